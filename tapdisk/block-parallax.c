/*
 * block-parallax.c - a blktap3 tapdisk driver serving a Parallax VDI ("parallax").
 *
 *   tap-ctl create -a parallax:<vdi>                   blockstore from configuration
 *   tap-ctl create -a parallax:<blockstore>:<vdi>      blockstore given
 *   tap-ctl create -a parallax:durability=ordered:...  completed writes as durable as aio:'s
 *
 * tapdisk splits "parallax:" off and hands the rest to open() (the params). <vdi> is anything
 * plx_vdi_open accepts: a VDI name or id, or "VDI@N" / "VDI@LABEL" for a snapshot (read-only).
 * Without a blockstore in the params, it comes from $PARALLAX_BLOCKSTORE, else from the first
 * line of /etc/parallax/blockstore ($PARALLAX_BLOCKSTORE_FILE overrides that path).
 *
 * How the driver fits tapdisk (see docs/tapdisk.md):
 * - tapdisk is one thread around a select() loop and nothing in a driver may block there. The
 *   Parallax engine is built for exactly this: submit calls only queue work, and completions
 *   are delivered by plx_store_service() when plx_store_fd() is readable. So open() registers
 *   that descriptor as a tapdisk read event whose callback services the store, queue_read /
 *   queue_write only submit, and the engine's completion callbacks call td_complete_request().
 * - Every request gets a slot that lives until its completion; the slot carries the request
 *   (tapdisk passes it by value) to the completion callback. The slot table is what bounds the
 *   requests in flight; only when it is full does a request complete with -EBUSY, which makes
 *   tapdisk resubmit it later.
 * - One engine (plx_store) per blockstore per process. The engine tells its own extents from
 *   other writers' by (host, pid), so two stores on the same blockstore in one process would
 *   each take the other's claimed blocks for its own. Disks of one tapdisk on the same
 *   blockstore therefore share one store and one registered event.
 * - tapdisk has no flush request for drivers: a guest's barrier or cache flush is satisfied
 *   by waiting for the writes before it to complete, i.e. tapdisk assumes a completed write is
 *   durable as far as its drivers make it (block-aio completes on the O_DIRECT write, with no
 *   device flush). Two durability modes (docs/tapdisk.md):
 *     durability=fua (default): every write is submitted with PLX_WRITE_FUA, so a completed
 *       write survives a power failure; writes that allocate share the engine's batch flushes
 *       (group commit), and overwrites of the VDI's own blocks are one FUA data write each,
 *       without a commit (docs/DESIGN.md, "FUA overwrites in place").
 *     durability=ordered: aio:'s contract. A write completes once its data, and the tree nodes
 *       that reach it, are written (not flushed): it survives a crash of tapdisk, and after a
 *       power failure the VDI is consistent and each block holds old or new data, but the last
 *       completed writes may be lost, as with aio: on a disk with a volatile cache. The tree's
 *       own ordering (data and new nodes flushed before the links to them) is kept by the
 *       engine's pipeline in both modes.
 * - Block status (queue_block_status) is answered by the engine asynchronously
 *   (plx_vdi_submit_block_status), in pieces completed in order: mapped runs as
 *   TD_BLOCK_STATE_NONE, sparse runs as HOLE|ZERO. tapdisk builds its extent list in completion
 *   order, so the next piece is asked for only once the previous one is answered.
 * - Admin commands (vdi-snapshot, snap-label, snap-delete) reach this process as they reach
 *   `parallax serve`: the `parallax` command finds the VDI's holder pid and connects to its
 *   control socket (host/parallax_control.h), which the driver serves from tapdisk's scheduler
 *   while any writable disk is open. A snapshot is a request in the VDI's stream; the reply is sent
 *   once the snapshot is durable.
 *
 * Build: inside a blktap tree, tapdisk-iface.h includes tapdisk's own headers; here it declares
 * the few names used, and tests/unit/tapdisk_double.c stands in for tapdisk.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "parallax.h"
#include "parallax_control.h"
#include "parallax_handover.h"
#include "tapdisk-iface.h"

/* Requests in flight per open disk. Large enough that tapdisk rarely meets the limit (an
 * 8-page blkif ring holds 256 requests of up to 11 segments, and tapdisk merges contiguous
 * segments into one request to the driver), small enough to bound memory (about 100 KiB). */
#define PLX_TD_SLOTS 1024

#define PLX_TD_CONF_DEFAULT "/etc/parallax/blockstore"

/* ---- State ---------------------------------------------------------------------------------- */

struct plx_td_disk;
struct plx_td_pool;

enum slot_state {
    SLOT_FREE = 0,
    SLOT_BUSY,      /* submitted to the engine; tapdisk waits for its completion */
    SLOT_ABANDONED, /* already completed towards tapdisk (close or store failure); the engine
                     * still owes its callback, which must then only release the slot */
};

struct plx_td_slot {
    struct plx_td_pool *pool;
    enum slot_state state;
    int op;            /* TD_OP_READ, TD_OP_WRITE or TD_OP_BLOCK_STATUS */
    td_request_t treq; /* block status: the part not answered yet */
    uint64_t run;      /* block status: the engine's answer */
    int mapped;
    struct plx_td_slot *next_free; /* also: the next request waiting for a handover */
};

/* The slots live outside tapdisk's private data (driver->data), because tapdisk frees that on
 * close, and after an engine failure the engine may still owe callbacks naming a slot. A pool
 * whose disk is gone is freed by the last such callback. */
struct plx_td_pool {
    struct plx_td_disk *disk; /* NULL once the disk is closed */
    unsigned engine_pending;  /* callbacks the engine still owes (busy + abandoned slots) */
    struct plx_td_slot *free;
    struct plx_td_slot slots[PLX_TD_SLOTS];
};

/* One engine per blockstore in this process (tapdisk is single-threaded: no locking). */
struct plx_td_store {
    char path[PATH_MAX]; /* canonical (realpath) */
    plx_store *st;
    int read_only;
    int refs;
    int failed;       /* negative errno once plx_store_service reported the store stopped */
    event_id_t event; /* -1 when not registered */
    /* With a write log attached by a disk's parameters: a 100 ms timer applying the write
     * cache's automatic mode to the store's writable disks (plx_vdi_wcache_tick). */
    int tick_fd;            /* -1: none */
    event_id_t tick_event;  /* -1 when not registered */
    struct plx_td_disk *disks;
    struct plx_td_store *next;
};

