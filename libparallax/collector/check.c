/*
 * check.c - the consistency checker: walks the registry, every snapshot log and every radix tree
 * of the store and compares what is reachable with the allocation bitmaps.
 *
 * The walk reads the medium directly (plx_sync_io into its own buffers), never through the node
 * cache: the cache trusts nodes only after validating them, and the checker wants to see and
 * report exactly what is on disk, on a store opened read-only too.
 *
 * Trees are walked level by level over all trees at once rather than recursively: every child
 * address of a level is collected, sorted, and read in runs of consecutive blocks, so that a
 * store of tens of GiB is read in large, mostly sequential I/Os. A node shared by many trees
 * (through read-only links) is queued the first time it is reached and read once.
 *
 * Per block the checker keeps these bits:
 *   reach  reached at least once (from a live tree, a snapshot log or as a root);
 *   wr     reached writable: the block is a current root, a snapshot log block, or is reached
 *          from a current root through writable links only. The engine writes such blocks in
 *          place, so they must be referenced from exactly one place: any second reference to a
 *          wr block is an error. Links inside snapshot trees do not make a block wr whatever
 *          their bit says: a snapshot's root is the VDI's former current root, frozen with its
 *          writable links, and nothing writes through it again (so the children of a snapshot
 *          root are legitimately linked writable from it and read-only from the current root);
 *   wl     has an owning reference: a writable link anywhere (snapshot trees included), or it
 *          is a current root or log block. The engine only ever creates a writable link to a
 *          block it has just allocated, and every copy of a link (copy-on-write, snapshot,
 *          clone) is made read-only, so a second owning reference is an error too;
 *   dup    already reported as shared, so a block is reported once;
 *   alloc  the allocation bitmaps, as read from the medium.
 *
 * Levels: a tree of height h has its root at level h-1; links of level L >= 1 name nodes of
 * level L-1 in metadata extents; links of level 0 name data blocks in data extents. Deleted VDIs
 * and deleted snapshots are skipped: their blocks are garbage for the collector, so they show up
 * as leaked (allocated, unreachable), which is not an error. Unless a live process holds one
 * open (hold.h): the collector keeps such a tree, so it is walked like a live one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "hold.h"
#include "labelidx.h"
#include "lock.h"
#include "registry.h"
#include "snaplog.h"

#define CK_RUN 64u          /* blocks per read of radix nodes */
#define CK_QD_MAX 32u       /* reads of radix nodes in flight (plx_check_opts.read_depth) */
#define CK_MAX_LINES 10000u /* a badly damaged store must not flood the caller */
#define CK_TYPE_BAD 0xffu   /* catalogue entry with an invalid type */

struct ck_tree {
    size_t vdi;    /* index in ck.vdis */
    uint64_t snap; /* snapshot index, 0 = the VDI's current tree */
    uint64_t root;
};

struct ck_item {
    uint64_t addr;
    size_t tree; /* the tree that reached the node first, for messages */
};

struct ck_list {
    struct ck_item *v;
    size_t n, cap;
};

/* A snapshot-log block's place and skip link, to check the links once the chain is known. */
struct ck_skip {
    uint64_t addr, first, skip, skip_first;
};

struct ck_logblk {
    uint64_t addr;
    size_t vdi;
};

/* A label: of a live snapshot in the log, or of an entry in the label index. */
struct ck_label {
    uint64_t index;
    char label[PLX_LABEL_MAX + 1];
};

struct ck_labels {
    struct ck_label *v;
    size_t n, cap;
};

enum ck_ref_kind { REF_NODE, REF_CUR_ROOT, REF_SNAP_ROOT, REF_LOG, REF_REGISTRY, REF_LIDX };

/* Where a reference comes from; only turned into text when something is wrong. */
struct ck_ref {
    enum ck_ref_kind kind;
    size_t tree;    /* REF_NODE, REF_*_ROOT */
    size_t vdi;     /* REF_LOG */
    uint64_t node;  /* REF_NODE: the node holding the link */
    unsigned level; /* REF_NODE: that node's level */
    unsigned idx;   /* REF_NODE: the entry */
};

struct ck {
    plx_store *st;
    struct plx_check_report *out;
    void (*report)(void *arg, int is_error, const char *line);
    void *arg;
    plx_progress_fn progress; /* may be NULL */
    void *progress_arg;
    uint64_t nb, eb, bmb, next;   /* blocks, blocks per extent, bitmap blocks, extents */
    struct plx_state_block state; /* as on disk now (falls back to the one read at open) */
    uint8_t *types;               /* per extent: catalogue type or CK_TYPE_BAD */
    uint8_t *bm_ok;               /* per extent: its allocation bitmap was read */
    uint64_t *reach, *wr, *wl, *dup, *alloc;
    struct plx_vdi_record *vdis; /* valid, live records */
    size_t nvdis;
    struct ck_tree *trees;
    size_t ntrees, trees_cap;
    struct ck_logblk *logs;
    size_t nlogs, logs_cap;
    struct ck_skip *skips; /* the log blocks of the VDI being checked, newest first */
    size_t nskips, skips_cap;
    struct ck_labels log_labels, idx_labels; /* of the VDI being checked */
    size_t lidx_vdi;                         /* while walking its label index */
    struct ck_list levels[PLX_HEIGHT_LARGE];
    unsigned read_depth; /* radix node reads in flight, 1..CK_QD_MAX */
    uint8_t *iobuf;      /* read_depth runs of CK_RUN blocks */
    uint8_t *blkbuf; /* one block */
    uint64_t lines, suppressed;
    int nomem;
    bool incomplete; /* some reference could not be followed: "leaks" may be live blocks */
};

/* ---- Bits ------------------------------------------------------------------------------------ */

static inline bool bit_test(const uint64_t *m, uint64_t i)
{
    return (m[i >> 6] >> (i & 63)) & 1;
}

static inline void bit_set(uint64_t *m, uint64_t i)
{
    m[i >> 6] |= 1ull << (i & 63);
}

static inline void bit_clear(uint64_t *m, uint64_t i)
{
    m[i >> 6] &= ~(1ull << (i & 63));
}

/* ---- Reporting ------------------------------------------------------------------------------- */

static void progress(const struct ck *c, const char *step, uint64_t done, uint64_t total)
{
    if (c->progress)
        c->progress(c->progress_arg, step, done, total);
}

