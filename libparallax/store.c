/*
 * store.c - formatting, opening and closing a blockstore; the service loop that drives the
 * engine; error messages; and the blocking I/O used by administrative paths.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"

#define DEFAULT_CACHE_BYTES (64ull << 20)
#define MAX_REGISTRY_SLOTS 65536u

uint64_t plx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int plx_err(plx_store *st, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->errmsg, sizeof st->errmsg, fmt, ap);
    va_end(ap);
    return err;
}

const char *plx_store_errmsg(const plx_store *st)
{
    return st->errmsg;
}

static void set_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
{
    if (!errbuf || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

/* ---- I/O plumbing ------------------------------------------------------------------------------ */

static void ev_io_done(struct plx_io *io, int status)
{
    struct plx_ev *ev = (struct plx_ev *)io;
    plx_store *st = io->owner;
    ev->status = status;
    ev->next = NULL;
    if (st->ready_tail)
        st->ready_tail->next = ev;
    else
        st->ready_head = ev;
    st->ready_tail = ev;
}

int plx_submit(plx_store *st, struct plx_ev *ev)
{
    ev->io.done = ev_io_done;
    ev->io.owner = st;
    int rc = st->be->ops->submit(st->be, &ev->io);
    if (rc == 0)
        st->internal_ios++;
    return rc;
}

static void sync_done(struct plx_io *io, int status)
{
    int *result = io->owner;
    result[0] = status;
    result[1] = 1;
}

int plx_sync_io(plx_store *st, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                unsigned flags)
{
    int result[2] = {0, 0};
    struct plx_io io = {.op = op, .flags = flags, .block = block, .nblocks = n, .buf = buf};
    io.done = sync_done;
    io.owner = result;
    int rc = st->be->ops->submit(st->be, &io);
    if (rc)
        return rc;
    while (!result[1]) {
        rc = st->be->ops->poll(st->be, -1);
        if (rc < 0 && rc != -EINTR)
            return rc;
    }
    /* A baseline message: callers with more context replace it. */
    if (result[0]) {
        static const char *const names[] = {"read", "write", "flush", "trim"};
        if (op == PLX_IO_FLUSH)
            plx_err(st, result[0], "flushing %s: %s", st->be->desc, strerror(-result[0]));
        else
            plx_err(st, result[0], "%s of block %llu on %s: %s", names[op],
                    (unsigned long long)block, st->be->desc, strerror(-result[0]));
    }
    return result[0];
}

void plx_wake(plx_store *st)
{
    uint64_t one = 1;
    if (write(st->wake_fd, &one, sizeof one) < 0) {
        /* The counter cannot overflow in practice; a failed wake only delays work to the next
         * service call. */
    }
}

void plx_complete(plx_store *st, struct plx_req *r)
{
    r->state = RQ_DONE;
    r->done_next = NULL;
    if (st->done_tail)
        st->done_tail->done_next = r;
    else
        st->done_head = r;
    st->done_tail = r;
    /* Inside the service loop the queue is drained before it returns: a wake-up would only
     * cost a system call per request. */
    if (!st->in_service)
        plx_wake(st);
}

int plx_store_fd(const plx_store *st)
{
    return st->epoll_fd;
}

void plx_run_ready(plx_store *st);
void plx_run_ready(plx_store *st)
{
    while (st->ready_head) {
        struct plx_ev *ev = st->ready_head;
        st->ready_head = ev->next;
        if (!st->ready_head)
            st->ready_tail = NULL;
        st->internal_ios--;
        ev->handler(st, ev);
    }
}

int plx_store_service(plx_store *st)
{
    uint64_t junk;
    if (read(st->wake_fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: nothing was signalled. */
    }
    int ran = 0;
    st->in_service = true;
    for (;;) {
        int rc = st->be->ops->poll(st->be, 0);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
            st->in_service = false;
            return plx_err(st, rc, "polling %s: %s", st->be->desc, strerror(-rc));
        }
        plx_run_ready(st);
        if (!st->done_head)
            break;
        while (st->done_head) {
            struct plx_req *r = st->done_head;
            st->done_head = r->done_next;
            if (!st->done_head)
                st->done_tail = NULL;
            plx_done_fn cb = r->cb;
            void *arg = r->arg;
            int status = r->status;
            free(r);
            ran++;
            if (cb)
                cb(arg, status);
        }
    }
    st->in_service = false;
    return ran;
}

