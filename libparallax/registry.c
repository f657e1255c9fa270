/*
 * registry.c - the VDI registry (layer 4, registry.h): one block per VDI in extent 0; reading,
 * writing, finding and listing records. Creating, cloning and deleting VDIs is vdi_admin.c.
 *
 * Registry changes are read-modify-write under the admin lock, always reading slots fresh from
 * the medium: another process may have changed them. Writes are ordered so that a crash leaves
 * either the old registry or the new one: everything a record points to (root block, claims)
 * is flushed before the record is written.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"
#include "system.h"

#define SCAN_BATCH 64u

/* A VDI spec or snapshot suffix that is all digits is an id / index, not a name / label. */
bool plx_all_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

unsigned plx_height_for_size(uint64_t size)
{
    uint64_t blocks = (size + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE;
    return blocks <= (1ull << (3 * PLX_RADIX_BITS)) ? PLX_HEIGHT_SMALL : PLX_HEIGHT_LARGE;
}

void plx_registry_seal(struct plx_vdi_record *rec, uint64_t slot_addr, void *block)
{
    memset(block, 0, PLX_BLOCK_SIZE);
    rec->version = 1;
    memcpy(block, rec, sizeof *rec);
    plx_blkhdr_seal(block, PLX_MAGIC_VDI, slot_addr);
    memcpy(rec, block, sizeof *rec);
}

static int record_check(plx_store *st, const struct plx_vdi_record *r, uint64_t slot)
{
    bool ok = r->id != 0 && r->size % PLX_BLOCK_SIZE == 0 &&
              r->size > 0 && r->size <= PLX_MAX_VDI_SIZE &&
              (r->height == PLX_HEIGHT_SMALL || r->height == PLX_HEIGHT_LARGE) &&
              r->height >= plx_height_for_size(r->size) && r->root != 0 &&
              r->root < st->sb.block_count && r->name[PLX_NAME_MAX] == 0 && r->name[0] != 0;
    if (!ok)
        return plx_err(st, -EUCLEAN, "VDI registry slot %llu holds an invalid record",
                       (unsigned long long)slot);
    return 0;
}

int plx_registry_read(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec)
{
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, slot_addr, 1, buf, 0);
    const char *why = "";
    if (rc) {
        plx_err(st, rc, "reading VDI registry slot %llu: %s", (unsigned long long)slot_addr,
                strerror(-rc));
    } else {
        rc = plx_blkhdr_verify(buf, PLX_MAGIC_VDI, slot_addr, &why);
        if (rc == -EUCLEAN)
            plx_err(st, rc, "VDI registry slot %llu is corrupt: %s",
                    (unsigned long long)slot_addr, why);
        if (rc == 0) {
            memcpy(rec, buf, sizeof *rec);
            rc = record_check(st, rec, slot_addr);
        }
    }
    plx_block_free(buf);
    return rc;
}

