/*
 * internal.h - the engine's shared structures. One concept per file:
 *   store.c    open/close/format, the service loop, errors, blocking I/O for admin paths
 *   extent.c   extent catalogue and the block allocator (bitmaps, claims)
 *   registry.c VDI records: read, write, lookup, create, clone, delete
 *   snaplog.c  snapshot logs: read, append, label, lookup
 *   cache.c    radix node cache (CLOCK, level-aware) and node loading
 *   pipeline.c logical requests, copy-on-write, batches and commit ordering
 *   vdi.c      VDI open/close and the public I/O entry points
 *   check.c    the consistency checker
 *
 * Everything here runs on one thread; nothing takes a mutex.
 */
#ifndef PLX_INTERNAL_H
#define PLX_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend.h"
#include "format.h"
#include "parallax.h"

struct plx_req;
struct plx_batch;
typedef struct plx_store plx_store_t;

/* Every engine I/O is an event: the backend's completion only records the status and queues the
 * event; the service loop runs the handler afterwards, outside the backend's poll, so handlers
 * may submit (or even wait for) more I/O. */
struct plx_ev {
    struct plx_io io;
    int status;
    void (*handler)(struct plx_store *st, struct plx_ev *ev);
    void *ctx;
    struct plx_ev *next;
};

/* ---- Node cache ------------------------------------------------------------------------------ */

enum plx_node_state { NODE_LOADING, NODE_VALID };

struct plx_waiter {
    struct plx_req *req;
    struct plx_waiter *next;
};

struct plx_node {
    uint64_t addr;
    uint64_t *links;            /* PLX_RADIX_FANOUT entries, block-aligned */
    struct plx_node *hash_next;
    struct plx_node *clock_next, *clock_prev;
    enum plx_node_state state;
    unsigned level;             /* 0 = leaf (links to data) */
    unsigned chances;           /* CLOCK credit: higher levels earn more */
    unsigned pins;              /* roots, nodes being loaded or written, dirty nodes */
    uint64_t new_batch;         /* batch that allocated this node (0: came from disk) */
    uint64_t dirty_batch;       /* latest batch that changed it and has not written it */
    bool stale;                 /* changed by a batch whose commit failed: reload from disk */
    struct plx_ev load_ev;
    struct plx_waiter *waiters; /* requests waiting for the load */
};

struct plx_cache {
    struct plx_node **hash;
    size_t hash_size;
    size_t count, capacity;     /* nodes held / nodes allowed (pinned ones may exceed) */
    struct plx_node *hand;      /* CLOCK hand (circular list) */
    uint64_t hits, misses, evictions;
};

/* ---- Allocator -------------------------------------------------------------------------------- */

/* Per extent type (metadata, data): the extents this process holds and a run of claimed blocks
 * ready to hand out. Claims are made durable by the batch that uses them (see extent.c). */
struct plx_extent_state {
    uint8_t *bitmap;            /* in-memory bitmap of a held extent, NULL otherwise */
    uint64_t free;              /* clear bits */
    uint64_t *dirty_blocks;     /* per bitmap block: generation of its last change */
    bool held;
};

struct plx_alloc_pool {
    uint64_t next, end;         /* claimed, unused blocks [next, end) */
    uint64_t extent;            /* extent the pool is in */
    bool valid;
};

struct plx_alloc_waiter {
    uint64_t gen;
    void (*cb)(void *arg, int status);
    void *arg;
    struct plx_alloc_waiter *next;
};

struct plx_alloc {
    struct plx_extent_state *ext;      /* extent_count entries */
    struct plx_alloc_pool pool[2];     /* [0] metadata, [1] data */
    uint64_t gen;                      /* bumped on every bitmap or catalogue change */
    uint64_t written_gen;              /* every change up to here is written */
    uint64_t round_target;             /* generation the writes in flight will reach */
    int round_status;
    struct plx_alloc_waiter *waiters;  /* batches waiting for claims to be written */
    unsigned writes_inflight;
    uint64_t claim_chunk;              /* blocks per claim */
};

/* ---- Store ------------------------------------------------------------------------------------- */