/* tapdisk's private data for one open image (driver->data, zeroed by tapdisk). */
struct plx_td_disk {
    td_driver_t *driver;
    struct plx_td_store *store;
    plx_vdi *vdi;
    struct plx_td_pool *pool;
    int read_only;
    unsigned write_flags; /* PLX_WRITE_FUA (durability=fua) or 0 (durability=ordered) */
    int write_cache;      /* 0, PLX_WCACHE_ON or PLX_WCACHE_AUTO (write-cache=PATH) */
    struct plx_wcache_auto wauto; /* write-cache-threshold= */
    td_sector_t sectors;
    unsigned inflight; /* busy slots: requests tapdisk is waiting for */
    int control;       /* this disk counts among the control socket's users */
    /* Handover (migration): opened while another process held the VDI for writing. Requests
     * wait, in order, until this process gets the VDI; none is served before. */
    int waiting;         /* the VDI is not ours yet */
    int handover_failed; /* negative errno once the wait gave up */
    uint64_t wait_since_ns;
    int retry_fd; /* timerfd: try to open the VDI again every 5 ms */
    event_id_t retry_event;
    /* The tries of the open (host/parallax_handover.h): each waits on the store's loop, and
     * this tapdisk's other disks are served meanwhile. */
    struct handover_try retry;
    struct plx_td_slot *wait_head, *wait_tail;
    char vdi_spec[PLX_NAME_MAX + PLX_LABEL_MAX + 32];
    struct plx_td_disk *next; /* on store->disks */
};

static struct plx_td_store *plx_td_stores;
static unsigned plx_td_control_users; /* writable disks open: the control socket runs while > 0 */

/* ---- Slots ---------------------------------------------------------------------------------- */

static struct plx_td_pool *pool_new(struct plx_td_disk *d)
{
    struct plx_td_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->disk = d;
    for (int i = PLX_TD_SLOTS - 1; i >= 0; i--) {
        p->slots[i].pool = p;
        p->slots[i].next_free = p->free;
        p->free = &p->slots[i];
    }
    return p;
}

static struct plx_td_slot *slot_get(struct plx_td_pool *p)
{
    struct plx_td_slot *s = p->free;
    if (s) {
        p->free = s->next_free;
        s->next_free = NULL;
        s->state = SLOT_BUSY;
    }
    return s;
}

static void slot_put(struct plx_td_slot *s)
{
    struct plx_td_pool *p = s->pool;
    s->state = SLOT_FREE;
    s->next_free = p->free;
    p->free = s;
}

/* Complete every busy slot of d towards tapdisk with err, leaving the engine's callbacks only
 * the release of the slot. Used when the engine can no longer be relied on to answer. */
static void abandon_inflight(struct plx_td_disk *d, int err)
{
    for (unsigned i = 0; i < PLX_TD_SLOTS && d->inflight > 0; i++) {
        struct plx_td_slot *s = &d->pool->slots[i];
        if (s->state != SLOT_BUSY)
            continue;
        s->state = SLOT_ABANDONED;
        d->inflight--;
        td_complete_request(s->treq, err);
    }
}

/* ---- Engine callbacks ---------------------------------------------------------------------- */

/* Completion of one plx_vdi_submit_read/write. Runs from plx_store_service, i.e. from the
 * tapdisk event callback below or from close()'s drain. */
static void request_done(void *arg, int status)
{
    struct plx_td_slot *s = arg;
    struct plx_td_pool *p = s->pool;
    p->engine_pending--;
    if (s->state == SLOT_ABANDONED) {
        slot_put(s);
        if (!p->disk && p->engine_pending == 0)
            free(p);
        return;
    }
    struct plx_td_disk *d = p->disk;
    td_request_t treq = s->treq;
    /* -EBUSY would make tapdisk resubmit at once; the engine never means that, so it must not
     * reach tapdisk as such. */
    if (status == -EBUSY)
        status = -EIO;
    if (status > 0)
        status = -status;
    /* Free the slot and count the request done before telling tapdisk: its completion path may
     * queue the next request to this disk straight away. */
    slot_put(s);
    d->inflight--;
    if (status)
        tlog_syslog(TLOG_WARN, "parallax: %s: %s of %d sectors at %llu failed: %s", d->vdi_spec,
                    treq.op == TD_OP_WRITE ? "write" : "read", treq.secs,
                    (unsigned long long)treq.sec, strerror(-status));
    td_complete_request(treq, status);
}

static int submit_status(struct plx_td_disk *d, struct plx_td_slot *s);

/* The engine answered block status for the start of s->treq: complete that piece towards
 * tapdisk and ask for the rest, if any. */
static void status_done(void *arg, int status)
{
    struct plx_td_slot *s = arg;
    struct plx_td_pool *p = s->pool;
    p->engine_pending--;
    if (s->state == SLOT_ABANDONED) {
        slot_put(s);
        if (!p->disk && p->engine_pending == 0)
            free(p);
        return;
    }
    struct plx_td_disk *d = p->disk;
    td_request_t rest = s->treq;
    if (status == 0) {
        td_request_t piece = rest;
        piece.secs = (int)(s->run >> SECTOR_SHIFT);
        piece.status = s->mapped ? TD_BLOCK_STATE_NONE : TD_BLOCK_STATE_HOLE | TD_BLOCK_STATE_ZERO;
        rest.sec += (td_sector_t)piece.secs;
        rest.secs -= piece.secs;
        s->treq = rest;
        if (rest.secs > 0)
            status = submit_status(d, s);
        if (rest.secs == 0 || status) {
            slot_put(s);
            d->inflight--;
        }
        /* The slot is settled before tapdisk hears of the piece (it may queue more at once). */
        td_complete_request(piece, 0);
        if (!status)
            return;
    } else {
        slot_put(s);
        d->inflight--;
    }
    if (status > 0 || status == -EBUSY)
        status = -EIO;
    tlog_syslog(TLOG_WARN, "parallax: %s: block status of %d sectors at %llu failed: %s",
                d->vdi_spec, rest.secs, (unsigned long long)rest.sec, strerror(-status));
    td_complete_request(rest, status);
}

