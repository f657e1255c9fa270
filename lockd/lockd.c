/*
 * lockd.c - parallax-lockd, the lock manager of many hosts sharing one blockstore (thesis
 * 3.4.1; docs/DESIGN.md "The lock manager"; protocol in lockd_proto.h, beside it).
 *
 * It keeps no lock state of its own that matters after a restart. Who holds a VDI or an extent
 * is written on the shared medium by the holder itself (VDI records, extent catalogue), under
 * the admin lock this daemon grants one connection at a time. What only this daemon knows is
 * which holders are alive: each engine process holds a lease on its connection, renewed by
 * every line it sends. After a restart every holder on the medium counts as alive for one grace
 * period, long enough for the live ones to reconnect; after it, a holder without a lease is
 * dead and its VDIs and extents may be taken by others.
 *
 * Several instances on several hosts (--store, the LUN): one is active, the others are
 * standbys, decided on the LUN itself by SCSI-3 persistent reservation keys (arbiter.c). A
 * standby answers HELLO with STANDBY, so engines try the next address they were given. The active
 * one grants the admin lock only while its last renewal on the LUN is recent (arbiter.h:
 * valid_until), and after becoming active it grants nothing, and counts every holder as alive, for
 * one grace period: every lease and grant the former active one gave out has run its course by
 * then, and the live engines have reconnected. An active one that can no longer renew steps down:
 * it closes every connection and becomes a standby.
 *
 * One poll loop (and the arbiter's thread); nothing here touches the data path.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "arbiter.h"
#include "lockd_proto.h"

#define MAX_CONNS 1024

struct conn {
    int fd;
    bool hello; /* HELLO accepted */
    char host_id[64];
    char instance[64];
    uint64_t host_hash, epoch;
    uint32_t pid;
    uint64_t last_ns;    /* last line received: the lease runs from here */
    bool waiting_admin;  /* queued for the admin lock */
    uint64_t standby_ns; /* told STANDBY then: closed when the client has not within a second */
    uint64_t wait_seq;   /* queue order */
    char in[PLX_LOCKD_LINE_MAX];
    size_t in_len;
};

static struct conn *conns[MAX_CONNS];
static struct conn *admin_holder;
static uint64_t admin_seq;
static uint64_t lease_ns;
static uint64_t grace_until_ns;
/* Fail-over (--store): is this instance active, since when may it grant, and until when. Without
 * --store it is the only one: always active, granting at once. */
static bool ha, active = true;
static uint64_t grant_from_ns, valid_until_ns = UINT64_MAX, grace_ns;
static const char *instance_id = "";
static uint64_t arb_window_ns;
static volatile sig_atomic_t stopping;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("parallax-lockd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void reply(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply(struct conn *c, const char *fmt, ...)
{
    char line[PLX_LOCKD_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* Replies are short and the client reads them at once; a client that does not is dropped
     * rather than allowed to stall everyone. */
    if (send(c->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) != n) {
        shutdown(c->fd, SHUT_RDWR);
    }
}

static bool lease_live(const struct conn *c, uint64_t now)
{
    return c->hello && now - c->last_ns < lease_ns;
}

/* May this instance grant the admin lock now? Read with a fresh clock at each grant: a process
 * that was stopped must not grant on a renewal older than its window. */
static bool may_grant(void)
{
    if (!ha)
        return true;
    uint64_t now = now_ns();
    return active && now >= grant_from_ns && now < valid_until_ns;
}

/* Grant the admin lock to the longest-waiting connection, if it is free. */
static void admin_grant(void)
{
    if (admin_holder || !may_grant())
        return;
    struct conn *next = NULL;
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i] && conns[i]->waiting_admin && (!next || conns[i]->wait_seq < next->wait_seq))
            next = conns[i];
    if (!next)
        return;
    next->waiting_admin = false;
    admin_holder = next;
    reply(next, "GRANTED");
}

static void conn_close(int i, const char *why)
{
    struct conn *c = conns[i];
    if (c->hello)
        say("%s pid %u disconnected (%s)", c->host_id, c->pid, why);
    if (admin_holder == c) {
        admin_holder = NULL;
        admin_grant();
    }
    close(c->fd);
    free(c);
    conns[i] = NULL;
    admin_grant();
}

