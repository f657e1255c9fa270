/*
 * vdi.c - opening and closing VDIs (with the single-writer lock) and the public I/O entry points.
 * The requests themselves are carried out by pipeline.c.
 */
#include <errno.h>
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
        else if (rec.lock_host &&
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
        int lrc = lock_record(st, v, false);
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
