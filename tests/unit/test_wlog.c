/*
 * test_wlog.c - the write cache (libparallax/wcache/wlog.c): a per-host write log on local disk.
 *
 * Stores and logs live on memory media (kept across close and reopen), or on the fault backend
 * for crash images and injected errors. Every test compares what the VDI reads against a shadow
 * copy of what was written:
 * - writes (aligned and sub-block, many in flight) read back through the log and, after the
 *   drain, from the store alone; the ring wraps many times (a log of the smallest size);
 * - a crash (the durable image of both media) then replay at attach: every flushed write is
 *   there, and the store is clean;
 * - ownership: a VDI whose record names a log is refused to any process without that log, with
 *   a message naming the way out; a log of another store or host is refused;
 * - snapshots taken with the cache on hold every write acknowledged before them, none after;
 * - EIO on the log: writes go through to the store, nothing acknowledged is lost;
 * - bad input: a log too small for one batch, a file that is not a log;
 * - plx_vdi_try_close does not wait for the drain (a server's other VDIs go on meanwhile);
 * - the deferred drain (test_drain_*): the engine's timer alone starts it after the idle
 *   window, the max age bounds it under a trickle, and every way of waiting for it (close,
 *   try_close, try_detach, disable, a trim or snapshot, a full or failed log, the automatic
 *   mode turning off) gets it at once with an idle window and max age of ten minutes.
 * The first four run twice: as they are (writes from unaligned buffers, all copied into their
 * batches) and with block-aligned buffers and $PARALLAX_WCACHE_ZC_MIN=8, so that records of 8
 * blocks and more are written from the writer's buffer in a batch written in pieces (zc_mode).
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "backend_fault.h"
#include "engine.h"
#include "format.h"
#include "parallax.h"
#include "pipeline.h"
#include "testutil.h"
#include "wlog.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define STORE_BLOCKS (64 * MiB / BS)
#define VDI_BYTES (8 * MiB)
#define LOG_BLOCKS 1024 /* 4 MiB: twice the smallest log, so the ring wraps often */

