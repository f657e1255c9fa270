/*
 * reclaim.c - the holder's side of collecting garbage in the extents it holds (layer 6,
 * reclaim.h; the collector's side is in gc.c, the allocator's in alloc.c, "Folding in").
 *
 * A collector cannot clear bits in a bitmap that a live process writes from memory, and does
 * not know which of that process's blocks are handed out but not linked yet. So it talks to the
 * holder through each held extent's reclaim record (FORMAT.md §6.1), and the holder frees the
 * blocks itself, like Ceph's snaptrim run by the OSD that owns the placement group:
 *
 * 1. The collector writes a REQUEST (a nonce, the holder's identity) into the record.
 * 2. This process sees it on its next poll (a timer: the catalogue blocks of its held extents,
 *    then each named record's request block, all asynchronous), begins a reclaim round
 *    (plx_alloc_round_begin: every block handed out from now on is young for it) and notes
 *    where each open VDI's request stream and batches are. Once everything before those
 *    points has finished (every block handed out before the round is linked on the medium or
 *    abandoned), it writes the ack block: "nonce N answered with round R".
 * 3. The collector, having seen the ack, checkpoints the extent's bitmap and reads the roots,
 *    marks, and PUBLISHES the blocks allocated in its checkpoint and unmarked, for round R.
 * 4. On a later poll this process reads the candidate bits, folds them into its allocator
 *    (plx_alloc_fold: not the blocks young for R, nor those claimed and not handed out), has
 *    the bitmaps written, drops its clean cached nodes (their blocks may be reused now) and
 *    writes the ack block again with the count it freed.
 *
 * Everything here is engine I/O from the service loop: the loop never waits for it. A crash
 * of this process at any step leaves its extents to a dead holder, which the next collection
 * sweeps itself; a crash before the freed bits are written leaks them until then.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "cache.h"
#include "lock.h"
#include "pipeline.h"
#include "reclaim.h"

#define BARRIER_CHECK_NS 5000000ull /* while a round waits for its barrier: every 5 ms */

struct ext_rec {
    uint64_t ack_addr;
    uint64_t acked_nonce, round;   /* the last request answered */
    uint64_t folded_nonce, folded; /* the last publication folded */
    uint64_t want_ack;             /* a request waiting for the barrier to be answered */
};

/* Where one open VDI was when the round began: the round's barrier has passed for it once
 * every batch up to `batch` and every request before `seq` has finished. */
struct vpos {
    struct plx_vdi *v;
    uint64_t id, batch, seq;
};

struct rec_io {
    struct plx_ev ev;
    struct plx_reclaim *rc;
    uint64_t e;
    void *buf; /* block-aligned */
};

struct fold_job {
    uint64_t e;
    struct plx_reclaim_req req;
    uint8_t *bits; /* bits_blocks blocks as read */
};

struct plx_reclaim {
    plx_store *st;
    struct plx_timer timer;
    uint64_t poll_ns;
    bool closing;
    bool polling; /* a poll's chain of I/O is under way */
    unsigned inflight;
    int err;
    struct ext_rec *ext; /* extent_count entries */
    /* The poll: the catalogue blocks [cat_first, cat_first + cat_n). */
    struct rec_io cat_io;
    uint64_t cat_first, cat_n;
    /* Request blocks read, one per held extent that has a record. */
    struct rec_io *hdr;
    size_t nhdr;
    /* Publications being folded: their candidate blocks read, one I/O per block. */
    struct fold_job *jobs;
    size_t njobs;
    struct rec_io *bits_io;
    size_t nbits_io;
    bool alloc_wait; /* the folded bits are being written (plx_alloc_sync) */
    /* The round waiting for its barrier (0: none), the request it answers. */
    uint64_t barrier_round, barrier_nonce;
    struct vpos *pos;
    size_t npos;
    /* Ack blocks being written. */
    struct rec_io *ack_io;
    size_t nack_io;
};

static void poll_end(struct plx_reclaim *rc);

static void arm(struct plx_reclaim *rc, uint64_t after_ns)
{
    if (!rc->closing)
        plx_timer_arm(rc->st, &rc->timer, plx_mono_ns() + after_ns);
}

static int submit(struct plx_reclaim *rc, struct rec_io *io, enum plx_io_op op, uint64_t block,
                  uint32_t n, void (*done)(plx_store *, struct plx_ev *))
{
    memset(&io->ev, 0, sizeof io->ev);
    io->ev.io.op = op;
    io->ev.io.block = block;
    io->ev.io.nblocks = n;
    io->ev.io.buf = io->buf;
    io->ev.handler = done;
    io->ev.ctx = io;
    io->rc = rc;
    int err = plx_submit(rc->st, &io->ev);
    if (!err)
        rc->inflight++;
    return err;
}

