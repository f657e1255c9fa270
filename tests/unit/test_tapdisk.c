/*
 * test_tapdisk.c - the blktap3 driver (tapdisk/block-parallax.c) against a test double of
 * tapdisk (tapdisk_double.c): parameters, open/close, the event that drives the engine,
 * reads and writes completed exactly once with the right data, unaligned requests, many
 * requests in flight, the slot limit (-EBUSY), read-only disks, draining at close, a store
 * shared by two disks, I/O errors (on a fault-injection backend), block status answered
 * asynchronously and a blockstore on iSCSI. The control socket, migration and the lock manager
 * are in test_tapdisk_host.c, the durability modes in test_tapdisk_durability.c; the fixture
 * they share in tapdisk_fixture.c.
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
#include "block-parallax.h"
#include "engine.h"
#include "parallax_control.h"
#include "backend_fault.h"
#include "parallax.h"
#include "tapdisk_double.h"
#include "tapdisk_fixture.h"
#include "testutil.h"
#include "tgtd.h"

/* The driver's request slots per disk (PLX_TD_SLOTS, block-parallax.h). */
#define DRIVER_SLOTS 1024

static int verbose(void)
{
    const char *v = getenv("TDD_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- Parameters and open -----------------------------------------------------------------------
 */

START_TEST(test_open_reports_size_and_registers_event)
{
    td_driver_t *drv = open_ok("web1", 0);
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    ck_assert_int_eq(drv->info.sector_size, 512);
    /* The engine's descriptor, its kick and the control socket's listener. */
    ck_assert_uint_eq(tdd_event_count(), 3);
    td_disk_id_t id = {0};
    ck_assert_int_eq(drv->ops->td_get_parent_id(drv, &id), TD_NO_PARENT);
    ck_assert_int_eq(drv->ops->td_validate_parent(drv, drv, 0), -EINVAL);
    ck_assert_ptr_nonnull(drv->ops->td_queue_block_status);
    /* A wake-up with nothing to do is harmless. */
    tdd_fire_all();
    ck_assert_uint_eq(tdd_completion_count(), 0);
    close_ok(drv);
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_uint_eq(tdd_bad_unregisters(), 0);
}
END_TEST

START_TEST(test_malformed_params)
{
    static const char *bad[] = {"", ":", "a:", ":b", "::", "some/path/without/vdi"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tdd_reset();
        td_driver_t *drv = NULL;
        int rc = try_open(bad[i], 0, &drv);
        ck_assert_msg(rc == -EINVAL, "params '%s': expected -EINVAL, got %d", bad[i], rc);
        ck_assert_msg(tdd_log_contains("parallax: "), "params '%s': no log line", bad[i]);
        ck_assert_msg(tdd_log_contains("parallax:<vdi>") || tdd_log_contains("blockstore"),
                      "params '%s': unclear message: %s", bad[i], tdd_log_last());
    }
    /* A NULL params pointer as well. */
    td_driver_t *drv = tdd_driver_new(&tapdisk_parallax, "");
    ck_assert_int_eq(drv->ops->td_open(drv, NULL, NULL, 0), -EINVAL);
    tdd_driver_free(drv);
    /* Trailing-colon and leading-colon forms with a real blockstore. */
    char params[4400];
    snprintf(params, sizeof params, "%s:", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("the VDI is empty"));
    ck_assert_uint_eq(tdd_event_count(), 0);
}
END_TEST

START_TEST(test_open_errors)
{
    td_driver_t *drv = NULL;
    char params[4400];
    /* No blockstore configured at all. */
    ck_assert_int_eq(try_open("web1", 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("PARALLAX_BLOCKSTORE"));
    /* A blockstore that does not exist. */
    snprintf(params, sizeof params, "%s/absent.img:web1", dir);
    ck_assert_int_eq(try_open(params, 0, &drv), -ENOENT);
    ck_assert(tdd_log_contains("absent.img"));
    /* A VDI that does not exist. */
    snprintf(params, sizeof params, "%s:nosuch", store_path);
    ck_assert_int_eq(try_open(params, 0, &drv), -ENOENT);
    ck_assert(tdd_log_contains("nosuch"));
    ck_assert_uint_eq(tdd_event_count(), 0);
    /* Encryption is refused. */
    snprintf(params, sizeof params, "%s:web1", store_path);
    uint8_t key[32] = {0};
    struct td_vbd_encryption enc = {sizeof key, key};
    drv = tdd_driver_new(&tapdisk_parallax, params);
    ck_assert_int_eq(drv->ops->td_open(drv, params, &enc, 0), -EOPNOTSUPP);
    tdd_driver_free(drv);
    /* No key: accepted. */
    struct td_vbd_encryption none = {0, NULL};
    drv = tdd_driver_new(&tapdisk_parallax, params);
    ck_assert_int_eq(drv->ops->td_open(drv, params, &none, 0), 0);
    close_ok(drv);
}
END_TEST

START_TEST(test_default_blockstore)
{
    td_driver_t *drv = NULL;
    setenv("PARALLAX_BLOCKSTORE", store_path, 1);
    ck_assert_int_eq(try_open("web1", 0, &drv), 0);
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    close_ok(drv);
    unsetenv("PARALLAX_BLOCKSTORE");

    char conf[4300];
    snprintf(conf, sizeof conf, "%s/blockstore.conf", dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# the host's Parallax blockstore\n\n   %s  \n/ignored/second/line\n", store_path);
    fclose(f);
    setenv("PARALLAX_BLOCKSTORE_FILE", conf, 1);
    ck_assert_int_eq(try_open("web2", 0, &drv), 0);
    ck_assert_uint_eq(drv->info.size, WEB2_SIZE / SEC);
    close_ok(drv);

    /* A file naming nothing. */
    f = fopen(conf, "w");
    fprintf(f, "# nothing here\n");
    fclose(f);
    ck_assert_int_eq(try_open("web2", 0, &drv), -EINVAL);
    ck_assert(tdd_log_contains("names no blockstore"));
}
END_TEST

/* A blockstore path with colons in it (like /dev/disk/by-path names) and a VDI spec with a colon
 * (a snapshot label) both work. */
START_TEST(test_colons_in_paths_and_labels)
{
    char colon_path[4400];
    snprintf(colon_path, sizeof colon_path, "%s/pci-0000:00:1f.2-ata-1", dir);
    ck_assert_int_eq(symlink(store_path, colon_path), 0);
    plx_store *st = NULL;
    char err[256];
    ck_assert_int_eq(plx_store_open(store_path, NULL, &st, err, sizeof err), 0);
    ck_assert_int_eq(plx_vdi_snapshot(st, "web1", "10:00", NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    char params[4500];
    td_driver_t *drv = NULL;
    snprintf(params, sizeof params, "%s:web1", colon_path);
    ck_assert_msg(try_open(params, 0, &drv) == 0, "%s", tdd_log_last());
    close_ok(drv);
    snprintf(params, sizeof params, "%s:web1@10:00", colon_path);
    ck_assert_msg(try_open(params, TD_OPEN_RDONLY, &drv) == 0, "%s", tdd_log_last());
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    close_ok(drv);
    unlink(colon_path);
}
END_TEST

/* ---- I/O ---------------------------------------------------------------------------------------
 */

START_TEST(test_write_then_read)
{
    td_driver_t *drv = open_ok("web1", 0);
    char *wbuf = malloc(8 * SEC), *rbuf = malloc(8 * SEC);
    tu_fill(wbuf, 8 * SEC, 42);

    td_request_t w = tdd_request(TD_OP_WRITE, wbuf, 0, 8, tag_of(0));
    drv->ops->td_queue_write(drv, w);
    /* Only submitted: the answer comes from the event, never from inside queue_write. */
    ck_assert_uint_eq(tdd_completion_count(), 0);
    ck_assert_int_eq(tdd_run_until(1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of(tag_of(0), &status), 1);
    ck_assert_int_eq(status, 0);
    const struct tdd_completion *c = tdd_completion_at(0);
    ck_assert_uint_eq(c->req.sec, 0);
    ck_assert_int_eq(c->req.secs, 8);
    ck_assert_ptr_eq(c->req.buf, wbuf);
    ck_assert_int_eq(c->req.op, TD_OP_WRITE);

    memset(rbuf, 0xee, 8 * SEC);
    td_request_t r = tdd_request(TD_OP_READ, rbuf, 0, 8, tag_of(1));
    drv->ops->td_queue_read(drv, r);
    ck_assert_uint_eq(tdd_completion_count(), 1);
    ck_assert_int_eq(tdd_run_until(2, WAIT_MS), 0);
    ck_assert_uint_eq(tdd_completions_of(tag_of(1), &status), 1);
    ck_assert_int_eq(status, 0);
    ck_assert_mem_eq(rbuf, wbuf, 8 * SEC);

    /* Give the event a few more chances: nothing completes twice. */
    tdd_fire_ready(50);
    tdd_fire_all();
    assert_each_once(2);
    close_ok(drv);
    free(wbuf);
    free(rbuf);
}
END_TEST

START_TEST(test_unaligned_requests)
{
    td_driver_t *drv = open_ok("web1", 0);
    enum { SPAN = 24 };
    unsigned char *model = calloc(SPAN, SEC);
    unsigned char *buf = malloc(SPAN * SEC);
    /* Sector 3, 5 sectors: starts and ends inside the first 4 KiB block. */
    tu_fill(buf, 5 * SEC, 7);
    memcpy(model + 3 * SEC, buf, 5 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 3, 5), 0);
    /* Sector 7, 3 sectors: straddles the first and second blocks. */
    tu_fill(buf, 3 * SEC, 8);
    memcpy(model + 7 * SEC, buf, 3 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 7, 3), 0);
    /* Sector 13, 9 sectors: three blocks, neither end aligned. */
    tu_fill(buf, 9 * SEC, 9);
    memcpy(model + 13 * SEC, buf, 9 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 13, 9), 0);

    memset(buf, 0xee, SPAN * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, SPAN), 0);
    ck_assert_mem_eq(buf, model, SPAN * SEC);
    /* Unaligned reads too. */
    memset(buf, 0xee, SPAN * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 5, 11), 0);
    ck_assert_mem_eq(buf, model + 5 * SEC, 11 * SEC);
    /* The last sector of the disk. */
    tu_fill(buf, SEC, 10);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, WEB1_SIZE / SEC - 1, 1), 0);
    unsigned char *back = malloc(SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, WEB1_SIZE / SEC - 1, 1), 0);
    ck_assert_mem_eq(back, buf, SEC);
    close_ok(drv);
    free(model);
    free(buf);
    free(back);
}
END_TEST

