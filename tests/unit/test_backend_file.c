/*
 * test_backend_file.c - what is particular to the file backend (backend_file.c): open errors,
 * size and read-only, short reads, EAGAIN from io_submit, the fallbacks for older kernels, the
 * urgent I/O priority, and the blocking mode; the executable's io_submit, pwritev2 and fdatasync
 * stand in for the system's to count and refuse calls.
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

#include "aio_ring.h"
#include "backend.h"
#include "backend_fault.h"
#include "backend_file_shared.h"
#include "backend_fixture.h"
#include "testutil.h"
#include "tgtd.h"

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
    /* IO_CMD_FDSYNC (alone in a call): kept here, not given to the kernel, until
     * aio_release_held() submits them; the caller sees them accepted. */
    int hold_fdsync;
    unsigned nheld;
    struct iocb *held[8];
    io_context_t held_ctx;
    /* The next hold_writes IO_CMD_PWRITEs (alone in a call): kept the same way until
     * aio_release_writes(). */
    unsigned hold_writes, nwheld;
    struct iocb *wheld[8];
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
    if (aio_fault.hold_fdsync && nr == 1 && ios[0]->aio_lio_opcode == IO_CMD_FDSYNC &&
        aio_fault.nheld < 8) {
        aio_fault.held[aio_fault.nheld++] = ios[0];
        aio_fault.held_ctx = ctx;
        return 1;
    }
    if (aio_fault.hold_writes > 0 && nr == 1 && ios[0]->aio_lio_opcode == IO_CMD_PWRITE &&
        aio_fault.nwheld < 8) {
        aio_fault.hold_writes--;
        aio_fault.wheld[aio_fault.nwheld++] = ios[0];
        aio_fault.held_ctx = ctx;
        return 1;
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

/* Wait (up to 10 s) until the backend's eventfd holds `target` completions' signals. */
static void wait_signals(plx_backend *be, unsigned long target)
{
    for (int t = 0; t < 10000 && efd_count(be->ops->fd(be)) < target; t++)
        usleep(1000);
}

/* FUA data writes (PLX_IO_FUA without PLX_IO_URGENT: the pipeline's FUA overwrites in place) whose
 * data completes in one poll share one flush, asked for by that poll after their writes completed
 * (one aio FDSYNC), and none of them is delivered before it completes.
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
        ck_assert_int_eq(
            rec_submit(be, &r[i], PLX_IO_WRITE, (uint64_t)i, 1, buf + (size_t)i * BS, PLX_IO_FUA),
            0);
    }
    /* Every data write done in the kernel before the backend looks: one poll reaps them all. */
    wait_signals(be, N);
    ck_assert_uint_eq(efd_count(be->ops->fd(be)), N);
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
    /* Written, not yet durable: none delivered, their one flush asked for. */
    ck_assert_int_eq(count, 0);
    ck_assert_uint_eq(sync_fault.fdatasyncs + aio_fault.fdsyncs, 1);
    drain_via_fd(be);
    ck_assert_int_eq(count, N);
    ck_assert_uint_eq(sync_fault.fdatasyncs + aio_fault.fdsyncs, 1);
    ck_assert_uint_eq(aio_fault.rwf_dsync, 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, (uint64_t)i, 1, 90 + (uint64_t)i));
    }

    /* Before Linux 4.18 the aio FDSYNC is refused, once: then each FUA write's flush is the
     * helper thread's. */
    aio_fault.refuse_fdsync = 1;
    count = 0;
    for (int i = 0; i < 4; i++) {
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, 32 + (uint64_t)i, 1,
                                    buf + (size_t)i * BS, PLX_IO_FUA),
                         0);
    }
    drain_via_fd(be);
    ck_assert_int_eq(count, 4);
    ck_assert_uint_eq(aio_fault.refused, 1);
    write_pattern(be, 40, 1, 99, PLX_IO_FUA);
    ck_assert_uint_eq(aio_fault.refused, 1);
    aio_fault.refuse_fdsync = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, 32 + (uint64_t)i, 1, 90 + (uint64_t)i));
    }
    ck_assert(has_pattern(be, 40, 1, 99));
    plx_block_free(buf);
    be->ops->destroy(be);
}
END_TEST

