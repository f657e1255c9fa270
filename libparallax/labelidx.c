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
    free(t);
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
    if (!t->root) {
        int rc = t->root_addr ? lnode_load(t, t->root_addr, 0, &t->root) : 0;
        if (rc)
            return rc;
        if (!t->root)
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

/* Write the dirty nodes below and at n, children first, each to a new block. */
static int write_dirty(struct plx_lidx_txn *t, struct lnode *n)
{
    if (!n->dirty)
        return 0;
    for (unsigned i = 0; n->kids && i < PLX_LIDX_FANOUT; i++) {
        struct lnode *c = n->kids[i];
        if (!c)
            continue;
        int rc = write_dirty(t, c);
        if (rc)
            return rc;
        n->b->u.child[i] = c->addr;
    }
    uint64_t a;
    int rc = plx_alloc_blocks(t->st, PLX_EXTENT_METADATA, 1, &a);
    if (rc < 0)
        return rc;
    struct plx_node *stale = plx_cache_lookup(t->st, a);
    if (stale && !stale->pins)
        plx_cache_drop(t->st, stale); /* a block gc freed, cached as a radix node before */
    plx_blkhdr_seal(n->b, PLX_MAGIC_LABELIDX, a);
    rc = plx_sync_io(t->st, PLX_IO_WRITE, a, 1, n->b, 0);
    if (rc)
        return plx_err(t->st, rc, "writing a label index node: %s", strerror(-rc));
    n->addr = a;
    n->dirty = false;
    return 0;
}

int plx_lidx_commit(struct plx_lidx_txn *t, uint64_t *root)
{
    *root = t->root_addr;
    int rc = 0;
    if (t->root && t->root->dirty) {
        rc = write_dirty(t, t->root);
        if (!rc)
            rc = plx_wait_alloc_written(t->st);
        if (!rc)
            rc = plx_sync_io(t->st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(t->st, rc, "making the label index durable: %s", strerror(-rc));
        else
            *root = t->root->addr;
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
