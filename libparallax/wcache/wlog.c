/*
 * wlog.c - the write cache: a per-host write log on local disk (layer 6; wlog.h).
 *
 * The log is a ring of batches on the side medium (st->side_be): block 0 is the head block
 * (whose blockstore and host, where the durable tail is), and each batch is one log write, a
 * header block listing up to 126 records followed by their data (docs/FORMAT.md §12).
 *
 * Life of a cached write: it waits in its VDI's queue (FIFO, so sub-block writes can read the
 * edges of their blocks first), is copied into the gathering batch (a large one is not: ZC_MIN)
 * and indexed, and completes when its batch is written. A batch is sealed and written at the end of the service pass that
 * filled it, up to MAX_FLYING at once; while those fly, the next one gathers. A flush completes
 * after a log flush issued once every batch sealed before it was written. The drain takes the
 * oldest written batches (a round; a round never spans a guest flush), reads their data back,
 * submits it to the pipeline in log order, flushes the VDIs it touched, and then writes the
 * head block with the new tail (FUA). Only then is the ring space reused.
 *
 * If the log fails (EIO on a write or flush), the cache falls back to write-through: batches
 * not written stay in memory, every VDI's record stops naming the log once the batches before
 * them are drained, and their requests complete when the drain has made them durable in the
 * store.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>
#include "lock.h"
#include "registry.h"
#include "vdi_io.h"
#include "slab.h"
#include "wlog.h"

#define BS PLX_BLOCK_SIZE
#define MAX_DATA 256u      /* data blocks per batch (1 MiB) */
#define MAX_FLYING 4u      /* batch writes in flight */
/* ... when the batch holds records written from the writers' buffers: those wait for the disk,
 * where a write through the page cache completes at once, and four 1 MiB writes in flight did
 * not keep the disk busy (3 writers x 64 MiB of 1 MiB writes, the drain held: 914-984 MiB/s,
 * with 16 969-1669 MiB/s). */
#define MAX_FLYING_ZC 16u
#define MAX_SEALED 2u      /* sealed batches waiting for room or a write slot */
#define ROUND_BLOCKS 4096u /* ring blocks per drain round (16 MiB; headers counted: rarena) */
/* The drain reads a round back in spans of batches adjacent in the ring, READ_SPAN blocks at
 * most each (a larger batch alone), one span per service pass (round_read_step). A buffered
 * read completes inside io_submit (a copy out of the page cache): with spans of 257 blocks
 * (1 MiB and a block) QD1's p99 was 1.65x that with 64 (bench/notes/wcache.md, "QD1 tail"). */
#define READ_SPAN 64u
#define APPLY_RECORDS 128u /* records a drain round submits per service pass ... */
#define APPLY_BLOCKS 1024u /* ... or data blocks (4 MiB) */
/* Records of a drain round in the pipeline at once: past that the round's next records wait
 * until half of those have completed. A whole round in flight (4096 records of 4 KiB to a slow
 * store) cost the engine thread, which also answers the guest, time per submission and
 * completion growing with it: the pipeline's conflict checks and libiscsi's command queue walk
 * the requests in flight. (A round of large records is far fewer records than this.) */
#define APPLY_INFLIGHT 256u
/* Batch buffers kept for reuse (buf_get): as many as are in use at once, the batches gathering,
 * sealed and in flight. With 8, the rest came from the heap each time, which gave them back to
 * the kernel, and the reads past the page cache faulted in fresh pages: 8-10% of serve's samples
 * in a burst of 1 MiB writes with the drain running (perf: do_anonymous_page under aio_read).
 * Held only once used: at most this many MiB. (The drain reads into rarena.) */
#define SPARE_BUFS (MAX_FLYING_ZC + MAX_SEALED + 1u)
#define MIN_LOG_BLOCKS (1u + 2u * (1u + MAX_DATA))
/* A record of at least this many blocks whose data lies in the writer's buffer aligned as the
 * log medium's O_DIRECT needs (plx_backend_dio_align: 512 bytes on ext4 over a disk of 512-byte
 * sectors, where tapdisk's buffers lie 512 bytes past a page boundary) is not copied into its
 * batch: the batch is written in pieces, that record straight from the
 * writer's buffer and past the page cache (PLX_IO_DIRECT), the header and the copied records
 * through it. Smaller writes keep the page cache, where a QD1 write completes without waiting
 * for the disk. $PARALLAX_WCACHE_ZC_MIN (blocks, 0 = never) overrides it: measurements, and the
 * crash harness, whose writes are smaller. */
#define ZC_MIN 64u
/* The deferred drain (drain_defer): it starts once no record has been appended for
 * DRAIN_DELAY_MS, or its oldest record is DRAIN_MAX_AGE_MS old, or the log is half full, or
 * someone waits for it. $PARALLAX_WCACHE_DRAIN_DELAY_MS and $PARALLAX_WCACHE_DRAIN_MAX_AGE_MS
 * override them (0: drain at once). */
#define DRAIN_DELAY_MS 50u
#define DRAIN_MAX_AGE_MS 2000u

enum bstate { B_GATHER, B_SEALED, B_FLYING, B_WRITTEN, B_DRAINING };

/* A batch's record array comes from one of these slabs: class k holds 1 << k records, the last
 * class PLX_WLOG_PER_BATCH. A batch gathers in the last class; sealing moves its records to the
 * smallest class they fit (a QD1 batch holds one record until drained). */
#define ENT_CLASSES 8u

struct wreq;

struct went {
    uint64_t vdi_id, vblock;
    uint32_t nblocks, data_off;
    /* Until write_batch: crc32c(0, the data), taken by append; from then on data_crc as written
     * (seeded with the batch's seq): the drain checks what it reads back. */
    uint32_t crc;
    struct wreq *req; /* the request it belongs to (NULL once acknowledged) */
    /* Appended without a copy (ZC_MIN): its data in the writer's buffer, until the batch is
     * written; the request is not answered before then, so the buffer stays. Else NULL, the
     * data in the batch buffer at data_off. */
    const uint8_t *zc;
};

struct wbatch {
    struct plx_wlog *wl;
    uint64_t seq, pos;
    uint64_t born_ns; /* when its first record was appended (monotonic): the drain's max age */
    uint32_t ndata, nent;
    enum bstate state;
    bool barrier;        /* a guest flush lies between it and the batches before: drain flushes */
    bool memory_only;    /* the log failed: drained from buf, its requests complete then */
    uint8_t *buf;        /* header block + data, while not written (memory_only: until drained) */
    uint8_t *rbuf;       /* drain: the data read back */
    uint32_t zc_blocks;  /* data blocks of records appended without a copy */
    uint8_t ent_class;   /* ent's slab (ent_alloc) */
    unsigned wpending;   /* written in pieces: pieces not completed */
    int wstatus;         /* and the first error of one */
    struct plx_ev *wevs; /* their I/Os */
    /* The records: room for PLX_WLOG_PER_BATCH while gathering, trimmed to nent when sealed. A
     * batch lives until drained, and at QD 1 each holds one record: room for 126 kept the
     * server at some 12 KiB of memory per undrained 4 KiB write (a full 1 GiB log of them,
     * 1.5 GB; tests/integration/wcache_memory.sh). */
    struct went *ent;
    struct plx_ev ev;
    struct wbatch *next;
};

/* Index: (VDI, virtual block) -> the newest record of it not yet drained, ICHUNK blocks per
 * entry. One entry per block cost a hash lookup and an allocation per 4 KiB at append and at
 * the drain: 12% of serve's samples in a burst of 1 MiB writes, which now look up 16 entries
 * each, not 256. Each block keeps its own slot, so a later write of some of a chunk's blocks
 * replaces just those (newest wins), and the drain clears just the slots still naming the
 * drained batch. A lone 4 KiB record costs an entry of some 200 bytes instead of 40. */
#define ICHUNK 16u
struct ient {
    uint64_t vdi_id, chunk; /* virtual blocks chunk * ICHUNK ... + ICHUNK - 1 */
    struct ient *next;
    uint32_t used;        /* bit k: block chunk * ICHUNK + k has a record in b[k] */
    uint16_t blk[ICHUNK]; /* its data block within the batch */
    struct wbatch *b[ICHUNK];
};

enum qkind { Q_WRITE, Q_TRIM, Q_SNAP, Q_READ };

/* A request of a cached VDI waiting in, or passed through, its queue. */
struct wreq {
    struct plx_vdi *v;
    enum qkind kind;
    plx_done_fn cb;
    void *arg;
    int status;
    uint64_t off, len;
    uint64_t b0, b1, next_b; /* blocks; next_b: appended up to */
    const uint8_t *src;      /* block-aligned source of blocks b0..b1 */
    uint8_t *merged;         /* sub-block writes: the whole blocks, edges read first */
    const uint8_t *ubuf;
    void *rbuf; /* Q_READ: the caller's buffer */
    unsigned flags;
    bool edges_started, ready, all_appended, held;
    unsigned edge_pending;
    uint8_t *edge;           /* two blocks: head and tail edge */
    unsigned pieces;         /* appended pieces whose batch is not written yet */
    uint64_t last_seq;
    char label[PLX_LABEL_MAX + 1];
    uint64_t *index_out;
    struct wreq *qnext;
    struct plx_deferred done;
};