static int submit_status(struct plx_td_disk *d, struct plx_td_slot *s)
{
    int rc = plx_vdi_submit_block_status(d->vdi, (uint64_t)s->treq.sec << SECTOR_SHIFT,
                                         (uint64_t)s->treq.secs << SECTOR_SHIFT, &s->run,
                                         &s->mapped, status_done, s);
    if (rc == 0)
        d->pool->engine_pending++;
    return rc;
}

/* The store stopped (the medium failed): answer everything outstanding with the error, stop
 * watching the descriptor (it may stay readable forever) and refuse new requests. */
static void store_failed(struct plx_td_store *ps, int err)
{
    tlog_syslog(TLOG_WARN, "parallax: blockstore %s stopped: %s (%s)", ps->path, strerror(-err),
                plx_store_errmsg(ps->st));
    ps->failed = err;
    if (ps->event >= 0) {
        tapdisk_server_unregister_event(ps->event);
        ps->event = -1;
    }
    for (struct plx_td_disk *d = ps->disks; d; d = d->next)
        abandon_inflight(d, err);
}

/* tapdisk read event on plx_store_fd(): the engine has completions or I/O to advance. */
static void store_event(event_id_t id, char mode, void *private)
{
    struct plx_td_store *ps = private;
    int rc = plx_store_service(ps->st);
    if (rc < 0)
        store_failed(ps, rc);
}

/* ---- Stores --------------------------------------------------------------------------------- */

static int store_open_engine(const char *path, int read_only, plx_store **out, char *err,
                             size_t errlen)
{
    struct plx_open_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.read_only = read_only;
    return plx_store_open(path, &o, out, err, errlen);
}

/* Find or open the process's store for `path`. Opening reads the blockstore synchronously;
 * that is acceptable in open(), which tapdisk calls outside the I/O path (block-vhd reads its
 * headers the same way). */
static int store_get(const char *path, int want_ro, struct plx_td_store **out)
{
    char real[PATH_MAX];
    if (plx_blockstore_is_url(path))
        snprintf(real, sizeof real, "%s", path); /* an iscsi:// LUN: its URL names it */
    else if (!realpath(path, real)) {
        int e = errno;
        tlog_syslog(TLOG_WARN, "parallax: blockstore %s: %s", path, strerror(e));
        return -e;
    }
    for (struct plx_td_store *ps = plx_td_stores; ps; ps = ps->next) {
        if (strcmp(ps->path, real) != 0)
            continue;
        if (ps->failed) {
            tlog_syslog(TLOG_WARN, "parallax: blockstore %s has stopped after an error: %s", real,
                        strerror(-ps->failed));
            return ps->failed;
        }
        if (ps->read_only && !want_ro) {
            tlog_syslog(TLOG_WARN,
                        "parallax: blockstore %s is open read-only in this tapdisk; cannot open "
                        "a VDI on it for writing",
                        real);
            return -EROFS;
        }
        ps->refs++;
        *out = ps;
        return 0;
    }

    struct plx_td_store *ps = calloc(1, sizeof *ps);
    if (!ps)
        return -ENOMEM;
    memcpy(ps->path, real, sizeof ps->path);
    ps->event = -1;
    ps->tick_fd = -1;
    ps->tick_event = -1;
    char err[512] = "";
    /* The store is opened writable even for a read-only disk, so that a writable disk on the
     * same blockstore can share it later; a read-only store only when that is all we may. */
    int rc = store_open_engine(real, 0, &ps->st, err, sizeof err);
    if (rc < 0 && want_ro && (rc == -EACCES || rc == -EPERM || rc == -EROFS)) {
        ps->read_only = 1;
        rc = store_open_engine(real, 1, &ps->st, err, sizeof err);
    }
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: cannot open blockstore %s: %s", real,
                    err[0] ? err : strerror(-rc));
        free(ps);
        return rc;
    }
    event_id_t ev = tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, plx_store_fd(ps->st),
                                                  TV_ZERO, store_event, ps);
    if (ev < 0) {
        tlog_syslog(TLOG_WARN, "parallax: cannot register the engine descriptor of %s: %s", real,
                    strerror(-ev));
        plx_store_close(ps->st);
        free(ps);
        return ev;
    }
    ps->event = ev;
    /* tapdisk's scheduler services the store whenever its descriptor is readable, the engine's
     * timers included: a loop like a server's engine thread, so a request that needs a new
     * extent waits on it as a request waits (its claim's admin lock too), and the disks served
     * beside it go on (docs/DESIGN.md, Allocator, "On a serving loop"). The pass the call
     * promises is the one right after it. */
    plx_store_will_service(ps->st);
    rc = plx_store_service(ps->st);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: blockstore %s: %s", real, plx_store_errmsg(ps->st));
        tapdisk_server_unregister_event(ev);
        plx_store_close(ps->st);
        free(ps);
        return rc;
    }
    ps->refs = 1;
    ps->next = plx_td_stores;
    plx_td_stores = ps;
    *out = ps;
    return 0;
}

/* Drop a reference; the last one unregisters the event and closes the engine. Returns 1 when
 * the store was closed (no engine callback can fire any more), 0 otherwise. */
static int store_put(struct plx_td_store *ps)
{
    if (--ps->refs > 0)
        return 0;
    for (struct plx_td_store **pp = &plx_td_stores; *pp; pp = &(*pp)->next) {
        if (*pp == ps) {
            *pp = ps->next;
            break;
        }
    }
    if (ps->event >= 0)
        tapdisk_server_unregister_event(ps->event);
    if (ps->tick_event >= 0)
        tapdisk_server_unregister_event(ps->tick_event);
    if (ps->tick_fd >= 0)
        close(ps->tick_fd);
    int rc = plx_store_close(ps->st);
    if (rc < 0)
        tlog_syslog(TLOG_WARN, "parallax: closing blockstore %s: %s", ps->path, strerror(-rc));
    free(ps);
    return 1;
}

