/*
 * test_tapdisk_durability.c - the blktap3 driver (tapdisk/block-parallax.c) against the tapdisk
 * test double (tapdisk_double.c): the durability of completed writes in each durability mode
 * under simulated crashes (crash images of a fault-injection backend), the durability option's
 * errors, and the write cache's parameter.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "parallax_control.h"
#include "backend_fault.h"
#include "parallax.h"
#include "tapdisk_double.h"
#include "tapdisk_fixture.h"
#include "testutil.h"
#include "tgtd.h"

/* ---- Durability modes under simulated crashes ---------------------------------------------------
 */

/* DUR_WRITES writes of 4 KiB to distinct blocks, DUR_GROUP in flight at a time; with two passes
 * the second overwrites the same blocks in place with new data (write DUR_WRITES + i is block
 * i's second write). */
enum { DUR_WRITES = 48, DUR_GROUP = 8, DUR_MAX = 2 * DUR_WRITES };
static uint64_t dur_done_at[DUR_MAX]; /* fault log position when tapdisk saw the completion */
static uint64_t dur_start;            /* log position once the disk is open */
static int dur_passes;                /* passes of the last dur_workload */
/* The fault backend's counts (writes, FUA writes, flushes) once the disk is open, before the
 * second pass and at its end. */
static uint64_t dur_counts[3][3];

static void dur_completed(td_request_t treq, int res)
{
    size_t i = (size_t)(uintptr_t)treq.cb_data - 1;
    ck_assert_int_eq(res, 0);
    dur_done_at[i] = plx_fault_log_position(fault_be);
}

/* Run `passes` passes of DUR_WRITES writes of 4 KiB to distinct blocks (each write's data is its
 * own pattern) through the driver opened with `params_prefix`, DUR_GROUP in flight at a time, on
 * a fault backend; record where in the fault log tapdisk saw each completion. */
static void dur_workload(const char *params_prefix, char **data, int passes)
{
    tdd_store_opener = open_on_fault_kept;
    /* open_on_fault_kept ignores the blockstore path (the driver still resolves it). */
    td_driver_t *drv = NULL;
    char spec[4400];
    snprintf(spec, sizeof spec, "%s%s:disk", params_prefix, store_path);
    ck_assert_int_eq(try_open(spec, 0, &drv), 0);
    dur_start = plx_fault_log_position(fault_be);
    dur_passes = passes;
    plx_fault_counts(fault_be, &dur_counts[0][0], &dur_counts[0][1], &dur_counts[0][2]);
    for (int g = 0; g < passes * DUR_WRITES; g += DUR_GROUP) {
        if (g == DUR_WRITES)
            plx_fault_counts(fault_be, &dur_counts[1][0], &dur_counts[1][1], &dur_counts[1][2]);
        size_t before = tdd_completion_count();
        for (int i = g; i < g + DUR_GROUP; i++) {
            td_request_t r = tdd_request(
                TD_OP_WRITE, data[i], (td_sector_t)(i % DUR_WRITES) * 8 * 3, 8, tag_of((size_t)i));
            r.cb = dur_completed;
            drv->ops->td_queue_write(drv, r);
        }
        ck_assert_int_eq(tdd_run_until(before + DUR_GROUP, WAIT_MS), 0);
    }
    plx_fault_counts(fault_be, &dur_counts[2][0], &dur_counts[2][1], &dur_counts[2][2]);
    close_ok(drv);
    tdd_store_opener = NULL;
}

/* Crash at `pos` with `mode`: the store opens, checks clean, and every block holds zeros or the
 * data of one of its writes. Returns how many writes tapdisk had seen complete by pos that are
 * missing (a block older than its newest write completed by pos). */
