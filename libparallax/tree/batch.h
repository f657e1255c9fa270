/*
 * batch.h - the batches that commit a VDI's changes in order (layer 5, below pipeline.c, above
 * cow.c; batch.c). struct plx_batch is pipeline.h's; a batch tells the request stream above it
 * that a member finished and that the stream may go on through the callbacks it was opened with.
 */
#ifndef PLX_BATCH_H
#define PLX_BATCH_H

#include <stdbool.h>
#include <stdint.h>
#include "pipeline.h"

/* Images of every node the batch changed, captured as the batch starts flying. */
struct node_image {
    uint64_t addr;
    bool stage_a;
    bool rewrite; /* patched after its stage-A write was issued: write it again before FLUSH */
    uint8_t *buf;
};

/* $PARALLAX_SNAP_TRACE: when the batch reached a phase (struct plx_snap_trace). */
static inline void btrace(struct plx_batch *b, enum plx_batch_trace at)
{
    if (b->v->st->snap_trace)
        b->trace[at] = plx_mono_ns();
}

static inline struct node_image *images_of(struct plx_batch *b)
{
    return (struct node_image *)b->images;
}

/* v's open batch, opened now if there is none (NULL: out of memory). `finish` finishes a request
 * that waited for the batch once it is over; `kick` lets the stream go on after it (and after a
 * reload of the tree when it failed). */
struct plx_batch *plx_batch_open(struct plx_vdi *v, void (*finish)(struct plx_req *r),
                                 void (*kick)(struct plx_vdi *v));
/* r completes with batch b (RQ_WAIT_BATCH). */
void plx_batch_wait(struct plx_batch *b, struct plx_req *r);
/* The state machine of a flying batch; called whenever something it waits for finished. */
void plx_batch_advance(struct plx_vdi *v, struct plx_batch *b);
/* Start the open batch flying when the batches in flight allow it. */
void plx_batch_maybe_start(struct plx_vdi *v);
/* Start it so at the end of this service pass (or the next one, called outside a pass): the
 * requests a host hands in together share it. The VDI is not idle while the start is queued. */
void plx_batch_start_soon(struct plx_vdi *v);

#endif
