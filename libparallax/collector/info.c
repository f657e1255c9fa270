/*
 * info.c - what `parallax info` reports (layer 8): space by extent type, VDIs, and what a
 * collection would free.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "registry.h"

/* ---- Space accounting -------------------------------------------------------------------------- */

static int count_live(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    (void)rec_addr;
    if (!(rec->flags & PLX_VDI_DELETED))
        ++*(uint64_t *)arg;
    return 0;
}

int plx_store_info(plx_store *st, struct plx_store_info *out)
{
    memset(out, 0, sizeof *out);
    uint64_t eb = st->sb.extent_blocks;
    int rc = plx_catalogue_read(st);
    if (rc)
        return rc;
    out->format_version = st->sb.version;
    out->block_count = st->sb.block_count;
    out->size_bytes = st->sb.block_count * PLX_BLOCK_SIZE;
    out->extent_size = eb * PLX_BLOCK_SIZE;
    out->extent_count = st->sb.extent_count;
    out->vdi_slots = 0; /* version 2: no fixed number (the field is kept for the API) */
    snprintf(out->lockd_addr, sizeof out->lockd_addr, "%s", st->state.lockd_addr);
    for (uint64_t e = 0; e < st->sb.extent_count && !rc; e++) {
        unsigned t = st->cat[e].type;
        out->extents_by_type[t]++;
        if (t == PLX_EXTENT_SYSTEM)
            continue; /* counted below, from the registry */
        if (t == PLX_EXTENT_UNUSED) {
            out->blocks_free_by_type[t] += eb;
            continue;
        }
        uint64_t fr = 0;
        rc = plx_extent_free(st, e, &fr);
        out->blocks_free_by_type[t] += fr;
        out->blocks_used_by_type[t] += eb - fr;
    }
    if (rc)
        return rc;
    rc = plx_registry_each(st, 0, count_live, &out->vdi_count);
    if (rc)
        return rc;
    /* System extent: superblock, state, catalogue, and the legacy registry slots of a store
     * upgraded from version 1 (VDI records now live in metadata extents). */
    uint64_t legacy = st->state.registry_used;
    out->blocks_used_by_type[PLX_EXTENT_SYSTEM] = st->sb.registry_start + legacy;
    out->blocks_free_by_type[PLX_EXTENT_SYSTEM] = eb - st->sb.registry_start - legacy;
    struct plx_gc_report gr;
    rc = plx_gc(st, 1, &gr);
    for (int t = 0; !rc && t < 4; t++)
        out->blocks_unreachable_by_type[t] = gr.freed_by_type[t];
    if (rc == -EUCLEAN) {
        /* A corrupt tree: what it reaches is unknown. The rest of the report stands. */
        for (int t = 0; t < 4; t++)
            out->blocks_unreachable_by_type[t] = PLX_UNKNOWN;
        rc = 0;
    }
    return rc;
}
