/*
 * test_backend_fault.c - the fault-injection backend (backend_fault.h): failing chosen I/Os,
 * and the crash images it builds from its log (what survives a crash at each position, against
 * a model of the durability rules).
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <libaio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "backend.h"
#include "backend_fault.h"
#include "backend_fixture.h"
#include "testutil.h"
#include "tgtd.h"

/* ---- Fault backend: injection ---------------------------------------------------------------- */

START_TEST(test_fault_fail_nth)
{
    plx_backend *be = plx_fault_create(NULL, 16);
    unsigned char *buf = plx_block_alloc(1);
    struct rec r[4];
    int count = 0;

    write_pattern(be, 0, 1, 1, 0);
    ck_assert_uint_eq(plx_fault_io_count(be), 1);
    uint64_t pos = plx_fault_log_position(be);

    plx_fault_fail_nth(be, 2, -EIO);
    tu_fill(buf, BS, 2);
    for (int i = 0; i < 3; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, 1 + i, 1, buf, 0), 0);
    }
    /* The failure is reported by poll, never by submit. */
    ck_assert_int_eq(count, 0);
    drain(be);
    ck_assert_int_eq(r[0].status, 0);
    ck_assert_int_eq(r[1].status, -EIO);
    ck_assert_int_eq(r[2].status, 0);
    ck_assert_int_eq(r[1].calls, 1);
    ck_assert(is_zero(be, 2));
    ck_assert(has_pattern(be, 3, 1, 2));
    ck_assert_uint_eq(plx_fault_errors_injected(be), 1);
    ck_assert_uint_eq(plx_fault_io_count(be), 6); /* + 2 reads */
    /* Two writes, each submitted and completed; the failed one left no trace. */
    ck_assert_uint_eq(plx_fault_log_position(be), pos + 4);

    /* Reads and flushes count too. */
    plx_fault_fail_nth(be, 1, -ENOSPC);
    plx_fault_fail_nth(be, 2, -EROFS);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 0, 1, buf, 0), -ENOSPC);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), -EROFS);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_uint_eq(plx_fault_errors_injected(be), 3);

    /* A rejected submit is not an I/O. */
    uint64_t n = plx_fault_io_count(be);
    ck_assert_int_eq(rec_submit(be, &r[3], PLX_IO_READ, 16, 1, buf, 0), -EINVAL);
    ck_assert_uint_eq(plx_fault_io_count(be), n);

    plx_fault_fail_nth(be, 1, -EIO);
    plx_fault_clear(be);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 0, 1, buf, 0), 0);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_fault_fail_blocks)
{
    plx_backend *be = plx_fault_create(NULL, 32);
    unsigned char *buf = plx_block_alloc(4);

    plx_fault_fail_blocks(be, PLX_IO_WRITE, 10, 2, -EIO, 2);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 5, 1, buf, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 10, 1, buf, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 11, 1, buf, 0), -EIO);
    /* A range that only overlaps the rule's at its edge. */
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 8, 3, buf, 0), -EIO);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 12, 1, buf, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 9, 1, buf, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 11, 1, buf, 0), 0); /* used up */
    ck_assert_uint_eq(plx_fault_errors_injected(be), 2);

    plx_fault_fail_blocks(be, PLX_IO_READ, 20, 1, -EUCLEAN, -1);
    plx_fault_fail_blocks(be, PLX_IO_FLUSH, 0, 0, -EIO, 1);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(tu_io(be, PLX_IO_READ, 18, 4, buf, 0), -EUCLEAN);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 21, 4, buf, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), -EIO);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 20, 1, buf, 0), 0);
    plx_fault_clear(be);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 20, 1, buf, 0), 0);
    ck_assert_uint_eq(plx_fault_errors_injected(be), 8);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_fault_reads_see_latest)
{
    plx_backend *be = plx_fault_create(NULL, 8);
    unsigned char *w = plx_block_alloc(1), *rd = plx_block_alloc(1);
    struct rec a = {0}, b = {0};
    tu_fill(w, BS, 5);
    /* Both in flight at once: the read was submitted after the write. */
    ck_assert_int_eq(rec_submit(be, &a, PLX_IO_WRITE, 4, 1, w, 0), 0);
    ck_assert_int_eq(rec_submit(be, &b, PLX_IO_READ, 4, 1, rd, 0), 0);
    drain(be);
    ck_assert_mem_eq(rd, w, BS);
    plx_block_free(w);
    plx_block_free(rd);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_fault_initial)
{
    plx_backend *mem = plx_backend_mem_create(8);
    unsigned char *buf = plx_block_alloc(1);
    tu_fill(buf, BS, 3);
    plx_backend_mem_poke(mem, 1, buf);

    plx_backend *be = plx_fault_create(mem, 0);
    ck_assert_uint_eq(be->nblocks, 8);
    ck_assert(has_pattern(be, 1, 1, 3));
    write_pattern(be, 1, 1, 4, 0);
    ck_assert(has_pattern(be, 1, 1, 4));
    /* The initial medium is copied, not shared. */
    ck_assert_mem_eq(plx_backend_mem_peek(mem, 1), buf, BS);
    mem->ops->destroy(mem);

    /* Crash images start from the initial contents. */
    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    plx_crash_cursor_seek(c, plx_fault_log_position(be));
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(img, 1, 1, 3));
    img->ops->destroy(img);
    plx_crash_cursor_free(c);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* ---- Fault backend: crash images ------------------------------------------------------------- */

