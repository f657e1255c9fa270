/*
 * crash_requests.c - a crash workload's requests (writes, trims, flushes, snapshots, label
 * edits, reads: test_crash.c), recorded in the model at submission and at completion, and the
 * loop that drives them.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crash.h"
#include "wlog.h"

/* ---- Requests -------------------------------------------------------------------------------- */

enum kind { K_WRITE, K_FLUSH, K_SNAP, K_READ, K_EDIT };

struct ctx {
    struct wl *wl;
    enum kind kind;
    size_t idx;
    void *mem;      /* buffer to free */
    uint64_t index; /* snapshots: *index_out */
    /* reads */
    int vdi;
    uint32_t t0, nb;
    uint64_t b0;
    uint8_t *buf;
    uint32_t *hlen;
};

static void check_status(struct wl *wl, const char *what, int status)
{
    if (status != 0 && wl->failed_reqs++ == 0)
        snprintf(wl->first_err, sizeof wl->first_err, "%s: %s", what, plx_store_errmsg(wl->st));
    if (wl->expect_ok && status != 0)
        violation(wl, "%s failed with %d (%s) with no error injected: %s", what, status,
                  strerror(-status), plx_store_errmsg(wl->st));
    else if (status != 0 && status != -EIO)
        violation(wl, "%s failed with %d (%s), expected 0 or -EIO", what, status,
                  strerror(-status));
}

void req_done(void *arg, int status)
{
    struct ctx *c = arg;
    struct wl *wl = c->wl;
    uint64_t pos = pos_of(wl);
    uint64_t seq = ++wl->seq;
    char what[160];
    wl->inflight--;
    wl->completed++;
    switch (c->kind) {
    case K_WRITE: {
        struct wrec *w = &wl->w[c->idx];
        if (w->acked)
            violation(wl, "write #%u: callback ran twice", w->wid);
        w->acked = true;
        w->status = status;
        w->ack_seq = seq;
        w->ack_pos = pos;
        snprintf(what, sizeof what, "%s of %s blocks %llu+%u", w->trim ? "trim" : "write",
                 wl->v[w->vdi].name, (unsigned long long)w->b0, w->nb);
        check_status(wl, what, status);
        break;
    }
    case K_FLUSH: {
        struct frec *f = &wl->f[c->idx];
        if (f->done)
            violation(wl, "flush: callback ran twice");
        f->done = true;
        f->status = status;
        f->done_seq = seq;
        f->done_pos = pos;
        snprintf(what, sizeof what, "flush of %s", wl->v[f->vdi].name);
        check_status(wl, what, status);
        break;
    }
    case K_SNAP: {
        struct srec *s = &wl->s[c->idx];
        struct mvdi *m = &wl->v[s->vdi];
        if (s->done)
            violation(wl, "snapshot: callback ran twice");
        s->done = true;
        s->status = status;
        s->done_pos = pos;
        snprintf(what, sizeof what, "snapshot of %s", m->name);
        check_status(wl, what, status);
        if (status == 0) {
            s->index = c->index;
            if (m->pred_ok && s->index != s->pred_index)
                violation(wl, "snapshot of %s got index %llu, expected %llu", m->name,
                          (unsigned long long)s->index, (unsigned long long)s->pred_index);
        } else {
            m->pred_ok = false;
        }
        break;
    }
    case K_EDIT: {
        struct erec *e = &wl->e[c->idx];
        if (e->done)
            violation(wl, "snapshot edit: callback ran twice");
        e->done = true;
        e->status = status;
        e->done_pos = pos;
        snprintf(what, sizeof what, "%s of %s@%llu", e->del ? "deletion" : "label",
                 wl->v[e->vdi].name, (unsigned long long)wl->s[e->snap].index);
        check_status(wl, what, status);
        break;
    }
    case K_READ: {
        struct mvdi *m = &wl->v[c->vdi];
        snprintf(what, sizeof what, "read of %s blocks %llu+%u", m->name, (unsigned long long)c->b0,
                 c->nb);
        check_status(wl, what, status);
        for (uint32_t i = 0; status == 0 && i < c->nb; i++) {
            uint32_t t = c->t0 + i, val = 0, e = 0;
            char why[160] = "";
            int d = pat_decode(c->buf + (size_t)i * BS, c->b0 + i, &val, why, sizeof why);
            if (d == 0 && prefix_ok(wl, m, t, c->hlen[i], val, &e))
                continue;
            if (d == 0)
                snprintf(why, sizeof why, "write #%u", val);
            else
                prefix_ok(wl, m, t, c->hlen[i], 0, &e);
            violation(wl, "live read of %s block %llu returned %s, expected write #%u", m->name,
                      (unsigned long long)(c->b0 + i), why, e);
            break;
        }
        wl->reads_checked += c->nb;
        free(c->hlen);
        break;
    }
    }
    free(c->mem);
    free(c);
}

