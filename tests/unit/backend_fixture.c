/*
 * backend_fixture.c - the backends under test and the helpers of the backend tests
 * (backend_fixture.h).
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

/* ---- Backends under test --------------------------------------------------------------------- */

const char *kind_name[K_COUNT] = {"mem",      "fault",         "file",          "file-thread",
                                  "file-shm", "file-blocking", "file-buffered", "file-rt",
                                  "iscsi",    "iscsi-blocking"};

/* The contract runs on the iSCSI kinds only when main() could start tgtd. */
int kind_count = K_COUNT;

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

plx_backend *open_temp_file_flags(const char *dir, uint64_t nblocks, unsigned flags)
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

plx_backend *open_temp_file(const char *dir, uint64_t nblocks)
{
    return open_temp_file_flags(dir, nblocks, 0);
}

plx_backend *make_backend(int kind, uint64_t nblocks)
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

static void rec_done(struct plx_io *io, int status)
{
    struct rec *r = io->owner;
    r->calls++;
    r->status = status;
    if (r->counter != NULL)
        (*r->counter)++;
}

int rec_submit(plx_backend *be, struct rec *r, enum plx_io_op op, uint64_t block, uint32_t nblocks,
               void *buf, unsigned flags)
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

void drain(plx_backend *be)
{
    while (be->ops->inflight(be) > 0)
        ck_assert_int_ge(be->ops->poll(be, -1), 0);
}

void write_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed, unsigned flags)
{
    void *buf = plx_block_alloc(n);
    tu_fill(buf, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, block, n, buf, flags), 0);
    plx_block_free(buf);
}

/* Nonzero when blocks [block, block + n) hold the pattern for seed. */
int has_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed)
{
    void *buf = plx_block_alloc(n), *want = plx_block_alloc(n);
    tu_fill(want, (size_t)n * BS, seed);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, block, n, buf, 0), 0);
    int same = memcmp(buf, want, (size_t)n * BS) == 0;
    plx_block_free(buf);
    plx_block_free(want);
    return same;
}

int is_zero(plx_backend *be, uint64_t block)
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

char *make_temp(uint64_t size)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s/plx-test-backend-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
    return path;
}

/* Waits the way the engine does: on the fd, then a non-blocking poll. */
void drain_via_fd(plx_backend *be)
{
    while (be->ops->inflight(be) > 0) {
        struct pollfd pfd = {.fd = be->ops->fd(be), .events = POLLIN};
        ck_assert_msg(poll(&pfd, 1, 10000) == 1, "fd never became readable");
        ck_assert_int_ge(be->ops->poll(be, 0), 0);
    }
}
