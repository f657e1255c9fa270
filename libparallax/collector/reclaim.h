/*
 * reclaim.h - the holder's side of collecting garbage in held extents (layer 6, reclaim.c):
 * answering a collector's requests and folding what it published into this process's
 * allocator (DESIGN.md, "Space comes back while hosts serve"; FORMAT.md §6.1).
 */
#ifndef PLX_RECLAIM_H
#define PLX_RECLAIM_H

#include "engine.h"

/* Start looking for collectors' requests (every $PARALLAX_RECLAIM_POLL_MS, default 1000 ms;
 * 0: never) in a store opened for writing. A failure to set up only leaves it off. */
void plx_reclaim_init(plx_store *st);
/* No new reclaim I/O from now on (close: the I/O in flight is drained by the caller). */
void plx_reclaim_stop(plx_store *st);
void plx_reclaim_free(plx_store *st);

#endif
