/*
 * aio_ring.c - a Linux aio context's completion ring read from user space (aio_ring.h).
 *
 * The kernel writes an event, then publishes it by moving tail (with a write barrier between);
 * the reader loads tail with acquire order, copies the events from head up to it, and publishes
 * its progress by storing head with release order, which the kernel reads to know the slots
 * are free again. This is the same contract io_getevents keeps under the ring's lock; with a
 * single reaper in user space there is no one to lock against.
 */
#include <stddef.h>

#include "aio_ring.h"

#define PLX_AIO_RING_MAGIC 0xa10a10a1u

struct plx_aio_ring *plx_aio_ring_of(io_context_t ctx)
{
    struct plx_aio_ring *r = (struct plx_aio_ring *)(void *)ctx;
    if (r == NULL || r->magic != PLX_AIO_RING_MAGIC || r->incompat_features != 0 ||
        r->header_length != sizeof(struct plx_aio_ring) || r->nr == 0 || r->head >= r->nr ||
        r->tail >= r->nr)
        return NULL;
    return r;
}

bool plx_aio_ring_empty(const struct plx_aio_ring *r)
{
    return __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) == r->head;
}

int plx_aio_ring_reap(struct plx_aio_ring *r, struct io_event *ev, int max)
{
    unsigned tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    unsigned head = r->head, nr = r->nr;
    int n = 0;
    if (tail >= nr)
        return 0; /* (never: the kernel keeps it below nr) */
    while (head != tail && n < max) {
        ev[n++] = r->events[head];
        head = head + 1 == nr ? 0 : head + 1;
    }
    if (n)
        __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    return n;
}
