/*
 * nbd_server.c - an event-driven NBD server on the engine thread; see nbd_server.h. This file
 * starts and stops it: the listening sockets, accepting a client, the engine loop's idle hook.
 *
 * Written from the NBD protocol specification (doc/proto.md of the NBD project): fixed
 * newstyle handshake, options EXPORT_NAME, GO, INFO, LIST, ABORT, STARTTLS, STRUCTURED_REPLY,
 * SET_META_CONTEXT and LIST_META_CONTEXT ("base:allocation"), commands READ, WRITE, DISC,
 * FLUSH, TRIM, WRITE_ZEROES and BLOCK_STATUS. Its parts, one file each, in their order from the
 * top (a part calls only those after it; docs/DESIGN.md, "The NBD server's files"; what they
 * share is in nbd_internal.h): this file, nbd_conn.c a client's connection (input, the events
 * it waits for; the life of a connection is described there), nbd_handshake.c the options,
 * nbd_exports.c the exports and their VDIs, nbd_handover.c exports waiting for a VDI another
 * process holds, nbd_transmission.c requests and replies, nbd_output.c a connection's output
 * and its switch to TLS, nbd_wcache.c the write cache's modes, nbd_buffers.c the request
 * buffers, nbd_tls.c the TLS sessions; nbd_proto.h the protocol's numbers.
 */
#include "nbd_server.h"

#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <stddef.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "parallax_control.h"
#include "nbd_internal.h"

/* The one server of the process (NULL while none runs): the listeners and the control socket's
 * lookups reach it through this. */
static struct nbd_server *the_server;

plx_vdi *nbd_server_find_writable(uint64_t id)
{
    if (!the_server)
        return NULL;
    for (struct export *e = the_server->exports; e; e = e->next)
        if (e->v && e->closing != 2 && !plx_vdi_readonly(e->v) && plx_vdi_id(e->v) == id)
            return e->v;
    return NULL;
}

/* The engine loop's idle hook: write replies, resume parsing, free finished connections. */
static void server_idle(void *arg, plx_store *st)
{
    struct nbd_server *srv = arg;
    /* First: a close runs other requests' callbacks, and the connections they kick are served
     * by the loop below rather than at the next wake-up. */
    export_reap(srv);
    while (srv->dirty_head) {
        struct conn *c = srv->dirty_head;
        srv->dirty_head = c->dirty_next;
        c->dirty = 0;
        if (c->tls_state == TLS_UP && nbd_tls_pending(c->tls) && nbd_may_read(c))
            nbd_conn_read(c);
        nbd_conn_parse(c, st);
        nbd_conn_flush(c);
        if (nbd_conn_finished(c))
            nbd_conn_destroy(c); /* may run other callbacks (closing a VDI): they only kick */
        else
            nbd_conn_update(c);
    }
}

static void listener_ready(struct et_fd_handler *h, plx_store *st)
{
    struct nbd_server *srv = the_server;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails on unix: fine */
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->h.fd = fd;
        c->h.on_ready = nbd_conn_ready;
        c->srv = srv;
        c->events = EPOLLIN;
        c->watched = 1;
        if (et_watch_events(srv->et, &c->h, EPOLLIN) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->conns;
        if (srv->conns)
            srv->conns->prev = c;
        srv->conns = c;
        unsigned char g[18];
        put64(g, NBD_MAGIC_INIT);
        put64(g + 8, NBD_MAGIC_OPT);
        put16(g + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
        nbd_queue(c, g, sizeof g, NULL, 0);
        nbd_conn_flush(c);
        nbd_conn_update(c);
    }
}

/* ---- start and stop
 * ------------------------------------------------------------------------------ */

static int listen_unix(struct nbd_server *srv, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "%s: socket path too long", path);
        return -ENAMETOOLONG;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
        /* A socket nobody accepts on was left by a server that died: take its place. One that
         * accepts belongs to a running server, which must keep it. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            snprintf(err, errlen, "%s: another server is listening on this socket", path);
            return -EADDRINUSE;
        }
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    snprintf(srv->unix_path, sizeof srv->unix_path, "%s", path);
    srv->lis[srv->nlis++].fd = fd;
    return 0;
}

static void set_sockaddr_port(struct sockaddr *sa, uint16_t port)
{
    if (sa->sa_family == AF_INET)
        ((struct sockaddr_in *)sa)->sin_port = htons(port);
    else if (sa->sa_family == AF_INET6)
        ((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

static int listen_tcp(struct nbd_server *srv, const char *port, const char *addr, char *err,
                      size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(addr, port, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "%s port %s: %s", addr, port, gai_strerror(rc));
        return -EINVAL;
    }
    int e = 0;
    for (struct addrinfo *ai = res; ai && srv->nlis < NBD_MAX_LISTENERS; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        /* Port 0: the kernel picks a free port for the first address; every further address
         * (IPv6 beside IPv4) takes the same one, so that one number reaches the server. */
        if (srv->tcp_port)
            set_sockaddr_port(ai->ai_addr, srv->tcp_port);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            e = errno;
            close(fd);
            continue;
        }
        if (!srv->tcp_port)
            srv->tcp_port = bound_port(fd);
        srv->lis[srv->nlis++].fd = fd;
    }
    freeaddrinfo(res);
    if (srv->nlis == 0) {
        snprintf(err, errlen, "%s port %s: %s", addr, port, strerror(e ? e : EADDRNOTAVAIL));
        return -(e ? e : EADDRNOTAVAIL);
    }
    return 0;
}

