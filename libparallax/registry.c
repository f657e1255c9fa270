/*
 * registry.c - the VDI registry: one block per VDI in extent 0, and the administrative
 * operations on it (create, clone, delete, lookup, list).
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
#include "internal.h"

#define SCAN_BATCH 64u

int plx_state_read(plx_store *st);
bool plx_holder_stale(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
int plx_wait_alloc_written(plx_store *st);

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

static int name_check(plx_store *st, const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > PLX_NAME_MAX)
        return plx_err(st, -EINVAL, "VDI name must be 1 to %u bytes", PLX_NAME_MAX);
    if (plx_all_digits(name))
        return plx_err(st, -EINVAL, "VDI name '%s' is all digits: it would read as an id", name);
    for (const char *p = name; *p; p++)
        if (*p == '@' || *p == '/' || iscntrl((unsigned char)*p) || isspace((unsigned char)*p))
            return plx_err(st, -EINVAL,
                           "VDI name '%s' may not contain '@', '/', spaces or control characters",
                           name);
    return 0;
}

/* Find a free slot and make sure the name is not taken; under the admin lock. */
static int slot_reserve(plx_store *st, const char *name, uint64_t *slot_addr)
{
    struct plx_vdi_record *recs;
    uint64_t *slots;
    size_t n;
    int rc = plx_registry_scan(st, &recs, &slots, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!(recs[i].flags & PLX_VDI_DELETED) && strcmp(recs[i].name, name) == 0) {
            free(recs);
            free(slots);
            return plx_err(st, -EEXIST, "a VDI named '%s' already exists", name);
        }
    }
    /* Slots are used in order; a slot below registry_used that is free was never written. */
    uint64_t chosen = UINT64_MAX;
    for (uint64_t s = 0, i = 0; s < st->state.registry_used; s++) {
        if (i < n && slots[i] == st->sb.registry_start + s) {
            i++;
            continue;
        }
        chosen = s;
        break;
    }
    free(recs);
    free(slots);
    if (chosen == UINT64_MAX) {
        if (st->state.registry_used >= st->sb.registry_slots)
            return plx_err(st, -ENOSPC, "the VDI registry is full (%llu slots)",
                           (unsigned long long)st->sb.registry_slots);
        chosen = st->state.registry_used;
    }
    *slot_addr = st->sb.registry_start + chosen;
    return 0;
}

/* Allocate a root node holding `links` (NULL: empty), durable together with its claim. */
static int root_write(plx_store *st, const uint64_t *links, uint64_t *root)
{
    uint64_t addr;
    int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &addr);
    if (rc < 0)
        return rc;
    uint64_t *buf = plx_block_alloc(1);
    if (links)
        memcpy(buf, links, PLX_BLOCK_SIZE);
    struct plx_node *stale = plx_cache_lookup(st, addr);
    if (stale && !stale->pins)
        plx_cache_drop(st, stale); /* the block was freed by gc and is reused here */
    rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing a new radix root: %s", strerror(-rc));
    rc = plx_wait_alloc_written(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        return plx_err(st, rc, "making a new radix root durable: %s", strerror(-rc));
    *root = addr;
    return 0;
}

static int vdi_create_common(plx_store *st, const char *name, uint64_t size, unsigned height,
                             const uint64_t *root_links, const struct plx_vdi_record *parent,
                             const struct plx_snap_info *psnap, uint64_t plog, uint64_t *id_out)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    int rc = name_check(st, name);
    if (rc)
        return rc;
    rc = plx_admin_lock(st);
    if (rc)
        return rc;
    uint64_t slot = 0, root = 0;
    rc = slot_reserve(st, name, &slot);
    if (!rc)
        rc = root_write(st, root_links, &root);
    if (!rc) {
        struct plx_vdi_record rec;
        memset(&rec, 0, sizeof rec);
        rec.id = st->state.next_vdi_id++;
        rec.size = size;
        rec.height = height;
        rec.root = root;
        rec.created_ns = plx_now_ns();
        snprintf(rec.name, sizeof rec.name, "%s", name);
        if (parent) {
            rec.parent_id = parent->id;
            rec.parent_snap = psnap->index;
            rec.parent_root = psnap->root;
            rec.parent_log_block = plog;
        }
        uint64_t idx = slot - st->sb.registry_start;
        if (idx >= st->state.registry_used)
            st->state.registry_used = idx + 1;
        /* The record first, then the state block that counts its slot and id: until the state
         * block lands, the record is invisible (beyond registry_used, or an id not yet issued),
         * so a crash in between leaves the registry as it was. */
        rc = plx_registry_write(st, slot, &rec);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc)
            rc = plx_state_write(st);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc && id_out)
            *id_out = rec.id;
        if (rc && !st->errmsg[0])
            plx_err(st, rc, "creating VDI %s: %s", name, strerror(-rc));
    }
    plx_admin_unlock(st);
    return rc;
}

int plx_vdi_create(plx_store *st, const char *name, uint64_t size, uint64_t *id_out)
{
    if (size == 0)
        return plx_err(st, -EINVAL, "VDI size must be more than 0");
    if (size > PLX_MAX_VDI_SIZE)
        return plx_err(st, -EFBIG, "VDI size %llu is beyond the 256 TiB a 4-level tree maps",
                       (unsigned long long)size);
    size = (size + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
    return vdi_create_common(st, name, size, plx_height_for_size(size), NULL, NULL, NULL, 0,
                             id_out);
}

int plx_vdi_clone(plx_store *st, const char *name, const char *snap, uint64_t *id_out)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    /* From resolving the snapshot to writing the clone's record, under the admin lock: a
     * collector reads the registry under it too, so it either sees the clone (and keeps what
     * the clone shares) or the snapshot is still live when the clone copies its root. */
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record parent;
    struct plx_snap_info si;
    uint64_t log_block = 0;
    struct plx_node *src = NULL;
    uint64_t *links = NULL;
    rc = plx_snap_resolve(st, snap, &parent, NULL, &si, &log_block);
    if (!rc)
        rc = plx_cache_get_sync(st, si.root, parent.height - 1, NULL, &src);
    if (!rc && !(links = malloc(PLX_BLOCK_SIZE)))
        rc = plx_err(st, -ENOMEM, "out of memory");
    if (!rc) {
        /* The clone's first root is a copy of the snapshot's root with every link read-only:
         * the whole tree is shared until written. */
        for (unsigned i = 0; i < PLX_RADIX_FANOUT; i++)
            links[i] = src->links[i] ? (src->links[i] | PLX_LINK_RO) : 0;
        rc = vdi_create_common(st, name, parent.size, parent.height, links, &parent, &si,
                               log_block, id_out);
    }
    free(links);
    plx_admin_unlock(st);
    return rc;
}

int plx_vdi_delete(plx_store *st, const char *vdi)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    int rc = plx_admin_lock(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    uint64_t slot;
    rc = plx_registry_find(st, vdi, &rec, &slot);
    if (!rc && rec.lock_host &&
        !plx_holder_stale(st, rec.lock_host, rec.lock_pid, rec.lock_epoch))
        rc = plx_err(st, -EBUSY, "VDI %s is open for writing (pid %u)", rec.name, rec.lock_pid);
    for (struct plx_vdi *v = st->vdis; !rc && v; v = v->next)
        if (v->rec.id == rec.id)
            rc = plx_err(st, -EBUSY, "VDI %s is open in this process", rec.name);
    if (!rc) {
        rec.flags |= PLX_VDI_DELETED;
        rc = plx_registry_write(st, slot, &rec);
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_admin_unlock(st);
    return rc;
}
