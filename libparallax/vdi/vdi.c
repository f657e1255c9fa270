/*
 * vdi.c - opening and closing VDIs (with the single-writer lock) and the public I/O entry points.
 * The requests themselves are carried out by pipeline.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include "cache.h"
#include "hold.h"
#include "lock.h"
#include "pipeline.h"
#include "registry.h"
#include "snap_edit.h"
#include "snaplog.h"
#include "vdi.h"
#include "vdi_io.h"
#include "wlog.h"

/* ---- Open / close -------------------------------------------------------------------------------
 */

/* Is VDI id among the locks this store's closes left behind? forget: take it off the list. */
static bool lock_left(plx_store *st, uint64_t id, bool forget)
{
    for (unsigned i = 0; i < st->nlocks_left; i++) {
        if (st->locks_left[i] != id)
            continue;
        if (forget)
            st->locks_left[i] = st->locks_left[--st->nlocks_left];
        return true;
    }
    return false;
}

static void lock_left_note(plx_store *st, uint64_t id)
{
    if (lock_left(st, id, false))
        return;
    uint64_t *n = realloc(st->locks_left, (st->nlocks_left + 1) * sizeof *n);
    if (!n)
        return; /* then only a restart frees it, as before */
    st->locks_left = n;
    st->locks_left[st->nlocks_left++] = id;
}

static int lock_record(plx_store *st, struct plx_vdi *v, bool take)
{
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    rc = plx_registry_read(st, v->slot_addr, &rec);
    if (!rc && take) {
        if (rec.flags & PLX_VDI_DELETED)
            rc = plx_err(st, -ENOENT, "VDI %s was deleted", rec.name);
        /* Writes of this VDI still in another host's (or process's) write log come first. */
        else if ((rc = plx_wlog_check_owner(st, &rec)) != 0)
            ;
        /* Our own lock that a close of ours left behind (its wait for the admin lock failed:
         * plx_vdi_close_async) is ours to take back. Only one this store noted: another store
         * of this process (same identity) may hold the VDI. */
        else if (rec.lock_host &&
                 !(plx_holder_is_me(st, rec.lock_host, rec.lock_pid, rec.lock_epoch) &&
                   lock_left(st, rec.id, false)) &&
                 !plx_holder_stale(st, rec.lock_host, rec.lock_pid, rec.lock_epoch))
            rc = plx_err(st, -EBUSY, "VDI %s is already open for writing by %s pid %u", rec.name,
                         rec.lock_host == st->host_hash ? st->host : "another host", rec.lock_pid);
        /* Taking the lock from a dead holder: cut it off at the target first, so nothing it
         * still sends can land after we start writing (a no-op without fencing). */
        if (!rc)
            rc = plx_holder_evict(st, rec.lock_host, rec.lock_pid, rec.lock_epoch);
        if (!rc) {
            plx_holder_set_me(st, &rec.lock_host, &rec.lock_pid, &rec.lock_epoch);
            rec.lock_time_ns = plx_now_ns();
            rec.writer_gen++; /* other processes' cached nodes of this VDI are now stale */
        }
    } else if (!rc) {
        /* Closing: the in-memory record is the newest (snapshots moved the root). */
        rec = v->rec;
        rec.lock_host = 0;
        rec.lock_pid = 0;
        rec.lock_epoch = 0;
        rec.lock_time_ns = 0;
    }
    if (!rc)
        rc = plx_registry_write(st, v->slot_addr, &rec);
    if (!rc) {
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "%s VDI %s: flush failed: %s", take ? "opening" : "closing", rec.name,
                    strerror(-rc));
    }
    if (!rc) {
        rec.seq++;
        v->rec = rec;
        if (take)
            (void)lock_left(st, rec.id, true);
    }
    plx_admin_unlock(st);
    return rc;
}

/* Is VDI `id` open for writing through this store? */
static bool written_here(const plx_store *st, uint64_t id)
{
    for (const struct plx_vdi *o = st->vdis; o; o = o->next)
        if (!o->ro && o->rec.id == id)
            return true;
    return false;
}