int plx_registry_write(plx_store *st, uint64_t slot_addr, const struct plx_vdi_record *rec)
{
    uint8_t *buf = plx_block_alloc(1);
    struct plx_vdi_record copy = *rec;
    copy.seq++;
    plx_registry_seal(&copy, slot_addr, buf);
    int rc = plx_sync_io(st, PLX_IO_WRITE, slot_addr, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing the record of VDI %s: %s", rec->name, strerror(-rc));
    return 0;
}

/* Every used slot (free slots are skipped). A corrupt slot fails the scan: the registry is the
 * root of everything and must not be guessed at. */
int plx_registry_scan(plx_store *st, struct plx_vdi_record **recs, uint64_t **slots, size_t *n)
{
    *recs = NULL;
    *slots = NULL;
    *n = 0;
    int rc = plx_state_read(st);
    if (rc)
        return rc;
    uint64_t used = st->state.registry_used;
    struct plx_vdi_record *r = calloc(used ? used : 1, sizeof *r);
    uint64_t *s = calloc(used ? used : 1, sizeof *s);
    uint8_t *buf = plx_block_alloc(SCAN_BATCH);
    if (!r || !s) {
        rc = plx_err(st, -ENOMEM, "out of memory reading the registry");
        goto out;
    }
    for (uint64_t first = 0; first < used && !rc; first += SCAN_BATCH) {
        uint32_t cnt = (uint32_t)(used - first < SCAN_BATCH ? used - first : SCAN_BATCH);
        uint64_t base = st->sb.registry_start + first;
        rc = plx_sync_io(st, PLX_IO_READ, base, cnt, buf, 0);
        if (rc) {
            plx_err(st, rc, "reading the VDI registry: %s", strerror(-rc));
            break;
        }
        for (uint32_t i = 0; i < cnt && !rc; i++) {
            const uint8_t *blk = buf + (size_t)i * PLX_BLOCK_SIZE;
            const char *why = "";
            int vrc = plx_blkhdr_verify(blk, PLX_MAGIC_VDI, base + i, &why);
            if (vrc == -ENODATA)
                continue;
            if (vrc) {
                rc = plx_err(st, -EUCLEAN, "VDI registry slot %llu is corrupt: %s",
                             (unsigned long long)(base + i), why);
                break;
            }
            memcpy(&r[*n], blk, sizeof *r);
            /* A record whose id the state block never issued is a create that crashed before
             * its last write: not part of the registry. */
            if (r[*n].id >= st->state.next_vdi_id)
                continue;
            rc = record_check(st, &r[*n], base + i);
            s[*n] = base + i;
            (*n)++;
        }
    }
out:
    plx_block_free(buf);
    if (rc) {
        free(r);
        free(s);
        *n = 0;
        return rc;
    }
    *recs = r;
    *slots = s;
    return 0;
}

int plx_registry_find(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                      uint64_t *slot_addr)
{
    struct plx_vdi_record *recs;
    uint64_t *slots;
    size_t n;
    int rc = plx_registry_scan(st, &recs, &slots, &n);
    if (rc)
        return rc;
    long found = -1;
    for (size_t i = 0; i < n && found < 0; i++)
        if (!(recs[i].flags & PLX_VDI_DELETED) && strcmp(recs[i].name, spec) == 0)
            found = (long)i;
    if (found < 0 && plx_all_digits(spec)) {
        uint64_t id = strtoull(spec, NULL, 10);
        for (size_t i = 0; i < n && found < 0; i++)
            if (!(recs[i].flags & PLX_VDI_DELETED) && recs[i].id == id)
                found = (long)i;
    }
    if (found >= 0) {
        *rec = recs[found];
        if (slot_addr)
            *slot_addr = slots[found];
    }
    free(recs);
    free(slots);
    if (found < 0 && plx_all_digits(spec))
        return plx_err(st, -ENOENT, "no VDI named '%s' and none with id %s", spec, spec);
    if (found < 0)
        return plx_err(st, -ENOENT, "no VDI named '%s'", spec);
    return 0;
}

void plx_record_to_info(const plx_store *st, const struct plx_vdi_record *rec,
                        struct plx_vdi_info *out)
{
    memset(out, 0, sizeof *out);
    out->id = rec->id;
    snprintf(out->name, sizeof out->name, "%s", rec->name);
    out->size = rec->size;
    out->height = rec->height;
    out->root = rec->root;
    out->snap_count = rec->snap_count;
    out->parent_id = rec->parent_id;
    out->parent_snap = rec->parent_snap;
    out->created_ns = rec->created_ns;
    out->deleted = (rec->flags & PLX_VDI_DELETED) != 0;
    if (rec->lock_host && !plx_holder_stale(st, rec->lock_host, rec->lock_pid, rec->lock_epoch)) {
        if (rec->lock_host == st->host_hash) {
            snprintf(out->lock_holder, sizeof out->lock_holder, "%.40s pid %u", st->host,
                     rec->lock_pid);
            out->lock_pid = rec->lock_pid;
        }
        else
            snprintf(out->lock_holder, sizeof out->lock_holder, "host %016llx pid %u",
                     (unsigned long long)rec->lock_host, rec->lock_pid);
    }
}

int plx_vdi_lookup(plx_store *st, const char *vdi, struct plx_vdi_info *out)
{
    struct plx_vdi_record rec;
    int rc = plx_registry_find(st, vdi, &rec, NULL);
    if (rc)
        return rc;
    plx_record_to_info(st, &rec, out);
    return 0;
}

int plx_vdi_list(plx_store *st, struct plx_vdi_info **out, size_t *count)
{
    struct plx_vdi_record *recs;
    uint64_t *slots;
    size_t n;
    *out = NULL;
    *count = 0;
    int rc = plx_registry_scan(st, &recs, &slots, &n);
    if (rc)
        return rc;
    struct plx_vdi_info *info = calloc(n ? n : 1, sizeof *info);
    if (!info) {
        free(recs);
        free(slots);
        return plx_err(st, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        plx_record_to_info(st, &recs[i], &info[i]);
    free(recs);
    free(slots);
    *out = info;
    *count = n;
    return 0;
}

