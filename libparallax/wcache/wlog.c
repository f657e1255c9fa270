/*
 * wlog.c - the write cache: a per-host write log on local disk (layer 6; wlog.h). This file:
 * a cached VDI's entry points and its queue; wlog_shared.h lists the files of the rest.
 *
 * The log is a ring of batches on the side medium (st->side_be): block 0 is the head block
 * (whose blockstore and host, where the durable tail is), and each batch is one log write, a
 * header block listing up to 126 records followed by their data (docs/FORMAT.md §12).
 *
 * Life of a cached write: it waits in its VDI's queue (FIFO, so sub-block writes can read the
 * edges of their blocks first), is copied into the gathering batch (a large one is not: zc_min,
 * wlog_policy.h) and indexed, and completes when its batch is written. A batch is sealed and
 * written at the end of the service pass that filled it, up to MAX_FLYING at once; while those
 * fly, the next one gathers. A flush completes after a log flush issued once every batch sealed
 * before it was written. The drain takes the oldest written batches (a round; a round never
 * spans a guest flush), reads their data back, submits it to the pipeline in log order, flushes
 * the VDIs it touched, and then writes the head block with the new tail (FUA). Only then is the
 * ring space reused.
 *
 * If the log fails (EIO on a write or flush), the cache falls back to write-through: batches
 * not written stay in memory, every VDI's record stops naming the log once the batches before
 * them are drained, and their requests complete when the drain has made them durable in the
 * store.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "vdi_io.h"
#include "wlog_shared.h"

/* ---- Queue ----------------------------------------------------------------------------------- */

static void edge_done(void *arg, int status);
static void merge_edges(struct wreq *r);
static void q_pop(struct plx_wlog_vdi *w)
{
    struct wreq *r = w->q_head;
    w->q_head = r->qnext;
    if (!w->q_head)
        w->q_tail = NULL;
}

void wlog_direct_done(void *arg, int status)
{
    struct wreq *r = arg;
    r->cb(r->arg, status);
    free(r);
}

void wlog_process_queue(struct plx_wlog *wl, struct plx_wlog_vdi *w)
{
    struct wreq *r;
    while ((r = w->q_head)) {
        if (r->kind == Q_READ) {
            /* Its turn: everything submitted before it is in the index or the pipeline. */
            q_pop(w);
            int rc = wlog_read(r->v, r->rbuf, r->off, r->len, wlog_direct_done, r);
            if (rc) {
                r->status = rc;
                r->done.run = wlog_req_run_done;
                plx_defer(wl->st, &r->done);
            }
            continue;
        }
        if (r->kind != Q_WRITE) {
            /* A trim or snapshot goes straight to the pipeline once everything before it in
             * this VDI's queue has been drained (so the pipeline orders it after them). */
            if (w->records) {
                if (wl->gather && wl->gather->nent)
                    wlog_seal(wl, wl->gather);
                if (wl->deferred)
                    wlog_kick_later(wl); /* it waits for the drain: not deferred (drain_wanted) */
                return;
            }
            q_pop(w);
            int rc =
                r->kind == Q_TRIM
                    ? plx_vdi_direct_trim(r->v, r->off, r->len, wlog_direct_done, r)
                    : plx_vdi_direct_snapshot(r->v, r->label, r->index_out, wlog_direct_done, r);
            if (r->kind == Q_TRIM && !rc) {
                w->direct_dirty = true;
                w->direct_seq = plx_vdi_next_seq(r->v);
            }
            if (rc) {
                r->status = rc;
                r->done.run = wlog_req_run_done;
                plx_defer(wl->st, &r->done);
            }
            continue;
        }
        if (!r->ready) {
            if (!r->edges_started) {
                /* A sub-block write: read the old contents of its edge blocks first (through
                 * the index, so earlier writes in the queue are seen); the queue waits. */
                r->edges_started = true;
                bool head = r->off % BS != 0, tail = (r->off + r->len) % BS != 0;
                if (head) {
                    r->edge_pending++;
                    int rc = wlog_read_blocks(r->v, r->edge, r->b0, 1, edge_done, r);
                    if (rc)
                        r->edge_pending--, r->status = rc;
                }
                if (tail && !(head && r->b1 - 1 == r->b0)) {
                    r->edge_pending++;
                    int rc = wlog_read_blocks(r->v, r->edge + BS, r->b1 - 1, 1, edge_done, r);
                    if (rc)
                        r->edge_pending--, r->status = rc;
                }
                if (!r->edge_pending)
                    merge_edges(r);
            }
            if (!r->ready)
                return;
            if (r->status) {
                q_pop(w);
                wlog_req_complete(wl, r, r->status);
                continue;
            }
        }
        if (!wlog_append(wl, w, r))
            return;
        q_pop(w);
    }
}

bool wlog_detach_left(const struct plx_wlog_vdi *w)
{
    return w->q_head || w->records;
}

