/*
 * lock_lockd.c - the lock seam's implementation for many hosts: a client of parallax-lockd
 * (lockd/lockd.c; protocol in lockd/lockd_proto.h; docs/DESIGN.md "The lock manager"). Reached
 * only through the seam (plx_lock_lockd, lock.h): lock.c attaches it and asks it for the admin
 * lock, holders' liveness, the lease and lockd's status.
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
/* How often the service loop looks at a connection being set up (a non-blocking connect, then
 * HELLO's answer): never blocks, so a lockd host that is down costs the data path nothing. */
#define SETUP_POLL_NS 100000000ull
/* How long a claim made ahead waits for ADMIN-TRY's answer inside the event loop. lockd answers
 * at once (a round trip); a slower answer is taken by a later try or released by the tick. */
#define TRY_WAIT_MS 50
/* An ask not granted within ASK_PROBE_NS sends a heartbeat; one unanswered for SILENT_NS means
 * lockd answers nothing (the message of a wait that times out says so). */
#define ASK_PROBE_NS 250000000ull
/* A waiter on the loop starts a connection to an unreachable lockd at most this often. */
#define RECONNECT_NS 250000000ull
#define SILENT_NS 500000000ull
/* How long ALIVE's answer is waited for on a serving loop (lockd_holder_alive). */
#define ALIVE_LOOP_MS 300

/* The connection to lockd. Setting it up never blocks the service loop: the heartbeat starts a
 * non-blocking connect and later ticks advance it (CONNECTING -> HELLO -> UP); only the
 * blocking calls (admin lock, holder liveness, status) wait for it, bounded. */
enum lk_state { LK_DOWN, LK_CONNECTING, LK_HELLO, LK_UP };

/* An ADMIN-TRY: none outstanding; sent, no answer yet; answered, the answer not yet taken. */
enum lk_try { TRY_NONE, TRY_ASKED, TRY_GRANTED, TRY_BUSY };

/* An ADMIN-LOCK: none outstanding; sent, GRANTED not yet in; GRANTED in, not yet taken. The
 * blocking admin lock and the waiters on the event loop (plx_admin_lock_async) share it: one
 * ask at a time, taken by whoever looks first. */
enum lk_ask { ASK_NONE, ASK_SENT, ASK_GRANTED };

/* Fail-over: at most this many lock managers in the list the store names (lockd-set). */
#define MAX_ADDRS 8

