/*
 * test_tapdisk.c - the blktap3 driver (tapdisk/block-parallax.c) against a test double of
 * tapdisk (tapdisk_double.c): parameters, open/close, the event that drives the engine,
 * reads and writes completed exactly once with the right data, unaligned requests, many
 * requests in flight, the slot limit (-EBUSY), read-only disks, draining at close, a store
 * shared by two disks, I/O errors (on a fault-injection backend), block status answered
 * asynchronously, the control socket served from tapdisk's loop (live snapshots), and the
 * durability of completed writes in each durability mode under simulated crashes.
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
#include "testutil.h"
#include "tgtd.h"

#define MiB (1ull << 20)
#define SEC 512u
#define WEB1_SIZE (16 * MiB)
#define WEB2_SIZE (8 * MiB)
#define WAIT_MS 20000

/* The driver's request slots per disk (PLX_TD_SLOTS, block-parallax.h). */
#define DRIVER_SLOTS 1024

static char dir[4096];
static char store_path[4200];
static char run_dir[4200];

/* ---- Fixture: a file blockstore with VDIs web1 (16 MiB) and web2 (8 MiB) -------------------- */

static void setup(void)
{
    snprintf(dir, sizeof dir, "%s/plx-test-tapdisk-XXXXXX", tu_tmpdir());
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
    snprintf(store_path, sizeof store_path, "%s/store.img", dir);
    char err[512] = "";
    int rc = plx_format(store_path, 64 * MiB, MiB, 0, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    plx_store *st = NULL;
    rc = plx_store_open(store_path, NULL, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    ck_assert_int_eq(plx_vdi_create(st, "web1", WEB1_SIZE, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "web2", WEB2_SIZE, NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    unsetenv("PARALLAX_BLOCKSTORE");
    setenv("PARALLAX_BLOCKSTORE_FILE", "/nonexistent/parallax-blockstore", 1);
    setenv("PARALLAX_WRITE_CACHE_FILE", "/nonexistent/parallax-write-cache", 1);
    /* The control socket of a writable disk goes here, never under /run. */
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    setenv("PARALLAX_RUN_DIR", run_dir, 1);
    tdd_reset();
}

static void teardown(void)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/store.img", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/blockstore.conf", dir);
    unlink(p);
    control_path((int)getpid(), p, sizeof p);
    unlink(p);
    rmdir(run_dir);
    rmdir(dir);
    tdd_reset();
}

/* ---- Helpers ------------------------------------------------------------------------------------
 */

static int try_open(const char *params, td_flag_t flags, td_driver_t **out)
{
    td_driver_t *drv = tdd_driver_new(&tapdisk_parallax, params);
    ck_assert_ptr_nonnull(drv);
    int rc = drv->ops->td_open(drv, params, NULL, flags);
    if (rc != 0) {
        tdd_driver_free(drv);
        drv = NULL;
    }
    *out = drv;
    return rc;
}

static td_driver_t *open_ok(const char *vdi, td_flag_t flags)
{
    char params[4400];
    snprintf(params, sizeof params, "%s:%s", store_path, vdi);
    td_driver_t *drv = NULL;
    int rc = try_open(params, flags, &drv);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", params, rc, tdd_log_last());
    return drv;
}

static void close_ok(td_driver_t *drv)
{
    ck_assert_int_eq(drv->ops->td_close(drv), 0);
    tdd_driver_free(drv);
}

static int verbose(void)
{
    const char *v = getenv("TDD_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static void *tag_of(size_t i)
{
    return (void *)(uintptr_t)(i + 1);
}

/* Submit one request and wait for it; asserts it completed exactly once; returns its status. */
static int io_sync(td_driver_t *drv, int op, void *buf, td_sector_t sec, int secs)
{
    static uintptr_t next_tag = 1000000;
    void *tag = (void *)next_tag++;
    size_t before = tdd_completion_count();
    td_request_t r = tdd_request(op, buf, sec, secs, tag);
    if (op == TD_OP_WRITE)
        drv->ops->td_queue_write(drv, r);
    else
        drv->ops->td_queue_read(drv, r);
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of(tag, &status), 1);
    ck_assert_uint_eq(tdd_sectors_completed_of(tag), (uint64_t)secs);
    return status;
}

/* Every recorded completion names a distinct request (no request completed twice). */
static void assert_each_once(size_t expected)
{
    ck_assert_uint_eq(tdd_completion_count(), expected);
    for (size_t i = 0; i < expected; i++) {
        const struct tdd_completion *c = tdd_completion_at(i);
        ck_assert_uint_eq(tdd_completions_of(c->req.cb_data, NULL), 1);
    }
}

/* ---- Parameters and open -----------------------------------------------------------------------
 */

START_TEST(test_open_reports_size_and_registers_event)
{
    td_driver_t *drv = open_ok("web1", 0);
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    ck_assert_int_eq(drv->info.sector_size, 512);
    /* The engine's descriptor and the control socket's listener. */
    ck_assert_uint_eq(tdd_event_count(), 2);
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

/* Two disks on one blockstore share one engine and one event (and the process's one control
 * socket); each keeps its own requests. */
START_TEST(test_shared_store)
{
    td_driver_t *a = open_ok("web1", 0);
    td_driver_t *b = open_ok("web2", 0);
    ck_assert_uint_eq(tdd_event_count(), 2);
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
    ck_assert_uint_eq(tdd_event_count(), 2);
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

/* ---- I/O errors, through the test hook on a fault-injection backend ------------------------- */

static plx_backend *fault_be;

static int open_on_fault(const char *path, const struct plx_open_opts *opts, plx_store **out,
                         char *errbuf, size_t errlen)
{
    plx_backend *mem = plx_backend_mem_create(16 * MiB / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, MiB, errbuf, errlen), 0);
    plx_backend *init = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    int rc = plx_store_open_backend(init, opts, out, errbuf, errlen);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(plx_vdi_create(*out, "disk", 4 * MiB, NULL), 0);
    fault_be = init;
    return 0;
}

/* The same, but the store does not own the fault backend (tu_keep_wrap), so that the test can
 * build crash images from its log after the disk is closed. */
static int open_on_fault_kept(const char *path, const struct plx_open_opts *opts, plx_store **out,
                              char *errbuf, size_t errlen)
{
    plx_backend *mem = plx_backend_mem_create(16 * MiB / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, MiB, errbuf, errlen), 0);
    fault_be = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    int rc = plx_store_open_backend(tu_keep_wrap(fault_be), opts, out, errbuf, errlen);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(plx_vdi_create(*out, "disk", 4 * MiB, NULL), 0);
    return 0;
}

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

/* ---- Control socket: admin commands served from tapdisk's loop
 * ----------------------------------- */

/* Send one control line to this process's control socket and run tapdisk's loop until the reply
 * arrives (the client must not block: the server runs in this thread). Returns the reply line. */
static void control_call(const char *line, char *reply, size_t len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    control_path((int)getpid(), sa.sun_path, sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect %s: %s",
                  sa.sun_path, strerror(errno));
    ck_assert_int_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    size_t got = 0;
    for (int i = 0; i < 400; i++) {
        tdd_fire_ready(50);
        ssize_t r = read(fd, reply + got, len - 1 - got);
        if (r > 0)
            got += (size_t)r;
        if (r == 0 || (got && reply[got - 1] == '\n'))
            break;
    }
    close(fd);
    reply[got] = 0;
    char *nl = strchr(reply, '\n');
    if (nl)
        *nl = 0;
}

static uint64_t vdi_id_of(const char *name)
{
    plx_store *st = NULL;
    char err[256];
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1};
    ck_assert_int_eq(plx_store_open(store_path, &o, &st, err, sizeof err), 0);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(st, name, &info), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    return info.id;
}

/* While tapdisk holds web1, a snapshot taken through the control socket freezes the writes
 * before it and not those after; labels and deletes work too; the socket goes with the disk. */
START_TEST(test_control_snapshot)
{
    uint64_t id = vdi_id_of("web1");
    td_driver_t *drv = open_ok("web1", 0);
    char *a = malloc(8 * SEC), *b = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(a, 8 * SEC, 71);
    tu_fill(b, 8 * SEC, 72);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, a, 16, 8), 0);
    char line[64], reply[512];
    snprintf(line, sizeof line, "snapshot %llu before", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 1");
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, b, 16, 8), 0);
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 2");
    snprintf(line, sizeof line, "snap-label %llu 2 after", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)id + 100);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 2 ", 6) == 0, "reply: %s", reply);
    /* The snapshots hold what was written before each, seen by a read-only opener in this
     * tapdisk too. */
    td_driver_t *snap = open_ok("web1@before", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(snap, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, a, 8 * SEC);
    close_ok(snap);
    snap = open_ok("web1@after", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(snap, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, b, 8 * SEC);
    close_ok(snap);
    snprintf(line, sizeof line, "snap-delete %llu 1", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    close_ok(drv);
    char path[256];
    control_path((int)getpid(), path, sizeof path);
    ck_assert_msg(access(path, F_OK) != 0, "control socket %s left behind", path);
    ck_assert_uint_eq(tdd_event_count(), 0);

    plx_store *st = NULL;
    char err[256];
    ck_assert_int_eq(plx_store_open(store_path, NULL, &st, err, sizeof err), 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "web1@before", &si), -ENOENT);
    ck_assert_int_eq(plx_snap_lookup(st, "web1@after", &si), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    free(a);
    free(b);
    free(back);
}
END_TEST

/* ---- Control commands never block tapdisk's loop -----------------------------------------------
 */

static uint64_t held_disk_id;

/* A store on the fault backend with VDIs "disk" (snapshot 1 labelled "old") and "disk2". */
static int open_on_fault_snapped(const char *path, const struct plx_open_opts *opts,
                                 plx_store **out, char *errbuf, size_t errlen)
{
    open_on_fault(path, opts, out, errbuf, errlen);
    uint64_t idx = 0;
    ck_assert_int_eq(plx_vdi_snapshot(*out, "disk", "old", &idx), 0);
    ck_assert_uint_eq(idx, 1);
    ck_assert_int_eq(plx_vdi_create(*out, "disk2", 4 * MiB, NULL), 0);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(*out, "disk", &info), 0);
    held_disk_id = info.id;
    return 0;
}

/* Connect to this process's control socket and send `line` without waiting for the reply. */
static int control_send(const char *line)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    control_path((int)getpid(), sa.sun_path, sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Whatever the server has answered on fd so far (the loop is not run here). */
static size_t control_poll(int fd, char *reply, size_t len, size_t got)
{
    ssize_t r = read(fd, reply + got, len - 1 - got);
    if (r > 0)
        got += (size_t)r;
    reply[got] = 0;
    return got;
}

/* Send `line` while the medium holds I/O of kind `op`, and show the command is carried out
 * without stopping the loop: its I/O gets held and it stays unanswered, while `serve` (a
 * request on another part of the disk, or another disk) completes meanwhile; released, the
 * command answers `expect`. On a loop that blocks, the callback that runs the command waits
 * out the hold (2 s) and the command is answered before any other request is looked at. */
static void command_beside_io(plx_backend *be, enum plx_io_op op, const char *line,
                              td_driver_t *other, int other_op, void *buf, const char *expect)
{
    char reply[256];
    size_t got = 0;
    plx_fault_hold_blocks(be, op, 0, be->nblocks, 2000);
    int fd = control_send(line);
    for (int i = 0; i < 100 && !plx_fault_held(be) && !got; i++) {
        tdd_fire_ready(20);
        got = control_poll(fd, reply, sizeof reply, got);
    }
    ck_assert_msg(got == 0 && plx_fault_held(be) > 0,
                  "'%s': answered '%s' with %u I/O held: the loop waited for the medium", line,
                  reply, plx_fault_held(be));
    size_t before = tdd_completion_count();
    static uintptr_t tag = 5000000;
    td_request_t r = tdd_request(other_op, buf, 0, 8, (void *)++tag);
    if (other_op == TD_OP_WRITE)
        other->ops->td_queue_write(other, r);
    else
        other->ops->td_queue_read(other, r);
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of((void *)tag, &status), 1);
    ck_assert_int_eq(status, 0);
    got = control_poll(fd, reply, sizeof reply, got);
    ck_assert_msg(got == 0, "'%s' answered '%s' before its I/O completed", line, reply);
    ck_assert_uint_gt(plx_fault_held(be), 0);
    plx_fault_release(be);
    for (int i = 0; i < 400 && !(got && reply[got - 1] == '\n'); i++) {
        tdd_fire_ready(20);
        got = control_poll(fd, reply, sizeof reply, got);
    }
    close(fd);
    char *nl = strchr(reply, '\n');
    if (nl)
        *nl = 0;
    ck_assert_msg(strcmp(reply, expect) == 0, "'%s': expected '%s', got '%s'", line, expect, reply);
}

START_TEST(test_control_commands_never_block)
{
    tdd_store_opener = open_on_fault_snapped;
    td_driver_t *drv = open_ok("disk", 0);
    tdd_store_opener = NULL;
    td_driver_t *drv2 = open_ok("disk2", 0); /* the same store: one engine, one loop */
    char *data = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(data, 8 * SEC, 91);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, data, 0, 8), 0);
    ck_assert_int_eq(io_sync(drv2, TD_OP_WRITE, data, 0, 8), 0); /* its nodes now cached */
    char line[128];
    unsigned long long id = (unsigned long long)held_disk_id;

    /* The first labelled snapshot since open reads the log's labels: with reads held, the
     * other disk's writes go on. */
    snprintf(line, sizeof line, "snapshot %llu new", id);
    command_beside_io(fault_be, PLX_IO_READ, line, drv2, TD_OP_WRITE, data, "ok 2");
    /* A label and a delete rewrite a log block: with writes held, reads go on. */
    snprintf(line, sizeof line, "snap-label %llu 1 renamed", id);
    command_beside_io(fault_be, PLX_IO_WRITE, line, drv, TD_OP_READ, back, "ok");
    ck_assert_mem_eq(back, data, 8 * SEC);
    snprintf(line, sizeof line, "snap-delete %llu 2", id);
    command_beside_io(fault_be, PLX_IO_WRITE, line, drv, TD_OP_READ, back, "ok");

    /* What they did: "new" is gone, "old" is "renamed", and a label in use is refused. */
    char reply[256];
    snprintf(line, sizeof line, "snap-label %llu 1 renamed", id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    snprintf(line, sizeof line, "snapshot %llu renamed", id);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 17 ", 7) == 0, "reply: %s", reply);
    snprintf(line, sizeof line, "snap-label %llu 2 again", id);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 2 ", 6) == 0, "reply: %s", reply);
    td_driver_t *snap = open_ok("disk@renamed", TD_OPEN_RDONLY);
    close_ok(snap);
    td_driver_t *gone = NULL;
    char params[4400];
    snprintf(params, sizeof params, "%s:disk@new", store_path);
    ck_assert_int_eq(try_open(params, TD_OPEN_RDONLY, &gone), -ENOENT);
    close_ok(drv2);
    close_ok(drv);
    free(data);
    free(back);
}
END_TEST

