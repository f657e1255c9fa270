/*
 * nbd_exports.c - the server's exports: one per VDI (or snapshot) that clients asked for, shared
 * by every connection to it; the asynchronous open of its VDI and the settling of its result
 * (open, waiting for a handover: nbd_handover.c, or failed); its close once the last client left
 * and the write cache drained it. The write cache's modes for the VDIs it opens are
 * nbd_wcache.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nbd_internal.h"

static void export_open_done(void *arg, int status, plx_vdi *v);

/* Open (or share) the export `name`. The VDI's open is asynchronous: the export may come back
 * still opening (e->opening), and the caller's option waits for it (conn.wait_ex). */
int export_get(struct nbd_server *srv, const char *name, plx_store *st, struct export **out)
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
    e->srv = srv;
    e->retry.st = st;
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
    struct nbd_server *srv = e->srv;
    e->opening = NULL;
    e->opened = 1;
    e->open_rc = status;
    e->v = v;
    if (status)
        snprintf(e->open_err, sizeof e->open_err, "%s", plx_store_errmsg(et_store(srv->et)));
    for (struct conn *c = srv->conns; c; c = c->next)
        if (c->wait_ex == e)
            nbd_conn_kick(c);
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
        nbd_retry_arm(srv) == 0) {
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
        snprintf(e->close_err, sizeof e->close_err, "%s", plx_store_errmsg(et_store(e->srv->et)));
    e->v = NULL;
    export_free(e->srv, e, status);
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
    if (e->retry.req)
        plx_vdi_open_cancel(e->retry.req);
    e->opening = e->retry.req = NULL;
    if (e->retry.v && !e->v)
        e->v = e->retry.v; /* handed over, and nobody left to serve */
    e->retry.v = NULL;
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

void export_put(struct nbd_server *srv, struct export *e)
{
    if (--e->refs > 0)
        return;
    export_close(srv, e);
}

/* Close the exports whose drain has finished (from the idle hook, after every service pass:
 * the pass that completed the last drain round is followed by this at once). */
void export_reap(struct nbd_server *srv)
{
    for (struct export *e = srv->exports, *next; e; e = next) {
        next = e->next;
        if (e->closing == 1 && e->refs == 0)
            export_close(srv, e);
        else
            export_settle(srv, e, et_store(srv->et));
    }
}