static void store_add_disk(struct plx_td_store *ps, struct plx_td_disk *d)
{
    d->next = ps->disks;
    ps->disks = d;
}

static void store_remove_disk(struct plx_td_store *ps, struct plx_td_disk *d)
{
    for (struct plx_td_disk **pp = &ps->disks; *pp; pp = &(*pp)->next) {
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    }
}

/* ---- Parameters ----------------------------------------------------------------------------- */

/* Copy src (n bytes) into dst as a string; -ENAMETOOLONG when it does not fit. */
static int copy_str(char *dst, size_t dstlen, const char *src, size_t n)
{
    if (n >= dstlen)
        return -ENAMETOOLONG;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* The configured blockstore: $PARALLAX_BLOCKSTORE, else the first line of the configuration
 * file that is neither empty nor a # comment, trimmed. */
static int default_blockstore(char *out, size_t outlen)
{
    const char *env = getenv("PARALLAX_BLOCKSTORE");
    if (env && *env) {
        int rc = copy_str(out, outlen, env, strlen(env));
        if (rc < 0)
            tlog_syslog(TLOG_WARN, "parallax: PARALLAX_BLOCKSTORE is too long");
        return rc;
    }
    const char *conf = getenv("PARALLAX_BLOCKSTORE_FILE");
    if (!conf || !*conf)
        conf = PLX_TD_CONF_DEFAULT;
    FILE *f = fopen(conf, "re");
    if (!f) {
        int e = errno;
        tlog_syslog(TLOG_WARN,
                    "parallax: no blockstore given (params <blockstore>:<vdi>), "
                    "PARALLAX_BLOCKSTORE unset, and %s: %s",
                    conf, strerror(e));
        return -EINVAL;
    }
    char line[PATH_MAX + 2];
    int rc = -EINVAL;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strlen(p);
        while (n > 0 &&
               (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
            p[--n] = '\0';
        if (n == 0 || p[0] == '#')
            continue;
        rc = copy_str(out, outlen, p, n);
        break;
    }
    fclose(f);
    if (rc == -EINVAL)
        tlog_syslog(TLOG_WARN, "parallax: %s names no blockstore", conf);
    else if (rc < 0)
        tlog_syslog(TLOG_WARN, "parallax: the blockstore named in %s is too long", conf);
    return rc;
}

static int is_existing_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && (S_ISREG(sb.st_mode) || S_ISBLK(sb.st_mode));
}

/* The length of the iscsi://HOST[:PORT]/IQN/LUN at the start of s (IQNs hold colons but no
 * '/', the LUN is digits), or 0 when s does not start with one. */
static size_t iscsi_url_len(const char *s)
{
    if (!plx_blockstore_is_url(s))
        return 0;
    const char *p = strchr(s + strlen("iscsi://"), '/');
    if (p)
        p = strchr(p + 1, '/');
    if (!p || !isdigit((unsigned char)p[1]))
        return 0;
    p++;
    while (isdigit((unsigned char)*p))
        p++;
    return (size_t)(p - s);
}

/* Split params into blockstore and VDI spec.
 *   "<vdi>"               no colon: the configured blockstore
 *   "<blockstore>:<vdi>"  the blockstore is the text before the first colon whose prefix names
 *                         an existing file or block device (paths such as
 *                         /dev/disk/by-path/pci-0000:00:1f.2-ata-1 contain colons, and so may
 *                         snapshot labels); if no prefix exists, the text before the first
 *                         colon (and opening it then fails with its own message)
 *   "iscsi://HOST[:PORT]/IQN/LUN:<vdi>"  an iSCSI LUN: the blockstore ends after the LUN number
 * Both parts must be non-empty. */
static int parse_params(const char *params, char *bs, size_t bslen, char *vdi, size_t vdilen)
{
    static const char syntax[] = "expected parallax:<vdi> or parallax:<blockstore>:<vdi>";
    if (!params || !*params) {
        tlog_syslog(TLOG_WARN, "parallax: empty disk parameters (%s)", syntax);
        return -EINVAL;
    }
    const char *colon = strchr(params, ':');
    if (!colon) {
        if (strchr(params, '/')) {
            tlog_syslog(TLOG_WARN,
                        "parallax: '%s' looks like a path, not a VDI: VDI names contain no '/' "
                        "(%s)",
                        params, syntax);
            return -EINVAL;
        }
        if (copy_str(vdi, vdilen, params, strlen(params)) < 0) {
            tlog_syslog(TLOG_WARN, "parallax: VDI '%s' is too long", params);
            return -EINVAL;
        }
        return default_blockstore(bs, bslen);
    }
    const char *split = colon;
    size_t url_len = iscsi_url_len(params);
    if (url_len > 0)
        split = params[url_len] == ':' ? params + url_len : params + strlen(params);
    for (const char *c = url_len > 0 ? NULL : colon; c; c = strchr(c + 1, ':')) {
        size_t n = (size_t)(c - params);
        if (n == 0 || copy_str(bs, bslen, params, n) < 0)
            continue;
        if (is_existing_file(bs)) {
            split = c;
            break;
        }
    }
    size_t bn = (size_t)(split - params);
    const char *v = split + 1;
    if (bn == 0 || *v == '\0') {
        tlog_syslog(TLOG_WARN, "parallax: malformed disk parameters '%s': %s is empty (%s)", params,
                    bn == 0 ? "the blockstore" : "the VDI", syntax);
        return -EINVAL;
    }
    if (copy_str(bs, bslen, params, bn) < 0 || copy_str(vdi, vdilen, v, strlen(v)) < 0) {
        tlog_syslog(TLOG_WARN, "parallax: disk parameters '%s' are too long", params);
        return -EINVAL;
    }
    return 0;
}

/* Leading "key=value:" options of the params. Only known keys are options, so a blockstore or
 * VDI name is never taken for one: durability=fua|ordered, and the write cache's
 * write-cache=PATH, write-cache-size=SIZE, write-cache-mode=on|auto and
 * write-cache-threshold=MS (plx_wcache_config_set; a PATH has no colon). */
static int parse_options(const char **params, unsigned *write_flags, struct plx_wcache_config *wc)
{
    static const char durability[] = "durability=";
    *write_flags = PLX_WRITE_FUA;
    memset(wc, 0, sizeof *wc);
    wc->mode = PLX_WCACHE_ON;
    int size_given = 0; /* length of the first write-cache-* setting */
    const char *given = NULL;
    while (*params) {
        const char *opt = *params;
        const char *end = strchr(opt, ':');
        size_t len = end ? (size_t)(end - opt) : strlen(opt);
        char err[4200];
        int rc;
        if (strncmp(opt, durability, sizeof durability - 1) == 0) {
            const char *v = opt + sizeof durability - 1;
            size_t n = len - (sizeof durability - 1);
            if (n == 3 && strncmp(v, "fua", 3) == 0) {
                *write_flags = PLX_WRITE_FUA;
            } else if (n == 7 && strncmp(v, "ordered", 7) == 0) {
                *write_flags = 0;
            } else {
                tlog_syslog(TLOG_WARN, "parallax: durability=%.*s: expected fua or ordered", (int)n,
                            v);
                return -EINVAL;
            }
        } else if ((rc = plx_wcache_config_set(wc, opt, len, err, sizeof err)) < 0) {
            tlog_syslog(TLOG_WARN, "parallax: %s", err);
            return rc;
        } else if (rc == 1) {
            break; /* not an option: the blockstore or the VDI */
        } else if (strncmp(opt, "write-cache-", 12) == 0 && !size_given) {
            size_given = (int)len; /* a setting that needs write-cache=PATH: the first one */
            given = opt;
        }
        if (!end) {
            tlog_syslog(TLOG_WARN, "parallax: %.*s names no VDI", (int)len, opt);
            return -EINVAL;
        }
        *params = end + 1;
    }
    if (size_given && !wc->path[0]) {
        tlog_syslog(TLOG_WARN, "parallax: %.*s needs write-cache=PATH", size_given, given);
        return -EINVAL;
    }
    return 0;
}

/* The write cache's automatic mode: its rule for the store's writable disks, from tapdisk's loop
 * (blocking while it switches, as a `parallax cache` command served here does). */
static void tick_event(event_id_t id, char mode, void *private)
{
    struct plx_td_store *ps = private;
    uint64_t ticks;
    if (read(ps->tick_fd, &ticks, sizeof ticks) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    for (struct plx_td_disk *d = ps->disks; d; d = d->next) {
        if (!d->vdi || d->read_only || d->waiting)
            continue;
        int rc = plx_vdi_wcache_tick(d->vdi);
        if (rc > 0)
            tlog_syslog(TLOG_INFO,
                        "parallax: %s: write cache %s automatically (store write latency "
                        "%.2f ms)",
                        d->vdi_spec, rc == 1 ? "on" : "turning off (draining its last writes)",
                        plx_store_write_latency_ms(ps->st));
        else if (rc < 0)
            tlog_syslog(TLOG_WARN, "parallax: %s: automatic write cache: %s", d->vdi_spec,
                        plx_store_errmsg(ps->st));
    }
}

static int tick_start(struct plx_td_store *ps)
{
    if (ps->tick_fd >= 0)
        return 0;
    ps->tick_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
    if (ps->tick_fd < 0 || timerfd_settime(ps->tick_fd, 0, &its, NULL) != 0) {
        int e = -errno;
        if (ps->tick_fd >= 0)
            close(ps->tick_fd);
        ps->tick_fd = -1;
        return e;
    }
    ps->tick_event =
        tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, ps->tick_fd, TV_ZERO, tick_event, ps);
    if (ps->tick_event < 0) {
        int rc = ps->tick_event;
        ps->tick_event = -1;
        close(ps->tick_fd);
        ps->tick_fd = -1;
        return rc;
    }
    return 0;
}

/* Attach the write log `wc` names to the disk's store (once per store: a second disk naming the
 * same log shares it; another log is refused), replaying what it holds for the store's VDIs.
 * Blocking, which open() may be. */
static int attach_write_cache(struct plx_td_store *ps, const struct plx_wcache_config *wc)
{
    struct plx_wcache_status ws;
    plx_wcache_status(ps->st, &ws);
    if (ws.attached) {
        if (strcmp(ws.path, wc->path) == 0)
            return 0;
        tlog_syslog(TLOG_WARN,
                    "parallax: write-cache=%s: blockstore %s already has the write log %s in "
                    "this tapdisk",
                    wc->path, ps->path, ws.path);
        return -EBUSY;
    }
    int rc = tick_start(ps);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: write-cache=%s: cannot start its timer: %s", wc->path,
                    strerror(-rc));
        return rc;
    }
    rc = plx_wcache_attach(ps->st, wc->path, wc->size);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: write-cache=%s: %s", wc->path, plx_store_errmsg(ps->st));
        return rc;
    }
    plx_wcache_status(ps->st, &ws);
    tlog_syslog(TLOG_INFO, "parallax: write cache %s on %s (%llu MiB, replayed %llu writes)",
                wc->path, ps->path, (unsigned long long)(ws.log_bytes >> 20),
                (unsigned long long)ws.replayed_records);
    return 0;
}

