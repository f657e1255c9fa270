/*
 * nbd_handshake.c - the fixed newstyle negotiation: the options a client sends before the
 * transmission phase (EXPORT_NAME, GO, INFO, LIST, ABORT, STARTTLS, STRUCTURED_REPLY,
 * SET_META_CONTEXT and LIST_META_CONTEXT for "base:allocation") and their replies. An option
 * that names an export waits, without blocking the loop, until the export's open is settled
 * (nbd_opt_settled).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "export_names.h"
#include "nbd_internal.h"

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
    nbd_queue(c, h, sizeof h, copy, len);
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
        c->wait_ex = e; /* answered by nbd_opt_settled once the open is settled */
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
    nbd_queue(c, h, sizeof h, zeroes, zeroes ? 124 : 0);
    c->state = ST_TRANSMISSION;
}

/* The option that waited for an export's open: answer it once the export is settled. Returns
 * 1 while it still waits (nothing more is parsed). */
int nbd_opt_settled(struct conn *c)
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

void nbd_handle_option(struct conn *c, plx_store *st, uint32_t opt, const unsigned char *d,
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
