/*
 * block_buf.c - block-aligned buffers for I/O through the backends.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static void *block_alloc(size_t nblocks, int zero)
{
    void *p = NULL;
    size_t len;

    /* A zero-block request still returns a distinct pointer so that callers can free it
     * unconditionally. */
    if (nblocks == 0)
        nblocks = 1;
    if (nblocks > SIZE_MAX / PLX_BLOCK_SIZE) {
        fprintf(stderr, "parallax: plx_block_alloc: %zu blocks is too large\n", nblocks);
        abort();
    }
    len = nblocks * PLX_BLOCK_SIZE;
    /* O_DIRECT needs the buffer aligned to the device's logical block size; 4096 covers every
     * device we meet and matches PLX_BLOCK_SIZE. */
    if (posix_memalign(&p, PLX_BLOCK_SIZE, len) != 0 || p == NULL) {
        fprintf(stderr, "parallax: out of memory allocating %zu bytes\n", len);
        abort();
    }
    if (zero)
        memset(p, 0, len);
    return p;
}

void *plx_block_alloc(size_t nblocks)
{
    return block_alloc(nblocks, 1);
}

void *plx_block_alloc_unzeroed(size_t nblocks)
{
    return block_alloc(nblocks, 0);
}

void plx_block_free(void *p)
{
    free(p);
}
