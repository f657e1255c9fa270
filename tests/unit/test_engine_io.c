/*
 * test_engine_io.c - the engine's I/O through the public API (parallax.h), on memory media:
 * sparse and byte-granular reads and writes, range and read-only errors, trim, block status,
 * large writes, a small node cache, data placement by leaf and read merging (engine_fixture.c
 * holds the helpers it shares with test_engine.c).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_fault.h"
#include "format.h"
#include "read_plan.h" /* plx_read_plan_make */
#include "engine_fixture.h"
#include "testutil.h"

/* The same with data placed by leaf (plx_open_opts.placement). */
static plx_store *open_kept_by_leaf(plx_backend *mem)
{
    char err[256] = "";
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o, .placement = PLX_PLACEMENT_LEAF};
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

/* ---- I/O
 * ----------------------------------------------------------------------------------------- */

START_TEST(test_sparse_reads_zero)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "d", 700 * GiB); /* four levels */
    create_vdi(st, "s", 8 * MiB);
    plx_vdi *v = open_vdi(st, "d", 0);
    expect_zero(st, v, 0, 3 * BS + 17, "fresh");
    expect_zero(st, v, 700 * GiB - 100000, 100000, "fresh end");
    expect_zero(st, v, 300 * GiB + 5, 1, "one byte");
    /* A write far away leaves the neighbourhood zero. */
    unsigned char buf[BS];
    pattern(buf, BS, 1, 1);
    pwrite_ok(st, v, buf, 513 * GiB, BS);
    expect_zero(st, v, 513 * GiB - 2 * BS, 2 * BS, "before");
    expect_zero(st, v, 513 * GiB + BS, 5 * BS, "after");
    expect_bytes(st, v, buf, 513 * GiB, BS, "written");
    close_vdi(st, v);
    v = open_vdi(st, "s", 0);
    expect_zero(st, v, 0, 8 * MiB, "whole small VDI");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_unaligned_io)
{
    const uint64_t size = 2 * MiB;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "u", size);
    plx_vdi *v = open_vdi(st, "u", 0);
    unsigned char *ref = calloc(1, size);
    unsigned char *raw = malloc(size + 64);
    unsigned char *got = malloc(size + 64);
    ck_assert(ref && raw && got);
    static const struct {
        uint64_t off;
        size_t len;
    } cases[] = {
        {4095, 2},
        {1, 8191},
        {0, 1},
        {4096, 4096},
        {8191, 1},
        {12288 - 7, 7},
        {100, 3 * BS + 5},
        {0, 3 * BS - 1},
        {5 * BS + 1, BS},
        {65535, 65537},
        {4097, 4094},
        {2 * MiB - 1, 1},
        {2 * MiB - 5000, 5000},
        {123457, 301 * 1024},
    };
    uint64_t gen = 100;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (unsigned mis = 0; mis < 3; mis++) {
            uint64_t off = cases[c].off;
            size_t len = cases[c].len;
            /* Buffers at odd addresses: 1, 3 and 0 mod 4096 (malloc'd, rarely aligned). */
            unsigned char *src = raw + (mis == 0 ? 1 : mis == 1 ? 3 : 0);
            tu_fill(src, len, ++gen);
            pwrite_ok(st, v, src, off, len);
            memcpy(ref + off, src, len);
            /* Read the written range, a wider one and a narrower one. */
            unsigned char *dst = got + 1 + mis;
            memset(dst, 0x5a, len);
            pread_ok(st, v, dst, off, len);
            ck_assert_msg(memcmp(dst, ref + off, len) == 0, "case %zu/%u: %llu+%zu", c, mis,
                          (unsigned long long)off, len);
            uint64_t lo = off > 3000 ? off - 3000 : 0;
            uint64_t hi = off + len + 3000 < size ? off + len + 3000 : size;
            pread_ok(st, v, got + 5, lo, hi - lo);
            ck_assert_msg(memcmp(got + 5, ref + lo, hi - lo) == 0, "case %zu/%u: around", c, mis);
            if (len > 2) {
                pread_ok(st, v, got + 7, off + 1, len - 2);
                ck_assert_msg(memcmp(got + 7, ref + off + 1, len - 2) == 0, "case %zu: inside", c);
            }
        }
    }
    /* The whole VDI, once with an aligned buffer. */
    unsigned char *al = plx_block_alloc(size / BS);
    pread_ok(st, v, al, 0, size);
    ck_assert(memcmp(al, ref, size) == 0);
    /* Aligned writes from an aligned buffer go straight through; check they land too. */
    tu_fill(al, 8 * BS, 4242);
    pwrite_ok(st, v, al, 16 * BS, 8 * BS);
    memcpy(ref + 16 * BS, al, 8 * BS);
    pread_ok(st, v, got + 1, 0, size);
    ck_assert(memcmp(got + 1, ref, size) == 0);
    /* Zero-length requests complete. */
    OK(st, plx_vdi_pwrite(v, got, 100, 0, 0));
    OK(st, plx_vdi_pread(v, got, size, 0));
    close_vdi(st, v);
    close_ok(st);

    st = open_kept(mem);
    v = open_vdi(st, "u", PLX_OPEN_READONLY);
    expect_bytes(st, v, ref, 0, size, "after reopen");
    close_vdi(st, v);
    check_clean(st, "unaligned");
    close_ok(st);
    plx_block_free(al);
    free(ref);
    free(raw);
    free(got);
    mem->ops->destroy(mem);
}
END_TEST

