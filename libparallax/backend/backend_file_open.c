/*
 * backend_file_open.c - opening a file or a block device as the file backend: O_DIRECT where
 * the filesystem takes it (probed with a read, as some refuse it only then), the size, the
 * memory alignment O_DIRECT needs, the aio context (fewer slots when the system's budget is
 * short), the eventfd, the zeroing ahead's state; and its line in the table of URL schemes.
 * The I/O on what it opened is backend_file.c's, the layer below (backend_file_shared.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "aio_ring.h"
#include "backend_file_shared.h"

#define FILE_MAX_SLOTS 1024
/* fua_hold's default (backend_file_shared.h) */
#define FUA_HOLD_DEFAULT 16

static size_t dio_align_ok(long a)
{
    return a > 0 && (a & (a - 1)) == 0 && a <= PLX_BLOCK_SIZE ? (size_t)a : PLX_BLOCK_SIZE;
}

/* The memory alignment O_DIRECT on fd needs (plx_backend_dio_align): ext4 on a disk of 512-byte
 * sectors takes a buffer 512 bytes past a page boundary, as tapdisk's are. */
static size_t dio_mem_align(int fd, const struct stat *st)
{
    long a = 0;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN))
        return dio_align_ok(sx.stx_dio_mem_align); /* 0: no O_DIRECT on this file after all */
#endif
    int ssz = 0;
    if (S_ISBLK(st->st_mode) && ioctl(fd, BLKSSZGET, &ssz) == 0)
        a = ssz; /* a sector: at least what the device's DMA needs */
    return dio_align_ok(a);
}

/* Some filesystems accept O_DIRECT at open and refuse it on the first I/O. */
static int direct_io_refused(int fd)
{
    void *buf = plx_block_alloc(1);
    int refused = pread(fd, buf, PLX_BLOCK_SIZE, 0) < 0 && errno == EINVAL;
    plx_block_free(buf);
    return refused;
}

