/*
 * medium_path.c - is a path the store's medium? Writing a file that is the blockstore (or lies on
 * its device) destroys the store; the write cache refuses such a log, and vdi-export such a
 * target. One rule for both, here.
 *
 * A path reaches the same bytes as the store when it is the same file or device (also through
 * symlinks and bind mounts: same device and inode), a file on the store's block device, a loop
 * device backed by the store's file (or the store a loop device and the path its backing file),
 * or a partition of the store's disk (or the store a partition and the path its whole disk).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>

#include "engine.h"
#include "format.h"
#include "medium_path.h"
#include "wlog.h"

/* What a path stands on, as up to three identities: itself; for a loop device, its backing
 * file; for a partition, its whole disk (a device number); for a whole disk, none more. */
struct medium_ids {
    struct stat self;
    bool has_backing; /* a loop device's backing file */
    struct stat backing;
    dev_t disk; /* a partition's disk, else 0 */
};

/* The first line of a sysfs file, without its newline; 0 or -1. */
static int read_sysfs(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char *ok = fgets(buf, (int)len, f);
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static int medium_ids(const char *path, struct medium_ids *m)
{
    memset(m, 0, sizeof *m);
    if (stat(path, &m->self) != 0)
        return -1;
    if (!S_ISBLK(m->self.st_mode))
        return 0;
    char sys[128], line[4096];
    unsigned maj = major(m->self.st_rdev), min = minor(m->self.st_rdev);
    snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u/loop/backing_file", maj, min);
    if (read_sysfs(sys, line, sizeof line) == 0 && stat(line, &m->backing) == 0)
        m->has_backing = true;
    /* A partition's directory sits inside its disk's: /sys/dev/block/M:m/../dev is the disk. */
    snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u/partition", maj, min);
    if (read_sysfs(sys, line, sizeof line) == 0) {
        unsigned dmaj, dmin;
        snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u/../dev", maj, min);
        if (read_sysfs(sys, line, sizeof line) == 0 && sscanf(line, "%u:%u", &dmaj, &dmin) == 2)
            m->disk = makedev(dmaj, dmin);
    }
    return 0;
}

static bool same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Does writing `b` reach the bytes of the file or device `a` (one direction)? */
static bool reaches(const struct medium_ids *a, const struct medium_ids *b)
{
    if (same_inode(&a->self, &b->self))
        return true;
    if (b->has_backing && same_inode(&a->self, &b->backing))
        return true; /* b is a loop device over the file a */
    if (S_ISBLK(a->self.st_mode)) {
        dev_t dev = a->self.st_rdev;
        if (!S_ISBLK(b->self.st_mode) && b->self.st_dev == dev)
            return true; /* b is a file in a file system on the device a */
        if (S_ISBLK(b->self.st_mode) && (b->self.st_rdev == dev || a->disk == b->self.st_rdev))
            return true; /* the same device; or a is a partition and b its disk */
    }
    return false;
}

bool plx_path_on_medium(const char *medium, const char *path)
{
    struct medium_ids m, p;
    if (medium_ids(medium, &m) != 0 || medium_ids(path, &p) != 0)
        return false;
    return reaches(&m, &p) || reaches(&p, &m);
}

/* Does the file start with a write log's head block? Any process's log, attached or not. */
static bool holds_write_log(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < PLX_BLOCK_SIZE)
        return false;
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    void *head = plx_block_alloc(1);
    const char *why = NULL;
    bool is_log = head && fread(head, 1, PLX_BLOCK_SIZE, f) == PLX_BLOCK_SIZE &&
                  plx_blkhdr_verify(head, PLX_MAGIC_WLOG_HEAD, 0, &why) == 0;
    plx_block_free(head);
    fclose(f);
    return is_log;
}

int plx_store_path_conflict(plx_store *st, const char *path, char *why, size_t len)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        len = sizeof scratch;
    }
    *why = '\0';
    if (plx_path_on_medium(st->be->desc, path)) {
        snprintf(why, len, "%s is the blockstore itself (or on its device)", path);
        return 1;
    }
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    if (ws.attached && plx_path_on_medium(ws.desc, path)) {
        snprintf(why, len, "%s is the write log of this blockstore", path);
        return 1;
    }
    if (holds_write_log(path)) {
        snprintf(why, len, "%s is a Parallax write log (a server's or tapdisk's write cache)",
                 path);
        return 1;
    }
    return 0;
}
