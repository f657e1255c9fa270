/*
 * pipeline.c - logical requests and the batches that order their writes. The walks of the radix
 * tree are radix.c's, and making a path writable (copy-on-write) is cow.c's; this file runs
 * them in request order and commits what they changed.
 *
 * A request goes through:
 *   WAIT_RANGE  until no earlier request it conflicts with is active (overlapping blocks where
 *               either writes; writes also wait for an earlier snapshot to swap roots);
 *   RESOLVE     the radix nodes on its paths are brought into the cache, and for sub-block
 *               writes the old contents of the edge blocks are read;
 *   mutation    (synchronous, in memory; cow.c) links are followed or copied: a read-only or
 *               sparse link on the path gets a new node (copy of the read-only one with every link
 *               read-only) and a data block is allocated where the data link is not writable;
 *               the request joins the VDI's open batch and its data writes are issued at once;
 *   IO          data I/O in flight; a write with PLX_WRITE_CACHED completes when its data is
 *               written, even if it changed metadata (acks_early: a volatile write cache);
 *   WAIT_BATCH  any other write that changed metadata (or asked for FUA), a flush or a
 *               snapshot completes with its batch, i.e. once every batch before it committed.
 *
 * A batch is the unit of commit (the thesis's shared commit node, generalised). Nodes a batch
 * allocated are invisible until a node that existed before the batch links them: the "commit
 * nodes". So a batch commits as:
 *   stage A: write the new nodes, the claimed bitmap blocks and (for a snapshot) the snapshot
 *            log block while the members' data writes are in flight; wait for both; FLUSH if
 *            there are commit nodes;
 *   stage B: write the commit nodes; for a snapshot, FLUSH and write the VDI record with FUA;
 *            otherwise FLUSH if a member asked for durability.
 * Dependency chains are therefore never longer than two, as with commit-node inheritance, and a
 * batch that is in flight accumulates the next one behind it, so a sequential writer never
 * waits on one ever-growing commit node (the thesis's section 4.1.5 problem).
 *
 * Node images are captured when a batch starts flying, so the next batch may change the same
 * nodes in memory at once; a node first allocated in batch N is a commit node for any later
 * batch, whose stage B comes after batch N has finished. Two batches may fly at once: the
 * second's stage A overlaps the first's stage B (see batch_maybe_start).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cow.h"
#include "pipeline.h"
#include "radix.h"
#include "registry.h"
#include "snaplog.h"

static void batch_advance(struct plx_vdi *v, struct plx_batch *b);
static void batch_maybe_start(struct plx_vdi *v);
static void vdi_reload(struct plx_vdi *v);

/* Images of every node the batch changed, captured as the batch starts flying. */
struct node_image {
    uint64_t addr;
    bool stage_a;
    bool rewrite; /* patched after its stage-A write was issued: write it again before FLUSH */
    uint8_t *buf;
};

/* $PARALLAX_SNAP_TRACE: when the batch reached a phase (struct plx_snap_trace). */
static void btrace(struct plx_batch *b, enum plx_batch_trace at)
{
    if (b->v->st->snap_trace)
        b->trace[at] = plx_mono_ns();
}

static struct node_image *images_of(struct plx_batch *b)
{
    return (struct node_image *)b->images;
}

static bool is_write(const struct plx_req *r)
{
    return r->op == REQ_WRITE || r->op == REQ_TRIM;
}

bool plx_vdi_idle(const struct plx_vdi *v)
{
    return !v->active_head && !v->open && !v->flight && !v->flight_next && !v->start_queued;
}

uint64_t plx_vdi_next_seq(const struct plx_vdi *v)
{
    return v->next_seq;
}

bool plx_vdi_finished_before(const struct plx_vdi *v, uint64_t seq)
{
    /* The active list is in submission order: its head is the oldest request not finished. */
    return !v->active_head || v->active_head->seq >= seq;
}

unsigned plx_vdi_active_before(const struct plx_vdi *v, uint64_t seq)
{
    unsigned n = 0;
    for (const struct plx_req *r = v->active_head; r && r->seq < seq; r = r->next)
        n++;
    return n;
}

uint64_t plx_vdi_oldest_write_ns(const struct plx_vdi *v)
{
    for (const struct plx_req *r = v->active_head; r; r = r->next)
        if (is_write(r))
            return r->submit_ns;
    return 0;
}

/* ---- Active list and conflicts ------------------------------------------------------------ */

/* r enters RQ_WAIT_RANGE: into the waiting list, in request order (a reload puts requests
 * back, so not always at the tail). */
static void wait_add(struct plx_vdi *v, struct plx_req *r)
{
    struct plx_req *after = v->wait_tail;
    while (after && after->seq > r->seq)
        after = after->wprev;
    r->wprev = after;
    r->wnext = after ? after->wnext : v->wait_head;
    if (r->wnext)
        r->wnext->wprev = r;
    else
        v->wait_tail = r;
    if (after)
        after->wnext = r;
    else
        v->wait_head = r;
    r->blocker = NULL;
    v->wait_gen++;
}

static void wait_remove(struct plx_vdi *v, struct plx_req *r)
{
    if (r->wprev)
        r->wprev->wnext = r->wnext;
    else
        v->wait_head = r->wnext;
    if (r->wnext)
        r->wnext->wprev = r->wprev;
    else
        v->wait_tail = r->wprev;
    r->wnext = r->wprev = NULL;
    if (r->blocker)
        r->blocker->nblocked--;
    r->blocker = NULL;
    v->wait_gen++;
}

/* Requests that may conflict over a range of blocks (may_start). */
static bool has_range(const struct plx_req *r)
{
    return r->op == REQ_READ || r->op == REQ_WRITE || r->op == REQ_TRIM || r->op == REQ_STATUS;
}

static unsigned busy_slot(uint64_t b)
{
    return (unsigned)((b * 0x9E3779B97F4A7C15ull) >> 52) & (PLX_BUSY_SLOTS - 1);
}

/* r becomes active (d = 1) or stops being active (d = -1): the busy filter. */
static void busy_count(struct plx_vdi *v, struct plx_req *r, int d)
{
    if (!has_range(r))
        return;
    if (d > 0)
        r->busy_counted = r->b1 - r->b0 <= PLX_BUSY_MAX_BLOCKS;
    if (!r->busy_counted) {
        v->nwide += (unsigned)d;
        return;
    }
    for (uint64_t b = r->b0; b < r->b1; b++)
        v->busy[busy_slot(b)] += (uint32_t)d;
}

static void active_remove(struct plx_vdi *v, struct plx_req *r)
{
    if (r->state == RQ_WAIT_RANGE)
        wait_remove(v, r);
    busy_count(v, r, -1);
    v->nsnap -= r->op == REQ_SNAPSHOT;
    if (r->nblocked) {
        /* The requests it blocked may start now: the kick asks them again. */
        for (struct plx_req *w = v->wait_head; w; w = w->wnext)
            if (w->blocker == r)
                w->blocker = NULL;
        r->nblocked = 0;
        if (v->kicking)
            v->kick_again = true;
    }
    if (r->prev)
        r->prev->next = r->next;
    else
        v->active_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        v->active_tail = r->prev;
    r->next = r->prev = NULL;
}

static bool mutated(const struct plx_req *r)
{
    return r->state == RQ_IO || r->state == RQ_WAIT_BATCH || r->state == RQ_DONE;
}

/* May r start, given the earlier active requests? When it may not because its range overlaps
 * an earlier request's, *blocker is that request (it stays in the way while it is active). */
