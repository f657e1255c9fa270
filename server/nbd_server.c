/*
 * nbd_server.c - an event-driven NBD server on the engine thread; see nbd_server.h.
 *
 * Written from the NBD protocol specification (doc/proto.md of the NBD project): fixed
 * newstyle handshake, options EXPORT_NAME, GO, INFO, LIST, ABORT, STARTTLS, STRUCTURED_REPLY,
 * SET_META_CONTEXT and LIST_META_CONTEXT ("base:allocation"), commands READ, WRITE, DISC,
 * FLUSH, TRIM, WRITE_ZEROES and BLOCK_STATUS.
 *
 * TLS (nbd_tls.c): after NBD_OPT_STARTTLS is acknowledged in plain text, the connection runs a
 * non-blocking GnuTLS handshake driven by the same event loop (waiting for input or output as
 * the handshake asks), then carries the rest of the option haggling and the transmission phase
 * in TLS records. With --tls=require, everything but STARTTLS and ABORT is refused before it.
 *
 * Life of a connection: its socket is watched for input while it may take more requests (fewer
 * than NBD_MAX_INFLIGHT outstanding, output not piling up); complete requests in the input
 * buffer are submitted to the engine; completion callbacks queue the reply and put the
 * connection on the dirty list (the reply of its last request in flight is also sent at once,
 * req_finish); the engine loop's idle hook (after plx_store_service) writes the replies out,
 * resumes parsing, and frees connections that are finished: ones that hung up,
 * disconnected or broke the protocol, once no request of theirs is outstanding. Freeing only
 * there means no callback and no pending epoll event can refer to a freed connection.
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "export_names.h"
#include "nbd_tls.h"

/* ---- protocol constants -------------------------------------------------------------------- */

#define NBD_MAGIC_INIT 0x4e42444d41474943ull /* "NBDMAGIC" */
#define NBD_MAGIC_OPT 0x49484156454f5054ull  /* "IHAVEOPT" */
#define NBD_MAGIC_REP 0x0003e889045565a9ull
#define NBD_MAGIC_REQUEST 0x25609513u
#define NBD_MAGIC_SIMPLE 0x67446698u
#define NBD_MAGIC_STRUCTURED 0x668e33efu

#define NBD_FLAG_FIXED_NEWSTYLE 1u
#define NBD_FLAG_NO_ZEROES 2u

#define NBD_OPT_EXPORT_NAME 1u
#define NBD_OPT_ABORT 2u
#define NBD_OPT_LIST 3u
#define NBD_OPT_STARTTLS 5u
#define NBD_OPT_INFO 6u
#define NBD_OPT_GO 7u
#define NBD_OPT_STRUCTURED_REPLY 8u
#define NBD_OPT_LIST_META_CONTEXT 9u
#define NBD_OPT_SET_META_CONTEXT 10u

#define NBD_REP_ACK 1u
#define NBD_REP_SERVER 2u
#define NBD_REP_INFO 3u
#define NBD_REP_META_CONTEXT 4u
#define NBD_REP_ERR_UNSUP 0x80000001u
#define NBD_REP_ERR_INVALID 0x80000003u
#define NBD_REP_ERR_PLATFORM 0x80000004u
#define NBD_REP_ERR_TLS_REQD 0x80000005u
#define NBD_REP_ERR_UNKNOWN 0x80000006u

#define NBD_INFO_EXPORT 0u
#define NBD_INFO_BLOCK_SIZE 3u

#define NBD_TFLAG_HAS_FLAGS (1u << 0)
#define NBD_TFLAG_READ_ONLY (1u << 1)
#define NBD_TFLAG_SEND_FLUSH (1u << 2)
#define NBD_TFLAG_SEND_FUA (1u << 3)
#define NBD_TFLAG_SEND_TRIM (1u << 5)
#define NBD_TFLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_TFLAG_CAN_MULTI_CONN (1u << 8)

#define NBD_CMD_READ 0u
#define NBD_CMD_WRITE 1u
#define NBD_CMD_DISC 2u
#define NBD_CMD_FLUSH 3u
#define NBD_CMD_TRIM 4u
#define NBD_CMD_WRITE_ZEROES 6u
#define NBD_CMD_BLOCK_STATUS 7u

#define NBD_CMD_FLAG_FUA (1u << 0)
#define NBD_CMD_FLAG_REQ_ONE (1u << 3)

#define NBD_REPLY_FLAG_DONE 1u
#define NBD_REPLY_TYPE_NONE 0u
#define NBD_REPLY_TYPE_OFFSET_DATA 1u
#define NBD_REPLY_TYPE_BLOCK_STATUS 5u
#define NBD_REPLY_TYPE_ERROR 32769u

#define NBD_STATE_HOLE 1u
#define NBD_STATE_ZERO 2u

#define NBD_EPERM 1u
#define NBD_EIO 5u
#define NBD_ENOMEM 12u
#define NBD_EINVAL 22u
#define NBD_ENOSPC 28u

/* ---- limits ---------------------------------------------------------------------------------- */

#define NBD_MAX_INFLIGHT 256        /* outstanding requests per connection */
#define NBD_MAX_PAYLOAD (32u << 20) /* block size maximum we advertise */
#define NBD_MAX_OPTION (64u << 10)  /* longest option we accept */
#define NBD_OUT_LIMIT (64u << 20)   /* queued reply bytes before we stop reading */
#define NBD_READ_CHUNK (256u << 10) /* input buffer growth of a busy connection */
#define NBD_READ_CHUNK0 (16u << 10) /* ... of a new one: an idle client costs 16 KiB, not 256 */
#define NBD_DIRECT_MIN (64u << 10)  /* a write this large is received into its own buffer */
#define NBD_MAX_EXTENTS 1024        /* block status descriptors per reply */
#define NBD_CONTEXT_ALLOCATION 1u   /* our id of "base:allocation" */
#define NBD_MAX_LISTENERS 8

/* ---- types ----------------------------------------------------------------------------------- */

struct req;

struct export
{
    char name[PLX_NAME_MAX + 64];
    plx_vdi *v; /* NULL while waiting for the VDI (see below) */
    int refs;
    struct export *next;
    char last_err[256]; /* the engine's message for the last failed request, said once */
    /* Handover: another process holds the VDI for writing (a guest migrating here, whose source
     * still runs). The client gets the export (size from the VDI's record) at once; its
     * requests wait, in order, until the source lets go and the VDI opens here, so nothing is
     * served while the source still can. */
    uint64_t size;
    uint64_t wait_since_ns;
    int failed; /* the wait ended without the VDI: every request fails */
    struct req *pending_head, *pending_tail;
    /* Its last client left while the write cache still held writes of the VDI: it stays open
     * (a new client takes it as it is) until they are drained, then export_reap closes it.
     * Closing at once would drain while the engine thread waits, and every other export with
     * it (issue 14). */
    int closing;
    /* The VDI is being opened (plx_vdi_open_async): a writable open waits for the admin lock,
     * which is the lock manager's to grant, and the loop serves the other exports meanwhile
     * (issue 30). The clients that asked for it wait in their option (conn.wait_ex) until the
     * idle hook settles the export (export_settle). */
    plx_open_req *opening;
    int opened;  /* the open reported (open_rc), not yet settled */
    int open_rc; /* its result */
    int settled; /* settled: open, waiting for a handover, or failed (open_rc, open_err) */
    char open_err[512];
    plx_open_req *retry_req; /* handover: a try of the open in progress */
    int retry_done;          /* ... has reported: retry_rc, retry_v, for the next retry tick */
    int retry_rc;
    plx_vdi *retry_v;
    int unlinked; /* failed: out of the exports list, freed with its last client */
    char close_err[512];
};

/* One queued output message: hdr[0..hlen) then data[0..dlen) (data is owned, freed). */
struct msg {
    struct msg *next;
    size_t hlen, dlen, sent;
    char *data;
    unsigned char hdr[32];
};

enum conn_state { ST_CLIENT_FLAGS, ST_OPTIONS, ST_TRANSMISSION };

/* TLS_ACK: STARTTLS acknowledged, the ACK not yet all sent: read nothing more in plain text. */
enum conn_tls { TLS_PLAIN, TLS_ACK, TLS_HANDSHAKE, TLS_UP };

