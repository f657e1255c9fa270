/*
 * snap_edit.c - labelling and deleting snapshots of an open VDI as requests in its stream
 * (layer 5, beside pipeline.c).
 *
 * A label or a deletion rewrites the one snapshot-log block that holds the record. Everything
 * runs on asynchronous I/O from the service loop, so the process that serves the VDI (tapdisk,
 * `parallax serve`) goes on serving requests while it is carried out: find the block (the head
 * block is in memory; older ones are reached along the log's skip links, O(log n) reads), check
 * that the label is free (the first time after open this reads the labels of the whole log),
 * change the record, write the block with FUA, and complete once that write is durable.
 *
 * The pipeline runs an edit only when no snapshot or other edit is ahead of it, and starts no
 * snapshot while an edit is in flight: both rewrite log blocks, and two writes of one block in
 * flight at once may land in either order.
 *
 * Crash safety: the block is rewritten in place with one FUA write of 4 KiB, which lands whole
 * or not at all (the medium's contract, backend.h). Before it, the old record stands; after it,
 * the new one; nothing else changes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "snap_edit.h"

struct plx_snap_edit {
    enum plx_snap_edit_kind kind;
    uint64_t index;
    char label[PLX_LABEL_MAX + 1];
    struct plx_snaplog_block *b; /* the block being read or rewritten */
    struct plx_ev ev;
    void (*after_read)(struct plx_req *r); /* what to do with b once read */
    uint64_t addr;                         /* where b comes from */
    uint64_t expect_first, expect_last, steps;
    struct plx_label_entry *found; /* labels of the log as at open, while loading them */
    size_t nfound, capfound;
};

struct plx_req *plx_snap_edit_new(struct plx_vdi *v, enum plx_snap_edit_kind kind, uint64_t index,
                                  const char *label, plx_done_fn cb, void *arg)
{
    struct plx_req *r = calloc(1, sizeof *r);
    struct plx_snap_edit *e = calloc(1, sizeof *e);
    if (!r || !e) {
        free(r);
        free(e);
        return NULL;
    }
    e->kind = kind;
    e->index = index;
    snprintf(e->label, sizeof e->label, "%s", label ? label : "");
    r->op = REQ_SNAPEDIT;
    r->edit = e;
    r->cb = cb;
    r->arg = arg;
    r->v = v;
    return r;
}

static void finish(struct plx_req *r, int status)
{
    struct plx_snap_edit *e = r->edit;
    plx_block_free(e->b);
    free(e->found);
    free(e);
    r->edit = NULL;
    if (status && !r->status)
        r->status = status;
    plx_req_finish(r);
}

static void read_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        finish(r, plx_err(st, ev->status, "reading snapshot log block %llu of VDI %s: %s",
                          (unsigned long long)e->addr, r->v->rec.name, strerror(-ev->status)));
        return;
    }
    int rc = plx_snaplog_check_block(st, e->addr, r->v->rec.id, e->b);
    if (rc) {
        finish(r, rc);
        return;
    }
    e->after_read(r);
}

/* Read log block addr into e->b, then run after_read. */
static void read_block(struct plx_req *r, uint64_t addr, void (*after_read)(struct plx_req *r))
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    /* Checked against the extent catalogue as it is: a link is trusted only once the block's
     * own header (magic, address, checksum, VDI) has been verified after the read. */
    if (addr == 0 || addr >= v->st->sb.block_count || ++e->steps > v->rec.snap_count + 2) {
        finish(r, plx_err(v->st, -EUCLEAN, "snapshot log of VDI %s: bad link to block %llu",
                          v->rec.name, (unsigned long long)addr));
        return;
    }
    e->addr = addr;
    e->after_read = after_read;
    memset(&e->ev, 0, sizeof e->ev);
    e->ev.io.op = PLX_IO_READ;
    e->ev.io.block = addr;
    e->ev.io.nblocks = 1;
    e->ev.io.buf = e->b;
    e->ev.handler = read_done;
    e->ev.ctx = r;
    int rc = plx_submit(v->st, &e->ev);
    if (rc)
        finish(r, plx_err(v->st, rc, "reading snapshot log block %llu: %s",
                          (unsigned long long)addr, strerror(-rc)));
}

/* ---- Labels of the log as it was at open ----------------------------------------------------- */

static void find_record(struct plx_req *r);

static void labels_block_read(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    const struct plx_snaplog_block *b = e->b;
    if (b->first_index > e->expect_last || b->first_index + b->count - 1 < e->expect_last) {
        finish(r, plx_err(v->st, -EUCLEAN,
                          "snapshot log block %llu of VDI %s does not hold "
                          "snapshot %llu",
                          (unsigned long long)e->addr, v->rec.name,
                          (unsigned long long)e->expect_last));
        return;
    }
    for (uint64_t idx = b->first_index; idx <= e->expect_last; idx++) {
        const struct plx_snap_record *rec = &b->records[idx - b->first_index];
        if ((rec->flags & PLX_SNAP_DELETED) || !rec->label[0])
            continue;
        if (e->nfound == e->capfound) {
            size_t cap = e->capfound ? 2 * e->capfound : 16;
            struct plx_label_entry *f = realloc(e->found, cap * sizeof *f);
            if (!f) {
                finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
                return;
            }
            e->found = f;
            e->capfound = cap;
        }
        struct plx_label_entry *f = &e->found[e->nfound++];
        f->index = idx;
        memcpy(f->label, rec->label, PLX_LABEL_MAX);
        f->label[PLX_LABEL_MAX] = 0;
    }
    e->expect_last = b->first_index - 1;
    if (e->expect_last > 0) {
        read_block(r, b->prev, labels_block_read);
        return;
    }
    int rc = plx_labels_load_base(&v->labels, e->found, e->nfound);
    if (rc) {
        finish(r, plx_err(v->st, rc, "out of memory"));
        return;
    }
    e->steps = 0;
    find_record(r);
}