static bool may_start(const struct plx_vdi *v, const struct plx_req *r, struct plx_req **blocker)
{
    if (v->needs_reload)
        return false;
    if (r->busy_counted && !v->nsnap && !v->nwide) {
        /* Without a snapshot active only a range can be in the way (flushes and snapshot edits
         * are passed), and no other active request has a block of r's in its range when every
         * counter of r's blocks is r's alone. Otherwise the walk decides. */
        uint64_t b = r->b0;
        while (b < r->b1 && v->busy[busy_slot(b)] == 1)
            b++;
        if (b == r->b1)
            return true;
    }
    for (const struct plx_req *e = v->active_head; e && e != r; e = e->next) {
        if (r->op == REQ_SNAPEDIT || e->op == REQ_SNAPEDIT) {
            /* Edits of snapshot records and snapshots both rewrite log blocks: one at a time, in
             * request order (a snapshot stays active until its batch has finished). Reads and
             * writes pass edits. */
            if ((r->op == REQ_SNAPEDIT || r->op == REQ_SNAPSHOT) &&
                (e->op == REQ_SNAPEDIT || e->op == REQ_SNAPSHOT))
                return false;
            continue;
        }
        if (r->op == REQ_SNAPSHOT) {
            /* Everything before the snapshot must be in the tree it freezes: applied in memory,
             * not necessarily written. The snapshot's record is written after their data anyway
             * (its batch comes after theirs or is theirs, and a batch's commit waits for its
             * members' data); a data write that fails after the swap fails the snapshot
             * (fail_snapshots_after). */
            if (is_write(e) && !mutated(e))
                return false;
            if (e->op == REQ_SNAPSHOT && !mutated(e))
                return false;
            continue;
        }
        if (e->op == REQ_SNAPSHOT) {
            if (is_write(r) && !mutated(e))
                return false;
            continue;
        }
        if (e->op == REQ_FLUSH || r->op == REQ_FLUSH)
            continue;
        if (!is_write(r) && !is_write(e))
            continue;
        if (e->b0 < r->b1 && r->b0 < e->b1) {
            *blocker = (struct plx_req *)(uintptr_t)e;
            return false;
        }
    }
    return true;
}

/* ---- Completion --------------------------------------------------------------------------- */

/* Nodes a batch may hold for writes acknowledged ahead of its commit; past this a member waits
 * for its batch again, which bounds the pinned node images (16 MiB) when the medium is slower
 * at commits than the guest is at writing. */
#define EARLY_MAX_NODES 4096

/* r is a write whose data is on the medium and whose mutation is in the in-memory tree (reads
 * see it): may it complete before its batch commits? A write with PLX_WRITE_CACHED (and not
 * FUA) does, as on a disk with a volatile write cache: until a flush it may be lost in a crash
 * (of the medium or of this process), and a flush, a FUA write or a snapshot still completes
 * only after every batch before it has committed. Other writes keep the stronger contract
 * (tapdisk's durability=ordered: a completed write survives a crash of the process). Not when the
 * batch has failed already (its members complete with its error). A batch that fails after a
 * member was acknowledged early puts the VDI into failed mode (batch_finish), since dropping
 * its changes would make that write revert. */
static bool acks_early(const struct plx_req *r, const struct plx_batch *b)
{
    return (r->flags & (PLX_WRITE_CACHED | PLX_WRITE_FUA)) == PLX_WRITE_CACHED && !b->status &&
           b->nnodes <= EARLY_MAX_NODES;
}

static void req_finish(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    if (r->state == RQ_DONE)
        return;
    if (r->bounce && r->op == REQ_READ && !r->status) {
        uint64_t skip = r->off - r->b0 * PLX_BLOCK_SIZE;
        memcpy(r->ubuf, r->bounce + skip, r->len);
    }
    plx_block_free(r->bounce);
    r->bounce = NULL;
    plx_read_plan_free(r->rplan);
    r->rplan = NULL;
    plx_block_free(r->rscratch);
    r->rscratch = NULL;
    free(r->rphys);
    r->rphys = NULL;
    free(r->ios);
    r->ios = NULL;
    free(r->relinks);
    r->relinks = NULL;
    active_remove(v, r);
    if (r->batch) {
        /* Still a batch member for bookkeeping; the batch forgets it when it finishes. */
        r->batch = NULL;
    }
    plx_complete(v->st, r);
    plx_pipeline_kick(v);
}

void plx_req_finish(struct plx_req *r)
{
    req_finish(r);
}

/* ---- Batches ---------------------------------------------------------------------------------- */

static struct plx_batch *batch_open(struct plx_vdi *v)
{
    if (v->open)
        return v->open;
    struct plx_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->seq = ++v->batch_seq;
    b->v = v;
    b->state = B_OPEN;
    v->open = b;
    return b;
}

/* Requests that complete with the batch wait on its list; others only count their data. */
static void batch_wait(struct plx_batch *b, struct plx_req *r)
{
    b->nreqs++;
    r->state = RQ_WAIT_BATCH;
    r->batch = b;
    r->batch_next = b->reqs;
    b->reqs = r;
}

static void batch_io_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_batch *b = ev->ctx;
    (void)st;
    if (ev->status && !b->status) {
        b->status = ev->status;
        if (ev->io.op == PLX_IO_FLUSH)
            plx_err(st, ev->status, "committing VDI %s: flush failed: %s", b->v->rec.name,
                    strerror(-ev->status));
        else
            plx_err(st, ev->status, "committing VDI %s: write of block %llu failed: %s",
                    b->v->rec.name, (unsigned long long)ev->io.block, strerror(-ev->status));
    }
    b->io_pending--;
    struct plx_vdi *v = b->v;
    batch_advance(v, b);
    batch_maybe_start(v); /* b may have left stage A: the next batch can start flying */
}

static void batch_submit_flags(struct plx_batch *b, struct plx_ev *ev, enum plx_io_op op,
                               uint64_t blk, void *buf, unsigned flags)
{
    memset(ev, 0, sizeof *ev);
    ev->io.op = op;
    /* A snapshot, a flush or a FUA write waits for this batch, or for one behind it (which
     * waits for this one): its writes and flushes go ahead of data writes (PLX_IO_URGENT). Not
     * otherwise: the device serves nothing else while an urgent write is in flight
     * (mq-deadline), which cost random writers half their speed. */
    bool urgent = b->snap || b->final_flush || b->v->st->durable_waiters;
    ev->io.flags = flags | (urgent ? PLX_IO_URGENT : 0);
    ev->io.block = blk;
    ev->io.nblocks = op == PLX_IO_FLUSH ? 0 : 1;
    ev->io.buf = buf;
    ev->handler = batch_io_done;
    ev->ctx = b;
    plx_store *st = b->v->st;
    /* A batch writes radix nodes, bitmaps, log blocks and VDI records: never the superblock,
     * state block or catalogue. A bug that aims there must not destroy the store. */
    int rc = op == PLX_IO_WRITE && blk < st->sb.registry_start
                 ? plx_err(st, -EIO, "refusing to write system block %llu from a commit (bug)",
                           (unsigned long long)blk)
                 : plx_submit(st, ev);
    if (rc) {
        if (!b->status)
            b->status = rc;
        return;
    }
    b->io_pending++;
}

static void batch_submit(struct plx_batch *b, struct plx_ev *ev, enum plx_io_op op, uint64_t blk,
                         void *buf)
{
    batch_submit_flags(b, ev, op, blk, buf, 0);
}

static void alloc_synced(void *arg, int status)
{
    struct plx_batch *b = arg;
    if (status && !b->status)
        b->status = status;
    b->io_pending--;
    btrace(b, BT_ALLOC);
    struct plx_vdi *v = b->v;
    batch_advance(v, b);
    batch_maybe_start(v);
}

static void batch_write_stage(struct plx_batch *b, bool stage_a)
{
    struct node_image *img = images_of(b);
    for (size_t i = 0; i < b->nnodes; i++)
        if (img[i].stage_a == stage_a)
            batch_submit(b, &b->ios[i], PLX_IO_WRITE, img[i].addr, img[i].buf);
    if (b->snap && stage_a)
        batch_submit(b, &b->ios[b->nnodes], PLX_IO_WRITE, b->log_addr, b->log_buf);
}

