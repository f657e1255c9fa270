/*
 * crash_workloads.c - the crash workloads, one function each; test_crash.c names them in its
 * table and runs each under the crash sweep.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crash.h"
#include "lock.h"
#include "wlog.h"

/* ---- Crash workloads ------------------------------------------------------------------------- */

static unsigned scale(unsigned full)
{
    return tu_quick() ? (full + 3) / 4 : full;
}

/* Positions per workload run: up to 560 x 6 images in full runs, 20 x 4 in quick ones. */
unsigned npositions(void)
{
    return tu_quick() ? 20 : 560;
}

unsigned nseeds(void)
{
    return tu_quick() ? 2 : 4;
}

void wl_sequential(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(700, 300)};
    int a = add_vdi(wl, "seq", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {
        .write = 80, .fua = 5, .flush = 10, .read = 5, .max_nb = 16, .seq = true, .inflight = 32};
    run_phase(wl, &mx, scale(300), 1u << a);
    /* Close (the record's lock is released) and open again (taken) between two phases. */
    close_vdi(wl, a);
    open_vdi(wl, a);
    run_phase(wl, &mx, scale(300), 1u << a);
}

void wl_random(struct wl *wl)
{
    static const struct range ra[] = {R(0, 200), R(400, 100), R(900, 124)};
    static const struct range rb[] = {R(10, 300)};
    int a = add_vdi(wl, "rand-a", 4 * MIB, ra, 3);
    int b = add_vdi(wl, "rand-b", 2 * MIB, rb, 1);
    open_vdi(wl, a);
    open_vdi(wl, b);
    struct mix mx = {.write = 64, .fua = 8, .flush = 8, .read = 12, .max_nb = 8, .inflight = 64};
    run_phase(wl, &mx, scale(520), (1u << a) | (1u << b));
}

void wl_snap_overwrite(struct wl *wl)
{
    static const struct range r[] = {R(0, 256), R(300, 64)};
    int a = add_vdi(wl, "snapow", 2 * MIB, r, 2);
    open_vdi(wl, a);
    /* Fill, snapshot, then overwrite the same hot blocks between snapshots. */
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(40), 1u << a);
    struct mix mx = {.write = 70,
                     .fua = 4,
                     .flush = 6,
                     .snap = 8,
                     .read = 12,
                     .max_nb = 6,
                     .hot = 70,
                     .inflight = 48,
                     .max_snaps = 40,
                     .label = 30};
    run_phase(wl, &mx, scale(400), 1u << a);
}

void wl_clone(struct wl *wl)
{
    static const struct range r[] = {R(0, 160), R(512, 96), R(1000, 24)};
    int a = add_vdi(wl, "base", 4 * MIB, r, 3);
    open_vdi(wl, a);
    struct mix mx = {.write = 70,
                     .fua = 5,
                     .flush = 8,
                     .snap = 5,
                     .read = 12,
                     .max_nb = 12,
                     .hot = 30,
                     .inflight = 48,
                     .max_snaps = 30,
                     .label = 20};
    run_phase(wl, &mx, scale(160), 1u << a);
    sub_snap(wl, a, false);
    drain(wl);
    long s1 = last_done_snap(wl, a);
    ck_assert_int_ge(s1, 0);
    int c1 = add_clone(wl, "clone1", a, (size_t)s1);
    open_vdi(wl, c1);
    /* The parent and the clone written at once; the clone's writes hit shared blocks. */
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << c1));
    sub_snap(wl, c1, true);
    drain(wl);
    long s2 = last_done_snap(wl, c1);
    ck_assert_int_ge(s2, 0);
    int c2 = add_clone(wl, "clone2", c1, (size_t)s2);
    /* A clone of the parent's first snapshot, never opened: it must stay as it was. */
    size_t s0 = wl->v[a].snaps.v[0];
    if (wl->s[s0].done && wl->s[s0].status == 0)
        add_clone(wl, "clone-old", a, s0);
    open_vdi(wl, c2);
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << c1) | (1u << c2));
}

