/*
 * wlog_drain.c - the write log's drain: rounds of the oldest written batches read back, their
 * records submitted to the pipeline in log order, the VDIs flushed, the tail moved past them;
 * and its write-back policy, the deferred drain (layer 6; wlog_shared.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"
#include "vdi_io.h"
#include "wlog_shared.h"

/* ---- The drain ------------------------------------------------------------------------------- */

static struct plx_vdi *vdi_by_id(plx_store *st, uint64_t id)
{
    for (struct plx_vdi *v = st->vdis; v; v = v->next)
        if (!v->ro && v->rec.id == id)
            return v;
    return NULL;
}

static void drain_fail(struct plx_wlog *wl, int status, const char *what)
{
    if (!wl->drain_error) {
        wl->drain_error = status;
        snprintf(wl->error, sizeof wl->error,
                 "draining write log %s into the store: %s failed (%s); its records stay in the "
                 "log and are replayed when it is attached again",
                 wl->desc, what, strerror(-status));
        fprintf(stderr, "parallax: %s\n", wl->error);
    }
    wl->round_active = false;
}

void wlog_release_round(struct plx_wlog *wl)
{
    if (wl->log_reads) {
        wl->release_waiting = true;
        return;
    }
    wl->release_waiting = false;
    wlog_advance_unwritten(wl); /* it must not point at a batch freed here */
    struct wbatch *b = wl->first, *end = wl->round_last->next;
    while (b != end) {
        struct wbatch *nx = b->next;
        for (uint32_t i = 0; i < b->nent; i++) {
            struct went *e = &b->ent[i];
            wlog_index_drop(wl, e->vdi_id, e->vblock, e->nblocks, b);
            struct plx_vdi *v = vdi_by_id(wl->st, e->vdi_id);
            if (v && v->wc && !--v->wc->records)
                v->wc->hurry = false; /* (what it waited for is in the store) */
            wl->backlog_records--;
            wl->backlog_blocks -= e->nblocks;
            wl->drained_bytes += (uint64_t)e->nblocks * BS;
            if (e->req) {
                struct wreq *r = e->req;
                e->req = NULL;
                wlog_piece_done(wl, r, b->seq, true);
            }
        }
        if (b == wl->last_placed)
            wl->last_placed = NULL;
        if (b == wl->last)
            wl->last = NULL;
        wl->released_seq = b->seq;
        wl->nbatches--;
        wlog_buf_put(wl, b->buf);
        wlog_batch_free(wl, b);
        b = nx;
    }
    wl->first = b;
    wl->round_active = false;
    wlog_flush_kick(wl);
    wl->queues_run(wl);
    wlog_kick_later(wl);
    wlog_drain_kick(wl);
}

static void head_written(struct plx_store *st, struct plx_ev *ev)
{
    struct plx_wlog *wl = ev->ctx;
    if (ev->status)
        wlog_enter_failed(wl, ev->status, "writing the head block");
    wlog_release_round(wl);
}

/* The store holds the round durably: move the tail past it. */
static void round_commit(struct plx_wlog *wl)
{
    if (wl->round_status) {
        drain_fail(wl, wl->round_status,
                   wl->round_crc_bad ? "checking a record read back from the log against its "
                                       "checksum"
                                     : "a write or flush of the store");
        return;
    }
    if (wl->failed) {
        wlog_release_round(wl);
        return;
    }
    struct wbatch *nb = wl->round_last->next;
    struct plx_wlog_head *h = wl->head;
    if (nb && nb->state >= B_FLYING) {
        h->tail_seq = nb->seq;
        h->tail_pos = nb->pos;
    } else {
        h->tail_seq = nb && nb->state != B_GATHER ? nb->seq : wl->next_seq;
        h->tail_pos = wl->head_pos;
        /* An unplaced sealed batch goes at head_pos or, when it does not fit, at block 1:
         * replay tries both. */
    }
    h->seq++;
    plx_blkhdr_seal(h, PLX_MAGIC_WLOG_HEAD, 0);
    wl->head_ev.io = (struct plx_io){
        .op = PLX_IO_WRITE, .flags = PLX_IO_FUA, .block = 0, .nblocks = 1, .buf = h};
    wl->head_ev.handler = head_written;
    wl->head_ev.ctx = wl;
    int rc = plx_submit_side(wl->st, &wl->head_ev);
    if (rc) {
        wl->head_ev.status = rc;
        wl->st->internal_ios++;
        head_written(wl->st, &wl->head_ev);
    }
}

