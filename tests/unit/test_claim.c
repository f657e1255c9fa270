/*
 * test_claim.c - extents claimed ahead (alloc_claim.c, "Claiming ahead"): a write that crosses into
 * a new extent does no synchronous I/O when a spare is ready, writes go on while the next spare's
 * claim is held at the medium, and a steady sequential writer never falls back to a
 * synchronous claim. On a serving loop, a write that needs a new extent while another process
 * holds the admin lock waits alone, and fails alone when the wait times out.
 *
 * The medium is the fault backend (backend_fault.h) over a store with 1 MiB extents (255 data
 * blocks each), so a few MiB of writes cross several extents.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "backend.h"
#include "backend_fault.h"
#include "engine.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)

/* A fault medium of `bytes` formatted with extents of `extent` bytes. */
static plx_backend *new_fault_medium_ext(uint64_t bytes, uint64_t extent)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, extent, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    plx_backend *fb = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    ck_assert_ptr_nonnull(fb);
    return fb;
}

static plx_backend *new_fault_medium(uint64_t bytes)
{
    return new_fault_medium_ext(bytes, MiB);
}

static plx_store *open_on(plx_backend *fb, unsigned placement)
{
    char err[256] = "";
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o, .placement = placement};
    int rc = plx_store_open_backend(tu_keep_wrap(fb), &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

static plx_vdi *create_open(plx_store *st, const char *name, uint64_t size)
{
    uint64_t id = 0;
    int rc = plx_vdi_create(st, name, size, &id);
    ck_assert_msg(rc == 0, "create %s: %d (%s)", name, rc, plx_store_errmsg(st));
    plx_vdi *v = NULL;
    rc = plx_vdi_open(st, name, 0, &v);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", name, rc, plx_store_errmsg(st));
    return v;
}

/* Sequential writes of `chunk` blocks, `depth` in flight, driven like a host's event loop:
 * service, then wait on the store's descriptor. The medium is only ever polled without waiting,
 * so I/O the fault backend holds stays held unless the engine blocks on it. */
struct seq {
    plx_backend *fb;
    uint8_t *buf;
    unsigned inflight, done, failed;
    unsigned done_while_held; /* completions seen while the medium held an I/O */
};

static void seq_done(void *arg, int status)
{
    struct seq *s = arg;
    s->inflight--;
    s->done++;
    if (status)
        s->failed++;
    if (plx_fault_held(s->fb))
        s->done_while_held++;
}

static void service_once(plx_store *st)
{
    int rc = plx_store_service(st);
    ck_assert_msg(rc >= 0, "service: %d (%s)", rc, plx_store_errmsg(st));
    struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
    (void)poll(&p, 1, 1);
}

static void write_seq(plx_store *st, plx_vdi *v, struct seq *s, uint64_t first, uint64_t nblocks,
                      unsigned chunk, unsigned depth)
{
    uint64_t next = first, end = first + nblocks;
    unsigned submitted = 0, target = (unsigned)((nblocks + chunk - 1) / chunk);
    unsigned done0 = s->done;
    while (s->done - done0 < target) {
        while (next < end && s->inflight < depth) {
            unsigned n = next + chunk <= end ? chunk : (unsigned)(end - next);
            for (unsigned i = 0; i < n; i++)
                tu_fill(s->buf + (size_t)i * BS, BS, 0x5eed0000 + next + i);
            int rc = plx_vdi_submit_write(v, s->buf, next * BS, (size_t)n * BS, 0, seq_done, s);
            ck_assert_msg(rc == 0, "submit write at block %llu: %d (%s)",
                          (unsigned long long)next, rc, plx_store_errmsg(st));
            s->inflight++;
            submitted++;
            next += n;
        }
        service_once(st);
    }
    ck_assert_uint_eq(submitted, target);
    ck_assert_uint_eq(s->failed, 0);
}

/* Service until nothing is in flight (a claim ahead included). */
static void settle(plx_store *st)
{
    for (int i = 0; i < 100000 && plx_store_busy(st); i++)
        service_once(st);
    ck_assert_msg(!plx_store_busy(st), "the store never went idle");
}

static void verify_seq(plx_store *st, plx_vdi *v, uint64_t first, uint64_t nblocks)
{
    uint8_t *got = plx_block_alloc(1), *want = plx_block_alloc(1);
    for (uint64_t b = first; b < first + nblocks; b++) {
        int rc = plx_vdi_pread(v, got, b * BS, BS);
        ck_assert_msg(rc == 0, "read block %llu: %d (%s)", (unsigned long long)b, rc,
                      plx_store_errmsg(st));
        tu_fill(want, BS, 0x5eed0000 + b);
        ck_assert_msg(memcmp(got, want, BS) == 0, "block %llu reads back wrong",
                      (unsigned long long)b);
    }
    plx_block_free(got);
    plx_block_free(want);
}

static void check_line(void *arg, int is_error, const char *line)
{
    if (is_error)
        fprintf(stderr, "claim: check: %s (%s)\n", line, (const char *)arg);
}

static void check_clean(plx_store *st, const char *what)
{
    struct plx_check_report rep;
    int rc = plx_check(st, &rep, check_line, (void *)what);
    ck_assert_msg(rc == 0, "%s: plx_check: %d (%s)", what, rc, plx_store_errmsg(st));
    ck_assert_msg(rep.errors == 0, "%s: plx_check found %llu errors", what,
                  (unsigned long long)rep.errors);
}

/* The engine does no synchronous claim I/O at an extent boundary: with every write to the
 * extent catalogue held at the medium (a claim's entry write never completes), sequential
 * writes cross into the spare claimed beforehand and go on completing while the next spare's
 * claim waits for its held entry write. A synchronous claim would wait for the held write (the
 * fault backend carries it out after 3 s of waiting, so the writes would complete only once
 * it was no longer held). */
START_TEST(test_boundary_takes_spare_without_io)
{
    plx_backend *fb = new_fault_medium(64 * MiB);
    plx_store *st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    plx_vdi *v = create_open(st, "seq", 8 * MiB);
    struct seq s = {.fb = fb, .buf = plx_block_alloc(16)};

    /* Most of the first data extent: its spare is claimed ahead, and the claim finishes. */
    write_seq(st, v, &s, 0, 200, 8, 4);
    settle(st);
    ck_assert_uint_eq(plx_fault_held(fb), 0);

    /* From here every catalogue write is held. 300 blocks cross into the spare (at about 255)
     * and use three quarters of it, which starts the next claim ahead. */
    plx_fault_hold_blocks(fb, PLX_IO_WRITE, st->sb.catalogue_start, st->sb.catalogue_blocks,
                          3000);
    s.done_while_held = 0;
    write_seq(st, v, &s, 200, 300, 8, 4);
    ck_assert_msg(plx_fault_held(fb) >= 1,
                  "no catalogue write is held after the writes: the engine waited for one "
                  "(a synchronous claim) or no claim ahead started");
    ck_assert_msg(s.done_while_held >= 1, "no write completed while the claim was held");

    plx_fault_release(fb);
    settle(st);
    verify_seq(st, v, 0, 500);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    check_clean(st, "after the held claim");
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(s.buf);
    fb->ops->destroy(fb);
}
END_TEST

/* A steady sequential writer over several extents takes every new extent from a spare that was
 * ready: the synchronous fallback never runs after the first extent of each type, and the
 * writer never waits for a claim in flight. Both placements (by leaf with 4 MiB extents, two
 * leaf slots each: with 1 MiB extents a slot would be the whole extent, bitmap included).
 * Close gives the spare back. */
static void steady(unsigned placement)
{
    uint64_t ext = placement == PLX_PLACEMENT_LEAF ? 4 * MiB : MiB;
    plx_backend *fb = new_fault_medium_ext(64 * ext, ext);
    plx_store *st = open_on(fb, placement);
    uint64_t nblocks = 8 * ext / BS; /* 8 extents' worth */
    plx_vdi *v = create_open(st, "steady", 2 * nblocks * BS);
    struct seq s = {.fb = fb, .buf = plx_block_alloc(16)};
    write_seq(st, v, &s, 0, 16, 16, 1); /* the first extent of each type: claimed when needed */
    struct plx_alloc *a = st->alloc;
    uint64_t sync0 = a->claims_sync;
    write_seq(st, v, &s, 16, nblocks, 16, 8);
    printf("claim: steady (%s placement): %llu spares taken ready, %llu waited for, %llu "
           "synchronous after the first extents\n",
           placement == PLX_PLACEMENT_LEAF ? "leaf" : "arrival",
           (unsigned long long)a->claims_ahead, (unsigned long long)a->claims_waited,
           (unsigned long long)(a->claims_sync - sync0));
    ck_assert_uint_eq(a->claims_sync - sync0, 0);
    ck_assert_uint_eq(a->claims_waited, 0);
    ck_assert_uint_ge(a->claims_ahead, 7);
    settle(st);
    verify_seq(st, v, 0, 16 + nblocks);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* The spare held at close was released: a second process claims it. */
    st = open_on(fb, placement);
    check_clean(st, "after the steady writer");
    struct plx_store_info in;
    ck_assert_int_eq(plx_store_info(st, &in), 0);
    uint64_t held_by_nobody = 0;
    for (uint64_t e = 1; e < st->sb.extent_count; e++)
        held_by_nobody += st->cat[e].type != PLX_EXTENT_UNUSED && st->cat[e].holder_host == 0;
    ck_assert_uint_eq(held_by_nobody,
                      in.extents_by_type[PLX_EXTENT_METADATA] + in.extents_by_type[PLX_EXTENT_DATA]);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(s.buf);
    fb->ops->destroy(fb);
}

START_TEST(test_steady_writer_never_claims_synchronously)
{
    steady(PLX_PLACEMENT_ARRIVAL);
}
END_TEST

START_TEST(test_steady_writer_by_leaf)
{
    steady(PLX_PLACEMENT_LEAF);
}
END_TEST

/* Another process holds the admin lock: the claim ahead waits for it without blocking the
 * writer (which goes on in the extents it holds), and completes once the lock is free. */
START_TEST(test_claim_waits_for_lock_without_blocking)
{
    plx_backend *fb = new_fault_medium(64 * MiB);
    plx_store *st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    plx_vdi *v = create_open(st, "locked", 8 * MiB);
    struct seq s = {.fb = fb, .buf = plx_block_alloc(16)};
    write_seq(st, v, &s, 0, 16, 16, 1);
    /* The other process: the medium's admin lock, taken behind the store's back. */
    ck_assert_int_eq(fb->ops->lock(fb, 1), 0);
    write_seq(st, v, &s, 16, 200, 8, 4); /* would start a claim: the lock is busy */
    ck_assert_ptr_nonnull(st->alloc->claim);
    ck_assert(!plx_alloc_claim_io(st));
    ck_assert_uint_eq(st->alloc->spare[1], 0);
    ck_assert_int_eq(fb->ops->lock(fb, 0), 0);
    /* The next allocations try again (at most every millisecond) and the claim completes. */
    uint64_t end = 216;
    for (; end < 248 && !st->alloc->spare[1]; end += 8) {
        write_seq(st, v, &s, end, 8, 8, 1);
        settle(st);
    }
    ck_assert_uint_ne(st->alloc->spare[1], 0);
    ck_assert_uint_eq(st->alloc->claims_sync, 2); /* the first metadata and data extents */
    verify_seq(st, v, 0, end);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(s.buf);
    fb->ops->destroy(fb);
}
END_TEST

/* One write, its completion noted. */
struct one {
    int done, status;
};

static void one_done(void *arg, int status)
{
    struct one *o = arg;
    o->done = 1;
    o->status = status;
}

/* A serving loop (a server's engine thread): a write that needs a new extent while another
 * process holds the admin lock waits for room as a request waits, and the loop meanwhile serves
 * another VDI's in-place overwrites; once the lock is free the write completes, its extent
 * claimed on the loop, never synchronously. When the lock stays held past the lock timeout the
 * write alone fails, with the lock's message. */
START_TEST(test_serving_write_waits_for_room)
{
    plx_backend *fb = new_fault_medium(64 * MiB);
    plx_store *st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    plx_vdi *a = create_open(st, "a", 2 * MiB);
    plx_vdi *b = create_open(st, "b", 8 * MiB);
    struct seq s = {.fb = fb, .buf = plx_block_alloc(16)};
    write_seq(st, a, &s, 0, 512, 16, 4); /* a whole: its overwrites below need no block */
    settle(st);
    plx_store_will_service(st);
    st->alloc->claim_retry_ns = UINT64_MAX; /* no claim ahead: the write must wait for one */
    uint64_t sync0 = st->alloc->claims_sync;
    uint8_t *big = plx_block_alloc(300);
    tu_fill(big, 300 * BS, 0xb16);
    ck_assert_int_eq(fb->ops->lock(fb, 1), 0); /* another process's admin lock */
    struct one w = {0};
    int rc = plx_vdi_submit_write(b, big, 0, 300 * BS, 0, one_done, &w);
    ck_assert_msg(rc == 0, "submit: %d (%s)", rc, plx_store_errmsg(st));
    for (int i = 0; i < 20; i++)
        service_once(st);
    ck_assert_int_eq(w.done, 0);        /* 300 blocks: more than the held extents have */
    write_seq(st, a, &s, 0, 256, 8, 4); /* in place: served meanwhile */
    /* A trim of b's unwritten half needs no block: it does not wait either. */
    struct one t = {0};
    ck_assert_int_eq(plx_vdi_submit_trim(b, 4 * MiB, 4 * MiB, one_done, &t), 0);
    for (int i = 0; i < 1000 && !t.done; i++)
        service_once(st);
    ck_assert_msg(t.done && t.status == 0, "trim: %d %d", t.done, t.status);
    ck_assert_int_eq(w.done, 0);
    ck_assert_int_eq(fb->ops->lock(fb, 0), 0);
    for (int i = 0; i < 100000 && !w.done; i++)
        service_once(st);
    ck_assert_msg(w.done && w.status == 0, "b's write: %d (%s)", w.status, plx_store_errmsg(st));
    ck_assert_uint_eq(st->alloc->claims_sync, sync0);
    ck_assert_uint_ge(st->alloc->claims_waited, 1);
    uint8_t *got = plx_block_alloc(300);
    ck_assert_int_eq(plx_vdi_pread(b, got, 0, 300 * BS), 0);
    ck_assert(memcmp(got, big, 300 * BS) == 0);

    /* The lock held past the timeout: the write fails, a's overwrites do not. */
    setenv("PARALLAX_LOCK_TIMEOUT", "0.3", 1);
    ck_assert_int_eq(fb->ops->lock(fb, 1), 0);
    struct one w2 = {0};
    rc = plx_vdi_submit_write(b, big, 2 * MiB, 300 * BS, 0, one_done, &w2);
    ck_assert_int_eq(rc, 0);
    write_seq(st, a, &s, 256, 256, 8, 4);
    for (int i = 0; i < 100000 && !w2.done; i++)
        service_once(st);
    ck_assert_int_eq(w2.done, 1);
    ck_assert_int_eq(w2.status, -EBUSY);
    ck_assert_msg(strstr(plx_store_errmsg(st), "admin lock"), "message: %s", plx_store_errmsg(st));
    ck_assert_int_eq(fb->ops->lock(fb, 0), 0);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    settle(st);
    check_clean(st, "after the waits for room");
    ck_assert_int_eq(plx_vdi_close(a), 0);
    ck_assert_int_eq(plx_vdi_close(b), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(got);
    plx_block_free(big);
    plx_block_free(s.buf);
    fb->ops->destroy(fb);
}
END_TEST

/* The collector run in the writer's process gives back a spare nothing was handed out from (an
 * extent with no live block): the writer then claims another and goes on, and the store stays
 * clean. */
START_TEST(test_gc_releases_unused_spare)
{
    plx_backend *fb = new_fault_medium(64 * MiB);
    plx_store *st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    plx_vdi *v = create_open(st, "gc", 8 * MiB);
    struct seq s = {.fb = fb, .buf = plx_block_alloc(16)};
    write_seq(st, v, &s, 0, 220, 8, 4);
    settle(st);
    uint64_t spare = st->alloc->spare[1];
    ck_assert_uint_ne(spare, 0);
    struct plx_gc_report r;
    int rc = plx_gc(st, 0, &r);
    ck_assert_msg(rc == 0, "gc: %d %s", rc, plx_store_errmsg(st));
    ck_assert_uint_ge(r.extents_released, 1);
    ck_assert_uint_eq(st->alloc->spare[1], 0);
    ck_assert(!st->alloc->ext[spare].held);
    ck_assert_uint_eq(st->cat[spare].type, PLX_EXTENT_UNUSED);
    write_seq(st, v, &s, 220, 600, 8, 4);
    settle(st);
    verify_seq(st, v, 0, 820);
    check_clean(st, "after gc released the spare");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    check_clean(st, "reopened");
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(s.buf);
    fb->ops->destroy(fb);
}
END_TEST

/* A blocking write returns with no claim ahead doing I/O (holding the admin lock): its caller
 * may stop servicing the store, and another process (or store) may need the lock. */
START_TEST(test_blocking_write_leaves_no_claim_running)
{
    plx_backend *fb = new_fault_medium(64 * MiB);
    plx_store *st = open_on(fb, PLX_PLACEMENT_ARRIVAL);
    plx_vdi *v = create_open(st, "blocking", 8 * MiB);
    uint8_t *buf = plx_block_alloc(8);
    uint64_t spares = 0;
    for (uint64_t b = 0; b < 1024; b += 8) {
        for (unsigned i = 0; i < 8; i++)
            tu_fill(buf + (size_t)i * BS, BS, 0x5eed0000 + b + i);
        int rc = plx_vdi_pwrite(v, buf, b * BS, 8 * BS, 0);
        ck_assert_msg(rc == 0, "write at %llu: %d (%s)", (unsigned long long)b, rc,
                      plx_store_errmsg(st));
        ck_assert_msg(!plx_alloc_claim_io(st), "a claim is still running after the write at %llu",
                      (unsigned long long)b);
        spares += st->alloc->spare[1] != 0;
    }
    ck_assert_uint_gt(spares, 0); /* claims ahead did run */
    ck_assert_uint_gt(st->alloc->claims_ahead, 0);
    verify_seq(st, v, 0, 1024);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(buf);
    fb->ops->destroy(fb);
}
END_TEST

static Suite *claim_suite(void)
{
    Suite *s = suite_create("claim");
    TCase *tc = tcase_create("ahead");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_boundary_takes_spare_without_io);
    tcase_add_test(tc, test_steady_writer_never_claims_synchronously);
    tcase_add_test(tc, test_steady_writer_by_leaf);
    tcase_add_test(tc, test_claim_waits_for_lock_without_blocking);
    tcase_add_test(tc, test_gc_releases_unused_spare);
    tcase_add_test(tc, test_blocking_write_leaves_no_claim_running);
    tcase_add_test(tc, test_serving_write_waits_for_room);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(claim_suite)
