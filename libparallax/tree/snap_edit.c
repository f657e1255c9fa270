/*
 * snap_edit.c - labelling and deleting snapshots of an open VDI, checking a new snapshot's label
 * and folding the log's tail into the label index, as requests in its stream (layer 5, beside
 * pipeline.c).
 *
 * Everything runs on asynchronous I/O from the service loop, so the process that serves the VDI
 * (tapdisk, `parallax serve`) goes on serving requests meanwhile, and nothing here reads more
 * than O(log n) blocks of a log of n snapshots:
 *  - a label is looked up (for uniqueness) in the log's tail (the records after label_indexed,
 *    kept short by folding; the head block is in memory) and along its path in the label index,
 *    each index hit checked against its log record through the skip links (labels.c has the
 *    blocking version of the same lookup);
 *  - a label or deletion rewrites the one log block that holds the record (found through the
 *    skip links), with FUA;
 *  - a label for a snapshot the index covers is first put into the index: the label's path is
 *    copied into new blocks (labelidx.c), which with the allocator's bitmaps are made durable,
 *    then the VDI record names the new root (FUA), then the log block is written. A crash in
 *    between leaves an index entry the log does not confirm, which readers ignore (FORMAT.md
 *    §9.1);
 *  - a fold puts the tail's labels into the index the same way and writes the record with
 *    label_indexed = snap_count.
 *
 * The pipeline runs an edit only when no snapshot or other edit is ahead of it, and starts no
 * snapshot while an edit is in flight: both rewrite log blocks and the VDI record, and two
 * writes of one block in flight at once may land in either order. So when an edit starts,
 * every snapshot before it is on the medium, and the writer's in-memory labels of snapshots in
 * flight (v->labels) are emptied.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "labelidx.h"
#include "registry.h"
#include "snap_edit.h"

#define CANDIDATES 16u /* index entries for one label: the live one and a few stale ones */

struct plx_snap_edit {
    enum plx_snap_edit_kind kind;
    uint64_t index; /* LABEL, DELETE: the snapshot; CHECK_LABEL: 0 */
    char label[PLX_LABEL_MAX + 1];
    struct plx_req *snap;         /* CHECK_LABEL: the snapshot waiting for the answer */
    struct plx_snaplog_block *b;  /* LABEL, DELETE: the block holding the record */
    uint64_t addr;                /* b's address */
    struct plx_snaplog_block *lb; /* log blocks read while looking up or folding */
    struct plx_lidx_block *nb;    /* index nodes read */
    struct plx_ev ev;
    void (*after_read)(struct plx_req *r); /* what to do with the block read */
    uint64_t read_addr;
    uint64_t expect_first, steps;
    /* Looking a label up: */
    void (*after_lookup)(struct plx_req *r);
    uint64_t taken;   /* a live snapshot other than `index` with the label, 0 = none */
    uint64_t scan_hi; /* the tail records still to read: (lo, scan_hi] */
    uint64_t cand[CANDIDATES];
    size_t ncand, icand;
    /* The label index: its nodes on the paths looked at, and the changes. */
    struct plx_lidx_txn *txn;
    void (*after_path)(struct plx_req *r);
    /* Folding: the tail's live labels. */
    struct plx_label_entry *fold;
    size_t nfold, capfold, ifold;
    uint64_t fold_to;
    /* Making index changes durable, then the record naming them. */
    struct plx_ev *wev;
    size_t nwev, wpending;
    int wstatus;
    /* The VDI record being written, and what comes after it. */
    struct plx_vdi_record next;
    void (*after_record)(struct plx_req *r);
    uint8_t *rec_buf;
};

static void edit_start(struct plx_req *r);

static struct plx_snap_edit *edit_new(struct plx_req **rp, struct plx_vdi *v,
                                      enum plx_snap_edit_kind kind, uint64_t index,
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
    r->edit_start = edit_start;
    r->cb = cb;
    r->arg = arg;
    r->v = v;
    *rp = r;
    return e;
}

