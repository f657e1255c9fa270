/*
 * test_prepare.c - zeroing ahead (plx_backend_prepare, backend.h): the file backend writes zeros
 * over the holes of a prepared range and keeps what was written there; writes racing the zeroing
 * keep their data; an error or a close while zeroing neither loses data nor hangs; the allocator
 * prepares the data extents it takes when placing by leaf.
 *
 * The files live in $TMPDIR (default /tmp), which must be a file system with holes (ext4, xfs)
 * and O_DIRECT for the zeroing to run: on one without, plx_backend_prepare says -EOPNOTSUPP and
 * the tests fail rather than pass vacuously.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "backend.h"
#include "engine.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define CHUNK 256u /* blocks zeroed at a time (backend_file.c, PREP_CHUNK) */

/* A sparse temp file of nblocks opened by the file backend; *fd_out reads it for SEEK_HOLE. */
static plx_backend *open_sparse(uint64_t nblocks, int *fd_out, char *path, size_t pathlen)
{
    char errbuf[256] = "";
    int err = 0;
    snprintf(path, pathlen, "%s/plx-test-prepare-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
    ck_assert_int_eq(ftruncate(fd, (off_t)(nblocks * BS)), 0);
    plx_backend *be = plx_backend_file_open(path, 0, &err, errbuf, sizeof errbuf);
    ck_assert_msg(be != NULL, "open %s: %d %s", path, err, errbuf);
    *fd_out = fd;
    return be;
}

static void close_sparse(plx_backend *be, int fd, const char *path)
{
    if (be != NULL)
        be->ops->destroy(be);
    close(fd);
    unlink(path);
}

/* Is any part of blocks [a, b) a hole? */
static int has_hole(int fd, uint64_t a, uint64_t b)
{
    off_t h = lseek(fd, (off_t)(a * BS), SEEK_HOLE);
    ck_assert_msg(h >= 0, "SEEK_HOLE: %s", strerror(errno));
    return h < (off_t)(b * BS);
}

/* Wait (up to 60 s) until nothing prepared is left to zero. */
static void wait_prepared(plx_backend *be)
{
    struct plx_prepare_stats ps;
    for (int i = 0; i < 6000; i++) {
        plx_backend_prepare_stats(be, &ps);
        if (ps.chunks_pending == 0)
            return;
        be->ops->poll(be, 0);
        usleep(10000);
    }
    ck_abort_msg("zeroing ahead did not finish: %llu chunks pending",
                 (unsigned long long)ps.chunks_pending);
}

struct rec {
    struct plx_io io;
    int calls, status;
};

static void rec_done(struct plx_io *io, int status)
{
    struct rec *r = io->owner;
    r->calls++;
    r->status = status;
}

static void rec_write(plx_backend *be, struct rec *r, uint64_t block, uint32_t n, void *buf)
{
    memset(r, 0, sizeof *r);
    r->io = (struct plx_io){
        .op = PLX_IO_WRITE, .block = block, .nblocks = n, .buf = buf, .done = rec_done, .owner = r};
    ck_assert_int_eq(be->ops->submit(be, &r->io), 0);
}

static void drain(plx_backend *be)
{
    while (be->ops->inflight(be) > 0)
        ck_assert_int_ge(be->ops->poll(be, -1), 0);
}

static int has_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed)
{
    void *buf = plx_block_alloc(n), *want = plx_block_alloc(n);
    tu_fill(want, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, block, n, buf, 0), 0);
    int same = memcmp(buf, want, (size_t)n * BS) == 0;
    plx_block_free(buf);
    plx_block_free(want);
    return same;
}

static int is_zero(plx_backend *be, uint64_t block, uint32_t n)
{
    unsigned char *buf = plx_block_alloc(n);
    memset(buf, 0xa5, (size_t)n * BS);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, block, n, buf, 0), 0);
    int zero = 1;
    for (size_t i = 0; i < (size_t)n * BS; i++)
        zero &= buf[i] == 0;
    plx_block_free(buf);
    return zero;
}

