/*
 * wlog.h - the write cache: a per-host write log on local disk (layer 6, below vdi.c and above
 * vdi_io.c; wlog.c and the files wlog_shared.h lists; plx_wlog_attach is wlog_attach.c's,
 * layer 7).
 *
 * With the cache on for a VDI, its writes and trims complete when their records are written to
 * the log (a ring on a local file, docs/FORMAT.md §12), a flush when every record acknowledged
 * before it is durable there, and reads see the newest data through an index in memory. A drain
 * moves the records into the store through the normal pipeline in log order, with a store flush
 * wherever the guest flushed in between, and the log's tail advances only past records the store
 * has made durable. Replay at attach re-applies what the tail had not passed. docs/DESIGN.md,
 * "The write cache", explains the design.
 */
#ifndef PLX_WLOG_H
#define PLX_WLOG_H

#include "pipeline.h"

/* Attach the log on `be` (the store takes it; destroyed at detach or on failure). A fresh log
 * (all zero header) is initialised for this store and host when `init` is set; an existing one
 * must belong to this store and host, and its records past the tail are replayed into their
 * VDIs (only those whose record still names this log) before this returns. `desc` names the
 * log in messages. Blocking. */
/* Open the log and replay it (wlog_attach.c; the layer above the write log and blocking.c). */
int plx_wlog_attach(plx_store *st, plx_backend *be, int init, const char *desc);

/* What wlog_attach.c is built from (wlog_open.c, wlog_cursor.c): open without
 * replaying; read the batches past the tail in order; restart the log after the last one
 * applied; or give the log up. */
int plx_wlog_open(plx_store *st, plx_backend *be, int init, const char *desc);
/* The head block of a new, empty log of nblocks for this store and host (sealed). */
void plx_wlog_head_init(const plx_store *st, void *block, uint64_t nblocks);
struct plx_wlog_cursor {
    uint64_t pos, seq; /* the batch to read next */
    uint8_t *hb;       /* its header block (struct plx_wlog_batch), after a read */
    uint8_t *data;     /* its data, entry after entry */
};
int plx_wlog_cursor_open(plx_store *st, struct plx_wlog_cursor *c);
bool plx_wlog_cursor_read(plx_store *st, struct plx_wlog_cursor *c);
void plx_wlog_cursor_step(struct plx_wlog_cursor *c);
void plx_wlog_cursor_close(struct plx_wlog_cursor *c);
int plx_wlog_restart_at(plx_store *st, const struct plx_wlog_cursor *c, uint64_t replayed);
void plx_wlog_abandon(plx_store *st);
uint64_t plx_wlog_id(const plx_store *st);
const char *plx_wlog_desc(const plx_store *st);
/* Drain everything, then detach the log (store close). Blocking. */
int plx_wlog_close(plx_store *st);

/* Turn the cache on for a writable VDI (the record then names this log; when it names it
 * already, bound by plx_wlog_vdi_bind, this writes nothing and never blocks) or off (waits until
 * its records are drained, then clears the record). Blocking. Turning on while a
 * plx_wlog_vdi_try_detach is under way calls that off. */
int plx_wlog_vdi_enable(struct plx_vdi *v);
int plx_wlog_vdi_disable(struct plx_vdi *v);
/* Write the record of v naming this log, with the cache still off (the automatic mode, so that
 * turning on later needs no store write). Close or disable clears it. Blocking. */
int plx_wlog_vdi_bind(struct plx_vdi *v);
/* Turn the cache off for v without waiting: new requests of v are held from now on, its
 * records drain, and the moment the last one is in the store the log lets go of v (from the
 * service loop) and the held requests go to the pipeline in order. Returns 0 when that is done
 * already, -EAGAIN while it is under way, or a drain error. The record is left as it is. */
int plx_wlog_vdi_try_detach(struct plx_vdi *v);
/* True while v's cache is being turned off (a detach under way). */
bool plx_wlog_vdi_detaching(const struct plx_vdi *v);
/* What close does: wait until the VDI's records are drained and turn the cache off, leaving the
 * record to the caller (close writes it anyway). On failure the records stay in the log and
 * the record keeps naming it. Blocking. */
int plx_wlog_vdi_detach(struct plx_vdi *v);
/* The first step of detach without its wait: start draining v's records (the drain runs even if
 * held, and a gathering batch holding a record of v is sealed). True while records of v, or
 * requests queued behind them, are left: detach would wait. Never blocks. */
bool plx_wlog_vdi_draining(struct plx_vdi *v);
/* Someone waits for v's records to be in the store (on), or no longer (off): while on and v
 * has records, the drain is not deferred (wlog_drain.c, drain_defer). The automatic mode uses it
 * once the store is fast again, so that the VDI's backlog can drain before it turns the cache off.
 * Cleared when v's last record is drained. Never blocks. */
