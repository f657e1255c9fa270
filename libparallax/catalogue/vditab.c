/*
 * vditab.c - the VDI table (layer 4, registry.h; FORMAT.md §7.1): a radix tree of 508-way blocks
 * that maps a VDI id to the block holding its record. Ids are handed out in order and never
 * reused, so the table is dense and an id is found in `height` reads: 2 up to 258,063 VDIs, 3 up
 * to 131 million.
 *
 * Crash safety: an entry is set by one in-place write of its level-0 block. Missing blocks on the
 * way are built whole, written and flushed (with their claims) before the one write that links
 * them; a new root is linked by the state block the caller writes. Clearing an entry (the purge)
 * that empties blocks below the root unlinks the highest of them with one in-place write of its
 * parent instead. A crash therefore leaves the
 * table as it was or with the entry set, and an entry whose id the state block has not issued
 * yet is ignored by every reader.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "registry.h"

/* Ids covered by one entry of a block of `level`: FANOUT^level. */
static uint64_t entry_span(unsigned level)
{
    uint64_t s = 1;
    for (unsigned l = 0; l < level; l++)
        s *= PLX_VDITAB_FANOUT;
    return s;
}

static int tab_read(plx_store *st, uint64_t addr, unsigned level, uint64_t first,
                    struct plx_vditab_block *b)
{
    int rc = plx_registry_block_read(st, addr, PLX_MAGIC_VDITAB, b, "VDI table block");
    if (!rc && (b->level != level || b->first_id != first))
        rc = plx_err(st, -EUCLEAN,
                     "VDI table block %llu is corrupt: it says level %u from id %llu, its "
                     "parent expects level %u from id %llu",
                     (unsigned long long)addr, b->level, (unsigned long long)b->first_id, level,
                     (unsigned long long)first);
    return rc;
}

int plx_vditab_get(plx_store *st, uint64_t id, uint64_t *rec_addr)
{
    *rec_addr = 0;
    unsigned h = st->state.vdi_table_height;
    if (!st->state.vdi_table_root || id >= entry_span(h))
        return 0;
    struct plx_vditab_block *b = plx_block_alloc(1);
    uint64_t addr = st->state.vdi_table_root, first = 0;
    int rc = 0;
    for (unsigned level = h - 1;; level--) {
        rc = tab_read(st, addr, level, first, b);
        if (rc)
            break;
        uint64_t i = (id - first) / entry_span(level);
        addr = b->entries[i];
        first += i * entry_span(level);
        if (level == 0 || addr == 0) {
            *rec_addr = level == 0 ? addr : 0;
            break;
        }
    }
    plx_block_free(b);
    return rc;
}

/* A new table block of `level` from id `first` holding one entry, written (not yet durable). */
static int tab_new(plx_store *st, unsigned level, uint64_t first, uint64_t i, uint64_t val,
                   uint64_t *addr)
{
    struct plx_vditab_block *b = plx_block_alloc(1);
    memset(b, 0, PLX_BLOCK_SIZE);
    b->level = level;
    b->first_id = first;
    b->entries[i] = val;
    int rc = plx_registry_new_block(st, b, PLX_MAGIC_VDITAB, addr);
    plx_block_free(b);
    return rc;
}

/* A chain of new blocks from `level` down to 0 leading to id's entry = val; *top = its top. */
static int tab_new_path(plx_store *st, unsigned level, uint64_t first, uint64_t id, uint64_t val,
                        uint64_t *top)
{
    /* Bottom up: each block links the one below, which is written first. */
    uint64_t child = val;
    int rc = 0;
    for (unsigned l = 0; l <= level && !rc; l++) {
        uint64_t span_up = entry_span(l + 1); /* ids covered by a block of level l */
        uint64_t bfirst = first + (id - first) / span_up * span_up;
        uint64_t i = (id - bfirst) / entry_span(l);
        rc = tab_new(st, l, bfirst, i, child, &child);
    }
    *top = child;
    return rc;
}

static bool tab_empty(const struct plx_vditab_block *b)
{
    for (unsigned i = 0; i < PLX_VDITAB_FANOUT; i++)
        if (b->entries[i])
            return false;
    return true;
}

/* Clear id's entry. A block below the root that the clearing empties is unlinked instead, by
 * clearing its entry in its parent (and so on up while parents empty): one in-place write,
 * which removes the entry and drops the empty blocks at once; they are garbage for the
 * collector. An id of a dropped block that is issued later (its range was not used up) gets a
 * new path like any missing block. */
static int tab_clear(plx_store *st, uint64_t id, uint64_t *old)
{
    unsigned h = st->state.vdi_table_height;
    if (!st->state.vdi_table_root || id >= entry_span(h))
        return 0;
    struct plx_vditab_block *b = plx_block_alloc(h);
    uint64_t addr[PLX_VDITAB_MAX_HEIGHT], idx[PLX_VDITAB_MAX_HEIGHT];
    uint64_t a = st->state.vdi_table_root, first = 0;
    int rc = 0;
    unsigned level = h - 1, top = h - 1;
    for (;; level--) {
        struct plx_vditab_block *cur = &b[level];
        rc = tab_read(st, a, level, first, cur);
        if (rc)
            goto out;
        addr[level] = a;
        idx[level] = (id - first) / entry_span(level);
        a = cur->entries[idx[level]];
        first += idx[level] * entry_span(level);
        if (a == 0)
            goto out; /* not there */
        if (level == 0)
            break;
    }
    if (old)
        *old = a;
    /* The highest block that would be left empty (below the root) is unlinked by its parent. */
    unsigned at = 0;
    b[0].entries[idx[0]] = 0;
    while (at < top && tab_empty(&b[at])) {
        at++;
        b[at].entries[idx[at]] = 0;
    }
    plx_blkhdr_seal(&b[at], PLX_MAGIC_VDITAB, addr[at]);
    rc = plx_sync_io(st, PLX_IO_WRITE, addr[at], 1, &b[at], 0);
    if (rc)
        plx_err(st, rc, "writing VDI table block %llu: %s", (unsigned long long)addr[at],
                strerror(-rc));
out:
    plx_block_free(b);
    return rc;
}

