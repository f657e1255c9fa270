/*
 * alloc_shared.h - what the allocator's three files share: alloc.c (handing out blocks in the
 * extents held: pools, slots placed by leaf, giving back, folding in a collector's findings,
 * releasing the extents at close), alloc_claim.c (taking extents: ahead, needed by a waiting
 * request, synchronously) and alloc_write.c (the catalogue and the bitmaps on the medium:
 * reading them, writing claims back). Nothing else includes it.
 *
 * They are in that order from the top (docs/DESIGN.md, layer 2): alloc.c calls the other two,
 * alloc_claim.c calls alloc_write.c, and none calls back up. The catalogue's readers and writers
 * let a claim in flight finish first, so plx_catalogue_read and plx_extent_entry_write are
 * alloc_claim.c's, over the bare I/O of alloc_write.c below.
 */
#ifndef PLX_ALLOC_SHARED_H
#define PLX_ALLOC_SHARED_H

#include "alloc.h"

static inline uint64_t eb(const plx_store *st)
{
    return st->sb.extent_blocks;
}

static inline uint64_t bitmap_blocks(const plx_store *st)
{
    return plx_bitmap_blocks(st->sb.extent_blocks);
}

/* Blocks per leaf slot: a leaf's worth, or the whole extent when extents are smaller (both are
 * powers of two, so slots tile an extent exactly). */
static inline uint64_t slot_blocks(const plx_store *st)
{
    return eb(st) < PLX_RADIX_FANOUT ? eb(st) : PLX_RADIX_FANOUT;
}

static inline bool bit_get(const uint8_t *bits, uint64_t i)
{
    return (bits[i >> 3] >> (i & 7)) & 1;
}

static inline void bit_set(uint8_t *bits, uint64_t i, bool v)
{
    if (v)
        bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    else
        bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

static inline uint64_t count_free(const plx_store *st, const uint8_t *bits)
{
    uint64_t used = 0;
    for (uint64_t i = 0; i < eb(st) / 8; i++)
        used += (uint64_t)__builtin_popcount(bits[i]);
    return eb(st) - used;
}

static inline bool is_data_extent(const plx_store *st, uint64_t e)
{
    const struct plx_extent_state *x = &st->alloc->ext[e];
    return x->held && !x->spare && x->slots && st->cat[e].type == PLX_EXTENT_DATA &&
           x->free > 0;
}

static inline bool slot_empty(const plx_store *st, const struct plx_extent_state *x, uint64_t s)
{
    uint64_t n = slot_blocks(st);
    const uint8_t *bits = x->bitmap + s * n / 8;
    for (uint64_t i = 0; i < n / 8; i++)
        if (bits[i])
            return false;
    return true;
}

/* alloc_write.c: check catalogue block b (read from the medium into cb) and copy its entries
 * into st->cat (a claim reads the catalogue itself). */
int plx_catalogue_block_take(plx_store *st, uint64_t b, const struct plx_catalog_block *cb);
/* alloc_write.c: plx_catalogue_read and plx_extent_entry_write without letting a claim in flight
 * finish first (alloc_claim.c's forms do, then call these). */
int plx_catalogue_load(plx_store *st);
int plx_extent_entry_put(plx_store *st, uint64_t e, const struct plx_extent_entry *ent);

/* alloc_claim.c */
/* After an allocation of `type`: start (or go on trying to start) a claim ahead if the held
 * extents run low. Never waits. */
void plx_claim_ahead_check(plx_store *st, enum plx_extent_type type);
/* A new extent of `type` for allocation (the spare, the claim in flight, or a synchronous
 * claim); `must` false on a serving loop: never waits, -EWOULDBLOCK. */
int plx_extent_claim(plx_store *st, enum plx_extent_type type, bool must);
/* At the store's end: drop claim c (NULL: none), leaving the lock's queue if it waits there. */
void plx_claim_drop(plx_store *st, struct plx_claim *c);

#endif