/* ---- Migration: the destination's open waits for the source to let go ----------------------- */

/* The "source host": an engine on the same blockstore with another host identity, holding web1
 * for writing, as the source's tapdisk does while libxl attaches the disk on the destination. */
static plx_store *source_open(plx_vdi **v)
{
    plx_store *st = NULL;
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .host = "source-host"};
    ck_assert_msg(plx_store_open(store_path, &o, &st, err, sizeof err) == 0, "source: %s", err);
    ck_assert_int_eq(plx_vdi_open(st, "web1", 0, v), 0);
    return st;
}

static void queue_io(td_driver_t *drv, int op, void *buf, td_sector_t sec, int secs, void *tag)
{
    td_request_t r = tdd_request(op, buf, sec, secs, tag);
    if (op == TD_OP_WRITE)
        drv->ops->td_queue_write(drv, r);
    else
        drv->ops->td_queue_read(drv, r);
}

/* libxl opens the disk on the destination while the source still holds the VDI: the open
 * succeeds at once, its requests wait (none is served while the source can still write), and
 * once the source lets go they are served in order, seeing everything the source wrote. */
START_TEST(test_open_waits_for_holder)
{
    setenv("PARALLAX_HANDOVER_WAIT", "30", 1);
    plx_vdi *sv = NULL;
    plx_store *src = source_open(&sv);
    char *a = malloc(8 * SEC), *b = malloc(8 * SEC), *c = malloc(8 * SEC);
    char *back = malloc(8 * SEC), *back2 = malloc(8 * SEC);
    tu_fill(a, 8 * SEC, 31);
    tu_fill(b, 8 * SEC, 32);
    tu_fill(c, 8 * SEC, 33);
    ck_assert_int_eq(plx_vdi_pwrite(sv, a, 0, 8 * SEC, PLX_WRITE_FUA), 0);

    td_driver_t *drv = open_ok("web1", 0);
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    ck_assert_msg(tdd_log_contains("waiting for it"), "no log line about the wait: %s",
                  tdd_log_last());
    queue_io(drv, TD_OP_READ, back, 0, 8, tag_of(0));
    queue_io(drv, TD_OP_WRITE, b, 16, 8, tag_of(1));
    queue_io(drv, TD_OP_READ, back2, 8, 8, tag_of(2)); /* the source writes this below */
    for (int i = 0; i < 10; i++)
        tdd_fire_ready(20);
    ck_assert_msg(tdd_completion_count() == 0,
                  "%zu requests answered while the source still held the VDI",
                  tdd_completion_count());
    /* The source goes on writing, then lets go (the guest stopped there; libxl's remove). */
    ck_assert_int_eq(plx_vdi_pwrite(sv, c, 8 * SEC, 8 * SEC, PLX_WRITE_FUA), 0);
    ck_assert_int_eq(plx_vdi_close(sv), 0);
    ck_assert_int_eq(tdd_run_until(3, WAIT_MS), 0);
    for (int i = 0; i < 3; i++) {
        int status = 1;
        ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
        ck_assert_int_eq(status, 0);
    }
    ck_assert_mem_eq(back, a, 8 * SEC);
    ck_assert_mem_eq(back2, c, 8 * SEC);
    ck_assert_msg(tdd_log_contains("handed over after"), "no handover log line: %s",
                  tdd_log_last());
    /* The destination holds it now: the source cannot take it back, and commands reach it.
     * The destination may still hold the admin lock for a claim of extents ahead (alloc_claim.c),
     * whose I/O completes only when this thread runs the destination's loop: the source's try
     * then waits out PARALLAX_LOCK_TIMEOUT (30 s) and fails with EBUSY for the wrong reason.
     * So the source tries with a short lock timeout, the loop runs between tries, and the
     * refusal must name the holder. */
    setenv("PARALLAX_LOCK_TIMEOUT", "0.2", 1);
    int rc = 0;
    for (int i = 0; i < 50; i++) {
        rc = plx_vdi_open(src, "web1", 0, &sv);
        if (rc != -EBUSY || !strstr(plx_store_errmsg(src), "admin lock"))
            break;
        tdd_fire_ready(20);
    }
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    ck_assert_int_eq(rc, -EBUSY);
    ck_assert_msg(strstr(plx_store_errmsg(src), "already open for writing by"),
                  "the source's open failed for another reason: %s", plx_store_errmsg(src));
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, b, 8 * SEC);
    char line[64], reply[256];
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)vdi_id_of("web1"));
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 1");
    close_ok(drv);
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_int_eq(plx_store_close(src), 0);
    unsetenv("PARALLAX_HANDOVER_WAIT");
    free(a);
    free(b);
    free(c);
    free(back);
    free(back2);
}
END_TEST