/* The aio context's completion ring read in user space (aio_ring.c) on a real context: writes
 * plain and FUA (their group FDSYNC too) are reaped with no io_getevents, polls with nothing
 * completed read nothing (not even the eventfd), and no signal is left behind once all is
 * delivered (nothing would keep the engine's loop busy). With $PARALLAX_AIO_RING=0 the same
 * writes go through io_getevents, as they did before. */
static void ring_round(plx_backend *be, uint64_t first, uint64_t seed)
{
    enum { N = 48 };
    unsigned char *buf = plx_block_alloc(N);
    struct rec r[N];
    int count = 0;
    for (int i = 0; i < N; i++) {
        tu_fill(buf + (size_t)i * BS, BS, seed + (uint64_t)i);
        r[i].counter = &count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, first + (uint64_t)i, 1,
                                    buf + (size_t)i * BS, i % 2 ? PLX_IO_FUA : 0),
                         0);
    }
    drain_via_fd(be);
    ck_assert_int_eq(count, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, first + (uint64_t)i, 1, seed + (uint64_t)i));
    }
    plx_block_free(buf);
}

START_TEST(test_file_aio_ring)
{
    plx_backend *be = make_backend(K_FILE_RT, 256);
    struct file_backend *f = (struct file_backend *)be;
    ck_assert_ptr_nonnull(f->ring); /* (every kernel since aio's ring has had this layout) */
    ring_round(be, 0, 300);
    ck_assert_uint_eq(f->getevents_calls, 0);
    /* Everything delivered: the eventfd holds nothing, and idle polls make no system call. */
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
    ck_assert_uint_eq(efd_count(be->ops->fd(be)), 0);
    uint64_t reads = f->efd_reads;
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(be->ops->poll(be, 0), 0);
    ck_assert_uint_eq(f->efd_reads, reads);
    /* Again on the same context, its head moved on by the first round. */
    ring_round(be, 100, 400);
    ck_assert_uint_eq(f->getevents_calls, 0);
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
    ck_assert_uint_eq(efd_count(be->ops->fd(be)), 0);
    be->ops->destroy(be);

    setenv("PARALLAX_AIO_RING", "0", 1);
    be = make_backend(K_FILE_RT, 256);
    unsetenv("PARALLAX_AIO_RING");
    f = (struct file_backend *)be;
    ck_assert_ptr_null(f->ring);
    ring_round(be, 0, 500);
    ck_assert_uint_gt(f->getevents_calls, 0);
    be->ops->destroy(be);
}
END_TEST

/* A ring whose header this reader does not know is not read (the backend keeps io_getevents);
 * one it knows is read from head to tail, around its end, and head is moved past what was
 * taken. On a ring in memory, laid out as the kernel's. */
START_TEST(test_aio_ring_reader)
{
    enum { NR = 4 };
    size_t size = sizeof(struct plx_aio_ring) + NR * sizeof(struct io_event);
    struct plx_aio_ring *r = calloc(1, size);
    r->nr = NR;
    r->header_length = sizeof *r;
    ck_assert_ptr_null(plx_aio_ring_of((io_context_t)(void *)r)); /* no magic */
    r->magic = 0xa10a10a1u;
    r->incompat_features = 1;
    ck_assert_ptr_null(plx_aio_ring_of((io_context_t)(void *)r));
    r->incompat_features = 0;
    r->header_length = 64;
    ck_assert_ptr_null(plx_aio_ring_of((io_context_t)(void *)r));
    r->header_length = sizeof *r;
    ck_assert_ptr_null(plx_aio_ring_of(NULL));
    ck_assert_ptr_eq(plx_aio_ring_of((io_context_t)(void *)r), r);
    struct io_event ev[NR];
    ck_assert(plx_aio_ring_empty(r));
    ck_assert_int_eq(plx_aio_ring_reap(r, ev, NR), 0);
    /* Three events from slot 2: slots 2, 3, 0. */
    r->head = r->tail = 2;
    for (unsigned i = 0; i < 3; i++) {
        r->events[(2 + i) % NR].res = 10 + i;
        r->events[(2 + i) % NR].data = (void *)(uintptr_t)(100 + i);
    }
    r->tail = 1;
    ck_assert(!plx_aio_ring_empty(r));
    ck_assert_int_eq(plx_aio_ring_reap(r, ev, 2), 2); /* at most max */
    ck_assert_uint_eq(r->head, 0);
    ck_assert_int_eq(plx_aio_ring_reap(r, ev + 2, NR), 1);
    ck_assert_uint_eq(r->head, 1);
    ck_assert(plx_aio_ring_empty(r));
    for (unsigned i = 0; i < 3; i++) {
        ck_assert_uint_eq(ev[i].res, 10 + i);
        ck_assert_ptr_eq(ev[i].data, (void *)(uintptr_t)(100 + i));
    }
    free(r);
}
END_TEST