static void round_all_done(struct plx_wlog *wl);

static void round_step_done(void *arg, int status)
{
    struct plx_wlog *wl = arg;
    if (status && !wl->round_status)
        wl->round_status = status;
    if (--wl->round_pending)
        return;
    round_all_done(wl);
}

/* A record of the round written by the pipeline: the held apply resumes once half of
 * APPLY_INFLIGHT is free (round_pending: the apply's own count and the records in flight). */
static void apply_write_done(void *arg, int status)
{
    struct plx_wlog *wl = arg;
    if (wl->apply_held && wl->round_pending - 2 <= APPLY_INFLIGHT / 2) {
        wl->apply_held = false;
        plx_defer_turn(wl->st, &wl->apply_next);
    }
    round_step_done(wl, status);
}

/* Every record of the round is written to the store (or failed): flush, then commit. */
static void round_all_done(struct plx_wlog *wl)
{
    if (wl->ntouched && !wl->round_status) {
        /* The writes are in; now make them durable in the store, one flush per VDI. */
        size_t n = wl->ntouched;
        wl->ntouched = 0;
        wl->round_pending = 1;
        for (size_t i = 0; i < n; i++) {
            struct plx_vdi *v = wl->touched[i];
            if (v->wc)
                v->wc->touched = false;
            wl->round_pending++;
            int rc = plx_vdi_direct_flush(v, round_step_done, wl);
            if (rc) {
                wl->round_pending--;
                if (!wl->round_status)
                    wl->round_status = rc;
            }
        }
        if (--wl->round_pending)
            return;
    }
    for (size_t i = 0; i < wl->ntouched; i++)
        if (wl->touched[i]->wc)
            wl->touched[i]->wc->touched = false;
    wl->ntouched = 0;
    round_commit(wl);
}

static void touch(struct plx_wlog *wl, struct plx_vdi *v)
{
    for (size_t i = 0; i < wl->ntouched; i++)
        if (wl->touched[i] == v)
            return;
    if (wl->ntouched == wl->captouched) {
        size_t c = wl->captouched ? wl->captouched * 2 : 8;
        struct plx_vdi **t = realloc(wl->touched, c * sizeof *t);
        if (!t)
            return;
        wl->touched = t;
        wl->captouched = c;
    }
    wl->touched[wl->ntouched++] = v;
}

/* Submit the round's next records to the pipeline, in log order, APPLY_RECORDS or
 * APPLY_BLOCKS at most, and leave the rest to the next service pass: submitting a whole round
 * (up to 4096 records of 4 KiB) in one pass kept a server's loop from its sockets for 100-400
 * ms, the tail of QD1 writes with the cache on (bench/README.md, "Write cache"). And no more
 * than APPLY_INFLIGHT records in the pipeline at once. The round's round_pending holds one
 * count for the steps until the last one. */
static void round_apply_step(struct plx_wlog *wl)
{
    unsigned recs = 0, blocks = 0;
    while (wl->apply_b != wl->round_last->next && !wl->round_status) {
        struct wbatch *b = wl->apply_b;
        if (wl->apply_i == b->nent) {
            wl->apply_b = b->next;
            wl->apply_i = 0;
            continue;
        }
        if (recs >= APPLY_RECORDS || blocks >= APPLY_BLOCKS) {
            plx_defer_turn(wl->st, &wl->apply_next);
            return;
        }
        if (wl->round_pending - 1 >= APPLY_INFLIGHT) {
            wl->apply_held = true; /* apply_write_done resumes */
            return;
        }
        const struct went *e = &b->ent[wl->apply_i++];
        recs++;
        blocks += e->nblocks;
        /* What the log gives back must be what was written: with the log in the page cache, a
         * page dropped after its writeback failed reads back as whatever the disk holds. Such
         * a record must not reach the store; the drain stops and the records stay. */
        if (!b->memory_only && plx_crc32c((uint32_t)b->seq, b->rbuf + (size_t)BS * e->data_off,
                                          (size_t)e->nblocks * BS) != e->crc) {
            wl->round_status = -EIO;
            wl->round_crc_bad = true;
            break;
        }
        struct plx_vdi *v = vdi_by_id(wl->st, e->vdi_id);
        int rc = v ? 0 : -ENOENT;
        if (v) {
            touch(wl, v);
            wl->round_pending++;
            rc = plx_vdi_direct_write(v, b->rbuf + (size_t)BS * e->data_off, e->vblock * BS,
                                      (size_t)e->nblocks * BS, 0, apply_write_done, wl);
            if (rc)
                wl->round_pending--;
        }
        if (rc && !wl->round_status)
            wl->round_status = rc;
    }
    round_step_done(wl, 0);
}

