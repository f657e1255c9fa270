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
 * The first four run twice: as they are (writes from unaligned buffers, all copied into their
 * batches) and with block-aligned buffers and $PARALLAX_WCACHE_ZC_MIN=8, so that records of 8
 * blocks and more are written from the writer's buffer in a batch written in pieces (zc_mode).
 * The automatic mode is tested in test_wlog_auto.c, the drain in test_wlog_drain.c; the media
 * and the shadow-copy workload they share are in wlog_fixture.c.
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
#include "wlog_fixture.h"
#include "wlog.h"

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
    verify_from_store(smem, &sh, "from the store after the drain");
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
    verify_from_store(smem, &sh, "store after the log failed");
    shadow_free(&sh);
    smem->ops->destroy(smem);
    lfault->ops->destroy(lfault);
}
END_TEST

static Suite *wlog_suite(void)
{
    Suite *s = suite_create("wlog");
    TCase *tc;

    tc = tcase_create("wlog");
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
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(wlog_suite)