/* ---- Control socket on tapdisk's scheduler (struct control_host) ---------------------------- */

struct plx_td_watch {
    event_id_t id;
    void (*ready)(void *arg);
    void *arg;
};

static void control_event(event_id_t id, char mode, void *private)
{
    struct plx_td_watch *w = private;
    w->ready(w->arg); /* may unwatch (free) w */
}

static void *control_watch(void *host_arg, int fd, void (*ready)(void *arg), void *arg)
{
    struct plx_td_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->ready = ready;
    w->arg = arg;
    w->id = tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, fd, TV_ZERO, control_event, w);
    if (w->id < 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void control_unwatch(void *host_arg, void *handle)
{
    struct plx_td_watch *w = handle;
    tapdisk_server_unregister_event(w->id);
    free(w);
}

static plx_vdi *control_find_vdi(void *host_arg, uint64_t id, plx_store **st, int *err)
{
    plx_vdi *found = NULL;
    *err = 0;
    for (struct plx_td_store *ps = plx_td_stores; ps; ps = ps->next) {
        for (struct plx_td_disk *d = ps->disks; d; d = d->next) {
            if (d->read_only || !d->vdi || plx_vdi_id(d->vdi) != id)
                continue;
            if (found && found != d->vdi) {
                *err = -EEXIST;
                return NULL;
            }
            found = d->vdi;
            *st = ps->st;
            /* A command may attach a log or start the automatic mode (cache-attach,
             * cache-auto): from now on the store's disks get the automatic mode's tick. */
            if (tick_start(ps) < 0)
                tlog_syslog(TLOG_WARN, "parallax: %s: no timer for the automatic write cache",
                            ps->path);
        }
    }
    return found;
}

static void control_use(void)
{
    if (plx_td_control_users++ > 0)
        return;
    static const struct control_host host = {.watch = control_watch,
                                             .unwatch = control_unwatch,
                                             .find_vdi = control_find_vdi};
    char err[256];
    if (control_start(&host, err, sizeof err) != 0)
        tlog_syslog(TLOG_WARN,
                    "parallax: %s: `parallax vdi-snapshot` and the other admin commands will not "
                    "reach this tapdisk",
                    err);
}

static void control_unuse(void)
{
    if (--plx_td_control_users == 0)
        control_stop();
}

/* ---- Handover: a disk opened while another process holds the VDI --------------------------- */

static void start_request(struct plx_td_disk *d, struct plx_td_slot *s);

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void retry_stop(struct plx_td_disk *d)
{
    if (d->retry.req)
        plx_vdi_open_cancel(d->retry.req);
    if (d->retry.v)
        plx_vdi_close(d->retry.v); /* handed over, but the wait ended first */
    d->retry.req = NULL;
    d->retry.v = NULL;
    d->retry.done = 0;
    if (d->retry_event >= 0)
        tapdisk_server_unregister_event(d->retry_event);
    if (d->retry_fd >= 0)
        close(d->retry_fd);
    d->retry_event = -1;
    d->retry_fd = -1;
}

/* Answer every waiting request with err (the wait is over without the VDI). */
static void fail_waiting(struct plx_td_disk *d, int err)
{
    struct plx_td_slot *s = d->wait_head;
    d->wait_head = d->wait_tail = NULL;
    while (s) {
        struct plx_td_slot *next = s->next_free;
        td_request_t treq = s->treq;
        slot_put(s);
        d->inflight--;
        td_complete_request(treq, err);
        s = next;
    }
}

static void control_use(void);

/* The retry timer: try to take the VDI. Each try is an asynchronous open, which waits for the
 * admin lock on the store's loop and then reads the VDI's record (as `parallax serve` does
 * while it waits); it fails at once while the holder lives. */
static void retry_event(event_id_t id, char mode, void *private)
{
    struct plx_td_disk *d = private;
    uint64_t ticks;
    if (read(d->retry_fd, &ticks, sizeof ticks) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    if (!d->waiting || d->retry.req)
        return;
    plx_store *st = d->store->st;
    plx_vdi *v = NULL;
    int rc;
    if (d->store->failed)
        rc = d->store->failed;
    else if (handover_try_step(&d->retry, d->vdi_spec, &rc, &v))
        return;
    uint64_t waited_ns = mono_ns() - d->wait_since_ns;
    double waited_ms = (double)waited_ns / 1e6;
    if (!d->store->failed && handover_keep_waiting(rc, waited_ns))
        return;
    d->waiting = 0;
    retry_stop(d);
    if (rc == 0 && plx_vdi_size(v) >> SECTOR_SHIFT != d->sectors) {
        tlog_syslog(TLOG_WARN, "parallax: %s: its size changed while this disk waited for it",
                    d->vdi_spec);
        plx_vdi_close(v);
        snprintf(d->retry.err, sizeof d->retry.err, "its size changed");
        rc = -EIO;
    }
    if (rc) {
        d->handover_failed = -EIO;
        tlog_syslog(TLOG_WARN,
                    "parallax: %s: gave up waiting for the VDI after %.0f ms "
                    "(PARALLAX_HANDOVER_WAIT): %s; its requests fail with EIO",
                    d->vdi_spec, waited_ms, !d->store->failed ? d->retry.err : strerror(-rc));
        fail_waiting(d, -EIO);
        return;
    }
    d->vdi = v;
    d->control = 1;
    control_use();
    if (d->write_cache && plx_vdi_wcache_set_mode(v, d->write_cache, &d->wauto) < 0)
        tlog_syslog(TLOG_WARN, "parallax: %s: write cache not on (writes go to the blockstore): %s",
                    d->vdi_spec, plx_store_errmsg(st));
    tlog_syslog(TLOG_INFO, "parallax: %s: handed over after %.1f ms; serving it", d->vdi_spec,
                waited_ms);
    struct plx_td_slot *s = d->wait_head;
    d->wait_head = d->wait_tail = NULL;
    while (s) {
        struct plx_td_slot *next = s->next_free;
        s->next_free = NULL;
        start_request(d, s);
        s = next;
    }
}

/* Another process holds the VDI for writing (during a migration, libxl opens the disk on the
 * destination before it closes it on the source): open the disk anyway, with the size from the
 * VDI's record, and let its requests wait until the holder lets go. */
static int wait_for_holder(struct plx_td_disk *d, const struct plx_vdi_info *info)
{
    d->retry_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct itimerspec its = {.it_interval = {0, 5000000}, .it_value = {0, 5000000}};
    if (d->retry_fd < 0 || timerfd_settime(d->retry_fd, 0, &its, NULL) != 0) {
        int e = errno;
        retry_stop(d);
        return -e;
    }
    d->retry_event =
        tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, d->retry_fd, TV_ZERO, retry_event, d);
    if (d->retry_event < 0) {
        int rc = d->retry_event;
        d->retry_event = -1;
        retry_stop(d);
        return rc;
    }
    d->waiting = 1;
    d->retry.st = d->store->st;
    d->wait_since_ns = mono_ns();
    d->sectors = info->size >> SECTOR_SHIFT;
    return 0;
}

/* ---- Driver callbacks ----------------------------------------------------------------------- */

static int plx_td_open(td_driver_t *driver, const char *params,
                       struct td_vbd_encryption *encryption, td_flag_t flags)
{
    struct plx_td_disk *d = driver->data;
    char bs[PATH_MAX];
    char spec[sizeof d->vdi_spec];

    if (encryption && encryption->encryption_key) {
        tlog_syslog(TLOG_WARN, "parallax: %s: tapdisk encryption is not supported",
                    params ? params : "");
        return -EOPNOTSUPP;
    }
    unsigned write_flags;
    struct plx_wcache_config wc;
    int rc = parse_options(&params, &write_flags, &wc);
    if (rc < 0)
        return rc;
    if (!wc.path[0] && !(flags & TD_OPEN_RDONLY)) {
        /* No write-cache parameter: the host's settings file may name the log. */
        char err[4200];
        rc = plx_wcache_config_read(&wc, err, sizeof err);
        if (rc < 0) {
            tlog_syslog(TLOG_WARN, "parallax: %s", err);
            return rc;
        }
    }
    rc = parse_params(params, bs, sizeof bs, spec, sizeof spec);
    if (rc < 0)
        return rc;

    memset(d, 0, sizeof *d);
    d->driver = driver;
    d->retry_fd = -1;
    d->retry_event = -1;
    d->write_flags = write_flags;
    d->read_only = (flags & TD_OPEN_RDONLY) != 0;
    /* A read-only disk writes nothing to cache. */
    d->write_cache = wc.path[0] && !d->read_only ? wc.mode : 0;
    d->wauto.on_ms = wc.threshold_ms;
    memcpy(d->vdi_spec, spec, sizeof d->vdi_spec);
    d->pool = pool_new(d);
    if (!d->pool)
        return -ENOMEM;

    rc = store_get(bs, d->read_only, &d->store);
    if (rc < 0)
        goto fail_pool;
    plx_store *st = d->store->st;
    /* The log first: it may hold this VDI's last writes, which its replay puts in the store. */
    if (d->write_cache && (rc = attach_write_cache(d->store, &wc)) < 0)
        goto fail_store;
    rc = plx_vdi_open(st, spec, d->read_only ? PLX_OPEN_READONLY : 0, &d->vdi);
    struct plx_vdi_info info;
    if (rc == -EBUSY && !d->read_only && !strchr(spec, '@') &&
        plx_vdi_lookup(st, spec, &info) == 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", plx_store_errmsg(st));
        rc = wait_for_holder(d, &info);
        if (rc == 0) {
            driver->info.size = d->sectors;
            driver->info.sector_size = SECTOR_SIZE;
            driver->info.info = 0;
            store_add_disk(d->store, d);
            tlog_syslog(TLOG_INFO,
                        "parallax: %s on %s: %s; this disk is open and its requests are held, "
                        "waiting for it (up to PARALLAX_HANDOVER_WAIT, default 60 s)",
                        spec, d->store->path, why);
            return 0;
        }
        tlog_syslog(TLOG_WARN, "parallax: %s: cannot wait for the VDI: %s", spec, strerror(-rc));
        goto fail_store;
    }
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: cannot open VDI %s on %s: %s", spec, d->store->path,
                    plx_store_errmsg(st));
        goto fail_store;
    }
    if (!d->read_only && plx_vdi_readonly(d->vdi)) {
        /* A snapshot ("VDI@N") only opens read-only: say so now rather than failing every
         * write of the guest. */
        tlog_syslog(TLOG_WARN,
                    "parallax: %s is a snapshot and read-only; open it read-only "
                    "(tap-ctl create -R, or access=ro)",
                    spec);
        plx_vdi_close(d->vdi);
        d->vdi = NULL;
        rc = -EROFS;
        goto fail_store;
    }
    if (d->write_cache && (rc = plx_vdi_wcache_set_mode(d->vdi, d->write_cache, &d->wauto)) < 0) {
        tlog_syslog(TLOG_WARN, "parallax: %s: cannot turn the write cache on: %s", spec,
                    plx_store_errmsg(st));
        plx_vdi_close(d->vdi);
        d->vdi = NULL;
        goto fail_store;
    }
    uint64_t bytes = plx_vdi_size(d->vdi);
    d->sectors = bytes >> SECTOR_SHIFT;
    driver->info.size = d->sectors;
    driver->info.sector_size = SECTOR_SIZE;
    driver->info.info = 0;
    store_add_disk(d->store, d);
    if (!d->read_only) {
        d->control = 1;
        control_use();
    }
    tlog_syslog(TLOG_INFO, "parallax: opened VDI %s on %s (%llu sectors, %s%s%s%s%s)", spec,
                d->store->path, (unsigned long long)d->sectors, d->read_only ? "ro" : "rw",
                d->read_only ? "" : d->write_flags ? ", durability=fua" : ", durability=ordered",
                d->write_cache ? ", write-cache=" : "", d->write_cache ? wc.path : "",
                d->write_cache == PLX_WCACHE_AUTO ? " (auto)" : "");
    return 0;

