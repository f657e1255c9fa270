/*
 * test_engine_async.c - the engine's asynchronous interface (parallax.h), on memory media:
 * many requests in flight and their order, snapshots between and beside batches, deferred
 * callbacks, the promised service pass and timers (engine_fixture.c holds the helpers it shares
 * with test_engine.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend_fault.h"
#include "engine.h"  /* plx_defer_turn */
#include "snaplog.h" /* PLX_LABELS_FOLD_TAIL */
#include "engine_fixture.h"
#include "testutil.h"

START_TEST(test_async_many_in_flight)
{
    enum { N = 256 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "a", 4 * MiB);
    plx_vdi *v = open_vdi(st, "a", 0);
    unsigned char *bufs = plx_block_alloc(N);
    static struct cb_rec recs[N];
    int in_submit = 0;
    int order[N], norder = 0;
    for (int i = 0; i < N; i++) {
        /* Distinct blocks, in a scattered order. */
        uint64_t blk = (uint64_t)(i * 37 % N) * 3;
        pattern(bufs + (size_t)i * BS, BS, 7, blk);
        recs[i] =
            (struct cb_rec){.in_submit = &in_submit, .order = order, .norder = &norder, .id = i};
        in_submit = 1;
        int rc = plx_vdi_submit_write(v, bufs + (size_t)i * BS, blk * BS, BS, 0, rec_cb, &recs[i]);
        in_submit = 0;
        ck_assert_msg(rc == 0, "submit %d: %d (%s)", i, rc, plx_store_errmsg(st));
        ck_assert_int_eq(recs[i].fired, 0);
    }
    ck_assert_int_ne(plx_store_busy(st), 0);
    ck_assert_int_ge(plx_store_fd(st), 0);
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    ck_assert_int_eq(norder, N);
    /* Nothing fires twice. */
    for (int i = 0; i < 5; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(recs[i].fired, 1);

    /* Read everything back asynchronously too, all in flight at once. */
    unsigned char *rb = plx_block_alloc(N);
    in_submit = 0;
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i * 37 % N) * 3;
        recs[i] = (struct cb_rec){.in_submit = &in_submit, .id = i};
        in_submit = 1;
        OK(st, plx_vdi_submit_read(v, rb + (size_t)i * BS, blk * BS, BS, rec_cb, &recs[i]));
        in_submit = 0;
        ck_assert_int_eq(recs[i].fired, 0);
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_msg(memcmp(rb + (size_t)i * BS, bufs + (size_t)i * BS, BS) == 0,
                      "request %d read back wrong data", i);
    }
    fprintf(stderr, "engine: %d writes then %d reads in flight at once\n", N, N);
    /* And the blocks in between are still zero. */
    expect_zero(st, v, BS, 2 * BS, "between");
    close_vdi(st, v);
    plx_block_free(bufs);
    plx_block_free(rb);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Requests on the same block are carried out in submission order, reads included. */
START_TEST(test_async_same_block_order)
{
    enum { N = 40 };
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "o", MiB);
    plx_vdi *v = open_vdi(st, "o", 0);
    unsigned char *w = malloc((size_t)N * BS);
    unsigned char *r = malloc((size_t)N * BS);
    unsigned char ref[3 * BS], want[N][64];
    memset(ref, 0, sizeof(ref));
    static struct cb_rec recs[2 * N];
    int in_submit = 0;
    for (int i = 0; i < N; i++) {
        /* Overlapping unaligned writes around block 1, each followed by a read of 64 bytes. */
        uint64_t off = BS - 30 + (uint64_t)(i * 13 % 60);
        size_t len = 20 + (size_t)(i * 7 % 40);
        tu_fill(w + (size_t)i * BS, len, 500 + (uint64_t)i);
        memcpy(ref + off, w + (size_t)i * BS, len);
        memcpy(want[i], ref + BS - 32, 64);
        recs[2 * i] = (struct cb_rec){.in_submit = &in_submit};
        recs[2 * i + 1] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st, plx_vdi_submit_write(v, w + (size_t)i * BS, off, len, 0, rec_cb, &recs[2 * i]));
        OK(st, plx_vdi_submit_read(v, r + (size_t)i * BS, BS - 32, 64, rec_cb, &recs[2 * i + 1]));
        in_submit = 0;
    }
    drain_all(st, recs, 2 * N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[2 * i].status, 0);
        ck_assert_int_eq(recs[2 * i + 1].status, 0);
        ck_assert_int_eq(recs[2 * i].bad_context + recs[2 * i + 1].bad_context, 0);
        ck_assert_msg(memcmp(r + (size_t)i * BS, want[i], 64) == 0,
                      "read %d did not see exactly the writes submitted before it", i);
    }
    expect_bytes(st, v, ref, 0, sizeof(ref), "final");
    close_vdi(st, v);
    close_ok(st);
    free(w);
    free(r);
    mem->ops->destroy(mem);
}
END_TEST

