/*
 * zero.h - spotting blocks of zeros, which stay sparse on import and export.
 */
#ifndef PLX_TOOLS_ZERO_H
#define PLX_TOOLS_ZERO_H

#include <stddef.h>

/* Nonzero when all len bytes at p are zero. */
int is_zero(const unsigned char *p, size_t len);

/* Length of the run at p (at most len bytes) whose PLX_BLOCK_SIZE blocks are all zero (when
 * zero is set) or all non-zero (when not). A short last block counts as a block. */
size_t zero_run(const unsigned char *p, size_t len, int zero);

#endif
