/*
 * gc.c - the mark-and-sweep garbage collector (thesis section 3.4.3, algorithm 1).
 *
 * 0. Ask the holder of every extent another live process holds for a reclaim round (reclaim.c):
 *    it answers once every block it handed out before the round is linked (or given up). Wait
 *    for the answers, bounded.
 * 1. Checkpoint the allocation bitmap of every extent this process may sweep: extents nobody
 *    holds (or whose holder died), the ones this process holds, after giving back its
 *    claimed-but-unused blocks, and those whose holder answered. An extent another live process
 *    holds and that did not answer is skipped: its claimed blocks may be linked into a tree at
 *    any moment, and only the holder knows which.
 * 2. Mark the roots of every live VDI and live snapshot, of every tree a live process holds open
 *    read-only (hold.h: deleted or not, a tree someone reads is not garbage), the snapshot-log
 *    blocks and the registry's blocks (VDI table, name index, live VDIs' records). Deleted VDIs
 *    leave the registry here, so their records are swept with the blocks they reached.
 * 3. Pass over the metadata extents in disk order, reading every marked, not yet read radix
 *    node and marking what it links, until a pass finds nothing new (at most one pass per tree
 *    level). Each node is read once, in runs of consecutive blocks.
 * 4. Per extent, under the admin lock and after checking the holder again, free every block that
 *    was allocated in the checkpoint and is still allocated but unmarked. A block allocated after
 *    the checkpoint is never freed. An extent left empty goes back to "unused". In an extent
 *    whose holder answered, publish those blocks instead, for the holder's round: the holder
 *    frees them, except what it handed out since the round began (alloc.c, "Folding in"); then
 *    wait (bounded) for it to say how many.
 *
 * Why concurrent writers are safe: a writer links only blocks it allocated from extents it
 * holds (skipped here) or blocks it reaches already (read-only links copied from a live tree).
 * The registry is read under the admin lock, which clone and delete also take, so a clone
 * cannot start sharing a snapshot this collector saw deleted. A crash at any point frees nothing
 * reachable: marking is complete before the first bit is cleared.
 *
 * Memory: two bits per block of the store, "reachable" and "already read" (1 GiB of memory
 * covers 16 TiB of blockstore), plus a copy of the bitmaps of the extents being swept; when
 * that cannot be allocated, gc stops with ENOMEM before any I/O.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "alloc.h"
#include "cache.h"
#include "hold.h"
#include "labelidx.h"
#include "lock.h"
#include "pipeline.h"
#include "registry.h"
#include "snaplog.h"
#include "system.h"

#define GC_RUN 64u /* blocks per read at most (a run of consecutive marked nodes) */
#define GC_QD 32u  /* reads in flight while marking: scattered nodes need the device's queue */

/* An extent a live process holds: what the collector asked its holder (reclaim.c, FORMAT.md
 * §6.1). */
struct gc_rec {
    struct plx_reclaim_req *q; /* the request block as written (q->hdr.self: its address) */
    uint64_t addr;             /* where it goes */
    bool acked;                /* the holder answered: its round began before our checkpoint */
    bool published;
    bool folded;
    bool gone; /* the holder died while we waited for it: wait no more */
    uint64_t candidates;
};

struct gc {
    plx_store *st;
    struct gc_rec **rec; /* per extent, NULL: not asked */
    uint64_t nonce;      /* this collection's requests */
    uint64_t eb, bmb;    /* blocks per extent, bitmap blocks per extent */
    unsigned eshift;     /* log2(eb) */
    uint64_t *rmap;      /* reachable, one bit per block */
    uint64_t *scanned;   /* radix node already read, one bit per block */
    uint8_t **ckpt;      /* per extent: checkpointed bitmap, NULL = not swept */
    struct plx_vdi_record *recs;
    uint64_t *slots;
    size_t nrecs;   /* deleted VDIs found in the VDI table */
    size_t entries; /* VDIs found in the VDI table, deleted or not */
    struct plx_gc_report *out;
    uint64_t epoch; /* state.gc_epoch this collection expects (it bumps it once) */
    bool bumped;
    plx_progress_fn progress; /* may be NULL */
    void *progress_arg;
    unsigned pass; /* marking pass, from 1 */
    /* Marking reads in flight (mark_pass): each slot reads one run into its buffer. */
    struct gc_read {
        struct plx_ev ev;
        struct gc *g;
        uint64_t *buf; /* GC_RUN blocks */
        bool busy;
    } reads[GC_QD];
    unsigned inflight;
    int completed; /* set by a read's handler: plx_drive_until returns */
    int mark_err;  /* first error of a read or of a node it read */
    long read_now; /* nodes read in this pass */
};

static void progress(const struct gc *g, const char *step, uint64_t done, uint64_t total)
{
    if (g->progress)
        g->progress(g->progress_arg, step, done, total);
}

static inline bool test_bit(const uint64_t *m, uint64_t i)
{
    return (m[i >> 6] >> (i & 63)) & 1;
}