struct srv_job {
    struct et_job job;
    struct nbd_server *srv;
};

static void start_job(struct et_job *job, plx_store *st)
{
    struct nbd_server *srv = ((struct srv_job *)job)->srv;
    int rc = 0;
    the_server = srv;
    et_set_idle(srv->et, server_idle, srv);
    if (nbd_cache_all)
        nbd_buf_pool_warm();
    rc = nbd_wauto_start(srv);
    for (int i = 0; i < srv->nlis && !rc; i++) {
        srv->lis[i].on_ready = listener_ready;
        rc = et_watch(srv->et, &srv->lis[i]);
    }
    et_job_done(job, NULL, rc);
}

static void close_listeners(struct nbd_server *srv)
{
    for (int i = 0; i < srv->nlis; i++) {
        if (srv->lis[i].on_ready)
            et_unwatch(srv->et, &srv->lis[i]);
        close(srv->lis[i].fd);
    }
    srv->nlis = 0;
    if (srv->unix_path[0])
        unlink(srv->unix_path);
}

uint16_t nbd_server_port(const struct nbd_server *srv)
{
    return srv->tcp_port;
}

int nbd_server_start(struct et *et, const char *unix_path, const char *port, const char *ipaddr,
                     const struct nbd_tls_config *tls, struct nbd_server **out, char *err,
                     size_t errlen)
{
    struct nbd_server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* Request buffers (up to 32 MiB each) come from the heap and are reused: by default glibc
     * maps a large buffer afresh for each request and unmaps it when it is freed, so every
     * byte of a 1 MiB request first took a page fault (a sixth of serve's CPU time for 1 MiB
     * writes and reads, measured with perf). The heap keeps up to 64 MiB free before it gives
     * memory back. */
    mallopt(M_MMAP_THRESHOLD, (int)NBD_MAX_PAYLOAD);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    srv->et = et;
    if (tls) {
        int trc = nbd_tls_new(tls, &srv->tls, err, errlen);
        if (trc) {
            free(srv);
            return trc;
        }
        srv->tls_mode = tls->mode;
    }
    int rc = unix_path ? listen_unix(srv, unix_path, err, errlen)
                       : listen_tcp(srv, port, ipaddr ? ipaddr : "127.0.0.1", err, errlen);
    if (rc == 0) {
        struct srv_job j = {.job.fn = start_job, .srv = srv};
        rc = et_call(et, &j.job);
        if (rc)
            snprintf(err, errlen, "watching the listening socket: %s", strerror(-rc));
    }
    if (rc) {
        if (srv->nlis) {
            nbd_server_stop(srv);
        } else {
            nbd_tls_free(srv->tls);
            free(srv);
        }
        return rc;
    }
    *out = srv;
    return 0;
}

/* The automatic mode's tick and the close-retry timer end with the server. */
static void stop_timers(struct nbd_server *srv)
{
    struct et_fd_handler *timers[] = {&srv->wauto, &srv->retry};
    for (size_t i = 0; i < sizeof timers / sizeof *timers; i++)
        if (timers[i]->fd > 0) {
            et_unwatch(srv->et, timers[i]);
            close(timers[i]->fd);
            timers[i]->fd = 0;
        }
}

/* The stop, first step: take no new clients, commands or requests; the loop goes on answering
 * the requests under way, ends each connection once they are answered, and closes each export
 * once the write cache has drained its VDI (export_reap), serving the others meanwhile. */
