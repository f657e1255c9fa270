/*
 * backend_fixture.h - what the backend tests (test_backend.c, test_backend_file.c,
 * test_backend_fault.c) share: the backends under test by kind, I/Os with their completion
 * records, and block patterns.
 */
#ifndef PLX_BACKEND_FIXTURE_H
#define PLX_BACKEND_FIXTURE_H

#include <stdint.h>

#include "backend.h"

#define BS PLX_BLOCK_SIZE

enum kind {
    K_MEM,
    K_FAULT,
    K_FILE,        /* O_DIRECT temp file, aio fdsync / RWF_DSYNC ($PARALLAX_IOPRIO=0) */
    K_FILE_THREAD, /* the same with the fdatasync helper-thread fallback forced */
    K_FILE_SHM,    /* tmpfs: O_DIRECT may be refused there, exercising buffered I/O */
    K_FILE_BLOCK,  /* PLX_BACKEND_BLOCKING: pread/pwrite/fdatasync, no aio context */
    K_FILE_BUF,    /* PLX_BACKEND_BUFFERED (the write log): page cache, aio fdsync for FUA too */
    K_FILE_RT,     /* the default: urgent writes in the real-time I/O class, flushes (and FUA's)
                    * from the helper thread, which has that class too */
    K_ISCSI,       /* a LUN of a tgtd on loopback, 512-byte logical blocks, libiscsi async */
    K_ISCSI_BLOCK, /* the same with 4096-byte logical blocks, libiscsi's synchronous calls */
    K_COUNT,
};

extern const char *kind_name[K_COUNT];
/* The contract runs on the iSCSI kinds only when main() could start tgtd. */
extern int kind_count;

/* A fresh backend of `kind` with `nblocks` blocks (a file one on a temp file already unlinked). */
plx_backend *make_backend(int kind, uint64_t nblocks);
plx_backend *open_temp_file_flags(const char *dir, uint64_t nblocks, unsigned flags);
plx_backend *open_temp_file(const char *dir, uint64_t nblocks);
/* A temp file of `size` bytes; its path (a static buffer). */
char *make_temp(uint64_t size);

/* An I/O with its completion record. */
struct rec {
    struct plx_io io;
    int calls;
    int status;
    int *counter;
};

/* Submit one I/O of `r` (its counter kept) and return submit's result. */
int rec_submit(plx_backend *be, struct rec *r, enum plx_io_op op, uint64_t block, uint32_t nblocks,
               void *buf, unsigned flags);
/* Poll until nothing is in flight. */
void drain(plx_backend *be);
/* The same, waiting the way the engine does: on the fd, then a non-blocking poll. */
void drain_via_fd(plx_backend *be);
void write_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed, unsigned flags);
/* Nonzero when blocks [block, block + n) hold the pattern for seed. */
int has_pattern(plx_backend *be, uint64_t block, uint32_t n, uint64_t seed);
int is_zero(plx_backend *be, uint64_t block);

#endif