static struct ctx *ctx_new(struct wl *wl, enum kind k, size_t idx)
{
    struct ctx *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    c->wl = wl;
    c->kind = k;
    c->idx = idx;
    return c;
}

static void submit_failed(struct wl *wl, const char *what, int rc)
{
    violation(wl, "submitting %s failed: %d (%s) %s", what, rc, strerror(-rc),
              plx_store_errmsg(wl->st));
}

/* Write (wid > 0) or trim (trim) tracked blocks [t0, t0 + nb) of VDI vi, one range. */
/* Three writes in four are submitted as the NBD server submits them, with PLX_WRITE_CACHED
 * (complete when the data is written); the rest complete when the metadata that reaches their
 * data is written too. Rule 2 is the same for both. */
unsigned write_flags(const struct wrec *w)
{
    if (w->fua)
        return PLX_WRITE_FUA;
    return w->wid % 4 ? PLX_WRITE_CACHED : 0;
}

void sub_write(struct wl *wl, int vi, uint32_t t0, uint32_t nb, bool fua, bool trim)
{
    struct mvdi *m = &wl->v[vi];
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    const struct range *r = &m->r[ri];
    ck_assert(t0 >= r->t0 && t0 + nb <= r->t0 + r->n && nb > 0);
    uint64_t b0 = r->vb0 + (t0 - r->t0);
    if (wl->nw == wl->capw) {
        wl->capw = wl->capw ? wl->capw * 2 : 256;
        wl->w = realloc(wl->w, wl->capw * sizeof *wl->w);
        ck_assert_ptr_nonnull(wl->w);
    }
    size_t idx = wl->nw;
    struct wrec *w = &wl->w[idx];
    memset(w, 0, sizeof *w);
    w->vdi = vi;
    w->t0 = t0;
    w->nb = nb;
    w->b0 = b0;
    w->fua = fua;
    w->trim = trim;
    w->wid = trim ? 0 : wl->next_wid++;

    struct ctx *c = ctx_new(wl, K_WRITE, idx);
    uint8_t *buf = NULL;
    if (!trim) {
        /* Mostly block-aligned buffers (the engine writes from them directly); some are not
         * (the engine stages them). */
        bool aligned = rnd(wl) % 5 != 0;
        if (aligned) {
            c->mem = aligned_alloc(BS, (size_t)nb * BS);
            buf = c->mem;
        } else {
            c->mem = malloc((size_t)nb * BS + 64);
            buf = (uint8_t *)c->mem + 8 * (1 + rnd(wl) % 7);
        }
        ck_assert_ptr_nonnull(c->mem);
        for (uint32_t i = 0; i < nb; i++)
            pat_fill(buf + (size_t)i * BS, w->wid, b0 + i);
    }
    w->sub_seq = ++wl->seq;
    w->sub_pos = pos_of(wl);
    wl->nw++;
    for (uint32_t i = 0; i < nb; i++)
        ivec_push(&m->hist[t0 + i], (uint32_t)idx);
    wl->inflight++;
    int rc = trim ? plx_vdi_submit_trim(m->h, b0 * BS, (uint64_t)nb * BS, req_done, c)
                  : plx_vdi_submit_write(m->h, buf, b0 * BS, (size_t)nb * BS, write_flags(w),
                                         req_done, c);
    if (rc != 0) {
        /* No callback: the write never happened. */
        wl->inflight--;
        w->acked = true;
        w->status = rc;
        w->ack_seq = ++wl->seq;
        w->ack_pos = pos_of(wl);
        submit_failed(wl, trim ? "a trim" : "a write", rc);
        free(c->mem);
        free(c);
    }
}

void sub_flush(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    if (wl->nf == wl->capf) {
        wl->capf = wl->capf ? wl->capf * 2 : 64;
        wl->f = realloc(wl->f, wl->capf * sizeof *wl->f);
        ck_assert_ptr_nonnull(wl->f);
    }
    size_t idx = wl->nf++;
    struct frec *f = &wl->f[idx];
    memset(f, 0, sizeof *f);
    f->vdi = vi;
    f->sub_seq = ++wl->seq;
    f->sub_pos = pos_of(wl);
    ivec_push(&m->flushes, (uint32_t)idx);
    struct ctx *c = ctx_new(wl, K_FLUSH, idx);
    wl->inflight++;
    int rc = plx_vdi_submit_flush(m->h, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        f->done = true;
        f->status = rc;
        submit_failed(wl, "a flush", rc);
        free(c);
    }
}