static void write_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed)
{
    void *buf = plx_block_alloc(n);
    tu_fill(buf, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, block, n, buf, 0), 0);
    plx_block_free(buf);
}

/* Poll until every record in r[0..n) has completed, at most 10 s: a write the backend holds
 * for zeroing that never comes fails the test instead of hanging it. */
static void wait_done(plx_backend *be, struct rec *r, unsigned n)
{
    for (int k = 0; k < 10000; k++) {
        unsigned done = 0;
        for (unsigned i = 0; i < n; i++)
            done += r[i].calls > 0;
        if (done == n)
            return;
        be->ops->poll(be, 0);
        usleep(1000);
    }
    ck_abort_msg("writes into chunks not zeroed yet did not complete within 10 s");
}

/* A prepared range's holes are written, whole blocks only and only inside the range, and what
 * was written there before is kept. */
START_TEST(test_prepare_fills_holes_keeps_data)
{
    enum { N = 8 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N + 64, &fd, path, sizeof path);
    write_pattern(be, 5, 1, 1);
    write_pattern(be, 300, 11, 2);
    write_pattern(be, 1000, 1, 3);
    write_pattern(be, N - 3, 2, 4);
    ck_assert(has_hole(fd, 3, N - 1));
    ck_assert_int_eq(plx_backend_prepare(be, 3, N - 4), 0); /* blocks [3, N - 1) */
    wait_prepared(be);
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    fprintf(stderr, "prepare: %llu chunks zeroed, %llu bytes of zeros\n",
            (unsigned long long)ps.chunks_zeroed, (unsigned long long)ps.bytes_zeroed);
    ck_assert(!has_hole(fd, 3, N - 1));
    ck_assert(has_hole(fd, 0, 3));          /* before the range: untouched */
    ck_assert(has_hole(fd, N + 1, N + 64)); /* after it: untouched */
    ck_assert_uint_eq(ps.bytes_zeroed, (uint64_t)(N - 4 - 1 - 11 - 1 - 2) * BS);
    ck_assert_uint_eq(ps.chunks_zeroed, 8);
    ck_assert_int_eq(ps.error, 0);
    ck_assert(has_pattern(be, 5, 1, 1));
    ck_assert(has_pattern(be, 300, 11, 2));
    ck_assert(has_pattern(be, 1000, 1, 3));
    ck_assert(has_pattern(be, N - 3, 2, 4));
    ck_assert(is_zero(be, 3, 2));
    ck_assert(is_zero(be, 6, 200));
    close_sparse(be, fd, path);
}
END_TEST

/* Writes into a range being prepared: a write into a chunk not zeroed yet goes ahead and its
 * chunk goes first; one covering a whole chunk makes the chunk count as done; writes submitted
 * while the thread runs race it. Every write keeps its data and no hole is left. */