static plx_backend *image_at(const plx_backend *be, uint64_t pos, enum plx_crash_mode mode,
                             uint64_t seed)
{
    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    plx_crash_cursor_seek(c, pos);
    plx_backend *img = plx_crash_cursor_image(c, mode, seed);
    plx_crash_cursor_free(c);
    return img;
}

START_TEST(test_crash_flushed_survives)
{
    plx_backend *be = plx_fault_create(NULL, 16);

    write_pattern(be, 1, 1, 100, 0);
    uint64_t before_flush = plx_fault_log_position(be);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    uint64_t flushed = plx_fault_log_position(be);
    write_pattern(be, 2, 1, 200, 0);
    uint64_t end = plx_fault_log_position(be);

    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 0);

    /* Flush submitted but not completed: block 1 is not durable yet. */
    plx_crash_cursor_seek(c, before_flush + 1);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 1);
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(is_zero(img, 1));
    img->ops->destroy(img);

    plx_crash_cursor_seek(c, flushed);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 0);
    plx_crash_cursor_seek(c, end);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 1);

    img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(img, 1, 1, 100));
    ck_assert(is_zero(img, 2));
    img->ops->destroy(img);

    img = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
    ck_assert(has_pattern(img, 1, 1, 100));
    ck_assert(has_pattern(img, 2, 1, 200));
    img->ops->destroy(img);

    /* Position 0 is the medium before anything happened. */
    img = image_at(be, 0, PLX_CRASH_KEEP_ALL, 0);
    ck_assert(is_zero(img, 1));
    img->ops->destroy(img);

    plx_crash_cursor_free(c);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_crash_flush_must_follow_completion)
{
    plx_backend *be = plx_fault_create(NULL, 16);
    unsigned char *buf = plx_block_alloc(1);
    struct rec w = {0}, f = {0};

    /* The flush is submitted while the write is still in flight: it does not cover it. */
    tu_fill(buf, BS, 9);
    ck_assert_int_eq(rec_submit(be, &w, PLX_IO_WRITE, 3, 1, buf, 0), 0);
    ck_assert_int_eq(rec_submit(be, &f, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    drain(be);
    ck_assert_int_eq(w.status | f.status, 0);

    plx_backend *img = image_at(be, plx_fault_log_position(be), PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(is_zero(img, 3));
    img->ops->destroy(img);

    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    img = image_at(be, plx_fault_log_position(be), PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(img, 3, 1, 9));
    img->ops->destroy(img);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_crash_fua)
{
    plx_backend *be = plx_fault_create(NULL, 16);
    unsigned char *buf = plx_block_alloc(2);
    struct rec w = {0};

    tu_fill(buf, 2 * BS, 31);
    ck_assert_int_eq(rec_submit(be, &w, PLX_IO_WRITE, 4, 2, buf, PLX_IO_FUA), 0);
    uint64_t submitted = plx_fault_log_position(be);
    drain(be);
    uint64_t completed = plx_fault_log_position(be);

    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    plx_crash_cursor_seek(c, submitted);
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(is_zero(img, 4));
    img->ops->destroy(img);
    img = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
    ck_assert(has_pattern(img, 4, 2, 31));
    img->ops->destroy(img);

    plx_crash_cursor_seek(c, completed);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 0);
    img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(img, 4, 2, 31));
    img->ops->destroy(img);
    plx_crash_cursor_free(c);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_crash_newer_durable_wins)
{
    plx_backend *be = plx_fault_create(NULL, 16);

    /* v1 sits in the cache when v2 goes to the medium with FUA: v1 can never come back. */
    write_pattern(be, 5, 1, 1, 0);
    write_pattern(be, 5, 1, 2, PLX_IO_FUA);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    uint64_t end = plx_fault_log_position(be);
    for (int mode = 0; mode < 3; mode++) {
        for (uint64_t seed = 0; seed < 8; seed++) {
            plx_backend *img = image_at(be, end, (enum plx_crash_mode)mode, seed);
            ck_assert(has_pattern(img, 5, 1, 2));
            img->ops->destroy(img);
        }
    }
    /* Before the flush completes, v1 is still pending yet superseded. */
    plx_backend *img = image_at(be, end - 1, PLX_CRASH_KEEP_ALL, 0);
    ck_assert(has_pattern(img, 5, 1, 2));
    img->ops->destroy(img);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_crash_random)
{
    enum { NW = 8, SEEDS = 64 };
    plx_backend *be = plx_fault_create(NULL, 32);

    write_pattern(be, 0, 1, 500, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    for (int i = 0; i < NW; i++)
        write_pattern(be, 1 + (uint64_t)i, 1, 600 + (uint64_t)i, 0);
    /* Block 20 written three times, never flushed. */
    for (int v = 1; v <= 3; v++)
        write_pattern(be, 20, 1, 700 + (uint64_t)v, 0);
    uint64_t end = plx_fault_log_position(be);

    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    plx_crash_cursor_seek(c, end);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), NW + 3);

    int present[NW] = {0}, absent[NW] = {0}, version[4] = {0};
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        plx_backend *a = plx_crash_cursor_image(c, PLX_CRASH_RANDOM, seed);
        plx_backend *b = image_at(be, end, PLX_CRASH_RANDOM, seed);
        ck_assert(has_pattern(a, 0, 1, 500));
        for (int i = 0; i < NW; i++) {
            int in_a = has_pattern(a, 1 + (uint64_t)i, 1, 600 + (uint64_t)i);
            ck_assert(in_a || is_zero(a, 1 + (uint64_t)i));
            /* Same seed, same image, whichever cursor made it. */
            ck_assert_int_eq(in_a, has_pattern(b, 1 + (uint64_t)i, 1, 600 + (uint64_t)i));
            present[i] += in_a;
            absent[i] += !in_a;
        }
        int v = is_zero(a, 20) ? 0 : -1;
        for (int k = 1; k <= 3; k++)
            if (has_pattern(a, 20, 1, 700 + (uint64_t)k))
                v = k;
        ck_assert_int_ge(v, 0);
        ck_assert(has_pattern(b, 20, 1, v ? 700 + (uint64_t)v : 0) || (v == 0 && is_zero(b, 20)));
        version[v]++;
        a->ops->destroy(a);
        b->ops->destroy(b);
    }
    for (int i = 0; i < NW; i++)
        ck_assert_msg(present[i] > 0 && absent[i] > 0, "block %d: %d present, %d absent", i + 1,
                      present[i], absent[i]);
    for (int k = 0; k < 4; k++)
        ck_assert_msg(version[k] > 0, "block 20 never held version %d", k);
    plx_crash_cursor_free(c);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_crash_images_independent)
{
    plx_backend *be = plx_fault_create(NULL, 16);
    write_pattern(be, 1, 1, 10, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    write_pattern(be, 2, 1, 20, 0);

    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    plx_crash_cursor_seek(c, plx_fault_log_position(be));
    plx_backend *a = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
    plx_backend *b = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);

    write_pattern(a, 1, 1, 11, 0);
    write_pattern(a, 2, 1, 21, 0);
    write_pattern(a, 3, 1, 31, 0);
    plx_backend_mem_poke(a, 4, NULL);
    ck_assert(has_pattern(b, 1, 1, 10));
    ck_assert(has_pattern(b, 2, 1, 20));
    ck_assert(is_zero(b, 3));
    write_pattern(b, 1, 1, 12, 0);
    ck_assert(has_pattern(a, 1, 1, 11));

    /* The cursor's state is untouched, and moving it on leaves earlier images alone. */
    plx_backend *d = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(d, 1, 1, 10));
    ck_assert(is_zero(d, 2));
    ck_assert(is_zero(d, 3));
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    write_pattern(be, 1, 1, 13, PLX_IO_FUA);
    plx_crash_cursor_seek(c, plx_fault_log_position(be));
    plx_backend *e = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    ck_assert(has_pattern(e, 1, 1, 13));
    ck_assert(has_pattern(e, 2, 1, 20));
    ck_assert(has_pattern(d, 1, 1, 10));
    ck_assert(is_zero(d, 2));
    ck_assert(has_pattern(be, 1, 1, 13));

    /* Images outlive the cursor and the fault backend. */
    plx_crash_cursor_free(c);
    be->ops->destroy(be);
    ck_assert(has_pattern(a, 2, 1, 21));
    ck_assert(has_pattern(b, 1, 1, 12));
    ck_assert(has_pattern(e, 1, 1, 13));
    a->ops->destroy(a);
    b->ops->destroy(b);
    d->ops->destroy(d);
    e->ops->destroy(e);
}
END_TEST

