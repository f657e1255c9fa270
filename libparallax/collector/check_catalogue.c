/*
 * check_catalogue.c - the consistency checker's look at the catalogue (check_shared.h): the
 * VDI registry (table, records, name index), and each VDI's snapshot log (its chain and skip
 * links, deleted count) and label index against the labels of the log's live snapshots. Blocks
 * are marked as they are reached; the trees of live snapshots are handed to check_walk.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_shared.h"
#include "labelidx.h"
#include "registry.h"
#include "snaplog.h"

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
    const char *why =
        legacy ? NULL : ck_addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
    if (why) {
        c->incomplete = true;
        ck_problem(c, 1, "%s %llu is outside the metadata extents: %s", what,
                   (unsigned long long)addr, why);
        return;
    }
    struct ck_ref r = {.kind = REF_REGISTRY};
    if (ck_ref_block(c, addr, true, true, &r) == REF_NEW_UNALLOCATED)
        ck_problem(c, 1, "%s %llu is not allocated in the bitmap of extent %llu", what,
                   (unsigned long long)addr, (unsigned long long)(addr / c->eb));
}

struct ck_reg {
    struct ck *c;
    struct plx_vdi_record *all;
    size_t nall, cap;
    bool *named;    /* per record of all[]: the name index has its entry */
    uint64_t stale; /* index entries no live VDI stands behind */
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
        ck_problem(c, 1, "VDI table: the record of id %llu is at block %llu, beyond the store",
                   (unsigned long long)id, (unsigned long long)addr);
        return 0;
    }
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, c->blkbuf, 0);
    if (rc) {
        c->incomplete = true;
        ck_problem(c, 1, "reading the VDI record of id %llu at block %llu: %s",
                   (unsigned long long)id, (unsigned long long)addr, strerror(-rc));
        return 0;
    }
    const char *why = "";
    if (plx_blkhdr_verify(c->blkbuf, PLX_MAGIC_VDI, addr, &why)) {
        c->incomplete = true;
        ck_problem(c, 1, "VDI record of id %llu at block %llu is corrupt: %s",
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
        ck_problem(c, 1, "VDI record at block %llu (id %llu) is invalid: %s",
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
            ck_problem(r->c, 1,
                       "name index bucket %llu holds an entry (VDI %llu) that belongs "
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

int ck_registry(struct ck *c)
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
        ck_problem(c, 1, "VDI table: %s", st->errmsg);
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
        ck_problem(c, 1, "name index: %s", st->errmsg);
        for (size_t i = 0; i < reg.nall; i++)
            reg.named[i] = true; /* unknown: not reported as missing */
        rc = 0;
    }
    for (size_t i = 0; !rc && i < reg.nall; i++)
        if (!reg.named[i] && !(reg.all[i].flags & PLX_VDI_DELETED))
            ck_problem(c, 1,
                       "VDI %s (id %llu) is missing from the name index: opening it by name "
                       "fails",
                       reg.all[i].name, (unsigned long long)reg.all[i].id);
    if (!rc && reg.stale)
        ck_problem(c, 0,
                   "name index: %llu entries name no live VDI (left by an interrupted create "
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
            ck_problem(c, 1, "VDI registry: more than one record has id %llu",
                       (unsigned long long)ids[i]);
    qsort(byname, nlive, sizeof *byname, cmp_name);
    for (size_t i = 1; i < nlive; i++)
        if (strcmp(byname[i]->name, byname[i - 1]->name) == 0 &&
            (i == 1 || strcmp(byname[i - 2]->name, byname[i]->name) != 0))
            ck_problem(c, 1, "VDI registry: more than one live VDI is named '%s'", byname[i]->name);
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
    c->skips[c->nskips++] = (struct ck_skip){
        .addr = addr, .first = b->first_index, .skip = b->skip, .skip_first = b->skip_first};
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
            ck_problem(c, 1,
                       "snapshot log block %llu of VDI %s holds snapshots from %llu, not %llu "
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
            ck_problem(c, 1,
                       "snapshot log block %llu of VDI %s has a bad skip link to block %llu "
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
    const char *bad = ck_addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
    if (bad) {
        ck_problem(c, 1, "label index of VDI %s links to block %llu: %s", rec->name,
                   (unsigned long long)addr, bad);
        c->incomplete = true;
        return 0;
    }
    struct ck_ref r = {.kind = REF_LIDX, .vdi = c->lidx_vdi};
    int rr = ck_ref_block(c, addr, true, true, &r);
    if (rr == REF_AGAIN)
        return 0; /* reported by ref_block */
    if (rr == REF_NEW_UNALLOCATED)
        ck_problem(c, 1,
                   "label index node %llu of VDI %s is not allocated in the bitmap of extent "
                   "%llu",
                   (unsigned long long)addr, rec->name, (unsigned long long)(addr / c->eb));
    if (!node) {
        ck_problem(c, 1, "label index node %llu of VDI %s is corrupt: %s", (unsigned long long)addr,
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
            ck_problem(c, 1, "label index node %llu of VDI %s holds label '%s' off its hash path",
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
        ck_problem(c, 1, "VDI %s: its label index claims %llu snapshots, its log holds %llu",
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
        if (!c->idx_labels.n || !bsearch(l, c->idx_labels.v, c->idx_labels.n, sizeof *l, cmp_label))
            ck_problem(c, 1,
                       "label index of VDI %s lacks snapshot %llu, labelled '%s' (%s@%s "
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
        ck_problem(c, 1, "VDI %s: its record names snapshot %llu as being deleted, of %llu",
                   rec->name, (unsigned long long)rec->snap_deleting,
                   (unsigned long long)rec->snap_count);
        return;
    }
    uint64_t want = deleted + (rec->snap_deleting && !deleting_done);
    if (rec->snap_deleted != want)
        ck_problem(c, 1,
                   "VDI %s: its record counts %llu deleted snapshots, its log %llu%s "
                   "(vdi-list shows the wrong number of snapshots)",
                   rec->name, (unsigned long long)rec->snap_deleted, (unsigned long long)deleted,
                   rec->snap_deleting && !deleting_done ? " and one being deleted" : "");
}

/* Follow one VDI's log from its head; every complete, non-deleted snapshot becomes a tree.
 * Records beyond snap_count belong to a snapshot that never completed and are ignored. */
int ck_log(struct ck *c, size_t vi)
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
        ck_problem(c, 1,
                   "VDI %s: snapshot log head is block %llu but the record counts no "
                   "snapshots",
                   rec->name, (unsigned long long)addr);
        goto stopped;
    }
    while (expect > 0) {
        if (addr == 0) {
            ck_problem(c, 1,
                       "snapshot log of VDI %s ends before snapshot %llu (the record counts "
                       "%llu)",
                       rec->name, (unsigned long long)expect, (unsigned long long)rec->snap_count);
            goto stopped;
        }
        if (++steps > rec->snap_count) {
            ck_problem(c, 1, "snapshot log of VDI %s has more blocks than snapshots (a loop?)",
                       rec->name);
            goto stopped;
        }
        const char *why = ck_addr_problem(c, addr, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
        if (why) {
            ck_problem(c, 1,
                       "snapshot log of VDI %s links to block %llu, outside the metadata "
                       "extents: %s",
                       rec->name, (unsigned long long)addr, why);
            goto stopped;
        }
        struct ck_ref r = {.kind = REF_LOG, .vdi = vi};
        int rr = ck_ref_block(c, addr, true, true, &r);
        if (rr == REF_AGAIN)
            goto stopped; /* reported by ref_block; following it again could loop */
        if (log_add(c, addr, vi))
            return -ENOMEM;
        if (rr == REF_NEW_UNALLOCATED)
            ck_problem(c, 1,
                       "snapshot log block %llu of VDI %s is not allocated in the bitmap of "
                       "extent %llu",
                       (unsigned long long)addr, rec->name, (unsigned long long)(addr / c->eb));
        int rc = plx_sync_io(c->st, PLX_IO_READ, addr, 1, b, 0);
        if (rc) {
            ck_problem(c, 1, "reading snapshot log block %llu of VDI %s: %s",
                       (unsigned long long)addr, rec->name, strerror(-rc));
            goto stopped;
        }
        if (plx_blkhdr_verify(b, PLX_MAGIC_SNAPLOG, addr, &why)) {
            ck_problem(c, 1, "snapshot log block %llu of VDI %s is corrupt: %s",
                       (unsigned long long)addr, rec->name, why);
            goto stopped;
        }
        if (b->vdi_id != rec->id) {
            ck_problem(c, 1, "snapshot log block %llu of VDI %s belongs to VDI %llu",
                       (unsigned long long)addr, rec->name, (unsigned long long)b->vdi_id);
            goto stopped;
        }
        if (b->count == 0 || b->count > PLX_SNAPLOG_PER_BLOCK || b->first_index == 0) {
            ck_problem(c, 1, "snapshot log block %llu of VDI %s has a bad record count",
                       (unsigned long long)addr, rec->name);
            goto stopped;
        }
        uint64_t last = b->first_index + b->count - 1;
        if (b->first_index > expect || last < expect) {
            ck_problem(c, 1,
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
            if (ck_tree_add(c, vi, idx, sr->root))
                return -ENOMEM;
        }
        if (skip_add(c, b, addr))
            return -ENOMEM;
        expect = b->first_index - 1;
        addr = b->prev;
    }
    if (addr != 0)
        ck_problem(c, 1,
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
