/*
 * pipeline.h - VDI trees being read and written: requests, batches and commit ordering (layer
 * 5; pipeline.c, which walks the tree through radix.c and changes it through cow.c, orders the
 * requests through req_order.c and commits through batch.c). struct plx_vdi is the state of one
 * open tree; vdi.c (layer 6) opens and closes it.
 */
#ifndef PLX_PIPELINE_H
#define PLX_PIPELINE_H

#include "alloc.h"
#include "cache.h"
#include "engine.h"
#include "radix.h"
#include "read_plan.h"
#include "snaplog.h"

#define PLX_BUSY_SLOTS 4096u    /* struct plx_vdi's busy filter: counters */
#define PLX_BUSY_MAX_BLOCKS 16u /* ... and the longest range it counts */

enum plx_req_op {
    REQ_READ,
    REQ_WRITE,
    REQ_FLUSH,
    REQ_TRIM,
    REQ_SNAPSHOT,
    REQ_STATUS,
    REQ_SNAPEDIT
};

enum plx_req_state {
    RQ_WAIT_RANGE,   /* an earlier overlapping request is still active */
    RQ_RESOLVE,      /* loading radix nodes / old data for partial blocks */
    RQ_IO,           /* data I/O in flight */
    RQ_WAIT_BATCH,   /* waiting for its batch to commit */
    RQ_DONE,
};

/* A link changed for a new data block, remembered so a failed data write can put it back. */
struct plx_relink {
    uint64_t leaf_addr;
    unsigned idx;
    uint64_t old_link;
};

/* Where one snapshot's time went ($PARALLAX_SNAP_TRACE, printed when it completes): monotonic
 * times, 0 where a phase did not happen. Batch phases are copied from the batch that carried the
 * snapshot (enum plx_batch_trace). */
enum plx_batch_trace {
    BT_FLY,       /* the batch started flying */
    BT_ALLOC,     /* the allocator's bitmaps it needed were written */
    BT_DATA,      /* the last data write of its members completed */
    BT_STAGE_A,   /* new nodes, bitmaps and log block written, data on the medium */
    BT_FLUSH_A,   /* the stage-A flush completed */
    BT_PREV,      /* the older batch in flight finished */
    BT_STAGE_B,   /* commit nodes written */
    BT_FLUSH_REC, /* the flush before the record completed */
    BT_DONE,      /* the record (FUA) written: the batch finishes */
    BT_N
};

struct plx_snap_trace {
    uint64_t submit_ns;     /* plx_vdi_submit_snapshot entered */
    uint64_t queued_ns;     /* the request entered the stream */
    uint64_t swap_ns;       /* roots swapped in memory (do_snapshot) */
    unsigned ahead;         /* requests ahead of it in the stream when queued */
    unsigned writes_ahead;  /* of which writes not yet applied to the tree */
    unsigned batches_ahead; /* batches in flight when it swapped */
    unsigned members;       /* requests in its batch */
    unsigned data_at_fly;   /* their data writes in flight when the batch started flying */
    uint64_t batch[BT_N];
};

struct plx_req {
    struct plx_vdi *v;
    enum plx_req_op op;
    enum plx_req_state state;
    unsigned flags;
    uint64_t seq;
    uint64_t submit_ns;          /* plx_mono_ns() at plx_req_submit */
    uint64_t off, len;           /* bytes */
    uint64_t b0, b1;             /* virtual blocks [b0, b1) */
    void *ubuf;                  /* caller's buffer */
    uint8_t *bounce;             /* block-aligned staging buffer, or NULL when ubuf is used */
    uint8_t *io_buf;             /* bounce or ubuf: what data I/O reads/writes */
    struct plx_read_plan *rplan; /* REQ_READ of several runs: its reads (read_plan.h), */
    uint8_t *rscratch;           /* the scratch buffer of those not read in place, */
    uint64_t *rphys;             /* the store block of each block (0: hole), */
    bool read_exact;             /* and whether it is read again without merging */
    bool busy_counted;           /* its blocks are counted in its VDI's busy filter */
    bool head_partial, tail_partial, old_data_read;
    plx_done_fn cb;
    void *arg;
    int status;
    struct plx_load_wait loads;  /* radix nodes this request waits for */
    struct plx_alloc_room room;  /* room to allocate in, waited for on a serving loop */
    unsigned ios_waiting;
    struct plx_ev *ios;
    size_t nios;
    struct plx_relink *relinks;
    size_t nrelinks;
    bool needs_batch;            /* allocated or changed metadata */
    bool fua_in_place;           /* a FUA overwrite made durable by FUA data writes alone */
    struct plx_batch *batch;
    char label[PLX_LABEL_MAX + 1];
    uint64_t *index_out;
    uint64_t *run_out;           /* REQ_STATUS: bytes sharing the state of the first block */
    int *mapped_out;             /* REQ_STATUS: 1 mapped, 0 sparse */
    struct plx_snap_edit *edit;  /* REQ_SNAPEDIT: label or delete a snapshot (snap_edit.c) */
    /* REQ_SNAPEDIT: carries the edit out once no snapshot or other edit is ahead of it, and
     * finishes r (set by snap_edit.c, the layer-5 peer above the pipeline's stream). */
    void (*edit_start)(struct plx_req *r);
    struct plx_req *next, *prev; /* vdi active list */
    /* RQ_WAIT_RANGE: the VDI's list of waiting requests (in request order), and the earlier
     * active request whose range overlaps this one's (NULL: not known): while it is active this
     * one cannot start, so the kick does not ask again. nblocked: waiting requests naming this
     * one. */
    struct plx_req *wnext, *wprev, *blocker;
    unsigned nblocked;
    struct plx_req *batch_next;  /* batch membership */
    struct plx_deferred done;    /* queued when complete: delivers the callback */
    struct plx_snap_trace *trace; /* REQ_SNAPSHOT with $PARALLAX_SNAP_TRACE, else NULL */
    bool durable_waiter;          /* counted in st->durable_waiters until complete */
};