/* Give the kernel the n iocbs the io_submit stand-in kept, in order; returns 0 (the new count). */
static unsigned aio_release(struct iocb **held, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        ck_assert_int_eq(syscall(SYS_io_submit, aio_fault.held_ctx, 1L, &held[i]), 1);
    return 0;
}

static void aio_release_held(void)
{
    aio_fault.fdsyncs += aio_fault.nheld;
    aio_fault.nheld = aio_release(aio_fault.held, aio_fault.nheld);
}

static void aio_release_writes(void)
{
    aio_fault.nwheld = aio_release(aio_fault.wheld, aio_fault.nwheld);
}

/* Submit FUA data writes to blocks at, at + 1, ... (block i holding pattern 50 + i), the last
 * `held` of them kept from the kernel (aio_fault.hold_writes), and poll once after the others'
 * data is written. */
static void fua_hold_round(plx_backend *be, struct rec *r, int *count, unsigned char *buf, int n,
                           int held, uint64_t at)
{
    unsigned long before = efd_count(be->ops->fd(be));
    for (int i = 0; i < n; i++) {
        if (i == n - held)
            aio_fault.hold_writes = (unsigned)held;
        r[i].counter = count;
        tu_fill(buf + (size_t)i * BS, BS, 50 + at + (uint64_t)i);
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, at + (uint64_t)i, 1,
                                    buf + (size_t)i * BS, PLX_IO_FUA),
                         0);
    }
    ck_assert_uint_eq(aio_fault.nwheld, (unsigned)held);
    wait_signals(be, before + (unsigned)(n - held));
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
}

static void fua_hold_finish(plx_backend *be, struct rec *r, int *count, int n, uint64_t at)
{
    aio_release_writes();
    drain_via_fd(be);
    ck_assert_int_eq(*count, n);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(r[i].status, 0);
        ck_assert(has_pattern(be, at + (uint64_t)i, 1, 50 + at + (uint64_t)i));
    }
}

/* A group's flush waits while other FUA data writes are still being written and fewer than 16
 * are pending ($PARALLAX_FUA_HOLD): one flush for the lot, not one for those written first and
 * another for the rest (at QD 32 through tapdisk a group of 6-7 became ~12, bench/notes/
 * fua-tapdisk.md). Past the limit, and with the wait turned off, the written ones' flush goes at
 * once. No write is delivered before its group's flush ends. */
/* A backend opened with $PARALLAX_FUA_HOLD set to hold (NULL: unset), the stand-in reset. */
static plx_backend *hold_backend(const char *hold)
{
    if (hold)
        setenv("PARALLAX_FUA_HOLD", hold, 1);
    plx_backend *be = make_backend(K_FILE_RT, 64);
    unsetenv("PARALLAX_FUA_HOLD");
    memset(&aio_fault, 0, sizeof aio_fault);
    return be;
}

START_TEST(test_file_fua_hold)
{
    unsigned char *buf = plx_block_alloc(6);
    struct rec r[6];
    int count = 0;
    plx_backend *be = hold_backend(NULL);
    fua_hold_round(be, r, &count, buf, 6, 2, 0);
    ck_assert_uint_eq(aio_fault.fdsyncs, 0); /* four written, two still writing: no flush yet */
    ck_assert_int_eq(count, 0);
    fua_hold_finish(be, r, &count, 6, 0);
    ck_assert_uint_eq(aio_fault.fdsyncs, 1); /* one flush for the six */
    be->ops->destroy(be);

    /* At the limit (4 here) the pending writes' flush goes though others are still writing. */
    be = hold_backend("4");
    count = 0;
    fua_hold_round(be, r, &count, buf, 6, 2, 8);
    ck_assert_uint_eq(aio_fault.fdsyncs, 1);
    fua_hold_finish(be, r, &count, 6, 8);
    ck_assert_uint_eq(aio_fault.fdsyncs, 2);
    be->ops->destroy(be);

    /* $PARALLAX_FUA_HOLD=0: no wait, as before. */
    be = hold_backend("0");
    count = 0;
    fua_hold_round(be, r, &count, buf, 3, 1, 16);
    ck_assert_uint_eq(aio_fault.fdsyncs, 1);
    fua_hold_finish(be, r, &count, 3, 16);
    ck_assert_uint_eq(aio_fault.fdsyncs, 2);
    be->ops->destroy(be);
    plx_block_free(buf);
}
END_TEST

