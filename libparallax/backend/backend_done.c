/*
 * backend_done.c - the completion eventfd and the queue of finished I/Os every backend has, and
 * the clock of a poll() that waits (backend_done.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>

#include "backend_done.h"
#include "clock.h"

int plx_efd_open(void)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return efd >= 0 ? efd : -errno;
}

void plx_efd_signal(int efd)
{
    uint64_t one = 1;
    if (write(efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        perror("parallax: eventfd write");
}

void plx_efd_drain(int efd)
{
    (void)plx_efd_take(efd);
}

uint64_t plx_efd_take(int efd)
{
    uint64_t v;
    if (read(efd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        return 0; /* EAGAIN: nothing signalled */
    return v;
}

int64_t plx_poll_deadline(int timeout_ms)
{
    return timeout_ms > 0 ? (int64_t)(plx_mono_ns() / 1000000) + timeout_ms : 0;
}

int plx_poll_wait(int timeout_ms, int64_t deadline)
{
    if (timeout_ms <= 0)
        return -1;
    int64_t left = deadline - (int64_t)(plx_mono_ns() / 1000000);
    return left > 0 ? (int)left : 0;
}

int plx_done_open(struct plx_done_queue *q)
{
    q->ready.head = q->ready.tail = NULL;
    q->efd = plx_efd_open();
    return q->efd < 0 ? q->efd : 0;
}

void plx_done_close(struct plx_done_queue *q)
{
    if (q->efd >= 0)
        close(q->efd);
    q->efd = -1;
}

void plx_done_finish(struct plx_done_queue *q, struct plx_done *d, int status)
{
    d->status = status;
    if (q->ready.head == NULL)
        plx_efd_signal(q->efd);
    plx_done_push(&q->ready, d);
}

int plx_done_deliver(struct plx_done_queue *q, void (*release)(void *arg, struct plx_done *d),
                     void *arg)
{
    struct plx_done_list ready = plx_done_take(&q->ready);
    int n = 0;
    struct plx_done *d;
    while ((d = plx_done_pop(&ready)) != NULL) {
        struct plx_io *io = d->io;
        int status = d->status;
        release(arg, d);
        n++;
        io->done(io, status);
    }
    return n;
}
