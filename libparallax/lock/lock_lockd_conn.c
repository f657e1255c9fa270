/*
 * lock_lockd_conn.c - the lock manager's client, its connection: setting it up without
 * blocking the service loop (connect, HELLO, fail-over along the list of lock managers), the
 * protocol's lines on it (lockd/lockd_proto.h), and the answers that come in beside the one
 * waited for (heartbeats, ADMIN-TRY, releases, late ALIVEs: take_aside). The lock seam's
 * operations over it are lock_lockd.c's, the layer above; this file calls nothing there.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include "lock_lockd_shared.h"

void plx_lk_set_timer(struct plx_lockd *lk, uint64_t period_ns)
{
    if (lk->timer_fd < 0 || lk->timer_ns == period_ns)
        return;
    struct itimerspec its = {0};
    its.it_interval.tv_sec = (time_t)(period_ns / 1000000000ull);
    its.it_interval.tv_nsec = (long)(period_ns % 1000000000ull);
    its.it_value = its.it_interval;
    if (timerfd_settime(lk->timer_fd, 0, &its, NULL) == 0)
        lk->timer_ns = period_ns;
}

void plx_lk_close(struct plx_lockd *lk)
{
    if (lk->fd >= 0)
        close(lk->fd);
    lk->fd = -1;
    lk->state = LK_DOWN;
    lk->in_len = 0;
    lk->try_state = TRY_NONE; /* lockd releases what a closed connection held */
    lk->releases_unread = 0;
    lk->ping_unanswered_ns = 0;
    lk->alive_unread = 0;
    lk->ask = ASK_NONE;
    lk->withdrawing = false;
    lk->watched = false; /* closing the socket took it out of the epoll set */
}

int plx_lk_send_line(struct plx_lockd *lk, const char *line)
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
        plx_lk_close(lk);
        return -ENOTCONN;
    }
    return 0;
}

int plx_lk_send_ping(struct plx_lockd *lk)
{
    lk->last_ping_ns = plx_mono_ns();
    if (!lk->ping_unanswered_ns)
        lk->ping_unanswered_ns = lk->last_ping_ns;
    return plx_lk_send_line(lk, "PING");
}

/* With several lock managers: has the one we are connected to left heartbeats unanswered for
 * half a lease (stopped, or cut off)? Then close the connection and try the next one: a standby
 * may have taken over. With one lock manager the connection is kept (it may come back). */
bool plx_lk_unanswered(struct plx_lockd *lk)
{
    uint64_t now = plx_mono_ns();
    if (lk->naddrs < 2 || lk->state != LK_UP || !lk->ping_unanswered_ns ||
        now - lk->ping_unanswered_ns <= lk->lease_ns / 2)
        return false;
    snprintf(lk->why_down, sizeof lk->why_down,
             "%s left heartbeats unanswered for %.1f s (stopped, or cut off)", lk->addrs[lk->cur],
             (double)(now - lk->ping_unanswered_ns) / 1e9);
    plx_lk_close(lk);
    lk->cur = (lk->cur + 1) % lk->naddrs;
    return true;
}

/* A line that answers something other than the request being waited for (a heartbeat, an
 * ADMIN-TRY, the release of an unclaimed TRY grant): note it and say 1 (consumed). */
static bool take_aside(struct plx_lockd *lk, const char *line)
{
    if (!strcmp(line, "PONG")) {
        lk->last_pong_ns = plx_mono_ns();
        lk->ping_unanswered_ns = 0;
        return true;
    }
    if (lk->try_state == TRY_ASKED) {
        if (!strcmp(line, "TRY-GRANTED") || !strcmp(line, "TRY-BUSY")) {
            lk->try_state = line[4] == 'G' ? TRY_GRANTED : TRY_BUSY;
            return true;
        }
        if (!strcmp(line, "ERR unknown command 'ADMIN-TRY'")) {
            lk->try_state = TRY_NONE;
            lk->try_unsupported = true;
            return true;
        }
    }
    if (!strcmp(line, "GRANTED")) {
        if (lk->withdrawing)
            return true; /* the withdrawn ask's: its RELEASED follows and gives it back */
        if (lk->ask == ASK_SENT) {
            lk->ask = ASK_GRANTED;
            return true;
        }
    }
    if (lk->alive_unread && (!strcmp(line, "YES") || !strcmp(line, "NO"))) {
        lk->alive_unread--; /* lockd answers in order: the oldest ALIVE's */
        return true;
    }
    if (lk->releases_unread && !strcmp(line, "RELEASED")) {
        /* lockd answers in order: the RELEASED of the last ADMIN-UNLOCK sent comes last. */
        if (--lk->releases_unread == 0)
            lk->withdrawing = false;
        return true;
    }
    return false;
}

/* The next complete line from the buffer, without its newline: 1, or 0 when none is complete.
 * Answers to other things than the request waited for are consumed here (take_aside). */
