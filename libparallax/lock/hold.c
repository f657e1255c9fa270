/*
 * hold.c - the hold table: the trees read-only handles read, recorded on the medium so that a
 * collection in any process keeps them (hold.h; FORMAT.md §7.5).
 *
 * The table is a few blocks at the end of extent 0, which nothing else uses (FORMAT.md §2): no
 * allocation, no pointer to keep, and a store made before the table existed has it already
 * (blocks never written read as empty). Every change is a read-modify-write of one block under
 * the admin lock, like the VDI lock fields; a holder that died leaves an entry that counts for
 * nothing (plx_holder_stale) and is reused by the next hold.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "hold.h"
#include "lock.h"

void plx_hold_area(const plx_store *st, uint64_t *first, uint32_t *n)
{
    /* After the catalogue and the legacy registry slots an upgraded store ever used (slots above
     * registry_used are never written again, FORMAT.md §7.4). */
    uint64_t used = st->sb.registry_start + st->state.registry_used;
    uint64_t eb = st->sb.extent_blocks;
    uint64_t room = eb > used ? eb - used : 0;
    *n = (uint32_t)(room < PLX_HOLD_BLOCKS ? room : PLX_HOLD_BLOCKS);
    *first = eb - *n;
}

/* Read the table; a block that does not verify (never written, or not a hold block) holds
 * nothing. */
static int table_read(plx_store *st, uint64_t first, uint32_t n, struct plx_hold_block *t)
{
    if (n == 0)
        return 0;
    int rc = plx_sync_io(st, PLX_IO_READ, first, n, t, 0);
    if (rc)
        return plx_err(st, rc, "reading the hold table (blocks %llu..%llu): %s",
                       (unsigned long long)first, (unsigned long long)(first + n - 1),
                       strerror(-rc));
    for (uint32_t b = 0; b < n; b++)
        if (plx_blkhdr_verify(&t[b], PLX_MAGIC_HOLD, first + b, NULL))
            memset(&t[b], 0, PLX_BLOCK_SIZE);
    return 0;
}

static int block_write(plx_store *st, uint64_t addr, struct plx_hold_block *b)
{
    plx_blkhdr_seal(b, PLX_MAGIC_HOLD, addr);
    int rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, b, 0);
    if (rc)
        plx_err(st, rc, "writing the hold table block %llu: %s", (unsigned long long)addr,
                strerror(-rc));
    return rc;
}

static bool live(const plx_store *st, const struct plx_hold *h)
{
    return h->host && (plx_holder_is_me(st, h->host, h->pid, h->epoch) ||
                       !plx_holder_stale(st, h->host, h->pid, h->epoch));
}

int plx_hold_add(plx_store *st, uint64_t vdi_id, uint64_t snap, uint64_t root, uint32_t height,
                 uint32_t *slot)
{
    uint64_t first;
    uint32_t n;
    plx_hold_area(st, &first, &n);
    struct plx_hold_block *t = n ? plx_block_alloc(n) : NULL;
    int rc = table_read(st, first, n, t);
    /* A free entry if there is one; else one whose holder is gone. */
    uint32_t found = UINT32_MAX;
    for (uint32_t i = 0; !rc && i < n * PLX_HOLDS_PER_BLOCK && found == UINT32_MAX; i++)
        if (!t[i / PLX_HOLDS_PER_BLOCK].holds[i % PLX_HOLDS_PER_BLOCK].host)
            found = i;
    for (uint32_t i = 0; !rc && i < n * PLX_HOLDS_PER_BLOCK && found == UINT32_MAX; i++)
        if (!live(st, &t[i / PLX_HOLDS_PER_BLOCK].holds[i % PLX_HOLDS_PER_BLOCK]))
            found = i;
    if (!rc && n == 0)
        rc = plx_err(st, -ENOSPC,
                     "no read-only open is possible: extent 0 of this store has no room for the "
                     "hold table (its legacy registry slots fill it), so a reader cannot be "
                     "recorded");
    else if (!rc && found == UINT32_MAX)
        rc = plx_err(st, -ENOSPC,
                     "the store's hold table is full: %u trees are held open read-only by live "
                     "processes; close one of them to open another read-only",
                     n * PLX_HOLDS_PER_BLOCK);
    if (!rc) {
        struct plx_hold_block *b = &t[found / PLX_HOLDS_PER_BLOCK];
        struct plx_hold *h = &b->holds[found % PLX_HOLDS_PER_BLOCK];
        memset(h, 0, sizeof *h);
        plx_holder_set_me(st, &h->host, &h->pid, &h->epoch);
        h->height = height;
        h->vdi_id = vdi_id;
        h->snap = snap;
        h->root = root;
        h->time_ns = plx_now_ns();
        uint64_t addr = first + found / PLX_HOLDS_PER_BLOCK;
        rc = block_write(st, addr, b);
        /* Durable before the tree is read: a collection on another host must see it even if
         * the medium's cache is lost while both run. */
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc)
            *slot = found;
    }
    plx_block_free(t);
    return rc;
}

int plx_hold_drop(plx_store *st, uint32_t slot, uint64_t root)
{
    uint64_t first;
    uint32_t n;
    plx_hold_area(st, &first, &n);
    if (slot >= n * PLX_HOLDS_PER_BLOCK)
        return 0;
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    uint64_t addr = first + slot / PLX_HOLDS_PER_BLOCK;
    struct plx_hold_block *b = plx_block_alloc(1);
    rc = table_read(st, addr, 1, b);
    struct plx_hold *h = &b->holds[slot % PLX_HOLDS_PER_BLOCK];
    /* No flush: a hold whose clearing is lost keeps the tree only until this process is gone. */
    if (!rc && h->root == root && plx_holder_is_me(st, h->host, h->pid, h->epoch)) {
        memset(h, 0, sizeof *h);
        rc = block_write(st, addr, b);
    }
    plx_block_free(b);
    plx_admin_unlock(st);
    return rc;
}

int plx_hold_each_live(plx_store *st, int (*fn)(void *arg, const struct plx_hold *h), void *arg)
{
    uint64_t first;
    uint32_t n;
    plx_hold_area(st, &first, &n);
    if (n == 0)
        return 0;
    struct plx_hold_block *t = plx_block_alloc(n);
    int rc = table_read(st, first, n, t);
    for (uint32_t i = 0; !rc && i < n * PLX_HOLDS_PER_BLOCK; i++) {
        const struct plx_hold *h = &t[i / PLX_HOLDS_PER_BLOCK].holds[i % PLX_HOLDS_PER_BLOCK];
        if (live(st, h))
            rc = fn(arg, h);
    }
    plx_block_free(t);
    return rc;
}
