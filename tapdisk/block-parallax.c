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
 * What opening a disk sets up (the shared store, the parameters, the write cache, the control
 * socket) is in block-parallax-open.c; block-parallax.h has what the two files share.
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

#include "block-parallax.h"

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
    if (ps->kick_event >= 0) {
        tapdisk_server_unregister_event(ps->kick_event);
        ps->kick_event = -1;
        ps->kicked = 0;
    }
    for (struct plx_td_disk *d = ps->disks; d; d = d->next)
        abandon_inflight(d, err);
}

/* One service pass of the store from tapdisk's loop; it serves any kick that was due. */
static void store_service(struct plx_td_store *ps)
{
    if (ps->kicked) {
        ps->kicked = 0;
        tapdisk_server_event_set_timeout(ps->kick_event, TV_INF);
    }
    ps->in_service = 1;
    int rc = plx_store_service(ps->st);
    ps->in_service = 0;
    if (rc < 0)
        store_failed(ps, rc);
}

/* tapdisk read event on plx_store_fd(): the engine has completions or I/O to advance. */
void plx_td_store_event(event_id_t id, char mode, void *private)
{
    store_service(private);
}

/* The kick (struct plx_td_store, kick_event): due when a request was submitted from tapdisk's
 * loop; nothing to do if the descriptor's event serviced the store first in this turn. */
void plx_td_store_kick(event_id_t id, char mode, void *private)
{
    struct plx_td_store *ps = private;
    if (ps->kicked)
        store_service(ps);
}

/* Before a submission from tapdisk's loop (not from a service pass, which runs what it queues
 * before it returns): promise the engine the next turn's service, and make that turn come at
 * once. Without the kick the engine wakes itself through its eventfd, a write and a read per
 * request (bench/notes/fua-tapdisk.md). */
static void store_kick(struct plx_td_store *ps)
{
    if (ps->kicked || ps->in_service || ps->kick_event < 0)
        return;
    if (tapdisk_server_event_set_timeout(ps->kick_event, TV_ZERO) != 0)
        return;
    ps->kicked = 1;
    plx_store_will_service(ps->st);
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
    plx_td_control_use();
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
    int rc = plx_td_parse_options(&params, &write_flags, &wc);
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
    rc = plx_td_parse_params(params, bs, sizeof bs, spec, sizeof spec);
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

    rc = plx_td_store_get(bs, d->read_only, &d->store);
    if (rc < 0)
        goto fail_pool;
    plx_store *st = d->store->st;
    /* The log first: it may hold this VDI's last writes, which its replay puts in the store. */
    if (d->write_cache && (rc = plx_td_attach_write_cache(d->store, &wc)) < 0)
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
            plx_td_store_add_disk(d->store, d);
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
    plx_td_store_add_disk(d->store, d);
    if (!d->read_only) {
        d->control = 1;
        plx_td_control_use();
    }
    tlog_syslog(TLOG_INFO, "parallax: opened VDI %s on %s (%llu sectors, %s%s%s%s%s)", spec,
                d->store->path, (unsigned long long)d->sectors, d->read_only ? "ro" : "rw",
                d->read_only ? "" : d->write_flags ? ", durability=fua" : ", durability=ordered",
                d->write_cache ? ", write-cache=" : "", d->write_cache ? wc.path : "",
                d->write_cache == PLX_WCACHE_AUTO ? " (auto)" : "");
    return 0;

fail_store:
    plx_td_store_put(d->store);
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
    plx_td_store_remove_disk(d->store, d);
    if (d->control)
        plx_td_control_unuse();
    int closed = plx_td_store_put(d->store);
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
    store_kick(d->store);
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
