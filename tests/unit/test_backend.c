/*
 * test_backend.c - the memory, file and iSCSI backends and the fault-injection one against the
 * contract of backend.h, and what is particular to the memory and iSCSI backends. The file
 * backend's own tests are in test_backend_file.c, the fault backend's in test_backend_fault.c;
 * the backends under test and the helpers in backend_fixture.c.
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
    TCase *tc;

    tc = tcase_create("contract");
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
