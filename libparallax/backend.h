/*
 * backend.h - the seam between the engine and storage (like SQLite's VFS).
 *
 * A backend reads and writes whole 4 KiB blocks at block addresses, flushes its volatile cache,
 * and reports completions asynchronously. Every byte the engine stores goes through here, so the
 * fault-injection backend (tests only) can fail any I/O and simulate a crash at any point.
 *
 * Contract:
 * - submit() either returns a negative errno (the io's done callback will never fire) or returns
 *   0 and later calls io->done exactly once, from inside poll(), never from inside submit().
 * - A completed write is visible to later reads but is durable only after a flush that was
 *   submitted after the write completed has itself completed, or at once when PLX_IO_FUA is set.
 * - Writes that overlap and are in flight at the same time may land in either order: the engine
 *   never issues them.
 * - Buffers must be aligned to PLX_BLOCK_SIZE (O_DIRECT) and stay valid until done fires.
 * - No partial I/O: a short transfer is retried by the backend or reported as -EIO.
 */
#ifndef PLX_BACKEND_H
#define PLX_BACKEND_H

#include <stdint.h>
#include "parallax.h"

enum plx_io_op {
    PLX_IO_READ = 0,
    PLX_IO_WRITE = 1,
    PLX_IO_FLUSH = 2,
};

#define PLX_IO_FUA 1u

struct plx_io {
    enum plx_io_op op;
    unsigned flags;       /* PLX_IO_FUA */
    uint64_t block;       /* first block (ignored for flush) */
    uint32_t nblocks;     /* number of blocks (0 for flush) */
    void *buf;            /* nblocks * PLX_BLOCK_SIZE bytes, PLX_BLOCK_SIZE-aligned */
    void (*done)(struct plx_io *io, int status); /* status: 0 or -errno */
    void *owner;          /* for the submitter */
    struct plx_io *be_next; /* backend-private linkage while in flight */
};

struct plx_backend_ops {
    int (*submit)(plx_backend *be, struct plx_io *io);
    /* Reap completions and run their callbacks. timeout_ms: 0 = do not wait, -1 = wait for at
     * least one completion if any I/O is in flight. Returns the number completed or -errno. */
    int (*poll)(plx_backend *be, int timeout_ms);
    /* Readable when poll() has completions to deliver. */
    int (*fd)(const plx_backend *be);
    /* Number of I/Os submitted and not yet completed. */
    unsigned (*inflight)(const plx_backend *be);
    /* Release everything. Only called with nothing in flight. */
    void (*destroy)(plx_backend *be);
    /* Optional: the medium's admin lock, which serialises catalogue and registry changes
     * between processes sharing the medium. take != 0: try to take it without waiting (0, or
     * -EWOULDBLOCK when another holder has it); take == 0: release it. Not recursive. */
    int (*lock)(plx_backend *be, int take);
};

struct plx_backend {
    const struct plx_backend_ops *ops;
    uint64_t nblocks;     /* size of the medium in blocks */
    char desc[128];       /* for messages: the path or "memory" */
};

/* File or block device, libaio + O_DIRECT + eventfd. Falls back to buffered I/O with fdatasync
 * only where O_DIRECT is refused (tmpfs), and says so in desc. On failure returns NULL and sets
 * *err (negative errno) and errbuf.
 * flags: PLX_BACKEND_RDONLY; PLX_BACKEND_BLOCKING: no kernel aio context (its teardown costs a
 * short-lived process some 30 ms), each I/O runs to completion inside submit() (pread, pwrite,
 * RWF_DSYNC, fdatasync) and is delivered by the next poll(). For short-lived single-threaded
 * tools only: a flush blocks the caller, and nothing overlaps. */
#define PLX_BACKEND_RDONLY 1u
#define PLX_BACKEND_BLOCKING 2u
/* Flush on the helper thread (fdatasync) and write without RWF_DSYNC, as on kernels that lack
 * IO_CMD_FDSYNC, even where the kernel has them: lets the fallback be exercised anywhere. */
#define PLX_BACKEND_FLUSH_THREAD 4u
plx_backend *plx_backend_file_open(const char *path, unsigned flags, int *err, char *errbuf,
                                   size_t errlen);

/* Memory medium of nblocks zeroed blocks (calloc'd lazily per block). Completions are queued and
 * delivered by poll(); fd is an eventfd. Flush is a no-op (memory is "durable"). */
plx_backend *plx_backend_mem_create(uint64_t nblocks);
/* Direct access to a memory backend's block (NULL when never written = zeros). Tests only. */
const void *plx_backend_mem_peek(const plx_backend *be, uint64_t block);
/* Overwrite a block directly (tests: corrupt a block). data NULL = zero it. */
void plx_backend_mem_poke(plx_backend *be, uint64_t block, const void *data);

/* Helpers shared by backends and the engine. */
void *plx_block_alloc(size_t nblocks); /* zeroed, PLX_BLOCK_SIZE-aligned; abort on OOM */
void plx_block_free(void *p);

#endif