void plx_wlog_vdi_hurry(struct plx_vdi *v, int on);
/* Records of v (cache on) appended to the log and not yet drained; 0 with the cache off. */
uint64_t plx_wlog_vdi_backlog(const struct plx_vdi *v);

/* The VDI's entry points while its cache is on (vdi.c routes them here). */
int plx_wlog_submit_read(struct plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                         void *arg);
int plx_wlog_submit_write(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                          unsigned flags, plx_done_fn cb, void *arg);
int plx_wlog_submit_flush(struct plx_vdi *v, plx_done_fn cb, void *arg);
/* A write of a VDI in the automatic mode with the cache off: to the pipeline, tracked until it
 * completes. If the cache turns on meanwhile, the write is put in the log too and completes
 * when its record is written there: a burst that meets a slow store does not wait for the
 * writes it queued to the store before the switch. */
int plx_wlog_submit_passthrough(struct plx_vdi *v, const void *buf, uint64_t off, size_t len,
                                unsigned flags, plx_done_fn cb, void *arg);
/* The same VDI's flush (the pipeline's): the tracked writes it covers are dropped. */
int plx_wlog_pass_flush(struct plx_vdi *v, plx_done_fn cb, void *arg);
/* A trim or snapshot of v went to the pipeline: the tracked writes before it are dropped. */
void plx_wlog_pass_untracked(struct plx_vdi *v);
/* Drop every tracked write of v (close, or the automatic mode left; the pipeline idle). */
void plx_wlog_pass_forget(struct plx_vdi *v);
int plx_wlog_submit_trim(struct plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg);
int plx_wlog_submit_snapshot(struct plx_vdi *v, const char *label, uint64_t *index_out,
                             plx_done_fn cb, void *arg);
/* Block status: blocks with records in the log are mapped; *len is cut before the first such
 * block when the range starts outside them (the caller asks the store about that part).
 * Returns 1 (mapped, *len set to the run) or 0 (ask the store about *len bytes). */
int plx_wlog_block_status(struct plx_vdi *v, uint64_t off, uint64_t *len);

/* Is VDI record `rec` free of another log's undrained writes (0), or -EBUSY with a message? */
int plx_wlog_check_owner(plx_store *st, const struct plx_vdi_record *rec);

/* The log stays locked (flock) while attached: keep this descriptor, closed at detach. */
void plx_wlog_keep_fd(plx_store *st, int fd);

/* What the drain is doing: nothing to drain (idle); a round under way (running); deferred while
 * guests write (drain_defer: idle window, max age, half the log); held (paused); it starts as
 * soon as a batch is written (eager: the policy is off, or the log failed); or it stopped at an
 * error (stopped: the records stay in the log, error says why). */
enum plx_wlog_drain_state {
    PLX_WLOG_DRAIN_IDLE,
    PLX_WLOG_DRAIN_RUNNING,
    PLX_WLOG_DRAIN_DEFERRED,
    PLX_WLOG_DRAIN_PAUSED,
    PLX_WLOG_DRAIN_EAGER,
    PLX_WLOG_DRAIN_STOPPED,
};
/* Counters for `parallax cache status`. */
struct plx_wlog_stats {
    int attached;
    int failed; /* the log failed: writes go through to the store */
    uint64_t log_bytes, used_bytes, backlog_records, backlog_bytes;
    uint64_t drained_bytes; /* since attach */
    uint64_t attach_ns;
    uint64_t replayed_records; /* by the replay at attach */
    uint64_t logged_bytes;     /* data written to the log since attach */
    uint64_t zc_bytes; /* of it, written from the writers' buffers (zc_min, wlog_policy.h) */
    uint64_t zc_records;       /* and the records those bytes were */
    /* The drain: what it is doing (enum plx_wlog_drain_state), its idle window and max age
     * (0: it never defers), and how old the oldest record not yet released is. */
    int drain;
    uint64_t drain_delay_ms, drain_max_age_ms, oldest_ms;
    char desc[128];
    char error[256];
};
void plx_wlog_stats(const plx_store *st, struct plx_wlog_stats *out);
/* Hold the drain (pause != 0) or let it go on: the log fills, writers wait once it is full. For
 * tests (a crash with everything in the log) and for an operator who wants the shared store
 * left alone for a while. */
void plx_wlog_pause_drain(plx_store *st, int pause);

/* The settings of the attached log (wlog_policy.h; st->wlog must be set). */
struct plx_wlog_policy;
const struct plx_wlog_policy *plx_wlog_policy(const plx_store *st);

#endif