START_TEST(test_crash_points)
{
    plx_backend *be = plx_fault_create(NULL, 16);
    uint64_t one;
    ck_assert_uint_eq(plx_fault_crash_points(be, &one, 1), 0);
    write_pattern(be, 1, 1, 1, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    write_pattern(be, 2, 2, 2, PLX_IO_FUA);

    uint64_t n = plx_fault_crash_points(be, NULL, 0);
    ck_assert_uint_gt(n, 0);
    uint64_t *pts = calloc(n, sizeof(*pts));
    ck_assert_uint_eq(plx_fault_crash_points(be, pts, n), n);
    for (uint64_t i = 1; i < n; i++)
        ck_assert_uint_gt(pts[i], pts[i - 1]);
    ck_assert_uint_gt(pts[0], 0);
    ck_assert_uint_le(pts[n - 1], plx_fault_log_position(be));
    /* A short array gets the first positions; the return value is still the total. */
    ck_assert_uint_eq(plx_fault_crash_points(be, &one, 1), n);
    ck_assert_uint_eq(one, pts[0]);

    /* Walking every point in order works, and so does going back. */
    struct plx_crash_cursor *c = plx_crash_cursor_new(be);
    for (uint64_t i = 0; i < n; i++)
        plx_crash_cursor_seek(c, pts[i]);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 0);
    plx_crash_cursor_seek(c, pts[0]);
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 1);
    plx_crash_cursor_free(c);
    free(pts);
    be->ops->destroy(be);
}
END_TEST

