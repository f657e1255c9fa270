/*
 * lock_lockd.c - the lock seam's implementation for many hosts: a client of parallax-lockd
 * (lockd/lockd.c; protocol in lockd_proto.h; docs/DESIGN.md "The lock manager").
 *
 * The admin lock is lockd's; a holder on another host is alive while its connection to lockd
 * holds a lease (a holder on this host is still judged by /proc, which is exact). Nothing here
 * is on the data path: the engine talks to lockd when it opens a VDI, claims an extent or
 * changes the registry, and sends a heartbeat every quarter lease from the service loop (a
 * timerfd in the store's epoll set wakes an idle engine for it).
 *
 * While lockd is unreachable the engine keeps serving and allocating from what it holds; only
 * calls that need the admin lock wait (and fail with a message naming lockd after the lock
 * timeout). What it must not survive is having been frozen past its lease: lockd may then have
 * handed its VDIs to another host. So if the gap between two heartbeat attempts exceeds three
 * quarters of the lease, the store is fenced: no further I/O reaches the medium, and every
 * request fails with -ESTALE.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include "lock.h"
#include "lockd_proto.h"

#define CONNECT_TIMEOUT_MS 2000
#define REPLY_TIMEOUT_MS 5000

struct plx_lockd {
    char addr[64];
    int fd;                 /* -1: not connected */
    int timer_fd;
    uint64_t lease_ns;
    uint64_t next_beat_ns;
    uint64_t last_attempt_ns;  /* last heartbeat attempt (sent or not): the freeze detector */
    char why_down[400];     /* why the last connection attempt failed */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lk_close(struct plx_lockd *lk)
{
    if (lk->fd >= 0)
        close(lk->fd);
    lk->fd = -1;
}

static int send_line(struct plx_lockd *lk, const char *line)
{
    size_t n = strlen(line);
    char buf[PLX_LOCKD_LINE_MAX];
    if (n + 1 > sizeof buf)
        return -EINVAL;
    memcpy(buf, line, n);
    buf[n++] = '\n';
    ssize_t w = send(lk->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w != (ssize_t)n) {
        snprintf(lk->why_down, sizeof lk->why_down, "sending to it failed: %s",
                 w < 0 ? strerror(errno) : "short write");
        lk_close(lk);
        return -ENOTCONN;
    }
    return 0;
}

/* Read one reply line (blocking, bounded). */
static int read_line(struct plx_lockd *lk, char *out, size_t len, int timeout_ms)
{
    size_t got = 0;
    uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (got + 1 < len) {
        int left = (int)((deadline - mono_ns()) / 1000000);
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", timeout_ms);
            lk_close(lk);
            return -ETIMEDOUT;
        }
        ssize_t r = recv(lk->fd, out + got, 1, 0);
        if (r <= 0) {
            snprintf(lk->why_down, sizeof lk->why_down, "it closed the connection");
            lk_close(lk);
            return -ENOTCONN;
        }
        if (out[got] == '\n') {
            out[got] = 0;
            return 0;
        }
        got++;
    }
    lk_close(lk);
    return -EPROTO;
}

static int request(struct plx_lockd *lk, const char *line, char *reply, size_t len,
                   int timeout_ms)
{
    int rc = send_line(lk, line);
    return rc ? rc : read_line(lk, reply, len, timeout_ms);
}

static int tcp_connect(struct plx_lockd *lk)
{
    char host[64], port[16];
    snprintf(port, sizeof port, "%d", PLX_LOCKD_DEFAULT_PORT);
    const char *colon = strrchr(lk->addr, ':');
    if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - lk->addr), lk->addr);
        snprintf(port, sizeof port, "%s", colon + 1);
    } else {
        snprintf(host, sizeof host, "%s", lk->addr);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        snprintf(lk->why_down, sizeof lk->why_down, "%s", gai_strerror(rc));
        return -EHOSTUNREACH;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    rc = fd < 0 ? -errno : 0;
    if (!rc && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS)
        rc = -errno;
    freeaddrinfo(ai);
    if (!rc) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (poll(&p, 1, CONNECT_TIMEOUT_MS) <= 0)
            rc = -ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err)
            rc = -err;
    }
    if (rc) {
        snprintf(lk->why_down, sizeof lk->why_down, "%s", strerror(-rc));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    lk->fd = fd;
    return 0;
}

/* The boot id tells two machines configured with the same host id apart. */
static void host_instance(char *buf, size_t len)
{
    const char *env = getenv("PARALLAX_HOST_INSTANCE");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return;
    }
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(buf, (int)len, f))
            buf[strcspn(buf, "\n")] = 0;
        fclose(f);
    }
}