struct wflush {
    uint64_t need_seq;
    plx_done_fn cb;
    void *arg;
    struct wreq *req; /* a FUA write completing through this flush, else NULL */
    int status;
    struct wflush *next;
    struct plx_deferred done;
};

struct plx_wlog_vdi {
    struct plx_vdi *v;
    struct wreq *q_head, *q_tail;
    struct wreq *held_head, *held_tail; /* submitted while turning the cache off */
    uint64_t records;                   /* appended and not yet drained */
    bool detaching, touched;
    bool async_detach; /* detaching without a caller waiting: process_all finishes it */
    /* Requests of v went straight to the pipeline (a trim, or writes from before the cache was
     * turned on without a store flush): a guest flush flushes the store too, until one is
     * issued after every such request numbered below direct_seq has finished. */
    bool direct_dirty;
    uint64_t direct_seq;
    /* Writes from before the cache turned on that were put in the log as well (wpass_rescue)
     * and whose pipeline write has not finished: a guest flush needs no store flush for them. */
    unsigned rescued_inflight;
    /* Someone waits for v's records to reach the store (plx_wlog_vdi_hurry, a handover's
     * plx_wlog_vdi_draining): the drain does not defer until they have (drain_wanted). */
    bool hurry;
    struct plx_wlog_vdi *next;
};

struct plx_wlog {
    plx_store *st;
    plx_backend *be;
    char desc[128];
    uint64_t nblocks, log_id;
    uint32_t zc_min;            /* ZC_MIN, or $PARALLAX_WCACHE_ZC_MIN */
    size_t dio_align;           /* a record's data must be this aligned for ZC_MIN */
    struct plx_wlog_head *head; /* the head block as last written */
    struct wbatch *first, *last, *gather, *last_placed;
    /* The oldest batch not yet written (sealed or flying), the gathering one, or NULL: every
     * batch before it is written, so flushes and the kick start here, not at `first`. */
    struct wbatch *first_unwritten;
    uint64_t next_seq, head_pos, released_seq, barrier_seq;
    unsigned flying, sealed;
    bool kick_queued;
    struct plx_deferred kick;
    struct wflush *fl_wait, *fl_fly;
    bool flush_inflight;
    struct plx_ev flush_ev;
    /* drain */
    bool round_active, release_waiting;
    unsigned round_pending, log_reads;
    int round_status;
    struct wbatch *round_last; /* newest batch of the round */
    struct wbatch *apply_b;    /* round_apply_step: the next record to submit */
    struct wbatch *read_b;     /* round_read_step: the next batch to read back */
    uint32_t read_off;         /* ... and where in rarena its span goes */
    struct plx_deferred read_next;
    /* The round's read-back buffer, ROUND_BLOCKS blocks, kept once used: a buffer of its own
     * per batch (1 MiB, and at QD1 a batch is one 4 KiB record) made a round of 4096 batches
     * 4096 allocations, page faults and reads on the engine thread in one pass. */
    uint8_t *rarena;
    bool round_crc_bad;        /* a record read back did not match its checksum */
    uint32_t apply_i;
    struct plx_deferred apply_next;
    bool apply_held;           /* round_apply_step stopped at APPLY_INFLIGHT */
    struct plx_ev head_ev;
    struct plx_vdi **touched;
    size_t ntouched, captouched;
    uint8_t *spare[SPARE_BUFS]; /* batch and drain-read buffers to reuse */
    unsigned nspare;
    /* index */
    struct ient **tab;
    size_t mask, nidx;
    /* The deferred drain (drain_defer): the idle window and max age (0: drain at once), the
     * last append, and the engine timer that starts the drain when one of them has passed. */
    uint64_t delay_ns, max_age_ns, last_append_ns;
    struct plx_timer drain_timer;
    bool deferred;     /* the last kick deferred the drain (status) */
    bool room_wait;    /* a sealed batch found no room in the ring: writers wait for the drain */
    bool closing;      /* plx_wlog_close */
    uint64_t nbatches; /* batches not yet released: ring blocks in use = nbatches + backlog */
    /* state */
    bool failed, fields_cleared, drain_paused;
    int drain_error;
    char error[256];
    uint64_t backlog_records, backlog_blocks, drained_bytes, attach_ns, replayed_records;
    /* Written to the log: data bytes, and of them the bytes and records written straight from
     * the writers' buffers (ZC_MIN): whether large writes take the no-copy path (status). */
    uint64_t logged_bytes, zc_bytes, zc_records;
    struct plx_wlog_vdi *vdis;
    int lock_fd;
    /* What lives as long as a record (its batch, the batch's records, index entries) comes
     * from slabs, not from malloc: slab.h says why (a caller's freed request buffers). */
    struct plx_slab batch_slab, ient_slab, ent_slab[ENT_CLASSES];
};

static void kick_later(struct plx_wlog *wl);
static void drain_kick(struct plx_wlog *wl);
static void process_all(struct plx_wlog *wl);
static void flush_kick(struct plx_wlog *wl);

/* ---- Index ------------------------------------------------------------------------------------ */

static size_t ihash(const struct plx_wlog *wl, uint64_t vdi, uint64_t chunk)
{
    uint64_t x = vdi * 0x9e3779b97f4a7c15ull ^ chunk * 0xc2b2ae3d27d4eb4full;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (size_t)x & wl->mask;
}

static struct ient *ichunk(const struct plx_wlog *wl, uint64_t vdi, uint64_t chunk)
{
    for (struct ient *e = wl->tab[ihash(wl, vdi, chunk)]; e; e = e->next)
        if (e->vdi_id == vdi && e->chunk == chunk)
            return e;
    return NULL;
}

/* The batch holding the newest record of (vdi, vb), and in *blk its data block there; NULL if
 * none is in the log. */
static struct wbatch *ifind(const struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint32_t *blk)
{
    const struct ient *e = ichunk(wl, vdi, vb / ICHUNK);
    uint32_t k = (uint32_t)(vb % ICHUNK);
    if (!e || !(e->used & (1u << k)))
        return NULL;
    if (blk)
        *blk = e->blk[k];
    return e->b[k];
}

static void igrow(struct plx_wlog *wl)
{
    size_t n = (wl->mask + 1) * 2;
    struct ient **old = wl->tab;
    size_t oldn = wl->mask + 1;
    struct ient **tab = calloc(n, sizeof *tab);
    if (!tab)
        return; /* keep the smaller table: slower, still right */
    wl->tab = tab;
    wl->mask = n - 1;
    for (size_t i = 0; i < oldn; i++)
        for (struct ient *e = old[i], *nx; e; e = nx) {
            nx = e->next;
            size_t h = ihash(wl, e->vdi_id, e->chunk);
            e->next = tab[h];
            tab[h] = e;
        }
    free(old);
}

/* Blocks vb ... vb + n - 1 of vdi: newest in batch b, data blocks blk ... blk + n - 1. */
static int iset(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n, struct wbatch *b,
                uint32_t blk)
{
    for (uint64_t end = vb + n; vb < end;) {
        uint64_t chunk = vb / ICHUNK;
        struct ient *e = ichunk(wl, vdi, chunk);
        if (!e) {
            e = plx_slab_alloc(&wl->ient_slab);
            if (!e)
                return -ENOMEM;
            e->vdi_id = vdi;
            e->chunk = chunk;
            e->used = 0;
            size_t h = ihash(wl, vdi, chunk);
            e->next = wl->tab[h];
            wl->tab[h] = e;
            if (++wl->nidx > wl->mask + 1)
                igrow(wl);
        }
        for (; vb < end && vb / ICHUNK == chunk; vb++, blk++) {
            uint32_t k = (uint32_t)(vb % ICHUNK);
            e->used |= 1u << k;
            e->b[k] = b;
            e->blk[k] = (uint16_t)blk;
        }
    }
    return 0;
}

/* Forget those of blocks vb ... vb + n - 1 of vdi whose newest record is in batch b. */
static void idrop(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n,
                  const struct wbatch *b)
{
    for (uint64_t end = vb + n; vb < end;) {
        uint64_t chunk = vb / ICHUNK;
        struct ient **pp = &wl->tab[ihash(wl, vdi, chunk)];
        while (*pp && !((*pp)->vdi_id == vdi && (*pp)->chunk == chunk))
            pp = &(*pp)->next;
        struct ient *e = *pp;
        for (; vb < end && vb / ICHUNK == chunk; vb++) {
            uint32_t k = (uint32_t)(vb % ICHUNK);
            if (e && e->b[k] == b)
                e->used &= ~(1u << k);
        }
        if (e && !e->used) {
            *pp = e->next;
            plx_slab_free(&wl->ient_slab, e);
            wl->nidx--;
        }
    }
}

