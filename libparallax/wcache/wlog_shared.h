/*
 * wlog_shared.h - what the files of the write log share (layer 6; not for the layers above,
 * which use wlog.h): its batches, records, index, requests and per-VDI state, the log itself,
 * and the functions one file of it calls in another.
 *
 * The files, in that order from the top (docs/DESIGN.md, layer 6): wlog_cursor.c (replay's
 * reading side), wlog_open.c (opening, closing and the status of the log), wlog_switch.c
 * (turning the cache on and off for a VDI, its record), wlog_pass.c (writes passed through with
 * the cache off), wlog.c (a cached VDI's entry points and its queue), wlog_read.c (reads served
 * from the log), wlog_drain.c (the drain into the pipeline), wlog_batch.c (appending records,
 * sealing and writing batches, flushing the log), wlog_index.c (which record holds a block),
 * wlog_policy.c (the settings). A file calls only those after it; where a lower one must tell
 * an upper one (a written batch lets the queues go on and kicks the drain, a drained round lets
 * the queues go on) it calls the callbacks in struct plx_wlog that wlog_open.c registered.
 */
#ifndef PLX_WLOG_SHARED_H
#define PLX_WLOG_SHARED_H

#include <stdbool.h>
#include <stdint.h>

#include "slab.h"
#include "wlog.h"
#include "wlog_policy.h"

#define BS PLX_BLOCK_SIZE

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
    /* Appended without a copy (pol.zc_min): its data in the writer's buffer, until the batch is
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
    uint8_t *edge;   /* two blocks: head and tail edge */
    unsigned pieces; /* appended pieces whose batch is not written yet */
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
    struct plx_wlog_policy pol; /* its settings (wlog_policy.h), fixed at attach */
    size_t dio_align;           /* a record's data must be this aligned for pol.zc_min */
    struct plx_wlog_head *head; /* the head block as last written */
    struct wbatch *first, *last, *gather, *last_placed;
    /* The oldest batch not yet written (sealed or flying), the gathering one, or NULL: every
     * batch before it is written, so flushes and the kick start here, not at `first`. */
    struct wbatch *first_unwritten;
    uint64_t next_seq, head_pos, released_seq, barrier_seq;
    unsigned flying, sealed;
    bool kick_queued;
    struct plx_deferred kick;
    /* What the batches and the drain tell the files above them, set at open (wlog_open.c):
     * a batch written or a round drained lets the VDIs' queues go on (wlog_process_all), a
     * batch written may start the drain (wlog_drain_kick). Through these, not by name: those
     * files sit above (wlog.c above the drain, the drain above the batches). */
    void (*queues_run)(struct plx_wlog *wl);
    void (*drain_kick)(struct plx_wlog *wl);
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
    bool round_crc_bad; /* a record read back did not match its checksum */
    uint32_t apply_i;
    struct plx_deferred apply_next;
    bool apply_held; /* round_apply_step stopped at APPLY_INFLIGHT */
    struct plx_ev head_ev;
    struct plx_vdi **touched;
    size_t ntouched, captouched;
    uint8_t *spare[SPARE_BUFS]; /* batch and drain-read buffers to reuse */
    unsigned nspare;
    /* index */
    struct ient **tab;
    size_t mask, nidx;
    /* The deferred drain (drain_defer; its idle window and max age are in pol): the last
     * append, and the engine timer that starts the drain when one of them has passed. */
    uint64_t last_append_ns;
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
     * the writers' buffers (pol.zc_min): whether large writes take the no-copy path (status). */
    uint64_t logged_bytes, zc_bytes, zc_records;
    struct plx_wlog_vdi *vdis;
    int lock_fd;
    /* What lives as long as a record (its batch, the batch's records, index entries) comes
     * from slabs, not from malloc: slab.h says why (a caller's freed request buffers). */
    struct plx_slab batch_slab, ient_slab, ent_slab[ENT_CLASSES];
};

/* wlog_index.c: (VDI, virtual block) -> the newest record not yet drained. */
struct wbatch *wlog_index_find(const struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint32_t *blk);
int wlog_index_set(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n, struct wbatch *b,
                   uint32_t blk);
void wlog_index_drop(struct plx_wlog *wl, uint64_t vdi, uint64_t vb, uint64_t n,
                     const struct wbatch *b);

/* wlog_batch.c: requests' completion, batches, the log's flushes, appending records. */
void wlog_req_run_done(struct plx_deferred *d);
void wlog_req_complete(struct plx_wlog *wl, struct wreq *r, int status);
int wlog_add_flush_waiter(struct plx_wlog *wl, uint64_t need, plx_done_fn cb, void *arg,
                          struct wreq *r);
void wlog_piece_done(struct plx_wlog *wl, struct wreq *r, uint64_t seq, bool durable);
void wlog_buf_put(struct plx_wlog *wl, uint8_t *buf);
void wlog_batch_free(struct plx_wlog *wl, struct wbatch *b);
const uint8_t *wlog_batch_data(const struct wbatch *b, uint32_t blk);
void wlog_seal(struct plx_wlog *wl, struct wbatch *b);
void wlog_advance_unwritten(struct plx_wlog *wl);
void wlog_enter_failed(struct plx_wlog *wl, int err, const char *what);
void wlog_kick_later(struct plx_wlog *wl);
void wlog_flush_kick(struct plx_wlog *wl);
bool wlog_append(struct plx_wlog *wl, struct plx_wlog_vdi *w, struct wreq *r);

/* wlog.c: a cached VDI's queue. */
void wlog_process_queue(struct plx_wlog *wl, struct plx_wlog_vdi *w);
void wlog_process_all(struct plx_wlog *wl);
void wlog_enqueue(struct plx_wlog_vdi *w, struct wreq *r);
void wlog_direct_done(void *arg, int status);
struct wreq *wlog_req_new(struct plx_vdi *v, enum qkind kind, uint64_t off, uint64_t len,
                          plx_done_fn cb, void *arg);
/* Records of w, or requests queued behind them, are left: turning the cache off waits. */
bool wlog_detach_left(const struct plx_wlog_vdi *w);
/* The end of turning the cache off for v: it leaves the log's list, and what arrived meanwhile
 * goes straight to the pipeline (wlog_switch.c, and wlog_process_all for a detach without a
 * wait). */
void wlog_detach_finish(struct plx_vdi *v);

/* wlog_read.c: reads of blocks through the index. */
int wlog_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb, void *arg);
int wlog_read_blocks(struct plx_vdi *v, uint8_t *buf, uint64_t vb, uint64_t n, plx_done_fn cb,
                     void *arg);

/* wlog_drain.c: the drain. */
void wlog_drain_kick(struct plx_wlog *wl);
void wlog_release_round(struct plx_wlog *wl);
void wlog_drain_timer_run(struct plx_timer *t);

/* wlog_pass.c: the tracked writes go to the log when the cache turns on. */
void wlog_pass_rescue(struct plx_wlog *wl, struct plx_wlog_vdi *w);

/* wlog_open.c: blocking I/O on the log (attach, replay, detach: nothing else in flight). */
int wlog_side_sync(struct plx_wlog *wl, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                   unsigned flags);

#endif
