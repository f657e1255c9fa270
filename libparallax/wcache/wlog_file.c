/*
 * wlog_file.c - the write cache's public calls (layer 7): attach a log file with the checks a
 * local log needs, turn the cache on and off for a VDI, report its state, and discard what a lost
 * log held. The log itself is wlog.c and the files
 * wlog_shared.h lists.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "lock.h"
#include "medium_path.h"
#include "registry.h"
#include "vdi.h"
#include "wlog.h"

#define TMPFS_MAGIC_ 0x01021994
#define RAMFS_MAGIC_ 0x858458f6

/* The filesystem type holding path (or its directory, when path does not exist yet). */
static long fs_type(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) == 0)
        return (long)sf.f_type;
    char *copy = strdup(path);
    long t = copy && statfs(dirname(copy), &sf) == 0 ? (long)sf.f_type : 0;
    free(copy);
    return t;
}

/* Write zeros over the whole file, O_DIRECT (not through the page cache). 0 or an errno. */
static int write_through(const char *path, uint64_t size)
{
    enum { CHUNK = 1 << 20 };
    int fd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0)
        return errno == EINVAL ? 0 : errno; /* no O_DIRECT here: keep the reserved space */
    void *z = NULL;
    int e = posix_memalign(&z, PLX_BLOCK_SIZE, CHUNK);
    if (!e) {
        memset(z, 0, CHUNK);
        for (uint64_t o = 0; !e && o < size;) {
            ssize_t n = pwrite(fd, z, size - o < CHUNK ? (size_t)(size - o) : CHUNK, (off_t)o);
            if (n < 0 && errno != EINTR)
                e = errno;
            else if (n > 0)
                o += (uint64_t)n;
        }
    }
    free(z);
    close(fd);
    return e;
}

/* The temporary name a new log is made under: ".NAME.parallax-new" beside it. */
static int temp_name(const char *path, char *out, size_t len)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    int dirlen = slash ? (int)(slash - path + 1) : 0;
    int n = snprintf(out, len, "%.*s.%s.parallax-new", dirlen, path, base);
    return n > 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

/* Make the directory entry of a rename durable. */
static int sync_dir_of(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int e = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return e;
}

/* Create the log file with its space reserved, so a full disk shows now and not as a failed
 * write later, and written through once: space that posix_fallocate reserves is "unwritten", and
 * the first write of each region converts it in the filesystem's journal, where it waits behind
 * other files' commits (the store's, when it is on the same filesystem). Measured on ext4 with
 * QD1 writes through the cache against a store file on the same disk, in three interleaved
 * pairs: median 150-317 us fallocated only, 66-125 us written through (bench/notes/wcache.md). The
 * price: creating a log writes its whole size once.
 *
 * All of it happens under a temporary name, and the file takes the log's name only with its head
 * written and synced: a process killed meanwhile (or a power cut) leaves no half-made file that
 * the next start would refuse as "not a write log" (tests/integration/wcache_create_crash.sh).
 * A leftover temporary file never held a record; the next creation removes it. */
static int create_log(plx_store *st, const char *path, uint64_t size)
{
    char tmp[PATH_MAX];
    if (temp_name(path, tmp, sizeof tmp))
        return plx_err(st, -ENAMETOOLONG, "write log %s: name too long", path);
    unlink(tmp); /* a creation that was killed */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return plx_err(st, -errno, "creating write log %s: %s", tmp, strerror(errno));
    int e = posix_fallocate(fd, 0, (off_t)size);
    if (e == EINVAL || e == EOPNOTSUPP)
        e = ftruncate(fd, (off_t)size) == 0 ? 0 : errno;
    if (!e)
        e = write_through(tmp, size);
    void *head = e ? NULL : plx_block_alloc(1);
    if (!e && !head)
        e = ENOMEM;
    if (!e) {
        plx_wlog_head_init(st, head, size / PLX_BLOCK_SIZE);
        if (pwrite(fd, head, PLX_BLOCK_SIZE, 0) != PLX_BLOCK_SIZE)
            e = errno ? errno : EIO;
    }
    plx_block_free(head);
    if (!e && fsync(fd) != 0)
        e = errno;
    close(fd);
    /* No replacing: a log that appeared under the name meanwhile is somebody's. */
    if (!e && renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0)
        e = errno;
    if (!e)
        e = sync_dir_of(path);
    if (e) {
        unlink(tmp);
        if (e == ENOSPC)
            return plx_err(st, -ENOSPC,
                           "write log %s: the disk has no room for %llu MiB (nothing was "
                           "created; give a smaller size: serve's --write-cache-size, cache's "
                           "--size, tapdisk's write-cache-size=; or free some space)",
                           path, (unsigned long long)(size >> 20));
        return plx_err(st, -e, "write log %s: creating %llu MiB: %s", path,
                       (unsigned long long)(size >> 20), strerror(e));
    }
    return 0;
}