/* ---- Blocking I/O on the log (attach, replay, detach: nothing else in flight) ---------------- */

static void side_sync_done(struct plx_io *io, int status)
{
    int *r = io->owner;
    r[0] = status;
    r[1] = 1;
}

static int side_sync(struct plx_wlog *wl, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                     unsigned flags)
{
    int r[2] = {0, 0};
    struct plx_io io = {.op = op, .flags = flags, .block = block, .nblocks = n, .buf = buf};
    io.done = side_sync_done;
    io.owner = r;
    int rc = wl->be->ops->submit(wl->be, &io);
    if (rc)
        return rc;
    while (!r[1]) {
        rc = wl->be->ops->poll(wl->be, -1);
        if (rc < 0 && rc != -EINTR)
            return rc;
    }
    return r[0];
}

/* ---- Requests ------------------------------------------------------------------------------ */

static void wreq_run_done(struct plx_deferred *d)
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

static void wreq_complete(struct plx_wlog *wl, struct wreq *r, int status)
{
    if (status && !r->status)
        r->status = status;
    r->done.run = wreq_run_done;
    plx_defer(wl->st, &r->done);
}

static void wflush_run_done(struct plx_deferred *d)
{
    struct wflush *f = (struct wflush *)((char *)d - offsetof(struct wflush, done));
    if (f->req) {
        struct wreq *r = f->req;
        if (f->status && !r->status)
            r->status = f->status;
        r->done.run = wreq_run_done;
        free(f);
        wreq_run_done(&r->done);
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

static int add_flush_waiter(struct plx_wlog *wl, uint64_t need, plx_done_fn cb, void *arg,
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
    flush_kick(wl);
    return 0;
}

/* One piece of r is written to the log (or, durable = true, drained into the store). */
static void piece_done(struct plx_wlog *wl, struct wreq *r, uint64_t seq, bool durable)
{
    if (seq > r->last_seq)
        r->last_seq = seq;
    if (--r->pieces || !r->all_appended)
        return;
    if ((r->flags & PLX_WRITE_FUA) && !durable) {
        if (add_flush_waiter(wl, r->last_seq, NULL, NULL, r))
            wreq_complete(wl, r, -ENOMEM);
        return;
    }
    wreq_complete(wl, r, 0);
}

/* ---- Batches ----------------------------------------------------------------------------------- */

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

static void buf_put(struct plx_wlog *wl, uint8_t *buf)
{
    if (!buf)
        return;
    if (wl->nspare < sizeof wl->spare / sizeof wl->spare[0])
        wl->spare[wl->nspare++] = buf;
    else
        free(buf);
}

static void batch_free(struct plx_wlog *wl, struct wbatch *b)
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
static const uint8_t *batch_data(const struct wbatch *b, uint32_t blk)
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

static void seal(struct plx_wlog *wl, struct wbatch *b)
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
    kick_later(wl); /* a sealed batch is written by the next kick */
}

/* Move first_unwritten past the batches written since. */
static void advance_unwritten(struct plx_wlog *wl)
{
    struct wbatch *b = wl->first_unwritten;
    while (b && b->state >= B_WRITTEN)
        b = b->next;
    wl->first_unwritten = b;
}

/* Every batch up to this seq is written (or drained). */
static uint64_t written_contig(struct plx_wlog *wl)
{
    advance_unwritten(wl);
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

static void enter_failed(struct plx_wlog *wl, int err, const char *what)
{
    if (wl->failed)
        return;
    wl->failed = true;
    snprintf(wl->error, sizeof wl->error,
             "%s on write log %s failed (%s): writes go through to the store from now on",
             what, wl->desc, strerror(-err));
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
    advance_unwritten(wl);
    if (status) {
        enter_failed(wl, status, "a write");
        b->memory_only = true;
        materialize(b);
        b->state = B_WRITTEN;
    } else {
        b->state = B_WRITTEN;
        if (!b->memory_only) {
            buf_put(wl, b->buf);
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
                    piece_done(wl, r, b->seq, false);
                }
        }
    }
    flush_kick(wl);
    process_all(wl);
    kick_later(wl);
    drain_kick(wl);
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
        seal(wl, wl->gather);
        moved = true;
    }
    advance_unwritten(wl);
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
        process_all(wl);
    drain_kick(wl);
}

static void kick_later(struct plx_wlog *wl)
{
    if (wl->kick_queued)
        return;
    wl->kick_queued = true;
    wl->kick.run = kick_run;
    plx_defer(wl->st, &wl->kick);
}

/* ---- Flushes ------------------------------------------------------------------------------------ */

