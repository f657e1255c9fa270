/*
 * wlog_index.c - the write log's index: (VDI, virtual block) -> the newest record of it not yet
 * drained, in memory (layer 6; wlog_shared.h).
 */
#include <errno.h>
#include <stdlib.h>
#include "wlog_shared.h"

/* ---- Index ----------------------------------------------------------------------------------- */

static size_t ihash(const struct plx_wlog *wl, uint64_t vdi, uint64_t chunk)
{
    uint64_t x = vdi * 0x9e3779b97f4a7c15ull ^ chunk * 0xc2b2ae3d27d4eb4full;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (size_t)x & wl->mask;
}

static struct ient *ichunk(const struct plx_wlog *wl, uint64_t vdi, uint64_t chunk)
{
    for (struct ient *e = wl->tab[ihash(wl, vdi, chunk)]; e; e = e->next)
        if (e->vdi_id == vdi && e->chunk == chunk)
            return e;
    return NULL;
}

/* The batch holding the newest record of (vdi, vb), and in *blk its data block there; NULL if
 * none is in the log. */
struct wbatch *wlog_index_find(const struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint32_t *blk)
{
    const struct ient *e = ichunk(wl, vdi, vb / ICHUNK);
    uint32_t k = (uint32_t)(vb % ICHUNK);
    if (!e || !(e->used & (1u << k)))
        return NULL;
    if (blk)
        *blk = e->blk[k];
    return e->b[k];
}

static void igrow(struct plx_wlog *wl)
{
    size_t n = (wl->mask + 1) * 2;
    struct ient **old = wl->tab;
    size_t oldn = wl->mask + 1;
    struct ient **tab = calloc(n, sizeof *tab);
    if (!tab)
        return; /* keep the smaller table: slower, still right */
    wl->tab = tab;
    wl->mask = n - 1;
    for (size_t i = 0; i < oldn; i++)
        for (struct ient *e = old[i], *nx; e; e = nx) {
            nx = e->next;
            size_t h = ihash(wl, e->vdi_id, e->chunk);
            e->next = tab[h];
            tab[h] = e;
        }
    free(old);
}

/* Blocks vb ... vb + n - 1 of vdi: newest in batch b, data blocks blk ... blk + n - 1. */
int wlog_index_set(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n, struct wbatch *b,
                   uint32_t blk)
{
    for (uint64_t end = vb + n; vb < end;) {
        uint64_t chunk = vb / ICHUNK;
        struct ient *e = ichunk(wl, vdi, chunk);
        if (!e) {
            e = plx_slab_alloc(&wl->ient_slab);
            if (!e)
                return -ENOMEM;
            e->vdi_id = vdi;
            e->chunk = chunk;
            e->used = 0;
            size_t h = ihash(wl, vdi, chunk);
            e->next = wl->tab[h];
            wl->tab[h] = e;
            if (++wl->nidx > wl->mask + 1)
                igrow(wl);
        }
        for (; vb < end && vb / ICHUNK == chunk; vb++, blk++) {
            uint32_t k = (uint32_t)(vb % ICHUNK);
            e->used |= 1u << k;
            e->b[k] = b;
            e->blk[k] = (uint16_t)blk;
        }
    }
    return 0;
}

/* Forget those of blocks vb ... vb + n - 1 of vdi whose newest record is in batch b. */
void wlog_index_drop(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n,
                     const struct wbatch *b)
{
    for (uint64_t end = vb + n; vb < end;) {
        uint64_t chunk = vb / ICHUNK;
        struct ient **pp = &wl->tab[ihash(wl, vdi, chunk)];
        while (*pp && !((*pp)->vdi_id == vdi && (*pp)->chunk == chunk))
            pp = &(*pp)->next;
        struct ient *e = *pp;
        for (; vb < end && vb / ICHUNK == chunk; vb++) {
            uint32_t k = (uint32_t)(vb % ICHUNK);
            if (e && e->b[k] == b)
                e->used &= ~(1u << k);
        }
        if (e && !e->used) {
            *pp = e->next;
            plx_slab_free(&wl->ient_slab, e);
            wl->nidx--;
        }
    }
}
