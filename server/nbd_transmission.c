/*
 * nbd_transmission.c - the transmission phase: a request's checks, its submission to the engine
 * (READ, WRITE, FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS; DISC ends the connection) and its reply,
 * simple or structured, queued on the connection in completion order.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd_internal.h"

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
    nbd_queue(c, h, sizeof h, data, dlen);
}

/* A structured chunk header (20 bytes) into h. */
static void nbd_chunk_header(unsigned char *h, uint16_t flags, uint16_t type, uint64_t handle,
                             uint32_t length)
{
    put32(h, NBD_MAGIC_STRUCTURED);
    put16(h + 4, flags);
    put16(h + 6, type);
    put64(h + 8, handle);
    put32(h + 16, length);
}

static void nbd_reply_error(struct conn *c, uint16_t type, uint64_t handle, uint32_t err)
{
    if (c->structured && (type == NBD_CMD_READ || type == NBD_CMD_BLOCK_STATUS)) {
        unsigned char h[26];
        nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, handle, 6);
        put32(h + 20, err);
        put16(h + 24, 0);
        nbd_queue(c, h, sizeof h, NULL, 0);
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
        nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, handle, 0);
        free(buf);
        nbd_queue(c, h, 20, NULL, 0);
        return;
    }
    nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, handle, 8 + len);
    put64(h + 20, off);
    nbd_queue(c, h, sizeof h, buf, len);
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

void nbd_req_finish(struct req *r, int status)
{
    struct conn *c = r->c;
    if (status) {
        log_request_error(c, r, status);
        nbd_reply_error(c, r->type, r->handle, nbd_error(status));
    } else if (r->type == NBD_CMD_READ) {
        reply_read(c, r->handle, r->off, r->buf, r->len);
        r->buf = NULL;
    } else
        reply_simple(c, r->handle, 0, NULL, 0);
    nbd_req_buf_free(r->buf, r->len);
    free(r);
    c->outstanding--;
    nbd_conn_kick(c);
    /* The connection's last request in flight (QD 1): no other reply will share the sendmsg,
     * so send it now rather than from the idle hook, which runs only after the rest of the
     * service pass (the log's writeback start, the store's poll, the drain's work). */
    if (c->outstanding == 0 && c->tls_state == TLS_PLAIN)
        nbd_conn_flush(c);
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
    nbd_req_finish(r, status);
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
        nbd_reply_error(c, NBD_CMD_BLOCK_STATUS, r->handle, nbd_error(rc));
        free(r->d);
    } else {
        unsigned char h[24];
        nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, r->handle,
                         (uint32_t)(4 + r->n * 8));
        put32(h + 20, NBD_CONTEXT_ALLOCATION);
        nbd_queue(c, h, sizeof h, (char *)r->d, r->n * 8);
    }
    free(r);
    c->outstanding--;
    nbd_conn_kick(c);
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
        nbd_reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_EINVAL);
        return;
    }
    struct status_req *r = calloc(1, sizeof *r);
    size_t max = (flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : NBD_MAX_EXTENTS;
    unsigned char *d = malloc(max * 8);
    if (!r || !d) {
        free(r);
        free(d);
        nbd_reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_ENOMEM);
        return;
    }
    *r = (struct status_req){
        .c = c, .handle = handle, .pos = off, .end = off + len, .max = max, .d = d};
    int rc = plx_vdi_submit_block_status(c->ex->v, off, len, &r->run, &r->mapped, status_done, r);
    if (rc < 0) {
        free(d);
        free(r);
        nbd_reply_error(c, NBD_CMD_BLOCK_STATUS, handle, nbd_error(rc));
        return;
    }
    c->outstanding++;
}

/* A request of an export whose VDI is not here yet (a handover, nbd_handover.c) waits in its
 * queue, in order. */
static void req_wait(struct export *e, struct req *r)
{
    if (e->failed) {
        nbd_req_finish(r, e->failed);
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
        nbd_reply_error(c, NBD_CMD_BLOCK_STATUS, handle, NBD_EINVAL);
        return;
    }
    unsigned char h[40];
    nbd_chunk_header(h, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, handle, 12);
    put32(h + 20, NBD_CONTEXT_ALLOCATION);
    put32(h + 24, len);
    put32(h + 28, 0);
    nbd_queue(c, h, 32, NULL, 0);
    (void)off;
}

/* One request (header fields and, for a write, its payload). A write's payload is either in
 * the input buffer (copied) or, for a large one, already in a request buffer (`owned`, taken
 * over). */
static void handle_request_in(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
                              uint64_t off, uint32_t len, const unsigned char *payload,
                              char **owned);

void nbd_handle_request(struct conn *c, uint16_t flags, uint16_t type, uint64_t handle,
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
            nbd_reply_error(c, type, handle, NBD_EPERM);
            return;
        }
        if (off > c->size || len > c->size - off ||
            (type == NBD_CMD_READ && len > NBD_MAX_PAYLOAD) ||
            (type == NBD_CMD_BLOCK_STATUS && len == 0)) {
            nbd_reply_error(c, type, handle, NBD_EINVAL);
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
        nbd_reply_error(c, type, handle, NBD_EINVAL);
        return;
    }

    struct req *r = calloc(1, sizeof *r);
    if (r && *owned) {
        r->buf = *owned;
        *owned = NULL;
    } else if (r && (type == NBD_CMD_READ || type == NBD_CMD_WRITE)) {
        r->buf = nbd_req_buf_alloc(len);
        if (!r->buf) {
            free(r);
            r = NULL;
        } else if (type == NBD_CMD_WRITE) {
            memcpy(r->buf, payload, len);
        }
    }
    if (!r) {
        nbd_reply_error(c, type, handle, NBD_ENOMEM);
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
    nbd_req_submit(r);
}

/* Hand a request to the engine (or fail it). */
void nbd_req_submit(struct req *r)
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
        nbd_req_finish(r, rc);
}