/* Write again the new nodes a failed data write patched after their first write; true if any. */
static bool batch_rewrite_patched(struct plx_batch *b)
{
    struct node_image *img = images_of(b);
    bool any = false;
    for (size_t i = 0; img && i < b->nnodes; i++) {
        if (!img[i].rewrite)
            continue;
        img[i].rewrite = false;
        batch_submit(b, &b->ios[i], PLX_IO_WRITE, img[i].addr, img[i].buf);
        any = true;
    }
    return any;
}

static bool batch_has_commit_nodes(const struct plx_batch *b)
{
    const struct node_image *img = (const struct node_image *)b->images;
    for (size_t i = 0; i < b->nnodes; i++)
        if (!img[i].stage_a)
            return true;
    return false;
}

static void batch_free(struct plx_vdi *v, struct plx_batch *b)
{
    struct node_image *img = images_of(b);
    for (size_t i = 0; i < b->nnodes; i++) {
        struct plx_node *n = b->nodes[i];
        plx_cache_unpin(v->st, n);
        if (n->dirty_batch == b->seq)
            n->dirty_batch = 0;
        /* Once its batch is over a new node is an ordinary one. Batch numbers restart when the
         * VDI is opened again while its nodes stay cached, so a stale number could otherwise
         * make a later batch take an existing node for one of its own new nodes. */
        if (n->new_batch == b->seq)
            n->new_batch = 0;
        if (img)
            plx_block_free(img[i].buf);
    }
    free(img);
    free(b->nodes);
    free(b->ios);
    plx_block_free(b->rec_buf);
    plx_block_free(b->log_buf);
    free(b);
}

static void batch_finish(struct plx_vdi *v, struct plx_batch *b)
{
    int status = b->status;
    if (status) {
        /* The medium refused part of this commit. What is on disk is consistent, but the
         * in-memory tree is ahead of it: fail what was built on top and reload. This comes
         * before the members finish, so nothing queued behind them starts on the old tree. */
        if (v->open)
            v->open->status = status;
        if (v->flight_next && !v->flight_next->status)
            v->flight_next->status = status;
        v->needs_reload = true;
        for (size_t i = 0; i < b->nnodes; i++)
            b->nodes[i]->stale = true;
        /* Members acknowledged early (acks_early) are in the tree the reload would drop: a
         * later read would return older data than they wrote. Fail the VDI instead. */
        if (b->early && !v->failed)
            v->failed = plx_err(v->st, status,
                                "VDI %s: a commit failed after %u of its writes were "
                                "acknowledged; every request fails until the VDI is opened "
                                "again",
                                v->rec.name, b->early);
    }
    btrace(b, BT_DONE);
    /* Its last flush came after its own writes, and its stage B after the older batch had
     * finished: everything of this batch and of those before it is durable. */
    if (!status && (b->final_flush || b->snap))
        v->durable_seq = b->seq;
    struct plx_req *r = b->reqs;
    b->reqs = NULL;
    while (r) {
        struct plx_req *next = r->batch_next;
        if (r->trace) {
            memcpy(r->trace->batch, b->trace, sizeof b->trace);
            r->trace->members = b->nreqs;
        }
        if (status && !r->status)
            r->status = status;
        req_finish(r);
        r = next;
    }
    /* Batches finish in order: the next one may now write its commit nodes, or finish. */
    v->flight = v->flight_next;
    v->flight_next = NULL;
    batch_free(v, b);
    if (v->needs_reload && !v->open && !v->flight)
        vdi_reload(v);
    if (v->flight)
        batch_advance(v, v->flight);
    batch_maybe_start(v);
    plx_pipeline_kick(v);
}

static void batch_capture(struct plx_batch *b)
{
    struct node_image *img = calloc(b->nnodes ? b->nnodes : 1, sizeof *img);
    b->ios = calloc(b->nnodes + 2, sizeof *b->ios);
    if (!img || !b->ios) {
        free(img);
        b->status = -ENOMEM;
        b->images = NULL;
        return;
    }
    for (size_t i = 0; i < b->nnodes; i++) {
        struct plx_node *n = b->nodes[i];
        img[i].addr = n->addr;
        img[i].stage_a = n->new_batch == b->seq;
        img[i].buf = plx_block_alloc(1);
        memcpy(img[i].buf, n->links, PLX_BLOCK_SIZE);
    }
    b->images = img;
}

/* The state machine of a flying batch; called whenever something it waits for finished. */
static void batch_advance(struct plx_vdi *v, struct plx_batch *b)
{
    for (;;) {
        if (b->state == B_STAGE_A && !b->stage_a_started && !b->status) {
            /* New nodes, claims and the log block are unreachable until stage B, so they are
             * written while the members' data writes are still in flight. */
            b->stage_a_started = true;
            b->io_pending++; /* the allocator sync */
            int rc = plx_alloc_sync(v->st, b->alloc_gen, alloc_synced, b);
            if (rc != 0) {
                b->io_pending--;
                if (rc < 0 && !b->status)
                    b->status = rc;
            }
            batch_write_stage(b, true);
            continue;
        }
        if (b->io_pending || b->data_pending)
            return;
        switch (b->state) {
        case B_OPEN:
            return;
        case B_STAGE_A:
            if (b->status) {
                b->state = B_DONE;
                break;
            }
            if (batch_rewrite_patched(b))
                continue;
            btrace(b, BT_STAGE_A);
            /* The stage-A flush orders the new nodes and the members' data before the commit
             * nodes that link them. Without commit nodes nothing is linked before the record
             * (a snapshot's, after its own flush in B_STAGE_B) or ever (a batch of in-place
             * overwrites): on a busy medium a snapshot then waits for one flush less. */
            b->state = batch_has_commit_nodes(b) ? B_FLUSH_A : B_WAIT_PREV;
            if (b->state == B_FLUSH_A)
                batch_submit(b, &b->flush_ev, PLX_IO_FLUSH, 0, NULL);
            break;
        case B_FLUSH_A:
            if (b->status) {
                b->state = B_DONE;
                break;
            }
            btrace(b, BT_FLUSH_A);
            b->state = B_WAIT_PREV;
            break;
        case B_WAIT_PREV:
            /* Stage B rewrites nodes the older batch may also write, and a snapshot's record
             * must not pass the older one's: wait until the older batch has finished. */
            if (v->flight != b)
                return;
            if (b->status) {
                b->state = B_DONE;
                break;
            }
            btrace(b, BT_PREV);
            b->state = B_STAGE_B;
            batch_write_stage(b, false);
            break;
        case B_STAGE_B:
            if (b->status) {
                b->state = B_DONE;
                break;
            }
            btrace(b, BT_STAGE_B);
            if (b->snap) {
                /* The record makes the snapshot count: it goes last, after the commit nodes
                 * of the requests before it are durable, so a snapshot that exists after a
                 * crash holds every one of them. */
                b->state = B_FLUSH_REC;
                /* Always a flush: the commit nodes just written, or else the stage-A writes
                 * (not flushed: see B_STAGE_A); and a batch that flew beside an older one needs
                 * the older batch's commit nodes durable too. */
                batch_submit(b, &b->flush_ev, PLX_IO_FLUSH, 0, NULL);
                break;
            }
            b->state = B_FLUSH_B;
            if (b->final_flush)
                batch_submit(b, &b->flush_ev, PLX_IO_FLUSH, 0, NULL);
            break;
        case B_FLUSH_REC:
            if (b->status) {
                b->state = B_DONE;
                break;
            }
            /* Everything else of the batch is durable: a FUA write of the record makes the
             * snapshot durable without another full flush (a device with FUA writes just that
             * block through its cache). */
            btrace(b, BT_FLUSH_REC);
            b->state = B_DONE;
            batch_submit_flags(b, &b->ios[b->nnodes + 1], PLX_IO_WRITE, v->slot_addr, b->rec_buf,
                               PLX_IO_FUA);
            break;
        case B_FLUSH_B:
            b->state = B_DONE;
            break;
        case B_DONE:
            if (v->flight != b)
                return; /* finishes after the older batch (batch_finish advances it then) */
            batch_finish(v, b);
            return;
        }
    }
}

