/*
 * engine.h - the engine's context and event loop (layer 0 above the backend).
 *
 * The engine is layered, each layer calling only the ones below it (docs/DESIGN.md, "Layers"):
 *
 *   8  check.c, gc.c, info.c      read everything below; nothing calls them
 *   7  store.c, blocking.c        open and close a store; the blocking forms of the calls
 *   6  vdi.c, vdi_admin.c, wlog.c VDI handles; create, clone, delete; the write cache
 *   5  pipeline.c                 radix walks, copy-on-write, batches, snapshots, commit order
 *   4  registry.c, vditab.c,      VDI records, the VDI table and name index; snapshot logs
 *      nameidx.c, snaplog.c
 *   3  cache.c                    cached radix nodes; "loaded" is a callback to layer 5
 *   2  alloc.c                    extent catalogue, bitmaps, claims
 *   1  lock.c, system.c, format.c identity, admin lock, holder liveness; superblock and system
 *                                 state block; making a new store
 *   0  engine.c                   this header: I/O events, deferred callbacks, errors
 *      backend.h                  the medium (file, memory; fault injection in tests)
 *
 * Every layer receives the one context, struct plx_store, and uses its own part of it and the
 * parts of the layers below. Layers above are reached only through callbacks they registered
 * (struct plx_deferred, the node cache's waiters, gc_epoch_moved).
 *
 * Everything runs on one thread; nothing takes a mutex.
 */
#ifndef PLX_ENGINE_H
#define PLX_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "clock.h"
#include "backend.h"
#include "format.h"
#include "parallax.h"

typedef struct plx_store plx_store_t;
struct plx_alloc;
struct plx_cache;
struct plx_lock_ops;
struct plx_lock_wait;
struct plx_open_req;
struct plx_reclaim;
struct plx_vdi;
struct plx_wlog;

/* Every engine I/O is an event: the backend's completion only records the status and queues the
 * event; the service loop runs the handler afterwards, outside the backend's poll, so handlers
 * may submit (or even wait for) more I/O. */
struct plx_ev {
    struct plx_io io;
    int status;
    void (*handler)(struct plx_store *st, struct plx_ev *ev);
    void *ctx;
    struct plx_ev *next;
    uint64_t write_submit_ns; /* a write to the store: when it was submitted (else 0) */
};

/* A callback to run at the end of the current service pass, never inside the call that queued
 * it (how completions reach the caller of an asynchronous request). */
struct plx_deferred {
    void (*run)(struct plx_deferred *d);
    struct plx_deferred *next;
};

/* A deadline on the engine's clock (plx_mono_ns): run() is called from the first service pass
 * at or after at_ns. One-shot: run() may arm it again. The layers above ask the engine for a
 * wake-up this way (the write cache's deferred drain) instead of relying on their callers'
 * loops to poll them: every user of plx_store_fd() gets it. */
struct plx_timer {
    void (*run)(struct plx_timer *t);
    uint64_t at_ns; /* 0: not armed */
    struct plx_timer *next;
};

struct plx_store {
    /* The medium and what is known of it (system.c, alloc.c). */
    plx_backend *be;
    struct plx_superblock sb;
    struct plx_state_block state;
    struct plx_extent_entry *cat; /* extent catalogue, extent_count entries (alloc.c) */
    int read_only;
    /* Opened by plx_store_upgrade: a version-1 superblock is accepted, and the state block is
     * read whatever its version (state_v1 says which it was). */
    bool upgrading;
    bool state_v1;
    uint64_t seen_gc_epoch; /* state.gc_epoch when the cache was last known good */
    /* Called when a read of the state block finds that a collection freed blocks since (the
     * node cache registers it: cached nodes may describe blocks that were reused). */
    void (*gc_epoch_moved)(struct plx_store *st);