int plx_wcache_attach(plx_store *st, const char *path, uint64_t size)
{
    if (st->wlog)
        return plx_err(st, -EBUSY, "a write log is already attached to this store");
    if (size % PLX_BLOCK_SIZE)
        return plx_err(st, -EINVAL, "write log size %llu is not a multiple of 4 KiB",
                       (unsigned long long)size);
    long t = fs_type(path);
    if (t == TMPFS_MAGIC_ || t == RAMFS_MAGIC_)
        return plx_err(st, -EINVAL,
                       "write log %s is on %s: it would vanish with a crash or reboot, and with "
                       "it writes already acknowledged; put it on this host's own disk",
                       path, t == TMPFS_MAGIC_ ? "tmpfs" : "ramfs");
    if (plx_path_on_medium(st->be->desc, path))
        return plx_err(st, -EINVAL,
                       "write log %s is on the blockstore itself: the cache must be on this "
                       "host's own disk",
                       path);
    struct stat sb;
    bool fresh = stat(path, &sb) != 0;
    if (fresh) {
        int rc = create_log(st, path, size ? size : PLX_WCACHE_DEFAULT_SIZE);
        if (rc)
            return rc;
    } else if (size && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size != size) {
        return plx_err(st, -EINVAL,
                       "write log %s exists with %llu MiB, not the %llu MiB asked for (a log "
                       "keeps its size: drain it with 'cache disable' and remove it first)",
                       path, (unsigned long long)(sb.st_size >> 20),
                       (unsigned long long)(size >> 20));
    }
    /* One process per log: a second one would replay and overwrite what the first writes. */
    int lock_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (lock_fd >= 0)
            close(lock_fd);
        return plx_err(st, e == EWOULDBLOCK ? -EBUSY : -e, "write log %s: %s", path,
                       e == EWOULDBLOCK ? "another process has it attached" : strerror(e));
    }
    int err = 0;
    char msg[256] = "";
    /* Through the page cache (docs/DESIGN.md, "The write cache": the log file); for
     * measurements, $PARALLAX_WCACHE_DIRECT=1 writes it O_DIRECT as before. */
    const char *direct = getenv("PARALLAX_WCACHE_DIRECT");
    unsigned flags = direct && !strcmp(direct, "1") ? 0 : PLX_BACKEND_BUFFERED;
    plx_backend *be = plx_backend_file_open(path, flags, &err, msg, sizeof msg);
    if (!be) {
        close(lock_fd);
        if (fresh)
            unlink(path);
        return plx_err(st, err ? err : -EIO, "write log: %s", msg);
    }
    int rc = plx_wlog_attach(st, be, fresh, path);
    if (rc) {
        close(lock_fd);
        if (fresh)
            unlink(path);
        return rc;
    }
    plx_wlog_keep_fd(st, lock_fd);
    /* Diagnostics and tests: hold the drain, so the log fills and stays full. */
    const char *hold = getenv("PARALLAX_WCACHE_HOLD_DRAIN");
    if (hold && !strcmp(hold, "1"))
        plx_wlog_pause_drain(st, 1);
    return 0;
}

int plx_vdi_wcache(plx_vdi *v, int on)
{
    return on ? plx_wlog_vdi_enable(v) : plx_wlog_vdi_disable(v);
}

int plx_vdi_wcache_on(const plx_vdi *v)
{
    return v->wc != NULL;
}

int plx_wcache_status(plx_store *st, struct plx_wcache_status *out)
{
    memset(out, 0, sizeof *out);
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    if (!ws.attached)
        return 0;
    out->attached = 1;
    out->failed = ws.failed;
    out->log_bytes = ws.log_bytes;
    out->used_bytes = ws.used_bytes;
    out->backlog_bytes = ws.backlog_bytes;
    out->backlog_records = ws.backlog_records;
    out->drained_bytes = ws.drained_bytes;
    out->replayed_records = ws.replayed_records;
    double secs = (double)(plx_now_ns() - ws.attach_ns) / 1e9;
    out->drain_rate = secs > 0 ? (double)ws.drained_bytes / secs : 0;
    for (const struct plx_vdi *v = st->vdis; v; v = v->next)
        if (v->wc)
            out->vdis_cached++;
    snprintf(out->path, sizeof out->path, "%s", ws.desc);
    snprintf(out->error, sizeof out->error, "%s", ws.error);
    return 0;
}

int plx_vdi_wcache_discard(plx_store *st, const char *vdi)
{
    int rc = plx_admin_lock_writable(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    uint64_t slot;
    rc = plx_registry_find(st, vdi, &rec, &slot);
    if (!rc)
        rc = plx_record_unwritten(st, &rec, ": close it first");
    if (!rc && !rec.wlog_id)
        rc = plx_err(st, -ENOENT, "VDI %s has no writes waiting in a write log", rec.name);
    if (!rc) {
        rec.wlog_host = rec.wlog_id = 0;
        rc = plx_registry_write(st, slot, &rec);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    }
    plx_admin_unlock(st);
    return rc;
}

int plx_wcache_drain_status(plx_store *st, struct plx_wcache_drain *out)
{
    if (!out || out->struct_size < offsetof(struct plx_wcache_drain, oldest_ms) + sizeof(uint64_t))
        return -EINVAL;
    struct plx_wcache_drain d = {.struct_size = out->struct_size};
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    if (ws.attached) {
        static const char *const state[] = {"idle",   "running", "deferred",
                                            "paused", "eager",   "stopped"};
        snprintf(d.state, sizeof d.state, "%s", state[ws.drain]);
        d.delay_ms = ws.drain_delay_ms;
        d.max_age_ms = ws.drain_max_age_ms;
        d.oldest_ms = ws.oldest_ms;
        d.logged_bytes = ws.logged_bytes;
        d.zc_bytes = ws.zc_bytes;
        d.zc_records = ws.zc_records;
    }
    /* Fields beyond the caller's struct_size (an older caller) are not written. */
    memcpy(out, &d, out->struct_size < sizeof d ? out->struct_size : sizeof d);
    return 0;
}
