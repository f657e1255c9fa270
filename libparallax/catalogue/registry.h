/*
 * registry.h - the VDI registry (layer 4): VDI records, the VDI table that finds a record by id
 * (vditab.c) and the name index that finds ids by name (nameidx.c); FORMAT.md §7.
 *
 * Changes (create, delete, purge, upgrade) are made under the admin lock from fresh reads. Look-
 * ups read the medium without it: every change is a single-block write in place or new blocks
 * linked by one such write, so a reader sees the registry before or after it.
 */
#ifndef PLX_REGISTRY_H
#define PLX_REGISTRY_H

#include "engine.h"
#include "registry_block.h"

/* ---- Records (registry.c) ---- */
int plx_registry_read(plx_store *st, uint64_t rec_addr, struct plx_vdi_record *rec);
int plx_registry_write(plx_store *st, uint64_t rec_addr, const struct plx_vdi_record *rec);
void plx_registry_seal(struct plx_vdi_record *rec, uint64_t rec_addr, void *block);
/* Find a live VDI by name, else by decimal id (re-reads the state block). -ENOENT if none. */
int plx_registry_find(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                      uint64_t *rec_addr);
/* 0 when no live process holds rec's VDI open for writing (no writer lock, or its holder is
 * gone), else -EBUSY with the message "VDI NAME is open for writing (pid N)" and `then` after
 * it (what the user may do instead: "" for nothing). The admin changes that refuse a VDI a
 * writer holds ask this under the admin lock. */
int plx_record_unwritten(plx_store *st, const struct plx_vdi_record *rec, const char *then);
/* The record of VDI `id`, deleted or not (uses st->state as read). -ENOENT if none. */
int plx_registry_get(plx_store *st, uint64_t id, struct plx_vdi_record *rec, uint64_t *rec_addr);
/* Every VDI with id > after_id, in id order, deleted ones included (re-reads the state block).
 * fn returning nonzero stops the walk and is returned. Reads the records it visits and the table
 * blocks above them, nothing else. */
typedef int (*plx_registry_fn)(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr);
int plx_registry_each(plx_store *st, uint64_t after_id, plx_registry_fn fn, void *arg);
/* Link a new record (id = st->state.next_vdi_id, not yet counted) into the table and the name
 * index. The caller then writes the state block with next_vdi_id + 1, which makes it a VDI. */
int plx_registry_link(plx_store *st, const struct plx_vdi_record *rec, uint64_t rec_addr);
/* A deleted VDI leaves the name index (its record stays, flagged, until purged). */
int plx_registry_unname(plx_store *st, const struct plx_vdi_record *rec);
/* A deleted VDI leaves the registry: out of the name index and the table. */
int plx_registry_purge(plx_store *st, const struct plx_vdi_record *rec);
/* Version 1 -> 2 (registry_upgrade.c): link every legacy record into a new VDI table and name
 * index, durable, with the roots in st->state for the caller's state write. Under the admin
 * lock; -EBUSY (nothing written) while a live process holds a VDI or an extent. */
int plx_registry_upgrade(plx_store *st);
/* Is rec_addr a legacy registry slot of a store upgraded from version 1? */
bool plx_registry_legacy_slot(const plx_store *st, uint64_t rec_addr);
void plx_record_to_info(const plx_store *st, const struct plx_vdi_record *rec,
                        struct plx_vdi_info *out);
unsigned plx_height_for_size(uint64_t size);
bool plx_all_digits(const char *s);

/* ---- VDI table: id -> record block (vditab.c) ---- */
/* *rec_addr = the table's entry for id (0 = none). */
int plx_vditab_get(plx_store *st, uint64_t id, uint64_t *rec_addr);
/* Set the entry for id (under the admin lock); *old (may be NULL) = what it was. May grow the
 * table: new blocks are made durable before the write that links them; a new root or height is
 * in st->state, for the caller's state write. */
int plx_vditab_set(plx_store *st, uint64_t id, uint64_t rec_addr, uint64_t *old);
/* Walk the table in id order from after_id + 1 up to next_vdi_id - 1. `block` (may be NULL) sees
 * every table block read, `entry` every non-zero entry. A nonzero return stops the walk. */
int plx_vditab_walk(plx_store *st, uint64_t after_id, int (*block)(void *arg, uint64_t addr),
                    int (*entry)(void *arg, uint64_t id, uint64_t rec_addr), void *arg);

/* ---- Name index: name hash -> ids (nameidx.c) ---- */
uint64_t plx_name_hash(const char *name);
/* Up to `max` ids whose entry has this hash, into ids; *n = how many. */
int plx_nameidx_lookup(plx_store *st, uint64_t hash, uint64_t *ids, size_t max, size_t *n);
int plx_nameidx_insert(plx_store *st, uint64_t hash, uint64_t id);
/* Remove the entry (hash, id), if there is one. */
int plx_nameidx_remove(plx_store *st, uint64_t hash, uint64_t id);
/* Every block of the index (nodes and buckets, each once) and every entry. */
int plx_nameidx_walk(plx_store *st, int (*block)(void *arg, uint64_t addr, const void *blk),
                     void *arg);

#endif