int plx_store_busy(const plx_store *st)
{
    if (st->internal_ios || st->done_head || st->ready_head)
        return 1;
    for (const struct plx_vdi *v = st->vdis; v; v = v->next)
        if (!plx_vdi_idle(v))
            return 1;
    return 0;
}

int plx_store_wait(plx_store *st, const int *done)
{
    while (!*done) {
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
        if (*done)
            break;
        if (!plx_store_busy(st))
            return plx_err(st, -EDEADLK, "waiting for a request that can never complete");
        struct epoll_event e;
        rc = epoll_wait(st->epoll_fd, &e, 1, 1000);
        if (rc < 0 && errno != EINTR)
            return plx_err(st, -errno, "epoll_wait: %s", strerror(errno));
    }
    return 0;
}

/* ---- Identity and the single-host admin lock -------------------------------------------------- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ? h : 1;
}

static uint64_t process_start_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Field 22 (starttime); skip past the command name, which may contain spaces. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long v = 0;
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
        /* A zombie (state Z) is gone as a lock holder, even before its parent reaps it. */
        if (++field == 3 && tok[0] == 'Z')
            return 0;
        if (field == 22) {
            v = strtoull(tok, NULL, 10);
            break;
        }
    }
    return v;
}

static void identity_init(plx_store *st, const char *host)
{
    if (host && *host) {
        snprintf(st->host, sizeof st->host, "%s", host);
    } else if (gethostname(st->host, sizeof st->host - 1) != 0) {
        snprintf(st->host, sizeof st->host, "localhost");
    }
    st->host_hash = fnv1a(st->host);
    st->pid = (uint32_t)getpid();
    st->epoch = process_start_ticks(getpid());
}

/* Is a lock held by (host, pid, epoch) stale, i.e. held by a process on this host that is gone?
 * Locks of other hosts are never stale from here: that is the lock manager's call. */
bool plx_holder_stale(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
bool plx_holder_stale(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host == 0)
        return true;
    if (host != st->host_hash)
        return false;
    if (pid == st->pid && epoch == st->epoch)
        return false;
    uint64_t now = process_start_ticks((pid_t)pid);
    return now == 0 || now != epoch;
}

bool plx_holder_is_me(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
bool plx_holder_is_me(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    return host == st->host_hash && pid == st->pid && epoch == st->epoch;
}

/* How long to wait for the admin lock: $PARALLAX_LOCK_TIMEOUT seconds, default 30. Holders keep
 * it for one read-modify-write of a few blocks, so a long wait means a stuck holder: better a
 * clear error than a hang. */
static double lock_timeout(void)
{
    const char *env = getenv("PARALLAX_LOCK_TIMEOUT");
    double t = env ? strtod(env, NULL) : 30.0;
    return t > 0 ? t : 30.0;
}

int plx_admin_lock(plx_store *st)
{
    if (st->admin_depth++ || !st->be->ops->lock)
        return 0;
    double waited = 0, limit = lock_timeout();
    for (unsigned sleep_us = 1000;; sleep_us = sleep_us < 50000 ? sleep_us * 2 : 50000) {
        int rc = st->be->ops->lock(st->be, 1);
        if (rc == 0)
            return 0;
        if (rc != -EWOULDBLOCK || waited >= limit) {
            st->admin_depth--;
            if (rc == -EWOULDBLOCK)
                return plx_err(st, -EBUSY,
                               "%s: another process has held the blockstore's admin lock for "
                               "%.0f s",
                               st->be->desc, waited);
            return plx_err(st, rc, "locking %s: %s", st->be->desc, strerror(-rc));
        }
        usleep(sleep_us);
        waited += sleep_us / 1e6;
    }
}

void plx_admin_unlock(plx_store *st)
{
    if (--st->admin_depth == 0 && st->be->ops->lock)
        st->be->ops->lock(st->be, 0);
}

/* ---- Format ------------------------------------------------------------------------------------ */

static int write_block_sync(plx_backend *be, uint64_t block, void *buf)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_WRITE, block, 1, buf, 0);
}

