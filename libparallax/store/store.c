/*
 * store.c - opening and closing a blockstore (layer 7): the layers below are set up in order at
 * open and torn down in reverse at close.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "cache.h"
#include "lock.h"
#include "pipeline.h"
#include "registry.h"
#include "system.h"
#include "vdi.h"
#include "reclaim.h"
#include "wlog.h"

#define DEFAULT_CACHE_BYTES (64ull << 20)

static void store_free(plx_store *st)
{
    plx_reclaim_free(st);
    plx_cache_free(st);
    plx_alloc_free(st);
    plx_lock_detach(st);
    free(st->locks_left);
    free(st->cat);
    if (st->be)
        st->be->ops->destroy(st->be);
    plx_engine_free(st);
    free(st);
}

/* A store whose state block names a lock manager is shared by many hosts: every process that
 * opens it talks to that manager. $PARALLAX_LOCKD overrides the address; "none" opens it as a
 * single host would (only for repairs, with every other host stopped). */
static int attach_lock_manager(plx_store *st)
{
    const char *addr = getenv("PARALLAX_LOCKD");
    if (!addr || !*addr)
        addr = st->state.lockd_addr;
    if (!*addr || !strcmp(addr, "none"))
        return 0;
    return plx_lock_attach(st, addr);
}

static int store_open(plx_backend *be, const struct plx_open_opts *opts, bool upgrading,
                      plx_store **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    plx_store *st = calloc(1, sizeof *st);
    if (!st) {
        be->ops->destroy(be);
        plx_set_errbuf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    st->be = be;
    st->wake_fd = st->epoll_fd = st->timer_fd = -1;
    st->read_only = opts ? opts->read_only : 0;
    st->upgrading = upgrading;
    plx_identity_init(st, opts ? opts->host : NULL);
    uint64_t cache = opts && opts->cache_bytes ? opts->cache_bytes : DEFAULT_CACHE_BYTES;
    const char *trace = getenv("PARALLAX_SNAP_TRACE");
    st->snap_trace = trace && *trace && strcmp(trace, "0") != 0;
    int rc = plx_engine_init(st);
    if (!rc)
        rc = plx_superblock_load(st);
    if (!rc)
        rc = plx_state_read(st);
    if (!rc)
        rc = attach_lock_manager(st);
    if (!rc)
        rc = plx_fence_join(st);
    if (!rc)
        rc = plx_catalogue_read(st);
    if (!rc)
        rc = plx_alloc_init(st);
    /* Leaf placement unless asked for arrival order (an older caller's struct without the field,
     * or its 0, gets the default). */
    if (!rc)
        st->alloc->by_leaf = !(
            opts && opts->struct_size >= offsetof(struct plx_open_opts, placement) + sizeof(int) &&
            opts->placement == PLX_PLACEMENT_ARRIVAL);
    if (!rc)
        rc = plx_cache_init(st, cache);
    if (!rc && !upgrading)
        plx_reclaim_init(st);
    if (rc) {
        plx_set_errbuf(errbuf, errlen, "%s", st->errmsg);
        store_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* API 1.8 (the default): be's ops have size (struct plx_backend_ops). */
int plx_store_open_backend_1_8(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                               char *errbuf, size_t errlen);
PLX_SYMVER("plx_store_open_backend@@PARALLAX_1.8")
int plx_store_open_backend_1_8(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                               char *errbuf, size_t errlen)
{
    return store_open(be, opts, false, out, errbuf, errlen);
}

/* A program built against API 1.0 to 1.7 (PARALLAX_1): its backend's ops may end at lock. */
static plx_backend *adopt_v1(plx_backend *be, char *errbuf, size_t errlen)
{
    plx_backend *in = plx_backend_v1_adopt(be);
    if (in == NULL)
        plx_set_errbuf(errbuf, errlen, "opening a store on a backend: out of memory");
    return in;
}

int plx_store_open_backend_1_0(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                               char *errbuf, size_t errlen);
PLX_SYMVER("plx_store_open_backend@PARALLAX_1")
int plx_store_open_backend_1_0(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                               char *errbuf, size_t errlen)
{
    be = adopt_v1(be, errbuf, errlen);
    if (be == NULL) {
        *out = NULL;
        return -ENOMEM;
    }
    return store_open(be, opts, false, out, errbuf, errlen);
}

int plx_store_open(const char *path, const struct plx_open_opts *opts, plx_store **out,
                   char *errbuf, size_t errlen)
{
    unsigned flags = 0;
    if (opts && opts->read_only)
        flags |= PLX_BACKEND_RDONLY;
    /* Callers built before blocking_io was appended pass a shorter struct. */
    if (opts && opts->struct_size >= offsetof(struct plx_open_opts, blocking_io) + sizeof(int) &&
        opts->blocking_io)
        flags |= PLX_BACKEND_BLOCKING;
    int err = 0;
    plx_backend *be = plx_backend_open(path, flags, &err, errbuf, errlen);
    if (!be) {
        *out = NULL;
        return err;
    }
    return store_open(be, opts, false, out, errbuf, errlen);
}

int plx_store_close(plx_store *st)
{
    if (!st)
        return 0;
    plx_vdi_open_cancel_all(st);
    plx_reclaim_stop(st);
    int rc = plx_vdi_close_all(st);
    int wrc = plx_wlog_close(st);
    if (!rc)
        rc = wrc;
    /* Drain whatever internal I/O is left so no callback fires into freed memory. */
    while (st->internal_ios || st->ready_head) {
        int prc = st->be->ops->poll(st->be, -1);
        if (prc < 0 && prc != -EINTR)
            break;
        plx_run_ready(st);
    }
    if (!st->read_only) {
        int arc = plx_alloc_shutdown(st);
        if (!rc)
            rc = arc;
    }
    store_free(st);
    return rc;
}


int plx_store_set_lockd(plx_store *st, const char *addr)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    if (strlen(addr) >= sizeof st->state.lockd_addr || strchr(addr, ' '))
        return plx_err(st, -EINVAL,
                       "lock manager address '%s': at most %zu characters, no "
                                    "spaces (HOST:PORT)",
                       addr, sizeof st->state.lockd_addr - 1);
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    rc = plx_state_read(st);
    if (!rc) {
        snprintf(st->state.lockd_addr, sizeof st->state.lockd_addr, "%s", addr);
        rc = plx_state_write(st);
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_admin_unlock(st);
    return rc;
}

int plx_store_lockd_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg)
{
    return plx_lock_status(st, line, arg);
}

/* ---- Upgrade -----------------------------------------------------------------------------------
 */

/* Version 1 -> 2, in this order, each step durable before the next (FORMAT.md §11): the VDI
 * table and name index (new blocks only), the version-2 state block that links them, the
 * version-2 superblock. A crash before the state block leaves version 1 (plus leaked blocks);
 * after it, a superblock still saying 1 over a version-2 state block, which this finishes. */
static int store_upgrade(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                         char *errbuf, size_t errlen)
{
    *upgraded = 0;
    if (opts && opts->read_only) {
        be->ops->destroy(be);
        plx_set_errbuf(errbuf, errlen, "upgrading needs the store opened for writing");
        return -EROFS;
    }
    plx_store *st = NULL;
    int rc = store_open(be, opts, true, &st, errbuf, errlen);
    if (rc)
        return rc;
    if (st->sb.version == PLX_FORMAT_VERSION)
        return plx_store_close(st);
    rc = plx_admin_lock(st);
    if (rc) {
        plx_set_errbuf(errbuf, errlen, "%s", st->errmsg);
        plx_store_close(st);
        return rc;
    }
    rc = plx_state_read(st);
    if (!rc && st->state_v1)
        rc = plx_registry_upgrade(st);
    if (!rc && st->state_v1) {
        st->state_v1 = false; /* written with the version-2 magic from now on */
        rc = plx_state_write(st);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    }
    if (!rc) {
        st->sb.version = PLX_FORMAT_VERSION;
        rc = plx_superblock_write(st);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    }
    if (rc)
        plx_set_errbuf(errbuf, errlen, "upgrading %s: %s", be->desc, st->errmsg);
    plx_admin_unlock(st);
    int crc = plx_store_close(st);
    if (!rc)
        rc = crc;
    if (!rc)
        *upgraded = 1;
    return rc;
}

/* API 1.8 (the default), and 1.0 to 1.7 (PARALLAX_1): as plx_store_open_backend. */
int plx_store_upgrade_backend_1_8(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                                  char *errbuf, size_t errlen);
PLX_SYMVER("plx_store_upgrade_backend@@PARALLAX_1.8")
int plx_store_upgrade_backend_1_8(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                                  char *errbuf, size_t errlen)
{
    return store_upgrade(be, opts, upgraded, errbuf, errlen);
}

int plx_store_upgrade_backend_1_0(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                                  char *errbuf, size_t errlen);
PLX_SYMVER("plx_store_upgrade_backend@PARALLAX_1")
int plx_store_upgrade_backend_1_0(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                                  char *errbuf, size_t errlen)
{
    be = adopt_v1(be, errbuf, errlen);
    if (be == NULL) {
        *upgraded = 0;
        return -ENOMEM;
    }
    return store_upgrade(be, opts, upgraded, errbuf, errlen);
}

int plx_store_upgrade(const char *path, const struct plx_open_opts *opts, int *upgraded,
                      char *errbuf, size_t errlen)
{
    int err = 0;
    plx_backend *be = plx_backend_open(path, PLX_BACKEND_BLOCKING, &err, errbuf, errlen);
    if (!be) {
        *upgraded = 0;
        return err;
    }
    return store_upgrade(be, opts, upgraded, errbuf, errlen);
}