int plx_lk_take_line(struct plx_lockd *lk, char *out, size_t len)
{
    for (;;) {
        char *nl = memchr(lk->in, '\n', lk->in_len);
        if (!nl)
            return 0;
        size_t used = (size_t)(nl - lk->in) + 1;
        *nl = 0;
        bool aside = take_aside(lk, lk->in);
        if (!aside)
            snprintf(out, len, "%s", lk->in);
        memmove(lk->in, lk->in + used, lk->in_len - used);
        lk->in_len -= used;
        if (!aside)
            return 1;
    }
}

/* Read what has arrived, without waiting: 0, or -ENOTCONN when lockd closed the connection. */
int plx_lk_fill(struct plx_lockd *lk)
{
    while (lk->in_len < sizeof lk->in) {
        ssize_t r = recv(lk->fd, lk->in + lk->in_len, sizeof lk->in - lk->in_len, MSG_DONTWAIT);
        if (r > 0) {
            lk->in_len += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        snprintf(lk->why_down, sizeof lk->why_down, "it closed the connection");
        plx_lk_close(lk);
        return -ENOTCONN;
    }
    if (!memchr(lk->in, '\n', lk->in_len)) {
        snprintf(lk->why_down, sizeof lk->why_down, "it sent a line longer than %d bytes",
                 PLX_LOCKD_LINE_MAX);
        plx_lk_close(lk);
        return -EPROTO;
    }
    return 0;
}

/* Read one reply line (blocking, bounded). */
int plx_lk_read_line(struct plx_lockd *lk, char *out, size_t len, int timeout_ms)
{
    uint64_t deadline = plx_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (lk->fd < 0)
            return -ENOTCONN;
        if (plx_lk_take_line(lk, out, len))
            return 0;
        uint64_t now = plx_mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0) {
            snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", timeout_ms);
            plx_lk_close(lk);
            return -ETIMEDOUT;
        }
        int rc = plx_lk_fill(lk);
        if (rc)
            return rc;
    }
}

