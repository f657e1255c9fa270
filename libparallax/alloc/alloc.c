/*
 * alloc.c - the extent catalogue and the block allocator (layer 2, alloc.h).
 *
 * The store is cut into fixed-size extents. A process allocates only inside extents it holds
 * (its identity is in the extent's catalogue entry), so allocation needs no coordination on the
 * data path. Inside a held extent, blocks are claimed in chunks: the claim sets the bits in the
 * in-memory bitmap, and the batch that links any claimed block first waits for
 * plx_alloc_sync(), which writes the changed bitmap blocks. Before its commit-node writes the
 * batch flushes, so a link never reaches the medium before the claim of the block it names.
 * A crash therefore only leaks claimed blocks (the collector takes them back).
 *
 * Taking a new extent is rare (once per extent's worth of allocation) and done under the admin
 * lock: read the catalogue fresh, pick an extent, write its fresh bitmap, flush, write the entry,
 * flush. It is done ahead, asynchronously, so that the write path finds a spare extent ready
 * ("Claiming ahead" below); the synchronous claim is the fallback.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "lock.h"

#define CLAIM_CHUNK 2048u


static uint64_t eb(const plx_store *st)
{
    return st->sb.extent_blocks;
}

static uint64_t bitmap_blocks(const plx_store *st)
{
    return plx_bitmap_blocks(st->sb.extent_blocks);
}

/* Blocks per leaf slot: a leaf's worth, or the whole extent when extents are smaller (both are
 * powers of two, so slots tile an extent exactly). */
static uint64_t slot_blocks(const plx_store *st)
{
    return eb(st) < PLX_RADIX_FANOUT ? eb(st) : PLX_RADIX_FANOUT;
}

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

/* ---- Catalogue ------------------------------------------------------------------------------- */

/* Check catalogue block b (read from the medium into cb) and copy its entries into st->cat. */
static int catalogue_block_take(plx_store *st, uint64_t b, const struct plx_catalog_block *cb)
{
    uint64_t addr = st->sb.catalogue_start + b;
    const char *why = "";
    int rc = plx_blkhdr_verify(cb, PLX_MAGIC_CATALOG, addr, &why);
    if (rc || cb->first_extent != b * PLX_CATALOG_PER_BLOCK ||
        cb->count > PLX_CATALOG_PER_BLOCK)
        return plx_err(st, -EUCLEAN, "extent catalogue block %llu is corrupt: %s",
                       (unsigned long long)addr, rc ? why : "wrong extent range");
    for (uint32_t i = 0; i < cb->count; i++) {
        uint64_t e = cb->first_extent + i;
        if (e >= st->sb.extent_count)
            break;
        if (cb->entries[i].type > PLX_EXTENT_DATA ||
            (e == 0) != (cb->entries[i].type == PLX_EXTENT_SYSTEM))
            return plx_err(st, -EUCLEAN, "extent catalogue: extent %llu has invalid type %u",
                           (unsigned long long)e, cb->entries[i].type);
        st->cat[e] = cb->entries[i];
    }
    return 0;
}

static int catalogue_block_read(plx_store *st, uint64_t b, struct plx_catalog_block *out)
{
    uint64_t addr = st->sb.catalogue_start + b;
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, out, 0);
    if (rc)
        return plx_err(st, rc, "reading extent catalogue block %llu: %s",
                       (unsigned long long)addr, strerror(-rc));
    const char *why = "";
    rc = plx_blkhdr_verify(out, PLX_MAGIC_CATALOG, addr, &why);
    if (rc || out->first_extent != b * PLX_CATALOG_PER_BLOCK ||
        out->count > PLX_CATALOG_PER_BLOCK)
        return plx_err(st, -EUCLEAN, "extent catalogue block %llu is corrupt: %s",
                       (unsigned long long)addr, rc ? why : "wrong extent range");
    return 0;
}

static void claim_settle(plx_store *st);
static void claim_discard(struct plx_claim *c);
static void claim_drop(plx_store *st, struct plx_claim *c);

int plx_catalogue_read(plx_store *st)
{
    if (!st->cat) {
        st->cat = calloc(st->sb.extent_count, sizeof *st->cat);
        if (!st->cat)
            return plx_err(st, -ENOMEM, "out of memory for the extent catalogue");
    }
    /* A claim ahead in flight would change the catalogue under the reader. */
    claim_settle(st);
    struct plx_catalog_block *cb = plx_block_alloc(1);
    int rc = 0;
    for (uint64_t b = 0; b < st->sb.catalogue_blocks && !rc; b++) {
        uint64_t addr = st->sb.catalogue_start + b;
        rc = plx_sync_io(st, PLX_IO_READ, addr, 1, cb, 0);
        if (rc)
            rc = plx_err(st, rc, "reading extent catalogue block %llu: %s",
                         (unsigned long long)addr, strerror(-rc));
        else
            rc = catalogue_block_take(st, b, cb);
    }
    plx_block_free(cb);
    return rc;
}