static void count_cb(void *arg, int status)
{
    int *calls = arg;
    (void)status;
    (*calls)++;
}

START_TEST(test_range_and_readonly_errors)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "r", MiB);
    plx_vdi *v = open_vdi(st, "r", 0);
    ck_assert_uint_eq(plx_vdi_size(v), MiB);
    ck_assert_int_eq(plx_vdi_readonly(v), 0);
    unsigned char buf[2 * BS];
    memset(buf, 1, sizeof(buf));
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB, 1, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB - 1, 2, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB - BS, 2 * BS, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, UINT64_MAX - 1, 4, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pread(v, buf, MiB - 1, 2), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pread(v, buf, 2 * MiB, 1), -EINVAL);
    EXPECT_ERR(st, plx_vdi_trim(v, MiB - BS, 2 * BS), -EINVAL);
    uint64_t run = 0;
    EXPECT_ERR(st, plx_vdi_block_status(v, MiB, BS, &run), -EINVAL);
    /* The last byte is fine. */
    OK(st, plx_vdi_pwrite(v, buf, MiB - 1, 1, 0));
    /* A rejected asynchronous request never calls back. */
    int calls = 0;
    EXPECT_ERR(st, plx_vdi_submit_write(v, buf, MiB, BS, 0, count_cb, &calls), -EINVAL);
    EXPECT_ERR(st, plx_vdi_submit_read(v, buf, MiB, BS, count_cb, &calls), -EINVAL);
    for (int i = 0; i < 5; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(calls, 0);
    ck_assert_int_eq(plx_store_busy(st), 0);
    close_vdi(st, v);

    OK(st, plx_vdi_snapshot(st, "r", "one", NULL));
    /* Snapshots are read-only, whichever way they are named and opened. */
    const char *specs[] = {"r@1", "r@one"};
    for (int i = 0; i < 2; i++) {
        v = open_vdi(st, specs[i], 0);
        ck_assert_int_ne(plx_vdi_readonly(v), 0);
        EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 0, BS, 0), -EROFS);
        EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 1, 10, 0), -EROFS);
        EXPECT_ERR(st, plx_vdi_trim(v, 0, BS), -EROFS);
        EXPECT_ERR(st, plx_vdi_snapshot_open(v, NULL, NULL), -EROFS);
        calls = 0;
        EXPECT_ERR(st, plx_vdi_submit_write(v, buf, 0, BS, 0, count_cb, &calls), -EROFS);
        ck_assert_int_ge(plx_store_service(st), 0);
        ck_assert_int_eq(calls, 0);
        /* Reading and flushing a read-only VDI are fine. */
        OK(st, plx_vdi_pread(v, buf, 0, BS));
        OK(st, plx_vdi_flush(v));
        close_vdi(st, v);
    }
    /* A VDI opened read-only refuses writes too. */
    v = open_vdi(st, "r", PLX_OPEN_READONLY);
    ck_assert_int_ne(plx_vdi_readonly(v), 0);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 0, BS, 0), -EROFS);
    close_vdi(st, v);
    EXPECT_ERR(st, plx_vdi_open(st, "r@2", 0, &v), -ENOENT);
    EXPECT_ERR(st, plx_vdi_open(st, "nosuch", 0, &v), -ENOENT);
    EXPECT_ERR(st, plx_vdi_open(st, "r@nolabel", 0, &v), -ENOENT);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_trim)
{
    const uint64_t size = 4 * MiB;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", size);
    plx_vdi *v = open_vdi(st, "t", 0);
    unsigned char *ref = malloc(size), *snap = malloc(size);
    tu_fill(ref, size, 11);
    pwrite_ok(st, v, ref, 0, size);
    uint64_t run = 0;
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, size);
    OK(st, plx_vdi_snapshot_open(v, "before", NULL));
    memcpy(snap, ref, size);

    /* Unaligned on both ends: blocks 11..19 become sparse, edges of 10 and 20 become zero. */
    uint64_t off = 10 * BS + 100, len = 10 * BS;
    OK(st, plx_vdi_trim(v, off, len));
    memset(ref + off, 0, len);
    expect_bytes(st, v, ref, 0, size, "after trim");
    ck_assert_int_eq(plx_vdi_block_status(v, 11 * BS, 9 * BS, &run), 0);
    ck_assert_uint_eq(run, 9 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 11 * BS, 20 * BS, &run), 0);
    ck_assert_uint_eq(run, 9 * BS);
    /* The edge blocks keep data outside the range, so they stay mapped. */
    ck_assert_int_eq(plx_vdi_block_status(v, 10 * BS, BS, &run), 1);
    ck_assert_int_eq(plx_vdi_block_status(v, 20 * BS, BS, &run), 1);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, 11 * BS);
    /* Aligned trim of a large range. */
    OK(st, plx_vdi_trim(v, MiB, 2 * MiB));
    memset(ref + MiB, 0, 2 * MiB);
    ck_assert_int_eq(plx_vdi_block_status(v, MiB, 2 * MiB, &run), 0);
    ck_assert_uint_eq(run, 2 * MiB);
    /* Within one block, and across one block boundary without a whole block. */
    OK(st, plx_vdi_trim(v, 30 * BS + 5, 100));
    memset(ref + 30 * BS + 5, 0, 100);
    OK(st, plx_vdi_trim(v, 40 * BS - 50, 100));
    memset(ref + 40 * BS - 50, 0, 100);
    /* Trimming what is already sparse is fine. */
    OK(st, plx_vdi_trim(v, MiB, MiB));
    OK(st, plx_vdi_trim(v, 0, 0));
    expect_bytes(st, v, ref, 0, size, "after all trims");
    /* A trimmed block can be written again. */
    unsigned char blk[BS];
    pattern(blk, BS, 3, 15);
    pwrite_ok(st, v, blk, 15 * BS, BS);
    memcpy(ref + 15 * BS, blk, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 15 * BS, BS, &run), 1);
    expect_bytes(st, v, ref, 0, size, "after rewrite");
    close_vdi(st, v);

    v = open_vdi(st, "t@before", 0);
    expect_bytes(st, v, snap, 0, size, "snapshot after trims");
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, size);
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "t", 0);
    expect_bytes(st, v, ref, 0, size, "after reopen");
    ck_assert_int_eq(plx_vdi_block_status(v, 12 * BS, BS, &run), 0);
    close_vdi(st, v);
    v = open_vdi(st, "t@1", 0);
    expect_bytes(st, v, snap, 0, size, "snapshot after reopen");
    close_vdi(st, v);
    check_clean(st, "trim");
    close_ok(st);
    free(ref);
    free(snap);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_block_status)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "b", 8 * MiB);
    create_vdi(st, "h", 600 * GiB);
    plx_vdi *v = open_vdi(st, "b", 0);
    uint64_t run = 0;
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 8 * MiB, &run), 0);
    ck_assert_uint_eq(run, 8 * MiB);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 0, &run), 0);
    ck_assert_uint_eq(run, 0);
    unsigned char buf[4 * BS];
    tu_fill(buf, sizeof(buf), 1);
    pwrite_ok(st, v, buf, 100 * BS, 4 * BS);
    pwrite_ok(st, v, buf, 2 * MiB + 10, 1); /* a byte maps its whole block */
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 8 * MiB, &run), 0);
    ck_assert_uint_eq(run, 100 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 100 * BS, 8 * MiB - 100 * BS, &run), 1);
    ck_assert_uint_eq(run, 4 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 101 * BS + 7, BS, &run), 1);
    ck_assert_uint_eq(run, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 102 * BS, 2 * BS, &run), 1);
    ck_assert_uint_eq(run, 2 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 104 * BS, 8 * MiB - 104 * BS, &run), 0);
    ck_assert_uint_eq(run, 2 * MiB - 104 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 2 * MiB, BS, &run), 1);
    ck_assert_uint_eq(run, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 2 * MiB + BS, 6 * MiB - BS, &run), 0);
    ck_assert_uint_eq(run, 6 * MiB - BS);
    close_vdi(st, v);

    /* Snapshots and clones report what they share as mapped. */
    OK(st, plx_vdi_snapshot(st, "b", NULL, NULL));
    OK(st, plx_vdi_clone(st, "bc", "b@1", NULL));
    v = open_vdi(st, "bc", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 100 * BS, 8 * BS, &run), 1);
    ck_assert_uint_eq(run, 4 * BS);
    close_vdi(st, v);
    v = open_vdi(st, "b@1", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 101 * BS, &run), 0);
    ck_assert_uint_eq(run, 100 * BS);
    close_vdi(st, v);

    /* A huge sparse VDI answers without walking every block. */
    v = open_vdi(st, "h", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 600 * GiB, &run), 0);
    ck_assert_uint_eq(run, 600 * GiB);
    pwrite_ok(st, v, buf, 599 * GiB, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 600 * GiB, &run), 0);
    ck_assert_uint_eq(run, 599 * GiB);
    ck_assert_int_eq(plx_vdi_block_status(v, 599 * GiB, GiB, &run), 1);
    ck_assert_uint_eq(run, BS);
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Block status without blocking: on a cold cache (the nodes are read asynchronously), it gives
 * the same answers as the blocking call; it sees a write submitted before it; its callback never
 * runs inside the submit call. */