struct plx_req *plx_snap_edit_new(struct plx_vdi *v, enum plx_snap_edit_kind kind, uint64_t index,
                                  const char *label, plx_done_fn cb, void *arg)
{
    struct plx_req *r = NULL;
    return edit_new(&r, v, kind, index, label, cb, arg) ? r : NULL;
}

struct plx_req *plx_snap_edit_check_new(struct plx_vdi *v, const char *label, struct plx_req *snap)
{
    struct plx_req *r = NULL;
    struct plx_snap_edit *e = edit_new(&r, v, PLX_EDIT_CHECK_LABEL, 0, label, NULL, NULL);
    if (e)
        e->snap = snap;
    return e ? r : NULL;
}

static void finish(struct plx_req *r, int status)
{
    struct plx_snap_edit *e = r->edit;
    /* The snapshot behind a check fails with it (it has not started: it waits for this). */
    if (e->snap && status && !e->snap->status)
        e->snap->status = status;
    if (e->kind == PLX_EDIT_FOLD)
        r->v->labels.fold_queued = false;
    plx_lidx_abort(e->txn);
    plx_block_free(e->b);
    plx_block_free(e->lb);
    plx_block_free(e->nb);
    plx_block_free(e->rec_buf);
    free(e->fold);
    free(e->wev);
    free(e);
    r->edit = NULL;
    if (status && !r->status)
        r->status = status;
    plx_req_finish(r);
}

static void submit(struct plx_req *r, struct plx_ev *ev, enum plx_io_op op, unsigned flags,
                   uint64_t block, void *buf, void (*handler)(plx_store *, struct plx_ev *))
{
    memset(ev, 0, sizeof *ev);
    ev->io.op = op;
    ev->io.flags = flags | PLX_IO_URGENT; /* a log block or record: ahead of data writes */
    ev->io.block = block;
    ev->io.nblocks = buf ? 1 : 0;
    ev->io.buf = buf;
    ev->handler = handler;
    ev->ctx = r;
    int rc = plx_submit(r->v->st, ev);
    if (rc)
        finish(r, plx_err(r->v->st, rc, "VDI %s: submitting I/O for a snapshot edit: %s",
                          r->v->rec.name, strerror(-rc)));
}

/* ---- Reading log blocks and index nodes -------------------------------------------------- */

static void log_read_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        finish(r, plx_err(st, ev->status, "reading snapshot log block %llu of VDI %s: %s",
                          (unsigned long long)e->read_addr, r->v->rec.name, strerror(-ev->status)));
        return;
    }
    int rc = plx_snaplog_check_block(st, e->read_addr, &r->v->rec, ev->io.buf);
    if (rc) {
        finish(r, rc);
        return;
    }
    e->after_read(r);
}

/* Read log block addr into buf, then run after_read. */
static void read_log(struct plx_req *r, uint64_t addr, struct plx_snaplog_block *buf,
                     void (*after_read)(struct plx_req *r))
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
    e->read_addr = addr;
    e->after_read = after_read;
    submit(r, &e->ev, PLX_IO_READ, 0, addr, buf, log_read_done);
}

static void index_path(struct plx_req *r);

static void node_read_done(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        finish(r, plx_err(st, ev->status, "reading label index node %llu of VDI %s: %s",
                          (unsigned long long)e->read_addr, r->v->rec.name, strerror(-ev->status)));
        return;
    }
    int rc = plx_lidx_supply(e->txn, e->nb);
    if (rc) {
        finish(r, rc);
        return;
    }
    index_path(r);
}

/* Load the label index path of e->label into e->txn, then run e->after_path. */
static void index_path(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    uint64_t addr;
    unsigned level;
    int rc = plx_lidx_need(e->txn, e->label, &addr, &level);
    if (rc < 0) {
        finish(r, rc);
        return;
    }
    if (rc == 0) {
        e->after_path(r);
        return;
    }
    e->read_addr = addr;
    submit(r, &e->ev, PLX_IO_READ, 0, addr, e->nb, node_read_done);
}

static int txn_begin(struct plx_req *r, uint64_t root)
{
    struct plx_snap_edit *e = r->edit;
    if (e->txn)
        return 0;
    return plx_lidx_begin(r->v->st, r->v->rec.id, root, &e->txn);
}