START_TEST(test_out_of_range)
{
    td_driver_t *drv = open_ok("web2", 0);
    char buf[2 * SEC];
    const td_sector_t end = WEB2_SIZE / SEC;
    struct {
        td_sector_t sec;
        int secs;
    } bad[] = {{end, 1}, {end - 1, 2}, {0, 0}, {0, -1}, {UINT64_MAX, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drv->ops->td_queue_read(drv,
                                tdd_request(TD_OP_READ, buf, bad[i].sec, bad[i].secs, tag_of(i)));
        int status = 0;
        ck_assert_uint_eq(tdd_completions_of(tag_of(i), &status), 1);
        ck_assert_int_eq(status, -EINVAL);
    }
    close_ok(drv);
}
END_TEST

/* Many requests of different sizes in flight at once: each completes exactly once, with its
 * whole sector count, whatever the order; the data is right afterwards. */
START_TEST(test_many_in_flight)
{
    td_driver_t *drv = open_ok("web1", 0);
    enum { N = 300 };
    const int nq = tu_quick() ? 100 : N;
    char *bufs[N];
    td_sector_t secs_at[N];
    int nsecs[N];
    uint64_t seed = 1;
    /* Writes to distinct regions, sizes 1..24 sectors at arbitrary sector offsets. */
    for (int i = 0; i < nq; i++) {
        nsecs[i] = 1 + (int)(tu_rand(&seed) % 24);
        secs_at[i] = (td_sector_t)i * 32 + tu_rand(&seed) % 8;
        bufs[i] = malloc((size_t)nsecs[i] * SEC);
        tu_fill(bufs[i], (size_t)nsecs[i] * SEC, 100 + (uint64_t)i);
        drv->ops->td_queue_write(
            drv, tdd_request(TD_OP_WRITE, bufs[i], secs_at[i], nsecs[i], tag_of((size_t)i)));
    }
    /* Reads of a region never written, submitted behind the writes. */
    char *zbuf = calloc(nq, 8 * SEC);
    for (int i = 0; i < nq; i++)
        drv->ops->td_queue_read(drv, tdd_request(TD_OP_READ, zbuf + (size_t)i * 8 * SEC,
                                                 WEB1_SIZE / SEC / 2 + (td_sector_t)i * 8, 8,
                                                 tag_of((size_t)(N + i))));
    ck_assert_uint_eq(tdd_completion_count(), 0);
    ck_assert_int_eq(tdd_run_until((size_t)nq * 2, WAIT_MS), 0);
    tdd_fire_ready(50);
    assert_each_once((size_t)nq * 2);
    size_t out_of_order = 0;
    for (size_t i = 0; i < (size_t)nq * 2; i++) {
        const struct tdd_completion *c = tdd_completion_at(i);
        ck_assert_int_eq(c->status, 0);
        uintptr_t t = (uintptr_t)c->req.cb_data;
        size_t submitted = t - 1 >= N ? (size_t)nq + (t - 1 - N) : t - 1;
        if (submitted != i)
            out_of_order++;
        ck_assert_uint_eq(tdd_sectors_completed_of(c->req.cb_data),
                          t - 1 >= N ? 8 : (uint64_t)nsecs[t - 1]);
    }
    /* The engine decides the order and the driver must not care. The reads of unmapped blocks
     * need no I/O, so the engine answers them before the writes submitted ahead of them: if it
     * ever answers strictly in order, this test no longer covers what it claims. */
    if (verbose())
        fprintf(stderr, "test_many_in_flight: %zu of %d completions out of submission order\n",
                out_of_order, nq * 2);
    ck_assert_msg(out_of_order > 0, "every request completed in submission order");
    for (int i = 0; i < nq * 8 * (int)SEC; i++)
        ck_assert_int_eq(zbuf[i], 0);
    for (int i = 0; i < nq; i++) {
        char *back = malloc((size_t)nsecs[i] * SEC);
        ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, secs_at[i], nsecs[i]), 0);
        ck_assert_mem_eq(back, bufs[i], (size_t)nsecs[i] * SEC);
        free(back);
        free(bufs[i]);
    }
    free(zbuf);
    close_ok(drv);
}
END_TEST