static unsigned dur_check_crash(struct plx_crash_cursor *cur, uint64_t pos,
                                enum plx_crash_mode mode, char **data)
{
    plx_crash_cursor_seek(cur, pos);
    plx_backend *img = plx_crash_cursor_image(cur, mode, pos);
    plx_store *st = NULL;
    char err[256];
    ck_assert_msg(plx_store_open_backend(img, NULL, &st, err, sizeof err) == 0,
                  "crash at %llu: open: %s", (unsigned long long)pos, err);
    struct plx_check_report rep;
    ck_assert_int_eq(plx_check(st, &rep, NULL, NULL), 0);
    ck_assert_msg(rep.errors == 0, "crash at %llu: %llu check errors", (unsigned long long)pos,
                  (unsigned long long)rep.errors);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "disk", PLX_OPEN_READONLY, &v), 0);
    char *got = malloc(8 * SEC), *zero = calloc(1, 8 * SEC);
    unsigned lost = 0;
    for (int i = 0; i < DUR_WRITES; i++) {
        ck_assert_int_eq(plx_vdi_pread(v, got, (uint64_t)i * 8 * 3 * SEC, 8 * SEC), 0);
        int holds = memcmp(got, zero, 8 * SEC) == 0 ? -1 : -2; /* -1: zeros; p: pass p's data */
        for (int p = 0; p < dur_passes && holds == -2; p++)
            if (memcmp(got, data[p * DUR_WRITES + i], 8 * SEC) == 0)
                holds = p;
        ck_assert_msg(holds != -2, "crash at %llu: block of write %d holds none of its writes",
                      (unsigned long long)pos, i);
        int newest_done = -1; /* the last pass whose write of this block completed by pos */
        for (int p = 0; p < dur_passes; p++) {
            uint64_t at = dur_done_at[p * DUR_WRITES + i];
            if (at && at <= pos)
                newest_done = p;
        }
        if (holds < newest_done)
            lost++;
    }
    free(got);
    free(zero);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    return lost;
}

/* Crash points between the first submission and the close, at most `max` of them spread out. */
static size_t dur_points(uint64_t *out, size_t max)
{
    uint64_t n = plx_fault_crash_points(fault_be, NULL, 0);
    uint64_t *all = calloc(n ? n : 1, sizeof *all);
    plx_fault_crash_points(fault_be, all, n);
    uint64_t last = 0;
    for (int i = 0; i < DUR_MAX; i++)
        last = dur_done_at[i] > last ? dur_done_at[i] : last;
    size_t k = 0;
    uint64_t in_range = 0;
    for (uint64_t i = 0; i < n; i++)
        in_range += all[i] >= dur_start && all[i] <= last;
    uint64_t step = in_range / max + 1;
    for (uint64_t i = 0, j = 0; i < n && k < max; i++) {
        if (all[i] < dur_start || all[i] > last)
            continue;
        if (j++ % step == 0)
            out[k++] = all[i];
    }
    free(all);
    return k;
}

static char **dur_data(void)
{
    char **data = malloc(DUR_MAX * sizeof *data);
    for (int i = 0; i < DUR_MAX; i++) {
        data[i] = malloc(8 * SEC);
        tu_fill(data[i], 8 * SEC, 900 + (uint64_t)i);
    }
    memset(dur_done_at, 0, sizeof dur_done_at);
    return data;
}

static void dur_free(char **data)
{
    for (int i = 0; i < DUR_MAX; i++)
        free(data[i]);
    free(data);
    fault_be->ops->destroy(fault_be);
    fault_be = NULL;
}

/* durability=fua (the default): a write tapdisk saw complete survives a power failure at any
 * later point, with the device's volatile cache lost: the first writes of blocks (which allocate
 * and complete with their batch's commit) and their overwrites in place (which complete on their
 * own FUA data writes, pipeline.c's fua_in_place). */
START_TEST(test_durability_fua)
{
    char **data = dur_data();
    dur_workload("", data, 2);
    struct plx_crash_cursor *cur = plx_crash_cursor_new(fault_be);
    uint64_t pts[600];
    size_t n = dur_points(pts, tu_quick() ? 90 : 600);
    ck_assert_uint_gt(n, 40);
    size_t in_overwrites = 0;
    for (size_t i = 0; i < n; i++) {
        in_overwrites += pts[i] > dur_done_at[DUR_WRITES - 1];
        unsigned lost = dur_check_crash(cur, pts[i], PLX_CRASH_DROP_UNFLUSHED, data);
        ck_assert_msg(lost == 0, "durability=fua: %u completed writes lost by a crash at %llu",
                      lost, (unsigned long long)pts[i]);
    }
    ck_assert_uint_gt(in_overwrites, 10); /* crash points fell among the overwrites too */
    plx_crash_cursor_free(cur);
    dur_free(data);
}
END_TEST

/* durability=fua's overwrites in place, DUR_GROUP (tapdisk's NBD server keeps 8 requests in
 * flight) at a time: each is one FUA data write and nothing else -- no flush and no metadata write
 * (no batch commit) -- where a group of them used to share two or three batch commits, a flush
 * each (0.39-0.42 flushes per write through a real tapdisk). The first writes, which allocate,
 * still commit in batches: a group handed in together shares one (batch.c's plx_batch_start_soon;
 * 16 flushes for the 48 here, where a batch that started with the group's first write, the
 * other seven in a second batch behind it, made 28). Counted on the fault backend. */
