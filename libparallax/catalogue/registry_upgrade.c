/*
 * registry_upgrade.c - format version 1's fixed registry becomes the VDI table and the name index
 * (layer 4, registry.h; FORMAT.md §11). The records stay in their legacy slots in extent 0: the
 * table points at them, so nothing is copied and no open handle's record moves.
 *
 * Only new blocks are written here (table and index blocks in a metadata extent), then made
 * durable; the caller then writes the version-2 state block (which links them) and the
 * superblock. A crash before the state block leaves the version-1 store with some leaked
 * metadata blocks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"

#define UPGRADE_BATCH 64u

struct legacy {
    uint64_t id, slot, hash;
    bool deleted;
};

/* A process that holds something of the store could go on using the version-1 registry. */
static int refuse_if_held(plx_store *st, const struct plx_vdi_record *r)
{
    if (!r->lock_host || plx_holder_stale(st, r->lock_host, r->lock_pid, r->lock_epoch) ||
        plx_holder_is_me(st, r->lock_host, r->lock_pid, r->lock_epoch))
        return 0;
    return plx_err(st, -EBUSY,
                   "VDI %s is open for writing (pid %u%s); stop every Parallax process using "
                   "the store before upgrading it",
                   r->name, r->lock_pid, r->lock_host == st->host_hash ? "" : " on another host");
}

static int read_legacy(plx_store *st, struct legacy **out, size_t *n)
{
    uint64_t used = st->state.registry_used;
    struct legacy *v = calloc(used ? used : 1, sizeof *v);
    uint8_t *buf = plx_block_alloc(UPGRADE_BATCH);
    int rc = v ? 0 : plx_err(st, -ENOMEM, "out of memory");
    *n = 0;
    for (uint64_t first = 0; first < used && !rc; first += UPGRADE_BATCH) {
        uint32_t cnt = (uint32_t)(used - first < UPGRADE_BATCH ? used - first : UPGRADE_BATCH);
        uint64_t base = st->sb.registry_start + first;
        rc = plx_sync_io(st, PLX_IO_READ, base, cnt, buf, 0);
        if (rc) {
            plx_err(st, rc, "reading the version-1 VDI registry: %s", strerror(-rc));
            break;
        }
        for (uint32_t i = 0; i < cnt && !rc; i++) {
            const uint8_t *blk = buf + (size_t)i * PLX_BLOCK_SIZE;
            const char *why = "";
            int vrc = plx_blkhdr_verify(blk, PLX_MAGIC_VDI, base + i, &why);
            if (vrc == -ENODATA)
                continue; /* a free slot */
            if (vrc) {
                rc = plx_err(st, -EUCLEAN,
                             "VDI registry slot %llu is corrupt (%s): nothing was changed; "
                             "repair the store before upgrading it",
                             (unsigned long long)(base + i), why);
                break;
            }
            struct plx_vdi_record rec;
            memcpy(&rec, blk, sizeof rec);
            if (rec.id >= st->state.next_vdi_id)
                continue; /* a create that crashed before its state block: not a VDI */
            if (rec.id == 0 || rec.name[PLX_NAME_MAX] != 0 || rec.name[0] == 0) {
                rc = plx_err(st, -EUCLEAN,
                             "VDI registry slot %llu holds an invalid record: nothing was "
                             "changed; repair the store before upgrading it",
                             (unsigned long long)(base + i));
                break;
            }
            bool deleted = rec.flags & PLX_VDI_DELETED;
            if (!deleted)
                rc = refuse_if_held(st, &rec);
            v[(*n)++] = (struct legacy){rec.id, base + i, plx_name_hash(rec.name), deleted};
        }
    }
    plx_block_free(buf);
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    return 0;
}

int plx_registry_upgrade(plx_store *st)
{
    /* Nothing may be held: check every extent before writing anything. */
    for (uint64_t e = 1; e < st->sb.extent_count; e++) {
        const struct plx_extent_entry *c = &st->cat[e];
        if (c->holder_host &&
            !plx_holder_stale(st, c->holder_host, c->holder_pid, c->holder_epoch) &&
            !plx_holder_is_me(st, c->holder_host, c->holder_pid, c->holder_epoch))
            return plx_err(st, -EBUSY,
                           "pid %u%s allocates in extent %llu; stop every Parallax process "
                           "using the store before upgrading it",
                           c->holder_pid, c->holder_host == st->host_hash ? "" : " on another host",
                           (unsigned long long)e);
    }
    struct legacy *v = NULL;
    size_t n = 0;
    int rc = read_legacy(st, &v, &n);
    if (rc)
        return rc;
    st->state.vdi_table_root = 0;
    st->state.vdi_table_height = 0;
    st->state.name_index_root = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = plx_vditab_set(st, v[i].id, v[i].slot, NULL);
        if (!rc && !v[i].deleted)
            rc = plx_nameidx_insert(st, v[i].hash, v[i].id);
    }
    if (!rc)
        rc = plx_registry_durable(st);
    free(v);
    return rc;
}