fail_store:
    store_put(d->store);
    d->store = NULL;
fail_pool:
    free(d->pool);
    d->pool = NULL;
    return rc;
}

/* Wait (blocking is allowed here: tapdisk calls close outside its I/O path) until the engine
 * has answered every request of this disk. Returns 0, or a negative errno when the engine can
 * no longer answer them. */
static int drain(struct plx_td_disk *d)
{
    struct plx_td_store *ps = d->store;
    while (d->inflight > 0) {
        if (ps->failed)
            return ps->failed;
        int rc = plx_store_service(ps->st);
        if (rc < 0) {
            store_failed(ps, rc);
            return rc;
        }
        if (d->inflight == 0)
            break;
        if (!plx_store_busy(ps->st))
            return -EIO; /* nothing in flight could ever answer them */
        struct pollfd pfd = {.fd = plx_store_fd(ps->st), .events = POLLIN};
        if (poll(&pfd, 1, 1000) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

static int plx_td_close(td_driver_t *driver)
{
    struct plx_td_disk *d = driver->data;
    if (!d->store)
        return 0;
    if (d->waiting) {
        tlog_syslog(TLOG_INFO,
                    "parallax: %s: closed before the VDI was handed over; %u waiting "
                    "requests fail with EIO",
                    d->vdi_spec, d->inflight);
        d->waiting = 0;
        retry_stop(d);
        fail_waiting(d, -EIO);
    }
    int rc = drain(d);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: %s: %u requests unanswered at close: %s", d->vdi_spec,
                    d->inflight, strerror(-rc));
        abandon_inflight(d, -EIO);
    }
    int crc = d->vdi ? plx_vdi_close(d->vdi) : 0;
    if (crc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: closing VDI %s: %s", d->vdi_spec,
                    plx_store_errmsg(d->store->st));
        if (!rc)
            rc = crc;
    }
    d->vdi = NULL;
    store_remove_disk(d->store, d);
    if (d->control)
        control_unuse();
    int closed = store_put(d->store);
    d->store = NULL;
    /* With the engine gone, nothing can call back into the pool; otherwise the callbacks the
     * engine still owes (only after a failure) free it. */
    struct plx_td_pool *p = d->pool;
    d->pool = NULL;
    if (closed || p->engine_pending == 0)
        free(p);
    else
        p->disk = NULL;
    tlog_syslog(TLOG_INFO, "parallax: closed VDI %s", d->vdi_spec);
    return rc;
}

