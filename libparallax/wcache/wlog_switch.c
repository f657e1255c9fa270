/*
 * wlog_switch.c - turning the write cache on and off for an open VDI (at once, or without a
 * wait: the VDI's records drain first), and the VDI record's fields that name the log (layer 6;
 * wlog.h, wlog_shared.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include "lock.h"
#include "registry.h"
#include "vdi_io.h"
#include "wlog_shared.h"

/* ---- VDI records ----------------------------------------------------------------------------- */

/* Write v's record with its write-log fields set (or cleared). Waits for the pipeline to be
 * idle: a snapshot in flight would write the record from an image taken before. */
static int write_fields(struct plx_vdi *v, bool set)
{
    plx_store *st = v->st;
    while (!plx_vdi_idle(v)) {
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
        if (plx_vdi_idle(v))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
    }
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec = v->rec;
    rec.wlog_host = set ? st->host_hash : 0;
    rec.wlog_id = set ? st->wlog->log_id : 0;
    rc = plx_registry_write(st, v->slot_addr, &rec);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (!rc) {
        rec.seq++;
        v->rec = rec;
    }
    plx_admin_unlock(st);
    return rc;
}

int plx_wlog_check_owner(plx_store *st, const struct plx_vdi_record *rec)
{
    if (!rec->wlog_id || (st->wlog && st->wlog->log_id == rec->wlog_id))
        return 0;
    bool here = rec->wlog_host == st->host_hash;
    return plx_err(st, -EBUSY,
                   "VDI %s has writes not yet drained in write log %016llx of %s: attach that "
                   "log again ('parallax serve --write-cache PATH', or the tapdisk that used "
                   "it, on that host), which replays them into the VDI first, then open it "
                   "there; or drop those writes with 'parallax cache discard %s --force'",
                   rec->name, (unsigned long long)rec->wlog_id,
                   here ? "this host (another process's log)" : "another host", rec->name);
}

/* ---- Turning the cache on and off for a VDI -------------------------------------------------- */

int plx_wlog_vdi_enable(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    if (!wl)
        return plx_err(st, -ENOENT, "no write log is attached to this store");
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only: nothing to cache", v->rec.name);
    if (wl->failed)
        return plx_err(st, -EIO, "%s", wl->error);
    struct plx_wlog_vdi *w = v->wc;
    if (w) {
        if (w->detaching && !w->async_detach)
            return plx_err(st, -EBUSY, "the write cache of VDI %s is being turned off",
                           v->rec.name);
        if (w->detaching) {
            /* Turning off is called off: what it held goes to the log after what is queued. */
            w->detaching = w->async_detach = false;
            if (w->held_head) {
                if (w->q_tail)
                    w->q_tail->qnext = w->held_head;
                else
                    w->q_head = w->held_head;
                w->q_tail = w->held_tail;
                for (struct wreq *r = w->held_head; r; r = r->qnext)
                    r->held = false;
                w->held_head = w->held_tail = NULL;
            }
            wlog_process_queue(wl, w);
        }
        return 0;
    }
    w = calloc(1, sizeof *w);
    if (!w)
        return plx_err(st, -ENOMEM, "out of memory");
    if (v->rec.wlog_id == wl->log_id) {
        /* The record names the log already (the automatic mode binds it beforehand): nothing
         * to write, so the switch is immediate. Writes that went to the pipeline before it and
         * were not flushed yet are covered by a store flush at the guest's next flush. */
        w->direct_dirty = v->wpass_dirty;
        w->direct_seq = plx_vdi_next_seq(v);
        v->wpass_dirty = false;
    } else {
        /* The record names the log before the first write goes there (its flush also makes
         * the writes before durable in the store). */
        int rc = write_fields(v, true);
        if (rc) {
            free(w);
            return rc;
        }
    }
    w->v = v;
    w->next = wl->vdis;
    wl->vdis = w;
    v->wc = w;
    wlog_pass_rescue(wl, w);
    /* Requests in the pipeline that are not in the log as well (a trim, a sub-block write):
     * once they complete, the guest's flush must flush the store too. */
    if (plx_vdi_active_before(v, w->direct_seq) > w->rescued_inflight)
        w->direct_dirty = true;
    return 0;
}