START_TEST(test_prepare_racing_writes)
{
    enum { N = 64 * CHUNK, SMALL = 200 };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 1); /* the thread waits before its first chunk */
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);

    /* Paused: 4 KiB writes in chunks 0..9 and 1 MiB writes over chunks 20 and 21 go ahead. */
    static struct rec early[10], whole[2], racing[SMALL];
    void *bufs = plx_block_alloc(10 + 2 * CHUNK + SMALL);
    uint8_t *b = bufs;
    for (unsigned i = 0; i < 10; i++) {
        tu_fill(b + (size_t)i * BS, BS, 100 + i);
        rec_write(be, &early[i], (uint64_t)i * CHUNK + 7, 1, b + (size_t)i * BS);
    }
    for (unsigned i = 0; i < 2; i++) {
        uint8_t *p = b + (size_t)(10 + i * CHUNK) * BS;
        tu_fill(p, (size_t)CHUNK * BS, 200 + i);
        rec_write(be, &whole[i], (uint64_t)(20 + i) * CHUNK, CHUNK, p);
    }
    wait_done(be, whole, 2);
    wait_done(be, early, 10);

    /* Go: the written chunks first; meanwhile more writes land all over the range. */
    plx_backend_prepare_test(be, 0, 0);
    uint64_t rng = 9;
    uint8_t *used = calloc(N, 1);
    for (unsigned i = 0; i < 10; i++)
        used[i * CHUNK + 7] = 1;
    for (uint64_t k = 20 * CHUNK; k < 22 * CHUNK; k++)
        used[k] = 1;
    uint64_t where[SMALL];
    for (unsigned i = 0; i < SMALL; i++) {
        uint64_t blk;
        do
            blk = tu_rand(&rng) % N;
        while (used[blk]);
        used[blk] = 1;
        where[i] = blk;
        uint8_t *p = b + (size_t)(10 + 2 * CHUNK + i) * BS;
        tu_fill(p, BS, 300 + i);
        rec_write(be, &racing[i], blk, 1, p);
        if (i % 8 == 0)
            be->ops->poll(be, 0);
    }
    drain(be);
    wait_prepared(be);
    for (unsigned i = 0; i < 10; i++) {
        ck_assert_int_eq(early[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)i * CHUNK + 7, 1, 100 + i));
    }
    for (unsigned i = 0; i < 2; i++) {
        ck_assert_int_eq(whole[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)(20 + i) * CHUNK, CHUNK, 200 + i));
    }
    for (unsigned i = 0; i < SMALL; i++) {
        ck_assert_int_eq(racing[i].status, 0);
        ck_assert_msg(has_pattern(be, where[i], 1, 300 + i), "block %llu lost its data",
                      (unsigned long long)where[i]);
    }
    for (uint64_t k = 0; k < N; k++)
        if (!used[k])
            ck_assert_msg(is_zero(be, k, 1), "block %llu is not zero", (unsigned long long)k);
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    fprintf(stderr, "prepare: racing: %llu writes waited, %llu chunks zeroed, %llu covered\n",
            (unsigned long long)ps.writes_waited, (unsigned long long)ps.chunks_zeroed,
            (unsigned long long)ps.chunks_covered);
    ck_assert_uint_eq(ps.chunks_covered, 2);
    ck_assert_uint_eq(ps.chunks_zeroed + ps.chunks_covered, N / CHUNK);
    ck_assert(!has_hole(fd, 0, N));
    free(used);
    plx_block_free(bufs);
    close_sparse(be, fd, path);
}
END_TEST

/* Right after a snapshot the writer needs many fresh chunks at once: a write into a chunk the
 * thread has not reached goes ahead at once (it does not wait for the zeroing), the thread
 * leaves a chunk alone while a write into it is in flight, and comes back to it afterwards
 * without zeroing over what was written. */
