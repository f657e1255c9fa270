/*
 * control_server.c - the server side of the control socket (protocol in parallax_control.h), on
 * the event loop of the process that holds the VDIs (struct control_host).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "parallax_control.h"

struct ctl_client {
    int fd;
    void *watch; /* host handle while reading the command; NULL once it runs */
    char line[512];
    size_t got;
    uint64_t index; /* snapshot result */
    plx_store *st;
    uint64_t accept_ns, command_ns; /* $PARALLAX_SNAP_TRACE: when accepted, when read whole */
};

static struct control_host host;
static int listen_fd = -1;
/* cache-disable commands waiting for their VDI's drain; a timer polls them every 100 ms while
 * there are any (the loop goes on serving meanwhile). */
struct ctl_pending {
    struct ctl_client *c;
    uint64_t id;
    struct ctl_pending *next;
};
static struct ctl_pending *pending;
static int poll_fd = -1;
static void *poll_watch;
static void *listen_watch;
static char sock_path[108];
static bool trace; /* $PARALLAX_SNAP_TRACE: print each command's times on stderr */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void reply_close(struct ctl_client *c, const char *text)
{
    if (trace && c->command_ns)
        fprintf(stderr,
                "parallax: control trace: accepted to command read %.3f ms, command to reply "
                "%.3f ms: %.40s -> %.40s",
                (double)(c->command_ns - c->accept_ns) / 1e6,
                (double)(mono_ns() - c->command_ns) / 1e6, c->line, text);
    size_t n = strlen(text);
    if (write(c->fd, text, n) != (ssize_t)n) {
        /* The client went away; nothing to tell it. */
    }
    close(c->fd);
    free(c);
}

static void reply_err(struct ctl_client *c, int err, const char *msg)
{
    char buf[400];
    snprintf(buf, sizeof buf, "err %d %s\n", -err, msg);
    reply_close(c, buf);
}

/* The snapshot record is durable: answer. */
static void snapshot_done(void *arg, int status)
{
    struct ctl_client *c = arg;
    if (status) {
        reply_err(c, status, plx_store_errmsg(c->st));
        return;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "ok %llu\n", (unsigned long long)c->index);
    reply_close(c, buf);
}

/* The changed snapshot record (label or deletion) is durable: answer. */
static void edit_done(void *arg, int status)
{
    struct ctl_client *c = arg;
    if (status)
        reply_err(c, status, plx_store_errmsg(c->st));
    else
        reply_close(c, "ok\n");
}

static void pending_stop_timer(void)
{
    if (poll_fd < 0)
        return;
    host.unwatch(host.host_arg, poll_watch);
    close(poll_fd);
    poll_fd = -1;
    poll_watch = NULL;
}

/* Answer the cache-disable commands whose drain has finished. A VDI no longer open was drained
 * and closed meanwhile (closing clears its record). */