static void cmd_hello(struct conn *c, char *args, uint64_t now)
{
    char id[64], inst[64];
    unsigned pid;
    unsigned long long epoch;
    if (sscanf(args, "%63s %63s %u %llu", id, inst, &pid, &epoch) != 4) {
        reply(c, "ERR HELLO needs: host-id instance pid epoch");
        return;
    }
    for (int i = 0; i < MAX_CONNS; i++) {
        const struct conn *o = conns[i];
        if (o && o != c && lease_live(o, now) && !strcmp(o->host_id, id) &&
            strcmp(o->instance, inst) != 0) {
            reply(c,
                  "ERR host id '%s' is in use by another live host (instance %s, pid %u): "
                  "give each host its own id (/etc/parallax/host-id or $PARALLAX_HOST_ID)",
                  id, o->instance, o->pid);
            return;
        }
    }
    snprintf(c->host_id, sizeof c->host_id, "%s", id);
    snprintf(c->instance, sizeof c->instance, "%s", inst);
    c->host_hash = plx_host_hash(id);
    c->pid = pid;
    c->epoch = epoch;
    c->hello = true;
    say("%s pid %u connected", id, pid);
    reply(c, "OK %llu", (unsigned long long)(lease_ns / 1000000));
}

/* Is the holder (host hash, pid, epoch) alive? A live lease says yes; none says no, except in
 * the grace period after a start, when every holder on the medium may still reconnect. */
static bool holder_alive(uint64_t hash, uint32_t pid, uint64_t epoch, uint64_t now)
{
    for (int i = 0; i < MAX_CONNS; i++) {
        const struct conn *o = conns[i];
        if (o && lease_live(o, now) && o->host_hash == hash && o->pid == pid && o->epoch == epoch)
            return true;
    }
    /* A standby, or an active one whose window ran out, declares nobody dead. */
    return now < grace_until_ns || !active || (ha && now_ns() >= valid_until_ns);
}

static void cmd_status(struct conn *c, uint64_t now)
{
    for (int i = 0; i < MAX_CONNS; i++) {
        const struct conn *o = conns[i];
        if (!o || !o->hello)
            continue;
        reply(c, "HOST %s pid %u lease %s %llu ms%s", o->host_id, o->pid,
              lease_live(o, now) ? "live" : "expired",
              (unsigned long long)((now - o->last_ns) / 1000000),
              admin_holder == o ? " admin-lock" : "");
    }
    if (now < grace_until_ns)
        reply(c, "GRACE %llu ms", (unsigned long long)((grace_until_ns - now) / 1000000));
    if (ha && now < grant_from_ns)
        reply(c, "TAKEOVER %s grants in %llu ms", instance_id,
              (unsigned long long)((grant_from_ns - now) / 1000000));
    reply(c, "END");
}

static void handle_line(struct conn *c, char *line, uint64_t now)
{
    char *args = strchr(line, ' ');
    if (args)
        *args++ = 0;
    else
        args = line + strlen(line);
    if (!c->hello && strcmp(line, "HELLO") != 0 && strcmp(line, "STATUS") != 0) {
        reply(c, "ERR say HELLO first");
        return;
    }
    if (!active && (!strcmp(line, "HELLO") || !strcmp(line, "STATUS"))) {
        /* The engine tries the next lock manager it knows of. Not shut down here: the client
         * reads the line before it sees the connection end (expire_leases closes it later). */
        reply(c, "STANDBY %s is a standby lock manager", instance_id);
        c->standby_ns = now;
        return;
    }
    if (!strcmp(line, "HELLO")) {
        cmd_hello(c, args, now);
    } else if (!strcmp(line, "PING")) {
        /* The lease was renewed by receiving the line; the answer tells the engine so (it
         * confirms its lease before registering again at a restarted target). */
        reply(c, "PONG");
    } else if (!strcmp(line, "ADMIN-LOCK")) {
        if (admin_holder == c) {
            reply(c, "ERR this connection holds the admin lock already");
            return;
        }
        c->waiting_admin = true;
        c->wait_seq = ++admin_seq;
        admin_grant();
    } else if (!strcmp(line, "ADMIN-TRY")) {
        /* For a claim made ahead from an engine's event loop: answered at once, never queued,
         * and not ahead of anyone queued. */
        bool idle = admin_holder == NULL && may_grant();
        for (int i = 0; idle && i < MAX_CONNS; i++)
            idle = !(conns[i] && conns[i]->waiting_admin);
        if (idle)
            admin_holder = c;
        reply(c, idle ? "TRY-GRANTED" : "TRY-BUSY");
    } else if (!strcmp(line, "ADMIN-UNLOCK")) {
        if (admin_holder == c) {
            admin_holder = NULL;
            admin_grant();
        }
        c->waiting_admin = false;
        reply(c, "RELEASED");
    } else if (!strcmp(line, "ALIVE")) {
        unsigned long long hash, epoch;
        unsigned pid;
        if (sscanf(args, "%llx %u %llu", &hash, &pid, &epoch) != 3)
            reply(c, "ERR ALIVE needs: host-hash pid epoch");
        else
            reply(c, "%s", holder_alive(hash, pid, epoch, now) ? "YES" : "NO");
    } else if (!strcmp(line, "STATUS")) {
        cmd_status(c, now);
    } else {
        reply(c, "ERR unknown command '%s'", line);
    }
}

