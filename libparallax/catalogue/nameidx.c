/*
 * nameidx.c - the name index (layer 4, registry.h; FORMAT.md §7.2): a 64-bit hash of each live
 * VDI's name -> its id, so that opening a VDI by name and the uniqueness check of create read a
 * few blocks instead of every record.
 *
 * Extendible hashing, paged as a trie. A node routes by one byte of the hash to 256 child
 * entries; a bucket (254 entries) of local depth d fills the 2^(8-d) entries that share the top
 * d bits of that byte. A full bucket splits in two (depth + 1) inside its node; a bucket of depth
 * 8 becomes a node of the next byte holding it. Buckets stay at least about half full on average
 * (extendible hashing), and a name is found in 2 reads up to ~30,000 names, 3 up to ~8 million.
 *
 * Crash safety: an entry is added or removed by one in-place write of its bucket. A split writes
 * the new buckets (or node) whole and flushes them with their claims before the one write of
 * the parent node that links them; the old bucket is then garbage for the collector. A removal
 * that leaves a bucket and its buddy holding at most half a bucket between them merges them the
 * same way (a new bucket, flushed, then the one write of the node). Nodes never merge. The index
 * may hold entries for no live VDI (a create that crashed before the state block counted it,
 * a delete that crashed before the entry was removed): every lookup reads the record the id
 * names and compares the name, so such an entry costs a read and is removed by the next
 * create of that id or the purge of the deleted VDI. It never lacks the entry of a live VDI: the
 * entry is written before the state block that makes the VDI exist.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "registry.h"

#define MAX_LEVEL 7u /* bytes of a 64-bit hash */

/* FNV-1a, then the splitmix64 finaliser: the index routes by the high bytes, which FNV-1a alone
 * mixes poorly for short names. */
uint64_t plx_name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static unsigned hash_byte(uint64_t h, unsigned level)
{
    return (unsigned)(h >> (56 - 8 * level)) & 0xffu;
}

/* Read a node that must be of `level`. */
static int node_read(plx_store *st, uint64_t addr, unsigned level, struct plx_nameidx_node *n)
{
    int rc = plx_registry_block_read(st, addr, PLX_MAGIC_NAMEIDX, n, "name index node");
    if (!rc && n->level != level)
        rc = plx_err(st, -EUCLEAN, "name index node %llu is corrupt: level %u, %u expected",
                     (unsigned long long)addr, n->level, level);
    return rc;
}

/* Read a child of a node of `level`: a bucket of that level or a node of the next one. */
static int child_read(plx_store *st, uint64_t addr, unsigned level, void *blk, bool *is_bucket)
{
    int rc = plx_registry_block_read(st, addr, 0, blk, "name index block");
    if (rc)
        return rc;
    *is_bucket = ((const struct plx_blkhdr *)blk)->magic == PLX_MAGIC_NAMEBKT;
    const struct plx_namebkt_block *b = blk;
    const struct plx_nameidx_node *n = blk;
    bool ok = *is_bucket ? b->level == level && b->depth <= 8 && b->count <= PLX_NAMEBKT_CAP &&
                               b->lo % (PLX_NAMEIDX_FANOUT >> b->depth) == 0
                         : n->level == level + 1 && n->level <= MAX_LEVEL;
    if (!ok)
        return plx_err(st, -EUCLEAN, "name index block %llu is corrupt: wrong level or range",
                       (unsigned long long)addr);
    return 0;
}

/* Descend to the bucket of `hash`: its node (address and copy), level and the bucket. */
struct path {
    uint64_t node_addr, bkt_addr;
    unsigned level;
    struct plx_nameidx_node *node;
    struct plx_namebkt_block *bkt;
};

static int descend(plx_store *st, uint64_t hash, struct path *p)
{
    uint64_t addr = st->state.name_index_root;
    int rc = node_read(st, addr, 0, p->node);
    for (unsigned level = 0; !rc; level++) {
        p->node_addr = addr;
        p->level = level;
        addr = p->node->children[hash_byte(hash, level)];
        bool is_bucket = false;
        rc = child_read(st, addr, level, p->bkt, &is_bucket);
        if (rc || is_bucket)
            break;
        /* A node of the next level: it becomes the node, its buffer the bucket's. */
        void *t = p->node;
        p->node = (struct plx_nameidx_node *)(void *)p->bkt;
        p->bkt = t;
    }
    p->bkt_addr = addr;
    return rc;
}

static int path_init(struct path *p)
{
    p->node = plx_block_alloc(1);
    p->bkt = plx_block_alloc(1);
    return 0;
}

static void path_free(struct path *p)
{
    plx_block_free(p->node);
    plx_block_free(p->bkt);
}

int plx_nameidx_lookup(plx_store *st, uint64_t hash, uint64_t *ids, size_t max, size_t *n)
{
    *n = 0;
    if (!st->state.name_index_root)
        return 0;
    struct path p;
    path_init(&p);
    int rc = descend(st, hash, &p);
    for (uint32_t i = 0; !rc && i < p.bkt->count; i++)
        if (p.bkt->entries[i].hash == hash && *n < max)
            ids[(*n)++] = p.bkt->entries[i].id;
    path_free(&p);
    return rc;
}