static int read_block_sync(plx_backend *be, uint64_t block, void *buf)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_READ, block, 1, buf, 0);
}

static int flush_sync(plx_backend *be)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_FLUSH, 0, 0, NULL, 0);
}

static void make_uuid(uint8_t uuid[16])
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, uuid, 16) != 16) {
        uint64_t t = plx_now_ns() ^ ((uint64_t)getpid() << 32);
        memcpy(uuid, &t, 8);
        memcpy(uuid + 8, &t, 8);
    }
    if (fd >= 0)
        close(fd);
}

/* "64 MiB", "1.5 GiB": sizes in messages. */
static void size_text(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    unsigned u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && bytes >= (1ull << (10 * (u + 1))))
        u++;
    double v = (double)bytes / (double)(1ull << (10 * u));
    snprintf(buf, len, v == (double)(uint64_t)v ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* The extent size `format` picks when none is given: about 32 extents, between 1 MiB and 2 GiB.
 * Each process that writes allocates in a metadata and a data extent of its own, so a store
 * needs several extents per engine that shares it, not three huge ones. */
uint64_t plx_default_extent_size(uint64_t store_bytes)
{
    uint64_t e = PLX_MIN_EXTENT_SIZE;
    while (e < PLX_DEFAULT_EXTENT_SIZE && e * 2 <= store_bytes / 32)
        e *= 2;
    return e;
}

/* Lay out a store of `bytes` in extents of `extent_size` (0 = default) into *sb, or say in
 * errbuf why it cannot be done. Touches nothing. */
static int plan_geometry(const char *desc, uint64_t bytes, uint64_t extent_size,
                         struct plx_superblock *sb, char *errbuf, size_t errlen)
{
    char have[32], want[32];
    if (extent_size == 0)
        extent_size = plx_default_extent_size(bytes);
    if (extent_size < PLX_MIN_EXTENT_SIZE || (extent_size & (extent_size - 1))) {
        set_errbuf(errbuf, errlen, "extent size %llu: must be a power of two of at least 1 MiB",
                   (unsigned long long)extent_size);
        return -EINVAL;
    }
    uint64_t eb = extent_size / PLX_BLOCK_SIZE;
    uint64_t extents = bytes / PLX_BLOCK_SIZE / eb;
    if (extents < 3) {
        size_text(bytes, have, sizeof have);
        size_text(extent_size, want, sizeof want);
        set_errbuf(errbuf, errlen,
                   "%s: %s holds fewer than 3 extents of %s (one system, one metadata, one "
                   "data); give a smaller --extent-size (at least 1M), or a larger --size",
                   desc, have, want);
        return -EINVAL;
    }
    if (extents * eb > (1ull << 48)) {
        set_errbuf(errbuf, errlen, "%s: larger than the format's 2^48 blocks", desc);
        return -EFBIG;
    }
    memset(sb, 0, sizeof *sb);
    sb->version = PLX_FORMAT_VERSION;
    sb->block_size = PLX_BLOCK_SIZE;
    sb->extent_blocks = eb;
    sb->extent_count = extents;
    sb->block_count = extents * eb;
    sb->state_block = 1;
    sb->catalogue_start = 2;
    sb->catalogue_blocks = (extents + PLX_CATALOG_PER_BLOCK - 1) / PLX_CATALOG_PER_BLOCK;
    sb->registry_start = sb->catalogue_start + sb->catalogue_blocks;
    if (sb->registry_start + 16 > eb) {
        set_errbuf(errbuf, errlen,
                   "%s: %llu extents are too many for extents of %llu KiB: no room for the VDI "
                   "registry in extent 0; give a larger --extent-size",
                   desc, (unsigned long long)extents, (unsigned long long)(extent_size >> 10));
        return -EINVAL;
    }
    sb->registry_slots = eb - sb->registry_start;
    if (sb->registry_slots > MAX_REGISTRY_SLOTS)
        sb->registry_slots = MAX_REGISTRY_SLOTS;
    return 0;
}

/* Does block 0 of `be` hold a Parallax superblock? 1 yes, 0 no, negative errno if unreadable. */
static int holds_superblock(plx_backend *be)
{
    if (be->nblocks == 0)
        return 0;
    uint8_t *buf = plx_block_alloc(1);
    int rc = read_block_sync(be, 0, buf);
    if (rc == 0)
        rc = ((struct plx_blkhdr *)buf)->magic == PLX_MAGIC_SUPER;
    plx_block_free(buf);
    return rc;
}

static int format_backend(plx_backend *be, uint64_t extent_size, int force, char *errbuf,
                          size_t errlen)
{
    struct plx_superblock keep;
    int rc = plan_geometry(be->desc, be->nblocks * PLX_BLOCK_SIZE, extent_size, &keep, errbuf,
                           errlen);
    if (rc)
        return rc;
    rc = holds_superblock(be);
    if (rc > 0 && !force) {
        set_errbuf(errbuf, errlen, "%s already holds a Parallax blockstore (use --force)",
                   be->desc);
        return -EEXIST;
    }
    rc = rc < 0 ? rc : 0;
    keep.created_ns = plx_now_ns();
    make_uuid(keep.uuid);
    uint64_t extents = keep.extent_count;
    uint8_t *buf = plx_block_alloc(1);

    /* Catalogue and state first, superblock last: a crash while formatting leaves no valid
     * superblock, never a superblock over a half-written catalogue. */
    for (uint64_t b = 0; b < keep.catalogue_blocks && rc == 0; b++) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        struct plx_catalog_block *cb = (struct plx_catalog_block *)buf;
        cb->first_extent = b * PLX_CATALOG_PER_BLOCK;
        uint64_t left = extents - cb->first_extent;
        cb->count = (uint32_t)(left < PLX_CATALOG_PER_BLOCK ? left : PLX_CATALOG_PER_BLOCK);
        if (b == 0)
            cb->entries[0].type = PLX_EXTENT_SYSTEM;
        plx_blkhdr_seal(buf, PLX_MAGIC_CATALOG, keep.catalogue_start + b);
        rc = write_block_sync(be, keep.catalogue_start + b, buf);
    }
    if (rc == 0) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        struct plx_state_block *s = (struct plx_state_block *)buf;
        s->seq = 1;
        s->next_vdi_id = 1;
        plx_blkhdr_seal(buf, PLX_MAGIC_STATE, keep.state_block);
        rc = write_block_sync(be, keep.state_block, buf);
    }
    if (rc == 0)
        rc = flush_sync(be);
    if (rc == 0) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        memcpy(buf, &keep, sizeof keep);
        plx_blkhdr_seal(buf, PLX_MAGIC_SUPER, 0);
        rc = write_block_sync(be, 0, buf);
    }
    if (rc == 0)
        rc = flush_sync(be);
    if (rc)
        set_errbuf(errbuf, errlen, "formatting %s: %s", be->desc, strerror(-rc));
    plx_block_free(buf);
    return rc;
}

