/*
 * cmd_export.c - vdi-export: write a VDI or snapshot to a file, keeping holes as holes.
 *
 * A regular file is sized up front and only the data is written, so unmapped runs (found with
 * plx_vdi_block_status) and blocks that read as zeros stay holes. Anything else (stdout, a pipe,
 * a block device) gets every byte in order, since its old contents cannot be assumed zero.
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

#define EXPORT_CHUNK (1u << 20)

struct sink {
    int fd;
    const char *name;
    int sparse;   /* a regular file already truncated to size: skip zeros */
    int seekable; /* use pwrite; otherwise offsets arrive in order and write() is used */
    struct progress *prog;
    uint64_t size; /* of the image, for the progress line */
};

static int sink_write(const struct sink *s, const unsigned char *p, uint64_t off, size_t len)
{
    while (len > 0) {
        ssize_t w = s->seekable ? pwrite(s->fd, p, len, (off_t)off) : write(s->fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return cli_error("writing %s: %s", s->name, w < 0 ? strerror(errno) : "no progress");
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return EXIT_OK;
}

static int sink_zeros(const struct sink *s, uint64_t off, uint64_t len)
{
    static const unsigned char zeros[64 << 10];
    int rc = EXIT_OK;

    while (!s->sparse && rc == EXIT_OK && len > 0) {
        size_t n = len < sizeof zeros ? (size_t)len : sizeof zeros;
        rc = sink_write(s, zeros, off, n);
        off += n;
        len -= n;
    }
    return rc;
}

/* Write a chunk read from the VDI, leaving out its zero blocks when the sink allows. */
static int sink_chunk(const struct sink *s, const unsigned char *p, uint64_t off, size_t len)
{
    size_t i = 0;
    int rc = EXIT_OK;

    if (!s->sparse)
        return sink_write(s, p, off, len);
    while (rc == EXIT_OK && i < len) {
        size_t run = zero_run(p + i, len - i, 0);
        rc = sink_write(s, p + i, off + i, run);
        i += run;
        i += zero_run(p + i, len - i, 1);
    }
    return rc;
}

static int copy_mapped(plx_vdi *v, plx_store *st, const struct sink *s, unsigned char *buf,
                       uint64_t off, uint64_t len)
{
    int rc = EXIT_OK;

    while (rc == EXIT_OK && len > 0) {
        size_t n = len < EXPORT_CHUNK ? (size_t)len : EXPORT_CHUNK;
        int err = plx_vdi_pread(v, buf, off, n);
        if (err < 0)
            return cli_engine_error(st, err);
        rc = sink_chunk(s, buf, off, n);
        off += n;
        len -= n;
        progress_bytes(s->prog, off, s->size);
    }
    return rc;
}

static int export_vdi(plx_vdi *v, plx_store *st, const struct sink *s, unsigned char *buf)
{
    uint64_t size = plx_vdi_size(v), off = 0;
    int rc = EXIT_OK;

    while (rc == EXIT_OK && off < size) {
        uint64_t run;
        int mapped = plx_vdi_block_status(v, off, size - off, &run);
        if (mapped < 0)
            return cli_engine_error(st, mapped);
        if (run == 0 || run > size - off)
            return cli_error("export: block status for offset %llu made no sense (run %llu)",
                             (unsigned long long)off, (unsigned long long)run);
        rc = mapped ? copy_mapped(v, st, s, buf, off, run) : sink_zeros(s, off, run);
        off += run;
        progress_bytes(s->prog, off, size);
    }
    progress_end(s->prog);
    return rc;
}

static int open_sink(struct sink *s, const char *file, uint64_t size)
{
    struct stat sb;

    s->name = file;
    if (strcmp(file, "-") == 0) {
        s->fd = STDOUT_FILENO;
        s->name = "stdout";
        return EXIT_OK;
    }
    s->fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (s->fd < 0 || fstat(s->fd, &sb) < 0)
        return cli_error("%s: %s", file, strerror(errno));
    s->seekable = S_ISREG(sb.st_mode) || S_ISBLK(sb.st_mode);
    if (S_ISREG(sb.st_mode)) {
        if (ftruncate(s->fd, (off_t)size) < 0)
            return cli_error("%s: setting size: %s", file, strerror(errno));
        s->sparse = 1;
    }
    return EXIT_OK;
}

static int close_sink(const struct sink *s, int rc)
{
    /* Errors of delayed writes (NFS, quotas) may only show at close. */
    if (s->fd >= 0 && s->fd != STDOUT_FILENO && close(s->fd) < 0 && rc == EXIT_OK)
        return cli_error("closing %s: %s", s->name, strerror(errno));
    return rc;
}

static int export_to(plx_store *st, const char *spec, const char *file, int quiet)
{
    struct progress prog;
    struct sink s = {.fd = -1, .prog = &prog};
    plx_vdi *v;
    char why[PATH_MAX + 128];
    /* Checked before the target is opened (and truncated): stdout too, which the shell may have
     * pointed at the store. */
    int err =
        plx_store_path_conflict(st, strcmp(file, "-") == 0 ? "/dev/stdout" : file, why, sizeof why);
    if (err > 0)
        return cli_error("vdi-export: %s: writing the image there would destroy it; nothing was "
                         "written",
                         why);
    err = plx_vdi_open(st, spec, PLX_OPEN_READONLY, &v);

    if (err < 0)
        return cli_engine_error(st, err);
    progress_init(&prog, "vdi-export", quiet);
    s.size = plx_vdi_size(v);
    unsigned char *buf = malloc(EXPORT_CHUNK);
    int rc = buf != NULL ? open_sink(&s, file, plx_vdi_size(v))
                         : cli_error("vdi-export: %s", strerror(ENOMEM));
    if (rc == EXIT_OK)
        rc = export_vdi(v, st, &s, buf);
    rc = close_sink(&s, rc);
    free(buf);
    err = plx_vdi_close(v);
    return err < 0 && rc == EXIT_OK ? cli_engine_error(st, err) : rc;
}

/* The store is opened for writing, though nothing of it changes, so that the open of the VDI
 * or snapshot records its hold (docs/DESIGN.md, "Readers hold what they read"): a gc elsewhere
 * then keeps the tree while the export reads it, even if it is deleted meanwhile. Read-only only
 * when the medium cannot be written. */
static int store_writable(const struct cli_ctx *ctx)
{
    const char *path = NULL;
    if (cli_blockstore(ctx, &path) != EXIT_OK || plx_blockstore_is_url(path) ||
        access(path, W_OK) == 0)
        return 1; /* the open reports what is wrong */
    fprintf(stderr,
            "parallax: vdi-export: warning: %s is read-only here: the export does not hold what "
            "it reads, and a gc elsewhere after a delete of it would change the image under it\n",
            path);
    return 0;
}

int cmd_vdi_export(struct cli_ctx *ctx, int argc, char **argv)
{
    int quiet = 0;
    const struct cli_opt opts[] = {{"quiet", 0, NULL, &quiet}, {0}};
    const char *pos[2];
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, pos, 2, 2);

    if (rc == EXIT_OK)
        rc = cli_open_store_aio(ctx, !store_writable(ctx), &st);
    if (rc != EXIT_OK)
        return rc;
    return cli_close_store(st, export_to(st, pos[0], pos[1], quiet));
}
