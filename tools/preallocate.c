/*
 * preallocate.c - `format --preallocate`: write a store file's holes through; see preallocate.h.
 *
 * Why: on a thin medium (a sparse file on ext4 over a virtual disk, a thin LUN) the first write
 * to a block is slower than a rewrite - measured 1.45x on this project's test VM
 * (bench/notes/snapshots.md, "Fresh space") - and copy-on-write below snapshots sends every write
 * after a snapshot to blocks the store has never written. Writing the file through once, as
 * `qemu-img create -o preallocation=full` does for an image, moves that cost to format time.
 *
 * Only holes are written, and only with zeros: a hole already reads as zeros, so the store's
 * contents cannot change, whatever the file held or the format wrote.
 */
#include "preallocate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "progress.h"

#define CHUNK (1u << 20)

/* Write zeros over [off, end) of fd (dfd: the same file opened O_DIRECT, or -1). */
static int fill(int fd, int dfd, const char *zeros, off_t off, off_t end, struct progress *p,
                uint64_t *done, uint64_t total)
{
    while (off < end) {
        size_t len = (size_t)(end - off < CHUNK ? end - off : CHUNK);
        /* O_DIRECT for whole aligned blocks (no page cache to fill and flush); the file's
         * unaligned tail, or a file system without O_DIRECT, through the page cache. */
        int direct = dfd >= 0 && off % 4096 == 0 && len % 4096 == 0;
        ssize_t n = pwrite(direct ? dfd : fd, zeros, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        off += n;
        *done += (uint64_t)n;
        progress_bytes(p, *done, total);
    }
    return 0;
}

int preallocate_holes(const char *path, uint64_t *written, char *err, size_t errlen)
{
    *written = 0;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: only a file is preallocated (a device has no holes)", path);
        close(fd);
        return -EINVAL;
    }
    int dfd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1: no O_DIRECT here (tmpfs) */
    char *zeros = NULL;
    if (posix_memalign((void **)&zeros, 4096, CHUNK) != 0) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        if (dfd >= 0)
            close(dfd);
        return -ENOMEM;
    }
    memset(zeros, 0, CHUNK);

    /* What is to be written, for the progress line: the holes' total. */
    uint64_t total = 0;
    off_t size = st.st_size;
    for (off_t h = lseek(fd, 0, SEEK_HOLE); h >= 0 && h < size;) {
        off_t d = lseek(fd, h, SEEK_DATA);
        off_t e = d < 0 ? size : d;
        total += (uint64_t)(e - h);
        if (d < 0)
            break;
        h = lseek(fd, d, SEEK_HOLE);
    }
    struct progress p;
    progress_init(&p, "format --preallocate", 0);

    int rc = 0;
    off_t h = lseek(fd, 0, SEEK_HOLE);
    while (rc == 0 && h >= 0 && h < size) {
        off_t d = lseek(fd, h, SEEK_DATA);
        off_t e = d < 0 ? size : d; /* ENXIO: no data after h, a hole up to the end */
        rc = fill(fd, dfd, zeros, h, e, &p, written, total);
        if (rc == 0 && d < 0)
            break;
        if (rc == 0)
            h = lseek(fd, d, SEEK_HOLE);
    }
    if (rc == 0 && h < 0 && errno != ENXIO)
        rc = -errno;
    if (rc == 0 && fdatasync(fd) != 0) /* the buffered tail, and the file's block map */
        rc = -errno;
    progress_end(&p);
    if (rc)
        snprintf(err, errlen, "writing zeros through %s: %s", path, strerror(-rc));
    free(zeros);
    if (dfd >= 0)
        close(dfd);
    close(fd);
    return rc;
}
