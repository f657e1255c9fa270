/*
 * format.c - making a new blockstore (plx_format): plan the geometry, check everything, then
 * write the catalogue, the state block and, last, the superblock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine.h"

/* ---- Format ------------------------------------------------------------------------------------ */

static int write_block_sync(plx_backend *be, uint64_t block, void *buf)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_WRITE, block, 1, buf, 0);
}

static int read_block_sync(plx_backend *be, uint64_t block, void *buf)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_READ, block, 1, buf, 0);
}

static int flush_sync(plx_backend *be)
{
    plx_store tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = be;
    return plx_sync_io(&tmp, PLX_IO_FLUSH, 0, 0, NULL, 0);
}

static void make_uuid(uint8_t uuid[16])
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, uuid, 16) != 16) {
        uint64_t t = plx_now_ns() ^ ((uint64_t)getpid() << 32);
        memcpy(uuid, &t, 8);
        memcpy(uuid + 8, &t, 8);
    }
    if (fd >= 0)
        close(fd);
}

/* "64 MiB", "1.5 GiB": sizes in messages. */
static void size_text(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    unsigned u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && bytes >= (1ull << (10 * (u + 1))))
        u++;
    double v = (double)bytes / (double)(1ull << (10 * u));
    snprintf(buf, len, v == (double)(uint64_t)v ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* The extent size `format` picks when none is given: about 32 extents, between 1 MiB and 2 GiB.
 * Each process that writes allocates in a metadata and a data extent of its own, so a store
 * needs several extents per engine that shares it, not three huge ones. */
uint64_t plx_default_extent_size(uint64_t store_bytes)
{
    uint64_t e = PLX_MIN_EXTENT_SIZE;
    while (e < PLX_DEFAULT_EXTENT_SIZE && e * 2 <= store_bytes / 32)
        e *= 2;
    return e;
}

/* Lay out a store of `bytes` in extents of `extent_size` (0 = default) into *sb, or say in
 * errbuf why it cannot be done. Touches nothing. */
static int plan_geometry(const char *desc, uint64_t bytes, uint64_t extent_size,
                         struct plx_superblock *sb, char *errbuf, size_t errlen)
{
    char have[32], want[32];
    if (extent_size == 0)
        extent_size = plx_default_extent_size(bytes);
    if (extent_size < PLX_MIN_EXTENT_SIZE || (extent_size & (extent_size - 1))) {
        plx_set_errbuf(errbuf, errlen, "extent size %llu: must be a power of two of at least 1 MiB",
                   (unsigned long long)extent_size);
        return -EINVAL;
    }
    uint64_t eb = extent_size / PLX_BLOCK_SIZE;
    uint64_t extents = bytes / PLX_BLOCK_SIZE / eb;
    if (extents < 3) {
        size_text(bytes, have, sizeof have);
        size_text(extent_size, want, sizeof want);
        plx_set_errbuf(errbuf, errlen,
                   "%s: %s holds fewer than 3 extents of %s (one system, one metadata, one "
                   "data); give a smaller --extent-size (at least 1M), or a larger --size",
                   desc, have, want);
        return -EINVAL;
    }
    if (extents * eb > (1ull << 48)) {
        plx_set_errbuf(errbuf, errlen, "%s: larger than the format's 2^48 blocks", desc);
        return -EFBIG;
    }
    memset(sb, 0, sizeof *sb);
    sb->version = PLX_FORMAT_VERSION;
    sb->block_size = PLX_BLOCK_SIZE;
    sb->extent_blocks = eb;
    sb->extent_count = extents;
    sb->block_count = extents * eb;
    sb->state_block = 1;
    sb->catalogue_start = 2;
    sb->catalogue_blocks = (extents + PLX_CATALOG_PER_BLOCK - 1) / PLX_CATALOG_PER_BLOCK;
    sb->registry_start = sb->catalogue_start + sb->catalogue_blocks;
    if (sb->registry_start > eb) {
        plx_set_errbuf(errbuf, errlen,
                   "%s: %llu extents are too many for extents of %llu KiB: no room for the "
                   "extent catalogue in extent 0; give a larger --extent-size",
                   desc, (unsigned long long)extents, (unsigned long long)(extent_size >> 10));
        return -EINVAL;
    }
    /* Version 2 keeps VDI records in metadata extents (FORMAT.md §7): no slots in extent 0. */
    sb->registry_slots = 0;
    return 0;
}

/* Does block 0 of `be` hold a Parallax superblock? 1 yes, 0 no, negative errno if unreadable. */
static int holds_superblock(plx_backend *be)
{
    if (be->nblocks == 0)
        return 0;
    uint8_t *buf = plx_block_alloc(1);
    int rc = read_block_sync(be, 0, buf);
    if (rc == 0)
        rc = ((struct plx_blkhdr *)buf)->magic == PLX_MAGIC_SUPER;
    plx_block_free(buf);
    return rc;
}

static int format_backend(plx_backend *be, uint64_t extent_size, int force, char *errbuf,
                          size_t errlen)
{
    struct plx_superblock keep;
    int rc = plan_geometry(be->desc, be->nblocks * PLX_BLOCK_SIZE, extent_size, &keep, errbuf,
                           errlen);
    if (rc)
        return rc;
    rc = holds_superblock(be);
    if (rc > 0 && !force) {
        plx_set_errbuf(errbuf, errlen, "%s already holds a Parallax blockstore (use --force)",
                   be->desc);
        return -EEXIST;
    }
    rc = rc < 0 ? rc : 0;
    keep.created_ns = plx_now_ns();
    make_uuid(keep.uuid);
    uint64_t extents = keep.extent_count;
    uint8_t *buf = plx_block_alloc(1);

    /* Catalogue and state first, superblock last: a crash while formatting leaves no valid
     * superblock, never a superblock over a half-written catalogue. */
    for (uint64_t b = 0; b < keep.catalogue_blocks && rc == 0; b++) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        struct plx_catalog_block *cb = (struct plx_catalog_block *)buf;
        cb->first_extent = b * PLX_CATALOG_PER_BLOCK;
        uint64_t left = extents - cb->first_extent;
        cb->count = (uint32_t)(left < PLX_CATALOG_PER_BLOCK ? left : PLX_CATALOG_PER_BLOCK);
        if (b == 0)
            cb->entries[0].type = PLX_EXTENT_SYSTEM;
        plx_blkhdr_seal(buf, PLX_MAGIC_CATALOG, keep.catalogue_start + b);
        rc = write_block_sync(be, keep.catalogue_start + b, buf);
    }
    if (rc == 0) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        struct plx_state_block *s = (struct plx_state_block *)buf;
        s->seq = 1;
        s->next_vdi_id = 1;
        plx_blkhdr_seal(buf, PLX_MAGIC_STATE_V2, keep.state_block);
        rc = write_block_sync(be, keep.state_block, buf);
    }
    if (rc == 0)
        rc = flush_sync(be);
    if (rc == 0) {
        memset(buf, 0, PLX_BLOCK_SIZE);
        memcpy(buf, &keep, sizeof keep);
        plx_blkhdr_seal(buf, PLX_MAGIC_SUPER, 0);
        rc = write_block_sync(be, 0, buf);
    }
    if (rc == 0)
        rc = flush_sync(be);
    if (rc)
        plx_set_errbuf(errbuf, errlen, "formatting %s: %s", be->desc, strerror(-rc));
    plx_block_free(buf);
    return rc;
}