    /* Who we are, for locks and holders (lock.c). */
    uint64_t host_hash;
    uint32_t pid;
    uint64_t epoch;
    char host[64];
    const struct plx_lock_ops *lock_ops; /* lock.h */
    void *lock_state; /* the lock seam's implementation's own state (lock_lockd.c: its client) */
    /* Called at the start of every service pass (the lock manager's heartbeat). */
    void (*service_tick)(struct plx_store *st);
    unsigned admin_depth; /* nested plx_admin_lock calls: only the outermost locks */
    /* Waiting for the admin lock without blocking the loop (lock.c, plx_admin_lock_async): the
     * waiters in order, and the timer that asks again and hands a grant to the first. */
    struct plx_lock_wait *lock_waiters;
    struct plx_timer lock_timer;
    unsigned lock_backoff_us;
    struct plx_open_req *opens; /* asynchronous VDI opens not yet completed (vdi.c) */
    /* VDIs whose close could not clear their lock (vdi.c, plx_vdi_close_async): the record
     * names this store's identity, and this store may take the lock back at its next open. */
    uint64_t *locks_left;
    unsigned nlocks_left;
    const struct plx_fence_ops *fence_ops; /* the medium's fencing (backend.h), or NULL */
    bool fencing; /* our key is registered at the medium (plx_fence_join) */

    /* The event loop (engine.c). */
    int epoll_fd;                                       /* plx_store_fd(): backend, wake, timer */
    int wake_fd;                                        /* eventfd: callbacks are ready to run */
    struct plx_ev *ready_head, *ready_tail;             /* I/O completed, handler not yet run */
    struct plx_deferred *deferred_head, *deferred_tail; /* callbacks to run */
    struct plx_deferred *turn_head, *turn_tail;         /* plx_defer_turn: the next pass's */
    unsigned internal_ios;                              /* engine I/O in flight */
    uint64_t be_submits; /* I/Os handed to `be` (plx_submit): has the service pass more to reap? */
    bool in_service;     /* inside plx_store_service: completions need no wake */
    /* plx_store_will_service: the caller's loop services before it waits: no wake either */
    bool service_next;
    /* The host said it serves the store from a loop (plx_store_will_service, ever): layers
     * below keep their waits short (lock_lockd.c's ALIVE). */
    bool serving;
    bool wake_pending; /* wake_fd was written since plx_store_service last read it */
    uint64_t wakes;    /* writes to wake_fd (plx_wake): what a host's loop spares, for tests */
    /* Armed plx_timers, and the timerfd in the epoll set that makes plx_store_fd() readable
     * when the earliest is due: programmed for timer_fd_at (0: disarmed). It is moved only
     * earlier when a timer is armed (no system call for a later deadline); a wake-up for a
     * deadline that moved later programs it again. */
    struct plx_timer *timers;
    int timer_fd;
    uint64_t timer_fd_at;
    int fatal;   /* nonzero: the store stopped (negative errno) */
    bool fenced; /* lease lost: no I/O may reach the medium any more */
    char errmsg[512];

    /* The layers above, each owning its state. */
    struct plx_alloc *alloc;     /* alloc.c */
    struct plx_cache *cache;     /* cache.c */
    struct plx_vdi *vdis;        /* open VDI handles (vdi.c) */
    struct plx_wlog *wlog;       /* the write cache's log, or NULL (wlog.c) */
    struct plx_reclaim *reclaim; /* answering collectors in held extents, or NULL (reclaim.c) */
    /* A second medium the service loop polls beside `be`: the write log's local file. */
    plx_backend *side_be;
    /* The store's write latency as the engine sees it: an exponentially weighted mean (weight
     * 1/8) of submit-to-completion times of its writes to `be`, and when the last one was
     * sampled (monotonic ns; 0: none yet). The write cache's automatic mode reads it. */
    uint64_t write_lat_ns, write_lat_at_ns;
    /* Writes to `be` submitted through plx_submit and not yet completed: while there are none,
     * the store is idle and write_lat_ns says only what it was (plx_store_write_lat_now). */
    unsigned store_writes_inflight;
    /* Bytes of data copies the write cache's automatic mode keeps (wlog_pass.c). */
    uint64_t wpass_copy_bytes;
    /* $PARALLAX_SNAP_TRACE set: each snapshot prints where its time went (pipeline.c). */
    bool snap_trace;
    /* Snapshots, flushes and FUA writes submitted to the pipeline and not yet complete: while
     * there are any, the commits they wait for (the batches ahead of theirs included) and the
     * allocator's bitmap writes go to the medium as PLX_IO_URGENT (DESIGN.md, "Commit writes go
     * first"). */
    unsigned durable_waiters;
    /* Merged reads that failed and were read again without merging (pipeline.c,
     * read_retry_exact): their error may have been in a stale block they did not need. */
    uint64_t reads_retried;
};

