/*
 * wlog_batch.c - the write log's batches: a record appended to the gathering batch (copied and
 * checksummed, or left in the writer's buffer), the batch sealed, placed in the ring and written,
 * the log flushed for the flushes that wait, and the requests completed once their pieces are
 * written (layer 6; wlog_shared.h). The log's format: docs/FORMAT.md §12.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "wlog_shared.h"

/* ---- Requests -------------------------------------------------------------------------------- */

void wlog_req_run_done(struct plx_deferred *d)
{
    struct wreq *r = (struct wreq *)((char *)d - offsetof(struct wreq, done));
    plx_done_fn cb = r->cb;
    void *arg = r->arg;
    int status = r->status;
    plx_block_free(r->merged);
    plx_block_free(r->edge);
    free(r);
    cb(arg, status);
}

void wlog_req_complete(struct plx_wlog *wl, struct wreq *r, int status)
{
    if (status && !r->status)
        r->status = status;
    r->done.run = wlog_req_run_done;
    plx_defer(wl->st, &r->done);
}

static void wflush_run_done(struct plx_deferred *d)
{
    struct wflush *f = (struct wflush *)((char *)d - offsetof(struct wflush, done));
    if (f->req) {
        struct wreq *r = f->req;
        if (f->status && !r->status)
            r->status = f->status;
        r->done.run = wlog_req_run_done;
        free(f);
        wlog_req_run_done(&r->done);
        return;
    }
    plx_done_fn cb = f->cb;
    void *arg = f->arg;
    int status = f->status;
    free(f);
    cb(arg, status);
}

static void wflush_complete(struct plx_wlog *wl, struct wflush *f, int status)
{
    f->status = status;
    f->done.run = wflush_run_done;
    plx_defer(wl->st, &f->done);
}

int wlog_add_flush_waiter(struct plx_wlog *wl, uint64_t need, plx_done_fn cb, void *arg,
                          struct wreq *r)
{
    struct wflush *f = calloc(1, sizeof *f);
    if (!f)
        return plx_err(wl->st, -ENOMEM, "out of memory");
    f->need_seq = need;
    f->cb = cb;
    f->arg = arg;
    f->req = r;
    struct wflush **pp = &wl->fl_wait;
    while (*pp)
        pp = &(*pp)->next;
    *pp = f;
    wlog_flush_kick(wl);
    return 0;
}

/* One piece of r is written to the log (or, durable = true, drained into the store). */
void wlog_piece_done(struct plx_wlog *wl, struct wreq *r, uint64_t seq, bool durable)
{
    if (seq > r->last_seq)
        r->last_seq = seq;
    if (--r->pieces || !r->all_appended)
        return;
    if ((r->flags & PLX_WRITE_FUA) && !durable) {
        if (wlog_add_flush_waiter(wl, r->last_seq, NULL, NULL, r))
            wlog_req_complete(wl, r, -ENOMEM);
        return;
    }
    wlog_req_complete(wl, r, 0);
}

/* ---- Batches --------------------------------------------------------------------------------- */

/* Batch buffers (1 MiB + 4 KiB) are kept for reuse: a lone writer at QD1 would otherwise
 * allocate and zero one per write. Nothing in them needs to be zero (the header is rebuilt
 * whole, data areas are written before they are read). The drain reads batches back into them
 * too: zeroing 1 MiB for each (plx_block_alloc) was 6-8% of serve's samples while a drain ran. */
static uint8_t *buf_get(struct plx_wlog *wl)
{
    if (wl->nspare)
        return wl->spare[--wl->nspare];
    void *p = NULL;
    if (posix_memalign(&p, BS, (size_t)BS * (1 + MAX_DATA)))
        abort(); /* as plx_block_alloc: out of memory */
    return p;
}

void wlog_buf_put(struct plx_wlog *wl, uint8_t *buf)
{
    if (!buf)
        return;
    if (wl->nspare < sizeof wl->spare / sizeof wl->spare[0])
        wl->spare[wl->nspare++] = buf;
    else
        free(buf);
}

void wlog_batch_free(struct plx_wlog *wl, struct wbatch *b)
{
    plx_slab_free(&wl->ent_slab[b->ent_class], b->ent);
    plx_slab_free(&wl->batch_slab, b);
}