/* Connect and introduce ourselves. Returns 0, -ENOTCONN (unreachable: lk->why_down says why) or
 * -EACCES (lockd refused us: the store's message says why). */
static int lk_connect(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    lk_close(lk);
    if (tcp_connect(lk))
        return -ENOTCONN;
    char inst[64], line[PLX_LOCKD_LINE_MAX], reply[PLX_LOCKD_LINE_MAX];
    host_instance(inst, sizeof inst);
    snprintf(line, sizeof line, "HELLO %s %s %u %llu", st->host, inst, st->pid,
             (unsigned long long)st->epoch);
    int rc = request(lk, line, reply, sizeof reply, REPLY_TIMEOUT_MS);
    if (rc)
        return -ENOTCONN;
    unsigned long long lease_ms;
    if (sscanf(reply, "OK %llu", &lease_ms) != 1) {
        lk_close(lk);
        snprintf(lk->why_down, sizeof lk->why_down, "refused this host: %.300s",
                 strncmp(reply, "ERR ", 4) ? reply : reply + 4);
        return plx_err(st, -EACCES, "the lock manager at %s %s", lk->addr, lk->why_down);
    }
    lk->lease_ns = lease_ms * 1000000ull;
    return 0;
}

static int ensure_connected(plx_store *st)
{
    return st->lockd->fd >= 0 ? 0 : lk_connect(st);
}

/* Wait for a line while keeping the lease: a heartbeat every quarter lease. */
static int read_line_beating(plx_store *st, char *out, size_t len, uint64_t timeout_ns)
{
    struct plx_lockd *lk = st->lockd;
    uint64_t deadline = mono_ns() + timeout_ns;
    for (;;) {
        uint64_t now = mono_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        uint64_t slice = lk->lease_ns / 4;
        if (slice > deadline - now)
            slice = deadline - now;
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(slice / 1000000) + 1);
        if (r > 0)
            return read_line(lk, out, len, REPLY_TIMEOUT_MS);
        lk->last_attempt_ns = mono_ns();
        if (send_line(lk, "PING"))
            return -ENOTCONN;
    }
}

static int lockd_admin_try(plx_store *st, int take)
{
    struct plx_lockd *lk = st->lockd;
    char reply[PLX_LOCKD_LINE_MAX];
    int rc = ensure_connected(st);
    if (rc)
        return rc;
    if (!take) {
        rc = request(lk, "ADMIN-UNLOCK", reply, sizeof reply, REPLY_TIMEOUT_MS);
        while (!rc && !strcmp(reply, "GRANTED"))
            rc = read_line(lk, reply, sizeof reply, REPLY_TIMEOUT_MS);
        return rc ? -ENOTCONN : 0;
    }
    /* Waiting for the grant happens in lockd's queue; its answer is the grant. The connection
     * is our lease, so it is never dropped to give up: a withdrawn request is released. */
    rc = send_line(lk, "ADMIN-LOCK");
    if (!rc)
        rc = read_line_beating(st, reply, sizeof reply, plx_admin_lock_timeout_ns());
    if (rc == -ETIMEDOUT) {
        rc = send_line(lk, "ADMIN-UNLOCK");
        while (!rc && !(rc = read_line(lk, reply, sizeof reply, REPLY_TIMEOUT_MS)) &&
               strcmp(reply, "RELEASED") != 0)
            ;
        return rc ? -ENOTCONN : -EWOULDBLOCK;
    }
    if (rc)
        return -ENOTCONN;
    if (strcmp(reply, "GRANTED") != 0)
        return plx_err(st, -EPROTO, "the lock manager at %s answered '%s'", lk->addr, reply);
    return 0;
}

static bool lockd_holder_alive(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host == st->host_hash)
        return plx_lock_local.holder_alive(st, host, pid, epoch);
    struct plx_lockd *lk = st->lockd;
    char line[128], reply[PLX_LOCKD_LINE_MAX];
    snprintf(line, sizeof line, "ALIVE %llx %u %llu", (unsigned long long)host, pid,
             (unsigned long long)epoch);
    /* Unreachable: nobody can be declared dead, so nothing is taken from anyone. */
    if (ensure_connected((plx_store *)st) ||
        request(lk, line, reply, sizeof reply, REPLY_TIMEOUT_MS))
        return true;
    return strcmp(reply, "NO") != 0;
}

