/*
 * test_backend.c - the memory, file and fault-injection backends against the contract of
 * backend.h and backend_fault.h.
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
#include "testutil.h"
#include "tgtd.h"

#define BS PLX_BLOCK_SIZE

/* ---- Backends under test --------------------------------------------------------------------- */

enum kind {
    K_MEM,
    K_FAULT,
    K_FILE,        /* O_DIRECT temp file, aio fdsync / RWF_DSYNC ($PARALLAX_IOPRIO=0) */
    K_FILE_THREAD, /* the same with the fdatasync helper-thread fallback forced */
    K_FILE_SHM,    /* tmpfs: O_DIRECT may be refused there, exercising buffered I/O */
    K_FILE_BLOCK,  /* PLX_BACKEND_BLOCKING: pread/pwrite/fdatasync, no aio context */
    K_FILE_BUF,    /* PLX_BACKEND_BUFFERED (the write log): page cache, aio fdsync for FUA too */
    K_FILE_RT,     /* the default: urgent writes in the real-time I/O class, flushes (and FUA's)
                    * from the helper thread, which has that class too */
    K_ISCSI,       /* a LUN of a tgtd on loopback, 512-byte logical blocks, libiscsi async */
    K_ISCSI_BLOCK, /* the same with 4096-byte logical blocks, libiscsi's synchronous calls */
    K_COUNT,
};

static const char *kind_name[K_COUNT] = {
    "mem",           "fault",         "file",    "file-thread", "file-shm",
    "file-blocking", "file-buffered", "file-rt", "iscsi",       "iscsi-blocking"};

/* The contract runs on the iSCSI kinds only when main() could start tgtd. */
static int kind_count = K_COUNT;

static plx_backend *open_iscsi_lun(uint64_t nblocks, unsigned lba_size, unsigned flags)
{
    char url[512], errbuf[512] = "";
    int err = 0;
    ck_assert_msg(tu_tgtd_new_lun(nblocks * BS, lba_size, url, sizeof(url)) > 0,
                  "tgtadm: cannot add a LUN");
    plx_backend *be = plx_backend_iscsi_open(url, flags, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "open %s: %d %s", url, err, errbuf);
    return be;
}

static plx_backend *open_temp_file_flags(const char *dir, uint64_t nblocks, unsigned flags)
{
    char path[4096];
    char errbuf[256] = "";
    int err = 0;

    snprintf(path, sizeof(path), "%s/plx-test-backend-XXXXXX", dir);
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
    ck_assert_int_eq(ftruncate(fd, (off_t)(nblocks * BS)), 0);
    close(fd);
    plx_backend *be = plx_backend_file_open(path, flags, &err, errbuf, sizeof(errbuf));
    /* The backend keeps its descriptor: the name is not needed any more. */
    unlink(path);
    ck_assert_msg(be != NULL, "open %s: %d %s", path, err, errbuf);
    return be;
}

static plx_backend *open_temp_file(const char *dir, uint64_t nblocks)
{
    return open_temp_file_flags(dir, nblocks, 0);
}

static plx_backend *make_backend(int kind, uint64_t nblocks)
{
    plx_backend *be = NULL;
    struct stat st;

    switch (kind) {
    case K_MEM:
        be = plx_backend_mem_create(nblocks);
        break;
    case K_FAULT:
        be = plx_fault_create(NULL, nblocks);
        break;
    case K_FILE:
        setenv("PARALLAX_IOPRIO", "0", 1);
        be = open_temp_file(tu_tmpdir(), nblocks);
        unsetenv("PARALLAX_IOPRIO");
        break;
    case K_FILE_THREAD:
        be = open_temp_file_flags(tu_tmpdir(), nblocks, PLX_BACKEND_FLUSH_THREAD);
        break;
    case K_FILE_SHM:
        be = open_temp_file(stat("/dev/shm", &st) == 0 ? "/dev/shm" : tu_tmpdir(), nblocks);
        break;
    case K_FILE_BLOCK:
        be = open_temp_file_flags(tu_tmpdir(), nblocks, PLX_BACKEND_BLOCKING);
        break;
    case K_FILE_BUF:
        be = open_temp_file_flags(tu_tmpdir(), nblocks, PLX_BACKEND_BUFFERED);
        break;
    case K_FILE_RT:
        be = open_temp_file(tu_tmpdir(), nblocks);
        break;
    case K_ISCSI:
        be = open_iscsi_lun(nblocks, 512, 0);
        break;
    case K_ISCSI_BLOCK:
        be = open_iscsi_lun(nblocks, 4096, PLX_BACKEND_BLOCKING);
        break;
    }
    ck_assert_ptr_nonnull(be);
    ck_assert_uint_eq(be->nblocks, nblocks);
    return be;
}

/* An I/O with its completion record. */
struct rec {
    struct plx_io io;
    int calls;
    int status;
    int *counter;
};

static void rec_done(struct plx_io *io, int status)
{
    struct rec *r = io->owner;
    r->calls++;
    r->status = status;
    if (r->counter != NULL)
        (*r->counter)++;
}

static int rec_submit(plx_backend *be, struct rec *r, enum plx_io_op op, uint64_t block,
                      uint32_t nblocks, void *buf, unsigned flags)
{
    int *counter = r->counter;
    memset(r, 0, sizeof(*r));
    r->counter = counter;
    r->io = (struct plx_io){.op = op,
                            .flags = flags,
                            .block = block,
                            .nblocks = nblocks,
                            .buf = buf,
                            .done = rec_done,
                            .owner = r};
    return be->ops->submit(be, &r->io);
}

static void drain(plx_backend *be)
{
    while (be->ops->inflight(be) > 0)
        ck_assert_int_ge(be->ops->poll(be, -1), 0);
}

static void write_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed,
                          unsigned flags)
{
    void *buf = plx_block_alloc(n);
    tu_fill(buf, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, block, n, buf, flags), 0);
    plx_block_free(buf);
}

/* Nonzero when blocks [block, block + n) hold the pattern for seed. */
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

static int is_zero(plx_backend *be, uint64_t block)
{
    unsigned char *buf = plx_block_alloc(1);
    memset(buf, 0xa5, BS);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, block, 1, buf, 0), 0);
    int zero = 1;
    for (unsigned i = 0; i < BS; i++)
        zero &= buf[i] == 0;
    plx_block_free(buf);
    return zero;
}

/* ---- Contract tests, run on every backend ---------------------------------------------------- */

START_TEST(test_read_after_write)
{
    plx_backend *be = make_backend(_i, 64);

    write_pattern(be, 3, 1, 1, 0);
    ck_assert_msg(has_pattern(be, 3, 1, 1), "%s: block 3", kind_name[_i]);
    write_pattern(be, 10, 5, 2, 0);
    ck_assert(has_pattern(be, 10, 5, 2));
    ck_assert(has_pattern(be, 12, 1, 0) == 0);
    /* Overwrite part of the range and read the pieces back. */
    write_pattern(be, 11, 1, 3, 0);
    ck_assert(has_pattern(be, 11, 1, 3));
    ck_assert(has_pattern(be, 10, 1, 2));
    ck_assert(has_pattern(be, 63, 1, 0) == 0);
    write_pattern(be, 63, 1, 4, 0);
    ck_assert(has_pattern(be, 63, 1, 4));
    write_pattern(be, 0, 64, 5, 0);
    ck_assert(has_pattern(be, 0, 64, 5));
    ck_assert_uint_eq(be->ops->inflight(be), 0);
    be->ops->destroy(be);
}
END_TEST

/* PLX_IO_DIRECT (backend.h) mixed with plain I/O over the same blocks: every read, with the flag
 * or without, sees the newest write, whichever way it went (a buffered file backend: through its
 * O_DIRECT descriptor or the page cache). Every other backend ignores the flag. */