START_TEST(test_prepare_writes_go_ahead)
{
    enum { N = 16 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 1); /* the thread waits before its first chunk */
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    static struct rec w[10], late;
    uint8_t *buf = plx_block_alloc(11);
    for (unsigned i = 0; i < 10; i++) {
        tu_fill(buf + (size_t)i * BS, BS, 400 + i);
        rec_write(be, &w[i], (uint64_t)i * CHUNK + 7, 1, buf + (size_t)i * BS);
    }
    wait_done(be, w, 10); /* with the thread still paused */
    for (unsigned i = 0; i < 10; i++)
        ck_assert_int_eq(w[i].status, 0);

    /* A write in flight into chunk 12 (not reaped: the backend counts it until poll delivers
     * it): the thread zeroes every other chunk and leaves chunk 12 pending. */
    tu_fill(buf + (size_t)10 * BS, BS, 499);
    rec_write(be, &late, 12 * CHUNK + 100, 1, buf + (size_t)10 * BS);
    plx_backend_prepare_test(be, 0, 0);
    struct plx_prepare_stats ps;
    for (int k = 0; k < 6000; k++) {
        plx_backend_prepare_stats(be, &ps);
        if (ps.chunks_pending <= 1)
            break;
        usleep(10000);
    }
    ck_assert_uint_eq(ps.chunks_pending, 1);
    ck_assert(has_hole(fd, 12 * CHUNK, 12 * CHUNK + 100));
    ck_assert(!has_hole(fd, 0, 12 * CHUNK));
    drain(be);
    ck_assert_int_eq(late.status, 0);
    wait_prepared(be);
    ck_assert(!has_hole(fd, 0, N));
    for (unsigned i = 0; i < 10; i++)
        ck_assert(has_pattern(be, (uint64_t)i * CHUNK + 7, 1, 400 + i));
    ck_assert(has_pattern(be, 12 * CHUNK + 100, 1, 499));
    ck_assert(is_zero(be, 12 * CHUNK, 100));
    ck_assert(is_zero(be, 12 * CHUNK + 101, CHUNK - 101));
    plx_backend_prepare_stats(be, &ps);
    ck_assert_uint_eq(ps.writes_waited, 0);
    ck_assert_uint_eq(ps.chunks_zeroed, N / CHUNK);
    plx_block_free(buf);
    close_sparse(be, fd, path);
}
END_TEST

/* A write into the chunk the thread is zeroing waits until that chunk is done (the thread must
 * not zero over it between its look for holes and its zero write); writes elsewhere go on. */
START_TEST(test_prepare_busy_chunk_waits)
{
    enum { N = 4 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 2); /* the thread takes chunk 0 and stops inside it */
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    plx_backend_prepare_test(be, 0, 3); /* returns once the thread holds a chunk */
    static struct rec in, out;
    uint8_t *buf = plx_block_alloc(2);
    tu_fill(buf, BS, 600);
    tu_fill(buf + BS, BS, 601);
    rec_write(be, &in, 9, 1, buf);
    rec_write(be, &out, 2 * CHUNK + 9, 1, buf + BS);
    wait_done(be, &out, 1);
    for (int k = 0; k < 20; k++) {
        be->ops->poll(be, 0);
        usleep(1000);
    }
    ck_assert_int_eq(in.calls, 0);
    plx_backend_prepare_test(be, 0, 0);
    drain(be);
    ck_assert_int_eq(in.status, 0);
    ck_assert_int_eq(out.status, 0);
    wait_prepared(be);
    ck_assert(has_pattern(be, 9, 1, 600));
    ck_assert(has_pattern(be, 2 * CHUNK + 9, 1, 601));
    ck_assert(is_zero(be, 0, 9));
    ck_assert(!has_hole(fd, 0, N));
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    ck_assert_uint_eq(ps.writes_waited, 1);
    plx_block_free(buf);
    close_sparse(be, fd, path);
}
END_TEST

/* A stream of writes into a prepared range (whole 1 MiB chunks, then 128 KiB writes each starting
 * where the last ended) needs no zeros: while it streams, the thread zeroes nothing, not even the
 * chunks the small sequential writes filled in part (it used to zero them first, and the whole
 * range ahead of the writer: the medium wrote everything twice). Once the stream has stopped for
 * $PARALLAX_ZERO_STREAM_MS, the rest is zeroed as before; small writes out of any stream resume
 * zeroing ahead at once. */
