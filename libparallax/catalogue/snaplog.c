/*
 * snaplog.c - snapshot logs: a chain of blocks in metadata extents, newest first, holding the
 * frozen root of every snapshot of a VDI. The VDI record's snap_count says how many records
 * are complete: a record beyond it belongs to a snapshot whose final write (the VDI record)
 * never reached the medium, and is ignored (the next snapshot overwrites it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "registry.h"
#include "snaplog.h"
#include "system.h"

int plx_snaplog_read_block(plx_store *st, uint64_t addr, const struct plx_vdi_record *rec,
                           struct plx_snaplog_block *out)
{
    /* Another process may have typed a new extent since we read the catalogue: look again
     * before calling the link bad. */
    if (addr && addr < st->sb.block_count &&
        plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        plx_catalogue_read(st);
    if (addr == 0 || addr >= st->sb.block_count || plx_block_type(st, addr) !=
                                                       PLX_EXTENT_METADATA)
        return plx_err(st, -EUCLEAN,
                       "snapshot log of VDI %s links to block %llu, outside "
                       "the metadata extents",
                       rec->name, (unsigned long long)addr);
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, out, 0);
    if (rc)
        return plx_err(st, rc, "reading snapshot log block %llu: %s", (unsigned long long)addr,
                       strerror(-rc));
    return plx_snaplog_check_block(st, addr, rec, out);
}

int plx_snaplog_check_block(plx_store *st, uint64_t addr, const struct plx_vdi_record *rec,
                            const struct plx_snaplog_block *out)
{
    const char *why = "";
    int rc = plx_blkhdr_verify(out, PLX_MAGIC_SNAPLOG, addr, &why);
    if (!rc && out->vdi_id != rec->id)
        why = "belongs to another VDI", rc = -EUCLEAN;
    if (!rc && (out->count > PLX_SNAPLOG_PER_BLOCK || out->first_index == 0))
        why = "bad record count", rc = -EUCLEAN;
    if (rc)
        return plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %s is corrupt: %s",
                       (unsigned long long)addr, rec->name, why);
    return 0;
}

int plx_snaplog_read(plx_store *st, const struct plx_vdi_record *rec, struct plx_snap_info **out,
                     size_t *count, uint64_t **blocks)
{
    *out = NULL;
    *count = 0;
    if (blocks)
        *blocks = NULL;
    uint64_t n = rec->snap_count;
    struct plx_snap_info *info = calloc(n ? n : 1, sizeof *info);
    uint64_t *where = calloc(n ? n : 1, sizeof *where);
    struct plx_snaplog_block *b = plx_block_alloc(1);
    int rc = 0;
    if (!info || !where) {
        rc = plx_err(st, -ENOMEM, "out of memory");
        goto out;
    }
    uint64_t expect_last = n; /* highest index still to be found */
    uint64_t addr = rec->snaplog_head;
    uint64_t steps = 0;
    while (expect_last > 0 && !rc) {
        if (addr == 0 || ++steps > n + 1) {
            rc = plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before snapshot %llu",
                         rec->name, (unsigned long long)expect_last);
            break;
        }
        rc = plx_snaplog_read_block(st, addr, rec, b);
        if (rc)
            break;
        if (b->first_index > expect_last ||
            b->first_index + b->count - 1 < expect_last) {
            rc = plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %s does not hold "
                                       "snapshot %llu",
                         (unsigned long long)addr, rec->name, (unsigned long long)expect_last);
            break;
        }
        for (uint64_t idx = b->first_index; idx <= expect_last; idx++) {
            const struct plx_snap_record *r = &b->records[idx - b->first_index];
            struct plx_snap_info *si = &info[idx - 1];
            si->vdi_id = rec->id;
            si->index = idx;
            si->root = r->root;
            si->time_ns = r->time_ns;
            si->deleted = (r->flags & PLX_SNAP_DELETED) != 0;
            memcpy(si->label, r->label, PLX_LABEL_MAX);
            si->label[PLX_LABEL_MAX] = 0;
            where[idx - 1] = addr;
        }
        expect_last = b->first_index - 1;
        addr = b->prev;
    }
out:
    plx_block_free(b);
    if (rc) {
        free(info);
        free(where);
        return rc;
    }
    *out = info;
    *count = n;
    if (blocks)
        *blocks = where;
    else
        free(where);
    return 0;
}

/* First index of the block that holds `index`: every block but the head is full, so block k
 * holds indexes k * 63 + 1 .. k * 63 + 63. */
static uint64_t block_start(uint64_t index)
{
    return (index - 1) / PLX_SNAPLOG_PER_BLOCK * PLX_SNAPLOG_PER_BLOCK + 1;
}