static struct wbatch *gather_get(struct plx_wlog *wl)
{
    if (wl->gather)
        return wl->gather;
    if (wl->sealed >= MAX_SEALED)
        return NULL;
    struct wbatch *b = plx_slab_alloc(&wl->batch_slab);
    if (!b)
        return NULL;
    b->ent_class = ENT_CLASSES - 1;
    b->ent = plx_slab_alloc(&wl->ent_slab[b->ent_class]);
    if (!b->ent) {
        plx_slab_free(&wl->batch_slab, b);
        return NULL;
    }
    b->wl = wl;
    b->buf = buf_get(wl);
    b->state = B_GATHER;
    b->born_ns = plx_mono_ns();
    wl->nbatches++;
    b->memory_only = wl->failed;
    if (wl->last)
        wl->last->next = b;
    else
        wl->first = b;
    wl->last = b;
    wl->gather = b;
    return b;
}

/* Block blk of b's data while b is not written: in the batch buffer, or in the writer's buffer
 * for a record appended without a copy. */
const uint8_t *wlog_batch_data(const struct wbatch *b, uint32_t blk)
{
    if (b->zc_blocks)
        for (uint32_t i = 0; i < b->nent; i++) {
            const struct went *e = &b->ent[i];
            if (blk >= e->data_off && blk < e->data_off + e->nblocks) {
                if (e->zc)
                    return e->zc + (size_t)BS * (blk - e->data_off);
                break;
            }
        }
    return b->buf + (size_t)BS * (1 + blk);
}

/* b will not be written (the log failed) and is drained from its buffer: copy into it the
 * records appended without a copy. Their requests are not answered yet, so the writers'
 * buffers are still there. */
static void materialize(struct wbatch *b)
{
    for (uint32_t i = 0; i < b->nent; i++) {
        struct went *e = &b->ent[i];
        if (e->zc)
            memcpy(b->buf + (size_t)BS * (1 + e->data_off), e->zc, (size_t)BS * e->nblocks);
        e->zc = NULL;
    }
    b->zc_blocks = 0;
}

void wlog_seal(struct plx_wlog *wl, struct wbatch *b)
{
    /* Nothing appends to a sealed batch: give back the room it did not use (its records move to
     * the smallest class they fit; without memory for that the batch keeps its room). */
    uint8_t k = 0;
    while (k < ENT_CLASSES - 1 && (1u << k) < b->nent)
        k++;
    if (k < b->ent_class) {
        struct went *ent = plx_slab_alloc(&wl->ent_slab[k]);
        if (ent) {
            memcpy(ent, b->ent, b->nent * sizeof *ent);
            plx_slab_free(&wl->ent_slab[b->ent_class], b->ent);
            b->ent = ent;
            b->ent_class = k;
        }
    }
    b->state = B_SEALED;
    b->seq = wl->next_seq++;
    if (!wl->first_unwritten)
        wl->first_unwritten = b;
    if (b->seq == wl->barrier_seq)
        b->barrier = true;
    wl->gather = NULL;
    wl->sealed++;
    wlog_kick_later(wl); /* a sealed batch is written by the next kick */
}

/* Move first_unwritten past the batches written since. */
void wlog_advance_unwritten(struct plx_wlog *wl)
{
    struct wbatch *b = wl->first_unwritten;
    while (b && b->state >= B_WRITTEN)
        b = b->next;
    wl->first_unwritten = b;
}

/* Every batch up to this seq is written (or drained). */
static uint64_t written_contig(struct plx_wlog *wl)
{
    wlog_advance_unwritten(wl);
    const struct wbatch *b = wl->first_unwritten;
    if (!b || b->state == B_GATHER)
        return wl->next_seq - 1;
    return b->seq - 1;
}

/* Find room in the ring for b after the placed batches; false when the drain must free some. */
static bool place(struct plx_wlog *wl, struct wbatch *b)
{
    uint64_t n = 1 + (uint64_t)b->ndata;
    uint64_t p;
    struct wbatch *oldest = wl->last_placed ? wl->first : NULL;
    if (!oldest) {
        p = wl->head_pos + n <= wl->nblocks ? wl->head_pos : 1;
    } else if (wl->last_placed->pos >= oldest->pos) { /* not wrapped: tail ... head */
        if (wl->head_pos + n <= wl->nblocks)
            p = wl->head_pos;
        else if (1 + n <= oldest->pos)
            p = 1;
        else
            return false;
    } else if (wl->head_pos + n <= oldest->pos) {
        p = wl->head_pos;
    } else {
        return false;
    }
    b->pos = p;
    wl->head_pos = p + n;
    wl->last_placed = b;
    return true;
}