static void stop_begin_job(struct et_job *job, plx_store *st)
{
    struct nbd_server *srv = ((struct srv_job *)job)->srv;
    srv->stopping = 1;
    close_listeners(srv);
    control_stop();
    stop_timers(srv);
    for (struct export *e = srv->exports; e; e = e->next) {
        for (struct req *r = e->pending_head, *next; r; r = next) {
            next = r->pending_next;
            nbd_req_finish(r, -ESHUTDOWN); /* never handed over: nothing was done */
        }
        e->pending_head = e->pending_tail = NULL;
        if (!e->v)
            e->failed = -ESHUTDOWN;
    }
    for (struct conn *c = srv->conns; c; c = c->next) {
        /* Requests the client sent before the stop (in the socket already) are still taken:
         * one that sent a write and then stopped the server gets its answer. */
        char peek;
        for (int i = 0; i < 4096 && c->state == ST_TRANSMISSION && c->tls_state == TLS_PLAIN &&
                        nbd_may_read(c) && recv(c->h.fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
             i++) {
            nbd_conn_read(c);
            nbd_conn_parse(c, st);
        }
        c->quit = 1;
        nbd_conn_kick(c);
        nbd_conn_update(c);
    }
    et_job_done(job, NULL, 0);
}

struct stop_poll {
    struct et_job job;
    struct nbd_server *srv;
    unsigned conns, exports;
    uint64_t backlog;
    char names[200];
};

/* What the stop still waits for. */
static void stop_poll_job(struct et_job *job, plx_store *st)
{
    struct stop_poll *p = (struct stop_poll *)job;
    p->conns = p->exports = 0;
    p->names[0] = 0;
    for (struct conn *c = p->srv->conns; c; c = c->next)
        p->conns++;
    size_t n = 0;
    for (struct export *e = p->srv->exports; e; e = e->next) {
        p->exports++;
        if (n < sizeof p->names - 1)
            n +=
                (size_t)snprintf(p->names + n, sizeof p->names - n, "%s%s", n ? ", " : "", e->name);
    }
    struct plx_wcache_status ws;
    plx_wcache_status(st, &ws);
    p->backlog = ws.backlog_bytes;
    et_job_done(job, NULL, 0);
}

/* The stop, when clients have not taken their answers in time: drop what they were sent. */
static void stop_drop_job(struct et_job *job, plx_store *st)
{
    struct nbd_server *srv = ((struct srv_job *)job)->srv;
    for (struct conn *c = srv->conns; c; c = c->next) {
        shutdown(c->h.fd, SHUT_RDWR);
        c->eof = c->quit = c->wr_broken = 1;
        nbd_free_out(c);
        nbd_conn_kick(c);
        nbd_conn_update(c);
    }
    et_job_done(job, NULL, 0);
}

static void stop_job(struct et_job *job, plx_store *st)
{
    struct nbd_server *srv = ((struct srv_job *)job)->srv;
    srv->stopping = 2;
    et_set_idle(srv->et, NULL, NULL);
    close_listeners(srv);
    control_stop();
    /* Disconnect every client; their replies are dropped from now on. */
    for (struct conn *c = srv->conns; c; c = c->next) {
        if (c->watched)
            et_unwatch(srv->et, &c->h);
        c->watched = 0;
        shutdown(c->h.fd, SHUT_RDWR);
        c->quit = c->eof = c->wr_broken = 1;
        nbd_free_out(c);
    }
    stop_timers(srv);
    /* Closing a VDI completes its outstanding requests (their callbacks run now). */
    while (srv->exports) {
        struct export *e = srv->exports;
        srv->exports = e->next;
        for (struct req *r = e->pending_head, *next; r; r = next) {
            next = r->pending_next;
            nbd_req_finish(r, -ESHUTDOWN); /* never handed over: nothing was done */
        }
        int rc = e->v ? plx_vdi_close(e->v) : 0;
        if (rc)
            fprintf(stderr, "parallax: serve: closing '%s': %s\n", e->name, strerror(-rc));
        free(e);
    }
    while (srv->conns) {
        struct conn *c = srv->conns;
        srv->conns = c->next;
        close(c->h.fd);
        nbd_free_out(c);
        free(c->in);
        free(c->pay);
        nbd_tls_session_free(c->tls);
        c->tls = NULL;
        if (c->outstanding == 0)
            free(c); /* else a request never completed: leak it rather than risk its callback */
    }
    srv->dirty_head = NULL;
    the_server = NULL;
    et_job_done(job, NULL, 0);
}

void nbd_server_stop(struct nbd_server *srv)
{
    if (!srv)
        return;
    struct srv_job b = {.job.fn = stop_begin_job, .srv = srv};
    et_call(srv->et, &b.job);
    /* Wait while the loop answers what is under way and drains the write cache, saying what
     * for (once, then every 10 s). */
    uint64_t said = 0, start = now_ns();
    int dropped = 0;
    for (;;) {
        struct stop_poll p = {.job.fn = stop_poll_job, .srv = srv};
        et_call(srv->et, &p.job);
        if (!p.conns && !p.exports)
            break;
        uint64_t t = now_ns();
        if (p.conns && !dropped && t - start >= 10000000000ull) {
            /* A client that does not read its answers must not hold the stop up for good. */
            fprintf(stderr,
                    "parallax: serve: stopping: %u clients did not take their answers in 10 s: "
                    "disconnected\n",
                    p.conns);
            struct srv_job d = {.job.fn = stop_drop_job, .srv = srv};
            et_call(srv->et, &d.job);
            dropped = 1;
        }
        if ((p.backlog || !p.conns) && (!said || t - said >= 10000000000ull)) {
            fprintf(stderr,
                    "parallax: serve: stopping: waiting for the write cache to drain %.1f MiB "
                    "into the blockstore (VDIs %s; %u clients being answered; %.0f s so far)\n",
                    (double)p.backlog / (1 << 20), p.names, p.conns, (double)(t - start) / 1e9);
            said = t;
        }
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    struct srv_job j = {.job.fn = stop_job, .srv = srv};
    et_call(srv->et, &j.job);
    nbd_buf_pool_free(); /* every connection is gone: nothing takes from it any more */
    nbd_tls_free(srv->tls);
    free(srv);
}