static int has_pattern_flags(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed,
                             unsigned flags)
{
    void *buf = plx_block_alloc(n), *want = plx_block_alloc(n);
    tu_fill(want, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, block, n, buf, flags), 0);
    int same = memcmp(buf, want, (size_t)n * BS) == 0;
    plx_block_free(buf);
    plx_block_free(want);
    return same;
}

START_TEST(test_direct_flag)
{
    plx_backend *be = make_backend(_i, 64);
    write_pattern(be, 0, 64, 1, 0); /* through the page cache, when there is one */
    ck_assert(has_pattern_flags(be, 0, 64, 1, PLX_IO_DIRECT));
    write_pattern(be, 8, 16, 2, PLX_IO_DIRECT);
    ck_assert_msg(has_pattern_flags(be, 8, 16, 2, 0), "%s: plain read after a direct write",
                  kind_name[_i]);
    ck_assert(has_pattern_flags(be, 0, 8, 1, 0));
    write_pattern(be, 10, 1, 3, 0);
    ck_assert_msg(has_pattern_flags(be, 10, 1, 3, PLX_IO_DIRECT),
                  "%s: direct read after a plain write", kind_name[_i]);
    ck_assert(has_pattern_flags(be, 11, 13, 0, 0) == 0);
    write_pattern(be, 11, 2, 4, PLX_IO_DIRECT | PLX_IO_FUA);
    ck_assert(has_pattern_flags(be, 11, 2, 4, 0));
    ck_assert(has_pattern_flags(be, 11, 2, 4, PLX_IO_DIRECT));
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert(has_pattern_flags(be, 10, 1, 3, 0));
    ck_assert_uint_eq(be->ops->inflight(be), 0);
    be->ops->destroy(be);
}
END_TEST

/* A PLX_IO_DIRECT write from a buffer aligned to plx_backend_dio_align and no more (the write
 * log's records from tapdisk's buffers, 512 bytes past a page) is taken and reads back. The
 * memory backend says 512, takes such a buffer only with the flag and refuses less; a file
 * backend with an O_DIRECT descriptor says what statx says (512 on ext4 over 512-byte sectors:
 * test_zc_from_a_sector_aligned_buffer relies on it). */
