/*
 * vdi.h - VDI handles (layer 6; vdi.c): open, close, and the asynchronous entry points of
 * parallax.h; struct plx_vdi itself is the pipeline's (pipeline.h).
 */
#ifndef PLX_VDI_H
#define PLX_VDI_H

#include "pipeline.h"

/* Close every VDI handle of the store (at store close). */
int plx_vdi_close_all(plx_store *st);
/* Drop the asynchronous opens not yet completed (their callbacks never run): store close. */
void plx_vdi_open_cancel_all(plx_store *st);

#endif
