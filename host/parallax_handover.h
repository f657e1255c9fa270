/*
 * parallax_handover.h - waiting for a VDI that another process holds for writing (a guest
 * migrating to this host, whose source still runs): the tries of its open and how long they go
 * on. `parallax serve` (server/nbd_handover.c) and tapdisk's driver (tapdisk/block-parallax.c)
 * wait this way, each on its own loop and timer. Copied into a blktap tree with the control
 * socket (parallax_control.h says why the name).
 */
#ifndef PLX_HANDOVER_H
#define PLX_HANDOVER_H

#include <stdint.h>

#include "parallax.h"

/* How long a handover may take before the waiting requests fail: $PARALLAX_HANDOVER_WAIT
 * seconds, default 60 (libxl gives a migrating guest's disks about as long). */
uint64_t handover_wait_ns(void);

/* The tries of one VDI's open, one at a time, each asynchronous (plx_vdi_open_async): with the
 * lock manager slow or gone, a try waits on the loop while the host serves its other disks. */
struct handover_try {
    plx_store *st;
    plx_open_req *req; /* a try in progress */
    int done;          /* a try has reported: rc, v, not yet taken by handover_try_step */
    int rc;
    plx_vdi *v;
    char err[512]; /* the engine's message when a try failed */
};

/* From the host's retry timer, outside the store's service pass: start a try of the open of
 * `name` in t->st, or take the result of the one that reported. Returns 1 while a try runs;
 * else 0, with the try's result in *rc and *v (the handle, when *rc is 0). */
int handover_try_step(struct handover_try *t, const char *name, int *rc, plx_vdi **v);
/* Whether a try that ended with rc, waited_ns after the wait began, leaves the host waiting:
 * the VDI is held by the source still, or the lock manager does not answer (it may come back
 * within the wait). */
int handover_keep_waiting(int rc, uint64_t waited_ns);

#endif
