/*
 * slab.h - fixed-size objects in chunks of their own, outside the process's malloc heap.
 *
 * Why: the write log keeps a few small objects per record (its batch, the batch's record
 * array, index entries) until the record is drained, seconds later. In a process whose
 * caller allocates each request's buffer with malloc and frees it once answered (tapdisk's
 * NBD server: posix_memalign(512, len) per request), those small objects, taken from malloc,
 * land in the freed 1 MiB buffers and split them; the next buffer no longer fits and the heap
 * grows by a fresh 1 MiB (page faults and the kernel's zeroing, on the thread that receives
 * the data) for every request of a fresh process's first burst, and keeps that memory for
 * good (bench/notes/wcache.md, "Through tapdisk": 200,000 minor faults and 800 MB more resident in
 * the first 768 MiB burst). Objects from a slab never touch the heap.
 *
 * A slab hands out objects of one size from chunks of PLX_SLAB_CHUNK bytes mapped anonymously
 * (pages are touched, and so counted, as objects are first used), reuses freed ones, and
 * unmaps every chunk but the first once no object is in use (after a drain): its memory
 * follows the log's backlog instead of its peak. Single-threaded, as the engine is.
 */
#ifndef PLX_SLAB_H
#define PLX_SLAB_H

#include <stddef.h>
#include <stdint.h>

#define PLX_SLAB_CHUNK ((size_t)1 << 20)

struct plx_slab {
    size_t size;   /* of an object, rounded up to 16 bytes */
    void *free;    /* freed objects, linked through their first word */
    void *chunks;  /* mapped chunks, newest first, linked through their first word */
    uint8_t *next; /* never used part of the newest chunk: from next to end */
    uint8_t *end;
    uint64_t live;    /* objects handed out and not freed */
    uint64_t nchunks; /* mapped */
};

/* size: at most PLX_SLAB_CHUNK / 2. */
void plx_slab_init(struct plx_slab *s, size_t size);
/* A zeroed object, or NULL (no memory). */
void *plx_slab_alloc(struct plx_slab *s);
/* p: from plx_slab_alloc of s, or NULL. */
void plx_slab_free(struct plx_slab *s, void *p);
/* Unmaps everything; every object becomes invalid. */
void plx_slab_destroy(struct plx_slab *s);

#endif