struct conn {
    struct et_fd_handler h; /* first: the handler is the connection */
    struct nbd_server *srv;
    enum conn_state state;
    enum conn_tls tls_state;
    struct nbd_tls_session *tls; /* from TLS_HANDSHAKE on */
    int no_zeroes, structured, meta_alloc;
    struct export *ex;
    uint64_t size;
    int writable;
    char *in;
    size_t in_off, in_len, in_cap, need;
    /* A large write's payload is received straight into its request buffer (see conn_parse):
     * the header, the buffer, how much of it has arrived. */
    unsigned char pay_hdr[28];
    char *pay;
    uint32_t pay_len, pay_have;
    /* After a large write's payload, read only as far as the next request's header (conn_read):
     * a read of the whole chunk took up to 256 KiB of the next payload into the input buffer,
     * copied from there into the request's buffer again (conn_parse's memcpy, 3-4% of serve's
     * samples in a burst of 1 MiB writes). Cleared by a request handled from the input buffer. */
    int hdr_only;
    size_t chunk; /* input buffer growth: doubles while reads fill it, up to NBD_READ_CHUNK */
    struct msg *out_head, *out_tail;
    size_t out_bytes;
    unsigned outstanding;
    int eof;         /* the client closed its side (read returned 0) */
    int quit;        /* DISC, ABORT, protocol error or broken socket: take no more requests */
    int wr_broken;   /* replies cannot be delivered: drop them */
    uint32_t events; /* as registered with epoll */
    int watched;     /* registered at all (dropped once replies cannot be delivered) */
    int dirty;
    struct conn *dirty_next;
    struct conn *prev, *next;
    /* An option (GO, INFO, EXPORT_NAME) waits for this export's open: nothing more is read or
     * parsed until the idle hook answers it (conn_parse). Holds a reference. */
    struct export *wait_ex;
    uint32_t wait_opt;
};

struct req {
    struct conn *c;
    uint16_t flags, type;
    uint64_t handle, off;
    uint32_t len;
    int flushing; /* write zeroes with FUA: the trim is done, the flush runs */
    char *buf;
    struct req *pending_next; /* waiting for the export's VDI (handover) */
};

struct nbd_server {
    struct et *et;
    struct et_fd_handler lis[NBD_MAX_LISTENERS];
    int nlis;
    uint16_t tcp_port; /* the TCP port listened on (the kernel's pick for --port 0); 0: unix */
    char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct conn *conns;
    struct conn *dirty_head;
    struct export *exports;
    struct nbd_tls *tls; /* NULL: --tls=off */
    enum nbd_tls_mode tls_mode;
    int stopping; /* 1: answering what is under way and draining (stop_begin_job); 2: closing */
    struct et_fd_handler retry; /* timerfd: try the waiting exports' VDIs again */
    int retry_armed;
    struct et_fd_handler wauto; /* timerfd: the write cache's automatic mode, every 100 ms */
};

static struct nbd_server *the_server;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- byte order ------------------------------------------------------------------------------ */

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void put32(unsigned char *p, uint32_t v)
{
    put16(p, (uint16_t)(v >> 16));
    put16(p + 2, (uint16_t)v);
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const unsigned char *p)
{
    return ((uint32_t)get16(p) << 16) | get16(p + 2);
}