START_TEST(test_async_block_status)
{
    plx_backend *mem = new_medium(64 * MiB);
    plx_store *st = open_kept(mem);
    const uint64_t size = 16 * MiB; /* several leaves (2 MiB each) */
    create_vdi(st, "s", size);
    plx_vdi *v = open_vdi(st, "s", 0);
    unsigned char *buf = malloc(MiB);
    tu_fill(buf, MiB, 5);
    /* Mapped: [0, 8K), [1M, 1M+12K), [5M, 6M), the last block; the rest sparse. */
    pwrite_ok(st, v, buf, 0, 2 * BS);
    pwrite_ok(st, v, buf, MiB, 3 * BS);
    pwrite_ok(st, v, buf, 5 * MiB, MiB);
    pwrite_ok(st, v, buf, size - BS, BS);
    close_vdi(st, v);
    close_ok(st);

    uint64_t seed = 42;
    enum { N = 64 };
    uint64_t offs[N], lens[N], runs[N];
    int mapped[N], in_submit = 0;
    struct cb_rec recs[N];
    memset(recs, 0, sizeof recs);
    st = open_kept(mem); /* cold cache: every node below the root must be read */
    v = open_vdi(st, "s", 0);
    for (int i = 0; i < N; i++) {
        offs[i] = tu_rand(&seed) % size;
        lens[i] = 1 + tu_rand(&seed) % (size - offs[i]);
        recs[i].in_submit = &in_submit;
        in_submit = 1;
        OK(st, plx_vdi_submit_block_status(v, offs[i], lens[i], &runs[i], &mapped[i], rec_cb,
                                           &recs[i]));
        in_submit = 0;
        ck_assert_int_eq(recs[i].fired, 0);
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_int_eq(recs[i].status, 0);
        uint64_t run = 0;
        int want = plx_vdi_block_status(v, offs[i], lens[i], &run);
        ck_assert_int_ge(want, 0);
        ck_assert_msg(mapped[i] == want && runs[i] == run,
                      "status of [%llu, +%llu): async %d/%llu, blocking %d/%llu",
                      (unsigned long long)offs[i], (unsigned long long)lens[i], mapped[i],
                      (unsigned long long)runs[i], want, (unsigned long long)run);
    }
    /* Spot checks against the layout written above. */
    uint64_t run = 0;
    int m = -1;
    struct cb_rec one = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_block_status(v, 2 * BS, size - 2 * BS, &run, &m, rec_cb, &one));
    drain_all(st, &one, 1);
    ck_assert_int_eq(m, 0);
    ck_assert_uint_eq(run, MiB - 2 * BS);
    /* A write submitted just before is seen. */
    struct cb_rec w = {.in_submit = &in_submit}, bs = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_write(v, buf, 9 * MiB, BS, 0, rec_cb, &w));
    OK(st, plx_vdi_submit_block_status(v, 9 * MiB, MiB, &run, &m, rec_cb, &bs));
    drain_all(st, &bs, 1);
    ck_assert_int_eq(w.fired, 1);
    ck_assert_int_eq(m, 1);
    ck_assert_uint_eq(run, BS);
    /* Bad ranges are refused at submission, without a callback. */
    int calls = 0;
    EXPECT_ERR(st, plx_vdi_submit_block_status(v, size, BS, &run, &m, count_cb, &calls), -EINVAL);
    EXPECT_ERR(st, plx_vdi_submit_block_status(v, 0, 0, &run, &m, count_cb, &calls), -EINVAL);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(calls, 0);
    close_vdi(st, v);
    close_ok(st);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