/*
 * A random workload of overlapping-free writes, FUA writes and flushes, checked at every crash
 * point against the durability rules computed straight from their definition.
 */
struct model_write {
    uint64_t block;
    uint32_t n;
    uint64_t seed;
    int fua;
    uint64_t submit_ev, done_ev; /* log indexes; done_ev UINT64_MAX until completed */
};

struct model_flush {
    uint64_t submit_ev, done_ev;
};

struct model {
    plx_backend *be;
    struct model_write *w;
    size_t nw;
    struct model_flush *f;
    size_t nf;
};

struct model_io {
    struct plx_io io;
    struct model *m;
    size_t idx;
    void *buf;
    int busy;
};

static void model_done(struct plx_io *io, int status)
{
    struct model_io *mi = io->owner;
    uint64_t ev = plx_fault_log_position(mi->m->be) - 1;
    ck_assert_int_eq(status, 0);
    if (io->op == PLX_IO_WRITE)
        mi->m->w[mi->idx].done_ev = ev;
    else
        mi->m->f[mi->idx].done_ev = ev;
    mi->busy = 0;
}

static int model_durable(const struct model *m, const struct model_write *w, uint64_t pos)
{
    if (w->done_ev >= pos)
        return 0;
    if (w->fua)
        return 1;
    for (size_t i = 0; i < m->nf; i++)
        if (m->f[i].submit_ev > w->done_ev && m->f[i].done_ev < pos)
            return 1;
    return 0;
}