struct plx_lockd {
    char addr[256]; /* as configured: one HOST:PORT, or several separated by commas */
    /* The lock managers of that list, tried in turn: the active one answers HELLO, a standby
     * says STANDBY (lockd/lockd.c), a dead one does not answer. cur is the one tried now,
     * tried how many were tried since one last answered. */
    char addrs[MAX_ADDRS][64];
    int naddrs, cur, tried;
    bool standby_seen;      /* a standby answered since the last connection was set up */
    uint64_t ping_unanswered_ns; /* the oldest PING sent since the last PONG (0: none) */
    int fd;                 /* -1: LK_DOWN */
    enum lk_state state;
    uint64_t setup_deadline_ns; /* CONNECTING/HELLO: give up then */
    uint64_t connect_started_ns; /* the last start_connect */
    char in[PLX_LOCKD_LINE_MAX];
    size_t in_len; /* buffered bytes of the next line(s) */
    int timer_fd;
    uint64_t timer_ns; /* the heartbeat timer's period now */
    uint64_t lease_ns;
    uint64_t next_beat_ns;
    uint64_t last_attempt_ns; /* last heartbeat attempt (sent or not): the freeze detector */
    uint64_t last_ping_ns;    /* last PING sent */
    uint64_t last_pong_ns;    /* last PONG received: lockd renewed our lease then */
    char why_down[400];       /* why the last connection attempt failed */
    char why_at[700];         /* "addr: why_down", for messages (lockd_unreachable) */
    char refused[400];        /* lockd refused our HELLO: why ("" = it did not) */
    enum lk_try try_state;
    uint64_t try_sent_ns;
    bool try_unsupported;     /* an older lockd: no ADMIN-TRY, claims wait for the admin lock */
    unsigned releases_unread; /* ADMIN-UNLOCKs sent whose RELEASED is due (none is waited for) */
    enum lk_ask ask;
    uint64_t ask_sent_ns;
    /* An ask was withdrawn (ADMIN-UNLOCK) and its RELEASED is not in yet: a GRANTED that comes
     * before it is the withdrawn ask's, not ours to use, and no new ask goes out until then. */
    bool withdrawing;
    /* The socket is in the store's epoll set: an answer the event loop waits for is due (an
     * ask, a withdrawal), so its arrival wakes the loop. Only then: an unread PONG would keep
     * the set readable. */
    bool watched;
    unsigned alive_unread; /* ALIVEs whose answer came too late: take_aside consumes them */
    /* An answer a waiter on the event loop wants came in: lock.c's waiters look (attach's
     * kick: the one way up from here). */
    void (*kick)(plx_store *st);
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void set_timer(struct plx_lockd *lk, uint64_t period_ns)
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

static void lk_close(struct plx_lockd *lk)
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

static int send_ping(struct plx_lockd *lk)
{
    lk->last_ping_ns = mono_ns();
    if (!lk->ping_unanswered_ns)
        lk->ping_unanswered_ns = lk->last_ping_ns;
    return send_line(lk, "PING");
}

/* With several lock managers: has the one we are connected to left heartbeats unanswered for
 * half a lease (stopped, or cut off)? Then close the connection and try the next one: a standby
 * may have taken over. With one lock manager the connection is kept (it may come back). */
static bool unanswered(struct plx_lockd *lk)
{
    uint64_t now = mono_ns();
    if (lk->naddrs < 2 || lk->state != LK_UP || !lk->ping_unanswered_ns ||
        now - lk->ping_unanswered_ns <= lk->lease_ns / 2)
        return false;
    snprintf(lk->why_down, sizeof lk->why_down,
             "%s left heartbeats unanswered for %.1f s (stopped, or cut off)", lk->addrs[lk->cur],
             (double)(now - lk->ping_unanswered_ns) / 1e9);
    lk_close(lk);
    lk->cur = (lk->cur + 1) % lk->naddrs;
    return true;
}

/* A line that answers something other than the request being waited for (a heartbeat, an
 * ADMIN-TRY, the release of an unclaimed TRY grant): note it and say 1 (consumed). */
static bool take_aside(struct plx_lockd *lk, const char *line)
{
    if (!strcmp(line, "PONG")) {
        lk->last_pong_ns = mono_ns();
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
static int take_line(struct plx_lockd *lk, char *out, size_t len)
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
static int fill(struct plx_lockd *lk)
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
        lk_close(lk);
        return -ENOTCONN;
    }
    if (!memchr(lk->in, '\n', lk->in_len)) {
        snprintf(lk->why_down, sizeof lk->why_down, "it sent a line longer than %d bytes",
                 PLX_LOCKD_LINE_MAX);
        lk_close(lk);
        return -EPROTO;
    }
    return 0;
}

/* Read one reply line (blocking, bounded). */
static int read_line(struct plx_lockd *lk, char *out, size_t len, int timeout_ms)
{
    uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (lk->fd < 0)
            return -ENOTCONN;
        if (take_line(lk, out, len))
            return 0;
        uint64_t now = mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0) {
            snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", timeout_ms);
            lk_close(lk);
            return -ETIMEDOUT;
        }
        int rc = fill(lk);
        if (rc)
            return rc;
    }
}

/* Start a non-blocking connect: LK_CONNECTING (or LK_DOWN with why_down set). */
static void start_connect(struct plx_lockd *lk)
{
    lk_close(lk);
    lk->connect_started_ns = mono_ns();
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
    lk->setup_deadline_ns = mono_ns() + CONNECT_TIMEOUT_MS * 1000000ull;
}

