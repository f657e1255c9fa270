/*
 * cmd_import.c - vdi-import: copy a file into a VDI, keeping zero blocks sparse.
 *
 * The file is read in 1 MiB chunks into a ring of buffers and written with the asynchronous API,
 * up to IMPORT_DEPTH requests in flight, so reading the file overlaps with the engine's I/O.
 * Zero blocks are not written; where the VDI already maps such a block (an import over older
 * contents) it is trimmed, so the VDI ends up equal to the file rather than a mix of both.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "progress.h"
#include "zero.h"

#define IMPORT_CHUNK (1u << 20)
#define IMPORT_BUFS 8
#define IMPORT_DEPTH 32
/* Several requests per chunk, so dense data still fills the queue from IMPORT_BUFS buffers. */
#define IMPORT_MAX_REQ (256u << 10)

struct import;

struct import_buf {
    struct import *im;
    unsigned char *data;
    unsigned pending; /* requests still using data */
};

struct import {
    plx_store *st;
    plx_vdi *v;
    uint64_t size;
    unsigned inflight;
    int failed;   /* first error reported by a callback */
    int progress; /* set by callbacks so plx_store_wait() returns */
    /* What plx_vdi_block_status() last said: from the current offset to known_end the VDI is
     * uniformly mapped (known_mapped) or sparse. */
    uint64_t known_end;
    int known_mapped;
    struct import_buf bufs[IMPORT_BUFS];
    struct progress prog;
    uint64_t file_size; /* for the progress line; 0 when not known (a pipe) */
};

static void import_done(void *arg, int status)
{
    struct import_buf *b = arg;
    struct import *im = b->im;

    b->pending--;
    im->inflight--;
    if (status < 0 && im->failed == 0)
        im->failed = status;
    im->progress = 1;
}

/* Block until at least one more request completes; only call with requests in flight. */
static int wait_one(struct import *im)
{
    im->progress = 0;
    int err = plx_store_wait(im->st, &im->progress);
    return err < 0 ? err : im->failed;
}

static int submit(struct import *im, struct import_buf *b, const unsigned char *data, uint64_t off,
                  size_t len)
{
    int err = 0;

    while (err == 0 && im->inflight >= IMPORT_DEPTH)
        err = wait_one(im);
    if (err == 0)
        err = data != NULL ? plx_vdi_submit_write(im->v, data, off, len, 0, import_done, b)
                           : plx_vdi_submit_trim(im->v, off, len, import_done, b);
    if (err < 0)
        return err;
    b->pending++;
    im->inflight++;
    return 0;
}

static int mapping_at(struct import *im, uint64_t off, int *mapped, uint64_t *run)
{
    if (off >= im->known_end) {
        uint64_t len;
        int err = plx_vdi_block_status(im->v, off, im->size - off, &len);
        if (err < 0)
            return err;
        if (len == 0)
            return -EIO; /* no progress would loop forever */
        im->known_mapped = err > 0;
        im->known_end = off + len;
    }
    *mapped = im->known_mapped;
    *run = im->known_end - off;
    return 0;
}

static int zero_range(struct import *im, struct import_buf *b, uint64_t off, uint64_t len)
{
    while (len > 0) {
        int mapped;
        uint64_t run;
        int err = mapping_at(im, off, &mapped, &run);
        if (err < 0)
            return err;
        run = run < len ? run : len;
        if (mapped && (err = submit(im, b, NULL, off, run)) < 0)
            return err;
        off += run;
        len -= run;
    }
    return 0;
}

static int import_chunk(struct import *im, struct import_buf *b, size_t n, uint64_t off)
{
    size_t i = 0;

    while (i < n) {
        int zero = is_zero(b->data + i, n - i < PLX_BLOCK_SIZE ? n - i : PLX_BLOCK_SIZE);
        size_t limit = zero ? n - i : (n - i < IMPORT_MAX_REQ ? n - i : IMPORT_MAX_REQ);
        size_t run = zero_run(b->data + i, limit, zero);
        int err = zero ? zero_range(im, b, off + i, run) : submit(im, b, b->data + i, off + i, run);
        if (err < 0)
            return err;
        i += run;
    }
    return 0;
}

/* Read up to len bytes; fewer only at end of file. */
static ssize_t read_full(int fd, unsigned char *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r == 0)
            break;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int drain(struct import *im)
{
    int err = 0;

    while (err == 0 && im->inflight > 0)
        err = wait_one(im);
    return err;
}

