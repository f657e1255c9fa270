/*
 * tree.h - drawing the VDI/snapshot forest (figure 3.4 of the Parallax thesis).
 *
 * Roots are VDIs that are not clones; each VDI is followed by its snapshots in log order, and a
 * clone hangs under the snapshot it was made from. A clone whose source snapshot is gone
 * (deleted, or its VDI deleted) is drawn as a root with a note, so no live VDI goes missing.
 *
 * The renderers only read the arrays that plx_vdi_list() and plx_snap_list() return, so they can
 * be exercised without a blockstore.
 */
#ifndef PLX_TOOLS_TREE_H
#define PLX_TOOLS_TREE_H

#include <stddef.h>
#include <stdio.h>

#include "parallax.h"

struct tree_forest {
    const struct plx_vdi_info *vdis; /* as from plx_vdi_list(), deleted ones included */
    size_t vdi_count;
    /* snaps[i] and snap_counts[i]: the log of vdis[i] from plx_snap_list(); may be NULL/0 for
     * deleted VDIs, which are not drawn. */
    struct plx_snap_info *const *snaps;
    const size_t *snap_counts;
};

/* Indented text with tree(1)-style box-drawing characters. Returns 0 or -ENOMEM. */
int tree_print_text(FILE *out, const struct tree_forest *f);
/* A Graphviz digraph: VDIs are boxes, snapshots ellipses; edges go from a VDI to each of its
 * snapshots in order and from a snapshot to each clone made from it. Returns 0 or -ENOMEM. */
int tree_print_dot(FILE *out, const struct tree_forest *f);

#endif
