/*
 * cache.c - the radix node cache.
 *
 * Every radix node the engine touches lives here, keyed by block address. Shared (read-only)
 * nodes may be reached from many trees; writable nodes belong to one tree, so one cache entry
 * per address is always coherent within a process (single writer per VDI).
 *
 * Replacement is CLOCK with credit by tree level: a node earns level+1 chances on each use, so a
 * sweep evicts a leaf long before the upper nodes every lookup passes through (the thesis's
 * address hash could evict a hot upper node for a leaf). Roots, nodes being loaded and nodes
 * with unwritten changes are pinned and never evicted.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "cache.h"

static size_t hash_of(const struct plx_cache *c, uint64_t addr)
{
    return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 20) & (c->hash_size - 1);
}

int plx_cache_init(plx_store *st, uint64_t bytes)
{
    struct plx_cache *c = calloc(1, sizeof *c);
    if (!c)
        return plx_err(st, -ENOMEM, "out of memory for the node cache");
    st->cache = c;
    st->gc_epoch_moved = plx_cache_drop_clean;
    c->capacity = bytes / PLX_BLOCK_SIZE;
    if (c->capacity < 64)
        c->capacity = 64;
    c->hash_size = 1024;
    while (c->hash_size < c->capacity * 2)
        c->hash_size <<= 1;
    c->hash = calloc(c->hash_size, sizeof *c->hash);
    if (!c->hash)
        return plx_err(st, -ENOMEM, "out of memory for the node cache");
    return 0;
}

static void unlink_node(struct plx_cache *c, struct plx_node *n)
{
    struct plx_node **pp = &c->hash[hash_of(c, n->addr)];
    while (*pp != n)
        pp = &(*pp)->hash_next;
    *pp = n->hash_next;
    if (n->clock_next == n) {
        c->hand = NULL;
    } else {
        n->clock_prev->clock_next = n->clock_next;
        n->clock_next->clock_prev = n->clock_prev;
        if (c->hand == n)
            c->hand = n->clock_next;
    }
    c->count--;
}

static void free_node(struct plx_node *n)
{
    plx_block_free(n->links);
    free(n);
}

void plx_cache_free(plx_store *st)
{
    struct plx_cache *c = st->cache;
    if (!c)
        return;
    for (size_t i = 0; c->hash && i < c->hash_size; i++) {
        struct plx_node *n = c->hash[i];
        while (n) {
            struct plx_node *next = n->hash_next;
            while (n->waiters) {
                struct plx_waiter *w = n->waiters;
                n->waiters = w->next;
                free(w);
            }
            free_node(n);
            n = next;
        }
    }
    free(c->hash);
    while (c->owners) {
        struct plx_owner *o = c->owners;
        c->owners = o->next;
        free(o);
    }
    free(c);
    st->cache = NULL;
    st->gc_epoch_moved = NULL;
}

struct plx_node *plx_cache_lookup(plx_store *st, uint64_t addr)
{
    struct plx_cache *c = st->cache;
    for (struct plx_node *n = c->hash[hash_of(c, addr)]; n; n = n->hash_next)
        if (n->addr == addr)
            return n;
    return NULL;
}

static void make_room(plx_store *st)
{
    struct plx_cache *c = st->cache;
    /* Bounded sweep: if everything is pinned the cache grows past its size rather than wait. */
    size_t budget = c->count * (PLX_HEIGHT_LARGE + 2);
    while (c->count >= c->capacity && c->hand && budget--) {
        struct plx_node *n = c->hand;
        c->hand = n->clock_next;
        if (n->pins || n->state != NODE_VALID || n->dirty_batch)
            continue;
        if (n->chances) {
            n->chances--;
            continue;
        }
        unlink_node(c, n);
        free_node(n);
        c->evictions++;
    }
}

static struct plx_node *insert(plx_store *st, uint64_t addr, unsigned level)
{
    struct plx_cache *c = st->cache;
    make_room(st);
    struct plx_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->links = plx_block_alloc(1);
    n->addr = addr;
    n->level = level;
    n->chances = level + 1;
    size_t h = hash_of(c, addr);
    n->hash_next = c->hash[h];
    c->hash[h] = n;
    if (c->hand) {
        /* New nodes go just behind the hand: the sweep reaches them last. */
        n->clock_next = c->hand;
        n->clock_prev = c->hand->clock_prev;
        c->hand->clock_prev->clock_next = n;
        c->hand->clock_prev = n;
    } else {
        n->clock_next = n->clock_prev = n;
        c->hand = n;
    }
    c->count++;
    return n;
}

void plx_cache_drop(plx_store *st, struct plx_node *n)
{
    unlink_node(st->cache, n);
    free_node(n);
}