/* Completions that arrive in an order different from submission: a write to a fresh region
 * (allocation, metadata) submitted before a read of a region already mapped and cached. */
START_TEST(test_completion_order_independent)
{
    td_driver_t *drv = open_ok("web1", 0);
    char *a = malloc(8 * SEC), *b = malloc(8 * SEC), *c = malloc(8 * SEC);
    tu_fill(a, 8 * SEC, 1);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, a, 0, 8), 0);
    size_t base = tdd_completion_count();
    /* Far away, new leaf node: more work than the read below. */
    tu_fill(b, 8 * SEC, 2);
    drv->ops->td_queue_write(drv, tdd_request(TD_OP_WRITE, b, WEB1_SIZE / SEC - 8, 8, tag_of(0)));
    drv->ops->td_queue_read(drv, tdd_request(TD_OP_READ, c, 0, 8, tag_of(1)));
    ck_assert_int_eq(tdd_run_until(base + 2, WAIT_MS), 0);
    ck_assert_uint_eq(tdd_completions_of(tag_of(0), NULL), 1);
    ck_assert_uint_eq(tdd_completions_of(tag_of(1), NULL), 1);
    ck_assert_mem_eq(c, a, 8 * SEC);
    if (verbose())
        fprintf(stderr, "test_completion_order_independent: first completed: %s\n",
                tdd_completion_at(base)->req.cb_data == tag_of(1) ? "read (out of order)"
                                                                  : "write (in order)");
    close_ok(drv);
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(test_slot_limit)
{
    td_driver_t *drv = open_ok("web1", 0);
    char *buf = calloc(DRIVER_SLOTS + 1, SEC);
    for (size_t i = 0; i < DRIVER_SLOTS; i++)
        drv->ops->td_queue_read(drv, tdd_request(TD_OP_READ, buf + i * SEC, i % 64, 1, tag_of(i)));
    ck_assert_uint_eq(tdd_completion_count(), 0);
    /* One too many: refused at once with -EBUSY, and only that one. */
    drv->ops->td_queue_read(
        drv, tdd_request(TD_OP_READ, buf + DRIVER_SLOTS * SEC, 0, 1, tag_of(DRIVER_SLOTS)));
    ck_assert_uint_eq(tdd_completion_count(), 1);
    int status = 0;
    ck_assert_uint_eq(tdd_completions_of(tag_of(DRIVER_SLOTS), &status), 1);
    ck_assert_int_eq(status, -EBUSY);

    ck_assert_int_eq(tdd_run_until(DRIVER_SLOTS + 1, WAIT_MS), 0);
    tdd_fire_ready(50);
    assert_each_once(DRIVER_SLOTS + 1);
    for (size_t i = 0; i < DRIVER_SLOTS; i++) {
        ck_assert_uint_eq(tdd_completions_of(tag_of(i), &status), 1);
        ck_assert_int_eq(status, 0);
    }
    /* Slots come back: tapdisk's resubmission now goes through. */
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, 1), 0);
    close_ok(drv);
    free(buf);
}
END_TEST