/* ---- Looking a label up: the tail, then the index ---------------------------------------- */

static bool record_has(const struct plx_snap_record *rec, const char *label)
{
    return !(rec->flags & PLX_SNAP_DELETED) && strncmp(rec->label, label, PLX_LABEL_MAX) == 0;
}

/* The first snapshot of the tail is after this one. */
static uint64_t tail_lo(const struct plx_vdi_record *rec)
{
    return rec->label_indexed <= rec->snap_count ? rec->label_indexed : 0;
}

static void lookup_index(struct plx_req *r);
static void fold_next(struct plx_req *r);
static void tail_read(struct plx_req *r);

static int fold_push(struct plx_snap_edit *e, uint64_t idx, const struct plx_snap_record *rec)
{
    if ((rec->flags & PLX_SNAP_DELETED) || !rec->label[0])
        return 0;
    if (e->nfold == e->capfold) {
        size_t cap = e->capfold ? 2 * e->capfold : 16;
        struct plx_label_entry *f = realloc(e->fold, cap * sizeof *f);
        if (!f)
            return -ENOMEM;
        e->fold = f;
        e->capfold = cap;
    }
    e->fold[e->nfold].index = idx;
    memcpy(e->fold[e->nfold].label, rec->label, PLX_LABEL_MAX);
    e->fold[e->nfold].label[PLX_LABEL_MAX] = 0;
    e->nfold++;
    return 0;
}

/* The tail records of b (which holds e->scan_hi), newest first: a lookup stops at a match, a
 * fold collects the labels. Then the next older block, or the next step. */
static void tail_block(struct plx_req *r, const struct plx_snaplog_block *b, uint64_t addr)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    uint64_t lo = tail_lo(&v->rec), hi = e->scan_hi;
    if (b->first_index > hi || b->first_index + PLX_SNAPLOG_PER_BLOCK - 1 < hi) {
        finish(r, plx_err(v->st, -EUCLEAN,
                          "snapshot log block %llu of VDI %s does not hold snapshot %llu",
                          (unsigned long long)addr, v->rec.name, (unsigned long long)hi));
        return;
    }
    for (uint64_t idx = hi; idx >= b->first_index && idx > lo; idx--) {
        const struct plx_snap_record *rec = &b->records[idx - b->first_index];
        if (e->kind == PLX_EDIT_FOLD) {
            if (fold_push(e, idx, rec)) {
                finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
                return;
            }
        } else if (idx != e->index && record_has(rec, e->label)) {
            e->taken = idx;
            e->after_lookup(r);
            return;
        }
    }
    e->scan_hi = b->first_index - 1;
    if (e->scan_hi <= lo) {
        if (e->kind == PLX_EDIT_FOLD)
            fold_next(r);
        else
            lookup_index(r);
        return;
    }
    read_log(r, b->prev, e->lb, tail_read);
}

static void tail_read(struct plx_req *r)
{
    tail_block(r, r->edit->lb, r->edit->read_addr);
}

/* Read the tail from the newest record down (the head block is in memory). */
static void scan_tail(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    e->scan_hi = v->rec.snap_count;
    e->steps = 0;
    if (e->scan_hi <= tail_lo(&v->rec)) {
        if (e->kind == PLX_EDIT_FOLD)
            fold_next(r);
        else
            lookup_index(r);
    } else if (v->log_head) {
        tail_block(r, v->log_head, v->rec.snaplog_head);
    } else {
        read_log(r, v->rec.snaplog_head, e->lb, tail_read);
    }
}

static void next_candidate(struct plx_req *r);

static void candidate_read(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    uint64_t c = e->cand[e->icand - 1], next = 0;
    int rc = plx_snaplog_find_step(r->v->st, &r->v->rec, c, e->lb, e->read_addr, &e->expect_first,
                                   &next);
    if (rc < 0) {
        finish(r, rc);
    } else if (rc == 0) {
        read_log(r, next, e->lb, candidate_read);
    } else if (record_has(&e->lb->records[c - e->lb->first_index], e->label)) {
        e->taken = c;
        e->after_lookup(r);
    } else {
        next_candidate(r);
    }
}