void plx_cache_drop_clean(plx_store *st)
{
    struct plx_cache *c = st->cache;
    for (size_t i = 0; i < c->hash_size; i++) {
        struct plx_node *n = c->hash[i];
        while (n) {
            struct plx_node *next = n->hash_next;
            if (!n->pins && n->state == NODE_VALID && !n->dirty_batch)
                plx_cache_drop(st, n);
            n = next;
        }
    }
}

void plx_cache_pin(struct plx_node *n)
{
    n->pins++;
}

void plx_cache_unpin(plx_store *st, struct plx_node *n)
{
    (void)st;
    if (n->pins)
        n->pins--;
}

bool plx_link_valid(const plx_store *st, uint64_t link, unsigned node_level)
{
    if (link == 0)
        return true;
    if (link & PLX_LINK_RESERVED_MASK)
        return false;
    uint64_t a = plx_link_addr(link);
    if (a >= st->sb.block_count || plx_block_in_bitmap_area(st, a))
        return false;
    enum plx_extent_type want = node_level == 0 ? PLX_EXTENT_DATA : PLX_EXTENT_METADATA;
    return plx_block_type(st, a) == want;
}

/* A node read from the medium is trusted only if every link in it could be a link. */
static int validate_links(plx_store *st, const struct plx_node *n)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        unsigned i;
        for (i = 0; i < PLX_RADIX_FANOUT; i++)
            if (!plx_link_valid(st, n->links[i], n->level))
                break;
        if (i == PLX_RADIX_FANOUT)
            return 0;
        /* Another process may have typed a new extent since we read the catalogue. */
        if (attempt == 0 && plx_catalogue_read(st) == 0)
            continue;
        return plx_err(st, -EUCLEAN,
                       "radix node %llu (level %u) is corrupt: entry %u = 0x%016llx is not a "
                       "valid link",
                       (unsigned long long)n->addr, n->level, i, (unsigned long long)n->links[i]);
    }
    return -EUCLEAN;
}

static void node_loaded(plx_store *st, struct plx_ev *ev)
{
    struct plx_node *n = ev->ctx;
    int status = ev->status;
    if (status)
        plx_err(st, status, "reading radix node %llu: %s", (unsigned long long)n->addr,
                strerror(-status));
    else
        status = validate_links(st, n);
    n->pins--;
    struct plx_waiter *w = n->waiters;
    n->waiters = NULL;
    if (status)
        plx_cache_drop(st, n);
    else
        n->state = NODE_VALID;
    while (w) {
        struct plx_waiter *next = w->next;
        struct plx_load_wait *lw = w->w;
        if (status && !*lw->status)
            *lw->status = status;
        free(w);
        if (--lw->pending == 0)
            lw->ready(lw);
        w = next;
    }
}

static int add_waiter(struct plx_node *n, struct plx_load_wait *lw)
{
    if (!lw)
        return 0;
    struct plx_waiter *w = malloc(sizeof *w);
    if (!w)
        return -ENOMEM;
    w->w = lw;
    w->next = n->waiters;
    n->waiters = w;
    lw->pending++;
    return 0;
}

/* May a lookup that reaches n as belonging to `want` (NULL: reached as immutable) use the cached
 * copy? See struct plx_owner. A node that cannot be dropped (pinned, loading, changed) was
 * current when it was pinned and is used as it is. */
static bool node_current(const struct plx_node *n, const struct plx_owner *want)
{
    const struct plx_owner *o = n->owner;
    if (o == want || o == NULL)
        return true;
    if (n->pins || n->state != NODE_VALID || n->dirty_batch)
        return true;
    return want == NULL && o->handles > 0 && o->gen != PLX_GEN_NEVER;
}

struct plx_node *plx_cache_get(plx_store *st, uint64_t addr, unsigned level,
                               struct plx_owner *owner, struct plx_load_wait *w, int *err)
{
    *err = 0;
    struct plx_node *n = plx_cache_lookup(st, addr);
    if (n && !node_current(n, owner)) {
        plx_cache_drop(st, n);
        n = NULL;
    }
    if (n && n->state == NODE_VALID) {
        st->cache->hits++;
        n->chances = n->level + 1;
        return n;
    }
    if (n) {
        *err = add_waiter(n, w);
        return NULL;
    }
    st->cache->misses++;
    n = insert(st, addr, level);
    if (!n) {
        *err = -ENOMEM;
        return NULL;
    }
    n->owner = owner;
    n->state = NODE_LOADING;
    n->pins = 1;
    n->load_ev.io.op = PLX_IO_READ;
    n->load_ev.io.block = addr;
    n->load_ev.io.nblocks = 1;
    n->load_ev.io.buf = n->links;
    n->load_ev.handler = node_loaded;
    n->load_ev.ctx = n;
    int rc = plx_submit(st, &n->load_ev);
    if (rc) {
        plx_cache_drop(st, n);
        *err =
            plx_err(st, rc, "reading radix node %llu: %s", (unsigned long long)addr, strerror(-rc));
        return NULL;
    }
    *err = add_waiter(n, w);
    return NULL;
}