/* FUA data writes reaped while a group's flush is in flight form a second group, whose flush goes
 * to the kernel at once (two in flight; with one, it waited for the first to come back through
 * the engine's loop); a third waits. No write is delivered before its group's flush ends. The
 * kernel is kept from running the flushes (held in the io_submit stand-in) until released. */
static void fua_batch(plx_backend *be, struct rec *r, int *count, unsigned char *buf, uint64_t at)
{
    unsigned long before = efd_count(be->ops->fd(be));
    for (int i = 0; i < 4; i++) {
        r[i].counter = count;
        ck_assert_int_eq(rec_submit(be, &r[i], PLX_IO_WRITE, at + (uint64_t)i, 1,
                                    buf + (size_t)i * BS, PLX_IO_FUA),
                         0);
    }
    /* Their data written before the backend looks: one poll reaps the four. */
    wait_signals(be, before + 4);
    ck_assert_int_ge(be->ops->poll(be, 0), 0);
}

START_TEST(test_file_fua_groups_in_flight)
{
    plx_backend *be = make_backend(K_FILE_RT, 64);
    memset(&aio_fault, 0, sizeof aio_fault);
    unsigned char *buf = plx_block_alloc(4);
    for (int i = 0; i < 4; i++)
        tu_fill(buf + (size_t)i * BS, BS, 77 + (uint64_t)i);
    struct rec r[3][4];
    int count = 0;
    aio_fault.hold_fdsync = 1;
    fua_batch(be, r[0], &count, buf, 0);
    ck_assert_uint_eq(aio_fault.nheld, 1);
    fua_batch(be, r[1], &count, buf, 8);
    ck_assert_uint_eq(aio_fault.nheld, 2); /* the second group's flush: not waiting for the first */
    fua_batch(be, r[2], &count, buf, 16);
    ck_assert_uint_eq(aio_fault.nheld, 2); /* the third waits */
    ck_assert_int_eq(count, 0);            /* written, none durable yet: none delivered */
    aio_fault.hold_fdsync = 0;
    aio_release_held();
    drain_via_fd(be);
    ck_assert_int_eq(count, 12);
    ck_assert_uint_eq(aio_fault.fdsyncs, 3); /* one per group */
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 4; i++) {
            ck_assert_int_eq(r[b][i].status, 0);
            ck_assert(has_pattern(be, (uint64_t)(8 * b + i), 1, 77 + (uint64_t)i));
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

static Suite *backend_file_suite(void)
{
    Suite *s = suite_create("backend-file");
    TCase *tc;

    tc = tcase_create("file");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_file_open_errors);
    tcase_add_loop_test(tc, test_file_size_and_rdonly, 0, 2);
    tcase_add_loop_test(tc, test_file_short_read_is_eio, 0, 2);
    tcase_add_test(tc, test_file_eagain);
    tcase_add_test(tc, test_file_old_kernel_fallbacks);
    tcase_add_test(tc, test_file_urgent_ioprio);
    tcase_add_test(tc, test_file_fua_group);
    tcase_add_test(tc, test_file_aio_ring);
    tcase_add_test(tc, test_file_fua_groups_in_flight);
    tcase_add_test(tc, test_file_fua_hold);
    tcase_add_test(tc, test_aio_ring_reader);
    tcase_add_test(tc, test_file_urgent_ioprio_refused);
    tcase_add_test(tc, test_file_blocking_no_aio_context);
    tcase_add_test(tc, test_file_blocking_fua_and_flush);
    tcase_add_test(tc, test_store_blocking_io);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(backend_file_suite());
}
