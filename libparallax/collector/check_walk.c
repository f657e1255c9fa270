/*
 * check_walk.c - the consistency checker's walk (check_shared.h): marking each reference to a
 * block in the per-block bits (check.c's top comment), and walking every radix tree level by
 * level over all trees at once, in sorted runs of reads, a tree held open by a live process too.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_shared.h"
#include "hold.h"
#include "registry.h"

/* ---- Addresses and references ---------------------------------------------------------------- */

/* NULL if block a may hold something of extent type `want`; otherwise why not. */
const char *ck_addr_problem(const struct ck *c, uint64_t a, unsigned want, char *buf, size_t len)
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
        snprintf(buf, len, "in %s extent %llu (%s expected)", ck_type_name(t),
                 (unsigned long long)e, ck_type_name(want));
    else
        return NULL;
    return buf;
}

/* Record one reference to block a (already known to be a valid address for its use). `wr`: the
 * reference reaches the block writable from a current tree (see the top of check.c); `wl`: it
 * is an owning reference. Reports a block that is shared when it must not be, once per block. */
int ck_ref_block(struct ck *c, uint64_t a, bool wr, bool wl, const struct ck_ref *r)
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
            ck_ref_text(c, r, from, sizeof from);
            ck_block_role(c, a, role, sizeof role);
            ck_problem(c, 1,
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

/* ---- Radix trees ----------------------------------------------------------------------------- */

int ck_tree_add(struct ck *c, size_t vdi, uint64_t snap, uint64_t root)
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

void ck_add_root(struct ck *c, size_t t)
{
    const struct ck_tree *tr = &c->trees[t];
    const struct plx_vdi_record *rec = &c->vdis[tr->vdi];
    char tn[PLX_NAME_MAX + 40], why_buf[128];
    ck_tree_name(c, t, tn, sizeof tn);
    const char *why =
        tr->root == 0 ? "block 0"
                      : ck_addr_problem(c, tr->root, PLX_EXTENT_METADATA, why_buf, sizeof why_buf);
    if (why) {
        c->incomplete = true;
        ck_problem(c, 1, "the radix root %llu of %s is outside the metadata extents: %s",
                   (unsigned long long)tr->root, tn, why);
        return;
    }
    c->out->trees++;
    struct ck_ref r = {.kind = tr->snap ? REF_SNAP_ROOT : REF_CUR_ROOT, .tree = t};
    int rr = ck_ref_block(c, tr->root, tr->snap == 0, tr->snap == 0, &r);
    if (rr == REF_NEW_UNALLOCATED)
        ck_problem(c, 1, "the radix root %llu of %s is not allocated in the bitmap of extent %llu",
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
            why = ck_addr_problem(c, plx_link_addr(l), want, why_buf, sizeof why_buf);
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
        int rr = ck_ref_block(c, a, node_wr && !plx_link_ro(l), !plx_link_ro(l), &r);
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
    ck_tree_name(c, it->tree, tn, sizeof tn);
    if (nbad)
        ck_problem(c, 1,
                   "radix node %llu (level %u, in the tree of %s) has %u invalid link%s: "
                   "entry %u = 0x%016llx %s",
                   (unsigned long long)it->addr, level, tn, nbad, nbad == 1 ? "" : "s", bad_idx,
                   (unsigned long long)bad_link, bad_why);
    if (nunalloc)
        ck_problem(c, 1,
                   "radix node %llu (level %u, in the tree of %s) has %u link%s to "
                   "unallocated blocks: entry %u -> block %llu is not set in its extent's "
                   "bitmap",
                   (unsigned long long)it->addr, level, tn, nunalloc, nunalloc == 1 ? "" : "s",
                   unalloc_idx, (unsigned long long)plx_link_addr(links[unalloc_idx]));
}

/* One read of a run of queued nodes (walk_level keeps up to read_depth of them in flight). */
struct ck_read {
    struct plx_ev ev;
    uint8_t *buf;    /* CK_RUN blocks */
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
            ck_tree_name(c, l->v[k].tree, tn, sizeof tn);
            ck_problem(c, 1, "reading radix node %llu (level %u, in the tree of %s): %s",
                       (unsigned long long)l->v[k].addr, level, tn, strerror(-krc));
            continue;
        }
        node_links(c, &l->v[k], level, links);
    }
}

/* Read every node queued at `level`, in address order, in runs of consecutive blocks, with up to
 * read_depth runs in flight: scattered nodes need the device's queue, not one read at a time.
 * Runs are handled in address order as they complete, so the messages do not depend on timing. */
void ck_walk_level(struct ck *c, unsigned level)
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
        ck_progress(c, step, r->first, l->n);
        run_links(c, l, level, r, rc ? rc : r->ev.status);
        head = (head + 1) % qd;
        inflight--;
    }
    ck_progress(c, step, l->n, l->n);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* ---- Trees held open by live processes ------------------------------------------------------- */

/* A tree a live process reads (hold.h) that no live VDI or snapshot reaches: its snapshot or VDI
 * was deleted, and the collector keeps it until the holder lets go. Walked like the rest, under
 * its VDI's record, or a stand-in naming the deleted VDI. */
int ck_hold_tree(void *arg, const struct plx_hold *h)
{
    struct ck *c = arg;
    if (h->root == 0 || h->root >= c->nb || bit_test(c->reach, h->root))
        return 0; /* a live tree, walked already (or nothing to walk) */
    if (h->height < PLX_HEIGHT_SMALL || h->height > PLX_HEIGHT_LARGE) {
        ck_problem(c, 1, "hold table: a tree held open by pid %u has %u levels", h->pid, h->height);
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
    int rc = ck_tree_add(c, vi, h->snap, h->root);
    if (!rc)
        ck_add_root(c, c->ntrees - 1);
    return rc;
}