/* A reader of a VDI's current image whose last writes wait in a write log that no live process
 * has attached (its server was killed, or closed without draining) would read older data where
 * those writes went, with nothing to tell it so: an export taken as a backup would be stale. The
 * same refusal as a writer's open, which names the way out (attach the log: it is replayed).
 * A live holder on this host (or a holder on another host: its liveness is lockd's call) is the
 * usual reader-beside-a-writer case. Snapshots are not affected: a snapshot is taken only once
 * the VDI's records before it are drained (docs/DESIGN.md, "The write cache"). */
static int check_log_holds_newer(plx_store *st, const struct plx_vdi_record *rec)
{
    bool live_holder =
        rec->lock_host && !plx_holder_stale(st, rec->lock_host, rec->lock_pid, rec->lock_epoch);
    return live_holder ? 0 : plx_wlog_check_owner(st, rec);
}

/* Which of this VDI's cached writable nodes the new handle may trust (struct plx_owner). A
 * writer took the lock and bumped writer_gen: nodes cached under the generation before it are
 * still good. A reader trusts the generation on disk, unless a writer elsewhere holds the VDI
 * now, whose in-place changes it would never see. */
static int attach_owner(plx_store *st, struct plx_vdi *v)
{
    uint64_t gen = v->rec.writer_gen;
    if (v->ro) {
        bool other_writer = v->rec.lock_host && !written_here(st, v->rec.id);
        v->owner = plx_cache_owner_open(st, v->rec.id, gen, other_writer ? PLX_GEN_NEVER : gen);
    } else {
        v->owner = plx_cache_owner_open(st, v->rec.id, gen - 1, gen);
    }
    if (!v->owner)
        return plx_err(st, -ENOMEM, "out of memory");
    if (!v->ro && v->owner->gen == PLX_GEN_NEVER)
        return plx_err(st, -EBUSY,
                       "VDI %s is open read-only in this process and another process has "
                       "written it since; close it before opening it for writing",
                       v->rec.name);
    return 0;
}

