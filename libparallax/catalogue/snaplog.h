/*
 * snaplog.h - snapshot logs: read, resolve "VDI@N" and "VDI@LABEL", labels (layer 4, above the
 * registry; snaplog.c).
 */
#ifndef PLX_SNAPLOG_H
#define PLX_SNAPLOG_H

#include "engine.h"

/* Read the log chain of a VDI: records 1..snap_count (newer records are an incomplete snapshot
 * and are ignored). *out malloc'd. */
int plx_snaplog_read(plx_store *st, const struct plx_vdi_record *rec, struct plx_snap_info **out,
                     size_t *count, uint64_t **blocks);
/* Read log block addr of the VDI of `rec` (its id checked, its name in messages, as check names
 * VDIs). */
int plx_snaplog_read_block(plx_store *st, uint64_t addr, const struct plx_vdi_record *rec,
                           struct plx_snaplog_block *out);
/* Is `b`, read from addr, a sound log block of the VDI of rec? 0 or -EUCLEAN with a message (the
 * checks of plx_snaplog_read_block after its read, for callers that read asynchronously). */
int plx_snaplog_check_block(plx_store *st, uint64_t addr, const struct plx_vdi_record *rec,
                            const struct plx_snaplog_block *b);
/* The block of rec's log that holds snapshot `index` (1..snap_count), reached by skip links in
 * O(log n) block reads; read into *b, its address in *addr. */
int plx_snaplog_find(plx_store *st, const struct plx_vdi_record *rec, uint64_t index,
                     struct plx_snaplog_block *b, uint64_t *addr);
/* One step of that walk, for callers that read the blocks themselves: b was read from addr,
 * reached with *expect_first (0 at the head). 1 when b holds index; 0 when the walk goes on at
 * *next (and *expect_first is updated); or an error. */
int plx_snaplog_find_step(plx_store *st, const struct plx_vdi_record *rec, uint64_t index,
                          const struct plx_snaplog_block *b, uint64_t addr, uint64_t *expect_first,
                          uint64_t *next);
/* The newest complete record in the head block image `head` of a log counting snap_count
 * snapshots, or NULL. */
const struct plx_snap_record *plx_snaplog_newest(const struct plx_snaplog_block *head,
                                                 uint64_t snap_count);

/* The skip path of a writer's log: the newest block, the block its skip link names, and so on
 * down to block 0, newest first. Appending a block needs nothing else (a skew-binary counter),
 * so a writer keeps it in memory. Its length is at most about 2 log2(blocks). */
#define PLX_SPINE_MAX 132u
struct plx_snaplog_spine {
    unsigned n; /* 0: no log yet */
    struct {
        uint64_t addr, first;
    } e[PLX_SPINE_MAX];
};
/* Build the spine of rec's log from its head, O(log n) reads. A log written without skip links
 * (by an older Parallax) is linked first: every block is rewritten in place with its skip link,
 * then flushed (the one-time upgrade; a crash part way leaves a valid, partly linked log). */
int plx_snaplog_spine_load(plx_store *st, const struct plx_vdi_record *rec,
                           struct plx_snaplog_spine *sp);
/* Give a new head block `b` (first_index set) at `addr` its skip link, and push it. */
void plx_snaplog_spine_push(struct plx_snaplog_spine *sp, struct plx_snaplog_block *b,
                            uint64_t addr);

/* ---- Labels (labels.c) ----------------------------------------------------------------------
 * A label is found through the VDI's label index (labelidx.c), which covers snapshots
 * 1..label_indexed, and by reading the log records after that (the "tail"). Writers fold the
 * tail into the index at open, at close and every PLX_LABELS_FOLD_TAIL snapshots (in the
 * request stream when snapshots are in flight, snap_edit.c), so the tail stays a few log
 * blocks long and a lookup reads O(log n) blocks. */
#define PLX_LABELS_FOLD_TAIL (2u * PLX_SNAPLOG_PER_BLOCK)

/* 1 and *index if a live snapshot of the log rec describes is labelled `label`, 0 if none, or a
 * negative errno. With b (may be NULL): on 1, *b is the log block holding it, *b_addr its
 * address. */
int plx_label_find(plx_store *st, const struct plx_vdi_record *rec, const char *label,
                   uint64_t *index, struct plx_snaplog_block *b, uint64_t *b_addr);

/* A writer's labels of snapshots taken since its last snapshot edit (snaplog.c), for uniqueness
 * while their records are in flight. Everything older is on the medium: a labelled snapshot is
 * preceded in the stream by an edit that looks its label up there (snap_edit.c: the label index
 * and the log's tail, O(log n) reads), and every edit starts by emptying this set. So it holds
 * about one entry. An entry wins over the record it names ("" = no live label). */
struct plx_label_entry {
    uint64_t index;
    char label[PLX_LABEL_MAX + 1];
};
struct plx_label_set {
    bool fold_queued; /* an asynchronous fold of the log's tail is in the stream (vdi.c) */
    size_t n, cap;
    struct plx_label_entry *e;
};
void plx_labels_init(struct plx_label_set *ls, const struct plx_vdi_record *rec);
void plx_labels_free(struct plx_label_set *ls);
/* Forget every entry: what they said is on the medium now. */
void plx_labels_clear(struct plx_label_set *ls);
/* Record that snapshot `index` now has `label` ("" = none or deleted). */
int plx_labels_set(struct plx_label_set *ls, uint64_t index, const char *label);
/* 1 if an entry other than except_index has `label`, else 0. No I/O: the medium is asked by the
 * edit ahead of the snapshot (st and rec are not used). */
int plx_labels_taken(plx_store *st, const struct plx_vdi_record *rec, struct plx_label_set *ls,
                     const char *label, uint64_t except_index);
/* Snapshot `index` of the VDI whose record is *rec (in slot slot_addr) is about to get `label`
 * while no writer holds the VDI (the caller holds the admin lock): if the index covers that
 * snapshot, put the label into it and write the record naming the new index (durable on
 * return), before the caller writes the log record. The VDI's own writer does the same without
 * blocking (snap_edit.c). */
int plx_labels_note(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec,
                    uint64_t index, const char *label);
/* Fold the tail of rec's log into its label index (building the index on a store written before
 * it existed) and write the record naming it. The caller holds the VDI lock with no snapshot in
 * flight; nothing is written if the tail is shorter than min_tail. */
int plx_labels_fold(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec,
                    uint64_t min_tail);

/* ---- Counting (snapiter.c) ---------------------------------------------------------------------
 * The live snapshots of rec: snap_count - snap_deleted from the record (FORMAT.md §7), plus one
 * when the log record of a counted deletion (snap_deleting) does not say deleted yet (the skip
 * path to it); a record that does not count them yet (written before the count existed) has
 * its log read whole. */
int plx_snaplog_count_live(plx_store *st, const struct plx_vdi_record *rec, uint64_t *live);
/* A writable open of a record that does not count its deleted snapshots yet counts them (the
 * log read whole, once) and writes the record with the count (flushed). 0 at once otherwise. */
int plx_snaplog_count_write(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec);

/* ---- Snapshots named by the user (snap_admin.c) ---------------------------------------------- */
/* Parse "VDI@N" or "VDI@LABEL" (O(log n) log and index reads). */
int plx_snap_resolve(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                     uint64_t *slot_addr, struct plx_snap_info *snap, uint64_t *log_block);
/* Is `label` acceptable as a snapshot label (length, characters)? 0 or -EINVAL with a message. */
int plx_label_check(plx_store *st, const char *label);

#endif