START_TEST(test_direct_flag_dio_align)
{
    plx_backend *be = make_backend(_i, 64);
    size_t a = plx_backend_dio_align(be);
    ck_assert_msg(a && (a & (a - 1)) == 0 && a <= BS, "%s: alignment %zu", kind_name[_i], a);
    if (_i == K_MEM)
        ck_assert_uint_eq(a, PLX_MEM_DIO_ALIGN);
    uint8_t *mem = plx_block_alloc(17);
    uint8_t *buf = mem + (a < BS ? a : 0);
    tu_fill(buf, 16 * BS, 77);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 8, 16, buf, PLX_IO_DIRECT), 0);
    ck_assert_msg(has_pattern_flags(be, 8, 16, 77, 0), "%s: direct write from buffer + %zu",
                  kind_name[_i], a);
    if (_i == K_MEM) {
        struct rec r;
        r.counter = NULL;
        ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 0, 1, mem + 512, 0), -EINVAL);
        ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 0, 1, mem + 256, PLX_IO_DIRECT), -EINVAL);
    }
    plx_block_free(mem);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_unwritten_zero)
{
    plx_backend *be = make_backend(_i, 16);
    ck_assert(is_zero(be, 0));
    ck_assert(is_zero(be, 7));
    ck_assert(is_zero(be, 15));
    write_pattern(be, 7, 1, 9, 0);
    ck_assert(is_zero(be, 6));
    ck_assert(is_zero(be, 8));
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_out_of_range)
{
    plx_backend *be = make_backend(_i, 8);
    unsigned char *buf = plx_block_alloc(3);
    int count = 0;
    struct rec r = {.counter = &count};

    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_READ, 8, 1, buf, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 8, 1, buf, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 6, 3, buf, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_READ, UINT64_MAX, 2, buf, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_READ, 0, 0, buf, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_READ, 0, 1, buf + 512, 0), -EINVAL);
    ck_assert_int_eq(rec_submit(be, &r, (enum plx_io_op)7, 0, 1, buf, 0), -EINVAL);
    ck_assert_uint_eq(be->ops->inflight(be), 0);
    ck_assert_int_eq(be->ops->poll(be, 0), 0);
    ck_assert_int_eq(count, 0);
    ck_assert_int_eq(r.calls, 0);
    /* The last block is in range. */
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 5, 3, buf, 0), 0);
    drain(be);
    ck_assert_int_eq(count, 1);
    ck_assert_int_eq(r.status, 0);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* PLX_IO_INLINE (backend.h, the write log's I/O from plx_submit_side): a buffered file backend
 * completes a plain write inside submit (pwrite: no eventfd signal, nothing for poll to reap);
 * FUA and PLX_IO_DIRECT writes, reads and every other backend keep the contract (done from
 * poll only). */
START_TEST(test_inline_flag)
{
    plx_backend *be = make_backend(_i, 64);
    unsigned char *buf = plx_block_alloc(4);
    struct rec r[4];
    int count = 0;
    int inline_ok = _i == K_FILE_BUF;

    tu_fill(buf, 4 * BS, 91);
    for (int i = 0; i < 4; i++)
        r[i].counter = &count;
    ck_assert_int_eq(rec_submit(be, &r[0], PLX_IO_WRITE, 3, 2, buf, PLX_IO_INLINE), 0);
    ck_assert_msg(count == inline_ok, "%s: %d completions inside submit", kind_name[_i], count);
    if (inline_ok) {
        ck_assert_int_eq(r[0].status, 0);
        ck_assert_uint_eq(be->ops->inflight(be), 0);
        /* Nothing signalled: an engine waiting on the fd would not wake for it. */
        struct pollfd pfd = {.fd = be->ops->fd(be), .events = POLLIN};
        ck_assert_int_eq(poll(&pfd, 1, 0), 0);
        ck_assert_int_eq(be->ops->poll(be, 0), 0);
    }
    drain(be);
    ck_assert_int_eq(count, 1);
    ck_assert_int_eq(r[0].calls, 1);
    ck_assert_int_eq(r[0].status, 0);
    ck_assert(has_pattern_flags(be, 3, 2, 91, 0));
    ck_assert(has_pattern_flags(be, 3, 2, 91, PLX_IO_DIRECT));

    /* Never inline: FUA (it waits for the disk), direct, and reads. */
    count = 0;
    ck_assert_int_eq(rec_submit(be, &r[1], PLX_IO_WRITE, 8, 1, buf, PLX_IO_INLINE | PLX_IO_FUA), 0);
    ck_assert_int_eq(
        rec_submit(be, &r[2], PLX_IO_WRITE, 9, 1, buf + BS, PLX_IO_INLINE | PLX_IO_DIRECT), 0);
    ck_assert_int_eq(rec_submit(be, &r[3], PLX_IO_READ, 3, 1, buf + 2 * BS, PLX_IO_INLINE), 0);
    ck_assert_int_eq(count, 0);
    drain(be);
    ck_assert_int_eq(count, 3);
    for (int i = 1; i < 4; i++)
        ck_assert_int_eq(r[i].status, 0);
    ck_assert(has_pattern_flags(be, 8, 2, 91, 0));
    ck_assert_uint_eq(be->ops->inflight(be), 0);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_no_callback_in_submit)
{
    enum { N = 16 };
    plx_backend *be = make_backend(_i, 64);
    unsigned char *buf = plx_block_alloc(N);
    struct rec r[N + 2];
    int count = 0;

    tu_fill(buf, (size_t)N * BS, 77);
    for (int i = 0; i < N; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, i * 2, 1, buf + i * BS, 0), 0);
        ck_assert_int_eq(count, 0);
    }
    r[N].counter = &count;
    ck_assert_int_eq(rec_submit(be, &r[N], PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_int_eq(count, 0);
    ck_assert_uint_eq(be->ops->inflight(be), N + 1);

    /* The fd must become readable on its own, without anybody calling poll(). */
    struct pollfd pfd = {.fd = be->ops->fd(be), .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
    ck_assert_int_eq(count, 0);

    drain(be);
    ck_assert_int_eq(count, N + 1);
    for (int i = 0; i <= N; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        ck_assert_int_eq(r[i].status, 0);
    }
    ck_assert_uint_eq(be->ops->inflight(be), 0);
    /* Nothing left to report: poll returns at once even with an infinite timeout. */
    ck_assert_int_eq(be->ops->poll(be, -1), 0);
    ck_assert_int_eq(be->ops->poll(be, 10), 0);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_flush_and_fua)
{
    plx_backend *be = make_backend(_i, 32);
    unsigned char *buf = plx_block_alloc(1);

    write_pattern(be, 1, 1, 11, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    write_pattern(be, 2, 2, 12, PLX_IO_FUA);
    ck_assert(has_pattern(be, 1, 1, 11));
    ck_assert(has_pattern(be, 2, 2, 12));
    /* A flush with nothing written is fine too. */
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* A callback that submits the next I/O of a chain, as the engine does. */
struct chain {
    plx_backend *be;
    struct plx_io io;
    void *buf;
    int left, in_callback, completed, status;
};

static void chain_done(struct plx_io *io, int status)
{
    struct chain *c = io->owner;
    ck_assert_int_eq(c->in_callback, 0);
    c->completed++;
    c->status |= status;
    if (--c->left > 0) {
        c->in_callback = 1;
        io->block = (io->block + 1) % c->be->nblocks;
        io->op = io->op == PLX_IO_WRITE   ? PLX_IO_FLUSH
                 : io->op == PLX_IO_FLUSH ? PLX_IO_READ
                                          : PLX_IO_WRITE;
        io->nblocks = io->op == PLX_IO_FLUSH ? 0 : 1;
        ck_assert_int_eq(c->be->ops->submit(c->be, io), 0);
        c->in_callback = 0;
    }
}

START_TEST(test_submit_from_callback)
{
    plx_backend *be = make_backend(_i, 8);
    struct chain c = {.be = be, .left = 30, .buf = plx_block_alloc(1)};
    c.io = (struct plx_io){.op = PLX_IO_WRITE,
                           .block = 0,
                           .nblocks = 1,
                           .buf = c.buf,
                           .done = chain_done,
                           .owner = &c};
    ck_assert_int_eq(be->ops->submit(be, &c.io), 0);
    drain(be);
    ck_assert_int_eq(c.completed, 30);
    ck_assert_int_eq(c.status, 0);
    plx_block_free(c.buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_many_concurrent)
{
    /* More than the file backend's 1024 aio slots, so its internal queue is used too. */
    const int n = tu_quick() ? 300 : 2048;
    plx_backend *be = make_backend(_i, (uint64_t)n + 8);
    unsigned char *buf = plx_block_alloc((size_t)n);
    struct rec *r = calloc((size_t)n + 1, sizeof(*r));
    int count = 0;

    for (int i = 0; i < n; i++)
        tu_fill(buf + (size_t)i * BS, BS, 1000 + (uint64_t)i);
    for (int i = 0; i < n; i++) {
        r[i].counter = &count;
        /* Every other one FUA, to mix the two write paths. */
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i + 4, 1,
                                    buf + (size_t)i * BS, i % 2 ? PLX_IO_FUA : 0),
                         0);
    }
    ck_assert_int_eq(count, 0);
    ck_assert_uint_eq(be->ops->inflight(be), (unsigned)n);
    drain(be);
    ck_assert_int_eq(count, n);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);

    memset(buf, 0, (size_t)n * BS);
    count = 0;
    for (int i = 0; i < n; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(
            rec_submit(be, &r[i], PLX_IO_READ, (uint64_t)i + 4, 1, buf + (size_t)i * BS, 0), 0);
    }
    drain(be);
    ck_assert_int_eq(count, n);
    unsigned char *want = plx_block_alloc(1);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        ck_assert_int_eq(r[i].status, 0);
        tu_fill(want, BS, 1000 + (uint64_t)i);
        ck_assert_msg(memcmp(buf + (size_t)i * BS, want, BS) == 0, "%s: block %d", kind_name[_i],
                      i + 4);
    }
    plx_block_free(want);
    free(r);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* Poll with a positive timeout waits for I/O in flight rather than returning 0 at once. */
START_TEST(test_poll_timeout)
{
    plx_backend *be = make_backend(_i, 8);
    unsigned char *buf = plx_block_alloc(1);
    struct rec r = {0};
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 1, 1, buf, PLX_IO_FUA), 0);
    int got = 0;
    for (int tries = 0; tries < 100 && got == 0; tries++)
        got = be->ops->poll(be, 1000);
    ck_assert_int_eq(got, 1);
    ck_assert_int_eq(r.calls, 1);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* Trim is optional: refused at submit with -EOPNOTSUPP (no callback), or done; either way the
 * blocks around it keep their data and the trimmed ones take writes again. */
START_TEST(test_trim)
{
    plx_backend *be = make_backend(_i, 16);
    struct rec r = {0};
    write_pattern(be, 0, 16, 31, 0);
    int rc = rec_submit(be, &r, PLX_IO_TRIM, 4, 8, NULL, 0);
    ck_assert_msg(rc == 0 || rc == -EOPNOTSUPP, "%s: trim submit %d", kind_name[_i], rc);
    if (rc == 0) {
        drain(be);
        ck_assert_int_eq(r.calls, 1);
        ck_assert_int_eq(r.status, 0);
    } else {
        ck_assert_int_eq(be->ops->poll(be, 0), 0);
        ck_assert_int_eq(r.calls, 0);
    }
    ck_assert(has_pattern(be, 0, 4, 31));
    void *want = plx_block_alloc(16);
    tu_fill(want, 16 * BS, 31);
    void *got = plx_block_alloc(4);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 12, 4, got, 0), 0);
    ck_assert(memcmp(got, (char *)want + 12 * BS, 4 * BS) == 0);
    write_pattern(be, 5, 2, 32, 0);
    ck_assert(has_pattern(be, 5, 2, 32));
    /* Out of range is -EINVAL whether or not the backend trims. */
    int e = rec_submit(be, &r, PLX_IO_TRIM, 15, 2, NULL, 0);
    ck_assert_msg(e == -EINVAL || e == -EOPNOTSUPP, "%s: trim past the end: %d", kind_name[_i], e);
    plx_block_free(want);
    plx_block_free(got);
    be->ops->destroy(be);
}
END_TEST

/* ---- Memory backend -------------------------------------------------------------------------- */

