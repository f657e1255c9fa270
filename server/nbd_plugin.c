/*
 * nbd_plugin.c - nbdkit plugin exporting every VDI of a blockstore over NBD.
 *
 *   nbdkit nbdkit-parallax-plugin.so blockstore=PATH [cache=SIZE] [socket=PATH]
 *                                                                  (or `parallax serve --nbdkit`)
 *
 * Export names: a VDI's name or id (read-write), "VDI@N" or "VDI@LABEL" (a snapshot,
 * read-only). All connections share one engine, owned by one thread (engine_thread.c): nbdkit
 * calls us from many threads, each call becomes a job on the engine thread and waits for its
 * completion, so requests from all connections go through the pipeline concurrently.
 * Connections to the same VDI share one open handle, which is why multi-conn is safe: a flush
 * on any connection covers the writes completed on every connection.
 */
#define NBDKIT_API_VERSION 2
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <nbdkit-plugin.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#define PLX_CONTROL_SERVER
#include "control.h"
#include "engine_thread.h"
#include "export_names.h"

static char *blockstore;
static uint64_t cache_bytes;
static struct et *engine;

/* socket=PATH: the --unix socket nbdkit listens on, which nbdkit leaves behind when it exits;
 * removed at unload if it is still the one that was there once nbdkit was serving. */
static char *socket_path;
static dev_t socket_dev;
static ino_t socket_ino;
static int socket_seen;

/* Open VDIs, shared by connections; engine thread only. */
struct export {
    char name[PLX_NAME_MAX + 64];
    plx_vdi *v;
    int refs;
    struct export *next;
};
static struct export *exports;

struct conn {
    struct export *ex;
    uint64_t size;
    int writable;
};

struct nbd_job {
    struct et_job job;
    plx_store *st;
    struct conn *c;
    const char *name;
    void *buf;
    uint64_t off, len;
    uint32_t flags;
    int readonly;
    /* block status answer */
    struct extent_run {
        uint64_t off, len;
        int mapped;
    } *runs;
    size_t nruns;
    /* list_exports answer: names and descriptions (NULL for none) */
    char **names, **descs;
    size_t nnames;
};

static int fail(struct nbd_job *j, int rc)
{
    nbdkit_error("%s", j->job.errmsg[0] ? j->job.errmsg : strerror(-rc));
    nbdkit_set_error(-rc);
    return -1;
}

static void req_done(void *arg, int status)
{
    struct nbd_job *j = arg;
    et_job_done(&j->job, j->st, status);
}

/* ---- configuration and lifetime ---------------------------------------------------------------- */

static int plx_config(const char *key, const char *value)
{
    if (strcmp(key, "blockstore") == 0) {
        free(blockstore);
        blockstore = strdup(value);
        return blockstore ? 0 : -1;
    }
    if (strcmp(key, "cache") == 0) {
        int64_t n = nbdkit_parse_size(value);
        if (n < 0)
            return -1;
        cache_bytes = (uint64_t)n;
        return 0;
    }
    if (strcmp(key, "socket") == 0) {
        free(socket_path);
        socket_path = nbdkit_absolute_path(value);
        return socket_path ? 0 : -1;
    }
    nbdkit_error("unknown parameter '%s' (expected blockstore=PATH, cache=SIZE, socket=PATH)", key);
    return -1;
}

static int plx_config_complete(void)
{
    if (!blockstore) {
        nbdkit_error("blockstore=PATH is required");
        return -1;
    }
    return 0;
}

static plx_vdi *find_writable(uint64_t id)
{
    for (struct export *e = exports; e; e = e->next)
        if (!plx_vdi_readonly(e->v) && plx_vdi_id(e->v) == id)
            return e->v;
    return NULL;
}

/* Threads do not survive nbdkit's fork into the background, so the engine starts after it. */
static int plx_after_fork(void)
{
    /* nbdkit has bound its sockets by now: remember which file is ours to remove. */
    struct stat sb;
    if (socket_path && lstat(socket_path, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
        socket_dev = sb.st_dev;
        socket_ino = sb.st_ino;
        socket_seen = 1;
    }
    char err[512];
    int rc = et_start(blockstore, cache_bytes, &engine, err, sizeof err);
    if (rc) {
        nbdkit_error("%s", err);
        return -1;
    }
    if (control_start(engine, find_writable, err, sizeof err) != 0)
        nbdkit_error("%s (live snapshots through `parallax` will not find this server)", err);
    return 0;
}

static void close_all_job(struct et_job *job, plx_store *st)
{
    (void)st;
    control_stop();
    while (exports) {
        struct export *e = exports;
        exports = e->next;
        plx_vdi_close(e->v);
        free(e);
    }
    et_job_done(job, NULL, 0);
}

static void plx_cleanup(void)
{
    if (!engine)
        return;
    struct nbd_job j = {.job.fn = close_all_job};
    et_call(engine, &j.job);
    et_stop(engine);
    engine = NULL;
}

static void plx_unload(void)
{
    struct stat sb;
    if (socket_seen && lstat(socket_path, &sb) == 0 && sb.st_dev == socket_dev &&
        sb.st_ino == socket_ino)
        unlink(socket_path);
    free(socket_path);
    free(blockstore);
}

/* ---- connections -------------------------------------------------------------------------------- */

static void open_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    for (struct export *e = exports; e; e = e->next) {
        if (strcmp(e->name, j->name) == 0) {
            e->refs++;
            j->c->ex = e;
            et_job_done(job, st, 0);
            return;
        }
    }
    struct export *e = calloc(1, sizeof *e);
    if (!e) {
        et_job_done(job, NULL, -ENOMEM);
        return;
    }
    int rc = plx_vdi_open(st, j->name, 0, &e->v);
    if (rc) {
        free(e);
        et_job_done(job, st, rc);
        return;
    }
    snprintf(e->name, sizeof e->name, "%s", j->name);
    e->refs = 1;
    e->next = exports;
    exports = e;
    j->c->ex = e;
    et_job_done(job, st, 0);
}

