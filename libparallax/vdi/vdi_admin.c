/*
 * vdi_admin.c - creating, cloning and deleting VDIs (layer 6).
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
#include "alloc.h"
#include "cache.h"
#include "lock.h"
#include "pipeline.h"
#include "registry.h"
#include "snaplog.h"
#include "system.h"

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

/* Is the name taken by a live VDI? Under the admin lock: the name index, then the records its
 * entries name. */
static int name_free(plx_store *st, const char *name)
{
    struct plx_vdi_record rec;
    int rc = plx_registry_find(st, name, &rec, NULL);
    if (rc == 0 && strcmp(rec.name, name) == 0)
        return plx_err(st, -EEXIST, "a VDI named '%s' already exists", name);
    if (rc == -ENOENT || rc == 0) { /* 0: an all-digit spec found an id; names are never digits */
        st->errmsg[0] = 0;
        return 0;
    }
    return rc;
}

/* Allocate and write the new VDI's root node (`links`, NULL: empty) and its record block, and
 * make both durable with their claims. */
static int root_and_record_write(plx_store *st, const uint64_t *links, struct plx_vdi_record *rec,
                                 uint64_t *rec_addr)
{
    uint64_t addr, raddr;
    int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &addr);
    if (rc >= 0)
        rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, &raddr);
    if (rc < 0)
        return rc;
    uint64_t *buf = plx_block_alloc(1);
    if (links)
        memcpy(buf, links, PLX_BLOCK_SIZE);
    struct plx_node *stale = plx_cache_lookup(st, addr);
    if (stale && !stale->pins)
        plx_cache_drop(st, stale); /* the block was freed by gc and is reused here */
    stale = plx_cache_lookup(st, raddr);
    if (stale && !stale->pins)
        plx_cache_drop(st, stale);
    rc = plx_sync_io(st, PLX_IO_WRITE, addr, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing a new radix root: %s", strerror(-rc));
    rec->root = addr;
    rc = plx_registry_write(st, raddr, rec);
    if (rc)
        return rc;
    rc = plx_wait_alloc_written(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        return plx_err(st, rc, "making a new VDI's root and record durable: %s", strerror(-rc));
    *rec_addr = raddr;
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
    rc = name_free(st, name);
    if (!rc) {
        struct plx_vdi_record rec;
        uint64_t rec_addr = 0;
        memset(&rec, 0, sizeof rec);
        rec.id = st->state.next_vdi_id;
        rec.size = size;
        rec.height = height;
        rec.created_ns = plx_now_ns();
        rec.flags = PLX_VDI_SNAPS_COUNTED; /* no snapshots, none deleted */
        snprintf(rec.name, sizeof rec.name, "%s", name);
        if (parent) {
            rec.parent_id = parent->id;
            rec.parent_snap = psnap->index;
            rec.parent_root = psnap->root;
            rec.parent_log_block = plog;
        }
        /* Root and record first, then the table entry and the name, then the state block that
         * issues the id: until it lands the VDI does not exist (its id is not below
         * next_vdi_id), so a crash anywhere before leaves the registry as it was, give or take
         * a name index entry that no VDI stands behind (FORMAT.md §7). */
        rc = root_and_record_write(st, root_links, &rec, &rec_addr);
        if (!rc)
            rc = plx_registry_link(st, &rec, rec_addr);
        if (!rc)
            rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
        if (!rc) {
            st->state.next_vdi_id++;
            rc = plx_state_write(st);
        }
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
    int rc = plx_admin_lock_writable(st);
    if (rc)
        return rc;
    struct plx_vdi_record rec;
    uint64_t slot;
    rc = plx_registry_find(st, vdi, &rec, &slot);
    if (!rc)
        rc = plx_record_unwritten(st, &rec, "");
    for (struct plx_vdi *v = st->vdis; !rc && v; v = v->next)
        if (v->rec.id == rec.id)
            rc = plx_err(st, -EBUSY, "VDI %s is open in this process", rec.name);
    if (!rc) {
        rec.flags |= PLX_VDI_DELETED;
        rc = plx_registry_write(st, slot, &rec);
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    /* Deleted once the record landed; then the name is free (a crash before this leaves an
     * entry that lookups skip and the purge removes). */
    if (!rc)
        rc = plx_registry_unname(st, &rec);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    plx_admin_unlock(st);
    return rc;
}
