/*
 * crash_verify.c - the crash harness's verification: the crash images a workload's event log
 * allows, rebuilt, opened and checked against the model under the rules test_crash.c lists.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crash.h"
#include "wlog.h"

/* ---- Verification ---------------------------------------------------------------------------- */

/* The base of rule 2 for VDI vi at crash position p: the sequence number of the submission of
 * the last flush that completed before p (0 when none). */
uint64_t flush_seq_at(const struct wl *wl, int vi, uint64_t p)
{
    const struct mvdi *m = &wl->v[vi];
    uint64_t best = 0;
    for (uint32_t k = 0; k < m->flushes.n; k++) {
        const struct frec *f = &wl->f[m->flushes.v[k]];
        if (f->done && f->status == 0 && f->done_pos <= p && f->sub_seq > best)
            best = f->sub_seq;
    }
    return best;
}

/* The writes to tracked block t around index `focus` of its history (the base of rule 2, or
 * the last write a snapshot must hold), for messages. */
static void describe_hist(const struct wl *wl, const struct mvdi *m, uint32_t t, int64_t focus,
                          uint64_t p, char *out, size_t len)
{
    const struct ivec *h = &m->hist[t];
    size_t o = (size_t)snprintf(out, len, "initial #%u", m->init[t]);
    uint32_t from = h->n > 8 ? h->n - 8 : 0;
    if (focus >= 0 && (uint32_t)focus < from + 3)
        from = focus > 3 ? (uint32_t)focus - 3 : 0;
    if (from > 0)
        o += (size_t)snprintf(out + o, len - o, "; (%u older)", from);
    for (uint32_t j = from; j < h->n && j < from + 10 && o < len; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        o += (size_t)snprintf(out + o, len - o, "; %s#%u%s sub@%llu ack@%llu st%d%s%s",
                              w->trim ? "trim" : "", w->wid, w->fua ? " fua" : "",
                              (unsigned long long)w->sub_pos,
                              w->acked ? (unsigned long long)w->ack_pos : 0ull, w->status,
                              (int64_t)j == focus ? " [*]" : "", w->sub_pos < p ? "" : " [later]");
    }
}

/* Rule 2 for tracked block t of VDI vi at crash position p (fseq from flush_seq_at). */
static bool durable_ok(const struct wl *wl, int vi, uint32_t t, uint64_t p, uint64_t fseq,
                       uint32_t val, int64_t *base_out)
{
    const struct mvdi *m = &wl->v[vi];
    const struct ivec *h = &m->hist[t];
    int64_t base = -1;
    for (uint32_t j = 0; j < h->n; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        if (w->acked && w->status == 0 && !w->lost &&
            (w->ack_seq < fseq || (w->fua && w->ack_pos <= p)))
            base = j;
    }
    *base_out = base;
    uint32_t bval = base < 0 ? m->init[t] : wl->w[h->v[base]].wid;
    if (val == bval)
        return true;
    for (uint32_t j = (uint32_t)(base + 1); j < h->n; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        if (w->sub_pos < p && w->wid == val)
            return true;
    }
    return false;
}

struct vctx {
    struct wl *wl;
    plx_store *st;
    uint8_t *buf;
    uint64_t p; /* crash position (UINT64_MAX: live store) */
    bool live;  /* verifying the running store, not an image */
};

enum vmode { V_DURABLE, V_LIVE, V_SNAP };

/* Read every tracked range of handle h (model VDI vi) and check each block: against rule 2
 * (V_DURABLE), against all writes (V_LIVE) or against snapshot sr (V_SNAP); then a sample of
 * untracked blocks, which must be zeros. */