plx_backend *plx_backend_file_open(const char *path, unsigned flags, int *err, char *errbuf,
                                   size_t errlen)
{
    int rdonly = (flags & PLX_BACKEND_RDONLY) != 0;
    int oflags = (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC;
    int direct = (flags & PLX_BACKEND_BUFFERED) == 0;
    uint64_t size;
    struct stat st;
    int e;

    int fd = open(path, oflags | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {
        direct = 0;
        fd = open(path, oflags);
    }
    if (fd < 0) {
        e = errno;
        return plx_backend_open_fail(err, errbuf, errlen, e, "open %s: %s", path, strerror(e));
    }
    if (fstat(fd, &st) < 0) {
        e = errno;
        close(fd);
        return plx_backend_open_fail(err, errbuf, errlen, e, "stat %s: %s", path, strerror(e));
    }
    if (S_ISREG(st.st_mode)) {
        size = (uint64_t)st.st_size;
    } else if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
            e = errno;
            close(fd);
            return plx_backend_open_fail(err, errbuf, errlen, e, "ioctl BLKGETSIZE64 %s: %s", path,
                                         strerror(e));
        }
    } else {
        close(fd);
        return plx_backend_open_fail(err, errbuf, errlen, EINVAL,
                                     "open %s: not a regular file or block device", path);
    }
    if (direct && size >= PLX_BLOCK_SIZE && direct_io_refused(fd)) {
        close(fd);
        direct = 0;
        fd = open(path, oflags);
        if (fd < 0) {
            e = errno;
            return plx_backend_open_fail(err, errbuf, errlen, e, "open %s: %s", path, strerror(e));
        }
    }

    struct file_backend *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        close(fd);
        return plx_backend_open_fail(err, errbuf, errlen, ENOMEM, "open %s: %s", path,
                                     strerror(ENOMEM));
    }
    f->fd = fd;
    f->direct = direct;
    f->rdonly = rdonly;
    f->aio_fdsync = 1;
    f->rwf_dsync = 1;
    if (flags & PLX_BACKEND_FLUSH_THREAD)
        f->aio_fdsync = f->rwf_dsync = 0;
    /* Buffered: RWF_DSYNC would make io_submit itself wait for the disk (a buffered aio write
     * runs inside the call); a write and an aio FDSYNC keep the wait off the caller. */
    f->buffered = (flags & PLX_BACKEND_BUFFERED) != 0;
    if (f->buffered)
        f->rwf_dsync = 0;

    int qrc = plx_done_open(&f->done);
    if (qrc < 0) {
        e = -qrc;
        close(fd);
        free(f);
        return plx_backend_open_fail(err, errbuf, errlen, e, "eventfd for %s: %s", path,
                                     strerror(e));
    }
    /* aio contexts come out of a system-wide budget (fs.aio-max-nr): settle for fewer slots
     * rather than fail when it is short. */
    unsigned nslots = FILE_MAX_SLOTS;
    int rc = 0;
    f->blocking = (flags & PLX_BACKEND_BLOCKING) != 0;
    const char *trace = getenv("PARALLAX_SNAP_TRACE");
    f->trace = trace && *trace && strcmp(trace, "0") != 0;
    const char *ioprio = getenv("PARALLAX_IOPRIO");
    f->ioprio_rt = f->direct && !f->blocking && !(ioprio && strcmp(ioprio, "0") == 0);
    /* Flushes, and the flush after an urgent FUA write, from the helper thread, which takes the
     * real-time I/O class for urgent ones: an aio FDSYNC runs in a kernel worker. */
    f->sync_rt = f->ioprio_rt;
    if (f->sync_rt)
        f->aio_fdsync = 0;
    const char *group = getenv("PARALLAX_FUA_GROUP");
    f->fua_group =
        !f->blocking && !(flags & PLX_BACKEND_FLUSH_THREAD) && !(group && strcmp(group, "0") == 0);
    /* Up to two groups' flushes in flight: the second group's FDSYNC waits at the block layer,
     * not in the engine's loop, for the first to end, and starts as soon as it does (at QD 32
     * through tapdisk 1.6x one in flight at load 8-12, equal on a quiet machine:
     * bench/notes/fua-tapdisk.md). $PARALLAX_FUA_GROUP=N
     * (N >= 1) sets it (for measurements). */
    f->fua_groups_max = group && atoi(group) >= 1 ? (unsigned)atoi(group) : 2;
    /* A group's flush waits for the FUA data writes still being written, up to 16 pending
     * (fua_group_submit). $PARALLAX_FUA_HOLD=N sets the 16, 0 turns the wait off (for
     * measurements). */
    const char *hold = getenv("PARALLAX_FUA_HOLD");
    f->fua_hold = hold && atoi(hold) >= 0 ? (unsigned)atoi(hold) : FUA_HOLD_DEFAULT;
    while (!f->blocking) {
        rc = io_setup((int)nslots, &f->ctx);
        if (rc != -EAGAIN || nslots <= 8)
            break;
        nslots /= 2;
    }
    if (rc < 0) {
        plx_done_close(&f->done);
        close(fd);
        free(f);
        return plx_backend_open_fail(err, errbuf, errlen, -rc, "io_setup for %s: %s", path,
                                     strerror(-rc));
    }
    /* The completion ring read in user space (aio_ring.h); $PARALLAX_AIO_RING=0: io_getevents. */
    const char *ring = getenv("PARALLAX_AIO_RING");
    if (!f->blocking && !(ring && strcmp(ring, "0") == 0))
        f->ring = plx_aio_ring_of(f->ctx);
    f->slots = calloc(nslots, sizeof(*f->slots));
    if (f->slots == NULL) {
        if (!f->blocking)
            io_destroy(f->ctx);
        plx_done_close(&f->done);
        close(fd);
        free(f);
        return plx_backend_open_fail(err, errbuf, errlen, ENOMEM, "open %s: %s", path,
                                     strerror(ENOMEM));
    }
    for (unsigned i = nslots; i-- > 0;)
        plx_file_slot_release(f, &f->slots[i]);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    plx_file_prep_init(&f->prep, &f->base, fd, f->done.efd,
                       S_ISREG(st.st_mode) && direct && !rdonly && !f->blocking);

    /* PLX_IO_DIRECT (backend.h): where O_DIRECT is refused (tmpfs) such I/Os use the page cache
     * like the rest. */
    f->dfd = -1;
    if (f->buffered && S_ISREG(st.st_mode)) {
        f->dfd = open(path, oflags | O_DIRECT);
        if (f->dfd >= 0 && size >= PLX_BLOCK_SIZE && direct_io_refused(f->dfd)) {
            close(f->dfd);
            f->dfd = -1;
        }
    }
    f->dio_align = f->dfd >= 0 ? dio_mem_align(f->dfd, &st)
                   : f->direct ? dio_mem_align(fd, &st)
                               : PLX_BLOCK_SIZE;
    f->base.ops = &plx_file_ops;
    f->base.nblocks = size / PLX_BLOCK_SIZE;
    if (direct || f->buffered)
        snprintf(f->base.desc, sizeof(f->base.desc), "%s", path);
    else
        snprintf(f->base.desc, sizeof(f->base.desc), "%s (buffered: O_DIRECT refused)", path);
    return &f->base;
}

/* Its line in the table of URL schemes (backend_open.c): any name no other scheme claims. */
const struct plx_backend_scheme plx_backend_file_scheme = {
    .prefix = NULL,
    .open = plx_backend_file_open,
    .ops = &plx_file_ops,
};