/* Start the open batch flying. Two batches may fly at once: the next starts when the older one
 * has written its stage A (new nodes, bitmaps, log block: none of which the next batch writes),
 * so its data wait, stage A and flush overlap the older batch's stage B; its own stage B waits
 * for the older batch to finish (B_WAIT_PREV). */
static void batch_maybe_start(struct plx_vdi *v)
{
    struct plx_batch *b = v->open;
    if (!b || v->flight_next)
        return;
    if (v->flight && v->flight->state <= B_STAGE_A)
        return;
    v->open = NULL;
    b->overlapped = v->flight != NULL;
    if (b->overlapped)
        v->flight_next = b;
    else
        v->flight = b;
    b->state = B_STAGE_A;
    btrace(b, BT_FLY);
    if (b->snap && b->snap->trace)
        b->snap->trace->data_at_fly = b->data_pending;
    b->alloc_gen = plx_alloc_gen(v->st);
    if (!b->status)
        batch_capture(b);
    batch_advance(v, b);
}

static void batch_start_queued(struct plx_deferred *d)
{
    struct plx_vdi *v = (struct plx_vdi *)((char *)d - offsetof(struct plx_vdi, start_soon));
    v->start_queued = false;
    batch_maybe_start(v);
}

/* Start the open batch at the end of this service pass, or in the next pass when called outside
 * one (a host submitting from its own loop: tapdisk hands in the requests its NBD server read in
 * one turn one by one). Started at once, the first of them would commit alone and the rest
 * in a second batch behind it, a stage-A flush and a final flush each; started once the turn
 * has handed them all in, they share one batch. Only the start waits: the batch's content and
 * order are what they would be if the requests had come a moment later. */
static void batch_start_soon(struct plx_vdi *v)
{
    if (v->start_queued)
        return;
    v->start_queued = true;
    v->start_soon.run = batch_start_queued;
    plx_defer(v->st, &v->start_soon);
}

/* ---- Reload after a failed commit --------------------------------------------------------------- */

static void vdi_reload(struct plx_vdi *v)
{
    plx_store *st = v->st;
    v->needs_reload = false;
    v->same_as_newest_snap = false;
    /* Drop every writable node of this VDI that may hold changes the medium never got. Nodes
     * are dropped only when unpinned; the root is re-read below. */
    struct plx_vdi_record rec;
    int rc = plx_registry_read(st, v->slot_addr, &rec);
    struct plx_cache *c = st->cache;
    for (size_t i = 0; i < c->hash_size; i++) {
        struct plx_node *n = c->hash[i];
        while (n) {
            struct plx_node *next = n->hash_next;
            if (n == v->root)
                n->pins--;
            if ((n->stale || n == v->root) && !n->pins && n->state == NODE_VALID)
                plx_cache_drop(st, n);
            n = next;
        }
    }
    v->root = NULL;
    if (rc == 0) {
        rec.lock_host = v->rec.lock_host;
        rec.lock_pid = v->rec.lock_pid;
        rec.lock_epoch = v->rec.lock_epoch;
        rec.lock_time_ns = v->rec.lock_time_ns;
        v->rec = rec;
        v->root_addr = rec.root;
        rc = plx_snaplog_spine_load(st, &rec, v->spine);
        if (!rec.snaplog_head) {
            plx_block_free(v->log_head); /* the first snapshot never landed */
            v->log_head = NULL;
        } else if (rc == 0) {
            if (!v->log_head)
                v->log_head = plx_block_alloc(1);
            rc = plx_snaplog_read_block(st, rec.snaplog_head, &rec, v->log_head);
        }
        plx_labels_init(&v->labels, &rec);
    }
    struct plx_node *root = NULL;
    /* A failed VDI keeps no root: every request fails in do_resolve. The record, spine and log
     * head above are the medium's, so that closing it writes nothing the medium lacks. */
    if (rc == 0 && !v->failed)
        rc = plx_cache_get_sync(st, v->root_addr, v->height - 1, v->owner, &root);
    if (rc == 0 && root) {
        plx_cache_pin(root);
        v->root = root;
    } else if (rc != 0) {
        st->fatal = rc;
    }
    plx_pipeline_kick(v);
}

/* ---- Resolve ------------------------------------------------------------------------------------ */

static void data_io_done(plx_store *st, struct plx_ev *ev);

static void submit_data_buf(struct plx_req *r, enum plx_io_op op, uint8_t *buf, uint64_t pb,
                            uint32_t n)
{
    struct plx_ev *ev = &r->ios[r->nios++];
    memset(ev, 0, sizeof *ev);
    ev->io.op = op;
    ev->io.flags = op == PLX_IO_WRITE && r->fua_in_place ? PLX_IO_FUA : 0;
    ev->io.block = pb;
    ev->io.nblocks = n;
    ev->io.buf = buf;
    ev->handler = data_io_done;
    ev->ctx = r;
    int rc = plx_submit(r->v->st, ev);
    if (rc) {
        if (!r->status)
            r->status = plx_err(r->v->st, rc, "submitting data I/O: %s", strerror(-rc));
        return;
    }
    r->ios_waiting++;
    if (r->batch && op == PLX_IO_WRITE)
        r->batch->data_pending++;
}

static void submit_data(struct plx_req *r, enum plx_io_op op, uint64_t vb0, uint64_t pb, uint32_t n)
{
    submit_data_buf(r, op, r->io_buf + (vb0 - r->b0) * PLX_BLOCK_SIZE, pb, n);
}

/* Every read of a merged request has completed: copy the blocks read into scratch into place
 * and zero the holes, over the stale blocks the direct reads brought along. A failed request
 * must not hand those over either (they may be another VDI's): its buffer is zeroed. */
static void read_fixup(struct plx_req *r)
{
    const struct plx_read_plan *p = r->rplan;
    if (!p)
        return;
    if (r->status) {
        if (p->merged)
            memset(r->io_buf, 0, (r->b1 - r->b0) * PLX_BLOCK_SIZE);
        return;
    }
    for (size_t k = 0; k < p->nfixes; k++) {
        const struct plx_read_fix *f = &p->fixes[k];
        uint8_t *dst = r->io_buf + f->dst * PLX_BLOCK_SIZE;
        if (f->zero)
            memset(dst, 0, f->n * PLX_BLOCK_SIZE);
        else
            memcpy(dst, r->rscratch + f->src * PLX_BLOCK_SIZE, f->n * PLX_BLOCK_SIZE);
    }
}

/* Read the old contents of a partially written edge block (its path is in the cache). */
static void read_edge(struct plx_req *r, uint64_t vb)
{
    bool loading = false;
    struct plx_node *leaf = plx_radix_walk(r->v, r, vb, &loading);
    uint64_t link = leaf ? leaf->links[plx_index_at(vb, 0)] : 0;
    uint8_t *dst = r->io_buf + (vb - r->b0) * PLX_BLOCK_SIZE;
    if (!link)
        memset(dst, 0, PLX_BLOCK_SIZE);
    else
        submit_data(r, PLX_IO_READ, vb, plx_link_addr(link), 1);
}

static int ensure_ios(struct plx_req *r, size_t n)
{
    free(r->ios);
    r->ios = calloc(n ? n : 1, sizeof *r->ios);
    r->nios = 0;
    return r->ios ? 0 : -ENOMEM;
}

/* Reads over several runs (read_plan.c): spans joined across gaps of up to max_gap blocks,
 * straight into the request's buffer or into a scratch buffer; read_fixup puts every block in
 * place afterwards. Takes phys (freed with the request). */
