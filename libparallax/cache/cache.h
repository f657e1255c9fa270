/*
 * cache.h - the radix node cache (layer 3; cache.c).
 */
#ifndef PLX_CACHE_H
#define PLX_CACHE_H

#include "engine.h"

enum plx_node_state { NODE_LOADING, NODE_VALID };

/* Someone waiting for node loads (a request): each load it waits for counts in `pending`; a
 * failed load stores its error in *status (if still 0); when pending drops to 0, ready() runs
 * (from the service loop, never inside plx_cache_get). */
struct plx_load_wait {
    unsigned pending;
    int *status;
    void (*ready)(struct plx_load_wait *w);
};

struct plx_waiter {
    struct plx_load_wait *w;
    struct plx_waiter *next;
};

/* Who may have changed a cached node in place. A node reached through a read-only link or from a
 * snapshot root is immutable and has no owner (NULL). A node reached from a live VDI's root
 * through writable links belongs to that VDI, whose writer changes it in place; the cached copy
 * is only as good as what this process knows of that VDI's writers. So such nodes point at one
 * owner record per VDI and writer generation (the VDI record's writer_gen): while some handle
 * of the VDI that trusts the record is open here, the nodes are current; once none is, they are
 * dormant, and a later handle adopts them only if no other writer has taken the VDI since
 * (writer_gen unchanged). Any other path that meets a dormant node reads it again. */
struct plx_owner {
    uint64_t vdi_id;
    uint64_t gen;               /* writer_gen the nodes reflect; PLX_GEN_NEVER: trusted by no one */
    unsigned handles;           /* open VDI handles trusting these nodes */
    struct plx_owner *next;     /* store's list */
};
#define PLX_GEN_NEVER UINT64_MAX

struct plx_node {
    uint64_t addr;
    uint64_t *links;            /* PLX_RADIX_FANOUT entries, block-aligned */
    struct plx_node *hash_next;
    struct plx_node *clock_next, *clock_prev;
    enum plx_node_state state;
    unsigned level;             /* 0 = leaf (links to data) */
    unsigned chances;           /* CLOCK credit: higher levels earn more */
    unsigned pins;              /* roots, nodes being loaded or written, dirty nodes */
    uint64_t new_batch;         /* batch that allocated this node (0: came from disk) */
    uint64_t dirty_batch;       /* latest batch that changed it and has not written it */
    bool stale;                 /* changed by a batch whose commit failed: reload from disk */
    uint64_t data_slot;         /* leaf: the slot its new data blocks go to (alloc.h), 0: none */
    struct plx_owner *owner;    /* NULL: immutable (see struct plx_owner) */
    struct plx_ev load_ev;
    struct plx_waiter *waiters; /* requests waiting for the load */
};

struct plx_cache {
    struct plx_node **hash;
    size_t hash_size;
    size_t count, capacity;     /* nodes held / nodes allowed (pinned ones may exceed) */
    struct plx_node *hand;      /* CLOCK hand (circular list) */
    uint64_t hits, misses, evictions;
    struct plx_owner *owners;   /* owner records of cached writable nodes */
};

int plx_cache_init(plx_store *st, uint64_t bytes);
void plx_cache_free(plx_store *st);
struct plx_node *plx_cache_lookup(plx_store *st, uint64_t addr);
/* Get a node, starting its load if absent. Returns the node if valid; NULL if loading (w, if
 * given, waits for it: see struct plx_load_wait); sets *err on failure. */
struct plx_node *plx_cache_get(plx_store *st, uint64_t addr, unsigned level,
                               struct plx_owner *owner, struct plx_load_wait *w, int *err);
/* Insert a freshly allocated node (contents zeroed); NULL and *err on failure. A cached node at
 * addr that an open tree still uses (pinned, loading, changed) means the block was handed out
 * while that tree reaches it: -EUCLEAN, never a silent replacement. */
struct plx_node *plx_cache_new(plx_store *st, uint64_t addr, unsigned level,
                               struct plx_owner *owner, int *err);
/* Blocking read of a node (admin and check paths). */
int plx_cache_get_sync(plx_store *st, uint64_t addr, unsigned level, struct plx_owner *owner,
                       struct plx_node **out);
/* The owner a child reached through `link` of node `parent` gets (struct plx_owner). */
static inline struct plx_owner *plx_child_owner(const struct plx_node *parent, uint64_t link)
{
    return plx_link_ro(link) ? NULL : parent->owner;
}
/* A handle of VDI `vdi_id` opens, knowing the VDI record's writer_gen was `seen_gen` before it
 * (if it took the writer lock, it bumped it to `new_gen`; else new_gen == seen_gen, or
 * PLX_GEN_NEVER when another process may be writing). Returns the owner record the handle's
 * nodes use: cached nodes of the VDI are kept when they reflect seen_gen and dropped otherwise.
 * NULL when out of memory. */
struct plx_owner *plx_cache_owner_open(plx_store *st, uint64_t vdi_id, uint64_t seen_gen,
                                       uint64_t new_gen);
/* A handle that trusted `o` closes. */
void plx_cache_owner_close(plx_store *st, struct plx_owner *o);
void plx_cache_pin(struct plx_node *n);
void plx_cache_unpin(plx_store *st, struct plx_node *n);
void plx_cache_drop(plx_store *st, struct plx_node *n);
/* Drop every node that is neither pinned nor changed: after blocks may have been freed. */
void plx_cache_drop_clean(plx_store *st);
bool plx_link_valid(const plx_store *st, uint64_t link, unsigned child_level);

#endif