/* ---- Answering requests: the round's barrier ---------------------------------------------- */

/* Has everything handed out before the round began been linked or given up? */
static bool barrier_passed(const struct plx_reclaim *rc)
{
    const plx_store *st = rc->st;
    /* An admin operation allocates and links outside the streams; timers do not run inside
     * one, but a claim ahead holds the lock across passes: just wait for it. */
    if (st->admin_depth)
        return false;
    for (size_t i = 0; i < rc->npos; i++) {
        const struct vpos *p = &rc->pos[i];
        const struct plx_vdi *v = st->vdis;
        while (v && !(v == p->v && v->rec.id == p->id))
            v = v->next;
        if (!v)
            continue; /* closed: everything it had finished */
        if ((v->flight && v->flight->seq <= p->batch) ||
            (v->flight_next && v->flight_next->seq <= p->batch) ||
            (v->open && v->open->seq <= p->batch) || !plx_vdi_finished_before(v, p->seq))
            return false;
    }
    return true;
}

static int barrier_begin(struct plx_reclaim *rc, uint64_t nonce)
{
    plx_store *st = rc->st;
    size_t n = 0;
    for (struct plx_vdi *v = st->vdis; v; v = v->next)
        n++;
    struct vpos *pos = calloc(n ? n : 1, sizeof *pos);
    if (!pos)
        return -ENOMEM;
    n = 0;
    for (struct plx_vdi *v = st->vdis; v; v = v->next)
        pos[n++] = (struct vpos){
            .v = v, .id = v->rec.id, .batch = v->batch_seq, .seq = plx_vdi_next_seq(v)};
    free(rc->pos);
    rc->pos = pos;
    rc->npos = n;
    rc->barrier_round = plx_alloc_round_begin(st);
    rc->barrier_nonce = nonce;
    return 0;
}

static void ack_fill(const struct plx_reclaim *rc, uint64_t e, struct plx_reclaim_ack *a)
{
    const struct ext_rec *x = &rc->ext[e];
    memset(a, 0, PLX_BLOCK_SIZE);
    a->extent = e;
    plx_holder_set_me(rc->st, &a->holder_host, &a->holder_pid, &a->holder_epoch);
    a->acked_nonce = x->acked_nonce;
    a->round = x->round;
    a->folded_nonce = x->folded_nonce;
    a->folded = x->folded;
    plx_blkhdr_seal(a, PLX_MAGIC_RECLAIM_ACK, x->ack_addr);
}

static void ack_done(plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct rec_io *io = ev->ctx;
    struct plx_reclaim *rc = io->rc;
    rc->inflight--;
    if (ev->status && !rc->err)
        rc->err = ev->status;
    if (rc->inflight == 0)
        poll_end(rc);
}

/* Write the ack block of every extent in `which` (extent numbers), as ext_rec says now. */
static void acks_write(struct plx_reclaim *rc, const uint64_t *which, size_t n)
{
    rc->ack_io = calloc(n ? n : 1, sizeof *rc->ack_io);
    if (!rc->ack_io) {
        poll_end(rc);
        return;
    }
    rc->nack_io = n;
    for (size_t i = 0; i < n; i++) {
        struct rec_io *io = &rc->ack_io[i];
        io->e = which[i];
        io->buf = plx_block_alloc(1);
        ack_fill(rc, which[i], io->buf);
        if (submit(rc, io, PLX_IO_WRITE, rc->ext[which[i]].ack_addr, 1, ack_done))
            rc->err = -EIO;
    }
    if (rc->inflight == 0)
        poll_end(rc);
}

/* The round's barrier passed: answer every request waiting for it. */
static void barrier_answer(struct plx_reclaim *rc)
{
    plx_store *st = rc->st;
    uint64_t *which = calloc(st->sb.extent_count, sizeof *which);
    size_t n = 0;
    for (uint64_t e = 1; which && e < st->sb.extent_count; e++) {
        struct ext_rec *x = &rc->ext[e];
        if (x->want_ack != rc->barrier_nonce)
            continue;
        x->want_ack = 0;
        x->acked_nonce = rc->barrier_nonce;
        x->round = rc->barrier_round;
        which[n++] = e;
    }
    rc->barrier_round = 0;
    rc->barrier_nonce = 0;
    free(rc->pos);
    rc->pos = NULL;
    rc->npos = 0;
    rc->polling = true;
    acks_write(rc, which, which ? n : 0);
    free(which);
}