int plx_vdi_open(plx_store *st, const char *spec, unsigned flags, plx_vdi **out)
{
    *out = NULL;
    struct plx_vdi *v = calloc(1, sizeof *v);
    if (!v)
        return plx_err(st, -ENOMEM, "out of memory");
    v->st = st;
    int rc;
    bool locked = false; /* this call took the single-writer lock: undo it on failure */
    struct plx_snap_info si = {0};
    v->ro = strchr(spec, '@') || (flags & PLX_OPEN_READONLY);
    /* A reader records which tree it reads (hold.h), found live and held in one hold of the
     * admin lock: a collection then either sees the hold or saw the tree live, and keeps it
     * either way. A store opened read-only cannot record it (DESIGN.md, "Readers hold what
     * they read"). */
    bool hold = v->ro && !st->read_only;
    if (hold && (rc = plx_admin_lock(st)) != 0) {
        free(v);
        return rc;
    }
    if (strchr(spec, '@')) {
        rc = plx_snap_resolve(st, spec, &v->rec, &v->slot_addr, &si, NULL);
        v->root_addr = si.root;
    } else {
        rc = plx_registry_find(st, spec, &v->rec, &v->slot_addr);
        v->root_addr = v->rec.root;
        if (!rc && v->ro)
            rc = check_log_holds_newer(st, &v->rec);
        if (!rc && !v->ro && st->read_only)
            rc = plx_err(st, -EROFS, "blockstore opened read-only");
        if (!rc && !v->ro && written_here(st, v->rec.id))
            rc = plx_err(st, -EBUSY, "VDI %s is already open for writing here", v->rec.name);
        if (!rc && !v->ro) {
            rc = lock_record(st, v, true);
            locked = rc == 0;
        }
        if (!rc)
            rc = attach_owner(st, v);
    }
    v->height = v->rec.height;
    v->nblocks = v->rec.size / PLX_BLOCK_SIZE;
    if (!rc && hold) {
        rc = plx_hold_add(st, v->rec.id, si.index, v->root_addr, v->height, &v->hold_slot);
        v->held = rc == 0;
    }
    if (hold)
        plx_admin_unlock(st);
    struct plx_node *root = NULL;
    if (!rc)
        rc = plx_cache_get_sync(st, v->root_addr, v->height - 1, v->owner, &root);
    /* A writer needs the log's head block and skip path (to append), not the log itself:
     * labels are read when one is first checked. */
    if (!rc && !v->ro) {
        v->spine = malloc(sizeof *v->spine);
        rc = v->spine ? plx_snaplog_spine_load(st, &v->rec, v->spine)
                      : plx_err(st, -ENOMEM, "out of memory");
        /* The label index covers the whole log from here on (on a store written before the
         * index existed, this builds it: the one time the whole log is read). */
        if (!rc)
            rc = plx_labels_fold(st, v->slot_addr, &v->rec, 1);
        /* Likewise the count of deleted snapshots (FORMAT.md §7), on a record without it. */
        if (!rc)
            rc = plx_snaplog_count_write(st, v->slot_addr, &v->rec);
        plx_labels_init(&v->labels, &v->rec);
    }
    if (!rc && !v->ro && v->rec.snaplog_head) {
        v->log_head = plx_block_alloc(1);
        rc = plx_snaplog_read_block(st, v->rec.snaplog_head, &v->rec, v->log_head);
    }
    if (rc) {
        if (locked)
            lock_record(st, v, false);
        if (v->held)
            plx_hold_drop(st, v->hold_slot, v->root_addr);
        plx_cache_owner_close(st, v->owner);
        plx_block_free(v->log_head);
        free(v->spine);
        plx_labels_free(&v->labels);
        free(v);
        return rc;
    }
    plx_cache_pin(root);
    v->root = root;
    v->next = st->vdis;
    st->vdis = v;
    *out = v;
    return 0;
}

/* ---- Opening without waiting for the lock manager -------------------------------------------- */

struct plx_open_req {
    plx_store *st;
    char spec[PLX_NAME_MAX + 64];
    unsigned flags;
    plx_open_fn cb;
    void *arg;
    /* A writable open waits for the admin lock on the loop (lw), then runs plx_vdi_open under
     * it; one that needs no lock runs it from a timer due at once (t). Both run from a service
     * pass's timers, outside every I/O handler, so the open's blocking reads are safe there. */
    struct plx_lock_wait lw;
    struct plx_timer t;
    bool lock_waiting;
    struct plx_open_req *next;
};

static void open_unlink(struct plx_open_req *o)
{
    for (struct plx_open_req **pp = &o->st->opens; *pp; pp = &(*pp)->next) {
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    }
}

/* Run the open (the admin lock held, or not needed) and report it. */
static void open_finish(struct plx_open_req *o, int rc)
{
    plx_store *st = o->st;
    plx_vdi *v = NULL;
    open_unlink(o);
    if (!rc)
        rc = plx_vdi_open(st, o->spec, o->flags, &v);
    o->cb(o->arg, rc, rc ? NULL : v);
    free(o);
}

static void open_lock_done(struct plx_lock_wait *w, int rc)
{
    struct plx_open_req *o = (struct plx_open_req *)((char *)w - offsetof(struct plx_open_req, lw));
    plx_store *st = o->st;
    o->lock_waiting = false;
    if (rc) {
        open_finish(o, rc); /* the message names the lock manager or the holder */
        return;
    }
    /* The open takes the lock again inside (nested, no wait) and we let go after it. */
    open_unlink(o);
    plx_vdi *v = NULL;
    rc = plx_vdi_open(st, o->spec, o->flags, &v);
    char msg[sizeof st->errmsg];
    if (rc)
        snprintf(msg, sizeof msg, "%s", st->errmsg);
    plx_admin_unlock(st);
    if (rc)
        snprintf(st->errmsg, sizeof st->errmsg, "%s", msg);
    o->cb(o->arg, rc, rc ? NULL : v);
    free(o);
}