static plx_backend *new_store_medium(void)
{
    plx_backend *mem = plx_backend_mem_create(STORE_BLOCKS);
    char err[256] = "";
    int rc = plx_format_backend(mem, MiB, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %s", err);
    return mem;
}

static plx_store *open_store(plx_backend *medium, const char *host)
{
    struct plx_open_opts o = {.struct_size = sizeof o, .host = host};
    plx_store *st = NULL;
    char err[256] = "";
    int rc = plx_store_open_backend(tu_keep_wrap(medium), &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open store: %d %s", rc, err);
    return st;
}

/* Loop tests: _i 1 writes from block-aligned buffers, and the log writes records of 8 blocks
 * and more straight from them (wlog.c, ZC_MIN). */
static bool g_zc;

static void zc_mode(int i)
{
    g_zc = i == 1;
    if (g_zc)
        setenv("PARALLAX_WCACHE_ZC_MIN", "8", 1);
    else
        unsetenv("PARALLAX_WCACHE_ZC_MIN");
}

/* In zc_mode, records were written from the writers' buffers. */
static void check_zc(plx_store *st)
{
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    if (g_zc)
        ck_assert_uint_gt(ws.zc_bytes, 0);
    else
        ck_assert_uint_eq(ws.zc_bytes, 0);
}

static int attach(plx_store *st, plx_backend *log_medium, int init)
{
    return plx_wlog_attach(st, tu_keep_wrap(log_medium), init, "test-log");
}

/* ---- A random asynchronous workload against a shadow copy ------------------------------------- */

struct shadow {
    uint8_t *bytes;         /* what the VDI must read */
    uint8_t *busy;          /* per block: a write in flight covers it */
    unsigned inflight;
    unsigned failed;
    uint64_t rng;
    unsigned read_pct, trim_pct; /* of the operations run_writes submits */
};

struct wctx {
    struct shadow *sh;
    uint64_t b0, b1;
    void *buf;
};

static void write_done(void *arg, int status)
{
    struct wctx *c = arg;
    if (status)
        c->sh->failed++;
    for (uint64_t b = c->b0; b < c->b1; b++)
        c->sh->busy[b] = 0;
    c->sh->inflight--;
    free(c->buf);
    free(c);
}

static void flush_done(void *arg, int status)
{
    struct shadow *sh = arg;
    if (status)
        sh->failed++;
    sh->inflight--;
}

/* Submit one write of a random range (sub-block when `unaligned`), not overlapping any write in
 * flight, and copy it into the shadow. */
static void random_write(plx_vdi *v, struct shadow *sh, bool unaligned, unsigned max_blocks)
{
    uint64_t nblocks = VDI_BYTES / BS;
    for (int tries = 0; tries < 100; tries++) {
        uint64_t b0 = tu_rand(&sh->rng) % nblocks;
        uint64_t n = 1 + tu_rand(&sh->rng) % max_blocks;
        if (b0 + n > nblocks)
            n = nblocks - b0;
        uint64_t off = b0 * BS, len = n * BS;
        if (unaligned) {
            off += tu_rand(&sh->rng) % BS;
            len = 1 + tu_rand(&sh->rng) % (n * BS - (off - b0 * BS));
        }
        uint64_t e0 = off / BS, e1 = (off + len + BS - 1) / BS;
        bool free_range = true;
        for (uint64_t b = e0; b < e1; b++)
            if (sh->busy[b])
                free_range = false;
        if (!free_range)
            continue;
        struct wctx *c = calloc(1, sizeof *c);
        c->sh = sh;
        c->b0 = e0;
        c->b1 = e1;
        c->buf = g_zc ? aligned_alloc(BS, (len + BS - 1) / BS * BS) : malloc(len);
        tu_fill(c->buf, len, tu_rand(&sh->rng));
        memcpy(sh->bytes + off, c->buf, len);
        for (uint64_t b = e0; b < e1; b++)
            sh->busy[b] = 1;
        sh->inflight++;
        unsigned flags = tu_rand(&sh->rng) % 16 == 0 ? PLX_WRITE_FUA : 0;
        int rc = plx_vdi_submit_write(v, c->buf, off, len, flags, write_done, c);
        ck_assert_msg(rc == 0, "submit write: %d", rc);
        return;
    }
}

static void wait_all(plx_store *st, struct shadow *sh)
{
    while (sh->inflight) {
        int rc = plx_store_service(st);
        ck_assert_msg(rc >= 0, "service: %d %s", rc, plx_store_errmsg(st));
        if (!sh->inflight)
            break;
        ck_assert_msg(plx_store_busy(st), "%u requests in flight but the store is idle",
                      sh->inflight);
        usleep(100);
    }
}

/* A read of blocks no write in flight covers: it must return what the shadow held when it was
 * submitted. */
struct rctx {
    struct shadow *sh;
    uint64_t off, len;
    uint8_t *buf, *expect;
};

static void read_done(void *arg, int status)
{
    struct rctx *c = arg;
    ck_assert_int_eq(status, 0);
    for (uint64_t o = 0; o < c->len; o += BS)
        ck_assert_msg(memcmp(c->buf + o, c->expect + o, BS) == 0,
                      "a read of block %llu returned other data than was last written",
                      (unsigned long long)((c->off + o) / BS));
    c->sh->inflight--;
    free(c->buf);
    free(c->expect);
    free(c);
}

static void random_read(plx_vdi *v, struct shadow *sh)
{
    uint64_t b0 = tu_rand(&sh->rng) % (VDI_BYTES / BS - 16), n = 1 + tu_rand(&sh->rng) % 16;
    for (uint64_t b = b0; b < b0 + n; b++)
        if (sh->busy[b])
            return;
    struct rctx *c = calloc(1, sizeof *c);
    c->sh = sh;
    c->off = b0 * BS;
    c->len = n * BS;
    c->buf = malloc(c->len);
    c->expect = malloc(c->len);
    memcpy(c->expect, sh->bytes + c->off, c->len);
    sh->inflight++;
    ck_assert_int_eq(plx_vdi_submit_read(v, c->buf, c->off, c->len, read_done, c), 0);
}

/* A trim of a range no write covers: the shadow holds zeros there from now on. */
static void random_trim(plx_vdi *v, struct shadow *sh)
{
    uint64_t b0 = tu_rand(&sh->rng) % (VDI_BYTES / BS - 8), n = 1 + tu_rand(&sh->rng) % 8;
    for (uint64_t b = b0; b < b0 + n; b++)
        if (sh->busy[b])
            return;
    struct wctx *c = calloc(1, sizeof *c);
    c->sh = sh;
    c->b0 = b0;
    c->b1 = b0 + n;
    memset(sh->bytes + b0 * BS, 0, n * BS);
    for (uint64_t b = b0; b < b0 + n; b++)
        sh->busy[b] = 1;
    sh->inflight++;
    ck_assert_int_eq(plx_vdi_submit_trim(v, b0 * BS, n * BS, write_done, c), 0);
}

static void run_writes(plx_store *st, plx_vdi *v, struct shadow *sh, unsigned nops,
                       unsigned qd, unsigned unaligned_pct, unsigned flush_pct)
{
    for (unsigned i = 0; i < nops; i++) {
        while (sh->inflight >= qd) {
            int rc = plx_store_service(st);
            ck_assert_msg(rc >= 0, "service: %d %s", rc, plx_store_errmsg(st));
            if (sh->inflight >= qd)
                usleep(50);
        }
        unsigned dice = (unsigned)(tu_rand(&sh->rng) % 100);
        if (sh->read_pct && dice >= 100 - sh->read_pct) {
            random_read(v, sh);
        } else if (sh->trim_pct && dice >= 100 - sh->read_pct - sh->trim_pct) {
            random_trim(v, sh);
        } else if (dice < flush_pct) {
            sh->inflight++;
            ck_assert_int_eq(plx_vdi_submit_flush(v, flush_done, sh), 0);
        } else {
            random_write(v, sh, dice < flush_pct + unaligned_pct, 24);
        }
    }
    wait_all(st, sh);
}

static void shadow_init(struct shadow *sh, uint64_t seed)
{
    memset(sh, 0, sizeof *sh);
    sh->bytes = calloc(1, VDI_BYTES);
    sh->busy = calloc(1, VDI_BYTES / BS);
    sh->rng = seed;
}

static void shadow_free(struct shadow *sh)
{
    free(sh->bytes);
    free(sh->busy);
}

/* The whole VDI reads as the shadow. */
static void verify(plx_vdi *v, const struct shadow *sh, const char *when)
{
    uint8_t *buf = plx_block_alloc(VDI_BYTES / BS);
    int rc = plx_vdi_pread(v, buf, 0, VDI_BYTES);
    ck_assert_msg(rc == 0, "%s: read: %d", when, rc);
    for (uint64_t b = 0; b < VDI_BYTES / BS; b++)
        ck_assert_msg(memcmp(buf + b * BS, sh->bytes + b * BS, BS) == 0,
                      "%s: block %llu differs from what was written", when,
                      (unsigned long long)b);
    plx_block_free(buf);
}

static void check_clean(plx_store *st)
{
    struct plx_check_report rep;
    ck_assert_int_eq(plx_check(st, &rep, NULL, NULL), 0);
    ck_assert_msg(rep.errors == 0, "check found %llu errors", (unsigned long long)rep.errors);
}

/* ---- Tests ----------------------------------------------------------------------------------- */

static void int_done(void *arg, int status)
{
    ck_assert_int_eq(status, 0);
    *(int *)arg = 1;
}

/* The log medium of loop test _i: memory, or (_i 2) a file through the page cache as
 * wlog_file.c opens it, whose small records complete inside submit (backend.h, PLX_IO_INLINE). */
static plx_backend *log_medium(int i)
{
    if (i != 2)
        return plx_backend_mem_create(LOG_BLOCKS);
    char path[512];
    snprintf(path, sizeof path, "%s/wlog-file-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)LOG_BLOCKS * BS), 0);
    close(fd);
    int err = 0;
    char msg[256] = "";
    plx_backend *be = plx_backend_file_open(path, PLX_BACKEND_BUFFERED, &err, msg, sizeof msg);
    ck_assert_msg(be != NULL, "%s", msg);
    unlink(path);
    return be;
}

START_TEST(test_cached_writes_read_back_and_drain)
{
    zc_mode(_i);
    plx_backend *smem = new_store_medium();
    plx_backend *lmem = log_medium(_i);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    struct shadow sh;
    shadow_init(&sh, 42);
    /* About 3 log sizes of data: the ring wraps while writers wait for the drain. */
    run_writes(st, v, &sh, 600, 32, 20, 5);
    check_zc(st);
    /* Blocking writes wait on plx_store_fd(): a record done inside submit, outside a service
     * pass and without plx_store_will_service, must still wake it. */
    uint8_t *one = plx_block_alloc(1);
    /* The same asynchronously: the descriptor says when to service (parallax.h's contract). */
    for (unsigned i = 0; i < 8; i++) {
        tu_fill(one, BS, 2000 + i);
        int done = 0;
        ck_assert_int_eq(
            plx_vdi_submit_write(v, one, (uint64_t)(60 + i) * BS, BS, 0, int_done, &done), 0);
        memcpy(sh.bytes + (60 + i) * BS, one, BS);
        while (!done) {
            struct pollfd pfd = {.fd = plx_store_fd(st), .events = POLLIN};
            ck_assert_msg(poll(&pfd, 1, 5000) == 1, "write %u: nothing to service in 5 s", i);
            ck_assert_int_ge(plx_store_service(st), 0);
        }
    }
    for (unsigned i = 0; i < 8; i++) {
        tu_fill(one, BS, 1000 + i);
        ck_assert_int_eq(plx_vdi_pwrite(v, one, (uint64_t)(40 + i) * BS, BS, 0), 0);
        memcpy(sh.bytes + (40 + i) * BS, one, BS);
    }
    plx_block_free(one);
    ck_assert_uint_eq(sh.failed, 0);
    verify(v, &sh, "through the cache");
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    ck_assert_int_eq(ws.attached, 1);
    ck_assert_int_eq(ws.failed, 0);
    ck_assert_uint_gt(ws.drained_bytes, (uint64_t)LOG_BLOCKS * BS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* The store alone (no log) holds everything, and the record names no log any more. */
    st = open_store(smem, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "from the store after the drain");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* Crash: both media as a power failure at the end would leave them (only durable writes). */
static plx_backend *durable_image(plx_backend *fault)
{
    struct plx_crash_cursor *c = plx_crash_cursor_new(fault);
    plx_crash_cursor_seek(c, plx_fault_log_position(fault));
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    plx_crash_cursor_free(c);
    return img;
}

START_TEST(test_replay_after_crash)
{
    zc_mode(_i);
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lfault = plx_fault_create(NULL, LOG_BLOCKS);
    smem->ops->destroy(smem);
    plx_store *st = open_store(sfault, "host-a");
    /* This engine plays a process that crashes: its locks name a start time no process has,
     * so the next process on host-a finds them stale. */
    st->epoch ^= 0x5a5a5a;
    ck_assert_int_eq(attach(st, lfault, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    struct shadow sh;
    shadow_init(&sh, 7);
    run_writes(st, v, &sh, 150, 16, 20, 0);
    /* The second half stays in the log: a crash leaves it only there. */
    plx_wlog_pause_drain(st, 1);
    run_writes(st, v, &sh, 40, 16, 20, 0);
    check_zc(st);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    /* Everything is acknowledged and flushed: a crash now loses none of it, whatever the drain
     * has done. Both images are taken before anything else happens. */
    plx_backend *simg = durable_image(sfault);
    plx_backend *limg = durable_image(lfault);
    plx_wlog_pause_drain(st, 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Another host cannot open the VDI for writing: the log holds writes of it. Reading is
     * allowed (it sees an older state). */
    st = open_store(simg, "host-b");
    int rc = plx_vdi_open(st, "vm", 0, &v);
    ck_assert_int_eq(rc, -EBUSY);
    ck_assert_msg(strstr(plx_store_errmsg(st), "cache discard") != NULL, "message: %s",
                  plx_store_errmsg(st));
    /* ... nor can it attach the log: it is host-a's. */
    rc = attach(st, limg, 1);
    ck_assert_int_eq(rc, -EPERM);
    ck_assert_msg(strstr(plx_store_errmsg(st), "belongs to host host-a") != NULL, "message: %s",
                  plx_store_errmsg(st));
    ck_assert_int_eq(plx_store_close(st), 0);

    /* The same process on host-a without its log: refused too. */
    st = open_store(simg, "host-a");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), -EBUSY);
    /* With the log: replayed at attach, then the VDI opens and reads everything. */
    ck_assert_int_eq(attach(st, limg, 0), 0);
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    ck_assert_uint_gt(ws.replayed_records, 0);
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "after replay");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* After replay the record is free: host-b opens it and sees the same. */
    st = open_store(simg, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "on another host after replay");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    shadow_free(&sh);
    simg->ops->destroy(simg);
    limg->ops->destroy(limg);
    sfault->ops->destroy(sfault);
    lfault->ops->destroy(lfault);
}
END_TEST

/* A large record from a buffer aligned to the log medium's O_DIRECT alignment but not to a page
 * (tapdisk's: posix_memalign(512)) is written from that buffer (wlog.c, ZC_MIN;
 * plx_backend_dio_align), one aligned to less is copied, and both replay after a crash. The log
 * is a file opened as wlog_file.c opens it, on a filesystem whose O_DIRECT takes 512-byte
 * aligned memory (ext4 on 512-byte sectors; statx STATX_DIOALIGN): elsewhere the test says so
 * and fails rather than pass unexercised. */
static plx_backend *file_log(const char *path, int create)
{
    if (create) {
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)LOG_BLOCKS * BS), 0);
        close(fd);
    }
    int err = 0;
    char msg[256] = "";
    plx_backend *be = plx_backend_file_open(path, PLX_BACKEND_BUFFERED, &err, msg, sizeof msg);
    ck_assert_msg(be != NULL, "%s", msg);
    return be;
}

/* A writer that allocates each request's buffer and frees it once answered, as tapdisk's NBD
 * server does (posix_memalign(512, len) per request): what the log keeps per record until it
 * is drained (its batch, the batch's records, index entries) must not come from malloc, or it
 * lands in those freed buffers, the next buffer no longer fits, and the heap grows by a fresh
 * 1 MiB per write (a fresh tapdisk's first burst: 200,000 page faults, bench/notes/wcache.md). Here
 * the writer's buffers come from mmap, so the heap holds only what the log keeps: after 40
 * writes of 1 MiB with the drain held, some 3.3 KiB a record before slab.c (127 KiB), only the
 * index's table since. (Under AddressSanitizer slabs are plain calloc and mallinfo2 does not
 * see ASan's heap: there the check holds either way.) */
START_TEST(test_records_keep_nothing_on_the_heap)
{
    enum { WRITES = 40, WARM = 4 };
    /* A log file (a memory medium would itself take a malloc per block written), with its own
     * O_DIRECT alignment: 512-byte buffers take the no-copy path, as tapdisk's do. */
    char path[512];
    snprintf(path, sizeof path, "%.400s/wlog-heap-%d", tu_tmpdir(), (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)(2 * WRITES * MiB)), 0);
    close(fd);
    int err = 0;
    char msg[256] = "";
    plx_backend *log = plx_backend_file_open(path, PLX_BACKEND_BUFFERED, &err, msg, sizeof msg);
    ck_assert_msg(log != NULL, "%s", msg);
    plx_backend *smem = new_store_medium();
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(plx_wlog_attach(st, log, 1, "heap-log"), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", WRITES * MiB, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    plx_wlog_pause_drain(st, 1);
    uint8_t *buf = mmap(NULL, MiB + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    ck_assert(buf != MAP_FAILED);
    size_t held = 0;
    for (int i = 0; i < WRITES; i++) {
        if (i == WARM)
            held = mallinfo2().uordblks;
        memset(buf + 512, i + 1, MiB);
        ck_assert_int_eq(plx_vdi_pwrite(v, buf + 512, (uint64_t)i * MiB, MiB, 0), 0);
    }
    size_t grown = mallinfo2().uordblks - held;
    ck_assert_msg(grown < 64 * 1024, "%d records hold %zu KiB of the heap", WRITES - WARM,
                  grown >> 10);
    struct plx_wcache_drain d = {.struct_size = sizeof d};
    ck_assert_int_eq(plx_wcache_drain_status(st, &d), 0);
    ck_assert_uint_eq(d.zc_records, WRITES); /* (the path tapdisk's writes take) */
    munmap(buf, MiB + 4096);
    plx_wlog_pause_drain(st, 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    smem->ops->destroy(smem);
    unlink(path);
}
END_TEST

START_TEST(test_zc_from_a_sector_aligned_buffer)
{
    unsetenv("PARALLAX_WCACHE_ZC_MIN"); /* the default: records of 256 KiB and more */
    char path[512], copy[512];
    snprintf(path, sizeof path, "%.400s/wlog-zc-%d", tu_tmpdir(), (int)getpid());
    snprintf(copy, sizeof copy, "%.400s/wlog-zc-%d.crash", tu_tmpdir(), (int)getpid());
    plx_backend *log = file_log(path, 1);
    ck_assert_msg(plx_backend_dio_align(log) == 512,
                  "%s: O_DIRECT memory alignment %zu, this test needs 512", tu_tmpdir(),
                  plx_backend_dio_align(log));
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    smem->ops->destroy(smem);
    plx_store *st = open_store(sfault, "host-a");
    st->epoch ^= 0x5a5a5a; /* a process that crashes (test_replay_after_crash) */
    ck_assert_int_eq(plx_wlog_attach(st, log, 1, "zc-log"), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    plx_wlog_pause_drain(st, 1);
    struct shadow sh;
    shadow_init(&sh, 11);
    uint8_t *mem = plx_block_alloc(2 * MiB / BS + 1);
    /* 1 MiB from 512 bytes past a page: written from the buffer. */
    tu_fill(mem + 512, MiB, 1);
    memcpy(sh.bytes, mem + 512, MiB);
    ck_assert_int_eq(plx_vdi_pwrite(v, mem + 512, 0, MiB, 0), 0);
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    ck_assert_uint_eq(ws.zc_bytes, MiB);
    /* 1 MiB from 256 bytes past a page, less than O_DIRECT takes: copied. */
    tu_fill(mem + 256, MiB, 2);
    memcpy(sh.bytes + MiB, mem + 256, MiB);
    ck_assert_int_eq(plx_vdi_pwrite(v, mem + 256, MiB, MiB, 0), 0);
    plx_wlog_stats(st, &ws);
    ck_assert_uint_eq(ws.zc_bytes, MiB);
    /* The public view (API 1.6): 2 MiB logged, 1 MiB of it in one record without a copy. */
    struct plx_wcache_drain d = {.struct_size = sizeof d};
    ck_assert_int_eq(plx_wcache_drain_status(st, &d), 0);
    ck_assert_uint_eq(d.logged_bytes, 2 * MiB);
    ck_assert_uint_eq(d.zc_bytes, MiB);
    ck_assert_uint_eq(d.zc_records, 1);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    memset(mem, 0, 2 * MiB); /* the log holds its own copy of both now */
    verify(v, &sh, "through the log");
    /* The crash: the store as flushed (the drain held: nothing of the writes), the log file as
     * it is (flushed). */
    plx_backend *simg = durable_image(sfault);
    {
        int in = open(path, O_RDONLY), out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ck_assert(in >= 0 && out >= 0);
        ssize_t n;
        while ((n = read(in, mem, MiB)) > 0)
            ck_assert_int_eq(write(out, mem, (size_t)n), n);
        close(in);
        close(out);
    }
    plx_wlog_pause_drain(st, 0);
    ck_assert_int_eq(plx_vdi_close(v), 0); /* the drain reads the records back and checks them */
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_store(simg, "host-a");
    ck_assert_int_eq(plx_wlog_attach(st, file_log(copy, 0), 0, "zc-log copy"), 0);
    plx_wlog_stats(st, &ws);
    ck_assert_uint_eq(ws.replayed_records, 2);
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "after replay");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    plx_block_free(mem);
    simg->ops->destroy(simg);
    sfault->ops->destroy(sfault);
    unlink(path);
    unlink(copy);
}
END_TEST

START_TEST(test_reads_see_acknowledged_writes)
{
    zc_mode(_i);
    plx_backend *smem = new_store_medium();
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    struct shadow sh;
    shadow_init(&sh, 1234);
    sh.read_pct = 30;
    sh.trim_pct = 3;
    run_writes(st, v, &sh, 2000, 32, 10, 3);
    check_zc(st);
    ck_assert_uint_eq(sh.failed, 0);
    verify(v, &sh, "after reads, writes and trims");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* A read and a sub-block write submitted right behind a large write of the same blocks, before
 * its batch is written: both see its data (in zc_mode, from the writer's buffer; the sub-block
 * write reads its edge from there too). */
static void count_done(void *arg, int status)
{
    ck_assert_int_eq(status, 0);
    (*(unsigned *)arg)--;
}

START_TEST(test_read_behind_a_write_in_flight)
{
    zc_mode(_i);
    plx_backend *smem = new_store_medium();
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    const size_t len = 64 * BS;
    uint8_t *w = g_zc ? aligned_alloc(BS, len) : malloc(len + 1) + 1;
    uint8_t *r = malloc(len), *expect = malloc(len);
    tu_fill(w, len, 77);
    memcpy(expect, w, len);
    uint8_t small[100];
    tu_fill(small, sizeof small, 78);
    memcpy(expect + 10 * BS + 5, small, sizeof small);
    unsigned pending = 3;
    ck_assert_int_eq(plx_vdi_submit_write(v, w, BS, len, 0, count_done, &pending), 0);
    ck_assert_int_eq(plx_vdi_submit_read(v, r, BS, len, count_done, &pending), 0);
    ck_assert_int_eq(
        plx_vdi_submit_write(v, small, BS + 10 * BS + 5, sizeof small, 0, count_done, &pending), 0);
    while (pending)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_msg(memcmp(r, w, len) == 0, "the read did not return the write before it");
    uint8_t *now = malloc(len);
    ck_assert_int_eq(plx_vdi_pread(v, now, BS, len), 0);
    ck_assert_msg(memcmp(now, expect, len) == 0, "the sub-block write lost its edge");
    check_zc(st);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    free(g_zc ? w : w - 1);
    free(r);
    free(expect);
    free(now);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

START_TEST(test_log_of_another_store_or_too_small)
{
    plx_backend *smem = new_store_medium();
    plx_backend *other = new_store_medium();
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    st = open_store(other, "host-a");
    int rc = attach(st, lmem, 1);
    ck_assert_int_eq(rc, -EXDEV);
    ck_assert_msg(strstr(plx_store_errmsg(st), "another blockstore") != NULL, "message: %s",
                  plx_store_errmsg(st));
    /* A log too small for two of its largest batches. */
    plx_backend *tiny = plx_backend_mem_create(64);
    rc = attach(st, tiny, 1);
    ck_assert_int_eq(rc, -EINVAL);
    ck_assert_msg(strstr(plx_store_errmsg(st), "too small") != NULL, "message: %s",
                  plx_store_errmsg(st));
    /* Something that is not a log, and init not allowed. */
    plx_backend *junk = plx_backend_mem_create(LOG_BLOCKS);
    uint8_t *b = plx_block_alloc(1);
    memset(b, 0x5a, BS);
    plx_backend_mem_poke(junk, 0, b);
    rc = attach(st, junk, 1);
    ck_assert_int_eq(rc, -EINVAL);
    ck_assert_msg(strstr(plx_store_errmsg(st), "not a Parallax write log") != NULL, "message: %s",
                  plx_store_errmsg(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(b);
    tiny->ops->destroy(tiny);
    junk->ops->destroy(junk);
    smem->ops->destroy(smem);
    other->ops->destroy(other);
    lmem->ops->destroy(lmem);
}
END_TEST

START_TEST(test_snapshot_holds_acknowledged_writes)
{
    plx_backend *smem = new_store_medium();
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    struct shadow sh;
    shadow_init(&sh, 99);
    run_writes(st, v, &sh, 100, 16, 10, 0);
    uint8_t *before = malloc(VDI_BYTES);
    memcpy(before, sh.bytes, VDI_BYTES);
    uint64_t idx = 0;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "snap", &idx), 0);
    ck_assert_uint_eq(idx, 1);
    run_writes(st, v, &sh, 100, 16, 10, 0);
    verify(v, &sh, "VDI after the snapshot");
    plx_vdi *s;
    ck_assert_int_eq(plx_vdi_open(st, "vm@snap", 0, &s), 0);
    struct shadow snap_sh = {.bytes = before};
    verify(s, &snap_sh, "snapshot");
    ck_assert_int_eq(plx_vdi_close(s), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    free(before);
    shadow_free(&sh);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

START_TEST(test_log_eio_falls_back_to_write_through)
{
    zc_mode(_i);
    plx_backend *smem = new_store_medium();
    plx_backend *lfault = plx_fault_create(NULL, LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lfault, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    struct shadow sh;
    shadow_init(&sh, 5);
    run_writes(st, v, &sh, 60, 16, 10, 5);
    /* From now on every write to the log fails. */
    plx_fault_fail_blocks(lfault, PLX_IO_WRITE, 0, LOG_BLOCKS, -EIO, -1);
    run_writes(st, v, &sh, 200, 16, 10, 5);
    check_zc(st);
    ck_assert_uint_eq(sh.failed, 0); /* nothing failed: they went through to the store */
    ck_assert_uint_gt(plx_fault_errors_injected(lfault), 0);
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    ck_assert_int_eq(ws.failed, 1);
    ck_assert_msg(strstr(ws.error, "write-through") || strstr(ws.error, "go through"), "error: %s",
                  ws.error);
    verify(v, &sh, "after the log failed");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    /* The store alone has it all, and no record names the broken log. */
    st = open_store(smem, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "store after the log failed");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    smem->ops->destroy(smem);
    lfault->ops->destroy(lfault);
}
END_TEST

/* Run writes for a while, applying the automatic mode's rule between them, until the cache is
 * on (want 1) or off (want 0), or 15 s pass. Returns whether it got there. */
static bool auto_until(plx_store *st, plx_vdi *v, struct shadow *sh, int want)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        run_writes(st, v, sh, 8, 4, 10, 10);
        int rc = plx_vdi_wcache_tick(v);
        ck_assert_msg(rc >= 0, "tick: %d %s", rc, plx_store_errmsg(st));
        if (plx_vdi_wcache_on(v) == want)
            return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 15)
            return false;
    }
}

/* The automatic mode: with the store fast the cache stays off; once the store's writes take
 * 20 ms it turns on; once they are fast again it drains and turns off; every acknowledged write
 * reads back, from the VDI and from the store alone afterwards. */
START_TEST(test_auto_mode_follows_store_latency)
{
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    struct plx_wcache_auto bad = {.on_ms = 5, .off_ms = 5};
    ck_assert_int_eq(plx_vdi_wcache_auto(v, &bad), -EINVAL);
    ck_assert_int_eq(plx_vdi_wcache_mode(v, NULL), PLX_WCACHE_OFF);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 100}, got;
    ck_assert_int_eq(plx_vdi_wcache_auto(v, &a), 0);
    ck_assert_int_eq(plx_vdi_wcache_mode(v, &got), PLX_WCACHE_AUTO);
    ck_assert(got.on_ms == 8 && got.off_ms == 2 && got.hold_ms == 100);
    struct shadow sh;
    shadow_init(&sh, 99);

    /* A fast store: the cache stays off. */
    for (int i = 0; i < 30; i++) {
        run_writes(st, v, &sh, 8, 4, 10, 10);
        ck_assert_int_eq(plx_vdi_wcache_tick(v), 0);
    }
    ck_assert_int_eq(plx_vdi_wcache_on(v), 0);
    ck_assert(plx_store_write_latency_ms(st) < 8);

    /* Every store write now takes 20 ms: on. */
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 20);
    ck_assert_msg(auto_until(st, v, &sh, 1), "the cache did not turn on; latency %.2f ms",
                  plx_store_write_latency_ms(st));
    ck_assert(plx_store_write_latency_ms(st) > 8);
    ck_assert_int_eq(plx_vdi_wcache_mode(v, NULL), PLX_WCACHE_AUTO);
    verify(v, &sh, "with the cache turned on automatically");

    /* Fast again: the log drains and the cache turns off, still in the automatic mode. */
    plx_fault_release(sfault);
    ck_assert_msg(auto_until(st, v, &sh, 0), "the cache did not turn off; latency %.2f ms",
                  plx_store_write_latency_ms(st));
    /* (Below the threshold to turn on: turning off finishes during the writes after the tick
     * that began it, whose samples on a loaded machine may pass the 2 ms to turn off.) */
    ck_assert(plx_store_write_latency_ms(st) < 8);
    ck_assert_int_eq(plx_vdi_wcache_mode(v, NULL), PLX_WCACHE_AUTO);
    ck_assert_uint_eq(sh.failed, 0);
    verify(v, &sh, "after the cache turned off automatically");

    /* The operator's switch leaves the automatic mode. */
    ck_assert_int_eq(plx_vdi_wcache_set_mode(v, PLX_WCACHE_ON, NULL), 0);
    ck_assert_int_eq(plx_vdi_wcache_mode(v, NULL), PLX_WCACHE_ON);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_store(sfault, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "from the store alone");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

static uint64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Issue 14: `parallax serve` closed a cached VDI whose last client left with plx_vdi_close, which
 * drains while the engine thread waits, so with a slow store every other VDI waited for that
 * drain. plx_vdi_try_close returns -EAGAIN at once while the log holds writes of the VDI, even
 * with the store completing no write at all and the drain held, and restarts the drain; the VDI
 * stays usable, another cached VDI's writes complete meanwhile, and once the store moves the
 * VDI closes. Everything reads back from the store alone. */
START_TEST(test_try_close_does_not_wait_for_the_drain)
{
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "a", VDI_BYTES, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "b", VDI_BYTES, NULL), 0);
    plx_vdi *a, *b;
    ck_assert_int_eq(plx_vdi_open(st, "a", 0, &a), 0);
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &b), 0);
    /* Every block written once first: the drain's writes below then need no extent claim (the
     * first claim of a pool is a synchronous write, which would wait for the held store). */
    uint8_t *zero = plx_block_alloc(VDI_BYTES / BS);
    ck_assert_int_eq(plx_vdi_pwrite(a, zero, 0, VDI_BYTES, 0), 0);
    ck_assert_int_eq(plx_vdi_pwrite(b, zero, 0, VDI_BYTES, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(a), 0);
    ck_assert_int_eq(plx_vdi_flush(b), 0);
    plx_block_free(zero);
    ck_assert_int_eq(plx_vdi_wcache(a, 1), 0);
    ck_assert_int_eq(plx_vdi_wcache(b, 1), 0);
    struct shadow sa, sb;
    shadow_init(&sa, 14);
    shadow_init(&sb, 41);

    /* From here the store completes no write (one a blocking wait is stuck on goes through
     * after 10 s, past what this test allows), and the drain is held. */
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 10000);
    plx_wlog_pause_drain(st, 1);
    run_writes(st, a, &sa, 12, 4, 10, 10);
    ck_assert_uint_eq(sa.failed, 0);

    uint64_t t0 = mono_ms();
    ck_assert_int_eq(plx_vdi_try_close(a), -EAGAIN);
    ck_assert_msg(mono_ms() - t0 < 1000, "try_close waited %llu ms",
                  (unsigned long long)(mono_ms() - t0));
    /* The drain runs again: its writes reach the store, which holds them. */
    for (int i = 0; i < 1000 && !plx_fault_held(sfault); i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(100);
    }
    ck_assert_uint_gt(plx_fault_held(sfault), 0);

    /* Meanwhile both VDIs take writes, answered from the log. */
    t0 = mono_ms();
    run_writes(st, b, &sb, 12, 4, 10, 10);
    run_writes(st, a, &sa, 4, 4, 10, 10);
    ck_assert_msg(mono_ms() - t0 < 5000, "writes beside a closing VDI took %llu ms",
                  (unsigned long long)(mono_ms() - t0));
    ck_assert_uint_eq(sa.failed + sb.failed, 0);
    ck_assert_uint_gt(plx_fault_held(sfault), 0); /* (the store still completed nothing) */
    verify(a, &sa, "a VDI being closed");
    ck_assert_int_eq(plx_vdi_try_close(a), -EAGAIN);

    /* The store moves: the drain finishes and the VDI closes. */
    plx_fault_release(sfault);
    int rc = -EAGAIN;
    t0 = mono_ms();
    while (rc == -EAGAIN && mono_ms() - t0 < 20000) {
        ck_assert_int_ge(plx_store_service(st), 0);
        rc = plx_vdi_try_close(a);
        if (rc == -EAGAIN)
            usleep(200);
    }
    ck_assert_msg(rc == 0, "try_close: %d %s", rc, plx_store_errmsg(st));
    ck_assert_int_eq(plx_vdi_try_close(b), 0); /* (b's drain is not held: it waits, as close) */
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_store(sfault, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "a", 0, &a), 0);
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &b), 0);
    verify(a, &sa, "a from the store alone");
    verify(b, &sb, "b from the store alone");
    ck_assert_int_eq(plx_vdi_close(a), 0);
    ck_assert_int_eq(plx_vdi_close(b), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sa);
    shadow_free(&sb);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* Every block of v written once and flushed: later writes then need no extent claim (the first
 * claim of a pool is a synchronous write, which would wait for a held store). */