/* ---- The record ------------------------------------------------------------------------------ */

static void write_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        /* The block on the medium holds the old record or the new one; the in-memory copies
         * keep the old, and the next snapshot writing the head block writes it again. */
        finish(r, plx_err(st, ev->status, "writing snapshot log block %llu of VDI %s: %s",
                          (unsigned long long)e->addr, v->rec.name, strerror(-ev->status)));
        return;
    }
    if (e->addr == v->rec.snaplog_head && v->log_head)
        memcpy(v->log_head, e->b, PLX_BLOCK_SIZE);
    int rc = plx_labels_set(&v->labels, e->index, e->kind == PLX_EDIT_DELETE ? "" : e->label);
    finish(r, rc ? plx_err(st, rc, "out of memory") : 0);
}

static void change_record(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    struct plx_snap_record *rec = &e->b->records[e->index - e->b->first_index];
    if (rec->flags & PLX_SNAP_DELETED) {
        finish(r, plx_err(v->st, -ENOENT, "VDI %s has no snapshot %llu (it was deleted)",
                          v->rec.name, (unsigned long long)e->index));
        return;
    }
    if (e->kind == PLX_EDIT_LABEL) {
        int taken = plx_label_taken(v, e->label, e->index); /* loaded: no I/O */
        if (taken) {
            finish(r, taken < 0
                          ? taken
                          : plx_err(v->st, -EEXIST, "VDI %s already has a snapshot labelled '%s'",
                                    v->rec.name, e->label));
            return;
        }
        memset(rec->label, 0, sizeof rec->label);
        memcpy(rec->label, e->label, strlen(e->label));
    } else {
        /* The record stays (indexes are positions in the log); only its root stops being one. */
        rec->flags |= PLX_SNAP_DELETED;
    }
    plx_blkhdr_seal(e->b, PLX_MAGIC_SNAPLOG, e->addr);
    memset(&e->ev, 0, sizeof e->ev);
    e->ev.io.op = PLX_IO_WRITE;
    e->ev.io.flags = PLX_IO_FUA; /* durable when it completes: the reply waits for it */
    e->ev.io.block = e->addr;
    e->ev.io.nblocks = 1;
    e->ev.io.buf = e->b;
    e->ev.handler = write_done;
    e->ev.ctx = r;
    int rc = plx_submit(v->st, &e->ev);
    if (rc)
        finish(r, plx_err(v->st, rc, "writing snapshot log block %llu: %s",
                          (unsigned long long)e->addr, strerror(-rc)));
}

static void find_block_read(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    uint64_t next = 0;
    int rc = plx_snaplog_find_step(r->v->st, &r->v->rec, e->index, e->b, e->addr, &e->expect_first,
                                   &next);
    if (rc < 0)
        finish(r, rc);
    else if (rc == 1)
        change_record(r);
    else
        read_block(r, next, find_block_read);
}

static void find_record(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (e->kind == PLX_EDIT_LOAD_LABELS) {
        finish(r, 0);
        return;
    }
    if (e->index == 0 || e->index > v->rec.snap_count) {
        finish(r, plx_err(v->st, -ENOENT, "VDI %s has no snapshot %llu", v->rec.name,
                          (unsigned long long)e->index));
        return;
    }
    if (v->log_head && e->index >= v->log_head->first_index) {
        /* The head block: its image in memory is current (no snapshot is in flight). */
        memcpy(e->b, v->log_head, PLX_BLOCK_SIZE);
        e->addr = v->rec.snaplog_head;
        change_record(r);
        return;
    }
    e->expect_first = 0;
    read_block(r, v->rec.snaplog_head, find_block_read);
}

void plx_snap_edit_start(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    e->b = plx_block_alloc(1);
    if (!e->b) {
        finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
        return;
    }
    bool need_labels =
        e->kind == PLX_EDIT_LOAD_LABELS || (e->kind == PLX_EDIT_LABEL && e->label[0]);
    if (!need_labels || v->labels.loaded) {
        find_record(r);
        return;
    }
    e->expect_last = v->labels.base_count;
    if (e->expect_last == 0) {
        int rc = plx_labels_load_base(&v->labels, NULL, 0);
        if (rc) {
            finish(r, plx_err(v->st, rc, "out of memory"));
            return;
        }
        find_record(r);
        return;
    }
    read_block(r, v->labels.base_head, labels_block_read);
}