static void problem(struct ck *c, int is_error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(struct ck *c, int is_error, const char *fmt, ...)
{
    if (is_error)
        c->out->errors++;
    if (!c->report)
        return;
    if (c->lines >= CK_MAX_LINES) {
        c->suppressed++;
        return;
    }
    c->lines++;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->report(c->arg, is_error, line);
}

static const char *type_name(unsigned t)
{
    switch (t) {
    case PLX_EXTENT_UNUSED:
        return "unused";
    case PLX_EXTENT_SYSTEM:
        return "system";
    case PLX_EXTENT_METADATA:
        return "metadata";
    case PLX_EXTENT_DATA:
        return "data";
    default:
        return "invalid";
    }
}

static void tree_name(const struct ck *c, size_t t, char *buf, size_t len)
{
    const struct ck_tree *tr = &c->trees[t];
    if (tr->snap)
        snprintf(buf, len, "snapshot %s@%llu", c->vdis[tr->vdi].name, (unsigned long long)tr->snap);
    else
        snprintf(buf, len, "VDI %s", c->vdis[tr->vdi].name);
}

static void ref_text(const struct ck *c, const struct ck_ref *r, char *buf, size_t len)
{
    char tn[PLX_NAME_MAX + 40];
    switch (r->kind) {
    case REF_NODE:
        tree_name(c, r->tree, tn, sizeof tn);
        snprintf(buf, len, "radix node %llu (level %u) entry %u in the tree of %s",
                 (unsigned long long)r->node, r->level, r->idx, tn);
        break;
    case REF_CUR_ROOT:
    case REF_SNAP_ROOT:
        tree_name(c, r->tree, tn, sizeof tn);
        snprintf(buf, len, "the root of %s", tn);
        break;
    case REF_LOG:
        snprintf(buf, len, "the snapshot log of VDI %s", c->vdis[r->vdi].name);
        break;
    case REF_REGISTRY:
        snprintf(buf, len, "the VDI registry");
        break;
    case REF_LIDX:
        snprintf(buf, len, "the label index of VDI %s", c->vdis[r->vdi].name);
        break;
    }
}

/* What a block that must be private is, for the message about it being shared. */
static void block_role(const struct ck *c, uint64_t a, char *buf, size_t len)
{
    buf[0] = 0;
    for (size_t t = 0; t < c->ntrees; t++) {
        if (c->trees[t].snap == 0 && c->trees[t].root == a) {
            snprintf(buf, len, "; it is the current root of VDI %s, which must be private",
                     c->vdis[c->trees[t].vdi].name);
            return;
        }
    }
    for (size_t i = 0; i < c->nlogs; i++) {
        if (c->logs[i].addr == a) {
            snprintf(buf, len, "; it is a snapshot log block of VDI %s",
                     c->vdis[c->logs[i].vdi].name);
            return;
        }
    }
}

/* ---- Addresses and references ---------------------------------------------------------------- */

/* NULL if block a may hold something of extent type `want`; otherwise why not. */
static const char *addr_problem(const struct ck *c, uint64_t a, unsigned want, char *buf,
                                size_t len)
{
    if (a >= c->nb) {
        snprintf(buf, len, "beyond the end of the store (%llu blocks)", (unsigned long long)c->nb);
        return buf;
    }
    uint64_t e = a / c->eb;
    unsigned t = c->types[e];
    if (t == PLX_EXTENT_SYSTEM)
        snprintf(buf, len, "in the system extent");
    else if (t == PLX_EXTENT_UNUSED)
        snprintf(buf, len, "in extent %llu, which is unused", (unsigned long long)e);
    else if (t == CK_TYPE_BAD)
        snprintf(buf, len, "in extent %llu, whose catalogue type is invalid",
                 (unsigned long long)e);
    else if (a % c->eb < c->bmb)
        snprintf(buf, len, "in the allocation bitmap of extent %llu", (unsigned long long)e);
    else if (t != want)
        snprintf(buf, len, "in %s extent %llu (%s expected)", type_name(t), (unsigned long long)e,
                 type_name(want));
    else
        return NULL;
    return buf;
}

enum { REF_AGAIN = 0, REF_NEW = 1, REF_NEW_UNALLOCATED = 2 };

/* Record one reference to block a (already known to be a valid address for its use). `wr`: the
 * reference reaches the block writable from a current tree (see the top of the file); `wl`: it
 * is an owning reference. Reports a block that is shared when it must not be, once per block. */
static int ref_block(struct ck *c, uint64_t a, bool wr, bool wl, const struct ck_ref *r)
{
    if (bit_test(c->reach, a)) {
        bool shared_private = bit_test(c->wr, a) || wr;
        bool two_owners = bit_test(c->wl, a) && wl;
        if (wr)
            bit_set(c->wr, a);
        if (wl)
            bit_set(c->wl, a);
        if ((shared_private || two_owners) && !bit_test(c->dup, a)) {
            bit_set(c->dup, a);
            char from[PLX_NAME_MAX + 128], role[PLX_NAME_MAX + 64];
            ref_text(c, r, from, sizeof from);
            block_role(c, a, role, sizeof role);
            problem(c, 1,
                    "block %llu is reachable writable from more than one tree/place: %s again "
                    "from %s%s",
                    (unsigned long long)a, shared_private ? "reached" : "linked writable", from,
                    role);
        }
        return REF_AGAIN;
    }
    bit_set(c->reach, a);
    if (wr)
        bit_set(c->wr, a);
    if (wl)
        bit_set(c->wl, a);
    if (c->bm_ok[a / c->eb] && !bit_test(c->alloc, a))
        return REF_NEW_UNALLOCATED;
    return REF_NEW;
}

static int list_push(struct ck *c, struct ck_list *l, uint64_t addr, size_t tree)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        struct ck_item *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            c->nomem = 1;
            return -ENOMEM;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].addr = addr;
    l->v[l->n].tree = tree;
    l->n++;
    return 0;
}

/* ---- Superblock, state, catalogue, bitmaps --------------------------------------------------- */

static int check_system(struct ck *c)
{
    plx_store *st = c->st;
    int rc = plx_sync_io(st, PLX_IO_READ, 0, 2, c->iobuf, 0);
    if (rc)
        return plx_err(st, rc, "check: reading the superblock and state block: %s", strerror(-rc));
    const char *why = "";
    if (plx_blkhdr_verify(c->iobuf, PLX_MAGIC_SUPER, 0, &why))
        problem(c, 1, "superblock is corrupt: %s", why);
    else if (memcmp(c->iobuf, &st->sb, sizeof st->sb) != 0)
        problem(c, 1, "superblock differs from the one read when the store was opened");

    const uint8_t *sblk = c->iobuf + PLX_BLOCK_SIZE;
    c->state = st->state;
    if (plx_blkhdr_verify(sblk, PLX_MAGIC_STATE_V2, st->sb.state_block, &why))
        problem(c, 1, "system state block is corrupt: %s (using the copy read at open)", why);
    else
        memcpy(&c->state, sblk, sizeof c->state);
    if (c->state.registry_used > st->sb.registry_slots) {
        problem(c, 1, "system state block: %llu registry slots used, beyond the %llu there are",
                (unsigned long long)c->state.registry_used,
                (unsigned long long)st->sb.registry_slots);
        c->state.registry_used = st->sb.registry_slots;
    }
    if (c->state.next_vdi_id == 0)
        problem(c, 1, "system state block: next VDI id is 0");

    /* The catalogue: a block that does not validate is reported and its extents keep the types
     * read at open, so the walk can still go on. */
    for (uint64_t b0 = 0; b0 < st->sb.catalogue_blocks; b0 += CK_RUN) {
        uint64_t n = st->sb.catalogue_blocks - b0 < CK_RUN ? st->sb.catalogue_blocks - b0 : CK_RUN;
        rc = plx_sync_io(st, PLX_IO_READ, st->sb.catalogue_start + b0, (uint32_t)n, c->iobuf, 0);
        if (rc)
            return plx_err(st, rc, "check: reading the extent catalogue: %s", strerror(-rc));
        for (uint64_t i = 0; i < n; i++) {
            uint64_t b = b0 + i, addr = st->sb.catalogue_start + b;
            const struct plx_catalog_block *cb =
                (const struct plx_catalog_block *)(c->iobuf + i * PLX_BLOCK_SIZE);
            uint64_t first = b * PLX_CATALOG_PER_BLOCK;
            uint64_t want =
                c->next - first < PLX_CATALOG_PER_BLOCK ? c->next - first : PLX_CATALOG_PER_BLOCK;
            uint64_t have = 0; /* entries of this block that can be believed */
            if (plx_blkhdr_verify(cb, PLX_MAGIC_CATALOG, addr, &why))
                problem(c, 1, "extent catalogue block %llu is corrupt: %s",
                        (unsigned long long)addr, why);
            else if (cb->first_extent != first || cb->count > PLX_CATALOG_PER_BLOCK)
                problem(c, 1, "extent catalogue block %llu is corrupt: wrong extent range",
                        (unsigned long long)addr);
            else if ((have = cb->count < want ? cb->count : want) < want)
                problem(c, 1, "extent catalogue block %llu holds %u entries, %llu expected",
                        (unsigned long long)addr, cb->count, (unsigned long long)want);
            for (uint64_t k = 0; k < want; k++) {
                uint64_t e = first + k;
                unsigned t = k < have ? cb->entries[k].type : st->cat[e].type;
                bool ok = t <= PLX_EXTENT_DATA && (e == 0) == (t == PLX_EXTENT_SYSTEM);
                if (!ok && k < have)
                    problem(c, 1, "extent catalogue: extent %llu has invalid type %u",
                            (unsigned long long)e, t);
                c->types[e] = ok ? (uint8_t)t : CK_TYPE_BAD;
            }
        }
    }
    return 0;
}

