/*
 * backend_fault.h - a simulated medium for proving crash safety (test builds only).
 *
 * The fault backend is a memory medium with a volatile write cache. It records every event
 * (write submitted, write completed, flush submitted, flush completed, and markers placed by the
 * test) in a log, so that the medium as it could be after a power failure at any point of a
 * workload can be rebuilt afterwards: a "crash image". It also injects I/O errors.
 *
 * Durability model (what a real disk with a volatile cache promises):
 * - a write is durable once a flush that was submitted after the write completed has completed;
 * - a write submitted with PLX_IO_FUA is durable when it completes;
 * - any other write that was submitted before the crash point may or may not have reached the
 *   medium, independently of the others (the cache may reorder them); a 4 KiB block is written
 *   atomically (never torn).
 */
#ifndef PLX_BACKEND_FAULT_H
#define PLX_BACKEND_FAULT_H

#include "backend.h"

/* A fault backend whose initial contents are a copy of `initial` (a memory backend, not
 * consumed), or all zeros when initial is NULL (then nblocks gives the size). */
plx_backend *plx_fault_create(const plx_backend *initial, uint64_t nblocks);

/* ---- Error injection -------------------------------------------------------------------------- */

/* The n-th I/O submitted from now on (n >= 1; reads, writes and flushes all count) completes
 * with `err` (negative errno) without touching the medium. */
void plx_fault_fail_nth(plx_backend *be, uint64_t n, int err);
/* I/O of kind `op` touching any block in [first, first + count) fails with `err`; `times` is how
 * many failures to inject (-1 = forever). Several rules may be active. */
void plx_fault_fail_blocks(plx_backend *be, enum plx_io_op op, uint64_t first, uint64_t count,
                           int err, int times);
/* Remove every injection rule. */
void plx_fault_clear(plx_backend *be);
/* I/Os submitted so far (the n of plx_fault_fail_nth counts from here). */
uint64_t plx_fault_io_count(const plx_backend *be);
/* Errors injected so far. */
uint64_t plx_fault_errors_injected(const plx_backend *be);
/* Writes submitted with PLX_IO_URGENT (the engine's hint: a snapshot or flush waits for them). */
uint64_t plx_fault_urgent_writes(const plx_backend *be);
/* Writes (FUA ones among them) and flushes submitted so far that reached the medium's log. */
void plx_fault_counts(const plx_backend *be, uint64_t *writes, uint64_t *fua_writes,
                      uint64_t *flushes);

/* ---- Holding I/O ---------------------------------------------------------------------------- */

/* I/O of kind `op` touching [first, first + count) submitted from now on stays in flight (not
 * carried out, not completed) until plx_fault_release. A poll that waits (timeout != 0) while
 * only held I/O is left carries it out once it has been held max_ms: code that blocks on held
 * I/O is delayed by max_ms instead of hanging, which a test can tell from asynchronous code. */
void plx_fault_hold_blocks(plx_backend *be, enum plx_io_op op, uint64_t first, uint64_t count,
                           int max_ms);
/* Stop holding; every held I/O is carried out and completed at the next poll. */
void plx_fault_release(plx_backend *be);
/* I/Os held right now. */
unsigned plx_fault_held(const plx_backend *be);

/* ---- Event log and crash images --------------------------------------------------------------- */

/* Current length of the event log. A crash "at position p" means: everything logged before p
 * happened, nothing after it did. Tests record positions (for example right after a flush they
 * issued has completed) to know which writes must survive a crash at a later position. */
uint64_t plx_fault_log_position(const plx_backend *be);

enum plx_crash_mode {
    PLX_CRASH_DROP_UNFLUSHED = 0, /* only the durable writes reach the medium */
    PLX_CRASH_KEEP_ALL = 1,       /* every write submitted before the crash reached it */
    PLX_CRASH_RANDOM = 2,         /* each non-durable write reached it with probability 1/2 */
};

/* A cursor walks crash positions in increasing order, keeping the durable image up to date
 * incrementally, so that thousands of crash images cost little. */
struct plx_crash_cursor;
struct plx_crash_cursor *plx_crash_cursor_new(const plx_backend *fault);
void plx_crash_cursor_free(struct plx_crash_cursor *c);
/* Move to position pos (>= the current one, <= the log length). */
void plx_crash_cursor_seek(struct plx_crash_cursor *c, uint64_t pos);
/* Number of writes submitted before the cursor position that are not durable there. */
uint64_t plx_crash_cursor_pending(const struct plx_crash_cursor *c);
/* A new memory backend holding the medium after a crash at the cursor position. For
 * PLX_CRASH_RANDOM, `seed` picks the subset. Blocks are shared copy-on-write with the cursor,
 * so the image is cheap and may be opened and written freely. Caller destroys it. */
plx_backend *plx_crash_cursor_image(struct plx_crash_cursor *c, enum plx_crash_mode mode,
                                    uint64_t seed);

/* Positions in the log at which a crash is interesting: just after each write or flush was
 * submitted or completed. Fills at most max entries; returns the total count. */
uint64_t plx_fault_crash_points(const plx_backend *be, uint64_t *out, uint64_t max);

/* Crash points around every write touching [first, first + count): just before and just after
 * its submission, after its completion, and after the submission and the completion of the
 * first flush submitted after it completed (the steps of an ordered update such as an extent
 * claim's catalogue entry). Fills at most max entries; returns the total count. */
uint64_t plx_fault_points_near_writes(const plx_backend *be, uint64_t first, uint64_t count,
                                      uint64_t *out, uint64_t max);

#endif
