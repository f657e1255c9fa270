/*
 * vdi_io.h - a VDI's requests straight into the pipeline, without the write cache (vdi_io.c):
 * below both vdi.c, whose public plx_vdi_submit_* route here when a VDI's cache is off, and
 * wlog.c, whose drain writes through here.
 */
#ifndef PLX_VDI_IO_H
#define PLX_VDI_IO_H

#include "pipeline.h"

int plx_vdi_direct_read(plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb, void *arg);
int plx_vdi_direct_write(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags,
                         plx_done_fn cb, void *arg);
int plx_vdi_direct_flush(plx_vdi *v, plx_done_fn cb, void *arg);
int plx_vdi_direct_trim(plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg);
int plx_vdi_direct_snapshot(plx_vdi *v, const char *label, uint64_t *index_out, plx_done_fn cb,
                            void *arg);

/* -EINVAL (with the message set) when off+len lies beyond the VDI's end. */
int plx_vdi_range_check(plx_vdi *v, uint64_t off, uint64_t len);
/* A request of v for cb(arg), not yet submitted; NULL when out of memory. */
struct plx_req *plx_vdi_req_new(plx_vdi *v, enum plx_req_op op, uint64_t off, uint64_t len,
                                plx_done_fn cb, void *arg);

#endif