static void open_timer(struct plx_timer *t)
{
    open_finish((struct plx_open_req *)((char *)t - offsetof(struct plx_open_req, t)), 0);
}

int plx_vdi_open_async(plx_store *st, const char *spec, unsigned flags, plx_open_fn cb, void *arg,
                       plx_open_req **req)
{
    if (req)
        *req = NULL;
    if (!cb || !spec || strlen(spec) >= sizeof((struct plx_open_req *)0)->spec)
        return plx_err(st, -EINVAL, "opening VDI '%.80s': no callback, or the name is too long",
                       spec ? spec : "");
    struct plx_open_req *o = calloc(1, sizeof *o);
    if (!o)
        return plx_err(st, -ENOMEM, "out of memory");
    o->st = st;
    snprintf(o->spec, sizeof o->spec, "%s", spec);
    o->flags = flags;
    o->cb = cb;
    o->arg = arg;
    o->next = st->opens;
    st->opens = o;
    /* Every open of a store opened for writing takes the admin lock: a writer to take the
     * VDI's lock (lock_record), a reader to record its hold (hold.h). Only a read-only store's
     * opens never wait for the lock manager. */
    if (!st->read_only) {
        o->lw.done = open_lock_done;
        o->lock_waiting = true;
        plx_admin_lock_async(st, &o->lw);
    } else {
        o->t.run = open_timer;
        plx_timer_arm(st, &o->t, plx_mono_ns());
    }
    if (req)
        *req = o;
    return 0;
}

void plx_vdi_open_cancel(plx_open_req *o)
{
    if (!o)
        return;
    if (o->lock_waiting)
        plx_admin_lock_cancel(o->st, &o->lw);
    else
        plx_timer_cancel(o->st, &o->t);
    open_unlink(o);
    free(o);
}

void plx_vdi_open_cancel_all(plx_store *st)
{
    while (st->opens)
        plx_vdi_open_cancel(st->opens);
}

/* ---- Closing without waiting for the lock manager -------------------------------------------- */

struct plx_close_req {
    plx_vdi *v;
    plx_done_fn cb;
    void *arg;
    /* First the VDI's requests finish (t, looking every millisecond: plx_vdi_close must not
     * service the store itself, as it runs from the service pass here), then the admin lock
     * is waited for on the loop (lw), then the close runs under it. */
    struct plx_timer t;
    struct plx_lock_wait lw;
    bool lock_waiting;
};

static void close_req_drop(struct plx_close_req *c)
{
    if (c->lock_waiting)
        plx_admin_lock_cancel(c->v->st, &c->lw);
    else
        plx_timer_cancel(c->v->st, &c->t);
    c->v->close_req = NULL;
    free(c);
}

static void close_finish(struct plx_close_req *c, bool locked, int lock_rc)
{
    plx_vdi *v = c->v;
    plx_store *st = v->st;
    plx_done_fn cb = c->cb;
    void *arg = c->arg;
    v->close_req = NULL;
    free(c);
    char msg[sizeof st->errmsg] = "";
    if (lock_rc) {
        v->unlock_err = lock_rc; /* closed all the same; the record keeps our lock */
        snprintf(msg, sizeof msg, "%s", st->errmsg);
    }
    int rc = plx_vdi_close(v);
    if (rc && !lock_rc)
        snprintf(msg, sizeof msg, "%s", st->errmsg);
    if (locked)
        plx_admin_unlock(st);
    if (rc)
        snprintf(st->errmsg, sizeof st->errmsg, "%s", msg);
    cb(arg, rc);
}

