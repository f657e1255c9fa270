/*
 * nbd_buffers.c - the buffers requests carry their data in, and the pool that keeps large ones
 * for the next request of the same size (engine thread only).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "nbd_internal.h"

/* A request buffer: block-aligned, so that the engine does the I/O straight into and out of it
 * (an unaligned buffer costs a bounce buffer and one more copy of every byte). One of 1 MiB or
 * more lies in a transparent huge page where the kernel has one: the kernel builds an O_DIRECT
 * request from the buffer's pages, one segment per physically contiguous piece, and a device
 * takes only so many segments per request (virtio-blk here: 254), so a 1 MiB read into 256
 * scattered 4 KiB pages reached the disk as two requests and merged with none of its
 * neighbours; whether the pages were contiguous was luck, and it moved 1 MiB reads by 20-30 %
 * from one server process to the next (bench/notes/snapshots.md, issue 16). */
#define REQ_BUF_HUGE (1u << 20)
#define HUGE_PAGE (2u << 20)
static size_t req_buf_size(uint32_t len)
{
    size_t size = (len + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
    return size < REQ_BUF_HUGE ? size : (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

/* Write buffers of NBD_DIRECT_MIN and more are kept for the next request of the same size (up
 * to BUF_POOL_N of them, BUF_POOL_BYTES in all; engine thread only). From the heap, an aligned
 * 1 MiB buffer seldom fitted the hole a freed one left (the alignment needs more), so the heap
 * kept growing into fresh pages, each zeroed by the kernel on its first touch, the receive's
 * copy: 15,000-31,000 page faults in a 192 MiB burst of 1 MiB writes, 15-20% of serve's CPU
 * time once the write log wrote large records from the request buffers (perf). */
#define BUF_POOL_N 64
#define BUF_POOL_BYTES (64u << 20)
static struct {
    char *p[BUF_POOL_N];
    size_t size[BUF_POOL_N];
    unsigned n;
    size_t bytes;
} buf_pool;

/* A buffer of `size` (req_buf_size) from the heap. */
static char *req_buf_new(size_t size)
{
    if (size < REQ_BUF_HUGE)
        return aligned_alloc(PLX_BLOCK_SIZE, size);
    char *p = aligned_alloc(HUGE_PAGE, size);
    if (p)
        (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: without it, the buffer is as before */
    return p;
}

char *nbd_req_buf_alloc(uint32_t len)
{
    size_t size = req_buf_size(len);
    for (unsigned i = buf_pool.n; i-- > 0;)
        if (buf_pool.size[i] == size) {
            char *p = buf_pool.p[i];
            buf_pool.n--;
            buf_pool.p[i] = buf_pool.p[buf_pool.n];
            buf_pool.size[i] = buf_pool.size[buf_pool.n];
            buf_pool.bytes -= size;
            return p;
        }
    return req_buf_new(size);
}

/* A server with a write cache starts with BUF_POOL_WARM buffers for 1 MiB writes in the pool,
 * their pages touched (a huge page each): three writers at QD 8, what bench/wcache.sh sends.
 * The pool keeps what a burst left anyway, for the server's life; filled at the start, a fresh
 * server's first burst does not take the kernel's zeroing of 48 MiB of new pages in its receive
 * copies on the engine thread (26-28% of serve's samples in a 3 x 64 MiB burst of 1 MiB writes
 * with the cache on, perf; what the cache is for is taking such a burst at the local disk's
 * speed). Without a write cache the store is the bound, and the server's memory stays small
 * (bench/serve-memory.py). The rest of the pool (16 MiB) is for other sizes. */
#define BUF_POOL_WARM 24
void nbd_buf_pool_warm(void)
{
    size_t size = req_buf_size(REQ_BUF_HUGE);
    while (buf_pool.n < BUF_POOL_WARM && buf_pool.bytes + size <= BUF_POOL_BYTES) {
        char *p = req_buf_new(size);
        if (!p)
            return;
        memset(p, 0, size);
        buf_pool.p[buf_pool.n] = p;
        buf_pool.size[buf_pool.n++] = size;
        buf_pool.bytes += size;
    }
}

void nbd_req_buf_free(char *p, uint32_t len)
{
    size_t size = req_buf_size(len);
    if (p && len >= NBD_DIRECT_MIN && buf_pool.n < BUF_POOL_N &&
        buf_pool.bytes + size <= BUF_POOL_BYTES) {
        buf_pool.p[buf_pool.n] = p;
        buf_pool.size[buf_pool.n++] = size;
        buf_pool.bytes += size;
        return;
    }
    free(p);
}

/* Free the pool (the server stopped: nothing takes from it any more). */
void nbd_buf_pool_free(void)
{
    while (buf_pool.n)
        free(buf_pool.p[--buf_pool.n]);
    buf_pool.bytes = 0;
}
