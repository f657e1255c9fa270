/*
 * aio_ring.h - reading a Linux aio context's completion ring from user space (aio_ring.c).
 *
 * An io_context_t is the address of the ring the kernel maps into the process: a header (head,
 * tail, size, a magic number) and the completed events. While no one else reaps the context,
 * the owner may take events from it without io_getevents: a system call per poll saved, and none
 * at all for a poll that finds nothing. Only a ring whose header says it is the layout this
 * reader knows is read; else (another kernel, another libaio) the caller keeps io_getevents.
 */
#ifndef PLX_AIO_RING_H
#define PLX_AIO_RING_H

#include <libaio.h>
#include <stdbool.h>

/* The kernel's struct aio_ring (fs/aio.c), the header of the mapping ctx points at. */
struct plx_aio_ring {
    unsigned id;
    unsigned nr;   /* events the ring holds */
    unsigned head; /* next event to take: the reader moves it */
    unsigned tail; /* next event the kernel writes: it moves it */
    unsigned magic;
    unsigned compat_features;
    unsigned incompat_features;
    unsigned header_length; /* sizeof this header: the events follow it */
    struct io_event events[];
};

/* ctx's ring if this reader may read it (the magic and layout it knows), else NULL. */
struct plx_aio_ring *plx_aio_ring_of(io_context_t ctx);
/* Take up to max completed events into ev; returns how many (0: none ready). Only the context's
 * one reaper may call it, and that reaper must not call io_getevents on it as well. */
int plx_aio_ring_reap(struct plx_aio_ring *r, struct io_event *ev, int max);
/* Whether the ring holds no completed event now. */
bool plx_aio_ring_empty(const struct plx_aio_ring *r);

#endif