int plx_wlog_vdi_bind(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    if (!wl || v->ro || wl->failed || v->rec.wlog_id == wl->log_id)
        return 0;
    return write_fields(v, true);
}

/* The gathering batch is sealed at the end of a pass anyway unless every write slot is busy;
 * sealing it early only for v's sake would shrink other VDIs' group commits. */
static void seal_for(struct plx_wlog *wl, const struct plx_vdi *v)
{
    struct wbatch *g = wl->gather;
    for (uint32_t i = 0; g && i < g->nent; i++)
        if (g->ent[i].vdi_id == v->rec.id) {
            wlog_seal(wl, g);
            break;
        }
}

/* Someone now waits for the drain (drain_wanted says so): let it go on, and start it if it
 * was deferred or held. (Otherwise it is running, or waits for a batch to be written: the
 * release or the write kicks it. A server calls this after every pass while a VDI closes.) */
static void drain_unpause(struct plx_wlog *wl)
{
    if (!wl->drain_paused && !wl->deferred)
        return;
    wl->drain_paused = false; /* closing drains, whatever held it */
    wlog_kick_later(wl);
}

void plx_wlog_vdi_hurry(struct plx_vdi *v, int on)
{
    struct plx_wlog_vdi *w = v->wc;
    if (!w || w->hurry == (on && w->records))
        return;
    w->hurry = on && w->records;
    if (w->hurry && v->st->wlog->deferred)
        wlog_kick_later(v->st->wlog);
}

bool plx_wlog_vdi_draining(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    if (!w || !wlog_detach_left(w) || wl->drain_error)
        return false;           /* (a drain error: detach reports it at once) */
    w->hurry = w->records != 0; /* a close waits for the drain: not deferred */
    drain_unpause(wl);
    seal_for(wl, v);
    return true;
}

int plx_wlog_vdi_try_detach(struct plx_vdi *v)
{
    struct plx_wlog *wl = v->st->wlog;
    struct plx_wlog_vdi *w = v->wc;
    if (!w)
        return 0;
    if (wl->drain_error)
        return plx_wlog_vdi_detach(v); /* reports it at once */
    w->detaching = true;
    w->async_detach = true;
    drain_unpause(wl);
    if (wlog_detach_left(w)) {
        seal_for(wl, v);
        return -EAGAIN;
    }
    wlog_detach_finish(v);
    return 0;
}

bool plx_wlog_vdi_detaching(const struct plx_vdi *v)
{
    return v->wc && v->wc->detaching;
}

int plx_wlog_vdi_detach(struct plx_vdi *v)
{
    plx_store *st = v->st;
    struct plx_wlog *wl = st->wlog;
    if (!v->wc)
        return 0;
    v->wc->detaching = true;
    v->wc->async_detach = false; /* this call finishes it */
    drain_unpause(wl);
    int rc = 0;
    /* (The loop looks v->wc up afresh: nothing else frees it while async_detach is off.) */
    while (wlog_detach_left(v->wc)) {
        if (wl->drain_error) {
            rc = plx_err(st, wl->drain_error, "%s", wl->error);
            break;
        }
        if (wl->gather && wl->gather->nent) {
            wlog_seal(wl, wl->gather);
            wlog_kick_later(wl);
        }
        rc = plx_store_service(st);
        if (rc < 0)
            break;
        rc = 0;
        if (!wlog_detach_left(v->wc))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
    }
    wlog_detach_finish(v);
    return rc;
}

uint64_t plx_wlog_vdi_backlog(const struct plx_vdi *v)
{
    return v->wc ? v->wc->records : 0;
}

int plx_wlog_vdi_disable(struct plx_vdi *v)
{
    /* (The record may name the log with the cache off: the automatic mode binds it.) */
    int rc = plx_wlog_vdi_detach(v);
    if (!rc && v->rec.wlog_id)
        rc = write_fields(v, false);
    return rc;
}