void wlog_enter_failed(struct plx_wlog *wl, int err, const char *what)
{
    if (wl->failed)
        return;
    wl->failed = true;
    snprintf(wl->error, sizeof wl->error,
             "%s on write log %s failed (%s): writes go through to the store from now on", what,
             wl->desc, strerror(-err));
    fprintf(stderr, "parallax: %s\n", wl->error);
    /* Batches not yet written never will be: they are drained from memory. */
    for (struct wbatch *b = wl->first; b; b = b->next)
        if (b->state == B_GATHER || b->state == B_SEALED) {
            b->memory_only = true;
            materialize(b);
        }
    /* Flushes waiting for the log now wait for the drain. */
    if (wl->flush_inflight) {
        /* their flush completes with an error and moves them back */
    }
}

static void batch_done(struct plx_wlog *wl, struct wbatch *b, int status)
{
    wl->flying--;
    wlog_advance_unwritten(wl);
    if (status) {
        wlog_enter_failed(wl, status, "a write");
        b->memory_only = true;
        materialize(b);
        b->state = B_WRITTEN;
    } else {
        b->state = B_WRITTEN;
        if (!b->memory_only) {
            wlog_buf_put(wl, b->buf);
            b->buf = NULL;
            wl->logged_bytes += (uint64_t)b->ndata * BS;
            wl->zc_bytes += (uint64_t)b->zc_blocks * BS;
            for (uint32_t i = 0; i < b->nent; i++) {
                wl->zc_records += b->ent[i].zc != NULL;
                b->ent[i].zc = NULL; /* the requests are answered below */
            }
            for (uint32_t i = 0; i < b->nent; i++)
                if (b->ent[i].req) {
                    struct wreq *r = b->ent[i].req;
                    b->ent[i].req = NULL;
                    wlog_piece_done(wl, r, b->seq, false);
                }
        }
    }
    wlog_flush_kick(wl);
    wl->queues_run(wl);
    wlog_kick_later(wl);
    wl->drain_kick(wl);
}

static void batch_written(struct plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct wbatch *b = ev->ctx;
    batch_done(b->wl, b, ev->status);
}

/* One piece of a batch written in pieces. */
static void piece_written(struct plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct wbatch *b = ev->ctx;
    if (ev->status && !b->wstatus)
        b->wstatus = ev->status;
    if (--b->wpending)
        return;
    free(b->wevs);
    b->wevs = NULL;
    batch_done(b->wl, b, b->wstatus);
}

/* Write b in pieces: the header block with the copied records after it from the batch buffer
 * (through the page cache), each record appended without a copy from the writer's buffer
 * (PLX_IO_DIRECT). The batch is written when every piece is; replay checks every record's
 * data against its checksum, so a crash between the pieces leaves a batch that does not verify,
 * as a torn single write does. */
static void write_pieces(struct plx_wlog *wl, struct wbatch *b)
{
    b->wevs = calloc(1 + b->nent, sizeof *b->wevs);
    if (!b->wevs) {
        batch_done(wl, b, -ENOMEM); /* as a failed write: the batch is drained from memory */
        return;
    }
    unsigned k = 0;
    b->wevs[0].io =
        (struct plx_io){.op = PLX_IO_WRITE, .block = b->pos, .nblocks = 1, .buf = b->buf};
    for (uint32_t i = 0; i < b->nent; i++) {
        const struct went *e = &b->ent[i];
        uint8_t *at = b->buf + (size_t)BS * (1 + e->data_off);
        struct plx_io *last = &b->wevs[k].io;
        if (!e->zc && !(last->flags & PLX_IO_DIRECT) &&
            (uint8_t *)last->buf + (size_t)BS * last->nblocks == at) {
            last->nblocks += e->nblocks; /* the next blocks of the buffer and of the disk */
            continue;
        }
        b->wevs[++k].io = (struct plx_io){.op = PLX_IO_WRITE,
                                          .flags = e->zc ? PLX_IO_DIRECT : 0,
                                          .block = b->pos + 1 + e->data_off,
                                          .nblocks = e->nblocks,
                                          .buf = e->zc ? (void *)(uintptr_t)e->zc : at};
    }
    b->wpending = 1;
    b->wstatus = 0;
    for (unsigned j = 0; j <= k; j++) {
        struct plx_ev *ev = &b->wevs[j];
        ev->handler = piece_written;
        ev->ctx = b;
        b->wpending++;
        int rc = plx_submit_side(wl->st, ev);
        if (rc) {
            b->wpending--;
            if (!b->wstatus)
                b->wstatus = rc;
        }
    }
    if (--b->wpending == 0) {
        free(b->wevs);
        b->wevs = NULL;
        batch_done(wl, b, b->wstatus);
    }
}