START_TEST(test_mem_peek_poke)
{
    plx_backend *be = plx_backend_mem_create(8);
    unsigned char *buf = plx_block_alloc(1);

    ck_assert_str_eq(be->desc, "memory");
    ck_assert_ptr_null(plx_backend_mem_peek(be, 2));
    write_pattern(be, 2, 1, 5, 0);
    tu_fill(buf, BS, 5);
    ck_assert_ptr_nonnull(plx_backend_mem_peek(be, 2));
    ck_assert_mem_eq(plx_backend_mem_peek(be, 2), buf, BS);

    /* Corrupt a block behind the backend's back. */
    buf[100] ^= 0xff;
    plx_backend_mem_poke(be, 2, buf);
    ck_assert_mem_eq(plx_backend_mem_peek(be, 2), buf, BS);
    ck_assert(!has_pattern(be, 2, 1, 5));
    plx_backend_mem_poke(be, 2, NULL);
    ck_assert_ptr_null(plx_backend_mem_peek(be, 2));
    ck_assert(is_zero(be, 2));
    /* Writing zeros leaves the block sparse. */
    memset(buf, 0, BS);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 3, 1, buf, 0), 0);
    ck_assert_ptr_null(plx_backend_mem_peek(be, 3));
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_mem_large_sparse)
{
    /* 1 TiB of blocks: nothing may be allocated per block up front. */
    plx_backend *be = plx_backend_mem_create(1ull << 28);
    write_pattern(be, (1ull << 28) - 1, 1, 3, 0);
    ck_assert(has_pattern(be, (1ull << 28) - 1, 1, 3));
    ck_assert(is_zero(be, 1ull << 27));
    be->ops->destroy(be);
}
END_TEST

/* ---- File backend ---------------------------------------------------------------------------- */

START_TEST(test_file_open_errors)
{
    char errbuf[256] = "";
    int err = 0;
    plx_backend *be =
        plx_backend_file_open("/nonexistent-dir/store.img", 0, &err, errbuf, sizeof(errbuf));
    ck_assert_ptr_null(be);
    ck_assert_int_eq(err, -ENOENT);
    ck_assert_str_eq(errbuf, "open /nonexistent-dir/store.img: No such file or directory");

    err = 0;
    be = plx_backend_file_open(tu_tmpdir(), 0, &err, errbuf, sizeof(errbuf));
    ck_assert_ptr_null(be);
    ck_assert_int_lt(err, 0);
    ck_assert_msg(strncmp(errbuf, "open ", 5) == 0, "message: %s", errbuf);

    /* Neither err nor errbuf is required. */
    ck_assert_ptr_null(plx_backend_file_open("/nonexistent-dir/x", 0, NULL, NULL, 0));
}
END_TEST

static char *make_temp(uint64_t size)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s/plx-test-backend-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
    return path;
}

/* Loop tests over the file backend's two modes: _i = 0 kernel aio, 1 blocking. */
static unsigned mode_flags(int i)
{
    return i ? PLX_BACKEND_BLOCKING : 0;
}

START_TEST(test_file_size_and_rdonly)
{
    char *path = make_temp(10 * BS + 100);
    char errbuf[256] = "";
    int err = 0;

    plx_backend *be = plx_backend_file_open(path, mode_flags(_i), &err, errbuf, sizeof(errbuf));
    ck_assert_ptr_nonnull(be);
    ck_assert_uint_eq(be->nblocks, 10);
    ck_assert_msg(strstr(be->desc, path) == be->desc, "desc %s", be->desc);
    write_pattern(be, 9, 1, 42, PLX_IO_FUA);
    be->ops->destroy(be);

    be = plx_backend_file_open(path, PLX_BACKEND_RDONLY | mode_flags(_i), &err, errbuf,
                               sizeof(errbuf));
    ck_assert_ptr_nonnull(be);
    ck_assert(has_pattern(be, 9, 1, 42));
    unsigned char *buf = plx_block_alloc(1);
    struct rec r = {0};
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 1, 1, buf, 0), -EBADF);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_int_eq(r.calls, 0);
    plx_block_free(buf);
    be->ops->destroy(be);
    unlink(path);
}
END_TEST

START_TEST(test_file_short_read_is_eio)
{
    char *path = make_temp(8 * BS);
    int err = 0;
    plx_backend *be = plx_backend_file_open(path, mode_flags(_i), &err, NULL, 0);
    ck_assert_ptr_nonnull(be);
    write_pattern(be, 0, 8, 7, 0);

    /* Shrink the file under the backend: reads past the new end can only come up short. */
    ck_assert_int_eq(truncate(path, 2 * BS + 100), 0);
    unsigned char *buf = plx_block_alloc(2);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 5, 1, buf, 0), -EIO);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 2, 2, buf, 0), -EIO);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 0, 2, buf, 0), 0);
    plx_block_free(buf);
    ck_assert(has_pattern(be, 1, 1, 7) == 0); /* block 1 of the 8-block pattern */
    be->ops->destroy(be);
    unlink(path);
}
END_TEST

/*
 * The file backend's calls to io_submit land here (the executable's definition wins over
 * libaio's), so that tests can make the kernel refuse what it never refuses on this machine.
 */
static struct {
    int eagain_every;  /* every n-th call fails with EAGAIN */
    int eagain_next;   /* the next n calls fail with EAGAIN */
    int refuse_fdsync; /* IO_CMD_FDSYNC: EINVAL, as before Linux 4.18 */
    int refuse_rwf;    /* per-I/O RWF_ flags: EINVAL, as before Linux 4.13 */
    int refuse_prio;   /* a per-I/O priority: EPERM, as without CAP_SYS_NICE for the RT class */
    unsigned calls, eagains, refused;
    unsigned fdsyncs, prio_rt, prio_other; /* submitted: FDSYNCs, I/Os with a priority */
    unsigned rwf_dsync;                    /* submitted: writes with RWF_DSYNC */
} aio_fault;

#define TEST_IOCB_FLAG_IOPRIO (1 << 1) /* <linux/aio_abi.h>, which clashes with libaio.h */

int io_submit(io_context_t ctx, long nr, struct iocb *ios[])
{
    aio_fault.calls++;
    if (aio_fault.eagain_next > 0 ||
        (aio_fault.eagain_every > 0 && aio_fault.calls % (unsigned)aio_fault.eagain_every == 0)) {
        if (aio_fault.eagain_next > 0)
            aio_fault.eagain_next--;
        aio_fault.eagains++;
        return -EAGAIN;
    }
    for (long i = 0; i < nr; i++) {
        if ((aio_fault.refuse_fdsync && ios[i]->aio_lio_opcode == IO_CMD_FDSYNC) ||
            (aio_fault.refuse_rwf && ios[i]->aio_rw_flags != 0)) {
            aio_fault.refused++;
            return -EINVAL;
        }
        if (aio_fault.refuse_prio && (ios[i]->u.c.flags & TEST_IOCB_FLAG_IOPRIO)) {
            aio_fault.refused++;
            return -EPERM;
        }
    }
    long rc = syscall(SYS_io_submit, ctx, nr, ios);
    for (long i = 0; i < rc; i++) {
        aio_fault.fdsyncs += ios[i]->aio_lio_opcode == IO_CMD_FDSYNC;
        aio_fault.rwf_dsync += (ios[i]->aio_rw_flags & RWF_DSYNC) != 0;
        if (ios[i]->u.c.flags & TEST_IOCB_FLAG_IOPRIO) {
            if ((ios[i]->aio_reqprio >> 13) == 1) /* IOPRIO_CLASS_RT */
                aio_fault.prio_rt++;
            else
                aio_fault.prio_other++;
        }
    }
    return rc < 0 ? -errno : (int)rc;
}

/* Waits the way the engine does: on the fd, then a non-blocking poll. */
static void drain_via_fd(plx_backend *be)
{
    while (be->ops->inflight(be) > 0) {
        struct pollfd pfd = {.fd = be->ops->fd(be), .events = POLLIN};
        ck_assert_msg(poll(&pfd, 1, 10000) == 1, "fd never became readable");
        ck_assert_int_ge(be->ops->poll(be, 0), 0);
    }
}