/* Write one catalogue entry: read-modify-write of its block, under the admin lock. */
static int catalogue_entry_write(plx_store *st, uint64_t e, const struct plx_extent_entry *ent)
{
    claim_settle(st); /* a claim ahead writes catalogue blocks too */
    struct plx_catalog_block *cb = plx_block_alloc(1);
    uint64_t b = e / PLX_CATALOG_PER_BLOCK;
    int rc = catalogue_block_read(st, b, cb);
    if (!rc) {
        cb->entries[e % PLX_CATALOG_PER_BLOCK] = *ent;
        plx_blkhdr_seal(cb, PLX_MAGIC_CATALOG, st->sb.catalogue_start + b);
        rc = plx_sync_io(st, PLX_IO_WRITE, st->sb.catalogue_start + b, 1, cb, 0);
        if (rc)
            plx_err(st, rc, "writing extent catalogue block: %s", strerror(-rc));
    }
    if (!rc)
        st->cat[e] = *ent;
    plx_block_free(cb);
    return rc;
}

int plx_bitmap_read(plx_store *st, uint64_t extent, uint8_t *bits)
{
    int rc = plx_sync_io(st, PLX_IO_READ, extent * eb(st), (uint32_t)bitmap_blocks(st), bits, 0);
    if (rc)
        return plx_err(st, rc, "reading the allocation bitmap of extent %llu: %s",
                       (unsigned long long)extent, strerror(-rc));
    return 0;
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
    claim_drop(st, a->claim);
    while (a->waiters) {
        struct plx_alloc_waiter *w = a->waiters;
        a->waiters = w->next;
        free(w);
    }
    free(a);
    st->alloc = NULL;
}

static uint64_t count_free(const plx_store *st, const uint8_t *bits)
{
    uint64_t used = 0;
    for (uint64_t i = 0; i < eb(st) / 8; i++)
        used += (uint64_t)__builtin_popcount(bits[i]);
    return eb(st) - used;
}

/* Hold extent e (its catalogue entry names us) with bitmap bits. A spare is held but hidden
 * from allocation until spare_take. */
static int extent_hold(plx_store *st, uint64_t e, uint8_t *bits, bool spare)
{
    struct plx_extent_state *x = &st->alloc->ext[e];
    x->dirty_blocks = calloc(bitmap_blocks(st), sizeof *x->dirty_blocks);
    if (x->dirty_blocks && st->cat[e].type == PLX_EXTENT_DATA) {
        x->slots = calloc(eb(st) / slot_blocks(st), sizeof *x->slots);
        x->reserved = calloc(eb(st) / 8, 1);
    }
    if (!x->dirty_blocks ||
        (st->cat[e].type == PLX_EXTENT_DATA && (!x->slots || !x->reserved))) {
        /* Not held: the caller keeps (and frees) bits. */
        free(x->dirty_blocks);
        free(x->slots);
        free(x->reserved);
        x->dirty_blocks = NULL;
        x->slots = NULL;
        x->reserved = NULL;
        return plx_err(st, -ENOMEM, "out of memory");
    }
    x->bitmap = bits;
    x->free = count_free(st, bits);
    x->held = true;
    x->spare = spare;
    /* Taken during a reclaim round: no publication of that round (or an earlier one) may be
     * folded into it (plx_alloc_fold), so its hand-outs need not be young for them; the next
     * round allocates its young sets. */
    x->hold_round = st->alloc->round;
    x->folded_nonce = 0;
    if (!spare)
        st->alloc->empty_cursor = 0;
    /* Placing by leaf writes the extent in random order: have the medium zero its holes ahead
     * (backend.h, plx_backend_prepare; DESIGN.md "Zeroing ahead"). Only blocks nobody else
     * writes: the extent is ours, its bitmap blocks are left out, and a block handed out later
     * is written through the backend, which holds the write until its chunk is done. */
    if (st->cat[e].type == PLX_EXTENT_DATA && st->alloc->by_leaf && !st->alloc->no_zero_ahead &&
        !st->read_only)
        (void)plx_backend_prepare(st->be, e * eb(st) + bitmap_blocks(st),
                                  eb(st) - bitmap_blocks(st));
    return 0;
}

/* No extent to claim: say whether the store is really full or its extents are all held by
 * other processes (each writer allocates in extents of its own), and what to do. */
static int no_extent_error(plx_store *st, enum plx_extent_type type)
{
    uint64_t others = 0, mine = 0, full = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        const struct plx_extent_entry *c = &st->cat[e];
        if (st->alloc->ext[e].held)
            mine++;
        else if (c->type != PLX_EXTENT_UNUSED &&
                 !plx_holder_stale(st, c->holder_host, c->holder_pid, c->holder_epoch))
            others++;
        else
            full++;
    }
    const char *what = type == PLX_EXTENT_DATA ? "data" : "metadata";
    uint64_t mib = st->sb.extent_blocks * PLX_BLOCK_SIZE >> 20;
    if (others == 0)
        return plx_err(st, -ENOSPC,
                       "blockstore full: no %s extent has room (%llu extents of %llu MiB: %llu "
                       "held here, %llu full); delete snapshots or VDIs and run parallax gc",
                       what, (unsigned long long)(st->sb.extent_count - 1),
                       (unsigned long long)mib, (unsigned long long)mine,
                       (unsigned long long)full);
    return plx_err(st, -ENOSPC,
                   "no free %s extent for this process: of %llu extents of %llu MiB, %llu are "
                   "held by other processes writing to this blockstore, %llu by this one and "
                   "%llu have no room for %s blocks. Every process that writes needs a metadata and a data "
                   "extent of its own: stop a process, or re-create the store with a smaller "
                   "--extent-size (parallax format) so that it has more extents",
                   what, (unsigned long long)(st->sb.extent_count - 1), (unsigned long long)mib,
                   (unsigned long long)others, (unsigned long long)mine,
                   (unsigned long long)full, what);
}

