/*
 * parallax_backend.h - the seam between the engine and storage (like SQLite's VFS): the
 * public interface of Parallax backends, and how to open one from a path or URL and stack them.
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
 * - fd() is one descriptor for the backend's whole life, and the host waits on it for POLLIN
 *   only. It must become readable whenever poll() has something to do: completions to deliver,
 *   and also, for a backend over a network, data it can now send (its socket wants POLLOUT) or a
 *   clock that must run (timeouts, reconnect back-off). Such a backend keeps an epoll set of its
 *   own behind fd() (the iSCSI backend: socket with the events libiscsi wants, a timerfd, an
 *   eventfd), so the host's event set never changes when the backend's wishes do.
 */
#ifndef PLX_PARALLAX_BACKEND_H
#define PLX_PARALLAX_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "parallax.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

enum plx_io_op {
    PLX_IO_READ = 0,
    PLX_IO_WRITE = 1,
    PLX_IO_FLUSH = 2,
    /* Optional: the blocks' contents are no longer needed and the medium may release them
     * (thin-provisioned LUNs). A backend without it refuses it at submit with -EOPNOTSUPP (the
     * callback never fires); the file and memory backends do. After a completed trim the
     * blocks read as zeros or as their old contents, whichever the medium does. buf is unused. */
    PLX_IO_TRIM = 3,
};

#define PLX_IO_FUA 1u

struct plx_io {
    enum plx_io_op op;
    unsigned flags;       /* PLX_IO_FUA */
    uint64_t block;       /* first block (ignored for flush) */
    uint32_t nblocks;     /* number of blocks (0 for flush) */
    void *buf;            /* nblocks * PLX_BLOCK_SIZE bytes, PLX_BLOCK_SIZE-aligned (not trim) */
    void (*done)(struct plx_io *io, int status); /* status: 0 or -errno */
    void *owner;          /* for the submitter */
    struct plx_io *be_next; /* backend-private linkage while in flight */
};

struct plx_backend_ops {
    int (*submit)(plx_backend *be, struct plx_io *io);
    /* Reap completions and run their callbacks. timeout_ms: 0 = do not wait, -1 = wait for at
     * least one completion if any I/O is in flight. Returns the number completed or -errno. */
    int (*poll)(plx_backend *be, int timeout_ms);
    /* Readable (POLLIN) when poll() has work: completions, or anything the medium needs served
     * (see the contract above). Never changes. */
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
plx_backend *plx_backend_file_open(const char *path, unsigned flags, int *err, char *errbuf,
                                   size_t errlen);

/* An iSCSI LUN through libiscsi: url is iscsi://[user%password@]host[:port]/target-iqn/lun
 * (backend_iscsi.c). Connects, logs in (CHAP when a user is given) and reads the LUN's geometry
 * before it returns (blocking); afterwards everything is asynchronous unless flags has
 * PLX_BACKEND_BLOCKING (libiscsi's synchronous calls). nblocks is the LUN's size in 4 KiB blocks.
 * PLX_IO_TRIM is UNMAP where the LUN says it may (READ CAPACITY(16) LBPME, the Logical Block
 * Provisioning VPD page's LBPU, the Block Limits VPD page's UNMAP limits), else -EOPNOTSUPP.
 * On failure returns NULL with *err and a message that names what is wrong (no LUN number,
 * portal unreachable, CHAP refused, no such LUN on the target). */
plx_backend *plx_backend_iscsi_open(const char *url, unsigned flags, int *err, char *errbuf,
                                    size_t errlen);
/* Nonzero when a blockstore name is an iSCSI URL (starts with iscsi://). */
int plx_backend_is_iscsi(const char *where);
/* A file, a block device or an iSCSI LUN, by the form of `where`. */
plx_backend *plx_backend_open(const char *where, unsigned flags, int *err, char *errbuf,
                              size_t errlen);

/* Memory medium of nblocks zeroed blocks (calloc'd lazily per block). Completions are queued and
 * delivered by poll(); fd is an eventfd. Flush is a no-op (memory is "durable"). */
plx_backend *plx_backend_mem_create(uint64_t nblocks);
/* ---- Stacking ------------------------------------------------------------------------------------
 * A backend may sit on another: a write cache over the shared store, a fault injector over any
 * medium in tests, a counter in a benchmark. struct plx_backend_stack is the common part: it
 * forwards every operation to `lower`, so a stacked backend starts from the forwarding
 * operations (plx_backend_stack_forward_ops), replaces the ones it changes and calls the lower
 * ones itself. Open a store on the top of the stack with plx_store_open_backend(). */
struct plx_backend_stack {
    plx_backend base;     /* first: a stack is a backend */
    plx_backend *lower;
    int owns_lower;       /* destroy() destroys lower too */
};
/* Set s up over lower (same size; desc says what is stacked): ops are the stack's own, usually a
 * copy of plx_backend_stack_forward with some operations replaced. */
void plx_backend_stack_init(struct plx_backend_stack *s, const struct plx_backend_ops *ops,
                            plx_backend *lower, int owns_lower, const char *what);
/* Copy into *ops the operations that forward everything to lower: destroy() destroys lower if
 * the stack owns it, then frees the stack (allocate it with malloc, or replace destroy). */
void plx_backend_stack_forward_ops(struct plx_backend_ops *ops);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