/* Check the index's entries for the label against their log records (through the skip links;
 * entries are hints, FORMAT.md §9.1). */
static void next_candidate(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    while (e->icand < e->ncand) {
        uint64_t c = e->cand[e->icand++];
        /* Entries after label_indexed are the tail's, read already. */
        if (c == e->index || c > v->rec.label_indexed || c > v->rec.snap_count)
            continue;
        if (v->log_head && c >= v->log_head->first_index) {
            if (record_has(&v->log_head->records[c - v->log_head->first_index], e->label)) {
                e->taken = c;
                break;
            }
            continue;
        }
        e->expect_first = 0;
        e->steps = 0;
        read_log(r, v->rec.snaplog_head, e->lb, candidate_read);
        return;
    }
    e->after_lookup(r);
}

static void index_looked_up(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    e->ncand = plx_lidx_txn_get(e->txn, e->label, e->cand, CANDIDATES);
    e->icand = 0;
    next_candidate(r);
}

static void lookup_index(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (!v->rec.label_index || !v->rec.label_indexed) {
        e->after_lookup(r);
        return;
    }
    int rc = txn_begin(r, v->rec.label_index);
    if (rc) {
        finish(r, rc);
        return;
    }
    e->after_path = index_looked_up;
    index_path(r);
}

/* Find a live snapshot other than e->index labelled e->label: e->taken, then after. */
static void lookup(struct plx_req *r, void (*after)(struct plx_req *r))
{
    struct plx_snap_edit *e = r->edit;
    e->after_lookup = after;
    e->taken = 0;
    scan_tail(r);
}

/* ---- Making index changes durable, then the record naming them --------------------------- */

static void record_written(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        /* The record on the medium is the old one or the new one; both are correct for the
         * log as it is (the log record is written only after this). */
        finish(r, plx_err(st, ev->status, "writing the record of VDI %s: %s", v->rec.name,
                          strerror(-ev->status)));
        return;
    }
    v->rec = e->next;
    e->after_record(r);
}

/* Write e->next as the VDI record (FUA), then run after. */
static void write_record(struct plx_req *r, void (*after)(struct plx_req *r))
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (!e->rec_buf)
        e->rec_buf = plx_block_alloc(1);
    if (!e->rec_buf) {
        finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
        return;
    }
    /* No snapshot writes the record meanwhile: none is in flight while an edit is. */
    e->after_record = after;
    e->next.seq++;
    plx_registry_seal(&e->next, v->slot_addr, e->rec_buf);
    submit(r, &e->ev, PLX_IO_WRITE, PLX_IO_FUA, v->slot_addr, e->rec_buf, record_written);
}

static void index_flushed(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    if (ev->status) {
        finish(r, plx_err(st, ev->status, "VDI %s: making the label index durable: %s",
                          r->v->rec.name, strerror(-ev->status)));
        return;
    }
    write_record(r, r->edit->after_record);
}

static void bitmaps_written(void *arg, int status)
{
    struct plx_req *r = arg;
    if (status) {
        finish(r, plx_err(r->v->st, status, "VDI %s: writing allocation bitmaps: %s",
                          r->v->rec.name, strerror(-status)));
        return;
    }
    submit(r, &r->edit->ev, PLX_IO_FLUSH, 0, 0, NULL, index_flushed);
}

static void node_written(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_snap_edit *e = r->edit;
    if (ev->status && !e->wstatus)
        e->wstatus = ev->status;
    if (--e->wpending)
        return;
    if (e->wstatus) {
        finish(r, plx_err(st, e->wstatus, "VDI %s: writing a label index node: %s", r->v->rec.name,
                          strerror(-e->wstatus)));
        return;
    }
    /* The nodes link only each other and old nodes; their claims must be durable too before
     * the record links them (FORMAT.md §10, claims before links). */
    int rc = plx_alloc_sync(st, plx_alloc_gen(st), bitmaps_written, r);
    if (rc) /* 1: written already (the callback does not fire); < 0: an error */
        bitmaps_written(r, rc < 0 ? rc : 0);
}