static int plx_td_get_parent_id(td_driver_t *driver, td_disk_id_t *id)
{
    /* Snapshots and clones live inside Parallax's own trees: tapdisk sees no parent chain. */
    return TD_NO_PARENT;
}

static int plx_td_validate_parent(td_driver_t *driver, td_driver_t *parent, td_flag_t flags)
{
    return -EINVAL;
}

/* Submit one request. Never waits: the engine only queues it, and the answer comes through
 * request_done from the event callback. Everything refused here is completed at once. */
static void queue_request(td_driver_t *driver, td_request_t treq, int op)
{
    int write = op == TD_OP_WRITE;
    struct plx_td_disk *d = driver->data;
    if (!d->store) {
        td_complete_request(treq, -EBADF);
        return;
    }
    if (d->store->failed) {
        td_complete_request(treq, d->store->failed);
        return;
    }
    if (write && d->read_only) {
        td_complete_request(treq, -EROFS);
        return;
    }
    if (treq.secs <= 0 || treq.sec > d->sectors || (td_sector_t)treq.secs > d->sectors - treq.sec) {
        tlog_syslog(TLOG_WARN,
                    "parallax: %s: request of %d sectors at %llu is outside the disk "
                    "(%llu sectors)",
                    d->vdi_spec, treq.secs, (unsigned long long)treq.sec,
                    (unsigned long long)d->sectors);
        td_complete_request(treq, -EINVAL);
        return;
    }
    if (d->handover_failed) {
        td_complete_request(treq, d->handover_failed);
        return;
    }
    struct plx_td_slot *s = slot_get(d->pool);
    if (!s) {
        /* The only -EBUSY this driver gives: tapdisk keeps the request and resubmits it. */
        td_complete_request(treq, -EBUSY);
        return;
    }
    s->treq = treq;
    s->op = op;
    d->inflight++;
    if (d->waiting) {
        /* Not ours yet (handover): the request waits, in order, until it is. */
        if (d->wait_tail)
            d->wait_tail->next_free = s;
        else
            d->wait_head = s;
        d->wait_tail = s;
        return;
    }
    start_request(d, s);
}