/* Reads and writes of mixed lengths on overlapping ranges, all in flight at once: each read sees
 * exactly the writes submitted before it. Ranges of up to PLX_BUSY_MAX_BLOCKS blocks start
 * through may_start's busy filter, longer ones through the walk of the active list; both kinds
 * are mixed here, and the short ones also start beside each other on blocks that share a
 * counter (64 blocks in 4096 counters: a few do). */
START_TEST(test_async_mixed_ranges_order)
{
    enum { N = 120, SPAN = 64 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "m", MiB);
    plx_vdi *v = open_vdi(st, "m", 0);
    unsigned char *buf = plx_block_alloc((size_t)N * 24);
    unsigned char *ref = calloc(SPAN, BS), *want = calloc((size_t)N * 24, BS);
    static struct cb_rec recs[N];
    uint64_t off[N], len[N];
    bool is_read[N];
    int in_submit = 0;
    for (int i = 0; i < N; i++) {
        /* 1 to 24 blocks (some past PLX_BUSY_MAX_BLOCKS), every third a read. */
        uint64_t n = 1 + (uint64_t)(i * 7 % 24), b = (uint64_t)(i * 37 % (SPAN - 24));
        off[i] = b * BS;
        len[i] = n * BS;
        is_read[i] = i % 3 == 2;
        unsigned char *p = buf + (size_t)i * 24 * BS;
        if (is_read[i])
            memcpy(want + (size_t)i * 24 * BS, ref + off[i], len[i]);
        else {
            tu_fill(p, len[i], 900 + (uint64_t)i);
            memcpy(ref + off[i], p, len[i]);
        }
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        if (is_read[i])
            OK(st, plx_vdi_submit_read(v, p, off[i], len[i], rec_cb, &recs[i]));
        else
            OK(st, plx_vdi_submit_write(v, p, off[i], len[i], 0, rec_cb, &recs[i]));
        in_submit = 0;
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
        size_t at = (size_t)i * 24 * BS;
        if (is_read[i])
            ck_assert_msg(memcmp(buf + at, want + at, len[i]) == 0,
                          "read %d did not see exactly the writes submitted before it", i);
    }
    expect_bytes(st, v, ref, 0, (size_t)SPAN * BS, "final");
    close_vdi(st, v);
    close_ok(st);
    plx_block_free(buf);
    free(ref);
    free(want);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_async_snapshot_between_batches)
{
    enum { N = 64 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "s", 2 * MiB);
    plx_vdi *v = open_vdi(st, "s", 0);
    unsigned char *a = plx_block_alloc(N), *b = plx_block_alloc(N);
    static struct cb_rec recs[2 * N + 1];
    int in_submit = 0;
    uint64_t idx = 0;
    /* First batch: blocks 0..N-1 with generation 1. */
    for (int i = 0; i < N; i++) {
        pattern(a + (size_t)i * BS, BS, 1, (uint64_t)i);
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st,
           plx_vdi_submit_write(v, a + (size_t)i * BS, (uint64_t)i * BS, BS, 0, rec_cb, &recs[i]));
        in_submit = 0;
    }
    recs[N] = (struct cb_rec){.in_submit = &in_submit};
    in_submit = 1;
    OK(st, plx_vdi_submit_snapshot(v, "mid", &idx, rec_cb, &recs[N]));
    in_submit = 0;
    /* Second batch: the same blocks, generation 2, plus blocks beyond. */
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i % 2 ? i : N + i);
        pattern(b + (size_t)i * BS, BS, 2, blk);
        recs[N + 1 + i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st,
           plx_vdi_submit_write(v, b + (size_t)i * BS, blk * BS, BS, 0, rec_cb, &recs[N + 1 + i]));
        in_submit = 0;
    }
    drain_all(st, recs, 2 * N + 1);
    for (int i = 0; i < 2 * N + 1; i++) {
        ck_assert_msg(recs[i].status == 0, "request %d: %d", i, recs[i].status);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_int_eq(recs[i].fired, 1);
    }
    ck_assert_uint_eq(idx, 1);
    /* The VDI has generation 2 where it was rewritten. */
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i % 2 ? i : N + i);
        expect_bytes(st, v, b + (size_t)i * BS, blk * BS, BS, "vdi, second batch");
        if (i % 2 == 0)
            expect_bytes(st, v, a + (size_t)i * BS, (uint64_t)i * BS, BS, "vdi, first batch");
    }
    close_vdi(st, v);
    /* The snapshot has exactly the first batch. */
    for (int pass = 0; pass < 2; pass++) {
        v = open_vdi(st, pass ? "s@mid" : "s@1", 0);
        expect_bytes(st, v, a, 0, (size_t)N * BS, "snapshot");
        expect_zero(st, v, (uint64_t)N * BS, (size_t)N * BS, "snapshot beyond the first batch");
        close_vdi(st, v);
    }
    check_clean(st, "async snapshot");
    close_ok(st);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* A snapshot does not drain the queue (issue 16). The medium holds back the data write of a
 * write that allocates a block; a snapshot submitted after it swaps roots as soon as that write
 * is in the tree, and a write after the snapshot (to the same leaf, so it copies the leaf with
 * the new link in it) reaches the medium while the first is still held. The snapshot completes
 * only once the held data is written, and holds it; the later write is not in it. */
