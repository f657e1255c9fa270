/*
 * wlog_read.c - reads of a cached VDI: each block from its newest record (the batch buffer
 * while not written, else the log) or from the pipeline (layer 6; wlog_shared.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "vdi_io.h"
#include "wlog_shared.h"

/* ---- Reads ----------------------------------------------------------------------------------- */

struct wread {
    struct plx_wlog *wl;
    uint8_t *bounce, *ubuf;
    uint64_t off, len, b0;
    plx_done_fn cb;
    void *arg;
    int status;
    unsigned pending;
    struct plx_ev *evs;
    struct plx_deferred done;
};

static void wread_run_done(struct plx_deferred *d)
{
    struct wread *rd = (struct wread *)((char *)d - offsetof(struct wread, done));
    if (!rd->status)
        memcpy(rd->ubuf, rd->bounce + rd->off - rd->b0 * BS, rd->len);
    plx_done_fn cb = rd->cb;
    void *arg = rd->arg;
    int status = rd->status;
    plx_block_free(rd->bounce);
    free(rd->evs);
    free(rd);
    cb(arg, status);
}

static void wread_step(struct wread *rd, int status)
{
    if (status && !rd->status)
        rd->status = status;
    if (--rd->pending)
        return;
    /* Completion from inside the callbacks of other requests: deliver at the end of the pass. */
    rd->done.run = wread_run_done;
    plx_defer(rd->wl->st, &rd->done);
}

static void wread_store_done(void *arg, int status)
{
    wread_step(arg, status);
}

static void wread_log_done(struct plx_store *st, struct plx_ev *ev)
{
    struct wread *rd = ev->ctx;
    struct plx_wlog *wl = rd->wl;
    wl->log_reads--;
    wread_step(rd, ev->status);
    if (!wl->log_reads && wl->release_waiting)
        wlog_release_round(wl);
}

/* Read whole or partial blocks [off, off+len) of v: newest records from the log or memory, the
 * rest from the store. */
int wlog_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb, void *arg)
{
    struct plx_wlog *wl = v->st->wlog;
    uint64_t b0 = off / BS, b1 = (off + len + BS - 1) / BS;
    uint64_t id = v->rec.id;
    unsigned hits = 0;
    if (off + len <= v->rec.size)
        for (uint64_t b = b0; b < b1; b++)
            if (wlog_index_find(wl, id, b, NULL))
                hits++;
    if (!hits)
        return plx_vdi_direct_read(v, buf, off, len, cb, arg);
    struct wread *rd = calloc(1, sizeof *rd);
    if (!rd)
        return plx_err(v->st, -ENOMEM, "out of memory");
    rd->wl = wl;
    rd->bounce = plx_block_alloc(b1 - b0);
    rd->evs = calloc(hits, sizeof *rd->evs);
    rd->ubuf = buf;
    rd->off = off;
    rd->len = len;
    rd->b0 = b0;
    rd->cb = cb;
    rd->arg = arg;
    rd->pending = 1;
    unsigned k = 0;
    for (uint64_t b = b0; b < b1;) {
        uint32_t blk;
        struct wbatch *eb = wlog_index_find(wl, id, b, &blk);
        if (!eb) {
            uint64_t end = b + 1;
            while (end < b1 && !wlog_index_find(wl, id, end, NULL))
                end++;
            rd->pending++;
            int rc = plx_vdi_direct_read(v, rd->bounce + (b - b0) * BS, b * BS,
                                         (size_t)(end - b) * BS, wread_store_done, rd);
            if (rc) {
                rd->pending--;
                rd->status = rc;
            }
            b = end;
            continue;
        }
        uint8_t *dst = rd->bounce + (b - b0) * BS;
        if (eb->buf) {
            memcpy(dst, wlog_batch_data(eb, blk), BS);
        } else {
            struct plx_ev *ev = &rd->evs[k++];
            ev->io = (struct plx_io){
                .op = PLX_IO_READ, .block = eb->pos + 1 + blk, .nblocks = 1, .buf = dst};
            ev->handler = wread_log_done;
            ev->ctx = rd;
            rd->pending++;
            wl->log_reads++;
            int rc = plx_submit_side(v->st, ev);
            if (rc) {
                rd->pending--;
                wl->log_reads--;
                rd->status = rc;
            }
        }
        b++;
    }
    wread_step(rd, 0);
    return 0;
}

int wlog_read_blocks(struct plx_vdi *v, uint8_t *buf, uint64_t vb, uint64_t n, plx_done_fn cb,
                     void *arg)
{
    return wlog_read(v, buf, vb * BS, (size_t)(n * BS), cb, arg);
}