static void read_bitmaps(struct ck *c)
{
    /* Extents up to 32 GiB have a bitmap that fits the run buffer; larger ones get their own. */
    uint8_t *bits = c->iobuf;
    uint8_t *own = NULL;
    if (c->bmb > CK_RUN) {
        own = plx_block_alloc(c->bmb);
        bits = own;
    }
    for (uint64_t e = 1; e < c->next; e++) {
        progress(c, "reading bitmaps", e, c->next);
        if (c->types[e] != PLX_EXTENT_METADATA && c->types[e] != PLX_EXTENT_DATA)
            continue;
        int rc = plx_sync_io(c->st, PLX_IO_READ, e * c->eb, (uint32_t)c->bmb, bits, 0);
        if (rc) {
            problem(c, 1,
                    "reading the allocation bitmap of extent %llu: %s (its blocks are "
                    "not checked against it)",
                    (unsigned long long)e, strerror(-rc));
            continue;
        }
        memcpy(c->alloc + e * c->eb / 64, bits, c->eb / 8);
        c->bm_ok[e] = 1;
        for (uint64_t b = 0; b < c->bmb; b++) {
            if (!bit_test(c->alloc, e * c->eb + b)) {
                problem(c, 1,
                        "the allocation bitmap of extent %llu does not mark its own "
                        "block %llu allocated",
                        (unsigned long long)e, (unsigned long long)(e * c->eb + b));
                break;
            }
        }
    }
    if (own)
        plx_block_free(own);
}

/* ---- Registry -------------------------------------------------------------------------------- */

static const char *record_problem(const struct ck *c, const struct plx_vdi_record *r)
{
    if (r->id == 0 || r->id >= c->state.next_vdi_id)
        return "its id is outside the ids given out";
    if (r->size == 0 || r->size % PLX_BLOCK_SIZE || r->size > PLX_MAX_VDI_SIZE)
        return "invalid size";
    if ((r->height != PLX_HEIGHT_SMALL && r->height != PLX_HEIGHT_LARGE) ||
        r->height < plx_height_for_size(r->size))
        return "invalid tree height";
    if (r->root == 0 || r->root >= c->nb)
        return "its root is beyond the store";
    if (r->name[PLX_NAME_MAX] != 0 || r->name[0] == 0)
        return "invalid name";
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_name(const void *a, const void *b)
{
    const struct plx_vdi_record *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* A block of the registry (VDI table, name index, a record outside the legacy slots): private
 * to the registry, in a metadata extent, allocated. */
static void registry_ref(struct ck *c, uint64_t addr, const char *what)
{
    char why_buf[128];
    bool legacy = plx_registry_legacy_slot(c->st, addr);
    const char *why = legacy ? NULL : addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf,
                                                   sizeof why_buf);
    if (why) {
        c->incomplete = true;
        problem(c, 1, "%s %llu is outside the metadata extents: %s", what,
                (unsigned long long)addr, why);
        return;
    }
    struct ck_ref r = {.kind = REF_REGISTRY};
    if (ref_block(c, addr, true, true, &r) == REF_NEW_UNALLOCATED)
        problem(c, 1, "%s %llu is not allocated in the bitmap of extent %llu", what,
                (unsigned long long)addr, (unsigned long long)(addr / c->eb));
}

struct ck_reg {
    struct ck *c;
    struct plx_vdi_record *all;
    size_t nall, cap;
    bool *named;     /* per record of all[]: the name index has its entry */
    uint64_t stale;  /* index entries no live VDI stands behind */
};

static int ck_table_block(void *arg, uint64_t addr)
{
    struct ck_reg *r = arg;
    registry_ref(r->c, addr, "VDI table block");
    return 0;
}

static int ck_table_entry(void *arg, uint64_t id, uint64_t addr)
{
    struct ck_reg *r = arg;
    struct ck *c = r->c;
    plx_store *st = c->st;
    if (addr >= c->nb) {
        c->incomplete = true;
        problem(c, 1, "VDI table: the record of id %llu is at block %llu, beyond the store",
                (unsigned long long)id, (unsigned long long)addr);
        return 0;
    }
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, c->blkbuf, 0);
    if (rc) {
        c->incomplete = true;
        problem(c, 1, "reading the VDI record of id %llu at block %llu: %s",
                (unsigned long long)id, (unsigned long long)addr, strerror(-rc));
        return 0;
    }
    const char *why = "";
    if (plx_blkhdr_verify(c->blkbuf, PLX_MAGIC_VDI, addr, &why)) {
        c->incomplete = true;
        problem(c, 1, "VDI record of id %llu at block %llu is corrupt: %s",
                (unsigned long long)id, (unsigned long long)addr, why);
        return 0;
    }
    if (r->nall == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        struct plx_vdi_record *a = realloc(r->all, cap * sizeof *a);
        if (!a)
            return -ENOMEM;
        r->all = a;
        r->cap = cap;
    }
    struct plx_vdi_record *rec = &r->all[r->nall];
    memcpy(rec, c->blkbuf, sizeof *rec);
    const char *bad = record_problem(c, rec);
    if (!bad && rec->id != id)
        bad = "its id differs from its place in the VDI table";
    if (bad) {
        c->incomplete = true;
        problem(c, 1, "VDI record at block %llu (id %llu) is invalid: %s",
                (unsigned long long)addr, (unsigned long long)id, bad);
        return 0;
    }
    /* A deleted VDI's record is garbage the collector takes with the rest of the VDI. */
    if (!(rec->flags & PLX_VDI_DELETED))
        registry_ref(c, addr, "VDI record");
    r->nall++;
    return 0;
}

static int cmp_rec_id(const void *key, const void *elem)
{
    uint64_t id = *(const uint64_t *)key, e = ((const struct plx_vdi_record *)elem)->id;
    return id < e ? -1 : id > e;
}

static int ck_index_block(void *arg, uint64_t addr, const void *blk)
{
    struct ck_reg *r = arg;
    registry_ref(r->c, addr, "name index block");
    const struct plx_namebkt_block *b = blk;
    if (b->hdr.magic != PLX_MAGIC_NAMEBKT)
        return 0;
    unsigned width = PLX_NAMEIDX_FANOUT >> b->depth;
    for (uint32_t i = 0; i < b->count; i++) {
        uint64_t h = b->entries[i].hash;
        unsigned byte = (unsigned)(h >> (56 - 8 * b->level)) & 0xffu;
        if (byte < b->lo || byte >= b->lo + width) {
            problem(r->c, 1, "name index bucket %llu holds an entry (VDI %llu) that belongs "
                             "elsewhere: lookups miss it",
                    (unsigned long long)addr, (unsigned long long)b->entries[i].id);
            continue;
        }
        const struct plx_vdi_record *rec =
            bsearch(&b->entries[i].id, r->all, r->nall, sizeof *r->all, cmp_rec_id);
        if (rec && !(rec->flags & PLX_VDI_DELETED) && plx_name_hash(rec->name) == h)
            r->named[rec - r->all] = true;
        else
            r->stale++;
    }
    return 0;
}

