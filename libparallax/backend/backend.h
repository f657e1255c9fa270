/*
 * backend.h - the backend seam inside the library: the public interface (parallax_backend.h)
 * and what only tests and backends use.
 */
#ifndef PLX_BACKEND_H
#define PLX_BACKEND_H

#include <stddef.h>

#include "parallax_backend.h"

/* The optional operation `member` of be (struct plx_backend_ops, from size on), or NULL when be
 * has none: its ops were built before the member existed (size does not cover it) or leave it
 * NULL. The library reads every operation past lock through this, and only of a backend whose
 * ops have size: one that came in through an entry point of API 1.8 or later, or the library's
 * own; the entry points of older versions wrap a caller's backend first (plx_backend_v1_adopt).
 * The seam's calls below (backend_ops.c) are the usual way. */
#define PLX_BACKEND_OP(be, member)                                                                 \
    ((be)->ops->size >= offsetof(struct plx_backend_ops, member) + sizeof((be)->ops->member)       \
         ? (be)->ops->member                                                                       \
         : NULL)

/* A function of the public API under an explicit symbol version (libparallax.map): two
 * versions of one function, such as the one of API 1.0 to 1.7 (PARALLAX_1, "name@PARALLAX_1")
 * and the current one ("name@@PARALLAX_1.8", the default a program links against now), are
 * two C functions name_1_0 and name_1_8, each under its version of the public name. */
#define PLX_SYMVER(name_at_version) __attribute__((visibility("default"), symver(name_at_version)))

/* A kind of medium a blockstore's name names: a line of backend_open.c's table, defined in its
 * backend's file. A new backend is its file, its scheme declared here and one line there. */
struct plx_backend_scheme {
    /* What the name starts with ("iscsi://"): a URL, naming a medium that exists by itself
     * (formatting opens it; plx_blockstore_is_url). NULL: the last line, any other name, a path
     * (formatting may create the file). */
    const char *prefix;
    plx_backend *(*open)(const char *where, unsigned flags, int *err, char *errbuf, size_t errlen);
    const struct plx_backend_ops *ops; /* its backends' ops (plx_backend_own) */
    /* Optional, for a URL (NULL: plx_blockstore_url_len answers 0, plx_blockstore_shown gives
     * the name as it is). url_len: the length of this scheme's URL that s starts with (s starts
     * with prefix), where a name that follows it begins ("URL:VDI"), or 0 when s holds no whole
     * one. shown: the name for messages and listings, without the secrets it may carry: where
     * itself, or buf (len bytes) holding it so. */
    size_t (*url_len)(const char *s);
    const char *(*shown)(const char *where, char *buf, size_t len);
};
extern const struct plx_backend_scheme plx_backend_iscsi_scheme; /* backend_iscsi.c */
extern const struct plx_backend_scheme plx_backend_file_scheme;  /* backend_file.c */
/* The scheme of a blockstore's name (never NULL: a path at least). */
const struct plx_backend_scheme *plx_backend_scheme_of(const char *where);

/* A backend's open failed: *err = -e (err may be NULL) and the message formatted into errbuf
 * (NULL or errlen 0: none). Returns NULL, for `return plx_backend_open_fail(...)`.
 * backend_fail.c. */
__attribute__((format(printf, 5, 6))) plx_backend *
plx_backend_open_fail(int *err, char *errbuf, size_t errlen, int e, const char *fmt, ...);

/* A backend that came in through an entry point of API 1.0 to 1.7 (plx_store_open_backend and
 * plx_store_upgrade_backend of symbol version PARALLAX_1), whose caller's ops may end at lock:
 * the library's own backends (plx_backend_own) as they are, any other wrapped in a stack that
 * owns it and forwards the operations of 1.0 (and has no optional ability, as any backend but
 * the library's had none before 1.8). backend_stack.c. NULL on allocation failure (be is then
 * destroyed, as the entry point would have). */
plx_backend *plx_backend_v1_adopt(plx_backend *be);
/* The forwarding operations of plx_backend_stack_forward_ops, as one table (backend_stack.c). */
const struct plx_backend_ops *plx_backend_stack_forward(void);
/* Whether be is one of the library's own backends (file, iSCSI, memory: backend_open.c's table
 * and the memory backend), whose ops always have size. */
int plx_backend_own(const plx_backend *be);

/* Flags of plx_backend_file_open beyond the public ones: flush on the helper thread (fdatasync)
 * and write without RWF_DSYNC, as on kernels that lack IO_CMD_FDSYNC, even where the kernel has
 * them: lets the fallback be exercised anywhere (tests). */
#define PLX_BACKEND_FLUSH_THREAD 4u
/* Open without O_DIRECT, for the write log (wlog_file.c): a write is copied into the page cache
 * inside io_submit and completes at once, its writeback is started right away
 * (sync_file_range, not waited for), and only a flush (aio FDSYNC) waits for the disk; a FUA
 * write becomes a write and such a flush. Reads of data still in the page cache do not go to
 * the disk. */
