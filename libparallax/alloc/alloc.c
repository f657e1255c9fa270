/*
 * alloc.c - the block allocator: blocks handed out in the extents this process holds (layer 2,
 * alloc.h).
 *
 * The store is cut into fixed-size extents. A process allocates only inside extents it holds
 * (its identity is in the extent's catalogue entry), so allocation needs no coordination on the
 * data path. Inside a held extent, blocks are claimed in chunks: the claim sets the bits in the
 * in-memory bitmap, and the batch that links any claimed block first waits for
 * plx_alloc_sync(), which writes the changed bitmap blocks. Before its commit-node writes the
 * batch flushes, so a link never reaches the medium before the claim of the block it names.
 * A crash therefore only leaks claimed blocks (the collector takes them back).
 *
 * Taking extents is alloc_claim.c's; the catalogue and the bitmaps on the medium are
 * alloc_write.c's (alloc_shared.h: what the three share). The three are in that order from
 * the top: this file calls both, a claim calls alloc_write.c, and nothing calls back up. So the
 * close is here too: it lets a claim finish and gives the pools back before the bitmaps and the
 * catalogue entries are written.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc_shared.h"
#include "lock.h"

#define CLAIM_CHUNK 2048u

enum plx_extent_type plx_block_type(const plx_store *st, uint64_t block)
{
    uint64_t e = block / eb(st);
    if (e >= st->sb.extent_count)
        return PLX_EXTENT_UNUSED;
    return (enum plx_extent_type)st->cat[e].type;
}

bool plx_block_in_bitmap_area(const plx_store *st, uint64_t block)
{
    return block / eb(st) != 0 && block % eb(st) < bitmap_blocks(st);
}

/* ---- Allocator ---------------------------------------------------------------------------------- */

int plx_alloc_init(plx_store *st)
{
    struct plx_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return plx_err(st, -ENOMEM, "out of memory for extent state");
    st->alloc = a;
    a->ext = calloc(st->sb.extent_count, sizeof *a->ext);
    if (!a->ext)
        return plx_err(st, -ENOMEM, "out of memory for extent state");
    a->claim_chunk = CLAIM_CHUNK;
    if (a->claim_chunk > eb(st) / 4)
        a->claim_chunk = eb(st) / 4;
    /* For measurements: claim synchronously only, as before claims ahead existed. */
    const char *ahead = getenv("PARALLAX_CLAIM_AHEAD");
    a->no_ahead = ahead && strcmp(ahead, "0") == 0;
    /* For measurements (and stores that must stay thin): data extents are not zeroed ahead. */
    const char *zero = getenv("PARALLAX_ZERO_AHEAD");
    a->no_zero_ahead = zero && strcmp(zero, "0") == 0;
    return 0;
}

void plx_alloc_free(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (!a)
        return;
    for (uint64_t e = 0; a->ext && e < st->sb.extent_count; e++) {
        plx_block_free(a->ext[e].bitmap);
        free(a->ext[e].dirty_blocks);
        free(a->ext[e].slots);
        free(a->ext[e].reserved);
        free(a->ext[e].young[0]);
        free(a->ext[e].young[1]);
    }
    free(a->ext);
    plx_claim_drop(st, a->claim);
    while (a->waiters) {
        struct plx_alloc_waiter *w = a->waiters;
        a->waiters = w->next;
        free(w);
    }
    free(a);
    st->alloc = NULL;
}