static void *plx_open(int readonly)
{
    const char *name = nbdkit_export_name();
    if (!name || !*name) {
        nbdkit_error("no export name: connect to a VDI by name, or VDI@N for a snapshot "
                     "(list them with `nbdinfo --list`)");
        nbdkit_set_error(ENOENT);
        return NULL;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    struct nbd_job j = {.job.fn = open_job, .c = c, .name = name};
    int rc = et_call(engine, &j.job);
    if (rc) {
        fail(&j, rc);
        free(c);
        return NULL;
    }
    c->size = plx_vdi_size(c->ex->v);
    c->writable = !readonly && !plx_vdi_readonly(c->ex->v);
    return c;
}

static void close_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    struct export *e = j->c->ex;
    if (--e->refs == 0) {
        for (struct export **pp = &exports; *pp; pp = &(*pp)->next) {
            if (*pp == e) {
                *pp = e->next;
                break;
            }
        }
        plx_vdi_close(e->v);
        free(e);
    }
    et_job_done(job, st, 0);
}

static void plx_close(void *handle)
{
    struct conn *c = handle;
    struct nbd_job j = {.job.fn = close_job, .c = c};
    et_call(engine, &j.job);
    free(c);
}

static int64_t plx_get_size(void *handle)
{
    return (int64_t)((struct conn *)handle)->size;
}

static int plx_can_write(void *handle)
{
    return ((struct conn *)handle)->writable;
}

static int plx_can_yes(void *handle)
{
    return 1;
}

static int plx_can_fua(void *handle)
{
    return NBDKIT_FUA_NATIVE;
}

/* ---- data path ---------------------------------------------------------------------------------- */

static void pread_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    j->st = st;
    int rc = plx_vdi_submit_read(j->c->ex->v, j->buf, j->off, j->len, req_done, j);
    if (rc)
        et_job_done(job, st, rc);
}

static void pwrite_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    j->st = st;
    unsigned f = (j->flags & NBDKIT_FLAG_FUA) ? PLX_WRITE_FUA : 0;
    int rc = plx_vdi_submit_write(j->c->ex->v, j->buf, j->off, j->len, f, req_done, j);
    if (rc)
        et_job_done(job, st, rc);
}

static void flush_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    j->st = st;
    int rc = plx_vdi_submit_flush(j->c->ex->v, req_done, j);
    if (rc)
        et_job_done(job, st, rc);
}

/* Trim, then flush when FUA was asked: zeroes and trims both leave the range sparse. */
static void trim_flushed(void *arg, int status)
{
    struct nbd_job *j = arg;
    if (status || !(j->flags & NBDKIT_FLAG_FUA)) {
        et_job_done(&j->job, j->st, status);
        return;
    }
    int rc = plx_vdi_submit_flush(j->c->ex->v, req_done, j);
    if (rc)
        et_job_done(&j->job, j->st, rc);
}

static void trim_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    j->st = st;
    int rc = plx_vdi_submit_trim(j->c->ex->v, j->off, j->len, trim_flushed, j);
    if (rc)
        et_job_done(job, st, rc);
}

static int run(struct nbd_job *j)
{
    int rc = et_call(engine, &j->job);
    return rc ? fail(j, rc) : 0;
}

static int plx_pread(void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
    struct nbd_job j = {.job.fn = pread_job, .c = handle, .buf = buf, .off = offset, .len = count};
    return run(&j);
}

static int plx_pwrite(void *handle, const void *buf, uint32_t count, uint64_t offset,
                      uint32_t flags)
{
    struct nbd_job j = {.job.fn = pwrite_job,
                        .c = handle,
                        .buf = (void *)(uintptr_t)buf,
                        .off = offset,
                        .len = count,
                        .flags = flags};
    return run(&j);
}

static int plx_flush(void *handle, uint32_t flags)
{
    struct nbd_job j = {.job.fn = flush_job, .c = handle};
    return run(&j);
}

