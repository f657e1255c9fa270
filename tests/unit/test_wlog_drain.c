/*
 * test_wlog_drain.c - the write cache's drain (libparallax/wcache/): plx_vdi_try_close does not
 * wait for it (a server's other VDIs go on meanwhile); a record that reads back wrong is
 * refused; few records are in the pipeline at once; and the deferred drain (test_drain_*): the
 * engine's timer alone starts it after the idle window, the max age bounds it under a trickle,
 * and every way of waiting for it (close, try_close, try_detach, disable, a trim or snapshot, a
 * full or failed log, the automatic mode turning off) gets it at once with an idle window and
 * max age of ten minutes. Stores and logs on memory media (wlog_fixture.c).
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

static Suite *wlog_drain_suite(void)
{
    Suite *s = suite_create("wlog-drain");
    TCase *tc;

    tc = tcase_create("wlog-drain");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_try_close_does_not_wait_for_the_drain);
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

TU_MAIN(wlog_drain_suite)