/* The lock manager tried now failed (down, unreachable, a standby): start connecting to the
 * next one in the list not tried since one last answered. Leaves LK_DOWN when all were tried. */
static void failover_next(struct plx_lockd *lk)
{
    while (lk->state == LK_DOWN && lk->tried + 1 < lk->naddrs) {
        lk->tried++;
        lk->cur = (lk->cur + 1) % lk->naddrs;
        start_connect(lk);
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
static void setup_step(plx_store *st, int wait_ms)
{
    struct plx_lockd *lk = st->lockd;
    uint64_t until = mono_ns() + (uint64_t)wait_ms * 1000000ull;
    while (lk->state == LK_CONNECTING || lk->state == LK_HELLO) {
        uint64_t now = mono_ns();
        if (now >= lk->setup_deadline_ns) {
            snprintf(lk->why_down, sizeof lk->why_down, "%s: %s", lk->addrs[lk->cur],
                     lk->state == LK_CONNECTING ? "connecting timed out (is its host down?)"
                                                : "no answer to HELLO");
            lk_close(lk);
            failover_next(lk);
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
                lk_close(lk);
                failover_next(lk);
                continue;
            }
            char inst[64], line[PLX_LOCKD_LINE_MAX];
            host_instance(inst, sizeof inst);
            snprintf(line, sizeof line, "HELLO %s %s %u %llu", st->host, inst, st->pid,
                     (unsigned long long)st->epoch);
            if (send_line(lk, line))
                return;
            lk->state = LK_HELLO;
            lk->setup_deadline_ns = mono_ns() + REPLY_TIMEOUT_MS * 1000000ull;
            continue;
        }
        char reply[PLX_LOCKD_LINE_MAX];
        if (fill(lk)) {
            failover_next(lk);
            continue;
        }
        if (!take_line(lk, reply, sizeof reply))
            continue;
        if (!strncmp(reply, "STANDBY", 7)) {
            snprintf(lk->why_down, sizeof lk->why_down, "%s is a standby", lk->addrs[lk->cur]);
            lk->standby_seen = true;
            lk_close(lk);
            failover_next(lk);
            continue;
        }
        unsigned long long lease_ms;
        if (sscanf(reply, "OK %llu", &lease_ms) != 1) {
            lk_close(lk);
            snprintf(lk->refused, sizeof lk->refused, "refused this host: %.300s",
                     strncmp(reply, "ERR ", 4) ? reply : reply + 4);
            snprintf(lk->why_down, sizeof lk->why_down, "%s", lk->refused);
            return;
        }
        lk->lease_ns = lease_ms * 1000000ull;
        lk->refused[0] = 0;
        lk->state = LK_UP;
        lk->tried = 0;
        set_timer(lk, lk->lease_ns / 4);
    }
}

/* Connect and introduce ourselves, waiting (bounded). Returns 0, -ENOTCONN (unreachable:
 * lk->why_down says why) or -EACCES (lockd refused us: the store's message says why). */
static int lk_connect(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (lk->state == LK_DOWN) {
        lk->tried = 0;
        start_connect(lk);
        failover_next(lk);
    }
    /* Each lock manager in the list gets its own time to connect and answer. */
    setup_step(st, (CONNECT_TIMEOUT_MS + REPLY_TIMEOUT_MS) * lk->naddrs);
    if (lk->state == LK_UP)
        return 0;
    if (lk->refused[0])
        return plx_err(st, -EACCES, "the lock manager at %s %s", lk->addr, lk->refused);
    return -ENOTCONN;
}

static int ensure_connected(plx_store *st)
{
    return st->lockd->state == LK_UP ? 0 : lk_connect(st);
}

/* Wait until until_ns for an outstanding ADMIN-TRY's answer: 0 when it is in, -ETIMEDOUT, or
 * -errno when the connection failed. */
static int await_try(struct plx_lockd *lk, uint64_t until_ns)
{
    while (lk->try_state == TRY_ASKED) {
        char line[PLX_LOCKD_LINE_MAX];
        if (lk->fd < 0)
            return -ENOTCONN;
        if (take_line(lk, line, sizeof line))
            continue; /* nothing but answers taken aside is expected between requests */
        uint64_t now = mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        int ms = now < until_ns ? (int)((until_ns - now + 999999) / 1000000) : 0;
        if (poll(&p, 1, ms) <= 0)
            return -ETIMEDOUT;
        int rc = fill(lk);
        if (rc)
            return rc;
    }
    return 0;
}

/* Wait (bounded) for an outstanding ADMIN-TRY's answer: 0, or -errno with the connection closed. */
static int try_settle(struct plx_lockd *lk, int timeout_ms)
{
    int rc = await_try(lk, mono_ns() + (uint64_t)timeout_ms * 1000000ull);
    if (rc == -ETIMEDOUT) {
        snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", timeout_ms);
        lk_close(lk);
    }
    return rc;
}

/* Give the admin lock back, or withdraw an ask: ADMIN-UNLOCK, whose RELEASED nobody waits for
 * (take_aside consumes it). Never waits: lockd handles our lines in order, so a later request
 * of ours comes after the release. If the send fails the connection is gone, and with it
 * everything it held. */
static void send_unlock(struct plx_lockd *lk)
{
    if (lk->state == LK_UP && !send_line(lk, "ADMIN-UNLOCK"))
        lk->releases_unread++;
}

/* Read what has arrived and take the answers it holds (take_aside); other lines are not
 * expected between requests and are dropped. Never waits. */
static void drain(struct plx_lockd *lk)
{
    if (lk->state != LK_UP || fill(lk))
        return;
    char line[PLX_LOCKD_LINE_MAX];
    while (take_line(lk, line, sizeof line))
        ;
}

/* Keep the socket in the store's epoll set exactly while the event loop waits for an answer. */
static void watch_update(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    bool want = lk->state == LK_UP && (lk->ask == ASK_SENT || lk->withdrawing);
    if (want == lk->watched)
        return;
    if (want && plx_engine_watch_fd(st, lk->fd) != 0)
        return; /* the lock timer still looks every ASK_LOOK_NS */
    if (!want)
        plx_engine_unwatch_fd(st, lk->fd);
    lk->watched = want;
}

/* Wait (bounded, keeping our lease) until an outstanding ask is granted: 0, -ETIMEDOUT, or
 * -ENOTCONN when the connection failed. */
static int await_grant(plx_store *st, uint64_t deadline)
{
    struct plx_lockd *lk = st->lockd;
    for (;;) {
        if (lk->fd < 0)
            return -ENOTCONN;
        char line[PLX_LOCKD_LINE_MAX];
        while (take_line(lk, line, sizeof line))
            ; /* nothing but answers taken aside is expected here */
        if (lk->ask == ASK_GRANTED) {
            lk->ask = ASK_NONE;
            return 0;
        }
        if (lk->ask != ASK_SENT && !lk->withdrawing)
            return -ENOTCONN;
        uint64_t now = mono_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        /* No grant yet: a heartbeat tells a lockd that answers nothing from one that queues us
         * (lockd_silent, for the message if the wait times out). */
        if (lk->ask == ASK_SENT && now - lk->ask_sent_ns > ASK_PROBE_NS &&
            lk->last_ping_ns < lk->ask_sent_ns) {
            lk->last_attempt_ns = now;
            if (send_ping(lk))
                return -ENOTCONN;
        }
        uint64_t slice = lk->lease_ns / 4;
        if (lk->last_ping_ns < lk->ask_sent_ns && slice > ASK_PROBE_NS)
            slice = ASK_PROBE_NS;
        if (slice > deadline - now)
            slice = deadline - now;
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(slice / 1000000) + 1);
        if (r > 0) {
            if (fill(lk))
                return -ENOTCONN;
            continue;
        }
        lk->last_attempt_ns = mono_ns();
        if (unanswered(lk) || send_ping(lk))
            return -ENOTCONN;
    }
}

