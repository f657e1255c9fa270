/*
 * vdi.h - VDI handles (layer 6; vdi.c): open, close, and the asynchronous entry points of
 * parallax.h; struct plx_vdi itself is the pipeline's (pipeline.h).
 */
#ifndef PLX_VDI_H
#define PLX_VDI_H

#include "pipeline.h"

/* The entry points without the write cache: straight into the pipeline (the public
 * plx_vdi_submit_* route a VDI whose cache is on to wlog.c, whose drain uses these). */
int plx_vdi_direct_read(plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                        void *arg);
int plx_vdi_direct_write(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags,
                         plx_done_fn cb, void *arg);
int plx_vdi_direct_flush(plx_vdi *v, plx_done_fn cb, void *arg);
int plx_vdi_direct_trim(plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg);
int plx_vdi_direct_snapshot(plx_vdi *v, const char *label, uint64_t *index_out, plx_done_fn cb,
                            void *arg);

/* Close every VDI handle of the store (at store close). */
int plx_vdi_close_all(plx_store *st);

#endif
