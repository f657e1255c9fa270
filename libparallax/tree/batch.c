/*
 * batch.c - the batches that commit what a VDI's requests changed, in order (layer 5, below
 * pipeline.c's request stream; batch.h). A request that changed metadata joins the VDI's open
 * batch (pipeline.c); the batch writes the changed nodes, and the requests waiting for it
 * complete when it has finished, through the callbacks the stream opened it with.
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
 * second's stage A overlaps the first's stage B (see plx_batch_maybe_start).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "batch.h"
#include "pipeline.h"
#include "registry.h"
#include "snaplog.h"

static void vdi_reload(struct plx_vdi *v, void (*kick)(struct plx_vdi *v));

/* ---- Batches ---------------------------------------------------------------------------------- */

struct plx_batch *plx_batch_open(struct plx_vdi *v, void (*finish)(struct plx_req *r),
                                 void (*kick)(struct plx_vdi *v))
{
    if (v->open)
        return v->open;
    struct plx_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->seq = ++v->batch_seq;
    b->v = v;
    b->state = B_OPEN;
    b->finish = finish;
    b->kick = kick;
    v->open = b;
    return b;
}

/* Requests that complete with the batch wait on its list; others only count their data. */
void plx_batch_wait(struct plx_batch *b, struct plx_req *r)
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
    plx_batch_advance(v, b);
    plx_batch_maybe_start(v); /* b may have left stage A: the next batch can start flying */
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
    plx_batch_advance(v, b);
    plx_batch_maybe_start(v);
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
        b->finish(r);
        r = next;
    }
    /* Batches finish in order: the next one may now write its commit nodes, or finish. */
    v->flight = v->flight_next;
    v->flight_next = NULL;
    void (*kick)(struct plx_vdi *) = b->kick;
    batch_free(v, b);
    if (v->needs_reload && !v->open && !v->flight)
        vdi_reload(v, kick);
    if (v->flight)
        plx_batch_advance(v, v->flight);
    plx_batch_maybe_start(v);
    kick(v);
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
void plx_batch_advance(struct plx_vdi *v, struct plx_batch *b)
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
void plx_batch_maybe_start(struct plx_vdi *v)
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
    plx_batch_advance(v, b);
}

static void batch_start_queued(struct plx_deferred *d)
{
    struct plx_vdi *v = (struct plx_vdi *)((char *)d - offsetof(struct plx_vdi, start_soon));
    v->start_queued = false;
    plx_batch_maybe_start(v);
}

/* Start the open batch at the end of this service pass, or in the next pass when called outside
 * one (a host submitting from its own loop: tapdisk hands in the requests its NBD server read in
 * one turn one by one). Started at once, the first of them would commit alone and the rest
 * in a second batch behind it, a stage-A flush and a final flush each; started once the turn
 * has handed them all in, they share one batch. Only the start waits: the batch's content and
 * order are what they would be if the requests had come a moment later. */
void plx_batch_start_soon(struct plx_vdi *v)
{
    if (v->start_queued)
        return;
    v->start_queued = true;
    v->start_soon.run = batch_start_queued;
    plx_defer(v->st, &v->start_soon);
}

/* ---- Reload after a failed commit --------------------------------------------------------------- */

static void vdi_reload(struct plx_vdi *v, void (*kick)(struct plx_vdi *v))
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
    kick(v);
}