static uint64_t get64(const unsigned char *p)
{
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

/* ---- exports --------------------------------------------------------------------------------- */

plx_vdi *nbd_server_find_writable(uint64_t id)
{
    if (!the_server)
        return NULL;
    for (struct export *e = the_server->exports; e; e = e->next)
        if (e->v && e->closing != 2 && !plx_vdi_readonly(e->v) && plx_vdi_id(e->v) == id)
            return e->v;
    return NULL;
}

static int retry_arm(struct nbd_server *srv);
static void conn_kick(struct conn *c);

static int cache_all;
static double cache_all_threshold_ms;

void nbd_server_cache_all(int mode, double threshold_ms)
{
    cache_all = mode;
    cache_all_threshold_ms = threshold_ms;
}

/* A VDI just opened for writing: the write cache on (or automatic), when the server caches
 * every VDI. */
static void export_opened(plx_store *st, struct export *e)
{
    if (!cache_all || !e->v || plx_vdi_readonly(e->v))
        return;
    struct plx_wcache_auto a = {.on_ms = cache_all_threshold_ms};
    int rc = plx_vdi_wcache_set_mode(e->v, cache_all, &a);
    if (rc)
        fprintf(stderr, "parallax: serve: export '%s': write cache not on: %s\n", e->name,
                plx_store_errmsg(st));
}

static void export_open_done(void *arg, int status, plx_vdi *v);

/* Open (or share) the export `name`. The VDI's open is asynchronous: the export may come back
 * still opening (e->opening), and the caller's option waits for it (conn.wait_ex). */
static int export_get(struct nbd_server *srv, const char *name, plx_store *st, struct export **out)
{
    if (!*name) {
        fprintf(stderr, "parallax: serve: a client asked for no export name: connect to a VDI "
                        "by name, or VDI@N for a snapshot (list them with `nbdinfo --list`)\n");
        return -ENOENT;
    }
    for (struct export *e = srv->exports; e; e = e->next) {
        /* One being closed is not shared: a new open of its VDI waits for the close as for a
         * handover (the VDI is open here until then). */
        if (strcmp(e->name, name) == 0 && e->closing != 2) {
            e->refs++;
            e->closing = 0;
            *out = e;
            return 0;
        }
    }
    struct export *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    snprintf(e->name, sizeof e->name, "%s", name);
    int rc = plx_vdi_open_async(st, name, 0, export_open_done, e, &e->opening);
    if (rc) {
        fprintf(stderr, "parallax: serve: export '%s': %s\n", name, plx_store_errmsg(st));
        free(e);
        return rc;
    }
    e->refs = 1;
    e->next = srv->exports;
    srv->exports = e;
    *out = e;
    return 0;
}

/* The open of e's VDI is done (from the store's service pass): note it and wake the clients
 * waiting for it; the idle hook settles the export outside the service pass. */
static void export_open_done(void *arg, int status, plx_vdi *v)
{
    struct export *e = arg;
    struct nbd_server *srv = the_server;
    e->opening = NULL;
    e->opened = 1;
    e->open_rc = status;
    e->v = v;
    if (status)
        snprintf(e->open_err, sizeof e->open_err, "%s", plx_store_errmsg(et_store(srv->et)));
    for (struct conn *c = srv->conns; c; c = c->next)
        if (c->wait_ex == e)
            conn_kick(c);
}

static void export_unlink(struct nbd_server *srv, struct export *e)
{
    for (struct export **pp = &srv->exports; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    e->unlinked = 1;
}

/* Settle an export whose open reported (idle hook, outside the service pass: what follows may
 * block on the medium): open; or held by another process, so its requests wait for a
 * handover; or failed, out of the list so that the next client tries afresh. */
static void export_settle(struct nbd_server *srv, struct export *e, plx_store *st)
{
    if (e->settled || !e->opened)
        return;
    e->settled = 1;
    int rc = e->open_rc;
    if (!rc) {
        export_opened(st, e);
        return;
    }
    struct plx_vdi_info info;
    if (rc == -EBUSY && !strchr(e->name, '@') && plx_vdi_lookup(st, e->name, &info) == 0 &&
        retry_arm(srv) == 0) {
        fprintf(stderr, "parallax: serve: export '%s': %s; its requests wait until it lets go\n",
                e->name, e->open_err);
        e->size = info.size;
        e->wait_since_ns = now_ns();
        e->open_rc = 0;
        return;
    }
    fprintf(stderr, "parallax: serve: export '%s': %s\n", e->name, e->open_err);
    export_unlink(srv, e);
}

static void export_free(struct nbd_server *srv, struct export *e, int rc)
{
    for (struct export **pp = &srv->exports; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    if (rc)
        fprintf(stderr, "parallax: serve: closing '%s': %s\n", e->name,
                e->close_err[0] ? e->close_err : strerror(-rc));
    free(e);
}

/* The close of e's VDI is done (from the store's service pass). */
static void export_closed(void *arg, int status)
{
    struct export *e = arg;
    if (status)
        snprintf(e->close_err, sizeof e->close_err, "%s",
                 plx_store_errmsg(et_store(the_server->et)));
    e->v = NULL;
    export_free(the_server, e, status);
}

/* Close e unless its VDI's writes are still being drained from the write cache (then it stays
 * in the list, closing, for export_reap). The close waits for the admin lock (the lock
 * manager's) on the loop (plx_vdi_close_async): the export stays in the list, closing == 2,
 * shared with no new client, until export_closed frees it. Never from a completion callback. */
static void export_close(struct nbd_server *srv, struct export *e)
{
    if (e->closing == 2)
        return;
    if (e->opening)
        plx_vdi_open_cancel(e->opening);
    if (e->retry_req)
        plx_vdi_open_cancel(e->retry_req);
    e->opening = e->retry_req = NULL;
    if (e->retry_v && !e->v)
        e->v = e->retry_v; /* handed over, and nobody left to serve */
    e->retry_v = NULL;
    int rc = e->v ? plx_vdi_close_async(e->v, export_closed, e) : 0;
    if (rc == -EAGAIN) {
        e->closing = 1;
        return;
    }
    if (e->v && rc == 0) {
        e->closing = 2;
        return;
    }
    if (e->v)
        rc = plx_vdi_close(e->v); /* the close could not be started: the blocking one */
    export_free(srv, e, rc);
}

static void export_put(struct nbd_server *srv, struct export *e)
{
    if (--e->refs > 0)
        return;
    export_close(srv, e);
}

/* Close the exports whose drain has finished (from the idle hook, after every service pass:
 * the pass that completed the last drain round is followed by this at once). */
static void export_reap(struct nbd_server *srv)
{
    for (struct export *e = srv->exports, *next; e; e = next) {
        next = e->next;
        if (e->closing == 1 && e->refs == 0)
            export_close(srv, e);
        else
            export_settle(srv, e, et_store(srv->et));
    }
}

static uint16_t export_flags(const struct conn *c)
{
    uint16_t f =
        NBD_TFLAG_HAS_FLAGS | NBD_TFLAG_SEND_FLUSH | NBD_TFLAG_SEND_FUA | NBD_TFLAG_CAN_MULTI_CONN;
    if (c->writable)
        f |= NBD_TFLAG_SEND_TRIM | NBD_TFLAG_SEND_WRITE_ZEROES;
    else
        f |= NBD_TFLAG_READ_ONLY;
    return f;
}

/* ---- output ---------------------------------------------------------------------------------- */

static void conn_kick(struct conn *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    c->dirty_next = c->srv->dirty_head;
    c->srv->dirty_head = c;
}

static void free_out(struct conn *c)
{
    while (c->out_head) {
        struct msg *m = c->out_head;
        c->out_head = m->next;
        free(m->data);
        free(m);
    }
    c->out_tail = NULL;
    c->out_bytes = 0;
}

/* Queue hdr (copied) followed by data (taken over; freed with the message). */
static int queue(struct conn *c, const void *hdr, size_t hlen, char *data, size_t dlen)
{
    if (c->wr_broken) {
        free(data);
        return 0;
    }
    struct msg *m = malloc(sizeof *m);
    if (!m) {
        free(data);
        c->quit = c->wr_broken = 1; /* a lost reply would hang the client: drop it */
        free_out(c);
        return -ENOMEM;
    }
    memcpy(m->hdr, hdr, hlen);
    m->hlen = hlen;
    m->data = data;
    m->dlen = dlen;
    m->sent = 0;
    m->next = NULL;
    if (c->out_tail)
        c->out_tail->next = m;
    else
        c->out_head = m;
    c->out_tail = m;
    c->out_bytes += hlen + dlen;
    return 0;
}

/* Drop `left` bytes of queued output: they have been sent. */
static void out_advance(struct conn *c, size_t left)
{
    c->out_bytes -= left;
    while (left && c->out_head) {
        struct msg *m = c->out_head;
        size_t rest = m->hlen + m->dlen - m->sent;
        if (left < rest) {
            m->sent += left;
            break;
        }
        left -= rest;
        c->out_head = m->next;
        if (!c->out_head)
            c->out_tail = NULL;
        free(m->data);
        free(m);
    }
}

static void tls_start(struct conn *c);

/* Queued output through TLS, one piece (header or data) per record call. After -EAGAIN the
 * same piece is offered again with the same length, as GnuTLS requires: m->sent only moves on
 * success. */
static void conn_flush_tls(struct conn *c)
{
    while (c->out_head && !c->wr_broken) {
        struct msg *m = c->out_head;
        const char *p;
        size_t n;
        if (m->sent < m->hlen) {
            p = (const char *)m->hdr + m->sent;
            n = m->hlen - m->sent;
        } else {
            p = m->data + (m->sent - m->hlen);
            n = m->dlen - (m->sent - m->hlen);
        }
        ssize_t r = nbd_tls_send(c->tls, p, n);
        if (r == -EAGAIN)
            return;
        if (r <= 0) {
            c->wr_broken = c->quit = 1;
            free_out(c);
            return;
        }
        out_advance(c, (size_t)r);
    }
}

/* Write as much queued output as the socket takes. */
static void conn_flush(struct conn *c)
{
    if (c->tls_state == TLS_UP) {
        conn_flush_tls(c);
        return;
    }
    if (c->tls_state == TLS_HANDSHAKE)
        return; /* nothing is queued while the handshake runs */
    while (c->out_head && !c->wr_broken) {
        struct iovec iov[64];
        int n = 0;
        for (struct msg *m = c->out_head; m && n < 63; m = m->next) {
            size_t s = m->sent;
            if (s < m->hlen)
                iov[n++] = (struct iovec){m->hdr + s, m->hlen - s};
            s = s > m->hlen ? s - m->hlen : 0;
            if (m->dlen > s)
                iov[n++] = (struct iovec){m->data + s, m->dlen - s};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = sendmsg(c->h.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                c->wr_broken = c->quit = 1;
                free_out(c);
            }
            return;
        }
        out_advance(c, (size_t)r);
    }
    if (c->tls_state == TLS_ACK && !c->out_head && !c->wr_broken)
        tls_start(c); /* the ACK is out: the client's next bytes are its ClientHello */
}

/* ---- replies -----------------------------------------------------------------------------------
 */

static uint32_t nbd_error(int rc)
{
    switch (-rc) {
    case 0:
        return 0;
    case EPERM:
    case EROFS:
        return NBD_EPERM;
    case ENOSPC:
        return NBD_ENOSPC;
    case EINVAL:
    case EFBIG:
        return NBD_EINVAL;
    case ENOMEM:
        return NBD_ENOMEM;
    default:
        return NBD_EIO;
    }
}

static void reply_simple(struct conn *c, uint64_t handle, uint32_t err, char *data, size_t dlen)
{
    unsigned char h[16];
    put32(h, NBD_MAGIC_SIMPLE);
    put32(h + 4, err);
    put64(h + 8, handle);
    queue(c, h, sizeof h, data, dlen);
}

/* A structured chunk header (20 bytes) into h. */
static void chunk_header(unsigned char *h, uint16_t flags, uint16_t type, uint64_t handle,
                         uint32_t length)
{
    put32(h, NBD_MAGIC_STRUCTURED);
    put16(h + 4, flags);
    put16(h + 6, type);
    put64(h + 8, handle);
    put32(h + 16, length);
}

static void reply_error(struct conn *c, uint16_t type, uint64_t handle, uint32_t err)
{
    if (c->structured && (type == NBD_CMD_READ || type == NBD_CMD_BLOCK_STATUS)) {
        unsigned char h[26];
        chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, handle, 6);
        put32(h + 20, err);
        put16(h + 24, 0);
        queue(c, h, sizeof h, NULL, 0);
    } else {
        reply_simple(c, handle, err, NULL, 0);
    }
}

/* Success of a read: the data (taken over). */
static void reply_read(struct conn *c, uint64_t handle, uint64_t off, char *buf, uint32_t len)
{
    if (!c->structured) {
        reply_simple(c, handle, 0, buf, len);
        return;
    }
    unsigned char h[28];
    if (len == 0) {
        chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, handle, 0);
        free(buf);
        queue(c, h, 20, NULL, 0);
        return;
    }
    chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, handle, 8 + len);
    put64(h + 20, off);
    queue(c, h, sizeof h, buf, len);
}

/* ---- requests ----------------------------------------------------------------------------------
 */

/* The client only gets an errno; the operator gets the engine's reason on stderr, once per
 * distinct message (a full store fails every write the same way). */