/* A source that never lets go: after $PARALLAX_HANDOVER_WAIT the queued requests fail with EIO
 * (a log line says why), later ones too; and a disk closed while it waits answers its queued
 * requests with EIO. */
START_TEST(test_open_wait_times_out)
{
    setenv("PARALLAX_HANDOVER_WAIT", "0.3", 1);
    plx_vdi *sv = NULL;
    plx_store *src = source_open(&sv);
    char *buf = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 5);
    td_driver_t *drv = open_ok("web1", 0);
    queue_io(drv, TD_OP_READ, buf, 0, 8, tag_of(0));
    queue_io(drv, TD_OP_WRITE, buf, 8, 8, tag_of(1));
    ck_assert_int_eq(tdd_run_until(2, WAIT_MS), 0);
    for (int i = 0; i < 2; i++) {
        int status = 0;
        ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
        ck_assert_int_eq(status, -EIO);
    }
    ck_assert_msg(tdd_log_contains("gave up waiting"), "no log line: %s", tdd_log_last());
    ck_assert_msg(tdd_log_contains("already open for writing by"),
                  "the log line names no holder: %s", tdd_log_last());
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, 8), -EIO);
    close_ok(drv);
    ck_assert_uint_eq(tdd_event_count(), 0);

    /* Closed while waiting. */
    setenv("PARALLAX_HANDOVER_WAIT", "30", 1);
    tdd_reset();
    drv = open_ok("web1", 0);
    queue_io(drv, TD_OP_READ, buf, 0, 8, tag_of(5));
    tdd_fire_ready(20);
    ck_assert_uint_eq(tdd_completion_count(), 0);
    close_ok(drv);
    int status = 0;
    ck_assert_uint_eq(tdd_completions_of(tag_of(5), &status), 1);
    ck_assert_int_eq(status, -EIO);
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_uint_eq(tdd_bad_unregisters(), 0);
    /* The source still holds it, untouched. */
    ck_assert_int_eq(plx_vdi_pwrite(sv, buf, 0, 8 * SEC, PLX_WRITE_FUA), 0);
    ck_assert_int_eq(plx_vdi_close(sv), 0);
    ck_assert_int_eq(plx_store_close(src), 0);
    unsetenv("PARALLAX_HANDOVER_WAIT");
    free(buf);
}
END_TEST

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