START_TEST(test_file_eagain)
{
    const int n = 300;
    plx_backend *be = make_backend(K_FILE, (uint64_t)n);
    unsigned char *buf = plx_block_alloc((size_t)n);
    struct rec *r = calloc((size_t)n, sizeof(*r));
    int count = 0;

    /* Refused while the context is idle: only the backend itself can wake the waiter. */
    aio_fault.eagain_next = 5;
    for (int i = 0; i < n; i++)
        tu_fill(buf + (size_t)i * BS, BS, 50 + (uint64_t)i);
    r[0].counter = &count;
    ck_assert_int_eq(rec_submit(be, &r[0], PLX_IO_WRITE, 0, 1, buf, PLX_IO_FUA), 0);
    drain_via_fd(be);
    ck_assert_int_eq(r[0].status, 0);

    aio_fault.eagain_every = 3;
    count = 0;
    for (int i = 1; i < n; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i, 1, buf + (size_t)i * BS,
                                    i % 3 ? 0 : PLX_IO_FUA),
                         0);
    }
    ck_assert_int_eq(count, 0);
    drain_via_fd(be);
    ck_assert_int_eq(count, n - 1);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    memset(buf, 0, (size_t)n * BS);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 0, (uint32_t)n, buf, 0), 0);
    aio_fault.eagain_every = 0;
    ck_assert_uint_gt(aio_fault.eagains, 50);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)i, 1, 50 + (uint64_t)i));
    }
    free(r);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_file_old_kernel_fallbacks)
{
    plx_backend *be = make_backend(K_FILE, 64);
    aio_fault.refuse_fdsync = 1;
    aio_fault.refuse_rwf = 1;
    write_pattern(be, 1, 1, 61, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    write_pattern(be, 2, 3, 62, PLX_IO_FUA);
    /* (The first FUA write's shared FDSYNC is refused; the second then tries RWF_DSYNC.) */
    write_pattern(be, 5, 1, 63, PLX_IO_FUA);
    unsigned refused = aio_fault.refused;
    ck_assert_uint_ge(refused, 2);
    /* The backend remembers: no more refused submissions. */
    for (int i = 0; i < 40; i++)
        write_pattern(be, 10 + (uint64_t)i, 1, 70 + (uint64_t)i, i % 2 ? PLX_IO_FUA : 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_uint_eq(aio_fault.refused, refused);
    ck_assert(has_pattern(be, 1, 1, 61));
    ck_assert(has_pattern(be, 2, 3, 62));
    ck_assert(has_pattern(be, 5, 1, 63));
    for (int i = 0; i < 40; i++)
        ck_assert(has_pattern(be, 10 + (uint64_t)i, 1, 70 + (uint64_t)i));
    be->ops->destroy(be);
}
END_TEST

/* The writes a commit waits for (PLX_IO_URGENT) go to the kernel in the real-time I/O class, so
 * that the I/O scheduler does not queue them behind data writes; no other I/O does; and flushes
 * and the flush of an urgent FUA write go through the helper thread (its fdatasync writes ext4's
 * metadata in that class too), not as an aio FDSYNC run by a kernel worker. A FUA write that is
 * not urgent (a FUA data write) is a plain write whose flush it shares with the others whose data
 * completed in the same poll (test_file_fua_group); none carries RWF_DSYNC. */
START_TEST(test_file_urgent_ioprio)
{
    plx_backend *be = make_backend(K_FILE_RT, 64);
    memset(&aio_fault, 0, sizeof aio_fault);
    write_pattern(be, 1, 1, 81, PLX_IO_URGENT);
    ck_assert_uint_eq(aio_fault.prio_rt, 1);
    write_pattern(be, 2, 4, 82, 0);
    write_pattern(be, 8, 1, 83, PLX_IO_FUA);
    ck_assert_uint_eq(aio_fault.prio_rt, 1);
    ck_assert_uint_eq(aio_fault.rwf_dsync, 0);
    /* Three at once: plain writes, their flushes the helper thread's (test_file_fua_group). */
    unsigned char *buf = plx_block_alloc(3);
    struct rec r[3];
    int count = 0;
    for (int i = 0; i < 3; i++) {
        tu_fill(buf + (size_t)i * BS, BS, 85 + (uint64_t)i);
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, 20 + (uint64_t)i, 1,
                                    buf + (size_t)i * BS, PLX_IO_FUA),
                         0);
    }
    drain_via_fd(be);
    ck_assert_int_eq(count, 3);
    ck_assert_uint_eq(aio_fault.rwf_dsync, 0);
    unsigned fdsyncs = aio_fault.fdsyncs; /* (the FUA data writes' shared flushes, if any) */
    write_pattern(be, 9, 1, 84, PLX_IO_URGENT | PLX_IO_FUA);
    ck_assert_uint_eq(aio_fault.prio_rt, 2);
    ck_assert_uint_eq(aio_fault.rwf_dsync, 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, 20 + (uint64_t)i, 1, 85 + (uint64_t)i));
    }
    plx_block_free(buf);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert(has_pattern(be, 1, 1, 81));
    ck_assert(has_pattern(be, 2, 4, 82));
    ck_assert(has_pattern(be, 8, 1, 83));
    ck_assert(has_pattern(be, 9, 1, 84));
    ck_assert_uint_eq(aio_fault.prio_rt, 2);
    ck_assert_uint_eq(aio_fault.prio_other, 0);
    ck_assert_uint_eq(aio_fault.fdsyncs, fdsyncs);
    be->ops->destroy(be);
}
END_TEST

/* Without CAP_SYS_NICE the kernel refuses the real-time class (EPERM at io_submit): the write
 * goes as any other, and the backend asks no more. */
START_TEST(test_file_urgent_ioprio_refused)
{
    plx_backend *be = make_backend(K_FILE_RT, 64);
    memset(&aio_fault, 0, sizeof aio_fault);
    aio_fault.refuse_prio = 1;
    write_pattern(be, 1, 1, 91, PLX_IO_URGENT);
    ck_assert_uint_eq(aio_fault.refused, 1);
    for (int i = 0; i < 10; i++)
        write_pattern(be, 2 + (uint64_t)i, 1, 92 + (uint64_t)i,
                      PLX_IO_URGENT | (i % 2 ? PLX_IO_FUA : 0));
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_uint_eq(aio_fault.refused, 1);
    ck_assert_uint_eq(aio_fault.prio_rt + aio_fault.prio_other, 0);
    ck_assert(has_pattern(be, 1, 1, 91));
    for (int i = 0; i < 10; i++)
        ck_assert(has_pattern(be, 2 + (uint64_t)i, 1, 92 + (uint64_t)i));
    aio_fault.refuse_prio = 0;
    be->ops->destroy(be);
}
END_TEST

/* ---- File backend, blocking mode ------------------------------------------------------------- */

/* Kernel aio rings this process has mapped: one per live io_setup context. */
static int aio_rings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, "[aio]") != NULL;
    fclose(f);
    return n;
}

START_TEST(test_file_blocking_no_aio_context)
{
    int before = aio_rings();
    plx_backend *be = make_backend(K_FILE_BLOCK, 16);
    write_pattern(be, 3, 2, 81, PLX_IO_FUA);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert(has_pattern(be, 3, 2, 81));
    ck_assert_int_eq(aio_rings(), before);
    be->ops->destroy(be);

    /* The check above can fail: the default mode does map a ring. */
    be = make_backend(K_FILE, 16);
    ck_assert_int_eq(aio_rings(), before + 1);
    be->ops->destroy(be);
    ck_assert_int_eq(aio_rings(), before);
}
END_TEST

/*
 * The blocking mode's pwritev2 and fdatasync land here (the executable's definitions win over
 * libc's), so that tests can count flushes and refuse RWF_DSYNC as kernels before 4.13 do.
 */
