/*
 * snaplog.c - snapshot logs: a chain of blocks in metadata extents, newest first, holding the
 * frozen root of every snapshot of a VDI. The VDI record's snap_count says how many records
 * are complete: a record beyond it belongs to a snapshot whose final write (the VDI record)
 * never reached the medium, and is ignored (the next snapshot overwrites it).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "lock.h"
#include "registry.h"
#include "snaplog.h"

int plx_snaplog_read_block(plx_store *st, uint64_t addr, uint64_t vdi_id,
                           struct plx_snaplog_block *out)
{
    /* Another process may have typed a new extent since we read the catalogue: look again
     * before calling the link bad. */
    if (addr && addr < st->sb.block_count &&
        plx_block_type(st, addr) != PLX_EXTENT_METADATA)
        plx_catalogue_read(st);
    if (addr == 0 || addr >= st->sb.block_count || plx_block_type(st, addr) !=
                                                       PLX_EXTENT_METADATA)
        return plx_err(st, -EUCLEAN, "snapshot log of VDI %llu links to block %llu, outside "
                                     "the metadata extents",
                       (unsigned long long)vdi_id, (unsigned long long)addr);
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, out, 0);
    if (rc)
        return plx_err(st, rc, "reading snapshot log block %llu: %s", (unsigned long long)addr,
                       strerror(-rc));
    const char *why = "";
    rc = plx_blkhdr_verify(out, PLX_MAGIC_SNAPLOG, addr, &why);
    if (!rc && out->vdi_id != vdi_id)
        why = "belongs to another VDI", rc = -EUCLEAN;
    if (!rc && (out->count > PLX_SNAPLOG_PER_BLOCK || out->first_index == 0))
        why = "bad record count", rc = -EUCLEAN;
    if (rc)
        return plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %llu is corrupt: %s",
                       (unsigned long long)addr, (unsigned long long)vdi_id, why);
    return 0;
}

int plx_snaplog_read(plx_store *st, const struct plx_vdi_record *rec, struct plx_snap_info **out,
                     size_t *count, uint64_t **blocks)
{
    *out = NULL;
    *count = 0;
    if (blocks)
        *blocks = NULL;
    uint64_t n = rec->snap_count;
    struct plx_snap_info *info = calloc(n ? n : 1, sizeof *info);
    uint64_t *where = calloc(n ? n : 1, sizeof *where);
    struct plx_snaplog_block *b = plx_block_alloc(1);
    int rc = 0;
    if (!info || !where) {
        rc = plx_err(st, -ENOMEM, "out of memory");
        goto out;
    }
    uint64_t expect_last = n; /* highest index still to be found */
    uint64_t addr = rec->snaplog_head;
    uint64_t steps = 0;
    while (expect_last > 0 && !rc) {
        if (addr == 0 || ++steps > n + 1) {
            rc = plx_err(st, -EUCLEAN, "snapshot log of VDI %s ends before snapshot %llu",
                         rec->name, (unsigned long long)expect_last);
            break;
        }
        rc = plx_snaplog_read_block(st, addr, rec->id, b);
        if (rc)
            break;
        if (b->first_index > expect_last ||
            b->first_index + b->count - 1 < expect_last) {
            rc = plx_err(st, -EUCLEAN, "snapshot log block %llu of VDI %s does not hold "
                                       "snapshot %llu",
                         (unsigned long long)addr, rec->name, (unsigned long long)expect_last);
            break;
        }
        for (uint64_t idx = b->first_index; idx <= expect_last; idx++) {
            const struct plx_snap_record *r = &b->records[idx - b->first_index];
            struct plx_snap_info *si = &info[idx - 1];
            si->vdi_id = rec->id;
            si->index = idx;
            si->root = r->root;
            si->time_ns = r->time_ns;
            si->deleted = (r->flags & PLX_SNAP_DELETED) != 0;
            memcpy(si->label, r->label, PLX_LABEL_MAX);
            si->label[PLX_LABEL_MAX] = 0;
            where[idx - 1] = addr;
        }
        expect_last = b->first_index - 1;
        addr = b->prev;
    }
out:
    plx_block_free(b);
    if (rc) {
        free(info);
        free(where);
        return rc;
    }
    *out = info;
    *count = n;
    if (blocks)
        *blocks = where;
    else
        free(where);
    return 0;
}

int plx_snap_resolve(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                     uint64_t *slot_addr, struct plx_snap_info *snap, uint64_t *log_block)
{
    const char *at = strchr(spec, '@');
    if (!at || at == spec || !at[1])
        return plx_err(st, -EINVAL, "'%s' is not a snapshot: use VDI@N or VDI@LABEL", spec);
    char vdi[PLX_NAME_MAX + 1];
    size_t vlen = (size_t)(at - spec);
    if (vlen > PLX_NAME_MAX)
        return plx_err(st, -ENOENT, "no VDI named '%.*s'", (int)vlen, spec);
    memcpy(vdi, spec, vlen);
    vdi[vlen] = 0;
    int rc = plx_registry_find(st, vdi, rec, slot_addr);
    if (rc)
        return rc;
    struct plx_snap_info *list;
    uint64_t *blocks;
    size_t n;
    rc = plx_snaplog_read(st, rec, &list, &n, &blocks);
    if (rc)
        return rc;
    const char *what = at + 1;
    long found = -1;
    if (plx_all_digits(what)) {
        uint64_t idx = strtoull(what, NULL, 10);
        if (idx >= 1 && idx <= n && !list[idx - 1].deleted)
            found = (long)idx - 1;
        else
            rc = plx_err(st, -ENOENT, "VDI %s has no snapshot %s (it has %zu)", rec->name,
                         what, n);
    } else {
        for (size_t i = 0; i < n; i++)
            if (!list[i].deleted && strcmp(list[i].label, what) == 0)
                found = (long)i;
        if (found < 0)
            rc = plx_err(st, -ENOENT, "VDI %s has no snapshot labelled '%s'", rec->name, what);
    }
    if (found >= 0) {
        *snap = list[found];
        if (log_block)
            *log_block = blocks[found];
    }
    free(list);
    free(blocks);
    return rc;
}