struct plx_store {
    plx_backend *be;
    struct plx_superblock sb;
    struct plx_state_block state;
    int read_only;
    unsigned admin_depth;       /* nested plx_admin_lock calls: only the outermost locks */
    int epoll_fd;               /* plx_store_fd(): backend fd + wake_fd */
    int wake_fd;                /* eventfd: callbacks are ready to run */
    char errmsg[512];
    uint64_t host_hash;
    uint32_t pid;
    uint64_t epoch;
    char host[64];
    struct plx_extent_entry *cat;      /* catalogue, extent_count entries */
    struct plx_alloc alloc;
    struct plx_cache cache;
    struct plx_vdi *vdis;              /* open VDIs */
    struct plx_req *done_head, *done_tail; /* completed, callback not yet run */
    struct plx_ev *ready_head, *ready_tail; /* I/O completed, handler not yet run */
    unsigned internal_ios;             /* engine I/O in flight */
    int fatal;                          /* nonzero: the store stopped (negative errno) */
    bool in_service;                   /* inside plx_store_service: completions need no wake */
    uint64_t seen_gc_epoch;            /* state.gc_epoch when the cache was last known good */
};

/* ---- VDIs, requests and batches ---------------------------------------------------------------- */

enum plx_req_op { REQ_READ, REQ_WRITE, REQ_FLUSH, REQ_TRIM, REQ_SNAPSHOT, REQ_STATUS };

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

struct plx_req {
    struct plx_vdi *v;
    enum plx_req_op op;
    enum plx_req_state state;
    unsigned flags;
    uint64_t seq;
    uint64_t off, len;           /* bytes */
    uint64_t b0, b1;             /* virtual blocks [b0, b1) */
    void *ubuf;                  /* caller's buffer */
    uint8_t *bounce;             /* block-aligned staging buffer, or NULL when ubuf is used */
    uint8_t *io_buf;             /* bounce or ubuf: what data I/O reads/writes */
    bool head_partial, tail_partial, old_data_read;
    plx_done_fn cb;
    void *arg;
    int status;
    unsigned loads_waiting;
    unsigned ios_waiting;
    struct plx_ev *ios;
    size_t nios;
    struct plx_relink *relinks;
    size_t nrelinks;
    bool needs_batch;            /* allocated or changed metadata */
    struct plx_batch *batch;
    char label[PLX_LABEL_MAX + 1];
    uint64_t *index_out;
    uint64_t *run_out;           /* REQ_STATUS: bytes sharing the state of the first block */
    int *mapped_out;             /* REQ_STATUS: 1 mapped, 0 sparse */
    struct plx_req *next, *prev; /* vdi active list */
    struct plx_req *batch_next;  /* batch membership */
    struct plx_req *done_next;
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
};

struct plx_vdi {
    plx_store *st;
    struct plx_vdi *next;        /* store's open list */
    struct plx_vdi_record rec;   /* in-memory copy of the registry record */
    uint64_t slot_addr;
    bool ro;
    uint64_t nblocks;            /* virtual blocks */
    unsigned height;
    uint64_t root_addr;
    struct plx_node *root;       /* pinned */
    struct plx_snaplog_block *log_head; /* newest log block image (NULL: none) */
    struct plx_snap_info *snaps; /* writable VDIs: every snapshot, as committed or in flight */
    size_t nsnaps;
    struct plx_req *active_head, *active_tail;
    struct plx_batch *open, *flight; /* flight: the oldest batch in flight */
    struct plx_batch *flight_next;   /* a second batch in flight, behind `flight` */
    uint64_t next_seq, batch_seq;
    bool needs_reload;
    /* No write or trim since the newest snapshot was taken (in request order): the tree equals
     * that snapshot's, so the next snapshot can share its root instead of copying one. */
    bool same_as_newest_snap;
    bool kicking, kick_again;    /* plx_pipeline_kick is not re-entered, it loops instead */
};