static void read_merged(struct plx_req *r, uint64_t *phys, uint64_t nb, unsigned max_gap)
{
    r->rphys = phys;
    struct plx_read_plan *p = plx_read_plan_make(phys, nb, max_gap);
    if (!p || ensure_ios(r, p->nios)) {
        plx_read_plan_free(p);
        r->status = -ENOMEM;
        req_finish(r);
        return;
    }
    r->rplan = p;
    if (p->scratch_blocks)
        r->rscratch = plx_block_alloc_unzeroed(p->scratch_blocks);
    for (size_t k = 0; k < p->nios; k++) {
        const struct plx_read_io *io = &p->ios[k];
        uint8_t *buf = io->direct ? r->io_buf + io->first * PLX_BLOCK_SIZE
                                  : r->rscratch + io->scratch * PLX_BLOCK_SIZE;
        submit_data_buf(r, PLX_IO_READ, buf, io->block, io->nblocks);
    }
    if (!r->ios_waiting) {
        read_fixup(r);
        req_finish(r);
    }
}

/* A merged read failed: the error may be in a block it read but does not need (a bad sector
 * under a stale copy). Read again, only the request's own blocks, once; true when it does.
 * The blocks have not moved: a write to them waits for this read, and the collector frees no
 * block the VDI reaches. */
static bool read_retry_exact(struct plx_req *r)
{
    if (!r->rplan || !r->rplan->merged || r->read_exact)
        return false;
    r->read_exact = true;
    r->status = 0;
    r->v->st->reads_retried++;
    memset(r->io_buf, 0, (r->b1 - r->b0) * PLX_BLOCK_SIZE); /* no stale block left behind */
    plx_read_plan_free(r->rplan);
    r->rplan = NULL;
    plx_block_free(r->rscratch);
    r->rscratch = NULL;
    read_merged(r, r->rphys, r->b1 - r->b0, 0);
    return true;
}

static void do_read(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    uint64_t nb = r->b1 - r->b0;
    uint64_t *phys = calloc(nb, sizeof *phys);
    bool loading = false;
    if (!phys) {
        r->status = -ENOMEM;
        req_finish(r);
        return;
    }
    for (uint64_t vb = r->b0; vb < r->b1; vb++) {
        struct plx_node *leaf = plx_radix_walk(v, r, vb, &loading);
        if (leaf)
            phys[vb - r->b0] = plx_link_addr(leaf->links[plx_index_at(vb, 0)]);
    }
    if (loading || r->status) {
        free(phys);
        if (!r->loads.pending)
            req_finish(r);
        return;
    }
    r->state = RQ_IO;
    /* More than one run: the merged reads of read_plan.c. One run (every 4 KiB read, a read of
     * blocks in place): read it as it is. */
    unsigned runs = 0;
    for (uint64_t i = 0; i < nb && runs < 2; i++)
        runs += phys[i] && (i == 0 || phys[i] != phys[i - 1] + 1 || i % PLX_READ_MAX_IO == 0);
    if (runs > 1) {
        read_merged(r, phys, nb, PLX_READ_MERGE_GAP);
        return;
    }
    if (ensure_ios(r, 1)) {
        free(phys);
        r->status = -ENOMEM;
        req_finish(r);
        return;
    }
    for (uint64_t i = 0; i < nb;) {
        if (!phys[i]) {
            memset(r->io_buf + i * PLX_BLOCK_SIZE, 0, PLX_BLOCK_SIZE);
            i++;
            continue;
        }
        uint64_t j = i + 1;
        while (j < nb && phys[j] == phys[i] + (j - i))
            j++;
        submit_data(r, PLX_IO_READ, r->b0 + i, phys[i], (uint32_t)(j - i));
        i = j;
    }
    free(phys);
    if (!r->ios_waiting)
        req_finish(r);
}

/* ---- Block status ---------------------------------------------------------------------------- */

/* The run of blocks from b0 sharing b0's state. Walks again from the start after each load:
 * nodes already loaded are cache hits, and a run ends at the first change anyway. */
static void do_status(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    uint64_t vb = r->b0;
    int first = -1;
    bool loading = false;
    while (vb < r->b1) {
        int m;
        uint64_t span;
        if (!plx_radix_status_at(v, r, vb, &m, &span, &loading))
            break;
        if (first < 0)
            first = m;
        else if (m != first)
            break;
        vb += span;
    }
    if (loading || r->status) {
        if (!r->loads.pending)
            req_finish(r);
        return;
    }
    uint64_t end = r->off + r->len, pos = vb * PLX_BLOCK_SIZE;
    *r->run_out = (pos < end ? pos : end) - r->off;
    *r->mapped_out = first;
    req_finish(r);
}

/* ---- Mutation ----------------------------------------------------------------------------------- */

static void undo_relinks(struct plx_req *r)
{
    plx_store *st = r->v->st;
    struct plx_batch *b = r->batch;
    struct node_image *img = b ? images_of(b) : NULL;
    for (size_t i = r->nrelinks; i-- > 0;) {
        const struct plx_relink *rl = &r->relinks[i];
        struct plx_node *leaf = plx_cache_lookup(st, rl->leaf_addr);
        if (leaf)
            leaf->links[rl->idx] = rl->old_link;
        /* A flying batch captured its images already. Its commit nodes are written only after
         * every member's data, so patching the image is enough; a new node may have been
         * written already (stage A overlaps the data writes): it is written again before the
         * stage-A flush, and nothing links it until stage B. */
        for (size_t k = 0; img && k < b->nnodes; k++)
            if (img[k].addr == rl->leaf_addr) {
                ((uint64_t *)img[k].buf)[rl->idx] = rl->old_link;
                img[k].rewrite = img[k].stage_a && b->stage_a_started;
            }
    }
    r->nrelinks = 0;
}

/* A write's data is on the medium: it completes now (acks_early), or with its batch when it
 * asked for FUA. */
static void req_data_done(struct plx_req *r)
{
    struct plx_batch *b = r->batch;
    if (r->status || !r->needs_batch || !b) {
        req_finish(r);
    } else if (acks_early(r, b)) {
        b->early++;
        req_finish(r);
    } else {
        batch_wait(b, r);
    }
}

/* Apply a write or trim to the in-memory tree and issue its data writes. */
static void do_mutate(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    plx_store *st = v->st;
    struct plx_batch *b = batch_open(v);
    v->same_as_newest_snap = false; /* even if it fails: nodes it shadowed stay */
    uint64_t nb = r->b1 - r->b0;
    uint64_t *phys = calloc(nb, sizeof *phys);
    r->relinks = calloc(nb, sizeof *r->relinks);
    int err = (!b || !phys || !r->relinks) ? -ENOMEM : 0;
    if (!err && b->status)
        err = b->status;
    uint64_t first_edge = r->head_partial ? r->b0 : UINT64_MAX;
    uint64_t last_edge = r->tail_partial ? r->b1 - 1 : UINT64_MAX;
    for (uint64_t vb = r->b0; vb < r->b1 && !err; vb++) {
        bool unmap = r->op == REQ_TRIM && vb != first_edge && vb != last_edge;
        struct plx_node *n = plx_cow_path(v, b, vb, unmap, &err);
        if (err || !n)
            continue;
        unsigned idx = plx_index_at(vb, 0);
        uint64_t link = n->links[idx];
        if (unmap) {
            if (link) {
                r->relinks[r->nrelinks++] = (struct plx_relink){n->addr, idx, link};
                n->links[idx] = 0;
                err = plx_cow_changed(b, n);
            }
            continue;
        }
        if (link && !plx_link_ro(link)) {
            phys[vb - r->b0] = plx_link_addr(link);
            continue;
        }
        /* With placement by leaf, virtual neighbours are neighbours on the store whatever
         * order they are written in (alloc.h, leaf slots); else blocks go in arrival order. */
        uint64_t pb;
        int rc = st->alloc->by_leaf
                     ? plx_alloc_leaf_block(st, v->rec.id, n->addr, idx, &n->data_slot, &pb)
                     : plx_alloc_blocks(st, PLX_EXTENT_DATA, 1, &pb);
        if (rc < 0) {
            err = rc;
            break;
        }
        r->relinks[r->nrelinks++] = (struct plx_relink){n->addr, idx, link};
        n->links[idx] = pb;
        phys[vb - r->b0] = pb;
        err = plx_cow_changed(b, n);
    }
    if (err) {
        undo_relinks(r);
        free(phys);
        r->status = err;
        req_finish(r);
        batch_maybe_start(v); /* nodes it shadowed are in the open batch: commit them */
        return;
    }
    /* A FUA write that only overwrites writable blocks, while every link in memory is durable
     * (no batch that changed a node is waiting for its flush), changes nothing its data needs:
     * its data writes carry FUA and it completes when they do, without a batch commit. Any other
     * FUA write completes with its batch, whose last flush makes it durable. It stays a member
     * of the batch either way (data_pending), so a snapshot after it still follows its data. */
    bool fua = r->flags & PLX_WRITE_FUA;
    r->fua_in_place = fua && r->op == REQ_WRITE && !r->nrelinks && v->meta_seq <= v->durable_seq;
    r->needs_batch = r->nrelinks > 0 || (fua && !r->fua_in_place);
    r->state = RQ_IO;
    r->batch = b;
    if (fua && !r->fua_in_place)
        b->final_flush = true;
    if (ensure_ios(r, nb)) {
        free(phys);
        r->status = -ENOMEM;
        /* Links already point at blocks that will not be written: put them back. */
        undo_relinks(r);
        r->batch = NULL;
        req_finish(r);
        return;
    }
    for (uint64_t i = 0; i < nb;) {
        if (!phys[i]) {
            i++;
            continue;
        }
        uint64_t j = i + 1;
        while (j < nb && phys[j] == phys[i] + (j - i) && j - i < 2048)
            j++;
        submit_data(r, PLX_IO_WRITE, r->b0 + i, phys[i], (uint32_t)(j - i));
        i = j;
    }
    free(phys);
    if (!r->ios_waiting)
        req_data_done(r);
    batch_start_soon(v);
}