/* Write e->txn's changes to new blocks, make them durable, write the record naming the new
 * root with label_indexed = indexed (FUA), then run after. */
static void commit_index(struct plx_req *r, uint64_t indexed, void (*after)(struct plx_req *r))
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    e->next = v->rec;
    e->next.label_indexed = indexed;
    e->after_record = after;
    const struct plx_lidx_write *w = NULL;
    size_t n = 0;
    int rc = e->txn ? plx_lidx_prepare(e->txn, &e->next.label_index, &w, &n) : 0;
    if (rc) {
        finish(r, rc);
        return;
    }
    if (n == 0) {
        write_record(r, after); /* nothing new to link: the record alone */
        return;
    }
    e->wev = calloc(n, sizeof *e->wev);
    if (!e->wev) {
        finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
        return;
    }
    e->nwev = n;
    e->wpending = n;
    e->wstatus = 0;
    for (size_t i = 0; i < n; i++) {
        struct plx_ev *ev = &e->wev[i];
        ev->io.op = PLX_IO_WRITE;
        ev->io.block = w[i].addr;
        ev->io.nblocks = 1;
        ev->io.buf = (void *)w[i].block;
        ev->handler = node_written;
        ev->ctx = r;
        rc = plx_submit(v->st, ev);
        if (rc) {
            /* The writes already submitted complete into node_written, which finishes. */
            e->wstatus = rc;
            e->wpending -= n - i;
            if (e->wpending == 0)
                finish(r, plx_err(v->st, rc, "VDI %s: writing a label index node: %s", v->rec.name,
                                  strerror(-rc)));
            return;
        }
    }
}

/* ---- Folding the tail into the index ----------------------------------------------------- */

static void fold_done(struct plx_req *r)
{
    finish(r, 0);
}

static void fold_put(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    const struct plx_label_entry *f = &e->fold[e->ifold++];
    int rc = plx_lidx_put(e->txn, f->label, f->index); /* its path is loaded: no I/O */
    if (rc) {
        finish(r, rc);
        return;
    }
    fold_next(r);
}

static void fold_next(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    if (e->ifold == e->nfold) {
        commit_index(r, e->fold_to, fold_done);
        return;
    }
    snprintf(e->label, sizeof e->label, "%s", e->fold[e->ifold].label);
    e->after_path = fold_put;
    index_path(r);
}

static void fold_start(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (v->rec.label_indexed == v->rec.snap_count) {
        finish(r, 0);
        return;
    }
    e->fold_to = v->rec.snap_count;
    /* No index yet, or one that claims too much: build it anew from the whole log. */
    int rc = txn_begin(r, tail_lo(&v->rec) ? v->rec.label_index : 0);
    if (rc) {
        finish(r, rc);
        return;
    }
    scan_tail(r);
}

/* ---- Labelling and deleting a record ----------------------------------------------------- */

static void log_written(plx_store *st, struct plx_ev *ev)
{
    struct plx_req *r = ev->ctx;
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (ev->status) {
        /* The block on the medium holds the old record or the new one; the in-memory head
         * keeps the old, and the next snapshot writing the head block writes it again. */
        finish(r, plx_err(st, ev->status, "writing snapshot log block %llu of VDI %s: %s",
                          (unsigned long long)e->addr, v->rec.name, strerror(-ev->status)));
        return;
    }
    if (e->addr == v->rec.snaplog_head && v->log_head)
        memcpy(v->log_head, e->b, PLX_BLOCK_SIZE);
    if (e->kind == PLX_EDIT_DELETE && v->rec.snap_deleting == e->index)
        v->rec.snap_deleting = 0; /* the log says it now; the next record write clears it */
    finish(r, 0);
}

/* Write the changed log block, durable (FUA) when it completes. */
static void write_log_block(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    plx_blkhdr_seal(e->b, PLX_MAGIC_SNAPLOG, e->addr);
    submit(r, &e->ev, PLX_IO_WRITE, PLX_IO_FUA, e->addr, e->b, log_written);
}