static void pending_poll(void *arg)
{
    uint64_t junk;
    if (read(poll_fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    for (struct ctl_pending **pp = &pending; *pp;) {
        struct ctl_pending *p = *pp;
        plx_store *st = NULL;
        int err = 0;
        plx_vdi *v = host.find_vdi(host.host_arg, p->id, &st, &err);
        int rc = v ? plx_vdi_wcache_off_nowait(v) : 0;
        if (rc == -EAGAIN) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (rc)
            reply_err(p->c, rc, plx_store_errmsg(st ? st : p->c->st));
        else
            reply_close(p->c, "ok\n");
        free(p);
    }
    if (!pending)
        pending_stop_timer();
}

static int pending_add(struct ctl_client *c, uint64_t id)
{
    struct ctl_pending *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    if (poll_fd < 0) {
        poll_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
        if (poll_fd < 0 || timerfd_settime(poll_fd, 0, &its, NULL) != 0 ||
            !(poll_watch = host.watch(host.host_arg, poll_fd, pending_poll, NULL))) {
            if (poll_fd >= 0)
                close(poll_fd);
            poll_fd = -1;
            free(p);
            return -ENOMEM;
        }
    }
    p->c = c;
    p->id = id;
    p->next = pending;
    pending = p;
    return 0;
}

/* The write-cache commands (parallax_control.h). cache-attach blocks the loop while it replays;
 * cache-disable answers once the VDI is drained, the loop serving meanwhile (docs/DESIGN.md,
 * "The write cache"). */
static void cache_command(struct ctl_client *c, const char *cmd, plx_vdi *v, uint64_t id)
{
    int rc;
    if (strcmp(cmd, "cache-attach") == 0) {
        unsigned long long size = 0;
        int at = 0;
        if (sscanf(c->line, "%*s %*u %llu %n", &size, &at) < 1 || !at || !c->line[at]) {
            reply_err(c, -EINVAL, "malformed command: cache-attach ID SIZE PATH");
            return;
        }
        struct plx_wcache_status ws;
        plx_wcache_status(c->st, &ws);
        if (ws.attached && strcmp(ws.path, c->line + at) != 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "this server already has the write log %.120s attached",
                     ws.path);
            reply_err(c, -EBUSY, msg);
            return;
        }
        rc = ws.attached ? 0 : plx_wcache_attach(c->st, c->line + at, size);
    } else if (strcmp(cmd, "cache-enable") == 0) {
        rc = plx_vdi_wcache_set_mode(v, PLX_WCACHE_ON, NULL);
    } else if (strcmp(cmd, "cache-disable") == 0) {
        rc = plx_vdi_wcache_off_nowait(v);
        if (rc == -EAGAIN) {
            if (pending_add(c, id) == 0)
                return; /* answered by pending_poll */
            reply_err(c, -ENOMEM, "out of memory");
            return;
        }
    } else if (strcmp(cmd, "cache-auto") == 0) {
        struct plx_wcache_auto a = {0};
        if (sscanf(c->line, "%*s %*u %lf", &a.on_ms) != 1) {
            reply_err(c, -EINVAL, "malformed command: cache-auto ID THRESHOLD_MS");
            return;
        }
        rc = plx_vdi_wcache_set_mode(v, PLX_WCACHE_AUTO, &a);
    } else if (strcmp(cmd, "cache-status") == 0) {
        struct plx_wcache_status ws;
        plx_wcache_status(c->st, &ws);
        struct plx_wcache_drain dr = {.struct_size = sizeof dr};
        plx_wcache_drain_status(c->st, &dr);
        struct plx_wcache_auto a;
        int mode = plx_vdi_wcache_mode(v, &a);
        char buf[1024];
        int n =
            snprintf(buf, sizeof buf,
                     "ok vdi=%s attached=%d failed=%d log=%llu used=%llu backlog=%llu "
                     "records=%llu drained=%llu rate=%.0f cached=%u mode=%s threshold=%.3f "
                     "latency=%.3f drain=%s drain_delay_ms=%llu drain_max_age_ms=%llu "
                     "oldest_ms=%llu logged=%llu zc=%llu zc_records=%llu path=%s",
                     plx_vdi_wcache_on(v) ? "on" : "off", ws.attached, ws.failed,
                     (unsigned long long)ws.log_bytes, (unsigned long long)ws.used_bytes,
                     (unsigned long long)ws.backlog_bytes, (unsigned long long)ws.backlog_records,
                     (unsigned long long)ws.drained_bytes, ws.drain_rate, ws.vdis_cached,
                     mode == PLX_WCACHE_AUTO ? "auto"
                     : mode == PLX_WCACHE_ON ? "on"
                                             : "off",
                     a.on_ms, plx_store_write_latency_ms(c->st), ws.attached ? dr.state : "-",
                     (unsigned long long)dr.delay_ms, (unsigned long long)dr.max_age_ms,
                     (unsigned long long)dr.oldest_ms, (unsigned long long)dr.logged_bytes,
                     (unsigned long long)dr.zc_bytes, (unsigned long long)dr.zc_records,
                     ws.attached ? ws.path : "-");
        if (ws.error[0] && n > 0 && (size_t)n < sizeof buf)
            snprintf(buf + n, sizeof buf - (size_t)n, " error=%s", ws.error);
        strncat(buf, "\n", sizeof buf - strlen(buf) - 1);
        reply_close(c, buf);
        return;
    } else {
        reply_err(c, -EINVAL, "unknown command");
        return;
    }
    if (rc)
        reply_err(c, rc, plx_store_errmsg(c->st));
    else
        reply_close(c, "ok\n");
}

/* Every command is a request in the VDI's stream, answered from its callback: nothing here
 * waits for the medium (but cache-attach, and the end of cache-disable: see cache_command). */
static void run_command(struct ctl_client *c)
{
    char cmd[32] = "", label[PLX_LABEL_MAX + 2] = "";
    unsigned long long id = 0, index = 0;
    if (sscanf(c->line, "%31s %llu", cmd, &id) != 2) {
        reply_err(c, -EINVAL, "malformed command");
        return;
    }
    bool snapshot = strcmp(cmd, "snapshot") == 0;
    bool label_cmd = strcmp(cmd, "snap-label") == 0, delete_cmd = strcmp(cmd, "snap-delete") == 0;
    bool cache_cmd = strncmp(cmd, "cache-", 6) == 0;
    if (!snapshot && !label_cmd && !delete_cmd && !cache_cmd) {
        reply_err(c, -EINVAL, "unknown command");
        return;
    }
    int ferr = 0;
    plx_vdi *v = host.find_vdi(host.host_arg, id, &c->st, &ferr);
    if (!v) {
        reply_err(c, ferr ? ferr : -ENOENT,
                  ferr == -EEXIST ? "this process has two VDIs with that id open (two blockstores)"
                                  : "this server does not have that VDI open for writing");
        return;
    }
    if (cache_cmd) {
        cache_command(c, cmd, v, id);
        return;
    }
    int rc;
    if (snapshot) {
        sscanf(c->line, "%*s %*u %40s", label);
        rc = plx_vdi_submit_snapshot(v, label, &c->index, snapshot_done, c);
    } else if (sscanf(c->line, "%*s %*u %llu %40s", &index, label) < 1) {
        reply_err(c, -EINVAL, "malformed command: snapshot index missing");
        return;
    } else if (label_cmd) {
        rc = plx_vdi_submit_snap_label(v, index, label, edit_done, c);
    } else {
        rc = plx_vdi_submit_snap_delete(v, index, edit_done, c);
    }
    if (rc)
        reply_err(c, rc, plx_store_errmsg(c->st));
}

static void client_ready(void *arg)
{
    struct ctl_client *c = arg;
    ssize_t r = read(c->fd, c->line + c->got, sizeof c->line - 1 - c->got);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) {
        host.unwatch(host.host_arg, c->watch);
        close(c->fd);
        free(c);
        return;
    }
    c->got += (size_t)r;
    c->line[c->got] = 0;
    char *nl = strchr(c->line, '\n');
    if (!nl && c->got < sizeof c->line - 1)
        return;
    if (nl)
        *nl = 0;
    /* One command per connection: stop watching; the reply closes it. */
    if (trace)
        c->command_ns = mono_ns();
    host.unwatch(host.host_arg, c->watch);
    c->watch = NULL;
    run_command(c);
}