/* Take an extent of `type` for this process: one whose holder is gone and has room, else an
 * unused one. Blocking, under the admin lock: the fallback when no spare is ready. */
static int extent_claim_sync(plx_store *st, enum plx_extent_type type)
{
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_catalogue_read(st);
    uint8_t *bits = plx_block_alloc(bitmap_blocks(st));
    uint64_t chosen = 0;
    for (int pass = 0; pass < 2 && !rc && !chosen; pass++) {
        for (uint64_t e = 1; e < st->sb.extent_count && !rc; e++) {
            const struct plx_extent_entry *c = &st->cat[e];
            if (st->alloc->ext[e].held)
                continue;
            if (pass == 0 && c->type == type && !(c->flags & PLX_EXTENT_FULL) &&
                plx_holder_stale(st, c->holder_host, c->holder_pid, c->holder_epoch)) {
                rc = plx_bitmap_read(st, e, bits);
                if (!rc && count_free(st, bits) > 0) {
                    chosen = e;
                    break;
                }
            } else if (pass == 1 && c->type == PLX_EXTENT_UNUSED) {
                memset(bits, 0, bitmap_blocks(st) * PLX_BLOCK_SIZE);
                for (uint64_t i = 0; i < bitmap_blocks(st); i++)
                    bit_set(bits, i, true);
                rc = plx_sync_io(st, PLX_IO_WRITE, e * eb(st), (uint32_t)bitmap_blocks(st), bits,
                                 0);
                if (rc)
                    plx_err(st, rc, "initialising the bitmap of extent %llu: %s",
                            (unsigned long long)e, strerror(-rc));
                else
                    chosen = e;
                break;
            }
        }
    }
    if (!rc && !chosen)
        rc = no_extent_error(st, type);
    /* An extent of a dead holder: cut that holder off at the target before we allocate in it. */
    if (!rc)
        rc = plx_holder_evict(st, st->cat[chosen].holder_host, st->cat[chosen].holder_pid,
                              st->cat[chosen].holder_epoch);
    if (!rc) {
        struct plx_extent_entry ent = st->cat[chosen];
        ent.type = (uint8_t)type;
        plx_holder_set_me(st, &ent.holder_host, &ent.holder_pid, &ent.holder_epoch);
        /* The bitmap must be durable before the entry that makes the extent ours. */
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc)
            rc = catalogue_entry_write(st, chosen, &ent);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc)
            rc = extent_hold(st, chosen, bits, false);
        else
            plx_err(st, rc, "claiming extent %llu: %s", (unsigned long long)chosen,
                    strerror(-rc));
        if (!rc)
            bits = NULL;
    }
    plx_admin_unlock(st);
    plx_block_free(bits);
    return rc;
}

/* ---- Claiming ahead -------------------------------------------------------------------------- */

/*
 * Taking an extent synchronously stalls the engine's loop for a lock, a catalogue read, a bitmap
 * write, two flushes and an entry write. So a spare extent of each type is claimed ahead, while
 * the held ones still have room, by a claim that runs from the service loop like any engine
 * I/O: the admin lock tried without waiting (retried on later allocations while another
 * process holds it), then catalogue read, bitmap read or initialisation, flush, entry write,
 * flush, each submitted from the completion of the one before. The spare is held (its entry
 * names us, so close releases it and gc sees it) but nothing is handed out from it until an
 * allocation finds the held extents full: then taking it is a few assignments.
 *
 * When: once the held extents of a type have less than a quarter of an extent free. A claim is
 * five dependent I/Os (two of them flushes): a quarter extent (64 MiB extents: 16 MiB) outlasts
 * them at any write rate the medium can sustain, and starting earlier would only hold the spare
 * longer. Only one spare per type, and only while at least CLAIM_RESERVE extents stay unused
 * after it: a nearly full store (or one shared by many writers) claims synchronously, as
 * before, so a spare never makes another process's claim fail.
 *
 * What stays synchronous: the fallback (no spare ready when the held extents are full: counted
 * in claims_sync; waiting for a claim in flight counts in claims_waited), and taking over an
 * extent whose holder must be judged dead by the lock manager or evicted at the medium: the
 * claim ahead takes only extents with no holder, or whose holder is a dead process of this host
 * on a medium without fencing, and leaves the rest to the synchronous path. With lockd the
 * admin lock is tried with ADMIN-TRY, which lockd answers at once and never queues (a round
 * trip; the loop waits for it 50 ms at most, lock_lockd.c): so an engine whose lock manager is
 * down keeps a spare to allocate from, and only a second extent would wait for lockd.
 *
 * On a serving loop (st->serving: parallax serve's engine thread, tapdisk's scheduler) nothing
 * waits for the lock manager and nothing claims synchronously: the claim ahead waits for the
 * admin lock on the loop (plx_admin_lock_async), and a request that would need a new extent
 * first waits for room (plx_alloc_room, from the pipeline) while a claim marked needed runs the
 * same steps (docs/DESIGN.md, Allocator, "On a serving loop").
 *
 * Crash safety is the synchronous claim's: the bitmap is durable before the entry that makes the
 * extent ours, and a crash in between leaves an unused extent or one we hold unused (its holder
 * is dead after the crash: the next claim or gc takes it back). In-process writers of the
 * catalogue (the synchronous claim, close, gc) first let a claim in flight finish.
 */
