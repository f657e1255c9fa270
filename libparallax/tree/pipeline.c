/*
 * pipeline.c - logical requests: the stream of a VDI's requests, from submission through the
 * resolve of their paths and their reads, writes, snapshots and flushes, to their completion.
 * The walks of the radix tree are radix.c's, making a path writable (copy-on-write) is cow.c's,
 * the order of the active requests (which may start) is req_order.c's, and the batches that
 * commit what the requests changed are batch.c's; this file runs them in request order.
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
 * A batch is the unit of commit (batch.c); the requests that complete with their batch are
 * finished by it through the callbacks the stream opens it with (batch_open).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batch.h"
#include "cow.h"
#include "pipeline.h"
#include "radix.h"
#include "registry.h"
#include "req_order.h"
#include "snaplog.h"

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
    plx_active_remove(v, r);
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

/* The VDI's open batch (batch.c), which finishes the requests that wait for it and kicks the
 * stream once it is over through these (it is below this file). */
static struct plx_batch *batch_open(struct plx_vdi *v)
{
    return plx_batch_open(v, req_finish, plx_pipeline_kick);
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
        plx_batch_wait(b, r);
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
        plx_batch_maybe_start(v); /* nodes it shadowed are in the open batch: commit them */
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
    plx_batch_start_soon(v);
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
        plx_batch_maybe_start(v);
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
    plx_batch_wait(b, r);
    v->meta_seq = b->seq; /* a new root and a record: not durable until the batch is */
    if (err)
        b->status = err;
    plx_batch_maybe_start(v);
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
    plx_batch_wait(b, r);
    plx_batch_maybe_start(r->v);
}

/* ---- Driving requests -------------------------------------------------------------------------- */

static void do_resolve(struct plx_req *r);

/* Blocks a label index edit may allocate, at most: a path copied, or a fold of the log's tail
 * (snap_edit.c). A bound, not a count: more is claimed synchronously, as before. */
#define EDIT_ROOM 64

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
        plx_wait_add(v, r);
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
        plx_cow_need(v, r, &meta, &data);
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
        plx_batch_wait(b, r);
    if (b)
        plx_batch_advance(b->v, b);
    if (early)
        req_finish(r);
}

/* Ask a waiting request whether it may start now; true if it was started. */
static bool try_start(struct plx_vdi *v, struct plx_req *r)
{
    struct plx_req *blocker = NULL;
    if (r->blocker)
        return false;
    if (!plx_may_start(v, r, &blocker)) {
        if (blocker) {
            r->blocker = blocker;
            blocker->nblocked++;
        }
        return false;
    }
    plx_wait_remove(v, r);
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
    plx_busy_count(v, r, 1);
    plx_wait_add(v, r);
    plx_pipeline_kick(v);
    return 0;
}