/* The latest write to block submitted before pos (and durable if durable_only), or NULL. */
static const struct model_write *model_latest(const struct model *m, uint64_t block, uint64_t pos,
                                              int durable_only)
{
    const struct model_write *best = NULL;
    for (size_t i = 0; i < m->nw; i++) {
        const struct model_write *w = &m->w[i];
        if (block < w->block || block >= w->block + w->n || w->submit_ev >= pos)
            continue;
        if (durable_only && !model_durable(m, w, pos))
            continue;
        if (best == NULL || w->submit_ev > best->submit_ev)
            best = w;
    }
    return best;
}

/* Writes submitted before pos that are not durable there, leaving out those whose every block
 * has since been overwritten by a durable write (they can no longer reach the medium). */
static uint64_t model_pending(const struct model *m, uint64_t pos)
{
    uint64_t pending = 0;
    for (size_t k = 0; k < m->nw; k++) {
        const struct model_write *w = &m->w[k];
        if (w->submit_ev >= pos || model_durable(m, w, pos))
            continue;
        int live = 0;
        for (uint64_t b = w->block; b < w->block + w->n && !live; b++) {
            const struct model_write *d = model_latest(m, b, pos, 1);
            live = d == NULL || d->submit_ev < w->submit_ev;
        }
        pending += live;
    }
    return pending;
}

static int block_matches(plx_backend *img, uint64_t block, const struct model_write *w)
{
    if (w == NULL)
        return is_zero(img, block);
    unsigned char *want = plx_block_alloc(w->n);
    unsigned char *got = plx_block_alloc(1);
    tu_fill(want, (size_t)w->n * BS, w->seed);
    ck_assert_int_eq(tu_io(img, PLX_IO_READ, block, 1, got, 0), 0);
    int same = memcmp(got, want + (block - w->block) * BS, BS) == 0;
    plx_block_free(want);
    plx_block_free(got);
    return same;
}