static inline void set_bit(uint64_t *m, uint64_t i)
{
    m[i >> 6] |= 1ull << (i & 63);
}

static inline bool bm_get(const uint8_t *bits, uint64_t i)
{
    return (bits[i >> 3] >> (i & 7)) & 1;
}

static inline void bm_clear(uint8_t *bits, uint64_t i)
{
    bits[i >> 3] &= (uint8_t) ~(1u << (i & 7));
}

static bool is_candidate_holder(plx_store *st, const struct plx_extent_entry *c)
{
    return plx_holder_is_me(st, c->holder_host, c->holder_pid, c->holder_epoch) ||
           plx_holder_stale(st, c->holder_host, c->holder_pid, c->holder_epoch);
}

/* Bring this process's VDIs to a committed state, so the medium holds what memory holds. */
static int drain_open_vdis(plx_store *st)
{
    for (struct plx_vdi *v = st->vdis; v; v = v->next) {
        while (!plx_vdi_idle(v)) {
            int rc = plx_store_service(st);
            if (rc < 0)
                return rc;
            if (plx_vdi_idle(v))
                break;
            struct epoll_event e;
            epoll_wait(st->epoll_fd, &e, 1, 100);
        }
    }
    if (st->read_only)
        return 0;
    plx_alloc_return_pools(st);
    return plx_wait_alloc_written(st);
}

static void mark_nonnode(struct gc *g, uint64_t addr)
{
    if (addr < g->st->sb.block_count) {
        set_bit(g->rmap, addr);
        set_bit(g->scanned, addr);
    }
}

static int mark_registry_block(void *arg, uint64_t addr)
{
    mark_nonnode(arg, addr);
    return 0;
}

static int mark_index_block(void *arg, uint64_t addr, const void *blk)
{
    (void)blk;
    mark_nonnode(arg, addr);
    return 0;
}

/* One VDI of the table: its record block, and for a live VDI its root and snapshot log. A
 * deleted one is remembered for the purge (step 5). */
/* A label index node is live but is not a radix node: never read it as one. */
static int mark_label_index(void *arg, uint64_t addr, const struct plx_lidx_block *node,
                            uint64_t parent, uint64_t path, const char *why)
{
    struct gc *g = arg;
    if (!node)
        return plx_err(g->st, -EUCLEAN,
                       "gc: nothing freed: label index node %llu is corrupt: "
                       "%s (parallax check reports it)",
                       (unsigned long long)addr, why);
    mark_nonnode(g, addr);
    return 0;
}

static int mark_vdi(void *arg, uint64_t id, uint64_t rec_addr)
{
    struct gc *g = arg;
    plx_store *st = g->st;
    struct plx_vdi_record rec;
    int rc = plx_registry_read(st, rec_addr, &rec);
    if (!rc && rec.id != id)
        rc = plx_err(st, -EUCLEAN, "VDI table: the entry of id %llu names the record of id %llu",
                     (unsigned long long)id, (unsigned long long)rec.id);
    if (rc)
        return rc;
    g->entries++;
    if (rec.flags & PLX_VDI_DELETED) {
        /* Not marked: the purge below unlinks the record, and its block goes with the VDI's. */
        if (g->nrecs % 64 == 0) {
            struct plx_vdi_record *r = realloc(g->recs, (g->nrecs + 64) * sizeof *r);
            uint64_t *a = realloc(g->slots, (g->nrecs + 64) * sizeof *a);
            if (r)
                g->recs = r;
            if (a)
                g->slots = a;
            if (!r || !a)
                return plx_err(st, -ENOMEM, "gc: out of memory");
        }
        g->recs[g->nrecs] = rec;
        g->slots[g->nrecs++] = rec_addr;
        return 0;
    }
    mark_nonnode(g, rec_addr);
    set_bit(g->rmap, rec.root);
    struct plx_snap_info *snaps = NULL;
    uint64_t *where = NULL;
    size_t n = 0;
    rc = plx_snaplog_read(st, &rec, &snaps, &n, &where);
    for (size_t k = 0; !rc && k < n; k++) {
        if (!snaps[k].deleted && snaps[k].root < st->sb.block_count)
            set_bit(g->rmap, snaps[k].root);
        /* A log block is live but is not a radix node: never read it as one. */
        mark_nonnode(g, where[k]);
    }
    free(snaps);
    free(where);
    if (!rc)
        rc = plx_lidx_walk(st, rec.id, rec.label_index, mark_label_index, g);
    return rc;
}

/* A tree a live process holds open read-only (hold.h): kept like a live snapshot's, whether its
 * snapshot or VDI was deleted or not. */
static int mark_hold(void *arg, const struct plx_hold *h)
{
    struct gc *g = arg;
    if (h->root < g->st->sb.block_count)
        set_bit(g->rmap, h->root);
    return 0;
}

/* Deleted VDIs leave the registry (part of step 2, under the admin lock): out of the name index
 * and the VDI table, so their record blocks are swept with the rest of what they reached. */