static void verify_blocks(struct vctx *x, int vi, plx_vdi *h, enum vmode mode,
                          const struct srec *sr, const char *what)
{
    struct wl *wl = x->wl;
    const struct mvdi *m = &wl->v[vi];
    uint64_t fseq = mode == V_DURABLE ? flush_seq_at(wl, vi, x->p) : 0;
    for (int ri = 0; ri < m->nr; ri++) {
        const struct range *r = &m->r[ri];
        int rc = plx_vdi_pread(h, x->buf, r->vb0 * BS, (size_t)r->n * BS);
        if (rc != 0) {
            violation(wl, "%s: reading blocks %llu+%u failed: %d %s", what,
                      (unsigned long long)r->vb0, r->n, rc, plx_store_errmsg(x->st));
            return;
        }
        for (uint32_t i = 0; i < r->n; i++) {
            uint32_t t = r->t0 + i, val = 0, e = 0;
            uint64_t vb = r->vb0 + i;
            char why[160] = "";
            int d = pat_decode(x->buf + (size_t)i * BS, vb, &val, why, sizeof why);
            bool ok = false;
            int64_t base = -1;
            if (d == 0) {
                if (mode == V_DURABLE)
                    ok = durable_ok(wl, vi, t, x->p, fseq, val, &base);
                else
                    ok = prefix_ok(wl, m, t, mode == V_SNAP ? sr->hlen[t] : m->hist[t].n, val, &e);
            }
            if (ok)
                continue;
            char hist[900];
            int64_t focus = mode == V_DURABLE ? base
                            : mode == V_SNAP  ? (int64_t)sr->hlen[t] - 1
                                              : (int64_t)m->hist[t].n - 1;
            describe_hist(wl, m, t, focus, x->p, hist, sizeof hist);
            char found[200];
            if (d)
                snprintf(found, sizeof found, "%s", why);
            else
                snprintf(found, sizeof found, "write #%u", val);
            if (mode == V_SNAP && !(sr->done && sr->status == 0 && sr->done_pos <= x->p))
                wl->strict++;
            if (mode == V_DURABLE)
                violation(wl,
                          "%s block %llu holds %s; not acceptable (last flush done: seq %llu). "
                          "History: %s",
                          what, (unsigned long long)vb, found, (unsigned long long)fseq, hist);
            else
                violation(wl, "%s block %llu holds %s; expected write #%u. History: %s", what,
                          (unsigned long long)vb, found, e, hist);
            return;
        }
    }
    /* Untracked blocks: zeros. */
    uint64_t nblocks = m->size / BS, tracked = m->nt;
    for (int k = 0; k < 4 && nblocks > tracked; k++) {
        uint64_t vb = rnd(wl) % nblocks;
        bool in = false;
        for (int ri = 0; ri < m->nr; ri++)
            in = in || (vb >= m->r[ri].vb0 && vb < m->r[ri].vb0 + m->r[ri].n);
        if (in)
            continue;
        int rc = plx_vdi_pread(h, x->buf, vb * BS, BS);
        if (rc != 0)
            violation(wl, "%s: reading untracked block %llu failed: %d %s", what,
                      (unsigned long long)vb, rc, plx_store_errmsg(x->st));
        else if (memcmp(x->buf, zero_blk, BS) != 0)
            violation(wl, "%s: untracked block %llu is not zero", what, (unsigned long long)vb);
    }
}

static void verify_snapshot(struct vctx *x, int vi, uint64_t index, const struct srec *sr)
{
    struct wl *wl = x->wl;
    const struct mvdi *m = &wl->v[vi];
    char spec[96], what[256];
    snprintf(spec, sizeof spec, "%s@%llu", m->name, (unsigned long long)index);
    if (sr->done && sr->status == 0 && sr->done_pos <= x->p)
        snprintf(what, sizeof what, "snapshot %s (submitted at %llu, completed at %llu)", spec,
                 (unsigned long long)sr->sub_pos, (unsigned long long)sr->done_pos);
    else
        snprintf(what, sizeof what,
                 "snapshot %s (submitted at %llu, NOT completed at the crash: callback at %llu)",
                 spec, (unsigned long long)sr->sub_pos, (unsigned long long)sr->done_pos);
    plx_vdi *h = NULL;
    int rc = plx_vdi_open(x->st, spec, PLX_OPEN_READONLY, &h);
    if (rc != 0) {
        violation(wl, "opening %s: %d %s", what, rc, plx_store_errmsg(x->st));
        return;
    }
    verify_blocks(x, vi, h, V_SNAP, sr, what);
    rc = plx_vdi_close(h);
    if (rc != 0)
        violation(wl, "closing %s: %d", what, rc);
}

/* The model's snapshot numbered `index` in VDI vi, or NULL when unknown. */
static const struct srec *snap_by_index(const struct wl *wl, int vi, uint64_t index)
{
    const struct mvdi *m = &wl->v[vi];
    for (uint32_t k = 0; k < m->snaps.n; k++) {
        const struct srec *s = &wl->s[m->snaps.v[k]];
        if (s->done && s->status == 0 && s->index == index)
            return s;
        if (m->pred_ok && s->pred_index == index)
            return s;
    }
    return NULL;
}

static void check_report(void *arg, int is_error, const char *line)
{
    struct wl *wl = arg;
    if (is_error)
        violation(wl, "plx_check: %s", line);
}

