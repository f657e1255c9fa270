/*
 * cow.h - copy-on-write of a VDI's radix tree: making the path to a block writable (a read-only
 * or sparse link on it gets a new node, a copy of the read-only one with every link read-only),
 * and recording each node changed in the batch that commits it (layer 5, below pipeline.c, above
 * radix.c; cow.c). Changes are in memory only: batch.c's batches write them.
 */
#ifndef PLX_COW_H
#define PLX_COW_H

#include <stdbool.h>
#include <stdint.h>

struct plx_vdi;
struct plx_batch;
struct plx_node;
struct plx_req;

/* Node n changed in batch b: b writes it when it commits (pinned in the cache until then). */
int plx_cow_changed(struct plx_batch *b, struct plx_node *n);
/* Make the path from v's root to vblock's leaf writable in batch b and return the leaf. With
 * unmap (a trim), a sparse link ends the walk: NULL, nothing to unmap. On an error *err is set
 * and the walk stops (what it made writable so far stays, in b). Every node on the path must be
 * in the cache (pipeline.c loads them first, plx_radix_walk). */
struct plx_node *plx_cow_path(struct plx_vdi *v, struct plx_batch *b, uint64_t vb, bool unmap,
                              int *err);
/* The blocks write or trim r will allocate, at most (plx_cow_path's new nodes in *meta, data
 * blocks in *data), for a claim before it mutates on a serving loop (pipeline.c). */
void plx_cow_need(const struct plx_vdi *v, const struct plx_req *r, uint64_t *meta, uint64_t *data);

#endif
