/*
 * check_extents.c - the consistency checker's look at the system blocks and extents
 * (check_shared.h): superblock, state block and extent catalogue against what the store was
 * opened with; each extent's allocation bitmap read; the extents' reclaim records marked; and,
 * once every tree is walked, the blocks the bitmaps allocate that nothing reaches (leaks).
 */
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "check_shared.h"

/* ---- Superblock, state, catalogue, bitmaps --------------------------------------------------- */

int ck_system(struct ck *c)
{
    plx_store *st = c->st;
    int rc = plx_sync_io(st, PLX_IO_READ, 0, 2, c->iobuf, 0);
    if (rc)
        return plx_err(st, rc, "check: reading the superblock and state block: %s", strerror(-rc));
    const char *why = "";
    if (plx_blkhdr_verify(c->iobuf, PLX_MAGIC_SUPER, 0, &why))
        ck_problem(c, 1, "superblock is corrupt: %s", why);
    else if (memcmp(c->iobuf, &st->sb, sizeof st->sb) != 0)
        ck_problem(c, 1, "superblock differs from the one read when the store was opened");

    const uint8_t *sblk = c->iobuf + PLX_BLOCK_SIZE;
    c->state = st->state;
    if (plx_blkhdr_verify(sblk, PLX_MAGIC_STATE_V2, st->sb.state_block, &why))
        ck_problem(c, 1, "system state block is corrupt: %s (using the copy read at open)", why);
    else
        memcpy(&c->state, sblk, sizeof c->state);
    if (c->state.registry_used > st->sb.registry_slots) {
        ck_problem(c, 1, "system state block: %llu registry slots used, beyond the %llu there are",
                   (unsigned long long)c->state.registry_used,
                   (unsigned long long)st->sb.registry_slots);
        c->state.registry_used = st->sb.registry_slots;
    }
    if (c->state.next_vdi_id == 0)
        ck_problem(c, 1, "system state block: next VDI id is 0");

    /* The catalogue: a block that does not validate is reported and its extents keep the types
     * read at open, so the walk can still go on. */
    for (uint64_t b0 = 0; b0 < st->sb.catalogue_blocks; b0 += CK_RUN) {
        uint64_t n = st->sb.catalogue_blocks - b0 < CK_RUN ? st->sb.catalogue_blocks - b0 : CK_RUN;
        rc = plx_sync_io(st, PLX_IO_READ, st->sb.catalogue_start + b0, (uint32_t)n, c->iobuf, 0);
        if (rc)
            return plx_err(st, rc, "check: reading the extent catalogue: %s", strerror(-rc));
        for (uint64_t i = 0; i < n; i++) {
            uint64_t b = b0 + i, addr = st->sb.catalogue_start + b;
            const struct plx_catalog_block *cb =
                (const struct plx_catalog_block *)(c->iobuf + i * PLX_BLOCK_SIZE);
            uint64_t first = b * PLX_CATALOG_PER_BLOCK;
            uint64_t want =
                c->next - first < PLX_CATALOG_PER_BLOCK ? c->next - first : PLX_CATALOG_PER_BLOCK;
            uint64_t have = 0; /* entries of this block that can be believed */
            if (plx_blkhdr_verify(cb, PLX_MAGIC_CATALOG, addr, &why))
                ck_problem(c, 1, "extent catalogue block %llu is corrupt: %s",
                           (unsigned long long)addr, why);
            else if (cb->first_extent != first || cb->count > PLX_CATALOG_PER_BLOCK)
                ck_problem(c, 1, "extent catalogue block %llu is corrupt: wrong extent range",
                           (unsigned long long)addr);
            else if ((have = cb->count < want ? cb->count : want) < want)
                ck_problem(c, 1, "extent catalogue block %llu holds %u entries, %llu expected",
                           (unsigned long long)addr, cb->count, (unsigned long long)want);
            for (uint64_t k = 0; k < want; k++) {
                uint64_t e = first + k;
                unsigned t = k < have ? cb->entries[k].type : st->cat[e].type;
                bool ok = t <= PLX_EXTENT_DATA && (e == 0) == (t == PLX_EXTENT_SYSTEM);
                if (!ok && k < have)
                    ck_problem(c, 1, "extent catalogue: extent %llu has invalid type %u",
                               (unsigned long long)e, t);
                c->types[e] = ok ? (uint8_t)t : CK_TYPE_BAD;
            }
        }
    }
    return 0;
}

void ck_read_bitmaps(struct ck *c)
{
    /* Extents up to 32 GiB have a bitmap that fits the run buffer; larger ones get their own. */
    uint8_t *bits = c->iobuf;
    uint8_t *own = NULL;
    if (c->bmb > CK_RUN) {
        own = plx_block_alloc(c->bmb);
        bits = own;
    }
    for (uint64_t e = 1; e < c->next; e++) {
        ck_progress(c, "reading bitmaps", e, c->next);
        if (c->types[e] != PLX_EXTENT_METADATA && c->types[e] != PLX_EXTENT_DATA)
            continue;
        int rc = plx_sync_io(c->st, PLX_IO_READ, e * c->eb, (uint32_t)c->bmb, bits, 0);
        if (rc) {
            ck_problem(c, 1,
                       "reading the allocation bitmap of extent %llu: %s (its blocks are "
                       "not checked against it)",
                       (unsigned long long)e, strerror(-rc));
            continue;
        }
        memcpy(c->alloc + e * c->eb / 64, bits, c->eb / 8);
        c->bm_ok[e] = 1;
        for (uint64_t b = 0; b < c->bmb; b++) {
            if (!bit_test(c->alloc, e * c->eb + b)) {
                ck_problem(c, 1,
                           "the allocation bitmap of extent %llu does not mark its own "
                           "block %llu allocated",
                           (unsigned long long)e, (unsigned long long)(e * c->eb + b));
                break;
            }
        }
    }
    if (own)
        plx_block_free(own);
}

