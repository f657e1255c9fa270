/*
 * blocking.c - the blocking forms of the asynchronous calls (layer 7): submit, then service the
 * store until the callback has run. Only this thin loop sits on top of the asynchronous API;
 * nothing below it waits for a request.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include "alloc.h"
#include "pipeline.h"
#include "snaplog.h"

int plx_store_wait(plx_store *st, const int *done)
{
    while (!*done) {
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
        if (*done)
            break;
        if (!plx_store_busy(st))
            return plx_err(st, -EDEADLK, "waiting for a request that can never complete");
        struct epoll_event e;
        rc = epoll_wait(st->epoll_fd, &e, 1, 1000);
        if (rc < 0 && errno != EINTR)
            return plx_err(st, -errno, "epoll_wait: %s", strerror(errno));
    }
    /* A claim ahead (alloc_claim.c) that the request started holds the admin lock until it ends: a
     * blocking caller may stop servicing the store once this returns, so it ends here. */
    plx_alloc_claim_finish(st);
    return 0;
}

struct sync_wait {
    int done;
    int status;
};

static void sync_done(void *arg, int status)
{
    struct sync_wait *w = arg;
    w->status = status;
    w->done = 1;
}

static int sync_finish(plx_vdi *v, int rc, struct sync_wait *w)
{
    if (rc)
        return rc;
    rc = plx_store_wait(v->st, &w->done);
    return rc ? rc : w->status;
}

int plx_vdi_pread(plx_vdi *v, void *buf, uint64_t off, size_t len)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_read(v, buf, off, len, sync_done, &w), &w);
}

int plx_vdi_pwrite(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_write(v, buf, off, len, flags, sync_done, &w), &w);
}

int plx_vdi_flush(plx_vdi *v)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_flush(v, sync_done, &w), &w);
}

int plx_vdi_trim(plx_vdi *v, uint64_t off, uint64_t len)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_trim(v, off, len, sync_done, &w), &w);
}

int plx_vdi_snapshot_open(plx_vdi *v, const char *label, uint64_t *index_out)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_snapshot(v, label, index_out, sync_done, &w), &w);
}

int plx_vdi_snap_label(plx_vdi *v, uint64_t index, const char *label)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_snap_label(v, index, label, sync_done, &w), &w);
}

int plx_vdi_snap_delete(plx_vdi *v, uint64_t index)
{
    struct sync_wait w = {0, 0};
    return sync_finish(v, plx_vdi_submit_snap_delete(v, index, sync_done, &w), &w);
}

int plx_vdi_snapshot(plx_store *st, const char *vdi, const char *label, uint64_t *index_out)
{
    const char *at = strchr(vdi, '@');
    if (at)
        return plx_err(st, -EINVAL,
                       "%s is a snapshot, and snapshots never change: snapshot the VDI %.*s, or "
                       "make a writable copy with 'vdi-create NAME --from %s'",
                       vdi, (int)(at - vdi), vdi, vdi);
    /* A label already taken is refused before the writable open, which writes the VDI's
     * record (its lock, taken and given back): a refused snapshot leaves the store as it was.
     * The request stream checks again, for a label taken meanwhile. */
    int rc = label ? plx_label_check(st, label) : 0;
    if (!rc && label && *label) {
        char spec[PLX_NAME_MAX + PLX_LABEL_MAX + 2];
        struct plx_snap_info si;
        struct plx_vdi_info vi;
        snprintf(spec, sizeof spec, "%s@%s", vdi, label);
        if (plx_snap_lookup(st, spec, &si) == 0 && plx_vdi_lookup(st, vdi, &vi) == 0)
            return plx_err(st, -EEXIST, "VDI %s already has a snapshot labelled '%s' (@%llu)",
                           vi.name, label, (unsigned long long)si.index);
    }
    if (rc)
        return rc;
    plx_vdi *v;
    rc = plx_vdi_open(st, vdi, 0, &v);
    if (rc)
        return rc;
    rc = plx_vdi_snapshot_open(v, label, index_out);
    int crc = plx_vdi_close(v);
    return rc ? rc : crc;
}