#define CLAIM_RESERVE 2
#define CLAIM_RETRY_BUSY_NS 1000000ull    /* lock held elsewhere: try again after 1 ms */
#define CLAIM_RETRY_NONE_NS 1000000000ull /* nothing to claim or an error: after 1 s */

enum claim_step {
    CLAIM_LOCK,         /* waiting for the admin lock (no I/O in flight) */
    CLAIM_CAT_READ,     /* the whole catalogue */
    CLAIM_BITMAP_READ,  /* a released extent's bitmap: has it room? */
    CLAIM_BITMAP_WRITE, /* an unused extent's fresh bitmap */
    CLAIM_FLUSH_BITMAP, /* the bitmap is durable before the entry */
    CLAIM_ENTRY_WRITE,
    CLAIM_FLUSH_ENTRY,
};

struct plx_claim {
    struct plx_ev ev; /* one I/O in flight at a time */
    enum claim_step step;
    enum plx_extent_type type;
    bool locked;
    /* On a serving loop the admin lock is waited for there (plx_admin_lock_async). */
    struct plx_lock_wait lw;
    plx_store *st;
    bool lock_waiting;
    /* A request waits for it (plx_alloc_room): it may take the last unused extents, takes
     * what the synchronous claim would when it finds nothing of its own, and the extent is
     * handed out from at once. */
    bool needed;
    int pass;       /* 0: released extents of the type, 1: unused ones */
    uint64_t next;  /* next extent to look at in this pass */
    uint64_t chosen;
    struct plx_catalog_block *cat; /* catalogue_blocks blocks, as read under the lock */
    uint8_t *bits;
};

static void claim_io_done(plx_store *st, struct plx_ev *ev);

static void claim_discard(struct plx_claim *c)
{
    if (!c)
        return;
    plx_block_free(c->cat);
    plx_block_free(c->bits);
    free(c);
}

/* At the store's end: a claim still waiting for the lock leaves the lock's queue. */
static void claim_drop(plx_store *st, struct plx_claim *c)
{
    if (c && c->lock_waiting)
        plx_admin_lock_cancel(st, &c->lw);
    claim_discard(c);
}

static void room_run(struct plx_deferred *d)
{
    struct plx_alloc_room *w = (struct plx_alloc_room *)d;
    w->ready(w, w->status);
}

/* A claim ended: the requests waiting for room look again (or fail with its error), from the
 * end of the service pass: never inside the allocation or the blocking call that ended it. */
static void room_notify(plx_store *st, int status)
{
    struct plx_alloc *a = st->alloc;
    if (status)
        snprintf(a->claim_err, sizeof a->claim_err, "%s", plx_store_errmsg(st));
    while (a->room_head) {
        struct plx_alloc_room *w = a->room_head;
        a->room_head = w->next;
        w->next = NULL;
        w->queued = false;
        w->status = status;
        w->d.run = room_run;
        plx_defer(st, &w->d);
    }
    a->room_tail = NULL;
}

static void claim_end(plx_store *st, struct plx_claim *c, int status, uint64_t retry_ns)
{
    struct plx_alloc *a = st->alloc;
    if (c->lock_waiting)
        plx_admin_lock_cancel(st, &c->lw);
    if (c->locked)
        plx_admin_unlock(st);
    claim_discard(c);
    a->claim = NULL;
    a->claim_busy = false;
    if (status)
        a->claim_retry_ns = plx_now_ns() + retry_ns;
    if (status && status != -ENOSPC)
        a->claims_failed++;
    if (a->room_head)
        room_notify(st, status);
}

static void claim_submit(plx_store *st, struct plx_claim *c, enum claim_step step,
                         enum plx_io_op op, uint64_t block, uint32_t n, void *buf)
{
    c->step = step;
    memset(&c->ev, 0, sizeof c->ev);
    c->ev.io.op = op;
    c->ev.io.block = block;
    c->ev.io.nblocks = n;
    c->ev.io.buf = buf;
    c->ev.handler = claim_io_done;
    int rc = plx_submit(st, &c->ev);
    if (rc)
        claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
}

/* Can the claim ahead take extent e's holder's place without asking anyone? */
static bool claim_holder_free(const plx_store *st, const struct plx_extent_entry *c)
{
    if (c->holder_host == 0)
        return true;
    return !st->fencing && c->holder_host == st->host_hash &&
           plx_holder_stale(st, c->holder_host, c->holder_pid, c->holder_epoch);
}