static int write_in_place(plx_store *st, void *blk, uint32_t magic, uint64_t addr)
{
    plx_blkhdr_seal(blk, magic, addr);
    int rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, blk, 0);
    if (rc)
        plx_err(st, rc, "writing name index block %llu: %s", (unsigned long long)addr,
                strerror(-rc));
    return rc;
}

static struct plx_namebkt_block *bucket_new(unsigned level, unsigned depth, unsigned lo)
{
    struct plx_namebkt_block *b = plx_block_alloc(1);
    memset(b, 0, PLX_BLOCK_SIZE);
    b->level = level;
    b->depth = depth;
    b->lo = lo;
    return b;
}

/* The first node and bucket of an empty index. */
static int index_create(plx_store *st)
{
    struct plx_namebkt_block *b = bucket_new(0, 0, 0);
    struct plx_nameidx_node *n = plx_block_alloc(1);
    memset(n, 0, PLX_BLOCK_SIZE);
    uint64_t baddr = 0, naddr = 0;
    int rc = plx_registry_new_block(st, b, PLX_MAGIC_NAMEBKT, &baddr);
    for (unsigned i = 0; i < PLX_NAMEIDX_FANOUT; i++)
        n->children[i] = baddr;
    if (!rc)
        rc = plx_registry_new_block(st, n, PLX_MAGIC_NAMEIDX, &naddr);
    if (!rc)
        rc = plx_registry_durable(st);
    if (!rc)
        st->state.name_index_root = naddr; /* linked by the caller's state write */
    plx_block_free(b);
    plx_block_free(n);
    return rc;
}

/* The full bucket p->bkt splits in two inside its node, or becomes a node of the next byte. */
static int bucket_split(plx_store *st, struct path *p)
{
    struct plx_namebkt_block *old = p->bkt;
    unsigned level = p->level;
    int rc;
    if (old->depth < 8) {
        unsigned half = PLX_NAMEIDX_FANOUT >> (old->depth + 1);
        struct plx_namebkt_block *lo = bucket_new(level, old->depth + 1, old->lo);
        struct plx_namebkt_block *hi = bucket_new(level, old->depth + 1, old->lo + half);
        for (uint32_t i = 0; i < old->count; i++) {
            struct plx_namebkt_block *to =
                hash_byte(old->entries[i].hash, level) < old->lo + half ? lo : hi;
            to->entries[to->count++] = old->entries[i];
        }
        uint64_t la = 0, ha = 0;
        rc = plx_registry_new_block(st, lo, PLX_MAGIC_NAMEBKT, &la);
        if (!rc)
            rc = plx_registry_new_block(st, hi, PLX_MAGIC_NAMEBKT, &ha);
        if (!rc)
            rc = plx_registry_durable(st);
        if (!rc) {
            for (unsigned i = 0; i < 2 * half; i++)
                p->node->children[old->lo + i] = i < half ? la : ha;
            rc = write_in_place(st, p->node, PLX_MAGIC_NAMEIDX, p->node_addr);
        }
        plx_block_free(lo);
        plx_block_free(hi);
        return rc;
    }
    if (level == MAX_LEVEL)
        return plx_err(st, -ENOSPC, "name index: %u names share one 64-bit hash", PLX_NAMEBKT_CAP);
    struct plx_namebkt_block *b = bucket_new(level + 1, 0, 0);
    memcpy(b->entries, old->entries, sizeof old->entries);
    b->count = old->count;
    struct plx_nameidx_node *n = plx_block_alloc(1);
    memset(n, 0, PLX_BLOCK_SIZE);
    n->level = level + 1;
    uint64_t baddr = 0, naddr = 0;
    rc = plx_registry_new_block(st, b, PLX_MAGIC_NAMEBKT, &baddr);
    for (unsigned i = 0; i < PLX_NAMEIDX_FANOUT; i++)
        n->children[i] = baddr;
    if (!rc)
        rc = plx_registry_new_block(st, n, PLX_MAGIC_NAMEIDX, &naddr);
    if (!rc)
        rc = plx_registry_durable(st);
    if (!rc) {
        p->node->children[old->lo] = naddr;
        rc = write_in_place(st, p->node, PLX_MAGIC_NAMEIDX, p->node_addr);
    }
    plx_block_free(b);
    plx_block_free(n);
    return rc;
}

int plx_nameidx_insert(plx_store *st, uint64_t hash, uint64_t id)
{
    int rc = st->state.name_index_root ? 0 : index_create(st);
    struct path p;
    path_init(&p);
    while (!rc) {
        rc = descend(st, hash, &p);
        if (rc)
            break;
        if (p.bkt->count < PLX_NAMEBKT_CAP) {
            p.bkt->entries[p.bkt->count++] = (struct plx_name_entry){hash, id};
            rc = write_in_place(st, p.bkt, PLX_MAGIC_NAMEBKT, p.bkt_addr);
            break;
        }
        rc = bucket_split(st, &p); /* then descend again: one half may still be full */
    }
    path_free(&p);
    return rc;
}