static int check_registry(struct ck *c)
{
    plx_store *st = c->st;
    struct ck_reg reg = {.c = c};
    /* The walkers read the state's roots from st->state: use the state block as read now. */
    struct plx_state_block saved = st->state;
    st->state = c->state;
    int rc = plx_vditab_walk(st, 0, ck_table_block, ck_table_entry, &reg);
    if (rc == -ENOMEM)
        goto out;
    if (rc) {
        c->incomplete = true;
        problem(c, 1, "VDI table: %s", st->errmsg);
        rc = 0;
    }
    reg.named = calloc(reg.nall ? reg.nall : 1, sizeof *reg.named);
    if (!reg.named) {
        rc = -ENOMEM;
        goto out;
    }
    rc = plx_nameidx_walk(st, ck_index_block, &reg);
    if (rc && rc != -ENOMEM) {
        c->incomplete = true;
        problem(c, 1, "name index: %s", st->errmsg);
        for (size_t i = 0; i < reg.nall; i++)
            reg.named[i] = true; /* unknown: not reported as missing */
        rc = 0;
    }
    for (size_t i = 0; !rc && i < reg.nall; i++)
        if (!reg.named[i] && !(reg.all[i].flags & PLX_VDI_DELETED))
            problem(c, 1, "VDI %s (id %llu) is missing from the name index: opening it by name "
                          "fails",
                    reg.all[i].name, (unsigned long long)reg.all[i].id);
    if (!rc && reg.stale)
        problem(c, 0, "name index: %llu entries name no live VDI (left by an interrupted create "
                      "or delete; harmless, removed by later creates and gc)",
                (unsigned long long)reg.stale);
out:
    st->state = saved;
    free(reg.named);
    if (rc) {
        free(reg.all);
        return rc;
    }
    struct plx_vdi_record *all = reg.all ? reg.all : calloc(1, sizeof *all);
    size_t nall = reg.nall;
    if (!all)
        return -ENOMEM;

    /* Ids are never reused, deleted VDIs included; live names are unique. */
    uint64_t *ids = calloc(nall ? nall : 1, sizeof *ids);
    const struct plx_vdi_record **byname = calloc(nall ? nall : 1, sizeof *byname);
    if (!ids || !byname) {
        free(ids);
        free(byname);
        free(all);
        return -ENOMEM;
    }
    size_t nlive = 0;
    for (size_t i = 0; i < nall; i++) {
        ids[i] = all[i].id;
        if (!(all[i].flags & PLX_VDI_DELETED))
            byname[nlive++] = &all[i];
    }
    qsort(ids, nall, sizeof *ids, cmp_u64);
    for (size_t i = 1; i < nall; i++)
        if (ids[i] == ids[i - 1] && (i == 1 || ids[i - 2] != ids[i]))
            problem(c, 1, "VDI registry: more than one record has id %llu",
                    (unsigned long long)ids[i]);
    qsort(byname, nlive, sizeof *byname, cmp_name);
    for (size_t i = 1; i < nlive; i++)
        if (strcmp(byname[i]->name, byname[i - 1]->name) == 0 &&
            (i == 1 || strcmp(byname[i - 2]->name, byname[i]->name) != 0))
            problem(c, 1, "VDI registry: more than one live VDI is named '%s'", byname[i]->name);
    free(ids);
    free(byname);

    /* Keep the live records only: deleted VDIs are not walked. */
    size_t k = 0;
    for (size_t i = 0; i < nall; i++)
        if (!(all[i].flags & PLX_VDI_DELETED))
            all[k++] = all[i];
    c->vdis = all;
    c->nvdis = k;
    return 0;
}

/* ---- Snapshot logs --------------------------------------------------------------------------- */

static void add_root(struct ck *c, size_t t);

static int tree_add(struct ck *c, size_t vdi, uint64_t snap, uint64_t root)
{
    if (c->ntrees == c->trees_cap) {
        size_t cap = c->trees_cap ? 2 * c->trees_cap : 64;
        struct ck_tree *t = realloc(c->trees, cap * sizeof *t);
        if (!t)
            return -ENOMEM;
        c->trees = t;
        c->trees_cap = cap;
    }
    c->trees[c->ntrees].vdi = vdi;
    c->trees[c->ntrees].snap = snap;
    c->trees[c->ntrees].root = root;
    c->ntrees++;
    return 0;
}

static int log_add(struct ck *c, uint64_t addr, size_t vdi)
{
    if (c->nlogs == c->logs_cap) {
        size_t cap = c->logs_cap ? 2 * c->logs_cap : 64;
        struct ck_logblk *l = realloc(c->logs, cap * sizeof *l);
        if (!l)
            return -ENOMEM;
        c->logs = l;
        c->logs_cap = cap;
    }
    c->logs[c->nlogs].addr = addr;
    c->logs[c->nlogs].vdi = vdi;
    c->nlogs++;
    return 0;
}

static int skip_add(struct ck *c, const struct plx_snaplog_block *b, uint64_t addr)
{
    if (c->nskips == c->skips_cap) {
        size_t cap = c->skips_cap ? 2 * c->skips_cap : 64;
        struct ck_skip *s = realloc(c->skips, cap * sizeof *s);
        if (!s)
            return -ENOMEM;
        c->skips = s;
        c->skips_cap = cap;
    }
    c->skips[c->nskips++] =
        (struct ck_skip){.addr = addr, .first = b->first_index, .skip = b->skip,
                         .skip_first = b->skip_first};
    return 0;
}

/* Every block but the head is full (block k holds snapshots k * 63 + 1 ..), and a skip link
 * names an older block of the same chain by address and first_index (0: none). c->skips holds
 * the chain newest first, so block k is entry nskips - 1 - k. */
static void check_skips(struct ck *c, const struct plx_vdi_record *rec)
{
    size_t n = c->nskips;
    for (size_t i = 0; i < n; i++) {
        const struct ck_skip *s = &c->skips[i];
        uint64_t k = n - 1 - i;
        if (s->first != k * PLX_SNAPLOG_PER_BLOCK + 1) {
            problem(c, 1, "snapshot log block %llu of VDI %s holds snapshots from %llu, not %llu "
                          "(an older block is not full)",
                    (unsigned long long)s->addr, rec->name, (unsigned long long)s->first,
                    (unsigned long long)(k * PLX_SNAPLOG_PER_BLOCK + 1));
            return;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const struct ck_skip *s = &c->skips[i];
        if (!s->skip)
            continue;
        uint64_t tk = s->skip_first ? (s->skip_first - 1) / PLX_SNAPLOG_PER_BLOCK : 0;
        bool ok = s->skip_first && s->skip_first < s->first &&
                  (s->skip_first - 1) % PLX_SNAPLOG_PER_BLOCK == 0 && tk < n &&
                  c->skips[n - 1 - tk].addr == s->skip;
        if (!ok)
            problem(c, 1, "snapshot log block %llu of VDI %s has a bad skip link to block %llu "
                          "(snapshots from %llu)",
                    (unsigned long long)s->addr, rec->name, (unsigned long long)s->skip,
                    (unsigned long long)s->skip_first);
    }
}

static int label_push(struct ck *c, struct ck_labels *l, uint64_t index, const char *label)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct ck_label *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            c->nomem = 1;
            return -ENOMEM;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].index = index;
    memcpy(l->v[l->n].label, label, PLX_LABEL_MAX);
    l->v[l->n].label[PLX_LABEL_MAX] = 0;
    l->n++;
    return 0;
}

static int cmp_label(const void *a, const void *b)
{
    const struct ck_label *x = a, *y = b;
    if (x->index != y->index)
        return x->index < y->index ? -1 : 1;
    return strcmp(x->label, y->label);
}