static int plx_trim(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
    struct nbd_job j = {.job.fn = trim_job, .c = handle, .off = offset, .len = count,
                        .flags = flags};
    return run(&j);
}

static int plx_zero(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
    return plx_trim(handle, count, offset, flags);
}

/* Block status from the tree's sparseness: unmapped runs are holes that read as zeros. */
static void extents_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    uint64_t off = j->off, end = j->off + j->len;
    size_t cap = 0;
    int rc = 0;
    while (off < end && j->nruns < 1024) {
        uint64_t run = 0;
        rc = plx_vdi_block_status(j->c->ex->v, off, end - off, &run);
        if (rc < 0 || run == 0)
            break;
        if (j->nruns == cap) {
            cap = cap ? cap * 2 : 16;
            struct extent_run *nr = realloc(j->runs, cap * sizeof *nr);
            if (!nr) {
                rc = -ENOMEM;
                break;
            }
            j->runs = nr;
        }
        j->runs[j->nruns++] = (struct extent_run){off, run, rc};
        off += run;
        rc = 0;
    }
    et_job_done(job, st, rc < 0 ? rc : 0);
}

static int plx_extents(void *handle, uint32_t count, uint64_t offset, uint32_t flags,
                       struct nbdkit_extents *extents)
{
    struct nbd_job j = {.job.fn = extents_job, .c = handle, .off = offset, .len = count};
    int rc = et_call(engine, &j.job);
    for (size_t i = 0; !rc && i < j.nruns; i++) {
        uint32_t type = j.runs[i].mapped ? 0 : (NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO);
        if (nbdkit_add_extent(extents, j.runs[i].off, j.runs[i].len, type) == -1)
            rc = -EIO;
    }
    free(j.runs);
    return rc ? fail(&j, rc) : 0;
}

/* ---- export listing ------------------------------------------------------------------------------ */

static int add_name(void *arg, const char *name, const char *desc)
{
    struct nbd_job *j = arg;
    char **nn = realloc(j->names, (j->nnames + 1) * sizeof *nn);
    if (!nn)
        return -ENOMEM;
    j->names = nn;
    char **nd = realloc(j->descs, (j->nnames + 1) * sizeof *nd);
    if (!nd)
        return -ENOMEM;
    j->descs = nd;
    j->names[j->nnames] = strdup(name);
    j->descs[j->nnames] = desc ? strdup(desc) : NULL;
    if (!j->names[j->nnames] || (desc && !j->descs[j->nnames])) {
        free(j->names[j->nnames]);
        free(j->descs[j->nnames]);
        return -ENOMEM;
    }
    j->nnames++;
    return 0;
}

static void list_job(struct et_job *job, plx_store *st)
{
    struct nbd_job *j = (struct nbd_job *)job;
    int rc = plx_export_names(st, add_name, j);
    et_job_done(job, st, rc);
}

static int plx_list_exports(int readonly, int is_tls, struct nbdkit_exports *exps)
{
    struct nbd_job j = {.job.fn = list_job};
    int rc = et_call(engine, &j.job);
    for (size_t i = 0; i < j.nnames; i++) {
        if (!rc && nbdkit_add_export(exps, j.names[i], j.descs[i]) == -1)
            rc = -EIO;
        free(j.names[i]);
        free(j.descs[i]);
    }
    free(j.names);
    free(j.descs);
    return rc ? fail(&j, rc) : 0;
}

static int plx_block_size(void *handle, uint32_t *minimum, uint32_t *preferred,
                          uint32_t *maximum)
{
    *minimum = 1;
    *preferred = PLX_BLOCK_SIZE;
    *maximum = 0xffffffff;
    return 0;
}

static struct nbdkit_plugin plugin = {
    .name = "parallax",
    .longname = "Parallax virtual disk images",
    .version = "1.0",
    .description = "exports the VDIs and snapshots of a Parallax blockstore",
    .config = plx_config,
    .config_complete = plx_config_complete,
    .config_help = "blockstore=PATH   the Parallax blockstore (file or block device)\n"
                   "cache=SIZE        radix node cache (default 64M)\n"
                   "socket=PATH       nbdkit's --unix socket, to remove at exit",
    .magic_config_key = "blockstore",
    .after_fork = plx_after_fork,
    .cleanup = plx_cleanup,
    .unload = plx_unload,
    .open = plx_open,
    .close = plx_close,
    .get_size = plx_get_size,
    .can_write = plx_can_write,
    .can_flush = plx_can_yes,
    .can_trim = plx_can_write,
    .can_zero = plx_can_write,
    .can_fua = plx_can_fua,
    .can_multi_conn = plx_can_yes,
    .can_extents = plx_can_yes,
    .pread = plx_pread,
    .pwrite = plx_pwrite,
    .flush = plx_flush,
    .trim = plx_trim,
    .zero = plx_zero,
    .extents = plx_extents,
    .list_exports = plx_list_exports,
    .block_size = plx_block_size,
    .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN(plugin)
