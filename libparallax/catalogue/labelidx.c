/*
 * labelidx.c - the label index of a VDI (FORMAT.md §9.1): a hash trie of 4 KiB nodes keyed by
 * the 64-bit hash of a label, one byte per level. A leaf holds up to 84 (index, label) entries;
 * a full leaf becomes an interior node with 256 children, its entries spread by the next byte.
 * So a lookup reads one node per level: about log256(labels / 84) + 1 of them.
 *
 * Nodes are never written in place. A change copies the path from the root to the leaf into new
 * blocks, and the VDI record switching to the new root makes it count (a crash before that
 * leaves the old index; the new blocks leak until gc). That keeps every version the record ever
 * named intact, so readers need no lock, and the writer of the record is the only writer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "cache.h"
#include "labelidx.h"

uint64_t plx_lidx_hash(const char *label)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < PLX_LABEL_MAX && label[i]; i++) {
        h ^= (unsigned char)label[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static unsigned hash_byte(uint64_t h, unsigned level)
{
    return (unsigned)(h >> (8 * level)) & 0xffu;
}

static bool label_eq(const struct plx_lidx_entry *e, const char *label)
{
    return strncmp(e->label, label, sizeof e->label) == 0;
}

const char *plx_lidx_node_problem(const plx_store *st, const struct plx_lidx_block *b,
                                  uint64_t addr, uint64_t vdi_id, unsigned level)
{
    const char *why = "";
    int rc = plx_blkhdr_verify(b, PLX_MAGIC_LABELIDX, addr, &why);
    if (rc == -ENODATA)
        return "block is empty";
    if (rc)
        return why;
    if (b->vdi_id != vdi_id)
        return "belongs to another VDI";
    if (b->level != level)
        return "wrong level";
    if (b->kind == PLX_LIDX_LEAF) {
        if (b->count > PLX_LIDX_PER_LEAF)
            return "bad entry count";
        for (uint32_t i = 0; i < b->count; i++) {
            const struct plx_lidx_entry *e = &b->u.entry[i];
            if (e->index == 0 || e->label[PLX_LABEL_MAX] != 0 || !e->label[0])
                return "bad entry";
        }
        return "";
    }
    if (b->kind != PLX_LIDX_INTERIOR || level + 1 >= PLX_LIDX_DEPTH)
        return "bad node kind";
    for (unsigned i = 0; i < PLX_LIDX_FANOUT; i++) {
        uint64_t c = b->u.child[i];
        if (c && (c >= st->sb.block_count || plx_block_type(st, c) != PLX_EXTENT_METADATA))
            return "child outside the metadata extents";
    }
    return "";
}

/* Read and verify one node (the catalogue is read again once if a link looks foreign, since
 * another process may have typed a new extent). */