static int lockd_admin_try(plx_store *st, int take)
{
    struct plx_lockd *lk = st->lockd;
    if (!take) {
        send_unlock(lk);
        watch_update(st);
        return 0;
    }
    int rc = ensure_connected(st);
    if (rc)
        return rc;
    if (lk->try_state != TRY_NONE) {
        /* A claim made ahead asked with ADMIN-TRY: its answer first (a grant is ours now). */
        rc = try_settle(lk, REPLY_TIMEOUT_MS);
        if (rc)
            return -ENOTCONN;
        bool granted = lk->try_state == TRY_GRANTED;
        lk->try_state = TRY_NONE;
        if (granted)
            return 0;
    }
    uint64_t deadline = mono_ns() + plx_admin_lock_timeout_ns();
    if (lk->withdrawing) {
        /* A withdrawn ask's RELEASED first: a GRANTED before it is not ours. */
        rc = await_grant(st, mono_ns() + REPLY_TIMEOUT_MS * 1000000ull);
        if (rc == -ETIMEDOUT) {
            snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", REPLY_TIMEOUT_MS);
            lk_close(lk);
        }
        if (lk->fd < 0)
            return -ENOTCONN;
    }
    /* Waiting for the grant happens in lockd's queue; its answer is the grant. An ask a waiter
     * on the event loop made already is the same ask. The connection is our lease, so it is
     * never dropped to give up: a withdrawn request is released. */
    if (lk->ask == ASK_NONE) {
        if (send_line(lk, "ADMIN-LOCK"))
            return -ENOTCONN;
        lk->ask = ASK_SENT;
        lk->ask_sent_ns = mono_ns();
    }
    rc = await_grant(st, deadline);
    if (rc == -ETIMEDOUT) {
        if (st->lock_waiters) {
            watch_update(st); /* a waiter on the loop keeps the ask */
        } else {
            send_unlock(lk);
            lk->ask = ASK_NONE;
            lk->withdrawing = lk->releases_unread > 0;
        }
        return -EWOULDBLOCK;
    }
    watch_update(st);
    return rc ? -ENOTCONN : 0;
}

