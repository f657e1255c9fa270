/*
 * vdi_io.c - a VDI's requests straight into the pipeline, without the write cache (layer 6, its
 * bottom): the checks every request passes (lease, read-only, range), the bounce buffer of an
 * unaligned request, a trim's parts, and a snapshot's label check and queued label-index fold.
 * vdi.c's public plx_vdi_submit_* route a VDI whose cache is on to wlog.c and every other one
 * here; wlog.c's drain comes here too, so this file sits below both.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "pipeline.h"
#include "snap_edit.h"
#include "snaplog.h"
#include "vdi_io.h"

/* ---- Requests ---------------------------------------------------------------------------------
 */

int plx_vdi_range_check(plx_vdi *v, uint64_t off, uint64_t len)
{
    if (off > v->rec.size || len > v->rec.size - off)
        return plx_err(v->st, -EINVAL, "request at %llu+%llu is beyond the end of VDI %s (%llu)",
                       (unsigned long long)off, (unsigned long long)len, v->rec.name,
                       (unsigned long long)v->rec.size);
    return 0;
}

struct plx_req *plx_vdi_req_new(plx_vdi *v, enum plx_req_op op, uint64_t off, uint64_t len,
                                plx_done_fn cb, void *arg)
{
    struct plx_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->op = op;
    r->off = off;
    r->len = len;
    r->b0 = off / PLX_BLOCK_SIZE;
    r->b1 = (off + len + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE;
    r->cb = cb;
    r->arg = arg;
    r->v = v;
    return r;
}

/* A request with nothing to do still completes from the service loop, never inline. */
static int complete_empty(plx_vdi *v, plx_done_fn cb, void *arg)
{
    struct plx_req *r = plx_vdi_req_new(v, REQ_READ, 0, 0, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    plx_complete(v->st, r);
    return 0;
}

static int submit_rw(plx_vdi *v, enum plx_req_op op, void *buf, uint64_t off, size_t len,
                     unsigned flags, plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (op != REQ_READ && v->ro)
        return plx_err(v->st, -EROFS, "VDI %s is open read-only", v->rec.name);
    int rc = plx_vdi_range_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0)
        return complete_empty(v, cb, arg);
    struct plx_req *r = plx_vdi_req_new(v, op, off, len, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    r->flags = flags;
    r->ubuf = buf;
    bool aligned = ((uintptr_t)buf % PLX_BLOCK_SIZE) == 0 && off % PLX_BLOCK_SIZE == 0 &&
                   len % PLX_BLOCK_SIZE == 0;
    if (aligned) {
        r->io_buf = buf;
    } else {
        /* A write of whole blocks overwrites all of its bounce buffer before any I/O
         * (do_resolve's copy), so it is not zeroed first: a memset per write through tapdisk,
         * whose buffers are not 4 KiB-aligned, was 2 % of its CPU at QD 32. */
        bool whole = op == REQ_WRITE && off % PLX_BLOCK_SIZE == 0 && len % PLX_BLOCK_SIZE == 0;
        r->bounce =
            whole ? plx_block_alloc_unzeroed(r->b1 - r->b0) : plx_block_alloc(r->b1 - r->b0);
        r->io_buf = r->bounce;
        if (op == REQ_WRITE) {
            r->head_partial = off % PLX_BLOCK_SIZE != 0;
            r->tail_partial = (off + len) % PLX_BLOCK_SIZE != 0;
        }
    }
    return plx_req_submit(v, r);
}

int plx_vdi_direct_read(plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb, void *arg)
{
    return submit_rw(v, REQ_READ, buf, off, len, 0, cb, arg);
}

int plx_vdi_direct_write(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags,
                         plx_done_fn cb, void *arg)
{
    /* The buffer is only read from; the request keeps one pointer type for both directions. */
    return submit_rw(v, REQ_WRITE, (void *)(uintptr_t)buf, off, len, flags, cb, arg);
}

int plx_vdi_direct_flush(plx_vdi *v, plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (v->ro)
        return complete_empty(v, cb, arg);
    struct plx_req *r = plx_vdi_req_new(v, REQ_FLUSH, 0, 0, cb, arg);
    if (!r)
        return plx_err(v->st, -ENOMEM, "out of memory");
    return plx_req_submit(v, r);
}

/* A trim becomes up to three requests: zero writes for partial edge blocks and an unmap of the
 * whole blocks between them. The caller's callback fires once, with the first error. */
struct trim_parts {
    plx_done_fn cb;
    void *arg;
    int remaining;
    int status;
};

static void trim_part_done(void *arg, int status)
{
    struct trim_parts *t = arg;
    if (status && !t->status)
        t->status = status;
    if (--t->remaining == 0) {
        t->cb(t->arg, t->status);
        free(t);
    }
}

static const uint8_t zero_block[PLX_BLOCK_SIZE];

int plx_vdi_direct_trim(plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg)
{
    if (plx_lease_check(v->st))
        return -ESTALE;
    if (v->ro)
        return plx_err(v->st, -EROFS, "VDI %s is open read-only", v->rec.name);
    int rc = plx_vdi_range_check(v, off, len);
    if (rc)
        return rc;
    if (len == 0)
        return complete_empty(v, cb, arg);
    uint64_t end = off + len;
    uint64_t a0 = (off + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
    uint64_t a1 = end / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
    struct trim_parts *t = calloc(1, sizeof *t);
    if (!t)
        return plx_err(v->st, -ENOMEM, "out of memory");
    t->cb = cb;
    t->arg = arg;
    t->remaining = 1; /* held until every part is submitted */
    if (a0 >= a1) {
        /* Inside one block (or two partial ones): plain zero writes. */
        for (uint64_t o = off; o < end;) {
            uint64_t next = (o / PLX_BLOCK_SIZE + 1) * PLX_BLOCK_SIZE;
            uint64_t n = (next < end ? next : end) - o;
            t->remaining++;
            if (submit_rw(v, REQ_WRITE, (void *)(uintptr_t)zero_block, o, n, 0, trim_part_done, t))
                t->remaining--;
            o += n;
        }
    } else {
        if (off < a0) {
            t->remaining++;
            if (submit_rw(v, REQ_WRITE, (void *)(uintptr_t)zero_block, off, a0 - off, 0,
                          trim_part_done, t))
                t->remaining--;
        }
        struct plx_req *r = plx_vdi_req_new(v, REQ_TRIM, a0, a1 - a0, trim_part_done, t);
        if (r) {
            t->remaining++;
            plx_req_submit(v, r);
        } else if (!t->status) {
            t->status = -ENOMEM;
        }
        if (a1 < end) {
            t->remaining++;
            if (submit_rw(v, REQ_WRITE, (void *)(uintptr_t)zero_block, a1, end - a1, 0,
                          trim_part_done, t))
                t->remaining--;
        }
    }
    /* Drop the submission hold; parts complete from the service loop, never from here. */
    if (--t->remaining == 0) {
        int status = t->status;
        free(t);
        return status ? status : complete_empty(v, cb, arg);
    }
    return 0;
}

/* Fold the log's tail into the label index once it is PLX_LABELS_FOLD_TAIL snapshots long, as
 * an edit in the request stream (snap_edit.c), queued behind the snapshot that made it that
 * long: it runs on asynchronous I/O once the snapshots ahead of it have committed, so the tail
 * stays short however the snapshots come, and submitting a snapshot never waits for the medium.
 * (It used to fold here and now with blocking I/O when nothing was in flight: a read of the
 * tail, a write of the VDI record and a flush, during which `parallax serve` or tapdisk served
 * nothing at all; on a busy disk, one snapshot in 126 took 100 ms and more, issue 16.) */
static int labels_fold_queue(plx_vdi *v, uint64_t tail)
{
    if (v->ro || v->needs_reload || tail < PLX_LABELS_FOLD_TAIL || v->labels.fold_queued)
        return 0;
    struct plx_req *f = plx_snap_edit_new(v, PLX_EDIT_FOLD, 0, NULL, NULL, NULL);
    if (!f)
        return plx_err(v->st, -ENOMEM, "out of memory");
    v->labels.fold_queued = true;
    return plx_req_submit(v, f);
}

int plx_vdi_direct_snapshot(plx_vdi *v, const char *label, uint64_t *index_out, plx_done_fn cb,
                            void *arg)
{
    plx_store *st = v->st;
    if (plx_lease_check(st))
        return -ESTALE;
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only: cannot snapshot", v->rec.name);
    if (!label)
        label = "";
    int rc = plx_label_check(st, label);
    if (rc)
        return rc;
    uint64_t t0 = st->snap_trace ? plx_mono_ns() : 0;
    uint64_t tail = v->rec.snap_count - v->rec.label_indexed; /* before this snapshot */
    /* Labels of snapshots in flight are known here; the medium is asked by an edit queued just
     * ahead of the snapshot, which fails the snapshot if the label is taken. */
    rc = plx_label_taken(v, label, 0);
    if (rc)
        return rc < 0 ? rc
                      : plx_err(st, -EEXIST, "VDI %s already has a snapshot labelled '%s'",
                                v->rec.name, label);
    struct plx_req *r = plx_vdi_req_new(v, REQ_SNAPSHOT, 0, 0, cb, arg);
    if (!r)
        return plx_err(st, -ENOMEM, "out of memory");
    if (st->snap_trace && (r->trace = calloc(1, sizeof *r->trace)) != NULL)
        r->trace->submit_ns = t0;
    if (*label) {
        struct plx_req *check = plx_snap_edit_check_new(v, label, r);
        if (!check) {
            free(r->trace);
            free(r);
            return plx_err(st, -ENOMEM, "out of memory");
        }
        rc = plx_req_submit(v, check);
        if (rc) {
            free(r->trace);
            free(r);
            return rc;
        }
    }
    snprintf(r->label, sizeof r->label, "%s", label);
    r->index_out = index_out;
    rc = plx_req_submit(v, r);
    if (!rc)
        (void)labels_fold_queue(v, tail); /* a failure leaves the index as it was: correct */
    return rc;
}