/* ---- With the real lock manager ---------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* parallax-lockd, built beside this binary, listening on 127.0.0.1:port. */
static pid_t lockd_start(int port)
{
    char exe[4096], path[4200], listen[64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(path, sizeof path, "%s/../parallax-lockd", exe);
    ck_assert_msg(access(path, X_OK) == 0, "%s not built", path);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(126);
        execl(path, path, "--listen", listen, "--lease", "3", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok)
            return pid;
        usleep(20000);
    }
    ck_abort_msg("parallax-lockd did not start on port %d", port);
    return -1;
}

/* Two disks in one tapdisk: a write to web2 that needs new extents while another process holds
 * the blockstore's admin lock waits alone (its claim waits on tapdisk's loop), web1's in-place
 * overwrites are served meanwhile, and the write completes once the lock is free. Before, the
 * claim slept in the admin lock's retry loop inside tapdisk's event callback: web1 waited with
 * it, and web2's write failed after the lock timeout. */
START_TEST(test_write_needing_extent_waits_alone)
{
    setenv("PARALLAX_LOCK_TIMEOUT", "3", 1);
    td_driver_t *web1 = open_ok("web1", 0);
    td_driver_t *web2 = open_ok("web2", 0);
    char *buf = malloc(2048 * SEC), *big = malloc(8000 * SEC), *back = malloc(8000 * SEC);
    tu_fill(buf, 2048 * SEC, 51);
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 0, 2048), 0);
    /* Another process's admin lock: flock on the store file, as the file backend takes it. */
    int fd = open(store_path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    /* (A claim made ahead may hold it a moment: tapdisk's loop runs until it lets go.) */
    int locked = -1;
    for (int i = 0; i < 400 && (locked = flock(fd, LOCK_EX | LOCK_NB)) != 0; i++)
        tdd_fire_ready(5);
    ck_assert_int_eq(locked, 0);
    tu_fill(big, 8000 * SEC, 52); /* 1000 blocks: more than the held extents and a spare */
    size_t before = tdd_completion_count();
    void *tag = (void *)(uintptr_t)777777;
    web2->ops->td_queue_write(web2, tdd_request(TD_OP_WRITE, big, 0, 8000, tag));
    tdd_run_until(before + 1, 300);
    ck_assert_uint_eq(tdd_completions_of(tag, NULL), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf + i * 8 * SEC, (td_sector_t)i * 64, 8), 0);
    ck_assert_uint_eq(tdd_completions_of(tag, NULL), 0);
    ck_assert_int_eq(flock(fd, LOCK_UN), 0);
    close(fd);
    before = tdd_completion_count();
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of(tag, &status), 1);
    ck_assert_int_eq(status, 0);
    ck_assert_int_eq(io_sync(web2, TD_OP_READ, back, 0, 8000), 0);
    ck_assert(memcmp(back, big, 8000 * SEC) == 0);
    close_ok(web2);
    close_ok(web1);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    free(buf);
    free(big);
    free(back);
}
END_TEST