/* One node of a VDI's label index: a private block, allocated; a leaf's entries sit where their
 * label's hash leads. */
static int label_index_node(void *arg, uint64_t addr, const struct plx_lidx_block *node,
                            uint64_t parent, uint64_t path, const char *why)
{
    struct ck *c = arg;
    const struct plx_vdi_record *rec = &c->vdis[c->lidx_vdi];
    char why_buf[128];
    const char *bad = addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
    if (bad) {
        problem(c, 1, "label index of VDI %s links to block %llu: %s", rec->name,
                (unsigned long long)addr, bad);
        c->incomplete = true;
        return 0;
    }
    struct ck_ref r = {.kind = REF_LIDX, .vdi = c->lidx_vdi};
    int rr = ref_block(c, addr, true, true, &r);
    if (rr == REF_AGAIN)
        return 0; /* reported by ref_block */
    if (rr == REF_NEW_UNALLOCATED)
        problem(c, 1, "label index node %llu of VDI %s is not allocated in the bitmap of extent "
                      "%llu",
                (unsigned long long)addr, rec->name, (unsigned long long)(addr / c->eb));
    if (!node) {
        problem(c, 1, "label index node %llu of VDI %s is corrupt: %s", (unsigned long long)addr,
                rec->name, why);
        c->incomplete = true;
        return 0;
    }
    if (node->kind != PLX_LIDX_LEAF)
        return 0;
    uint64_t mask = node->level ? (~0ull >> (64 - 8 * node->level)) : 0;
    for (uint32_t i = 0; i < node->count; i++) {
        const struct plx_lidx_entry *e = &node->u.entry[i];
        if ((plx_lidx_hash(e->label) & mask) != path) {
            problem(c, 1, "label index node %llu of VDI %s holds label '%s' off its hash path",
                    (unsigned long long)addr, rec->name, e->label);
            continue;
        }
        if (label_push(c, &c->idx_labels, e->index, e->label))
            return -ENOMEM;
    }
    return 0;
}

/* The index must name the label of every live labelled snapshot up to label_indexed (it may
 * hold more: stale entries are checked against the log by every reader). */
static int check_label_index(struct ck *c, size_t vi)
{
    const struct plx_vdi_record *rec = &c->vdis[vi];
    if (rec->label_indexed > rec->snap_count) {
        problem(c, 1, "VDI %s: its label index claims %llu snapshots, its log holds %llu",
                rec->name, (unsigned long long)rec->label_indexed,
                (unsigned long long)rec->snap_count);
        return 0;
    }
    c->idx_labels.n = 0;
    c->lidx_vdi = vi;
    bool was_incomplete = c->incomplete;
    c->incomplete = false;
    int rc = plx_lidx_walk(c->st, rec->id, rec->label_index, label_index_node, c);
    if (rc == -ENOMEM || c->nomem)
        return -ENOMEM;
    bool walked = !c->incomplete;
    c->incomplete = was_incomplete || c->incomplete;
    if (!walked)
        return 0;
    if (c->idx_labels.n)
        qsort(c->idx_labels.v, c->idx_labels.n, sizeof *c->idx_labels.v, cmp_label);
    for (size_t i = 0; i < c->log_labels.n; i++) {
        const struct ck_label *l = &c->log_labels.v[i];
        if (!c->idx_labels.n ||
            !bsearch(l, c->idx_labels.v, c->idx_labels.n, sizeof *l, cmp_label))
            problem(c, 1, "label index of VDI %s lacks snapshot %llu, labelled '%s' (%s@%s "
                          "would not be found)",
                    rec->name, (unsigned long long)l->index, l->label, rec->name, l->label);
    }
    return 0;
}

/* The record's count of deleted snapshots (FORMAT.md §7) against the log's: a deletion named
 * in snap_deleting is counted whether or not its log record says so yet. */
static void check_deleted_count(struct ck *c, const struct plx_vdi_record *rec, uint64_t deleted,
                                bool deleting_done)
{
    if (!(rec->flags & PLX_VDI_SNAPS_COUNTED))
        return; /* a record from before the count: the next writable open counts */
    if (rec->snap_deleting > rec->snap_count) {
        problem(c, 1, "VDI %s: its record names snapshot %llu as being deleted, of %llu",
                rec->name, (unsigned long long)rec->snap_deleting,
                (unsigned long long)rec->snap_count);
        return;
    }
    uint64_t want = deleted + (rec->snap_deleting && !deleting_done);
    if (rec->snap_deleted != want)
        problem(c, 1,
                "VDI %s: its record counts %llu deleted snapshots, its log %llu%s "
                "(vdi-list shows the wrong number of snapshots)",
                rec->name, (unsigned long long)rec->snap_deleted, (unsigned long long)deleted,
                rec->snap_deleting && !deleting_done ? " and one being deleted" : "");
}

/* Follow one VDI's log from its head; every complete, non-deleted snapshot becomes a tree.
 * Records beyond snap_count belong to a snapshot that never completed and are ignored. */
static int check_log(struct ck *c, size_t vi)
{
    const struct plx_vdi_record *rec = &c->vdis[vi];
    uint64_t expect = rec->snap_count, addr = rec->snaplog_head, steps = 0;
    struct plx_snaplog_block *b = (struct plx_snaplog_block *)c->blkbuf;
    char why_buf[128];
    uint64_t deleted = 0;
    bool deleting_done = false; /* the log record of snap_deleting says deleted */
    c->nskips = 0;
    c->log_labels.n = 0;
    if (expect == 0 && addr != 0) {
        problem(c, 1,
                "VDI %s: snapshot log head is block %llu but the record counts no "
                "snapshots",
                rec->name, (unsigned long long)addr);
        goto stopped;
    }
    while (expect > 0) {
        if (addr == 0) {
            problem(c, 1,
                    "snapshot log of VDI %s ends before snapshot %llu (the record counts "
                    "%llu)",
                    rec->name, (unsigned long long)expect, (unsigned long long)rec->snap_count);
            goto stopped;
        }
        if (++steps > rec->snap_count) {
            problem(c, 1, "snapshot log of VDI %s has more blocks than snapshots (a loop?)",
                    rec->name);
            goto stopped;
        }
        const char *why = addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
        if (why) {
            problem(c, 1,
                    "snapshot log of VDI %s links to block %llu, outside the metadata "
                    "extents: %s",
                    rec->name, (unsigned long long)addr, why);
            goto stopped;
        }
        struct ck_ref r = {.kind = REF_LOG, .vdi = vi};
        int rr = ref_block(c, addr, true, true, &r);
        if (rr == REF_AGAIN)
            goto stopped; /* reported by ref_block; following it again could loop */
        if (log_add(c, addr, vi))
            return -ENOMEM;
        if (rr == REF_NEW_UNALLOCATED)
            problem(c, 1,
                    "snapshot log block %llu of VDI %s is not allocated in the bitmap of "
                    "extent %llu",
                    (unsigned long long)addr, rec->name, (unsigned long long)(addr / c->eb));
        int rc = plx_sync_io(c->st, PLX_IO_READ, addr, 1, b, 0);
        if (rc) {
            problem(c, 1, "reading snapshot log block %llu of VDI %s: %s", (unsigned long long)addr,
                    rec->name, strerror(-rc));
            goto stopped;
        }
        if (plx_blkhdr_verify(b, PLX_MAGIC_SNAPLOG, addr, &why)) {
            problem(c, 1, "snapshot log block %llu of VDI %s is corrupt: %s",
                    (unsigned long long)addr, rec->name, why);
            goto stopped;
        }
        if (b->vdi_id != rec->id) {
            problem(c, 1, "snapshot log block %llu of VDI %s belongs to VDI %llu",
                    (unsigned long long)addr, rec->name, (unsigned long long)b->vdi_id);
            goto stopped;
        }
        if (b->count == 0 || b->count > PLX_SNAPLOG_PER_BLOCK || b->first_index == 0) {
            problem(c, 1, "snapshot log block %llu of VDI %s has a bad record count",
                    (unsigned long long)addr, rec->name);
            goto stopped;
        }
        uint64_t last = b->first_index + b->count - 1;
        if (b->first_index > expect || last < expect) {
            problem(c, 1,
                    "snapshot log block %llu of VDI %s holds snapshots %llu to %llu, "
                    "not snapshot %llu (the record counts %llu)",
                    (unsigned long long)addr, rec->name, (unsigned long long)b->first_index,
                    (unsigned long long)last, (unsigned long long)expect,
                    (unsigned long long)rec->snap_count);
            goto stopped;
        }
        for (uint64_t idx = b->first_index; idx <= expect; idx++) {
            const struct plx_snap_record *sr = &b->records[idx - b->first_index];
            if (sr->flags & PLX_SNAP_DELETED) {
                deleted++;
                deleting_done |= idx == rec->snap_deleting;
                continue;
            }
            if (sr->label[0] && idx <= rec->label_indexed &&
                label_push(c, &c->log_labels, idx, sr->label))
                return -ENOMEM;
            c->out->snapshots++;
            if (tree_add(c, vi, idx, sr->root))
                return -ENOMEM;
        }
        if (skip_add(c, b, addr))
            return -ENOMEM;
        expect = b->first_index - 1;
        addr = b->prev;
    }
    if (addr != 0)
        problem(c, 1,
                "snapshot log of VDI %s: the block holding snapshot 1 links to an older "
                "block %llu",
                rec->name, (unsigned long long)addr);
    check_skips(c, rec);
    check_deleted_count(c, rec, deleted, deleting_done);
    return check_label_index(c, vi);
stopped:
    c->incomplete = true;
    return 0;
}