START_TEST(test_read_only)
{
    td_driver_t *rw = open_ok("web2", 0);
    char *buf = malloc(4 * SEC), *back = malloc(4 * SEC);
    tu_fill(buf, 4 * SEC, 5);
    ck_assert_int_eq(io_sync(rw, TD_OP_WRITE, buf, 10, 4), 0);
    close_ok(rw);

    td_driver_t *ro = open_ok("web2", TD_OPEN_RDONLY);
    ck_assert_uint_eq(ro->info.size, WEB2_SIZE / SEC);
    size_t before = tdd_completion_count();
    ro->ops->td_queue_write(ro, tdd_request(TD_OP_WRITE, buf, 0, 4, tag_of(0)));
    ck_assert_uint_eq(tdd_completion_count(), before + 1);
    int status = 0;
    ck_assert_uint_eq(tdd_completions_of(tag_of(0), &status), 1);
    ck_assert(status == -EROFS || status == -EPERM);
    ck_assert_int_eq(io_sync(ro, TD_OP_READ, back, 10, 4), 0);
    ck_assert_mem_eq(back, buf, 4 * SEC);
    tdd_fire_ready(50);
    ck_assert_uint_eq(tdd_completions_of(tag_of(0), NULL), 1);
    close_ok(ro);
    free(buf);
    free(back);
}
END_TEST

