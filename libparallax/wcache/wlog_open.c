/*
 * wlog_open.c - the write log's life: its head block checked or written at open, the log
 * closed (drained) and freed, its status and the drain's pause (layer 6; wlog.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>
#include "wlog_shared.h"

/* ---- Blocking I/O on the log (attach, replay, detach: nothing else in flight) ---------------- */

static void side_sync_done(struct plx_io *io, int status)
{
    int *r = io->owner;
    r[0] = status;
    r[1] = 1;
}

int wlog_side_sync(struct plx_wlog *wl, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                   unsigned flags)
{
    int r[2] = {0, 0};
    struct plx_io io = {.op = op, .flags = flags, .block = block, .nblocks = n, .buf = buf};
    io.done = side_sync_done;
    io.owner = r;
    int rc = wl->be->ops->submit(wl->be, &io);
    if (rc)
        return rc;
    while (!r[1]) {
        rc = wl->be->ops->poll(wl->be, -1);
        if (rc < 0 && rc != -EINTR)
            return rc;
    }
    return r[0];
}

/* ---- Open, close, status --------------------------------------------------------------------- */

static uint64_t random_id(void)
{
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &x, sizeof x) != sizeof x)
            x = 0;
        close(fd);
    }
    if (!x)
        x = plx_now_ns() ^ ((uint64_t)getpid() << 32);
    return x ? x : 1;
}

uint64_t plx_wlog_id(const plx_store *st)
{
    return st->wlog ? st->wlog->log_id : 0;
}

const char *plx_wlog_desc(const plx_store *st)
{
    return st->wlog ? st->wlog->desc : "";
}

static void hex_uuid(const uint8_t u[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", u[i]);
}

static void wlog_free(plx_store *st)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    for (size_t i = 0; i <= wl->mask; i++)
        for (struct ient *e = wl->tab[i], *nx; e; e = nx) {
            nx = e->next;
            plx_slab_free(&wl->ient_slab, e);
        }
    free(wl->tab);
    for (struct wbatch *b = wl->first, *nx; b; b = nx) {
        nx = b->next;
        free(b->buf);
        free(b->wevs);
        wlog_batch_free(wl, b);
    }
    plx_slab_destroy(&wl->batch_slab);
    plx_slab_destroy(&wl->ient_slab);
    for (unsigned k = 0; k < ENT_CLASSES; k++)
        plx_slab_destroy(&wl->ent_slab[k]);
    while (wl->nspare)
        free(wl->spare[--wl->nspare]);
    plx_block_free(wl->rarena);
    free(wl->touched);
    plx_timer_cancel(st, &wl->drain_timer);
    plx_block_free(wl->head);
    if (st->side_be)
        st->side_be->ops->destroy(st->side_be);
    st->side_be = NULL;
    if (wl->lock_fd >= 0)
        close(wl->lock_fd);
    free(wl);
    st->wlog = NULL;
}

void plx_wlog_abandon(plx_store *st)
{
    wlog_free(st);
}

void plx_wlog_head_init(const plx_store *st, void *block, uint64_t nblocks)
{
    struct plx_wlog_head *h = block;
    memset(h, 0, BS);
    h->version = PLX_WLOG_VERSION;
    memcpy(h->store_uuid, st->sb.uuid, 16);
    h->host_hash = st->host_hash;
    snprintf(h->host, sizeof h->host, "%s", st->host);
    h->log_blocks = nblocks;
    h->log_id = random_id();
    h->tail_seq = 1;
    h->tail_pos = 1;
    h->created_ns = plx_now_ns();
    plx_blkhdr_seal(h, PLX_MAGIC_WLOG_HEAD, 0);
}

/* The log's head is checked (or, init and empty, written); nothing is replayed yet
 * (wlog_attach.c). On failure nothing is attached and be is destroyed. */