int plx_format_backend(plx_backend *be, uint64_t extent_size, char *errbuf, size_t errlen)
{
    return format_backend(be, extent_size, 1, errbuf, errlen);
}

plx_backend *plx_backend_open(const char *where, unsigned flags, int *err, char *errbuf,
                              size_t errlen)
{
    if (plx_backend_is_iscsi(where))
        return plx_backend_iscsi_open(where, flags, err, errbuf, errlen);
    return plx_backend_file_open(where, flags, err, errbuf, errlen);
}

int plx_blockstore_is_url(const char *where)
{
    return plx_backend_is_iscsi(where);
}

/* A LUN has the size its target gives it: format all of it, or its first `size` bytes. */
static int format_iscsi(const char *url, uint64_t size, uint64_t extent_size, int force,
                        char *errbuf, size_t errlen)
{
    int err = 0;
    plx_backend *be = plx_backend_iscsi_open(url, PLX_BACKEND_BLOCKING, &err, errbuf, errlen);
    if (!be)
        return err;
    if (size / PLX_BLOCK_SIZE > be->nblocks) {
        set_errbuf(errbuf, errlen, "%s: --size %llu bytes is more than the LUN's %llu bytes",
                   be->desc, (unsigned long long)size,
                   (unsigned long long)(be->nblocks * PLX_BLOCK_SIZE));
        be->ops->destroy(be);
        return -ENOSPC;
    }
    if (size)
        be->nblocks = size / PLX_BLOCK_SIZE;
    int rc = format_backend(be, extent_size, force, errbuf, errlen);
    be->ops->destroy(be);
    return rc;
}