int plx_snaplog_find(plx_store *st, const struct plx_vdi_record *rec, uint64_t index,
                     struct plx_snaplog_block *b, uint64_t *addr_out)
{
    if (index == 0 || index > rec->snap_count)
        return plx_err(st, -ENOENT, "VDI %s has no snapshot %llu (it has %llu)", rec->name,
                       (unsigned long long)index, (unsigned long long)rec->snap_count);
    uint64_t addr = rec->snaplog_head, expect_first = 0;
    for (uint64_t steps = 0;; steps++) {
        if (addr == 0 || steps > rec->snap_count + 1)
            return plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before snapshot %llu",
                           rec->name, (unsigned long long)index);
        int rc = plx_snaplog_read_block(st, addr, rec, b);
        if (!rc)
            rc = plx_snaplog_find_step(st, rec, index, b, addr, &expect_first, &addr);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            *addr_out = addr;
            return 0;
        }
    }
}

int plx_snaplog_find_step(plx_store *st, const struct plx_vdi_record *rec, uint64_t index,
                          const struct plx_snaplog_block *b, uint64_t addr, uint64_t *expect_first,
                          uint64_t *next)
{
    if (*expect_first && b->first_index != *expect_first)
        return plx_err(st, -EUCLEAN,
                       "snapshot log block %llu of VDI %s starts at snapshot "
                       "%llu, not %llu as the skip link to it says",
                       (unsigned long long)addr, rec->name, (unsigned long long)b->first_index,
                       (unsigned long long)*expect_first);
    if (b->first_index <= index) {
        if (b->first_index + b->count - 1 < index)
            return plx_err(st, -EUCLEAN,
                           "snapshot log block %llu of VDI %s does not hold "
                           "snapshot %llu",
                           (unsigned long long)addr, rec->name, (unsigned long long)index);
        return 1;
    }
    /* Jump when the skip link lands at or above the wanted block; else one step back. */
    if (b->skip && b->skip_first >= block_start(index) && b->skip_first < b->first_index) {
        *expect_first = b->skip_first;
        *next = b->skip;
    } else {
        *expect_first = 0;
        *next = b->prev;
    }
    return 0;
}

const struct plx_snap_record *plx_snaplog_newest(const struct plx_snaplog_block *head,
                                                 uint64_t snap_count)
{
    if (!head || snap_count < head->first_index ||
        snap_count - head->first_index >= PLX_SNAPLOG_PER_BLOCK)
        return NULL;
    return &head->records[snap_count - head->first_index];
}

/* ---- Skip links: a skew-binary jump structure (Myers, "An applicative random-access stack") --
 * Block k links to J(k): J(k) = J(J(k-1)) when k-1 - J(k-1) == J(k-1) - J(J(k-1)), else k-1.
 * Following J when it does not overshoot, else prev, reaches any older block in O(log k) steps.
 * Seen from the head, the path head, J(head), J(J(head)), ... is a stack: a new block either
 * pushes itself onto it or first pops its top two entries (the case J(k) = J(J(k-1))). */

static void spine_next(const struct plx_snaplog_spine *sp, uint64_t *skip, uint64_t *skip_first,
                       unsigned *pop)
{
    *skip = 0, *skip_first = 0, *pop = 0;
    if (sp->n == 0)
        return;
    unsigned t = 0;
    if (sp->n >= 3 && sp->e[0].first - sp->e[1].first == sp->e[1].first - sp->e[2].first)
        t = 2;
    *skip = sp->e[t].addr;
    *skip_first = sp->e[t].first;
    *pop = t;
}

void plx_snaplog_spine_push(struct plx_snaplog_spine *sp, struct plx_snaplog_block *b,
                            uint64_t addr)
{
    unsigned pop;
    spine_next(sp, &b->skip, &b->skip_first, &pop);
    if (pop) {
        memmove(&sp->e[0], &sp->e[pop], (sp->n - pop) * sizeof sp->e[0]);
        sp->n -= pop;
    }
    if (sp->n == PLX_SPINE_MAX) /* cannot happen below 2^64 blocks: drop the oldest entry */
        sp->n--;
    memmove(&sp->e[1], &sp->e[0], sp->n * sizeof sp->e[0]);
    sp->e[0].addr = addr;
    sp->e[0].first = b->first_index;
    sp->n++;
}