/* Look for the next candidate from c->next and start its I/O; end the claim if none. */
static void claim_choose(plx_store *st, struct plx_claim *c)
{
    struct plx_alloc *a = st->alloc;
    uint64_t unused = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++)
        unused += !a->ext[e].held && st->cat[e].type == PLX_EXTENT_UNUSED;
    for (; c->pass < 2; c->pass++, c->next = 1) {
        for (; c->next < st->sb.extent_count; c->next++) {
            uint64_t e = c->next;
            const struct plx_extent_entry *ce = &st->cat[e];
            if (a->ext[e].held)
                continue;
            bool fits = c->pass == 0 ? ce->type == c->type && !(ce->flags & PLX_EXTENT_FULL) &&
                                           claim_holder_free(st, ce)
                                     : ce->type == PLX_EXTENT_UNUSED;
            if (!fits)
                continue;
            if (!c->needed && unused - (c->pass == 1) < CLAIM_RESERVE)
                break; /* nearly full: leave the rest to claims that are needed now */
            c->next = e + 1;
            c->chosen = e;
            if (c->pass == 0) {
                claim_submit(st, c, CLAIM_BITMAP_READ, PLX_IO_READ, e * eb(st),
                             (uint32_t)bitmap_blocks(st), c->bits);
                return;
            }
            memset(c->bits, 0, bitmap_blocks(st) * PLX_BLOCK_SIZE);
            for (uint64_t i = 0; i < bitmap_blocks(st); i++)
                bit_set(c->bits, i, true);
            claim_submit(st, c, CLAIM_BITMAP_WRITE, PLX_IO_WRITE, e * eb(st),
                         (uint32_t)bitmap_blocks(st), c->bits);
            return;
        }
    }
    if (c->needed) {
        /* A request waits, and nothing is free without asking: take what the synchronous claim
         * takes (an extent of a holder the lock manager declares dead, evicted at the medium),
         * under the admin lock this claim holds already. Blocking I/O, but no wait for the
         * lock; the liveness question is bounded on a serving loop (lock_lockd.c). */
        a->claim = NULL;
        a->claim_busy = false;
        int rc = extent_claim_sync(st, c->type);
        a->claims_sync++;
        a->claim = c;
        claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
        return;
    }
    claim_end(st, c, -ENOSPC, CLAIM_RETRY_NONE_NS);
}

/* The bitmap is durable: write the entry that makes the extent ours, in the catalogue block as
 * read under the lock (in-process writers wait for this claim, other processes for the lock). */
static void claim_entry_write(plx_store *st, struct plx_claim *c)
{
    uint64_t e = c->chosen, b = e / PLX_CATALOG_PER_BLOCK;
    struct plx_catalog_block *cb =
        (struct plx_catalog_block *)((uint8_t *)c->cat + b * PLX_BLOCK_SIZE);
    struct plx_extent_entry *ent = &cb->entries[e % PLX_CATALOG_PER_BLOCK];
    ent->type = (uint8_t)c->type;
    plx_holder_set_me(st, &ent->holder_host, &ent->holder_pid, &ent->holder_epoch);
    plx_blkhdr_seal(cb, PLX_MAGIC_CATALOG, st->sb.catalogue_start + b);
    claim_submit(st, c, CLAIM_ENTRY_WRITE, PLX_IO_WRITE, st->sb.catalogue_start + b, 1, cb);
}

static void claim_io_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_claim *c = (struct plx_claim *)ev;
    struct plx_alloc *a = st->alloc;
    if (ev->status) {
        claim_end(st, c, ev->status, CLAIM_RETRY_NONE_NS);
        return;
    }
    switch (c->step) {
    case CLAIM_CAT_READ:
        for (uint64_t b = 0; b < st->sb.catalogue_blocks; b++) {
            int rc = catalogue_block_take(
                st, b, (struct plx_catalog_block *)((uint8_t *)c->cat + b * PLX_BLOCK_SIZE));
            if (rc) {
                claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
                return;
            }
        }
        c->next = 1;
        claim_choose(st, c);
        return;
    case CLAIM_BITMAP_READ:
        if (count_free(st, c->bits) == 0) {
            claim_choose(st, c);
            return;
        }
        claim_submit(st, c, CLAIM_FLUSH_BITMAP, PLX_IO_FLUSH, 0, 0, NULL);
        return;
    case CLAIM_BITMAP_WRITE:
        claim_submit(st, c, CLAIM_FLUSH_BITMAP, PLX_IO_FLUSH, 0, 0, NULL);
        return;
    case CLAIM_FLUSH_BITMAP:
        claim_entry_write(st, c);
        return;
    case CLAIM_ENTRY_WRITE:
        claim_submit(st, c, CLAIM_FLUSH_ENTRY, PLX_IO_FLUSH, 0, 0, NULL);
        return;
    case CLAIM_FLUSH_ENTRY: {
        uint64_t e = c->chosen, b = e / PLX_CATALOG_PER_BLOCK;
        const struct plx_catalog_block *cb =
            (const struct plx_catalog_block *)((uint8_t *)c->cat + b * PLX_BLOCK_SIZE);
        st->cat[e] = cb->entries[e % PLX_CATALOG_PER_BLOCK];
        /* Needed now: handed out from at once (a spare may be there already, too small). */
        int rc = extent_hold(st, e, c->bits, !c->needed);
        if (rc) {
            /* Ours on the medium but not held here: a leak until this process exits. */
            claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
            return;
        }
        c->bits = NULL;
        if (c->needed)
            a->claims_waited++;
        else
            a->spare[c->type == PLX_EXTENT_DATA] = e;
        claim_end(st, c, 0, 0);
        return;
    }
    case CLAIM_LOCK:
        break;
    }
    claim_end(st, c, -EINVAL, CLAIM_RETRY_NONE_NS);
}