/* ---- Trees held open by live processes ------------------------------------------------------- */

/* The extents' reclaim records (FORMAT.md §6.1): live while their catalogue entry names them,
 * not radix nodes. One an older collector freed (not a record any more) is no error: readers
 * check every block of it, and the next collection unlinks it. */
void ck_reclaim_records(struct ck *c)
{
    plx_store *st = c->st;
    struct plx_reclaim_req *q = plx_block_alloc(1);
    for (uint64_t e = 1; q && st->cat && e < c->next; e++) {
        uint64_t addr = st->cat[e].reclaim;
        const char *why = "";
        if (!addr || addr >= c->nb || plx_sync_io(st, PLX_IO_READ, addr, 1, q, 0) != 0 ||
            plx_blkhdr_verify(q, PLX_MAGIC_RECLAIM_REQ, addr, &why) != 0 || q->extent != e ||
            q->bits_blocks > PLX_RECLAIM_MAX_BITS_BLOCKS)
            continue;
        uint64_t blocks[2 + PLX_RECLAIM_MAX_BITS_BLOCKS];
        size_t n = 0;
        blocks[n++] = addr;
        blocks[n++] = q->ack_addr;
        for (uint32_t k = 0; k < q->bits_blocks; k++)
            blocks[n++] = q->bits_addr[k];
        for (size_t i = 0; i < n; i++) {
            uint64_t a = blocks[i];
            if (a >= c->nb)
                continue;
            if (bit_test(c->reach, a))
                ck_problem(c, 1,
                           "block %llu of extent %llu's reclaim record is reachable from a tree "
                           "or another record too",
                           (unsigned long long)a, (unsigned long long)e);
            bit_set(c->reach, a);
        }
    }
    plx_block_free(q);
}

/* ---- Leaks ----------------------------------------------------------------------------------- */

void ck_leaks(struct ck *c)
{
    plx_store *st = c->st;
    /* Blocks this process has claimed but not used yet are not leaks: closing the store gives
     * them back. Bitmap blocks are allocated by definition and never reachable. */
    for (int t = 0; t < 2; t++) {
        const struct plx_alloc_pool *p = &st->alloc->pool[t];
        if (!p->valid)
            continue;
        for (uint64_t b = p->next; b < p->end && b < c->nb; b++)
            bit_clear(c->alloc, b);
    }
    /* Likewise the blocks this process's leaf slots have reserved (alloc.h), and blocks it has
     * given back in memory that the medium's bitmap does not show yet. */
    for (uint64_t e = 1; e < c->next && e < st->sb.extent_count; e++) {
        const struct plx_extent_state *x = &st->alloc->ext[e];
        if (!x->held || !x->bitmap)
            continue;
        for (uint64_t i = 0; i < c->eb; i++) {
            bool res = x->reserved && ((x->reserved[i >> 3] >> (i & 7)) & 1);
            if (res || !((x->bitmap[i >> 3] >> (i & 7)) & 1))
                bit_clear(c->alloc, e * c->eb + i);
        }
    }
    for (uint64_t e = 1; e < c->next; e++) {
        if (!c->bm_ok[e])
            continue;
        for (uint64_t b = 0; b < c->bmb; b++)
            bit_clear(c->alloc, e * c->eb + b);
        uint64_t count = 0, first = 0, last = 0;
        for (uint64_t w = e * c->eb / 64; w < (e + 1) * c->eb / 64; w++) {
            uint64_t leak = c->alloc[w] & ~c->reach[w];
            if (!leak)
                continue;
            if (!count)
                first = w * 64 + (uint64_t)__builtin_ctzll(leak);
            last = w * 64 + 63 - (uint64_t)__builtin_clzll(leak);
            count += (uint64_t)__builtin_popcountll(leak);
        }
        if (!count)
            continue;
        c->out->leaked_blocks += count;
        const char *tn = ck_type_name(c->types[e]);
        /* After damage, "unreachable" may only mean "below a reference that could not be
         * followed": say so, so that nobody reclaims them on this report's word alone. */
        const char *note = c->incomplete ? " (the walk was incomplete: some may belong to the "
                                           "damaged trees reported above)"
                                         : "";
        if (count == 1)
            ck_problem(c, 0, "%s block %llu is allocated but not reachable%s", tn,
                       (unsigned long long)first, note);
        else
            ck_problem(c, 0,
                       "%s extent %llu: %llu blocks are allocated but not reachable (first %llu, "
                       "last %llu)%s",
                       tn, (unsigned long long)e, (unsigned long long)count,
                       (unsigned long long)first, (unsigned long long)last, note);
    }
}