/* For a waiter on the event loop (plx_admin_lock_async): never waits. */
static int lockd_admin_ask(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (lk->state == LK_DOWN) {
        if (lk->refused[0])
            return plx_err(st, -EACCES, "the lock manager at %s %s", lk->addr, lk->refused);
        /* Not at every look (1-50 ms apart): each attempt resolves the address and opens a
         * socket. The heartbeat's timer advances it. */
        if (mono_ns() - lk->connect_started_ns >= RECONNECT_NS) {
            lk->tried = 0;
            start_connect(lk);
            failover_next(lk); /* several lock managers: the next, if this one failed at once */
            set_timer(lk, SETUP_POLL_NS);
        }
    }
    if (lk->state != LK_UP)
        return -ENOTCONN;
    drain(lk);
    if (lk->state != LK_UP)
        return -ENOTCONN;
    int rc = -EINPROGRESS;
    if (lk->try_state == TRY_GRANTED) {
        lk->try_state = TRY_NONE; /* a claim's late TRY grant: ours now */
        rc = 0;
    } else if (lk->ask == ASK_GRANTED) {
        lk->ask = ASK_NONE;
        rc = 0;
    } else if (lk->withdrawing || lk->try_state == TRY_ASKED) {
        rc = -EINPROGRESS; /* their answers first */
    } else if (lk->ask == ASK_NONE) {
        if (send_line(lk, "ADMIN-LOCK"))
            return -ENOTCONN;
        lk->ask = ASK_SENT;
        lk->ask_sent_ns = mono_ns();
    } else if (mono_ns() - lk->ask_sent_ns > ASK_PROBE_NS && lk->last_ping_ns < lk->ask_sent_ns) {
        /* No grant yet: a heartbeat tells a lockd that answers nothing (stopped, partitioned)
         * from one that queues us behind another holder (lockd_silent). */
        lk->last_attempt_ns = mono_ns();
        (void)send_ping(lk);
    }
    watch_update(st);
    return lk->state == LK_UP || rc == 0 ? rc : -ENOTCONN;
}