/* Give every block of a log written without skip links its link, oldest first. */
static int link_log(plx_store *st, const struct plx_vdi_record *rec)
{
    uint64_t nblocks = (block_start(rec->snap_count) - 1) / PLX_SNAPLOG_PER_BLOCK + 1;
    uint64_t *addrs = calloc(nblocks, sizeof *addrs);
    struct plx_snaplog_block *b = plx_block_alloc(1);
    struct plx_snaplog_spine *sp = calloc(1, sizeof *sp);
    int rc = addrs && b && sp ? 0 : plx_err(st, -ENOMEM, "out of memory");
    uint64_t addr = rec->snaplog_head;
    for (uint64_t i = nblocks; !rc && i-- > 0;) {
        if (addr == 0) {
            rc = plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before block %llu", rec->name,
                         (unsigned long long)i);
            break;
        }
        rc = plx_snaplog_read_block(st, addr, rec, b);
        if (!rc && b->first_index != i * PLX_SNAPLOG_PER_BLOCK + 1)
            rc = plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %s starts at snapshot "
                                       "%llu, not %llu",
                         (unsigned long long)addr, rec->name, (unsigned long long)b->first_index,
                         (unsigned long long)(i * PLX_SNAPLOG_PER_BLOCK + 1));
        addrs[i] = addr;
        addr = b->prev;
    }
    bool wrote = false;
    for (uint64_t i = 0; !rc && i < nblocks; i++) {
        rc = plx_snaplog_read_block(st, addrs[i], rec, b);
        if (rc)
            break;
        uint64_t skip = b->skip, skip_first = b->skip_first;
        plx_snaplog_spine_push(sp, b, addrs[i]);
        if (b->skip == skip && b->skip_first == skip_first)
            continue;
        /* Only the link changes: a crash before this write lands leaves skip = 0 (follow prev). */
        plx_blkhdr_seal(b, PLX_MAGIC_SNAPLOG, addrs[i]);
        rc = plx_sync_io(st, PLX_IO_WRITE, addrs[i], 1, b, 0);
        if (rc)
            plx_err(st, rc, "writing snapshot log block %llu: %s", (unsigned long long)addrs[i],
                    strerror(-rc));
        wrote = true;
    }
    if (!rc && wrote) {
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "flushing snapshot log: %s", strerror(-rc));
    }
    free(addrs);
    free(sp);
    plx_block_free(b);
    return rc;
}

int plx_snaplog_spine_load(plx_store *st, const struct plx_vdi_record *rec,
                           struct plx_snaplog_spine *sp)
{
    sp->n = 0;
    if (!rec->snaplog_head || !rec->snap_count)
        return 0;
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!b)
        return plx_err(st, -ENOMEM, "out of memory");
    uint64_t addr = rec->snaplog_head, expect_first = 0;
    bool linked = false;
    int rc = 0;
    for (;;) {
        rc = plx_snaplog_read_block(st, addr, rec, b);
        if (rc)
            break;
        if ((expect_first && b->first_index != expect_first) || sp->n == PLX_SPINE_MAX) {
            rc = plx_err(st, -EUCLEAN, "snapshot log of VDI %s: bad skip link to block %llu",
                         rec->name, (unsigned long long)addr);
            break;
        }
        sp->e[sp->n].addr = addr;
        sp->e[sp->n].first = b->first_index;
        sp->n++;
        if (b->first_index == 1)
            break;
        if (!b->skip || b->skip_first >= b->first_index) {
            /* Written by a Parallax without skip links: link the whole log once. */
            if (linked) {
                rc = plx_err(st, -EUCLEAN, "snapshot log of VDI %s: block %llu has no skip "
                                           "link after linking",
                             rec->name, (unsigned long long)addr);
                break;
            }
            rc = link_log(st, rec);
            if (rc)
                break;
            linked = true;
            sp->n = 0;
            addr = rec->snaplog_head;
            expect_first = 0;
            continue;
        }
        expect_first = b->skip_first;
        addr = b->skip;
    }
    plx_block_free(b);
    if (rc)
        sp->n = 0;
    return rc;
}

/* ---- Labels of a writer ------------------------------------------------------------------------ */

void plx_labels_init(struct plx_label_set *ls, const struct plx_vdi_record *rec)
{
    free(ls->e);
    memset(ls, 0, sizeof *ls);
}

void plx_labels_free(struct plx_label_set *ls)
{
    free(ls->e);
    memset(ls, 0, sizeof *ls);
}

void plx_labels_clear(struct plx_label_set *ls)
{
    ls->n = 0;
}

int plx_labels_set(struct plx_label_set *ls, uint64_t index, const char *label)
{
    for (size_t i = 0; i < ls->n; i++)
        if (ls->e[i].index == index) {
            snprintf(ls->e[i].label, sizeof ls->e[i].label, "%s", label);
            return 0;
        }
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? 2 * ls->cap : 4;
        struct plx_label_entry *e = realloc(ls->e, cap * sizeof *e);
        if (!e)
            return -ENOMEM;
        ls->e = e;
        ls->cap = cap;
    }
    ls->e[ls->n].index = index;
    snprintf(ls->e[ls->n].label, sizeof ls->e[ls->n].label, "%s", label);
    ls->n++;
    return 0;
}

int plx_labels_taken(plx_store *st, const struct plx_vdi_record *rec, struct plx_label_set *ls,
                     const char *label, uint64_t except_index)
{
    if (!label || !*label)
        return 0;
    for (size_t i = 0; i < ls->n; i++)
        if (ls->e[i].index != except_index && strcmp(ls->e[i].label, label) == 0)
            return 1;
    return 0;
}