START_TEST(test_snapshot_needs_read_only)
{
    char *buf = malloc(8 * SEC), *back = malloc(8 * SEC);
    td_driver_t *rw = open_ok("web1", 0);
    tu_fill(buf, 8 * SEC, 11);
    ck_assert_int_eq(io_sync(rw, TD_OP_WRITE, buf, 0, 8), 0);
    close_ok(rw);
    plx_store *st = NULL;
    char err[256];
    ck_assert_int_eq(plx_store_open(store_path, NULL, &st, err, sizeof err), 0);
    ck_assert_int_eq(plx_vdi_snapshot(st, "web1", "gold", NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    char params[4400];
    snprintf(params, sizeof params, "%s:web1@gold", store_path);
    td_driver_t *drv = NULL;
    ck_assert_int_eq(try_open(params, 0, &drv), -EROFS);
    ck_assert(tdd_log_contains("read-only"));
    ck_assert_uint_eq(tdd_event_count(), 0);
    drv = open_ok("web1@gold", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, 0, 8), 0);
    ck_assert_mem_eq(back, buf, 8 * SEC);
    close_ok(drv);
    free(buf);
    free(back);
}
END_TEST

/* close() with requests in flight answers them all (from the engine) before it returns. */
START_TEST(test_close_drains)
{
    td_driver_t *drv = open_ok("web1", 0);
    enum { N = 64 };
    char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(4 * SEC);
        tu_fill(bufs[i], 4 * SEC, 300 + (uint64_t)i);
        drv->ops->td_queue_write(
            drv, tdd_request(TD_OP_WRITE, bufs[i], (td_sector_t)i * 11, 4, tag_of((size_t)i)));
    }
    ck_assert_uint_eq(tdd_completion_count(), 0);
    close_ok(drv);
    assert_each_once(N);
    for (int i = 0; i < N; i++) {
        int status = 1;
        ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
        ck_assert_int_eq(status, 0);
    }
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_uint_eq(tdd_bad_unregisters(), 0);

    /* The writes are on the blockstore. */
    drv = open_ok("web1", TD_OPEN_RDONLY);
    char *back = malloc(4 * SEC);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, (td_sector_t)i * 11, 4), 0);
        ck_assert_mem_eq(back, bufs[i], 4 * SEC);
        free(bufs[i]);
    }
    free(back);
    close_ok(drv);
}
END_TEST

/* Overwrites submitted from tapdisk's loop, one per loop turn: with the kick (block-parallax.h) the
 * engine never writes its wake eventfd for them (a write and a read per request before); with
 * $PARALLAX_TD_KICK=0 it does, at least once per request. Both durability modes, all data read
 * back. */
