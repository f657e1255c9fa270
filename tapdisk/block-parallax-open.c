/*
 * block-parallax-open.c - what opening a tapdisk disk sets up (block-parallax.h): the store the
 * disks of one tapdisk on the same blockstore share (one engine per blockstore per process, see
 * block-parallax.c), the disk's parameters, the write cache attached to the store and its
 * automatic mode's timer, and the control socket served from tapdisk's scheduler while a
 * writable disk is open.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "block-parallax.h"

#define PLX_TD_CONF_DEFAULT "/etc/parallax/blockstore"

static struct plx_td_store *plx_td_stores;
static unsigned plx_td_control_users; /* writable disks open: the control socket runs while > 0 */

/* ---- Stores --------------------------------------------------------------------------------- */

static int store_open_engine(const char *path, int read_only, plx_store **out, char *err,
                             size_t errlen)
{
    struct plx_open_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.read_only = read_only;
    return plx_store_open(path, &o, out, err, errlen);
}

/* Find or open the process's store for `path`. Opening reads the blockstore synchronously;
 * that is acceptable in open(), which tapdisk calls outside the I/O path (block-vhd reads its
 * headers the same way). */
int plx_td_store_get(const char *path, int want_ro, struct plx_td_store **out)
{
    char real[PATH_MAX];
    if (plx_blockstore_is_url(path))
        snprintf(real, sizeof real, "%s", path); /* a URL (an iSCSI LUN's) names it */
    else if (!realpath(path, real)) {
        int e = errno;
        tlog_syslog(TLOG_WARN, "parallax: blockstore %s: %s", path, strerror(e));
        return -e;
    }
    for (struct plx_td_store *ps = plx_td_stores; ps; ps = ps->next) {
        if (strcmp(ps->path, real) != 0)
            continue;
        if (ps->failed) {
            tlog_syslog(TLOG_WARN, "parallax: blockstore %s has stopped after an error: %s", real,
                        strerror(-ps->failed));
            return ps->failed;
        }
        if (ps->read_only && !want_ro) {
            tlog_syslog(TLOG_WARN,
                        "parallax: blockstore %s is open read-only in this tapdisk; cannot open "
                        "a VDI on it for writing",
                        real);
            return -EROFS;
        }
        ps->refs++;
        *out = ps;
        return 0;
    }

    struct plx_td_store *ps = calloc(1, sizeof *ps);
    if (!ps)
        return -ENOMEM;
    memcpy(ps->path, real, sizeof ps->path);
    ps->event = -1;
    ps->kick_event = -1;
    ps->tick_fd = -1;
    ps->tick_event = -1;
    char err[512] = "";
    /* The store is opened writable even for a read-only disk, so that a writable disk on the
     * same blockstore can share it later; a read-only store only when that is all we may. */
    int rc = store_open_engine(real, 0, &ps->st, err, sizeof err);
    if (rc < 0 && want_ro && (rc == -EACCES || rc == -EPERM || rc == -EROFS)) {
        ps->read_only = 1;
        rc = store_open_engine(real, 1, &ps->st, err, sizeof err);
    }
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: cannot open blockstore %s: %s", real,
                    err[0] ? err : strerror(-rc));
        free(ps);
        return rc;
    }
    event_id_t ev = tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, plx_store_fd(ps->st),
                                                  TV_ZERO, plx_td_store_event, ps);
    if (ev < 0) {
        tlog_syslog(TLOG_WARN, "parallax: cannot register the engine descriptor of %s: %s", real,
                    strerror(-ev));
        plx_store_close(ps->st);
        free(ps);
        return ev;
    }
    ps->event = ev;
    /* The kick (block-parallax.h), off until a request is submitted; $PARALLAX_TD_KICK=0 leaves it
     * out, so that the engine wakes itself per request as before (for comparisons). Without it
     * the store is only slower. */
    const char *kick = getenv("PARALLAX_TD_KICK");
    if (!kick || strcmp(kick, "0") != 0) {
        ps->kick_event = tapdisk_server_register_event(SCHEDULER_POLL_TIMEOUT, -1, TV_INF,
                                                       plx_td_store_kick, ps);
        if (ps->kick_event < 0)
            ps->kick_event = -1;
    }
    /* tapdisk's scheduler services the store whenever its descriptor is readable, the engine's
     * timers included: a loop like a server's engine thread, so a request that needs a new
     * extent waits on it as a request waits (its claim's admin lock too), and the disks served
     * beside it go on (docs/DESIGN.md, Allocator, "On a serving loop"). The pass the call
     * promises is the one right after it. */
    plx_store_will_service(ps->st);
    rc = plx_store_service(ps->st);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: blockstore %s: %s", real, plx_store_errmsg(ps->st));
        tapdisk_server_unregister_event(ev);
        if (ps->kick_event >= 0)
            tapdisk_server_unregister_event(ps->kick_event);
        plx_store_close(ps->st);
        free(ps);
        return rc;
    }
    ps->refs = 1;
    ps->next = plx_td_stores;
    plx_td_stores = ps;
    *out = ps;
    return 0;
}