/* Returns an exit code, the error (if any) printed. */
static int import_file(struct import *im, int fd, const char *file, const char *vdi)
{
    uint64_t off = 0;
    int err = 0;

    for (unsigned k = 0;; k = (k + 1) % IMPORT_BUFS) {
        struct import_buf *b = &im->bufs[k];
        while (err == 0 && b->pending > 0)
            err = wait_one(im);
        if (err < 0)
            break;
        ssize_t n = read_full(fd, b->data, IMPORT_CHUNK);
        if (n < 0) {
            drain(im);
            return cli_error("reading %s: %s", file, strerror((int)-n));
        }
        if (n == 0)
            break;
        if ((uint64_t)n > im->size - off) {
            drain(im);
            return cli_error("%s is larger than VDI %s (%llu bytes)", file, vdi,
                             (unsigned long long)im->size);
        }
        err = import_chunk(im, b, (size_t)n, off);
        off += (uint64_t)n;
        progress_bytes(&im->prog, off, im->file_size);
    }
    int derr = drain(im);
    err = err < 0 ? err : derr;
    if (err == 0)
        err = plx_vdi_flush(im->v);
    progress_end(&im->prog);
    return err < 0 ? cli_engine_error(im->st, err) : EXIT_OK;
}

static int check_file_size(struct import *im, int fd, const char *file, const char *vdi)
{
    struct stat sb;

    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        im->file_size = (uint64_t)sb.st_size;
    /* Catch the common mistake before anything is written; pipes are caught while reading. */
    if (im->file_size > im->size)
        return cli_error("%s (%llu bytes) is larger than VDI %s (%llu bytes)", file,
                         (unsigned long long)im->file_size, vdi, (unsigned long long)im->size);
    return EXIT_OK;
}

static int alloc_bufs(struct import *im)
{
    for (unsigned k = 0; k < IMPORT_BUFS; k++) {
        im->bufs[k].im = im;
        im->bufs[k].data = malloc(IMPORT_CHUNK);
        if (im->bufs[k].data == NULL)
            return cli_error("vdi-import: %s", strerror(ENOMEM));
    }
    return EXIT_OK;
}

static int import_into(plx_store *st, const char *vdi, int fd, const char *file, int quiet)
{
    struct import im = {.st = st};
    const char *at = strchr(vdi, '@');
    if (at != NULL)
        return cli_error("%s is a snapshot, and snapshots never change: import into the VDI "
                         "%.*s, or into a writable copy made with 'vdi-create NAME --from %s'",
                         vdi, (int)(at - vdi), vdi, vdi);
    /* Reading the store into one of its own VDIs reads blocks the import is changing; a write
     * log is no disk image either. Both are mistakes for the name of an image file. */
    char why[PATH_MAX + 128];
    if (fd != STDIN_FILENO && plx_store_path_conflict(st, file, why, sizeof why) > 0)
        return cli_error("vdi-import: %s, not a disk image to import; nothing was written", why);
    int err = plx_vdi_open(st, vdi, 0, &im.v);

    if (err < 0)
        return cli_engine_error(st, err);
    progress_init(&im.prog, "vdi-import", quiet);
    im.size = plx_vdi_size(im.v);
    int rc = check_file_size(&im, fd, file, vdi);
    if (rc == EXIT_OK)
        rc = alloc_bufs(&im);
    if (rc == EXIT_OK)
        rc = import_file(&im, fd, file, vdi);
    /* Close before freeing: it completes whatever an error left in flight. */
    err = plx_vdi_close(im.v);
    if (err < 0 && rc == EXIT_OK)
        rc = cli_engine_error(st, err);
    for (unsigned k = 0; k < IMPORT_BUFS; k++)
        free(im.bufs[k].data);
    return rc;
}

int cmd_vdi_import(struct cli_ctx *ctx, int argc, char **argv)
{
    int quiet = 0;
    const struct cli_opt opts[] = {{"quiet", 0, NULL, &quiet}, {0}};
    const char *pos[2];
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, pos, 2, 2);

    if (rc != EXIT_OK)
        return rc;
    int is_stdin = strcmp(pos[1], "-") == 0;
    int fd = is_stdin ? STDIN_FILENO : open(pos[1], O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_error("%s: %s", pos[1], strerror(errno));
    rc = cli_open_store_aio(ctx, 0, &st);
    if (rc == EXIT_OK)
        rc = cli_close_store(st, import_into(st, pos[0], fd, is_stdin ? "stdin" : pos[1], quiet));
    if (!is_stdin)
        close(fd);
    return rc;
}
