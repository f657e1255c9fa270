/*
 * slab.c - fixed-size objects in anonymously mapped chunks (slab.h says why).
 */
#include "slab.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* A chunk begins with the link to the next (older) chunk; objects follow, 16-byte aligned. */
#define CHUNK_HDR 16u

void plx_slab_init(struct plx_slab *s, size_t size)
{
    memset(s, 0, sizeof *s);
    size = size < sizeof(void *) ? sizeof(void *) : size;
    s->size = (size + 15u) & ~(size_t)15u;
}

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer every object is its own allocation, so that a use after free or an
 * overrun of one is caught as with malloc. */
void *plx_slab_alloc(struct plx_slab *s)
{
    void *p = calloc(1, s->size);
    s->live += p != NULL;
    return p;
}

void plx_slab_free(struct plx_slab *s, void *p)
{
    if (p)
        s->live--;
    free(p);
}

void plx_slab_destroy(struct plx_slab *s)
{
    memset(s, 0, sizeof *s); /* (objects still held leak, as with malloc: LeakSanitizer) */
}
#else
static int chunk_add(struct plx_slab *s)
{
    void *c =
        mmap(NULL, PLX_SLAB_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED)
        return -1;
    *(void **)c = s->chunks;
    s->chunks = c;
    s->nchunks++;
    s->next = (uint8_t *)c + CHUNK_HDR;
    s->end = (uint8_t *)c + PLX_SLAB_CHUNK;
    return 0;
}

void *plx_slab_alloc(struct plx_slab *s)
{
    void *p = s->free;
    if (p) {
        s->free = *(void **)p;
    } else {
        if ((size_t)(s->end - s->next) < s->size && chunk_add(s))
            return NULL;
        p = s->next;
        s->next += s->size;
    }
    s->live++;
    return memset(p, 0, s->size);
}

/* No object in use: keep the newest chunk (a writer at QD 1 empties the log after each write,
 * and must not map and fault in a chunk each time), unmap the others. */
static void shrink(struct plx_slab *s)
{
    void *keep = s->chunks;
    if (!keep)
        return;
    for (void *c = *(void **)keep, *nx; c; c = nx) {
        nx = *(void **)c;
        munmap(c, PLX_SLAB_CHUNK);
    }
    *(void **)keep = NULL;
    s->nchunks = 1;
    s->free = NULL;
    s->next = (uint8_t *)keep + CHUNK_HDR;
    s->end = (uint8_t *)keep + PLX_SLAB_CHUNK;
}

void plx_slab_free(struct plx_slab *s, void *p)
{
    if (!p)
        return;
    *(void **)p = s->free;
    s->free = p;
    if (--s->live == 0 && s->nchunks > 1)
        shrink(s);
}

void plx_slab_destroy(struct plx_slab *s)
{
    for (void *c = s->chunks, *nx; c; c = nx) {
        nx = *(void **)c;
        munmap(c, PLX_SLAB_CHUNK);
    }
    memset(s, 0, sizeof *s);
}
#endif