void wl_snap_storm(struct wl *wl)
{
    static const struct range r[] = {R(0, 192), R(256, 64)};
    int a = add_vdi(wl, "storm", 2 * MIB, r, 2);
    open_vdi(wl, a);
    /* About one request in four is a snapshot, with up to 64 requests in flight; over 63
     * snapshots also fill the first snapshot-log block. */
    struct mix mx = {.write = 56,
                     .fua = 4,
                     .flush = 4,
                     .snap = 26,
                     .read = 10,
                     .max_nb = 8,
                     .hot = 40,
                     .inflight = 64,
                     .max_snaps = 140,
                     .label = 15};
    run_phase(wl, &mx, scale(520), 1u << a);
}

/* Snapshots between writes whose data is in flight (issue 16): a snapshot swaps roots once the
 * writes before it are in the tree, not on the medium, so large writes on both sides of it, to
 * the same leaves, have their data in flight together, and later writes copy leaves whose new
 * links are not written yet. crash_sweep also puts crash points right after each snapshot's
 * submission, where the writes around it are in flight. */
void wl_snap_inflight(struct wl *wl)
{
    static const struct range r[] = {R(0, 320), R(600, 80)};
    int a = add_vdi(wl, "inflight", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 32, .seq = true, .inflight = 32};
    run_phase(wl, &fill, scale(30), 1u << a);
    struct mix mx = {.write = 66,
                     .fua = 3,
                     .flush = 3,
                     .snap = 16,
                     .read = 12,
                     .max_nb = 24,
                     .hot = 50,
                     .inflight = 64,
                     .max_snaps = 60,
                     .label = 10};
    run_phase(wl, &mx, scale(360), 1u << a);
}

/* Labels and deletions of snapshots (requests in the stream, each one FUA rewrite of a log
 * block) among writes and snapshots: in the head block (in memory) and in older blocks (found
 * along the skip links), with snapshots waiting for edits and edits for snapshots; the VDI is
 * reopened between rounds; labels are checked for uniqueness on the medium (the label index and
 * the log's tail) by requests in the stream. */
void wl_snap_edit(struct wl *wl)
{
    static const struct range r[] = {R(0, 96)};
    int a = add_vdi(wl, "edited", 2 * MIB, r, 1);
    open_vdi(wl, a);
    struct mix mx = {.write = 40,
                     .fua = 4,
                     .flush = 4,
                     .snap = 24,
                     .edit = 20,
                     .read = 8,
                     .max_nb = 4,
                     .hot = 40,
                     .inflight = 32,
                     .max_snaps = 150,
                     .label = 40};
    for (int round = 0; round < 3; round++) {
        run_phase(wl, &mx, scale(200), 1u << a);
        close_vdi(wl, a);
        open_vdi(wl, a);
    }
}

void wl_trim(struct wl *wl)
{
    static const struct range r[] = {R(0, 384), R(600, 200)};
    int a = add_vdi(wl, "trim", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(50), 1u << a);
    struct mix mx = {.write = 48,
                     .fua = 5,
                     .trim = 25,
                     .flush = 10,
                     .snap = 3,
                     .read = 9,
                     .max_nb = 12,
                     .max_trim = 40,
                     .hot = 20,
                     .inflight = 48,
                     .max_snaps = 12};
    run_phase(wl, &mx, scale(480), 1u << a);
}

/* FUA overwrites in place (DESIGN.md, "The request pipeline": a FUA write of writable blocks
 * while every link in memory is durable completes when its FUA data writes do, without a batch
 * commit): a filled VDI overwritten mostly by FUA writes, 8 in flight as tapdisk keeps them,
 * among cached and plain writes (which allocate after trims and snapshots, and whose links are
 * not durable until a flush), trims, flushes and snapshots. */
void wl_fua_overwrite(struct wl *wl)
{
    static const struct range r[] = {R(0, 192), R(512, 64)};
    int a = add_vdi(wl, "fua-ow", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 95, .flush = 5, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(40), 1u << a);
    struct mix mx = {.write = 20,
                     .fua = 60,
                     .trim = 3,
                     .flush = 4,
                     .snap = 2,
                     .read = 11,
                     .max_nb = 4,
                     .max_trim = 4,
                     .hot = 60,
                     .inflight = 8,
                     .max_snaps = 10};
    run_phase(wl, &mx, scale(400), 1u << a);
}

