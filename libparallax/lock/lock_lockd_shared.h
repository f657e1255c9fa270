/*
 * lock_lockd_shared.h - what the two files of the lock manager's client share: the connection
 * to parallax-lockd and its protocol lines (lock_lockd_conn.c, below), and the lock seam's
 * operations over it (lock_lockd.c, above). Nothing else includes it.
 */
#ifndef PLX_LOCK_LOCKD_SHARED_H
#define PLX_LOCK_LOCKD_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lock.h"
#include "lockd_proto.h"

#define CONNECT_TIMEOUT_MS 2000
#define REPLY_TIMEOUT_MS 5000

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
    bool standby_seen;           /* a standby answered since the last connection was set up */
    uint64_t ping_unanswered_ns; /* the oldest PING sent since the last PONG (0: none) */
    int fd;                      /* -1: LK_DOWN */
    enum lk_state state;
    uint64_t setup_deadline_ns;  /* CONNECTING/HELLO: give up then */
    uint64_t connect_started_ns; /* the last plx_lk_start_connect */
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

/* lock_lockd_conn.c: the connection and the lines on it. A failure closes the connection
 * (plx_lk_close) with why_down saying why. */
void plx_lk_set_timer(struct plx_lockd *lk, uint64_t period_ns);
void plx_lk_close(struct plx_lockd *lk);
int plx_lk_send_line(struct plx_lockd *lk, const char *line);
int plx_lk_send_ping(struct plx_lockd *lk);
bool plx_lk_unanswered(struct plx_lockd *lk);
int plx_lk_take_line(struct plx_lockd *lk, char *out, size_t len);
int plx_lk_fill(struct plx_lockd *lk);
int plx_lk_read_line(struct plx_lockd *lk, char *out, size_t len, int timeout_ms);
void plx_lk_start_connect(struct plx_lockd *lk);
void plx_lk_failover_next(struct plx_lockd *lk);
void plx_lk_setup_step(plx_store *st, int wait_ms);
int plx_lk_connect(plx_store *st);
int plx_lk_ensure_connected(plx_store *st);
int plx_lk_await_try(struct plx_lockd *lk, uint64_t until_ns);
int plx_lk_try_settle(struct plx_lockd *lk, int timeout_ms);
void plx_lk_send_unlock(struct plx_lockd *lk);
void plx_lk_drain(struct plx_lockd *lk);

#endif