void sub_snap(struct wl *wl, int vi, bool labelled)
{
    struct mvdi *m = &wl->v[vi];
    if (wl->ns == wl->caps) {
        wl->caps = wl->caps ? wl->caps * 2 : 64;
        wl->s = realloc(wl->s, wl->caps * sizeof *wl->s);
        ck_assert_ptr_nonnull(wl->s);
    }
    size_t idx = wl->ns++;
    struct srec *s = &wl->s[idx];
    memset(s, 0, sizeof *s);
    s->vdi = vi;
    s->hlen = malloc(m->nt * sizeof *s->hlen);
    ck_assert_ptr_nonnull(s->hlen);
    for (uint32_t t = 0; t < m->nt; t++)
        s->hlen[t] = m->hist[t].n;
    s->pred_index = ++m->snaps_submitted;
    s->sub_seq = ++wl->seq;
    s->sub_pos = pos_of(wl);
    ivec_push(&m->snaps, (uint32_t)idx);
    char label[PLX_LABEL_MAX + 1] = "";
    if (labelled)
        snprintf(label, sizeof label, "snap-%u", ++m->label_seq);
    memcpy(s->label, label, sizeof s->label);
    struct ctx *c = ctx_new(wl, K_SNAP, idx);
    wl->inflight++;
    int rc = plx_vdi_submit_snapshot(m->h, label, &c->index, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        s->done = true;
        s->status = rc;
        m->pred_ok = false;
        char what[80];
        snprintf(what, sizeof what, "a snapshot labelled '%s' of %s", label, m->name);
        submit_failed(wl, what, rc);
        free(c);
    }
}

/* Relabel (two times in three) or delete a completed snapshot of VDI vi; false when it has
 * none left to change. Labels are new each time, so none is ever taken. */
static bool sub_edit(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    uint32_t cand = 0;
    for (uint32_t k = 0; k < m->snaps.n; k++) {
        const struct srec *sr = &wl->s[m->snaps.v[k]];
        cand += sr->done && sr->status == 0 && !sr->delete_submitted;
    }
    if (!cand)
        return false;
    uint32_t pick = (uint32_t)(rnd(wl) % cand), k = 0;
    size_t si = 0;
    for (;; k++) {
        si = m->snaps.v[k];
        const struct srec *sr = &wl->s[si];
        if (sr->done && sr->status == 0 && !sr->delete_submitted && pick-- == 0)
            break;
    }
    if (wl->ne == wl->cape) {
        wl->cape = wl->cape ? wl->cape * 2 : 64;
        wl->e = realloc(wl->e, wl->cape * sizeof *wl->e);
        ck_assert_ptr_nonnull(wl->e);
    }
    size_t idx = wl->ne++;
    struct erec *e = &wl->e[idx];
    memset(e, 0, sizeof *e);
    e->vdi = vi;
    e->snap = si;
    e->del = rnd(wl) % 3 == 0;
    if (!e->del)
        snprintf(e->label, sizeof e->label, "edit-%u", ++m->label_seq);
    wl->s[si].delete_submitted = e->del;
    e->sub_pos = pos_of(wl);
    ++wl->seq;
    struct ctx *c = ctx_new(wl, K_EDIT, idx);
    wl->inflight++;
    uint64_t index = wl->s[si].index;
    int rc = e->del ? plx_vdi_submit_snap_delete(m->h, index, req_done, c)
                    : plx_vdi_submit_snap_label(m->h, index, e->label, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        e->done = true;
        e->status = rc;
        submit_failed(wl, e->del ? "a snapshot deletion" : "a snapshot label", rc);
        free(c);
    }
    return true;
}

void sub_read(struct wl *wl, int vi, uint32_t t0, uint32_t nb)
{
    struct mvdi *m = &wl->v[vi];
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    const struct range *r = &m->r[ri];
    ck_assert(t0 + nb <= r->t0 + r->n);
    struct ctx *c = ctx_new(wl, K_READ, 0);
    c->vdi = vi;
    c->t0 = t0;
    c->nb = nb;
    c->b0 = r->vb0 + (t0 - r->t0);
    c->mem = aligned_alloc(BS, (size_t)nb * BS);
    c->buf = c->mem;
    c->hlen = malloc(nb * sizeof *c->hlen);
    ck_assert(c->mem && c->hlen);
    for (uint32_t i = 0; i < nb; i++)
        c->hlen[i] = m->hist[t0 + i].n;
    wl->inflight++;
    int rc = plx_vdi_submit_read(m->h, c->buf, c->b0 * BS, (size_t)nb * BS, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        submit_failed(wl, "a read", rc);
        free(c->hlen);
        free(c->mem);
        free(c);
    }
}

/* ---- Driving --------------------------------------------------------------------------------- */