#define PLX_BACKEND_BUFFERED 8u
/* An I/O flag beside the public PLX_IO_FUA, for a PLX_BACKEND_BUFFERED file backend: this read
 * or write bypasses the page cache (the backend keeps a second descriptor opened O_DIRECT for
 * it; the kernel writes back and drops cached pages of the range around such a write, so the
 * two stay coherent). The write log writes large records with it straight from the writer's
 * buffer (wlog.c): no copy into the page cache. Every other backend ignores it (a file opened
 * O_DIRECT already is; a memory medium has no cache). Its buffer is aligned to
 * plx_backend_dio_align, not necessarily to a block. */
#define PLX_IO_DIRECT 0x100u
/* The memory alignment a PLX_IO_DIRECT buffer needs on be (a power of two, at most
 * PLX_BLOCK_SIZE as a rule; the optional operation dio_align, backend_ops.c); offsets and
 * lengths stay whole blocks. A file backend learns it at
 * open from the descriptor it uses O_DIRECT: statx's STATX_DIOALIGN (Linux 6.1), else a block
 * device's logical block size (BLKSSZGET), else PLX_BLOCK_SIZE, which it also is with no O_DIRECT
 * descriptor. A memory backend: PLX_MEM_DIO_ALIGN, which it checks (plx_backend_check_io), so
 * tests exercise the unaligned path. Any other backend, a stacked one included: PLX_BLOCK_SIZE,
 * the public contract. The write log writes a large record from a writer's buffer aligned to
 * this (wlog_batch.c, zc_min): tapdisk's buffers are 512 bytes past a page boundary. */
#define PLX_MEM_DIO_ALIGN 512u
size_t plx_backend_dio_align(const plx_backend *be);

/* An I/O flag beyond the public PLX_IO_FUA, set by the engine on the writes and flushes of a
 * commit that a snapshot, a flush or a FUA write waits for (radix nodes, snapshot log blocks,
 * VDI records). A hint, never needed for correctness: the file backend gives them the real-time
 * I/O priority class, so the kernel's I/O scheduler hands them to the device ahead of data
 * writes queued before them (DESIGN.md, "Commit writes go first"); other backends ignore it. */
#define PLX_IO_URGENT 0x200u

/* An I/O flag beyond the public ones, set by the engine on the write log's I/O
 * (plx_submit_side): the submitter accepts io->done from inside submit (its done callback only
 * queues the completion), against the contract of parallax_backend.h. A PLX_BACKEND_BUFFERED file
 * backend writes such a write that is neither FUA nor PLX_IO_DIRECT with pwrite inside submit:
 * io_submit would copy it into the page cache inside the call just the same, and the completion
 * then needs no eventfd signal and no io_getevents (a small record at QD 1 paid three system
 * calls for them). Every other backend and I/O ignores it. */
#define PLX_IO_INLINE 0x400u

/* Direct access to a memory backend's block (NULL when never written = zeros). Tests only. */
const void *plx_backend_mem_peek(const plx_backend *be, uint64_t block);
/* Overwrite a block directly (tests: corrupt a block). data NULL = zero it. */
void plx_backend_mem_poke(plx_backend *be, uint64_t block, const void *data);

/* Fencing at the medium itself (SCSI-3 persistent reservations on an iSCSI LUN; docs/DESIGN.md
 * "The lock manager", Fencing): the optional operation fence (struct plx_backend_ops), whose
 * types are the library's own for now. Both block.
 * join: register `key` (nonzero) for this connection and make sure the medium is reserved
 * "write exclusive, registrants only". From then on an I/O that the medium refuses because
 * `key` was preempted fails with -ESTALE (at submit or completion), and so does every later one.
 * preempt: remove every registration of `victim` so the medium refuses its writes (0 when it
 * has none); -ESTALE when this connection's own key was preempted.
 *
 * When the backend finds its registration in doubt (a session re-established, or a command
 * refused with RESERVATION CONFLICT) it holds every write, flush and trim and registers again
 * only when the layer above agrees, through these hooks (called from the backend's poll or
 * from a blocking call, never from inside a submit): if its key is gone from the medium (a
 * target that restarted forgets every registration; a preempt removes it too), only after the
 * lock manager confirmed the lease, and in every case it re-reads the preempted-keys block
 * after registering: a key listed there was preempted by a host that took over its locks, and
 * the backend unregisters and fails everything with -ESTALE. */
