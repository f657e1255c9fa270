/*
 * wlog_pass.c - writes of a VDI in the automatic mode with the cache off: passed to the
 * pipeline and tracked, so that turning the cache on puts them in the log too (layer 6;
 * wlog.h, wlog_shared.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "vdi_io.h"
#include "wlog_shared.h"

/* ---- Writes passed through to the pipeline (automatic mode, cache off) ------------------------
 *
 * Turning the cache on should take effect at once, also for what the guest has already written:
 * its writes still queued to the slow store, and those completed there since its last flush,
 * which its next flush would otherwise have to wait for (a store flush queues behind every write
 * in flight). So in the automatic mode with the cache off, each aligned write goes to the
 * pipeline as usual but is tracked, with a copy of its data (up to pol.pass_copy_max bytes
 * per store), until a flush has covered it. When the cache turns on, the tracked writes are put in
 * the log in their order, before anything new: those in flight complete from there, and the
 * guest's next flush needs no store flush. The pipeline's own writes go on; the drain writes the
 * same data after them. Whatever else completes in the pipeline (sub-block and FUA writes,
 * trims, snapshots, a write without a copy) sets wpass_dirty instead, and drops the tracked
 * writes before it (a record appended later must not overwrite it). */

struct plx_wpass {
    struct plx_vdi *v;
    /* A copy of the data (or NULL, past the budget): the pipeline writes from it, so that the
     * write can be answered from the log while the pipeline's goes on. Freed with the entry. */
    uint8_t *copy;
    uint64_t off;
    size_t len;
    plx_done_fn cb;
    void *arg;
    uint64_t flush_gen; /* a flush covers it once it completes (0: none yet) */
    bool rescued;       /* in flight when the cache turned on: it completes from the log */
    bool answered;      /* its callback ran */
    bool in_store;      /* the pipeline's write completed */
    bool listed;
    struct plx_wpass *prev, *next;
};

static void wpass_unlink(struct plx_wpass *p)
{
    struct plx_vdi *v = p->v;
    if (!p->listed)
        return;
    p->listed = false;
    if (p->prev)
        p->prev->next = p->next;
    else
        v->wpass_head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        v->wpass_tail = p->prev;
    p->prev = p->next = NULL;
}

static void wpass_drop_copy(struct plx_wpass *p)
{
    if (!p->copy)
        return;
    p->v->st->wpass_copy_bytes -= p->len;
    plx_block_free(p->copy);
    p->copy = NULL;
}

static void wpass_free(struct plx_wpass *p)
{
    wpass_unlink(p);
    wpass_drop_copy(p);
    free(p);
}

/* Something went to the pipeline that the tracked writes do not cover, or that a record of one
 * of them appended later would overwrite: drop them (those in flight complete from the store). */
static void wpass_untrack(struct plx_vdi *v)
{
    v->wpass_dirty = true;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->in_store)
            wpass_free(p);
        else
            wpass_unlink(p); /* (the pipeline still writes from its copy) */
    }
}

static bool wpass_on(const struct plx_vdi *v)
{
    return v->wauto.on && !v->wc && v->st->wlog && !v->ro;
}

void plx_wlog_pass_untracked(struct plx_vdi *v)
{
    if (wpass_on(v) || v->wpass_head)
        wpass_untrack(v);
}

static void wpass_store_done(void *arg, int status)
{
    struct plx_wpass *p = arg;
    struct plx_vdi *v = p->v;
    p->in_store = true;
    if (p->rescued) {
        /* Its record in the log answers it, and the drain writes it again: a failure here is
         * the drain's to see. */
        if (v->wc && v->wc->rescued_inflight)
            v->wc->rescued_inflight--;
        if (p->answered)
            wpass_free(p);
        return;
    }
    p->answered = true;
    plx_done_fn cb = p->cb;
    void *carg = p->arg;
    if (!p->listed || status || !p->copy || !wpass_on(v)) {
        if (!status)
            v->wpass_dirty = true; /* completed in the store, and nothing tracks it */
        wpass_free(p);
    }
    cb(carg, status);
}

static void wpass_log_done(void *arg, int status)
{
    struct plx_wpass *p = arg;
    p->answered = true;
    plx_done_fn cb = p->cb;
    void *carg = p->arg;
    if (p->in_store)
        wpass_free(p); /* (else the pipeline still writes from its copy: freed when it is done) */
    cb(carg, status);
}

/* A completed write put in the log from its copy: it was answered long ago. */
static void wpass_copy_logged(void *arg, int status)
{
    struct plx_wpass *p = arg;
    struct plx_vdi *v = p->v;
    if (status && v->wc) {
        v->wc->direct_dirty = true; /* not in the log after all: the store's flush covers it */
        v->wc->direct_seq = plx_vdi_next_seq(v);
    }
    wpass_free(p);
}