static void prefill(plx_vdi *v)
{
    uint8_t *zero = plx_block_alloc(VDI_BYTES / BS);
    ck_assert_int_eq(plx_vdi_pwrite(v, zero, 0, VDI_BYTES, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    plx_block_free(zero);
}

/* Issue 14: the automatic mode turned the cache on by writing the VDI's record, after waiting
 * for every write already queued to the slow store; meanwhile the loop served nothing, and the
 * writers went on at the store's speed for seconds after the switch was decided. In the
 * automatic mode the record names the log from the start, so turning on is immediate: the
 * rule's tick returns at once with the cache on while the store still holds the earlier writes,
 * and new writes complete from the log meanwhile. */
START_TEST(test_auto_on_does_not_wait_for_queued_store_writes)
{
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    prefill(v);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 100};
    ck_assert_int_eq(plx_vdi_wcache_auto(v, &a), 0);
    struct shadow sh;
    shadow_init(&sh, 7);

    /* The store's writes take 30 ms: the latency passes the threshold (the cache stays off
     * until the rule's tick decides). */
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 30);
    run_writes(st, v, &sh, 16, 4, 0, 0);
    ck_assert(plx_store_write_latency_ms(st) > 8);
    /* Now it completes no write for 10 s: four writes are stuck in the store. */
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 10000);
    for (int i = 0; i < 4; i++)
        random_write(v, &sh, false, 8);
    for (int i = 0; i < 100; i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(100);
    }
    ck_assert_uint_gt(plx_fault_held(sfault), 0);
    uint64_t t0 = mono_ms(), longest = 0;
    while (!plx_vdi_wcache_on(v) && mono_ms() - t0 < 3000) {
        uint64_t t = mono_ms();
        ck_assert_int_ge(plx_vdi_wcache_tick(v), 0);
        if (mono_ms() - t > longest)
            longest = mono_ms() - t;
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(1000);
    }
    ck_assert_msg(plx_vdi_wcache_on(v), "the cache did not turn on in 3 s");
    ck_assert_msg(longest < 300, "a tick of the automatic mode took %llu ms",
                  (unsigned long long)longest);
    ck_assert_msg(mono_ms() - t0 < 1000, "turning on took %llu ms",
                  (unsigned long long)(mono_ms() - t0));
    /* The writes stuck in the store complete from the log (they were put there too), and so
     * do new ones, while the store still holds every write. */
    t0 = mono_ms();
    for (int i = 0; i < 12; i++) {
        random_write(v, &sh, false, 8);
        while (sh.inflight >= 8 && mono_ms() - t0 < 5000) {
            ck_assert_int_ge(plx_store_service(st), 0);
            usleep(100);
        }
    }
    while (sh.inflight && mono_ms() - t0 < 5000) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(100);
    }
    ck_assert_msg(sh.inflight == 0, "%u writes with the cache on waited for the store",
                  sh.inflight);
    /* And a flush: every write before it is in the log (those completed in the store before
     * the switch too), so it does not wait for the store either. */
    sh.inflight++;
    ck_assert_int_eq(plx_vdi_submit_flush(v, flush_done, &sh), 0);
    while (sh.inflight && mono_ms() - t0 < 5000) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(100);
    }
    ck_assert_msg(sh.inflight == 0, "a flush with the cache on waited for the store");
    ck_assert_uint_gt(plx_fault_held(sfault), 0);
    plx_fault_release(sfault);
    wait_all(st, &sh);
    ck_assert_uint_eq(sh.failed, 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    verify(v, &sh, "after turning on with writes queued to the store");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    st = open_store(sfault, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "from the store alone");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* Issue 14: the store's latency was a mean of the writes the engine makes, so with nothing
 * written after a slow spell it stood still and the cache stayed on for good. With no store
 * write in flight it decays: the log drains and the cache turns off with no further writes. */
START_TEST(test_auto_off_when_idle_and_store_fast)
{
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    prefill(v);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 100};
    ck_assert_int_eq(plx_vdi_wcache_auto(v, &a), 0);
    struct shadow sh;
    shadow_init(&sh, 8);
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 30);
    ck_assert_msg(auto_until(st, v, &sh, 1), "the cache did not turn on");
    run_writes(st, v, &sh, 2, 1, 0, 0); /* two records in the log */
    plx_fault_release(sfault);
    uint64_t t0 = mono_ms();
    while (plx_vdi_wcache_on(v) && mono_ms() - t0 < 6000) {
        ck_assert_int_ge(plx_vdi_wcache_tick(v), 0);
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(5000);
    }
    ck_assert_msg(!plx_vdi_wcache_on(v),
                  "the cache stayed on %llu ms with the store idle and fast (latency %.2f ms)",
                  (unsigned long long)(mono_ms() - t0), plx_store_write_latency_ms(st));
    ck_assert_int_eq(plx_vdi_wcache_mode(v, NULL), PLX_WCACHE_AUTO);
    verify(v, &sh, "after turning off while idle");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    st = open_store(sfault, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, &sh, "from the store alone");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* A record that no longer reads back as it was written (with the log written through the page
 * cache: a page dropped after its writeback failed; or a disk that lost a write): the drain must
 * not put it into the store. It stops and says so, and the records stay in the log. */