/* Large writes spanning many extents and the 2048-block I/O split. */
START_TEST(test_large_write)
{
    const uint64_t size = 24 * MiB;
    plx_backend *mem = new_medium(96 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "L", size);
    plx_vdi *v = open_vdi(st, "L", 0);
    unsigned char *ref = malloc(size);
    tu_fill(ref, size, 99);
    pwrite_ok(st, v, ref + 3, 3, 10 * MiB);
    unsigned char *al = plx_block_alloc(size / BS);
    memcpy(al, ref, size);
    pwrite_ok(st, v, al + 10 * MiB, 10 * MiB, 14 * MiB);
    memset(ref, 0, 3);
    memcpy(ref + 10 * MiB, al + 10 * MiB, 14 * MiB);
    expect_bytes(st, v, ref, 0, size, "large writes");
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "L", 0);
    expect_bytes(st, v, ref, 0, size, "large writes after reopen");
    close_vdi(st, v);
    check_clean(st, "large write");
    close_ok(st);
    plx_block_free(al);
    free(ref);
    mem->ops->destroy(mem);
}
END_TEST

/* A small node cache must not make requests fail: nodes are evicted and reloaded. */
START_TEST(test_small_cache)
{
    const uint64_t size = 256 * MiB;
    plx_backend *mem = new_medium(256 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "c", size);
    close_ok(st);
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof(o), .cache_bytes = 64 * BS};
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    plx_vdi *v = open_vdi(st, "c", 0);
    unsigned char *buf = malloc(3 * BS);
    /* Touch one block in each of 100 leaves (100+ nodes), then snapshot and rewrite, so every
     * write copies a read-only path through a cache too small to hold the tree. */
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 100; i++) {
            uint64_t off = i * 512 * BS + (uint64_t)round * BS + 100;
            pattern(buf, 2 * BS, (uint64_t)round, i);
            rc = plx_vdi_pwrite(v, buf, off, 2 * BS, 0);
            ck_assert_msg(rc == 0, "round %d write %llu: %d (%s)", round, (unsigned long long)i, rc,
                          plx_store_errmsg(st));
        }
        OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    }
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 100; i++) {
            uint64_t off = i * 512 * BS + (uint64_t)round * BS + 100;
            pattern(buf, 2 * BS, (uint64_t)round, i);
            if (round < 2) /* later rounds overwrite the first 100 bytes after it */
                expect_bytes(st, v, buf, off, BS - 100, "small cache");
            else
                expect_bytes(st, v, buf, off, 2 * BS, "small cache");
        }
    }
    close_vdi(st, v);
    check_clean(st, "small cache");
    close_ok(st);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