static uint64_t wakes_for_overwrites(const char *params_opts, int kick)
{
    if (!kick)
        setenv("PARALLAX_TD_KICK", "0", 1);
    char params[4400];
    snprintf(params, sizeof params, "%s%s:web1", params_opts, store_path);
    td_driver_t *drv = NULL;
    ck_assert_int_eq(try_open(params, 0, &drv), 0);
    unsetenv("PARALLAX_TD_KICK");
    enum { N = 16, SECS = 8 };
    char *buf = malloc((size_t)N * SECS * SEC), *back = malloc((size_t)N * SECS * SEC);
    tu_fill(buf, (size_t)N * SECS * SEC, 31);
    /* First writes allocate (batch commits): not what is counted. */
    for (size_t i = 0; i < N; i++)
        drv->ops->td_queue_write(drv, tdd_request(TD_OP_WRITE, buf + i * SECS * SEC,
                                                  (td_sector_t)(i * 64), SECS, tag_of(i)));
    ck_assert_int_eq(tdd_run_until(N, WAIT_MS), 0);
    tu_fill(buf, (size_t)N * SECS * SEC, 32);
    struct plx_td_disk *d = drv->data;
    plx_store *st = d->store->st;
    uint64_t w0 = st->wakes;
    unsigned sets0 = tdd_timeout_sets();
    for (int round = 0; round < 4; round++) {
        size_t base = tdd_completion_count();
        /* One request per loop turn, as tapdisk's NBD server hands them in. */
        for (size_t i = 0; i < N; i++) {
            drv->ops->td_queue_write(drv, tdd_request(TD_OP_WRITE, buf + i * SECS * SEC,
                                                      (td_sector_t)(i * 64), SECS,
                                                      tag_of(100 + round * N + i)));
            tdd_fire_ready(0);
        }
        ck_assert_int_eq(tdd_run_until(base + N, WAIT_MS), 0);
    }
    uint64_t wakes = st->wakes - w0;
    /* The kick was armed (and set off again) for the submissions, or not used at all. */
    if (kick)
        ck_assert_uint_gt(tdd_timeout_sets() - sets0, 0);
    else
        ck_assert_uint_eq(tdd_timeout_sets() - sets0, 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_int_eq(
            io_sync(drv, TD_OP_READ, back + i * SECS * SEC, (td_sector_t)(i * 64), SECS), 0);
    ck_assert_mem_eq(back, buf, (size_t)N * SECS * SEC);
    close_ok(drv);
    free(buf);
    free(back);
    return wakes;
}

START_TEST(test_kick_spares_wakes)
{
    static const char *modes[] = {"", "durability=ordered:"};
    for (size_t m = 0; m < 2; m++) {
        uint64_t with = wakes_for_overwrites(modes[m], 1);
        tdd_reset();
        uint64_t without = wakes_for_overwrites(modes[m], 0);
        tdd_reset();
        if (verbose())
            fprintf(stderr,
                    "mode '%s': wakes for 64 overwrites: %llu with the kick, %llu without\n",
                    modes[m], (unsigned long long)with, (unsigned long long)without);
        ck_assert_uint_eq(with, 0);
        ck_assert_uint_ge(without, 64);
    }
}
END_TEST

/* Two disks on one blockstore share one engine and its events (and the process's one control
 * socket); each keeps its own requests. */
START_TEST(test_shared_store)
{
    td_driver_t *a = open_ok("web1", 0);
    td_driver_t *b = open_ok("web2", 0);
    ck_assert_uint_eq(tdd_event_count(), 3);
    char *x = malloc(8 * SEC), *y = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(x, 8 * SEC, 21);
    tu_fill(y, 8 * SEC, 22);
    a->ops->td_queue_write(a, tdd_request(TD_OP_WRITE, x, 0, 8, tag_of(0)));
    b->ops->td_queue_write(b, tdd_request(TD_OP_WRITE, y, 0, 8, tag_of(1)));
    ck_assert_int_eq(tdd_run_until(2, WAIT_MS), 0);
    assert_each_once(2);
    /* Closing b while the store stays open for a: b's own requests are answered before close
     * returns, a's request is left to a. */
    a->ops->td_queue_read(a, tdd_request(TD_OP_READ, back, 0, 8, tag_of(2)));
    for (size_t i = 0; i < 16; i++)
        b->ops->td_queue_write(b, tdd_request(TD_OP_WRITE, y, 64 + i * 8, 8, tag_of(10 + i)));
    close_ok(b);
    for (size_t i = 0; i < 16; i++) {
        int status = 1;
        ck_assert_uint_eq(tdd_completions_of(tag_of(10 + i), &status), 1);
        ck_assert_int_eq(status, 0);
    }
    ck_assert_uint_eq(tdd_event_count(), 3);
    ck_assert_int_eq(tdd_run_until(19, WAIT_MS), 0);
    ck_assert_uint_eq(tdd_completions_of(tag_of(2), NULL), 1);
    ck_assert_mem_eq(back, x, 8 * SEC);
    tdd_fire_ready(50);
    assert_each_once(19);
    close_ok(a);
    ck_assert_uint_eq(tdd_event_count(), 0);

    b = open_ok("web2", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(b, TD_OP_READ, back, 0, 8), 0);
    ck_assert_mem_eq(back, y, 8 * SEC);
    close_ok(b);
    free(x);
    free(y);
    free(back);
}
END_TEST

START_TEST(test_io_errors)
{
    tdd_store_opener = open_on_fault;
    td_driver_t *drv = open_ok("disk", 0);
    ck_assert_ptr_nonnull(fault_be);
    char *buf = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 3);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 0, 8), 0);

    plx_fault_fail_blocks(fault_be, PLX_IO_READ, 0, fault_be->nblocks, -EIO, -1);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, 8), -EIO);
    ck_assert(tdd_log_contains("read of 8 sectors at 0 failed"));
    plx_fault_clear(fault_be);

    plx_fault_fail_blocks(fault_be, PLX_IO_WRITE, 0, fault_be->nblocks, -EIO, -1);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 100, 3), -EIO);
    plx_fault_clear(fault_be);

    /* The disk goes on working once the medium does. */
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, 8), 0);
    tdd_fire_ready(50);
    size_t n = tdd_completion_count();
    assert_each_once(n);
    close_ok(drv);
    tdd_store_opener = NULL;
    free(buf);
}
END_TEST

/* The blockstore is an iSCSI LUN (tgtd on loopback), named in the params as
 * iscsi://HOST:PORT/IQN/LUN:VDI and, for a bare VDI, in the configuration file. */