static void close_lock_done(struct plx_lock_wait *w, int rc)
{
    struct plx_close_req *c =
        (struct plx_close_req *)((char *)w - offsetof(struct plx_close_req, lw));
    c->lock_waiting = false;
    if (!rc && !plx_vdi_idle(c->v)) {
        /* Work of the VDI's own came up meanwhile: let it finish first. */
        plx_admin_unlock(c->v->st);
        plx_timer_arm(c->v->st, &c->t, plx_mono_ns() + 1000000);
        return;
    }
    close_finish(c, rc == 0, rc);
}

static void close_timer(struct plx_timer *t)
{
    struct plx_close_req *c =
        (struct plx_close_req *)((char *)t - offsetof(struct plx_close_req, t));
    plx_vdi *v = c->v;
    if (!plx_vdi_idle(v)) {
        plx_timer_arm(v->st, t, plx_mono_ns() + 1000000);
        return;
    }
    /* A writer clears its lock, a reader drops its hold: both under the admin lock. */
    if ((!v->ro || (v->held && !v->st->fenced)) && !v->st->fatal) {
        c->lock_waiting = true;
        plx_admin_lock_async(v->st, &c->lw);
        return;
    }
    close_finish(c, false, 0);
}

int plx_vdi_close_async(plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (v->wc && plx_wlog_vdi_draining(v))
        return -EAGAIN;
    if (v->close_req || !cb)
        return plx_err(v->st, -EINVAL, "closing VDI %s: %s", v->rec.name,
                       cb ? "a close is under way already" : "no callback");
    struct plx_close_req *c = calloc(1, sizeof *c);
    if (!c)
        return plx_err(v->st, -ENOMEM, "out of memory");
    c->v = v;
    c->cb = cb;
    c->arg = arg;
    c->t.run = close_timer;
    c->lw.done = close_lock_done;
    v->close_req = c;
    plx_timer_arm(v->st, &c->t, plx_mono_ns());
    return 0;
}

int plx_vdi_try_close(plx_vdi *v)
{
    /* Only the wait for the write cache's drain is left out: the rest of a close is the VDI's
     * own writes (its log tail, its record and lock), as short as any admin step. */
    if (v->wc && plx_wlog_vdi_draining(v))
        return -EAGAIN;
    return plx_vdi_close(v);
}

int plx_vdi_close(plx_vdi *v)
{
    plx_store *st = v->st;
    if (v->close_req)
        close_req_drop(v->close_req); /* finished here, without its callback */
    /* The write cache drains this VDI's records first; if it cannot, the record keeps naming
     * the log, so nobody else opens the VDI until the log is replayed. */
    int wrc = v->wc ? plx_wlog_vdi_detach(v) : 0;
    if (!wrc && !v->ro && v->rec.wlog_id) {
        v->rec.wlog_host = 0; /* drained, or replayed at attach: nothing of it left in a log */
        v->rec.wlog_id = 0;
    }
    int rc = 0;
    while (!plx_vdi_idle(v)) {
        rc = plx_store_service(st);
        if (rc < 0)
            break;
        if (plx_vdi_idle(v))
            break;
        struct epoll_event e;
        epoll_wait(st->epoll_fd, &e, 1, 100);
    }
    rc = rc < 0 ? rc : 0;
    plx_wlog_pass_forget(v);
    plx_alloc_claim_finish(st); /* a claim the VDI's writes started holds the admin lock */
    if (!v->ro && st->fenced && !rc)
        rc = -ESTALE; /* the lock stays as it is on the medium: another host may own it now */
    /* Leave the log's tail short for readers. A failure only leaves the index as it was. */
    if (!v->ro && !st->fatal && !st->fenced && !rc && !v->needs_reload && !v->failed)
        (void)plx_labels_fold(st, v->slot_addr, &v->rec, PLX_SNAPLOG_PER_BLOCK);
    if (!v->ro && !st->fatal) {
        /* The admin lock could not be had (plx_vdi_close_async): the record keeps our lock. */
        int lrc = v->unlock_err ? v->unlock_err : lock_record(st, v, false);
        if (v->unlock_err)
            lock_left_note(st, v->rec.id);
        if (!rc)
            rc = lrc;
    }
    if (!v->ro)
        plx_alloc_release_slots(st, v->rec.id);
    if (v->root)
        plx_cache_unpin(st, v->root);
    /* The tree may be freed by the next collection from here on (if it was deleted). A failure
     * only keeps it until this process is gone: the close goes on. */
    if (v->held && !st->fatal && !st->fenced)
        (void)plx_hold_drop(st, v->hold_slot, v->root_addr);
    plx_cache_owner_close(st, v->owner);
    for (struct plx_vdi **pp = &st->vdis; *pp; pp = &(*pp)->next) {
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    }
    plx_block_free(v->log_head);
    free(v->spine);
    plx_labels_free(&v->labels);
    free(v);
    return rc ? rc : wrc;
}

