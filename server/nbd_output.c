/*
 * nbd_output.c - a connection's output: the queue of replies (which the handshake, the
 * transmission phase and the exports fill, so it sits below them all), writing it out in plain
 * text or in TLS records, and the switch to TLS once STARTTLS's acknowledgement is out (the
 * handshake that follows is advanced by the connection's events, nbd_conn.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "nbd_internal.h"

/* ---- output ---------------------------------------------------------------------------------- */

void nbd_conn_kick(struct conn *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    c->dirty_next = c->srv->dirty_head;
    c->srv->dirty_head = c;
}

void nbd_free_out(struct conn *c)
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
int nbd_queue(struct conn *c, const void *hdr, size_t hlen, char *data, size_t dlen)
{
    if (c->wr_broken) {
        free(data);
        return 0;
    }
    struct msg *m = malloc(sizeof *m);
    if (!m) {
        free(data);
        c->quit = c->wr_broken = 1; /* a lost reply would hang the client: drop it */
        nbd_free_out(c);
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
            nbd_free_out(c);
            return;
        }
        out_advance(c, (size_t)r);
    }
}

/* Write as much queued output as the socket takes. */
void nbd_conn_flush(struct conn *c)
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
                nbd_free_out(c);
            }
            return;
        }
        out_advance(c, (size_t)r);
    }
    if (c->tls_state == TLS_ACK && !c->out_head && !c->wr_broken)
        tls_start(c); /* the ACK is out: the client's next bytes are its ClientHello */
}

/* ---- TLS ---------------------------------------------------------------------------------------
 */

/* Advance the handshake; on success go on with the options (in TLS from now on). */
void nbd_conn_tls_step(struct conn *c)
{
    char err[256];
    int rc = nbd_tls_handshake(c->tls, err, sizeof err);
    if (rc == -EAGAIN)
        return;
    if (rc) {
        fprintf(stderr, "parallax: serve: TLS handshake with a client failed: %s\n", err);
        c->quit = c->wr_broken = 1; /* nothing can be said to it in plain text any more */
        nbd_free_out(c);
        return;
    }
    c->tls_state = TLS_UP;
    nbd_conn_kick(c); /* records may already be buffered */
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
    nbd_conn_tls_step(c);
}