/* Drop a reference; the last one unregisters the event and closes the engine. Returns 1 when
 * the store was closed (no engine callback can fire any more), 0 otherwise. */
int plx_td_store_put(struct plx_td_store *ps)
{
    if (--ps->refs > 0)
        return 0;
    for (struct plx_td_store **pp = &plx_td_stores; *pp; pp = &(*pp)->next) {
        if (*pp == ps) {
            *pp = ps->next;
            break;
        }
    }
    if (ps->event >= 0)
        tapdisk_server_unregister_event(ps->event);
    if (ps->kick_event >= 0)
        tapdisk_server_unregister_event(ps->kick_event);
    if (ps->tick_event >= 0)
        tapdisk_server_unregister_event(ps->tick_event);
    if (ps->tick_fd >= 0)
        close(ps->tick_fd);
    int rc = plx_store_close(ps->st);
    if (rc < 0)
        tlog_syslog(TLOG_WARN, "parallax: closing blockstore %s: %s", ps->path, strerror(-rc));
    free(ps);
    return 1;
}

void plx_td_store_add_disk(struct plx_td_store *ps, struct plx_td_disk *d)
{
    d->next = ps->disks;
    ps->disks = d;
}

void plx_td_store_remove_disk(struct plx_td_store *ps, struct plx_td_disk *d)
{
    for (struct plx_td_disk **pp = &ps->disks; *pp; pp = &(*pp)->next) {
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    }
}

/* ---- Parameters ----------------------------------------------------------------------------- */