/* Is there a Parallax superblock at the start of `path`? Read-only look. */
static int path_holds_superblock(const char *path, char *errbuf, size_t errlen)
{
    int err = 0;
    plx_backend *be =
        plx_backend_file_open(path, PLX_BACKEND_BLOCKING | PLX_BACKEND_RDONLY, &err, errbuf, errlen);
    if (!be)
        return err;
    int rc = holds_superblock(be);
    be->ops->destroy(be);
    if (rc < 0)
        set_errbuf(errbuf, errlen, "reading the start of %s: %s", path, strerror(-rc));
    return rc;
}

/* Nothing is changed (no file created, resized or written) until every check has passed: a
 * refused format leaves what was there exactly as it was. */
int plx_format(const char *path, uint64_t size, uint64_t extent_size, int force, char *errbuf,
               size_t errlen)
{
    if (plx_backend_is_iscsi(path))
        return format_iscsi(path, size, extent_size, force, errbuf, errlen);
    struct stat sbuf;
    bool exists = stat(path, &sbuf) == 0;
    if (!exists && errno != ENOENT) {
        set_errbuf(errbuf, errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    if (!exists && size == 0) {
        set_errbuf(errbuf, errlen, "%s does not exist: give --size to create it", path);
        return -EINVAL;
    }
    if (exists && !S_ISREG(sbuf.st_mode) && !S_ISBLK(sbuf.st_mode)) {
        set_errbuf(errbuf, errlen, "%s is neither a regular file nor a block device", path);
        return -EINVAL;
    }
    bool resize = exists && S_ISREG(sbuf.st_mode) && size && (uint64_t)sbuf.st_size != size;
    int rc;
    if (exists) {
        rc = path_holds_superblock(path, errbuf, errlen);
        if (rc < 0)
            return rc;
        if (rc > 0 && !force) {
            set_errbuf(errbuf, errlen, "%s already holds a Parallax blockstore (use --force)",
                       path);
            return -EEXIST;
        }
    }
    /* The geometry of what the store will be, checked before anything changes. A device keeps
     * its size; the file backend rounds down to whole blocks, as here. */
    uint64_t bytes = size;
    if (exists && !resize) {
        if (S_ISREG(sbuf.st_mode)) {
            bytes = (uint64_t)sbuf.st_size;
        } else {
            int err = 0;
            plx_backend *be = plx_backend_file_open(
                path, PLX_BACKEND_BLOCKING | PLX_BACKEND_RDONLY, &err, errbuf, errlen);
            if (!be)
                return err;
            bytes = be->nblocks * PLX_BLOCK_SIZE;
            be->ops->destroy(be);
        }
    }
    struct plx_superblock plan;
    rc = plan_geometry(path, bytes, extent_size, &plan, errbuf, errlen);
    if (rc)
        return rc;

    if (!exists) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
            int e = errno;
            set_errbuf(errbuf, errlen, "creating %s: %s", path, strerror(e));
            if (fd >= 0) {
                close(fd);
                unlink(path);
            }
            return -e;
        }
        close(fd);
    } else if (resize && truncate(path, (off_t)size) != 0) {
        set_errbuf(errbuf, errlen, "resizing %s: %s", path, strerror(errno));
        return -errno;
    }
    int err = 0;
    /* Formatting is one block at a time anyway: no aio context to tear down afterwards. */
    plx_backend *be = plx_backend_file_open(path, PLX_BACKEND_BLOCKING, &err, errbuf, errlen);
    if (!be) {
        rc = err;
    } else {
        rc = format_backend(be, extent_size, force, errbuf, errlen);
        be->ops->destroy(be);
    }
    if (rc && !exists)
        unlink(path); /* leave no half-made file behind */
    return rc;
}

/* ---- Open / close ------------------------------------------------------------------------------ */