static void log_flushed(struct plx_store *st, struct plx_ev *ev)
{
    struct plx_wlog *wl = ev->ctx;
    wl->flush_inflight = false;
    struct wflush *f = wl->fl_fly;
    wl->fl_fly = NULL;
    if (ev->status) {
        enter_failed(wl, ev->status, "a flush");
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
    flush_kick(wl);
}

static void flush_kick(struct plx_wlog *wl)
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

/* ---- The drain ----------------------------------------------------------------------------------- */

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

static void release_round(struct plx_wlog *wl)
{
    if (wl->log_reads) {
        wl->release_waiting = true;
        return;
    }
    wl->release_waiting = false;
    advance_unwritten(wl); /* it must not point at a batch freed here */
    struct wbatch *b = wl->first, *end = wl->round_last->next;
    while (b != end) {
        struct wbatch *nx = b->next;
        for (uint32_t i = 0; i < b->nent; i++) {
            struct went *e = &b->ent[i];
            idrop(wl, e->vdi_id, e->vblock, e->nblocks, b);
            struct plx_vdi *v = vdi_by_id(wl->st, e->vdi_id);
            if (v && v->wc && !--v->wc->records)
                v->wc->hurry = false; /* (what it waited for is in the store) */
            wl->backlog_records--;
            wl->backlog_blocks -= e->nblocks;
            wl->drained_bytes += (uint64_t)e->nblocks * BS;
            if (e->req) {
                struct wreq *r = e->req;
                e->req = NULL;
                piece_done(wl, r, b->seq, true);
            }
        }
        if (b == wl->last_placed)
            wl->last_placed = NULL;
        if (b == wl->last)
            wl->last = NULL;
        wl->released_seq = b->seq;
        wl->nbatches--;
        buf_put(wl, b->buf);
        batch_free(wl, b);
        b = nx;
    }
    wl->first = b;
    wl->round_active = false;
    flush_kick(wl);
    process_all(wl);
    kick_later(wl);
    drain_kick(wl);
}

static void head_written(struct plx_store *st, struct plx_ev *ev)
{
    struct plx_wlog *wl = ev->ctx;
    if (ev->status)
        enter_failed(wl, ev->status, "writing the head block");
    release_round(wl);
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
        release_round(wl);
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
        if (!b->memory_only &&
            plx_crc32c((uint32_t)b->seq, b->rbuf + (size_t)BS * e->data_off,
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

/* Clear every cached VDI's record of this log: from here on the log is not replayed for them
 * (the log failed; what follows goes through to the store). */
static int clear_fields(struct plx_wlog *wl);

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

static void drain_timer_run(struct plx_timer *t)
{
    drain_kick((struct plx_wlog *)((char *)t - offsetof(struct plx_wlog, drain_timer)));
}

/* The drain's write-back policy (docs/DESIGN.md, "The deferred drain"; bcache's writeback_delay
 * and writeback_percent, dm-writecache's watermarks): while guests are writing, reading the log
 * back and writing the store competes with them for the CPU and the local disk, so the drain
 * waits while all of these hold: nobody waits for it (drain_wanted), the log is less than half
 * full, a record was appended within the idle window (delay_ns), and the oldest record is
 * younger than max_age_ns (how far the store may lag). The engine timer kicks the drain when
 * the earliest of those last two runs out; any other kick (a batch written, a waiter) looks
 * again. Returns true when deferred. */
static bool drain_defer(struct plx_wlog *wl)
{
    wl->deferred = false;
    if (!wl->delay_ns || drain_wanted(wl))
        return false;
    if ((wl->backlog_blocks + wl->nbatches) * 2 >= wl->nblocks)
        return false; /* the high watermark: half the ring */
    uint64_t now = plx_mono_ns();
    uint64_t idle_at = wl->last_append_ns + wl->delay_ns;
    uint64_t age_at = wl->first->born_ns + wl->max_age_ns;
    if (now >= idle_at || now >= age_at)
        return false;
    plx_timer_arm(wl->st, &wl->drain_timer, age_at < idle_at ? age_at : idle_at);
    wl->deferred = true;
    return true;
}

static void drain_kick(struct plx_wlog *wl)
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

/* ---- VDI records ------------------------------------------------------------------------------ */

/* Write v's record with its write-log fields set (or cleared). Waits for the pipeline to be
 * idle: a snapshot in flight would write the record from an image taken before. */
static int write_fields(struct plx_vdi *v, bool set)
{
    plx_store *st = v->st;
    while (!plx_vdi_idle(v)) {
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
        if (plx_vdi_idle(v))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
    }
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec = v->rec;
    rec.wlog_host = set ? st->host_hash : 0;
    rec.wlog_id = set ? st->wlog->log_id : 0;
    rc = plx_registry_write(st, v->slot_addr, &rec);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (!rc) {
        rec.seq++;
        v->rec = rec;
    }
    plx_admin_unlock(st);
    return rc;
}

/* From inside the service loop (the log failed), so without waiting for the pipeline: a
 * snapshot record already captured with the fields set could still land after this write
 * (DESIGN.md, known limitations). */
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

int plx_wlog_check_owner(plx_store *st, const struct plx_vdi_record *rec)
{
    if (!rec->wlog_id || (st->wlog && st->wlog->log_id == rec->wlog_id))
        return 0;
    bool here = rec->wlog_host == st->host_hash;
    return plx_err(st, -EBUSY,
                   "VDI %s has writes not yet drained in write log %016llx of %s: attach that "
                   "log again ('parallax serve --write-cache PATH', or the tapdisk that used "
                   "it, on that host), which replays them into the VDI first, then open it "
                   "there; or drop those writes with 'parallax cache discard %s --force'",
                   rec->name, (unsigned long long)rec->wlog_id,
                   here ? "this host (another process's log)" : "another host", rec->name);
}

/* ---- Queue ------------------------------------------------------------------------------------- */

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
static bool append(struct plx_wlog *wl, struct plx_wlog_vdi *w, struct wreq *r)
{
    if (wl->delay_ns)
        wl->last_append_ns = plx_mono_ns();
    while (r->next_b < r->b1) {
        struct wbatch *g = gather_get(wl);
        if (!g)
            return false;
        if (g->nent == PLX_WLOG_PER_BATCH || g->ndata == MAX_DATA) {
            seal(wl, g);
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
        if (wl->zc_min && n >= wl->zc_min && !g->memory_only &&
            (uintptr_t)src % wl->dio_align == 0) {
            e->zc = src;
            e->crc = plx_crc32c(0, src, (size_t)n * BS);
            g->zc_blocks += (uint32_t)n;
        } else {
            e->zc = NULL;
            e->crc = copy_crc(g->buf + (size_t)BS * (1 + g->ndata), src, (size_t)n * BS);
        }
        if (iset(wl, e->vdi_id, e->vblock, n, g, e->data_off))
            r->status = -ENOMEM; /* reads could miss it: the write reports failure */
        g->ndata += (uint32_t)n;
        r->pieces++;
        w->records++;
        wl->backlog_records++;
        wl->backlog_blocks += n;
        r->next_b += n;
    }
    r->all_appended = true;
    kick_later(wl);
    return true;
}

static void edge_done(void *arg, int status);
static void merge_edges(struct wreq *r);
static int read_blocks(struct plx_vdi *v, uint8_t *buf, uint64_t vb, uint64_t n, plx_done_fn cb,
                       void *arg);

static void q_pop(struct plx_wlog_vdi *w)
{
    struct wreq *r = w->q_head;
    w->q_head = r->qnext;
    if (!w->q_head)
        w->q_tail = NULL;
}

static void direct_done(void *arg, int status)
{
    struct wreq *r = arg;
    r->cb(r->arg, status);
    free(r);
}

static int wlog_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                     void *arg);

static void process_queue(struct plx_wlog *wl, struct plx_wlog_vdi *w)
{
    struct wreq *r;
    while ((r = w->q_head)) {
        if (r->kind == Q_READ) {
            /* Its turn: everything submitted before it is in the index or the pipeline. */
            q_pop(w);
            int rc = wlog_read(r->v, r->rbuf, r->off, r->len, direct_done, r);
            if (rc) {
                r->status = rc;
                r->done.run = wreq_run_done;
                plx_defer(wl->st, &r->done);
            }
            continue;
        }
        if (r->kind != Q_WRITE) {
            /* A trim or snapshot goes straight to the pipeline once everything before it in
             * this VDI's queue has been drained (so the pipeline orders it after them). */
            if (w->records) {
                if (wl->gather && wl->gather->nent)
                    seal(wl, wl->gather);
                if (wl->deferred)
                    kick_later(wl); /* it waits for the drain: not deferred (drain_wanted) */
                return;
            }
            q_pop(w);
            int rc = r->kind == Q_TRIM
                         ? plx_vdi_direct_trim(r->v, r->off, r->len, direct_done, r)
                         : plx_vdi_direct_snapshot(r->v, r->label, r->index_out, direct_done, r);
            if (r->kind == Q_TRIM && !rc) {
                w->direct_dirty = true;
                w->direct_seq = plx_vdi_next_seq(r->v);
            }
            if (rc) {
                r->status = rc;
                r->done.run = wreq_run_done;
                plx_defer(wl->st, &r->done);
            }
            continue;
        }
        if (!r->ready) {
            if (!r->edges_started) {
                /* A sub-block write: read the old contents of its edge blocks first (through
                 * the index, so earlier writes in the queue are seen); the queue waits. */
                r->edges_started = true;
                bool head = r->off % BS != 0, tail = (r->off + r->len) % BS != 0;
                if (head) {
                    r->edge_pending++;
                    int rc = read_blocks(r->v, r->edge, r->b0, 1, edge_done, r);
                    if (rc)
                        r->edge_pending--, r->status = rc;
                }
                if (tail && !(head && r->b1 - 1 == r->b0)) {
                    r->edge_pending++;
                    int rc = read_blocks(r->v, r->edge + BS, r->b1 - 1, 1, edge_done, r);
                    if (rc)
                        r->edge_pending--, r->status = rc;
                }
                if (!r->edge_pending)
                    merge_edges(r);
            }
            if (!r->ready)
                return;
            if (r->status) {
                q_pop(w);
                wreq_complete(wl, r, r->status);
                continue;
            }
        }
        if (!append(wl, w, r))
            return;
        q_pop(w);
    }
}

static void detach_finish(struct plx_vdi *v);

static bool detach_left(const struct plx_wlog_vdi *w)
{
    return w->q_head || w->records;
}

static void process_all(struct plx_wlog *wl)
{
    for (struct plx_wlog_vdi *w = wl->vdis; w; w = w->next)
        process_queue(wl, w);
    /* A VDI being turned off without a wait (plx_wlog_vdi_try_detach) leaves the log here, the
     * moment its last record is drained: what it was holding goes to the pipeline now. */
    for (struct plx_wlog_vdi *w = wl->vdis, *nx; w; w = nx) {
        nx = w->next;
        if (w->detaching && w->async_detach && !detach_left(w) && !wl->drain_error)
            detach_finish(w->v);
    }
}

/* The old edge blocks around the new bytes. */
static void merge_edges(struct wreq *r)
{
    uint64_t nb = r->b1 - r->b0;
    bool head = r->off % BS != 0, tail = (r->off + r->len) % BS != 0;
    if (head)
        memcpy(r->merged, r->edge, BS);
    if (tail) {
        const uint8_t *src = (head && nb == 1) ? r->edge : r->edge + BS;
        memcpy(r->merged + (nb - 1) * BS, src, BS);
    }
    memcpy(r->merged + r->off % BS, r->ubuf, r->len);
    r->ready = true;
}

/* An edge read completed (from the service loop, never inside process_queue). */
static void edge_done(void *arg, int status)
{
    struct wreq *r = arg;
    if (status && !r->status)
        r->status = status;
    if (--r->edge_pending)
        return;
    merge_edges(r);
    if (r->v->wc)
        process_queue(r->v->st->wlog, r->v->wc);
}

static void enqueue(struct plx_wlog_vdi *w, struct wreq *r)
{
    r->qnext = NULL;
    if (w->detaching) {
        r->held = true;
        if (w->held_tail)
            w->held_tail->qnext = r;
        else
            w->held_head = r;
        w->held_tail = r;
        return;
    }
    if (w->q_tail)
        w->q_tail->qnext = r;
    else
        w->q_head = r;
    w->q_tail = r;
}

/* ---- Reads ------------------------------------------------------------------------------------- */

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
        release_round(wl);
}

/* Read whole or partial blocks [off, off+len) of v: newest records from the log or memory, the
 * rest from the store. */
static int wlog_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                     void *arg)
{
    struct plx_wlog *wl = v->st->wlog;
    uint64_t b0 = off / BS, b1 = (off + len + BS - 1) / BS;
    uint64_t id = v->rec.id;
    unsigned hits = 0;
    if (off + len <= v->rec.size)
        for (uint64_t b = b0; b < b1; b++)
            if (ifind(wl, id, b, NULL))
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
        struct wbatch *eb = ifind(wl, id, b, &blk);
        if (!eb) {
            uint64_t end = b + 1;
            while (end < b1 && !ifind(wl, id, end, NULL))
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
            memcpy(dst, batch_data(eb, blk), BS);
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

static int read_blocks(struct plx_vdi *v, uint8_t *buf, uint64_t vb, uint64_t n, plx_done_fn cb,
                       void *arg)
{
    return wlog_read(v, buf, vb * BS, (size_t)(n * BS), cb, arg);
}

/* ---- Entry points -------------------------------------------------------------------------------- */

static int entry_check(struct plx_vdi *v, uint64_t off, uint64_t len)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (v->ro)
        return plx_err(v->st, -EROFS, "VDI %s is open read-only", v->rec.name);
    if (off > v->rec.size || len > v->rec.size - off)
        return plx_err(v->st, -EINVAL, "request at %llu+%llu is beyond the end of VDI %s (%llu)",
                       (unsigned long long)off, (unsigned long long)len, v->rec.name,
                       (unsigned long long)v->rec.size);
    return 0;
}

static struct wreq *wreq_new(struct plx_vdi *v, enum qkind kind, uint64_t off, uint64_t len,
                             plx_done_fn cb, void *arg)
{
    struct wreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->v = v;
    r->kind = kind;
    r->off = off;
    r->len = len;
    r->b0 = off / BS;
    r->b1 = (off + len + BS - 1) / BS;
    r->next_b = r->b0;
    r->cb = cb;
    r->arg = arg;
    return r;
}

int plx_wlog_submit_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                         void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (off > v->rec.size || len > v->rec.size - off || len == 0)
        return plx_vdi_direct_read(v, buf, off, len, cb, arg); /* its checks and messages */
    if (!v->wc->q_head && !v->wc->held_head)
        return wlog_read(v, buf, off, len, cb, arg);
    /* Requests of one block are carried out in submission order: a read waits behind the
     * writes, trims and snapshots queued before it. */
    struct wreq *r = wreq_new(v, Q_READ, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->rbuf = buf;
    enqueue(v->wc, r);
    if (!r->held)
        process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_submit_write(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                          unsigned flags, plx_done_fn cb, void *arg)
{
    int rc = entry_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0)
        return plx_vdi_direct_write(v, buf, off, len, flags, cb, arg);
    struct wreq *r = wreq_new(v, Q_WRITE, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->flags = flags;
    r->ubuf = buf;
    if (off % BS == 0 && len % BS == 0) {
        r->src = buf;
        r->ready = true;
    } else {
        r->merged = plx_block_alloc(r->b1 - r->b0);
        r->edge = plx_block_alloc(2);
        r->src = r->merged;
    }
    enqueue(v->wc, r);
    if (!r->held)
        process_queue(v->st->wlog, v->wc);
    return 0;
}

/* ---- Writes passed through to the pipeline (automatic mode, cache off) ------------------------
 *
 * Turning the cache on should take effect at once, also for what the guest has already written:
 * its writes still queued to the slow store, and those completed there since its last flush,
 * which its next flush would otherwise have to wait for (a store flush queues behind every write
 * in flight). So in the automatic mode with the cache off, each aligned write goes to the
 * pipeline as usual but is tracked, with a copy of its data (up to WPASS_COPY_MAX bytes per
 * store), until a flush has covered it. When the cache turns on, the tracked writes are put in
 * the log in their order, before anything new: those in flight complete from there, and the
 * guest's next flush needs no store flush. The pipeline's own writes go on; the drain writes the
 * same data after them. Whatever else completes in the pipeline (sub-block and FUA writes,
 * trims, snapshots, a write without a copy) sets wpass_dirty instead, and drops the tracked
 * writes before it (a record appended later must not overwrite it). */

#define WPASS_COPY_MAX (64ull << 20)

struct plx_wpass {
    struct plx_vdi *v;
    /* A copy of the data (or NULL, past the budget): the pipeline writes from it, so that the
     * write can be answered from the log while the pipeline's goes on. Freed with the entry. */
    uint8_t *copy;
    uint64_t off;
    size_t len;
    plx_done_fn cb;
    void *arg;
    uint64_t flush_gen; /* a flush covers it once it completes (0: none yet) */
    bool rescued;       /* in flight when the cache turned on: it completes from the log */
    bool answered;      /* its callback ran */
    bool in_store;      /* the pipeline's write completed */
    bool listed;
    struct plx_wpass *prev, *next;
};

static void wpass_unlink(struct plx_wpass *p)
{
    struct plx_vdi *v = p->v;
    if (!p->listed)
        return;
    p->listed = false;
    if (p->prev)
        p->prev->next = p->next;
    else
        v->wpass_head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        v->wpass_tail = p->prev;
    p->prev = p->next = NULL;
}

static void wpass_drop_copy(struct plx_wpass *p)
{
    if (!p->copy)
        return;
    p->v->st->wpass_copy_bytes -= p->len;
    plx_block_free(p->copy);
    p->copy = NULL;
}

static void wpass_free(struct plx_wpass *p)
{
    wpass_unlink(p);
    wpass_drop_copy(p);
    free(p);
}

/* Something went to the pipeline that the tracked writes do not cover, or that a record of one
 * of them appended later would overwrite: drop them (those in flight complete from the store). */
static void wpass_untrack(struct plx_vdi *v)
{
    v->wpass_dirty = true;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->in_store)
            wpass_free(p);
        else
            wpass_unlink(p); /* (the pipeline still writes from its copy) */
    }
}

static bool wpass_on(const struct plx_vdi *v)
{
    return v->wauto.on && !v->wc && v->st->wlog && !v->ro;
}

void plx_wlog_pass_untracked(struct plx_vdi *v)
{
    if (wpass_on(v) || v->wpass_head)
        wpass_untrack(v);
}

static void wpass_store_done(void *arg, int status)
{
    struct plx_wpass *p = arg;
    struct plx_vdi *v = p->v;
    p->in_store = true;
    if (p->rescued) {
        /* Its record in the log answers it, and the drain writes it again: a failure here is
         * the drain's to see. */
        if (v->wc && v->wc->rescued_inflight)
            v->wc->rescued_inflight--;
        if (p->answered)
            wpass_free(p);
        return;
    }
    p->answered = true;
    plx_done_fn cb = p->cb;
    void *carg = p->arg;
    if (!p->listed || status || !p->copy || !wpass_on(v)) {
        if (!status)
            v->wpass_dirty = true; /* completed in the store, and nothing tracks it */
        wpass_free(p);
    }
    cb(carg, status);
}

static void wpass_log_done(void *arg, int status)
{
    struct plx_wpass *p = arg;
    p->answered = true;
    plx_done_fn cb = p->cb;
    void *carg = p->arg;
    if (p->in_store)
        wpass_free(p); /* (else the pipeline still writes from its copy: freed when it is done) */
    cb(carg, status);
}

/* A completed write put in the log from its copy: it was answered long ago. */
static void wpass_copy_logged(void *arg, int status)
{
    struct plx_wpass *p = arg;
    struct plx_vdi *v = p->v;
    if (status && v->wc) {
        v->wc->direct_dirty = true; /* not in the log after all: the store's flush covers it */
        v->wc->direct_seq = plx_vdi_next_seq(v);
    }
    wpass_free(p);
}

int plx_wlog_submit_passthrough(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                                unsigned flags, plx_done_fn cb, void *arg)
{
    if (off % BS || len % BS || !len || (flags & PLX_WRITE_FUA)) {
        int rc = plx_vdi_direct_write(v, buf, off, len, flags, cb, arg);
        if (!rc)
            wpass_untrack(v);
        return rc;
    }
    struct plx_wpass *p = calloc(1, sizeof *p);
    if (!p)
        return plx_err(v->st, -ENOMEM, "out of memory");
    *p = (struct plx_wpass){.v = v, .off = off, .len = len, .cb = cb, .arg = arg};
    if (v->st->wpass_copy_bytes + len <= WPASS_COPY_MAX) {
        p->copy = plx_block_alloc(len / BS);
        memcpy(p->copy, buf, len);
        v->st->wpass_copy_bytes += len;
    }
    int rc = plx_vdi_direct_write(v, p->copy ? p->copy : buf, off, len, flags, wpass_store_done, p);
    if (rc) {
        wpass_drop_copy(p);
        free(p);
        return rc;
    }
    p->listed = true;
    p->prev = v->wpass_tail;
    if (v->wpass_tail)
        v->wpass_tail->next = p;
    else
        v->wpass_head = p;
    v->wpass_tail = p;
    return 0;
}

struct wpass_flush {
    struct plx_vdi *v;
    uint64_t gen;
    bool clears_dirty;
    plx_done_fn cb;
    void *arg;
};

static void wpass_flush_done(void *arg, int status)
{
    struct wpass_flush *f = arg;
    struct plx_vdi *v = f->v;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->flush_gen != f->gen)
            continue;
        if (status)
            p->flush_gen = 0; /* the next flush tries again */
        else
            wpass_free(p);
    }
    if (status && f->clears_dirty)
        v->wpass_dirty = true;
    plx_done_fn cb = f->cb;
    void *carg = f->arg;
    free(f);
    cb(carg, status);
}