/* Give back claimed-but-unused blocks, write the bitmaps, release our extents. */
int plx_alloc_shutdown(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (!a->ext)
        return 0;
    plx_alloc_claim_finish(st);
    a->closing = true;
    /* The extents are given back below: no zeroing may run in them once another process can
     * take them. */
    plx_backend_prepare_stop(st->be, 0, st->be->nblocks);
    if (getenv("PARALLAX_CLAIM_STATS"))
        fprintf(stderr,
                "parallax: extent claims: %llu spares taken ready, %llu waited for, %llu "
                "synchronous; requests waited %.1f ms in claims (longest %.1f ms)\n",
                (unsigned long long)a->claims_ahead, (unsigned long long)a->claims_waited,
                (unsigned long long)a->claims_sync, (double)a->stall_ns / 1e6,
                (double)a->stall_max_ns / 1e6);
    plx_alloc_return_pools(st);
    int rc = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        struct plx_extent_state *x = &a->ext[e];
        if (!x->held)
            continue;
        for (uint64_t b = 0; b < bitmap_blocks(st) && !rc; b++) {
            if (x->dirty_blocks[b] <= a->written_gen)
                continue;
            rc =
                plx_sync_io(st, PLX_IO_WRITE, e * eb(st) + b, 1, x->bitmap + b * PLX_BLOCK_SIZE, 0);
        }
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        return plx_err(st, rc, "writing allocation bitmaps at close: %s", strerror(-rc));
    a->written_gen = a->gen;
    rc = plx_admin_lock(st);
    if (rc)
        return rc;
    /* Entries as they are now: a collector may have named a reclaim record in one since we
     * read them (FORMAT.md §6.1), and the release must not drop it. */
    rc = plx_catalogue_read(st);
    for (uint64_t e = 1; e < st->sb.extent_count && !rc; e++) {
        if (!a->ext[e].held)
            continue;
        struct plx_extent_entry ent = st->cat[e];
        ent.holder_host = 0;
        ent.holder_pid = 0;
        ent.holder_epoch = 0;
        if (a->ext[e].free == 0)
            ent.flags |= PLX_EXTENT_FULL;
        rc = plx_extent_entry_write(st, e, &ent);
        a->ext[e].held = false;
        for (uint64_t s = 0; a->ext[e].slots && s < eb(st) / slot_blocks(st); s++)
            if (a->ext[e].slots[s].leaf)
                a->slots_owned--;
        free(a->ext[e].slots);
        a->ext[e].slots = NULL;
        free(a->ext[e].reserved);
        a->ext[e].reserved = NULL;
        for (int k = 0; k < 2; k++) {
            free(a->ext[e].young[k]);
            a->ext[e].young[k] = NULL;
        }
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_admin_unlock(st);
    return rc;
}

/* Blocks [i, i + n) of held extent e were handed out: young for the reclaim rounds kept. */
static void young_mark(plx_store *st, uint64_t e, uint64_t i, uint64_t n)
{
    struct plx_extent_state *x = &st->alloc->ext[e];
    for (int k = 0; k < 2; k++)
        if (x->young[k])
            for (uint64_t j = i; j < i + n; j++)
                bit_set(x->young[k], j, true);
}

/* Claim a run of free blocks in a held extent of `type` into the pool. */
static int pool_refill(plx_store *st, enum plx_extent_type type, struct plx_alloc_pool *pool)
{
    struct plx_alloc *a = st->alloc;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (uint64_t e = 1; e < st->sb.extent_count; e++) {
            struct plx_extent_state *x = &a->ext[e];
            if (!x->held || x->spare || st->cat[e].type != type || x->free == 0)
                continue;
            /* First fit from the start keeps a writer's blocks close together. */
            uint64_t i = bitmap_blocks(st);
            while (i < eb(st) && bit_get(x->bitmap, i))
                i++;
            if (i == eb(st)) {
                x->free = 0;
                continue;
            }
            uint64_t j = i;
            while (j < eb(st) && j - i < a->claim_chunk && !bit_get(x->bitmap, j))
                j++;
            a->gen++;
            for (uint64_t k = i; k < j; k++) {
                bit_set(x->bitmap, k, true);
                x->dirty_blocks[k / (PLX_BLOCK_SIZE * 8)] = a->gen;
            }
            x->free -= j - i;
            pool->next = e * eb(st) + i;
            pool->end = e * eb(st) + j;
            pool->extent = e;
            pool->valid = true;
            plx_claim_ahead_check(st, type);
            return 0;
        }
        if (attempt == 0) {
            int rc = plx_extent_claim(st, type, true);
            if (rc)
                return rc;
        }
    }
    return plx_err(st, -ENOSPC, "blockstore full");
}

int plx_alloc_blocks(plx_store *st, enum plx_extent_type type, uint64_t want, uint64_t *first)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    struct plx_alloc_pool *pool = &st->alloc->pool[type == PLX_EXTENT_DATA];
    if (st->alloc->claim)
        plx_claim_ahead_check(st, type); /* waiting for the lock: try again */
    if (!pool->valid || pool->next == pool->end) {
        int rc = pool_refill(st, type, pool);
        if (rc)
            return rc;
    }
    uint64_t n = pool->end - pool->next;
    if (n > want)
        n = want;
    *first = pool->next;
    pool->next += n;
    young_mark(st, pool->extent, *first % eb(st), n);
    return (int)n;
}