/* ---- Trees held open by live processes ------------------------------------------------------- */

/* The extents' reclaim records (FORMAT.md §6.1): live while their catalogue entry names them,
 * not radix nodes. One an older collector freed (not a record any more) is no error: readers
 * check every block of it, and the next collection unlinks it. */
static void reclaim_records(struct ck *c)
{
    plx_store *st = c->st;
    struct plx_reclaim_req *q = plx_block_alloc(1);
    for (uint64_t e = 1; q && st->cat && e < c->next; e++) {
        uint64_t addr = st->cat[e].reclaim;
        const char *why = "";
        if (!addr || addr >= c->nb || plx_sync_io(st, PLX_IO_READ, addr, 1, q, 0) != 0 ||
            plx_blkhdr_verify(q, PLX_MAGIC_RECLAIM_REQ, addr, &why) != 0 || q->extent != e ||
            q->bits_blocks > PLX_RECLAIM_MAX_BITS_BLOCKS)
            continue;
        uint64_t blocks[2 + PLX_RECLAIM_MAX_BITS_BLOCKS];
        size_t n = 0;
        blocks[n++] = addr;
        blocks[n++] = q->ack_addr;
        for (uint32_t k = 0; k < q->bits_blocks; k++)
            blocks[n++] = q->bits_addr[k];
        for (size_t i = 0; i < n; i++) {
            uint64_t a = blocks[i];
            if (a >= c->nb)
                continue;
            if (bit_test(c->reach, a))
                problem(c, 1,
                        "block %llu of extent %llu's reclaim record is reachable from a tree "
                        "or another record too",
                        (unsigned long long)a, (unsigned long long)e);
            bit_set(c->reach, a);
        }
    }
    plx_block_free(q);
}

/* A tree a live process reads (hold.h) that no live VDI or snapshot reaches: its snapshot or VDI
 * was deleted, and the collector keeps it until the holder lets go. Walked like the rest, under
 * its VDI's record, or a stand-in naming the deleted VDI. */
static int hold_tree(void *arg, const struct plx_hold *h)
{
    struct ck *c = arg;
    if (h->root == 0 || h->root >= c->nb || bit_test(c->reach, h->root))
        return 0; /* a live tree, walked already (or nothing to walk) */
    if (h->height < PLX_HEIGHT_SMALL || h->height > PLX_HEIGHT_LARGE) {
        problem(c, 1, "hold table: a tree held open by pid %u has %u levels", h->pid, h->height);
        return 0;
    }
    size_t vi = 0;
    while (vi < c->nvdis && !(c->vdis[vi].id == h->vdi_id && c->vdis[vi].height == h->height))
        vi++;
    if (vi == c->nvdis) {
        struct plx_vdi_record *v = realloc(c->vdis, (c->nvdis + 1) * sizeof *v);
        if (!v)
            return -ENOMEM;
        c->vdis = v;
        memset(&v[vi], 0, sizeof v[vi]);
        v[vi].id = h->vdi_id;
        v[vi].height = h->height;
        v[vi].flags = PLX_VDI_DELETED;
        snprintf(v[vi].name, sizeof v[vi].name, "(deleted VDI %llu, held open by pid %u)",
                 (unsigned long long)h->vdi_id, h->pid);
        c->nvdis++;
    }
    int rc = tree_add(c, vi, h->snap, h->root);
    if (!rc)
        add_root(c, c->ntrees - 1);
    return rc;
}

/* ---- Radix trees ----------------------------------------------------------------------------- */