int plx_vdi_close_all(plx_store *st)
{
    int rc = 0;
    while (st->vdis) {
        int c = plx_vdi_close(st->vdis);
        if (!rc)
            rc = c;
    }
    return rc;
}

/* Is anything of the store still in flight: engine I/O, or a request of any VDI? */
int plx_store_busy(const plx_store *st)
{
    if (plx_engine_busy(st))
        return 1;
    for (const struct plx_vdi *v = st->vdis; v; v = v->next)
        if (!plx_vdi_idle(v))
            return 1;
    return 0;
}

uint64_t plx_vdi_size(const plx_vdi *v)
{
    return v->rec.size;
}

uint64_t plx_vdi_id(const plx_vdi *v)
{
    return v->rec.id;
}

int plx_vdi_readonly(const plx_vdi *v)
{
    return v->ro;
}

/* ---- Submission: a VDI with its cache on goes to the write log (wlog.c), any other
 * straight into the pipeline (vdi_io.c) ---------------------------------------------------- */

int plx_vdi_submit_read(plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb, void *arg)
{
    if (v->wc)
        return plx_wlog_submit_read(v, buf, off, len, cb, arg);
    return plx_vdi_direct_read(v, buf, off, len, cb, arg);
}

int plx_vdi_submit_write(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags,
                         plx_done_fn cb, void *arg)
{
    if (v->wc)
        return plx_wlog_submit_write(v, buf, off, len, flags, cb, arg);
    if (v->wauto.on && v->st->wlog)
        return plx_wlog_submit_passthrough(v, buf, off, len, flags, cb, arg);
    return plx_vdi_direct_write(v, buf, off, len, flags, cb, arg);
}

int plx_vdi_submit_block_status(plx_vdi *v, uint64_t off, uint64_t len, uint64_t *run_len,
                                int *mapped, plx_done_fn cb, void *arg)
{
    int rc = plx_vdi_range_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0)
        return plx_err(v->st, -EINVAL, "block status of an empty range of VDI %s", v->rec.name);
    if (v->wc && plx_wlog_block_status(v, off, &len) == 1) {
        /* Written in the log, not yet in the store: mapped. */
        struct plx_req *e = plx_vdi_req_new(v, REQ_READ, 0, 0, cb, arg);
        if (!e)
            return plx_err(v->st, -ENOMEM, "out of memory");
        *run_len = len;
        *mapped = 1;
        plx_complete(v->st, e);
        return 0;
    }
    struct plx_req *r = plx_vdi_req_new(v, REQ_STATUS, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->run_out = run_len;
    r->mapped_out = mapped;
    return plx_req_submit(v, r);
}

int plx_vdi_submit_flush(plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (v->wc)
        return plx_wlog_submit_flush(v, cb, arg);
    if (v->wpass_head || (v->wauto.on && v->st->wlog))
        return plx_wlog_pass_flush(v, cb, arg);
    return plx_vdi_direct_flush(v, cb, arg);
}