/* ---- Data blocks placed by leaf --------------------------------------------------------------- */

/* Claim block i of held extent e (in memory; a batch makes it durable, see the top). */
static void claim_block(plx_store *st, uint64_t e, uint64_t i)
{
    struct plx_alloc *a = st->alloc;
    struct plx_extent_state *x = &a->ext[e];
    a->gen++;
    bit_set(x->bitmap, i, true);
    x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = a->gen;
    x->free--;
}

static uint64_t slot_free(const plx_store *st, const struct plx_extent_state *x, uint64_t s)
{
    uint64_t n = slot_blocks(st), used = 0;
    const uint8_t *bits = x->bitmap + s * n / 8;
    for (uint64_t i = 0; i < n / 8; i++)
        used += (uint64_t)__builtin_popcount(bits[i]);
    return n - used;
}

/* Block i of an owned slot may be handed out: reserved for it, or free. */
static bool place_free(const struct plx_extent_state *x, uint64_t i)
{
    return bit_get(x->reserved, i) || !bit_get(x->bitmap, i);
}

/* Hand out block i of an owned slot: take it out of the reservation, or claim it. */
static void take_block(plx_store *st, uint64_t e, uint64_t i)
{
    struct plx_extent_state *x = &st->alloc->ext[e];
    if (bit_get(x->reserved, i)) {
        bit_set(x->reserved, i, false);
        st->alloc->reserved--;
    } else {
        claim_block(st, e, i);
    }
}

/* The place of owned slot s nearest to offset off (off itself first); false if none is left. */
static bool slot_nearest_free(const plx_store *st, const struct plx_extent_state *x, uint64_t s,
                              uint64_t off, uint64_t *i)
{
    uint64_t n = slot_blocks(st), base = s * n;
    for (uint64_t d = 0; d < n; d++) {
        if (off + d < n && place_free(x, base + off + d)) {
            *i = base + off + d;
            return true;
        }
        if (d && d <= off && place_free(x, base + off - d)) {
            *i = base + off - d;
            return true;
        }
    }
    return false;
}

/* A slot for a leaf whose entry at offset off needs a block (UINT64_MAX: any offset). First an
 * empty unowned slot, in store order from a cursor that only moves forward (so a sequential
 * writer's leaves lie one after the other; the cursor goes back to the start when blocks are
 * given back or an extent is taken). When none is left, an unowned slot with offset off free
 * and at least min_free free blocks, from a rotating cursor: holes left by leaves frozen early
 * get filled. The cursors make the common case O(1); the worst is O(slots held). */
static bool slot_choose(plx_store *st, uint64_t off, uint64_t min_free, uint64_t *ext,
                        uint64_t *slot)
{
    struct plx_alloc *a = st->alloc;
    uint64_t n = slot_blocks(st), spe = eb(st) / n, total = st->sb.extent_count * spe;
    for (; a->empty_cursor < total; a->empty_cursor++) {
        uint64_t e = a->empty_cursor / spe, s = a->empty_cursor % spe;
        if (!is_data_extent(st, e)) {
            a->empty_cursor = (e + 1) * spe - 1;
            continue;
        }
        const struct plx_extent_state *x = &a->ext[e];
        if (!x->slots[s].leaf && slot_empty(st, x, s)) {
            *ext = e;
            *slot = s;
            a->empty_cursor++;
            return true;
        }
    }
    for (uint64_t k = 0; k < total; k++) {
        uint64_t g = (a->fill_cursor + k) % total, e = g / spe, s = g % spe;
        if (!is_data_extent(st, e)) {
            k += spe - 1 - s;
            continue;
        }
        const struct plx_extent_state *x = &a->ext[e];
        if (x->slots[s].leaf || (off != UINT64_MAX && bit_get(x->bitmap, s * n + off)))
            continue;
        if (slot_free(st, x, s) < min_free)
            continue;
        a->fill_cursor = g;
        *ext = e;
        *slot = s;
        return true;
    }
    return false;
}

/* Any free block of a held data extent, first fit. */
static bool any_free_block(plx_store *st, uint64_t *ext, uint64_t *i)
{
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        if (!is_data_extent(st, e))
            continue;
        const uint8_t *bits = st->alloc->ext[e].bitmap;
        for (uint64_t k = bitmap_blocks(st) / 8; k < eb(st) / 8; k++) {
            if (bits[k] == 0xff)
                continue;
            uint64_t j = k * 8;
            while (bit_get(bits, j))
                j++;
            *ext = e;
            *i = j;
            return true;
        }
    }
    return false;
}