/* The admin lock, waited for on the serving loop: read the catalogue. */
static void claim_locked(struct plx_lock_wait *w, int rc)
{
    struct plx_claim *c = (struct plx_claim *)((char *)w - offsetof(struct plx_claim, lw));
    plx_store *st = c->st;
    c->lock_waiting = false;
    if (rc) {
        claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
        return;
    }
    c->locked = true;
    claim_submit(st, c, CLAIM_CAT_READ, PLX_IO_READ, st->sb.catalogue_start,
                 (uint32_t)st->sb.catalogue_blocks, c->cat);
}

/* Ask for the admin lock; once held, read the catalogue. On a serving loop the wait is the
 * loop's (claim_locked); elsewhere the lock is tried without waiting, again at later
 * allocations. */
static void claim_lock_step(plx_store *st, struct plx_claim *c)
{
    if (st->serving) {
        if (!c->lock_waiting) {
            c->lock_waiting = true;
            c->lw.done = claim_locked;
            plx_admin_lock_async(st, &c->lw);
        }
        return;
    }
    int rc = plx_admin_lock_try(st);
    if (rc == -EWOULDBLOCK) {
        st->alloc->claim_retry_ns = plx_now_ns() + CLAIM_RETRY_BUSY_NS;
        return; /* the next allocation tries again */
    }
    if (rc) {
        claim_end(st, c, rc, CLAIM_RETRY_NONE_NS);
        return;
    }
    c->locked = true;
    claim_submit(st, c, CLAIM_CAT_READ, PLX_IO_READ, st->sb.catalogue_start,
                 (uint32_t)st->sb.catalogue_blocks, c->cat);
}

static uint64_t held_free(const plx_store *st, enum plx_extent_type type)
{
    uint64_t n = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        const struct plx_extent_state *x = &st->alloc->ext[e];
        if (x->held && !x->spare && st->cat[e].type == type)
            n += x->free;
    }
    return n;
}

static bool is_data_extent(const plx_store *st, uint64_t e);
static bool slot_empty(const plx_store *st, const struct plx_extent_state *x, uint64_t s);

/* Empty slots nobody owns in held data extents, counting up to `enough`. */
static uint64_t empty_slots(plx_store *st, uint64_t enough)
{
    uint64_t n = 0, spe = eb(st) / slot_blocks(st);
    for (uint64_t e = 1; e < st->sb.extent_count && n < enough; e++) {
        const struct plx_extent_state *x = &st->alloc->ext[e];
        if (!is_data_extent(st, e))
            continue;
        for (uint64_t s = 0; s < spe && n < enough; s++)
            n += !x->slots[s].leaf && slot_empty(st, x, s);
    }
    return n;
}

/* Will the held extents of `type` run out soon? Less than a quarter extent free; placed by
 * leaf, also fewer than two empty slots (a new leaf takes an empty slot whole, and a leaf and
 * the spill slot may both want one at once: free blocks scattered in used slots do not help). */
static bool running_low(plx_store *st, enum plx_extent_type type)
{
    if (held_free(st, type) < eb(st) / 4)
        return true;
    return type == PLX_EXTENT_DATA && st->alloc->by_leaf && empty_slots(st, 2) < 2;
}

/* After an allocation of `type`: start (or go on trying to start) a claim ahead if the held
 * extents run low. Never waits. */
static void claim_ahead_check(plx_store *st, enum plx_extent_type type)
{
    struct plx_alloc *a = st->alloc;
    /* Not inside an admin operation (create, delete, snapshot edits under the admin lock): it
     * drives the store only until its own I/O is done, so a claim it started would keep the
     * admin lock until the next request. The data path's host services the store until idle. */
    if (a->no_ahead || st->admin_depth || st->read_only || st->fenced || a->closing ||
        plx_now_ns() < a->claim_retry_ns)
        return;
    if (a->claim) {
        if (a->claim->step == CLAIM_LOCK)
            claim_lock_step(st, a->claim);
        return;
    }
    if (a->spare[type == PLX_EXTENT_DATA] || !running_low(st, type))
        return;
    struct plx_claim *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->type = type;
    c->st = st;
    c->step = CLAIM_LOCK;
    c->cat = plx_block_alloc(st->sb.catalogue_blocks);
    c->bits = plx_block_alloc(bitmap_blocks(st));
    a->claim = c;
    a->claim_busy = true;
    claim_lock_step(st, c);
}

/* Let a claim in progress finish (I/O in flight: wait for it, running only its handlers) or
 * drop it (still waiting for the lock: it holds nothing). Blocking. */
static void claim_settle(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (!a || !a->claim)
        return;
    if (a->claim->step == CLAIM_LOCK) {
        claim_end(st, a->claim, 0, 0);
        return;
    }
    /* An error here means the medium cannot be polled: the store is failing anyway. */
    (void)plx_drive_handler_while(st, claim_io_done, &a->claim_busy);
}

bool plx_alloc_claim_io(const plx_store *st)
{
    return st->alloc && st->alloc->claim && st->alloc->claim->step != CLAIM_LOCK;
}

void plx_alloc_claim_finish(plx_store *st)
{
    claim_settle(st);
}