static void lockd_admin_withdraw(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (lk->ask == ASK_SENT) {
        send_unlock(lk);
        lk->withdrawing = lk->releases_unread > 0;
    } else if (lk->ask == ASK_GRANTED) {
        send_unlock(lk);
    }
    lk->ask = ASK_NONE;
    watch_update(st);
}

/* Has a heartbeat gone unanswered for SILENT_NS? Then lockd is not answering at all (a queued
 * ask is answered later, a PING at once: a round trip, milliseconds). */
static bool lockd_silent(const plx_store *st, uint64_t since_ns)
{
    struct plx_lockd *lk = st->lockd;
    uint64_t now = mono_ns();
    if (lk->state != LK_UP)
        return true;
    uint64_t t = lk->ping_unanswered_ns;
    if (!t || now - t < SILENT_NS)
        return false;
    snprintf(lk->why_down, sizeof lk->why_down,
             "%s has not answered a heartbeat for %.1f s: stopped, or the network to it is down",
             lk->addrs[lk->cur], (double)(now - t) / 1e9);
    return true;
}

/* From the event loop, for a claim made ahead: ADMIN-TRY, waiting for its answer TRY_WAIT_MS at
 * most. Never connects (the tick does) and never blocks longer. */
static int lockd_admin_try_now(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (lk->try_unsupported)
        return -EOPNOTSUPP;
    if (lk->state != LK_UP)
        return -ENOTCONN;
    if (lk->try_state == TRY_NONE) {
        if (send_line(lk, "ADMIN-TRY"))
            return -ENOTCONN;
        lk->try_state = TRY_ASKED;
        lk->try_sent_ns = mono_ns();
    }
    int rc = await_try(lk, lk->try_sent_ns + TRY_WAIT_MS * 1000000ull);
    if (rc && rc != -ETIMEDOUT)
        return -ENOTCONN;
    if (lk->try_unsupported)
        return -EOPNOTSUPP;
    enum lk_try answer = lk->try_state;
    if (answer == TRY_ASKED)
        return -EWOULDBLOCK; /* not in yet: the next try looks again, without asking again */
    lk->try_state = TRY_NONE;
    return answer == TRY_GRANTED ? 0 : -EWOULDBLOCK;
}

/* ALIVE's answer within timeout_ms: 1 alive or unknown, 0 dead. A late answer is left for
 * take_aside (alive_unread), and the connection stays: it holds our lease and maybe our admin
 * lock, which closing it would hand to another host in the middle of our change. */
static bool ask_alive(struct plx_lockd *lk, const char *line, int timeout_ms)
{
    if (send_line(lk, line))
        return true;
    uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    char reply[PLX_LOCKD_LINE_MAX];
    for (;;) {
        if (lk->fd < 0)
            return true;
        if (take_line(lk, reply, sizeof reply))
            return strcmp(reply, "NO") != 0;
        uint64_t now = mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        if (now >= deadline || poll(&p, 1, (int)((deadline - now + 999999) / 1000000)) <= 0) {
            lk->alive_unread++;
            return true;
        }
        if (fill(lk))
            return true;
    }
}

static bool lockd_holder_alive(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host == st->host_hash)
        return plx_lock_local.holder_alive(st, host, pid, epoch);
    struct plx_lockd *lk = st->lockd;
    char line[128];
    snprintf(line, sizeof line, "ALIVE %llx %u %llu", (unsigned long long)host, pid,
             (unsigned long long)epoch);
    /* On a serving loop (a timer of the service pass: an asynchronous open's; or a server's
     * engine thread) the answer is waited for briefly and no connection is set up: lockd just
     * granted the admin lock when this is asked, and answers at once unless it stopped. */
    bool on_loop = st->in_service || st->serving;
    /* Unreachable: nobody can be declared dead, so nothing is taken from anyone. */
    if (on_loop ? lk->state != LK_UP : ensure_connected((plx_store *)st) != 0)
        return true;
    return ask_alive(lk, line, on_loop ? ALIVE_LOOP_MS : REPLY_TIMEOUT_MS);
}

