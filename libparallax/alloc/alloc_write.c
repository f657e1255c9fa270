/*
 * alloc_write.c - the allocator's state on the medium (layer 2, alloc.h; alloc_shared.h): the
 * extent catalogue read and its entries written, the allocation bitmaps read and the claims
 * written back before the links that use them (alloc.c says why that order). It calls nothing of
 * alloc.c or alloc_claim.c, which sit above it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc_shared.h"

/* ---- Catalogue ------------------------------------------------------------------------------- */

/* Check catalogue block b (read from the medium into cb) and copy its entries into st->cat. */
int plx_catalogue_block_take(plx_store *st, uint64_t b, const struct plx_catalog_block *cb)
{
    uint64_t addr = st->sb.catalogue_start + b;
    const char *why = "";
    int rc = plx_blkhdr_verify(cb, PLX_MAGIC_CATALOG, addr, &why);
    if (rc || cb->first_extent != b * PLX_CATALOG_PER_BLOCK ||
        cb->count > PLX_CATALOG_PER_BLOCK)
        return plx_err(st, -EUCLEAN, "extent catalogue block %llu is corrupt: %s",
                       (unsigned long long)addr, rc ? why : "wrong extent range");
    for (uint32_t i = 0; i < cb->count; i++) {
        uint64_t e = cb->first_extent + i;
        if (e >= st->sb.extent_count)
            break;
        if (cb->entries[i].type > PLX_EXTENT_DATA ||
            (e == 0) != (cb->entries[i].type == PLX_EXTENT_SYSTEM))
            return plx_err(st, -EUCLEAN, "extent catalogue: extent %llu has invalid type %u",
                           (unsigned long long)e, cb->entries[i].type);
        st->cat[e] = cb->entries[i];
    }
    return 0;
}

static int catalogue_block_read(plx_store *st, uint64_t b, struct plx_catalog_block *out)
{
    uint64_t addr = st->sb.catalogue_start + b;
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, out, 0);
    if (rc)
        return plx_err(st, rc, "reading extent catalogue block %llu: %s",
                       (unsigned long long)addr, strerror(-rc));
    const char *why = "";
    rc = plx_blkhdr_verify(out, PLX_MAGIC_CATALOG, addr, &why);
    if (rc || out->first_extent != b * PLX_CATALOG_PER_BLOCK ||
        out->count > PLX_CATALOG_PER_BLOCK)
        return plx_err(st, -EUCLEAN, "extent catalogue block %llu is corrupt: %s",
                       (unsigned long long)addr, rc ? why : "wrong extent range");
    return 0;
}

int plx_catalogue_load(plx_store *st)
{
    if (!st->cat) {
        st->cat = calloc(st->sb.extent_count, sizeof *st->cat);
        if (!st->cat)
            return plx_err(st, -ENOMEM, "out of memory for the extent catalogue");
    }
    struct plx_catalog_block *cb = plx_block_alloc(1);
    int rc = 0;
    for (uint64_t b = 0; b < st->sb.catalogue_blocks && !rc; b++) {
        uint64_t addr = st->sb.catalogue_start + b;
        rc = plx_sync_io(st, PLX_IO_READ, addr, 1, cb, 0);
        if (rc)
            rc = plx_err(st, rc, "reading extent catalogue block %llu: %s",
                         (unsigned long long)addr, strerror(-rc));
        else
            rc = plx_catalogue_block_take(st, b, cb);
    }
    plx_block_free(cb);
    return rc;
}

/* Write one catalogue entry: read-modify-write of its block, under the admin lock. */
static int catalogue_entry_write(plx_store *st, uint64_t e, const struct plx_extent_entry *ent)
{
    struct plx_catalog_block *cb = plx_block_alloc(1);
    uint64_t b = e / PLX_CATALOG_PER_BLOCK;
    int rc = catalogue_block_read(st, b, cb);
    if (!rc) {
        cb->entries[e % PLX_CATALOG_PER_BLOCK] = *ent;
        plx_blkhdr_seal(cb, PLX_MAGIC_CATALOG, st->sb.catalogue_start + b);
        rc = plx_sync_io(st, PLX_IO_WRITE, st->sb.catalogue_start + b, 1, cb, 0);
        if (rc)
            plx_err(st, rc, "writing extent catalogue block: %s", strerror(-rc));
    }
    if (!rc)
        st->cat[e] = *ent;
    plx_block_free(cb);
    return rc;
}

int plx_bitmap_read(plx_store *st, uint64_t extent, uint8_t *bits)
{
    int rc = plx_sync_io(st, PLX_IO_READ, extent * eb(st), (uint32_t)bitmap_blocks(st), bits, 0);
    if (rc)
        return plx_err(st, rc, "reading the allocation bitmap of extent %llu: %s",
                       (unsigned long long)extent, strerror(-rc));
    return 0;
}

uint64_t plx_alloc_gen(const plx_store *st)
{
    return st->alloc->gen;
}

/* ---- Writing claims ------------------------------------------------------------------------- */