static void wait_events(struct wl *wl)
{
    if (!plx_store_busy(wl->st)) {
        violation(wl, "%u requests in flight but the store is idle: callbacks lost", wl->inflight);
        ck_abort_msg("[%s] %u requests never completed", wl->name, wl->inflight);
    }
    struct pollfd pfd = {.fd = plx_store_fd(wl->st), .events = POLLIN};
    int n = poll(&pfd, 1, 2000);
    ck_assert_msg(n >= 0, "poll: %s", strerror(errno));
}

void service(struct wl *wl, bool need_progress)
{
    int rc = plx_store_service(wl->st);
    ck_assert_msg(rc >= 0, "[%s] plx_store_service: %d %s", wl->name, rc, plx_store_errmsg(wl->st));
    if (rc == 0 && need_progress && wl->inflight > 0)
        wait_events(wl);
}

void drain(struct wl *wl)
{
    while (wl->inflight > 0)
        service(wl, true);
}

/* Every request has completed, but the batches of cached writes (PLX_WRITE_CACHED) may still be
 * committing: wait until VDI vi's pipeline is idle, so that a commit that fails shows. */
void settle(struct wl *wl, int vi)
{
    plx_vdi *h = wl->v[vi].h;
    while (h && !plx_vdi_idle(h)) {
        int rc = plx_store_service(wl->st);
        ck_assert_msg(rc >= 0, "[%s] plx_store_service: %d", wl->name, rc);
        if (rc == 0 && !plx_vdi_idle(h))
            wait_events(wl);
    }
}

static uint32_t pick_start(struct wl *wl, const struct mvdi *m, const struct mix *mx)
{
    if (mx->hot && rnd(wl) % 100 < mx->hot)
        return (uint32_t)(rnd(wl) % (m->nt < 48 ? m->nt : 48));
    return (uint32_t)(rnd(wl) % m->nt);
}

/* Clip [t0, t0 + nb) to the range holding t0. */
static uint32_t clip(const struct mvdi *m, uint32_t t0, uint32_t nb)
{
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    uint32_t end = m->r[ri].t0 + m->r[ri].n;
    return t0 + nb > end ? end - t0 : nb;
}

void gen_op(struct wl *wl, const struct mix *mx, unsigned vmask)
{
    int cand[MAXV], nc = 0;
    for (int i = 0; i < wl->nv; i++)
        if ((vmask >> i) & 1)
            cand[nc++] = i;
    ck_assert_int_gt(nc, 0);
    int vi = cand[rnd(wl) % (uint64_t)nc];
    struct mvdi *m = &wl->v[vi];
    unsigned total = mx->write + mx->fua + mx->trim + mx->flush + mx->snap + mx->read + mx->edit;
    unsigned r = (unsigned)(rnd(wl) % total);
    if (r < mx->write + mx->fua) {
        uint32_t nb = 1 + (uint32_t)(rnd(wl) % mx->max_nb);
        uint32_t t0;
        if (mx->seq) {
            if (m->cursor >= m->nt)
                m->cursor = 0;
            t0 = m->cursor;
        } else {
            t0 = pick_start(wl, m, mx);
        }
        nb = clip(m, t0, nb);
        if (mx->seq)
            m->cursor = t0 + nb;
        sub_write(wl, vi, t0, nb, r >= mx->write, false);
        return;
    }
    r -= mx->write + mx->fua;
    if (r < mx->trim) {
        uint32_t t0 = pick_start(wl, m, mx);
        sub_write(wl, vi, t0, clip(m, t0, 1 + (uint32_t)(rnd(wl) % mx->max_trim)), false, true);
        return;
    }
    r -= mx->trim;
    if (r < mx->flush) {
        sub_flush(wl, vi);
        return;
    }
    r -= mx->flush;
    if (r < mx->edit) {
        if (!sub_edit(wl, vi))
            sub_flush(wl, vi);
        return;
    }
    r -= mx->edit;
    if (r < mx->snap) {
        if (m->snaps.n < mx->max_snaps)
            sub_snap(wl, vi, rnd(wl) % 100 < mx->label);
        else
            sub_flush(wl, vi);
        return;
    }
    uint32_t t0 = pick_start(wl, m, mx);
    sub_read(wl, vi, t0, clip(m, t0, 1 + (uint32_t)(rnd(wl) % 16)));
}

/* Submit nops requests to the VDIs in vmask, in bursts, with at most mx->inflight in flight. */
void run_phase(struct wl *wl, const struct mix *mx, unsigned nops, unsigned vmask)
{
    unsigned done_ops = 0;
    while (done_ops < nops) {
        unsigned burst = 1 + (unsigned)(rnd(wl) % 24);
        while (burst-- > 0 && done_ops < nops && wl->inflight < mx->inflight) {
            gen_op(wl, mx, vmask);
            done_ops++;
        }
        service(wl, wl->inflight >= mx->inflight);
    }
    drain(wl);
}