/* Start handing out from the spare of `type`. */
static void spare_take(plx_store *st, enum plx_extent_type type)
{
    struct plx_alloc *a = st->alloc;
    uint64_t e = a->spare[type == PLX_EXTENT_DATA];
    a->spare[type == PLX_EXTENT_DATA] = 0;
    a->ext[e].spare = false;
    a->empty_cursor = 0;
}

/* A new extent of `type` for allocation: the spare if one is ready, else the one being claimed
 * (waiting for it), else a synchronous claim. A claim that is only wanted (`must` false: a leaf
 * would like slots of its own, but free blocks are left) never waits on a serving loop: it
 * starts a claim ahead and answers -EWOULDBLOCK. */
static int extent_claim(plx_store *st, enum plx_extent_type type, bool must)
{
    struct plx_alloc *a = st->alloc;
    int t = type == PLX_EXTENT_DATA;
    if (a->spare[t]) {
        a->claims_ahead++;
        spare_take(st, type);
        return 0;
    }
    if (!must && st->serving) {
        claim_ahead_check(st, type);
        return -EWOULDBLOCK;
    }
    uint64_t t0 = plx_now_ns();
    int rc = 0;
    if (a->claim && a->claim->type == type && a->claim->step != CLAIM_LOCK)
        claim_settle(st);
    if (a->spare[t]) {
        a->claims_waited++;
        spare_take(st, type);
    } else {
        claim_settle(st);
        a->claims_sync++;
        rc = extent_claim_sync(st, type);
    }
    uint64_t waited = plx_now_ns() - t0;
    a->stall_ns += waited;
    if (waited > a->stall_max_ns)
        a->stall_max_ns = waited;
    return rc;
}

/* Blocks of `type` that can be handed out without claiming an extent. */
static uint64_t room_of(plx_store *st, enum plx_extent_type type)
{
    struct plx_alloc *a = st->alloc;
    int t = type == PLX_EXTENT_DATA;
    uint64_t n = held_free(st, type);
    if (a->pool[t].valid)
        n += a->pool[t].end - a->pool[t].next;
    if (t)
        n += a->reserved; /* given back when nothing else is free (unreserve_all) */
    if (a->spare[t])
        n += a->ext[a->spare[t]].free;
    return n;
}