START_TEST(test_prepare_stands_aside_for_streams)
{
    enum { N = 32 * CHUNK, PIECE = 32 };
    setenv("PARALLAX_ZERO_STREAM_MS", "3000", 1); /* long enough to look at while it lasts */
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(2 * N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 1); /* the thread waits before its first chunk */
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    for (unsigned c = 0; c < 8; c++)
        write_pattern(be, (uint64_t)c * CHUNK, CHUNK, 700 + c);
    for (unsigned k = 0; k < 4 * CHUNK / PIECE; k++)
        write_pattern(be, 8 * CHUNK + (uint64_t)k * PIECE, PIECE, 800 + k);
    plx_backend_prepare_test(be, 0, 0);
    usleep(300000);
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    fprintf(stderr,
            "prepare: streams: %llu chunks zeroed while streaming, %llu covered, %llu writes "
            "streamed, %llu small\n",
            (unsigned long long)ps.chunks_zeroed, (unsigned long long)ps.chunks_covered,
            (unsigned long long)ps.writes_streamed, (unsigned long long)ps.writes_random);
    ck_assert_uint_eq(ps.chunks_covered, 8);
    ck_assert_uint_eq(ps.chunks_zeroed, 0);
    ck_assert_uint_eq(ps.bytes_zeroed, 0);
    ck_assert_uint_eq(ps.writes_streamed, 8 + 4 * CHUNK / PIECE);
    ck_assert_uint_eq(ps.chunks_pending, N / CHUNK - 8);
    ck_assert(has_hole(fd, 12 * CHUNK, N));

    /* Small writes out of the stream (4 KiB, scattered): zeroing ahead resumes at once, long
     * before the stream's window ends. */
    for (unsigned k = 0; k < 8; k++)
        write_pattern(be, (uint64_t)(13 + 2 * k) * CHUNK + 5, 1, 900 + k);
    for (int k = 0; k < 200 && ps.chunks_pending > 0; k++) {
        be->ops->poll(be, 0);
        usleep(10000);
        plx_backend_prepare_stats(be, &ps);
    }
    ck_assert_uint_eq(ps.chunks_pending, 0);
    ck_assert_uint_eq(ps.writes_random, 8);
    ck_assert(!has_hole(fd, 0, N));
    ck_assert(has_hole(fd, N, 2 * N));
    for (unsigned c = 0; c < 8; c++)
        ck_assert(has_pattern(be, (uint64_t)c * CHUNK, CHUNK, 700 + c));
    for (unsigned k = 0; k < 4 * CHUNK / PIECE; k++)
        ck_assert(has_pattern(be, 8 * CHUNK + (uint64_t)k * PIECE, PIECE, 800 + k));
    for (unsigned k = 0; k < 8; k++) {
        ck_assert(has_pattern(be, (uint64_t)(13 + 2 * k) * CHUNK + 5, 1, 900 + k));
        ck_assert(is_zero(be, (uint64_t)(13 + 2 * k) * CHUNK, 5));
    }
    ck_assert(is_zero(be, 12 * CHUNK, CHUNK));
    close_sparse(be, fd, path);
    unsetenv("PARALLAX_ZERO_STREAM_MS");
}
END_TEST

/* Small sequential writes (4 KiB, each where the last ended) are no stream: each pays for its
 * allocation on ext4 like a random one, so their chunk is zeroed first, as before. */
START_TEST(test_prepare_small_sequential_no_stream)
{
    enum { N = 4 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 1);
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    for (unsigned k = 0; k < 16; k++)
        write_pattern(be, 2 * CHUNK + 40 + k, 1, 950 + k);
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    ck_assert_uint_eq(ps.writes_streamed, 0);
    ck_assert_uint_eq(ps.writes_random, 16);
    plx_backend_prepare_test(be, 0, 0);
    wait_prepared(be);
    plx_backend_prepare_stats(be, &ps);
    ck_assert_uint_eq(ps.urgent_zeroed, 1); /* chunk 2, before the others */
    ck_assert(!has_hole(fd, 0, N));
    for (unsigned k = 0; k < 16; k++)
        ck_assert(has_pattern(be, 2 * CHUNK + 40 + k, 1, 950 + k));
    ck_assert(is_zero(be, 2 * CHUNK, 40));
    close_sparse(be, fd, path);
}
END_TEST

/* A zero write that fails (the medium full, or an I/O error) ends zeroing ahead: the writes
 * succeed (the file has room for them here), nothing hangs, and later ranges are refused with
 * the error. */