enum plx_batch_state {
    B_OPEN,
    B_STAGE_A,
    B_FLUSH_A,
    B_WAIT_PREV, /* stage A durable; stage B waits for the older flying batch to finish */
    B_STAGE_B,
    B_FLUSH_REC, /* snapshot: commit nodes durable before the record (FUA) that counts it */
    B_FLUSH_B,
    B_DONE,
};

struct plx_batch {
    uint64_t seq;
    struct plx_vdi *v;
    enum plx_batch_state state;
    struct plx_node **nodes;     /* changed nodes: written in stage A when new, else in B */
    size_t nnodes, cap;
    struct plx_req *reqs;        /* requests completing with this batch */
    bool final_flush;            /* FUA, FLUSH or SNAPSHOT inside */
    uint64_t alloc_gen;          /* allocator generation that must be written first */
    unsigned data_pending;       /* data writes of member requests still in flight */
    unsigned io_pending;         /* this batch's own I/O in flight */
    int status;
    struct plx_ev *ios;          /* metadata writes */
    void *images;                /* node images captured when the batch started flying */
    struct plx_ev flush_ev;
    bool stage_a_started;
    bool overlapped;             /* started flying while an older batch was in flight */
    /* snapshot carried by this batch */
    struct plx_req *snap;
    uint8_t *rec_buf;            /* VDI record image */
    uint8_t *log_buf;            /* snapshot log block image */
    uint64_t log_addr;
    uint64_t trace[BT_N];        /* with $PARALLAX_SNAP_TRACE (struct plx_snap_trace) */
    unsigned nreqs;              /* requests waiting on reqs (for the trace) */
    unsigned early;              /* members acknowledged before the batch committed */
    /* The request stream that opened it (pipeline.c, above batch.c): finishes a request that
     * waited for the batch, and lets the stream go on once the batch is over. */
    void (*finish)(struct plx_req *r);
    void (*kick)(struct plx_vdi *v);
};