static void run_check(struct vctx *x)
{
    struct wl *wl = x->wl;
    struct plx_check_report rep;
    memset(&rep, 0, sizeof rep);
    int rc = plx_check(x->st, &rep, check_report, wl);
    g_tot->checks++;
    if (rc != 0)
        violation(wl, "plx_check could not run: %d %s", rc, plx_store_errmsg(x->st));
    else if (rep.errors != 0)
        violation(wl, "plx_check found %llu errors", (unsigned long long)rep.errors);
}

/* Rule 3 for the record of completed snapshot si as found at crash position p: deleted exactly
 * when a deletion completed before p (either way while one was in flight, or failed), and
 * labelled as the last label that completed before p says (or as at creation), or as a label
 * submitted after that one, before p. */
static void verify_snap_record(struct wl *wl, int vi, size_t si, const struct plx_snap_info *got,
                               uint64_t p)
{
    const struct srec *s = &wl->s[si];
    const char *name = wl->v[vi].name;
    bool del_done = false, del_maybe = false;
    const char *base = s->label;
    size_t nlater = 0;
    const char *later[64];
    for (size_t i = 0; i < wl->ne; i++) {
        const struct erec *e = &wl->e[i];
        if (e->snap != si || e->sub_pos >= p)
            continue;
        bool completed = e->done && e->status == 0 && e->done_pos <= p;
        if (e->del) {
            del_done |= completed;
            del_maybe |= !completed;
        } else if (completed) {
            base = e->label;
            nlater = 0;
        } else if (nlater < 64) {
            later[nlater++] = e->label;
        }
    }
    if (got->deleted != del_done && !(del_maybe && got->deleted)) {
        violation(wl, "snapshot %s@%llu is %s at position %llu, but its deletion %s", name,
                  (unsigned long long)s->index, got->deleted ? "deleted" : "not deleted",
                  (unsigned long long)p,
                  del_done    ? "had completed"
                  : del_maybe ? "was still in flight"
                              : "was never submitted before");
        return;
    }
    if (got->deleted)
        return;
    bool ok = strcmp(got->label, base) == 0;
    for (size_t i = 0; i < nlater && !ok; i++)
        ok = strcmp(got->label, later[i]) == 0;
    if (!ok)
        violation(wl, "snapshot %s@%llu is labelled '%s' at position %llu, expected '%s'%s", name,
                  (unsigned long long)s->index, got->label, (unsigned long long)p, base,
                  nlater ? " or a label still in flight" : "");
}

/* Rules 1-5 on a store (an image at crash position x->p, or the live store). nsnap: how many
 * snapshots per VDI to read back (the newest ones and a random sample). */