static void listener_ready(void *arg)
{
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    struct ctl_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->fd = fd;
    if (trace)
        c->accept_ns = mono_ns();
    c->watch = host.watch(host.host_arg, fd, client_ready, c);
    if (!c->watch) {
        close(fd);
        free(c);
    }
}

int control_start(const struct control_host *h, char *err, size_t errlen)
{
    char dir[200];
    control_dir(dir, sizeof dir);
    mkdir(dir, 0700);
    control_sweep_stale();
    control_path((int)getpid(), sock_path, sizeof sock_path);
    unlink(sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        snprintf(err, errlen, "control socket %s: %s", sock_path, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    host = *h;
    listen_fd = fd;
    const char *t = getenv("PARALLAX_SNAP_TRACE");
    trace = t && *t && strcmp(t, "0") != 0;
    listen_watch = host.watch(host.host_arg, fd, listener_ready, NULL);
    if (!listen_watch) {
        snprintf(err, errlen, "control socket %s: cannot watch it", sock_path);
        close(fd);
        listen_fd = -1;
        unlink(sock_path);
        return -ENOMEM;
    }
    return 0;
}

void control_stop(void)
{
    /* (The drain goes on: the server waits for it before it exits.) */
    while (pending) {
        struct ctl_pending *p = pending;
        pending = p->next;
        reply_err(p->c, -ESHUTDOWN,
                  "the server is stopping; it drains the VDI's writes before it exits");
        free(p);
    }
    pending_stop_timer();
    if (listen_fd < 0)
        return;
    host.unwatch(host.host_arg, listen_watch);
    listen_watch = NULL;
    close(listen_fd);
    listen_fd = -1;
    unlink(sock_path);
}