void wlog_process_all(struct plx_wlog *wl)
{
    for (struct plx_wlog_vdi *w = wl->vdis; w; w = w->next)
        wlog_process_queue(wl, w);
    /* A VDI being turned off without a wait (plx_wlog_vdi_try_detach) leaves the log here, the
     * moment its last record is drained: what it was holding goes to the pipeline now. */
    for (struct plx_wlog_vdi *w = wl->vdis, *nx; w; w = nx) {
        nx = w->next;
        if (w->detaching && w->async_detach && !wlog_detach_left(w) && !wl->drain_error)
            wlog_detach_finish(w->v);
    }
}

/* The end of turning the cache off for v: it leaves the log's list, and what arrived meanwhile
 * goes straight to the pipeline, in order. */
void wlog_detach_finish(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    for (struct plx_wlog_vdi **pp = &wl->vdis; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    v->wc = NULL;
    if (w->direct_dirty || w->held_head)
        v->wpass_dirty = true; /* (what went straight to the pipeline: the next flush covers it) */
    for (struct wreq *r = w->held_head, *nx; r; r = nx) {
        nx = r->qnext;
        int src;
        if (r->kind == Q_WRITE)
            src = plx_vdi_direct_write(v, r->ubuf, r->off, r->len, r->flags, wlog_direct_done, r);
        else if (r->kind == Q_READ)
            src = plx_vdi_direct_read(v, r->rbuf, r->off, r->len, wlog_direct_done, r);
        else if (r->kind == Q_TRIM)
            src = plx_vdi_direct_trim(v, r->off, r->len, wlog_direct_done, r);
        else
            src = plx_vdi_direct_snapshot(v, r->label, r->index_out, wlog_direct_done, r);
        if (src) {
            r->status = src;
            r->done.run = wlog_req_run_done;
            plx_defer(st, &r->done);
        } else {
            plx_block_free(r->merged);
            plx_block_free(r->edge);
            r->merged = r->edge = NULL;
        }
    }
    free(w);
}

/* The old edge blocks around the new bytes. */
static void merge_edges(struct wreq *r)
{
    uint64_t nb = r->b1 - r->b0;
    bool head = r->off % BS != 0, tail = (r->off + r->len) % BS != 0;
    if (head)
        memcpy(r->merged, r->edge, BS);
    if (tail) {
        const uint8_t *src = (head && nb == 1) ? r->edge : r->edge + BS;
        memcpy(r->merged + (nb - 1) * BS, src, BS);
    }
    memcpy(r->merged + r->off % BS, r->ubuf, r->len);
    r->ready = true;
}

/* An edge read completed (from the service loop, never inside wlog_process_queue). */
static void edge_done(void *arg, int status)
{
    struct wreq *r = arg;
    if (status && !r->status)
        r->status = status;
    if (--r->edge_pending)
        return;
    merge_edges(r);
    if (r->v->wc)
        wlog_process_queue(r->v->st->wlog, r->v->wc);
}

void wlog_enqueue(struct plx_wlog_vdi *w, struct wreq *r)
{
    r->qnext = NULL;
    if (w->detaching) {
        r->held = true;
        if (w->held_tail)
            w->held_tail->qnext = r;
        else
            w->held_head = r;
        w->held_tail = r;
        return;
    }
    if (w->q_tail)
        w->q_tail->qnext = r;
    else
        w->q_head = r;
    w->q_tail = r;
}

/* ---- Entry points ---------------------------------------------------------------------------- */

static int entry_check(struct plx_vdi *v, uint64_t off, uint64_t len)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (v->ro)
        return plx_err(v->st, -EROFS, "VDI %s is open read-only", v->rec.name);
    if (off > v->rec.size || len > v->rec.size - off)
        return plx_err(v->st, -EINVAL, "request at %llu+%llu is beyond the end of VDI %s (%llu)",
                       (unsigned long long)off, (unsigned long long)len, v->rec.name,
                       (unsigned long long)v->rec.size);
    return 0;
}

struct wreq *wlog_req_new(struct plx_vdi *v, enum qkind kind, uint64_t off, uint64_t len,
                          plx_done_fn cb, void *arg)
{
    struct wreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->v = v;
    r->kind = kind;
    r->off = off;
    r->len = len;
    r->b0 = off / BS;
    r->b1 = (off + len + BS - 1) / BS;
    r->next_b = r->b0;
    r->cb = cb;
    r->arg = arg;
    return r;
}