static void verify_store(struct vctx *x, unsigned nsnap)
{
    struct wl *wl = x->wl;
    uint64_t p = x->p;
    if (!x->live)
        run_check(x);

    struct plx_vdi_info *list = NULL;
    size_t nlist = 0;
    int rc = plx_vdi_list(x->st, &list, &nlist);
    if (rc != 0) {
        violation(wl, "plx_vdi_list: %d %s", rc, plx_store_errmsg(x->st));
        return;
    }
    for (size_t i = 0; i < nlist; i++) {
        bool known = list[i].deleted;
        for (int vi = 0; vi < wl->nv && !known; vi++)
            known = strcmp(list[i].name, wl->v[vi].name) == 0;
        if (!known)
            violation(wl, "unknown VDI '%s' (id %llu) in the registry", list[i].name,
                      (unsigned long long)list[i].id);
    }
    free(list);

    for (int vi = 0; vi < wl->nv; vi++) {
        const struct mvdi *m = &wl->v[vi];
        struct plx_vdi_info info;
        rc = plx_vdi_lookup(x->st, m->name, &info);
        if (rc == -ENOENT && p < m->create_pos)
            continue; /* not created yet */
        if (rc != 0) {
            violation(wl, "VDI %s (created at position %llu) is missing: %d %s", m->name,
                      (unsigned long long)m->create_pos, rc, plx_store_errmsg(x->st));
            continue;
        }
        if (info.id != m->id || info.size != m->size)
            violation(wl, "VDI %s has id %llu size %llu, expected id %llu size %llu", m->name,
                      (unsigned long long)info.id, (unsigned long long)info.size,
                      (unsigned long long)m->id, (unsigned long long)m->size);
        if (m->parent >= 0 &&
            (info.parent_id != wl->v[m->parent].id || info.parent_snap != m->parent_index))
            violation(wl, "clone %s has parent %llu@%llu, expected %llu@%llu", m->name,
                      (unsigned long long)info.parent_id, (unsigned long long)info.parent_snap,
                      (unsigned long long)wl->v[m->parent].id, (unsigned long long)m->parent_index);

        /* Rule 2 (or, live, every write). */
        char what[160];
        plx_vdi *h = m->h;
        if (!x->live || !h) {
            rc = plx_vdi_open(x->st, m->name, PLX_OPEN_READONLY, &h);
            if (rc != 0) {
                violation(wl, "opening VDI %s read-only: %d %s", m->name, rc,
                          plx_store_errmsg(x->st));
                continue;
            }
        }
        snprintf(what, sizeof what, "VDI %s", m->name);
        verify_blocks(x, vi, h, x->live ? V_LIVE : V_DURABLE, NULL, what);
        if (h != m->h || !x->live) {
            rc = plx_vdi_close(h);
            if (rc != 0)
                violation(wl, "closing VDI %s: %d", m->name, rc);
        }

        /* Rule 3: snapshots. */
        struct plx_snap_info *sl = NULL;
        size_t n = 0;
        rc = plx_snap_list(x->st, info.id, &sl, &n);
        if (rc != 0) {
            violation(wl, "listing the snapshots of %s: %d %s", m->name, rc,
                      plx_store_errmsg(x->st));
            continue;
        }
        uint64_t submitted = 0;
        for (uint32_t k = 0; k < m->snaps.n; k++) {
            size_t si = m->snaps.v[k];
            const struct srec *s = &wl->s[si];
            if (s->sub_pos < p)
                submitted++;
            if (!(s->done && s->status == 0 && s->done_pos <= p))
                continue;
            if (s->index > n)
                violation(wl,
                          "snapshot %s@%llu completed at position %llu but the log holds "
                          "%zu snapshots",
                          m->name, (unsigned long long)s->index, (unsigned long long)s->done_pos,
                          n);
            else
                verify_snap_record(wl, vi, si, &sl[s->index - 1], p);
        }
        if (m->pred_ok && n > submitted)
            violation(wl, "VDI %s has %zu snapshots but only %llu were submitted", m->name, n,
                      (unsigned long long)submitted);
        /* Every live label names its snapshot through the label index and the log's tail. */
        for (size_t k = 0; k < n; k++) {
            if (sl[k].deleted || !sl[k].label[0])
                continue;
            char spec[PLX_NAME_MAX + PLX_LABEL_MAX + 2];
            snprintf(spec, sizeof spec, "%s@%s", m->name, sl[k].label);
            struct plx_snap_info si;
            rc = plx_snap_lookup(x->st, spec, &si);
            if (rc != 0 || si.index != sl[k].index)
                violation(wl, "%s names snapshot %llu (%d %s), the log says %llu", spec,
                          (unsigned long long)si.index, rc, plx_store_errmsg(x->st),
                          (unsigned long long)sl[k].index);
        }
        /* Read back the newest snapshots (most exposed to the crash) and a random sample. */
        for (unsigned k = 0; k < nsnap && k < n; k++) {
            uint64_t index = k < 2 ? n - k : 1 + rnd(wl) % n;
            const struct srec *s = snap_by_index(wl, vi, index);
            if (s && !sl[index - 1].deleted)
                verify_snapshot(x, vi, index, s);
        }
        free(sl);
    }
}

static const char *mode_name(enum plx_crash_mode md)
{
    switch (md) {
    case PLX_CRASH_DROP_UNFLUSHED:
        return "drop-unflushed";
    case PLX_CRASH_KEEP_ALL:
        return "keep-all";
    case PLX_CRASH_RANDOM:
        return "random";
    }
    return "?";
}

