/*
 * backend_mem_shared.h - the block table behind the memory backend, shared with the
 * fault-injection backend (crash images are copy-on-write clones of block tables).
 *
 * A block is a refcounted 4 KiB buffer that is never modified once published, so the same
 * buffer can sit in many tables (and in the fault backend's event log) at once. A table maps
 * block addresses to such buffers (NULL = zeros) through refcounted chunks of pointers, so
 * cloning a table costs one pointer per chunk and the first write to a shared chunk copies it.
 * Refcounts are atomic so that tables cloned from one another may be used from different
 * threads; a single table is not thread-safe.
 */
#ifndef PLX_BACKEND_MEM_SHARED_H
#define PLX_BACKEND_MEM_SHARED_H

#include <stdint.h>
#include "backend.h"

struct plx_blk;
struct plx_blk_table;

/* A new block holding a copy of data (PLX_BLOCK_SIZE bytes), with one reference. Returns NULL
 * (= zeros, no allocation) when data is NULL or all zeros. Aborts on OOM. */
struct plx_blk *plx_blk_new(const void *data);
/* Take (returns b) and drop a reference. Both accept NULL. */
struct plx_blk *plx_blk_ref(struct plx_blk *b);
void plx_blk_unref(struct plx_blk *b);
/* The block's PLX_BLOCK_SIZE bytes; NULL for NULL. */
const void *plx_blk_data(const struct plx_blk *b);

struct plx_blk_table *plx_blk_table_new(uint64_t nblocks);
/* A copy-on-write clone: O(nblocks / 512), no block data copied. */
struct plx_blk_table *plx_blk_table_clone(const struct plx_blk_table *t);
void plx_blk_table_free(struct plx_blk_table *t);
uint64_t plx_blk_table_nblocks(const struct plx_blk_table *t);
/* The block at addr (NULL = zeros); the table keeps its reference. */
struct plx_blk *plx_blk_table_get(const struct plx_blk_table *t, uint64_t addr);
/* Store b at addr, taking over the caller's reference (NULL = zeros). */
void plx_blk_table_set(struct plx_blk_table *t, uint64_t addr, struct plx_blk *b);

/* A memory backend over t, which it takes over (freed by destroy). */
plx_backend *plx_backend_mem_from_table(struct plx_blk_table *t);
/* The table of a memory backend, or NULL when be is not one. */
struct plx_blk_table *plx_backend_mem_table(const plx_backend *be);

/* Shared by the memory and fault backends: -EINVAL unless io is well formed and in range. */
int plx_backend_check_io(const plx_backend *be, const struct plx_io *io);

#endif