START_TEST(test_crash_model)
{
    enum { NBLK = 12, SLOTS = 6 };
    const int steps = tu_quick() ? 120 : 400;
    uint64_t rng = 12345 + (uint64_t)_i;
    struct model m = {.be = plx_fault_create(NULL, NBLK)};
    struct model_io mio[SLOTS];

    m.w = calloc((size_t)steps, sizeof(*m.w));
    m.f = calloc((size_t)steps, sizeof(*m.f));
    memset(mio, 0, sizeof(mio));
    for (int s = 0; s < SLOTS; s++)
        mio[s].buf = plx_block_alloc(3);

    for (int step = 0; step < steps; step++) {
        int s = (int)(tu_rand(&rng) % SLOTS);
        uint64_t r = tu_rand(&rng) % 10;
        if (mio[s].busy || r < 3) {
            m.be->ops->poll(m.be, 0);
            continue;
        }
        mio[s].m = &m;
        mio[s].io = (struct plx_io){.done = model_done, .owner = &mio[s]};
        if (r < 5) {
            mio[s].io.op = PLX_IO_FLUSH;
            mio[s].idx = m.nf;
            ck_assert_int_eq(m.be->ops->submit(m.be, &mio[s].io), 0);
            m.f[m.nf++] = (struct model_flush){plx_fault_log_position(m.be) - 1, UINT64_MAX};
        } else {
            uint32_t n = 1 + (uint32_t)(tu_rand(&rng) % 3);
            uint64_t block = tu_rand(&rng) % (NBLK - n + 1);
            /* The engine never has overlapping writes in flight. */
            int clash = 0;
            for (int o = 0; o < SLOTS; o++) {
                const struct plx_io *oi = &mio[o].io;
                if (mio[o].busy && oi->op == PLX_IO_WRITE && oi->block < block + n &&
                    block < oi->block + oi->nblocks)
                    clash = 1;
            }
            if (clash)
                continue;
            struct model_write *w = &m.w[m.nw];
            *w = (struct model_write){.block = block,
                                      .n = n,
                                      .seed = 9000 + (uint64_t)step,
                                      .fua = tu_rand(&rng) % 4 == 0,
                                      .done_ev = UINT64_MAX};
            tu_fill(mio[s].buf, (size_t)n * BS, w->seed);
            mio[s].io.op = PLX_IO_WRITE;
            mio[s].io.block = block;
            mio[s].io.nblocks = n;
            mio[s].io.buf = mio[s].buf;
            mio[s].io.flags = w->fua ? PLX_IO_FUA : 0;
            mio[s].idx = m.nw;
            ck_assert_int_eq(m.be->ops->submit(m.be, &mio[s].io), 0);
            w->submit_ev = plx_fault_log_position(m.be) - 1;
            m.nw++;
        }
        mio[s].busy = 1;
    }
    drain(m.be);

    uint64_t npts = plx_fault_crash_points(m.be, NULL, 0);
    uint64_t *pts = calloc(npts + 1, sizeof(*pts));
    plx_fault_crash_points(m.be, pts, npts);
    struct plx_crash_cursor *c = plx_crash_cursor_new(m.be);
    for (uint64_t i = 0; i < npts; i++) {
        uint64_t pos = pts[i];
        plx_crash_cursor_seek(c, pos);
        ck_assert_uint_eq(plx_crash_cursor_pending(c), model_pending(&m, pos));

        plx_backend *drop = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
        plx_backend *keep = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
        plx_backend *rnd = plx_crash_cursor_image(c, PLX_CRASH_RANDOM, pos);
        for (uint64_t b = 0; b < NBLK; b++) {
            const struct model_write *dw = model_latest(&m, b, pos, 1);
            const struct model_write *kw = model_latest(&m, b, pos, 0);
            ck_assert_msg(block_matches(drop, b, dw), "pos %llu block %llu: drop-unflushed",
                          (unsigned long long)pos, (unsigned long long)b);
            ck_assert_msg(block_matches(keep, b, kw), "pos %llu block %llu: keep-all",
                          (unsigned long long)pos, (unsigned long long)b);
            /* Random: the durable version or a newer write submitted before pos. */
            int ok = block_matches(rnd, b, dw);
            for (size_t k = 0; k < m.nw && !ok; k++) {
                const struct model_write *w = &m.w[k];
                if (b >= w->block && b < w->block + w->n && w->submit_ev < pos &&
                    (dw == NULL || w->submit_ev > dw->submit_ev))
                    ok = block_matches(rnd, b, w);
            }
            ck_assert_msg(ok, "pos %llu block %llu: random", (unsigned long long)pos,
                          (unsigned long long)b);
        }
        drop->ops->destroy(drop);
        keep->ops->destroy(keep);
        rnd->ops->destroy(rnd);
    }
    plx_crash_cursor_free(c);
    free(pts);
    for (int s = 0; s < SLOTS; s++)
        plx_block_free(mio[s].buf);
    free(m.w);
    free(m.f);
    m.be->ops->destroy(m.be);
}
END_TEST

static Suite *backend_fault_suite(void)
{
    Suite *s = suite_create("backend-fault");
    TCase *tc;

    tc = tcase_create("fault");
    tcase_add_test(tc, test_fault_fail_nth);
    tcase_add_test(tc, test_fault_fail_blocks);
    tcase_add_test(tc, test_fault_reads_see_latest);
    tcase_add_test(tc, test_fault_initial);
    suite_add_tcase(s, tc);

    tc = tcase_create("crash");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_crash_flushed_survives);
    tcase_add_test(tc, test_crash_flush_must_follow_completion);
    tcase_add_test(tc, test_crash_fua);
    tcase_add_test(tc, test_crash_newer_durable_wins);
    tcase_add_test(tc, test_crash_random);
    tcase_add_test(tc, test_crash_images_independent);
    tcase_add_test(tc, test_crash_points);
    tcase_add_loop_test(tc, test_crash_model, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(backend_fault_suite());
}