/* Writes after a collection that found nothing to free (or something) must commit normally. */
START_TEST(test_write_after_gc)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    /* A VDI whose blocks become garbage, then one whose data fills later extents: the
     * collector frees blocks in some extents and none in others. */
    create_vdi(st, "x", 4 * MiB);
    create_vdi(st, "g", 4 * MiB);
    plx_vdi *v = open_vdi(st, "x", 0);
    unsigned char *ref = calloc(1, 4 * MiB);
    tu_fill(ref, 8 * BS, 1);
    pwrite_ok(st, v, ref, 0, 8 * BS);
    close_vdi(st, v);
    v = open_vdi(st, "g", 0);
    tu_fill(ref, 600 * BS, 3);
    pwrite_ok(st, v, ref, 0, 600 * BS);
    close_vdi(st, v);
    OK(st, plx_vdi_delete(st, "x"));
    struct plx_gc_report g;
    OK(st, plx_gc(st, 0, &g));
    ck_assert_uint_gt(g.freed_by_type[PLX_EXTENT_DATA], 0);
    v = open_vdi(st, "g", 0);
    tu_fill(ref + 100 * BS, 8 * BS, 2);
    pwrite_ok(st, v, ref + 100 * BS, 100 * BS, 8 * BS);
    expect_bytes(st, v, ref, 0, 4 * MiB, "after gc and write");
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "g", 0);
    expect_bytes(st, v, ref, 0, 4 * MiB, "after reopen");
    close_vdi(st, v);
    check_clean(st, "gc");
    close_ok(st);
    free(ref);
    mem->ops->destroy(mem);
}
END_TEST

/* Submit 4 KiB writes to blocks first + perm[i] all at once (pattern gen), and wait for them. */
static void write_blocks_async(plx_store *st, plx_vdi *v, uint64_t first, const unsigned *perm,
                               unsigned n, uint64_t gen, unsigned char *bufs)
{
    static struct cb_rec recs[PLX_RADIX_FANOUT];
    int in_submit = 0;
    ck_assert_uint_le(n, PLX_RADIX_FANOUT);
    for (unsigned i = 0; i < n; i++) {
        uint64_t blk = first + perm[i];
        pattern(bufs + (size_t)perm[i] * BS, BS, gen, blk);
        recs[i] = (struct cb_rec){.in_submit = &in_submit, .id = (int)i};
        OK(st,
           plx_vdi_submit_write(v, bufs + (size_t)perm[i] * BS, blk * BS, BS, 0, rec_cb, &recs[i]));
    }
    drain_all(st, recs, (int)n);
    for (unsigned i = 0; i < n; i++)
        ck_assert_int_eq(recs[i].status, 0);
}

/* Read len blocks at first in one request; return how many backend reads it took. */
static unsigned long read_requests(plx_store *st, plx_vdi *v, uint64_t first, unsigned len,
                                   const unsigned char *want)
{
    unsigned char *buf = plx_block_alloc(len);
    unsigned long before = tu_reads;
    OK(st, plx_vdi_pread(v, buf, first * BS, (size_t)len * BS));
    unsigned long n = tu_reads - before;
    ck_assert_msg(memcmp(buf, want, (size_t)len * BS) == 0, "read back wrong data");
    plx_block_free(buf);
    return n;
}

/* Data blocks are placed by their leaf: 4 KiB writes to one leaf's range in random order land in
 * one contiguous run on the store, so a sequential read of the range is one backend read; the
 * same after a snapshot, when every write copies on write (figure 5.5's case). */