START_TEST(test_drain_refuses_a_record_that_reads_back_wrong)
{
    plx_backend *smem = new_store_medium();
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(smem, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    plx_wlog_pause_drain(st, 1);
    uint8_t *good = plx_block_alloc(1), *junk = plx_block_alloc(1), *got = plx_block_alloc(1);
    memset(good, 0x5c, BS);
    memset(junk, 0xa7, BS);
    ck_assert_int_eq(plx_vdi_pwrite(v, good, 0, BS, 0), 0);
    /* The record's data block in the log goes bad. */
    uint64_t hit = 0;
    for (uint64_t b = 1; b < LOG_BLOCKS && !hit; b++) {
        const void *p = plx_backend_mem_peek(lmem, b);
        if (p && !memcmp(p, good, BS))
            hit = b;
    }
    ck_assert_uint_gt(hit, 0);
    plx_backend_mem_poke(lmem, hit, junk);
    plx_wlog_pause_drain(st, 0);
    struct plx_wlog_stats ws;
    for (int i = 0; i < 2000; i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        plx_wlog_stats(st, &ws);
        if (ws.error[0] || !ws.backlog_records)
            break;
        usleep(1000);
    }
    ck_assert_msg(strstr(ws.error, "checksum") != NULL, "drain error: '%s'", ws.error);
    ck_assert_uint_eq(ws.backlog_records, 1);
    ck_assert_int_ne(plx_vdi_close(v), 0); /* its record stays in the log */
    plx_store_close(st);

    /* The store never got the bad data (a reader sees the block as before the write). While
     * the record names the log, no reader elsewhere opens the VDI's image (it would read older
     * data with nothing to tell it so); dropping the log's writes lets one look. */
    st = open_store(smem, "host-b");
    ck_assert_int_eq(plx_vdi_open(st, "vm", PLX_OPEN_READONLY, &v), -EBUSY);
    ck_assert_int_eq(plx_vdi_wcache_discard(st, "vm"), 0);
    ck_assert_int_eq(plx_vdi_open(st, "vm", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, BS), 0);
    ck_assert_msg(memcmp(got, junk, BS) != 0, "the drain wrote a record that read back wrong");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(good);
    plx_block_free(junk);
    plx_block_free(got);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* A drain round holds at most 256 records in the pipeline (wlog.c, APPLY_INFLIGHT): with the
 * store completing nothing, 600 cached 4 KiB writes (one round) all went into the pipeline
 * at once, and every submission and completion then paid for that many requests in flight
 * (the pipeline's conflict check, libiscsi's command queue). */
START_TEST(test_drain_keeps_few_records_in_the_pipeline)
{
    enum { NREC = 600, LOG = 4096 };
    setenv("PARALLAX_WCACHE_DRAIN_DELAY_MS", "0", 1); /* it counts the drain's first passes */
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    unsetenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    /* Every block written once first, so that the drain's writes need no extent claim (a
     * synchronous write, which would wait for the held store). */
    uint8_t *buf = plx_block_alloc(VDI_BYTES / BS);
    memset(buf, 0, VDI_BYTES);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, 0, VDI_BYTES, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_int_eq(plx_wlog_vdi_enable(v), 0);
    plx_wlog_pause_drain(st, 1);
    for (unsigned i = 0; i < NREC; i++) {
        memset(buf, (int)(i % 251) + 1, BS);
        ck_assert_int_eq(plx_vdi_pwrite(v, buf, (uint64_t)i * BS, BS, 0), 0);
    }
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 10000);
    plx_wlog_pause_drain(st, 0);
    unsigned most = 0;
    for (int pass = 0; pass < 100; pass++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        unsigned n = plx_vdi_active_before(v, plx_vdi_next_seq(v));
        most = n > most ? n : most;
    }
    ck_assert_msg(most > 128, "the drain put only %u records into the pipeline", most);
    ck_assert_msg(most <= 256, "%u records of the drain in the pipeline at once", most);
    plx_fault_release(sfault);
    struct plx_wlog_stats ws;
    for (int i = 0; i < 5000; i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        plx_wlog_stats(st, &ws);
        if (!ws.backlog_records)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(ws.backlog_records, 0);
    ck_assert_str_eq(ws.error, "");
    for (unsigned i = 0; i < NREC; i++) {
        ck_assert_int_eq(plx_vdi_pread(v, buf, (uint64_t)i * BS, BS), 0);
        ck_assert_uint_eq(buf[0], i % 251 + 1);
        ck_assert_uint_eq(buf[BS - 1], i % 251 + 1);
    }
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(buf);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* The rule used to look only at completed writes: at the start of a burst against a slow store
 * nothing completes for a while (a batch of queued writes completes at once), and the cache
 * stayed off meanwhile. A write in flight for longer than the threshold counts as well: with
 * the store completing nothing at all, the cache turns on, and the writes stuck in the store
 * complete from the log. */
START_TEST(test_auto_on_before_any_write_completes)
{
    plx_backend *smem = new_store_medium();
    plx_backend *sfault = plx_fault_create(smem, 0);
    plx_backend *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(sfault, "host-a");
    ck_assert_int_eq(attach(st, lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    prefill(v);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 100};
    ck_assert_int_eq(plx_vdi_wcache_auto(v, &a), 0);
    struct shadow sh;
    shadow_init(&sh, 9);
    plx_fault_hold_blocks(sfault, PLX_IO_WRITE, 0, STORE_BLOCKS, 10000);
    for (uint64_t i = 0; i < 6; i++) { /* (plain writes: a FUA write is not put in the log) */
        struct wctx *c = calloc(1, sizeof *c);
        c->sh = &sh;
        c->b0 = i * 16;
        c->b1 = c->b0 + 8;
        c->buf = malloc(8 * BS);
        tu_fill(c->buf, 8 * BS, 100 + i);
        memcpy(sh.bytes + c->b0 * BS, c->buf, 8 * BS);
        sh.inflight++;
        ck_assert_int_eq(plx_vdi_submit_write(v, c->buf, c->b0 * BS, 8 * BS, 0, write_done, c), 0);
    }
    uint64_t t0 = mono_ms();
    while (!plx_vdi_wcache_on(v) && mono_ms() - t0 < 3000) {
        ck_assert_int_ge(plx_vdi_wcache_tick(v), 0);
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(5000);
    }
    ck_assert_msg(plx_vdi_wcache_on(v), "the cache did not turn on with writes stuck in the store");
    while (sh.inflight && mono_ms() - t0 < 3000) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(100);
    }
    ck_assert_msg(sh.inflight == 0, "the stuck writes did not complete from the log");
    ck_assert_uint_gt(plx_fault_held(sfault), 0);
    plx_fault_release(sfault);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_uint_eq(sh.failed, 0);
    verify(v, &sh, "after turning on before any write completed");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
    shadow_free(&sh);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}
END_TEST

/* ---- The deferred drain (wlog.c, drain_defer) ---------------------------------------------------
 *
 * Each test attaches a log whose drain defers for an idle window and a max age (ms) given for
 * that attach. With both at ten minutes the drain never starts on its own within a test: then
 * every way of waiting for it must override the deferral, or the test runs out of its time
 * bound (DEFER_WAIT_MS) or of Check's timeout. */

#define NEVER_MS "600000"
#define DEFER_WAIT_MS 3000u

struct lazy {
    plx_backend *smem, *lmem;
    plx_store *st;
    plx_vdi *v;
    uint8_t *buf;
};

/* The log on lmem, or (NULL) on memory. */
static void lazy_open(struct lazy *z, const char *delay_ms, const char *age_ms, plx_backend *lmem)
{
    memset(z, 0, sizeof *z);
    z->smem = new_store_medium();
    z->lmem = lmem ? lmem : plx_backend_mem_create(LOG_BLOCKS);
    z->st = open_store(z->smem, "host-a");
    setenv("PARALLAX_WCACHE_DRAIN_DELAY_MS", delay_ms, 1);
    setenv("PARALLAX_WCACHE_DRAIN_MAX_AGE_MS", age_ms, 1);
    ck_assert_int_eq(attach(z->st, z->lmem, 1), 0);
    unsetenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
    unsetenv("PARALLAX_WCACHE_DRAIN_MAX_AGE_MS");
    ck_assert_int_eq(plx_vdi_create(z->st, "vm", VDI_BYTES, NULL), 0);
    ck_assert_int_eq(plx_vdi_open(z->st, "vm", 0, &z->v), 0);
    prefill(z->v); /* (the drain's writes then claim nothing) */
    ck_assert_int_eq(plx_wlog_vdi_enable(z->v), 0);
    z->buf = plx_block_alloc(VDI_BYTES / BS);
}

static struct plx_wlog_stats lazy_stats(const struct lazy *z)
{
    struct plx_wlog_stats ws;
    plx_wlog_stats(z->st, &ws);
    return ws;
}

/* n 4 KiB records at blocks b0 ..., block b filled with (b % 251) + 1; the drain is deferred. */
static void lazy_write(struct lazy *z, uint64_t b0, unsigned n)
{
    for (uint64_t b = b0; b < b0 + n; b++) {
        memset(z->buf, (int)(b % 251) + 1, BS);
        ck_assert_int_eq(plx_vdi_pwrite(z->v, z->buf, b * BS, BS, 0), 0);
    }
    ck_assert_int_ge(plx_store_service(z->st), 0);
    struct plx_wlog_stats ws = lazy_stats(z);
    ck_assert_uint_eq(ws.backlog_records, n);
    ck_assert_int_eq(ws.drain, PLX_WLOG_DRAIN_DEFERRED);
}

/* Serve the store until *done is set, at most DEFER_WAIT_MS; false when it was not. */
static bool serve_until(plx_store *st, const int *done)
{
    uint64_t t0 = mono_ms();
    while (!*done && mono_ms() - t0 < DEFER_WAIT_MS) {
        ck_assert_int_ge(plx_store_service(st), 0);
        if (!*done)
            usleep(1000);
    }
    return *done;
}

/* Blocks b0 ... b0 + n - 1 read as lazy_write wrote them, from a store opened without the log. */
static void lazy_check_store(struct lazy *z, uint64_t b0, unsigned n)
{
    plx_store *st = open_store(z->smem, "host-b");
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    for (uint64_t b = b0; b < b0 + n; b++) {
        ck_assert_int_eq(plx_vdi_pread(v, z->buf, b * BS, BS), 0);
        ck_assert_uint_eq(z->buf[0], b % 251 + 1);
        ck_assert_uint_eq(z->buf[BS - 1], b % 251 + 1);
    }
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
}

static void lazy_free(struct lazy *z)
{
    plx_block_free(z->buf);
    z->smem->ops->destroy(z->smem);
    z->lmem->ops->destroy(z->lmem);
}

/* The end of most tests: close the VDI and the store (which drains the log), then check that
 * blocks b0 ... b0 + n - 1 reached the store, and free. */
static void lazy_close(struct lazy *z, uint64_t b0, unsigned n)
{
    ck_assert_int_eq(plx_vdi_close(z->v), 0);
    ck_assert_int_eq(plx_store_close(z->st), 0);
    lazy_check_store(z, b0, n);
    lazy_free(z);
}

/* Nobody waits and nobody ticks: the engine's timer alone starts the drain once no write has
 * come for the idle window. The host loop only waits on plx_store_fd(), which the timer must
 * make readable (a poll that times out fails the test). */
START_TEST(test_drain_timer_alone_starts_the_drain)
{
    struct lazy z;
    lazy_open(&z, "40", NEVER_MS, NULL);
    uint64_t t0 = mono_ms();
    lazy_write(&z, 0, 8);
    while (lazy_stats(&z).backlog_records) {
        struct pollfd pfd = {.fd = plx_store_fd(z.st), .events = POLLIN};
        ck_assert_msg(poll(&pfd, 1, 2000) == 1,
                      "plx_store_fd() did not become readable with the drain deferred (backlog "
                      "%llu)",
                      (unsigned long long)lazy_stats(&z).backlog_records);
        ck_assert_int_ge(plx_store_service(z.st), 0);
        ck_assert_msg(mono_ms() - t0 < DEFER_WAIT_MS, "not drained after %u ms", DEFER_WAIT_MS);
    }
    ck_assert_uint_ge(mono_ms() - t0, 40); /* it did wait for the idle window */
    ck_assert_int_eq(lazy_stats(&z).drain, PLX_WLOG_DRAIN_IDLE);
    /* Drained: the fd goes quiet (no timer left firing, nothing to service). */
    ck_assert_int_ge(plx_store_service(z.st), 0);
    struct pollfd pfd = {.fd = plx_store_fd(z.st), .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 100), 0);
    lazy_close(&z, 0, 8);
}
END_TEST

/* The public view of the drain (plx_wcache_drain_status, API 1.5): the deferred state and the
 * policy; a caller whose struct is larger (built against a later version) gets only the fields
 * this library knows, nothing past them, and a size below the first version's is refused. */
START_TEST(test_drain_status_public)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, "900000", NULL);
    lazy_write(&z, 0, 4);
    struct plx_wcache_drain d = {.struct_size = sizeof d};
    ck_assert_int_eq(plx_wcache_drain_status(z.st, &d), 0);
    ck_assert_str_eq(d.state, "deferred");
    ck_assert_uint_eq(d.delay_ms, 600000);
    ck_assert_uint_eq(d.max_age_ms, 900000);
    ck_assert_uint_lt(d.oldest_ms, 60000);
    /* A caller built against a later, larger struct: the fields past this version's stay as
     * the caller left them (a copy of struct_size bytes would overwrite the guard). */
    struct {
        struct plx_wcache_drain d;
        uint8_t guard[64];
    } big;
    memset(&big, 0xa5, sizeof big);
    big.d.struct_size = sizeof big;
    ck_assert_int_eq(plx_wcache_drain_status(z.st, &big.d), 0);
    ck_assert_str_eq(big.d.state, "deferred");
    for (size_t i = 0; i < sizeof big.guard; i++)
        ck_assert_uint_eq(big.guard[i], 0xa5);
    struct plx_wcache_drain small = {.struct_size = offsetof(struct plx_wcache_drain, delay_ms)};
    ck_assert_int_eq(plx_wcache_drain_status(z.st, &small), -EINVAL);
    lazy_close(&z, 0, 4);
}
END_TEST

