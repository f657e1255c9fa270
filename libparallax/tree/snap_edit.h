/*
 * snap_edit.h - labelling and deleting snapshots of an open VDI, checking a new snapshot's label
 * and folding the log's tail into the label index, as requests in its stream (layer 5, above
 * pipeline.c, which starts an edit through the request's edit_start; snap_edit.c).
 */
#ifndef PLX_SNAP_EDIT_H
#define PLX_SNAP_EDIT_H

#include "pipeline.h"

enum plx_snap_edit_kind {
    PLX_EDIT_CHECK_LABEL, /* is `label` free? queued just ahead of the snapshot that wants it */
    PLX_EDIT_LABEL,       /* set (or clear, with "") the label of snapshot `index` */
    PLX_EDIT_DELETE,      /* mark snapshot `index` deleted */
    PLX_EDIT_FOLD,        /* put the labels of the log's tail into the label index */
};

/* A REQ_SNAPEDIT request for v; NULL when out of memory. Submit it with plx_req_submit. */
struct plx_req *plx_snap_edit_new(struct plx_vdi *v, enum plx_snap_edit_kind kind, uint64_t index,
                                  const char *label, plx_done_fn cb, void *arg);
/* A PLX_EDIT_CHECK_LABEL request for the snapshot request `snap`, to be submitted right before
 * it: when the label is taken (or cannot be looked up), snap gets that status and fails
 * without running (the pipeline finishes a request whose status is set). */
struct plx_req *plx_snap_edit_check_new(struct plx_vdi *v, const char *label, struct plx_req *snap);
#endif