/* Open image (consumed) as the medium after a crash at p, and verify it. */
void verify_image(struct wl *wl, plx_backend *img, uint64_t p, enum plx_crash_mode md,
                  uint64_t seed, unsigned nsnap)
{
    snprintf(wl->where, sizeof wl->where, "crash at position %llu, mode %s, seed %llu",
             (unsigned long long)p, mode_name(md), (unsigned long long)seed);
    snprintf(g_ctx, sizeof g_ctx, "verifying [%s seed %llu] %s", wl->name,
             (unsigned long long)wl->seed, wl->where);
    wl->img_msgs = 0;
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1, .cache_bytes = 2 * MIB};
    plx_store *st = NULL;
    char err[256] = "";
    plx_backend *medium = img;
    if (wl->log_blocks) {
        /* Restart on this host: a new process (another start time) attaches the log, which is
         * replayed, and closes the store again; then the store is checked as always. */
        struct plx_open_opts wo = {.struct_size = sizeof wo, .cache_bytes = 2 * MIB};
        int rc =
            plx_store_open_backend(win_new(medium, 0, STORE_BYTES / BS), &wo, &st, err, sizeof err);
        if (rc != 0) {
            violation(wl, "the store does not open for the replay: %d %s", rc, err);
            medium->ops->destroy(medium);
            return;
        }
        rc = plx_wlog_attach(st, win_new(medium, STORE_BYTES / BS, wl->log_blocks), 0, "log");
        if (rc != 0 && p >= wl->log_ready_pos)
            violation(wl, "the write log does not replay: %d %s", rc, plx_store_errmsg(st));
        rc = plx_store_close(st);
        if (rc != 0)
            violation(wl, "closing the store after the replay: %d", rc);
        st = NULL;
        img = win_new(medium, 0, STORE_BYTES / BS);
    }
    int rc = plx_store_open_backend(img, &o, &st, err, sizeof err);
    wl->images++;
    if (rc != 0) {
        violation(wl, "the store does not open: %d %s", rc, err);
        if (medium != img)
            medium->ops->destroy(medium);
        return;
    }
    uint8_t *buf = aligned_alloc(BS, 512 * BS);
    ck_assert_ptr_nonnull(buf);
    struct vctx x = {.wl = wl, .st = st, .buf = buf, .p = p, .live = false};
    verify_store(&x, nsnap);
    free(buf);
    rc = plx_store_close(st);
    if (rc != 0)
        violation(wl, "closing the read-only store: %d", rc);
    if (medium != img)
        medium->ops->destroy(medium);
    g_ctx[0] = 0;
}

/* Read everything back from the running store: every write, every snapshot. */
void verify_live(struct wl *wl)
{
    snprintf(wl->where, sizeof wl->where, "live store");
    wl->img_msgs = 0;
    uint8_t *buf = aligned_alloc(BS, 512 * BS);
    ck_assert_ptr_nonnull(buf);
    struct vctx x = {.wl = wl, .st = wl->st, .buf = buf, .p = UINT64_MAX, .live = true};
    verify_store(&x, 1000000);
    free(buf);
}

/* The superblock is written once, by format: check the medium (as reads see it) still holds it. */
void check_superblock(struct wl *wl)
{
    uint8_t *b = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(wl->fb, PLX_IO_READ, 0, 1, b, 0), 0);
    if (memcmp(b, wl->sb0, BS) != 0) {
        uint64_t w[2];
        memcpy(w, b, sizeof w);
        violation(wl, "block 0 (the superblock) was overwritten: it now holds magic 0x%08llx",
                  (unsigned long long)(w[0] & 0xffffffffu));
    }
    plx_block_free(b);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Close the workload's VDIs and store, then verify crash images at npos positions: a random
 * sample of the crash points plus points at and just before guest-visible completions, and just
 * after each snapshot was submitted. */