int plx_wlog_submit_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                         void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (off > v->rec.size || len > v->rec.size - off || len == 0)
        return plx_vdi_direct_read(v, buf, off, len, cb, arg); /* its checks and messages */
    if (!v->wc->q_head && !v->wc->held_head)
        return wlog_read(v, buf, off, len, cb, arg);
    /* Requests of one block are carried out in submission order: a read waits behind the
     * writes, trims and snapshots queued before it. */
    struct wreq *r = wlog_req_new(v, Q_READ, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->rbuf = buf;
    wlog_enqueue(v->wc, r);
    if (!r->held)
        wlog_process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_submit_write(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                          unsigned flags, plx_done_fn cb, void *arg)
{
    int rc = entry_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0)
        return plx_vdi_direct_write(v, buf, off, len, flags, cb, arg);
    struct wreq *r = wlog_req_new(v, Q_WRITE, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->flags = flags;
    r->ubuf = buf;
    if (off % BS == 0 && len % BS == 0) {
        r->src = buf;
        r->ready = true;
    } else {
        r->merged = plx_block_alloc(r->b1 - r->b0);
        r->edge = plx_block_alloc(2);
        r->src = r->merged;
    }
    wlog_enqueue(v->wc, r);
    if (!r->held)
        wlog_process_queue(v->st->wlog, v->wc);
    return 0;
}

/* A flush that needs both the log and the store flushed: completes once, with the first error. */
struct flush_join {
    plx_done_fn cb;
    void *arg;
    int pending, status;
};

static void flush_join_done(void *arg, int status)
{
    struct flush_join *j = arg;
    if (status && !j->status)
        j->status = status;
    if (--j->pending)
        return;
    plx_done_fn cb = j->cb;
    void *carg = j->arg;
    int st = j->status;
    free(j);
    cb(carg, st);
}

/* A flush of the store medium itself, outside the pipeline (whose flush waits for every batch
 * in flight before it): it makes durable what has completed so far. */
struct raw_flush {
    struct plx_ev ev;
    struct flush_join *j;
};

static void raw_flush_done(struct plx_store *st, struct plx_ev *ev)
{
    struct raw_flush *f = ev->ctx;
    struct flush_join *j = f->j;
    int status = ev->status;
    free(f);
    flush_join_done(j, status);
}

static int raw_flush(plx_store *st, struct flush_join *j)
{
    struct raw_flush *f = calloc(1, sizeof *f);
    if (!f)
        return plx_err(st, -ENOMEM, "out of memory");
    f->j = j;
    f->ev.io = (struct plx_io){.op = PLX_IO_FLUSH};
    f->ev.handler = raw_flush_done;
    f->ev.ctx = f;
    int rc = plx_submit(st, &f->ev);
    if (rc)
        free(f);
    return rc;
}

int plx_wlog_submit_flush(struct plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    struct plx_wlog *wl = v->st->wlog;
    /* Writes completed before now are in batches sealed before now. */
    if (!v->wc->direct_dirty)
        return wlog_add_flush_waiter(wl, wl->next_seq - 1, cb, arg, NULL);
    /* A trim completed straight in the pipeline: the store needs its flush as well. */
    struct flush_join *j = calloc(1, sizeof *j);
    if (!j)
        return plx_err(v->st, -ENOMEM, "out of memory");
    j->cb = cb;
    j->arg = arg;
    j->pending = 2;
    struct plx_wlog_vdi *w = v->wc;
    /* When every request before direct_seq still in flight is a rescued write (in the log as
     * well), the store's flush need not wait for them: a flush of the medium covers what has
     * finished. Otherwise the pipeline's flush, which covers what was submitted before it. */
    bool raw = plx_vdi_active_before(v, w->direct_seq) == w->rescued_inflight;
    int rc = raw ? raw_flush(v->st, j) : plx_vdi_direct_flush(v, flush_join_done, j);
    if (rc) {
        free(j);
        return rc;
    }
    /* This store flush covers what went straight to the pipeline and has finished; a request
     * still in flight (not rescued) needs the next one. */
    w->direct_dirty = !raw && !plx_vdi_finished_before(v, w->direct_seq);
    rc = wlog_add_flush_waiter(wl, wl->next_seq - 1, flush_join_done, j, NULL);
    if (rc)
        flush_join_done(j, rc); /* the store's flush is still to come: it completes j */
    return 0;
}

int plx_wlog_submit_trim(struct plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb,
                         void *arg)
{
    int rc = entry_check(v, off, len);
    if (rc)
        return rc;
    struct wreq *r = wlog_req_new(v, Q_TRIM, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    wlog_enqueue(v->wc, r);
    if (!r->held)
        wlog_process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_submit_snapshot(struct plx_vdi *v, const char *label, uint64_t *index_out,
                             plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (!label)
        label = "";
    if (strlen(label) > PLX_LABEL_MAX)
        return plx_err(v->st, -EINVAL, "snapshot label '%s' is longer than %d bytes", label,
                       PLX_LABEL_MAX);
    struct wreq *r = wlog_req_new(v, Q_SNAP, 0, 0, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    snprintf(r->label, sizeof r->label, "%s", label);
    r->index_out = index_out;
    wlog_enqueue(v->wc, r);
    if (!r->held)
        wlog_process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_block_status(struct plx_vdi *v, uint64_t off, uint64_t *len)
{
    struct plx_wlog *wl = v->st->wlog;
    /* At most SCAN blocks are looked at; the answer covers no more than that. */
    enum { SCAN = 65536 };
    uint64_t b = off / BS, end = off + *len;
    bool hit = wlog_index_find(wl, v->rec.id, b, NULL) != NULL;
    uint64_t e = b + 1;
    while (e * BS < end && e - b < SCAN && (wlog_index_find(wl, v->rec.id, e, NULL) != NULL) == hit)
        e++;
    if (e * BS < end)
        *len = e * BS - off;
    return hit;
}