static void conn_read(int i, uint64_t now)
{
    struct conn *c = conns[i];
    ssize_t n = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(i, n == 0 ? "closed" : strerror(errno));
        return;
    }
    if (n < 0)
        return;
    c->in_len += (size_t)n;
    c->last_ns = now;
    char *nl;
    while (conns[i] && (nl = memchr(c->in, '\n', c->in_len))) {
        *nl = 0;
        size_t used = (size_t)(nl - c->in) + 1;
        char line[PLX_LOCKD_LINE_MAX];
        memcpy(line, c->in, used);
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        handle_line(c, line, now);
    }
    if (conns[i] && c->in_len == sizeof c->in)
        conn_close(i, "line too long");
}

/* A connection whose lease ran out is a holder that stopped (frozen, partitioned): drop it, so
 * whatever it held (the admin lock) is free, and holder_alive says no from now on. */
static void expire_leases(uint64_t now)
{
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i] && conns[i]->standby_ns && now - conns[i]->standby_ns > 1000000000ull)
            conn_close(i, "told it this lock manager is a standby");
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i] && conns[i]->hello && !lease_live(conns[i], now)) {
            say("%s pid %u: lease expired", conns[i]->host_id, conns[i]->pid);
            conn_close(i, "lease expired");
        }
}

/* Take the arbiter's word: become active (grant nothing, and count every holder as alive, for a
 * grace period and at least one window), or stop being active (drop every connection: its
 * engines go to the next lock manager they know of). */
static void follow_arbiter(void)
{
    static uint64_t gave_up; /* the arbiter's generation we stepped down from */
    struct arb_view v;
    arb_get(&v);
    if (v.generation == gave_up)
        v.active = false; /* the arbiter has yet to drop the key */
    uint64_t now = now_ns();
    if (v.active && !active) {
        active = true;
        uint64_t wait = grace_ns > arb_window_ns ? grace_ns : arb_window_ns;
        grant_from_ns = v.since_ns + wait;
        grace_until_ns = v.since_ns + grace_ns;
        say("active: engines may connect; granting the admin lock in %.1f s",
            (double)(grant_from_ns > now ? grant_from_ns - now : 0) / 1e9);
    }
    valid_until_ns = v.active ? v.valid_until_ns : 0;
    if (active && (!v.active || now >= valid_until_ns)) {
        active = false;
        say("%s: now a standby; dropping every connection",
            v.active ? "could not renew our key on the LUN in time" : "our key was taken");
        admin_holder = NULL;
        for (int i = 0; i < MAX_CONNS; i++)
            if (conns[i])
                conn_close(i, "this lock manager is a standby now");
        if (v.active) {
            gave_up = v.generation;
            arb_step_down();
        }
    }
}

static int listen_on(const char *addr, char *err, size_t errlen)
{
    char host[256] = "0.0.0.0", port[16];
    snprintf(port, sizeof port, "%d", PLX_LOCKD_DEFAULT_PORT);
    const char *colon = strrchr(addr, ':');
    if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
        snprintf(port, sizeof port, "%s", colon + 1);
    } else if (*addr) {
        snprintf(host, sizeof host, "%s", addr);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "%s port %s: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        snprintf(err, errlen, "listening on %s:%s: %s", host, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: parallax-lockd [--listen [ADDR]:PORT] [--lease SECONDS] "
            "[--grace SECONDS] [--store LUN [--id NAME]]\n"
            "  --listen  address to listen on (default 0.0.0.0:%d)\n"
            "  --lease   how long a holder stays alive after its last heartbeat "
            "(default %u)\n"
            "  --grace   after a start (or taking over), how long every holder counts as "
            "alive\n"
            "            (default: the lease plus 2 s; with --store, the lease)\n"
            "  --store   the blockstore's iSCSI LUN: one of several lock managers, the active "
            "one\n"
            "            chosen on the LUN (the others are standbys that take over)\n"
            "  --id      this lock manager's name among them (default: the --listen "
            "address)\n",
            PLX_LOCKD_DEFAULT_PORT, PLX_LOCKD_DEFAULT_LEASE_MS / 1000);
}