int plx_format_backend(plx_backend *be, uint64_t extent_size, char *errbuf, size_t errlen)
{
    return format_backend(be, extent_size, 1, errbuf, errlen);
}

/* Is there a Parallax superblock at the start of `path`? Read-only look. */
static int path_holds_superblock(const char *path, char *errbuf, size_t errlen)
{
    int err = 0;
    plx_backend *be =
        plx_backend_file_open(path, PLX_BACKEND_BLOCKING | PLX_BACKEND_RDONLY, &err, errbuf, errlen);
    if (!be)
        return err;
    int rc = holds_superblock(be);
    be->ops->destroy(be);
    if (rc < 0)
        plx_set_errbuf(errbuf, errlen, "reading the start of %s: %s", path, strerror(-rc));
    return rc;
}

/* Nothing is changed (no file created, resized or written) until every check has passed: a
 * refused format leaves what was there exactly as it was. */
/* A medium named by a URL (an iSCSI LUN: plx_blockstore_is_url) exists by itself and has the
 * size it has: format all of it, or its first `size` bytes. */
static int format_url(const char *url, uint64_t size, uint64_t extent_size, int force, char *errbuf,
                      size_t errlen)
{
    int err = 0;
    plx_backend *be = plx_backend_open(url, PLX_BACKEND_BLOCKING, &err, errbuf, errlen);
    if (!be)
        return err;
    if (size / PLX_BLOCK_SIZE > be->nblocks) {
        plx_set_errbuf(errbuf, errlen, "%s: --size %llu bytes is more than the LUN's %llu bytes",
                       be->desc, (unsigned long long)size,
                       (unsigned long long)(be->nblocks * PLX_BLOCK_SIZE));
        be->ops->destroy(be);
        return -ENOSPC;
    }
    if (size)
        be->nblocks = size / PLX_BLOCK_SIZE;
    int rc = format_backend(be, extent_size, force, errbuf, errlen);
    be->ops->destroy(be);
    return rc;
}

