/*
 * signature.c - what a file or device already holds, for `parallax format` to refuse without
 * --force, as mkfs and `zpool create` do.
 *
 * File systems, swap, LVM and RAID members, encrypted volumes and partition tables are found by
 * libblkid (util-linux, the library mkfs uses). libblkid does not know the disk image formats
 * of emulators (qcow2, VHD, VMDK, ...): those are the magic numbers below, from each format's
 * published specification.
 */
#include "signature.h"

#include <blkid/blkid.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct image_magic {
    const char *what;
    long offset; /* from the start; negative: from the end */
    const char *magic;
    size_t len;
};

static const struct image_magic image_magics[] = {
    {"a qcow2 image", 0, "QFI\xfb", 4},
    {"a QED image", 0, "QED\0", 4},
    {"a VMDK image", 0, "KDMV", 4},
    {"a VMDK image", 0, "# Disk DescriptorFile", 21},
    {"a VHDX image", 0, "vhdxfile", 8},
    {"a VirtualBox VDI image", 0x40, "\x7f\x10\xda\xbe", 4},
    /* VHD: the footer is the last 512 bytes; a dynamic disk has a copy at the start. */
    {"a VHD image", 0, "conectix", 8},
    {"a VHD image", -512, "conectix", 8},
};

static int read_at(int fd, off_t off, void *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len, off);
    return n == (ssize_t)len ? 0 : -1;
}

static const char *image_format(int fd, off_t size)
{
    char buf[32];
    for (size_t i = 0; i < sizeof image_magics / sizeof image_magics[0]; i++) {
        const struct image_magic *m = &image_magics[i];
        off_t off = m->offset >= 0 ? m->offset : size + m->offset;
        if (off < 0 || off + (off_t)m->len > size)
            continue;
        if (read_at(fd, off, buf, m->len) == 0 && memcmp(buf, m->magic, m->len) == 0)
            return m->what;
    }
    return NULL;
}

/* libblkid's TYPE and USAGE (or PTTYPE) in words. */
static void describe_blkid(blkid_probe pr, char *out, size_t len)
{
    const char *type = NULL, *usage = NULL;
    if (blkid_probe_lookup_value(pr, "PTTYPE", &type, NULL) == 0) {
        snprintf(out, len, "a %s partition table", type);
        return;
    }
    if (blkid_probe_lookup_value(pr, "TYPE", &type, NULL) != 0)
        type = "unknown";
    if (blkid_probe_lookup_value(pr, "USAGE", &usage, NULL) != 0)
        usage = "";
    if (strcmp(type, "swap") == 0)
        snprintf(out, len, "swap space");
    else if (strcmp(type, "LVM2_member") == 0 || strcmp(type, "LVM1_member") == 0)
        snprintf(out, len, "an LVM physical volume");
    else if (strcmp(usage, "filesystem") == 0)
        snprintf(out, len, "%s %s file system", strchr("aeiou", type[0]) ? "an" : "a", type);
    else if (strcmp(usage, "raid") == 0)
        snprintf(out, len, "a RAID member (%s)", type);
    else if (strcmp(usage, "crypto") == 0)
        snprintf(out, len, "an encrypted volume (%s)", type);
    else
        snprintf(out, len, "a %s signature", type);
}

static int probe_blkid(const char *path, char *what, size_t len)
{
    blkid_probe pr = blkid_new_probe_from_filename(path);
    if (pr == NULL)
        return -errno ? -errno : -EIO;
    blkid_probe_enable_superblocks(pr, 1);
    blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_USAGE);
    blkid_probe_enable_partitions(pr, 1);
    blkid_probe_set_partitions_flags(pr, BLKID_PARTS_MAGIC);
    int rc = blkid_do_safeprobe(pr);
    if (rc == 0)
        describe_blkid(pr, what, len);
    else if (rc == -2)
        snprintf(what, len, "signatures of more than one kind (see 'wipefs %s')", path);
    blkid_free_probe(pr);
    if (rc == 1)
        return 0;
    return rc == -1 ? -EIO : 1;
}

int signature_probe(const char *path, char *what, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    struct stat sb;
    off_t size = 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        size = sb.st_size;
    else
        size = lseek(fd, 0, SEEK_END);
    const char *image = size > 0 ? image_format(fd, size) : NULL;
    close(fd);
    if (image != NULL) {
        snprintf(what, len, "%s", image);
        return 1;
    }
    return size > 0 ? probe_blkid(path, what, len) : 0;
}
