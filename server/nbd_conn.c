/*
 * nbd_conn.c - a client's connection: its input buffer and parsing (handed to the handshake or
 * the transmission phase), and the events it waits for; its output and the start of its TLS
 * session are nbd_output.c's, below the phases that queue replies.
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
 * nbd_req_finish); the engine loop's idle hook (after plx_store_service) writes the replies out,
 * resumes parsing, and frees connections that are finished: ones that hung up,
 * disconnected or broke the protocol, once no request of theirs is outstanding. Freeing only
 * there means no callback and no pending epoll event can refer to a freed connection.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nbd_internal.h"

/* ---- input -------------------------------------------------------------------------------------
 */

int nbd_may_read(const struct conn *c)
{
    return !c->eof && !c->quit && !c->wait_ex && c->outstanding < NBD_MAX_INFLIGHT &&
           c->out_bytes < NBD_OUT_LIMIT && (c->tls_state == TLS_PLAIN || c->tls_state == TLS_UP);
}

/* Handle every complete message in the input buffer that may be handled now. */
void nbd_conn_parse(struct conn *c, plx_store *st)
{
    if (nbd_opt_settled(c))
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
            nbd_handle_request(c, get16(h + 4), get16(h + 6), get64(h + 8), get64(h + 16),
                               c->pay_len, NULL, buf);
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
            nbd_handle_option(c, st, get32(p + 8), p + 16, len);
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
                (c->pay = nbd_req_buf_alloc(len)) != NULL) {
                /* Receive the rest of the payload straight into the request's buffer rather
                 * than into the input buffer and copy it from there (nbd_conn_read). */
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
            nbd_handle_request(c, get16(p + 4), type, get64(p + 8), get64(p + 16), len, p + 28,
                               NULL);
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
}

/* One read from the socket into the input buffer, with room for the message being parsed, or
 * into the buffer of a large write's payload. */
void nbd_conn_read(struct conn *c)
{
    if (c->pay && c->pay_have < c->pay_len) {
        char *to = c->pay + c->pay_have;
        size_t want = c->pay_len - c->pay_have;
        ssize_t r;
        if (c->tls_state == TLS_UP) {
            r = nbd_tls_recv(c->tls, to, want);
            if (r > 0 && nbd_tls_pending(c->tls))
                nbd_conn_kick(c);
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
            nbd_conn_kick(c);
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

int nbd_conn_finished(const struct conn *c)
{
    return (c->eof || c->quit) && c->outstanding == 0 && (!c->out_head || c->wr_broken);
}

/* Register the events the connection wants now. */
void nbd_conn_update(struct conn *c)
{
    if (nbd_conn_finished(c)) {
        nbd_conn_kick(c); /* freed by the idle hook */
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
    if (nbd_may_read(c))
        ev |= EPOLLIN;
    if (c->out_head && !c->wr_broken)
        ev |= EPOLLOUT;
    if (ev != c->events && et_modify(c->srv->et, &c->h, ev) == 0)
        c->events = ev;
}

void nbd_conn_destroy(struct conn *c)
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
    nbd_free_out(c);
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

void nbd_conn_ready(struct et_fd_handler *h, plx_store *st)
{
    struct conn *c = (struct conn *)h;
    if (c->tls_state == TLS_HANDSHAKE) {
        if (h->revents & (EPOLLHUP | EPOLLERR) && !(h->revents & EPOLLIN)) {
            c->eof = c->quit = c->wr_broken = 1;
        } else
            nbd_conn_tls_step(c);
        nbd_conn_update(c);
        return;
    }
    if (h->revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (nbd_may_read(c))
            nbd_conn_read(c);
        else if (h->revents & (EPOLLHUP | EPOLLERR)) {
            /* Hung up while we were not reading: nobody is left to answer. */
            c->eof = c->quit = c->wr_broken = 1;
            nbd_free_out(c);
        }
    }
    nbd_conn_parse(c, st);
    nbd_conn_flush(c);
    nbd_conn_update(c);
}