static int purge_deleted(struct gc *g)
{
    plx_store *st = g->st;
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    uint8_t *zero = plx_block_alloc(1);
    rc = plx_state_read(st);
    for (size_t i = 0; !rc && i < g->nrecs; i++) {
        struct plx_vdi_record now;
        uint64_t addr = 0;
        rc = plx_vditab_get(st, g->recs[i].id, &addr);
        if (rc || addr != g->slots[i])
            continue; /* purged already */
        rc = plx_registry_read(st, addr, &now);
        if (rc)
            break;
        if (!(now.flags & PLX_VDI_DELETED))
            continue;
        rc = plx_registry_purge(st, &now);
        /* A legacy slot in extent 0 is not collected: clear it, as version 1 did. */
        if (!rc && plx_registry_legacy_slot(st, addr))
            rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, zero, 0);
        if (!rc)
            g->out->vdis_purged++;
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_block_free(zero);
    plx_admin_unlock(st);
    return rc;
}

static int skip_entry(void *arg, uint64_t id, uint64_t rec_addr)
{
    (void)arg, (void)id, (void)rec_addr;
    return 0;
}

/* Every VDI was deleted: the registry's own blocks go too, so an emptied store is a fresh one
 * (the roots leave the state block in one write; a dry run only counts the blocks). */
static int registry_drop(struct gc *g, bool dry_run)
{
    plx_store *st = g->st;
    if (dry_run)
        return 0; /* its blocks are not marked: counted as what a collection would free */
    int rc;
    st->state.vdi_table_root = 0;
    st->state.vdi_table_height = 0;
    st->state.name_index_root = 0;
    rc = plx_state_write(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    return rc;
}

/* ---- Held extents: asking their holders (reclaim.c has the holder's side) -------------------- */

static uint64_t reclaim_wait_ns(void)
{
    const char *env = getenv("PARALLAX_RECLAIM_WAIT_MS");
    return (env && *env ? strtoull(env, NULL, 10) : 10000) * 1000000ull;
}

static bool held_by_other(plx_store *st, const struct plx_extent_entry *c)
{
    return (c->type == PLX_EXTENT_METADATA || c->type == PLX_EXTENT_DATA) && c->holder_host &&
           !is_candidate_holder(st, c);
}

static bool same_holder(const struct plx_extent_entry *c, const struct plx_reclaim_req *q)
{
    return c->holder_host == q->holder_host && c->holder_pid == q->holder_pid &&
           c->holder_epoch == q->holder_epoch;
}

/* The record of extent e at addr, if it is one (an older collector may have freed its blocks);
 * into q. */
static bool record_read(plx_store *st, uint64_t e, uint64_t addr, struct plx_reclaim_req *q)
{
    const char *why = "";
    uint64_t need =
        (st->sb.extent_blocks + PLX_RECLAIM_BITS_PER_BLOCK - 1) / PLX_RECLAIM_BITS_PER_BLOCK;
    if (!addr || addr >= st->sb.block_count || plx_sync_io(st, PLX_IO_READ, addr, 1, q, 0) != 0 ||
        plx_blkhdr_verify(q, PLX_MAGIC_RECLAIM_REQ, addr, &why) != 0 || q->extent != e ||
        q->bits_blocks != need || !q->ack_addr || q->ack_addr >= st->sb.block_count)
        return false;
    for (uint32_t k = 0; k < q->bits_blocks; k++)
        if (!q->bits_addr[k] || q->bits_addr[k] >= st->sb.block_count)
            return false;
    return true;
}

static int alloc_one(plx_store *st, uint64_t *addr)
{
    int n = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, addr);
    return n < 0 ? n : 0;
}

/* Step 0: ask the holder of every extent a live process holds for a round, in the extent's
 * record (made here in our own metadata extent when it has none). Under the admin lock: the
 * records are written before the catalogue entries that name them. */