static bool parse_seconds(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || v <= 0 || v > 3600)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    const char *listen_addr = "", *store = NULL;
    double lease_s = PLX_LOCKD_DEFAULT_LEASE_MS / 1000.0, grace_s = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc) {
            listen_addr = argv[++i];
        } else if (!strcmp(argv[i], "--lease") && i + 1 < argc) {
            if (!parse_seconds(argv[++i], &lease_s)) {
                say("--lease '%s': not a number of seconds (0 to 3600)", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--grace") && i + 1 < argc) {
            if (!parse_seconds(argv[++i], &grace_s)) {
                say("--grace '%s': not a number of seconds (0 to 3600)", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--store") && i + 1 < argc) {
            store = argv[++i];
        } else if (!strcmp(argv[i], "--id") && i + 1 < argc) {
            instance_id = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    lease_ns = (uint64_t)(lease_s * 1e9);
    if (grace_s < 0)
        grace_s = store ? lease_s : lease_s + 2;
    grace_ns = (uint64_t)(grace_s * 1e9);
    if (!*instance_id)
        instance_id = *listen_addr ? listen_addr : "lockd";
    if (strlen(instance_id) > 48 || strpbrk(instance_id, " \t\n")) {
        say("--id '%s': at most 48 characters, no spaces", instance_id);
        return 2;
    }
    char err[300];
    int lfd = listen_on(listen_addr, err, sizeof err);
    if (lfd < 0) {
        say("%s", err);
        return 1;
    }
    grace_until_ns = now_ns() + grace_ns;
    /* The arbiter's timing, from the lease (docs/DESIGN.md, "Fail-over"): the active one renews
     * its key twelve times a lease, a standby takes over a key unchanged for a quarter lease
     * (three renewals missed), and a renewal lets the active one grant for a quarter lease
     * after it started. */
    struct arb_config acfg = {.url = store,
                              .id = instance_id,
                              .period_ns = lease_ns / 12,
                              .stale_ns = lease_ns / 4,
                              .window_ns = lease_ns / 4};
    if (store) {
        ha = true;
        arb_window_ns = acfg.window_ns;
        active = false;
        valid_until_ns = 0;
        if (strncmp(store, "iscsi://", 8) != 0) {
            say("--store '%s': give the blockstore's iSCSI LUN (iscsi://HOST[:PORT]/IQN/LUN)",
                store);
            return 2;
        }
        if (arb_start(&acfg, err, sizeof err) != 0) {
            say("%s", err);
            return 1;
        }
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    say("listening on %s (lease %.1f s, grace %.1f s)%s", *listen_addr ? listen_addr : "0.0.0.0",
        lease_s, grace_s, ha ? ", a standby until the LUN makes it the active one" : "");

    static struct pollfd pfd[MAX_CONNS + 1];
    while (!stopping) {
        int n = 0;
        int map[MAX_CONNS + 1];
        pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        map[n++] = -1;
        for (int i = 0; i < MAX_CONNS; i++)
            if (conns[i]) {
                pfd[n] = (struct pollfd){.fd = conns[i]->fd, .events = POLLIN};
                map[n++] = i;
            }
        int timeout_ms = (int)(lease_ns / (ha ? 20000000 : 4000000)) + 1;
        int r = poll(pfd, (nfds_t)n, timeout_ms);
        if (r < 0 && errno != EINTR) {
            say("poll: %s", strerror(errno));
            return 1;
        }
        uint64_t now = now_ns();
        for (int k = 0; r > 0 && k < n; k++) {
            if (!pfd[k].revents)
                continue;
            if (map[k] < 0) {
                int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                if (cfd < 0)
                    continue;
                int slot = 0;
                while (slot < MAX_CONNS && conns[slot])
                    slot++;
                struct conn *c = slot < MAX_CONNS ? calloc(1, sizeof *c) : NULL;
                if (!c) {
                    close(cfd);
                    continue;
                }
                int one = 1;
                setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                c->fd = cfd;
                c->last_ns = now;
                conns[slot] = c;
            } else if (conns[map[k]]) {
                conn_read(map[k], now);
            }
        }
        if (ha)
            follow_arbiter();
        expire_leases(now);
        admin_grant();
    }
    say("stopping");
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i])
            conn_close(i, "lockd stopping");
    if (ha)
        arb_stop();
    close(lfd);
    return 0;
}