/* Start a non-blocking connect: LK_CONNECTING (or LK_DOWN with why_down set). */
void plx_lk_start_connect(struct plx_lockd *lk)
{
    plx_lk_close(lk);
    lk->connect_started_ns = plx_mono_ns();
    char host[64], port[16];
    const char *addr = lk->addrs[lk->cur];
    snprintf(port, sizeof port, "%d", PLX_LOCKD_DEFAULT_PORT);
    const char *colon = strrchr(addr, ':');
    if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
        snprintf(port, sizeof port, "%s", colon + 1);
    } else {
        snprintf(host, sizeof host, "%s", addr);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        snprintf(lk->why_down, sizeof lk->why_down, "%s: %s", addr, gai_strerror(rc));
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    rc = fd < 0 ? -errno : 0;
    if (!rc && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS)
        rc = -errno;
    freeaddrinfo(ai);
    if (rc) {
        snprintf(lk->why_down, sizeof lk->why_down, "%s: %s", addr, strerror(-rc));
        if (fd >= 0)
            close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    lk->fd = fd;
    lk->state = LK_CONNECTING;
    lk->setup_deadline_ns = plx_mono_ns() + CONNECT_TIMEOUT_MS * 1000000ull;
}

/* The lock manager tried now failed (down, unreachable, a standby): start connecting to the
 * next one in the list not tried since one last answered. Leaves LK_DOWN when all were tried. */
void plx_lk_failover_next(struct plx_lockd *lk)
{
    while (lk->state == LK_DOWN && lk->tried + 1 < lk->naddrs) {
        lk->tried++;
        lk->cur = (lk->cur + 1) % lk->naddrs;
        plx_lk_start_connect(lk);
    }
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

/* Advance a connection being set up, waiting at most wait_ms (0: not at all). */
void plx_lk_setup_step(plx_store *st, int wait_ms)
{
    struct plx_lockd *lk = st->lock_state;
    uint64_t until = plx_mono_ns() + (uint64_t)wait_ms * 1000000ull;
    while (lk->state == LK_CONNECTING || lk->state == LK_HELLO) {
        uint64_t now = plx_mono_ns();
        if (now >= lk->setup_deadline_ns) {
            snprintf(lk->why_down, sizeof lk->why_down, "%s: %s", lk->addrs[lk->cur],
                     lk->state == LK_CONNECTING ? "connecting timed out (is its host down?)"
                                                : "no answer to HELLO");
            plx_lk_close(lk);
            plx_lk_failover_next(lk);
            continue;
        }
        uint64_t stop = until < lk->setup_deadline_ns ? until : lk->setup_deadline_ns;
        int ms = stop > now ? (int)((stop - now + 999999) / 1000000) : 0;
        struct pollfd p = {.fd = lk->fd, .events = lk->state == LK_CONNECTING ? POLLOUT : POLLIN};
        int r = poll(&p, 1, ms);
        if (r <= 0) {
            if (now >= until)
                return; /* not yet: a later tick looks again */
            continue;
        }
        if (lk->state == LK_CONNECTING) {
            int err = 0;
            socklen_t el = sizeof err;
            if (getsockopt(lk->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
                err = errno;
            if (err) {
                snprintf(lk->why_down, sizeof lk->why_down, "%s: %s", lk->addrs[lk->cur],
                         strerror(err));
                plx_lk_close(lk);
                plx_lk_failover_next(lk);
                continue;
            }
            char inst[64], line[PLX_LOCKD_LINE_MAX];
            host_instance(inst, sizeof inst);
            snprintf(line, sizeof line, "HELLO %s %s %u %llu", st->host, inst, st->pid,
                     (unsigned long long)st->epoch);
            if (plx_lk_send_line(lk, line))
                return;
            lk->state = LK_HELLO;
            lk->setup_deadline_ns = plx_mono_ns() + REPLY_TIMEOUT_MS * 1000000ull;
            continue;
        }
        char reply[PLX_LOCKD_LINE_MAX];
        if (plx_lk_fill(lk)) {
            plx_lk_failover_next(lk);
            continue;
        }
        if (!plx_lk_take_line(lk, reply, sizeof reply))
            continue;
        if (!strncmp(reply, "STANDBY", 7)) {
            snprintf(lk->why_down, sizeof lk->why_down, "%s is a standby", lk->addrs[lk->cur]);
            lk->standby_seen = true;
            plx_lk_close(lk);
            plx_lk_failover_next(lk);
            continue;
        }
        unsigned long long lease_ms;
        if (sscanf(reply, "OK %llu", &lease_ms) != 1) {
            plx_lk_close(lk);
            snprintf(lk->refused, sizeof lk->refused, "refused this host: %.300s",
                     strncmp(reply, "ERR ", 4) ? reply : reply + 4);
            snprintf(lk->why_down, sizeof lk->why_down, "%s", lk->refused);
            return;
        }
        lk->lease_ns = lease_ms * 1000000ull;
        lk->refused[0] = 0;
        lk->state = LK_UP;
        lk->tried = 0;
        plx_lk_set_timer(lk, lk->lease_ns / 4);
    }
}

/* Connect and introduce ourselves, waiting (bounded). Returns 0, -ENOTCONN (unreachable:
 * lk->why_down says why) or -EACCES (lockd refused us: the store's message says why). */
int plx_lk_connect(plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
    if (lk->state == LK_DOWN) {
        lk->tried = 0;
        plx_lk_start_connect(lk);
        plx_lk_failover_next(lk);
    }
    /* Each lock manager in the list gets its own time to connect and answer. */
    plx_lk_setup_step(st, (CONNECT_TIMEOUT_MS + REPLY_TIMEOUT_MS) * lk->naddrs);
    if (lk->state == LK_UP)
        return 0;
    if (lk->refused[0])
        return plx_err(st, -EACCES, "the lock manager at %s %s", lk->addr, lk->refused);
    return -ENOTCONN;
}

int plx_lk_ensure_connected(plx_store *st)
{
    const struct plx_lockd *lk = st->lock_state;
    return lk->state == LK_UP ? 0 : plx_lk_connect(st);
}

/* Wait until until_ns for an outstanding ADMIN-TRY's answer: 0 when it is in, -ETIMEDOUT, or
 * -errno when the connection failed. */
int plx_lk_await_try(struct plx_lockd *lk, uint64_t until_ns)
{
    while (lk->try_state == TRY_ASKED) {
        char line[PLX_LOCKD_LINE_MAX];
        if (lk->fd < 0)
            return -ENOTCONN;
        if (plx_lk_take_line(lk, line, sizeof line))
            continue; /* nothing but answers taken aside is expected between requests */
        uint64_t now = plx_mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        int ms = now < until_ns ? (int)((until_ns - now + 999999) / 1000000) : 0;
        if (poll(&p, 1, ms) <= 0)
            return -ETIMEDOUT;
        int rc = plx_lk_fill(lk);
        if (rc)
            return rc;
    }
    return 0;
}

/* Wait (bounded) for an outstanding ADMIN-TRY's answer: 0, or -errno with the connection closed. */
int plx_lk_try_settle(struct plx_lockd *lk, int timeout_ms)
{
    int rc = plx_lk_await_try(lk, plx_mono_ns() + (uint64_t)timeout_ms * 1000000ull);
    if (rc == -ETIMEDOUT) {
        snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", timeout_ms);
        plx_lk_close(lk);
    }
    return rc;
}

/* Give the admin lock back, or withdraw an ask: ADMIN-UNLOCK, whose RELEASED nobody waits for
 * (take_aside consumes it). Never waits: lockd handles our lines in order, so a later request
 * of ours comes after the release. If the send fails the connection is gone, and with it
 * everything it held. */
void plx_lk_send_unlock(struct plx_lockd *lk)
{
    if (lk->state == LK_UP && !plx_lk_send_line(lk, "ADMIN-UNLOCK"))
        lk->releases_unread++;
}

/* Read what has arrived and take the answers it holds (take_aside); other lines are not
 * expected between requests and are dropped. Never waits. */
void plx_lk_drain(struct plx_lockd *lk)
{
    if (lk->state != LK_UP || plx_lk_fill(lk))
        return;
    char line[PLX_LOCKD_LINE_MAX];
    while (plx_lk_take_line(lk, line, sizeof line))
        ;
}
