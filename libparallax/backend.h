/*
 * backend.h - the backend seam inside the library: the public interface (parallax_backend.h)
 * and what only tests and backends use.
 */
#ifndef PLX_BACKEND_H
#define PLX_BACKEND_H

#include "parallax_backend.h"

/* Flags of plx_backend_file_open beyond the public ones: flush on the helper thread (fdatasync)
 * and write without RWF_DSYNC, as on kernels that lack IO_CMD_FDSYNC, even where the kernel has
 * them: lets the fallback be exercised anywhere (tests). */
#define PLX_BACKEND_FLUSH_THREAD 4u

/* Direct access to a memory backend's block (NULL when never written = zeros). Tests only. */
const void *plx_backend_mem_peek(const plx_backend *be, uint64_t block);
/* Overwrite a block directly (tests: corrupt a block). data NULL = zero it. */
void plx_backend_mem_poke(plx_backend *be, uint64_t block, const void *data);

/* Helpers shared by backends and the engine. */
void *plx_block_alloc(size_t nblocks); /* zeroed, PLX_BLOCK_SIZE-aligned; abort on OOM */
void plx_block_free(void *p);

#endif