/* At least a quarter of the held data extents' blocks are in use: slots never make a process
 * hold more than four times the data it has written. (A disk rewritten in random order after a
 * snapshot needs a second copy's worth of slots, so half would be too tight.) */
static bool data_mostly_used(const plx_store *st)
{
    uint64_t held = 0, free_blocks = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        const struct plx_extent_state *x = &st->alloc->ext[e];
        if (x->held && !x->spare && x->slots) {
            held += eb(st);
            free_blocks += x->free;
        }
    }
    return (held - free_blocks - st->alloc->reserved) * 4 >= held;
}

/* The held extent state of the slot at base if leaf/tag own it, else NULL. */
static struct plx_extent_state *owned_slot(plx_store *st, uint64_t base, uint64_t leaf,
                                           uint64_t tag)
{
    uint64_t e = base / eb(st), s = base % eb(st) / slot_blocks(st);
    if (!base || e >= st->sb.extent_count)
        return NULL;
    struct plx_extent_state *x = &st->alloc->ext[e];
    return x->held && x->slots && x->slots[s].leaf == leaf && x->slots[s].tag == tag ? x : NULL;
}

/* Take slot s of extent e for leaf/tag and claim its free blocks: a batch then writes the
 * bitmap once for the slot instead of for every block the leaf adds. */
static void slot_take(plx_store *st, uint64_t e, uint64_t s, uint64_t leaf, uint64_t tag)
{
    struct plx_alloc *a = st->alloc;
    struct plx_extent_state *x = &a->ext[e];
    x->slots[s].leaf = leaf;
    x->slots[s].tag = tag;
    a->slots_owned++;
    uint64_t n = slot_blocks(st);
    a->gen++;
    for (uint64_t i = s * n; i < s * n + n; i++) {
        if (bit_get(x->bitmap, i))
            continue;
        bit_set(x->bitmap, i, true);
        bit_set(x->reserved, i, true);
        x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = a->gen;
        x->free--;
        a->reserved++;
    }
    plx_claim_ahead_check(st, PLX_EXTENT_DATA);
}

/* Give back what slot s of extent e still has reserved (nothing links those blocks). */
static void slot_unreserve(plx_store *st, uint64_t e, uint64_t s)
{
    struct plx_alloc *a = st->alloc;
    struct plx_extent_state *x = &a->ext[e];
    uint64_t n = slot_blocks(st);
    a->gen++;
    for (uint64_t i = s * n; i < s * n + n; i++) {
        if (!bit_get(x->reserved, i))
            continue;
        bit_set(x->reserved, i, false);
        bit_set(x->bitmap, i, false);
        x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = a->gen;
        x->free++;
        a->reserved--;
    }
    a->empty_cursor = 0;
}

static void slot_release(plx_store *st, uint64_t e, uint64_t s)
{
    struct plx_extent_state *x = &st->alloc->ext[e];
    x->slots[s].leaf = 0;
    st->alloc->slots_owned--;
    slot_unreserve(st, e, s);
}

/* Give back every reservation (owners keep their slots): before a collection, at close, and
 * when the store has no other free block. */
static void unreserve_all(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    for (uint64_t e = 1; a->reserved && e < st->sb.extent_count; e++)
        for (uint64_t s = 0; a->ext[e].reserved && s < eb(st) / slot_blocks(st); s++)
            if (a->ext[e].slots[s].leaf)
                slot_unreserve(st, e, s);
}

/* The owner of the spill slot (no leaf or VDI has this address or id). */
#define SPILL UINT64_MAX

/* A block whose place in its leaf's slot is taken (by an extent's bitmap, or by a block of a
 * leaf that held the slot before) goes to the spill slot, filled in order: it costs a sequential
 * reader one more request, where taking the nearest free place in the leaf's slot would push
 * its neighbours out of place one after another. */