struct plx_node *plx_cache_new(plx_store *st, uint64_t addr, unsigned level,
                               struct plx_owner *owner, int *err)
{
    struct plx_node *old = plx_cache_lookup(st, addr);
    /* A node an open tree uses cannot be dropped (its handle or batch points to it), and its
     * block must not be reused: the collector keeps what open trees reach (a reader's through
     * its hold, hold.h). Freeing it here would leave the tree on freed memory and the block
     * both its node and the new one. */
    if (old && (old->pins || old->state != NODE_VALID || old->dirty_batch)) {
        *err = plx_err(st, -EUCLEAN,
                       "block %llu was allocated again while an open tree still uses it as a "
                       "radix node (level %u): not written",
                       (unsigned long long)addr, old->level);
        return NULL;
    }
    if (old)
        plx_cache_drop(st, old); /* a stale entry for a block that was freed and reused */
    struct plx_node *n = insert(st, addr, level);
    if (n) {
        n->state = NODE_VALID;
        n->owner = owner;
    } else {
        *err = plx_err(st, -ENOMEM, "out of memory for the node cache");
    }
    return n;
}

int plx_cache_get_sync(plx_store *st, uint64_t addr, unsigned level, struct plx_owner *owner,
                       struct plx_node **out)
{
    struct plx_node *n;
    while ((n = plx_cache_lookup(st, addr)) && n->state == NODE_LOADING) {
        int rc = plx_poll_medium(st);
        if (rc < 0 && rc != -EINTR)
            return rc;
        plx_run_ready(st);
    }
    if (n && !node_current(n, owner)) {
        plx_cache_drop(st, n);
        n = NULL;
    }
    if (n) {
        n->chances = n->level + 1;
        *out = n;
        return 0;
    }
    n = insert(st, addr, level);
    if (!n)
        return plx_err(st, -ENOMEM, "out of memory");
    n->owner = owner;
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, n->links, 0);
    if (rc)
        plx_err(st, rc, "reading radix node %llu: %s", (unsigned long long)addr, strerror(-rc));
    else
        rc = validate_links(st, n);
    if (rc) {
        plx_cache_drop(st, n);
        return rc;
    }
    n->state = NODE_VALID;
    *out = n;
    return 0;
}

/* ---- Owners of writable nodes (struct plx_owner) ------------------------------------------------
 */

/* Forget what the cache holds of o's nodes: drop them, or, where they cannot be dropped (pinned
 * snapshot roots that were current when pinned), keep them as immutable. */
static void disown(plx_store *st, struct plx_owner *o)
{
    struct plx_cache *c = st->cache;
    for (size_t i = 0; i < c->hash_size; i++) {
        struct plx_node *n = c->hash[i];
        while (n) {
            struct plx_node *next = n->hash_next;
            if (n->owner == o) {
                if (!n->pins && n->state == NODE_VALID && !n->dirty_batch)
                    plx_cache_drop(st, n);
                else
                    n->owner = NULL;
            }
            n = next;
        }
    }
}

struct plx_owner *plx_cache_owner_open(plx_store *st, uint64_t vdi_id, uint64_t seen_gen,
                                       uint64_t new_gen)
{
    struct plx_owner *o = st->cache->owners;
    while (o && o->vdi_id != vdi_id)
        o = o->next;
    if (!o) {
        o = calloc(1, sizeof *o);
        if (!o)
            return NULL;
        o->vdi_id = vdi_id;
        o->gen = new_gen;
        o->next = st->cache->owners;
        st->cache->owners = o;
    } else if (o->handles == 0) {
        /* Dormant: adopt the nodes only if no other writer took the VDI since they were
         * current here. */
        if (o->gen != seen_gen || seen_gen == PLX_GEN_NEVER)
            disown(st, o);
        o->gen = new_gen;
    } else if (o->gen != seen_gen || new_gen == PLX_GEN_NEVER) {
        /* Handles here trust nodes that another process's writes may have outdated: nobody
         * trusts them from now on (the caller refuses to write through them). */
        o->gen = PLX_GEN_NEVER;
    } else {
        o->gen = new_gen;
    }
    o->handles++;
    return o;
}

void plx_cache_owner_close(plx_store *st, struct plx_owner *o)
{
    (void)st;
    if (o && o->handles)
        o->handles--;
}