int plx_wlog_pass_flush(struct plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (!v->wpass_head && !wpass_on(v))
        return plx_vdi_direct_flush(v, cb, arg);
    struct wpass_flush *f = calloc(1, sizeof *f);
    if (!f)
        return plx_err(v->st, -ENOMEM, "out of memory");
    *f = (struct wpass_flush){.v = v, .gen = ++v->wpass_flush_gen, .cb = cb, .arg = arg};
    int rc = plx_vdi_direct_flush(v, wpass_flush_done, f);
    if (rc) {
        free(f);
        return rc;
    }
    /* It covers what has completed: those writes need not go to the log any more. */
    for (struct plx_wpass *p = v->wpass_head; p; p = p->next)
        if (p->in_store && !p->flush_gen)
            p->flush_gen = f->gen;
    f->clears_dirty = v->wpass_dirty;
    v->wpass_dirty = false;
    return 0;
}

void plx_wlog_pass_forget(struct plx_vdi *v)
{
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        if (p->in_store)
            wpass_free(p);
        else
            wpass_unlink(p); /* (freed when the pipeline is done with its copy) */
    }
    v->wpass_dirty = false;
}

/* The cache just turned on for v: the tracked writes go to the log, in their order and before
 * anything new, from their copies (a record's data is copied into its batch when appended).
 * Those in flight complete from there; the pipeline goes on writing from the copy. */