static int request_all(struct gc *g)
{
    plx_store *st = g->st;
    uint64_t need =
        (st->sb.extent_blocks + PLX_RECLAIM_BITS_PER_BLOCK - 1) / PLX_RECLAIM_BITS_PER_BLOCK;
    if (need > PLX_RECLAIM_MAX_BITS_BLOCKS)
        return 0; /* extents too large for a record: skipped, as before */
    while (!g->nonce)
        if (getrandom(&g->nonce, sizeof g->nonce, 0) != sizeof g->nonce)
            g->nonce = plx_now_ns() ^ ((uint64_t)getpid() << 32);
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_catalogue_read(st);
    bool made = false;
    for (uint64_t e = 1; !rc && e < st->sb.extent_count; e++) {
        const struct plx_extent_entry *c = &st->cat[e];
        if (!held_by_other(st, c))
            continue;
        struct gc_rec *r = calloc(1, sizeof *r);
        struct plx_reclaim_req *q = plx_block_alloc(1);
        if (!r || !q) {
            free(r);
            plx_block_free(q);
            rc = plx_err(st, -ENOMEM, "gc: out of memory");
            break;
        }
        r->q = q;
        g->rec[e] = r;
        uint64_t addr = c->reclaim;
        if (!record_read(st, e, addr, q)) {
            /* A new record: request, ack and candidate blocks in our metadata extent. */
            memset(q, 0, PLX_BLOCK_SIZE);
            q->bits_blocks = (uint32_t)need;
            rc = alloc_one(st, &addr);
            if (!rc)
                rc = alloc_one(st, &q->ack_addr);
            for (uint32_t k = 0; !rc && k < need; k++)
                rc = alloc_one(st, &q->bits_addr[k]);
            made = true;
        }
        if (rc)
            break;
        q->extent = e;
        q->nonce = g->nonce;
        q->state = PLX_RECLAIM_REQUEST;
        q->holder_host = c->holder_host;
        q->holder_pid = c->holder_pid;
        q->holder_epoch = c->holder_epoch;
        q->round = q->candidates = q->gc_epoch = 0;
        r->addr = addr;
    }
    /* Our claims of the new blocks are durable before anything names them. */
    if (!rc && made)
        rc = plx_wait_alloc_written(st);
    for (uint64_t e = 1; !rc && e < st->sb.extent_count; e++) {
        struct gc_rec *r = g->rec[e];
        if (!r)
            continue;
        plx_blkhdr_seal(r->q, PLX_MAGIC_RECLAIM_REQ, r->addr);
        rc = plx_sync_io(st, PLX_IO_WRITE, r->addr, 1, r->q, 0);
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    for (uint64_t e = 1; !rc && made && e < st->sb.extent_count; e++) {
        struct gc_rec *r = g->rec[e];
        if (!r || st->cat[e].reclaim == r->q->hdr.self)
            continue;
        struct plx_extent_entry ent = st->cat[e];
        ent.reclaim = r->q->hdr.self;
        rc = plx_extent_entry_write(st, e, &ent);
    }
    if (!rc && made)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        plx_err(st, rc, "gc: writing reclaim requests: %s", strerror(-rc));
    plx_admin_unlock(st);
    /* What we claimed for records and did not use goes back before the checkpoint. */
    if (!rc && made) {
        plx_alloc_return_pools(st);
        rc = plx_wait_alloc_written(st);
    }
    return rc;
}

/* Read the ack block of r's record: did its holder answer (folded: fold) our request? */
static bool ack_seen(struct gc *g, uint64_t e, const struct gc_rec *r, bool fold,
                     struct plx_reclaim_ack *a)
{
    const char *why = "";
    const struct plx_reclaim_req *q = r->q;
    if (plx_sync_io(g->st, PLX_IO_READ, q->ack_addr, 1, a, 0) != 0 ||
        plx_blkhdr_verify(a, PLX_MAGIC_RECLAIM_ACK, q->ack_addr, &why) != 0 || a->extent != e ||
        a->holder_host != q->holder_host || a->holder_pid != q->holder_pid ||
        a->holder_epoch != q->holder_epoch)
        return false;
    return fold ? a->folded_nonce == g->nonce : a->acked_nonce == g->nonce;
}

/* Wait (bounded) until every holder asked has answered (fold: has folded our publication).
 * Holders look every second by default; one that does not answer in time is skipped. */
static void wait_holders(struct gc *g, bool fold)
{
    plx_store *st = g->st;
    struct plx_reclaim_ack *a = plx_block_alloc(1);
    uint64_t deadline = plx_mono_ns() + reclaim_wait_ns();
    for (unsigned turn = 0;; turn++) {
        uint64_t left = 0, total = 0;
        for (uint64_t e = 1; e < st->sb.extent_count; e++) {
            struct gc_rec *r = g->rec[e];
            if (!r || r->gone || (fold ? !r->published || r->folded : r->acked))
                continue;
            total++;
            if (!ack_seen(g, e, r, fold, a)) {
                /* A holder that died will not answer (every quarter second: with a lock
                 * manager, asking costs a round trip). Its extents are a dead holder's now,
                 * which the next checkpoint (or collection) sweeps itself. */
                const struct plx_reclaim_req *q = r->q;
                if (turn % 12 == 11 &&
                    plx_holder_stale(st, q->holder_host, q->holder_pid, q->holder_epoch))
                    r->gone = true;
                else
                    left++;
                continue;
            }
            if (!fold) {
                r->acked = true;
                r->q->round = a->round;
            } else {
                r->folded = true;
                g->out->freed_by_type[st->cat[e].type] += a->folded;
            }
        }
        progress(g, fold ? "waiting for holders to free" : "waiting for holders", total - left,
                 total);
        if (!left || plx_mono_ns() >= deadline)
            break;
        if (st->service_tick)
            st->service_tick(st); /* our lease, if a lock manager holds one */
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    plx_block_free(a);
}

/* In the checkpoint, under the admin lock: an extent's record stays once made (its blocks
 * marked), whoever holds the extent next, so that collections reuse it instead of making and
 * sweeping records all the time; one that is not a record any more (an older collector freed
 * its blocks) is unlinked from its entry (a dry run leaves it). */
static int records_keep(struct gc *g, bool dry_run)
{
    plx_store *st = g->st;
    struct plx_reclaim_req *q = plx_block_alloc(1);
    int rc = 0;
    bool cleared = false;
    for (uint64_t e = 1; !rc && e < st->sb.extent_count; e++) {
        struct plx_extent_entry ent = st->cat[e];
        if (!ent.reclaim)
            continue;
        if (record_read(st, e, ent.reclaim, q)) {
            mark_nonnode(g, ent.reclaim);
            mark_nonnode(g, q->ack_addr);
            for (uint32_t k = 0; k < q->bits_blocks; k++)
                mark_nonnode(g, q->bits_addr[k]);
            continue;
        }
        if (dry_run)
            continue;
        ent.reclaim = 0;
        rc = plx_extent_entry_write(st, e, &ent);
        cleared = true;
    }
    if (!rc && cleared)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_block_free(q);
    return rc;
}

/* Step 1 and the registry half of step 2, under the admin lock. */
static int checkpoint(struct gc *g, bool dry_run)
{
    plx_store *st = g->st;
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_catalogue_read(st);
    for (uint64_t e = 1; !rc && e < st->sb.extent_count; e++) {
        progress(g, "checkpoint", e, st->sb.extent_count);
        const struct plx_extent_entry *c = &st->cat[e];
        if (c->type != PLX_EXTENT_METADATA && c->type != PLX_EXTENT_DATA)
            continue;
        struct gc_rec *r = g->rec[e];
        /* A live holder that answered our request: its blocks handed out before its round are
         * linked by now, so this checkpoint and the roots read below hold for them. */
        bool answered = r && r->acked && same_holder(c, r->q) && held_by_other(st, c);
        if (r && !answered) {
            plx_block_free(r->q);
            free(r);
            g->rec[e] = NULL;
        }
        if (!is_candidate_holder(st, c) && !dry_run && !answered) {
            g->out->extents_skipped++;
            continue;
        }
        g->ckpt[e] = plx_block_alloc(g->bmb);
        if (st->alloc->ext[e].held)
            memcpy(g->ckpt[e], st->alloc->ext[e].bitmap, g->bmb * PLX_BLOCK_SIZE);
        else
            rc = plx_bitmap_read(st, e, g->ckpt[e]);
    }
    /* Roots and logs are marked while the lock is held: a clone made after this point shares
     * only snapshots that are live here. The registry's own blocks (VDI table, name index,
     * records) are live too, and are not radix nodes: never read them as such. */
    if (!rc)
        rc = records_keep(g, dry_run);
    if (!rc)
        rc = plx_state_read(st);
    g->epoch = st->state.gc_epoch;
    if (!rc)
        rc = plx_vditab_walk(st, 0, NULL, mark_vdi, g);
    /* The trees live processes read: a hold is recorded under the admin lock in the same hold
     * as the lookup that found its tree live, so a tree is either held here or was live. */
    if (!rc)
        rc = plx_hold_each_live(st, mark_hold, g);
    if (!rc && !dry_run)
        rc = purge_deleted(g);
    /* The registry's blocks as the purge left them: buckets it merged and table blocks it
     * emptied are swept in this collection (FORMAT.md §7.3). */
    if (!rc && g->entries == g->nrecs && (st->state.vdi_table_root || st->state.name_index_root)) {
        rc = registry_drop(g, dry_run);
    } else if (!rc) {
        rc = plx_vditab_walk(st, 0, mark_registry_block, skip_entry, g);
        if (!rc)
            rc = plx_nameidx_walk(st, mark_index_block, g);
    }
    plx_admin_unlock(st);
    return rc;
}

/* plx_block_type without its division (extent_blocks is a power of two, FORMAT.md): this runs
 * for every link of every node read, and the division was half of the mark's CPU time. */
static inline bool link_target_ok(const struct gc *g, uint64_t link)
{
    if (link & PLX_LINK_RESERVED_MASK)
        return false;
    uint64_t a = plx_link_addr(link);
    if (a >= g->st->sb.block_count)
        return false;
    uint8_t t = g->st->cat[a >> g->eshift].type;
    return t == PLX_EXTENT_METADATA || t == PLX_EXTENT_DATA;
}

/* A marking read completed: mark what its nodes link (runs from the service loop). */
static void mark_read_done(plx_store *st, struct plx_ev *ev)
{
    struct gc_read *r = ev->ctx;
    struct gc *g = r->g;
    uint64_t first = ev->io.block;
    g->inflight--;
    g->completed = 1;
    r->busy = false;
    if (g->mark_err)
        return;
    if (ev->status) {
        g->mark_err = plx_err(st, ev->status, "gc: reading radix nodes at block %llu: %s",
                              (unsigned long long)first, strerror(-ev->status));
        return;
    }
    for (uint64_t b = first; b < first + ev->io.nblocks; b++) {
        const uint64_t *links = r->buf + (b - first) * (PLX_BLOCK_SIZE / 8);
        g->read_now++;
        for (unsigned k = 0; k < PLX_RADIX_FANOUT; k++) {
            if (!links[k])
                continue;
            /* What a corrupt node really linked is unknown: freeing anything could free blocks
             * it still reaches. */
            if (!link_target_ok(g, links[k])) {
                g->mark_err = plx_err(st, -EUCLEAN,
                                      "gc: nothing freed: radix node %llu is corrupt: entry %u "
                                      "= 0x%016llx is not a valid link (parallax check reports "
                                      "it)",
                                      (unsigned long long)b, k, (unsigned long long)links[k]);
                return;
            }
            set_bit(g->rmap, plx_link_addr(links[k]));
        }
    }
}

/* Wait until a marking read completes (and its handler ran). */
static int mark_wait(struct gc *g)
{
    g->completed = 0;
    return plx_drive_until(g->st, &g->completed);
}

/* One pass over the metadata extents: read every marked, unread node, mark its links. Up to
 * GC_QD runs are read at once; links found mark blocks ahead of the scan (read in this pass) or
 * behind it (the next pass). Returns the number of nodes read, or a negative errno. */
static long mark_pass(struct gc *g)
{
    plx_store *st = g->st;
    char step[32];
    snprintf(step, sizeof step, "marking (pass %u)", ++g->pass);
    g->read_now = 0;
    int rc = 0;
    for (uint64_t e = 1; e < st->sb.extent_count && !rc && !g->mark_err; e++) {
        progress(g, step, e, st->sb.extent_count);
        if (st->cat[e].type != PLX_EXTENT_METADATA)
            continue;
        uint64_t base = e * g->eb;
        uint64_t i = base + g->bmb, end = base + g->eb;
        while (i < end && !rc && !g->mark_err) {
            if (!test_bit(g->rmap, i) || test_bit(g->scanned, i)) {
                i++;
                continue;
            }
            /* A run of consecutive marked, unread blocks: one read. */
            uint64_t j = i + 1;
            while (j < end && j - i < GC_RUN && test_bit(g->rmap, j) && !test_bit(g->scanned, j))
                j++;
            while (g->inflight == GC_QD && !rc)
                rc = mark_wait(g);
            if (rc || g->mark_err)
                break;
            struct gc_read *r = NULL;
            for (unsigned q = 0; q < GC_QD && !r; q++)
                if (!g->reads[q].busy)
                    r = &g->reads[q];
            memset(&r->ev, 0, sizeof r->ev);
            r->ev.io = (struct plx_io){
                .op = PLX_IO_READ, .block = i, .nblocks = (uint32_t)(j - i), .buf = r->buf};
            r->ev.handler = mark_read_done;
            r->ev.ctx = r;
            r->g = g;
            rc = plx_submit(st, &r->ev);
            if (rc) {
                plx_err(st, rc, "gc: reading radix nodes at block %llu: %s", (unsigned long long)i,
                        strerror(-rc));
                break;
            }
            r->busy = true;
            g->inflight++;
            for (uint64_t b = i; b < j; b++)
                set_bit(g->scanned, b);
            i = j;
        }
    }
    /* Every read must land before the pass ends (or its buffer is freed). */
    while (g->inflight > 0) {
        int wrc = mark_wait(g);
        if (wrc) {
            rc = rc ? rc : wrc;
            break;
        }
    }
    if (rc)
        return rc;
    if (g->mark_err)
        return g->mark_err;
    return g->read_now;
}

/* Collections must not overlap: a block one collection freed may be allocated again before the
 * other sweeps, and "allocated in my checkpoint and allocated now" would no longer mean the
 * same allocation. So, under the admin lock before each sweep: if another collection bumped the
 * epoch since our checkpoint, give up (a later run finishes the job); the first time we free,
 * bump it ourselves, in the same lock hold, so a collection that overlaps ours gives up too. */
static int claim_epoch(struct gc *g, bool will_free)
{
    plx_store *st = g->st;
    int rc = plx_state_read(st);
    if (rc)
        return rc;
    if (st->state.gc_epoch != g->epoch)
        return plx_err(st, -EAGAIN,
                       "gc: another collection freed blocks while this one was marking; run "
                       "gc again");
    if (g->bumped || !will_free)
        return 0;
    st->state.gc_epoch++;
    rc = plx_state_write(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        return rc;
    g->epoch = st->state.gc_epoch;
    st->seen_gc_epoch = g->epoch; /* our own bump: drop our cache once, at the end */
    g->bumped = true;
    return 0;
}

/* Step 4 for an extent a live process holds and whose holder answered: publish what we found
 * allocated in the checkpoint and unreachable, for the holder's round; the holder frees it
 * (reclaim.c). Under the admin lock, after the epoch check (and our bump when there is any). */
static int publish_extent(struct gc *g, uint64_t e)
{
    plx_store *st = g->st;
    struct gc_rec *r = g->rec[e];
    struct plx_reclaim_req *q = r->q;
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_catalogue_read(st);
    if (!rc)
        rc = claim_epoch(g, false);
    const struct plx_extent_entry *c = &st->cat[e];
    if (!rc && (!same_holder(c, q) || !held_by_other(st, c) || c->reclaim != q->hdr.self)) {
        /* Released or taken over since: what it handed out after its round is in the
         * checkpoint and may be linked by now. The next collection sees it afresh. */
        g->out->extents_skipped++;
        plx_admin_unlock(st);
        return 0;
    }
    struct plx_reclaim_bits *bb = plx_block_alloc(q->bits_blocks);
    uint64_t count = 0, base = e * g->eb;
    for (uint64_t i = g->bmb; !rc && i < g->eb; i++) {
        if (!bm_get(g->ckpt[e], i) || test_bit(g->rmap, base + i))
            continue;
        uint64_t k = i / PLX_RECLAIM_BITS_PER_BLOCK, j = i % PLX_RECLAIM_BITS_PER_BLOCK;
        bb[k].bits[j >> 3] |= (uint8_t)(1u << (j & 7));
        count++;
    }
    if (!rc && count)
        rc = claim_epoch(g, true);
    for (uint32_t k = 0; !rc && count && k < q->bits_blocks; k++) {
        bb[k].extent = e;
        bb[k].nonce = g->nonce;
        bb[k].index = k;
        plx_blkhdr_seal(&bb[k], PLX_MAGIC_RECLAIM_BITS, q->bits_addr[k]);
        rc = plx_sync_io(st, PLX_IO_WRITE, q->bits_addr[k], 1, &bb[k], 0);
    }
    /* The bits are on the medium before the request block that says they are there. */
    if (!rc && count)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (!rc && count) {
        q->state = PLX_RECLAIM_PUBLISHED;
        q->candidates = count;
        q->gc_epoch = g->epoch;
        plx_blkhdr_seal(q, PLX_MAGIC_RECLAIM_REQ, q->hdr.self);
        rc = plx_sync_io(st, PLX_IO_WRITE, q->hdr.self, 1, q, 0);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc) {
            r->published = true;
            r->candidates = count;
        }
    }
    /* (The epoch check's and the catalogue's errors carry their own message.) */
    if (rc && rc != -EAGAIN && count)
        plx_err(st, rc, "gc: publishing what extent %llu's holder may free: %s",
                (unsigned long long)e, strerror(-rc));
    plx_block_free(bb);
    plx_admin_unlock(st);
    return rc;
}

/* Step 4 for one extent. */
static int sweep_extent(struct gc *g, uint64_t e, bool dry_run)
{
    plx_store *st = g->st;
    struct plx_extent_state *x = &st->alloc->ext[e];
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_catalogue_read(st);
    if (!rc && !dry_run)
        rc = claim_epoch(g, false);
    struct plx_extent_entry ent = st->cat[e];
    if (rc || (!dry_run && !is_candidate_holder(st, &ent))) {
        /* Taken by a live process since the checkpoint: leave it to a later run. */
        if (!rc)
            g->out->extents_skipped++;
        plx_admin_unlock(st);
        return rc;
    }
    /* Freeing blocks of a dead holder's extent: cut that holder off at the target first, or a
     * block it still writes could land after another process reused it. */
    if (!dry_run)
        rc = plx_holder_evict(st, ent.holder_host, ent.holder_pid, ent.holder_epoch);
    uint8_t *cur = x->held ? x->bitmap : plx_block_alloc(g->bmb);
    if (!rc && !x->held)
        rc = plx_bitmap_read(st, e, cur);
    uint64_t freed = 0, used = 0;
    if (!rc) {
        st->alloc->gen++;
        for (uint64_t i = g->bmb; i < g->eb; i++) {
            if (!bm_get(cur, i))
                continue;
            if (bm_get(g->ckpt[e], i) && !test_bit(g->rmap, e * g->eb + i)) {
                freed++;
                if (dry_run)
                    continue;
                bm_clear(cur, i);
                if (x->held)
                    x->dirty_blocks[i / (PLX_BLOCK_SIZE * 8)] = st->alloc->gen;
            } else {
                used++;
            }
        }
    }
    g->out->freed_by_type[ent.type] += freed;
    if (!rc && !dry_run && freed)
        rc = claim_epoch(g, true); /* still under the lock that the sweep holds */
    if (!rc && !dry_run && freed) {
        if (x->held) {
            x->free += freed;
            plx_alloc_blocks_freed(st);
            rc = plx_wait_alloc_written(st);
        } else {
            rc = plx_sync_io(st, PLX_IO_WRITE, e * g->eb, (uint32_t)g->bmb, cur, 0);
        }
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "gc: writing the bitmap of extent %llu: %s", (unsigned long long)e,
                    strerror(-rc));
        else if (ent.flags & PLX_EXTENT_FULL) {
            ent.flags &= (uint8_t)~PLX_EXTENT_FULL;
            rc = plx_extent_entry_write(st, e, &ent);
        }
    }
    bool pooled = st->alloc->pool[0].valid && st->alloc->pool[0].extent == e;
    pooled |= st->alloc->pool[1].valid && st->alloc->pool[1].extent == e;
    if (!rc && !dry_run && used == 0 && !pooled) {
        /* Nothing left in it: give the extent back to the unused pool, untyped (its reclaim
         * record stays for its next holder). */
        struct plx_extent_entry empty;
        memset(&empty, 0, sizeof empty);
        empty.reclaim = ent.reclaim;
        /* Once released, another process may write in it: no zeroing ahead there any more. */
        if (x->held)
            plx_backend_prepare_stop(st->be, e * g->eb, g->eb);
        rc = plx_extent_entry_write(st, e, &empty);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc) {
            g->out->extents_released++;
            if (x->held) {
                plx_alloc_extent_released(st, e);
                cur = NULL;
            }
        }
    }
    if (cur && cur != x->bitmap)
        plx_block_free(cur);
    plx_admin_unlock(st);
    return rc;
}