int plx_wlog_submit_passthrough(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                                unsigned flags, plx_done_fn cb, void *arg)
{
    if (off % BS || len % BS || !len || (flags & PLX_WRITE_FUA)) {
        int rc = plx_vdi_direct_write(v, buf, off, len, flags, cb, arg);
        if (!rc)
            wpass_untrack(v);
        return rc;
    }
    struct plx_wpass *p = calloc(1, sizeof *p);
    if (!p)
        return plx_err(v->st, -ENOMEM, "out of memory");
    *p = (struct plx_wpass){.v = v, .off = off, .len = len, .cb = cb, .arg = arg};
    if (v->st->wpass_copy_bytes + len <= v->st->wlog->pol.pass_copy_max) {
        p->copy = plx_block_alloc(len / BS);
        memcpy(p->copy, buf, len);
        v->st->wpass_copy_bytes += len;
    }
    int rc = plx_vdi_direct_write(v, p->copy ? p->copy : buf, off, len, flags, wpass_store_done, p);
    if (rc) {
        wpass_drop_copy(p);
        free(p);
        return rc;
    }
    p->listed = true;
    p->prev = v->wpass_tail;
    if (v->wpass_tail)
        v->wpass_tail->next = p;
    else
        v->wpass_head = p;
    v->wpass_tail = p;
    return 0;
}

struct wpass_flush {
    struct plx_vdi *v;
    uint64_t gen;
    bool clears_dirty;
    plx_done_fn cb;
    void *arg;
};

static void wpass_flush_done(void *arg, int status)
{
    struct wpass_flush *f = arg;
    struct plx_vdi *v = f->v;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->flush_gen != f->gen)
            continue;
        if (status)
            p->flush_gen = 0; /* the next flush tries again */
        else
            wpass_free(p);
    }
    if (status && f->clears_dirty)
        v->wpass_dirty = true;
    plx_done_fn cb = f->cb;
    void *carg = f->arg;
    free(f);
    cb(carg, status);
}

int plx_wlog_pass_flush(struct plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (!v->wpass_head && !wpass_on(v))
        return plx_vdi_direct_flush(v, cb, arg);
    struct wpass_flush *f = calloc(1, sizeof *f);
    if (!f)
        return plx_err(v->st, -ENOMEM, "out of memory");
    *f = (struct wpass_flush){.v = v, .gen = ++v->wpass_flush_gen, .cb = cb, .arg = arg};
    int rc = plx_vdi_direct_flush(v, wpass_flush_done, f);
    if (rc) {
        free(f);
        return rc;
    }
    /* It covers what has completed: those writes need not go to the log any more. */
    for (struct plx_wpass *p = v->wpass_head; p; p = p->next)
        if (p->in_store && !p->flush_gen)
            p->flush_gen = f->gen;
    f->clears_dirty = v->wpass_dirty;
    v->wpass_dirty = false;
    return 0;
}

void plx_wlog_pass_forget(struct plx_vdi *v)
{
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->in_store)
            wpass_free(p);
        else
            wpass_unlink(p); /* (freed when the pipeline is done with its copy) */
    }
    v->wpass_dirty = false;
}

/* The cache just turned on for v: the tracked writes go to the log, in their order and before
 * anything new, from their copies (a record's data is copied into its batch when appended).
 * Those in flight complete from there; the pipeline goes on writing from the copy. */
void wlog_pass_rescue(struct plx_wlog *wl, struct plx_wlog_vdi *w)
{
    struct plx_vdi *v = w->v;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        wpass_unlink(p);
        bool inflight = !p->in_store;
        if (!p->copy) {
            /* In flight without a copy (past the budget): the pipeline writes from the caller's
             * buffer, so it completes from the store, and the store's flush covers it. (A
             * completed one without a copy is not kept.) */
            w->direct_dirty = true;
            if (!inflight)
                wpass_free(p);
            continue;
        }
        struct wreq *r = wlog_req_new(v, Q_WRITE, p->off, p->len,
                                      inflight ? wpass_log_done : wpass_copy_logged, p);
        if (!r) {
            /* It completes from the store, as without the cache; the store's flush covers it. */
            w->direct_dirty = true;
            if (!inflight)
                wpass_free(p);
            continue;
        }
        r->ubuf = r->src = p->copy;
        r->ready = true;
        if (inflight) {
            p->rescued = true;
            w->rescued_inflight++;
        }
        wlog_enqueue(w, r);
    }
    wlog_process_queue(wl, w);
}
