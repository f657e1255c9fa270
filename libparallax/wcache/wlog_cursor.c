/*
 * wlog_cursor.c - replay's reading side: the batches past the log's tail, read and checked one
 * by one, and the log restarted after the last one applied (layer 6; wlog.h; wlog_attach.c
 * applies what it reads).
 */
#include <errno.h>
#include <string.h>
#include "wlog_shared.h"

/* ---- Replay's reading side (wlog_attach.c applies what it reads) ----------------------------- */

/* Read and check the batch at pos; returns its header in hb and data in *data, or false. */
static bool read_batch(struct plx_wlog *wl, uint64_t pos, uint64_t seq, uint8_t *hb, uint8_t **data)
{
    if (pos < 1 || pos >= wl->nblocks || wlog_side_sync(wl, PLX_IO_READ, pos, 1, hb, 0))
        return false;
    const char *why;
    if (plx_blkhdr_verify(hb, PLX_MAGIC_WLOG_BATCH, pos, &why))
        return false;
    const struct plx_wlog_batch *h = (const void *)hb;
    if (h->log_id != wl->log_id || h->seq != seq || h->count > PLX_WLOG_PER_BATCH ||
        h->nblocks < 1 || pos + h->nblocks > wl->nblocks)
        return false;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < h->count; i++) {
        if (h->entries[i].op != PLX_WLOG_OP_WRITE)
            return false;
        sum += h->entries[i].nblocks;
    }
    if (sum + 1 != h->nblocks)
        return false;
    *data = sum ? plx_block_alloc(sum) : NULL;
    if (sum && wlog_side_sync(wl, PLX_IO_READ, pos + 1, (uint32_t)sum, *data, 0)) {
        plx_block_free(*data);
        return false;
    }
    uint64_t o = 0;
    for (uint32_t i = 0; i < h->count; i++) {
        size_t bytes = (size_t)h->entries[i].nblocks * BS;
        if (plx_crc32c((uint32_t)seq, *data + o * BS, bytes) != h->entries[i].data_crc) {
            plx_block_free(*data); /* torn: never acknowledged, and the log ends here */
            return false;
        }
        o += h->entries[i].nblocks;
    }
    return true;
}

int plx_wlog_cursor_open(plx_store *st, struct plx_wlog_cursor *c)
{
    struct plx_wlog *wl = st->wlog;
    c->pos = wl->head->tail_pos;
    c->seq = wl->head->tail_seq;
    c->data = NULL;
    c->hb = plx_block_alloc(1);
    return c->hb ? 0 : plx_err(st, -ENOMEM, "out of memory");
}

/* The batch at the cursor, or at block 1 when the log wrapped there; false at the log's end
 * (the first batch that is missing, foreign, out of sequence or torn: never acknowledged). */
bool plx_wlog_cursor_read(plx_store *st, struct plx_wlog_cursor *c)
{
    struct plx_wlog *wl = st->wlog;
    uint8_t *data = NULL; /* (read_batch frees what it allocated when it fails) */
    if (read_batch(wl, c->pos, c->seq, c->hb, &data)) {
        c->data = data;
        return true;
    }
    data = NULL;
    if (c->pos == 1 || !read_batch(wl, 1, c->seq, c->hb, &data))
        return false;
    c->data = data;
    c->pos = 1;
    return true;
}

void plx_wlog_cursor_step(struct plx_wlog_cursor *c)
{
    const struct plx_wlog_batch *bh = (const void *)c->hb;
    plx_block_free(c->data);
    c->data = NULL;
    c->pos += bh->nblocks;
    c->seq++;
}

void plx_wlog_cursor_close(struct plx_wlog_cursor *c)
{
    plx_block_free(c->data);
    plx_block_free(c->hb);
    c->data = c->hb = NULL;
}

/* Everything before the cursor is in the store: the log starts afresh there. */
int plx_wlog_restart_at(plx_store *st, const struct plx_wlog_cursor *c, uint64_t replayed)
{
    struct plx_wlog *wl = st->wlog;
    struct plx_wlog_head *h = wl->head;
    wl->replayed_records = replayed;
    h->tail_pos = c->pos < wl->nblocks ? c->pos : 1;
    h->tail_seq = c->seq;
    h->seq++;
    plx_blkhdr_seal(h, PLX_MAGIC_WLOG_HEAD, 0);
    int rc = wlog_side_sync(wl, PLX_IO_WRITE, 0, 1, h, PLX_IO_FUA);
    if (rc)
        return plx_err(st, rc, "writing the head of write log %s: %s", wl->desc, strerror(-rc));
    wl->head_pos = h->tail_pos;
    wl->next_seq = c->seq;
    wl->released_seq = c->seq - 1;
    return 0;
}