void crash_sweep(struct wl *wl, unsigned npos, unsigned nseeds, unsigned nsnap)
{
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h)
            close_vdi(wl, vi);
    int rc = plx_store_close(wl->st);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing the store: %d", rc);
    wl->st = NULL;
    if (wl->other && (rc = plx_store_close(wl->other)) != 0 && wl->expect_ok)
        violation(wl, "closing the second engine: %d", rc);
    wl->other = NULL;
    snprintf(wl->where, sizeof wl->where, "after the workload");
    check_superblock(wl);

    uint64_t total = plx_fault_crash_points(wl->fb, NULL, 0);
    ck_assert_uint_gt(total, 0);
    uint64_t *pts = malloc(total * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(wl->fb, pts, total);

    /* Candidates tied to guest events: acknowledgements (the earliest positions where a
     * guarantee applies) and the position just before each. */
    size_t ncand = 0, capc = 2 * (wl->nf + wl->nw + (size_t)wl->nv) + 5 * wl->ns + 2;
    uint64_t *cand = malloc(capc * sizeof *cand);
    ck_assert_ptr_nonnull(cand);
    for (size_t i = 0; i < wl->nf; i++)
        if (wl->f[i].done && wl->f[i].done_pos > 0) {
            cand[ncand++] = wl->f[i].done_pos;
            cand[ncand++] = wl->f[i].done_pos - 1;
        }
    for (size_t i = 0; i < wl->ns; i++) {
        if (wl->s[i].done && wl->s[i].done_pos > 0) {
            cand[ncand++] = wl->s[i].done_pos;
            cand[ncand++] = wl->s[i].done_pos - 1;
        }
        /* Just after the snapshot swapped roots: the data of writes before and after it in
         * flight together (a snapshot waits only until earlier writes are in the tree). */
        for (uint64_t d = 1; d <= 4; d *= 2)
            cand[ncand++] = wl->s[i].sub_pos + d;
    }
    for (size_t i = 0; i < wl->nw; i++)
        if (wl->w[i].fua && wl->w[i].acked && wl->w[i].ack_pos > 0)
            cand[ncand++] = wl->w[i].ack_pos;
    for (int i = 0; i < wl->nv; i++)
        cand[ncand++] = wl->v[i].create_pos;

    uint64_t nfocus = wl->focus_count ? plx_fault_points_near_writes(wl->fb, wl->focus_first,
                                                                     wl->focus_count, NULL, 0)
                                      : 0;
    uint64_t *sel = malloc((npos + nfocus + 1) * sizeof *sel);
    ck_assert_ptr_nonnull(sel);
    size_t nsel = 0;
    sel[nsel++] = total; /* after everything, the store closed */
    if (nfocus) {
        plx_fault_points_near_writes(wl->fb, wl->focus_first, wl->focus_count, sel + nsel, nfocus);
        nsel += nfocus;
        npos += (unsigned)nfocus;
    }
    while (nsel < npos) {
        uint64_t p;
        if (ncand > 0 && rnd(wl) % 3 == 0)
            p = cand[rnd(wl) % ncand];
        else
            p = pts[rnd(wl) % total];
        if (p >= 1 && p <= total)
            sel[nsel++] = p;
    }
    qsort(sel, nsel, sizeof *sel, cmp_u64);

    struct plx_crash_cursor *c = plx_crash_cursor_new(wl->fb);
    uint64_t last = 0;
    for (size_t i = 0; i < nsel; i++) {
        uint64_t p = sel[i];
        if (i > 0 && p == last)
            continue;
        last = p;
        plx_crash_cursor_seek(c, p);
        wl->positions++;
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0), p,
                     PLX_CRASH_DROP_UNFLUSHED, 0, nsnap);
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0), p, PLX_CRASH_KEEP_ALL, 0,
                     nsnap);
        for (unsigned k = 0; k < nseeds; k++) {
            uint64_t seed = wl->seed * 1000003 + p * 31 + k;
            verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_RANDOM, seed), p, PLX_CRASH_RANDOM,
                         seed, nsnap);
        }
    }
    plx_crash_cursor_free(c);
    free(sel);
    free(cand);
    free(pts);
}

void report(struct wl *wl, double secs)
{
    g_tot->images += wl->images;
    g_tot->positions += wl->positions;
    g_tot->workloads++;
    g_tot->failures += wl->violations;
    g_tot->strict += wl->strict;
    printf(
        "crash[%s]: seed %llu, %zu writes/trims, %zu flushes, %zu snapshots, %zu labels/deletes, "
        "%llu blocks read live, log %llu events, %llu positions, %llu images, %llu violations "
        "(%llu of an unfinished snapshot), %.1f s\n",
        wl->name, (unsigned long long)wl->seed, wl->nw, wl->nf, wl->ns, wl->ne,
        (unsigned long long)wl->reads_checked, (unsigned long long)plx_fault_log_position(wl->fb),
        (unsigned long long)wl->positions, (unsigned long long)wl->images,
        (unsigned long long)wl->violations, (unsigned long long)wl->strict, secs);
    fflush(stdout);
}

void eio_report(struct wl *wl)
{
    g_tot->eio_runs++;
    g_tot->eio_failures += wl->violations;
    printf("crash[%s]: seed %llu, %zu writes/trims, %zu flushes, %zu snapshots, %llu failed "
           "requests, %llu errors injected, %llu violations%s%s\n",
           wl->name, (unsigned long long)wl->seed, wl->nw, wl->nf, wl->ns,
           (unsigned long long)wl->failed_reqs,
           (unsigned long long)plx_fault_errors_injected(wl->fb),
           (unsigned long long)wl->violations, wl->first_err[0] ? "; first failure: " : "",
           wl->first_err);
    fflush(stdout);
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