/* lockd stops answering (SIGSTOP), then goes away, while this tapdisk serves web1 from a store
 * shared through it: opening web2 (same store) fails after $PARALLAX_LOCK_TIMEOUT, and the log
 * line says the lock manager does not answer / cannot be reached; web1 is still served. */
START_TEST(test_open_with_lockd_gone)
{
    int port = free_port();
    pid_t lockd = lockd_start(port);
    char err[256] = "", addr[64];
    plx_store *st = NULL;
    ck_assert_msg(plx_store_open(store_path, NULL, &st, err, sizeof err) == 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_msg(plx_store_set_lockd(st, addr) == 0, "%s", plx_store_errmsg(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    setenv("PARALLAX_LOCK_TIMEOUT", "1", 1);

    td_driver_t *web1 = open_ok("web1", 0);
    char *buf = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 41);
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 0, 8), 0);

    /* Let a claim made ahead give its TRY grant back (the heartbeat does): an admin lock held
     * here would let the open through. */
    for (int i = 0; i < 40; i++)
        tdd_fire_ready(50);
    char params[4400];
    snprintf(params, sizeof params, "%s:web2", store_path);
    td_driver_t *web2 = NULL;
    /* Frozen: the connection stays up and nothing answers (before, the log blamed "another
     * process" holding the admin lock). */
    kill(lockd, SIGSTOP);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = try_open(params, 0, &web2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kill(lockd, SIGCONT);
    ck_assert_int_eq(rc, -EHOSTUNREACH);
    /* The lock timeout (1 s), not lockd's reply timeout on top (5 s more before). */
    ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 4);
    ck_assert_msg(tdd_log_contains("cannot open VDI web2") && tdd_log_contains("lock manager") &&
                      tdd_log_contains("has not answered"),
                  "the log does not say the lock manager does not answer: %s", tdd_log_last());
    kill(lockd, SIGKILL);
    waitpid(lockd, NULL, 0);
    rc = try_open(params, 0, &web2);
    ck_assert_int_eq(rc, -EHOSTUNREACH);
    ck_assert_msg(tdd_log_contains("cannot open VDI web2") && tdd_log_contains("lock manager"),
                  "the log does not say the lock manager cannot be reached: %s", tdd_log_last());
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 8, 8), 0);
    ck_assert_int_eq(io_sync(web1, TD_OP_READ, back, 8, 8), 0);
    ck_assert_mem_eq(back, buf, 8 * SEC);
    (void)web1->ops->td_close(web1); /* clearing web1's lock needs lockd: it fails, said */
    tdd_driver_free(web1);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    free(buf);
    free(back);
}
END_TEST

static Suite *tapdisk_suite(void)
{
    Suite *s = suite_create("tapdisk");
    TCase *tc = tcase_create("open");
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
    tcase_add_test(tc, test_io_errors);
    tcase_add_test(tc, test_block_status);
    tcase_add_test(tc, test_close_with_mixed_requests_in_flight);
    tcase_add_test(tc, test_control_snapshot);
    tcase_add_test(tc, test_control_commands_never_block);
    tcase_add_test(tc, test_open_waits_for_holder);
    tcase_add_test(tc, test_open_wait_times_out);
    tcase_add_test(tc, test_durability_option_errors);
    tcase_add_test(tc, test_write_cache_param);
    tcase_add_test(tc, test_open_with_lockd_gone);
    tcase_add_test(tc, test_durability_fua);
    tcase_add_test(tc, test_fua_overwrite_io);
    tcase_add_test(tc, test_durability_ordered);
    suite_add_tcase(s, tc);

    tc = tcase_create("room");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_write_needing_extent_waits_alone);
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
