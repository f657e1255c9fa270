/*
 * alloc_claim.c - taking extents for this process (layer 2, alloc.h; alloc_shared.h).
 *
 * Taking a new extent is rare (once per extent's worth of allocation) and done under the admin
 * lock: read the catalogue fresh, pick an extent, write its fresh bitmap, flush, write the entry,
 * flush. It is done ahead, asynchronously, so that the write path finds a spare extent ready
 * ("Claiming ahead" below); the synchronous claim is the fallback.
 * A request on a serving loop that would need a new extent waits for one (plx_alloc_room) while
 * a claim marked needed runs the same steps.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc_shared.h"
#include "lock.h"

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
            rc = plx_extent_entry_write(st, chosen, &ent);
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
void plx_claim_drop(plx_store *st, struct plx_claim *c)
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
            int rc = plx_catalogue_block_take(
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
void plx_claim_ahead_check(plx_store *st, enum plx_extent_type type)
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

/* The catalogue as the rest of the engine reads and writes it (alloc_write.c does the I/O): a
 * claim ahead in flight would change it under a reader, and writes catalogue blocks itself, so
 * both first let it finish. Here, not in alloc_write.c, which sits below the claims. */
int plx_catalogue_read(plx_store *st)
{
    claim_settle(st);
    return plx_catalogue_load(st);
}

int plx_extent_entry_write(plx_store *st, uint64_t e, const struct plx_extent_entry *ent)
{
    claim_settle(st);
    return plx_extent_entry_put(st, e, ent);
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
int plx_extent_claim(plx_store *st, enum plx_extent_type type, bool must)
{
    struct plx_alloc *a = st->alloc;
    int t = type == PLX_EXTENT_DATA;
    if (a->spare[t]) {
        a->claims_ahead++;
        spare_take(st, type);
        return 0;
    }
    if (!must && st->serving) {
        plx_claim_ahead_check(st, type);
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