int plx_wlog_open(plx_store *st, plx_backend *be, int init, const char *desc)
{
    if (st->wlog) {
        be->ops->destroy(be);
        return plx_err(st, -EBUSY, "a write log is already attached to this store");
    }
    if (st->read_only) {
        be->ops->destroy(be);
        return plx_err(st, -EROFS, "blockstore opened read-only: no write cache");
    }
    if (be->nblocks < MIN_LOG_BLOCKS) {
        int rc = plx_err(st, -EINVAL,
                         "write log %s is too small: %llu KiB; it needs at least %llu KiB (two of "
                         "its largest writes)",
                         desc, (unsigned long long)be->nblocks * 4,
                         (unsigned long long)MIN_LOG_BLOCKS * 4);
        be->ops->destroy(be);
        return rc;
    }
    struct plx_wlog *wl = calloc(1, sizeof *wl);
    if (!wl) {
        be->ops->destroy(be);
        return plx_err(st, -ENOMEM, "out of memory");
    }
    wl->st = st;
    wl->be = be;
    wl->lock_fd = -1;
    plx_slab_init(&wl->batch_slab, sizeof(struct wbatch));
    plx_slab_init(&wl->ient_slab, sizeof(struct ient));
    for (unsigned k = 0; k < ENT_CLASSES; k++)
        plx_slab_init(&wl->ent_slab[k],
                      (k < ENT_CLASSES - 1 ? 1u << k : PLX_WLOG_PER_BATCH) * sizeof(struct went));
    wl->nblocks = be->nblocks;
    plx_wlog_policy_init(&wl->pol);
    wl->dio_align = plx_backend_dio_align(be);
    wl->drain_timer.run = wlog_drain_timer_run;
    wl->queues_run = wlog_process_all;
    wl->drain_kick = wlog_drain_kick;
    wl->mask = 1023;
    wl->tab = calloc(wl->mask + 1, sizeof *wl->tab);
    wl->head = plx_block_alloc(1);
    wl->attach_ns = plx_now_ns();
    snprintf(wl->desc, sizeof wl->desc, "%s", desc);
    st->wlog = wl;
    st->side_be = be;
    int rc = wl->tab ? 0 : plx_err(st, -ENOMEM, "out of memory");
    /* (Tests put store and log on one medium, whose one fd is watched already.) */
    if (!rc && be->ops->fd(be) >= 0 && be->ops->fd(be) != st->be->ops->fd(st->be))
        rc = plx_engine_watch_fd(st, be->ops->fd(be));
    if (!rc) {
        rc = wlog_side_sync(wl, PLX_IO_READ, 0, 1, wl->head, 0);
        if (rc)
            plx_err(st, rc, "reading write log %s: %s", desc, strerror(-rc));
    }
    const char *why = NULL;
    int vrc = rc ? 0 : plx_blkhdr_verify(wl->head, PLX_MAGIC_WLOG_HEAD, 0, &why);
    struct plx_wlog_head *h = wl->head;
    if (!rc && vrc == -ENODATA && init) {
        plx_wlog_head_init(st, h, wl->nblocks);
        rc = wlog_side_sync(wl, PLX_IO_WRITE, 0, 1, h, PLX_IO_FUA);
        if (rc)
            plx_err(st, rc, "writing the head of write log %s: %s", desc, strerror(-rc));
    } else if (!rc && vrc) {
        rc = plx_err(st, -EINVAL, "%s is not a Parallax write log (%s)", desc,
                     vrc == -ENODATA ? "it is empty" : why);
    } else if (!rc) {
        char a[33], b[33];
        hex_uuid(h->store_uuid, a);
        hex_uuid(st->sb.uuid, b);
        if (h->version != PLX_WLOG_VERSION)
            rc = plx_err(st, -EPROTONOSUPPORT,
                         "write log %s has version %u; this Parallax reads "
                         "version %u",
                         desc, h->version, PLX_WLOG_VERSION);
        else if (memcmp(h->store_uuid, st->sb.uuid, 16))
            rc = plx_err(st, -EXDEV,
                         "write log %s belongs to another blockstore (uuid %s; this one is %s): "
                         "attach it to that one",
                         desc, a, b);
        else if (h->host_hash != st->host_hash)
            rc = plx_err(st, -EPERM,
                         "write log %s belongs to host %.64s, and this is host %s: replay it on "
                         "that host, or drop its writes with 'parallax cache discard'",
                         desc, h->host, st->host);
        else if (h->log_blocks != wl->nblocks)
            rc = plx_err(st, -EUCLEAN, "write log %s was made %llu KiB long and is now %llu KiB",
                         desc, (unsigned long long)h->log_blocks * 4,
                         (unsigned long long)wl->nblocks * 4);
    }
    if (!rc)
        wl->log_id = h->log_id;
    if (rc) {
        wlog_free(st);
        return rc;
    }
    return 0;
}