/* ---- Folding publications ------------------------------------------------------------------ */

static void folded_written(void *arg, int status)
{
    struct plx_reclaim *rc = arg;
    rc->alloc_wait = false;
    if (status && !rc->err)
        rc->err = status;
    if (rc->closing || status) {
        poll_end(rc);
        return;
    }
    uint64_t *which = calloc(rc->njobs ? rc->njobs : 1, sizeof *which);
    size_t n = 0;
    for (size_t j = 0; which && j < rc->njobs; j++)
        if (rc->ext[rc->jobs[j].e].folded_nonce == rc->jobs[j].req.nonce)
            which[n++] = rc->jobs[j].e;
    acks_write(rc, which, which ? n : 0);
    free(which);
}

/* Every candidate block is read: check them, fold, write the bitmaps, then the acks. */
static void fold_all(struct plx_reclaim *rc)
{
    plx_store *st = rc->st;
    uint64_t eb = st->sb.extent_blocks, total = 0;
    uint8_t *bits = calloc(eb / 8, 1);
    for (size_t j = 0; bits && j < rc->njobs; j++) {
        struct fold_job *job = &rc->jobs[j];
        const struct plx_reclaim_req *q = &job->req;
        bool ok = true;
        memset(bits, 0, eb / 8);
        for (uint32_t k = 0; k < q->bits_blocks && ok; k++) {
            const struct plx_reclaim_bits *b =
                (const struct plx_reclaim_bits *)(job->bits + (size_t)k * PLX_BLOCK_SIZE);
            const char *why = "";
            /* Bits of another publication (a collector rewrote them since): not ours to use. */
            ok = plx_blkhdr_verify(b, PLX_MAGIC_RECLAIM_BITS, q->bits_addr[k], &why) == 0 &&
                 b->extent == job->e && b->nonce == q->nonce && b->index == k;
            uint64_t from = (uint64_t)k * (PLX_RECLAIM_BITS_PER_BLOCK / 8);
            uint64_t len = sizeof b->bits;
            if (ok && from < eb / 8)
                memcpy(bits + from, b->bits, from + len > eb / 8 ? eb / 8 - from : len);
        }
        if (!ok)
            continue;
        /* Refused (the round is gone, the extent was taken after it): answered as 0 freed, so
         * that the collector stops waiting; the next collection finds the blocks again. */
        int64_t freed = plx_alloc_fold(st, job->e, q->round, q->nonce, bits);
        if (freed < 0)
            freed = 0;
        rc->ext[job->e].folded_nonce = q->nonce;
        rc->ext[job->e].folded = (uint64_t)freed;
        total += (uint64_t)freed;
    }
    free(bits);
    if (total)
        plx_cache_drop_clean(st); /* freed blocks may be handed out again from now on */
    rc->alloc_wait = true;
    int r = plx_alloc_sync(st, plx_alloc_gen(st), folded_written, rc);
    if (r != 0) /* 1: written already; < 0: error (its callback never fires) */
        folded_written(rc, r < 0 ? r : 0);
}

/* One read of a round of reads came in: the round's rc once it was the last and all went well
 * (the caller takes the next step), else NULL (more to come, or the round ended: poll_end). */
static struct plx_reclaim *round_read_done(struct plx_ev *ev)
{
    struct rec_io *io = ev->ctx;
    struct plx_reclaim *rc = io->rc;
    rc->inflight--;
    if (ev->status && !rc->err)
        rc->err = ev->status;
    if (rc->inflight)
        return NULL;
    if (rc->err || rc->closing) {
        poll_end(rc);
        return NULL;
    }
    return rc;
}

static void bits_done(plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct plx_reclaim *rc = round_read_done(ev);
    if (rc)
        fold_all(rc);
}

static void folds_start(struct plx_reclaim *rc)
{
    size_t total = 0;
    for (size_t j = 0; j < rc->njobs; j++)
        total += rc->jobs[j].req.bits_blocks;
    rc->bits_io = calloc(total ? total : 1, sizeof *rc->bits_io);
    if (!rc->bits_io) {
        poll_end(rc);
        return;
    }
    rc->nbits_io = 0;
    for (size_t j = 0; j < rc->njobs; j++) {
        struct fold_job *job = &rc->jobs[j];
        job->bits = plx_block_alloc(job->req.bits_blocks ? job->req.bits_blocks : 1);
        for (uint32_t k = 0; k < job->req.bits_blocks; k++) {
            struct rec_io *io = &rc->bits_io[rc->nbits_io++];
            io->e = job->e;
            io->buf = job->bits + (size_t)k * PLX_BLOCK_SIZE;
            if (submit(rc, io, PLX_IO_READ, job->req.bits_addr[k], 1, bits_done))
                rc->err = -EIO;
        }
    }
    if (rc->inflight == 0) {
        if (rc->err)
            poll_end(rc);
        else
            fold_all(rc);
    }
}

