/*
 * snapiter.c - listing a VDI's snapshots page by page (plx_snap_iterate), with memory and reads
 * that depend on the page, not on the history.
 *
 * The log is chained newest first (FORMAT.md §9). Newest first, a page starts at the block of
 * its first snapshot (reached by skip links) and follows prev. Oldest first, it goes forward in
 * chunks of up to CHUNK blocks: the chunk's newest block is found by skip links, prev leads back
 * through the chunk (the images are kept), and the chunk's records are handed out oldest first.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "registry.h"
#include "snaplog.h"

#define CHUNK 64u /* log blocks held at once going forward: 256 KiB, 4,032 snapshots */

static void to_info(const struct plx_vdi_record *rec, uint64_t idx, const struct plx_snap_record *r,
                    struct plx_snap_info *si)
{
    memset(si, 0, sizeof *si);
    si->vdi_id = rec->id;
    si->index = idx;
    si->root = r->root;
    si->time_ns = r->time_ns;
    si->deleted = (r->flags & PLX_SNAP_DELETED) != 0;
    memcpy(si->label, r->label, PLX_LABEL_MAX);
    si->label[PLX_LABEL_MAX] = 0;
}

/* Read the block before `b` in the chain (b->prev), which must hold snapshot `want`. */
static int read_prev(plx_store *st, const struct plx_vdi_record *rec,
                     const struct plx_snaplog_block *b, uint64_t want,
                     struct plx_snaplog_block *out)
{
    uint64_t addr = b->prev;
    if (addr == 0)
        return plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before snapshot %llu", rec->name,
                       (unsigned long long)want);
    int rc = plx_snaplog_read_block(st, addr, rec, out);
    if (!rc && (out->first_index > want || out->first_index + out->count - 1 < want ||
                out->first_index >= b->first_index))
        rc = plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %s does not hold snapshot %llu",
                     (unsigned long long)addr, rec->name, (unsigned long long)want);
    return rc;
}

struct emit {
    int (*fn)(void *arg, const struct plx_snap_info *snap);
    void *arg;
    uint64_t left; /* snapshots still wanted; UINT64_MAX = no limit */
};

/* Hand out snapshot idx of block b if it is live: 1 when the page is full, fn's nonzero value,
 * or 0 to go on. */
static int emit_one(struct emit *e, const struct plx_vdi_record *rec,
                    const struct plx_snaplog_block *b, uint64_t idx)
{
    const struct plx_snap_record *r = &b->records[idx - b->first_index];
    if (r->flags & PLX_SNAP_DELETED)
        return 0;
    struct plx_snap_info si;
    to_info(rec, idx, r, &si);
    int rc = e->fn(e->arg, &si);
    if (rc)
        return rc;
    return --e->left == 0 ? 1 : 0;
}

static int newest_first(plx_store *st, const struct plx_vdi_record *rec, uint64_t start,
                        struct emit *e)
{
    struct plx_snaplog_block *b = plx_block_alloc(2);
    if (!b)
        return plx_err(st, -ENOMEM, "out of memory");
    uint64_t addr;
    int rc = plx_snaplog_find(st, rec, start, &b[0], &addr);
    for (uint64_t idx = start; !rc && idx >= 1;) {
        rc = emit_one(e, rec, &b[0], idx);
        if (rc || idx == 1)
            break;
        if (--idx < b[0].first_index) {
            rc = read_prev(st, rec, &b[0], idx, &b[1]);
            if (!rc)
                memcpy(&b[0], &b[1], sizeof b[0]);
        }
    }
    plx_block_free(b);
    return rc;
}

static int oldest_first(plx_store *st, const struct plx_vdi_record *rec, uint64_t lo,
                        struct emit *e)
{
    struct plx_snaplog_block *blk = plx_block_alloc(CHUNK);
    if (!blk)
        return plx_err(st, -ENOMEM, "out of memory");
    int rc = 0;
    while (!rc && lo <= rec->snap_count) {
        /* The chunk: blocks first(lo) .. first(lo) + CHUNK - 1, cut at snap_count. */
        uint64_t first_block = (lo - 1) / PLX_SNAPLOG_PER_BLOCK;
        uint64_t hi = (first_block + CHUNK) * PLX_SNAPLOG_PER_BLOCK;
        if (hi > rec->snap_count)
            hi = rec->snap_count;
        if (e->left != UINT64_MAX && e->left - 1 < hi - lo)
            hi = lo + e->left - 1; /* a short page reads only its own blocks */
        uint64_t nblk = (hi - 1) / PLX_SNAPLOG_PER_BLOCK - first_block + 1, addr;
        rc = plx_snaplog_find(st, rec, hi, &blk[nblk - 1], &addr);
        for (uint64_t k = nblk - 1; !rc && k > 0; k--)
            rc = read_prev(st, rec, &blk[k], blk[k].first_index - 1, &blk[k - 1]);
        for (uint64_t idx = lo; !rc && idx <= hi; idx++) {
            const struct plx_snaplog_block *b =
                &blk[(idx - 1) / PLX_SNAPLOG_PER_BLOCK - first_block];
            rc = emit_one(e, rec, b, idx);
        }
        lo = hi + 1;
    }
    plx_block_free(blk);
    return rc;
}