/* Set the store's error message; returns err. */
int plx_err(plx_store *st, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Like plx_err for calls that have no store yet: the message goes to errbuf. */
void plx_set_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Create and release the event descriptors (epoll set: the backend's fd and the wake fd). */
int plx_engine_init(plx_store *st);
void plx_engine_free(plx_store *st);

/* Submit an engine I/O; ev->handler runs from the service loop when it completes. On a submit
 * error the handler never runs. */
int plx_submit(plx_store *st, struct plx_ev *ev);
/* The same on the side medium (st->side_be, the write log): completions run as above. */
int plx_submit_side(plx_store *st, struct plx_ev *ev);
/* The store's write latency as of now (ns): write_lat_ns, decayed while the store has been idle
 * (no write in flight) for more than a grace period, halving at every further such period.
 * With nothing written, the mean of the last slow spell would otherwise stand for good (the
 * write cache's automatic mode would never turn off); a new write's sample starts from the
 * decayed figure. */
uint64_t plx_store_write_lat_now(const plx_store *st);
/* Blocking wait for completions on the main medium: poll it, at most a quarter second at a time
 * when the store has a lock manager, and run the heartbeat between (a stalled target must not
 * cost the lease: lockd would give our VDIs away, and we would judge ourselves frozen). Returns
 * what the backend's poll returns. */
int plx_poll_medium(plx_store *st);
/* Blocking single I/O for admin paths: submit, then poll the backend until it completes. */
int plx_sync_io(plx_store *st, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                unsigned flags);
/* Queue d->run for the end of the current service pass (waking the loop if outside one). */
void plx_defer(plx_store *st, struct plx_deferred *d);
/* Queue d->run for the next service pass, not this one, and wake the loop: a long job (the
 * write log's drain) runs in steps with the loop's other work (a server's sockets) between. */
void plx_defer_turn(plx_store *st, struct plx_deferred *d);
void plx_wake(plx_store *st);
/* Arm t for at_ns (monotonic ns), or move it if armed; cancel it. Timers run from
 * plx_store_service, at its start (not from blocking internal waits). */
void plx_timer_arm(plx_store *st, struct plx_timer *t, uint64_t at_ns);
void plx_timer_cancel(plx_store *st, struct plx_timer *t);
/* Run the handlers of completed engine I/O (not deferred callbacks). */
void plx_run_ready(plx_store *st);
/* Blocking internal wait: poll and run I/O handlers until *flag is set. Deferred callbacks are
 * not run (they stay queued for the next plx_store_service), so admin paths may use this. */
int plx_drive_until(plx_store *st, const int *flag);
/* Blocking: poll the medium and run only the handlers `handler` of completed I/O until *busy
 * is false; other completions stay queued for the service loop (alloc.c: waiting for a claim
 * ahead from inside the I/O path without re-entering it). */
int plx_drive_handler_while(plx_store *st, void (*handler)(plx_store *st, struct plx_ev *ev),
                            const bool *busy);
/* Add fd to the set behind plx_store_fd(), so that its readiness wakes the host loop (which
 * then calls plx_store_service). */
int plx_engine_watch_fd(plx_store *st, int fd);
/* Take fd out of that set again (closing it does too). */
void plx_engine_unwatch_fd(plx_store *st, int fd);
/* Stop all further I/O to the medium for good: this process may no longer own what it holds
 * (its lease lapsed). Submissions fail with -ESTALE and the message from then on. */
void plx_fence(plx_store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Anything queued or in flight at this level (I/O, handlers, deferred callbacks)? */
bool plx_engine_busy(const plx_store *st);

#endif