static int load_superblock(plx_store *st)
{
    if (st->be->nblocks == 0)
        return plx_err(st, -EUCLEAN,
                       "%s is empty (less than one 4 KiB block): not a Parallax blockstore; "
                       "'parallax format --size SIZE' makes one",
                       st->be->desc);
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, 0, 1, buf, 0);
    if (rc) {
        plx_block_free(buf);
        return plx_err(st, rc, "reading the superblock of %s: %s", st->be->desc, strerror(-rc));
    }
    const char *why = NULL;
    rc = plx_blkhdr_verify(buf, PLX_MAGIC_SUPER, 0, &why);
    if (rc == -ENODATA || (rc && ((struct plx_blkhdr *)buf)->magic != PLX_MAGIC_SUPER)) {
        plx_block_free(buf);
        return plx_err(st, -EUCLEAN, "%s is not a Parallax blockstore (no superblock magic)",
                       st->be->desc);
    }
    if (rc) {
        plx_block_free(buf);
        return plx_err(st, -EUCLEAN, "superblock of %s is corrupt: %s", st->be->desc, why);
    }
    memcpy(&st->sb, buf, sizeof st->sb);
    plx_block_free(buf);
    const struct plx_superblock *sb = &st->sb;
    if (sb->version != PLX_FORMAT_VERSION)
        return plx_err(st, -EPROTONOSUPPORT,
                       "%s has format version %u; this Parallax reads version %u",
                       st->be->desc, sb->version, PLX_FORMAT_VERSION);
    if (sb->incompat_features & ~PLX_INCOMPAT_KNOWN)
        return plx_err(st, -EPROTONOSUPPORT,
                       "%s uses format features this Parallax does not know (0x%llx)",
                       st->be->desc, (unsigned long long)sb->incompat_features);
    if (sb->block_size != PLX_BLOCK_SIZE || sb->extent_blocks < 256 ||
        (sb->extent_blocks & (sb->extent_blocks - 1)) || sb->extent_count < 3 ||
        sb->block_count != sb->extent_count * sb->extent_blocks ||
        sb->registry_start + sb->registry_slots > sb->extent_blocks || sb->state_block != 1 ||
        sb->catalogue_start != 2)
        return plx_err(st, -EUCLEAN, "superblock of %s has inconsistent geometry", st->be->desc);
    if (sb->block_count > st->be->nblocks)
        return plx_err(st, -EUCLEAN,
                       "%s is truncated: the blockstore needs %llu bytes, the medium has %llu",
                       st->be->desc, (unsigned long long)(sb->block_count * PLX_BLOCK_SIZE),
                       (unsigned long long)(st->be->nblocks * PLX_BLOCK_SIZE));
    return 0;
}

int plx_state_read(plx_store *st);
int plx_state_read(plx_store *st)
{
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, st->sb.state_block, 1, buf, 0);
    const char *why = "";
    if (rc == 0)
        rc = plx_blkhdr_verify(buf, PLX_MAGIC_STATE, st->sb.state_block, &why);
    if (rc == 0)
        memcpy(&st->state, buf, sizeof st->state);
    plx_block_free(buf);
    if (rc == 0 && st->state.gc_epoch != st->seen_gc_epoch) {
        /* A collector freed blocks since we last looked: a cached node may describe a block
         * that now holds something else. Pinned nodes belong to open trees, which the
         * collector never frees. */
        if (st->cache.hash)
            plx_cache_drop_clean(st);
        st->seen_gc_epoch = st->state.gc_epoch;
    }
    if (rc == -EIO)
        return plx_err(st, rc, "reading the system state block: %s", strerror(EIO));
    if (rc)
        return plx_err(st, -EUCLEAN, "system state block is corrupt: %s", why);
    if (st->state.registry_used > st->sb.registry_slots)
        return plx_err(st, -EUCLEAN, "system state block: registry_used beyond the registry");
    return 0;
}