START_TEST(test_fua_overwrite_io)
{
    char **data = dur_data();
    dur_workload("", data, 2);
    uint64_t d[2][3]; /* the allocating pass, the overwrites: writes, FUA writes, flushes */
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++)
            d[p][k] = dur_counts[p + 1][k] - dur_counts[p][k];
    printf("durability=fua, %d writes in flight, %d writes per pass: allocating pass %llu writes "
           "(%llu FUA), %llu flushes; overwrites %llu writes (%llu FUA), %llu flushes\n",
           DUR_GROUP, DUR_WRITES, (unsigned long long)d[0][0], (unsigned long long)d[0][1],
           (unsigned long long)d[0][2], (unsigned long long)d[1][0], (unsigned long long)d[1][1],
           (unsigned long long)d[1][2]);
    ck_assert_uint_eq(d[1][2], 0);
    ck_assert_uint_eq(d[1][0], DUR_WRITES);
    ck_assert_uint_eq(d[1][1], DUR_WRITES);
    ck_assert_uint_gt(d[0][2], 0); /* (the allocating pass does commit, and flush) */
    /* ... a batch per group of DUR_GROUP, two flushes each, and a few to spare */
    ck_assert_msg(d[0][2] <= 3 * (DUR_WRITES / DUR_GROUP),
                  "allocating pass: %llu flushes for %d groups of %d writes handed in together",
                  (unsigned long long)d[0][2], DUR_WRITES / DUR_GROUP, DUR_GROUP);
    dur_free(data);
}
END_TEST

/* durability=ordered (aio:'s contract): a completed write survives a crash of tapdisk (all
 * writes it submitted reached the device); after a power failure the VDI is consistent and
 * holds old or new data in every block, but completed writes may be lost -- and are, at some
 * crash points, which is what makes this mode faster. */
START_TEST(test_durability_ordered)
{
    char **data = dur_data();
    dur_workload("durability=ordered:", data, 2);
    struct plx_crash_cursor *cur = plx_crash_cursor_new(fault_be);
    uint64_t pts[600];
    size_t n = dur_points(pts, tu_quick() ? 90 : 600);
    ck_assert_uint_gt(n, 40);
    unsigned lost_power = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned lost = dur_check_crash(cur, pts[i], PLX_CRASH_KEEP_ALL, data);
        ck_assert_msg(lost == 0,
                      "durability=ordered: %u completed writes lost when tapdisk "
                      "died at %llu",
                      lost, (unsigned long long)pts[i]);
    }
    plx_crash_cursor_free(cur);
    cur = plx_crash_cursor_new(fault_be);
    for (size_t i = 0; i < n; i++)
        lost_power += dur_check_crash(cur, pts[i], PLX_CRASH_DROP_UNFLUSHED, data);
    ck_assert_msg(lost_power > 0, "durability=ordered lost no completed write at any power "
                                  "failure: is it still submitting FUA writes?");
    plx_crash_cursor_free(cur);
    dur_free(data);
}
END_TEST

/* The option is parsed strictly. */
START_TEST(test_durability_option_errors)
{
    char params[4400];
    td_driver_t *drv = NULL;
    snprintf(params, sizeof params, "durability=sometimes:%s:web1", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("expected fua or ordered"));
    ck_assert_int_eq(try_open("durability=fua", 0, &drv), -EINVAL);
    snprintf(params, sizeof params, "durability=fua:%s:web1", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), 0);
    ck_assert(tdd_log_contains("durability=fua"));
    close_ok(drv);
    snprintf(params, sizeof params, "durability=ordered:%s:web1", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), 0);
    ck_assert(tdd_log_contains("durability=ordered"));
    close_ok(drv);
}
END_TEST

/* write-cache=PATH (and write-cache-size=SIZE): the disk's writes go through a write log on this
 * host's disk, as with `serve --write-cache`. With the drain held, a completed write is in the
 * log's backlog (cache-status through the control socket) and reads back; a bad path is refused
 * at open with a message naming it. */