START_TEST(test_snapshot_does_not_drain)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "d", 4 * MiB);
    plx_vdi *v = open_vdi(st, "d", 0);
    unsigned char *old = plx_block_alloc(1), *a = plx_block_alloc(1), *b = plx_block_alloc(1);
    pattern(old, BS, 1, 0);
    pwrite_ok(st, v, old, 0, BS); /* the leaf exists and is on the medium */
    pattern(a, BS, 2, 2);
    pattern(b, BS, 3, 1);
    int in_submit = 0;
    struct cb_rec recs[3];
    for (int i = 0; i < 3; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t idx = 0;
    tu_hold_next_write();
    OK(st, plx_vdi_submit_write(v, a, 2 * BS, BS, 0, rec_cb, &recs[0]));
    ck_assert_uint_eq(tu_held(), 1); /* the data write of block 2 */
    OK(st, plx_vdi_submit_snapshot(v, "mid", &idx, rec_cb, &recs[1]));
    OK(st, plx_vdi_submit_write(v, b, 1 * BS, BS, 0, rec_cb, &recs[2]));
    for (int i = 0; i < 200 && !tu_write_seen(b); i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(1000);
    }
    ck_assert_uint_eq(tu_held(), 1);
    ck_assert_msg(tu_write_seen(b),
                  "the write after the snapshot waited for the held write before it: the "
                  "snapshot drained the queue");
    ck_assert_msg(!recs[1].fired, "the snapshot completed before the data of a write in it");
    tu_release_held();
    drain_all(st, recs, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    ck_assert_uint_eq(idx, 1);
    expect_bytes(st, v, old, 0, BS, "vdi block 0");
    expect_bytes(st, v, b, BS, BS, "vdi block 1, written after the snapshot");
    expect_bytes(st, v, a, 2 * BS, BS, "vdi block 2, written before the snapshot");
    close_vdi(st, v);
    v = open_vdi(st, "d@mid", 0);
    expect_bytes(st, v, old, 0, BS, "snapshot block 0");
    expect_zero(st, v, BS, BS, "snapshot block 1 (written after it)");
    expect_bytes(st, v, a, 2 * BS, BS, "snapshot block 2 (written before it, held)");
    close_vdi(st, v);
    check_clean(st, "snapshot beside a held write");
    close_ok(st);
    plx_block_free(old);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* The snapshot that brings the log's tail to PLX_LABELS_FOLD_TAIL records starts a fold of the
 * tail into the label index; submitting it must not wait for the medium. It used to fold right
 * there, with blocking I/O (read the tail, write the VDI record, flush) inside the submit call:
 * inside `parallax serve`'s loop, every request of every VDI of the process stood still for that
 * long, one snapshot in 126 (issue 16's busy-disk outliers). Writes are held by the medium for
 * a second: a submit that waits for one takes that second. */
static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

START_TEST(test_snapshot_fold_does_not_block)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept(fault);
    create_vdi(st, "f", 2 * MiB);
    plx_vdi *v = open_vdi(st, "f", 0);
    unsigned char *buf = plx_block_alloc(1);
    uint64_t idx = 0;
    for (unsigned i = 1; i <= PLX_LABELS_FOLD_TAIL; i++) {
        pattern(buf, BS, i, 0);
        pwrite_ok(st, v, buf, (i % 16) * BS, BS);
        OK(st, plx_vdi_snapshot_open(v, i % 2 ? "" : NULL, &idx));
        ck_assert_uint_eq(idx, i);
    }
    int in_submit = 0;
    struct cb_rec rec = {.in_submit = &in_submit};
    plx_fault_hold_blocks(fault, PLX_IO_WRITE, 0, fault->nblocks, 1000);
    uint64_t t0 = mono_ms();
    in_submit = 1;
    OK(st, plx_vdi_submit_snapshot(v, "", &idx, rec_cb, &rec));
    in_submit = 0;
    uint64_t took = mono_ms() - t0;
    ck_assert_msg(took < 500,
                  "submitting the snapshot that starts a fold took %llu ms with the medium "
                  "holding writes: it waited for I/O",
                  (unsigned long long)took);
    ck_assert_int_eq(rec.fired, 0);
    plx_fault_release(fault);
    drain_all(st, &rec, 1);
    ck_assert_msg(rec.status == 0, "snapshot: %d (%s)", rec.status, plx_store_errmsg(st));
    ck_assert_int_eq(rec.bad_context, 0);
    ck_assert_uint_eq(idx, PLX_LABELS_FOLD_TAIL + 1);
    /* The next one queues behind the fold and works as usual. */
    OK(st, plx_vdi_snapshot_open(v, "after", &idx));
    ck_assert_uint_eq(idx, PLX_LABELS_FOLD_TAIL + 2);
    close_vdi(st, v);
    v = open_vdi(st, "f@after", 0);
    close_vdi(st, v);
    check_clean(st, "snapshot starting a fold");
    close_ok(st);
    plx_block_free(buf);
    fault->ops->destroy(fault);
}
END_TEST

/* The commit writes a snapshot waits for go to the medium marked urgent (the file backend gives
 * them the real-time I/O class); plain commits are not marked, since while an urgent write is
 * in flight mq-deadline serves nothing else (DESIGN.md, "Commit writes go first"). */
START_TEST(test_urgent_only_with_a_waiter)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept(fault);
    create_vdi(st, "u", 2 * MiB);
    plx_vdi *v = open_vdi(st, "u", 0);
    unsigned char *buf = plx_block_alloc(1);
    uint64_t idx = 0, u0 = plx_fault_urgent_writes(fault);
    for (unsigned i = 0; i < 16; i++) {
        pattern(buf, BS, i, 0);
        pwrite_ok(st, v, buf, (uint64_t)i * 29 * BS, BS);
    }
    ck_assert_uint_eq(plx_fault_urgent_writes(fault), u0);
    OK(st, plx_vdi_snapshot_open(v, "", &idx));
    uint64_t u1 = plx_fault_urgent_writes(fault);
    ck_assert_uint_ge(u1, u0 + 2); /* at least the log block and the VDI record */
    for (unsigned i = 0; i < 16; i++) {
        pattern(buf, BS, 100 + i, 0);
        pwrite_ok(st, v, buf, (uint64_t)i * 29 * BS, BS); /* copy-on-write: new leaves */
    }
    ck_assert_uint_eq(plx_fault_urgent_writes(fault), u1);
    close_vdi(st, v);
    check_clean(st, "urgent writes");
    close_ok(st);
    plx_block_free(buf);
    fault->ops->destroy(fault);
}
END_TEST

/* Two snapshots submitted back to back, the second labelled: both succeed, in order, and the
 * second label is unique. */
START_TEST(test_async_two_snapshots)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", MiB);
    plx_vdi *v = open_vdi(st, "t", 0);
    unsigned char a[BS], b[BS];
    pattern(a, BS, 1, 0);
    pattern(b, BS, 2, 0);
    int in_submit = 0;
    struct cb_rec recs[4];
    for (int i = 0; i < 4; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t i1 = 0, i2 = 0;
    OK(st, plx_vdi_submit_write(v, a, 0, BS, 0, rec_cb, &recs[0]));
    int rc = plx_vdi_submit_snapshot(v, NULL, &i1, rec_cb, &recs[1]);
    ck_assert_msg(rc == 0, "first snapshot: %d (%s)", rc, plx_store_errmsg(st));
    OK(st, plx_vdi_submit_write(v, b, 0, BS, 0, rec_cb, &recs[2]));
    rc = plx_vdi_submit_snapshot(v, "second", &i2, rec_cb, &recs[3]);
    ck_assert_msg(rc == 0, "labelled snapshot submitted while another is in flight: %d (%s)", rc,
                  plx_store_errmsg(st));
    drain_all(st, recs, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    ck_assert_uint_eq(i1, 1);
    ck_assert_uint_eq(i2, 2);
    close_vdi(st, v);
    v = open_vdi(st, "t@1", 0);
    expect_bytes(st, v, a, 0, BS, "first snapshot");
    close_vdi(st, v);
    v = open_vdi(st, "t@second", 0);
    expect_bytes(st, v, b, 0, BS, "second snapshot");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* A snapshot whose batch has no commit nodes flies beside an older batch: one flush before its
 * record makes the older batch's commit nodes and its own stage-A writes (the root copy, the log
 * block) durable at once. It used to flush after its stage A too, one more flush on the path of
 * every such snapshot on a busy disk (issue 16): 3 flushes here where 2 do. */
START_TEST(test_snapshot_beside_batch_one_flush)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "o", 4 * MiB);
    plx_vdi *v = open_vdi(st, "o", 0);
    unsigned char *a = plx_block_alloc(1), *b = plx_block_alloc(1);
    pattern(a, BS, 1, 0);
    pwrite_ok(st, v, a, 0, BS); /* the leaf exists: the next write makes it a commit node */
    OK(st, plx_vdi_flush(v));
    int in_submit = 0;
    struct cb_rec recs[2];
    for (int i = 0; i < 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t idx = 0;
    pattern(b, BS, 2, 1);
    unsigned long flushes0 = tu_flushes;
    tu_hold_next_write();
    OK(st, plx_vdi_submit_write(v, b, BS, BS, 0, rec_cb, &recs[0])); /* batch 1, flying */
    ck_assert_uint_eq(tu_held(), 1);
    OK(st, plx_vdi_submit_snapshot(v, NULL, &idx, rec_cb, &recs[1])); /* batch 2: the snapshot */
    for (int i = 0; i < 20; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(recs[1].fired, 0);
    tu_release_held();
    drain_all(st, recs, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    unsigned long flushes = tu_flushes - flushes0;
    ck_assert_msg(flushes == 2,
                  "a write's batch and a snapshot's beside it took %lu flushes (1 + 1 expected)",
                  flushes);
    close_vdi(st, v);
    v = open_vdi(st, "o@1", 0);
    expect_bytes(st, v, a, 0, BS, "snapshot block 0");
    expect_bytes(st, v, b, BS, BS, "snapshot block 1 (written just before it)");
    close_vdi(st, v);
    check_clean(st, "snapshot beside a batch");
    close_ok(st);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* A burst of snapshots with writes between them, submitted while a batch is in flight: they share
 * batches (and their flushes) instead of taking one batch each, cross a snapshot-log block, and
 * each holds exactly the writes submitted before it. */
START_TEST(test_async_snapshot_burst)
{
    enum { NSNAP = 80, NBLK = 8 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "b", 2 * MiB);
    plx_vdi *v = open_vdi(st, "b", 0);
    unsigned char *w = plx_block_alloc(NSNAP + 1);
    static struct cb_rec recs[2 * NSNAP + 2];
    static uint64_t idx[NSNAP];
    int in_submit = 0, nr = 0;
    for (int i = 0; i < 2 * NSNAP + 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    unsigned long flushes0 = tu_flushes;
    /* Write g goes to block g % NBLK; every fourth snapshot follows a write, the others follow
     * the previous snapshot with no write between (clean snapshots). */
    pattern(w, BS, 0, 0);
    OK(st, plx_vdi_submit_write(v, w, 0, BS, 0, rec_cb, &recs[nr++]));
    int last_write[NSNAP + 1];
    int g = 0;
    for (int k = 1; k <= NSNAP; k++) {
        if (k % 4 == 1) {
            g++;
            pattern(w + (size_t)g * BS, BS, (uint64_t)g, (uint64_t)(g % NBLK));
            OK(st, plx_vdi_submit_write(v, w + (size_t)g * BS, (uint64_t)(g % NBLK) * BS, BS, 0,
                                        rec_cb, &recs[nr++]));
        }
        last_write[k] = g;
        int rc = plx_vdi_submit_snapshot(v, NULL, &idx[k - 1], rec_cb, &recs[nr++]);
        ck_assert_msg(rc == 0, "snapshot %d: %d (%s)", k, rc, plx_store_errmsg(st));
    }
    drain_all(st, recs, (size_t)nr);
    for (int i = 0; i < nr; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    unsigned long flushes = tu_flushes - flushes0;
    fprintf(stderr, "engine: %d snapshots and %d writes in one burst: %lu flushes\n", NSNAP, g,
            flushes);
    /* One batch per snapshot would flush at least twice per snapshot. */
    ck_assert_msg(flushes <= NSNAP, "%lu flushes for %d snapshots", flushes, NSNAP);
    close_vdi(st, v);
    unsigned char got[BS], want[BS];
    for (int k = 1; k <= NSNAP; k++) {
        ck_assert_uint_eq(idx[k - 1], (uint64_t)k);
        char spec[32];
        snprintf(spec, sizeof spec, "b@%d", k);
        v = open_vdi(st, spec, 0);
        for (int blk = 0; blk < NBLK; blk++) {
            int gen = -1;
            for (int x = 0; x <= last_write[k]; x++)
                if (x % NBLK == blk)
                    gen = x;
            pread_ok(st, v, got, (uint64_t)blk * BS, BS);
            if (gen < 0) {
                memset(want, 0, BS);
            } else {
                pattern(want, BS, (uint64_t)gen, (uint64_t)blk);
            }
            ck_assert_msg(memcmp(got, want, BS) == 0, "snapshot %d block %d: want write %d", k, blk,
                          gen);
        }
        close_vdi(st, v);
    }
    check_clean(st, "snapshot burst");
    close_ok(st);
    plx_block_free(w);
    mem->ops->destroy(mem);
}
END_TEST

/* A label must stay unique even when two snapshots asking for it are in flight together. */
START_TEST(test_async_duplicate_label_in_flight)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", MiB);
    plx_vdi *v = open_vdi(st, "t", 0);
    int in_submit = 0;
    struct cb_rec recs[2];
    for (int i = 0; i < 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    OK(st, plx_vdi_submit_snapshot(v, "dup", NULL, rec_cb, &recs[0]));
    int rc = plx_vdi_submit_snapshot(v, "dup", NULL, rec_cb, &recs[1]);
    if (rc == 0) {
        drain_all(st, recs, 2);
        rc = recs[1].status;
    } else {
        drain_all(st, recs, 1);
    }
    ck_assert_int_eq(recs[0].status, 0);
    ck_assert_msg(rc == -EEXIST, "second snapshot labelled 'dup': %d, want -EEXIST", rc);
    close_vdi(st, v);
    struct plx_snap_info *list = NULL;
    size_t n = 0;
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "t", &vi));
    OK(st, plx_snap_list(st, vi.id, &list, &n));
    int with_label = 0;
    for (size_t i = 0; i < n; i++)
        with_label += strcmp(list[i].label, "dup") == 0;
    free(list);
    ck_assert_int_eq(with_label, 1);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* plx_defer_turn: a callback queued from inside a service pass runs in the next pass, not in
 * the one that queued it (the write log's drain steps give the loop back between them), and
 * the queue counts as work (plx_engine_busy). */
struct turn {
    struct plx_deferred now, later;
    plx_store *st;
    int ran_now, ran_later;
};

static void turn_later(struct plx_deferred *d)
{
    struct turn *t = (struct turn *)((char *)d - offsetof(struct turn, later));
    t->ran_later++;
}

static void turn_now(struct plx_deferred *d)
{
    struct turn *t = (struct turn *)((char *)d - offsetof(struct turn, now));
    t->ran_now++;
    t->later.run = turn_later;
    plx_defer_turn(t->st, &t->later);
}

START_TEST(test_defer_turn_runs_in_the_next_pass)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct turn t = {.st = st};
    t.now.run = turn_now;
    plx_defer(st, &t.now);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 1);
    ck_assert_int_eq(t.ran_later, 0);
    ck_assert(plx_engine_busy(st));
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 1);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* plx_store_will_service: work queued before the promised service pass does not make
 * plx_store_fd() readable (a wake-up is two system calls per request); work that only a later
 * pass runs (plx_defer_turn from inside the pass) still does, and so does everything queued
 * without the promise. */
static int fd_readable(plx_store *st)
{
    struct pollfd pfd = {.fd = plx_store_fd(st), .events = POLLIN};
    return poll(&pfd, 1, 0);
}

START_TEST(test_will_service_skips_the_wake)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct turn t = {.st = st};
    t.now.run = turn_now;
    ck_assert_int_eq(fd_readable(st), 0);
    plx_store_will_service(st);
    plx_defer(st, &t.now);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 1);
    /* turn_now queued the next pass's work from inside this one: that needs the wake-up. */
    ck_assert_int_eq(fd_readable(st), 1);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 1);
    ck_assert_int_eq(fd_readable(st), 0);
    /* The promise ended with that pass: a plain defer wakes again. */
    plx_defer(st, &t.now);
    ck_assert_int_eq(fd_readable(st), 1);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 2);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 2);
    ck_assert_int_eq(fd_readable(st), 0);
    /* A turn queued before the promised pass runs in it: no wake-up either. */
    plx_store_will_service(st);
    t.later.run = turn_later;
    plx_defer_turn(st, &t.later);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 3);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* Engine timers (plx_timer_arm): a timer makes plx_store_fd() readable when it is due, and
 * the service pass then runs it and leaves the fd quiet; a timer moved later fires at its new
 * time only (the early wake-up finds nothing due and goes quiet); a cancelled one never runs;
 * and a loop that calls plx_store_service without waiting on the fd gets it too. */