/* The index must name the new label before the log record carries it (FORMAT.md §9.1). */
static void label_put(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    int rc = plx_lidx_put(e->txn, e->label, e->index); /* its path is loaded: no I/O */
    if (rc) {
        finish(r, rc);
        return;
    }
    commit_index(r, r->v->rec.label_indexed, write_log_block);
}

static void label_looked_up(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    if (e->taken) {
        finish(r, plx_err(v->st, -EEXIST, "VDI %s already has a snapshot labelled '%s' (@%llu)",
                          v->rec.name, e->label, (unsigned long long)e->taken));
        return;
    }
    struct plx_snap_record *rec = &e->b->records[e->index - e->b->first_index];
    memset(rec->label, 0, sizeof rec->label);
    memcpy(rec->label, e->label, strlen(e->label));
    if (e->index > v->rec.label_indexed) {
        write_log_block(r); /* in the tail: readers read the record itself */
        return;
    }
    /* The lookup loaded the label's path when there is an index; load it (or nothing) now. */
    int rc = txn_begin(r, v->rec.label_index);
    if (rc) {
        finish(r, rc);
        return;
    }
    e->after_path = label_put;
    index_path(r);
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
        if (e->label[0]) {
            lookup(r, label_looked_up);
            return;
        }
        /* Removing a label only writes the log: an index entry is a hint. */
        memset(rec->label, 0, sizeof rec->label);
    } else {
        /* The record stays (indexes are positions in the log); only its root stops being one. */
        rec->flags |= PLX_SNAP_DELETED;
        if (v->rec.flags & PLX_VDI_SNAPS_COUNTED) {
            /* The VDI record counts it first and names it (FORMAT.md §7): a crash before the
             * log block lands leaves snap_deleting, which readers check against the log. */
            e->next = v->rec;
            e->next.snap_deleted++;
            e->next.snap_deleting = e->index;
            write_record(r, write_log_block);
            return;
        }
    }
    write_log_block(r);
}

static void find_block_read(struct plx_req *r)
{
    struct plx_snap_edit *e = r->edit;
    uint64_t next = 0;
    e->addr = e->read_addr;
    int rc = plx_snaplog_find_step(r->v->st, &r->v->rec, e->index, e->b, e->addr, &e->expect_first,
                                   &next);
    if (rc < 0)
        finish(r, rc);
    else if (rc == 1)
        change_record(r);
    else
        read_log(r, next, e->b, find_block_read);
}

static void find_record(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
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
    read_log(r, v->rec.snaplog_head, e->b, find_block_read);
}

/* ---- Checking a new snapshot's label ----------------------------------------------------- */

static void check_looked_up(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    int rc = 0;
    if (e->taken)
        rc = plx_err(v->st, -EEXIST, "VDI %s already has a snapshot labelled '%s'", v->rec.name,
                     e->label);
    if (rc && !e->snap->status)
        e->snap->status = rc;
    finish(r, 0);
}

/* Carry out r (the pipeline calls it through r->edit_start once no snapshot or other edit is
 * ahead of it); finishes it with plx_req_finish. */
static void edit_start(struct plx_req *r)
{
    struct plx_vdi *v = r->v;
    struct plx_snap_edit *e = r->edit;
    /* Every snapshot before this edit is on the medium: the medium answers from here. */
    plx_labels_clear(&v->labels);
    e->b = plx_block_alloc(1);
    e->lb = plx_block_alloc(1);
    e->nb = plx_block_alloc(1);
    if (!e->b || !e->lb || !e->nb) {
        finish(r, plx_err(v->st, -ENOMEM, "out of memory"));
        return;
    }
    switch (e->kind) {
    case PLX_EDIT_CHECK_LABEL:
        lookup(r, check_looked_up);
        return;
    case PLX_EDIT_FOLD:
        fold_start(r);
        return;
    case PLX_EDIT_LABEL:
    case PLX_EDIT_DELETE:
        find_record(r);
        return;
    }
}
