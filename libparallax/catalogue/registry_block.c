/*
 * registry_block.c - the blocks the registry is built of (registry_block.h): read one and check
 * its seal, write a new one, make new ones durable before anything links them.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "cache.h"
#include "registry_block.h"
#include "system.h"

int plx_registry_block_read(plx_store *st, uint64_t addr, uint32_t magic, void *block,
                            const char *what)
{
    bool ok = addr != 0 && addr < st->sb.block_count;
    /* Another process may have typed the extent since we read the catalogue: read it again. */
    if (ok && plx_block_type(st, addr) != PLX_EXTENT_METADATA) {
        int crc = plx_catalogue_read(st);
        if (crc)
            return crc;
        ok = plx_block_type(st, addr) == PLX_EXTENT_METADATA;
    }
    if (!ok)
        return plx_err(st, -EUCLEAN, "%s %llu is corrupt: not a metadata block", what,
                       (unsigned long long)addr);
    int rc = plx_sync_io(st, PLX_IO_READ, addr, 1, block, 0);
    if (rc)
        return plx_err(st, rc, "reading %s %llu: %s", what, (unsigned long long)addr,
                       strerror(-rc));
    if (magic == 0) /* a name index block: node or bucket */
        magic = ((const struct plx_blkhdr *)block)->magic == PLX_MAGIC_NAMEBKT ? PLX_MAGIC_NAMEBKT
                                                                               : PLX_MAGIC_NAMEIDX;
    const char *why = "";
    rc = plx_blkhdr_verify(block, magic, addr, &why);
    if (rc)
        return plx_err(st, -EUCLEAN, "%s %llu is corrupt: %s", what, (unsigned long long)addr,
                       rc == -ENODATA ? "empty" : why);
    return 0;
}

int plx_registry_new_block(plx_store *st, void *block, uint32_t magic, uint64_t *addr)
{
    int rc = plx_alloc_blocks(st, PLX_EXTENT_METADATA, 1, addr);
    if (rc < 0)
        return rc;
    /* The block may have been a radix node that a collection freed: never serve that copy. */
    struct plx_node *stale = plx_cache_lookup(st, *addr);
    if (stale && !stale->pins)
        plx_cache_drop(st, stale);
    plx_blkhdr_seal(block, magic, *addr);
    rc = plx_sync_io(st, PLX_IO_WRITE, *addr, 1, block, 0);
    if (rc)
        return plx_err(st, rc, "writing registry block %llu: %s", (unsigned long long)*addr,
                       strerror(-rc));
    return 0;
}

int plx_registry_durable(plx_store *st)
{
    int rc = plx_wait_alloc_written(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (rc)
        return plx_err(st, rc, "making registry blocks durable: %s", strerror(-rc));
    return 0;
}