static void apply_next_run(struct plx_deferred *d)
{
    round_apply_step((struct plx_wlog *)((char *)d - offsetof(struct plx_wlog, apply_next)));
}

/* The round's data is in memory: submit its records to the pipeline in log order. */
static void round_apply(struct plx_wlog *wl)
{
    if (wl->round_status) {
        drain_fail(wl, wl->round_status, "reading records back from the log");
        return;
    }
    wl->round_pending = 1;
    wl->apply_held = false;
    wl->apply_b = wl->first;
    wl->apply_i = 0;
    wl->apply_next.run = apply_next_run;
    round_apply_step(wl);
}

static void round_read_done(struct plx_store *st, struct plx_ev *ev)
{
    struct wbatch *b = ev->ctx;
    struct plx_wlog *wl = b->wl;
    if (ev->status && !wl->round_status)
        wl->round_status = ev->status;
    if (--wl->round_pending == 0)
        round_apply(wl);
}

/* Read the round's batches back into rarena: batches adjacent in the ring in one read of their
 * headers and data (READ_SPAN blocks at most, or one larger batch), one span per service pass,
 * the rest on the next (plx_defer_turn). At QD1 every batch is one 4 KiB record: a read each,
 * all in one pass, held the serving loop for milliseconds (bench/notes/wcache.md, "QD1 tail with
 * the drain"). A batch written past the page cache as a whole (zc_blocks) is read the same way, its
 * data alone (no copy, and the page cache is not filled with what is read once). The round's
 * round_pending holds one count for the steps until the last one. */
static void round_read_step(struct plx_wlog *wl)
{
    struct wbatch *end = wl->round_last->next;
    unsigned step = 0;
    while (wl->read_b != end && !wl->round_status) {
        struct wbatch *s = wl->read_b;
        if (s->memory_only || !s->ndata) {
            if (s->memory_only)
                s->rbuf = s->buf + BS;
            wl->read_b = s->next;
            continue;
        }
        if (step) {
            plx_defer_turn(wl->st, &wl->read_next);
            return;
        }
        bool direct = s->zc_blocks == s->ndata;
        uint64_t start = direct ? s->pos + 1 : s->pos;
        uint32_t n = 0;
        struct wbatch *b = s;
        if (direct) {
            s->rbuf = wl->rarena + (size_t)BS * wl->read_off;
            n = s->ndata;
            b = s->next;
        } else {
            while (b != end && !b->memory_only && b->ndata && b->zc_blocks != b->ndata &&
                   b->pos == start + n && (n == 0 || n + 1 + b->ndata <= READ_SPAN)) {
                b->rbuf = wl->rarena + (size_t)BS * (wl->read_off + n + 1);
                n += 1 + b->ndata;
                b = b->next;
            }
        }
        wl->read_b = b;
        /* the read fills what is used: no zeroing */
        s->ev.io = (struct plx_io){.op = PLX_IO_READ,
                                   .flags = direct ? PLX_IO_DIRECT : 0,
                                   .block = start,
                                   .nblocks = n,
                                   .buf = wl->rarena + (size_t)BS * wl->read_off};
        s->ev.handler = round_read_done;
        s->ev.ctx = s;
        wl->read_off += n;
        step += n;
        wl->round_pending++;
        int rc = plx_submit_side(wl->st, &s->ev);
        if (rc) {
            wl->round_pending--;
            wl->round_status = rc;
        }
    }
    if (--wl->round_pending == 0)
        round_apply(wl);
}

static void read_next_run(struct plx_deferred *d)
{
    round_read_step((struct plx_wlog *)((char *)d - offsetof(struct plx_wlog, read_next)));
}

/* Does anyone wait for the drain? Then it must not be deferred. Every wait for the drain
 * shows here: writers waiting for room in the ring (room_wait), a log that failed (its flushes
 * and writes complete only once drained; memory-only batches), plx_wlog_close, and per VDI a
 * detach (close, `cache disable`, the automatic mode turning off: detaching), a handover or an
 * explicit hurry (hurry), and a trim or snapshot queued behind the VDI's records (the head of
 * its queue: everything before it is appended already). */