/* Submit the request in slot s (counted in d->inflight) to the engine. */
static void start_request(struct plx_td_disk *d, struct plx_td_slot *s)
{
    td_request_t treq = s->treq;
    int op = s->op, write = op == TD_OP_WRITE;
    uint64_t off = (uint64_t)treq.sec << SECTOR_SHIFT;
    size_t len = (size_t)treq.secs << SECTOR_SHIFT;
    int rc;
    if (op == TD_OP_BLOCK_STATUS) {
        rc = submit_status(d, s);
    } else {
        rc = write ? plx_vdi_submit_write(d->vdi, treq.buf, off, len, d->write_flags,
                                          request_done, s)
                   : plx_vdi_submit_read(d->vdi, treq.buf, off, len, request_done, s);
        if (rc == 0)
            d->pool->engine_pending++;
    }
    if (rc < 0) {
        /* A refused submit never calls back: answer here. */
        slot_put(s);
        d->inflight--;
        if (rc == -EBUSY)
            rc = -EIO;
        tlog_syslog(TLOG_WARN, "parallax: %s: %s of %d sectors at %llu refused: %s", d->vdi_spec,
                    write ? "write" : op == TD_OP_BLOCK_STATUS ? "block status" : "read",
                    treq.secs, (unsigned long long)treq.sec, plx_store_errmsg(d->store->st));
        td_complete_request(treq, rc);
    }
}

static void plx_td_queue_read(td_driver_t *driver, td_request_t treq)
{
    queue_request(driver, treq, TD_OP_READ);
}

static void plx_td_queue_write(td_driver_t *driver, td_request_t treq)
{
    queue_request(driver, treq, TD_OP_WRITE);
}

static void plx_td_queue_block_status(td_driver_t *driver, td_request_t treq)
{
    queue_request(driver, treq, TD_OP_BLOCK_STATUS);
}

static void plx_td_debug(td_driver_t *driver)
{
    struct plx_td_disk *d = driver->data;
    tlog_syslog(TLOG_INFO, "parallax: %s on %s: %llu sectors, %s, %u requests in flight",
                d->vdi_spec, d->store ? d->store->path : "(closed)", (unsigned long long)d->sectors,
                d->read_only ? "ro" : "rw", d->inflight);
}

struct tap_disk tapdisk_parallax = {
    .disk_type = "tapdisk_parallax",
    .flags = 0,
    .private_data_size = sizeof(struct plx_td_disk),
    .td_open = plx_td_open,
    .td_close = plx_td_close,
    .td_get_parent_id = plx_td_get_parent_id,
    .td_validate_parent = plx_td_validate_parent,
    .td_queue_read = plx_td_queue_read,
    .td_queue_write = plx_td_queue_write,
    .td_queue_block_status = plx_td_queue_block_status,
    .td_debug = plx_td_debug,
    .td_stats = NULL,
    .td_rrd = NULL,
};