static bool spill_block(plx_store *st, uint64_t *ext, uint64_t *i)
{
    struct plx_alloc *a = st->alloc;
    uint64_t n = slot_blocks(st), e, s;
    for (int tries = 0; tries < 2; tries++) {
        struct plx_extent_state *x = owned_slot(st, a->spill, SPILL, SPILL);
        if (x) {
            e = a->spill / eb(st);
            s = a->spill % eb(st) / n;
            if (slot_nearest_free(st, x, s, 0, i)) {
                *ext = e;
                return true;
            }
            slot_release(st, e, s); /* full */
        }
        a->spill = 0;
        if (!slot_choose(st, UINT64_MAX, n / 4, &e, &s) &&
            !(data_mostly_used(st) && plx_extent_claim(st, PLX_EXTENT_DATA, false) == 0 &&
              slot_choose(st, UINT64_MAX, n / 4, &e, &s)) &&
            !slot_choose(st, UINT64_MAX, 1, &e, &s))
            return false;
        slot_take(st, e, s, SPILL, SPILL);
        a->spill = e * eb(st) + s * n;
    }
    return false;
}

int plx_alloc_leaf_block(plx_store *st, uint64_t tag, uint64_t leaf_addr, unsigned idx,
                         uint64_t *slot, uint64_t *block)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    uint64_t n = slot_blocks(st), off = idx % n, e, s, i;
    if (st->alloc->claim)
        plx_claim_ahead_check(st, PLX_EXTENT_DATA); /* waiting for the lock: try again */
    for (int attempt = 0; attempt < 2; attempt++) {
        struct plx_extent_state *x = owned_slot(st, *slot, leaf_addr, tag);
        if (x) {
            e = *slot / eb(st);
            i = *slot % eb(st) + off;
            if (!place_free(x, i) && spill_block(st, &e, &i)) {
                take_block(st, e, i);
                young_mark(st, e, i, 1);
                *block = e * eb(st) + i;
                return 0;
            }
            if (place_free(x, i) || slot_nearest_free(st, x, *slot % eb(st) / n, off, &i)) {
                take_block(st, e, i);
                young_mark(st, e, i, 1);
                *block = e * eb(st) + i;
                return 0;
            }
        }
        /* Every slot is owned or mostly full. A new extent gives the leaves slots of their
         * own, but only while what this process holds is well used: a writer scattering single
         * blocks over many leaves would otherwise take extent after extent (and starve other
         * writers) for slots that stay almost empty. Then any slot with the place free, then
         * any free block. */
        bool got = slot_choose(st, off, n / 4, &e, &s);
        if (!got && attempt == 0 && data_mostly_used(st)) {
            int rc = plx_extent_claim(st, PLX_EXTENT_DATA, false);
            if (rc == 0)
                continue;
            if (rc != -ENOSPC && rc != -EWOULDBLOCK)
                return rc;
        }
        if (got || slot_choose(st, off, 1, &e, &s)) {
            slot_take(st, e, s, leaf_addr, tag);
            *slot = e * eb(st) + s * n;
            take_block(st, e, s * n + off);
            young_mark(st, e, s * n + off, 1);
            *block = *slot + off;
            return 0;
        }
        if (!any_free_block(st, &e, &i) && st->alloc->reserved)
            unreserve_all(st); /* the store is full but for reservations */
        if (any_free_block(st, &e, &i)) {
            claim_block(st, e, i);
            young_mark(st, e, i, 1);
            *block = e * eb(st) + i;
            return 0;
        }
        if (attempt == 0) {
            int rc = plx_extent_claim(st, PLX_EXTENT_DATA, true);
            if (rc)
                return rc;
        }
    }
    return plx_err(st, -ENOSPC, "blockstore full");
}

void plx_alloc_release_slots(plx_store *st, uint64_t tag)
{
    struct plx_alloc *a = st->alloc;
    for (uint64_t e = 1; a->slots_owned && e < st->sb.extent_count; e++) {
        struct plx_extent_state *x = &a->ext[e];
        for (uint64_t s = 0; x->slots && s < eb(st) / slot_blocks(st); s++) {
            if (x->slots[s].leaf && x->slots[s].tag == tag)
                slot_release(st, e, s);
        }
    }
}

void plx_alloc_extent_released(plx_store *st, uint64_t e)
{
    struct plx_extent_state *x = &st->alloc->ext[e];
    for (int t = 0; t < 2; t++)
        if (st->alloc->spare[t] == e)
            st->alloc->spare[t] = 0;
    for (uint64_t s = 0; x->slots && s < eb(st) / slot_blocks(st); s++)
        if (x->slots[s].leaf)
            slot_release(st, e, s);
    plx_block_free(x->bitmap);
    free(x->dirty_blocks);
    free(x->slots);
    free(x->reserved);
    free(x->young[0]);
    free(x->young[1]);
    memset(x, 0, sizeof *x);
}