static void wpass_rescue(struct plx_wlog *wl, struct plx_wlog_vdi *w)
{
    struct plx_vdi *v = w->v;
    for (struct plx_wpass *p = v->wpass_head, *nx; p; p = nx) {
        nx = p->next;
        wpass_unlink(p);
        bool inflight = !p->in_store;
        if (!p->copy) {
            /* In flight without a copy (past the budget): the pipeline writes from the caller's
             * buffer, so it completes from the store, and the store's flush covers it. (A
             * completed one without a copy is not kept.) */
            w->direct_dirty = true;
            if (!inflight)
                wpass_free(p);
            continue;
        }
        struct wreq *r =
            wreq_new(v, Q_WRITE, p->off, p->len, inflight ? wpass_log_done : wpass_copy_logged, p);
        if (!r) {
            /* It completes from the store, as without the cache; the store's flush covers it. */
            w->direct_dirty = true;
            if (!inflight)
                wpass_free(p);
            continue;
        }
        r->ubuf = r->src = p->copy;
        r->ready = true;
        if (inflight) {
            p->rescued = true;
            w->rescued_inflight++;
        }
        enqueue(w, r);
    }
    process_queue(wl, w);
}

/* A flush that needs both the log and the store flushed: completes once, with the first error. */
struct flush_join {
    plx_done_fn cb;
    void *arg;
    int pending, status;
};

static void flush_join_done(void *arg, int status)
{
    struct flush_join *j = arg;
    if (status && !j->status)
        j->status = status;
    if (--j->pending)
        return;
    plx_done_fn cb = j->cb;
    void *carg = j->arg;
    int st = j->status;
    free(j);
    cb(carg, st);
}

/* A flush of the store medium itself, outside the pipeline (whose flush waits for every batch
 * in flight before it): it makes durable what has completed so far. */
struct raw_flush {
    struct plx_ev ev;
    struct flush_join *j;
};

static void raw_flush_done(struct plx_store *st, struct plx_ev *ev)
{
    struct raw_flush *f = ev->ctx;
    struct flush_join *j = f->j;
    int status = ev->status;
    free(f);
    flush_join_done(j, status);
}

static int raw_flush(plx_store *st, struct flush_join *j)
{
    struct raw_flush *f = calloc(1, sizeof *f);
    if (!f)
        return plx_err(st, -ENOMEM, "out of memory");
    f->j = j;
    f->ev.io = (struct plx_io){.op = PLX_IO_FLUSH};
    f->ev.handler = raw_flush_done;
    f->ev.ctx = f;
    int rc = plx_submit(st, &f->ev);
    if (rc)
        free(f);
    return rc;
}

int plx_wlog_submit_flush(struct plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    struct plx_wlog *wl = v->st->wlog;
    /* Writes completed before now are in batches sealed before now. */
    if (!v->wc->direct_dirty)
        return add_flush_waiter(wl, wl->next_seq - 1, cb, arg, NULL);
    /* A trim completed straight in the pipeline: the store needs its flush as well. */
    struct flush_join *j = calloc(1, sizeof *j);
    if (!j)
        return plx_err(v->st, -ENOMEM, "out of memory");
    j->cb = cb;
    j->arg = arg;
    j->pending = 2;
    struct plx_wlog_vdi *w = v->wc;
    /* When every request before direct_seq still in flight is a rescued write (in the log as
     * well), the store's flush need not wait for them: a flush of the medium covers what has
     * finished. Otherwise the pipeline's flush, which covers what was submitted before it. */
    bool raw = plx_vdi_active_before(v, w->direct_seq) == w->rescued_inflight;
    int rc = raw ? raw_flush(v->st, j) : plx_vdi_direct_flush(v, flush_join_done, j);
    if (rc) {
        free(j);
        return rc;
    }
    /* This store flush covers what went straight to the pipeline and has finished; a request
     * still in flight (not rescued) needs the next one. */
    w->direct_dirty = !raw && !plx_vdi_finished_before(v, w->direct_seq);
    rc = add_flush_waiter(wl, wl->next_seq - 1, flush_join_done, j, NULL);
    if (rc)
        flush_join_done(j, rc); /* the store's flush is still to come: it completes j */
    return 0;
}