static int read_node(plx_store *st, uint64_t vdi_id, uint64_t addr, unsigned level,
                     struct plx_lidx_block *b)
{
    if (addr && addr < st->sb.block_count && plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        plx_catalogue_read(st);
    if (addr == 0 || addr >= st->sb.block_count || plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        return plx_err(st, -EUCLEAN,
                       "label index of VDI %llu links to block %llu, outside the "
                       "metadata extents",
                       (unsigned long long)vdi_id, (unsigned long long)addr);
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, b, 0);
    if (rc)
        return plx_err(st, rc, "reading label index node %llu: %s", (unsigned long long)addr,
                       strerror(-rc));
    const char *why = plx_lidx_node_problem(st, b, addr, vdi_id, level);
    if (strcmp(why, "child outside the metadata extents") == 0 && plx_catalogue_read(st) == 0)
        why = plx_lidx_node_problem(st, b, addr, vdi_id, level);
    if (*why)
        return plx_err(st, -EUCLEAN, "label index node %llu of VDI %llu is corrupt: %s",
                       (unsigned long long)addr, (unsigned long long)vdi_id, why);
    return 0;
}

int plx_lidx_get(plx_store *st, uint64_t vdi_id, uint64_t root, const char *label, uint64_t *idx,
                 size_t max, size_t *n)
{
    *n = 0;
    if (!root)
        return 0;
    struct plx_lidx_block *b = plx_block_alloc(1);
    if (!b)
        return plx_err(st, -ENOMEM, "out of memory");
    uint64_t h = plx_lidx_hash(label), addr = root;
    int rc = 0;
    for (unsigned level = 0; addr && !rc; level++) {
        rc = read_node(st, vdi_id, addr, level, b);
        if (rc)
            break;
        if (b->kind == PLX_LIDX_INTERIOR) {
            addr = b->u.child[hash_byte(h, level)];
            continue;
        }
        for (uint32_t i = 0; i < b->count; i++)
            if (label_eq(&b->u.entry[i], label) && *n < max)
                idx[(*n)++] = b->u.entry[i].index;
        break;
    }
    plx_block_free(b);
    return rc;
}

/* ---- Changing an index: nodes on the changed paths are held in memory until commit -------- */

struct lnode {
    uint64_t addr; /* as read; 0 for a node made in this txn */
    bool dirty;    /* to be written to a new block */
    struct plx_lidx_block *b;
    struct lnode **kids; /* interior: children loaded so far (PLX_LIDX_FANOUT) */
};

struct plx_lidx_txn {
    plx_store *st;
    uint64_t vdi_id, root_addr;
    struct lnode *root;
    /* The node the last plx_lidx_need asked for: the child `want_slot` of want_parent, or the
     * root when want_parent is NULL. */
    struct lnode *want_parent;
    unsigned want_slot;
    uint64_t want_addr;
    struct plx_lidx_write *writes; /* what plx_lidx_prepare handed out */
    size_t nwrites, capwrites;
};

static void lnode_free(struct lnode *n)
{
    if (!n)
        return;
    if (n->kids)
        for (unsigned i = 0; i < PLX_LIDX_FANOUT; i++)
            lnode_free(n->kids[i]);
    free(n->kids);
    plx_block_free(n->b);
    free(n);
}

static struct lnode *lnode_new(uint64_t vdi_id, unsigned level, uint32_t kind)
{
    struct lnode *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->b = plx_block_alloc(1);
    if (!n->b) {
        free(n);
        return NULL;
    }
    memset(n->b, 0, PLX_BLOCK_SIZE);
    n->b->vdi_id = vdi_id;
    n->b->level = level;
    n->b->kind = kind;
    n->dirty = true;
    return n;
}

static int lnode_load(struct plx_lidx_txn *t, uint64_t addr, unsigned level, struct lnode **out)
{
    struct lnode *n = calloc(1, sizeof *n);
    if (n)
        n->b = plx_block_alloc(1);
    if (!n || !n->b) {
        free(n);
        return plx_err(t->st, -ENOMEM, "out of memory");
    }
    int rc = read_node(t->st, t->vdi_id, addr, level, n->b);
    if (rc) {
        lnode_free(n);
        return rc;
    }
    n->addr = addr;
    *out = n;
    return 0;
}

int plx_lidx_begin(plx_store *st, uint64_t vdi_id, uint64_t root, struct plx_lidx_txn **out)
{
    struct plx_lidx_txn *t = calloc(1, sizeof *t);
    if (!t)
        return plx_err(st, -ENOMEM, "out of memory");
    t->st = st;
    t->vdi_id = vdi_id;
    t->root_addr = root;
    *out = t;
    return 0;
}

void plx_lidx_abort(struct plx_lidx_txn *t)
{
    if (!t)
        return;
    lnode_free(t->root);
    free(t->writes);
    free(t);
}

/* Is addr a block an index node may be at? The catalogue is read again once if not, since
 * another process may have typed the extent since. */
static int node_addr_check(plx_store *st, uint64_t vdi_id, uint64_t addr)
{
    if (addr && addr < st->sb.block_count && plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        plx_catalogue_read(st);
    if (addr == 0 || addr >= st->sb.block_count || plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        return plx_err(st, -EUCLEAN,
                       "label index of VDI %llu links to block %llu, outside the "
                       "metadata extents",
                       (unsigned long long)vdi_id, (unsigned long long)addr);
    return 0;
}

int plx_lidx_need(struct plx_lidx_txn *t, const char *label, uint64_t *addr, unsigned *level)
{
    t->want_addr = 0;
    if (!t->root) {
        if (!t->root_addr)
            return 0; /* no index yet: put makes a root, get finds nothing */
        t->want_parent = NULL;
        t->want_addr = t->root_addr;
        *level = 0;
    } else {
        uint64_t h = plx_lidx_hash(label);
        struct lnode *n = t->root;
        while (n->b->kind == PLX_LIDX_INTERIOR) {
            unsigned slot = hash_byte(h, n->b->level);
            if (n->kids && n->kids[slot]) {
                n = n->kids[slot];
                continue;
            }
            if (!n->b->u.child[slot])
                return 0; /* no label with this prefix */
            t->want_parent = n;
            t->want_slot = slot;
            t->want_addr = n->b->u.child[slot];
            *level = n->b->level + 1;
            break;
        }
        if (!t->want_addr)
            return 0;
    }
    int rc = node_addr_check(t->st, t->vdi_id, t->want_addr);
    if (rc) {
        t->want_addr = 0;
        return rc;
    }
    *addr = t->want_addr;
    return 1;
}

int plx_lidx_supply(struct plx_lidx_txn *t, const struct plx_lidx_block *b)
{
    uint64_t addr = t->want_addr;
    unsigned level = t->want_parent ? t->want_parent->b->level + 1 : 0;
    if (!addr)
        return plx_err(t->st, -EINVAL, "label index: a node nobody asked for (bug)");
    const char *why = plx_lidx_node_problem(t->st, b, addr, t->vdi_id, level);
    if (strcmp(why, "child outside the metadata extents") == 0 && plx_catalogue_read(t->st) == 0)
        why = plx_lidx_node_problem(t->st, b, addr, t->vdi_id, level);
    if (*why)
        return plx_err(t->st, -EUCLEAN, "label index node %llu of VDI %llu is corrupt: %s",
                       (unsigned long long)addr, (unsigned long long)t->vdi_id, why);
    struct lnode *n = calloc(1, sizeof *n);
    if (n)
        n->b = plx_block_alloc(1);
    if (n && n->b && t->want_parent && !t->want_parent->kids)
        t->want_parent->kids = calloc(PLX_LIDX_FANOUT, sizeof *t->want_parent->kids);
    if (!n || !n->b || (t->want_parent && !t->want_parent->kids)) {
        lnode_free(n);
        return plx_err(t->st, -ENOMEM, "out of memory");
    }
    memcpy(n->b, b, PLX_BLOCK_SIZE);
    n->addr = addr;
    if (t->want_parent)
        t->want_parent->kids[t->want_slot] = n;
    else
        t->root = n;
    t->want_addr = 0;
    return 0;
}

/* Load label's path synchronously (the blocking callers: the admin path, folds at open and
 * close). */
static int load_path(struct plx_lidx_txn *t, const char *label)
{
    struct plx_lidx_block *b = NULL;
    uint64_t addr;
    unsigned level;
    int rc;
    while ((rc = plx_lidx_need(t, label, &addr, &level)) == 1) {
        if (!b)
            b = plx_block_alloc(1);
        if (!b)
            return plx_err(t->st, -ENOMEM, "out of memory");
        rc = plx_sync_io(t->st, PLX_IO_READ, addr, 1, b, 0);
        if (rc) {
            plx_err(t->st, rc, "reading label index node %llu: %s", (unsigned long long)addr,
                    strerror(-rc));
            break;
        }
        rc = plx_lidx_supply(t, b);
        if (rc)
            break;
    }
    plx_block_free(b);
    return rc;
}

size_t plx_lidx_txn_get(const struct plx_lidx_txn *t, const char *label, uint64_t *idx, size_t max)
{
    uint64_t h = plx_lidx_hash(label);
    const struct lnode *n = t->root;
    while (n && n->b->kind == PLX_LIDX_INTERIOR) {
        unsigned slot = hash_byte(h, n->b->level);
        n = n->kids ? n->kids[slot] : NULL;
    }
    size_t k = 0;
    for (uint32_t i = 0; n && i < n->b->count; i++)
        if (label_eq(&n->b->u.entry[i], label) && k < max)
            idx[k++] = n->b->u.entry[i].index;
    return k;
}

/* The child of interior node n for hash byte `slot`, loaded or made (an empty leaf). */
static int child_of(struct plx_lidx_txn *t, struct lnode *n, unsigned slot, struct lnode **out)
{
    if (!n->kids) {
        n->kids = calloc(PLX_LIDX_FANOUT, sizeof *n->kids);
        if (!n->kids)
            return plx_err(t->st, -ENOMEM, "out of memory");
    }
    if (!n->kids[slot]) {
        uint64_t a = n->b->u.child[slot];
        if (a) {
            int rc = lnode_load(t, a, n->b->level + 1, &n->kids[slot]);
            if (rc)
                return rc;
        } else {
            n->kids[slot] = lnode_new(t->vdi_id, n->b->level + 1, PLX_LIDX_LEAF);
            if (!n->kids[slot])
                return plx_err(t->st, -ENOMEM, "out of memory");
        }
    }
    *out = n->kids[slot];
    return 0;
}

/* Turn full leaf n into an interior node: its entries go to new leaves by the next hash byte. */
static int split_leaf(struct plx_lidx_txn *t, struct lnode *n)
{
    struct plx_lidx_block old;
    memcpy(&old, n->b, sizeof old);
    memset(&n->b->u, 0, sizeof n->b->u);
    n->b->kind = PLX_LIDX_INTERIOR;
    n->b->count = 0;
    for (uint32_t i = 0; i < old.count; i++) {
        struct lnode *c;
        int rc = child_of(t, n, hash_byte(plx_lidx_hash(old.u.entry[i].label), n->b->level), &c);
        if (rc)
            return rc;
        c->b->u.entry[c->b->count++] = old.u.entry[i]; /* a new leaf: it cannot be full */
    }
    return 0;
}

int plx_lidx_put(struct plx_lidx_txn *t, const char *label, uint64_t index)
{
    int lrc = load_path(t, label); /* reads nothing when the path is loaded already */
    if (lrc)
        return lrc;
    if (!t->root) {
        t->root = lnode_new(t->vdi_id, 0, PLX_LIDX_LEAF);
        if (!t->root)
            return plx_err(t->st, -ENOMEM, "out of memory");
    }
    uint64_t h = plx_lidx_hash(label);
    struct lnode *n = t->root;
    for (;;) {
        n->dirty = true;
        struct plx_lidx_block *b = n->b;
        if (b->kind == PLX_LIDX_INTERIOR) {
            int rc = child_of(t, n, hash_byte(h, b->level), &n);
            if (rc)
                return rc;
            continue;
        }
        uint32_t k = 0;
        for (uint32_t i = 0; i < b->count; i++)
            if (!label_eq(&b->u.entry[i], label))
                b->u.entry[k++] = b->u.entry[i];
        memset(&b->u.entry[k], 0, (b->count - k) * sizeof b->u.entry[0]);
        b->count = k;
        if (k < PLX_LIDX_PER_LEAF) {
            b->u.entry[k].index = index;
            memset(b->u.entry[k].label, 0, sizeof b->u.entry[k].label);
            strncpy(b->u.entry[k].label, label, PLX_LABEL_MAX);
            b->count++;
            return 0;
        }
        /* Full: 84 labels share this hash prefix. At the last level they share the whole hash. */
        if (b->level + 1 >= PLX_LIDX_DEPTH)
            return plx_err(t->st, -ENOSPC,
                           "label index of VDI %llu: more than %u labels with "
                           "one 64-bit hash",
                           (unsigned long long)t->vdi_id, PLX_LIDX_PER_LEAF);
        int rc = split_leaf(t, n);
        if (rc)
            return rc;
    }
}

/* Give the dirty nodes below and at n, children first, each a new block, and seal them: the
 * list of blocks to write grows in t. */
static int assign_dirty(struct plx_lidx_txn *t, struct lnode *n)
{
    if (!n->dirty)
        return 0;
    for (unsigned i = 0; n->kids && i < PLX_LIDX_FANOUT; i++) {
        struct lnode *c = n->kids[i];
        if (!c)
            continue;
        int rc = assign_dirty(t, c);
        if (rc)
            return rc;
        n->b->u.child[i] = c->addr;
    }
    if (t->nwrites == t->capwrites) {
        size_t cap = t->capwrites ? 2 * t->capwrites : 8;
        struct plx_lidx_write *w = realloc(t->writes, cap * sizeof *w);
        if (!w)
            return plx_err(t->st, -ENOMEM, "out of memory");
        t->writes = w;
        t->capwrites = cap;
    }
    uint64_t a;
    int rc = plx_alloc_blocks(t->st, PLX_EXTENT_METADATA, 1, &a);
    if (rc < 0)
        return rc;
    struct plx_node *stale = plx_cache_lookup(t->st, a);
    if (stale && !stale->pins)
        plx_cache_drop(t->st, stale); /* a block gc freed, cached as a radix node before */
    plx_blkhdr_seal(n->b, PLX_MAGIC_LABELIDX, a);
    n->addr = a;
    n->dirty = false;
    t->writes[t->nwrites++] = (struct plx_lidx_write){.addr = a, .block = n->b};
    return 0;
}

int plx_lidx_prepare(struct plx_lidx_txn *t, uint64_t *root, const struct plx_lidx_write **w,
                     size_t *n)
{
    *root = t->root_addr;
    t->nwrites = 0;
    int rc = t->root && t->root->dirty ? assign_dirty(t, t->root) : 0;
    if (!rc && t->root)
        *root = t->root->addr;
    *w = t->writes;
    *n = rc ? 0 : t->nwrites;
    return rc;
}

int plx_lidx_commit(struct plx_lidx_txn *t, uint64_t *root)
{
    const struct plx_lidx_write *w;
    size_t n;
    int rc = plx_lidx_prepare(t, root, &w, &n);
    for (size_t i = 0; i < n && !rc; i++) {
        rc = plx_sync_io(t->st, PLX_IO_WRITE, w[i].addr, 1, (void *)w[i].block, 0);
        if (rc)
            plx_err(t->st, rc, "writing a label index node: %s", strerror(-rc));
    }
    if (!rc && n) {
        rc = plx_wait_alloc_written(t->st);
        if (!rc)
            rc = plx_sync_io(t->st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(t->st, rc, "making the label index durable: %s", strerror(-rc));
    }
    plx_lidx_abort(t);
    return rc;
}

/* ---- Walking (gc marks, check verifies) ---------------------------------------------------- */

static int walk(plx_store *st, uint64_t vdi_id, uint64_t addr, uint64_t parent, uint64_t path,
                unsigned level, struct plx_lidx_block *bufs, plx_lidx_visit_fn cb, void *arg)
{
    struct plx_lidx_block *b = &bufs[level];
    const char *why = "";
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, b, 0);
    if (rc)
        why = "read failed";
    else
        why = plx_lidx_node_problem(st, b, addr, vdi_id, level);
    rc = cb(arg, addr, *why ? NULL : b, parent, path, why);
    if (rc || *why || b->kind != PLX_LIDX_INTERIOR)
        return rc;
    for (unsigned i = 0; i < PLX_LIDX_FANOUT && !rc; i++)
        if (b->u.child[i])
            rc = walk(st, vdi_id, b->u.child[i], addr, path | (uint64_t)i << (8 * level), level + 1,
                      bufs, cb, arg);
    return rc;
}

int plx_lidx_walk(plx_store *st, uint64_t vdi_id, uint64_t root, plx_lidx_visit_fn cb, void *arg)
{
    if (!root)
        return 0;
    if (root >= st->sb.block_count || plx_block_type(st, root) != PLX_EXTENT_METADATA)
        return cb(arg, root, NULL, 0, 0, "outside the metadata extents");
    struct plx_lidx_block *bufs = plx_block_alloc(PLX_LIDX_DEPTH);
    if (!bufs)
        return plx_err(st, -ENOMEM, "out of memory");
    int rc = walk(st, vdi_id, root, 0, 0, 0, bufs, cb, arg);
    plx_block_free(bufs);
    return rc;
}
