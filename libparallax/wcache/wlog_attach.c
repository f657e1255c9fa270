/*
 * wlog_attach.c - attaching a write log to a store: open it (wlog_open.c checks its head, or writes
 * a new one) and replay into the store what it holds past its tail, before any VDI is served
 * (docs/DESIGN.md, "The write cache": crash and ownership).
 *
 * Replay applies each batch with the blocking calls (blocking.c) on VDIs it opens itself (vdi.c),
 * so it sits above both; the write log only reads batches for it (wlog_cursor.c,
 * plx_wlog_cursor_*) and restarts the log after them, and calls nothing up here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"
#include "wlog.h"

#define BS PLX_BLOCK_SIZE

/* The VDIs replay writes to, opened on first use. */
struct replay_vdi {
    uint64_t id;
    plx_vdi *v; /* NULL: skipped (deleted, or its record no longer names this log) */
};

static plx_vdi *replay_target(plx_store *st, struct replay_vdi **rv, size_t *n, uint64_t id,
                              int *err)
{
    for (size_t i = 0; i < *n; i++)
        if ((*rv)[i].id == id)
            return (*rv)[i].v;
    struct replay_vdi *t = realloc(*rv, (*n + 1) * sizeof *t);
    if (!t) {
        *err = -ENOMEM;
        return NULL;
    }
    *rv = t;
    t[*n].id = id;
    t[*n].v = NULL;
    struct plx_vdi_record rec;
    uint64_t slot;
    char spec[32];
    snprintf(spec, sizeof spec, "%llu", (unsigned long long)id);
    int rc = plx_registry_find(st, spec, &rec, &slot);
    if (!rc && rec.wlog_id == plx_wlog_id(st) && !(rec.flags & PLX_VDI_DELETED)) {
        rc = plx_vdi_open(st, spec, 0, &t[*n].v);
        if (rc)
            *err = rc;
    }
    (*n)++;
    return t[*n - 1].v;
}

/* The records (their block addresses) that name log_id. */
struct named {
    uint64_t log_id;
    uint64_t *addr;
    size_t n, cap;
};

static int collect_named(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    struct named *nm = arg;
    if (rec->wlog_id != nm->log_id)
        return 0;
    if (nm->n == nm->cap) {
        size_t c = nm->cap ? nm->cap * 2 : 16;
        uint64_t *a = realloc(nm->addr, c * sizeof *a);
        if (!a)
            return -ENOMEM;
        nm->addr = a;
        nm->cap = c;
    }
    nm->addr[nm->n++] = rec_addr;
    return 0;
}

/* VDIs whose record still names this log but that had nothing past the tail: clear the names. */
static int clear_named(plx_store *st)
{
    struct named named = {.log_id = plx_wlog_id(st)};
    int rc = plx_registry_each(st, 0, collect_named, &named);
    for (size_t i = 0; !rc && i < named.n; i++) {
        rc = plx_admin_lock(st);
        if (rc)
            break;
        struct plx_vdi_record rec;
        rc = plx_registry_read(st, named.addr[i], &rec);
        if (!rc && rec.wlog_id == named.log_id) {
            rec.wlog_host = rec.wlog_id = 0;
            rc = plx_registry_write(st, named.addr[i], &rec);
            if (!rc)
                rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        }
        plx_admin_unlock(st);
    }
    free(named.addr);
    return rc;
}

static int replay(plx_store *st)
{
    struct plx_wlog_cursor c;
    int rc = plx_wlog_cursor_open(st, &c);
    if (rc)
        return rc;
    struct replay_vdi *rv = NULL;
    size_t nrv = 0;
    uint64_t applied = 0;
    while (!rc && plx_wlog_cursor_read(st, &c)) {
        const struct plx_wlog_batch *bh = (const void *)c.hb;
        uint64_t o = 0;
        for (uint32_t i = 0; i < bh->count && !rc; i++) {
            const struct plx_wlog_entry *e = &bh->entries[i];
            plx_vdi *v = replay_target(st, &rv, &nrv, e->vdi_id, &rc);
            if (v && !rc) {
                rc = plx_vdi_pwrite(v, c.data + o * BS, e->vblock * BS, (size_t)e->nblocks * BS, 0);
                applied++;
            }
            o += e->nblocks;
        }
        plx_wlog_cursor_step(&c);
    }
    for (size_t i = 0; i < nrv; i++)
        if (rv[i].v) {
            int frc = plx_vdi_flush(rv[i].v);
            int crc = plx_vdi_close(rv[i].v); /* clears the record's write-log fields */
            if (!rc)
                rc = frc ? frc : crc;
        }
    free(rv);
    if (rc) {
        char why[sizeof st->errmsg];
        snprintf(why, sizeof why, "%s", st->errmsg);
        rc = plx_err(st, rc, "replaying write log %s: %s", plx_wlog_desc(st), why);
    }
    if (!rc)
        rc = clear_named(st);
    if (!rc)
        rc = plx_wlog_restart_at(st, &c, applied);
    plx_wlog_cursor_close(&c);
    return rc;
}

int plx_wlog_attach(plx_store *st, plx_backend *be, int init, const char *desc)
{
    int rc = plx_wlog_open(st, be, init, desc);
    if (rc)
        return rc;
    rc = replay(st);
    if (rc)
        plx_wlog_abandon(st);
    return rc;
}
