/*
 * labels.c - snapshot labels: finding VDI@LABEL, keeping labels unique, and keeping the label
 * index (labelidx.c) in step with the log (FORMAT.md §9.1).
 *
 * The index covers snapshots 1..label_indexed of the VDI record; the records after that (the
 * tail) are read from the log. An index entry is only a hint, checked against the log record
 * it names, so entries left by relabels, deletions or crashes are harmless; a label is always
 * put into the index before the record that carries it is written (plx_labels_note), so the
 * index never lacks a live label of a snapshot it covers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "labelidx.h"
#include "lock.h"
#include "registry.h"
#include "snaplog.h"

#define CANDIDATES 16u /* index entries for one label: the live one and a few stale ones */

static bool record_has(const struct plx_snap_record *r, const char *label)
{
    return !(r->flags & PLX_SNAP_DELETED) && strncmp(r->label, label, PLX_LABEL_MAX) == 0;
}

/* Visit the tail records (label_indexed, snap_count], newest first; stop when fn returns
 * nonzero (and return that). */
static int tail_each(plx_store *st, const struct plx_vdi_record *rec, struct plx_snaplog_block *b,
                     uint64_t *b_addr,
                     int (*fn)(void *arg, uint64_t idx, const struct plx_snap_record *r), void *arg)
{
    uint64_t lo = rec->label_indexed < rec->snap_count ? rec->label_indexed : rec->snap_count;
    uint64_t hi = rec->snap_count, addr = rec->snaplog_head, steps = 0;
    while (hi > lo) {
        if (addr == 0 || ++steps > rec->snap_count + 1)
            return plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before snapshot %llu",
                           rec->name, (unsigned long long)hi);
        int rc = plx_snaplog_read_block(st, addr, rec, b);
        if (rc)
            return rc;
        *b_addr = addr;
        if (b->first_index > hi || b->first_index + b->count - 1 < hi)
            return plx_err(st, -EUCLEAN,
                           "snapshot log block %llu of VDI %s does not hold "
                           "snapshot %llu",
                           (unsigned long long)addr, rec->name, (unsigned long long)hi);
        for (uint64_t idx = hi; idx >= b->first_index && idx > lo; idx--) {
            rc = fn(arg, idx, &b->records[idx - b->first_index]);
            if (rc)
                return rc;
        }
        hi = b->first_index - 1;
        addr = b->prev;
    }
    return 0;
}

struct find_ctx {
    const char *label;
    uint64_t found;
};

static int find_in_tail(void *arg, uint64_t idx, const struct plx_snap_record *r)
{
    struct find_ctx *f = arg;
    if (!record_has(r, f->label))
        return 0;
    f->found = idx;
    return 1;
}

int plx_label_find(plx_store *st, const struct plx_vdi_record *rec, const char *label,
                   uint64_t *index, struct plx_snaplog_block *b, uint64_t *b_addr)
{
    if (!*label || strlen(label) > PLX_LABEL_MAX)
        return 0;
    struct plx_snaplog_block *own = b ? NULL : plx_block_alloc(1);
    if (!b && !own)
        return plx_err(st, -ENOMEM, "out of memory");
    if (!b)
        b = own;
    uint64_t addr = 0;
    struct find_ctx f = {.label = label};
    int rc = tail_each(st, rec, b, &addr, find_in_tail, &f);
    if (rc == 0 && rec->label_index) {
        uint64_t cand[CANDIDATES];
        size_t n = 0;
        rc = plx_lidx_get(st, rec->id, rec->label_index, label, cand, CANDIDATES, &n);
        for (size_t i = 0; i < n && rc == 0; i++) {
            /* Candidates after label_indexed were seen in the tail already. */
            if (cand[i] > rec->label_indexed || cand[i] > rec->snap_count)
                continue;
            rc = plx_snaplog_find(st, rec, cand[i], b, &addr);
            if (rc == 0 && record_has(&b->records[cand[i] - b->first_index], label)) {
                f.found = cand[i];
                rc = 1;
            }
        }
    }
    plx_block_free(own);
    if (rc < 0)
        return rc;
    if (f.found) {
        *index = f.found;
        if (b_addr)
            *b_addr = addr;
    }
    return f.found ? 1 : 0;
}

/* ---- Keeping the index in step ------------------------------------------------------------- */

/* Write rec naming `root` as its index covering 1..indexed, and flush. */
static int record_switch(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec,
                         uint64_t root, uint64_t indexed)
{
    struct plx_vdi_record next = *rec;
    next.label_index = root;
    next.label_indexed = indexed;
    int rc = plx_registry_write(st, slot_addr, &next);
    if (!rc) {
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "VDI %s: flushing its record: %s", rec->name, strerror(-rc));
    }
    if (rc)
        return rc;
    next.seq++;
    *rec = next;
    return 0;
}

int plx_labels_note(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec,
                    uint64_t index, const char *label)
{
    if (!*label || index > rec->label_indexed)
        return 0; /* in the tail: readers see the record itself */
    struct plx_lidx_txn *t;
    int rc = plx_lidx_begin(st, rec->id, rec->label_index, &t);
    if (rc)
        return rc;
    rc = plx_lidx_put(t, label, index);
    uint64_t root = 0;
    if (rc)
        plx_lidx_abort(t);
    else
        rc = plx_lidx_commit(t, &root);
    if (!rc)
        rc = record_switch(st, slot_addr, rec, root, rec->label_indexed);
    return rc;
}

struct fold_ctx {
    struct plx_lidx_txn *t;
    uint64_t labels;
};

static int fold_one(void *arg, uint64_t idx, const struct plx_snap_record *r)
{
    struct fold_ctx *f = arg;
    if ((r->flags & PLX_SNAP_DELETED) || !r->label[0])
        return 0;
    char label[PLX_LABEL_MAX + 1];
    memcpy(label, r->label, PLX_LABEL_MAX);
    label[PLX_LABEL_MAX] = 0;
    f->labels++;
    return plx_lidx_put(f->t, label, idx);
}

int plx_labels_fold(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec,
                    uint64_t min_tail)
{
    uint64_t indexed = rec->label_indexed < rec->snap_count ? rec->label_indexed : 0;
    uint64_t tail = rec->snap_count - indexed;
    if (rec->label_indexed == rec->snap_count || tail < min_tail || tail == 0)
        return 0;
    struct plx_vdi_record from = *rec;
    from.label_indexed = indexed;
    if (!indexed)
        from.label_index = 0; /* no index yet, or one that claims too much: build it anew */
    struct fold_ctx f = {0};
    int rc = plx_lidx_begin(st, rec->id, from.label_index, &f.t);
    if (rc)
        return rc;
    struct plx_snaplog_block *b = plx_block_alloc(1);
    uint64_t addr;
    rc = b ? tail_each(st, &from, b, &addr, fold_one, &f) : plx_err(st, -ENOMEM, "out of memory");
    plx_block_free(b);
    uint64_t root = 0;
    if (rc)
        plx_lidx_abort(f.t);
    else
        rc = plx_lidx_commit(f.t, &root);
    if (!rc)
        rc = record_switch(st, slot_addr, rec, root, rec->snap_count);
    return rc;
}