/* A steady trickle of writes never leaves the idle window: the max age still bounds how far
 * the store lags behind the log. */
START_TEST(test_drain_max_age_holds_under_a_trickle)
{
    enum { AGE_MS = 300 };
    struct lazy z;
    lazy_open(&z, "200", "300", NULL);
    uint64_t t0 = mono_ms(), oldest = 0;
    unsigned n = 0;
    while (mono_ms() - t0 < 1500) {
        memset(z.buf, (int)(n % 251) + 1, BS);
        ck_assert_int_eq(plx_vdi_pwrite(z.v, z.buf, (uint64_t)n * BS, BS, 0), 0);
        n++;
        for (int i = 0; i < 10; i++) {
            ck_assert_int_ge(plx_store_service(z.st), 0);
            struct plx_wlog_stats ws = lazy_stats(&z);
            oldest = ws.oldest_ms > oldest ? ws.oldest_ms : oldest;
            usleep(2000);
        }
    }
    struct plx_wlog_stats ws = lazy_stats(&z);
    ck_assert_msg(ws.drained_bytes >= (uint64_t)n / 2 * BS,
                  "only %llu of %u records drained during the trickle",
                  (unsigned long long)(ws.drained_bytes / BS), n);
    ck_assert_msg(oldest < AGE_MS + 100, "a record stayed %llu ms in the log (max age %u ms)",
                  (unsigned long long)oldest, AGE_MS);
    lazy_close(&z, 0, n);
}
END_TEST