/* Copy src (n bytes) into dst as a string; -ENAMETOOLONG when it does not fit. */
static int copy_str(char *dst, size_t dstlen, const char *src, size_t n)
{
    if (n >= dstlen)
        return -ENAMETOOLONG;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* The configured blockstore: $PARALLAX_BLOCKSTORE, else the first line of the configuration
 * file that is neither empty nor a # comment, trimmed. */
static int default_blockstore(char *out, size_t outlen)
{
    const char *env = getenv("PARALLAX_BLOCKSTORE");
    if (env && *env) {
        int rc = copy_str(out, outlen, env, strlen(env));
        if (rc < 0)
            tlog_syslog(TLOG_WARN, "parallax: PARALLAX_BLOCKSTORE is too long");
        return rc;
    }
    const char *conf = getenv("PARALLAX_BLOCKSTORE_FILE");
    if (!conf || !*conf)
        conf = PLX_TD_CONF_DEFAULT;
    FILE *f = fopen(conf, "re");
    if (!f) {
        int e = errno;
        tlog_syslog(TLOG_WARN,
                    "parallax: no blockstore given (params <blockstore>:<vdi>), "
                    "PARALLAX_BLOCKSTORE unset, and %s: %s",
                    conf, strerror(e));
        return -EINVAL;
    }
    char line[PATH_MAX + 2];
    int rc = -EINVAL;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strlen(p);
        while (n > 0 &&
               (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
            p[--n] = '\0';
        if (n == 0 || p[0] == '#')
            continue;
        rc = copy_str(out, outlen, p, n);
        break;
    }
    fclose(f);
    if (rc == -EINVAL)
        tlog_syslog(TLOG_WARN, "parallax: %s names no blockstore", conf);
    else if (rc < 0)
        tlog_syslog(TLOG_WARN, "parallax: the blockstore named in %s is too long", conf);
    return rc;
}

static int is_existing_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && (S_ISREG(sb.st_mode) || S_ISBLK(sb.st_mode));
}

/* Split params into blockstore and VDI spec.
 *   "<vdi>"               no colon: the configured blockstore
 *   "<blockstore>:<vdi>"  the blockstore is the text before the first colon whose prefix names
 *                         an existing file or block device (paths such as
 *                         /dev/disk/by-path/pci-0000:00:1f.2-ata-1 contain colons, and so may
 *                         snapshot labels); if no prefix exists, the text before the first
 *                         colon (and opening it then fails with its own message)
 *   "iscsi://HOST[:PORT]/IQN/LUN:<vdi>"  a URL (here an iSCSI LUN's): the blockstore ends where
 *                         the URL's form does (plx_blockstore_url_len: after the LUN number)
 * Both parts must be non-empty. */
int plx_td_parse_params(const char *params, char *bs, size_t bslen, char *vdi, size_t vdilen)
{
    static const char syntax[] = "expected parallax:<vdi> or parallax:<blockstore>:<vdi>";
    if (!params || !*params) {
        tlog_syslog(TLOG_WARN, "parallax: empty disk parameters (%s)", syntax);
        return -EINVAL;
    }
    const char *colon = strchr(params, ':');
    if (!colon) {
        if (strchr(params, '/')) {
            tlog_syslog(TLOG_WARN,
                        "parallax: '%s' looks like a path, not a VDI: VDI names contain no '/' "
                        "(%s)",
                        params, syntax);
            return -EINVAL;
        }
        if (copy_str(vdi, vdilen, params, strlen(params)) < 0) {
            tlog_syslog(TLOG_WARN, "parallax: VDI '%s' is too long", params);
            return -EINVAL;
        }
        return default_blockstore(bs, bslen);
    }
    const char *split = colon;
    size_t url_len = plx_blockstore_url_len(params);
    if (url_len > 0)
        split = params[url_len] == ':' ? params + url_len : params + strlen(params);
    for (const char *c = url_len > 0 ? NULL : colon; c; c = strchr(c + 1, ':')) {
        size_t n = (size_t)(c - params);
        if (n == 0 || copy_str(bs, bslen, params, n) < 0)
            continue;
        if (is_existing_file(bs)) {
            split = c;
            break;
        }
    }
    size_t bn = (size_t)(split - params);
    const char *v = split + 1;
    if (bn == 0 || *v == '\0') {
        tlog_syslog(TLOG_WARN, "parallax: malformed disk parameters '%s': %s is empty (%s)", params,
                    bn == 0 ? "the blockstore" : "the VDI", syntax);
        return -EINVAL;
    }
    if (copy_str(bs, bslen, params, bn) < 0 || copy_str(vdi, vdilen, v, strlen(v)) < 0) {
        tlog_syslog(TLOG_WARN, "parallax: disk parameters '%s' are too long", params);
        return -EINVAL;
    }
    return 0;
}

/* Leading "key=value:" options of the params. Only known keys are options, so a blockstore or
 * VDI name is never taken for one: durability=fua|ordered, and the write cache's
 * write-cache=PATH, write-cache-size=SIZE, write-cache-mode=on|auto and
 * write-cache-threshold=MS (plx_wcache_config_set; a PATH has no colon). */
int plx_td_parse_options(const char **params, unsigned *write_flags, struct plx_wcache_config *wc)
{
    static const char durability[] = "durability=";
    *write_flags = PLX_WRITE_FUA;
    memset(wc, 0, sizeof *wc);
    wc->mode = PLX_WCACHE_ON;
    int size_given = 0; /* length of the first write-cache-* setting */
    const char *given = NULL;
    while (*params) {
        const char *opt = *params;
        const char *end = strchr(opt, ':');
        size_t len = end ? (size_t)(end - opt) : strlen(opt);
        char err[4200];
        int rc;
        if (strncmp(opt, durability, sizeof durability - 1) == 0) {
            const char *v = opt + sizeof durability - 1;
            size_t n = len - (sizeof durability - 1);
            if (n == 3 && strncmp(v, "fua", 3) == 0) {
                *write_flags = PLX_WRITE_FUA;
            } else if (n == 7 && strncmp(v, "ordered", 7) == 0) {
                *write_flags = 0;
            } else {
                tlog_syslog(TLOG_WARN, "parallax: durability=%.*s: expected fua or ordered", (int)n,
                            v);
                return -EINVAL;
            }
        } else if ((rc = plx_wcache_config_set(wc, opt, len, err, sizeof err)) < 0) {
            tlog_syslog(TLOG_WARN, "parallax: %s", err);
            return rc;
        } else if (rc == 1) {
            break; /* not an option: the blockstore or the VDI */
        } else if (strncmp(opt, "write-cache-", 12) == 0 && !size_given) {
            size_given = (int)len; /* a setting that needs write-cache=PATH: the first one */
            given = opt;
        }
        if (!end) {
            tlog_syslog(TLOG_WARN, "parallax: %.*s names no VDI", (int)len, opt);
            return -EINVAL;
        }
        *params = end + 1;
    }
    if (size_given && !wc->path[0]) {
        tlog_syslog(TLOG_WARN, "parallax: %.*s needs write-cache=PATH", size_given, given);
        return -EINVAL;
    }
    return 0;
}

/* The write cache's automatic mode: its rule for the store's writable disks, from tapdisk's loop
 * (blocking while it switches, as a `parallax cache` command served here does). */
static void tick_event(event_id_t id, char mode, void *private)
{
    struct plx_td_store *ps = private;
    uint64_t ticks;
    if (read(ps->tick_fd, &ticks, sizeof ticks) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    for (struct plx_td_disk *d = ps->disks; d; d = d->next) {
        if (!d->vdi || d->read_only || d->waiting)
            continue;
        int rc = plx_vdi_wcache_tick(d->vdi);
        if (rc > 0)
            tlog_syslog(TLOG_INFO,
                        "parallax: %s: write cache %s automatically (store write latency "
                        "%.2f ms)",
                        d->vdi_spec, rc == 1 ? "on" : "turning off (draining its last writes)",
                        plx_store_write_latency_ms(ps->st));
        else if (rc < 0)
            tlog_syslog(TLOG_WARN, "parallax: %s: automatic write cache: %s", d->vdi_spec,
                        plx_store_errmsg(ps->st));
    }
}

static int tick_start(struct plx_td_store *ps)
{
    if (ps->tick_fd >= 0)
        return 0;
    ps->tick_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
    if (ps->tick_fd < 0 || timerfd_settime(ps->tick_fd, 0, &its, NULL) != 0) {
        int e = -errno;
        if (ps->tick_fd >= 0)
            close(ps->tick_fd);
        ps->tick_fd = -1;
        return e;
    }
    ps->tick_event =
        tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, ps->tick_fd, TV_ZERO, tick_event, ps);
    if (ps->tick_event < 0) {
        int rc = ps->tick_event;
        ps->tick_event = -1;
        close(ps->tick_fd);
        ps->tick_fd = -1;
        return rc;
    }
    return 0;
}

/* Attach the write log `wc` names to the disk's store (once per store: a second disk naming the
 * same log shares it; another log is refused), replaying what it holds for the store's VDIs.
 * Blocking, which open() may be. */
int plx_td_attach_write_cache(struct plx_td_store *ps, const struct plx_wcache_config *wc)
{
    struct plx_wcache_status ws;
    plx_wcache_status(ps->st, &ws);
    if (ws.attached) {
        if (strcmp(ws.path, wc->path) == 0)
            return 0;
        tlog_syslog(TLOG_WARN,
                    "parallax: write-cache=%s: blockstore %s already has the write log %s in "
                    "this tapdisk",
                    wc->path, ps->path, ws.path);
        return -EBUSY;
    }
    int rc = tick_start(ps);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: write-cache=%s: cannot start its timer: %s", wc->path,
                    strerror(-rc));
        return rc;
    }
    rc = plx_wcache_attach(ps->st, wc->path, wc->size);
    if (rc < 0) {
        tlog_syslog(TLOG_WARN, "parallax: write-cache=%s: %s", wc->path, plx_store_errmsg(ps->st));
        return rc;
    }
    plx_wcache_status(ps->st, &ws);
    tlog_syslog(TLOG_INFO, "parallax: write cache %s on %s (%llu MiB, replayed %llu writes)",
                wc->path, ps->path, (unsigned long long)(ws.log_bytes >> 20),
                (unsigned long long)ws.replayed_records);
    return 0;
}