int plx_wlog_submit_trim(struct plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb,
                         void *arg)
{
    int rc = entry_check(v, off, len);
    if (rc)
        return rc;
    struct wreq *r = wreq_new(v, Q_TRIM, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    enqueue(v->wc, r);
    if (!r->held)
        process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_submit_snapshot(struct plx_vdi *v, const char *label, uint64_t *index_out,
                             plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (!label)
        label = "";
    if (strlen(label) > PLX_LABEL_MAX)
        return plx_err(v->st, -EINVAL, "snapshot label '%s' is longer than %d bytes", label,
                       PLX_LABEL_MAX);
    struct wreq *r = wreq_new(v, Q_SNAP, 0, 0, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    snprintf(r->label, sizeof r->label, "%s", label);
    r->index_out = index_out;
    enqueue(v->wc, r);
    if (!r->held)
        process_queue(v->st->wlog, v->wc);
    return 0;
}

int plx_wlog_block_status(struct plx_vdi *v, uint64_t off, uint64_t *len)
{
    struct plx_wlog *wl = v->st->wlog;
    /* At most SCAN blocks are looked at; the answer covers no more than that. */
    enum { SCAN = 65536 };
    uint64_t b = off / BS, end = off + *len;
    bool hit = ifind(wl, v->rec.id, b, NULL) != NULL;
    uint64_t e = b + 1;
    while (e * BS < end && e - b < SCAN && (ifind(wl, v->rec.id, e, NULL) != NULL) == hit)
        e++;
    if (e * BS < end)
        *len = e * BS - off;
    return hit;
}

/* ---- Turning the cache on and off for a VDI ------------------------------------------------- */

int plx_wlog_vdi_enable(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return plx_err(st, -ENOENT, "no write log is attached to this store");
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only: nothing to cache", v->rec.name);
    if (wl->failed)
        return plx_err(st, -EIO, "%s", wl->error);
    struct plx_wlog_vdi *w = v->wc;
    if (w) {
        if (w->detaching && !w->async_detach)
            return plx_err(st, -EBUSY, "the write cache of VDI %s is being turned off",
                           v->rec.name);
        if (w->detaching) {
            /* Turning off is called off: what it held goes to the log after what is queued. */
            w->detaching = w->async_detach = false;
            if (w->held_head) {
                if (w->q_tail)
                    w->q_tail->qnext = w->held_head;
                else
                    w->q_head = w->held_head;
                w->q_tail = w->held_tail;
                for (struct wreq *r = w->held_head; r; r = r->qnext)
                    r->held = false;
                w->held_head = w->held_tail = NULL;
            }
            process_queue(wl, w);
        }
        return 0;
    }
    w = calloc(1, sizeof *w);
    if (!w)
        return plx_err(st, -ENOMEM, "out of memory");
    if (v->rec.wlog_id == wl->log_id) {
        /* The record names the log already (the automatic mode binds it beforehand): nothing
         * to write, so the switch is immediate. Writes that went to the pipeline before it and
         * were not flushed yet are covered by a store flush at the guest's next flush. */
        w->direct_dirty = v->wpass_dirty;
        w->direct_seq = plx_vdi_next_seq(v);
        v->wpass_dirty = false;
    } else {
        /* The record names the log before the first write goes there (its flush also makes
         * the writes before durable in the store). */
        int rc = write_fields(v, true);
        if (rc) {
            free(w);
            return rc;
        }
    }
    w->v = v;
    w->next = wl->vdis;
    wl->vdis = w;
    v->wc = w;
    wpass_rescue(wl, w);
    /* Requests in the pipeline that are not in the log as well (a trim, a sub-block write):
     * once they complete, the guest's flush must flush the store too. */
    if (plx_vdi_active_before(v, w->direct_seq) > w->rescued_inflight)
        w->direct_dirty = true;
    return 0;
}

int plx_wlog_vdi_bind(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    if (!wl || v->ro || wl->failed || v->rec.wlog_id == wl->log_id)
        return 0;
    return write_fields(v, true);
}

/* The gathering batch is sealed at the end of a pass anyway unless every write slot is busy;
 * sealing it early only for v's sake would shrink other VDIs' group commits. */
static void seal_for(struct plx_wlog *wl, const struct plx_vdi *v)
{
    struct wbatch *g = wl->gather;
    for (uint32_t i = 0; g && i < g->nent; i++)
        if (g->ent[i].vdi_id == v->rec.id) {
            seal(wl, g);
            break;
        }
}

/* Someone now waits for the drain (drain_wanted says so): let it go on, and start it if it
 * was deferred or held. (Otherwise it is running, or waits for a batch to be written: the
 * release or the write kicks it. A server calls this after every pass while a VDI closes.) */
static void drain_unpause(struct plx_wlog *wl)
{
    if (!wl->drain_paused && !wl->deferred)
        return;
    wl->drain_paused = false; /* closing drains, whatever held it */
    kick_later(wl);
}

void plx_wlog_vdi_hurry(struct plx_vdi *v, int on)
{
    struct plx_wlog_vdi *w = v->wc;
    if (!w || w->hurry == (on && w->records))
        return;
    w->hurry = on && w->records;
    if (w->hurry && v->st->wlog->deferred)
        kick_later(v->st->wlog);
}

bool plx_wlog_vdi_draining(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    if (!w || !detach_left(w) || wl->drain_error)
        return false; /* (a drain error: detach reports it at once) */
    w->hurry = w->records != 0; /* a close waits for the drain: not deferred */
    drain_unpause(wl);
    seal_for(wl, v);
    return true;
}

/* The end of turning the cache off for v: it leaves the log's list, and what arrived meanwhile
 * goes straight to the pipeline, in order. */
static void detach_finish(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    for (struct plx_wlog_vdi **pp = &wl->vdis; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    v->wc = NULL;
    if (w->direct_dirty || w->held_head)
        v->wpass_dirty = true; /* (what went straight to the pipeline: the next flush covers it) */
    for (struct wreq *r = w->held_head, *nx; r; r = nx) {
        nx = r->qnext;
        int src;
        if (r->kind == Q_WRITE)
            src = plx_vdi_direct_write(v, r->ubuf, r->off, r->len, r->flags, direct_done, r);
        else if (r->kind == Q_READ)
            src = plx_vdi_direct_read(v, r->rbuf, r->off, r->len, direct_done, r);
        else if (r->kind == Q_TRIM)
            src = plx_vdi_direct_trim(v, r->off, r->len, direct_done, r);
        else
            src = plx_vdi_direct_snapshot(v, r->label, r->index_out, direct_done, r);
        if (src) {
            r->status = src;
            r->done.run = wreq_run_done;
            plx_defer(st, &r->done);
        } else {
            plx_block_free(r->merged);
            plx_block_free(r->edge);
            r->merged = r->edge = NULL;
        }
    }
    free(w);
}

int plx_wlog_vdi_try_detach(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    if (!w)
        return 0;
    if (wl->drain_error)
        return plx_wlog_vdi_detach(v); /* reports it at once */
    w->detaching = true;
    w->async_detach = true;
    drain_unpause(wl);
    if (detach_left(w)) {
        seal_for(wl, v);
        return -EAGAIN;
    }
    detach_finish(v);
    return 0;
}

bool plx_wlog_vdi_detaching(const struct plx_vdi *v)
{
    return v->wc && v->wc->detaching;
}

int plx_wlog_vdi_detach(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    if (!v->wc)
        return 0;
    v->wc->detaching = true;
    v->wc->async_detach = false; /* this call finishes it */
    drain_unpause(wl);
    int rc = 0;
    /* (The loop looks v->wc up afresh: nothing else frees it while async_detach is off.) */
    while (detach_left(v->wc)) {
        if (wl->drain_error) {
            rc = plx_err(st, wl->drain_error, "%s", wl->error);
            break;
        }
        if (wl->gather && wl->gather->nent) {
            seal(wl, wl->gather);
            kick_later(wl);
        }
        rc = plx_store_service(st);
        if (rc < 0)
            break;
        rc = 0;
        if (!detach_left(v->wc))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
    }
    detach_finish(v);
    return rc;
}

uint64_t plx_wlog_vdi_backlog(const struct plx_vdi *v)
{
    return v->wc ? v->wc->records : 0;
}

int plx_wlog_vdi_disable(struct plx_vdi *v)
{
    /* (The record may name the log with the cache off: the automatic mode binds it.) */
    int rc = plx_wlog_vdi_detach(v);
    if (!rc && v->rec.wlog_id)
        rc = write_fields(v, false);
    return rc;
}

/* ---- Attach, replay, close -------------------------------------------------------------------- */

static uint64_t random_id(void)
{
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &x, sizeof x) != sizeof x)
            x = 0;
        close(fd);
    }
    if (!x)
        x = plx_now_ns() ^ ((uint64_t)getpid() << 32);
    return x ? x : 1;
}

/* Read and check the batch at pos; returns its header in hb and data in *data, or false. */
static bool read_batch(struct plx_wlog *wl, uint64_t pos, uint64_t seq, uint8_t *hb, uint8_t **data)
{
    if (pos < 1 || pos >= wl->nblocks || side_sync(wl, PLX_IO_READ, pos, 1, hb, 0))
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
    if (sum && side_sync(wl, PLX_IO_READ, pos + 1, (uint32_t)sum, *data, 0)) {
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

/* ---- Replay's reading side (wlog_attach.c applies what it reads) ----------------------------- */

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
    int rc = side_sync(wl, PLX_IO_WRITE, 0, 1, h, PLX_IO_FUA);
    if (rc)
        return plx_err(st, rc, "writing the head of write log %s: %s", wl->desc, strerror(-rc));
    wl->head_pos = h->tail_pos;
    wl->next_seq = c->seq;
    wl->released_seq = c->seq - 1;
    return 0;
}

uint64_t plx_wlog_id(const plx_store *st)
{
    return st->wlog ? st->wlog->log_id : 0;
}

const char *plx_wlog_desc(const plx_store *st)
{
    return st->wlog ? st->wlog->desc : "";
}

static void hex_uuid(const uint8_t u[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", u[i]);
}

static void wlog_free(plx_store *st)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    for (size_t i = 0; i <= wl->mask; i++)
        for (struct ient *e = wl->tab[i], *nx; e; e = nx) {
            nx = e->next;
            plx_slab_free(&wl->ient_slab, e);
        }
    free(wl->tab);
    for (struct wbatch *b = wl->first, *nx; b; b = nx) {
        nx = b->next;
        free(b->buf);
        free(b->wevs);
        batch_free(wl, b);
    }
    plx_slab_destroy(&wl->batch_slab);
    plx_slab_destroy(&wl->ient_slab);
    for (unsigned k = 0; k < ENT_CLASSES; k++)
        plx_slab_destroy(&wl->ent_slab[k]);
    while (wl->nspare)
        free(wl->spare[--wl->nspare]);
    plx_block_free(wl->rarena);
    free(wl->touched);
    plx_timer_cancel(st, &wl->drain_timer);
    plx_block_free(wl->head);
    if (st->side_be)
        st->side_be->ops->destroy(st->side_be);
    st->side_be = NULL;
    if (wl->lock_fd >= 0)
        close(wl->lock_fd);
    free(wl);
    st->wlog = NULL;
}

void plx_wlog_abandon(plx_store *st)
{
    wlog_free(st);
}

void plx_wlog_head_init(const plx_store *st, void *block, uint64_t nblocks)
{
    struct plx_wlog_head *h = block;
    memset(h, 0, BS);
    h->version = PLX_WLOG_VERSION;
    memcpy(h->store_uuid, st->sb.uuid, 16);
    h->host_hash = st->host_hash;
    snprintf(h->host, sizeof h->host, "%s", st->host);
    h->log_blocks = nblocks;
    h->log_id = random_id();
    h->tail_seq = 1;
    h->tail_pos = 1;
    h->created_ns = plx_now_ns();
    plx_blkhdr_seal(h, PLX_MAGIC_WLOG_HEAD, 0);
}

/* The log's head is checked (or, init and empty, written); nothing is replayed yet
 * (wlog_attach.c). On failure nothing is attached and be is destroyed. */
int plx_wlog_open(plx_store *st, plx_backend *be, int init, const char *desc)
{
    if (st->wlog) {
        be->ops->destroy(be);
        return plx_err(st, -EBUSY, "a write log is already attached to this store");
    }
    if (st->read_only) {
        be->ops->destroy(be);
        return plx_err(st, -EROFS, "blockstore opened read-only: no write cache");
    }
    if (be->nblocks < MIN_LOG_BLOCKS) {
        int rc = plx_err(st, -EINVAL,
                         "write log %s is too small: %llu KiB; it needs at least %llu KiB (two of "
                         "its largest writes)",
                         desc, (unsigned long long)be->nblocks * 4,
                         (unsigned long long)MIN_LOG_BLOCKS * 4);
        be->ops->destroy(be);
        return rc;
    }
    struct plx_wlog *wl = calloc(1, sizeof *wl);
    if (!wl) {
        be->ops->destroy(be);
        return plx_err(st, -ENOMEM, "out of memory");
    }
    wl->st = st;
    wl->be = be;
    wl->lock_fd = -1;
    plx_slab_init(&wl->batch_slab, sizeof(struct wbatch));
    plx_slab_init(&wl->ient_slab, sizeof(struct ient));
    for (unsigned k = 0; k < ENT_CLASSES; k++)
        plx_slab_init(&wl->ent_slab[k],
                      (k < ENT_CLASSES - 1 ? 1u << k : PLX_WLOG_PER_BATCH) * sizeof(struct went));
    wl->nblocks = be->nblocks;
    wl->zc_min = ZC_MIN;
    wl->dio_align = plx_backend_dio_align(be);
    const char *zc = getenv("PARALLAX_WCACHE_ZC_MIN");
    if (zc && *zc)
        wl->zc_min = (uint32_t)strtoul(zc, NULL, 10);
    /* The deferred drain (drain_defer): on by default; a delay of 0 drains at once, as before. */
    uint64_t delay_ms = DRAIN_DELAY_MS, age_ms = DRAIN_MAX_AGE_MS;
    const char *d = getenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
    if (d && *d)
        delay_ms = strtoull(d, NULL, 10);
    const char *age = getenv("PARALLAX_WCACHE_DRAIN_MAX_AGE_MS");
    if (age && *age)
        age_ms = strtoull(age, NULL, 10);
    wl->delay_ns = delay_ms * 1000000ull;
    wl->max_age_ns = age_ms * 1000000ull;
    wl->drain_timer.run = drain_timer_run;
    wl->mask = 1023;
    wl->tab = calloc(wl->mask + 1, sizeof *wl->tab);
    wl->head = plx_block_alloc(1);
    wl->attach_ns = plx_now_ns();
    snprintf(wl->desc, sizeof wl->desc, "%s", desc);
    st->wlog = wl;
    st->side_be = be;
    int rc = wl->tab ? 0 : plx_err(st, -ENOMEM, "out of memory");
    /* (Tests put store and log on one medium, whose one fd is watched already.) */
    if (!rc && be->ops->fd(be) >= 0 && be->ops->fd(be) != st->be->ops->fd(st->be))
        rc = plx_engine_watch_fd(st, be->ops->fd(be));
    if (!rc) {
        rc = side_sync(wl, PLX_IO_READ, 0, 1, wl->head, 0);
        if (rc)
            plx_err(st, rc, "reading write log %s: %s", desc, strerror(-rc));
    }
    const char *why = NULL;
    int vrc = rc ? 0 : plx_blkhdr_verify(wl->head, PLX_MAGIC_WLOG_HEAD, 0, &why);
    struct plx_wlog_head *h = wl->head;
    if (!rc && vrc == -ENODATA && init) {
        plx_wlog_head_init(st, h, wl->nblocks);
        rc = side_sync(wl, PLX_IO_WRITE, 0, 1, h, PLX_IO_FUA);
        if (rc)
            plx_err(st, rc, "writing the head of write log %s: %s", desc, strerror(-rc));
    } else if (!rc && vrc) {
        rc = plx_err(st, -EINVAL, "%s is not a Parallax write log (%s)", desc,
                     vrc == -ENODATA ? "it is empty" : why);
    } else if (!rc) {
        char a[33], b[33];
        hex_uuid(h->store_uuid, a);
        hex_uuid(st->sb.uuid, b);
        if (h->version != PLX_WLOG_VERSION)
            rc = plx_err(st, -EPROTONOSUPPORT,
                         "write log %s has version %u; this Parallax reads "
                         "version %u",
                         desc, h->version, PLX_WLOG_VERSION);
        else if (memcmp(h->store_uuid, st->sb.uuid, 16))
            rc = plx_err(st, -EXDEV,
                         "write log %s belongs to another blockstore (uuid %s; this one is %s): "
                         "attach it to that one",
                         desc, a, b);
        else if (h->host_hash != st->host_hash)
            rc = plx_err(st, -EPERM,
                         "write log %s belongs to host %.64s, and this is host %s: replay it on "
                         "that host, or drop its writes with 'parallax cache discard'",
                         desc, h->host, st->host);
        else if (h->log_blocks != wl->nblocks)
            rc = plx_err(st, -EUCLEAN, "write log %s was made %llu KiB long and is now %llu KiB",
                         desc, (unsigned long long)h->log_blocks * 4,
                         (unsigned long long)wl->nblocks * 4);
    }
    if (!rc)
        wl->log_id = h->log_id;
    if (rc) {
        wlog_free(st);
        return rc;
    }
    return 0;
}

int plx_wlog_close(plx_store *st)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return 0;
    int rc = 0;
    wl->closing = true; /* nothing defers the drain from here on */
    for (struct plx_vdi *v = st->vdis; v; v = v->next)
        if (v->wc) {
            int c = plx_wlog_vdi_detach(v);
            if (!rc)
                rc = c;
        }
    /* Nothing of the log may still be in flight when its medium goes. */
    while (wl->flying || wl->flush_inflight || wl->round_active || st->ready_head ||
           st->deferred_head) {
        int s = plx_store_service(st);
        if (s < 0)
            break;
        if (!(wl->flying || wl->flush_inflight || wl->round_active))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
        if (wl->drain_error && !wl->flying && !wl->flush_inflight && !wl->log_reads)
            break;
    }
    if (wl->drain_error && !rc)
        rc = plx_err(st, wl->drain_error, "%s", wl->error);
    wlog_free(st);
    return rc;
}

void plx_wlog_stats(const plx_store *st, struct plx_wlog_stats *out)
{
    memset(out, 0, sizeof *out);
    const struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    out->attached = 1;
    out->failed = wl->failed;
    out->log_bytes = wl->nblocks * BS;
    uint64_t used = 0;
    for (const struct wbatch *b = wl->first; b; b = b->next)
        if (!b->memory_only && b->state >= B_FLYING)
            used += 1 + b->ndata;
    out->used_bytes = used * BS;
    out->backlog_records = wl->backlog_records;
    out->backlog_bytes = wl->backlog_blocks * BS;
    out->drained_bytes = wl->drained_bytes;
    out->attach_ns = wl->attach_ns;
    out->replayed_records = wl->replayed_records;
    out->logged_bytes = wl->logged_bytes;
    out->zc_bytes = wl->zc_bytes;
    out->zc_records = wl->zc_records;
    out->drain_delay_ms = wl->delay_ns / 1000000u;
    out->drain_max_age_ms = wl->max_age_ns / 1000000u;
    if (wl->first)
        out->oldest_ms = (plx_mono_ns() - wl->first->born_ns) / 1000000u;
    out->drain = wl->drain_error    ? PLX_WLOG_DRAIN_STOPPED
                 : wl->failed       ? PLX_WLOG_DRAIN_EAGER
                 : wl->drain_paused ? PLX_WLOG_DRAIN_PAUSED
                 : wl->round_active ? PLX_WLOG_DRAIN_RUNNING
                 : !wl->first       ? PLX_WLOG_DRAIN_IDLE
                 : wl->deferred     ? PLX_WLOG_DRAIN_DEFERRED
                                    : PLX_WLOG_DRAIN_EAGER;
    snprintf(out->desc, sizeof out->desc, "%s", wl->desc);
    snprintf(out->error, sizeof out->error, "%s", wl->error);
}

void plx_wlog_pause_drain(plx_store *st, int pause)
{
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return;
    wl->drain_paused = pause != 0;
    if (!pause)
        drain_kick(wl);
}

void plx_wlog_keep_fd(plx_store *st, int fd)
{
    if (st->wlog)
        st->wlog->lock_fd = fd;
    else
        close(fd);
}