struct plx_vdi {
    plx_store *st;
    struct plx_vdi *next;        /* store's open list */
    struct plx_vdi_record rec;   /* in-memory copy of the registry record */
    uint64_t slot_addr;
    bool ro;
    bool held;                   /* a read-only handle's hold is recorded (hold.h) at hold_slot */
    uint32_t hold_slot;
    uint64_t nblocks;            /* virtual blocks */
    unsigned height;
    uint64_t root_addr;
    struct plx_node *root;       /* pinned */
    struct plx_owner *owner;     /* owner of this tree's writable nodes; NULL for a snapshot */
    struct plx_snaplog_block *log_head; /* newest log block image (NULL: none) */
    struct plx_snaplog_spine *spine; /* writable VDIs: the log's skip path (snaplog.h) */
    struct plx_label_set labels;     /* writable VDIs: labels, read from the log when first needed */
    struct plx_req *active_head, *active_tail;
    /* The active requests in RQ_WAIT_RANGE (in request order), and the number of active
     * snapshots: without a snapshot, plx_pipeline_kick walks only the waiting ones, and skips
     * those whose blocker is still active. The drain of the write cache keeps thousands of
     * requests active, and every submission and completion kicks. wait_gen counts changes of
     * the waiting list (a kick's walk starts over when one happened under it). */
    struct plx_req *wait_head, *wait_tail;
    unsigned nsnap;
    uint64_t wait_gen;
    /* plx_may_start's fast path: a counting filter of the blocks of the active requests with a
     * range (reads, writes, trims, block status) of at most PLX_BUSY_MAX_BLOCKS blocks, one
     * counter per hash of a block; nwide counts the active ones with more. A request whose every
     * block's counter is 1 (its own) overlaps no other active request and starts without the
     * walk of the active list, which the write cache's drain, keeping hundreds of 4 KiB writes
     * active, paid on every submission (bench/notes/wcache.md, "QD1 mean with the drain"). */
    uint32_t busy[PLX_BUSY_SLOTS];
    unsigned nwide;
    struct plx_batch *open, *flight; /* flight: the oldest batch in flight */
    struct plx_batch *flight_next;   /* a second batch in flight, behind `flight` */
    /* A mutation queued the start of the open batch for the end of the loop turn
     * (plx_batch_start_soon): requests submitted together, as a host's loop turn hands them in,
     * share one batch and its flushes. The VDI is not idle while it is queued. */
    struct plx_deferred start_soon;
    bool start_queued;
    uint64_t next_seq, batch_seq;
    /* meta_seq: the newest batch that changed a node of the tree (or carried a snapshot);
     * durable_seq: the newest batch that finished with a flush after its writes (its own and,
     * batches finishing in order, every older batch's). meta_seq <= durable_seq: every link in
     * memory is durable on the medium, so a FUA overwrite of a writable block needs only its
     * data durable (fua_in_place). */
    uint64_t meta_seq, durable_seq;
    bool needs_reload;
    /* A commit failed after some of its writes were acknowledged (they completed when their
     * data was written, before their batch committed): every request fails with this error
     * until the VDI is opened again, so that no read returns data older than an acknowledged
     * write and the guest's next flush reports the loss. 0: not failed. */
    int failed;
    /* No write or trim since the newest snapshot was taken (in request order): the tree equals
     * that snapshot's, so the next snapshot can share its root instead of copying one. */
    bool same_as_newest_snap;
    bool kicking, kick_again;    /* plx_pipeline_kick is not re-entered, it loops instead */
    struct plx_wlog_vdi *wc;     /* the write cache's state for this VDI, NULL when off (wlog.c) */
    /* The automatic mode with the cache off (wlog_pass.c, plx_wlog_submit_passthrough): writes in
     * the pipeline, oldest first, in flight or completed and not yet covered by a flush, which
     * turning the cache on puts in the log as well; wpass_dirty: something completed in the
     * pipeline that those do not cover, so the first flush with the cache on flushes the store. */
    struct plx_wpass *wpass_head, *wpass_tail;
    bool wpass_dirty;
    uint64_t wpass_flush_gen;
    /* vdi.c: a close under way (plx_vdi_close_async), and the error of its wait for the admin
     * lock when that failed: the close then leaves the record's lock fields as they are. */
    struct plx_close_req *close_req;
    int unlock_err;
    struct plx_wcache_auto_state {
        bool on;                     /* the automatic mode decides (wcache_auto.c) */
        uint32_t on_us, off_us, hold_ms;
        uint64_t since_ns;           /* since when the condition to switch has held, or 0 */
    } wauto;
};

int plx_req_submit(struct plx_vdi *v, struct plx_req *r);
/* r is over (status in r->status): leave the active list and deliver its callback. */
void plx_req_finish(struct plx_req *r);
void plx_pipeline_kick(struct plx_vdi *v);
/* No request active and no batch open or in flight. This and the three below read the active
 * list (req_order.c). */
bool plx_vdi_idle(const struct plx_vdi *v);
/* Requests are numbered in submission order: the number the next one gets, and whether every
 * request numbered below `seq` has finished. */
uint64_t plx_vdi_next_seq(const struct plx_vdi *v);
bool plx_vdi_finished_before(const struct plx_vdi *v, uint64_t seq);
/* How many requests numbered below `seq` have not finished. */
unsigned plx_vdi_active_before(const struct plx_vdi *v, uint64_t seq);
/* When the oldest write or trim of v not finished yet was submitted (plx_mono_ns), or 0. */
uint64_t plx_vdi_oldest_write_ns(const struct plx_vdi *v);
/* Is `label` the label of a live snapshot of v (snapshots in flight included)? 1 yes, 0 no, or
 * an error. The first call with a label after open reads the log (synchronously). */
int plx_label_taken(struct plx_vdi *v, const char *label, uint64_t except_index);
/* Queue a finished request's callback for the end of the service pass (never inline). */
void plx_complete(plx_store *st, struct plx_req *r);

#endif