int plx_snap_iterate(plx_store *st, const char *vdi, const struct plx_snap_iter_opts *opts,
                     int (*fn)(void *arg, const struct plx_snap_info *snap), void *arg)
{
    struct plx_snap_iter_opts o = {0};
    if (opts)
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    struct plx_vdi_record rec;
    int rc = plx_registry_find(st, vdi, &rec, NULL);
    if (rc)
        return rc;
    struct emit e = {.fn = fn, .arg = arg, .left = o.limit ? o.limit : UINT64_MAX};
    if (o.newest_first) {
        uint64_t start = o.after && o.after - 1 < rec.snap_count ? o.after - 1 : rec.snap_count;
        rc = start ? newest_first(st, &rec, start, &e) : 0;
    } else {
        rc = o.after < rec.snap_count ? oldest_first(st, &rec, o.after + 1, &e) : 0;
    }
    return rc == 1 && e.left == 0 ? 0 : rc;
}

/* ---- Counting live snapshots ----------------------------------------------------------------- */

/* Deleted snapshots among 1..snap_count, by reading the whole log. */
static int count_deleted_in_log(plx_store *st, const struct plx_vdi_record *rec, uint64_t *deleted)
{
    struct plx_snap_info *list;
    size_t n;
    int rc = plx_snaplog_read(st, rec, &list, &n, NULL);
    if (rc)
        return rc;
    *deleted = 0;
    for (size_t i = 0; i < n; i++)
        *deleted += list[i].deleted != 0;
    free(list);
    return 0;
}

int plx_snaplog_count_live(plx_store *st, const struct plx_vdi_record *rec, uint64_t *live)
{
    uint64_t deleted = 0;
    if (!(rec->flags & PLX_VDI_SNAPS_COUNTED) || rec->snap_deleted > rec->snap_count) {
        int rc = count_deleted_in_log(st, rec, &deleted); /* a record from before the count */
        if (rc)
            return rc;
        *live = rec->snap_count - deleted;
        return 0;
    }
    *live = rec->snap_count - rec->snap_deleted;
    if (rec->snap_deleting && rec->snap_deleting <= rec->snap_count) {
        /* A deletion counted before its log record was written: look at the record. */
        struct plx_snaplog_block *b = plx_block_alloc(1);
        uint64_t addr;
        int rc = b ? plx_snaplog_find(st, rec, rec->snap_deleting, b, &addr)
                   : plx_err(st, -ENOMEM, "out of memory");
        if (!rc && !(b->records[rec->snap_deleting - b->first_index].flags & PLX_SNAP_DELETED))
            (*live)++;
        plx_block_free(b);
        if (rc)
            return rc;
    }
    return 0;
}

int plx_snaplog_count_write(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec)
{
    if (rec->flags & PLX_VDI_SNAPS_COUNTED)
        return 0;
    uint64_t deleted;
    int rc = count_deleted_in_log(st, rec, &deleted);
    if (rc)
        return rc;
    struct plx_vdi_record next = *rec;
    next.flags |= PLX_VDI_SNAPS_COUNTED;
    next.snap_deleted = deleted;
    next.snap_deleting = 0;
    rc = plx_registry_write(st, slot_addr, &next);
    if (!rc) {
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "VDI %s: flushing its record: %s", rec->name, strerror(-rc));
    }
    if (rc)
        return rc;
    next.seq++;
    *rec = next;
    return 0;
}

int plx_vdi_live_snapshots(plx_store *st, const char *vdi, uint64_t *live)
{
    struct plx_vdi_record rec;
    int rc = plx_registry_find(st, vdi, &rec, NULL);
    return rc ? rc : plx_snaplog_count_live(st, &rec, live);
}