static struct {
    int refuse_rwf;
    unsigned dsync_writes, refused, fdatasyncs;
} sync_fault;

ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags)
{
    if (flags & RWF_DSYNC) {
        if (sync_fault.refuse_rwf) {
            sync_fault.refused++;
            errno = EOPNOTSUPP;
            return -1;
        }
        sync_fault.dsync_writes++;
    }
    return syscall(SYS_pwritev2, fd, iov, iovcnt, (long)off, 0L, flags);
}

int fdatasync(int fd)
{
    sync_fault.fdatasyncs++;
    return (int)syscall(SYS_fdatasync, fd);
}

/* The completions the kernel has signalled on the backend's eventfd and nobody read yet (its
 * count, from /proc without reading it). */
static unsigned long efd_count(int efd)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", efd);
    FILE *fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fp);
    unsigned long n = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "eventfd-count: %lx", &n) == 1)
            break;
    fclose(fp);
    return n;
}

/* FUA data writes (PLX_IO_FUA without PLX_IO_URGENT: the pipeline's FUA overwrites in place) whose
 * data completes in one poll share one flush, asked for by that poll after their writes completed
 * (one fdatasync of the helper thread), and none of them is delivered before it was asked for.
 * Before, each but one alone carried RWF_DSYNC: a kernel worker blocking in its own flush per
 * write (bench/notes/fua-tapdisk.md). */
START_TEST(test_file_fua_group)
{
    enum { N = 16 };
    plx_backend *be = make_backend(K_FILE_RT, 64);
    memset(&aio_fault, 0, sizeof aio_fault);
    memset(&sync_fault, 0, sizeof sync_fault);
    unsigned char *buf = plx_block_alloc(N);
    struct rec r[N];
    int count = 0;
    for (int i = 0; i < N; i++) {
        tu_fill(buf + (size_t)i * BS, BS, 90 + (uint64_t)i);
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i, 1, buf + (size_t)i * BS,
                                    PLX_IO_FUA),
                         0);
    }
    /* Every data write done in the kernel before the backend looks: one poll reaps them all. */
    for (int t = 0; t < 10000 && efd_count(be->ops->fd(be)) < N; t++)
        usleep(1000);
    ck_assert_uint_eq(efd_count(be->ops->fd(be)), N);
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
    /* Written, and delivered only once their flush is over (the helper thread may have finished
     * it before this poll looked), all at once. */
    ck_assert(count == 0 || count == N);
    ck_assert(count == 0 || sync_fault.fdatasyncs + aio_fault.fdsyncs == 1);
    drain_via_fd(be);
    ck_assert_int_eq(count, N);
    ck_assert_uint_eq(sync_fault.fdatasyncs + aio_fault.fdsyncs, 1);
    ck_assert_uint_eq(aio_fault.rwf_dsync, 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)i, 1, 90 + (uint64_t)i));
    }
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

START_TEST(test_file_blocking_fua_and_flush)
{
    plx_backend *be = make_backend(K_FILE_BLOCK, 64);
    memset(&sync_fault, 0, sizeof(sync_fault));

    /* FUA is one RWF_DSYNC write, a flush one fdatasync, a plain write neither. */
    write_pattern(be, 1, 1, 91, 0);
    ck_assert_uint_eq(sync_fault.dsync_writes + sync_fault.fdatasyncs, 0);
    write_pattern(be, 2, 2, 92, PLX_IO_FUA);
    ck_assert_uint_eq(sync_fault.dsync_writes, 1);
    ck_assert_uint_eq(sync_fault.fdatasyncs, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    ck_assert_uint_eq(sync_fault.fdatasyncs, 1);

    /* Without RWF_DSYNC, every FUA write is followed by its own fdatasync, and the backend
     * stops asking after the first refusal. */
    sync_fault.refuse_rwf = 1;
    for (int i = 0; i < 5; i++)
        write_pattern(be, 10 + (uint64_t)i, 1, 100 + (uint64_t)i, PLX_IO_FUA);
    ck_assert_uint_eq(sync_fault.refused, 1);
    ck_assert_uint_eq(sync_fault.fdatasyncs, 1 + 5);
    sync_fault.refuse_rwf = 0;
    ck_assert(has_pattern(be, 1, 1, 91));
    ck_assert(has_pattern(be, 2, 2, 92));
    for (int i = 0; i < 5; i++)
        ck_assert(has_pattern(be, 10 + (uint64_t)i, 1, 100 + (uint64_t)i));
    be->ops->destroy(be);
}
END_TEST

/* A store opened with blocking_io (and a store formatted) leaves no aio context behind; one
 * opened without it, or by a caller whose struct predates the field, uses aio. */
START_TEST(test_store_blocking_io)
{
    char path[4096], err[512] = "";
    snprintf(path, sizeof(path), "%s/plx-test-blocking-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_msg(plx_format(path, 8ull << 20, 1ull << 20, 1, err, sizeof(err)) == 0, "%s", err);
    int before = aio_rings();

    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof(o), .blocking_io = 1};
    ck_assert_msg(plx_store_open(path, &o, &st, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(aio_rings(), before);
    ck_assert_int_eq(plx_vdi_create(st, "b", 1 << 20, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &v), 0);
    unsigned char *buf = plx_block_alloc(4);
    tu_fill(buf, 4 * BS, 7);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, 8 * BS, 4 * BS, PLX_WRITE_FUA), 0);
    uint64_t snap = 0;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, NULL, &snap), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(aio_rings(), before);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Same bytes through the aio path. */
    o.blocking_io = 0;
    ck_assert_int_eq(plx_store_open(path, &o, &st, err, sizeof(err)), 0);
    ck_assert_int_eq(aio_rings(), before + 1);
    char spec[64];
    snprintf(spec, sizeof(spec), "b@%llu", (unsigned long long)snap);
    ck_assert_int_eq(plx_vdi_open(st, spec, PLX_OPEN_READONLY, &v), 0);
    unsigned char *got = plx_block_alloc(4);
    ck_assert_int_eq(plx_vdi_pread(v, got, 8 * BS, 4 * BS), 0);
    ck_assert_mem_eq(got, buf, 4 * BS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* An older caller's struct ends before blocking_io: whatever follows it is not read. */
    struct {
        struct plx_open_opts o;
    } old = {{.struct_size = offsetof(struct plx_open_opts, blocking_io), .blocking_io = 1}};
    ck_assert_int_eq(plx_store_open(path, &old.o, &st, err, sizeof(err)), 0);
    ck_assert_int_eq(aio_rings(), before + 1);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(got);
    plx_block_free(buf);
    unlink(path);
}
END_TEST

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

/* ---- iSCSI backend -----------------------------------------------------------------------------
 */

/* Open url; expect failure with err == want_err and a message containing `says`. */
static void expect_iscsi_open_error(const char *url, int want_err, const char *says)
{
    char errbuf[1024] = "";
    int err = 0;
    plx_backend *be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be == NULL, "%s opened", url);
    ck_assert_msg(err == want_err, "%s: err %d, want %d (%s)", url, err, want_err, errbuf);
    ck_assert_msg(strstr(errbuf, says) != NULL, "%s: message [%s] lacks [%s]", url, errbuf, says);
    /* The password never appears in a message. */
    ck_assert_msg(strstr(errbuf, "s3cret") == NULL, "password in [%s]", errbuf);
}

