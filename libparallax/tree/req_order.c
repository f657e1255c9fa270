/*
 * req_order.c - the order of a VDI's requests (layer 5, below pipeline.c; req_order.h): the
 * active list in submission order, the list of those waiting for a range, the busy filter, and
 * whether a request may start given the ones before it (plx_may_start).
 */
#include <stdint.h>
#include "pipeline.h"
#include "req_order.h"

/* ---- Active list and conflicts ------------------------------------------------------------ */

bool plx_vdi_idle(const struct plx_vdi *v)
{
    return !v->active_head && !v->open && !v->flight && !v->flight_next && !v->start_queued;
}

uint64_t plx_vdi_next_seq(const struct plx_vdi *v)
{
    return v->next_seq;
}

bool plx_vdi_finished_before(const struct plx_vdi *v, uint64_t seq)
{
    /* The active list is in submission order: its head is the oldest request not finished. */
    return !v->active_head || v->active_head->seq >= seq;
}

unsigned plx_vdi_active_before(const struct plx_vdi *v, uint64_t seq)
{
    unsigned n = 0;
    for (const struct plx_req *r = v->active_head; r && r->seq < seq; r = r->next)
        n++;
    return n;
}

uint64_t plx_vdi_oldest_write_ns(const struct plx_vdi *v)
{
    for (const struct plx_req *r = v->active_head; r; r = r->next)
        if (is_write(r))
            return r->submit_ns;
    return 0;
}

/* r enters RQ_WAIT_RANGE: into the waiting list, in request order (a reload puts requests
 * back, so not always at the tail). */
void plx_wait_add(struct plx_vdi *v, struct plx_req *r)
{
    struct plx_req *after = v->wait_tail;
    while (after && after->seq > r->seq)
        after = after->wprev;
    r->wprev = after;
    r->wnext = after ? after->wnext : v->wait_head;
    if (r->wnext)
        r->wnext->wprev = r;
    else
        v->wait_tail = r;
    if (after)
        after->wnext = r;
    else
        v->wait_head = r;
    r->blocker = NULL;
    v->wait_gen++;
}

void plx_wait_remove(struct plx_vdi *v, struct plx_req *r)
{
    if (r->wprev)
        r->wprev->wnext = r->wnext;
    else
        v->wait_head = r->wnext;
    if (r->wnext)
        r->wnext->wprev = r->wprev;
    else
        v->wait_tail = r->wprev;
    r->wnext = r->wprev = NULL;
    if (r->blocker)
        r->blocker->nblocked--;
    r->blocker = NULL;
    v->wait_gen++;
}

/* Requests that may conflict over a range of blocks (plx_may_start). */
static bool has_range(const struct plx_req *r)
{
    return r->op == REQ_READ || r->op == REQ_WRITE || r->op == REQ_TRIM || r->op == REQ_STATUS;
}

static unsigned busy_slot(uint64_t b)
{
    return (unsigned)((b * 0x9E3779B97F4A7C15ull) >> 52) & (PLX_BUSY_SLOTS - 1);
}

/* r becomes active (d = 1) or stops being active (d = -1): the busy filter. */
void plx_busy_count(struct plx_vdi *v, struct plx_req *r, int d)
{
    if (!has_range(r))
        return;
    if (d > 0)
        r->busy_counted = r->b1 - r->b0 <= PLX_BUSY_MAX_BLOCKS;
    if (!r->busy_counted) {
        v->nwide += (unsigned)d;
        return;
    }
    for (uint64_t b = r->b0; b < r->b1; b++)
        v->busy[busy_slot(b)] += (uint32_t)d;
}

void plx_active_remove(struct plx_vdi *v, struct plx_req *r)
{
    if (r->state == RQ_WAIT_RANGE)
        plx_wait_remove(v, r);
    plx_busy_count(v, r, -1);
    v->nsnap -= r->op == REQ_SNAPSHOT;
    if (r->nblocked) {
        /* The requests it blocked may start now: the kick asks them again. */
        for (struct plx_req *w = v->wait_head; w; w = w->wnext)
            if (w->blocker == r)
                w->blocker = NULL;
        r->nblocked = 0;
        if (v->kicking)
            v->kick_again = true;
    }
    if (r->prev)
        r->prev->next = r->next;
    else
        v->active_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        v->active_tail = r->prev;
    r->next = r->prev = NULL;
}

/* May r start, given the earlier active requests? When it may not because its range overlaps
 * an earlier request's, *blocker is that request (it stays in the way while it is active). */
bool plx_may_start(const struct plx_vdi *v, const struct plx_req *r, struct plx_req **blocker)
{
    if (v->needs_reload)
        return false;
    if (r->busy_counted && !v->nsnap && !v->nwide) {
        /* Without a snapshot active only a range can be in the way (flushes and snapshot edits
         * are passed), and no other active request has a block of r's in its range when every
         * counter of r's blocks is r's alone. Otherwise the walk decides. */
        uint64_t b = r->b0;
        while (b < r->b1 && v->busy[busy_slot(b)] == 1)
            b++;
        if (b == r->b1)
            return true;
    }
    for (const struct plx_req *e = v->active_head; e && e != r; e = e->next) {
        if (r->op == REQ_SNAPEDIT || e->op == REQ_SNAPEDIT) {
            /* Edits of snapshot records and snapshots both rewrite log blocks: one at a time, in
             * request order (a snapshot stays active until its batch has finished). Reads and
             * writes pass edits. */
            if ((r->op == REQ_SNAPEDIT || r->op == REQ_SNAPSHOT) &&
                (e->op == REQ_SNAPEDIT || e->op == REQ_SNAPSHOT))
                return false;
            continue;
        }
        if (r->op == REQ_SNAPSHOT) {
            /* Everything before the snapshot must be in the tree it freezes: applied in memory,
             * not necessarily written. The snapshot's record is written after their data anyway
             * (its batch comes after theirs or is theirs, and a batch's commit waits for its
             * members' data); a data write that fails after the swap fails the snapshot
             * (fail_snapshots_after). */
            if (is_write(e) && !mutated(e))
                return false;
            if (e->op == REQ_SNAPSHOT && !mutated(e))
                return false;
            continue;
        }
        if (e->op == REQ_SNAPSHOT) {
            if (is_write(r) && !mutated(e))
                return false;
            continue;
        }
        if (e->op == REQ_FLUSH || r->op == REQ_FLUSH)
            continue;
        if (!is_write(r) && !is_write(e))
            continue;
        if (e->b0 < r->b1 && r->b0 < e->b1) {
            *blocker = (struct plx_req *)(uintptr_t)e;
            return false;
        }
    }
    return true;
}
