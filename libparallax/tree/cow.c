/*
 * cow.c - copy-on-write of a VDI's radix tree (cow.h): the writable path to a block, new nodes
 * and their links, the batch's list of changed nodes, and how many blocks a request's path
 * will take (for a claim ahead of it). In memory, synchronous: the nodes are in the cache
 * already, and batch.c's batches write what changed.
 */
#include <errno.h>
#include <stdlib.h>
#include "cow.h"
#include "pipeline.h"

int plx_cow_changed(struct plx_batch *b, struct plx_node *n)
{
    b->v->meta_seq = b->seq;
    if (n->dirty_batch == b->seq)
        return 0;
    if (b->nnodes == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        struct plx_node **nn = realloc(b->nodes, cap * sizeof *nn);
        if (!nn)
            return -ENOMEM;
        b->nodes = nn;
        b->cap = cap;
    }
    b->nodes[b->nnodes++] = n;
    n->dirty_batch = b->seq;
    plx_cache_pin(n);
    return 0;
}

/* Make the child behind links[idx] of n writable: follow a writable link, or give it a new node
 * (a read-only copy or an empty one). */
static struct plx_node *shadow_child(struct plx_vdi *v, struct plx_batch *b, struct plx_node *n,
                                     unsigned idx, int *err)
{
    plx_store *st = v->st;
    uint64_t link = n->links[idx];
    if (link && !plx_link_ro(link)) {
        struct plx_node *c = plx_cache_lookup(st, plx_link_addr(link));
        if (!c || c->state != NODE_VALID)
            *err = plx_err(st, -EAGAIN, "node %llu left the cache during a write",
                           (unsigned long long)plx_link_addr(link));
        return c;
    }
    const struct plx_node *src = NULL;
    if (link) {
        src = plx_cache_lookup(st, plx_link_addr(link));
        if (!src || src->state != NODE_VALID) {
            *err = -EAGAIN;
            return NULL;
        }
    }
    uint64_t addr;
    int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &addr);
    if (rc < 0) {
        *err = rc;
        return NULL;
    }
    struct plx_node *c = plx_cache_new(st, addr, n->level - 1, v->owner, err);
    if (!c)
        return NULL;
    if (src)
        for (unsigned i = 0; i < PLX_RADIX_FANOUT; i++)
            c->links[i] = src->links[i] ? (src->links[i] | PLX_LINK_RO) : 0;
    c->new_batch = b->seq;
    n->links[idx] = addr;
    if ((*err = plx_cow_changed(b, n)) == 0)
        *err = plx_cow_changed(b, c);
    return c;
}

struct plx_node *plx_cow_path(struct plx_vdi *v, struct plx_batch *b, uint64_t vb, bool unmap,
                              int *err)
{
    struct plx_node *n = v->root;
    for (unsigned level = v->height - 1; level > 0 && !*err; level--) {
        unsigned idx = plx_index_at(vb, level);
        if (unmap && !n->links[idx]) {
            n = NULL; /* already sparse: nothing to unmap */
            break;
        }
        n = shadow_child(v, b, n, idx, err);
    }
    return n;
}

/* The blocks a write or trim will allocate (do_mutate, shadow_child): a new node for every node
 * on its paths reached through a read-only or sparse link (and every node below one), a data
 * block for every block whose link is not writable. Every node on the paths is cached (the
 * request resolved them); one that is not counts as new, which only overstates. An in-place
 * overwrite needs nothing, so it never waits for a claim. */
void plx_cow_need(const struct plx_vdi *v, const struct plx_req *r, uint64_t *meta, uint64_t *data)
{
    uint64_t last[8]; /* per level: the last node counted (heights are 3 or 4) */
    for (unsigned l = 0; l < 8; l++)
        last[l] = UINT64_MAX;
    *meta = *data = 0;
    uint64_t first_edge = r->head_partial ? r->b0 : UINT64_MAX;
    uint64_t last_edge = r->tail_partial ? r->b1 - 1 : UINT64_MAX;
    for (uint64_t vb = r->b0; vb < r->b1; vb++) {
        /* A trim unmaps whole blocks: nothing below a sparse link, no data block. */
        bool unmap = r->op == REQ_TRIM && vb != first_edge && vb != last_edge;
        /* n: the node as it is (copied from, when fresh); fresh: the node on the path at this
         * level will be a new one (a copy, or an empty node), and so will all below it. */
        const struct plx_node *n = v->root;
        bool fresh = false, stop = false;
        for (unsigned level = v->height - 1; level > 0 && !stop; level--) {
            uint64_t link = n ? n->links[plx_index_at(vb, level)] : 0;
            if (unmap && !link && (n || !fresh)) {
                stop = true; /* sparse: nothing to unmap below */
                break;
            }
            if (!fresh && link && !plx_link_ro(link)) {
                n = plx_cache_lookup(v->st, plx_link_addr(link));
                if (n && n->state == NODE_VALID)
                    continue;
            }
            fresh = true;
            n = link ? plx_cache_lookup(v->st, plx_link_addr(link)) : NULL;
            if (n && n->state != NODE_VALID)
                n = NULL; /* not cached: every link below counts as present (overstates) */
            uint64_t at = vb >> (PLX_RADIX_BITS * level); /* the child's index at its level */
            if (last[level - 1] != at) {
                last[level - 1] = at;
                (*meta)++;
            }
        }
        if (stop || unmap)
            continue;
        uint64_t link = n && !fresh ? n->links[plx_index_at(vb, 0)] : 0;
        if (!link || plx_link_ro(link))
            (*data)++;
    }
}