/* Buckets whose entries together fit in half a bucket merge, so a split undone by removals does
 * not leave two thin buckets behind (and the split at CAP and the merge at CAP / 2 cannot chase
 * each other). */
#define MERGE_AT (PLX_NAMEBKT_CAP / 2)

/* p->bkt (depth d >= 1) and its buddy (the other half of the range of depth d - 1) merge into a
 * new bucket of depth d - 1 while both are buckets of depth d holding at most MERGE_AT entries
 * together. The new bucket is written and flushed with its claim before the one in-place write
 * of the node that links it; the two old buckets are then garbage for the collector (a crash
 * before that write leaves them linked and the new one leaked). *merged tells whether it did. */
static int bucket_merge(plx_store *st, struct path *p, bool *merged)
{
    *merged = false;
    struct plx_namebkt_block *b = p->bkt;
    if (b->depth == 0)
        return 0;
    unsigned width = PLX_NAMEIDX_FANOUT >> b->depth;
    unsigned buddy_lo = b->lo ^ width;
    uint64_t buddy_addr = p->node->children[buddy_lo];
    struct plx_namebkt_block *buddy = plx_block_alloc(1);
    bool is_bucket = false;
    int rc = child_read(st, buddy_addr, p->level, buddy, &is_bucket);
    if (rc || !is_bucket || buddy->depth != b->depth || buddy->lo != buddy_lo ||
        b->count + buddy->count > MERGE_AT) {
        plx_block_free(buddy);
        return rc;
    }
    unsigned lo = b->lo < buddy_lo ? b->lo : buddy_lo;
    struct plx_namebkt_block *m = bucket_new(p->level, b->depth - 1, lo);
    memcpy(m->entries, b->entries, b->count * sizeof b->entries[0]);
    memcpy(m->entries + b->count, buddy->entries, buddy->count * sizeof buddy->entries[0]);
    m->count = b->count + buddy->count;
    uint64_t maddr = 0;
    rc = plx_registry_new_block(st, m, PLX_MAGIC_NAMEBKT, &maddr);
    if (!rc)
        rc = plx_registry_durable(st);
    if (!rc) {
        for (unsigned i = 0; i < 2 * width; i++)
            p->node->children[lo + i] = maddr;
        rc = write_in_place(st, p->node, PLX_MAGIC_NAMEIDX, p->node_addr);
    }
    if (!rc) {
        memcpy(p->bkt, m, PLX_BLOCK_SIZE);
        p->bkt_addr = maddr;
        *merged = true;
    }
    plx_block_free(m);
    plx_block_free(buddy);
    return rc;
}

int plx_nameidx_remove(plx_store *st, uint64_t hash, uint64_t id)
{
    if (!st->state.name_index_root)
        return 0;
    struct path p;
    path_init(&p);
    int rc = descend(st, hash, &p);
    bool removed = false;
    for (uint32_t i = 0; !rc && i < p.bkt->count; i++) {
        if (p.bkt->entries[i].hash == hash && p.bkt->entries[i].id == id) {
            p.bkt->entries[i] = p.bkt->entries[--p.bkt->count];
            memset(&p.bkt->entries[p.bkt->count], 0, sizeof p.bkt->entries[0]);
            rc = write_in_place(st, p.bkt, PLX_MAGIC_NAMEBKT, p.bkt_addr);
            removed = true;
            break;
        }
    }
    /* Then merge with the buddy, and the result with its buddy, as far as they are thin. */
    for (bool merged = removed; !rc && merged;)
        rc = bucket_merge(st, &p, &merged);
    path_free(&p);
    return rc;
}

static int walk_node(plx_store *st, uint64_t addr, const struct plx_nameidx_node *n,
                     int (*block)(void *arg, uint64_t addr, const void *blk), void *arg)
{
    int rc = block(arg, addr, n);
    void *child = plx_block_alloc(1);
    /* A bucket of depth d fills 2^(8-d) consecutive entries: visit it once. */
    for (unsigned i = 0; !rc && i < PLX_NAMEIDX_FANOUT; i++) {
        uint64_t c = n->children[i];
        if (i > 0 && c == n->children[i - 1])
            continue;
        bool is_bucket = false;
        rc = child_read(st, c, n->level, child, &is_bucket);
        if (!rc && is_bucket)
            rc = block(arg, c, child);
        else if (!rc)
            rc = walk_node(st, c, child, block, arg);
    }
    plx_block_free(child);
    return rc;
}

int plx_nameidx_walk(plx_store *st, int (*block)(void *arg, uint64_t addr, const void *blk),
                     void *arg)
{
    if (!st->state.name_index_root)
        return 0;
    struct plx_nameidx_node *n = plx_block_alloc(1);
    int rc = node_read(st, st->state.name_index_root, 0, n);
    if (!rc)
        rc = walk_node(st, st->state.name_index_root, n, block, arg);
    plx_block_free(n);
    return rc;
}
