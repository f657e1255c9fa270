/*
 * read_plan.h - read merging: which backend reads serve one read request (layer 5, beside
 * pipeline.c, which carries the plan out; read_plan.c). Pure computation, no I/O.
 */
#ifndef PLX_READ_PLAN_H
#define PLX_READ_PLAN_H

#include <stdbool.h>
#include <stdint.h>

/* Two runs of a request that lie on the store with the same offset from their virtual blocks are
 * read as one backend read when at most this many blocks lie between them (stale or displaced
 * blocks, holes): reading 64 KiB more costs less than another request. */
#define PLX_READ_MERGE_GAP 16u
/* The most blocks one backend read covers (8 MiB). */
#define PLX_READ_MAX_IO 2048u

/* One backend read: blocks [block, block + nblocks) of the store, into the request's buffer at
 * block `first` of the request (direct) or into the scratch buffer at block `scratch`. */
struct plx_read_io {
    uint64_t first;
    uint64_t block;
    uint32_t nblocks;
    bool direct;
    uint64_t scratch;
};

/* After every read completed: request blocks [dst, dst + n) get scratch blocks [src, src + n),
 * or zeros (holes). */
struct plx_read_fix {
    uint64_t dst, src, n;
    bool zero;
};

struct plx_read_plan {
    struct plx_read_io *ios;
    size_t nios;
    struct plx_read_fix *fixes;
    size_t nfixes;
    uint64_t scratch_blocks; /* size of the scratch buffer the ios need (0: none) */
    bool merged;             /* some read covers blocks the request does not need */
};

/* Plan the reads of a request of n blocks whose block i lies at store block phys[i] (0: a hole,
 * reads as zeros), joining runs whose gaps are at most max_gap blocks. Every block of the request
 * is delivered exactly once: by a direct read that covers it at its place, by a fix from the
 * scratch buffer, or by a zero fix; direct reads never overlap one another. Returns NULL when out
 * of memory. */
struct plx_read_plan *plx_read_plan_make(const uint64_t *phys, uint64_t n, unsigned max_gap);
void plx_read_plan_free(struct plx_read_plan *p);

#endif
