/*
 * snap_admin.c - snapshots named by the user, outside an open VDI: resolving "VDI@N" and
 * "VDI@LABEL", listing, and labelling or deleting a snapshot of a VDI no process holds for
 * writing (under the admin lock, from fresh reads). A VDI open for writing does the same edits
 * as requests in its stream (snap_edit.c). Built on the log (snaplog.c) and the label index
 * (labels.c), both below it.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"
#include "snaplog.h"
#include "system.h"

static void info_from_record(const struct plx_vdi_record *rec, uint64_t idx,
                             const struct plx_snap_record *r, struct plx_snap_info *si)
{
    memset(si, 0, sizeof *si);
    si->vdi_id = rec->id;
    si->index = idx;
    si->root = r->root;
    si->time_ns = r->time_ns;
    si->deleted = (r->flags & PLX_SNAP_DELETED) != 0;
    memcpy(si->label, r->label, PLX_LABEL_MAX);
    si->label[PLX_LABEL_MAX] = 0;
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
    const char *what = at + 1;
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!b)
        return plx_err(st, -ENOMEM, "out of memory");
    uint64_t addr = 0;
    if (plx_all_digits(what)) {
        uint64_t idx = strtoull(what, NULL, 10);
        if (idx >= 1 && idx <= rec->snap_count) {
            rc = plx_snaplog_find(st, rec, idx, b, &addr);
            if (!rc && (b->records[idx - b->first_index].flags & PLX_SNAP_DELETED))
                rc = plx_err(st, -ENOENT, "snapshot %s@%s was deleted", rec->name, what);
            else if (!rc)
                info_from_record(rec, idx, &b->records[idx - b->first_index], snap);
        } else if (rec->snap_count == 0) {
            rc = plx_err(st, -ENOENT,
                         "VDI %s has no snapshots yet ('parallax vdi-snapshot %s' takes one)",
                         rec->name, rec->name);
        } else {
            rc = plx_err(st, -ENOENT,
                         "VDI %s has no snapshot %s (its snapshots are numbered 1 "
                         "to %llu)",
                         rec->name, what, (unsigned long long)rec->snap_count);
        }
    } else {
        /* The label index and the log records after it (labels.c). */
        uint64_t idx = 0;
        int found = plx_label_find(st, rec, what, &idx, b, &addr);
        rc = found < 0 ? found : 0;
        if (found > 0)
            info_from_record(rec, idx, &b->records[idx - b->first_index], snap);
        if (!found)
            rc = plx_err(st, -ENOENT, "VDI %s has no snapshot labelled '%s'", rec->name, what);
    }
    plx_block_free(b);
    if (!rc && log_block)
        *log_block = addr;
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
    int rc = plx_state_read(st);
    if (!rc)
        rc = plx_registry_get(st, vdi_id, &rec, NULL);
    if (rc == -ENOENT)
        return plx_err(st, -ENOENT, "no VDI with id %s", spec);
    if (rc)
        return rc;
    return plx_snaplog_read(st, &rec, out, count, NULL);
}

int plx_label_check(plx_store *st, const char *label)
{
    if (strlen(label) > PLX_LABEL_MAX)
        return plx_err(st, -EINVAL, "snapshot label '%s' is longer than %u bytes", label,
                       PLX_LABEL_MAX);
    if (*label && plx_all_digits(label))
        return plx_err(st, -EINVAL, "snapshot label '%s' is all digits: it would read as N", label);
    for (const char *p = label; *p; p++)
        if (*p == '@' || *p == '/' || iscntrl((unsigned char)*p))
            return plx_err(st, -EINVAL,
                           "snapshot label may not contain '@', '/' or control "
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
    uint64_t log_block = 0, slot = 0;
    rc = plx_snap_resolve(st, snap, &rec, &slot, &si, &log_block);
    if (!rc)
        rc = plx_record_unwritten(st, &rec, "; label it there");
    if (!rc && *label) {
        uint64_t other = 0;
        int found = plx_label_find(st, &rec, label, &other, NULL, NULL);
        rc = found < 0                        ? found
             : found > 0 && other != si.index ? plx_err(st, -EEXIST,
                                                        "VDI %s already has a "
                                                        "snapshot labelled '%s' "
                                                        "(@%llu)",
                                                        rec.name, label, (unsigned long long)other)
                                              : 0;
    }
    /* The index names the label before the log record does (a crash between leaves a stale
     * entry, which readers check against the record). */
    if (!rc)
        rc = plx_labels_note(st, slot, &rec, si.index, label);
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!rc)
        rc = plx_snaplog_read_block(st, log_block, &rec, b);
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

/* Write rec (seq bumped) and flush. */
static int record_write_durable(plx_store *st, uint64_t slot, struct plx_vdi_record *rec)
{
    int rc = plx_registry_write(st, slot, rec);
    if (!rc) {
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (rc)
            plx_err(st, rc, "VDI %s: flushing its record: %s", rec->name, strerror(-rc));
    }
    if (!rc)
        rec->seq++;
    return rc;
}

int plx_snap_delete(plx_store *st, const char *snap)
{
    int rc = plx_admin_lock_writable(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    struct plx_snap_info si;
    uint64_t log_block = 0, slot = 0;
    rc = plx_snap_resolve(st, snap, &rec, &slot, &si, &log_block);
    if (!rc)
        rc = plx_record_unwritten(st, &rec, "; delete the snapshot there");
    /* The record counts the deletion first and names it (FORMAT.md §7): a crash before the log
     * record lands leaves snap_deleting, which readers check against the log. */
    bool counted = (rec.flags & PLX_VDI_SNAPS_COUNTED) != 0;
    if (!rc && counted) {
        rec.snap_deleted++;
        rec.snap_deleting = si.index;
        rc = record_write_durable(st, slot, &rec);
    }
    struct plx_snaplog_block *b = plx_block_alloc(1);
    if (!rc)
        rc = plx_snaplog_read_block(st, log_block, &rec, b);
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
    if (!rc && counted) {
        rec.snap_deleting = 0; /* the log says it now */
        rc = record_write_durable(st, slot, &rec);
    }
    plx_block_free(b);
    plx_admin_unlock(st);
    return rc;
}