static void log_request_error(struct conn *c, const struct req *r, int status)
{
    static const char *const names[] = {"read", "write", "disconnect",   "flush",
                                        "trim", "cache", "write zeroes", "block status"};
    const char *msg = plx_store_errmsg(et_store(c->srv->et));
    struct export *ex = c->ex;
    if (!ex || !strcmp(ex->last_err, msg))
        return;
    snprintf(ex->last_err, sizeof ex->last_err, "%s", msg);
    fprintf(stderr, "parallax: serve: export '%s': %s failed (%s): %s\n", ex->name,
            r->type < sizeof names / sizeof names[0] ? names[r->type] : "request",
            strerror(-status), msg);
}

/* A request buffer: block-aligned, so that the engine does the I/O straight into and out of it
 * (an unaligned buffer costs a bounce buffer and one more copy of every byte). One of 1 MiB or
 * more lies in a transparent huge page where the kernel has one: the kernel builds an O_DIRECT
 * request from the buffer's pages, one segment per physically contiguous piece, and a device
 * takes only so many segments per request (virtio-blk here: 254), so a 1 MiB read into 256
 * scattered 4 KiB pages reached the disk as two requests and merged with none of its
 * neighbours; whether the pages were contiguous was luck, and it moved 1 MiB reads by 20-30 %
 * from one server process to the next (bench/notes/snapshots.md, issue 16). */
#define REQ_BUF_HUGE (1u << 20)
#define HUGE_PAGE (2u << 20)
static size_t req_buf_size(uint32_t len)
{
    size_t size = (len + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
    return size < REQ_BUF_HUGE ? size : (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

/* Write buffers of NBD_DIRECT_MIN and more are kept for the next request of the same size (up
 * to BUF_POOL_N of them, BUF_POOL_BYTES in all; engine thread only). From the heap, an aligned
 * 1 MiB buffer seldom fitted the hole a freed one left (the alignment needs more), so the heap
 * kept growing into fresh pages, each zeroed by the kernel on its first touch, the receive's
 * copy: 15,000-31,000 page faults in a 192 MiB burst of 1 MiB writes, 15-20% of serve's CPU
 * time once the write log wrote large records from the request buffers (perf). */
#define BUF_POOL_N 64
#define BUF_POOL_BYTES (64u << 20)
static struct {
    char *p[BUF_POOL_N];
    size_t size[BUF_POOL_N];
    unsigned n;
    size_t bytes;
} buf_pool;

/* A buffer of `size` (req_buf_size) from the heap. */
static char *req_buf_new(size_t size)
{
    if (size < REQ_BUF_HUGE)
        return aligned_alloc(PLX_BLOCK_SIZE, size);
    char *p = aligned_alloc(HUGE_PAGE, size);
    if (p)
        (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: without it, the buffer is as before */
    return p;
}

static char *req_buf_alloc(uint32_t len)
{
    size_t size = req_buf_size(len);
    for (unsigned i = buf_pool.n; i-- > 0;)
        if (buf_pool.size[i] == size) {
            char *p = buf_pool.p[i];
            buf_pool.n--;
            buf_pool.p[i] = buf_pool.p[buf_pool.n];
            buf_pool.size[i] = buf_pool.size[buf_pool.n];
            buf_pool.bytes -= size;
            return p;
        }
    return req_buf_new(size);
}

/* A server with a write cache starts with BUF_POOL_WARM buffers for 1 MiB writes in the pool,
 * their pages touched (a huge page each): three writers at QD 8, what bench/wcache.sh sends.
 * The pool keeps what a burst left anyway, for the server's life; filled at the start, a fresh
 * server's first burst does not take the kernel's zeroing of 48 MiB of new pages in its receive
 * copies on the engine thread (26-28% of serve's samples in a 3 x 64 MiB burst of 1 MiB writes
 * with the cache on, perf; what the cache is for is taking such a burst at the local disk's
 * speed). Without a write cache the store is the bound, and the server's memory stays small
 * (bench/serve-memory.py). The rest of the pool (16 MiB) is for other sizes. */
#define BUF_POOL_WARM 24
static void buf_pool_warm(void)
{
    size_t size = req_buf_size(REQ_BUF_HUGE);
    while (buf_pool.n < BUF_POOL_WARM && buf_pool.bytes + size <= BUF_POOL_BYTES) {
        char *p = req_buf_new(size);
        if (!p)
            return;
        memset(p, 0, size);
        buf_pool.p[buf_pool.n] = p;
        buf_pool.size[buf_pool.n++] = size;
        buf_pool.bytes += size;
    }
}

static void req_buf_free(char *p, uint32_t len)
{
    size_t size = req_buf_size(len);
    if (p && len >= NBD_DIRECT_MIN && buf_pool.n < BUF_POOL_N &&
        buf_pool.bytes + size <= BUF_POOL_BYTES) {
        buf_pool.p[buf_pool.n] = p;
        buf_pool.size[buf_pool.n++] = size;
        buf_pool.bytes += size;
        return;
    }
    free(p);
}

static void req_finish(struct req *r, int status)
{
    struct conn *c = r->c;
    if (status) {
        log_request_error(c, r, status);
        reply_error(c, r->type, r->handle, nbd_error(status));
    } else if (r->type == NBD_CMD_READ) {
        reply_read(c, r->handle, r->off, r->buf, r->len);
        r->buf = NULL;
    } else
        reply_simple(c, r->handle, 0, NULL, 0);
    req_buf_free(r->buf, r->len);
    free(r);
    c->outstanding--;
    conn_kick(c);
    /* The connection's last request in flight (QD 1): no other reply will share the sendmsg,
     * so send it now rather than from the idle hook, which runs only after the rest of the
     * service pass (the log's writeback start, the store's poll, the drain's work). */
    if (c->outstanding == 0 && c->tls_state == TLS_PLAIN)
        conn_flush(c);
}

static void req_done(void *arg, int status)
{
    struct req *r = arg;
    struct conn *c = r->c;
    /* Write zeroes with FUA: the trim, then a flush (zeroes and trims both leave holes). */
    if (!status && r->type == NBD_CMD_WRITE_ZEROES && (r->flags & NBD_CMD_FLAG_FUA) &&
        !r->flushing && c->srv->stopping < 2) {
        r->flushing = 1;
        int rc = plx_vdi_submit_flush(c->ex->v, req_done, r);
        if (rc == 0)
            return;
        status = rc;
    }
    req_finish(r, status);
}

/* Block status: one engine request per run of one state (plx_vdi_submit_block_status reads
 * the radix nodes it needs asynchronously), until the range or the extent budget is used up. */
struct status_req {
    struct conn *c;
    uint64_t handle, pos, end;
    size_t max, n;    /* extents allowed / gathered */
    unsigned char *d; /* n descriptors of 8 bytes */
    uint64_t run;     /* the engine's answer */
    int mapped;
};

static void status_reply(struct status_req *r, int rc)
{
    struct conn *c = r->c;
    if (rc < 0 && r->n == 0) {
        reply_error(c, NBD_CMD_BLOCK_STATUS, r->handle, nbd_error(rc));
        free(r->d);
    } else {
        unsigned char h[24];
        chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, r->handle,
                     (uint32_t)(4 + r->n * 8));
        put32(h + 20, NBD_CONTEXT_ALLOCATION);
        queue(c, h, sizeof h, (char *)r->d, r->n * 8);
    }
    free(r);
    c->outstanding--;
    conn_kick(c);
}

static void status_done(void *arg, int status)
{
    struct status_req *r = arg;
    if (status < 0) {
        status_reply(r, status);
        return;
    }
    uint64_t run = r->run;
    if (run == 0 || run > r->end - r->pos)
        run = r->end - r->pos;
    uint32_t state = r->mapped ? 0 : (NBD_STATE_HOLE | NBD_STATE_ZERO);
    unsigned char *last = r->n ? r->d + (r->n - 1) * 8 : NULL;
    if (last && get32(last + 4) == state) {
        put32(last, get32(last) + (uint32_t)run);
    } else {
        put32(r->d + r->n * 8, (uint32_t)run);
        put32(r->d + r->n * 8 + 4, state);
        r->n++;
    }
    r->pos += run;
    int rc = 0;
    if (r->pos < r->end && r->n < r->max && r->c->srv->stopping < 2) {
        rc = plx_vdi_submit_block_status(r->c->ex->v, r->pos, r->end - r->pos, &r->run, &r->mapped,
                                         status_done, r);
        if (rc == 0)
            return;
    }
    status_reply(r, rc);
}

static void block_status(struct conn *c, uint64_t handle, uint64_t off, uint32_t len,
                         uint16_t flags)
{
    if (!c->meta_alloc) {
        reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_EINVAL);
        return;
    }
    struct status_req *r = calloc(1, sizeof *r);
    size_t max = (flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : NBD_MAX_EXTENTS;
    unsigned char *d = malloc(max * 8);
    if (!r || !d) {
        free(r);
        free(d);
        reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_ENOMEM);
        return;
    }
    *r = (struct status_req){
        .c = c, .handle = handle, .pos = off, .end = off + len, .max = max, .d = d};
    int rc = plx_vdi_submit_block_status(c->ex->v, off, len, &r->run, &r->mapped, status_done, r);
    if (rc < 0) {
        free(d);
        free(r);
        reply_error(c, NBD_CMD_BLOCK_STATUS, handle, nbd_error(rc));
        return;
    }
    c->outstanding++;
}

/* ---- handover: exports waiting for their VDI ---------------------------------------------------
 */

static void req_submit(struct req *r);

/* How long a handover may take before the waiting requests fail: $PARALLAX_HANDOVER_WAIT
 * seconds, default 60 (libxl gives a migrating guest's disks about as long). */
static uint64_t handover_wait_ns(void)
{
    const char *env = getenv("PARALLAX_HANDOVER_WAIT");
    double s = env ? strtod(env, NULL) : 60.0;
    return (uint64_t)((s > 0 ? s : 60.0) * 1e9);
}

static void req_wait(struct export *e, struct req *r)
{
    if (e->failed) {
        req_finish(r, e->failed);
        return;
    }
    r->pending_next = NULL;
    if (e->pending_tail)
        e->pending_tail->pending_next = r;
    else
        e->pending_head = r;
    e->pending_tail = r;
}

/* While waiting, block status says "data" everywhere: true of any disk, and it needs no tree. */
static void block_status_waiting(struct conn *c, uint64_t handle, uint64_t off, uint32_t len)
{
    if (!c->meta_alloc) {
        reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_EINVAL);
        return;
    }
    unsigned char h[40];
    chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, handle, 12);
    put32(h + 20, NBD_CONTEXT_ALLOCATION);
    put32(h + 24, len);
    put32(h + 28, 0);
    queue(c, h, 32, NULL, 0);
    (void)off;
}