/* ---- Control socket on tapdisk's scheduler (struct control_host) ---------------------------- */

struct plx_td_watch {
    event_id_t id;
    void (*ready)(void *arg);
    void *arg;
};

static void control_event(event_id_t id, char mode, void *private)
{
    struct plx_td_watch *w = private;
    w->ready(w->arg); /* may unwatch (free) w */
}

static void *control_watch(void *host_arg, int fd, void (*ready)(void *arg), void *arg)
{
    struct plx_td_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->ready = ready;
    w->arg = arg;
    w->id = tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, fd, TV_ZERO, control_event, w);
    if (w->id < 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void control_unwatch(void *host_arg, void *handle)
{
    struct plx_td_watch *w = handle;
    tapdisk_server_unregister_event(w->id);
    free(w);
}

static plx_vdi *control_find_vdi(void *host_arg, uint64_t id, plx_store **st, int *err)
{
    plx_vdi *found = NULL;
    *err = 0;
    for (struct plx_td_store *ps = plx_td_stores; ps; ps = ps->next) {
        for (struct plx_td_disk *d = ps->disks; d; d = d->next) {
            if (d->read_only || !d->vdi || plx_vdi_id(d->vdi) != id)
                continue;
            if (found && found != d->vdi) {
                *err = -EEXIST;
                return NULL;
            }
            found = d->vdi;
            *st = ps->st;
            /* A command may attach a log or start the automatic mode (cache-attach,
             * cache-auto): from now on the store's disks get the automatic mode's tick. */
            if (tick_start(ps) < 0)
                tlog_syslog(TLOG_WARN, "parallax: %s: no timer for the automatic write cache",
                            ps->path);
        }
    }
    return found;
}

void plx_td_control_use(void)
{
    if (plx_td_control_users++ > 0)
        return;
    static const struct control_host host = {.watch = control_watch,
                                             .unwatch = control_unwatch,
                                             .find_vdi = control_find_vdi};
    char err[256];
    if (control_start(&host, err, sizeof err) != 0)
        tlog_syslog(TLOG_WARN,
                    "parallax: %s: `parallax vdi-snapshot` and the other admin commands will not "
                    "reach this tapdisk",
                    err);
}

void plx_td_control_unuse(void)
{
    if (--plx_td_control_users == 0)
        control_stop();
}