static void prepare_error(int err)
{
    enum { N = 16 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, err, 1);
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    static struct rec w[4];
    void *buf = plx_block_alloc(4);
    for (unsigned i = 0; i < 4; i++) {
        tu_fill((uint8_t *)buf + (size_t)i * BS, BS, 50 + i);
        rec_write(be, &w[i], (uint64_t)i * 3 * CHUNK + 1, 1, (uint8_t *)buf + (size_t)i * BS);
    }
    plx_backend_prepare_test(be, 0, 0);
    drain(be);
    wait_prepared(be);
    for (unsigned i = 0; i < 4; i++) {
        ck_assert_int_eq(w[i].calls, 1);
        ck_assert_int_eq(w[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)i * 3 * CHUNK + 1, 1, 50 + i));
    }
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    ck_assert_int_eq(ps.error, err);
    ck_assert_uint_eq(ps.chunks_pending, 0);
    /* the one batch the thread took (up to 8 chunks at a time, backend_file_prepare.c) */
    ck_assert_uint_ge(ps.chunks_zeroed, 1);
    ck_assert_uint_le(ps.chunks_zeroed, 8);
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), err);
    /* Later writes anywhere go straight through. */
    write_pattern(be, 5 * CHUNK + 9, 1, 77);
    ck_assert(has_pattern(be, 5 * CHUNK + 9, 1, 77));
    plx_block_free(buf);
    close_sparse(be, fd, path);
}

START_TEST(test_prepare_enospc)
{
    prepare_error(-ENOSPC);
}
END_TEST

START_TEST(test_prepare_eio)
{
    prepare_error(-EIO);
}
END_TEST

/* Closing with zeroing in progress (or paused with everything pending) returns at once: at most
 * the chunk being zeroed is finished. */
START_TEST(test_prepare_close_while_zeroing)
{
    enum { N = 1024 * CHUNK }; /* 1 GiB of holes: far more than is zeroed before the close */
    for (int paused = 0; paused < 2; paused++) {
        char path[4096];
        int fd;
        plx_backend *be = open_sparse(N, &fd, path, sizeof path);
        plx_backend_prepare_test(be, 0, paused);
        ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
        usleep(20000);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        be->ops->destroy(be);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        fprintf(stderr, "prepare: close with zeroing %s took %.3f s\n",
                paused ? "paused" : "running", s);
        ck_assert_msg(s < 2.0, "close took %.3f s", s);
        close_sparse(NULL, fd, path);
    }
}
END_TEST

/* Stopping a range (an extent given back) forgets what is not zeroed there; other ranges carry
 * on. */
START_TEST(test_prepare_stop)
{
    enum { N = 8 * CHUNK };
    char path[4096];
    int fd;
    plx_backend *be = open_sparse(2 * N, &fd, path, sizeof path);
    plx_backend_prepare_test(be, 0, 1);
    ck_assert_int_eq(plx_backend_prepare(be, 0, N), 0);
    ck_assert_int_eq(plx_backend_prepare(be, N, N), 0);
    static struct rec w;
    void *buf = plx_block_alloc(1);
    tu_fill(buf, BS, 9);
    rec_write(be, &w, 3, 1, buf);
    drain(be);
    ck_assert_int_eq(w.status, 0);
    plx_backend_prepare_stop(be, 0, N);
    struct plx_prepare_stats ps;
    plx_backend_prepare_stats(be, &ps);
    ck_assert_uint_eq(ps.chunks_pending, N / CHUNK);
    plx_backend_prepare_test(be, 0, 0);
    wait_prepared(be);
    ck_assert(has_hole(fd, 4, N)); /* stopped: left as it was */
    ck_assert(!has_hole(fd, N, 2 * N));
    ck_assert(has_pattern(be, 3, 1, 9));
    plx_block_free(buf);
    close_sparse(be, fd, path);
}
END_TEST

