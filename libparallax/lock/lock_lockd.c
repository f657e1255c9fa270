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
 *
 * The connection itself (setting it up, fail-over, the protocol's lines, the answers taken aside)
 * is lock_lockd_conn.c's, the layer below this one (lock_lockd_shared.h).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include "lock_lockd_shared.h"

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

/* Keep the socket in the store's epoll set exactly while the event loop waits for an answer. */
static void watch_update(plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
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
    struct plx_lockd *lk = st->lock_state;
    for (;;) {
        if (lk->fd < 0)
            return -ENOTCONN;
        char line[PLX_LOCKD_LINE_MAX];
        while (plx_lk_take_line(lk, line, sizeof line))
            ; /* nothing but answers taken aside is expected here */
        if (lk->ask == ASK_GRANTED) {
            lk->ask = ASK_NONE;
            return 0;
        }
        if (lk->ask != ASK_SENT && !lk->withdrawing)
            return -ENOTCONN;
        uint64_t now = plx_mono_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        /* No grant yet: a heartbeat tells a lockd that answers nothing from one that queues us
         * (lockd_silent, for the message if the wait times out). */
        if (lk->ask == ASK_SENT && now - lk->ask_sent_ns > ASK_PROBE_NS &&
            lk->last_ping_ns < lk->ask_sent_ns) {
            lk->last_attempt_ns = now;
            if (plx_lk_send_ping(lk))
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
            if (plx_lk_fill(lk))
                return -ENOTCONN;
            continue;
        }
        lk->last_attempt_ns = plx_mono_ns();
        if (plx_lk_unanswered(lk) || plx_lk_send_ping(lk))
            return -ENOTCONN;
    }
}

static int lockd_admin_try(plx_store *st, int take)
{
    struct plx_lockd *lk = st->lock_state;
    if (!take) {
        plx_lk_send_unlock(lk);
        watch_update(st);
        return 0;
    }
    int rc = plx_lk_ensure_connected(st);
    if (rc)
        return rc;
    if (lk->try_state != TRY_NONE) {
        /* A claim made ahead asked with ADMIN-TRY: its answer first (a grant is ours now). */
        rc = plx_lk_try_settle(lk, REPLY_TIMEOUT_MS);
        if (rc)
            return -ENOTCONN;
        bool granted = lk->try_state == TRY_GRANTED;
        lk->try_state = TRY_NONE;
        if (granted)
            return 0;
    }
    uint64_t deadline = plx_mono_ns() + plx_admin_lock_timeout_ns();
    if (lk->withdrawing) {
        /* A withdrawn ask's RELEASED first: a GRANTED before it is not ours. */
        rc = await_grant(st, plx_mono_ns() + REPLY_TIMEOUT_MS * 1000000ull);
        if (rc == -ETIMEDOUT) {
            snprintf(lk->why_down, sizeof lk->why_down, "no answer within %d ms", REPLY_TIMEOUT_MS);
            plx_lk_close(lk);
        }
        if (lk->fd < 0)
            return -ENOTCONN;
    }
    /* Waiting for the grant happens in lockd's queue; its answer is the grant. An ask a waiter
     * on the event loop made already is the same ask. The connection is our lease, so it is
     * never dropped to give up: a withdrawn request is released. */
    if (lk->ask == ASK_NONE) {
        if (plx_lk_send_line(lk, "ADMIN-LOCK"))
            return -ENOTCONN;
        lk->ask = ASK_SENT;
        lk->ask_sent_ns = plx_mono_ns();
    }
    rc = await_grant(st, deadline);
    if (rc == -ETIMEDOUT) {
        if (st->lock_waiters) {
            watch_update(st); /* a waiter on the loop keeps the ask */
        } else {
            plx_lk_send_unlock(lk);
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
    struct plx_lockd *lk = st->lock_state;
    if (lk->state == LK_DOWN) {
        if (lk->refused[0])
            return plx_err(st, -EACCES, "the lock manager at %s %s", lk->addr, lk->refused);
        /* Not at every look (1-50 ms apart): each attempt resolves the address and opens a
         * socket. The heartbeat's timer advances it. */
        if (plx_mono_ns() - lk->connect_started_ns >= RECONNECT_NS) {
            lk->tried = 0;
            plx_lk_start_connect(lk);
            plx_lk_failover_next(
                lk); /* several lock managers: the next, if this one failed at once */
            plx_lk_set_timer(lk, SETUP_POLL_NS);
        }
    }
    if (lk->state != LK_UP)
        return -ENOTCONN;
    plx_lk_drain(lk);
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
        if (plx_lk_send_line(lk, "ADMIN-LOCK"))
            return -ENOTCONN;
        lk->ask = ASK_SENT;
        lk->ask_sent_ns = plx_mono_ns();
    } else if (plx_mono_ns() - lk->ask_sent_ns > ASK_PROBE_NS &&
               lk->last_ping_ns < lk->ask_sent_ns) {
        /* No grant yet: a heartbeat tells a lockd that answers nothing (stopped, partitioned)
         * from one that queues us behind another holder (lockd_silent). */
        lk->last_attempt_ns = plx_mono_ns();
        (void)plx_lk_send_ping(lk);
    }
    watch_update(st);
    return lk->state == LK_UP || rc == 0 ? rc : -ENOTCONN;
}

static void lockd_admin_withdraw(plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
    if (lk->ask == ASK_SENT) {
        plx_lk_send_unlock(lk);
        lk->withdrawing = lk->releases_unread > 0;
    } else if (lk->ask == ASK_GRANTED) {
        plx_lk_send_unlock(lk);
    }
    lk->ask = ASK_NONE;
    watch_update(st);
}

/* Has a heartbeat gone unanswered for SILENT_NS? Then lockd is not answering at all (a queued
 * ask is answered later, a PING at once: a round trip, milliseconds). */
static bool lockd_silent(const plx_store *st, uint64_t since_ns)
{
    struct plx_lockd *lk = st->lock_state;
    uint64_t now = plx_mono_ns();
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
    struct plx_lockd *lk = st->lock_state;
    if (lk->try_unsupported)
        return -EOPNOTSUPP;
    if (lk->state != LK_UP)
        return -ENOTCONN;
    if (lk->try_state == TRY_NONE) {
        if (plx_lk_send_line(lk, "ADMIN-TRY"))
            return -ENOTCONN;
        lk->try_state = TRY_ASKED;
        lk->try_sent_ns = plx_mono_ns();
    }
    int rc = plx_lk_await_try(lk, lk->try_sent_ns + TRY_WAIT_MS * 1000000ull);
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
    if (plx_lk_send_line(lk, line))
        return true;
    uint64_t deadline = plx_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    char reply[PLX_LOCKD_LINE_MAX];
    for (;;) {
        if (lk->fd < 0)
            return true;
        if (plx_lk_take_line(lk, reply, sizeof reply))
            return strcmp(reply, "NO") != 0;
        uint64_t now = plx_mono_ns();
        struct pollfd p = {.fd = lk->fd, .events = POLLIN};
        if (now >= deadline || poll(&p, 1, (int)((deadline - now + 999999) / 1000000)) <= 0) {
            lk->alive_unread++;
            return true;
        }
        if (plx_lk_fill(lk))
            return true;
    }
}

static bool lockd_holder_alive(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host == st->host_hash)
        return plx_lock_local.holder_alive(st, host, pid, epoch);
    struct plx_lockd *lk = st->lock_state;
    char line[128];
    snprintf(line, sizeof line, "ALIVE %llx %u %llu", (unsigned long long)host, pid,
             (unsigned long long)epoch);
    /* On a serving loop (a timer of the service pass: an asynchronous open's; or a server's
     * engine thread) the answer is waited for briefly and no connection is set up: lockd just
     * granted the admin lock when this is asked, and answers at once unless it stopped. */
    bool on_loop = st->in_service || st->serving;
    /* Unreachable: nobody can be declared dead, so nothing is taken from anyone. */
    if (on_loop ? lk->state != LK_UP : plx_lk_ensure_connected((plx_store *)st) != 0)
        return true;
    return ask_alive(lk, line, on_loop ? ALIVE_LOOP_MS : REPLY_TIMEOUT_MS);
}

static const char *lockd_unreachable(const plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
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
    struct plx_lockd *lk = st->lock_state;
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
    frozen(st, plx_mono_ns());
}

/* From the service loop: heartbeat, reconnect, and notice a freeze. Never waits: a lockd
 * whose host is down (no answer, no reset) must not stall the requests this loop serves. */
static void lockd_tick(plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
    uint64_t junk;
    if (read(lk->timer_fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: woken by something else. */
    }
    if (lk->state == LK_CONNECTING || lk->state == LK_HELLO)
        plx_lk_setup_step(st, 0);
    /* An answer a waiter on the event loop wants may have woken us: take it, and hand a grant
     * (or the news that the ask is gone with the connection) to the lock timer. */
    bool asked = lk->ask == ASK_SENT || lk->withdrawing;
    if (lk->watched)
        plx_lk_drain(lk);
    if (lk->ask == ASK_GRANTED || (asked && lk->ask != ASK_SENT && !lk->withdrawing))
        lk->kick(st);
    uint64_t now = plx_mono_ns();
    if (now >= lk->next_beat_ns && !frozen(st, now)) {
        lk->last_attempt_ns = now;
        lk->next_beat_ns = now + lk->lease_ns / 4;
        if (lk->state == LK_UP && plx_lk_fill(lk) == 0) {
            char line[PLX_LOCKD_LINE_MAX];
            while (plx_lk_take_line(lk, line, sizeof line))
                ; /* nothing but answers taken aside is expected between requests */
        }
        /* A TRY grant that came in after its claim stopped waiting, and nobody took since:
         * give the admin lock back rather than hold it while idle. */
        if (lk->state == LK_UP && lk->try_state == TRY_GRANTED &&
            !plx_lk_send_line(lk, "ADMIN-UNLOCK")) {
            lk->try_state = TRY_NONE;
            lk->releases_unread++;
        } else if (lk->try_state == TRY_BUSY) {
            lk->try_state = TRY_NONE;
        }
        if (lk->state == LK_UP && !plx_lk_unanswered(lk)) {
            plx_lk_send_ping(lk);
        } else if (lk->state == LK_DOWN) {
            lk->tried = 0;
            plx_lk_start_connect(lk); /* unreachable: keep serving; later ticks go on */
            plx_lk_failover_next(lk);
            plx_lk_setup_step(st, 0);
        }
    }
    /* While a connection is being set up, look at it often; else once a quarter lease. */
    bool setting_up = lk->state == LK_CONNECTING || lk->state == LK_HELLO;
    plx_lk_set_timer(lk, setting_up ? SETUP_POLL_NS : lk->lease_ns / 4);
    watch_update(st);
}

static int lockd_lease_confirmed(plx_store *st, uint64_t since_ns)
{
    struct plx_lockd *lk = st->lock_state;
    if (!lk)
        return 0;
    if (lk->state == LK_UP && plx_lk_fill(lk) == 0) {
        char line[PLX_LOCKD_LINE_MAX];
        while (plx_lk_take_line(lk, line, sizeof line))
            ;
    }
    if (lk->last_pong_ns > since_ns && lk->state == LK_UP)
        return 1;
    if (lk->state == LK_DOWN)
        plx_lk_start_connect(lk);
    plx_lk_setup_step(st, 0);
    if (lk->state == LK_UP && lk->last_ping_ns <= since_ns)
        plx_lk_send_ping(lk);
    return 0;
}

static uint64_t lockd_lease_ns(const plx_store *st)
{
    const struct plx_lockd *lk = st->lock_state;
    return lk ? lk->lease_ns : 0;
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
    st->lock_state = lk;
    int rc = plx_lk_connect(st);
    /* Only standbys answered: one of them is taking over (it does within half a lease). Wait
     * for it as for the admin lock. */
    uint64_t deadline = plx_mono_ns() + plx_admin_lock_timeout_ns();
    while (rc == -ENOTCONN && lk->standby_seen && plx_mono_ns() < deadline) {
        usleep(100000);
        lk->standby_seen = false;
        rc = plx_lk_connect(st);
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
        plx_lk_set_timer(lk, lk->lease_ns / 4);
        if (lk->timer_ns != lk->lease_ns / 4)
            rc = plx_err(st, -errno, "setting the heartbeat timer: %s", strerror(errno));
    }
    if (!rc)
        rc = plx_engine_watch_fd(st, lk->timer_fd);
    if (rc) {
        lockd_detach(st);
        return rc;
    }
    lk->last_attempt_ns = plx_mono_ns();
    lk->next_beat_ns = lk->last_attempt_ns + lk->lease_ns / 4;
    st->service_tick = lockd_tick;
    return 0;
}

static void lockd_detach(plx_store *st)
{
    struct plx_lockd *lk = st->lock_state;
    if (!lk)
        return;
    plx_lk_close(lk);
    if (lk->timer_fd >= 0)
        close(lk->timer_fd);
    free(lk);
    st->lock_state = NULL;
    st->service_tick = NULL;
}

static int lockd_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg)
{
    if (!st->lock_state)
        return plx_err(st, -ENOENT, "this blockstore has no lock manager");
    struct plx_lockd *lk = st->lock_state;
    char reply[PLX_LOCKD_LINE_MAX];
    int rc = plx_lk_ensure_connected(st);
    if (!rc)
        rc = plx_lk_send_line(lk, "STATUS");
    while (!rc) {
        rc = plx_lk_read_line(lk, reply, sizeof reply, REPLY_TIMEOUT_MS);
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