struct bitmap_write {
    struct plx_ev ev;
    uint64_t target_gen;
    uint8_t *buf;
};

static void sync_round_start(plx_store *st);
static int round_finish_if_empty(plx_store *st);

static void wake_alloc_waiters(plx_store *st, int status)
{
    struct plx_alloc *a = st->alloc;
    struct plx_alloc_waiter **pp = &a->waiters;
    while (*pp) {
        struct plx_alloc_waiter *w = *pp;
        if (status || w->gen <= a->written_gen) {
            *pp = w->next;
            w->cb(w->arg, status);
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

static void bitmap_write_done(plx_store *st, struct plx_ev *ev)
{
    struct bitmap_write *bw = (struct bitmap_write *)ev;
    struct plx_alloc *a = st->alloc;
    if (ev->status && !a->round_status)
        a->round_status = ev->status;
    plx_block_free(bw->buf);
    free(bw);
    if (--a->writes_inflight)
        return;
    int status = a->round_status;
    if (!status)
        a->written_gen = a->round_target;
    else
        plx_err(st, status, "writing an allocation bitmap: %s", strerror(-status));
    wake_alloc_waiters(st, status);
    while (a->waiters) {
        sync_round_start(st);
        if (!round_finish_if_empty(st))
            break;
        wake_alloc_waiters(st, a->round_status);
    }
}

/* Write every bitmap block changed since the last completed round. */
static void sync_round_start(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    a->round_status = 0;
    a->round_target = a->gen;
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        struct plx_extent_state *x = &a->ext[e];
        if (!x->held)
            continue;
        for (uint64_t b = 0; b < bitmap_blocks(st); b++) {
            if (x->dirty_blocks[b] <= a->written_gen)
                continue;
            struct bitmap_write *bw = calloc(1, sizeof *bw);
            if (!bw) {
                a->round_status = -ENOMEM;
                continue;
            }
            bw->buf = plx_block_alloc(1);
            memcpy(bw->buf, x->bitmap + b * PLX_BLOCK_SIZE, PLX_BLOCK_SIZE);
            bw->ev.io.op = PLX_IO_WRITE;
            /* A snapshot's or flush's commit waits for them (pipeline.c, batch_submit_flags). */
            bw->ev.io.flags = st->durable_waiters ? PLX_IO_URGENT : 0;
            bw->ev.io.block = e * eb(st) + b;
            bw->ev.io.nblocks = 1;
            bw->ev.io.buf = bw->buf;
            bw->ev.handler = bitmap_write_done;
            int rc = plx_submit(st, &bw->ev);
            if (rc) {
                a->round_status = rc;
                plx_block_free(bw->buf);
                free(bw);
                continue;
            }
            a->writes_inflight++;
        }
    }
}

/* A round with nothing to write (the changes were in extents since released) is done at once. */
static int round_finish_if_empty(plx_store *st)
{
    struct plx_alloc *a = st->alloc;
    if (a->writes_inflight)
        return 0;
    if (!a->round_status)
        a->written_gen = a->round_target;
    return 1;
}

int plx_alloc_sync(plx_store *st, uint64_t gen, void (*cb)(void *arg, int status), void *arg)
{
    struct plx_alloc *a = st->alloc;
    if (gen <= a->written_gen)
        return 1;
    if (a->writes_inflight == 0) {
        /* Callbacks never fire from inside this call: a round that needs no I/O is answered
         * by the return value. */
        sync_round_start(st);
        if (round_finish_if_empty(st))
            return a->round_status ? a->round_status : 1;
    }
    /* A round is in flight; if it does not reach gen, its completion starts the next one. */
    struct plx_alloc_waiter *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->gen = gen;
    w->cb = cb;
    w->arg = arg;
    w->next = a->waiters;
    a->waiters = w;
    return 0;
}

int plx_extent_entry_put(plx_store *st, uint64_t e, const struct plx_extent_entry *ent)
{
    return catalogue_entry_write(st, e, ent);
}

static void flag_done(void *arg, int status)
{
    int *f = arg;
    f[0] = status;
    f[1] = 1;
}

int plx_wait_alloc_written(plx_store *st)
{
    int f[2] = {0, 0};
    int rc = plx_alloc_sync(st, st->alloc->gen, flag_done, f);
    if (rc == 1)
        return 0;
    if (rc < 0)
        return rc;
    rc = plx_drive_until(st, &f[1]);
    return rc ? rc : f[0];
}

int plx_extent_free(plx_store *st, uint64_t e, uint64_t *free_blocks)
{
    int rc = 0;
    if (st->alloc->ext[e].held) {
        *free_blocks = count_free(st, st->alloc->ext[e].bitmap);
        return 0;
    }
    uint8_t *bits = plx_block_alloc(bitmap_blocks(st));
    rc = plx_bitmap_read(st, e, bits);
    if (!rc)
        *free_blocks = count_free(st, bits);
    plx_block_free(bits);
    return rc;
}