/* A sparse 1 TiB VDI (four tree levels) with ranges straddling leaf, level-1 and level-2
 * boundaries, through a node cache small enough to evict. */
void wl_sparse(struct wl *wl)
{
    static const struct range r[] = {
        R(0, 64),
        R(3 * 512 - 20, 48),
        R((1ull << 18) - 16, 40),
        R((1ull << 27) - 24, 48),
        R((1ull << 28) - 100, 100),
    };
    int a = add_vdi(wl, "sparse", 1ull << 40, r, 5);
    open_vdi(wl, a);
    struct mix mx = {.write = 60,
                     .fua = 6,
                     .trim = 8,
                     .flush = 8,
                     .snap = 6,
                     .read = 12,
                     .max_nb = 12,
                     .max_trim = 16,
                     .inflight = 48,
                     .max_snaps = 24,
                     .label = 10};
    run_phase(wl, &mx, scale(420), 1u << a);
}

/* A checkpointing VM: bursts of writes alternate with runs of snapshots that have no write
 * between them (clean snapshots share the newest snapshot's root), some of them labelled, across
 * a close and reopen (after which the first snapshot copies the root again). */
void wl_checkpoint(struct wl *wl)
{
    static const struct range r[] = {R(0, 128), R(2000, 64)};
    int a = add_vdi(wl, "checkpoint", 16 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix writes = {
        .write = 80, .fua = 5, .flush = 5, .read = 10, .max_nb = 8, .hot = 50, .inflight = 32};
    struct mix snaps = {.snap = 90, .read = 10, .inflight = 16, .max_snaps = 120, .label = 20};
    for (int round = 0; round < 8; round++) {
        if (round == 4) {
            close_vdi(wl, a);
            open_vdi(wl, a);
            run_phase(wl, &snaps, scale(8), 1u << a); /* clean, but the first copies a root */
        }
        run_phase(wl, &writes, scale(round % 3 == 2 ? 4 : 30), 1u << a);
        run_phase(wl, &snaps, scale(12), 1u << a);
    }
}

/* The collector beside a live holder (reclaim.c, gc.c): the VDI's engine (a host whose reclaim
 * timer looks every millisecond) writes, snapshots and deletes snapshots, and the other engine
 * (another host) collects three times. While the collector waits for the holder, marks and
 * sweeps, the holder serves and takes new requests, snapshot deletions among them; so blocks
 * are handed out, linked and unlinked after the mark began. The holder answers each request,
 * and folds what the collector published into its allocator, freeing blocks of extents it
 * holds. Every write the holder does afterwards lands in blocks a fold may have freed: a fold
 * that freed a linked block shows as data a later write overwrote. Crash points fall in the
 * collector's records and publications and in the holder's answers and folds. */
struct gc_beside {
    struct wl *wl;
    struct mix mx;
    unsigned ops, budget, vmask;
};

static void gc_beside_step(void *arg, const char *step, uint64_t done, uint64_t total)
{
    struct gc_beside *b = arg;
    (void)done, (void)total;
    /* Not while the collector holds the admin lock (its checkpoint): a synchronous claim of the
     * holder would wait for it in this same thread. */
    if (strncmp(step, "waiting", 7) && strncmp(step, "marking", 7) && strcmp(step, "sweeping"))
        return;
    struct wl *wl = b->wl;
    /* A burst, so that requests are in flight (blocks handed out, batches not committed) when
     * the holder's round begins and while the collector marks. */
    for (int k = 0; k < 8 && b->ops < b->budget && wl->inflight < b->mx.inflight; k++) {
        gen_op(wl, &b->mx, b->vmask);
        b->ops++;
    }
    service(wl, false);
}

void wl_gc_fold(struct wl *wl)
{
    static const struct range r[] = {R(0, 256), R(1500, 64)};
    int a = add_vdi(wl, "folded", 8 * MIB, r, 2);
    open_vdi(wl, a);
    /* Every write near the catalogue (records linked and unlinked) is a crash point too. */
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    /* The holder: an engine opened with a fast reclaim poll. */
    setenv("PARALLAX_RECLAIM_POLL_MS", "1", 1);
    switch_engine(wl);
    unsetenv("PARALLAX_RECLAIM_POLL_MS");
    struct mix mx = {.write = 50,
                     .fua = 5,
                     .trim = 4,
                     .flush = 6,
                     .snap = 12,
                     .edit = 15,
                     .read = 8,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 30,
                     .inflight = 24,
                     .max_snaps = 60,
                     .label = 10};
    uint64_t freed = 0;
    for (int round = 0; round < 3; round++) {
        run_phase(wl, &mx, scale(200), 1u << a);
        struct gc_beside b = {.wl = wl, .mx = mx, .budget = scale(80), .vmask = 1u << a};
        struct plx_gc_opts o = {
            .struct_size = sizeof o, .progress = gc_beside_step, .progress_arg = &b};
        struct plx_gc_report rep;
        snprintf(wl->where, sizeof wl->where, "gc round %d", round);
        int rc = plx_gc_ex(wl->other, &o, &rep);
        ck_assert_msg(rc == 0, "[%s] gc: %d %s", wl->name, rc, plx_store_errmsg(wl->other));
        freed += rep.freed_by_type[PLX_EXTENT_DATA] + rep.freed_by_type[PLX_EXTENT_METADATA];
        drain(wl);
    }
    run_phase(wl, &mx, scale(200), 1u << a);
    printf("crash[gc-fold]: collections freed %llu blocks, %llu of them in the holder's extents\n",
           (unsigned long long)freed, (unsigned long long)wl->st->alloc->folded);
    ck_assert_uint_gt(wl->st->alloc->folded, 0);
}

/* A VDI handed back and forth between two engines (hosts) on one medium, with writes,
 * overwrites, trims and snapshots on both sides: each engine's cached nodes go stale while the
 * other writes. Crash points fall in the writer-lock handovers too. */
/* Data placement by leaf (alloc.h, leaf slots): single-block writes in random order over two
 * leaves' ranges fill slots at their entries' offsets, snapshots release the slots so the copies
 * of the leaves take new ones (copy on write moves every block), writes to blocks already taken
 * collide and go to the nearest free block, a small cache evicts leaves with their slot hint,
 * and a close releases every slot. */
void wl_placement(struct wl *wl)
{
    wl->st->alloc->by_leaf = true; /* plx_open_opts.placement = PLX_PLACEMENT_LEAF */
    static const struct range r[] = {R(0, 512), R(512, 300), R(1024, 40)}; /* at most 512 each */
    int a = add_vdi(wl, "place", 8 * MIB, r, 3);
    open_vdi(wl, a);
    struct mix fill = {.write = 92, .flush = 4, .read = 4, .max_nb = 1, .inflight = 64};
    run_phase(wl, &fill, scale(300), 1u << a);
    struct mix mx = {.write = 70,
                     .fua = 4,
                     .flush = 4,
                     .snap = 6,
                     .read = 16,
                     .max_nb = 3,
                     .inflight = 48,
                     .max_snaps = 24,
                     .label = 10};
    run_phase(wl, &mx, scale(300), 1u << a);
    close_vdi(wl, a);
    open_vdi(wl, a);
    run_phase(wl, &mx, scale(200), 1u << a);
}

/* Extents claimed ahead (alloc_claim.c, "Claiming ahead"): a sequential writer crosses extent after
 * extent (1 MiB extents: 255 data blocks), each taken from a spare that an asynchronous claim
 * made durable while writes, flushes and FUA writes went on. Every crash point around each
 * catalogue write is verified (before and after its submission and completion, and around the
 * flush after it), beside the usual sample. */
void wl_claim_ahead(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(512, 512), R(1024, 512), R(1536, 400)};
    int a = add_vdi(wl, "ahead", 8 * MIB, r, 4);
    open_vdi(wl, a);
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    struct mix mx = {
        .write = 80, .fua = 6, .flush = 8, .read = 6, .max_nb = 16, .seq = true, .inflight = 24};
    run_phase(wl, &mx, scale(480), 1u << a);
    /* A second lap over the same blocks, with snapshots: copies on write take extents too. */
    struct mix snap = mx;
    snap.snap = 2;
    snap.max_snaps = 6;
    run_phase(wl, &snap, scale(300), 1u << a);
    struct plx_alloc *al = wl->st->alloc;
    printf("crash[claim-ahead]: %llu extents taken from a spare, %llu waited for, %llu claimed "
           "synchronously\n",
           (unsigned long long)al->claims_ahead, (unsigned long long)al->claims_waited,
           (unsigned long long)al->claims_sync);
    ck_assert_uint_ge(al->claims_ahead, tu_quick() ? 1 : 3);
}

