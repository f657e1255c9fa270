/*
 * snaplog.h - snapshot logs: read, resolve "VDI@N" and "VDI@LABEL", labels (layer 4, above the
 * registry; snaplog.c).
 */
#ifndef PLX_SNAPLOG_H
#define PLX_SNAPLOG_H

#include "engine.h"

/* Read the log chain of a VDI: records 1..snap_count (newer records are an incomplete snapshot
 * and are ignored). *out malloc'd. */
int plx_snaplog_read(plx_store *st, const struct plx_vdi_record *rec, struct plx_snap_info **out,
                     size_t *count, uint64_t **blocks);
int plx_snaplog_read_block(plx_store *st, uint64_t addr, uint64_t vdi_id,
                           struct plx_snaplog_block *out);
/* Parse "VDI@N" or "VDI@LABEL". */
int plx_snap_resolve(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                     uint64_t *slot_addr, struct plx_snap_info *snap, uint64_t *log_block);
/* Is `label` acceptable as a snapshot label (length, characters)? 0 or -EINVAL with a message. */
int plx_label_check(plx_store *st, const char *label);

#endif
