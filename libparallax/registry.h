/*
 * registry.h - VDI records: read, write, seal, find, scan, and what the public API shows of them
 * (layer 4; registry.c).
 */
#ifndef PLX_REGISTRY_H
#define PLX_REGISTRY_H

#include "engine.h"

int plx_registry_read(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec);
int plx_registry_write(plx_store *st, uint64_t slot_addr, const struct plx_vdi_record *rec);
void plx_registry_seal(struct plx_vdi_record *rec, uint64_t slot_addr, void *block);
/* Find a live VDI by name or id (from disk). Returns slot address or -ENOENT. */
int plx_registry_find(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                      uint64_t *slot_addr);
int plx_registry_scan(plx_store *st, struct plx_vdi_record **recs, uint64_t **slots, size_t *n);
void plx_record_to_info(const plx_store *st, const struct plx_vdi_record *rec,
                        struct plx_vdi_info *out);
unsigned plx_height_for_size(uint64_t size);
bool plx_all_digits(const char *s);

#endif