/* Give claimed-but-unused blocks (pools, slot reservations) back to their bitmaps (in memory;
 * the next allocator write carries it). Safe at any time: nothing links a block before it is
 * handed out. */
void plx_alloc_return_pools(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    for (int t = 0; t < 2; t++) {
        struct plx_alloc_pool *p = &a->pool[t];
        if (!p->valid)
            continue;
        struct plx_extent_state *x = &a->ext[p->extent];
        a->gen++;
        for (uint64_t blk = p->next; blk < p->end; blk++) {
            uint64_t i = blk % eb(st);
            bit_set(x->bitmap, i, false);
            x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = a->gen;
            x->free++;
        }
        p->valid = false;
    }
    unreserve_all(st);
    a->empty_cursor = 0;
}

void plx_alloc_blocks_freed(plx_store *st)
{
    st->alloc->empty_cursor = 0;
}

/* ---- Folding in what a collector found ------------------------------------------------------
 *
 * A collector cannot free blocks in an extent a live process holds: the holder writes that
 * bitmap from memory, and only the holder knows which of its blocks are handed out but not yet
 * linked (a write in flight, a batch not committed) and so unmarked by a mark that read their
 * parents too early. So the holder frees them itself, in two steps with the collector between
 * (reclaim.c has the protocol):
 *
 * 1. A round begins (plx_alloc_round_begin) when the holder sees a collector's request; the
 *    holder answers it once everything handed out before the round began is linked or
 *    abandoned (the pipeline's batches of that time have finished). Only then does the collector
 *    checkpoint the bitmap and read the roots. So a block handed out before the round began and
 *    linked at any time after the checkpoint was linked, on the medium, before it: the mark
 *    finds it. A block handed out after the round began is young for the round.
 * 2. The collector publishes the blocks it found allocated in its checkpoint and unmarked, for
 *    that round; the holder frees those that are still allocated here and are not young for the
 *    round, not in a pool and not reserved by a slot (plx_alloc_fold).
 *
 * Young sets are bitmaps per held extent, kept for the current round and the one before (a
 * hand-out marks both), so a publication made for the round before the current one still folds
 * (a second collector's request may begin a round between one's answer and its publication).
 */
uint64_t plx_alloc_round_begin(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    uint64_t r = ++a->round;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        struct plx_extent_state *x = &a->ext[e];
        if (!x->held)
            continue;
        for (int k = 0; k < 2; k++)
            if (!x->young[k])
                x->young[k] = calloc(eb(st) / 8, 1);
        /* The set of round r - 2 becomes round r's, empty: nothing was handed out in r yet. */
        if (x->young[r & 1])
            memset(x->young[r & 1], 0, eb(st) / 8);
    }
    return r;
}

int64_t plx_alloc_fold(plx_store *st, uint64_t e, uint64_t round, uint64_t nonce,
                       const uint8_t *bits)
{
    struct plx_alloc *a = st->alloc;
    if (e == 0 || e >= st->sb.extent_count)
        return -EINVAL;
    struct plx_extent_state *x = &a->ext[e];
    /* Not held now, or taken after the round began (the round's answer may have come from an
     * earlier hold of it: what was handed out in between is not in the young sets), or a round
     * whose young set is gone, or folded already: nothing may be freed. */
    if (!x->held || round == 0 || x->hold_round >= round || round > a->round ||
        round + 1 < a->round || !x->young[round & 1] || (nonce && x->folded_nonce == nonce))
        return -ESTALE;
    const uint8_t *young = x->young[round & 1];
    uint64_t freed = 0, base = e * eb(st);
    a->gen++;
    for (uint64_t i = bitmap_blocks(st); i < eb(st); i++) {
        if (!bit_get(bits, i) || !bit_get(x->bitmap, i) || bit_get(young, i))
            continue;
        if (x->reserved && bit_get(x->reserved, i))
            continue;
        bool pooled = false;
        for (int t = 0; t < 2; t++) {
            const struct plx_alloc_pool *p = &a->pool[t];
            pooled |= p->valid && p->extent == e && base + i >= p->next && base + i < p->end;
        }
        if (pooled)
            continue;
        bit_set(x->bitmap, i, false);
        x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = a->gen;
        x->free++;
        freed++;
    }
    x->folded_nonce = nonce;
    a->folded += freed;
    if (freed)
        plx_alloc_blocks_freed(st);
    return (int64_t)freed;
}