START_TEST(test_iscsi_open_errors)
{
    char url[512];
    int port = tu_tgtd_port();
    const char *iqn = tu_tgtd_iqn();

    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s", port, iqn);
    expect_iscsi_open_error(url, -EINVAL, "no LUN number after the target IQN");
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s/", port, iqn);
    expect_iscsi_open_error(url, -EINVAL, "no LUN number");
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s/one", port, iqn);
    expect_iscsi_open_error(url, -EINVAL, "LUN 'one' is not a number");
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d", port);
    expect_iscsi_open_error(url, -EINVAL, "no target");
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/", port);
    expect_iscsi_open_error(url, -EINVAL, "no target IQN");
    /* An IQN without such a LUN: LUN 0 is tgt's controller; tu_tgtd_new_lun never makes 255 (LUN
     * 300 was once found present under tgt, so a number past 255 is no safe "missing" LUN). */
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s/255", port, iqn);
    expect_iscsi_open_error(url, -ENOENT, "has no LUN 255");
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/iqn.2026-11.org.parallax.test:nosuch/1", port);
    expect_iscsi_open_error(url, -ENOENT, "no such target IQN");
    /* A portal nobody listens on. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(s, (struct sockaddr *)&a, &alen), 0);
    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s/1", ntohs(a.sin_port), iqn);
    expect_iscsi_open_error(url, -ECONNREFUSED, "is the portal reachable");
    close(s);
}
END_TEST

/* A target of its own (tid 2) that wants CHAP user plx, password s3cret. */
START_TEST(test_iscsi_chap)
{
    char url[512], errbuf[1024] = "";
    int err = 0;
    const char *iqn = "iqn.2026-11.org.parallax.test:chap";
    ck_assert_int_eq(tu_tgtd_adm("--op new --mode target --tid 2 -T %s", iqn), 0);
    ck_assert_int_eq(tu_tgtd_adm("--op bind --mode target --tid 2 -I ALL"), 0);
    const char *file = make_temp(64 * BS);
    ck_assert_int_eq(tu_tgtd_adm("--op new --mode logicalunit --tid 2 --lun 1 -b %s", file), 0);
    unlink(file);
    ck_assert_int_eq(tu_tgtd_adm("--op new --mode account --user plx --password s3cret"), 0);
    ck_assert_int_eq(tu_tgtd_adm("--op bind --mode account --tid 2 --user plx"), 0);

    snprintf(url, sizeof(url), "iscsi://127.0.0.1:%d/%s/1", tu_tgtd_port(), iqn);
    expect_iscsi_open_error(url, -EACCES, "the target wants CHAP");
    snprintf(url, sizeof(url), "iscsi://plx%%wrong@127.0.0.1:%d/%s/1", tu_tgtd_port(), iqn);
    expect_iscsi_open_error(url, -EACCES, "wrong CHAP user or password");
    snprintf(url, sizeof(url), "iscsi://plx%%s3cret@127.0.0.1:%d/%s/1", tu_tgtd_port(), iqn);
    plx_backend *be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "with the right password: %s", errbuf);
    ck_assert_msg(strstr(be->desc, "s3cret") == NULL, "password in desc %s", be->desc);
    be->ops->destroy(be);
    tu_tgtd_adm("--op delete --mode target --tid 2 --force");
    tu_tgtd_adm("--op delete --mode account --user plx");
}
END_TEST

/* A thin-provisioned LUN says it may UNMAP (LBPME, LBPU, Block Limits): trim unmaps, and tgt's
 * thin LUN (LBPRZ) then reads zeros; a LUN that is not thin refuses trim (-EOPNOTSUPP). */
START_TEST(test_iscsi_unmap)
{
    char url[512], errbuf[1024] = "";
    int err = 0;
    unsigned flags = _i ? PLX_BACKEND_BLOCKING : 0;
    int lun = tu_tgtd_new_lun(64 * BS, 512, url, sizeof(url));
    ck_assert_int_gt(lun, 0);
    ck_assert_int_eq(
        tu_tgtd_adm("--op update --mode logicalunit --tid 1 --lun %d --params thin_provisioning=1",
                    lun),
        0);
    /* 40 blocks of 8 LBAs in UNMAPs of 24 LBAs: 14 commands, the last one short. */
    setenv("PLX_TEST_ISCSI_MAX_UNMAP", "24", 1);
    plx_backend *be = plx_backend_iscsi_open(url, flags, &err, errbuf, sizeof(errbuf));
    unsetenv("PLX_TEST_ISCSI_MAX_UNMAP");
    ck_assert_msg(be != NULL, "%s", errbuf);
    write_pattern(be, 0, 64, 41, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_TRIM, 8, 40, NULL, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    for (uint64_t b = 8; b < 48; b++)
        ck_assert_msg(is_zero(be, b), "block %llu not unmapped", (unsigned long long)b);
    ck_assert(has_pattern(be, 0, 8, 41));
    void *want = plx_block_alloc(64), *got = plx_block_alloc(16);
    tu_fill(want, 64 * BS, 41);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 48, 16, got, 0), 0);
    ck_assert(memcmp(got, (char *)want + 48 * BS, 16 * BS) == 0);
    plx_block_free(want);
    plx_block_free(got);
    be->ops->destroy(be);

    be = make_backend(_i ? K_ISCSI_BLOCK : K_ISCSI, 16);
    struct rec r = {0};
    ck_assert_int_eq(rec_submit(be, &r, PLX_IO_TRIM, 0, 4, NULL, 0), -EOPNOTSUPP);
    be->ops->destroy(be);
}
END_TEST

/* Close every iSCSI connection of target 1 from the target's side. */
static int drop_connections(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "for s in $(tgtadm -C %d --lld iscsi --op show --mode conn --tid 1 | "
             "awk '/Session:/ {print $2}'); do tgtadm -C %d --lld iscsi --op delete --mode conn "
             "--tid 1 --sid $s --cid 0 && echo x; done | wc -l",
             tu_tgtd_ctl(), tu_tgtd_ctl());
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p != NULL) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* The connection drops while writes are in flight: libiscsi logs in again and re-issues them;
 * every write completes once, successfully, and reads back. */
START_TEST(test_iscsi_reconnect)
{
    enum { N = 256, ROUNDS = 3 };
    plx_backend *be = make_backend(K_ISCSI, N);
    unsigned char *buf = plx_block_alloc(N);
    struct rec *r = calloc(N, sizeof(*r));
    int count = 0;

    for (int round = 0; round < ROUNDS; round++) {
        count = 0;
        for (int i = 0; i < N; i++) {
            tu_fill(buf + (size_t)i * BS, BS, 5000 + (uint64_t)round * N + (uint64_t)i);
            r[i].counter = &count;
            ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i, 1,
                                        buf + (size_t)i * BS, i % 3 ? 0 : PLX_IO_FUA),
                             0);
        }
        /* Let some go out and complete, then cut the connection under the rest. */
        ck_assert_int_ge(be->ops->poll(be, 0), 0);
        ck_assert_int_ge(drop_connections(), 1);
        drain(be);
        ck_assert_int_eq(count, N);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(r[i].calls, 1);
            ck_assert_msg(r[i].status == 0, "round %d write %d: %d", round, i, r[i].status);
        }
        ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
        for (int i = 0; i < N; i++)
            ck_assert_msg(has_pattern(be, (uint64_t)i, 1, 5000 + (uint64_t)round * N + (uint64_t)i),
                          "round %d block %d", round, i);
    }
    free(r);
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* The connection drops while the backend is idle: the next I/O (asynchronous: woken through the
 * backend's fd, as the engine waits; blocking: libiscsi's synchronous calls) logs in again with a
 * fresh session and succeeds, and what was written before is there. */