/* A try of a waiting export's open reported (from the service pass): the retry timer's next
 * tick, outside the service pass, acts on it. */
static void retry_open_done(void *arg, int status, plx_vdi *v)
{
    struct export *e = arg;
    e->retry_req = NULL;
    e->retry_done = 1;
    e->retry_rc = status;
    e->retry_v = v;
    if (status)
        snprintf(e->open_err, sizeof e->open_err, "%s", plx_store_errmsg(et_store(the_server->et)));
}

/* Try the waiting exports' VDIs again (every few ms, from the retry timer). Each try is an
 * asynchronous open (plx_vdi_open_async): with the lock manager slow or gone, the try waits on
 * the loop while the other exports are served, and the handover goes on waiting for it. */
static void retry_ready(struct et_fd_handler *h, plx_store *st)
{
    struct nbd_server *srv = (struct nbd_server *)((char *)h - offsetof(struct nbd_server, retry));
    uint64_t junk;
    if (read(h->fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    int still_waiting = 0;
    for (struct export *e = srv->exports; e; e = e->next) {
        if (e->v || e->failed || !e->settled || e->open_rc)
            continue;
        still_waiting = 1;
        if (e->retry_req)
            continue;
        if (!e->retry_done) {
            if (plx_vdi_open_async(st, e->name, 0, retry_open_done, e, &e->retry_req) == 0)
                continue;
            e->retry_done = 1;
            e->retry_rc = -ENOMEM;
            snprintf(e->open_err, sizeof e->open_err, "%s", plx_store_errmsg(st));
        }
        e->retry_done = 0;
        int rc = e->retry_rc;
        /* Held by the source still, or the lock manager not answering (it may come back within
         * the wait): try again. */
        if ((rc == -EBUSY || rc == -EHOSTUNREACH) &&
            now_ns() - e->wait_since_ns < handover_wait_ns())
            continue;
        e->v = e->retry_v;
        e->retry_v = NULL;
        if (rc) {
            e->v = NULL;
            e->failed = rc == -EBUSY ? -ETIMEDOUT : rc;
            fprintf(stderr, "parallax: serve: export '%s': gave up waiting for it: %s\n", e->name,
                    e->open_err);
        } else {
            fprintf(stderr, "parallax: serve: export '%s': handed over after %.1f ms\n", e->name,
                    (double)(now_ns() - e->wait_since_ns) / 1e6);
            export_opened(st, e);
        }
        struct req *r = e->pending_head;
        e->pending_head = e->pending_tail = NULL;
        while (r) {
            struct req *next = r->pending_next;
            if (e->v)
                req_submit(r);
            else
                req_finish(r, e->failed);
            r = next;
        }
    }
    if (!still_waiting) {
        struct itimerspec off = {0};
        timerfd_settime(h->fd, 0, &off, NULL);
        srv->retry_armed = 0;
    }
}

/* Start the retry timer (5 ms) for an export that waits. */
static int retry_arm(struct nbd_server *srv)
{
    if (srv->retry.fd <= 0) {
        srv->retry.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        srv->retry.on_ready = retry_ready;
        if (srv->retry.fd < 0 || et_watch(srv->et, &srv->retry) != 0)
            return -errno;
    }
    if (!srv->retry_armed) {
        struct itimerspec its = {.it_interval = {0, 5000000}, .it_value = {0, 5000000}};
        if (timerfd_settime(srv->retry.fd, 0, &its, NULL) != 0)
            return -errno;
        srv->retry_armed = 1;
    }
    return 0;
}

/* One request (header fields and, for a write, its payload). A write's payload is either in
 * the input buffer (copied) or, for a large one, already in a request buffer (`owned`, taken
 * over). */
static void handle_request_in(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
                              uint64_t off, uint32_t len, const unsigned char *payload,
                              char **owned);

static void handle_request(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
                           uint64_t off, uint32_t len, const unsigned char *payload, char *owned)
{
    handle_request_in(c, flags, type, handle, off, len, payload, &owned);
    free(owned); /* refused before a request took it */
}

/* The request itself; sets *owned to NULL when a request took the buffer. */
static void handle_request_in(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
                              uint64_t off, uint32_t len, const unsigned char *payload,
                              char **owned)
{
    if (type == NBD_CMD_DISC) {
        c->quit = 1;
        return;
    }
    if (type == NBD_CMD_FLUSH) {
        if (!c->writable) {
            reply_simple(c, handle, 0, NULL, 0);
            return;
        }
    } else if (type == NBD_CMD_READ || type == NBD_CMD_WRITE || type == NBD_CMD_TRIM ||
               type == NBD_CMD_WRITE_ZEROES || type == NBD_CMD_BLOCK_STATUS) {
        int writes = type == NBD_CMD_WRITE || type == NBD_CMD_TRIM || type == NBD_CMD_WRITE_ZEROES;
        if (writes && !c->writable) {
            reply_error(c, type, handle, NBD_EPERM);
            return;
        }
        if (off > c->size || len > c->size - off ||
            (type == NBD_CMD_READ && len > NBD_MAX_PAYLOAD) ||
            (type == NBD_CMD_BLOCK_STATUS && len == 0)) {
            reply_error(c, type, handle, NBD_EINVAL);
            return;
        }
        if (type == NBD_CMD_BLOCK_STATUS && !c->ex->v) {
            block_status_waiting(c, handle, off, len);
            return;
        }
        if (type == NBD_CMD_BLOCK_STATUS) {
            block_status(c, handle, off, len, flags);
            return;
        }
        if (len == 0) {
            if (type == NBD_CMD_READ)
                reply_read(c, handle, off, NULL, 0);
            else
                reply_simple(c, handle, 0, NULL, 0);
            return;
        }
    } else {
        reply_error(c, type, handle, NBD_EINVAL);
        return;
    }

    struct req *r = calloc(1, sizeof *r);
    if (r && *owned) {
        r->buf = *owned;
        *owned = NULL;
    } else if (r && (type == NBD_CMD_READ || type == NBD_CMD_WRITE)) {
        r->buf = req_buf_alloc(len);
        if (!r->buf) {
            free(r);
            r = NULL;
        } else if (type == NBD_CMD_WRITE) {
            memcpy(r->buf, payload, len);
        }
    }
    if (!r) {
        reply_error(c, type, handle, NBD_ENOMEM);
        return;
    }
    *r = (struct req){.c = c,
                      .flags = flags,
                      .type = type,
                      .handle = handle,
                      .off = off,
                      .len = len,
                      .buf = r->buf};
    c->outstanding++;
    if (!c->ex->v) {
        req_wait(c->ex, r);
        return;
    }
    req_submit(r);
}

/* Hand a request to the engine (or fail it). */
static void req_submit(struct req *r)
{
    struct conn *c = r->c;
    plx_vdi *v = c->ex->v;
    uint64_t off = r->off;
    uint32_t len = r->len;
    int rc;
    switch (r->type) {
    case NBD_CMD_READ:
        rc = plx_vdi_submit_read(v, r->buf, off, len, req_done, r);
        break;
    case NBD_CMD_WRITE:
        rc = plx_vdi_submit_write(v, r->buf, off, len,
                                  (r->flags & NBD_CMD_FLAG_FUA) ? PLX_WRITE_FUA : PLX_WRITE_CACHED,
                                  req_done, r);
        break;
    case NBD_CMD_FLUSH:
        rc = plx_vdi_submit_flush(v, req_done, r);
        break;
    default: /* TRIM, WRITE_ZEROES */
        rc = plx_vdi_submit_trim(v, off, len, req_done, r);
        break;
    }
    if (rc)
        req_finish(r, rc);
}

/* ---- options -----------------------------------------------------------------------------------
 */

static void opt_reply(struct conn *c, uint32_t opt, uint32_t type, const void *data, size_t len)
{
    unsigned char h[20];
    put64(h, NBD_MAGIC_REP);
    put32(h + 8, opt);
    put32(h + 12, type);
    put32(h + 16, (uint32_t)len);
    char *copy = NULL;
    if (len) {
        copy = malloc(len);
        if (!copy) {
            c->quit = 1;
            return;
        }
        memcpy(copy, data, len);
    }
    queue(c, h, sizeof h, copy, len);
}

static void opt_error(struct conn *c, uint32_t opt, uint32_t type, const char *msg)
{
    opt_reply(c, opt, type, msg, msg ? strlen(msg) : 0);
}

/* One NBD_REP_SERVER: u32 name length, name, then an optional description (desc may be NULL). */
static int add_server_reply(void *arg, const char *name, const char *desc)
{
    struct conn *c = arg;
    size_t n = strlen(name), dn = desc ? strlen(desc) : 0;
    unsigned char *d = malloc(4 + n + dn);
    if (!d)
        return -ENOMEM;
    put32(d, (uint32_t)n);
    memcpy(d + 4, name, n);
    if (dn)
        memcpy(d + 4 + n, desc, dn);
    opt_reply(c, NBD_OPT_LIST, NBD_REP_SERVER, d, 4 + n + dn);
    free(d);
    return 0;
}

static void opt_list(struct conn *c, plx_store *st, uint32_t len)
{
    if (len) {
        opt_error(c, NBD_OPT_LIST, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
        return;
    }
    int rc = plx_export_names(st, add_server_reply, c);
    if (rc)
        opt_error(c, NBD_OPT_LIST, NBD_REP_ERR_PLATFORM, plx_store_errmsg(st));
    else
        opt_reply(c, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
}

static void opt_info_go_reply(struct conn *c, uint32_t opt, struct export *e);

/* INFO and GO: u32 name length, name, u16 n, n x u16 info requests. */
static void opt_info_go(struct conn *c, plx_store *st, uint32_t opt, const unsigned char *d,
                        uint32_t len)
{
    uint32_t nlen = len >= 4 ? get32(d) : 0;
    if (len < 6 || nlen > len - 6 || (len - 6 - nlen) != 2u * get16(d + 4 + nlen)) {
        opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO");
        return;
    }
    if (nlen > PLX_NAME_MAX + 63) {
        opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "export name too long");
        return;
    }
    char name[PLX_NAME_MAX + 64];
    memcpy(name, d + 4, nlen);
    name[nlen] = 0;
    struct export *e = NULL;
    int rc = export_get(c->srv, name, st, &e);
    if (rc) {
        opt_error(c, opt, NBD_REP_ERR_UNKNOWN, *name ? plx_store_errmsg(st) : "no export name");
        return;
    }
    if (!e->settled) {
        c->wait_ex = e; /* answered by opt_settled once the open is settled */
        c->wait_opt = opt;
        return;
    }
    opt_info_go_reply(c, opt, e);
}

/* INFO and GO, the export settled: its information, or why it cannot be opened. Takes over the
 * caller's reference to e. */
static void opt_info_go_reply(struct conn *c, uint32_t opt, struct export *e)
{
    if (e->open_rc) {
        /* The client gets the engine's message as the reply's text: "no VDI named ...", or
         * that the lock manager cannot be reached. The protocol has no code for "try again
         * later"; UNKNOWN ("export not available" to qemu) is the least wrong, and clients
         * that show the text (qemu: "server reported: ...") say why. */
        opt_error(c, opt, NBD_REP_ERR_UNKNOWN, e->open_err);
        export_put(c->srv, e);
        return;
    }
    struct export *old = c->ex;
    c->ex = e;
    c->size = e->v ? plx_vdi_size(e->v) : e->size;
    c->writable = e->v ? !plx_vdi_readonly(e->v) : 1;
    unsigned char info[14];
    put16(info, NBD_INFO_EXPORT);
    put64(info + 2, c->size);
    put16(info + 10, export_flags(c));
    opt_reply(c, opt, NBD_REP_INFO, info, 12);
    put16(info, NBD_INFO_BLOCK_SIZE);
    put32(info + 2, 1);
    put32(info + 6, PLX_BLOCK_SIZE);
    put32(info + 10, NBD_MAX_PAYLOAD);
    opt_reply(c, opt, NBD_REP_INFO, info, 14);
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
    if (old)
        export_put(c->srv, old);
    if (opt == NBD_OPT_GO) {
        c->state = ST_TRANSMISSION;
    } else {
        c->ex = NULL;
        export_put(c->srv, e);
    }
}

/* LIST_META_CONTEXT and SET_META_CONTEXT: u32 name length, name, u32 n, n x (u32 len, query). */
static void opt_meta(struct conn *c, uint32_t opt, const unsigned char *d, uint32_t len)
{
    int set = opt == NBD_OPT_SET_META_CONTEXT;
    if (set && !c->structured) {
        opt_error(c, opt, NBD_REP_ERR_INVALID, "structured replies were not negotiated");
        return;
    }
    uint32_t nlen = len >= 4 ? get32(d) : 0;
    if (len < 8 || nlen > len - 8) {
        opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed meta context option");
        return;
    }
    uint32_t nq = get32(d + 4 + nlen), pos = 8 + nlen;
    /* Validate every query first. */
    uint32_t p = pos;
    for (uint32_t i = 0; i < nq; i++) {
        if (len - p < 4 || get32(d + p) > len - p - 4) {
            opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed meta context query");
            return;
        }
        p += 4 + get32(d + p);
    }
    if (p != len) {
        opt_error(c, opt, NBD_REP_ERR_INVALID, "trailing data in meta context option");
        return;
    }
    static const char ctx[] = "base:allocation";
    unsigned char rep[4 + sizeof ctx];
    put32(rep, NBD_CONTEXT_ALLOCATION);
    memcpy(rep + 4, ctx, sizeof ctx - 1);
    int match = 0;
    if (set)
        c->meta_alloc = 0;
    if (nq == 0 && !set)
        match = 1;
    for (uint32_t i = 0; i < nq; i++) {
        uint32_t ql = get32(d + pos);
        const char *q = (const char *)d + pos + 4;
        pos += 4 + ql;
        if ((ql == sizeof ctx - 1 && memcmp(q, ctx, ql) == 0) ||
            (!set && ql == 5 && memcmp(q, "base:", 5) == 0))
            match = 1;
    }
    if (match) {
        opt_reply(c, opt, NBD_REP_META_CONTEXT, rep, sizeof rep - 1);
        if (set)
            c->meta_alloc = 1;
    }
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

static void opt_starttls(struct conn *c, uint32_t len)
{
    if (!c->srv->tls) {
        opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_UNSUP,
                  "TLS is off on this server (parallax serve --tls=on|require)");
        return;
    }
    if (c->tls_state != TLS_PLAIN) {
        opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, "TLS is already on");
        return;
    }
    if (len) {
        opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
        return;
    }
    opt_reply(c, NBD_OPT_STARTTLS, NBD_REP_ACK, NULL, 0);
    c->tls_state = TLS_ACK;
}

/* EXPORT_NAME, the export settled. Takes over the caller's reference to e. */
static void export_name_reply(struct conn *c, struct export *e)
{
    if (e->open_rc) {
        export_put(c->srv, e);
        c->quit = 1; /* the protocol's only answer to an export that cannot be had: close */
        return;
    }
    if (c->ex)
        export_put(c->srv, c->ex);
    c->ex = e;
    c->size = e->v ? plx_vdi_size(e->v) : e->size;
    c->writable = e->v ? !plx_vdi_readonly(e->v) : 1;
    unsigned char h[10];
    put64(h, c->size);
    put16(h + 8, export_flags(c));
    char *zeroes = c->no_zeroes ? NULL : calloc(1, 124);
    if (!c->no_zeroes && !zeroes) {
        c->quit = 1;
        return;
    }
    queue(c, h, sizeof h, zeroes, zeroes ? 124 : 0);
    c->state = ST_TRANSMISSION;
}

/* The option that waited for an export's open: answer it once the export is settled. Returns
 * 1 while it still waits (nothing more is parsed). */
static int opt_settled(struct conn *c)
{
    struct export *e = c->wait_ex;
    if (!e)
        return 0;
    if (!e->settled)
        return 1;
    c->wait_ex = NULL;
    if (c->wait_opt == NBD_OPT_EXPORT_NAME)
        export_name_reply(c, e);
    else
        opt_info_go_reply(c, c->wait_opt, e);
    return 0;
}

static void handle_option(struct conn *c, plx_store *st, uint32_t opt, const unsigned char *d,
                          uint32_t len)
{
    if (c->srv->tls_mode == NBD_TLS_REQUIRE && c->tls_state != TLS_UP && opt != NBD_OPT_STARTTLS &&
        opt != NBD_OPT_ABORT) {
        if (opt == NBD_OPT_EXPORT_NAME) {
            c->quit = 1; /* no way to answer it with an error: close */
            return;
        }
        opt_error(c, opt, NBD_REP_ERR_TLS_REQD, "this server requires TLS (NBD_OPT_STARTTLS)");
        return;
    }
    switch (opt) {
    case NBD_OPT_STARTTLS:
        opt_starttls(c, len);
        return;
    case NBD_OPT_EXPORT_NAME: {
        char name[PLX_NAME_MAX + 64];
        struct export *e = NULL;
        if (len >= sizeof name) {
            c->quit = 1;
            return;
        }
        memcpy(name, d, len);
        name[len] = 0;
        if (export_get(c->srv, name, st, &e) != 0) {
            c->quit = 1; /* the protocol's only answer to an unknown name: close */
            return;
        }
        if (!e->settled) {
            c->wait_ex = e;
            c->wait_opt = opt;
            return;
        }
        export_name_reply(c, e);
        return;
    }
    case NBD_OPT_ABORT:
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        c->quit = 1;
        return;
    case NBD_OPT_LIST:
        opt_list(c, st, len);
        return;
    case NBD_OPT_INFO:
    case NBD_OPT_GO:
        opt_info_go(c, st, opt, d, len);
        return;
    case NBD_OPT_STRUCTURED_REPLY:
        if (len) {
            opt_error(c, opt, NBD_REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
            return;
        }
        c->structured = 1;
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        return;
    case NBD_OPT_LIST_META_CONTEXT:
    case NBD_OPT_SET_META_CONTEXT:
        opt_meta(c, opt, d, len);
        return;
    default:
        opt_error(c, opt, NBD_REP_ERR_UNSUP, "option not supported");
        return;
    }
}

/* ---- input -------------------------------------------------------------------------------------
 */

static int may_read(const struct conn *c)
{
    return !c->eof && !c->quit && !c->wait_ex && c->outstanding < NBD_MAX_INFLIGHT &&
           c->out_bytes < NBD_OUT_LIMIT && (c->tls_state == TLS_PLAIN || c->tls_state == TLS_UP);
}

/* Handle every complete message in the input buffer that may be handled now. */
static void conn_parse(struct conn *c, plx_store *st)
{
    if (opt_settled(c))
        return;
    while (!c->wait_ex && !c->quit && c->out_bytes < NBD_OUT_LIMIT &&
           (c->tls_state == TLS_PLAIN || c->tls_state == TLS_UP)) {
        const unsigned char *p = (const unsigned char *)c->in + c->in_off;
        size_t avail = c->in_len - c->in_off;
        if (c->pay) { /* a large write's payload, received into its buffer */
            if (c->pay_have < c->pay_len)
                break;
            const unsigned char *h = c->pay_hdr;
            char *buf = c->pay;
            c->pay = NULL;
            c->hdr_only = 1;
            handle_request(c, get16(h + 4), get16(h + 6), get64(h + 8), get64(h + 16), c->pay_len,
                           NULL, buf);
            continue;
        }
        if (c->state == ST_CLIENT_FLAGS) {
            c->need = 4;
            if (avail < 4)
                break;
            uint32_t f = get32(p);
            c->in_off += 4;
            if (f & ~(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES)) {
                c->quit = 1;
                break;
            }
            c->no_zeroes = !!(f & NBD_FLAG_NO_ZEROES);
            c->state = ST_OPTIONS;
        } else if (c->state == ST_OPTIONS) {
            c->need = 16;
            if (avail < 16)
                break;
            uint32_t len = get32(p + 12);
            if (get64(p) != NBD_MAGIC_OPT || len > NBD_MAX_OPTION) {
                c->quit = 1;
                break;
            }
            c->need = 16 + (size_t)len;
            if (avail < c->need)
                break;
            c->in_off += c->need;
            handle_option(c, st, get32(p + 8), p + 16, len);
        } else {
            if (c->outstanding >= NBD_MAX_INFLIGHT)
                break;
            c->need = 28;
            if (avail < 28)
                break;
            uint16_t type = get16(p + 6);
            uint32_t len = get32(p + 24);
            if (get32(p) != NBD_MAGIC_REQUEST || (type == NBD_CMD_WRITE && len > NBD_MAX_PAYLOAD)) {
                fprintf(stderr, "parallax: serve: protocol error from a client (%s): closing\n",
                        get32(p) != NBD_MAGIC_REQUEST ? "bad request magic"
                                                      : "write larger than 32 MiB");
                c->quit = 1;
                break;
            }
            if (type == NBD_CMD_WRITE)
                c->need += len;
            if (type == NBD_CMD_WRITE && avail < c->need && len >= NBD_DIRECT_MIN &&
                (c->pay = req_buf_alloc(len)) != NULL) {
                /* Receive the rest of the payload straight into the request's buffer rather
                 * than into the input buffer and copy it from there (conn_read). */
                memcpy(c->pay_hdr, p, 28);
                c->pay_len = len;
                c->pay_have = (uint32_t)(avail - 28);
                memcpy(c->pay, p + 28, c->pay_have);
                c->in_off = c->in_len;
                c->need = 0;
                break;
            }
            if (avail < c->need)
                break;
            c->in_off += c->need;
            c->hdr_only = 0;
            handle_request(c, get16(p + 4), type, get64(p + 8), get64(p + 16), len, p + 28, NULL);
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
}

/* One read from the socket into the input buffer, with room for the message being parsed, or
 * into the buffer of a large write's payload. */
static void conn_read(struct conn *c)
{
    if (c->pay && c->pay_have < c->pay_len) {
        char *to = c->pay + c->pay_have;
        size_t want = c->pay_len - c->pay_have;
        ssize_t r;
        if (c->tls_state == TLS_UP) {
            r = nbd_tls_recv(c->tls, to, want);
            if (r > 0 && nbd_tls_pending(c->tls))
                conn_kick(c);
            if (r == -EAGAIN)
                return;
            if (r < 0) {
                c->eof = c->quit = c->wr_broken = 1;
                return;
            }
        } else {
            r = recv(c->h.fd, to, want, MSG_DONTWAIT);
            if (r < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                    c->eof = c->quit = c->wr_broken = 1;
                return;
            }
        }
        if (r == 0)
            c->eof = 1;
        c->pay_have += (uint32_t)r;
        return;
    }
    size_t have = c->in_len - c->in_off;
    if (!c->chunk)
        c->chunk = NBD_READ_CHUNK0;
    size_t room = c->chunk;
    if (c->need > have && c->need - have > room)
        room = c->need - have;
    if (c->in_cap - c->in_len < room && c->in_off) {
        memmove(c->in, c->in + c->in_off, have);
        c->in_len = have;
        c->in_off = 0;
    }
    if (c->in_cap - c->in_len < room) {
        char *n = realloc(c->in, c->in_len + room);
        if (!n) {
            c->quit = 1;
            return;
        }
        c->in = n;
        c->in_cap = c->in_len + room;
    }
    size_t max = c->in_cap - c->in_len;
    if (c->hdr_only && c->need > have && c->need - have < max)
        max = c->need - have;
    if (c->tls_state == TLS_UP) {
        ssize_t r = nbd_tls_recv(c->tls, c->in + c->in_len, max);
        if (r > 0)
            c->in_len += (size_t)r;
        else if (r == 0)
            c->eof = 1;
        else if (r != -EAGAIN)
            c->eof = c->quit = c->wr_broken = 1;
        /* GnuTLS may hold decrypted bytes the socket will not announce again: read them from
         * the idle hook. */
        if (r > 0 && nbd_tls_pending(c->tls))
            conn_kick(c);
        return;
    }
    ssize_t r = recv(c->h.fd, c->in + c->in_len, max, MSG_DONTWAIT);
    if (r > 0 && (size_t)r == c->in_cap - c->in_len && c->chunk < NBD_READ_CHUNK)
        c->chunk *= 2; /* the client sends faster than one chunk per read */
    if (r > 0)
        c->in_len += (size_t)r;
    else if (r == 0)
        c->eof = 1;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        c->eof = c->quit = c->wr_broken = 1;
}

/* ---- TLS ---------------------------------------------------------------------------------------
 */

/* Advance the handshake; on success go on with the options (in TLS from now on). */
static void tls_step(struct conn *c)
{
    char err[256];
    int rc = nbd_tls_handshake(c->tls, err, sizeof err);
    if (rc == -EAGAIN)
        return;
    if (rc) {
        fprintf(stderr, "parallax: serve: TLS handshake with a client failed: %s\n", err);
        c->quit = c->wr_broken = 1; /* nothing can be said to it in plain text any more */
        free_out(c);
        return;
    }
    c->tls_state = TLS_UP;
    conn_kick(c); /* records may already be buffered */
}

static void tls_start(struct conn *c)
{
    if (c->in_len != c->in_off) {
        /* The client sent more plain text after STARTTLS, which the protocol forbids. */
        fprintf(stderr, "parallax: serve: protocol error from a client (data after "
                        "NBD_OPT_STARTTLS): closing\n");
        c->quit = c->wr_broken = 1;
        return;
    }
    if (nbd_tls_session_new(c->srv->tls, c->h.fd, &c->tls) != 0) {
        fprintf(stderr, "parallax: serve: cannot start a TLS session: closing the connection\n");
        c->quit = c->wr_broken = 1;
        return;
    }
    c->tls_state = TLS_HANDSHAKE;
    tls_step(c);
}

static int conn_finished(const struct conn *c)
{
    return (c->eof || c->quit) && c->outstanding == 0 && (!c->out_head || c->wr_broken);
}

/* Register the events the connection wants now. */
static void conn_update(struct conn *c)
{
    if (conn_finished(c)) {
        conn_kick(c); /* freed by the idle hook */
        return;
    }
    if (c->wr_broken) {
        /* Nothing more to read or write: stop watching (a hung-up socket stays ready). */
        if (c->watched)
            et_unwatch(c->srv->et, &c->h);
        c->watched = 0;
        return;
    }
    uint32_t ev = 0;
    if (c->tls_state == TLS_HANDSHAKE)
        ev = nbd_tls_wants_write(c->tls) ? EPOLLOUT : EPOLLIN;
    if (may_read(c))
        ev |= EPOLLIN;
    if (c->out_head && !c->wr_broken)
        ev |= EPOLLOUT;
    if (ev != c->events && et_modify(c->srv->et, &c->h, ev) == 0)
        c->events = ev;
}

static void conn_destroy(struct conn *c)
{
    struct nbd_server *srv = c->srv;
    if (c->watched)
        et_unwatch(srv->et, &c->h);
    nbd_tls_session_free(c->tls);
    close(c->h.fd);
    if (c->ex)
        export_put(srv, c->ex);
    if (c->wait_ex)
        export_put(srv, c->wait_ex); /* the last client of an open in progress cancels it */
    free_out(c);
    free(c->in);
    free(c->pay);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void conn_ready(struct et_fd_handler *h, plx_store *st)
{
    struct conn *c = (struct conn *)h;
    if (c->tls_state == TLS_HANDSHAKE) {
        if (h->revents & (EPOLLHUP | EPOLLERR) && !(h->revents & EPOLLIN)) {
            c->eof = c->quit = c->wr_broken = 1;
        } else
            tls_step(c);
        conn_update(c);
        return;
    }
    if (h->revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (may_read(c))
            conn_read(c);
        else if (h->revents & (EPOLLHUP | EPOLLERR)) {
            /* Hung up while we were not reading: nobody is left to answer. */
            c->eof = c->quit = c->wr_broken = 1;
            free_out(c);
        }
    }
    conn_parse(c, st);
    conn_flush(c);
    conn_update(c);
}

/* The write cache's automatic mode: its rule for every VDI open for writing (blocking while it
 * switches, as a `parallax cache` command does; plx_vdi_wcache_tick). */
static void wauto_ready(struct et_fd_handler *h, plx_store *st)
{
    struct nbd_server *srv = (struct nbd_server *)((char *)h - offsetof(struct nbd_server, wauto));
    uint64_t junk;
    if (read(h->fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    for (struct export *e = srv->exports; e; e = e->next) {
        if (!e->v || e->closing == 2 || plx_vdi_readonly(e->v))
            continue;
        int rc = plx_vdi_wcache_tick(e->v);
        if (rc > 0)
            fprintf(stderr,
                    "parallax: serve: export '%s': write cache %s automatically (store write "
                    "latency %.2f ms)\n",
                    e->name, rc == 1 ? "on" : "turning off (draining its last writes)",
                    plx_store_write_latency_ms(st));
        else if (rc < 0)
            fprintf(stderr, "parallax: serve: export '%s': automatic write cache: %s\n", e->name,
                    plx_store_errmsg(st));
    }
}

static int wauto_start(struct nbd_server *srv)
{
    srv->wauto.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    srv->wauto.on_ready = wauto_ready;
    struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
    if (srv->wauto.fd < 0 || timerfd_settime(srv->wauto.fd, 0, &its, NULL) != 0 ||
        et_watch(srv->et, &srv->wauto) != 0) {
        int e = -errno;
        if (srv->wauto.fd >= 0)
            close(srv->wauto.fd);
        srv->wauto.fd = 0;
        return e ? e : -EIO;
    }
    return 0;
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
        if (c->tls_state == TLS_UP && nbd_tls_pending(c->tls) && may_read(c))
            conn_read(c);
        conn_parse(c, st);
        conn_flush(c);
        if (conn_finished(c))
            conn_destroy(c); /* may run other callbacks (closing a VDI): they only kick */
        else
            conn_update(c);
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
        c->h.on_ready = conn_ready;
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
        queue(c, g, sizeof g, NULL, 0);
        conn_flush(c);
        conn_update(c);
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
    if (cache_all)
        buf_pool_warm();
    rc = wauto_start(srv);
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
            req_finish(r, -ESHUTDOWN); /* never handed over: nothing was done */
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
                        may_read(c) && recv(c->h.fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
             i++) {
            conn_read(c);
            conn_parse(c, st);
        }
        c->quit = 1;
        conn_kick(c);
        conn_update(c);
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
        free_out(c);
        conn_kick(c);
        conn_update(c);
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
        free_out(c);
    }
    stop_timers(srv);
    /* Closing a VDI completes its outstanding requests (their callbacks run now). */
    while (srv->exports) {
        struct export *e = srv->exports;
        srv->exports = e->next;
        for (struct req *r = e->pending_head, *next; r; r = next) {
            next = r->pending_next;
            req_finish(r, -ESHUTDOWN); /* never handed over: nothing was done */
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
        free_out(c);
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
    while (buf_pool.n) /* every connection is gone: nothing takes from it any more */
        free(buf_pool.p[--buf_pool.n]);
    buf_pool.bytes = 0;
    nbd_tls_free(srv->tls);
    free(srv);
}