static void write_batch(struct plx_wlog *wl, struct wbatch *b)
{
    struct plx_wlog_batch *h = (struct plx_wlog_batch *)b->buf;
    memset(h, 0, BS);
    h->log_id = wl->log_id;
    h->seq = b->seq;
    h->nblocks = 1 + b->ndata;
    h->count = b->nent;
    for (uint32_t i = 0; i < b->nent; i++) {
        const struct went *e = &b->ent[i];
        h->entries[i].vdi_id = e->vdi_id;
        h->entries[i].vblock = e->vblock;
        h->entries[i].nblocks = e->nblocks;
        h->entries[i].op = PLX_WLOG_OP_WRITE;
        /* append took it with seed 0; written, as FORMAT.md says, with the batch's seq. */
        b->ent[i].crc = plx_crc32c_reseed(e->crc, 0, (uint32_t)b->seq, (uint64_t)e->nblocks * BS);
        h->entries[i].data_crc = b->ent[i].crc;
    }
    plx_blkhdr_seal(h, PLX_MAGIC_WLOG_BATCH, b->pos);
    b->state = B_FLYING;
    wl->sealed--;
    wl->flying++;
    if (b->zc_blocks) {
        write_pieces(wl, b);
        return;
    }
    b->ev.io = (struct plx_io){
        .op = PLX_IO_WRITE, .block = b->pos, .nblocks = 1 + b->ndata, .buf = b->buf};
    b->ev.handler = batch_written;
    b->ev.ctx = b;
    int rc = plx_submit_side(wl->st, &b->ev);
    if (rc) {
        b->ev.status = rc;
        wl->st->internal_ios++; /* batch_written is run as if it completed */
        batch_written(wl->st, &b->ev);
    }
}

static unsigned flying_max(const struct wbatch *b)
{
    return b->zc_blocks ? MAX_FLYING_ZC : MAX_FLYING;
}

static void kick_run(struct plx_deferred *d)
{
    struct plx_wlog *wl = (struct plx_wlog *)((char *)d - offsetof(struct plx_wlog, kick));
    wl->kick_queued = false;
    bool moved = false; /* a gather slot came free: stalled queues may go on */
    if (wl->gather && wl->gather->nent && wl->flying < flying_max(wl->gather)) {
        wlog_seal(wl, wl->gather);
        moved = true;
    }
    wlog_advance_unwritten(wl);
    wl->room_wait = false;
    for (struct wbatch *b = wl->first_unwritten; b; b = b->next) {
        if (b->state != B_SEALED)
            continue;
        if (b->memory_only) {
            b->state = B_WRITTEN;
            wl->sealed--;
            moved = true;
            continue;
        }
        if (wl->flying >= flying_max(b))
            break;
        if (!place(wl, b)) {
            wl->room_wait = true;
            break;
        }
        write_batch(wl, b);
        moved = true;
    }
    if (moved)
        wl->queues_run(wl);
    wl->drain_kick(wl);
}

void wlog_kick_later(struct plx_wlog *wl)
{
    if (wl->kick_queued)
        return;
    wl->kick_queued = true;
    wl->kick.run = kick_run;
    plx_defer(wl->st, &wl->kick);
}

/* ---- Flushes --------------------------------------------------------------------------------- */

static void log_flushed(struct plx_store *st, struct plx_ev *ev)
{
    struct plx_wlog *wl = ev->ctx;
    wl->flush_inflight = false;
    struct wflush *f = wl->fl_fly;
    wl->fl_fly = NULL;
    if (ev->status) {
        wlog_enter_failed(wl, ev->status, "a flush");
        /* Back to waiting: in write-through they complete when the drain made them durable. */
        while (f) {
            struct wflush *nx = f->next;
            f->next = wl->fl_wait;
            wl->fl_wait = f;
            f = nx;
        }
    }
    while (f) {
        struct wflush *nx = f->next;
        wflush_complete(wl, f, 0);
        f = nx;
    }
    wlog_flush_kick(wl);
}

