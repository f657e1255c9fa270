/*
 * radix.c - walking a VDI's radix tree (radix.h): the index of a block at each level, the walk to
 * a block's leaf through the node cache, and block status. Read-only: making a path writable is
 * cow.c's; ordering the walks of requests is pipeline.c's.
 */
#include "radix.h"
#include "pipeline.h"

unsigned plx_index_at(uint64_t vblock, unsigned level)
{
    return (unsigned)(vblock >> (level * PLX_RADIX_BITS)) & (PLX_RADIX_FANOUT - 1);
}

/* Walk to the leaf for vblock, loading what is missing. Returns the leaf node (NULL when the
 * path is sparse above the leaf or something is being loaded; *loading tells which). */
struct plx_node *plx_radix_walk(struct plx_vdi *v, struct plx_req *r, uint64_t vb, bool *loading)
{
    plx_store *st = v->st;
    struct plx_node *n = v->root;
    for (unsigned level = v->height - 1; level > 0; level--) {
        uint64_t link = n->links[plx_index_at(vb, level)];
        if (!link)
            return NULL;
        int err;
        struct plx_node *child = plx_cache_get(st, plx_link_addr(link), level - 1,
                                               plx_child_owner(n, link), &r->loads, &err);
        if (err && !r->status)
            r->status = err;
        if (!child) {
            *loading = true;
            return NULL;
        }
        n = child;
    }
    return n;
}

/* Is vblock mapped? Loads missing nodes for r (returns false, *loading set, while one is being
 * read). *span receives how many blocks from vb certainly share the answer. */
bool plx_radix_status_at(struct plx_vdi *v, struct plx_req *r, uint64_t vb, int *mapped,
                         uint64_t *span, bool *loading)
{
    struct plx_node *n = v->root;
    for (unsigned level = v->height - 1;; level--) {
        uint64_t link = n->links[plx_index_at(vb, level)];
        uint64_t sub = 1ull << (level * PLX_RADIX_BITS); /* blocks under one link */
        if (!link) {
            *mapped = 0;
            *span = sub - (vb & (sub - 1));
            return true;
        }
        if (level == 0) {
            *mapped = 1;
            *span = 1;
            return true;
        }
        int err;
        n = plx_cache_get(v->st, plx_link_addr(link), level - 1, plx_child_owner(n, link),
                          &r->loads, &err);
        if (err && !r->status)
            r->status = err;
        if (!n) {
            *loading = true;
            return false;
        }
    }
}