int plx_label_taken(struct plx_vdi *v, const char *label, uint64_t except_index)
{
    return plx_labels_taken(v->st, &v->rec, &v->labels, label, except_index);
}

/* Does the next snapshot record go into the newest log block? Several snapshots share a batch
 * (and its flushes) as long as their records go into the one log block the batch writes. */
static bool log_head_has_room(const struct plx_vdi *v)
{
    return v->log_head && v->rec.snap_count + 1 - v->log_head->first_index < PLX_SNAPLOG_PER_BLOCK;
}

/* Freeze the tree as of this point in the request stream. Requests before the snapshot are in it;
 * those after it copy on write from the new current root. The snapshot joins the open batch, which
 * writes the new root and the log block in stage A and the VDI record that makes the snapshot
 * count last; several snapshots may share a batch. */
static void do_snapshot(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    plx_store *st = v->st;
    struct plx_batch *b = batch_open(v);
    int err = b ? b->status : -ENOMEM;
    /* Checked again here: another snapshot asking for the label may have gone first. */
    int taken = err ? 0 : plx_label_taken(v, r->label, 0);
    if (taken < 0)
        err = taken;
    else if (taken)
        err = plx_err(st, -EEXIST, "VDI %s already has a snapshot labelled '%s'", v->rec.name,
                      r->label);
    struct plx_node *old = v->root;
    /* A clean snapshot (nothing written since the newest one, which still exists) shares that
     * snapshot's root: it costs a log record and the VDI record, no radix node. Otherwise the
     * current root is frozen as the snapshot and a read-only copy becomes the current root. */
    const struct plx_snap_record *newest = plx_snaplog_newest(v->log_head, v->rec.snap_count);
    bool clean = v->same_as_newest_snap && newest && !(newest->flags & PLX_SNAP_DELETED);
    uint64_t frozen = clean ? newest->root : old->addr;
    uint64_t new_addr = 0, log_addr = 0;
    if (!err && !clean) {
        int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &new_addr);
        err = rc < 0 ? rc : 0;
    }
    /* Where the record goes: the newest log block if it has room, else a new block. */
    bool new_block = !log_head_has_room(v);
    if (!err && new_block && b->snap)
        err = plx_err(st, -EIO, "VDI %s: a second snapshot in a batch needs a new log block (bug)",
                      v->rec.name);
    if (!err && new_block) {
        int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &log_addr);
        err = rc < 0 ? rc : 0;
    } else if (!err) {
        log_addr = v->rec.snaplog_head;
    }
    struct plx_node *nr = NULL;
    if (!err && !clean)
        nr = plx_cache_new(st, new_addr, v->height - 1, v->owner, &err);
    if (err) {
        if (nr)
            plx_cache_drop(st, nr);
        r->status = err;
        req_finish(r);
        batch_maybe_start(v);
        return;
    }
    if (!v->log_head)
        v->log_head = plx_block_alloc(1);
    if (!b->snap) {
        b->log_buf = plx_block_alloc(1);
        b->rec_buf = plx_block_alloc(1);
    }
    if (nr) {
        for (unsigned i = 0; i < PLX_RADIX_FANOUT; i++)
            nr->links[i] = old->links[i] ? (old->links[i] | PLX_LINK_RO) : 0;
        nr->new_batch = b->seq;
        err = plx_cow_changed(b, nr);
    }

    /* The log block image: the record beyond snap_count is invisible until the VDI record that
     * counts it is written in stage B. */
    struct plx_snaplog_block *lb = (struct plx_snaplog_block *)b->log_buf;
    if (new_block) {
        memset(lb, 0, PLX_BLOCK_SIZE);
        lb->vdi_id = v->rec.id;
        lb->prev = v->rec.snaplog_head;
        lb->first_index = v->rec.snap_count + 1;
        plx_snaplog_spine_push(v->spine, lb, log_addr);
    } else {
        memcpy(lb, v->log_head, PLX_BLOCK_SIZE);
    }
    uint64_t pos = v->rec.snap_count + 1 - lb->first_index; /* from snap_count, not lb->count */
    struct plx_snap_record *sr = &lb->records[pos];
    memset(sr, 0, sizeof *sr);
    sr->root = frozen;
    sr->time_ns = plx_now_ns();
    memcpy(sr->label, r->label, strlen(r->label));
    lb->count = (uint32_t)pos + 1;
    plx_blkhdr_seal(lb, PLX_MAGIC_SNAPLOG, log_addr);
    memcpy(v->log_head, lb, PLX_BLOCK_SIZE);

    if (!err && r->label[0])
        err = plx_labels_set(&v->labels, v->rec.snap_count + 1, r->label);
    v->rec.snap_count++;
    v->rec.snaplog_head = log_addr;
    if (nr)
        v->rec.root = new_addr;
    v->rec.seq++;
    v->same_as_newest_snap = true;
    struct plx_vdi_record tmp = v->rec;
    plx_registry_seal(&tmp, v->slot_addr, b->rec_buf);
    if (r->index_out)
        *r->index_out = v->rec.snap_count;

    /* The leaves written so far are frozen: their copies take slots of their own. */
    plx_alloc_release_slots(st, v->rec.id);
    b->snap = r;
    b->log_addr = log_addr;
    b->final_flush = true;
    if (nr) {
        plx_cache_unpin(st, old);
        plx_cache_pin(nr);
        v->root = nr;
        v->root_addr = new_addr;
    }
    if (r->trace) {
        r->trace->swap_ns = plx_mono_ns();
        r->trace->batches_ahead = (v->flight != NULL) + (v->flight_next != NULL);
    }
    batch_wait(b, r);
    v->meta_seq = b->seq; /* a new root and a record: not durable until the batch is */
    if (err)
        b->status = err;
    batch_maybe_start(v);
}

static void do_flush(struct plx_req *r)
{
    struct plx_batch *b = batch_open(r->v);
    if (!b) {
        r->status = -ENOMEM;
        req_finish(r);
        return;
    }
    b->final_flush = true;
    batch_wait(b, r);
    batch_maybe_start(r->v);
}

/* ---- Driving requests -------------------------------------------------------------------------- */

static void do_resolve(struct plx_req *r);

/* Blocks a label index edit may allocate, at most: a path copied, or a fold of the log's tail
 * (snap_edit.c). A bound, not a count: more is claimed synchronously, as before. */