/* ---- The poll ------------------------------------------------------------------------------ */

static bool bits_in_store(const plx_store *st, const struct plx_reclaim_req *q)
{
    for (uint32_t k = 0; k < q->bits_blocks; k++)
        if (!q->bits_addr[k] || q->bits_addr[k] >= st->sb.block_count)
            return false;
    return true;
}

/* Every request block is read: answer requests (begin a round) and collect publications. */
static void requests_seen(struct plx_reclaim *rc)
{
    plx_store *st = rc->st;
    struct plx_alloc *a = st->alloc;
    uint64_t eb = st->sb.extent_blocks;
    rc->jobs = calloc(rc->nhdr ? rc->nhdr : 1, sizeof *rc->jobs);
    rc->njobs = 0;
    for (size_t i = 0; rc->jobs && i < rc->nhdr; i++) {
        uint64_t e = rc->hdr[i].e;
        const struct plx_reclaim_req *q = rc->hdr[i].buf;
        const char *why = "";
        if (plx_blkhdr_verify(q, PLX_MAGIC_RECLAIM_REQ, rc->hdr[i].ev.io.block, &why) ||
            q->extent != e || !q->nonce || !a->ext[e].held || !q->ack_addr ||
            q->ack_addr >= st->sb.block_count ||
            !plx_holder_is_me(st, q->holder_host, q->holder_pid, q->holder_epoch))
            continue; /* not a record (an old collector freed it), or not for us */
        struct ext_rec *x = &rc->ext[e];
        x->ack_addr = q->ack_addr;
        if (q->state == PLX_RECLAIM_REQUEST && q->nonce != x->acked_nonce &&
            q->nonce != x->want_ack) {
            if (!rc->barrier_round && barrier_begin(rc, q->nonce) != 0)
                continue;
            if (rc->barrier_nonce == q->nonce)
                x->want_ack = q->nonce; /* another collector's request: the next poll */
        } else if (q->state == PLX_RECLAIM_PUBLISHED && q->nonce != x->folded_nonce &&
                   q->bits_blocks > 0 && q->bits_blocks <= PLX_RECLAIM_MAX_BITS_BLOCKS &&
                   (uint64_t)q->bits_blocks * PLX_RECLAIM_BITS_PER_BLOCK >= eb &&
                   bits_in_store(st, q)) {
            struct fold_job *job = &rc->jobs[rc->njobs++];
            job->e = e;
            memcpy(&job->req, q, sizeof job->req);
        }
    }
    if (rc->njobs)
        folds_start(rc);
    else
        poll_end(rc);
}

static void hdr_done(plx_store *st, struct plx_ev *ev)
{
    (void)st;
    struct plx_reclaim *rc = round_read_done(ev);
    if (rc)
        requests_seen(rc);
}

/* The catalogue blocks of the held extents are read: read the records they name. */
static void cat_done(plx_store *st, struct plx_ev *ev)
{
    struct rec_io *io = ev->ctx;
    struct plx_reclaim *rc = io->rc;
    rc->inflight--;
    if (ev->status || rc->closing) {
        rc->err = ev->status;
        poll_end(rc);
        return;
    }
    rc->hdr = calloc(st->sb.extent_count, sizeof *rc->hdr);
    rc->nhdr = 0;
    for (uint64_t b = 0; rc->hdr && b < rc->cat_n; b++) {
        const struct plx_catalog_block *cb =
            (const struct plx_catalog_block *)((uint8_t *)io->buf + b * PLX_BLOCK_SIZE);
        const char *why = "";
        uint64_t cbn = rc->cat_first + b;
        if (plx_blkhdr_verify(cb, PLX_MAGIC_CATALOG, st->sb.catalogue_start + cbn, &why) ||
            cb->first_extent != cbn * PLX_CATALOG_PER_BLOCK || cb->count > PLX_CATALOG_PER_BLOCK)
            continue;
        for (uint32_t i = 0; i < cb->count; i++) {
            uint64_t e = cb->first_extent + i, addr = cb->entries[i].reclaim;
            if (e == 0 || e >= st->sb.extent_count || !st->alloc->ext[e].held || !addr ||
                addr >= st->sb.block_count)
                continue;
            struct rec_io *h = &rc->hdr[rc->nhdr++];
            h->e = e;
            h->buf = plx_block_alloc(1);
            if (submit(rc, h, PLX_IO_READ, addr, 1, hdr_done))
                rc->err = -EIO;
        }
    }
    if (rc->inflight == 0) {
        if (rc->err || !rc->nhdr)
            poll_end(rc);
        else
            requests_seen(rc);
    }
}