/* Only a file backend in aio mode prepares. */
START_TEST(test_prepare_not_elsewhere)
{
    plx_backend *mem = plx_backend_mem_create(1024);
    ck_assert_int_eq(plx_backend_prepare(mem, 0, 1024), -EOPNOTSUPP);
    mem->ops->destroy(mem);
    char path[4096], errbuf[256] = "";
    int fd, err = 0;
    plx_backend *be = open_sparse(1024, &fd, path, sizeof path);
    be->ops->destroy(be);
    be = plx_backend_file_open(path, PLX_BACKEND_BLOCKING, &err, errbuf, sizeof errbuf);
    ck_assert_ptr_nonnull(be);
    ck_assert_int_eq(plx_backend_prepare(be, 0, 1024), -EOPNOTSUPP);
    be->ops->destroy(be);
    be = plx_backend_file_open(path, 0, &err, errbuf, sizeof errbuf);
    ck_assert_int_eq(plx_backend_prepare(be, 1000, 25), -EINVAL);
    close_sparse(be, fd, path);
}
END_TEST

/* The optional operations (struct plx_backend_ops from size on) are the backend's only where its
 * size covers them: a backend compiled before an operation existed has none there, whatever
 * lies in the struct past its size (here: a prepare that must not run). */
static int stub_prepared;
static int stub_prepare(plx_backend *be, uint64_t first, uint64_t nblocks)
{
    stub_prepared++;
    return 0;
}
static size_t stub_dio_align(const plx_backend *be)
{
    return 512;
}

START_TEST(test_optional_ops_by_size)
{
    plx_backend *mem = plx_backend_mem_create(1024);
    struct plx_backend_ops ops;
    plx_backend_stack_forward_ops(&ops);
    ck_assert_uint_eq(ops.size, sizeof ops);
    ck_assert_ptr_null(ops.prepare);
    ops.prepare = stub_prepare;
    ops.dio_align = stub_dio_align;
    struct plx_backend_stack *s = calloc(1, sizeof *s);
    plx_backend_stack_init(s, &ops, mem, 1, "stub");
    plx_backend *be = &s->base;
    ck_assert_int_eq(plx_backend_prepare(be, 0, 8), 0);
    ck_assert_int_eq(stub_prepared, 1);
    ck_assert_uint_eq(plx_backend_dio_align(be), 512);
    /* Compiled when the struct ended before prepare: dio_align yes, prepare no. */
    ops.size = offsetof(struct plx_backend_ops, prepare);
    ck_assert_int_eq(plx_backend_prepare(be, 0, 8), -EOPNOTSUPP);
    ck_assert_int_eq(stub_prepared, 1);
    ck_assert_uint_eq(plx_backend_dio_align(be), 512);
    /* No size at all (ops written without it): no optional operation. */
    ops.size = 0;
    ck_assert_int_eq(plx_backend_prepare(be, 0, 8), -EOPNOTSUPP);
    ck_assert_uint_eq(plx_backend_dio_align(be), PLX_BLOCK_SIZE);
    ck_assert_ptr_null(plx_backend_fence_ops(be));
    ck_assert_int_eq(stub_prepared, 1);
    be->ops->destroy(be);
}
END_TEST

/* Through the engine: a store on a sparse file, data placed by leaf (the default): taking a data
 * extent prepares it (all but its bitmap blocks), blocks written in random order read back, and
 * the store checks clean. With arrival order nothing is prepared. */