/* The same on a serving loop (a server's engine thread) with no claim made ahead: every extent
 * is claimed by a request that waits for it (plx_alloc_room), its admin lock asked for on the
 * loop, its I/O submitted from the completions, and never synchronously. */
void wl_claim_room(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(512, 512), R(1024, 512), R(1536, 400)};
    int a = add_vdi(wl, "room", 8 * MIB, r, 4);
    open_vdi(wl, a);
    wl->st->serving = true;
    struct plx_alloc *al = wl->st->alloc;
    al->claim_retry_ns = UINT64_MAX;  /* no claim ahead starts; needed ones ignore it */
    uint64_t sync0 = al->claims_sync; /* the open's, before the loop served */
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    struct mix mx = {
        .write = 80, .fua = 6, .flush = 8, .read = 6, .max_nb = 16, .seq = true, .inflight = 24};
    run_phase(wl, &mx, scale(480), 1u << a);
    /* With snapshots, and trims (whose need counts no block below a sparse link). */
    struct mix snap = mx;
    snap.snap = 2;
    snap.max_snaps = 6;
    snap.trim = 8;
    snap.max_trim = 64;
    run_phase(wl, &snap, scale(300), 1u << a);
    printf("crash[claim-room]: %llu extents claimed for waiting requests, %llu synchronously\n",
           (unsigned long long)al->claims_waited, (unsigned long long)(al->claims_sync - sync0));
    ck_assert_uint_ge(al->claims_waited, tu_quick() ? 1 : 3);
    ck_assert_uint_eq(al->claims_sync, sync0);
}