int plx_snap_lookup(plx_store *st, const char *snap, struct plx_snap_info *out)
{
    struct plx_vdi_record rec;
    return plx_snap_resolve(st, snap, &rec, NULL, out, NULL);
}

int plx_snap_list(plx_store *st, uint64_t vdi_id, struct plx_snap_info **out, size_t *count)
{
    char spec[32];
    snprintf(spec, sizeof spec, "%llu", (unsigned long long)vdi_id);
    struct plx_vdi_record rec;
    struct plx_vdi_record *recs;
    uint64_t *slots;
    size_t n;
    int rc = plx_registry_scan(st, &recs, &slots, &n);
    if (rc)
        return rc;
    long found = -1;
    for (size_t i = 0; i < n; i++)
        if (recs[i].id == vdi_id)
            found = (long)i;
    if (found >= 0)
        rec = recs[found];
    free(recs);
    free(slots);
    if (found < 0)
        return plx_err(st, -ENOENT, "no VDI with id %s", spec);
    return plx_snaplog_read(st, &rec, out, count, NULL);
}

int plx_label_check(plx_store *st, const char *label)
{
    if (strlen(label) > PLX_LABEL_MAX)
        return plx_err(st, -EINVAL, "snapshot label '%s' is longer than %u bytes", label,
                       PLX_LABEL_MAX);
    if (*label && plx_all_digits(label))
        return plx_err(st, -EINVAL, "snapshot label '%s' is all digits: it would read as N",
                       label);
    for (const char *p = label; *p; p++)
        if (*p == '@' || *p == '/' || iscntrl((unsigned char)*p))
            return plx_err(st, -EINVAL, "snapshot label may not contain '@', '/' or control "
                                        "characters");
    return 0;
}

int plx_snap_label(plx_store *st, const char *snap, const char *label)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    int rc = plx_label_check(st, label);
    if (rc)
        return rc;
    rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    struct plx_snap_info si;
    uint64_t log_block = 0;
    rc = plx_snap_resolve(st, snap, &rec, NULL, &si, &log_block);
    if (!rc && rec.lock_host && !plx_holder_stale(st, rec.lock_host, rec.lock_pid,
                                                   rec.lock_epoch))
        rc = plx_err(st, -EBUSY, "VDI %s is open for writing (pid %u); label it there",
                     rec.name, rec.lock_pid);
    if (!rc && *label) {
        struct plx_snap_info *list;
        size_t n;
        rc = plx_snaplog_read(st, &rec, &list, &n, NULL);
        for (size_t i = 0; !rc && i < n; i++)
            if (!list[i].deleted && i + 1 != si.index && strcmp(list[i].label, label) == 0)
                rc = plx_err(st, -EEXIST, "VDI %s already has a snapshot labelled '%s' (@%zu)",
                             rec.name, label, i + 1);
        if (!rc || rc == -EEXIST)
            free(list);
    }
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!rc)
        rc = plx_snaplog_read_block(st, log_block, rec.id, b);
    if (!rc) {
        struct plx_snap_record *r = &b->records[si.index - b->first_index];
        memset(r->label, 0, sizeof r->label);
        memcpy(r->label, label, strlen(label));
        plx_blkhdr_seal(b, PLX_MAGIC_SNAPLOG, log_block);
        rc = plx_sync_io(st, PLX_IO_WRITE, log_block, 1, b, 0);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "writing snapshot log block: %s", strerror(-rc));
    }
    plx_block_free(b);
    plx_admin_unlock(st);
    return rc;
}

int plx_snap_delete(plx_store *st, const char *snap)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    struct plx_snap_info si;
    uint64_t log_block = 0;
    rc = plx_snap_resolve(st, snap, &rec, NULL, &si, &log_block);
    if (!rc && rec.lock_host &&
        !plx_holder_stale(st, rec.lock_host, rec.lock_pid, rec.lock_epoch))
        rc = plx_err(st, -EBUSY, "VDI %s is open for writing (pid %u); delete the snapshot there",
                     rec.name, rec.lock_pid);
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!rc)
        rc = plx_snaplog_read_block(st, log_block, rec.id, b);
    if (!rc) {
        /* The record stays (indexes are positions in the log); only its root stops being one. */
        b->records[si.index - b->first_index].flags |= PLX_SNAP_DELETED;
        plx_blkhdr_seal(b, PLX_MAGIC_SNAPLOG, log_block);
        rc = plx_sync_io(st, PLX_IO_WRITE, log_block, 1, b, 0);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "writing snapshot log block: %s", strerror(-rc));
    }
    plx_block_free(b);
    plx_admin_unlock(st);
    return rc;
}