START_TEST(test_placement_by_leaf)
{
    enum { N = PLX_RADIX_FANOUT };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(64 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 8 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", 16 * MiB);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned perm[N];
    uint64_t rng = 16;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    unsigned char *bufs = plx_block_alloc(N);
    for (int round = 0; round < 3; round++) {
        for (unsigned i = N - 1; i > 0; i--) {
            unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        /* Round 0 on a new VDI, rounds 1 and 2 after a snapshot: copy on write everywhere. */
        if (round) {
            int in_submit = 0;
            struct cb_rec snap = {.in_submit = &in_submit};
            OK(st, plx_vdi_submit_snapshot(v, NULL, NULL, rec_cb, &snap));
            drain_all(st, &snap, 1);
            ck_assert_int_eq(snap.status, 0);
        }
        write_blocks_async(st, v, N, perm, N, 40 + (uint64_t)round, bufs);
        unsigned long reqs = read_requests(st, v, N, N, bufs);
        fprintf(stderr,
                "engine: placement round %d: a 2 MiB read of a leaf written in random "
                "order took %lu backend reads\n",
                round, reqs);
        ck_assert_msg(reqs == 1, "round %d: %lu backend reads for one leaf's blocks", round, reqs);
    }
    close_vdi(st, v);
    check_clean(st, "after placement");
    plx_block_free(bufs);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Backend reads for a 2 MiB read of one leaf written in random 4 KiB writes, on a store opened
 * with opts (NULL: none). */
static unsigned long random_leaf_read_reqs(const struct plx_open_opts *opts)
{
    enum { N = PLX_RADIX_FANOUT };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(64 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 8 * MiB, err, sizeof err), 0);
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), opts, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    create_vdi(st, "p", 16 * MiB);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned perm[N];
    uint64_t rng = 17;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    unsigned char *bufs = plx_block_alloc(N);
    write_blocks_async(st, v, N, perm, N, 43, bufs);
    unsigned long reqs = read_requests(st, v, N, N, bufs);
    close_vdi(st, v);
    check_clean(st, "after the random leaf");
    plx_block_free(bufs);
    close_ok(st);
    mem->ops->destroy(mem);
    return reqs;
}

/* Placement by leaf is the default (issue 16): a store opened without options, with zeroed
 * options or with 1 (PLX_PLACEMENT_LEAF before API 1.3) reads a leaf written in random order
 * back in one backend read; only PLX_PLACEMENT_ARRIVAL places blocks in arrival order. */
START_TEST(test_placement_default_is_leaf)
{
    struct plx_open_opts zero = {.struct_size = sizeof zero};
    struct plx_open_opts old_leaf = {.struct_size = sizeof old_leaf, .placement = 1};
    struct plx_open_opts arrival = {.struct_size = sizeof arrival,
                                    .placement = PLX_PLACEMENT_ARRIVAL};
    unsigned long none = random_leaf_read_reqs(NULL), z = random_leaf_read_reqs(&zero),
                  one = random_leaf_read_reqs(&old_leaf), arr = random_leaf_read_reqs(&arrival);
    fprintf(stderr,
            "engine: placement: backend reads for a leaf written in random order: no options "
            "%lu, zeroed %lu, 1 %lu, arrival %lu\n",
            none, z, one, arr);
    ck_assert_uint_eq(PLX_PLACEMENT_LEAF, 0);
    ck_assert_uint_eq(none, 1);
    ck_assert_uint_eq(z, 1);
    ck_assert_uint_eq(one, 1);
    ck_assert_msg(arr > 100, "arrival order: %lu backend reads (blocks in write order)", arr);
}
END_TEST

/* The depth benchmark's history on a small scale: a disk written sequentially, a snapshot, then
 * every block rewritten in random order (each write copies on write). The held extents fill up
 * on the way; the leaves' copies still get slots of their own (a new extent) instead of blocks
 * scattered over each other's slots, so 1 MiB reads of the result take at most two backend
 * reads each (a slot may share its first block with an extent's bitmap). */
START_TEST(test_placement_after_snapshot_rewrite)
{
    enum { LEAVES = 8, N = LEAVES * PLX_RADIX_FANOUT, CHUNK = 256 };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(96 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 4 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 60, i);
    OK(st, plx_vdi_pwrite(v, want, 0, (size_t)N * BS, 0));
    int in_submit = 0;
    struct cb_rec snap = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_snapshot(v, NULL, NULL, rec_cb, &snap));
    drain_all(st, &snap, 1);
    static unsigned perm[N];
    uint64_t rng = 61;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (unsigned k = 0; k < N; k += PLX_RADIX_FANOUT)
        write_blocks_async(st, v, 0, perm + k, PLX_RADIX_FANOUT, 62, want);
    unsigned long total = 0;
    for (unsigned b = 0; b < N; b += CHUNK)
        total += read_requests(st, v, b, CHUNK, want + (size_t)b * BS);
    fprintf(stderr,
            "engine: placement: %u 1 MiB reads after a random rewrite took %lu backend "
            "reads\n",
            N / CHUNK, total);
    ck_assert_msg(total <= 2 * (N / CHUNK), "%lu backend reads for %u 1 MiB reads", total,
                  N / CHUNK);
    close_vdi(st, v);
    check_clean(st, "after the rewrite");
    plx_block_free(want);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* The suite's depth section on a small scale (bench/suite/run.sh, section_depth): a disk written
 * sequentially; then, per depth, snapshots each followed by four random 4 KiB writes (copies on
 * write that leave their leaf's slot: about 0.7 per leaf at depth 100 and 7 at depth 1000, as on
 * the suite's 1 GiB disk), 1 MiB reads of the whole disk, random 4 KiB writes over about half of it
 * and 1 MiB writes over all of it (which copy every leaf into a slot of its own again). A 1 MiB
 * read spanning out-of-place blocks takes one backend read over its run, stale blocks and all,
 * and one per stray block (read merging); it used to take one per piece of the run as well. */
static void write_random_blocks(plx_store *st, plx_vdi *v, unsigned n, uint64_t gen,
                                unsigned char *want, unsigned count, uint64_t *rng)
{
    for (unsigned k = 0; k < count; k++) {
        uint64_t b = tu_rand(rng) % n;
        pattern(want + b * BS, BS, gen + k, b);
        OK(st, plx_vdi_pwrite(v, want + b * BS, b * BS, BS, 0));
    }
}

START_TEST(test_read_merge_depth_history)
{
    enum { LEAVES = 32, N = LEAVES * PLX_RADIX_FANOUT, CHUNK = 256, WRITES = 4 };
    static const unsigned depths[] = {1, 10, 100, 1000};
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(1024 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 16 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 70, i);
    for (unsigned b = 0; b < N; b += CHUNK)
        OK(st, plx_vdi_pwrite(v, want + (size_t)b * BS, (uint64_t)b * BS, (size_t)CHUNK * BS, 0));
    uint64_t rng = 71, gen = 1000;
    unsigned prev = 0;
    for (size_t di = 0; di < sizeof depths / sizeof depths[0]; di++) {
        /* The suite's 1 GiB disk has 512 leaves: as many stray blocks per leaf here. */
        unsigned snaps = (depths[di] - prev) * LEAVES / 512;
        snaps = snaps ? snaps : 1;
        prev = depths[di];
        for (unsigned k = 0; k < snaps; k++) {
            OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
            write_random_blocks(st, v, N, gen, want, WRITES, &rng);
            gen += 100;
        }
        unsigned long rb0 = tu_read_blocks, total = 0;
        for (unsigned b = 0; b < N; b += CHUNK)
            total += read_requests(st, v, b, CHUNK, want + (size_t)b * BS);
        fprintf(stderr,
                "engine: depth %u (%u snapshots, %u stray writes): %.2f backend reads and %.1f "
                "blocks per 1 MiB read\n",
                depths[di], snaps, snaps * WRITES, (double)total / (N / CHUNK),
                (double)(tu_read_blocks - rb0) / (N / CHUNK));
        /* One read per 1 MiB and one per block out of place at most: the strays, and the
         * first block of a slot that starts an extent (its bitmap's place; at most one leaf
         * in four here). Without merging every stray inside a run cost another read for the
         * rest of the run: 1.25 / 1.69 / 8.38 reads per 1 MiB read at depth 10 / 100 / 1000
         * where this is 1.19 / 1.38 / 4.47. */
        ck_assert_msg(total <= N / CHUNK + snaps * WRITES + LEAVES / 4,
                      "depth %u: %lu backend reads for %u 1 MiB reads and %u stray blocks",
                      depths[di], total, N / CHUNK, snaps * WRITES);
        write_random_blocks(st, v, N, gen, want, N * 3 / 4, &rng);
        gen += N;
        for (unsigned b = 0; b < N; b += CHUNK) {
            for (unsigned i = b; i < b + CHUNK; i++)
                pattern(want + (size_t)i * BS, BS, gen, i);
            OK(st,
               plx_vdi_pwrite(v, want + (size_t)b * BS, (uint64_t)b * BS, (size_t)CHUNK * BS, 0));
        }
        gen += N;
    }
    close_vdi(st, v);
    check_clean(st, "after the history");
    plx_block_free(want);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Carry out a read plan on a pretend store whose block b holds the number b: every request block
 * must end up holding its own store block (0 for a hole), direct reads must not overlap, and the
 * plan must never take more reads than the request has runs. Returns the number of reads. */
static size_t run_read_plan(const uint64_t *phys, uint64_t n, size_t runs)
{
    struct plx_read_plan *p = plx_read_plan_make(phys, n, PLX_READ_MERGE_GAP);
    ck_assert_ptr_nonnull(p);
    uint64_t *out = calloc(n, sizeof *out), *scratch = calloc(p->scratch_blocks + 1, sizeof *out);
    unsigned char *hit = calloc(n, 1);
    ck_assert(out && scratch && hit);
    for (uint64_t i = 0; i < n; i++)
        out[i] = 0xdeadull; /* what the buffer held before */
    for (size_t k = 0; k < p->nios; k++) {
        const struct plx_read_io *io = &p->ios[k];
        ck_assert_uint_ge(io->nblocks, 1);
        ck_assert_uint_le(io->nblocks, PLX_READ_MAX_IO);
        for (uint32_t j = 0; j < io->nblocks; j++) {
            if (io->direct) {
                ck_assert_uint_lt(io->first + j, n);
                ck_assert_msg(!hit[io->first + j], "direct reads overlap at %llu",
                              (unsigned long long)(io->first + j));
                hit[io->first + j] = 1;
                out[io->first + j] = io->block + j;
            } else {
                ck_assert_uint_lt(io->scratch + j, p->scratch_blocks);
                scratch[io->scratch + j] = io->block + j;
            }
        }
    }
    for (size_t k = 0; k < p->nfixes; k++) {
        const struct plx_read_fix *f = &p->fixes[k];
        for (uint64_t j = 0; j < f->n; j++)
            out[f->dst + j] = f->zero ? 0 : scratch[f->src + j];
    }
    for (uint64_t i = 0; i < n; i++)
        ck_assert_msg(out[i] == phys[i], "block %llu: got store block %llu, wants %llu",
                      (unsigned long long)i, (unsigned long long)out[i],
                      (unsigned long long)phys[i]);
    ck_assert_uint_le(p->nios, runs);
    size_t nios = p->nios;
    free(out);
    free(scratch);
    free(hit);
    plx_read_plan_free(p);
    return nios;
}

/* Read merging's plans (read_plan.c): a run with stray blocks and holes in it is one read plus
 * one per stray; strays near each other on the store share a read; random layouts deliver
 * every block. */
START_TEST(test_read_plan)
{
    /* Runs at offset 100 with a stray (store 500) and holes between them; a run elsewhere;
     * a block right after it at another offset; two strays close together on the store. */
    static const uint64_t a[] = {100, 101, 0, 500, 104, 105, 0, 0, 108, 900, 901, 903, 112, 505};
    ck_assert_uint_eq(run_read_plan(a, sizeof a / sizeof a[0], 8), 4);
    /* One long run: one read per 2048 blocks. */
    enum { LONG = 5000 };
    static uint64_t l[LONG];
    for (unsigned i = 0; i < LONG; i++)
        l[i] = 7000 + i;
    ck_assert_uint_eq(run_read_plan(l, LONG, 3), 3);
    /* Two slots interleaved block by block (a leaf half rewritten after a snapshot): two reads. */
    static uint64_t m[256];
    uint64_t rng = 5;
    for (unsigned i = 0; i < 256; i++)
        m[i] = (tu_rand(&rng) & 1 ? 20000 : 40000) + i;
    ck_assert_uint_eq(run_read_plan(m, 256, 256), 2);
    /* Random layouts. */
    static uint64_t r[700];
    for (int round = 0; round < 300; round++) {
        uint64_t base = 1000 + tu_rand(&rng) % 5000;
        size_t runs = 0;
        unsigned n = 1 + (unsigned)(tu_rand(&rng) % 700);
        for (unsigned i = 0; i < n; i++) {
            unsigned what = (unsigned)(tu_rand(&rng) % 16);
            if (what == 0)
                r[i] = 0;
            else if (what == 1)
                r[i] = 1000 + tu_rand(&rng) % 9000;
            else if (what == 2)
                r[i] = base + i + 20 + tu_rand(&rng) % 40;
            else
                r[i] = base + i;
            runs += r[i] && (i == 0 || r[i] != r[i - 1] + 1);
        }
        run_read_plan(r, n, runs);
    }
}
END_TEST

/* The store block holding what pattern(gen, blk) wrote (the medium scanned; 0 when none). */
static uint64_t find_block(plx_backend *be, uint64_t gen, uint64_t blk)
{
    unsigned char *want = plx_block_alloc(1), *got = plx_block_alloc(1);
    uint64_t found = 0;
    pattern(want, BS, gen, blk);
    for (uint64_t b = 1; b < be->nblocks && !found; b++) {
        ck_assert_int_eq(tu_io(be, PLX_IO_READ, b, 1, got, 0), 0);
        if (memcmp(got, want, BS) == 0)
            found = b;
    }
    plx_block_free(want);
    plx_block_free(got);
    return found;
}

/* A merged read reads stale blocks it does not need; a medium error in one of them must not
 * fail the request: it is read again, only its own blocks. An error in a block it needs still
 * fails it. */
START_TEST(test_read_merge_bad_stale_block)
{
    enum { N = PLX_RADIX_FANOUT, STRAY = 100 };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(16 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 4 * MiB, err, sizeof err), 0);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept_by_leaf(fault);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N), *got = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 80, i);
    pwrite_ok(st, v, want, 0, (size_t)N * BS);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    pattern(want + (size_t)STRAY * BS, BS, 81, STRAY);
    pwrite_ok(st, v, want + (size_t)STRAY * BS, (uint64_t)STRAY * BS, BS);
    uint64_t stale = find_block(fault, 80, STRAY), stray = find_block(fault, 81, STRAY);
    ck_assert_uint_ne(stale, 0);
    ck_assert_uint_ne(stray, 0);

    unsigned long r0 = tu_reads;
    OK(st, plx_vdi_pread(v, got, 0, (size_t)N * BS));
    ck_assert_msg(memcmp(got, want, (size_t)N * BS) == 0, "read back wrong data");
    ck_assert_uint_eq(tu_reads - r0, 2); /* the run, stale block and all, and the stray */

    plx_fault_fail_blocks(fault, PLX_IO_READ, stale, 1, -EIO, -1);
    uint64_t e0 = plx_fault_errors_injected(fault);
    r0 = tu_reads;
    memset(got, 0, (size_t)N * BS);
    OK(st, plx_vdi_pread(v, got, 0, (size_t)N * BS));
    ck_assert_msg(memcmp(got, want, (size_t)N * BS) == 0, "read back wrong data after a retry");
    ck_assert_uint_eq(plx_fault_errors_injected(fault) - e0, 1);
    ck_assert_uint_eq(tu_reads - r0, 2 + 3); /* then the two pieces of the run and the stray */

    plx_fault_clear(fault);
    plx_fault_fail_blocks(fault, PLX_IO_READ, stray, 1, -EIO, -1);
    int rc = plx_vdi_pread(v, got, 0, (size_t)N * BS);
    ck_assert_int_lt(rc, 0);
    plx_fault_clear(fault);
    close_vdi(st, v);
    plx_block_free(want);
    plx_block_free(got);
    close_ok(st);
    fault->ops->destroy(fault);
}
END_TEST

static Suite *engine_io_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("io");
    tcase_set_timeout(tc, 60);
    tu_no_reclaim_poll(tc); /* the placement tests count the reads reaching the medium */
    tcase_add_test(tc, test_sparse_reads_zero);
    tcase_add_test(tc, test_unaligned_io);
    tcase_add_test(tc, test_range_and_readonly_errors);
    tcase_add_test(tc, test_trim);
    tcase_add_test(tc, test_async_block_status);
    tcase_add_test(tc, test_block_status);
    tcase_add_test(tc, test_large_write);
    tcase_add_test(tc, test_small_cache);
    tcase_add_test(tc, test_write_after_gc);
    tcase_add_test(tc, test_placement_by_leaf);
    tcase_add_test(tc, test_placement_after_snapshot_rewrite);
    tcase_add_test(tc, test_read_merge_depth_history);
    tcase_add_test(tc, test_read_plan);
    tcase_add_test(tc, test_read_merge_bad_stale_block);
    tcase_add_test(tc, test_placement_default_is_leaf);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(engine_io_suite)