static void store_random_writes(int placement, struct plx_prepare_stats *out)
{
    enum { EXT = 4 * MiB, NB = 2048 };
    char path[4096], err[256] = "";
    int fd, e = 0;
    plx_backend *be = open_sparse(64 * MiB / BS, &fd, path, sizeof path);
    ck_assert_int_eq(plx_format_backend(be, EXT, err, sizeof err), 0);
    be->ops->destroy(be);
    be = plx_backend_file_open(path, 0, &e, err, sizeof err);
    ck_assert_ptr_nonnull(be);
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o, .placement = placement};
    ck_assert_int_eq(plx_store_open_backend(be, &o, &st, err, sizeof err), 0);
    uint64_t id = 0;
    ck_assert_int_eq(plx_vdi_create(st, "r", (uint64_t)NB * BS, &id), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "r", 0, &v), 0);
    static unsigned perm[NB];
    uint64_t rng = 5;
    for (unsigned i = 0; i < NB; i++)
        perm[i] = i;
    for (unsigned i = NB - 1; i > 0; i--) {
        unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    uint8_t *buf = plx_block_alloc(NB);
    tu_fill(buf, (size_t)NB * BS, 11);
    for (unsigned i = 0; i < NB; i++)
        ck_assert_int_eq(
            plx_vdi_pwrite(v, buf + (size_t)perm[i] * BS, (uint64_t)perm[i] * BS, BS, 0), 0);
    plx_backend_prepare_stats(st->be, out);
    uint8_t *back = plx_block_alloc(NB);
    ck_assert_int_eq(plx_vdi_pread(v, back, 0, (size_t)NB * BS), 0);
    ck_assert(memcmp(back, buf, (size_t)NB * BS) == 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    /* Reopened: the data is there and the store is consistent. */
    ck_assert_int_eq(plx_store_open(path, NULL, &st, err, sizeof err), 0);
    ck_assert_int_eq(plx_vdi_open(st, "r", 1, &v), 0);
    memset(back, 0, (size_t)NB * BS);
    ck_assert_int_eq(plx_vdi_pread(v, back, 0, (size_t)NB * BS), 0);
    ck_assert(memcmp(back, buf, (size_t)NB * BS) == 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    struct plx_check_report cr;
    ck_assert_int_eq(plx_check(st, &cr, NULL, NULL), 0);
    ck_assert_msg(cr.errors == 0, "check: %llu errors", (unsigned long long)cr.errors);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(back);
    plx_block_free(buf);
    close_sparse(NULL, fd, path);
}

START_TEST(test_store_prepares_data_extents)
{
    struct plx_prepare_stats leaf, arrival;
    store_random_writes(PLX_PLACEMENT_LEAF, &leaf);
    store_random_writes(PLX_PLACEMENT_ARRIVAL, &arrival);
    fprintf(stderr,
            "prepare: store, leaf placement: %llu chunks zeroed, %llu covered, %llu pending, "
            "%llu writes waited; arrival: %llu zeroed\n",
            (unsigned long long)leaf.chunks_zeroed, (unsigned long long)leaf.chunks_covered,
            (unsigned long long)leaf.chunks_pending, (unsigned long long)leaf.writes_waited,
            (unsigned long long)arrival.chunks_zeroed);
    ck_assert_uint_gt(leaf.chunks_zeroed + leaf.chunks_covered + leaf.chunks_pending, 0);
    ck_assert_int_eq(leaf.error, 0);
    ck_assert_uint_eq(arrival.chunks_zeroed + arrival.chunks_covered + arrival.chunks_pending, 0);
}
END_TEST

static Suite *prepare_suite(void)
{
    Suite *s = suite_create("prepare");
    TCase *tc = tcase_create("file");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prepare_fills_holes_keeps_data);
    tcase_add_test(tc, test_prepare_racing_writes);
    tcase_add_test(tc, test_prepare_writes_go_ahead);
    tcase_add_test(tc, test_prepare_busy_chunk_waits);
    tcase_add_test(tc, test_prepare_stands_aside_for_streams);
    tcase_add_test(tc, test_prepare_small_sequential_no_stream);
    tcase_add_test(tc, test_prepare_enospc);
    tcase_add_test(tc, test_prepare_eio);
    tcase_add_test(tc, test_prepare_close_while_zeroing);
    tcase_add_test(tc, test_prepare_stop);
    tcase_add_test(tc, test_prepare_not_elsewhere);
    tcase_add_test(tc, test_optional_ops_by_size);
    suite_add_tcase(s, tc);
    tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_store_prepares_data_extents);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(prepare_suite)