static bool drain_wanted(const struct plx_wlog *wl)
{
    if (wl->failed || wl->closing || wl->room_wait || (wl->first && wl->first->memory_only))
        return true;
    for (const struct plx_wlog_vdi *w = wl->vdis; w; w = w->next)
        if (w->detaching || w->hurry ||
            (w->q_head && (w->q_head->kind == Q_TRIM || w->q_head->kind == Q_SNAP)))
            return true;
    return false;
}

void wlog_drain_timer_run(struct plx_timer *t)
{
    wlog_drain_kick((struct plx_wlog *)((char *)t - offsetof(struct plx_wlog, drain_timer)));
}

/* The drain's write-back policy (docs/DESIGN.md, "The deferred drain"; bcache's writeback_delay
 * and writeback_percent, dm-writecache's watermarks): while guests are writing, reading the log
 * back and writing the store competes with them for the CPU and the local disk, so the drain
 * waits while all of these hold: nobody waits for it (drain_wanted), the log is less than half
 * full, a record was appended within the idle window (pol.drain_delay_ns), and the oldest record
 * is younger than pol.drain_max_age_ns (how far the store may lag). The engine timer kicks the
 * drain when the earliest of those last two runs out; any other kick (a batch written, a waiter)
 * looks again. Returns true when deferred. */
static bool drain_defer(struct plx_wlog *wl)
{
    wl->deferred = false;
    if (!wl->pol.drain_delay_ns || drain_wanted(wl))
        return false;
    if ((wl->backlog_blocks + wl->nbatches) * 2 >= wl->nblocks)
        return false; /* the high watermark: half the ring */
    uint64_t now = plx_mono_ns();
    uint64_t idle_at = wl->last_append_ns + wl->pol.drain_delay_ns;
    uint64_t age_at = wl->first->born_ns + wl->pol.drain_max_age_ns;
    if (now >= idle_at || now >= age_at)
        return false;
    plx_timer_arm(wl->st, &wl->drain_timer, age_at < idle_at ? age_at : idle_at);
    wl->deferred = true;
    return true;
}

/* Clear every cached VDI's record of this log: from here on the log is not replayed for them
 * (the log failed; what follows goes through to the store). From inside the service loop, so
 * without waiting for the pipeline: a snapshot record already captured with the fields set
 * could still land after this write (DESIGN.md, known limitations). */
static int clear_fields(struct plx_wlog *wl)
{
    plx_store *st = wl->st;
    /* (Every VDI whose record names the log: the cached ones, and those the automatic mode
     * bound to it with the cache off.) */
    for (struct plx_vdi *v = st->vdis; v; v = v->next) {
        if (v->ro || v->rec.wlog_id != wl->log_id)
            continue;
        int rc = plx_admin_lock(st);
        if (rc)
            return rc;
        struct plx_vdi_record rec = v->rec;
        rec.wlog_host = rec.wlog_id = 0;
        rc = plx_registry_write(st, v->slot_addr, &rec);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc) {
            rec.seq++;
            v->rec = rec;
        }
        plx_admin_unlock(st);
        if (rc)
            return rc;
    }
    return 0;
}

void wlog_drain_kick(struct plx_wlog *wl)
{
    if (wl->round_active || wl->drain_error || wl->drain_paused || !wl->first)
        return;
    struct wbatch *b = wl->first;
    if (b->state != B_WRITTEN)
        return;
    if (drain_defer(wl))
        return;
    plx_timer_cancel(wl->st, &wl->drain_timer);
    bool mem = b->memory_only;
    if (mem && !wl->fields_cleared) {
        int rc = clear_fields(wl);
        if (rc) {
            drain_fail(wl, rc, "clearing the VDI records");
            return;
        }
        wl->fields_cleared = true;
    }
    if (!mem && !wl->rarena)
        wl->rarena = plx_block_alloc_unzeroed(ROUND_BLOCKS); /* every read fills what is used */
    unsigned count = 0, blocks = 0;
    while (b && b->state == B_WRITTEN && b->memory_only == mem &&
           (count == 0 || (!b->barrier && blocks + 1 + b->ndata <= ROUND_BLOCKS))) {
        b->state = B_DRAINING;
        count++;
        blocks += 1 + b->ndata;
        wl->round_last = b;
        b = b->next;
    }
    wl->round_active = true;
    wl->round_status = 0;
    wl->round_crc_bad = false;
    wl->round_pending = 1;
    wl->read_b = wl->first;
    wl->read_off = 0;
    wl->read_next.run = read_next_run;
    round_read_step(wl);
}
