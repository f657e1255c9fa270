/*
 * test_wlog_auto.c - the write cache's automatic mode (libparallax/wcache/): the cache turned on
 * and off as the store's latency and the load change, at once and without waiting for the
 * writes queued to the store. Every test compares what the VDI reads against a shadow copy of
 * what was written (wlog_fixture.c).
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

/* The start of the tests below: VDI "vm" on a store whose medium (smem) is behind a fault
 * backend (sfault), with a log on lmem attached, every block written once (prefill) and the
 * automatic mode on (on at 8 ms, off at 2 ms, held 100 ms); the shadow started with `seed`. */
static plx_store *open_auto(plx_backend **smem, plx_backend **sfault, plx_backend **lmem,
                            plx_vdi **v, struct shadow *sh, uint64_t seed)
{
    *smem = new_store_medium();
    *sfault = plx_fault_create(*smem, 0);
    *lmem = plx_backend_mem_create(LOG_BLOCKS);
    plx_store *st = open_store(*sfault, "host-a");
    ck_assert_int_eq(attach(st, *lmem, 1), 0);
    ck_assert_int_eq(plx_vdi_create(st, "vm", VDI_BYTES, NULL), 0);
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, v), 0);
    prefill(*v);
    struct plx_wcache_auto a = {.on_ms = 8, .off_ms = 2, .hold_ms = 100};
    ck_assert_int_eq(plx_vdi_wcache_auto(*v, &a), 0);
    shadow_init(sh, seed);
    return st;
}

/* The end of each test: v and st closed, a store on the same medium opened by another host with
 * no log reads back what the shadow holds (the log drained into the store) and check finds it
 * clean; the shadow and the three media are freed. */
static void close_and_verify_from_store(plx_store *st, plx_vdi *v, struct shadow *sh,
                                        plx_backend *sfault, plx_backend *smem, plx_backend *lmem)
{
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    verify_from_store(sfault, sh, "from the store alone");
    shadow_free(sh);
    sfault->ops->destroy(sfault);
    smem->ops->destroy(smem);
    lmem->ops->destroy(lmem);
}

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
    close_and_verify_from_store(st, v, &sh, sfault, smem, lmem);
}
END_TEST

/* Issue 14: the automatic mode turned the cache on by writing the VDI's record, after waiting
 * for every write already queued to the slow store; meanwhile the loop served nothing, and the
 * writers went on at the store's speed for seconds after the switch was decided. In the
 * automatic mode the record names the log from the start, so turning on is immediate: the
 * rule's tick returns at once with the cache on while the store still holds the earlier writes,
 * and new writes complete from the log meanwhile. */
START_TEST(test_auto_on_does_not_wait_for_queued_store_writes)
{
    plx_backend *smem, *sfault, *lmem;
    plx_vdi *v;
    struct shadow sh;
    plx_store *st = open_auto(&smem, &sfault, &lmem, &v, &sh, 7);

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
    close_and_verify_from_store(st, v, &sh, sfault, smem, lmem);
}
END_TEST

/* Issue 14: the store's latency was a mean of the writes the engine makes, so with nothing
 * written after a slow spell it stood still and the cache stayed on for good. With no store
 * write in flight it decays: the log drains and the cache turns off with no further writes. */
START_TEST(test_auto_off_when_idle_and_store_fast)
{
    plx_backend *smem, *sfault, *lmem;
    plx_vdi *v;
    struct shadow sh;
    plx_store *st = open_auto(&smem, &sfault, &lmem, &v, &sh, 8);
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
    close_and_verify_from_store(st, v, &sh, sfault, smem, lmem);
}
END_TEST

/* The rule used to look only at completed writes: at the start of a burst against a slow store
 * nothing completes for a while (a batch of queued writes completes at once), and the cache
 * stayed off meanwhile. A write in flight for longer than the threshold counts as well: with
 * the store completing nothing at all, the cache turns on, and the writes stuck in the store
 * complete from the log. */
START_TEST(test_auto_on_before_any_write_completes)
{
    plx_backend *smem, *sfault, *lmem;
    plx_vdi *v;
    struct shadow sh;
    plx_store *st = open_auto(&smem, &sfault, &lmem, &v, &sh, 9);
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

static Suite *wlog_auto_suite(void)
{
    Suite *s = suite_create("wlog-auto");
    TCase *tc;

    tc = tcase_create("wlog-auto");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_auto_mode_follows_store_latency);
    tcase_add_test(tc, test_auto_on_does_not_wait_for_queued_store_writes);
    tcase_add_test(tc, test_auto_off_when_idle_and_store_fast);
    tcase_add_test(tc, test_auto_on_before_any_write_completes);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(wlog_auto_suite)
