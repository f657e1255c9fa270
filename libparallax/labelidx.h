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
 * the VDI record naming the new root. Frees the txn. */
int plx_lidx_commit(struct plx_lidx_txn *t, uint64_t *root);
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
