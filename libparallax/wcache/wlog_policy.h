/*
 * wlog_policy.h - the write cache's policy in one place: when the drain runs and how much it
 * moves at once, which records skip the copy, how much the automatic mode keeps and when it
 * switches (layer 6; wlog_policy.c).
 *
 * What a log or a test may set differently is in struct plx_wlog_policy, its defaults in
 * wlog_policy.c (plx_wlog_policy_init, with the environment's overrides); each log keeps its
 * copy from attach (wl->pol), and the automatic mode (wcache_auto.c) reads it through
 * plx_wlog_policy(). The limits below the struct are fixed when the library is built: they size
 * arrays and buffers. docs/DESIGN.md, "The write cache", says why each value is what it is.
 */
#ifndef PLX_WLOG_POLICY_H
#define PLX_WLOG_POLICY_H

#include <stddef.h>
#include <stdint.h>

struct plx_wlog_policy {
    /* The deferred drain (drain_defer): it starts once no record has been appended for
     * drain_delay_ns, or its oldest record is drain_max_age_ns old, or the log is half full, or
     * someone waits for it. $PARALLAX_WCACHE_DRAIN_DELAY_MS and $PARALLAX_WCACHE_DRAIN_MAX_AGE_MS
     * override them (0: drain at once). */
    uint64_t drain_delay_ns, drain_max_age_ns;
    /* A record of at least this many blocks whose data lies in the writer's buffer aligned as
     * the log medium's O_DIRECT needs (plx_backend_dio_align: 512 bytes on ext4 over a disk of
     * 512-byte sectors, where tapdisk's buffers lie 512 bytes past a page boundary) is not
     * copied into its batch: the batch is written in pieces, that record straight from the
     * writer's buffer and past the page cache (PLX_IO_DIRECT), the header and the copied records
     * through it. Smaller writes keep the page cache, where a QD1 write completes without
     * waiting for the disk. $PARALLAX_WCACHE_ZC_MIN (blocks, 0 = never) overrides it:
     * measurements, and the crash harness, whose writes are smaller. */
    uint32_t zc_min;
    /* Bytes of data copies the automatic mode keeps per store for the writes it passes to the
     * pipeline with the cache off (wlog_pass.c): past that a write goes without a copy, and
     * turning the cache on cannot put it in the log. */
    uint64_t pass_copy_max;
    /* The automatic mode (wcache_auto.c): its threshold when the caller gives none (on_ms;
     * off_ms is half of it), its hold time, and the backlog that counts as drained: a guest
     * that keeps writing keeps a few records in the log at any moment, so "drained" means at
     * most this many, which a fast store drains in a few ms. */
    double auto_on_ms;
    unsigned auto_hold_ms;
    uint64_t auto_off_max_backlog;
};

/* The defaults, with the environment's overrides applied. */
void plx_wlog_policy_init(struct plx_wlog_policy *p);

/* Limits fixed at build time. */
#define MAX_DATA 256u /* data blocks per batch (1 MiB) */
#define MAX_FLYING 4u /* batch writes in flight */
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

#endif
