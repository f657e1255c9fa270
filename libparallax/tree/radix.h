/*
 * radix.h - walking a VDI's radix tree: the index of a block in a node of each level, the walk
 * from the root to a block's leaf, and whether a block is mapped (layer 5, below cow.c and
 * pipeline.c; radix.c). Missing nodes are loaded through the node cache (cache.h) on behalf of a
 * request, which waits for them on its plx_load_wait; nothing here writes.
 */
#ifndef PLX_RADIX_H
#define PLX_RADIX_H

#include <stdbool.h>
#include <stdint.h>

struct plx_vdi;
struct plx_req;
struct plx_node;

/* The slot of a node of `level` (0: leaf) that the path to vblock goes through. */
unsigned plx_index_at(uint64_t vblock, unsigned level);
/* Walk to the leaf for vblock, loading what is missing for r. Returns the leaf node (NULL when the
 * path is sparse above the leaf or something is being loaded; *loading tells which). */
struct plx_node *plx_radix_walk(struct plx_vdi *v, struct plx_req *r, uint64_t vb, bool *loading);
/* Is vblock mapped? Loads missing nodes for r (returns false, *loading set, while one is being
 * read). *span receives how many blocks from vb certainly share the answer. */
bool plx_radix_status_at(struct plx_vdi *v, struct plx_req *r, uint64_t vb, int *mapped,
                         uint64_t *span, bool *loading);

#endif