/* ---- store.c ------------------------------------------------------------------------------------ */
int plx_err(plx_store *st, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Submit an engine I/O; ev->handler runs from the service loop when it completes. On a submit
 * error the handler never runs. */
int plx_submit(plx_store *st, struct plx_ev *ev);
/* Blocking single I/O for admin paths: submit, then poll the backend until it completes. */
int plx_sync_io(plx_store *st, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                unsigned flags);
/* Queue a request's callback to run at the end of the current service pass. */
void plx_complete(plx_store *st, struct plx_req *r);
void plx_wake(plx_store *st);
int plx_admin_lock(plx_store *st);
void plx_admin_unlock(plx_store *st);
uint64_t plx_now_ns(void);

/* ---- extent.c ----------------------------------------------------------------------------------- */
int plx_alloc_init(plx_store *st);
/* Release claimed-but-unused blocks and extent locks; write everything. Blocking. */
int plx_alloc_shutdown(plx_store *st);
void plx_alloc_free(plx_store *st);
/* Hand out up to `want` contiguous blocks of `type` (METADATA or DATA); returns the count (>= 1)
 * with the first in *first, or -ENOSPC. Never does I/O except for claiming a new extent. */
int plx_alloc_blocks(plx_store *st, enum plx_extent_type type, uint64_t want, uint64_t *first);
/* Current allocator generation: a batch that used blocks must see it written before linking. */
uint64_t plx_alloc_gen(const plx_store *st);
/* Write allocator state up to generation gen; cb fires when written (immediately if already). */
int plx_alloc_sync(plx_store *st, uint64_t gen, void (*cb)(void *arg, int status), void *arg);
/* Read the whole catalogue and every held extent's bitmap from disk (check, info, gc). */
int plx_catalogue_read(plx_store *st);
int plx_bitmap_read(plx_store *st, uint64_t extent, uint8_t *bits);
enum plx_extent_type plx_block_type(const plx_store *st, uint64_t block);
bool plx_block_in_bitmap_area(const plx_store *st, uint64_t block);

/* ---- registry.c --------------------------------------------------------------------------------- */
int plx_registry_read(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec);
int plx_registry_write(plx_store *st, uint64_t slot_addr, const struct plx_vdi_record *rec);
void plx_registry_seal(struct plx_vdi_record *rec, uint64_t slot_addr, void *block);
/* Find a live VDI by name or id (from disk). Returns slot address or -ENOENT. */
int plx_registry_find(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                      uint64_t *slot_addr);
int plx_registry_scan(plx_store *st, struct plx_vdi_record **recs, uint64_t **slots, size_t *n);
int plx_state_write(plx_store *st);
void plx_record_to_info(const plx_store *st, const struct plx_vdi_record *rec,
                        struct plx_vdi_info *out);
unsigned plx_height_for_size(uint64_t size);
bool plx_all_digits(const char *s);

/* ---- snaplog.c ---------------------------------------------------------------------------------- */
/* Read the log chain of a VDI: records 1..snap_count (newer records are an incomplete snapshot
 * and are ignored). *out malloc'd. */
int plx_snaplog_read(plx_store *st, const struct plx_vdi_record *rec, struct plx_snap_info **out,
                     size_t *count, uint64_t **blocks);
int plx_snaplog_read_block(plx_store *st, uint64_t addr, uint64_t vdi_id,
                           struct plx_snaplog_block *out);
/* Parse "VDI@N" or "VDI@LABEL". */
int plx_snap_resolve(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                     uint64_t *slot_addr, struct plx_snap_info *snap, uint64_t *log_block);

/* ---- cache.c ------------------------------------------------------------------------------------ */
int plx_cache_init(plx_store *st, uint64_t bytes);
void plx_cache_free(plx_store *st);
struct plx_node *plx_cache_lookup(plx_store *st, uint64_t addr);
/* Get a node, starting its load if absent. Returns the node if valid; NULL if loading (req, if
 * given, is queued and its loads_waiting incremented); sets *err on failure. */
struct plx_node *plx_cache_get(plx_store *st, uint64_t addr, unsigned level, struct plx_req *req,
                               int *err);
/* Insert a freshly allocated node (contents zeroed). */
struct plx_node *plx_cache_new(plx_store *st, uint64_t addr, unsigned level);
/* Blocking read of a node (admin and check paths). */
int plx_cache_get_sync(plx_store *st, uint64_t addr, unsigned level, struct plx_node **out);
void plx_cache_pin(struct plx_node *n);
void plx_cache_unpin(plx_store *st, struct plx_node *n);
void plx_cache_drop(plx_store *st, struct plx_node *n);
/* Drop every node that is neither pinned nor changed: after blocks may have been freed. */
void plx_cache_drop_clean(plx_store *st);
bool plx_link_valid(const plx_store *st, uint64_t link, unsigned child_level);

/* ---- pipeline.c --------------------------------------------------------------------------------- */
int plx_req_submit(struct plx_vdi *v, struct plx_req *r);
void plx_pipeline_kick(struct plx_vdi *v);
bool plx_vdi_idle(const struct plx_vdi *v);
unsigned plx_index_at(uint64_t vblock, unsigned level);
/* Is `label` the label of a live snapshot of v (in memory: includes snapshots in flight)? */
bool plx_label_taken(const struct plx_vdi *v, const char *label, uint64_t except_index);

#endif