int plx_state_write(plx_store *st)
{
    uint8_t *buf = plx_block_alloc(1);
    st->state.seq++;
    memcpy(buf, &st->state, sizeof st->state);
    plx_blkhdr_seal(buf, PLX_MAGIC_STATE, st->sb.state_block);
    int rc = plx_sync_io(st, PLX_IO_WRITE, st->sb.state_block, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing the system state block: %s", strerror(-rc));
    return 0;
}

static int events_init(plx_store *st)
{
    st->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    st->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (st->wake_fd < 0 || st->epoll_fd < 0)
        return plx_err(st, -errno, "creating event descriptors: %s", strerror(errno));
    struct epoll_event e = {.events = EPOLLIN};
    if (epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, st->wake_fd, &e) != 0)
        return plx_err(st, -errno, "epoll_ctl: %s", strerror(errno));
    int bfd = st->be->ops->fd(st->be);
    if (bfd >= 0 && epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, bfd, &e) != 0)
        return plx_err(st, -errno, "epoll_ctl: %s", strerror(errno));
    return 0;
}

static void store_free(plx_store *st)
{
    plx_cache_free(st);
    plx_cache_owners_free(st);
    plx_alloc_free(st);
    free(st->cat);
    if (st->be)
        st->be->ops->destroy(st->be);
    if (st->wake_fd >= 0)
        close(st->wake_fd);
    if (st->epoll_fd >= 0)
        close(st->epoll_fd);
    free(st);
}

static int store_open(plx_backend *be, const struct plx_open_opts *opts,
                      plx_store **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    plx_store *st = calloc(1, sizeof *st);
    if (!st) {
        be->ops->destroy(be);
        set_errbuf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    st->be = be;
    st->wake_fd = st->epoll_fd = -1;
    st->read_only = opts ? opts->read_only : 0;
    identity_init(st, opts ? opts->host : NULL);
    uint64_t cache = opts && opts->cache_bytes ? opts->cache_bytes : DEFAULT_CACHE_BYTES;
    int rc = events_init(st);
    if (!rc)
        rc = load_superblock(st);
    if (!rc)
        rc = plx_state_read(st);
    if (!rc)
        rc = plx_catalogue_read(st);
    if (!rc)
        rc = plx_alloc_init(st);
    if (!rc)
        rc = plx_cache_init(st, cache);
    if (rc) {
        set_errbuf(errbuf, errlen, "%s", st->errmsg);
        store_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

int plx_store_open_backend(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                           char *errbuf, size_t errlen)
{
    return store_open(be, opts, out, errbuf, errlen);
}

int plx_store_open(const char *path, const struct plx_open_opts *opts, plx_store **out,
                   char *errbuf, size_t errlen)
{
    unsigned flags = 0;
    if (opts && opts->read_only)
        flags |= PLX_BACKEND_RDONLY;
    /* Callers built before blocking_io was appended pass a shorter struct. */
    if (opts && opts->struct_size >= offsetof(struct plx_open_opts, blocking_io) + sizeof(int) &&
        opts->blocking_io)
        flags |= PLX_BACKEND_BLOCKING;
    int err = 0;
    plx_backend *be = plx_backend_open(path, flags, &err, errbuf, errlen);
    if (!be) {
        *out = NULL;
        return err;
    }
    return store_open(be, opts, out, errbuf, errlen);
}

int plx_vdi_close_all(plx_store *st);

int plx_store_close(plx_store *st)
{
    if (!st)
        return 0;
    int rc = plx_vdi_close_all(st);
    /* Drain whatever internal I/O is left so no callback fires into freed memory. */
    while (st->internal_ios || st->ready_head) {
        int prc = st->be->ops->poll(st->be, -1);
        if (prc < 0 && prc != -EINTR)
            break;
        plx_run_ready(st);
    }
    if (!st->read_only) {
        int arc = plx_alloc_shutdown(st);
        if (!rc)
            rc = arc;
    }
    store_free(st);
    return rc;
}

/* Blocking internal wait: run engine I/O handlers until *flag is set. User callbacks are not
 * run here (they stay queued for the next plx_store_service), so admin paths may use this. */
int plx_drive_until(plx_store *st, const int *flag);
int plx_drive_until(plx_store *st, const int *flag)
{
    plx_run_ready(st);
    while (!*flag) {
        if (!st->internal_ios && !st->ready_head)
            return plx_err(st, -EDEADLK, "internal wait with nothing in flight");
        int rc = st->be->ops->poll(st->be, -1);
        if (rc < 0 && rc != -EINTR)
            return plx_err(st, rc, "polling %s: %s", st->be->desc, strerror(-rc));
        plx_run_ready(st);
    }
    return 0;
}
