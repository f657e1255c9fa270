/*
 * backend_done.h - what every backend has the same: the completion eventfd and the queue of
 * finished I/Os that waits in it for poll() to run their callbacks (backend_done.c).
 *
 * The contract (parallax_backend.h) has a backend call io->done only from inside poll(), and
 * keep its fd readable while poll() has something to deliver. So a backend that finishes an
 * I/O (a kernel completion, a SCSI response, a memory copy) puts it on a queue and makes an
 * eventfd readable, and its poll() drains the eventfd, takes the queue and runs the callbacks.
 * A backend embeds a struct plx_done in its per-I/O state and keeps its own policy of when to
 * signal (the file backend skips reads of an eventfd it knows to be 0): these are the parts,
 * with the clock of a poll() that waits (plx_poll_deadline, plx_poll_wait).
 */
#ifndef PLX_BACKEND_DONE_H
#define PLX_BACKEND_DONE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* A finished (or waiting) I/O: the link a backend's per-I/O state embeds. The same link serves
 * the backend's other lists (waiting for a slot, held, retried) while the I/O is not finished. */
struct plx_done {
    struct plx_done *next;
    struct plx_io *io;
    int status; /* 0 or -errno, for io->done */
};

/* A first-in first-out list of them. */
struct plx_done_list {
    struct plx_done *head, *tail;
};

static inline void plx_done_push(struct plx_done_list *l, struct plx_done *d)
{
    d->next = NULL;
    if (l->tail != NULL)
        l->tail->next = d;
    else
        l->head = d;
    l->tail = d;
}

static inline struct plx_done *plx_done_pop(struct plx_done_list *l)
{
    struct plx_done *d = l->head;
    if (d != NULL) {
        l->head = d->next;
        if (l->head == NULL)
            l->tail = NULL;
        d->next = NULL;
    }
    return d;
}

/* The whole list, leaving l empty. */
static inline struct plx_done_list plx_done_take(struct plx_done_list *l)
{
    struct plx_done_list all = *l;
    l->head = l->tail = NULL;
    return all;
}

/* The completion eventfd: nonblocking, close-on-exec. Returns it, or -errno. */
int plx_efd_open(void);
/* Make it readable. Safe from any thread. EAGAIN means the counter is saturated, which still
 * reads as readable. */
void plx_efd_signal(int efd);
/* Make it not readable (a read takes the whole count: not EFD_SEMAPHORE; a second read would
 * only find a signal that came after the first, whose work the caller's reap finds anyway). */
void plx_efd_drain(int efd);
/* plx_efd_drain, returning the count it took (0: nothing was signalled). */
uint64_t plx_efd_take(int efd);

/* The eventfd and the finished I/Os, for a backend whose eventfd is readable exactly while
 * `ready` is not empty (plx_done_finish and plx_done_deliver keep it so). */
struct plx_done_queue {
    int efd;
    struct plx_done_list ready;
};

/* Open q's eventfd, with an empty queue. 0 or -errno. */
int plx_done_open(struct plx_done_queue *q);
/* Close q's eventfd (what is still queued is the caller's to free). */
void plx_done_close(struct plx_done_queue *q);
/* d's I/O finished with status: queue it for poll (signals when the queue was empty). */
void plx_done_finish(struct plx_done_queue *q, struct plx_done *d, int status);
/* From poll(): run the callbacks of what is queued now (not what they queue: a callback that
 * resubmits cannot keep poll() going), in order. Before each callback, release(arg, d) gives the
 * backend its I/O back (free d, count it out of the in-flight ones); d is not touched after.
 * Returns how many ran. What the callbacks queued was queued on an empty queue, which
 * plx_done_finish signals; a backend that queues without signalling signals itself after. */
int plx_done_deliver(struct plx_done_queue *q, void (*release)(void *arg, struct plx_done *d),
                     void *arg);

/* A backend's poll(timeout_ms) that waits: its deadline (CLOCK_MONOTONIC, ms; 0 when
 * timeout_ms is not positive), and how long it may wait now for its fd: -1 for ever (timeout_ms
 * negative), else the milliseconds left, 0 when none are (it returns). */
int64_t plx_poll_deadline(int timeout_ms);
int plx_poll_wait(int timeout_ms, int64_t deadline);

#endif