START_TEST(test_iscsi_blockstore)
{
    char url[512], err[1024] = "";
    ck_assert_int_gt(tu_tgtd_new_lun(64 * MiB, 512, url, sizeof url), 0);
    int rc = plx_format(url, 0, MiB, 0, err, sizeof err);
    ck_assert_msg(rc == 0, "format %s: %d %s", url, rc, err);
    plx_store *st = NULL;
    ck_assert_int_eq(plx_store_open(url, NULL, &st, err, sizeof err), 0);
    ck_assert_int_eq(plx_vdi_create(st, "web1", WEB1_SIZE, NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    char params[1024];
    snprintf(params, sizeof params, "%s:web1", url);
    td_driver_t *drv = NULL;
    ck_assert_msg(try_open(params, 0, &drv) == 0, "%s: %s", params, tdd_log_last());
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    char *wbuf = malloc(16 * SEC), *rbuf = malloc(16 * SEC);
    tu_fill(wbuf, 16 * SEC, 7);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, wbuf, 8, 16), 0);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, rbuf, 8, 16), 0);
    ck_assert_mem_eq(rbuf, wbuf, 16 * SEC);
    close_ok(drv);

    /* The configuration file names the LUN; the params name only the VDI. */
    char conf[4300];
    snprintf(conf, sizeof conf, "%s/blockstore.conf", dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# this host's LUN\n%s\n", url);
    fclose(f);
    setenv("PARALLAX_BLOCKSTORE_FILE", conf, 1);
    ck_assert_msg(try_open("web1", TD_OPEN_RDONLY, &drv) == 0, "%s", tdd_log_last());
    memset(rbuf, 0, 16 * SEC);
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, rbuf, 8, 16), 0);
    ck_assert_mem_eq(rbuf, wbuf, 16 * SEC);
    close_ok(drv);

    /* A URL without a VDI after the LUN number is malformed, not a path to look up. */
    snprintf(params, sizeof params, "%s:", url);
    ck_assert_int_eq(try_open(params, 0, &drv), -EINVAL);
    free(wbuf);
    free(rbuf);
}
END_TEST

/* ---- Block status ------------------------------------------------------------------------------
 */

/* The pieces completed for `tag`, in completion order, must tile [sec, sec + secs) exactly; each
 * piece's state must match want(sector) for every sector it covers. */
static void assert_status_tiles(const void *tag, td_sector_t sec, int secs,
                                int (*want)(td_sector_t s))
{
    td_sector_t next = sec;
    for (size_t i = 0; i < tdd_completion_count(); i++) {
        const struct tdd_completion *c = tdd_completion_at(i);
        if (c->req.cb_data != tag)
            continue;
        ck_assert_int_eq(c->status, 0);
        ck_assert_int_eq(c->req.op, TD_OP_BLOCK_STATUS);
        ck_assert_msg(c->req.sec == next, "piece at %llu, expected %llu",
                      (unsigned long long)c->req.sec, (unsigned long long)next);
        ck_assert_int_gt(c->req.secs, 0);
        for (td_sector_t s2 = c->req.sec; s2 < c->req.sec + (td_sector_t)c->req.secs; s2++)
            ck_assert_msg(c->req.status == want(s2), "sector %llu: state %d, expected %d",
                          (unsigned long long)s2, c->req.status, want(s2));
        next += (td_sector_t)c->req.secs;
    }
    ck_assert_uint_eq(next, sec + (td_sector_t)secs);
}

/* web1 after the writes of test_block_status: mapped 4 KiB blocks at sectors [0, 8) and
 * [8192, 8200). */
static int web1_state(td_sector_t s)
{
    int mapped = s < 8 || (s >= 8192 && s < 8200);
    return mapped ? TD_BLOCK_STATE_NONE : TD_BLOCK_STATE_HOLE | TD_BLOCK_STATE_ZERO;
}

/* queue_block_status is answered from the engine's event (never inside the call), in pieces
 * that tile the request in order, mapped runs as NONE and holes as HOLE|ZERO; on snapshots too. */