int plx_vdi_submit_trim(plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg)
{
    if (v->wc)
        return plx_wlog_submit_trim(v, off, len, cb, arg);
    int rc = plx_vdi_direct_trim(v, off, len, cb, arg);
    if (!rc)
        plx_wlog_pass_untracked(v);
    return rc;
}

int plx_vdi_submit_snapshot(plx_vdi *v, const char *label, uint64_t *index_out, plx_done_fn cb,
                            void *arg)
{
    if (v->wc && !v->ro)
        return plx_wlog_submit_snapshot(v, label, index_out, cb, arg);
    int rc = plx_vdi_direct_snapshot(v, label, index_out, cb, arg);
    if (!rc && !v->ro)
        plx_wlog_pass_untracked(v);
    return rc;
}

/* ---- Block status -------------------------------------------------------------------------------
 */

/* Is vblock mapped? *span receives how many blocks from vblock certainly share the answer. */
static int mapped_at(plx_vdi *v, uint64_t vb, int *mapped, uint64_t *span)
{
    struct plx_node *n = v->root;
    if (!n) /* a failed commit lost acknowledged writes (pipeline.h, failed) */
        return v->failed ? v->failed : v->st->fatal ? v->st->fatal : -EIO;
    for (unsigned level = v->height - 1;; level--) {
        uint64_t link = n->links[plx_index_at(vb, level)];
        uint64_t sub = 1ull << (level * PLX_RADIX_BITS); /* blocks under one link */
        if (!link) {
            *mapped = 0;
            *span = sub - (vb & (sub - 1));
            return 0;
        }
        if (level == 0) {
            *mapped = 1;
            *span = 1;
            return 0;
        }
        int rc =
            plx_cache_get_sync(v->st, plx_link_addr(link), level - 1, plx_child_owner(n, link), &n);
        if (rc)
            return rc;
    }
}

int plx_vdi_block_status(plx_vdi *v, uint64_t off, uint64_t len, uint64_t *run_len)
{
    int rc = plx_vdi_range_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0) {
        *run_len = 0;
        return 0;
    }
    uint64_t end = off + len;
    uint64_t vb = off / PLX_BLOCK_SIZE;
    int first = -1;
    uint64_t pos = off;
    while (pos < end) {
        int m;
        uint64_t span;
        rc = mapped_at(v, vb, &m, &span);
        if (rc)
            return rc;
        if (first < 0)
            first = m;
        else if (m != first)
            break;
        vb += span;
        pos = vb * PLX_BLOCK_SIZE;
    }
    *run_len = (pos < end ? pos : end) - off;
    return first;
}

/* ---- Changing snapshot records of an open VDI ----------------------------------------------- */

/* A label or deletion in the request stream (snap_edit.c): never waits for the medium here. */
static int submit_snap_edit(plx_vdi *v, enum plx_snap_edit_kind kind, uint64_t index,
                            const char *label, plx_done_fn cb, void *arg)
{
    plx_store *st = v->st;
    if (plx_lease_check(st))
        return -ESTALE;
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only", v->rec.name);
    if (label) {
        int rc = plx_label_check(st, label);
        if (rc)
            return rc;
    }
    if (index == 0)
        return plx_err(st, -ENOENT, "VDI %s has no snapshot 0 (they are numbered from 1)",
                       v->rec.name);
    struct plx_req *r = plx_snap_edit_new(v, kind, index, label, cb, arg);
    if (!r)
        return plx_err(st, -ENOMEM, "out of memory");
    return plx_req_submit(v, r);
}

int plx_vdi_submit_snap_label(plx_vdi *v, uint64_t index, const char *label, plx_done_fn cb,
                              void *arg)
{
    return submit_snap_edit(v, PLX_EDIT_LABEL, index, label ? label : "", cb, arg);
}

int plx_vdi_submit_snap_delete(plx_vdi *v, uint64_t index, plx_done_fn cb, void *arg)
{
    return submit_snap_edit(v, PLX_EDIT_DELETE, index, NULL, cb, arg);
}