static const char *lockd_unreachable(const plx_store *st)
{
    return st->lockd->why_down;
}

const struct plx_lock_ops plx_lock_lockd = {
    .name = "lockd",
    .admin_try = lockd_admin_try,
    .holder_alive = lockd_holder_alive,
    .unreachable = lockd_unreachable,
};

/* Were we stopped (SIGSTOP, a hung machine) for most of a lease since the last heartbeat
 * attempt? Then lockd may have given what we hold to another host: fence. */
static bool frozen(plx_store *st, uint64_t now)
{
    struct plx_lockd *lk = st->lockd;
    if (!st->fenced && lk->last_attempt_ns && now - lk->last_attempt_ns > lk->lease_ns / 4 * 3)
        plx_fence(st,
                  "this process was stopped for %.1f s, longer than it may go without renewing "
                  "its lease of %.1f s from the lock manager at %s: another host may hold its "
                  "VDIs now, so it writes nothing more (reopen the VDIs)",
                  (double)(now - lk->last_attempt_ns) / 1e9, (double)lk->lease_ns / 1e9,
                  lk->addr);
    return st->fenced;
}

int plx_lease_check(plx_store *st)
{
    if (st->lockd)
        frozen(st, mono_ns());
    return st->fenced ? -ESTALE : 0;
}

/* From the service loop: heartbeat, reconnect, and notice a freeze. */
static void lockd_tick(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    uint64_t now = mono_ns();
    if (now < lk->next_beat_ns)
        return;
    uint64_t junk;
    if (read(lk->timer_fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: woken by something else; the beat is due all the same. */
    }
    if (frozen(st, now))
        return;
    lk->last_attempt_ns = now;
    lk->next_beat_ns = now + lk->lease_ns / 4;
    if (lk->fd < 0)
        lk_connect(st); /* unreachable: keep serving; the next beat tries again */
    else
        send_line(lk, "PING");
}

int plx_lockd_attach(plx_store *st, const char *addr)
{
    struct plx_lockd *lk = calloc(1, sizeof *lk);
    if (!lk)
        return plx_err(st, -ENOMEM, "out of memory");
    snprintf(lk->addr, sizeof lk->addr, "%s", addr);
    lk->fd = -1;
    lk->lease_ns = PLX_LOCKD_DEFAULT_LEASE_MS * 1000000ull;
    st->lockd = lk;
    int rc = lk_connect(st);
    if (rc == -ENOTCONN)
        rc = plx_err(st, -EHOSTUNREACH, "cannot reach the lock manager at %s: %s", addr,
                     lk->why_down);
    if (!rc) {
        lk->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct itimerspec its = {0};
        its.it_interval.tv_sec = (time_t)(lk->lease_ns / 4 / 1000000000ull);
        its.it_interval.tv_nsec = (long)(lk->lease_ns / 4 % 1000000000ull);
        its.it_value = its.it_interval;
        if (lk->timer_fd < 0 || timerfd_settime(lk->timer_fd, 0, &its, NULL) != 0)
            rc = plx_err(st, -errno, "creating the heartbeat timer: %s", strerror(errno));
    }
    if (!rc)
        rc = plx_engine_watch_fd(st, lk->timer_fd);
    if (rc) {
        plx_lockd_detach(st);
        return rc;
    }
    lk->last_attempt_ns = mono_ns();
    lk->next_beat_ns = lk->last_attempt_ns + lk->lease_ns / 4;
    st->lock_ops = &plx_lock_lockd;
    st->service_tick = lockd_tick;
    return 0;
}

void plx_lockd_detach(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (!lk)
        return;
    lk_close(lk);
    if (lk->timer_fd > 0)
        close(lk->timer_fd);
    free(lk);
    st->lockd = NULL;
    st->service_tick = NULL;
    st->lock_ops = &plx_lock_local;
}

int plx_lockd_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg)
{
    if (!st->lockd)
        return plx_err(st, -ENOENT, "this blockstore has no lock manager");
    struct plx_lockd *lk = st->lockd;
    char reply[PLX_LOCKD_LINE_MAX];
    int rc = ensure_connected(st);
    if (!rc)
        rc = send_line(lk, "STATUS");
    while (!rc) {
        rc = read_line(lk, reply, sizeof reply, REPLY_TIMEOUT_MS);
        if (rc || !strcmp(reply, "END"))
            break;
        line(arg, reply);
    }
    if (rc)
        return plx_err(st, -EHOSTUNREACH, "the lock manager at %s: %s", lk->addr, lk->why_down);
    return 0;
}