static const char *lockd_unreachable(const plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    /* Most reasons name the lock manager they are about already ("HOST:PORT: ..."). */
    for (int i = 0; i < lk->naddrs; i++)
        if (!strncmp(lk->why_down, lk->addrs[i], strlen(lk->addrs[i])))
            return lk->why_down;
    snprintf(lk->why_at, sizeof lk->why_at, "%s: %s", lk->addr, lk->why_down);
    return lk->why_at;
}

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
                  (double)(now - lk->last_attempt_ns) / 1e9, (double)lk->lease_ns / 1e9, lk->addr);
    return st->fenced;
}

static void lockd_lease_check(plx_store *st)
{
    frozen(st, mono_ns());
}

/* From the service loop: heartbeat, reconnect, and notice a freeze. Never waits: a lockd
 * whose host is down (no answer, no reset) must not stall the requests this loop serves. */
static void lockd_tick(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    uint64_t junk;
    if (read(lk->timer_fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: woken by something else. */
    }
    if (lk->state == LK_CONNECTING || lk->state == LK_HELLO)
        setup_step(st, 0);
    /* An answer a waiter on the event loop wants may have woken us: take it, and hand a grant
     * (or the news that the ask is gone with the connection) to the lock timer. */
    bool asked = lk->ask == ASK_SENT || lk->withdrawing;
    if (lk->watched)
        drain(lk);
    if (lk->ask == ASK_GRANTED || (asked && lk->ask != ASK_SENT && !lk->withdrawing))
        lk->kick(st);
    uint64_t now = mono_ns();
    if (now >= lk->next_beat_ns && !frozen(st, now)) {
        lk->last_attempt_ns = now;
        lk->next_beat_ns = now + lk->lease_ns / 4;
        if (lk->state == LK_UP && fill(lk) == 0) {
            char line[PLX_LOCKD_LINE_MAX];
            while (take_line(lk, line, sizeof line))
                ; /* nothing but answers taken aside is expected between requests */
        }
        /* A TRY grant that came in after its claim stopped waiting, and nobody took since:
         * give the admin lock back rather than hold it while idle. */
        if (lk->state == LK_UP && lk->try_state == TRY_GRANTED && !send_line(lk, "ADMIN-UNLOCK")) {
            lk->try_state = TRY_NONE;
            lk->releases_unread++;
        } else if (lk->try_state == TRY_BUSY) {
            lk->try_state = TRY_NONE;
        }
        if (lk->state == LK_UP && !unanswered(lk)) {
            send_ping(lk);
        } else if (lk->state == LK_DOWN) {
            lk->tried = 0;
            start_connect(lk); /* unreachable: keep serving; later ticks go on */
            failover_next(lk);
            setup_step(st, 0);
        }
    }
    /* While a connection is being set up, look at it often; else once a quarter lease. */
    bool setting_up = lk->state == LK_CONNECTING || lk->state == LK_HELLO;
    set_timer(lk, setting_up ? SETUP_POLL_NS : lk->lease_ns / 4);
    watch_update(st);
}

static int lockd_lease_confirmed(plx_store *st, uint64_t since_ns)
{
    struct plx_lockd *lk = st->lockd;
    if (!lk)
        return 0;
    if (lk->state == LK_UP && fill(lk) == 0) {
        char line[PLX_LOCKD_LINE_MAX];
        while (take_line(lk, line, sizeof line))
            ;
    }
    if (lk->last_pong_ns > since_ns && lk->state == LK_UP)
        return 1;
    if (lk->state == LK_DOWN)
        start_connect(lk);
    setup_step(st, 0);
    if (lk->state == LK_UP && lk->last_ping_ns <= since_ns)
        send_ping(lk);
    return 0;
}

static uint64_t lockd_lease_ns(const plx_store *st)
{
    return st->lockd ? st->lockd->lease_ns : 0;
}

static void lockd_detach(plx_store *st);

static int lockd_attach(plx_store *st, const char *addr, void (*kick)(plx_store *st))
{
    struct plx_lockd *lk = calloc(1, sizeof *lk);
    if (!lk)
        return plx_err(st, -ENOMEM, "out of memory");
    snprintf(lk->addr, sizeof lk->addr, "%s", addr);
    bool bad = false;
    for (const char *p = addr;; p++) {
        size_t n = strcspn(p, ",");
        bad |= n == 0 || n >= sizeof lk->addrs[0] || lk->naddrs == MAX_ADDRS;
        if (bad)
            break;
        snprintf(lk->addrs[lk->naddrs++], sizeof lk->addrs[0], "%.*s", (int)n, p);
        p += n;
        if (!*p)
            break;
    }
    if (bad) {
        free(lk);
        return plx_err(st, -EINVAL,
                       "lock manager address '%s': give HOST:PORT, or up to %d of them "
                       "separated by commas",
                       addr, MAX_ADDRS);
    }
    lk->fd = -1;
    lk->timer_fd = -1;
    lk->lease_ns = PLX_LOCKD_DEFAULT_LEASE_MS * 1000000ull;
    lk->kick = kick;
    st->lockd = lk;
    int rc = lk_connect(st);
    /* Only standbys answered: one of them is taking over (it does within half a lease). Wait
     * for it as for the admin lock. */
    uint64_t deadline = mono_ns() + plx_admin_lock_timeout_ns();
    while (rc == -ENOTCONN && lk->standby_seen && mono_ns() < deadline) {
        usleep(100000);
        lk->standby_seen = false;
        rc = lk_connect(st);
    }
    if (rc == -ENOTCONN && lk->standby_seen)
        rc = plx_err(st, -EHOSTUNREACH,
                     "no active lock manager at %s: only standbys answered (none took over in "
                     "%.0f s; %s)",
                     addr, plx_admin_lock_timeout_ns() / 1e9, lk->why_down);
    else if (rc == -ENOTCONN)
        rc = plx_err(st, -EHOSTUNREACH, "cannot reach the lock manager at %s: %s", addr,
                     lk->why_down);
    if (!rc) {
        lk->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (lk->timer_fd < 0)
            rc = plx_err(st, -errno, "creating the heartbeat timer: %s", strerror(errno));
    }
    if (!rc) {
        set_timer(lk, lk->lease_ns / 4);
        if (lk->timer_ns != lk->lease_ns / 4)
            rc = plx_err(st, -errno, "setting the heartbeat timer: %s", strerror(errno));
    }
    if (!rc)
        rc = plx_engine_watch_fd(st, lk->timer_fd);
    if (rc) {
        lockd_detach(st);
        return rc;
    }
    lk->last_attempt_ns = mono_ns();
    lk->next_beat_ns = lk->last_attempt_ns + lk->lease_ns / 4;
    st->service_tick = lockd_tick;
    return 0;
}

static void lockd_detach(plx_store *st)
{
    struct plx_lockd *lk = st->lockd;
    if (!lk)
        return;
    lk_close(lk);
    if (lk->timer_fd >= 0)
        close(lk->timer_fd);
    free(lk);
    st->lockd = NULL;
    st->service_tick = NULL;
}

static int lockd_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg)
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

const struct plx_lock_ops plx_lock_lockd = {
    .name = "lockd",
    .admin_try = lockd_admin_try,
    .admin_try_now = lockd_admin_try_now,
    .holder_alive = lockd_holder_alive,
    .unreachable = lockd_unreachable,
    .admin_ask = lockd_admin_ask,
    .admin_withdraw = lockd_admin_withdraw,
    .silent = lockd_silent,
    .attach = lockd_attach,
    .detach = lockd_detach,
    .lease_check = lockd_lease_check,
    .lease_confirmed = lockd_lease_confirmed,
    .lease_ns = lockd_lease_ns,
    .status = lockd_status,
};