struct plx_fence_hooks {
    void *arg;
    /* Has the lock manager renewed our lease after since_ns (CLOCK_MONOTONIC)? 1 yes, 0 not
     * yet (asked; the backend asks again on its next tick). Never blocks. */
    int (*lease_confirmed)(void *arg, uint64_t since_ns);
    /* How long to wait for that before giving up and fencing. */
    uint64_t lease_wait_ns;
    /* The block that lists preempted keys, and whether `key` is listed in its contents `block`
     * (as read from the medium): 1 listed, 0 not, -EIO when the block does not verify. */
    uint64_t preempted_block;
    int (*key_preempted)(void *arg, const void *block, uint64_t key);
};
struct plx_fence_ops {
    int (*join)(plx_backend *be, uint64_t key, const struct plx_fence_hooks *hooks);
    int (*preempt)(plx_backend *be, uint64_t victim);
};
/* The medium's fencing, or NULL when it has none: an iSCSI LUN opened directly (a backend
 * stacked over one does not fence; its writes would not be refused). backend_ops.c. */
const struct plx_fence_ops *plx_backend_fence_ops(const plx_backend *be);

/* Zeroing ahead (the optional operations prepare, prepare_stop, prepare_stats; the file backend
 * has them: docs/DESIGN.md "Zeroing ahead"). Writing into a file's holes is
 * slow on ext4 (each write allocates), writing into written space fast, so when the allocator
 * takes a new data extent it asks the medium to prepare its blocks: a helper thread writes zeros
 * over the holes of [first, first + nblocks) in 1 MiB chunks (SEEK_HOLE/SEEK_DATA). A hole reads
 * as zeros, so zeroing one changes no block's contents; the only hazard is a data write landing
 * on a hole between the thread's look and its zero write, and the backend excludes it: the
 * thread takes no chunk with a write or trim in flight, and a write or trim into the chunk it is
 * zeroing waits inside the backend (submit still returns at once) until that chunk is done. Any
 * other write goes ahead at once (into holes where the thread has not been yet) and makes its
 * chunk zeroed before the untouched ones; one that covers a whole chunk makes the chunk count as
 * done. Reads never wait. A zero write that fails (EIO, ENOSPC) ends all zeroing ahead
 * for the backend's life and lets the waiting writes go; they succeed or fail on their own.
 * Never blocks. Returns 0, or -EOPNOTSUPP where the medium has nothing to gain (not a regular
 * file, buffered, blocking or read-only mode, any other backend, a stacked one included). */
int plx_backend_prepare(plx_backend *be, uint64_t first, uint64_t nblocks);
/* Forget what is not yet zeroed in [first, first + nblocks) and wait for the chunks being zeroed
 * there (the batch in hand: at most 8 MiB of zero writes): before the range is given back to other
 * processes (an extent released), whose writes the backend cannot hold. Blocking, briefly. */
void plx_backend_prepare_stop(plx_backend *be, uint64_t first, uint64_t nblocks);
struct plx_prepare_stats {
    uint64_t chunks_pending;  /* in prepared ranges, not yet zeroed (or being zeroed) */
    uint64_t chunks_zeroed;   /* zeroed by the thread (holes found or not) */
    uint64_t chunks_covered;  /* counted done because a write covered them whole */
    uint64_t bytes_zeroed;    /* zeros written over holes */
    uint64_t writes_waited;   /* writes and trims that waited for a chunk being zeroed */
    uint64_t wait_ns;         /* their waits added up */
    uint64_t held_max;        /* most writes waiting at once */
    uint64_t urgent_zeroed;   /* chunks zeroed because a write waited for them */
    uint64_t writes_streamed; /* writes into chunks not done that streamed (sequential, large) */
    uint64_t writes_random;   /* and the small ones out of any stream */
    int error;                /* the zero write error that ended zeroing ahead, or 0 */
};
/* All zero when the backend does not prepare. */
void plx_backend_prepare_stats(const plx_backend *be, struct plx_prepare_stats *out);
/* Tests, a file backend's (backend_file.c; nothing on any other backend): the next zero write
 * fails with err (a negative errno); pause 1 holds the thread before
 * its next chunk, pause 2 inside it (taken, busy, not zeroed) until called again with pause 0;
 * pause 3 changes nothing and returns once the thread holds a chunk under pause 2 (at most
 * 10 s). */
void plx_backend_prepare_test(plx_backend *be, int fail_next, int pause);

/* The configured host id: $PARALLAX_HOST_ID, else the first word of /etc/parallax/host-id, else
 * the host name (host_id.c). The engine's identity and the iSCSI initiator name both use it. */
void plx_host_id_default(char *out, size_t len);

/* Helpers shared by backends and the engine. */
void *plx_block_alloc(size_t nblocks); /* zeroed, PLX_BLOCK_SIZE-aligned; abort on OOM */
/* The same, not zeroed: only for a buffer every byte of which is read into before it is read
 * (check.c's read buffer of up to 8 MiB, set up once per check: zeroing it was 30% of the crash
 * harness's time). */
void *plx_block_alloc_unzeroed(size_t nblocks);
void plx_block_free(void *p);

#endif