START_TEST(test_iscsi_reconnect_idle)
{
    plx_backend *be = make_backend(_i ? K_ISCSI_BLOCK : K_ISCSI, 16);
    write_pattern(be, 0, 4, 11, 0);
    for (int round = 0; round < 2; round++) {
        ck_assert_int_ge(drop_connections(), 1);
        usleep(100000);
        void *buf = plx_block_alloc(4);
        tu_fill(buf, 4 * BS, 12 + (uint64_t)round);
        struct rec r = {0};
        ck_assert_int_eq(rec_submit(be, &r, PLX_IO_WRITE, 4, 4, buf, PLX_IO_FUA), 0);
        drain_via_fd(be);
        ck_assert_int_eq(r.calls, 1);
        ck_assert_int_eq(r.status, 0);
        plx_block_free(buf);
        ck_assert(has_pattern(be, 0, 4, 11));
        ck_assert(has_pattern(be, 4, 4, 12 + (uint64_t)round));
    }
    be->ops->destroy(be);
}
END_TEST

/* libiscsi writes to its socket without MSG_NOSIGNAL: a target that hangs up while PDUs are
 * queued raised SIGPIPE, whose default action killed the process (test_iscsi_gives_up died so
 * under ASan in CI, 2026-11-26). Opening an iSCSI store ignores SIGPIPE when the process left it
 * at the default, and leaves a handler of the process's own alone. */
static void own_sigpipe_handler(int sig)
{
    (void)sig;
}

START_TEST(test_iscsi_open_ignores_sigpipe)
{
    char url[512], errbuf[1024] = "";
    int err = 0;
    ck_assert_int_gt(tu_tgtd_new_lun(16 * BS, 512, url, sizeof(url)), 0);
    struct sigaction sa;
    signal(SIGPIPE, SIG_DFL);
    plx_backend *be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "%s", errbuf);
    ck_assert_int_eq(sigaction(SIGPIPE, NULL, &sa), 0);
    ck_assert_msg(sa.sa_handler == SIG_IGN, "SIGPIPE still kills the process");
    be->ops->destroy(be);

    signal(SIGPIPE, own_sigpipe_handler);
    be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "%s", errbuf);
    ck_assert_int_eq(sigaction(SIGPIPE, NULL, &sa), 0);
    ck_assert_msg(sa.sa_handler == own_sigpipe_handler, "the process's own handler was replaced");
    be->ops->destroy(be);
    signal(SIGPIPE, SIG_DFL);
}
END_TEST

/* When logging in again keeps failing, I/O fails with -EIO (never reported done), and so does
 * later I/O; nothing hangs. */
START_TEST(test_iscsi_gives_up)
{
    enum { N = 32 };
    char url[512], errbuf[1024] = "";
    int err = 0;
    setenv("PARALLAX_ISCSI_RETRIES", "1", 1);
    ck_assert_int_gt(tu_tgtd_new_lun(N * BS, 512, url, sizeof(url)), 0);
    plx_backend *be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "%s", errbuf);
    unsigned char *buf = plx_block_alloc(N);
    tu_fill(buf, (size_t)N * BS, 77);
    struct rec r[N];
    int count = 0;

    /* The target stops accepting this initiator, then drops its connection under FUA writes. */
    ck_assert_int_eq(tu_tgtd_adm("--op unbind --mode target --tid 1 -I ALL"), 0);
    for (int i = 0; i < N; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(
            rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i, 1, buf + (size_t)i * BS, PLX_IO_FUA),
            0);
    }
    ck_assert_int_ge(drop_connections(), 1);
    drain(be);
    ck_assert_int_eq(tu_tgtd_adm("--op bind --mode target --tid 1 -I ALL"), 0);
    ck_assert_int_eq(count, N);
    int failed = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        failed += r[i].status == -EIO;
        ck_assert(r[i].status == 0 || r[i].status == -EIO);
    }
    ck_assert_int_gt(failed, 0);
    struct rec late = {0};
    ck_assert_int_eq(rec_submit(be, &late, PLX_IO_FLUSH, 0, 0, NULL, 0), -EIO);
    be->ops->destroy(be);
    unsetenv("PARALLAX_ISCSI_RETRIES");

    /* Every write reported done is on the LUN (a failed one may or may not be: it was not
     * reported done, which is all a failed write promises). */
    be = plx_backend_iscsi_open(url, 0, &err, errbuf, sizeof(errbuf));
    ck_assert_msg(be != NULL, "reopen: %s", errbuf);
    for (int i = 0; i < N; i++) {
        if (r[i].status != 0)
            continue;
        unsigned char *got = plx_block_alloc(1);
        ck_assert_int_eq(tu_io(be, PLX_IO_READ, (uint64_t)i, 1, got, 0), 0);
        ck_assert_msg(memcmp(got, buf + (size_t)i * BS, BS) == 0, "acknowledged block %d lost", i);
        plx_block_free(got);
    }
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");

    TCase *tc = tcase_create("contract");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_read_after_write, 0, kind_count);
    tcase_add_loop_test(tc, test_unwritten_zero, 0, kind_count);
    tcase_add_loop_test(tc, test_out_of_range, 0, kind_count);
    tcase_add_loop_test(tc, test_no_callback_in_submit, 0, kind_count);
    tcase_add_loop_test(tc, test_flush_and_fua, 0, kind_count);
    tcase_add_loop_test(tc, test_submit_from_callback, 0, kind_count);
    tcase_add_loop_test(tc, test_many_concurrent, 0, kind_count);
    tcase_add_loop_test(tc, test_poll_timeout, 0, kind_count);
    tcase_add_loop_test(tc, test_trim, 0, kind_count);
    tcase_add_loop_test(tc, test_direct_flag, 0, kind_count);
    tcase_add_loop_test(tc, test_direct_flag_dio_align, 0, kind_count);
    tcase_add_loop_test(tc, test_inline_flag, 0, kind_count);
    suite_add_tcase(s, tc);

    tc = tcase_create("mem");
    tcase_add_test(tc, test_mem_peek_poke);
    tcase_add_test(tc, test_mem_large_sparse);
    suite_add_tcase(s, tc);

    tc = tcase_create("file");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_file_open_errors);
    tcase_add_loop_test(tc, test_file_size_and_rdonly, 0, 2);
    tcase_add_loop_test(tc, test_file_short_read_is_eio, 0, 2);
    tcase_add_test(tc, test_file_eagain);
    tcase_add_test(tc, test_file_old_kernel_fallbacks);
    tcase_add_test(tc, test_file_urgent_ioprio);
    tcase_add_test(tc, test_file_fua_group);
    tcase_add_test(tc, test_file_urgent_ioprio_refused);
    tcase_add_test(tc, test_file_blocking_no_aio_context);
    tcase_add_test(tc, test_file_blocking_fua_and_flush);
    tcase_add_test(tc, test_store_blocking_io);
    suite_add_tcase(s, tc);

    if (kind_count > K_ISCSI) {
        tc = tcase_create("iscsi");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_iscsi_open_errors);
        tcase_add_test(tc, test_iscsi_chap);
        tcase_add_loop_test(tc, test_iscsi_unmap, 0, 2);
        tcase_add_test(tc, test_iscsi_reconnect);
        tcase_add_loop_test(tc, test_iscsi_reconnect_idle, 0, 2);
        tcase_add_test(tc, test_iscsi_gives_up);
        tcase_add_test(tc, test_iscsi_open_ignores_sigpipe);
        suite_add_tcase(s, tc);
    }

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

/* tgtd first, so that the contract also runs on iSCSI LUNs. Without it (not root, no tgt) the
 * rest still runs, the iSCSI part is reported skipped and the exit status is 77, never 0. */
int main(void)
{
    char why[512] = "";
    int have_tgtd = tu_tgtd_start(why, sizeof(why)) == 0;
    if (!have_tgtd) {
        kind_count = K_ISCSI;
        printf("SKIP: iSCSI backend contract and tests: %s\n", why);
    }
    int rc = tu_run_suite(backend_suite());
    if (rc == EXIT_SUCCESS && !have_tgtd)
        return 77;
    return rc;
}