/* Closing the VDI (plx_wlog_vdi_detach) waits for its records: it must not wait out the
 * deferral. So must closing the store with the VDI open (plx_wlog_close). */
START_TEST(test_drain_close_overrides_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    lazy_write(&z, 0, 16);
    uint64_t t0 = mono_ms();
    if (_i == 0)
        ck_assert_int_eq(plx_vdi_close(z.v), 0);
    ck_assert_int_eq(plx_store_close(z.st), 0); /* (_i 1: with the VDI open) */
    ck_assert_uint_lt(mono_ms() - t0, DEFER_WAIT_MS);
    lazy_check_store(&z, 0, 16);
    lazy_free(&z);
}
END_TEST

/* A handover's close without a wait (plx_vdi_try_close: plx_wlog_vdi_draining), and the cache
 * turned off without a wait (`cache disable`, the automatic mode: plx_wlog_vdi_try_detach). */
START_TEST(test_drain_try_close_and_try_detach_override_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    lazy_write(&z, 0, 16);
    uint64_t t0 = mono_ms();
    int rc;
    if (_i == 0) {
        while ((rc = plx_vdi_try_close(z.v)) == -EAGAIN && mono_ms() - t0 < DEFER_WAIT_MS) {
            ck_assert_int_ge(plx_store_service(z.st), 0);
            usleep(1000);
        }
        ck_assert_msg(rc == 0, "plx_vdi_try_close: %d after %llu ms", rc,
                      (unsigned long long)(mono_ms() - t0));
    } else {
        while ((rc = plx_vdi_wcache_off_nowait(z.v)) == -EAGAIN && mono_ms() - t0 < DEFER_WAIT_MS) {
            ck_assert_int_ge(plx_store_service(z.st), 0);
            usleep(1000);
        }
        ck_assert_msg(rc == 0, "plx_vdi_wcache_off_nowait: %d after %llu ms", rc,
                      (unsigned long long)(mono_ms() - t0));
        ck_assert(!plx_vdi_wcache_on(z.v));
        ck_assert_int_eq(plx_vdi_close(z.v), 0);
    }
    ck_assert_int_eq(plx_store_close(z.st), 0);
    lazy_check_store(&z, 0, 16);
    lazy_free(&z);
}
END_TEST