int plx_wlog_close(plx_store *st)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return 0;
    int rc = 0;
    wl->closing = true; /* nothing defers the drain from here on */
    for (struct plx_vdi *v = st->vdis; v; v = v->next)
        if (v->wc) {
            int c = plx_wlog_vdi_detach(v);
            if (!rc)
                rc = c;
        }
    /* Nothing of the log may still be in flight when its medium goes. */
    while (wl->flying || wl->flush_inflight || wl->round_active || st->ready_head ||
           st->deferred_head) {
        int s = plx_store_service(st);
        if (s < 0)
            break;
        if (!(wl->flying || wl->flush_inflight || wl->round_active))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
        if (wl->drain_error && !wl->flying && !wl->flush_inflight && !wl->log_reads)
            break;
    }
    if (wl->drain_error && !rc)
        rc = plx_err(st, wl->drain_error, "%s", wl->error);
    wlog_free(st);
    return rc;
}

void plx_wlog_stats(const plx_store *st, struct plx_wlog_stats *out)
{
    memset(out, 0, sizeof *out);
    const struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    out->attached = 1;
    out->failed = wl->failed;
    out->log_bytes = wl->nblocks * BS;
    uint64_t used = 0;
    for (const struct wbatch *b = wl->first; b; b = b->next)
        if (!b->memory_only && b->state >= B_FLYING)
            used += 1 + b->ndata;
    out->used_bytes = used * BS;
    out->backlog_records = wl->backlog_records;
    out->backlog_bytes = wl->backlog_blocks * BS;
    out->drained_bytes = wl->drained_bytes;
    out->attach_ns = wl->attach_ns;
    out->replayed_records = wl->replayed_records;
    out->logged_bytes = wl->logged_bytes;
    out->zc_bytes = wl->zc_bytes;
    out->zc_records = wl->zc_records;
    out->drain_delay_ms = wl->pol.drain_delay_ns / 1000000u;
    out->drain_max_age_ms = wl->pol.drain_max_age_ns / 1000000u;
    if (wl->first)
        out->oldest_ms = (plx_mono_ns() - wl->first->born_ns) / 1000000u;
    out->drain = wl->drain_error    ? PLX_WLOG_DRAIN_STOPPED
                 : wl->failed       ? PLX_WLOG_DRAIN_EAGER
                 : wl->drain_paused ? PLX_WLOG_DRAIN_PAUSED
                 : wl->round_active ? PLX_WLOG_DRAIN_RUNNING
                 : !wl->first       ? PLX_WLOG_DRAIN_IDLE
                 : wl->deferred     ? PLX_WLOG_DRAIN_DEFERRED
                                    : PLX_WLOG_DRAIN_EAGER;
    snprintf(out->desc, sizeof out->desc, "%s", wl->desc);
    snprintf(out->error, sizeof out->error, "%s", wl->error);
}

void plx_wlog_pause_drain(plx_store *st, int pause)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    wl->drain_paused = pause != 0;
    if (!pause)
        wlog_drain_kick(wl);
}

void plx_wlog_keep_fd(plx_store *st, int fd)
{
    if (st->wlog)
        st->wlog->lock_fd = fd;
    else
        close(fd);
}
