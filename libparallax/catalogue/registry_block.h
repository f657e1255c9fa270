/*
 * registry_block.h - the blocks the registry is built of (layer 4, below the registry itself):
 * VDI-table blocks, name-index nodes and buckets (FORMAT.md §7). registry.c, vditab.c and
 * nameidx.c all read, write and order them the same way, so that way lives once, here.
 */
#ifndef PLX_REGISTRY_BLOCK_H
#define PLX_REGISTRY_BLOCK_H

#include "engine.h"

/* Allocate a metadata block, seal `block` as `magic` at its address and write it (not flushed:
 * plx_registry_durable makes it and its claim durable before anything links it). */
int plx_registry_new_block(plx_store *st, void *block, uint32_t magic, uint64_t *addr);
int plx_registry_durable(plx_store *st);
/* Read a registry block (table, index node or bucket) of metadata extent: `magic` expected
 * (0: a name-index node or bucket, whichever it is). */
int plx_registry_block_read(plx_store *st, uint64_t addr, uint32_t magic, void *block,
                            const char *what);

#endif