/* `cache disable` (plx_vdi_wcache(v, 0): waits until drained). */
START_TEST(test_drain_disable_overrides_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    lazy_write(&z, 0, 16);
    uint64_t t0 = mono_ms();
    ck_assert_int_eq(plx_vdi_wcache(z.v, 0), 0);
    ck_assert_uint_lt(mono_ms() - t0, DEFER_WAIT_MS);
    ck_assert_uint_eq(lazy_stats(&z).backlog_records, 0);
    lazy_close(&z, 0, 16);
}
END_TEST

/* A trim (_i 0) or snapshot (_i 1) goes to the pipeline once the VDI's records before it are
 * drained: it waits for the drain. */
START_TEST(test_drain_trim_and_snapshot_override_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    lazy_write(&z, 0, 16);
    int done = 0;
    uint64_t idx = 0;
    if (_i == 0)
        ck_assert_int_eq(plx_vdi_submit_trim(z.v, 64 * BS, BS, int_done, &done), 0);
    else
        ck_assert_int_eq(plx_vdi_submit_snapshot(z.v, "s", &idx, int_done, &done), 0);
    ck_assert_msg(serve_until(z.st, &done), "the %s waited out the deferred drain",
                  _i == 0 ? "trim" : "snapshot");
    ck_assert_uint_eq(lazy_stats(&z).backlog_records, 0);
    lazy_close(&z, 0, 16);
}
END_TEST