static void poll_start(struct plx_reclaim *rc)
{
    plx_store *st = rc->st;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++)
        if (st->alloc->ext[e].held) {
            uint64_t b = e / PLX_CATALOG_PER_BLOCK;
            lo = b < lo ? b : lo;
            hi = b > hi ? b : hi;
        }
    if (lo == UINT64_MAX) {
        arm(rc, rc->poll_ns);
        return;
    }
    rc->polling = true;
    rc->err = 0;
    rc->cat_first = lo;
    rc->cat_n = hi - lo + 1;
    rc->cat_io.buf = plx_block_alloc(rc->cat_n);
    if (submit(rc, &rc->cat_io, PLX_IO_READ, st->sb.catalogue_start + lo, (uint32_t)rc->cat_n,
               cat_done))
        poll_end(rc);
}

/* The poll's chain is over (done or failed): free what it used and wait for the next. */
static void poll_end(struct plx_reclaim *rc)
{
    if (rc->inflight || rc->alloc_wait)
        return;
    plx_block_free(rc->cat_io.buf);
    rc->cat_io.buf = NULL;
    for (size_t i = 0; i < rc->nhdr; i++)
        plx_block_free(rc->hdr[i].buf);
    free(rc->hdr);
    rc->hdr = NULL;
    rc->nhdr = 0;
    for (size_t j = 0; j < rc->njobs; j++)
        plx_block_free(rc->jobs[j].bits);
    free(rc->jobs);
    rc->jobs = NULL;
    rc->njobs = 0;
    free(rc->bits_io);
    rc->bits_io = NULL;
    rc->nbits_io = 0;
    for (size_t i = 0; i < rc->nack_io; i++)
        plx_block_free(rc->ack_io[i].buf);
    free(rc->ack_io);
    rc->ack_io = NULL;
    rc->nack_io = 0;
    rc->polling = false;
    arm(rc, rc->barrier_round ? BARRIER_CHECK_NS : rc->poll_ns);
}

static void timer_run(struct plx_timer *t)
{
    struct plx_reclaim *rc =
        (struct plx_reclaim *)((char *)t - offsetof(struct plx_reclaim, timer));
    if (rc->closing || rc->polling)
        return;
    if (rc->st->fenced || rc->st->fatal) {
        arm(rc, rc->poll_ns);
        return;
    }
    if (rc->barrier_round && barrier_passed(rc)) {
        barrier_answer(rc);
        return;
    }
    if (rc->barrier_round) {
        arm(rc, BARRIER_CHECK_NS);
        return;
    }
    poll_start(rc);
}

void plx_reclaim_init(plx_store *st)
{
    if (st->read_only)
        return;
    const char *env = getenv("PARALLAX_RECLAIM_POLL_MS");
    uint64_t ms = env && *env ? strtoull(env, NULL, 10) : 1000;
    if (ms == 0)
        return;
    struct plx_reclaim *rc = calloc(1, sizeof *rc);
    if (!rc)
        return;
    rc->ext = calloc(st->sb.extent_count, sizeof *rc->ext);
    if (!rc->ext) {
        free(rc);
        return;
    }
    rc->st = st;
    rc->poll_ns = ms * 1000000ull;
    rc->timer.run = timer_run;
    st->reclaim = rc;
    arm(rc, rc->poll_ns);
}

void plx_reclaim_stop(plx_store *st)
{
    struct plx_reclaim *rc = st->reclaim;
    if (!rc)
        return;
    rc->closing = true;
    plx_timer_cancel(st, &rc->timer);
}

void plx_reclaim_free(plx_store *st)
{
    struct plx_reclaim *rc = st->reclaim;
    if (!rc)
        return;
    rc->alloc_wait = false;
    rc->inflight = 0;
    rc->closing = true;
    poll_end(rc);
    plx_timer_cancel(st, &rc->timer);
    free(rc->pos);
    free(rc->ext);
    free(rc);
    st->reclaim = NULL;
}