int plx_vditab_set(plx_store *st, uint64_t id, uint64_t rec_addr, uint64_t *old)
{
    int rc = 0;
    if (old)
        *old = 0;
    if (rec_addr == 0)
        return tab_clear(st, id, old);
    /* Grow: a new root above the old one, until the table covers id. */
    if (!st->state.vdi_table_root) {
        unsigned h = 1;
        while (id >= entry_span(h))
            h++;
        if (h > PLX_VDITAB_MAX_HEIGHT)
            return plx_err(st, -EFBIG, "VDI id %llu is beyond the VDI table",
                           (unsigned long long)id);
        if (rec_addr == 0)
            return 0;
        uint64_t root;
        rc = tab_new_path(st, h - 1, 0, id, rec_addr, &root);
        if (!rc)
            rc = plx_registry_durable(st);
        if (!rc) {
            st->state.vdi_table_root = root;
            st->state.vdi_table_height = h;
        }
        return rc;
    }
    while (id >= entry_span(st->state.vdi_table_height)) {
        unsigned h = st->state.vdi_table_height;
        if (h >= PLX_VDITAB_MAX_HEIGHT)
            return plx_err(st, -EFBIG, "VDI id %llu is beyond the VDI table",
                           (unsigned long long)id);
        uint64_t root;
        rc = tab_new(st, h, 0, 0, st->state.vdi_table_root, &root);
        if (!rc)
            rc = plx_registry_durable(st);
        if (rc)
            return rc;
        st->state.vdi_table_root = root;
        st->state.vdi_table_height = h + 1;
    }
    struct plx_vditab_block *b = plx_block_alloc(1);
    uint64_t addr = st->state.vdi_table_root, first = 0;
    for (unsigned level = st->state.vdi_table_height - 1;; level--) {
        rc = tab_read(st, addr, level, first, b);
        if (rc)
            break;
        uint64_t i = (id - first) / entry_span(level);
        uint64_t child_first = first + i * entry_span(level);
        if (level == 0 || b->entries[i] == 0) {
            if (level == 0 && old)
                *old = b->entries[i];
            if (level > 0 && rec_addr == 0)
                break; /* clearing an entry that is not there */
            uint64_t val = rec_addr;
            if (level > 0) {
                rc = tab_new_path(st, level - 1, child_first, id, rec_addr, &val);
                if (!rc)
                    rc = plx_registry_durable(st);
            }
            if (!rc) {
                b->entries[i] = val;
                plx_blkhdr_seal(b, PLX_MAGIC_VDITAB, addr);
                rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, b, 0);
                if (rc)
                    plx_err(st, rc, "writing VDI table block %llu: %s", (unsigned long long)addr,
                            strerror(-rc));
            }
            break;
        }
        addr = b->entries[i];
        first = child_first;
    }
    plx_block_free(b);
    return rc;
}

struct walk {
    plx_store *st;
    uint64_t after, end; /* visit ids in (after, end) */
    int (*block)(void *arg, uint64_t addr);
    int (*entry)(void *arg, uint64_t id, uint64_t rec_addr);
    void *arg;
};

static int walk_block(struct walk *w, uint64_t addr, unsigned level, uint64_t first)
{
    struct plx_vditab_block *b = plx_block_alloc(1);
    int rc = tab_read(w->st, addr, level, first, b);
    if (!rc && w->block)
        rc = w->block(w->arg, addr);
    uint64_t span = entry_span(level);
    for (uint64_t i = 0; !rc && i < PLX_VDITAB_FANOUT; i++) {
        uint64_t lo = first + i * span;
        if (lo >= w->end)
            break;
        if (lo + span <= w->after + 1 || b->entries[i] == 0)
            continue;
        if (level == 0)
            rc = w->entry(w->arg, lo, b->entries[i]);
        else
            rc = walk_block(w, b->entries[i], level - 1, lo);
    }
    plx_block_free(b);
    return rc;
}

int plx_vditab_walk(plx_store *st, uint64_t after_id, int (*block)(void *arg, uint64_t addr),
                    int (*entry)(void *arg, uint64_t id, uint64_t rec_addr), void *arg)
{
    if (!st->state.vdi_table_root)
        return 0;
    if (st->state.vdi_table_height == 0 || st->state.vdi_table_height > PLX_VDITAB_MAX_HEIGHT)
        return plx_err(st, -EUCLEAN, "system state block: VDI table height %u is invalid",
                       st->state.vdi_table_height);
    struct walk w = {st, after_id, st->state.next_vdi_id, block, entry, arg};
    return walk_block(&w, st->state.vdi_table_root, st->state.vdi_table_height - 1, 0);
}