/* Writers waiting for room in the log: more than the log holds, at once. */
struct many {
    unsigned left;
};

static void many_done(void *arg, int status)
{
    ck_assert_int_eq(status, 0);
    ((struct many *)arg)->left--;
}

START_TEST(test_drain_full_log_overrides_the_deferral)
{
    enum { CHUNK = 64, NCHUNK = 2 * LOG_BLOCKS / CHUNK }; /* twice the log */
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    uint8_t *data = plx_block_alloc((uint64_t)CHUNK * NCHUNK);
    for (uint64_t b = 0; b < (uint64_t)CHUNK * NCHUNK; b++)
        memset(data + b * BS, (int)(b % 251) + 1, BS);
    struct many m = {NCHUNK};
    for (unsigned i = 0; i < NCHUNK; i++)
        ck_assert_int_eq(plx_vdi_submit_write(z.v, data + (size_t)i * CHUNK * BS,
                                              (uint64_t)i * CHUNK * BS, (size_t)CHUNK * BS, 0,
                                              many_done, &m),
                         0);
    uint64_t t0 = mono_ms();
    while (m.left && mono_ms() - t0 < DEFER_WAIT_MS) {
        ck_assert_int_ge(plx_store_service(z.st), 0);
        if (m.left)
            usleep(1000);
    }
    ck_assert_msg(!m.left, "%u writes still waited for room in the log", m.left);
    ck_assert_uint_gt(lazy_stats(&z).drained_bytes, 0);
    plx_block_free(data);
    lazy_close(&z, 0, CHUNK * NCHUNK);
}
END_TEST

/* The log failed: a flush then completes only once the drain has put what it covers into the
 * store (write-through). */
START_TEST(test_drain_failed_log_overrides_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, plx_fault_create(NULL, LOG_BLOCKS));
    lazy_write(&z, 0, 4);
    plx_fault_fail_blocks(z.lmem, PLX_IO_WRITE, 0, LOG_BLOCKS, -EIO, -1);
    int wdone = 0, fdone = 0;
    memset(z.buf, 4 % 251 + 1, BS);
    ck_assert_int_eq(plx_vdi_submit_write(z.v, z.buf, 4 * BS, BS, 0, int_done, &wdone), 0);
    ck_assert_int_eq(plx_vdi_submit_flush(z.v, int_done, &fdone), 0);
    ck_assert_msg(serve_until(z.st, &fdone), "the flush waited out the deferred drain");
    ck_assert_msg(serve_until(z.st, &wdone), "the write waited out the deferred drain");
    ck_assert_int_eq(lazy_stats(&z).failed, 1);
    lazy_close(&z, 0, 5);
}
END_TEST

/* The automatic mode with the store fast again: the VDI's backlog (more than the mode's
 * AUTO_OFF_MAX_BACKLOG) must drain so that the cache can turn off (plx_wlog_vdi_hurry). */
START_TEST(test_drain_auto_off_overrides_the_deferral)
{
    struct lazy z;
    lazy_open(&z, NEVER_MS, NEVER_MS, NULL);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 50};
    ck_assert_int_eq(plx_vdi_wcache_auto(z.v, &a), 0); /* (on: it keeps its state) */
    lazy_write(&z, 0, 200);
    uint64_t t0 = mono_ms();
    while (plx_vdi_wcache_on(z.v) && mono_ms() - t0 < DEFER_WAIT_MS) {
        ck_assert_int_ge(plx_vdi_wcache_tick(z.v), 0);
        ck_assert_int_ge(plx_store_service(z.st), 0);
        usleep(2000);
    }
    ck_assert_msg(!plx_vdi_wcache_on(z.v), "the cache stayed on, %llu records in the log",
                  (unsigned long long)lazy_stats(&z).backlog_records);
    lazy_close(&z, 0, 200);
}
END_TEST

/* With the delay 0 the drain starts as soon as a batch is written, as before the policy. */
START_TEST(test_drain_delay_zero_is_eager)
{
    struct lazy z;
    lazy_open(&z, "0", NEVER_MS, NULL);
    memset(z.buf, 1, BS);
    ck_assert_int_eq(plx_vdi_pwrite(z.v, z.buf, 0, BS, 0), 0);
    for (int i = 0; i < 50 && lazy_stats(&z).backlog_records; i++) {
        ck_assert_int_ge(plx_store_service(z.st), 0);
        usleep(200); /* (10 ms in all: far below the 10 minutes of max age) */
    }
    ck_assert_uint_eq(lazy_stats(&z).backlog_records, 0);
    ck_assert_int_eq(plx_vdi_close(z.v), 0);
    ck_assert_int_eq(plx_store_close(z.st), 0);
    lazy_free(&z);
}
END_TEST

/* At QD1 every batch is one 4 KiB record. The drain reads batches adjacent in the ring back in
 * one read per span (round_read_step), not one read (and one 1 MiB buffer) per batch, which cost
 * the serving thread milliseconds per round in one pass (bench/notes/wcache.md, "QD1 tail with the
 * drain"). 200 batches of a header and a block each: 400 blocks, seven spans. */
START_TEST(test_drain_reads_adjacent_batches_together)
{
    struct lazy z;
    plx_backend *lf = plx_fault_create(NULL, LOG_BLOCKS);
    lazy_open(&z, NEVER_MS, NEVER_MS, lf);
    lazy_write(&z, 0, 200);
    uint64_t ios = plx_fault_io_count(lf);
    ck_assert_int_eq(plx_vdi_close(z.v), 0); /* (waits for the drain) */
    ios = plx_fault_io_count(lf) - ios;
    ck_assert_msg(ios <= 8, "the drain of 200 adjacent batches took %llu I/Os of the log",
                  (unsigned long long)ios);
    ck_assert_int_eq(plx_store_close(z.st), 0);
    lazy_check_store(&z, 0, 200);
    lazy_free(&z);
}
END_TEST

static Suite *wlog_suite(void)
{
    Suite *s = suite_create("wlog");
    TCase *tc = tcase_create("wlog");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_cached_writes_read_back_and_drain, 0, 3);
    tcase_add_loop_test(tc, test_replay_after_crash, 0, 2);
    tcase_add_test(tc, test_zc_from_a_sector_aligned_buffer);
    tcase_add_test(tc, test_records_keep_nothing_on_the_heap);
    tcase_add_loop_test(tc, test_reads_see_acknowledged_writes, 0, 2);
    tcase_add_loop_test(tc, test_read_behind_a_write_in_flight, 0, 2);
    tcase_add_test(tc, test_log_of_another_store_or_too_small);
    tcase_add_test(tc, test_snapshot_holds_acknowledged_writes);
    tcase_add_loop_test(tc, test_log_eio_falls_back_to_write_through, 0, 2);
    tcase_add_test(tc, test_auto_mode_follows_store_latency);
    tcase_add_test(tc, test_try_close_does_not_wait_for_the_drain);
    tcase_add_test(tc, test_auto_on_does_not_wait_for_queued_store_writes);
    tcase_add_test(tc, test_auto_off_when_idle_and_store_fast);
    tcase_add_test(tc, test_auto_on_before_any_write_completes);
    tcase_add_test(tc, test_drain_refuses_a_record_that_reads_back_wrong);
    tcase_add_test(tc, test_drain_keeps_few_records_in_the_pipeline);
    tcase_add_test(tc, test_drain_timer_alone_starts_the_drain);
    tcase_add_test(tc, test_drain_status_public);
    tcase_add_test(tc, test_drain_max_age_holds_under_a_trickle);
    tcase_add_loop_test(tc, test_drain_close_overrides_the_deferral, 0, 2);
    tcase_add_loop_test(tc, test_drain_try_close_and_try_detach_override_the_deferral, 0, 2);
    tcase_add_test(tc, test_drain_disable_overrides_the_deferral);
    tcase_add_loop_test(tc, test_drain_trim_and_snapshot_override_the_deferral, 0, 2);
    tcase_add_test(tc, test_drain_full_log_overrides_the_deferral);
    tcase_add_test(tc, test_drain_failed_log_overrides_the_deferral);
    tcase_add_test(tc, test_drain_auto_off_overrides_the_deferral);
    tcase_add_test(tc, test_drain_delay_zero_is_eager);
    tcase_add_test(tc, test_drain_reads_adjacent_batches_together);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(wlog_suite)