#define EDIT_ROOM 64

/* The blocks a write or trim will allocate (do_mutate, shadow_child): a new node for every node
 * on its paths reached through a read-only or sparse link (and every node below one), a data
 * block for every block whose link is not writable. Every node on the paths is cached (the
 * request resolved them); one that is not counts as new, which only overstates. An in-place
 * overwrite needs nothing, so it never waits for a claim. */
static void mutate_need(const struct plx_vdi *v, const struct plx_req *r, uint64_t *meta,
                        uint64_t *data)
{
    uint64_t last[8]; /* per level: the last node counted (heights are 3 or 4) */
    for (unsigned l = 0; l < 8; l++)
        last[l] = UINT64_MAX;
    *meta = *data = 0;
    uint64_t first_edge = r->head_partial ? r->b0 : UINT64_MAX;
    uint64_t last_edge = r->tail_partial ? r->b1 - 1 : UINT64_MAX;
    for (uint64_t vb = r->b0; vb < r->b1; vb++) {
        /* A trim unmaps whole blocks: nothing below a sparse link, no data block. */
        bool unmap = r->op == REQ_TRIM && vb != first_edge && vb != last_edge;
        /* n: the node as it is (copied from, when fresh); fresh: the node on the path at this
         * level will be a new one (a copy, or an empty node), and so will all below it. */
        const struct plx_node *n = v->root;
        bool fresh = false, stop = false;
        for (unsigned level = v->height - 1; level > 0 && !stop; level--) {
            uint64_t link = n ? n->links[plx_index_at(vb, level)] : 0;
            if (unmap && !link && (n || !fresh)) {
                stop = true; /* sparse: nothing to unmap below */
                break;
            }
            if (!fresh && link && !plx_link_ro(link)) {
                n = plx_cache_lookup(v->st, plx_link_addr(link));
                if (n && n->state == NODE_VALID)
                    continue;
            }
            fresh = true;
            n = link ? plx_cache_lookup(v->st, plx_link_addr(link)) : NULL;
            if (n && n->state != NODE_VALID)
                n = NULL; /* not cached: every link below counts as present (overstates) */
            uint64_t at = vb >> (PLX_RADIX_BITS * level); /* the child's index at its level */
            if (last[level - 1] != at) {
                last[level - 1] = at;
                (*meta)++;
            }
        }
        if (stop || unmap)
            continue;
        uint64_t link = n && !fresh ? n->links[plx_index_at(vb, 0)] : 0;
        if (!link || plx_link_ro(link))
            (*data)++;
    }
}

static void room_ready(struct plx_alloc_room *w, int status)
{
    struct plx_req *r = (struct plx_req *)((char *)w - offsetof(struct plx_req, room));
    /* No extent left to claim: the request goes on with what is held (its need is a bound; the
     * allocator says "full" itself if it really is). */
    if (status == -ENOSPC) {
        w->full = true;
        status = 0;
    }
    if (status && !r->status)
        r->status = plx_err(r->v->st, status, "%s", r->v->st->alloc->claim_err);
    if (r->state == RQ_RESOLVE && !r->loads.pending && !r->ios_waiting)
        do_resolve(r);
}

/* Before a request allocates on a serving loop: is there room without claiming an extent? If
 * not, it waits here, as for a node load, while the claim waits for the admin lock on the loop
 * (plx_alloc_room), and the loop serves the other requests meanwhile. True: it waits. */
static bool room_wait(struct plx_req *r, uint64_t meta, uint64_t data)
{
    if (r->room.queued)
        return true;
    if (!r->v->st->serving || r->room.full)
        return false;
    r->room.ready = room_ready;
    int rc = plx_alloc_room(r->v->st, meta, data, &r->room);
    if (rc == -EINPROGRESS)
        return true;
    if (rc && !r->status)
        r->status = rc; /* failed before mutating: do_resolve finishes it */
    return false;
}

static void do_resolve(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    if (r->status) {
        req_finish(r);
        return;
    }
    if (v->needs_reload) {
        r->state = RQ_WAIT_RANGE; /* start again on the reloaded tree */
        wait_add(v, r);
        return;
    }
    if (!v->root) {
        r->status = v->failed ? v->failed : v->st->fatal ? v->st->fatal : -EIO;
        req_finish(r);
        return;
    }
    if (r->op == REQ_READ) {
        do_read(r);
        return;
    }
    if (r->op == REQ_STATUS) {
        do_status(r);
        return;
    }
    if (r->op == REQ_FLUSH) {
        do_flush(r);
        return;
    }
    if (r->op == REQ_SNAPEDIT) {
        if (room_wait(r, EDIT_ROOM, 0))
            return;
        if (r->status) {
            req_finish(r);
            return;
        }
        r->edit_start(r);
        return;
    }
    if (r->op == REQ_SNAPSHOT) {
        if (v->open && v->open->snap && !log_head_has_room(v))
            return; /* a batch writes one log block: wait for this one to fly */
        if (room_wait(r, 2, 0)) /* the new root, a new log block */
            return;
        if (r->status) {
            req_finish(r);
            return;
        }
        do_snapshot(r);
        return;
    }
    /* Writes and trims: every node on every path must be in the cache (read-only ones too:
     * they are copied), and the old contents of partial edge blocks must be read. */
    bool loading = false;
    for (uint64_t vb = r->b0; vb < r->b1; vb++)
        plx_radix_walk(v, r, vb, &loading);
    if (r->status && !r->loads.pending) {
        req_finish(r);
        return;
    }
    if (loading || r->loads.pending)
        return;
    if ((r->head_partial || r->tail_partial) && !r->old_data_read) {
        if (ensure_ios(r, 2)) {
            r->status = -ENOMEM;
            req_finish(r);
            return;
        }
        r->old_data_read = true;
        if (r->head_partial)
            read_edge(r, r->b0);
        if (r->tail_partial && (r->b1 - 1 != r->b0 || !r->head_partial))
            read_edge(r, r->b1 - 1);
        if (r->ios_waiting)
            return; /* data_io_done resolves again */
    }
    uint64_t meta = 0, data = 0;
    if (v->st->serving && !r->room.queued)
        mutate_need(v, r, &meta, &data);
    if (room_wait(r, meta, data))
        return;
    if (r->status) {
        req_finish(r);
        return;
    }
    if (r->bounce) {
        /* Merge the caller's bytes over the old edge contents. */
        uint64_t skip = r->off - r->b0 * PLX_BLOCK_SIZE;
        memcpy(r->bounce + skip, r->ubuf, r->len);
    }
    do_mutate(r);
}

/* The cache finished every node load the request waited for (struct plx_load_wait). */
static void loads_ready(struct plx_load_wait *w)
{
    struct plx_req *r = (struct plx_req *)((char *)w - offsetof(struct plx_req, loads));
    if (r->state == RQ_RESOLVE && !r->loads.pending && !r->ios_waiting)
        do_resolve(r);
}

/* A write's data failed, and a snapshot after it may already have swapped roots (a snapshot
 * waits only until earlier writes are applied in memory). The failed write puts its old link
 * back in its leaf (undo_relinks), but the frozen tree holds that leaf too, and writes after the
 * snapshot may have copied it, link and all. So such a snapshot fails rather than freeze a block
 * that was never written: its batch fails, and with it every batch behind it (batch_finish), and
 * the VDI is reloaded from the medium before anything else starts, so that no read follows a
 * copied link meanwhile. Writes after the snapshot may have completed already (acks_early: each
 * of them allocated a block, since every link under the new root is read-only, and completed
 * with its data): then their batch fails with members acknowledged, and the VDI fails instead
 * of reloading (batch_finish); otherwise the requests of the failed batches fail and nothing
 * acknowledged is lost. */