void wl_handover(struct wl *wl)
{
    static const struct range r[] = {R(0, 160), R(900, 100)};
    int a = add_vdi(wl, "mover", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {.write = 66,
                     .fua = 5,
                     .trim = 6,
                     .flush = 8,
                     .snap = 5,
                     .read = 10,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 50,
                     .inflight = 32,
                     .max_snaps = 30,
                     .label = 10};
    for (int round = 0; round < 10; round++) {
        run_phase(wl, &mx, scale(50), 1u << a);
        switch_engine(wl);
    }
    run_phase(wl, &mx, scale(50), 1u << a);
}

/* Many snapshots of one VDI: its log grows past a dozen blocks, each new block written with a
 * skip link computed in the request stream, across closes and reopens (which rebuild the skip
 * path from the medium and fold the log's labels into the label index); snapshots are read back
 * as VDI@N through the links and every live label as VDI@LABEL through the index. Some are
 * relabelled or deleted in the stream, among them ones the label index covers (the writer
 * writes a new index path and the VDI record naming it before it writes the label), and the
 * tail is folded into the index by requests in the stream while snapshots are in flight. */
void wl_snap_many(struct wl *wl)
{
    static const struct range r[] = {R(0, 64)};
    int a = add_vdi(wl, "many", 4 * MIB, r, 1);
    open_vdi(wl, a);
    struct mix mx = {.write = 20,
                     .flush = 2,
                     .snap = 70,
                     .read = 8,
                     .max_nb = 4,
                     .hot = 50,
                     .inflight = 16,
                     .max_snaps = 4000,
                     .edit = 3,
                     .label = 5};
    for (int round = 0; round < 4; round++) {
        run_phase(wl, &mx, scale(300), 1u << a);
        close_vdi(wl, a);
        open_vdi(wl, a);
    }
}

/* Lock takeover: the engine writing a VDI loses its lease mid-run (a host frozen past its lease,
 * or partitioned from the lock manager) with the VDI still open, and does not know it. Another
 * engine, to which the first one's holder now counts as dead, takes the VDI over: under the admin
 * lock it preempts the first engine's fence key at the medium (persistent reservations, as on an
 * iSCSI LUN), then writes itself as the holder and goes on writing. Every write the first engine
 * completed is in the VDI the second one sees (the live reads check it), crash images taken
 * during the takeover hold everything flushed by either engine, and when the first engine then
 * writes (its close), the medium refuses it and it stops: nothing of it lands. */
static uint64_t g_dead_host;

static bool takeover_holder_alive(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    return host != g_dead_host && plx_lock_local.holder_alive(st, host, pid, epoch);
}

static const struct plx_lock_ops takeover_lock_ops = {
    .name = "test: the first engine's lease lapsed",
    .admin_try = plx_lock_local_admin_try,
    .holder_alive = takeover_holder_alive,
};

/* What plx_fence_join does for a store with a lock manager on a medium that fences. */
static void join_fencing(plx_store *st)
{
    st->fence_ops = &fwd_fence_ops;
    ck_assert_int_eq(
        st->fence_ops->join(st->be, plx_fence_key(st->host_hash, st->pid, st->epoch), NULL), 0);
    st->fencing = true;
}

void wl_takeover(struct wl *wl)
{
    static const struct range r[] = {R(0, 200), R(700, 64)};
    g_nkeys = 0;
    join_fencing(wl->st);
    int a = add_vdi(wl, "taken", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {.write = 66,
                     .fua = 6,
                     .trim = 5,
                     .flush = 8,
                     .snap = 5,
                     .read = 10,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 40,
                     .inflight = 32,
                     .max_snaps = 20,
                     .label = 10};
    run_phase(wl, &mx, scale(200), 1u << a);
    drain(wl);
    /* The first engine's lease lapses; it has not noticed (partitioned, not frozen). */
    plx_store *first = wl->st;
    plx_vdi *abandoned = wl->v[a].h;
    g_dead_host = first->host_hash;
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .host = "taking-host"};
    int rc = plx_store_open_backend(fwd_new(wl->fb), &o, &wl->st, err, sizeof err);
    ck_assert_msg(rc == 0, "opening the second engine: %d %s", rc, err);
    join_fencing(wl->st);
    wl->st->lock_ops = &takeover_lock_ops;
    open_vdi(wl, a); /* lists and preempts the dead holder's key, then takes the lock */
    ck_assert_int_eq(g_nkeys, 1);
    /* The key is listed on the medium: the first engine never registers again, even at a
     * target that forgot the preempt. */
    uint64_t first_key = plx_fence_key(first->host_hash, first->pid, first->epoch);
    bool listed = false;
    for (uint32_t i = 0; i < wl->st->state.preempted_count; i++)
        listed |= wl->st->state.preempted_keys[i] == first_key;
    ck_assert_msg(listed, "the preempted key is not listed in the state block");
    run_phase(wl, &mx, scale(300), 1u << a);
    /* The first engine writes again (its close writes the VDI record): the medium refuses it,
     * the store is fenced and says why, and nothing of it lands. */
    ck_assert_int_eq(plx_vdi_close(abandoned), -ESTALE);
    ck_assert_msg(strstr(plx_store_errmsg(first), "RESERVATION CONFLICT") != NULL,
                  "the fenced engine's message: %s", plx_store_errmsg(first));
    plx_store_close(first);
}

/* The write cache (wlog.c): two VDIs cached in a log a little above its smallest size, so the
 * ring wraps and writers wait for the drain; writes, FUA writes, trims, flushes, snapshots and
 * reads; in the middle the drain is held so the log fills with acknowledged writes only it
 * holds, and then one VDI is closed as a server closes a departed client's VDI
 * (plx_vdi_try_close: the other goes on writing while it drains). Every crash image is replayed
 * (a new process attaches the log) before it is checked. */
void wl_wcache(struct wl *wl)
{
    static const struct range ra[] = {R(0, 200), R(600, 120)};
    static const struct range rb[] = {R(30, 256)};
    int a = add_vdi(wl, "wc-a", 4 * MIB, ra, 2);
    int b = add_vdi(wl, "wc-b", 2 * MIB, rb, 1);
    open_vdi(wl, a);
    open_vdi(wl, b);
    struct mix mx = {.write = 60,
                     .fua = 6,
                     .trim = 3,
                     .flush = 8,
                     .snap = 2,
                     .read = 12,
                     .max_nb = 16,
                     .max_trim = 8,
                     .inflight = 48,
                     .max_snaps = 4};
    run_phase(wl, &mx, scale(300), (1u << a) | (1u << b));
    plx_wlog_pause_drain(wl->st, 1);
    struct mix nosnap = mx;
    nosnap.snap = 0;
    nosnap.trim = 0; /* both wait for the drain */
    run_phase(wl, &nosnap, scale(30), (1u << a) | (1u << b));
    /* b leaves as a server's client does (plx_vdi_try_close): its drain restarts at once, a
     * goes on writing meanwhile, and b closes once the log holds none of its writes. */
    struct mvdi *mb = &wl->v[b];
    int rc = plx_vdi_try_close(mb->h);
    if (rc != -EAGAIN && wl->expect_ok)
        violation(wl, "try_close of %s with the log full of its writes: %d", mb->name, rc);
    if (rc == -EAGAIN) {
        run_phase(wl, &nosnap, scale(40), 1u << a);
        while ((rc = plx_vdi_try_close(mb->h)) == -EAGAIN) {
            service(wl, false);
            usleep(100);
        }
    }
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing VDI %s: %d %s", mb->name, rc, plx_store_errmsg(wl->st));
    mb->h = NULL;
    open_vdi(wl, b);
    plx_wlog_pause_drain(wl->st, 0);
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << b));

    /* The automatic mode (wcache_auto.c): a goes to it with the cache off (its record bound to
     * the log); its writes go to the store, tracked with copies until a flush covers them. The
     * cache turns on, as the rule's tick does, with writes of a in flight: those go to the log
     * as well and complete from there, and so do the completed ones not yet flushed (from their
     * copies). Then it turns off without a wait (try_detach) while b writes on. */
    struct mvdi *ma = &wl->v[a];
    rc = plx_vdi_wcache_set_mode(ma->h, PLX_WCACHE_OFF, NULL);
    if (rc == 0)
        rc = plx_vdi_wcache_set_mode(ma->h, PLX_WCACHE_AUTO, NULL);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "automatic mode for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
    if (rc != 0)
        return;
    struct mix plain = nosnap; /* writes only: completed and not flushed, then in flight */
    plain.flush = plain.fua = plain.read = 0;
    for (int round = 0; round < 2; round++) {
        run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
        for (unsigned i = 0; i < 12; i++)
            gen_op(wl, &plain, 1u << a);
        while (wl->inflight)
            service(wl, true);
        for (unsigned i = 0; i < 12 && wl->inflight < mx.inflight; i++)
            gen_op(wl, &plain, 1u << a);
        rc = plx_wlog_vdi_enable(ma->h);
        if (rc != 0 && wl->expect_ok)
            violation(wl, "cache on for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
        run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
        while ((rc = plx_wlog_vdi_try_detach(ma->h)) == -EAGAIN) {
            gen_op(wl, &nosnap, 1u << b);
            service(wl, false);
            usleep(100);
        }
        if (rc != 0 && wl->expect_ok)
            violation(wl, "cache off for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
        if (rc != 0)
            return;
    }
    run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
    struct plx_wlog_stats ws;
    plx_wlog_stats(wl->st, &ws);
    if (!ws.zc_bytes && getenv("PARALLAX_WCACHE_ZC_MIN"))
        violation(wl, "no record was written from its writer's buffer (ZC_MIN)");
}