void wlog_flush_kick(struct plx_wlog *wl)
{
    if (wl->failed) {
        for (struct wflush **pp = &wl->fl_wait; *pp;) {
            struct wflush *f = *pp;
            if (f->need_seq <= wl->released_seq) {
                *pp = f->next;
                wflush_complete(wl, f, 0);
            } else {
                pp = &f->next;
            }
        }
        return;
    }
    if (wl->flush_inflight || !wl->fl_wait)
        return;
    uint64_t contig = written_contig(wl);
    for (struct wflush **pp = &wl->fl_wait; *pp;) {
        struct wflush *f = *pp;
        if (f->need_seq <= contig) {
            *pp = f->next;
            f->next = wl->fl_fly;
            wl->fl_fly = f;
        } else {
            pp = &f->next;
        }
    }
    if (!wl->fl_fly)
        return;
    /* Batches after `contig` may hold writes submitted after this flush completes: the drain
     * must make everything up to contig durable in the store before it writes them. */
    struct wbatch *nb = wl->first_unwritten; /* (written_contig advanced it) */
    if (nb && nb->state != B_GATHER && nb->seq == contig + 1)
        nb->barrier = true;
    else
        wl->barrier_seq = contig + 1;
    wl->flush_inflight = true;
    wl->flush_ev.io = (struct plx_io){.op = PLX_IO_FLUSH};
    wl->flush_ev.handler = log_flushed;
    wl->flush_ev.ctx = wl;
    int rc = plx_submit_side(wl->st, &wl->flush_ev);
    if (rc) {
        wl->flush_ev.status = rc;
        wl->st->internal_ios++;
        log_flushed(wl->st, &wl->flush_ev);
    }
}

/* ---- Appending a record ---------------------------------------------------------------------- */

/* Copy len bytes to dst and return their CRC-32C with seed 0, a piece at a time so that the
 * checksum reads what the copy has just written while it is in the CPU's nearest cache.
 * 24 KiB: two runs of crc_hw_run's three lanes (12 KiB) each, the copy and the source of a piece
 * fit in L1 (48 KiB). */
#define COPY_CRC_PIECE (24u << 10)
static uint32_t copy_crc(uint8_t *dst, const uint8_t *src, size_t len)
{
    uint32_t c = 0;
    for (size_t done = 0; done < len;) {
        size_t k = len - done < COPY_CRC_PIECE ? len - done : COPY_CRC_PIECE;
        memcpy(dst + done, src + done, k);
        c = plx_crc32c(c, dst + done, k);
        done += k;
    }
    return c;
}

/* Append as much of r as fits; false when it must wait for room. A record is checksummed here,
 * while its data is fresh in the CPU's caches (received in this service pass, as a rule): in
 * write_batch, up to a few dozen MiB of other data later, the checksum missed the caches (23% of
 * serve's samples in a burst of 1 MiB writes). Its seed, the batch's seq, is not known yet: the
 * checksum is taken with seed 0 and write_batch turns it into the one with the seq
 * (plx_crc32c_reseed), without reading the data again. The data does not change in between: a
 * copied record's is in the batch buffer, and a record appended without a copy is in the
 * writer's buffer (or a sub-block write's merged blocks, or a rescued write's copy), which stays
 * until its request is answered, after its batch is written. */
bool wlog_append(struct plx_wlog *wl, struct plx_wlog_vdi *w, struct wreq *r)
{
    if (wl->pol.drain_delay_ns)
        wl->last_append_ns = plx_mono_ns();
    while (r->next_b < r->b1) {
        struct wbatch *g = gather_get(wl);
        if (!g)
            return false;
        if (g->nent == PLX_WLOG_PER_BATCH || g->ndata == MAX_DATA) {
            wlog_seal(wl, g);
            continue;
        }
        uint64_t n = r->b1 - r->next_b;
        if (n > MAX_DATA - g->ndata)
            n = MAX_DATA - g->ndata;
        struct went *e = &g->ent[g->nent++];
        e->vdi_id = r->v->rec.id;
        e->vblock = r->next_b;
        e->nblocks = (uint32_t)n;
        e->data_off = g->ndata;
        e->req = r;
        const uint8_t *src = r->src + (size_t)BS * (r->next_b - r->b0);
        if (wl->pol.zc_min && n >= wl->pol.zc_min && !g->memory_only &&
            (uintptr_t)src % wl->dio_align == 0) {
            e->zc = src;
            e->crc = plx_crc32c(0, src, (size_t)n * BS);
            g->zc_blocks += (uint32_t)n;
        } else {
            e->zc = NULL;
            e->crc = copy_crc(g->buf + (size_t)BS * (1 + g->ndata), src, (size_t)n * BS);
        }
        if (wlog_index_set(wl, e->vdi_id, e->vblock, n, g, e->data_off))
            r->status = -ENOMEM; /* reads could miss it: the write reports failure */
        g->ndata += (uint32_t)n;
        r->pieces++;
        w->records++;
        wl->backlog_records++;
        wl->backlog_blocks += n;
        r->next_b += n;
    }
    r->all_appended = true;
    wlog_kick_later(wl);
    return true;
}