static void add_root(struct ck *c, size_t t)
{
    const struct ck_tree *tr = &c->trees[t];
    const struct plx_vdi_record *rec = &c->vdis[tr->vdi];
    char tn[PLX_NAME_MAX + 40], why_buf[128];
    tree_name(c, t, tn, sizeof tn);
    const char *why = tr->root == 0
                          ? "block 0"
                          : addr_problem(c, tr->root, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
    if (why) {
        c->incomplete = true;
        problem(c, 1, "the radix root %llu of %s is outside the metadata extents: %s",
                (unsigned long long)tr->root, tn, why);
        return;
    }
    c->out->trees++;
    struct ck_ref r = {.kind = tr->snap ? REF_SNAP_ROOT : REF_CUR_ROOT, .tree = t};
    int rr = ref_block(c, tr->root, tr->snap == 0, tr->snap == 0, &r);
    if (rr == REF_NEW_UNALLOCATED)
        problem(c, 1, "the radix root %llu of %s is not allocated in the bitmap of extent %llu",
                (unsigned long long)tr->root, tn, (unsigned long long)(tr->root / c->eb));
    if (rr != REF_AGAIN)
        list_push(c, &c->levels[rec->height - 1], tr->root, t);
}

static int cmp_item(const void *a, const void *b)
{
    const struct ck_item *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static void node_links(struct ck *c, const struct ck_item *it, unsigned level,
                       const uint64_t *links)
{
    bool node_wr = bit_test(c->wr, it->addr);
    unsigned want = level ? PLX_EXTENT_METADATA : PLX_EXTENT_DATA;
    unsigned nbad = 0, bad_idx = 0, nunalloc = 0, unalloc_idx = 0;
    uint64_t bad_link = 0;
    char bad_why[128] = "", why_buf[128];
    struct ck_ref r = {.kind = REF_NODE, .tree = it->tree, .node = it->addr, .level = level};
    for (unsigned i = 0; i < PLX_RADIX_FANOUT; i++) {
        uint64_t l = links[i];
        if (!l)
            continue;
        const char *why = NULL;
        if (l & PLX_LINK_RESERVED_MASK)
            why = "has reserved bits set";
        else
            why = addr_problem(c, plx_link_addr(l), want, why_buf, sizeof why_buf);
        if (why) {
            if (nbad++ == 0) {
                bad_idx = i;
                bad_link = l;
                snprintf(bad_why, sizeof bad_why, "%s", why);
            }
            continue;
        }
        uint64_t a = plx_link_addr(l);
        r.idx = i;
        int rr = ref_block(c, a, node_wr && !plx_link_ro(l), !plx_link_ro(l), &r);
        if (rr == REF_NEW_UNALLOCATED && nunalloc++ == 0)
            unalloc_idx = i;
        if (rr != REF_AGAIN && level > 0)
            list_push(c, &c->levels[level - 1], a, it->tree);
    }
    if (!nbad && !nunalloc)
        return;
    if (nbad)
        c->incomplete = true;
    char tn[PLX_NAME_MAX + 40];
    tree_name(c, it->tree, tn, sizeof tn);
    if (nbad)
        problem(c, 1,
                "radix node %llu (level %u, in the tree of %s) has %u invalid link%s: "
                "entry %u = 0x%016llx %s",
                (unsigned long long)it->addr, level, tn, nbad, nbad == 1 ? "" : "s", bad_idx,
                (unsigned long long)bad_link, bad_why);
    if (nunalloc)
        problem(c, 1,
                "radix node %llu (level %u, in the tree of %s) has %u link%s to "
                "unallocated blocks: entry %u -> block %llu is not set in its extent's "
                "bitmap",
                (unsigned long long)it->addr, level, tn, nunalloc, nunalloc == 1 ? "" : "s",
                unalloc_idx, (unsigned long long)plx_link_addr(links[unalloc_idx]));
}

/* One read of a run of queued nodes (walk_level keeps up to read_depth of them in flight). */
struct ck_read {
    struct plx_ev ev;
    uint8_t *buf; /* CK_RUN blocks */
    size_t first, n; /* the run: l->v[first .. first + n) */
    int done;
};

static void ck_read_done(plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct ck_read *r = ev->ctx;
    r->done = 1;
}

/* The nodes of one completed run: their links, or what went wrong. */
static void run_links(struct ck *c, struct ck_list *l, unsigned level, struct ck_read *r, int rc)
{
    for (size_t k = r->first; k < r->first + r->n; k++) {
        const uint64_t *links = (const uint64_t *)(r->buf + (k - r->first) * PLX_BLOCK_SIZE);
        int krc = rc;
        if (rc && r->n > 1) {
            /* One bad block must not hide the others of its run. */
            krc = plx_sync_io(c->st, PLX_IO_READ, l->v[k].addr, 1, c->blkbuf, 0);
            links = (const uint64_t *)c->blkbuf;
        }
        if (krc) {
            c->incomplete = true;
            char tn[PLX_NAME_MAX + 40];
            tree_name(c, l->v[k].tree, tn, sizeof tn);
            problem(c, 1, "reading radix node %llu (level %u, in the tree of %s): %s",
                    (unsigned long long)l->v[k].addr, level, tn, strerror(-krc));
            continue;
        }
        node_links(c, &l->v[k], level, links);
    }
}

/* Read every node queued at `level`, in address order, in runs of consecutive blocks, with up to
 * read_depth runs in flight: scattered nodes need the device's queue, not one read at a time.
 * Runs are handled in address order as they complete, so the messages do not depend on timing. */
static void walk_level(struct ck *c, unsigned level)
{
    struct ck_list *l = &c->levels[level];
    if (!l->n)
        return;
    qsort(l->v, l->n, sizeof *l->v, cmp_item);
    char step[40];
    snprintf(step, sizeof step, "walking trees (level %u)", level);
    struct ck_read reads[CK_QD_MAX];
    unsigned head = 0, inflight = 0, qd = c->read_depth;
    size_t next = 0;
    while (next < l->n || inflight) {
        /* Fill the queue. */
        while (next < l->n && inflight < qd) {
            size_t j = next + 1;
            while (j < l->n && j - next < CK_RUN && l->v[j].addr == l->v[j - 1].addr + 1)
                j++;
            struct ck_read *r = &reads[(head + inflight) % qd];
            r->buf = c->iobuf + (size_t)((head + inflight) % qd) * CK_RUN * PLX_BLOCK_SIZE;
            r->first = next;
            r->n = j - next;
            r->done = 0;
            memset(&r->ev, 0, sizeof r->ev);
            r->ev.io = (struct plx_io){.op = PLX_IO_READ,
                                       .block = l->v[next].addr,
                                       .nblocks = (uint32_t)r->n,
                                       .buf = r->buf};
            r->ev.handler = ck_read_done;
            r->ev.ctx = r;
            int rc = plx_submit(c->st, &r->ev);
            if (rc) {
                r->ev.status = rc;
                r->done = 1;
            }
            inflight++;
            next = j;
        }
        /* Handle the oldest run once it is in. */
        struct ck_read *r = &reads[head];
        int rc = r->done ? 0 : plx_drive_until(c->st, &r->done);
        progress(c, step, r->first, l->n);
        run_links(c, l, level, r, rc ? rc : r->ev.status);
        head = (head + 1) % qd;
        inflight--;
    }
    progress(c, step, l->n, l->n);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* ---- Leaks ----------------------------------------------------------------------------------- */

static void check_leaks(struct ck *c)
{
    plx_store *st = c->st;
    /* Blocks this process has claimed but not used yet are not leaks: closing the store gives
     * them back. Bitmap blocks are allocated by definition and never reachable. */
    for (int t = 0; t < 2; t++) {
        const struct plx_alloc_pool *p = &st->alloc->pool[t];
        if (!p->valid)
            continue;
        for (uint64_t b = p->next; b < p->end && b < c->nb; b++)
            bit_clear(c->alloc, b);
    }
    /* Likewise the blocks this process's leaf slots have reserved (alloc.h), and blocks it has
     * given back in memory that the medium's bitmap does not show yet. */
    for (uint64_t e = 1; e < c->next && e < st->sb.extent_count; e++) {
        const struct plx_extent_state *x = &st->alloc->ext[e];
        if (!x->held || !x->bitmap)
            continue;
        for (uint64_t i = 0; i < c->eb; i++) {
            bool res = x->reserved && ((x->reserved[i >> 3] >> (i & 7)) & 1);
            if (res || !((x->bitmap[i >> 3] >> (i & 7)) & 1))
                bit_clear(c->alloc, e * c->eb + i);
        }
    }
    for (uint64_t e = 1; e < c->next; e++) {
        if (!c->bm_ok[e])
            continue;
        for (uint64_t b = 0; b < c->bmb; b++)
            bit_clear(c->alloc, e * c->eb + b);
        uint64_t count = 0, first = 0, last = 0;
        for (uint64_t w = e * c->eb / 64; w < (e + 1) * c->eb / 64; w++) {
            uint64_t leak = c->alloc[w] & ~c->reach[w];
            if (!leak)
                continue;
            if (!count)
                first = w * 64 + (uint64_t)__builtin_ctzll(leak);
            last = w * 64 + 63 - (uint64_t)__builtin_clzll(leak);
            count += (uint64_t)__builtin_popcountll(leak);
        }
        if (!count)
            continue;
        c->out->leaked_blocks += count;
        const char *tn = type_name(c->types[e]);
        /* After damage, "unreachable" may only mean "below a reference that could not be
         * followed": say so, so that nobody reclaims them on this report's word alone. */
        const char *note = c->incomplete ? " (the walk was incomplete: some may belong to the "
                                           "damaged trees reported above)"
                                         : "";
        if (count == 1)
            problem(c, 0, "%s block %llu is allocated but not reachable%s", tn,
                    (unsigned long long)first, note);
        else
            problem(c, 0,
                    "%s extent %llu: %llu blocks are allocated but not reachable (first %llu, "
                    "last %llu)%s",
                    tn, (unsigned long long)e, (unsigned long long)count, (unsigned long long)first,
                    (unsigned long long)last, note);
    }
}

/* ---- Entry point ----------------------------------------------------------------------------- */

static void ck_free(struct ck *c)
{
    free(c->types);
    free(c->bm_ok);
    free(c->reach);
    free(c->wr);
    free(c->wl);
    free(c->dup);
    free(c->alloc);
    free(c->vdis);
    free(c->trees);
    free(c->logs);
    free(c->skips);
    free(c->log_labels.v);
    free(c->idx_labels.v);
    for (unsigned i = 0; i < PLX_HEIGHT_LARGE; i++)
        free(c->levels[i].v);
    plx_block_free(c->iobuf);
    plx_block_free(c->blkbuf);
}

/* ---- Who else writes ------------------------------------------------------------------------------ */


static void describe_holder(const plx_store *st, uint64_t host, uint32_t pid, const char *what,
                            char *who, size_t len)
{
    if (host != st->host_hash) {
        snprintf(who, len, "a process on another host (pid %u there) %s", pid, what);
        return;
    }
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    snprintf(who, len, "pid %u%s%s%s on this host %s", pid, *comm ? " (" : "", comm,
             *comm ? ")" : "", what);
}

/* The VDIs that are open for writing: only they name a holder. */
struct locked {
    struct plx_vdi_record *v;
    size_t n;
};

static int collect_locked(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    (void)rec_addr;
    struct locked *l = arg;
    if (!rec->lock_host || (rec->flags & PLX_VDI_DELETED))
        return 0;
    struct plx_vdi_record *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    l->v = v;
    l->v[l->n++] = *rec;
    return 0;
}

int plx_store_writers(plx_store *st, char *who, size_t len)
{
    if (who && len)
        *who = 0;
    int rc = plx_catalogue_read(st);
    struct locked l = {NULL, 0};
    if (!rc)
        rc = plx_registry_each(st, 0, collect_locked, &l);
    if (rc == -ENOMEM)
        plx_err(st, rc, "out of memory");
    if (rc) {
        free(l.v);
        return rc;
    }
    size_t n = l.n;
    const struct plx_vdi_record *recs = l.v;
    /* Distinct live holders: each (host, pid, epoch) counted once. */
    struct holder {
        uint64_t host, epoch;
        uint32_t pid;
    } *seen = calloc(n + st->sb.extent_count, sizeof *seen);
    if (!seen) {
        free(l.v);
        return plx_err(st, -ENOMEM, "out of memory");
    }
    size_t count = 0;
    for (size_t i = 0; i < n + st->sb.extent_count; i++) {
        uint64_t host, epoch;
        uint32_t pid;
        char what[PLX_NAME_MAX + 64];
        if (i < n) {
            host = recs[i].lock_host, pid = recs[i].lock_pid, epoch = recs[i].lock_epoch;
            snprintf(what, sizeof what, "has VDI %s open for writing", recs[i].name);
        } else {
            const struct plx_extent_entry *c = &st->cat[i - n];
            host = c->holder_host, pid = c->holder_pid, epoch = c->holder_epoch;
            snprintf(what, sizeof what, "allocates in extent %llu", (unsigned long long)(i - n));
        }
        if (!host || plx_holder_stale(st, host, pid, epoch) ||
            plx_holder_is_me(st, host, pid, epoch))
            continue;
        size_t k = 0;
        while (k < count && !(seen[k].host == host && seen[k].pid == pid && seen[k].epoch == epoch))
            k++;
        if (k < count)
            continue;
        seen[count++] = (struct holder){.host = host, .epoch = epoch, .pid = pid};
        if (count == 1 && who && len)
            describe_holder(st, host, pid, what, who, len);
    }
    free(seen);
    free(l.v);
    return (int)count;
}

int plx_check(plx_store *st, struct plx_check_report *out,
              void (*report)(void *arg, int is_error, const char *line), void *arg)
{
    struct plx_check_opts o = {.struct_size = sizeof o, .report = report, .report_arg = arg};
    return plx_check_ex(st, &o, out);
}

int plx_check_ex(plx_store *st, const struct plx_check_opts *opts, struct plx_check_report *out)
{
    /* Fields beyond the caller's struct_size (an older caller) stay zero. */
    struct plx_check_opts o = {0};
    if (opts)
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    if (!st || !out)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    struct ck c;
    memset(&c, 0, sizeof c);
    c.st = st;
    c.out = out;
    c.report = o.report;
    c.arg = o.report_arg;
    c.progress = o.progress;
    c.progress_arg = o.progress_arg;
    c.nb = st->sb.block_count;
    c.eb = st->sb.extent_blocks;
    c.bmb = plx_bitmap_blocks(c.eb);
    c.next = st->sb.extent_count;
    size_t words = (size_t)((c.nb + 63) / 64);
    c.types = calloc(c.next, 1);
    c.bm_ok = calloc(c.next, 1);
    c.reach = calloc(words, sizeof(uint64_t));
    c.wr = calloc(words, sizeof(uint64_t));
    c.wl = calloc(words, sizeof(uint64_t));
    c.dup = calloc(words, sizeof(uint64_t));
    c.alloc = calloc(words, sizeof(uint64_t));
    c.read_depth = o.read_depth == 0 || o.read_depth > CK_QD_MAX ? CK_QD_MAX : o.read_depth;
    c.iobuf = plx_block_alloc_unzeroed((size_t)CK_RUN * c.read_depth);
    c.blkbuf = plx_block_alloc(1);
    int rc = 0;
    if (!c.types || !c.bm_ok || !c.reach || !c.wr || !c.wl || !c.dup || !c.alloc) {
        rc = plx_err(st, -ENOMEM, "check: out of memory for the block maps of %llu blocks",
                     (unsigned long long)c.nb);
        goto out;
    }
    rc = check_system(&c);
    if (rc)
        goto out;
    read_bitmaps(&c);
    rc = check_registry(&c);
    for (size_t i = 0; !rc && i < c.nvdis; i++)
        rc = tree_add(&c, i, 0, c.vdis[i].root);
    /* Logs before roots, current roots before snapshot roots: a block that must be private is
     * then reported from the place that should not reach it. */
    size_t ncurrent = c.ntrees;
    for (size_t i = 0; !rc && i < c.nvdis; i++) {
        progress(&c, "reading snapshot logs", i, c.nvdis);
        rc = check_log(&c, i);
    }
    for (size_t t = 0; !rc && t < ncurrent; t++)
        add_root(&c, t);
    for (size_t t = ncurrent; !rc && t < c.ntrees; t++)
        add_root(&c, t);
    if (!rc) {
        rc = plx_hold_each_live(st, hold_tree, &c);
        if (rc && rc != -ENOMEM) {
            problem(&c, 1, "hold table: %s", st->errmsg);
            c.incomplete = true; /* a held tree's blocks may show as leaks */
            rc = 0;
        }
    }
    for (int level = PLX_HEIGHT_LARGE - 1; !rc && !c.nomem && level >= 0; level--)
        walk_level(&c, (unsigned)level);
    if (!rc && c.nomem)
        rc = -ENOMEM;
    if (rc == -ENOMEM) {
        plx_err(st, rc, "check: out of memory");
        goto out;
    }
    if (!rc)
        reclaim_records(&c);
    progress(&c, "counting leaks", 0, 0);
    check_leaks(&c);
    for (size_t w = 0; w < words; w++)
        out->reachable_blocks += (uint64_t)__builtin_popcountll(c.reach[w]);
    if (c.suppressed && c.report) {
        char line[128];
        snprintf(line, sizeof line, "%llu more problems were found but are not listed",
                 (unsigned long long)c.suppressed);
        c.report(c.arg, 0, line);
    }
out:
    ck_free(&c);
    return rc;
}
