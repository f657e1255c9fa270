/*
 * read_plan.c - read merging (docs/DESIGN.md "The request pipeline", Reads).
 *
 * A read request's blocks fall into runs: blocks contiguous on the store. Copy-on-write after
 * snapshots leaves single blocks out of place (the 4 KiB writes between snapshots each go to a
 * slot of their own), so a 1 MiB read of a leaf written sequentially long ago can be a long run
 * with a few holes punched in it, each refilled from elsewhere. Reading each piece separately
 * made every stray block cost two requests (the stray and the rest of the run); here runs that
 * lie at the same offset from their virtual blocks (the pieces of one run, or a leaf's blocks in
 * one slot) are joined across small gaps into one span and read whole, and the stale blocks the
 * span covers are overwritten afterwards by what belongs there.
 *
 * A span goes straight into the request's buffer when no other span chosen for that overlaps it
 * (the fullest spans first); others go into a scratch buffer and their blocks are copied into
 * place once every read has completed, as are the zeros of holes. So each block is written by
 * exactly one read or one fix, and fixes run after the reads: no ordering between backend
 * reads is needed.
 */
#include <stdlib.h>
#include <string.h>
#include "read_plan.h"

struct run {
    uint64_t i0, n;
    uint64_t delta; /* store block minus request block, modulo 2^64 */
    size_t span;
};

struct span {
    uint64_t s, e, delta, members;
    bool direct;
};

static int run_cmp(const void *a, const void *b)
{
    const struct run *x = a, *y = b;
    if (x->delta != y->delta)
        return x->delta < y->delta ? -1 : 1;
    return x->i0 < y->i0 ? -1 : x->i0 > y->i0;
}

/* By the first store block. */
static int run_phys_cmp(const void *a, const void *b)
{
    const struct run *x = a, *y = b;
    uint64_t px = x->i0 + x->delta, py = y->i0 + y->delta;
    return px < py ? -1 : px > py;
}

struct span_rank {
    uint64_t members, s;
    size_t idx;
};

/* Fullest first; among equals the earlier one (any fixed order would do). */
static int rank_cmp(const void *a, const void *b)
{
    const struct span_rank *x = a, *y = b;
    if (x->members != y->members)
        return x->members > y->members ? -1 : 1;
    return x->s < y->s ? -1 : x->s > y->s;
}

void plx_read_plan_free(struct plx_read_plan *p)
{
    if (!p)
        return;
    free(p->ios);
    free(p->fixes);
    free(p);
}

struct plx_read_plan *plx_read_plan_make(const uint64_t *phys, uint64_t n, unsigned max_gap)
{
    struct plx_read_plan *p = calloc(1, sizeof *p);
    struct run *runs = calloc(n ? n : 1, sizeof *runs);
    struct span *spans = NULL;
    struct span_rank *rank = NULL;
    uint8_t *covered = NULL;
    size_t nruns = 0, nholes = 0, nspans = 0;
    if (!p || !runs)
        goto fail;
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i + 1;
        if (!phys[i]) {
            while (j < n && !phys[j])
                j++;
            nholes++;
        } else {
            while (j < n && phys[j] == phys[i] + (j - i) && j - i < PLX_READ_MAX_IO)
                j++;
            runs[nruns++] = (struct run){.i0 = i, .n = j - i, .delta = phys[i] - i};
        }
        i = j;
    }
    qsort(runs, nruns, sizeof *runs, run_cmp);
    spans = calloc(nruns ? nruns : 1, sizeof *spans);
    rank = calloc(nruns ? nruns : 1, sizeof *rank);
    covered = calloc(n ? n : 1, 1);
    p->ios = calloc(nruns ? nruns : 1, sizeof *p->ios);
    p->fixes = calloc(nruns + nholes ? nruns + nholes : 1, sizeof *p->fixes);
    if (!spans || !rank || !covered || !p->ios || !p->fixes)
        goto fail;

    /* Runs of one offset are adjacent and in request order after the sort. */
    for (size_t k = 0; k < nruns; k++) {
        struct run *r = &runs[k];
        struct span *sp = nspans ? &spans[nspans - 1] : NULL;
        if (sp && sp->delta == r->delta && r->i0 - sp->e <= max_gap &&
            r->i0 + r->n - sp->s <= PLX_READ_MAX_IO) {
            sp->e = r->i0 + r->n;
            sp->members += r->n;
        } else {
            spans[nspans++] =
                (struct span){.s = r->i0, .e = r->i0 + r->n, .delta = r->delta, .members = r->n};
        }
        r->span = nspans - 1;
    }

    for (size_t k = 0; k < nspans; k++)
        rank[k] = (struct span_rank){.members = spans[k].members, .s = spans[k].s, .idx = k};
    qsort(rank, nspans, sizeof *rank, rank_cmp);
    for (size_t k = 0; k < nspans; k++) {
        struct span *sp = &spans[rank[k].idx];
        bool free_range = true;
        for (uint64_t i = sp->s; i < sp->e && free_range; i++)
            free_range = !covered[i];
        if (!free_range)
            continue;
        sp->direct = true;
        memset(covered + sp->s, 1, sp->e - sp->s);
        if (sp->members < sp->e - sp->s)
            p->merged = true;
        p->ios[p->nios++] = (struct plx_read_io){
            .first = sp->s,
            .block = sp->s + sp->delta,
            .nblocks = (uint32_t)(sp->e - sp->s),
            .direct = true,
        };
    }

    /* The runs left over (blocks displaced out of a span that went direct) are read into the
     * scratch buffer, joined by where they lie on the store instead: the strays of a leaf often
     * share a slot, or the spill slot, whatever their offsets. */
    size_t nleft = 0;
    for (size_t k = 0; k < nruns; k++)
        if (!spans[runs[k].span].direct)
            runs[nleft++] = runs[k];
    qsort(runs, nleft, sizeof *runs, run_phys_cmp);
    for (size_t k = 0; k < nleft;) {
        uint64_t b0 = runs[k].i0 + runs[k].delta, b1 = b0 + runs[k].n;
        size_t m = k + 1;
        for (; m < nleft; m++) {
            uint64_t c0 = runs[m].i0 + runs[m].delta, c1 = c0 + runs[m].n;
            if (c0 > b1 + max_gap || (c1 > b1 ? c1 : b1) - b0 > PLX_READ_MAX_IO)
                break;
            b1 = c1 > b1 ? c1 : b1;
        }
        p->ios[p->nios++] = (struct plx_read_io){
            .block = b0, .nblocks = (uint32_t)(b1 - b0), .scratch = p->scratch_blocks};
        uint64_t used = 0;
        for (size_t q = k; q < m; q++)
            used += runs[q].n;
        if (used < b1 - b0)
            p->merged = true;
        for (size_t q = k; q < m; q++)
            p->fixes[p->nfixes++] = (struct plx_read_fix){
                .dst = runs[q].i0,
                .src = p->scratch_blocks + (runs[q].i0 + runs[q].delta - b0),
                .n = runs[q].n,
            };
        p->scratch_blocks += b1 - b0;
        k = m;
    }
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i + 1;
        if (phys[i]) {
            i = j;
            continue;
        }
        while (j < n && !phys[j])
            j++;
        p->fixes[p->nfixes++] = (struct plx_read_fix){.dst = i, .n = j - i, .zero = true};
        i = j;
    }
    free(runs);
    free(spans);
    free(rank);
    free(covered);
    return p;
fail:
    free(runs);
    free(spans);
    free(rank);
    free(covered);
    plx_read_plan_free(p);
    return NULL;
}