int plx_format(const char *path, uint64_t size, uint64_t extent_size, int force, char *errbuf,
               size_t errlen)
{
    if (plx_blockstore_is_url(path))
        return format_url(path, size, extent_size, force, errbuf, errlen);
    struct stat sbuf;
    bool exists = stat(path, &sbuf) == 0;
    if (!exists && errno != ENOENT) {
        plx_set_errbuf(errbuf, errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    if (!exists && size == 0) {
        plx_set_errbuf(errbuf, errlen, "%s does not exist: give --size to create it", path);
        return -EINVAL;
    }
    if (exists && !S_ISREG(sbuf.st_mode) && !S_ISBLK(sbuf.st_mode)) {
        plx_set_errbuf(errbuf, errlen, "%s is neither a regular file nor a block device", path);
        return -EINVAL;
    }
    bool resize = exists && S_ISREG(sbuf.st_mode) && size && (uint64_t)sbuf.st_size != size;
    int rc;
    if (exists) {
        rc = path_holds_superblock(path, errbuf, errlen);
        if (rc < 0)
            return rc;
        if (rc > 0 && !force) {
            plx_set_errbuf(errbuf, errlen, "%s already holds a Parallax blockstore (use --force)",
                       path);
            return -EEXIST;
        }
    }
    /* The geometry of what the store will be, checked before anything changes. A device keeps
     * its size; the file backend rounds down to whole blocks, as here. */
    uint64_t bytes = size;
    if (exists && !resize) {
        if (S_ISREG(sbuf.st_mode)) {
            bytes = (uint64_t)sbuf.st_size;
        } else {
            int err = 0;
            plx_backend *be = plx_backend_file_open(
                path, PLX_BACKEND_BLOCKING | PLX_BACKEND_RDONLY, &err, errbuf, errlen);
            if (!be)
                return err;
            bytes = be->nblocks * PLX_BLOCK_SIZE;
            be->ops->destroy(be);
        }
    }
    struct plx_superblock plan;
    rc = plan_geometry(path, bytes, extent_size, &plan, errbuf, errlen);
    if (rc)
        return rc;

    if (!exists) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
            int e = errno;
            plx_set_errbuf(errbuf, errlen, "creating %s: %s", path, strerror(e));
            if (fd >= 0) {
                close(fd);
                unlink(path);
            }
            return -e;
        }
        close(fd);
    } else if (resize && truncate(path, (off_t)size) != 0) {
        plx_set_errbuf(errbuf, errlen, "resizing %s: %s", path, strerror(errno));
        return -errno;
    }
    int err = 0;
    /* Formatting is one block at a time anyway: no aio context to tear down afterwards. */
    plx_backend *be = plx_backend_file_open(path, PLX_BACKEND_BLOCKING, &err, errbuf, errlen);
    if (!be) {
        rc = err;
    } else {
        rc = format_backend(be, extent_size, force, errbuf, errlen);
        be->ops->destroy(be);
    }
    if (rc && !exists)
        unlink(path); /* leave no half-made file behind */
    return rc;
}