START_TEST(test_block_status)
{
    td_driver_t *drv = open_ok("web1", 0);
    char *buf = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 9);
    /* One sector written maps its whole 4 KiB block. */
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 2, 1), 0);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, buf, 8192, 8), 0);
    tdd_reset();
    const td_sector_t total = WEB1_SIZE / SEC;
    drv->ops->td_queue_block_status(
        drv, tdd_request(TD_OP_BLOCK_STATUS, NULL, 0, (int)total, tag_of(0)));
    drv->ops->td_queue_block_status(drv, tdd_request(TD_OP_BLOCK_STATUS, NULL, 3, 20, tag_of(1)));
    drv->ops->td_queue_block_status(drv, tdd_request(TD_OP_BLOCK_STATUS, NULL, 8190, 5, tag_of(2)));
    ck_assert_uint_eq(tdd_completion_count(), 0);
    /* 4 + 2 + 2 pieces. */
    ck_assert_int_eq(tdd_run_until(8, WAIT_MS), 0);
    tdd_fire_ready(50);
    ck_assert_uint_eq(tdd_completion_count(), 8);
    assert_status_tiles(tag_of(0), 0, (int)total, web1_state);
    assert_status_tiles(tag_of(1), 3, 20, web1_state);
    assert_status_tiles(tag_of(2), 8190, 5, web1_state);
    /* Out of range: refused at once. */
    drv->ops->td_queue_block_status(drv,
                                    tdd_request(TD_OP_BLOCK_STATUS, NULL, total, 1, tag_of(3)));
    int status = 0;
    ck_assert_uint_eq(tdd_completions_of(tag_of(3), &status), 1);
    ck_assert_int_eq(status, -EINVAL);
    close_ok(drv);

    /* A snapshot's status, read-only. */
    drv = open_ok("web1", 0);
    ck_assert_int_eq(drv->ops->td_close(drv), 0);
    tdd_driver_free(drv);
    plx_store *st = NULL;
    char err[256];
    ck_assert_int_eq(plx_store_open(store_path, NULL, &st, err, sizeof err), 0);
    ck_assert_int_eq(plx_vdi_snapshot(st, "web1", "s", NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    drv = open_ok("web1@s", TD_OPEN_RDONLY);
    tdd_reset();
    drv->ops->td_queue_block_status(
        drv, tdd_request(TD_OP_BLOCK_STATUS, NULL, 0, (int)total, tag_of(4)));
    ck_assert_int_eq(tdd_run_until(4, WAIT_MS), 0);
    assert_status_tiles(tag_of(4), 0, (int)total, web1_state);
    close_ok(drv);
    free(buf);
}
END_TEST

/* close() with reads, writes and block status in flight answers every sector exactly once. */
START_TEST(test_close_with_mixed_requests_in_flight)
{
    td_driver_t *drv = open_ok("web1", 0);
    enum { N = 48 };
    char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(8 * SEC);
        tu_fill(bufs[i], 8 * SEC, 500 + (uint64_t)i);
        td_sector_t sec = (td_sector_t)i * 64;
        if (i % 3 == 0)
            drv->ops->td_queue_write(drv,
                                     tdd_request(TD_OP_WRITE, bufs[i], sec, 8, tag_of((size_t)i)));
        else if (i % 3 == 1)
            drv->ops->td_queue_read(drv,
                                    tdd_request(TD_OP_READ, bufs[i], sec, 8, tag_of((size_t)i)));
        else
            drv->ops->td_queue_block_status(
                drv, tdd_request(TD_OP_BLOCK_STATUS, NULL, sec, 4096, tag_of((size_t)i)));
    }
    ck_assert_uint_eq(tdd_completion_count(), 0);
    close_ok(drv);
    for (int i = 0; i < N; i++) {
        if (i % 3 == 2) {
            ck_assert_uint_eq(tdd_sectors_completed_of(tag_of((size_t)i)), 4096);
        } else {
            int status = 1;
            ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
            ck_assert_int_eq(status, 0);
        }
        free(bufs[i]);
    }
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_uint_eq(tdd_bad_unregisters(), 0);
}
END_TEST

static Suite *tapdisk_suite(void)
{
    Suite *s = suite_create("tapdisk");
    TCase *tc;
    tc = tcase_create("open");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_open_reports_size_and_registers_event);
    tcase_add_test(tc, test_malformed_params);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_default_blockstore);
    tcase_add_test(tc, test_colons_in_paths_and_labels);
    suite_add_tcase(s, tc);

    tc = tcase_create("io");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_write_then_read);
    tcase_add_test(tc, test_unaligned_requests);
    tcase_add_test(tc, test_out_of_range);
    tcase_add_test(tc, test_many_in_flight);
    tcase_add_test(tc, test_completion_order_independent);
    tcase_add_test(tc, test_slot_limit);
    tcase_add_test(tc, test_read_only);
    tcase_add_test(tc, test_snapshot_needs_read_only);
    tcase_add_test(tc, test_close_drains);
    tcase_add_test(tc, test_shared_store);
    tcase_add_test(tc, test_kick_spares_wakes);
    tcase_add_test(tc, test_io_errors);
    tcase_add_test(tc, test_block_status);
    tcase_add_test(tc, test_close_with_mixed_requests_in_flight);
    suite_add_tcase(s, tc);

    if (tu_tgtd_running()) {
        tc = tcase_create("iscsi");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_iscsi_blockstore);
        suite_add_tcase(s, tc);
    }
    return s;
}

/* tgtd for the iSCSI case; without it the rest runs and the exit status is 77, never 0. */
int main(void)
{
    char why[512] = "";
    int have_tgtd = tu_tgtd_start(why, sizeof why) == 0;
    if (!have_tgtd)
        printf("SKIP: tapdisk on an iSCSI blockstore: %s\n", why);
    int rc = tu_run_suite(tapdisk_suite());
    return rc == EXIT_SUCCESS && !have_tgtd ? 77 : rc;
}