int plx_alloc_room(plx_store *st, uint64_t meta, uint64_t data, struct plx_alloc_room *w)
{
    struct plx_alloc *a = st->alloc;
    if (!st->serving || a->no_ahead || st->read_only || st->fenced || a->closing)
        return 0;
    enum plx_extent_type type;
    if (meta && room_of(st, PLX_EXTENT_METADATA) < meta)
        type = PLX_EXTENT_METADATA;
    else if (data && room_of(st, PLX_EXTENT_DATA) < data)
        type = PLX_EXTENT_DATA;
    else
        return 0;
    w->queued = true;
    w->next = NULL;
    if (a->room_tail)
        a->room_tail->next = w;
    else
        a->room_head = w;
    a->room_tail = w;
    if (a->claim) {
        /* One claim at a time: this one serves, or its end makes the waiters look again. */
        if (a->claim->type == type)
            a->claim->needed = true;
        return -EINPROGRESS;
    }
    struct plx_claim *c = calloc(1, sizeof *c);
    if (c) {
        c->cat = plx_block_alloc(st->sb.catalogue_blocks);
        c->bits = plx_block_alloc(bitmap_blocks(st));
    }
    if (!c || !c->cat || !c->bits) {
        claim_discard(c);
        a->room_head = w->next; /* w is the only one: no claim runs */
        a->room_tail = NULL;
        w->queued = false;
        return plx_err(st, -ENOMEM, "out of memory");
    }
    c->type = type;
    c->st = st;
    c->step = CLAIM_LOCK;
    c->needed = true;
    a->claim = c;
    a->claim_busy = true;
    claim_lock_step(st, c);
    return -EINPROGRESS;
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
            claim_ahead_check(st, type);
            return 0;
        }
        if (attempt == 0) {
            int rc = extent_claim(st, type, true);
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
        claim_ahead_check(st, type); /* waiting for the lock: try again */
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

static bool is_data_extent(const plx_store *st, uint64_t e)
{
    const struct plx_extent_state *x = &st->alloc->ext[e];
    return x->held && !x->spare && x->slots && st->cat[e].type == PLX_EXTENT_DATA &&
           x->free > 0;
}

static bool slot_empty(const plx_store *st, const struct plx_extent_state *x, uint64_t s)
{
    uint64_t n = slot_blocks(st);
    const uint8_t *bits = x->bitmap + s * n / 8;
    for (uint64_t i = 0; i < n / 8; i++)
        if (bits[i])
            return false;
    return true;
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
    claim_ahead_check(st, PLX_EXTENT_DATA);
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
            !(data_mostly_used(st) && extent_claim(st, PLX_EXTENT_DATA, false) == 0 &&
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
        claim_ahead_check(st, PLX_EXTENT_DATA); /* waiting for the lock: try again */
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
            int rc = extent_claim(st, PLX_EXTENT_DATA, false);
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
            int rc = extent_claim(st, PLX_EXTENT_DATA, true);
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

uint64_t plx_alloc_gen(const plx_store *st)
{
    return st->alloc->gen;
}

/* ---- Writing claims ------------------------------------------------------------------------- */

struct bitmap_write {
    struct plx_ev ev;
    uint64_t target_gen;
    uint8_t *buf;
};

static void sync_round_start(plx_store *st);
static int round_finish_if_empty(plx_store *st);

static void wake_alloc_waiters(plx_store *st, int status)
{
    struct plx_alloc *a = st->alloc;
    struct plx_alloc_waiter **pp = &a->waiters;
    while (*pp) {
        struct plx_alloc_waiter *w = *pp;
        if (status || w->gen <= a->written_gen) {
            *pp = w->next;
            w->cb(w->arg, status);
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

static void bitmap_write_done(plx_store *st, struct plx_ev *ev)
{
    struct bitmap_write *bw = (struct bitmap_write *)ev;
    struct plx_alloc *a = st->alloc;
    if (ev->status && !a->round_status)
        a->round_status = ev->status;
    plx_block_free(bw->buf);
    free(bw);
    if (--a->writes_inflight)
        return;
    int status = a->round_status;
    if (!status)
        a->written_gen = a->round_target;
    else
        plx_err(st, status, "writing an allocation bitmap: %s", strerror(-status));
    wake_alloc_waiters(st, status);
    while (a->waiters) {
        sync_round_start(st);
        if (!round_finish_if_empty(st))
            break;
        wake_alloc_waiters(st, a->round_status);
    }
}

/* Write every bitmap block changed since the last completed round. */
static void sync_round_start(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    a->round_status = 0;
    a->round_target = a->gen;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        struct plx_extent_state *x = &a->ext[e];
        if (!x->held)
            continue;
        for (uint64_t b = 0; b < bitmap_blocks(st); b++) {
            if (x->dirty_blocks[b] <= a->written_gen)
                continue;
            struct bitmap_write *bw = calloc(1, sizeof *bw);
            if (!bw) {
                a->round_status = -ENOMEM;
                continue;
            }
            bw->buf = plx_block_alloc(1);
            memcpy(bw->buf, x->bitmap + b * PLX_BLOCK_SIZE, PLX_BLOCK_SIZE);
            bw->ev.io.op = PLX_IO_WRITE;
            /* A snapshot's or flush's commit waits for them (pipeline.c, batch_submit_flags). */
            bw->ev.io.flags = st->durable_waiters ? PLX_IO_URGENT : 0;
            bw->ev.io.block = e * eb(st) + b;
            bw->ev.io.nblocks = 1;
            bw->ev.io.buf = bw->buf;
            bw->ev.handler = bitmap_write_done;
            int rc = plx_submit(st, &bw->ev);
            if (rc) {
                a->round_status = rc;
                plx_block_free(bw->buf);
                free(bw);
                continue;
            }
            a->writes_inflight++;
        }
    }
}

/* A round with nothing to write (the changes were in extents since released) is done at once. */
static int round_finish_if_empty(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (a->writes_inflight)
        return 0;
    if (!a->round_status)
        a->written_gen = a->round_target;
    return 1;
}

int plx_alloc_sync(plx_store *st, uint64_t gen, void (*cb)(void *arg, int status), void *arg)
{
    struct plx_alloc *a = st->alloc;
    if (gen <= a->written_gen)
        return 1;
    if (a->writes_inflight == 0) {
        /* Callbacks never fire from inside this call: a round that needs no I/O is answered
         * by the return value. */
        sync_round_start(st);
        if (round_finish_if_empty(st))
            return a->round_status ? a->round_status : 1;
    }
    /* A round is in flight; if it does not reach gen, its completion starts the next one. */
    struct plx_alloc_waiter *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->gen = gen;
    w->cb = cb;
    w->arg = arg;
    w->next = a->waiters;
    a->waiters = w;
    return 0;
}

int plx_extent_entry_write(plx_store *st, uint64_t e, const struct plx_extent_entry *ent)
{
    return catalogue_entry_write(st, e, ent);
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

/* Give back claimed-but-unused blocks, write the bitmaps, release our extents. */
int plx_alloc_shutdown(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (!a->ext)
        return 0;
    claim_settle(st);
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
            rc = plx_sync_io(st, PLX_IO_WRITE, e * eb(st) + b, 1,
                             x->bitmap + b * PLX_BLOCK_SIZE, 0);
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
        rc = catalogue_entry_write(st, e, &ent);
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

static void flag_done(void *arg, int status)
{
    int *f = arg;
    f[0] = status;
    f[1] = 1;
}

int plx_wait_alloc_written(plx_store *st)
{
    int f[2] = {0, 0};
    int rc = plx_alloc_sync(st, st->alloc->gen, flag_done, f);
    if (rc == 1)
        return 0;
    if (rc < 0)
        return rc;
    rc = plx_drive_until(st, &f[1]);
    return rc ? rc : f[0];
}

int plx_extent_free(plx_store *st, uint64_t e, uint64_t *free_blocks)
{
    int rc = 0;
    if (st->alloc->ext[e].held) {
        *free_blocks = count_free(st, st->alloc->ext[e].bitmap);
        return 0;
    }
    uint8_t *bits = plx_block_alloc(bitmap_blocks(st));
    rc = plx_bitmap_read(st, e, bits);
    if (!rc)
        *free_blocks = count_free(st, bits);
    plx_block_free(bits);
    return rc;
}