struct tick {
    struct plx_timer t;
    int ran;
};

static void tick_run(struct plx_timer *t)
{
    ((struct tick *)((char *)t - offsetof(struct tick, t)))->ran++;
}

START_TEST(test_timer_wakes_the_fd)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct tick k = {.t = {.run = tick_run}};
    ck_assert_int_eq(fd_readable(st), 0);
    uint64_t t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 30000000ull);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 0); /* not due */
    struct pollfd pfd = {.fd = plx_store_fd(st), .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
    ck_assert_uint_ge(plx_mono_ns() - t0, 29000000ull);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 1);
    ck_assert_int_eq(fd_readable(st), 0);
    /* Moved later before it was due: the early wake-up runs nothing and goes quiet. */
    t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 20000000ull);
    plx_timer_arm(st, &k.t, t0 + 80000000ull);
    ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, plx_mono_ns() - t0 >= 80000000ull ? 2 : 1);
    if (k.ran == 1) {
        ck_assert_int_eq(fd_readable(st), 0);
        ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
        ck_assert_uint_ge(plx_mono_ns() - t0, 79000000ull);
        ck_assert_int_ge(plx_store_service(st), 0);
        ck_assert_int_eq(k.ran, 2);
    }
    ck_assert_int_eq(fd_readable(st), 0);
    /* Cancelled: never runs, and the fd goes quiet after its wake-up. */
    plx_timer_arm(st, &k.t, plx_mono_ns() + 10000000ull);
    plx_timer_cancel(st, &k.t);
    usleep(20000);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 2);
    ck_assert_int_eq(fd_readable(st), 0);
    /* A service loop that never waits on the fd. */
    t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 10000000ull);
    while (k.ran == 2 && plx_mono_ns() - t0 < 2000000000ull)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 3);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_async_flush_trim_fua)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "f", MiB);
    plx_vdi *v = open_vdi(st, "f", 0);
    unsigned char *a = plx_block_alloc(8);
    tu_fill(a, 8 * BS, 3);
    int in_submit = 0;
    struct cb_rec recs[5];
    for (int i = 0; i < 5; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    in_submit = 1;
    OK(st, plx_vdi_submit_write(v, a, 0, 8 * BS, PLX_WRITE_FUA, rec_cb, &recs[0]));
    OK(st, plx_vdi_submit_trim(v, 2 * BS + 1, 3 * BS, rec_cb, &recs[1]));
    OK(st, plx_vdi_submit_flush(v, rec_cb, &recs[2]));
    OK(st, plx_vdi_submit_trim(v, 0, 0, rec_cb, &recs[3]));
    OK(st, plx_vdi_submit_write(v, a, 100, 0, 0, rec_cb, &recs[4]));
    in_submit = 0;
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(recs[i].fired, 0);
    drain_all(st, recs, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    memset(a + 2 * BS + 1, 0, 3 * BS);
    expect_bytes(st, v, a, 0, 8 * BS, "after FUA write and trim");
    close_vdi(st, v);
    close_ok(st);
    plx_block_free(a);
    mem->ops->destroy(mem);
}
END_TEST

static Suite *engine_async_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("async");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_async_many_in_flight);
    tcase_add_test(tc, test_async_same_block_order);
    tcase_add_test(tc, test_async_mixed_ranges_order);
    tcase_add_test(tc, test_async_snapshot_between_batches);
    tcase_add_test(tc, test_snapshot_does_not_drain);
    tcase_add_test(tc, test_snapshot_fold_does_not_block);
    tcase_add_test(tc, test_urgent_only_with_a_waiter);
    tcase_add_test(tc, test_snapshot_beside_batch_one_flush);
    tcase_add_test(tc, test_async_two_snapshots);
    tcase_add_test(tc, test_async_snapshot_burst);
    tcase_add_test(tc, test_async_duplicate_label_in_flight);
    tcase_add_test(tc, test_async_flush_trim_fua);
    tcase_add_test(tc, test_defer_turn_runs_in_the_next_pass);
    tcase_add_test(tc, test_will_service_skips_the_wake);
    tcase_add_test(tc, test_timer_wakes_the_fd);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(engine_async_suite)
