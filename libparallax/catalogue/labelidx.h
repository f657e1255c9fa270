/*
 * labelidx.h - the on-disk label index of a VDI: a hash trie from snapshot label to snapshot
 * index, written copy on write (labelidx.c; layer 3, below the snapshot log that uses it).
 *
 * An entry is a hint: "snapshot I had label L when this was written". A reader checks it against
 * the log record before believing it, so an entry left behind by a relabel, a deletion or a crash
 * is harmless. What must never happen is a missing entry, so a label is put into the index (and
 * made durable) before the log record that carries it (snaplog.c, "labels").
 */
#ifndef PLX_LABELIDX_H
#define PLX_LABELIDX_H

#include "engine.h"

/* The 64-bit hash that places a label in the trie (FNV-1a of its bytes). */
uint64_t plx_lidx_hash(const char *label);

/* Up to `max` snapshot indexes the index at `root` holds for `label` (stale ones included), in
 * *n; reads one node per level. -EUCLEAN (with a message) for a corrupt node. */
int plx_lidx_get(plx_store *st, uint64_t vdi_id, uint64_t root, const char *label, uint64_t *idx,
                 size_t max, size_t *n);

/* A set of changes to an index, applied in memory and written as new blocks by commit. */
struct plx_lidx_txn;
int plx_lidx_begin(plx_store *st, uint64_t vdi_id, uint64_t root, struct plx_lidx_txn **out);
/* Make `label` name snapshot `index`: entries for the same label are dropped (labels are unique
 * among live snapshots, so they are stale). */
int plx_lidx_put(struct plx_lidx_txn *t, const char *label, uint64_t index);
/* Write every changed node to a newly allocated block, claims included, and flush: the new root
 * in *root (the old one if nothing changed). Nothing reachable changes until the caller writes
 * the VDI record naming the new root. Frees the txn. Blocking. */
int plx_lidx_commit(struct plx_lidx_txn *t, uint64_t *root);

/* The same without blocking, for the writer's service loop (snap_edit.c). A txn reads nothing
 * by itself there: before put or get of a label, the caller asks which node of the label's path
 * is missing (plx_lidx_need: 1 with its address; 0 once the path is loaded, or there is none),
 * reads it, hands it over (plx_lidx_supply checks it: -EUCLEAN with a message if it is not a
 * sound node), and asks again. */
int plx_lidx_need(struct plx_lidx_txn *t, const char *label, uint64_t *addr, unsigned *level);
int plx_lidx_supply(struct plx_lidx_txn *t, const struct plx_lidx_block *b);
/* Up to max snapshot indexes t holds for label (its path loaded; stale ones included). */
size_t plx_lidx_txn_get(const struct plx_lidx_txn *t, const char *label, uint64_t *idx, size_t max);
/* Give every changed node a newly allocated block and seal it: the blocks to write in *w (n of
 * them, owned by t) and the new root. The caller writes them, makes them and the allocator's
 * bitmaps durable (plx_alloc_sync, then a flush), then writes the VDI record naming the root,
 * and frees t with plx_lidx_abort. */
struct plx_lidx_write {
    uint64_t addr;
    const struct plx_lidx_block *block;
};
int plx_lidx_prepare(struct plx_lidx_txn *t, uint64_t *root, const struct plx_lidx_write **w,
                     size_t *n);
void plx_lidx_abort(struct plx_lidx_txn *t);

/* Visit every node of the index at `root`, parents before children: cb(arg, addr, node, parent,
 * path) with parent = 0 for the root and path = the hash bytes that lead to the node (byte L =
 * the slot taken at level L): every label in a leaf at level L has those L low bytes. A node
 * that fails to read or verify gets cb with node = NULL and why set (nothing below it is
 * visited). A nonzero return of cb stops the walk and is returned. */
typedef int (*plx_lidx_visit_fn)(void *arg, uint64_t addr, const struct plx_lidx_block *node,
                                 uint64_t parent, uint64_t path, const char *why);
int plx_lidx_walk(plx_store *st, uint64_t vdi_id, uint64_t root, plx_lidx_visit_fn cb, void *arg);

/* "" or why the block read from `addr` at depth `level` is not a valid node of vdi_id's index. */
const char *plx_lidx_node_problem(const plx_store *st, const struct plx_lidx_block *b,
                                  uint64_t addr, uint64_t vdi_id, unsigned level);

#endif