START_TEST(test_write_cache_param)
{
    char params[9000], logp[4300], reply[1024];
    snprintf(logp, sizeof logp, "%s/wlog", dir);
    setenv("PARALLAX_WCACHE_HOLD_DRAIN", "1", 1);
    snprintf(params, sizeof params, "write-cache=%s:write-cache-size=8M:%s:web1", logp, store_path);
    td_driver_t *drv = NULL;
    int rc = try_open(params, 0, &drv);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", params, rc, tdd_log_last());
    ck_assert(tdd_log_contains("write-cache="));
    char *wbuf = malloc(8 * SEC), *rbuf = malloc(8 * SEC);
    tu_fill(wbuf, 8 * SEC, 77);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, wbuf, 16, 8), 0);
    char line[64];
    snprintf(line, sizeof line, "cache-status %llu", (unsigned long long)vdi_id_of("web1"));
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strstr(reply, "ok vdi=on attached=1") != NULL, "cache-status: %s", reply);
    ck_assert_msg(strstr(reply, " log=8388608 ") != NULL, "cache-status: %s", reply);
    ck_assert_msg(strstr(reply, " backlog=0 ") == NULL, "nothing in the backlog: %s", reply);
    memset(rbuf, 0, 8 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, rbuf, 16, 8), 0);
    ck_assert_mem_eq(rbuf, wbuf, 8 * SEC);
    unsetenv("PARALLAX_WCACHE_HOLD_DRAIN");
    close_ok(drv);

    /* Reopened without the drain held: the log is replayed and the write is in the store. */
    snprintf(params, sizeof params, "write-cache=%s:%s:web1", logp, store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), 0);
    memset(rbuf, 0, 8 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, rbuf, 16, 8), 0);
    ck_assert_mem_eq(rbuf, wbuf, 8 * SEC);
    close_ok(drv);
    unlink(logp);

    /* write-cache-mode=auto: the automatic mode with its threshold, shown by cache-status. */
    snprintf(params, sizeof params,
             "write-cache=%s:write-cache-mode=auto:write-cache-threshold=5:%s:web1", logp,
             store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), 0);
    ck_assert(tdd_log_contains("(auto)"));
    snprintf(line, sizeof line, "cache-status %llu", (unsigned long long)vdi_id_of("web1"));
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strstr(reply, " mode=auto threshold=5.000 ") != NULL, "cache-status: %s", reply);
    ck_assert_msg(strstr(reply, "ok vdi=off ") != NULL, "a fast store: off: %s", reply);
    close_ok(drv);
    unlink(logp);
    snprintf(params, sizeof params, "write-cache=%s:write-cache-mode=sometimes:%s:web1", logp,
             store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("expected on or auto"));
    snprintf(params, sizeof params, "write-cache=%s:write-cache-threshold=0:%s:web1", logp,
             store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("write-cache-threshold=0: expected milliseconds"));

    /* Bad input: a log path in a missing directory, a bad size, an option naming no VDI. */
    snprintf(params, sizeof params, "write-cache=%s/no/such/dir/wlog:%s:web1", dir, store_path);
    ck_assert_int_lt(try_open(params, 0, &drv), 0);
    ck_assert_msg(tdd_log_contains("no/such/dir/wlog"), "log: %s", tdd_log_last());
    snprintf(params, sizeof params, "write-cache=%s:write-cache-size=lots:%s:web1", logp,
             store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("write-cache-size=lots"));
    snprintf(params, sizeof params, "write-cache-size=8M:%s:web1", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("write-cache-size=8M needs write-cache=PATH"));
    ck_assert_int_eq(try_open("write-cache=/x", 0, &drv), -EINVAL);

    /* No parameter: the host's settings file names the log (a read-only disk ignores it). */
    char conf[4400];
    snprintf(conf, sizeof conf, "%s/write-cache.conf", dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# this host's write log\n\nwrite-cache=%s\nwrite-cache-size=4M\n", logp);
    fclose(f);
    setenv("PARALLAX_WRITE_CACHE_FILE", conf, 1);
    drv = open_ok("web2", 0);
    snprintf(line, sizeof line, "cache-status %llu", (unsigned long long)vdi_id_of("web2"));
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strstr(reply, "ok vdi=on attached=1") != NULL, "cache-status: %s", reply);
    ck_assert_msg(strstr(reply, " log=4194304 ") != NULL, "cache-status: %s", reply);
    close_ok(drv);
    unlink(logp);
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "write-cache-size=4M\nlog=%s\n", logp);
    fclose(f);
    snprintf(params, sizeof params, "%s:web2", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert_msg(tdd_log_contains("write-cache.conf line 2"), "log: %s", tdd_log_last());
    drv = open_ok("web2", TD_OPEN_RDONLY);
    close_ok(drv);
    unlink(conf);
    setenv("PARALLAX_WRITE_CACHE_FILE", "/nonexistent/parallax-write-cache", 1);
    free(wbuf);
    free(rbuf);
}
END_TEST

static Suite *tapdisk_durability_suite(void)
{
    Suite *s = suite_create("tapdisk-durability");
    TCase *tc;
    tc = tcase_create("durability");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_durability_option_errors);
    tcase_add_test(tc, test_write_cache_param);
    tcase_add_test(tc, test_durability_fua);
    tcase_add_test(tc, test_fua_overwrite_io);
    tcase_add_test(tc, test_durability_ordered);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(tapdisk_durability_suite());
}
