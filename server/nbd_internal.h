/*
 * nbd_internal.h - what the parts of the NBD server share (nbd_server.c and the files it names):
 * its limits, the export, connection and request records, and the calls each part makes into
 * another, listed below in the parts' order from the top (docs/DESIGN.md, "The NBD server's
 * files"): a part calls only the parts after it. Not for anything outside server/nbd_*.c: the
 * server's interface is nbd_server.h.
 */
#ifndef PLX_NBD_INTERNAL_H
#define PLX_NBD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <sys/un.h>

#include "nbd_proto.h"
#include "nbd_server.h"
#include "nbd_tls.h"
#include "parallax_handover.h"

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
    struct nbd_server *srv; /* its server: the engine's callbacks reach it through this */
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
    struct handover_try retry; /* handover: the tries of the open (nbd_handover.c) */
    int unlinked;              /* failed: out of the exports list, freed with its last client */
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
    /* A large write's payload is received straight into its request buffer (see nbd_conn_parse):
     * the header, the buffer, how much of it has arrived. */
    unsigned char pay_hdr[28];
    char *pay;
    uint32_t pay_len, pay_have;
    /* After a large write's payload, read only as far as the next request's header (nbd_conn_read):
     * a read of the whole chunk took up to 256 KiB of the next payload into the input buffer,
     * copied from there into the request's buffer again (nbd_conn_parse's memcpy, 3-4% of serve's
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
     * parsed until the idle hook answers it (nbd_conn_parse). Holds a reference. */
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

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- nbd_conn.c: connections, their input and the events they wait for ------------------- */

int nbd_may_read(const struct conn *c);
void nbd_conn_parse(struct conn *c, plx_store *st);
void nbd_conn_read(struct conn *c);
int nbd_conn_finished(const struct conn *c);
void nbd_conn_update(struct conn *c);
void nbd_conn_destroy(struct conn *c);
void nbd_conn_ready(struct et_fd_handler *h, plx_store *st);

/* ---- nbd_handshake.c: the newstyle negotiation (options) ------------------------------------ */

int nbd_opt_settled(struct conn *c);
void nbd_handle_option(struct conn *c, plx_store *st, uint32_t opt, const unsigned char *d,
                       uint32_t len);

/* ---- nbd_exports.c: exports, their VDIs' open and close ------------------------------------ */

int export_get(struct nbd_server *srv, const char *name, plx_store *st, struct export **out);
void export_put(struct nbd_server *srv, struct export *e);
void export_reap(struct nbd_server *srv);

/* ---- nbd_handover.c: exports waiting for a VDI another process holds ------------------------ */

int nbd_retry_arm(struct nbd_server *srv);

/* ---- nbd_transmission.c: requests and their replies ----------------------------------------- */

void nbd_req_finish(struct req *r, int status);
void nbd_handle_request(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
                        uint64_t off, uint32_t len, const unsigned char *payload, char *owned);
void nbd_req_submit(struct req *r);

/* ---- nbd_output.c: a connection's output, the switch to TLS --------------------------------- */

void nbd_conn_kick(struct conn *c);
void nbd_free_out(struct conn *c);
int nbd_queue(struct conn *c, const void *hdr, size_t hlen, char *data, size_t dlen);
void nbd_conn_flush(struct conn *c);
/* Advance the TLS handshake (STARTTLS acknowledged and sent). */
void nbd_conn_tls_step(struct conn *c);

/* ---- nbd_wcache.c: the write cache's modes ------------------------------------------------- */

/* The write cache mode every VDI opened for writing gets (nbd_server_cache_all). */
extern int nbd_cache_all;
extern double nbd_cache_all_threshold_ms;

void export_opened(plx_store *st, struct export *e);
int nbd_wauto_start(struct nbd_server *srv);

/* ---- nbd_buffers.c: request buffers and their pool ------------------------------------------ */

char *nbd_req_buf_alloc(uint32_t len);
void nbd_req_buf_free(char *p, uint32_t len);
void nbd_buf_pool_warm(void);
void nbd_buf_pool_free(void);

#endif