static void fail_snapshots_after(struct plx_req *r, int status)
{
    struct plx_vdi *v = r->v;
    for (struct plx_req *e = r->next; e; e = e->next) {
        if (e->op != REQ_SNAPSHOT || e->state != RQ_WAIT_BATCH || !e->batch)
            continue;
        if (!e->batch->status)
            e->batch->status = status;
        v->needs_reload = true;
    }
}

static void data_io_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    if (ev->status && !r->status)
        r->status = plx_err(st, ev->status, "%s of VDI %s block %llu failed: %s",
                            ev->io.op == PLX_IO_READ ? "read" : "write", r->v->rec.name,
                            (unsigned long long)ev->io.block, strerror(-ev->status));
    r->ios_waiting--;
    bool write = ev->io.op == PLX_IO_WRITE;
    struct plx_batch *b = write ? r->batch : NULL;
    if (ev->status && write && r->nrelinks) {
        /* New blocks whose data never reached the medium must not be linked: put the old links
         * back, in memory and in the images of a batch that has not written its nodes yet. */
        undo_relinks(r);
    }
    if (ev->status && write)
        fail_snapshots_after(r, ev->status);
    if (b && --b->data_pending == 0)
        btrace(b, BT_DATA);
    if (r->ios_waiting)
        return;
    if (r->state == RQ_RESOLVE) {
        if (r->status)
            req_finish(r);
        else
            do_resolve(r); /* the old edge data has arrived */
        return;
    }
    if (r->op == REQ_READ) {
        if (r->status && read_retry_exact(r))
            return;
        read_fixup(r);
        req_finish(r);
        return;
    }
    /* Advance the batch before finishing a request early: finishing starts waiting requests,
     * which may start (and even complete and free) a batch. */
    bool early = r->status || !r->needs_batch || !b;
    if (!early && acks_early(r, b)) {
        b->early++;
        early = true;
    }
    if (!early)
        batch_wait(b, r);
    if (b)
        batch_advance(b->v, b);
    if (early)
        req_finish(r);
}

/* Ask a waiting request whether it may start now; true if it was started. */
static bool try_start(struct plx_vdi *v, struct plx_req *r)
{
    struct plx_req *blocker = NULL;
    if (r->blocker)
        return false;
    if (!may_start(v, r, &blocker)) {
        if (blocker) {
            r->blocker = blocker;
            blocker->nblocked++;
        }
        return false;
    }
    wait_remove(v, r);
    r->state = RQ_RESOLVE;
    do_resolve(r);
    return true;
}

/* Start every waiting request that may now start. */
void plx_pipeline_kick(struct plx_vdi *v)
{
    if (v->kicking) {
        v->kick_again = true;
        return;
    }
    v->kicking = true;
    do {
        v->kick_again = false;
        if (v->nsnap) {
            /* A snapshot in RQ_RESOLVE is driven from here too: the whole active list. */
            for (struct plx_req *r = v->active_head; r;) {
                struct plx_req *next = r->next;
                if (r->state == RQ_WAIT_RANGE && try_start(v, r)) {
                    next = r->next;
                    if (r->state == RQ_DONE)
                        v->kick_again = true; /* the list changed under us */
                } else if (r->state == RQ_RESOLVE && r->op == REQ_SNAPSHOT &&
                           !r->loads.pending) {
                    do_resolve(r);
                }
                if (v->kick_again)
                    break;
                r = next;
            }
            continue;
        }
        for (struct plx_req *r = v->wait_head; r;) {
            struct plx_req *next = r->wnext;
            uint64_t gen = v->wait_gen;
            /* Starting removes r from the list (one change); any other change, or a snapshot
             * submitted meanwhile, and the walk starts over. */
            if (try_start(v, r) && (v->wait_gen != gen + 1 || v->nsnap))
                v->kick_again = true;
            if (v->kick_again)
                break;
            r = next;
        }
    } while (v->kick_again);
    v->kicking = false;
}

/* Milliseconds from *prev to t, and t becomes *prev (a phase that did not happen: 0). */
static double phase_ms(uint64_t *prev, uint64_t t)
{
    if (!t || t < *prev)
        return 0;
    double ms = (double)(t - *prev) / 1e6;
    *prev = t;
    return ms;
}

/* $PARALLAX_SNAP_TRACE: one line per snapshot, where its time went, phase by phase. */
static void snap_trace_print(const struct plx_req *r)
{
    const struct plx_snap_trace *t = r->trace;
    uint64_t now = plx_mono_ns(), p = t->submit_ns;
    const uint64_t *b = t->batch;
    double queue = phase_ms(&p, t->queued_ns);
    double apply = phase_ms(&p, t->swap_ns);
    double fly = phase_ms(&p, b[BT_FLY]);
    double data = b[BT_DATA] > b[BT_FLY] ? (double)(b[BT_DATA] - b[BT_FLY]) / 1e6 : 0;
    double alloc = b[BT_ALLOC] > b[BT_FLY] ? (double)(b[BT_ALLOC] - b[BT_FLY]) / 1e6 : 0;
    double stage_a = phase_ms(&p, b[BT_STAGE_A]);
    double flush_a = phase_ms(&p, b[BT_FLUSH_A]);
    double prev = phase_ms(&p, b[BT_PREV]);
    double stage_b = phase_ms(&p, b[BT_STAGE_B]);
    double flush_rec = phase_ms(&p, b[BT_FLUSH_REC]);
    double rec = phase_ms(&p, b[BT_DONE]);
    double deliver = phase_ms(&p, now);
    fprintf(stderr,
            "parallax: snapshot trace: VDI %s status %d total %.3f ms: submit %.3f "
            "apply %.3f (ahead %u, writes %u) fly %.3f (batches ahead %u) stage-a %.3f (data "
            "%.3f, alloc %.3f; members %u, data writes %u) flush-a %.3f wait-prev %.3f stage-b "
            "%.3f flush-rec %.3f record %.3f deliver %.3f\n",
            r->v->rec.name, r->status, (double)(now - t->submit_ns) / 1e6, queue, apply, t->ahead,
            t->writes_ahead, fly, t->batches_ahead, stage_a, data, alloc, t->members,
            t->data_at_fly, flush_a, prev, stage_b, flush_rec, rec, deliver);
}

/* The request's callback, from the service loop (struct plx_deferred). */
static void req_deliver(struct plx_deferred *d)
{
    struct plx_req *r = (struct plx_req *)((char *)d - offsetof(struct plx_req, done));
    plx_done_fn cb = r->cb;
    void *arg = r->arg;
    int status = r->status;
    if (r->trace) {
        snap_trace_print(r);
        free(r->trace);
    }
    free(r);
    if (cb)
        cb(arg, status);
}

void plx_complete(plx_store *st, struct plx_req *r)
{
    r->state = RQ_DONE;
    if (r->durable_waiter) {
        r->durable_waiter = false;
        st->durable_waiters--;
    }
    r->done.run = req_deliver;
    plx_defer(st, &r->done);
}

int plx_req_submit(struct plx_vdi *v, struct plx_req *r)
{
    r->loads.status = &r->status;
    r->loads.ready = loads_ready;
    r->v = v;
    r->seq = v->next_seq++;
    r->submit_ns = plx_mono_ns();
    r->state = RQ_WAIT_RANGE;
    v->nsnap += r->op == REQ_SNAPSHOT;
    r->durable_waiter = r->op == REQ_SNAPSHOT || r->op == REQ_FLUSH ||
                        (r->op == REQ_WRITE && (r->flags & PLX_WRITE_FUA));
    v->st->durable_waiters += r->durable_waiter;
    if (r->trace) {
        r->trace->queued_ns = plx_mono_ns();
        for (const struct plx_req *e = v->active_head; e; e = e->next) {
            r->trace->ahead++;
            r->trace->writes_ahead += is_write(e) && !mutated(e);
        }
    }
    r->prev = v->active_tail;
    r->next = NULL;
    if (v->active_tail)
        v->active_tail->next = r;
    else
        v->active_head = r;
    v->active_tail = r;
    busy_count(v, r, 1);
    wait_add(v, r);
    plx_pipeline_kick(v);
    return 0;
}