static double mono_seconds(void)
{
    return (double)plx_mono_ns() / 1e9;
}

int plx_gc(plx_store *st, int dry_run, struct plx_gc_report *out)
{
    struct plx_gc_opts o = {.struct_size = sizeof o, .dry_run = dry_run};
    return plx_gc_ex(st, &o, out);
}

int plx_gc_ex(plx_store *st, const struct plx_gc_opts *opts, struct plx_gc_report *out)
{
    /* Fields beyond the caller's struct_size (an older caller) stay zero. */
    struct plx_gc_opts o = {0};
    if (opts)
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    int dry_run = o.dry_run;
    struct plx_gc_report local;
    if (!out)
        out = &local;
    memset(out, 0, sizeof *out);
    if (st->read_only && !dry_run)
        return plx_err(st, -EROFS, "blockstore opened read-only: gc needs --dry-run");
    double t0 = mono_seconds();
    struct gc g = {.st = st,
                   .eb = st->sb.extent_blocks,
                   .out = out,
                   .progress = o.progress,
                   .progress_arg = o.progress_arg};
    g.bmb = plx_bitmap_blocks(g.eb);
    g.eshift = (unsigned)__builtin_ctzll(g.eb);
    uint64_t words = (st->sb.block_count + 63) / 64;
    g.rmap = calloc(words, sizeof *g.rmap);
    g.scanned = calloc(words, sizeof *g.scanned);
    g.ckpt = calloc(st->sb.extent_count, sizeof *g.ckpt);
    g.rec = calloc(st->sb.extent_count, sizeof *g.rec);
    uint64_t *bufs = plx_block_alloc((size_t)GC_RUN * GC_QD);
    for (unsigned q = 0; q < GC_QD; q++)
        g.reads[q].buf = bufs + (size_t)q * GC_RUN * (PLX_BLOCK_SIZE / 8);
    int rc = (!g.rmap || !g.scanned || !g.ckpt || !g.rec)
                 ? plx_err(st, -ENOMEM, "gc: out of memory")
                 : 0;
    if (!rc)
        rc = drain_open_vdis(st);
    if (!rc && !dry_run) {
        rc = request_all(&g);
        if (!rc)
            wait_holders(&g, false);
    }
    if (!rc)
        rc = checkpoint(&g, dry_run);
    for (long n = 1; !rc && n > 0;) {
        n = mark_pass(&g);
        if (n < 0)
            rc = (int)n;
        else
            out->metadata_read += (uint64_t)n;
    }
    if (!rc) {
        for (uint64_t i = 0; i < words; i++)
            out->reachable += (uint64_t)__builtin_popcountll(g.rmap[i]);
    }
    for (uint64_t e = 1; !rc && e < st->sb.extent_count; e++) {
        progress(&g, "sweeping", e, st->sb.extent_count);
        if (g.ckpt[e] && g.rec[e])
            rc = publish_extent(&g, e);
        else if (g.ckpt[e])
            rc = sweep_extent(&g, e, dry_run);
    }
    if (!rc && !dry_run)
        wait_holders(&g, true);
    if (!rc && g.bumped) {
        /* Blocks we freed may be cached here, and may be reused from now on. */
        plx_cache_drop_clean(st);
    }
    out->store_blocks = st->sb.block_count;
    out->seconds = mono_seconds() - t0;
    for (uint64_t e = 0; g.ckpt && e < st->sb.extent_count; e++)
        plx_block_free(g.ckpt[e]);
    for (uint64_t e = 0; g.rec && e < st->sb.extent_count; e++) {
        if (g.rec[e])
            plx_block_free(g.rec[e]->q);
        free(g.rec[e]);
    }
    free(g.rec);
    free(g.ckpt);
    free(g.rmap);
    free(g.scanned);
    free(g.recs);
    free(g.slots);
    plx_block_free(bufs);
    return rc;
}
