/*
 * req_order.h - the order of a VDI's requests (layer 5, below pipeline.c; req_order.c): the
 * active list (submission order), the requests waiting for a range, the busy filter, and
 * whether a request may start. The lists and counters are struct plx_vdi's (pipeline.h).
 */
#ifndef PLX_REQ_ORDER_H
#define PLX_REQ_ORDER_H

#include <stdbool.h>
#include "pipeline.h"

static inline bool is_write(const struct plx_req *r)
{
    return r->op == REQ_WRITE || r->op == REQ_TRIM;
}

/* r has applied its change to the in-memory tree (or needed none). */
static inline bool mutated(const struct plx_req *r)
{
    return r->state == RQ_IO || r->state == RQ_WAIT_BATCH || r->state == RQ_DONE;
}

/* r enters RQ_WAIT_RANGE: into the waiting list, in request order. */
void plx_wait_add(struct plx_vdi *v, struct plx_req *r);
/* r leaves the waiting list. */
void plx_wait_remove(struct plx_vdi *v, struct plx_req *r);
/* r becomes active (d = 1) or stops being active (d = -1): the busy filter. */
void plx_busy_count(struct plx_vdi *v, struct plx_req *r, int d);
/* r is finished: out of the active list (and the waiting list, the busy filter). */
void plx_active_remove(struct plx_vdi *v, struct plx_req *r);
/* May r start, given the earlier active requests? When it may not because its range overlaps
 * an earlier request's, *blocker is that request (it stays in the way while it is active). */
bool plx_may_start(const struct plx_vdi *v, const struct plx_req *r, struct plx_req **blocker);

#endif
