/*
 * parallax.h - the public API of libparallax.
 *
 * A blockstore (one file, block device or LUN) holds many virtual disk images (VDIs). Each VDI
 * is a radix tree of 4 KiB nodes mapping virtual blocks to blocks of the store; snapshots are
 * frozen roots recorded in the VDI's snapshot log, and clones are new VDIs whose first root is a
 * copy of a snapshot's root.
 *
 * Conventions (the header is the specification):
 * - Functions return 0 (or a count) on success and a negative errno on failure. A human-readable
 *   message naming the operation, the object and the cause is kept per store and returned by
 *   plx_store_errmsg(). Error classes: -ENOENT (no such VDI/snapshot), -EEXIST (name taken),
 *   -ENOSPC (blockstore full), -EIO (the medium failed), -EUCLEAN (corrupt metadata: bad magic,
 *   checksum, or link), -EPROTONOSUPPORT (unknown format version), -EROFS (write to a snapshot),
 *   -EBUSY (a VDI is open for writing elsewhere), -EINVAL (bad argument), -EFBIG (size beyond
 *   the tree's reach).
 * - The engine is single-threaded and never blocks: asynchronous calls (plx_vdi_submit_*) queue
 *   work and return; the caller waits for plx_store_fd() to become readable (or polls) and calls
 *   plx_store_service(), which runs completion callbacks. Callback contract: if a submit call
 *   returns an error, its callback never fires; otherwise it fires exactly once, from inside
 *   plx_store_service() (never from inside the submit call).
 * - Calls marked "blocking" are thin loops over the asynchronous ones (submit, then service until
 *   done). They must not be called from inside a completion callback.
 * - A plx_store and everything opened from it must be used from one thread at a time.
 * - Compatibility: libparallax.so.1 exports exactly the functions declared here (version node
 *   PARALLAX_1 of libparallax/libparallax.map). Within one major version, functions, fields at
 *   the end of versioned structs (those with struct_size) and flags are only ever added.
 */
#ifndef PARALLAX_H
#define PARALLAX_H

#include <stddef.h>
#include <stdint.h>

/* The library is built with -fvisibility=hidden: what is declared here is its public surface. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version -------------------------------------------------------------------------------- */

/* The API version this header describes. MAJOR is the soname (libparallax.so.MAJOR) and changes
 * only when something is removed or changed incompatibly; MINOR grows when something is added;
 * PATCH counts releases without API changes. */
#define PLX_API_VERSION_MAJOR 1
#define PLX_API_VERSION_MINOR 9
#define PLX_API_VERSION_PATCH 0
#define PLX_API_VERSION                                                                            \
    (PLX_API_VERSION_MAJOR * 10000 + PLX_API_VERSION_MINOR * 100 + PLX_API_VERSION_PATCH)

/* The API version of the library actually running, encoded like PLX_API_VERSION (10000 for
 * 1.0.0). A program built against a newer minor version than the library it runs with can test
 * plx_version() >= PLX_API_VERSION before using what the newer version added. Never fails. */
unsigned plx_version(void);

#define PLX_BLOCK_SIZE 4096u
#define PLX_NAME_MAX 255   /* longest VDI name, bytes, without the NUL */
#define PLX_FORMAT_VERSION_CURRENT 2 /* the on-disk format version this library writes */
#define PLX_LABEL_MAX 39   /* longest snapshot label, bytes, without the NUL */
#define PLX_MAX_VDI_SIZE (1ull << 48) /* 256 TiB: four tree levels */

typedef struct plx_store plx_store;
typedef struct plx_vdi plx_vdi;
typedef struct plx_backend plx_backend;

/* ---- Formatting and opening ---------------------------------------------------------------- */

#define PLX_DEFAULT_EXTENT_SIZE (2ull << 30)
#define PLX_MIN_EXTENT_SIZE (1ull << 20)

/* Options for opening a store. Zero-initialise, set struct_size = sizeof(struct plx_open_opts);
 * fields are only ever appended. */
struct plx_open_opts {
    size_t struct_size;
    int read_only;          /* open without writing anything (check, export, info) */
    uint64_t cache_bytes;   /* radix node cache size; 0 = default (64 MiB) */
    const char *host;       /* lock-holder identity; NULL = this host's name */
    /* Nonzero: plain blocking reads, writes and fdatasync instead of kernel aio, for short-lived
     * single-threaded tools. Saves the ~30 ms the kernel takes to tear an aio context down at
     * close or exit; costs all overlap between I/Os. Never for servers. */
    int blocking_io;
    /* Where new data blocks go (docs/DESIGN.md, "Placement"): PLX_PLACEMENT_LEAF (0, the
     * default) puts each leaf's blocks in one slot in virtual order, so a disk written in random
     * order (or rewritten after a snapshot) reads back sequentially at sequential speed;
     * PLX_PLACEMENT_ARRIVAL hands them out in the order writes arrive (the default before API
     * 1.3; 1, the old PLX_PLACEMENT_LEAF, still means leaf). Per process; the format is the
     * same either way. */
    int placement;
};
#define PLX_PLACEMENT_LEAF 0
#define PLX_PLACEMENT_ARRIVAL 2

/* A blockstore is named by a path (file or block device) or by a URL:
 * iscsi://[user%password@]host[:port]/target-iqn/lun names a LUN reached with libiscsi. Nonzero
 * when `where` is such a URL: tools use it as given (no realpath, no file to create or stat). */
int plx_blockstore_is_url(const char *where);
/* API 1.9. The length of the blockstore URL that s starts with, up to where the URL's form ends
 * (for iscsi://, the LUN number after the target IQN), so that a name may follow it
 * ("iscsi://HOST/IQN/LUN:VDI", tapdisk's parameters); 0 when s does not start with a whole URL
 * (a path, or a URL cut short). */
size_t plx_blockstore_url_len(const char *s);
/* API 1.9. A blockstore's name as messages and listings show it: a URL without the password
 * it may carry (iscsi://USER%PASSWORD@HOST/... as iscsi://USER@HOST/...), written into buf
 * (len bytes) and returned; any other name is returned as it is. */
const char *plx_blockstore_shown(const char *where, char *buf, size_t len);

/* Format `path` (created as a sparse file of `size` bytes if absent; an existing regular file
 * is resized to `size`, and a device or a file keeps its size when size is 0; an iSCSI LUN is
 * formatted whole when size is 0, else its first `size` bytes, never more than it has).
 * extent_size 0 = plx_default_extent_size() of the store's size. Refuses to overwrite an
 * existing Parallax blockstore unless force is set. Every check runs before anything changes:
 * on failure the file is exactly as it was, and a file this call created is removed. Blocking. */
int plx_format(const char *path, uint64_t size, uint64_t extent_size, int force, char *errbuf,
               size_t errlen);
/* Convert a store of an older format version to the current one (docs/FORMAT.md §11): format
 * version 1's fixed registry becomes the VDI table and name index; records stay where they are.
 * Refuses (-EBUSY) while any live process holds a VDI or an extent of the store. Crash-safe: an
 * interrupted upgrade leaves a store this call finishes. *upgraded = 1 if it changed the store,
 * 0 if it was current already. Blocking. */
int plx_store_upgrade(const char *path, const struct plx_open_opts *opts, int *upgraded,
                      char *errbuf, size_t errlen);
int plx_store_upgrade_backend(plx_backend *be, const struct plx_open_opts *opts, int *upgraded,
                              char *errbuf, size_t errlen);
/* The extent size format picks for a store of `store_bytes`: about 32 extents, a power of two
 * from PLX_MIN_EXTENT_SIZE to PLX_DEFAULT_EXTENT_SIZE (2 GiB, the most it picks). Each process
 * writing to a store allocates in extents of its own, so small stores need small extents. */
uint64_t plx_default_extent_size(uint64_t store_bytes);
/* The same on a backend the caller owns (tests use the memory backend). */
int plx_format_backend(plx_backend *be, uint64_t extent_size, char *errbuf, size_t errlen);

/* Open a blockstore. On failure *out is NULL and errbuf holds the message. Blocking. */
int plx_store_open(const char *path, const struct plx_open_opts *opts, plx_store **out,
                   char *errbuf, size_t errlen);
/* Open a store on a backend; the store takes ownership of `be` (destroyed on close, or on
 * failure). Since API 1.8 be's ops have size (parallax_backend.h); a program built against an
 * older header links the version of PARALLAX_1, which takes ops without it (so does
 * plx_store_upgrade_backend). */
int plx_store_open_backend(plx_backend *be, const struct plx_open_opts *opts, plx_store **out,
                           char *errbuf, size_t errlen);
/* Wait for all outstanding work, release claimed-but-unused blocks, close open VDIs and the
 * store. Returns the first error met while closing. Blocking. */
int plx_store_close(plx_store *st);

/* The lock manager (parallax-lockd) that hosts sharing this store use, as "HOST:PORT" in the
 * store's state block; "" makes it a single-host store again. Every process that opens the store
 * afterwards talks to it ($PARALLAX_LOCKD overrides the address; "none" ignores it). Takes
 * effect for processes that open the store later. Blocking. */
int plx_store_set_lockd(plx_store *st, const char *addr);
/* The lock manager's view: one line per connected engine process (host, pid, lease), passed to
 * `line`. -ENOENT when the store has no lock manager. Blocking. */
int plx_store_lockd_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg);

/* The message for the last failed call on this store. */
const char *plx_store_errmsg(const plx_store *st);

/* ---- Driving the engine --------------------------------------------------------------------- */

/* A file descriptor that becomes readable when plx_store_service() has work to do. */
int plx_store_fd(const plx_store *st);
/* Reap completed I/O, advance requests and run callbacks. Never blocks. Returns the number of
 * callbacks run, or a negative errno if the medium failed in a way that stops the store. */
int plx_store_service(plx_store *st);
/* A promise from a loop that serves the store: the calling thread will call plx_store_service()
 * before it next waits for plx_store_fd(). Until that call, work queued from this thread does
 * not make the descriptor readable (which costs two system calls per request); a server's loop
 * calls it when it wakes, before it hands the store the requests it received. (API 1.4) */
void plx_store_will_service(plx_store *st);
/* Nonzero while any request or internal I/O is outstanding. */
int plx_store_busy(const plx_store *st);
/* Block until `*done` becomes nonzero (set by a callback), servicing the store. */
int plx_store_wait(plx_store *st, const int *done);

/* ---- Information ------------------------------------------------------------------------------ */

enum plx_extent_type {
    PLX_EXTENT_UNUSED = 0,
    PLX_EXTENT_SYSTEM = 1,
    PLX_EXTENT_METADATA = 2,
    PLX_EXTENT_DATA = 3,
};

struct plx_store_info {
    uint32_t format_version;
    uint64_t size_bytes;       /* usable size: whole extents */
    uint64_t block_count;
    uint64_t extent_size;
    uint64_t extent_count;
    uint64_t extents_by_type[4];       /* indexed by enum plx_extent_type */
    uint64_t blocks_used_by_type[4];   /* allocated blocks (bitmap bits set) */
    uint64_t blocks_free_by_type[4];
    uint64_t vdi_slots;                /* registry capacity */
    uint64_t vdi_count;                /* live (not deleted) VDIs */
    char lockd_addr[64];               /* lock manager address, "" when none */
    /* Allocated blocks no live tree or log reaches (what gc would free): crash leftovers,
     * deleted VDIs and snapshots, and blocks claimed right now by running writers.
     * PLX_UNKNOWN when a corrupt radix node leaves it unknown (parallax check says where). */
    uint64_t blocks_unreachable_by_type[4];
};
#define PLX_UNKNOWN UINT64_MAX
int plx_store_info(plx_store *st, struct plx_store_info *out);

struct plx_vdi_info {
    uint64_t id;
    char name[PLX_NAME_MAX + 1];
    uint64_t size;            /* bytes */
    unsigned height;          /* radix tree levels: 3 or 4 */
    uint64_t root;            /* block address of the current radix root */
    uint64_t snap_count;      /* snapshots in this VDI's own log */
    uint64_t parent_id;       /* clones: the VDI the source snapshot belongs to; 0 otherwise */
    uint64_t parent_snap;     /* clones: index of that snapshot in the parent's log */
    uint64_t created_ns;      /* CLOCK_REALTIME */
    int deleted;
    char lock_holder[64];     /* "" when not open for writing */
    uint32_t lock_pid;        /* the writer's pid, when it runs on this host (else 0) */
};

struct plx_snap_info {
    uint64_t vdi_id;
    uint64_t index;           /* 1-based position in the VDI's log */
    uint64_t root;
    uint64_t time_ns;
    char label[PLX_LABEL_MAX + 1];
    int deleted;
};

/* Resolve a VDI given by name or decimal id. */
int plx_vdi_lookup(plx_store *st, const char *vdi, struct plx_vdi_info *out);
/* Resolve "VDI@N" (N from 1) or "VDI@LABEL". */
int plx_snap_lookup(plx_store *st, const char *snap, struct plx_snap_info *out);
/* All VDIs, deleted ones included (check .deleted). *out is malloc'd; free() it. */
int plx_vdi_list(plx_store *st, struct plx_vdi_info **out, size_t *count);
/* Stream the VDIs whose id is above after_id (0: all), in id order, deleted ones included: fn is
 * called once per VDI with an info valid during the call; a nonzero return stops the walk and is
 * returned. Reads only the records it reports (and the VDI table blocks above them), so a page
 * costs its size, not the store's VDI count. */
typedef int (*plx_vdi_list_fn)(void *arg, const struct plx_vdi_info *info);
int plx_vdi_list_each(plx_store *st, uint64_t after_id, plx_vdi_list_fn fn, void *arg);
/* A VDI's snapshot log, oldest first. *out is malloc'd; free() it. */
int plx_snap_list(plx_store *st, uint64_t vdi_id, struct plx_snap_info **out, size_t *count);
/* Options of plx_snap_iterate. Zero-initialise, set struct_size = sizeof(struct
 * plx_snap_iter_opts); fields are only ever appended. */
struct plx_snap_iter_opts {
    size_t struct_size;
    uint64_t after;   /* start after snapshot `after` in the listing order: oldest first, the
                       * snapshots numbered above it; newest first, those below it. 0 = from the
                       * start (snapshot 1, or the newest). */
    uint64_t limit;   /* at most this many snapshots, 0 = no limit */
    int newest_first; /* list from the newest snapshot down */
};
/* The live snapshots of VDI `vdi` (name or id), one call of fn each, in index order, without
 * holding the log in memory: a page costs O(log n) log reads to find its start and one read per
 * 63 snapshots after that, and memory for 64 log blocks. fn returning nonzero stops the walk;
 * that value is returned. Blocking. */
int plx_snap_iterate(plx_store *st, const char *vdi, const struct plx_snap_iter_opts *opts,
                     int (*fn)(void *arg, const struct plx_snap_info *snap), void *arg);

/* The live (not deleted) snapshots of VDI `vdi` (name or id) in *live: O(1) block reads beyond
 * finding the record (the record counts them; FORMAT.md §7), O(log n) just after a deletion
 * that crashed or is under way, and a read of the whole log for a VDI no writer has opened
 * since the count existed (a store from before it). Blocking. */
int plx_vdi_live_snapshots(plx_store *st, const char *vdi, uint64_t *live);

/* ---- Administration (blocking) ---------------------------------------------------------------- */

/* Create an empty VDI of `size` bytes (rounded up to 4 KiB). */
int plx_vdi_create(plx_store *st, const char *name, uint64_t size, uint64_t *id_out);
/* Create a writable VDI whose contents start as the snapshot `snap` ("VDI@N" / "VDI@LABEL"). */
int plx_vdi_clone(plx_store *st, const char *name, const char *snap, uint64_t *id_out);
/* Mark a VDI (and its snapshots) deleted. Space comes back when the collector runs. */
int plx_vdi_delete(plx_store *st, const char *vdi);
/* Take a snapshot of a VDI that is not open; *index_out receives N of "VDI@N". */
int plx_vdi_snapshot(plx_store *st, const char *vdi, const char *label, uint64_t *index_out);
/* Set a snapshot's label (unique within its VDI; "" clears it). */
int plx_snap_label(plx_store *st, const char *snap, const char *label);

/* ---- Consistency check ------------------------------------------------------------------------ */

struct plx_check_report {
    uint64_t errors;           /* anything that makes the store inconsistent */
    uint64_t leaked_blocks;    /* allocated but unreachable: not an error */
    uint64_t reachable_blocks;
    uint64_t trees;            /* radix trees walked (VDIs + snapshots) */
    uint64_t snapshots;
};
/* Walk every tree and log. Each problem is reported through `report` (may be NULL) as one line
 * of text. Returns 0 when the walk ran (errors are counted in *out), negative errno when it
 * could not run. Blocking. */
int plx_check(plx_store *st, struct plx_check_report *out,
              void (*report)(void *arg, int is_error, const char *line), void *arg);

/* How many other processes may be writing this blockstore right now (live holders of a VDI's
 * writer lock or of an extent), 0 when none, or a negative errno. `who` (may be NULL) receives a
 * description of one of them, such as "pid 812 (parallax) on this host has VDI vm open for
 * writing". A check beside a writer can see changes half made. Blocking. */
int plx_store_writers(plx_store *st, char *who, size_t len);

/* Would writing to `path` destroy this store or the writes of a write cache? 1 when it would
 * (`why`, which may be NULL, receives the reason in a sentence such as "PATH is the blockstore
 * itself (or on its device)"), 0 when not (or path does not exist yet). Caught: the store's file
 * or device, also through symlinks, bind mounts, a loop device or a partition of it, or a file
 * on its device; the write log attached to this store; any Parallax write log (its head block
 * says so, whichever process has it). vdi-export checks its target with it. (API 1.7) */
int plx_store_path_conflict(plx_store *st, const char *path, char *why, size_t len);

/* Progress of a long blocking call (plx_check_ex, plx_gc_ex): called from inside the call as it
 * advances. `step` names what it is doing ("reading bitmaps", "walking trees", "marking",
 * "sweeping", ...; the wording may change); `done` of `total` units of that step are finished
 * (total 0: unknown). Called often, up to once per read the call issues: a caller that draws
 * something rate-limits itself. It must not call into the store. */
typedef void (*plx_progress_fn)(void *arg, const char *step, uint64_t done, uint64_t total);

/* Options of plx_check_ex. Zero-initialise, set struct_size = sizeof(struct plx_check_opts);
 * fields are only ever appended. */
struct plx_check_opts {
    size_t struct_size;
    void (*report)(void *arg, int is_error, const char *line); /* as for plx_check; may be NULL */
    void *report_arg;
    plx_progress_fn progress; /* may be NULL */
    void *progress_arg;
    unsigned read_depth; /* radix node reads in flight: 0 = the default (32), 1 = one at a time */
};
/* plx_check with options: the same walk and results; opts may be NULL. Blocking. */
int plx_check_ex(plx_store *st, const struct plx_check_opts *opts, struct plx_check_report *out);

/* ---- Deletion and garbage collection ----------------------------------------------------------- */

/* Mark one snapshot deleted. Its blocks come back when the collector runs, except those that a
 * clone, a later snapshot or the VDI itself still reaches. Blocking. */
int plx_snap_delete(plx_store *st, const char *snap);

struct plx_gc_report {
    uint64_t store_blocks;        /* blockstore processed, blocks */
    uint64_t metadata_read;       /* radix nodes read while marking */
    uint64_t reachable;           /* live blocks found */
    uint64_t freed_by_type[4];    /* blocks given back (dry run: that would be) */
    uint64_t extents_released;    /* extents that became unused */
    uint64_t extents_skipped;     /* held by another live process: not collected this time */
    uint64_t vdis_purged;         /* deleted VDI records removed from the registry */
    double seconds;
};
/* The mark-and-sweep collector (thesis algorithm 1): checkpoint the allocation bitmaps, mark
 * from every live root through the metadata extents in disk order, then free every block that
 * was allocated in the checkpoint and is unmarked. Runs beside writers in other processes: in an
 * extent another live process holds, that process frees the blocks, after answering a request
 * through the extent's reclaim record (waited for up to $PARALLAX_RECLAIM_WAIT_MS, default
 * 10 s; an extent whose holder does not answer is skipped: extents_skipped). freed_by_type
 * counts what the holders confirmed within that wait. In this process, open VDIs are first
 * brought to a committed state. Blocking. */
int plx_gc(plx_store *st, int dry_run, struct plx_gc_report *out);

/* Options of plx_gc_ex. Zero-initialise, set struct_size = sizeof(struct plx_gc_opts); fields
 * are only ever appended. */
struct plx_gc_opts {
    size_t struct_size;
    int dry_run;              /* as for plx_gc */
    plx_progress_fn progress; /* may be NULL */
    void *progress_arg;
};
/* plx_gc with options; opts may be NULL (a real collection, no progress). Blocking. */
int plx_gc_ex(plx_store *st, const struct plx_gc_opts *opts, struct plx_gc_report *out);

/* ---- VDI I/O ------------------------------------------------------------------------------------ */

#define PLX_OPEN_READONLY 1u

/* Open "VDI" for writing (single writer: -EBUSY when another process holds it) or read-only,
 * or "VDI@N"/"VDI@LABEL" (always read-only). Blocking. A read-only open of a store opened for
 * writing records a hold until the close: plx_gc in any process keeps the tree it reads, even if
 * the VDI or snapshot is deleted meanwhile (-ENOSPC when the store's 1,152 holds are taken). */
int plx_vdi_open(plx_store *st, const char *spec, unsigned flags, plx_vdi **out);
/* plx_vdi_open without waiting for the lock manager (API 1.7). An open on a store opened for
 * writing needs the store's admin lock (a writer takes the VDI's lock, a reader records its
 * hold), which on a store shared through parallax-lockd is lockd's to grant: with
 * lockd slow, stopped or gone, plx_vdi_open waits up to $PARALLAX_LOCK_TIMEOUT (30 s) and a
 * server's other VDIs wait with it. Here that wait is an event on the store's loop, as a
 * request's I/O is: the call returns at once and the loop goes on serving. cb runs exactly
 * once, from plx_store_service (never inside this call), with 0 and the new handle, or -errno
 * and NULL; plx_store_errmsg says why while cb runs (-EHOSTUNREACH: the lock manager could not
 * be reached or stopped answering, and the message names it; -EBUSY: another process holds
 * the VDI, or held the admin lock for the whole wait). Once the lock is granted, the rest of
 * the open (the VDI's record, root and log) is blocking medium I/O, as in plx_vdi_open. On a
 * submission error (-ENOMEM, -EINVAL) cb never runs. *req (may be NULL) names the open for
 * plx_vdi_open_cancel until cb runs. */
typedef struct plx_open_req plx_open_req;
typedef void (*plx_open_fn)(void *arg, int status, plx_vdi *v);
int plx_vdi_open_async(plx_store *st, const char *spec, unsigned flags, plx_open_fn cb, void *arg,
                       plx_open_req **req);
/* Withdraw an open whose cb has not run: it never will. (API 1.7) */
void plx_vdi_open_cancel(plx_open_req *req);
/* Complete outstanding requests, write back, release the VDI lock. Blocking. */
int plx_vdi_close(plx_vdi *v);
/* plx_vdi_close without waiting for the write cache: while the write log still holds writes of
 * v (not yet drained into the blockstore), returns -EAGAIN at once and leaves v open and usable,
 * with its drain under way (even a held drain); call it again later from the loop that serves
 * the store (plx_store_service), which carries the drain on. Otherwise it is plx_vdi_close. For
 * servers, whose other VDIs must not wait while one is closed. (API 1.3) */
int plx_vdi_try_close(plx_vdi *v);
uint64_t plx_vdi_size(const plx_vdi *v);
uint64_t plx_vdi_id(const plx_vdi *v);
int plx_vdi_readonly(const plx_vdi *v);

typedef void (*plx_done_fn)(void *arg, int status); /* status: 0 or -errno */
/* plx_vdi_close without waiting for the lock manager (API 1.7): a writable VDI's close clears
 * its lock in the VDI's record, a reader's drops its hold, under the admin lock, and that wait
 * is an event on the store's loop. Returns -EAGAIN at once, doing nothing, while the write cache
 * still drains v (as plx_vdi_try_close); else 0: v is being closed and must not be used again
 * (submit nothing more), and cb runs once, from plx_store_service, with the close's result. If the
 * admin lock cannot be had within $PARALLAX_LOCK_TIMEOUT the handle is closed all the same and cb
 * gets -EHOSTUNREACH (or -EBUSY), the message saying so: the record still names this process as the
 * VDI's writer, so no other process opens it for writing while this one runs (this store does,
 * taking the lock back). A close under way is finished by plx_vdi_close(v) or plx_store_close,
 * without cb. */
int plx_vdi_close_async(plx_vdi *v, plx_done_fn cb, void *arg);

#define PLX_WRITE_FUA 1u /* durable when the callback fires */
/* The write may complete once its data is written and the VDI's tree in memory links it (reads
 * see it), before the metadata that reaches it is written: a write into a volatile cache, as on
 * a disk with one. Until a later flush completes it may be lost not only by a power failure but
 * also if this process dies. If writing that metadata then fails, the VDI fails every later
 * request, the next flush included, until it is opened again (no read returns older data than
 * such a write had put there). Ignored with PLX_WRITE_FUA. Used by the NBD server, whose
 * clients must flush anyway. */
#define PLX_WRITE_CACHED 2u

/* Byte-granular requests; any alignment is accepted (sub-block pieces are read-modify-write).
 * Requests touching the same 4 KiB block are carried out in submission order. A write
 * completes when its data and the metadata that reaches it are written (with PLX_WRITE_CACHED:
 * its data); it is durable after a later flush completes (or at once with PLX_WRITE_FUA).
 * Buffers are owned by the caller until the callback fires. */
int plx_vdi_submit_read(plx_vdi *v, void *buf, uint64_t off, size_t len, plx_done_fn cb,
                        void *arg);
int plx_vdi_submit_write(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags,
                         plx_done_fn cb, void *arg);
/* Completes when every write completed before it was submitted is durable. */
int plx_vdi_submit_flush(plx_vdi *v, plx_done_fn cb, void *arg);
/* Make the range read as zeros. Whole 4 KiB blocks inside the range become sparse (snapshots
 * untouched); partial blocks at the edges are zero-filled. */
int plx_vdi_submit_trim(plx_vdi *v, uint64_t off, uint64_t len, plx_done_fn cb, void *arg);
/* Snapshot in the request stream: earlier requests are in it, later ones are not. The callback
 * fires once the snapshot record is durable; *index_out (owned by the caller) receives N. */
int plx_vdi_submit_snapshot(plx_vdi *v, const char *label, uint64_t *index_out, plx_done_fn cb,
                            void *arg);

/* Label (or clear, with "") or delete snapshot N of a VDI this process has open for writing;
 * the form a server uses for commands routed to it. Requests in the stream: they run after any
 * snapshot submitted before them, and the callback fires once the changed log record is
 * durable. A label in use by another live snapshot fails with -EEXIST, a missing or deleted
 * snapshot with -ENOENT. */
int plx_vdi_submit_snap_label(plx_vdi *v, uint64_t index, const char *label, plx_done_fn cb,
                              void *arg);
int plx_vdi_submit_snap_delete(plx_vdi *v, uint64_t index, plx_done_fn cb, void *arg);
/* Blocking forms of those two. */
int plx_vdi_snap_label(plx_vdi *v, uint64_t index, const char *label);
int plx_vdi_snap_delete(plx_vdi *v, uint64_t index);

/* Blocking forms of the above. */
int plx_vdi_pread(plx_vdi *v, void *buf, uint64_t off, size_t len);
int plx_vdi_pwrite(plx_vdi *v, const void *buf, uint64_t off, size_t len, unsigned flags);
int plx_vdi_flush(plx_vdi *v);
int plx_vdi_trim(plx_vdi *v, uint64_t off, uint64_t len);
int plx_vdi_snapshot_open(plx_vdi *v, const char *label, uint64_t *index_out);

/* Is the block at `off` mapped (1) or sparse (0)? *run_len receives how many bytes from off share
 * that state (up to len). Blocking (may read radix nodes). */
int plx_vdi_block_status(plx_vdi *v, uint64_t off, uint64_t len, uint64_t *run_len);
/* The same without blocking: the radix nodes it needs are read asynchronously. len > 0. When the
 * callback fires with status 0, *mapped (1 mapped, 0 sparse) and *run_len (bytes from off, up
 * to len, sharing that state) are set; both are owned by the caller. It waits for earlier
 * writes overlapping the range, like a read, so it sees them. */
int plx_vdi_submit_block_status(plx_vdi *v, uint64_t off, uint64_t len, uint64_t *run_len,
                                int *mapped, plx_done_fn cb, void *arg);

/* ---- Write cache ------------------------------------------------------------------------------
 * A per-host log on this host's own disk (docs/DESIGN.md, "The write cache"; its format is
 * docs/FORMAT.md §12). With the cache on for a VDI, its writes complete once they are in the log
 * and a flush once the log is flushed; the log drains into the blockstore in the background, in
 * order. The VDI's record names the log meanwhile, so no other process opens the VDI for writing
 * until the log is replayed (at attach). */

#define PLX_WCACHE_DEFAULT_SIZE (1ull << 30)

/* Attach the write log at `path`, a file on this host's own disk. An absent file is created with
 * `size` bytes (0: PLX_WCACHE_DEFAULT_SIZE), its space reserved; an existing log keeps its size
 * (size 0, or the same) and its records not yet in the store are replayed before this returns.
 * Refused with a message: a path on tmpfs or ramfs, the blockstore itself, a log of another
 * blockstore or host, a log too small for two of its largest writes, a disk without room, a log
 * another process has attached. Blocking. */
int plx_wcache_attach(plx_store *st, const char *path, uint64_t size);
/* Turn the write cache on (on != 0) or off for a VDI open for writing; off returns once the
 * VDI's writes are drained into the blockstore. Blocking. */
int plx_vdi_wcache(plx_vdi *v, int on);
/* Nonzero while the cache is on for v. */
int plx_vdi_wcache_on(const plx_vdi *v);

struct plx_wcache_status {
    int attached;              /* a log is attached */
    int failed;                /* the log failed: writes go through to the blockstore */
    uint64_t log_bytes;        /* the log's size */
    uint64_t used_bytes;       /* written to the log and not yet drained */
    uint64_t backlog_bytes;    /* cached writes not yet in the blockstore */
    uint64_t backlog_records;
    uint64_t drained_bytes;    /* since attach */
    uint64_t replayed_records; /* by the replay at attach */
    double drain_rate;         /* bytes/s since attach */
    unsigned vdis_cached;      /* open VDIs with the cache on */
    char path[128];
    char error[256];           /* why it failed, or "" */
};
int plx_wcache_status(plx_store *st, struct plx_wcache_status *out);
/* The write cache's drain (API 1.5; struct plx_wcache_status keeps its 1.0 layout, which
 * programs built before allocate). An output struct that may grow: zero-initialise, set
 * struct_size = sizeof(struct plx_wcache_drain); the library fills the fields that fit in it.
 * state: "" (no log attached), "idle" (nothing to drain), "running", "deferred" (guests are
 * writing: the drain waits for delay_ms without a write, the oldest record to be max_age_ms
 * old, half the log used, or someone waiting for it), "paused", "eager" (starts at once), or
 * "stopped" (at an error: the records stay in the log). -EINVAL if struct_size is smaller
 * than the first version of the struct. */
struct plx_wcache_drain {
    size_t struct_size;
    char state[16];
    uint64_t delay_ms, max_age_ms; /* 0: the drain is never deferred */
    uint64_t oldest_ms;            /* age of the oldest record in the log */
    /* API 1.6: data written to the log since attach, and of it what was written straight from
     * the writers' buffers without a copy (records of 256 KiB and more whose buffer is aligned
     * as the log's O_DIRECT needs, docs/DESIGN.md): bytes and records. A caller built against
     * 1.5 has no room for them and gets none. */
    uint64_t logged_bytes, zc_bytes, zc_records;
};
int plx_wcache_drain_status(plx_store *st, struct plx_wcache_drain *out);
/* The automatic mode (wcache_auto.c): the cache turns on for a VDI once the store's write
 * latency (the engine's weighted mean of its writes' completion times, decaying while the store
 * is idle, or the age of the VDI's oldest write in flight, whichever is more) has stayed above
 * on_ms for a fifth of hold_ms, and off once the VDI's backlog is
 * (nearly) drained and the latency has stayed below off_ms for hold_ms (turning off drains the
 * rest, holding the VDI's new requests meanwhile). While a VDI is in this mode its record names
 * the log even with the cache off, so that turning on writes nothing to the store and takes
 * effect at once; closing the VDI or leaving the mode with plx_vdi_wcache(v, 0) clears it.
 * Acknowledged writes are neither lost nor reordered. */
#define PLX_WCACHE_OFF 0
#define PLX_WCACHE_ON 1
#define PLX_WCACHE_AUTO 2
#define PLX_WCACHE_AUTO_ON_MS 20.0 /* the default threshold */
struct plx_wcache_auto {
    double on_ms;      /* 0: PLX_WCACHE_AUTO_ON_MS */
    double off_ms;     /* 0: on_ms / 2 */
    unsigned hold_ms;  /* 0: 1000 */
};
/* Put v (open for writing, a log attached) in the automatic mode (a = NULL: the defaults). The
 * cache keeps its present state until plx_vdi_wcache_tick decides. Blocking (writes the VDI's
 * record, naming the log, when it does not name it yet). */
int plx_vdi_wcache_auto(plx_vdi *v, const struct plx_wcache_auto *a);
/* Set the mode: PLX_WCACHE_ON or _OFF (plx_vdi_wcache; leaves the automatic mode; off returns
 * once drained), or PLX_WCACHE_AUTO with a. Blocking. */
int plx_vdi_wcache_set_mode(plx_vdi *v, int mode, const struct plx_wcache_auto *a);
/* Turn the cache off (leaving the automatic mode) without waiting for the drain: v's new
 * requests are held while its writes drain, then go to the blockstore in order. Returns
 * -EAGAIN while the drain is under way (call it again after service passes: the server polls
 * it every 100 ms), then 0 once drained and the VDI's record no longer names the log (that
 * record write blocks briefly), or a negative errno. */
int plx_vdi_wcache_off_nowait(plx_vdi *v);
/* PLX_WCACHE_AUTO, _ON or _OFF; with *a (may be NULL) the automatic mode's thresholds. */
int plx_vdi_wcache_mode(const plx_vdi *v, struct plx_wcache_auto *a);
/* Apply the automatic mode's rule now: call it every 100 ms or so from the loop that serves
 * the VDI. It does not block (the record was written when the mode was set; turning off
 * finishes from the service loop once the last records are drained). Does nothing outside the
 * automatic mode. Returns 1 when it turned the cache on, 2 when it started turning it off, 0,
 * or a negative errno. */
int plx_vdi_wcache_tick(plx_vdi *v);
/* The store's write latency in ms as the engine sees it (0 before its first write). */
double plx_store_write_latency_ms(const plx_store *st);

/* Where the write log is when no option names it: the settings a program starts with
 * (`serve`, the tapdisk driver). A setting is "key=value": write-cache=PATH (the log),
 * write-cache-size=SIZE (bytes, or a number with K, M, G or T), write-cache-mode=on|auto and
 * write-cache-threshold=MS (the automatic mode's on_ms), the same words as the tapdisk
 * parameters. */
struct plx_wcache_config {
    char path[4096];     /* "" : no write cache */
    uint64_t size;       /* 0: PLX_WCACHE_DEFAULT_SIZE, or the existing log's size */
    int mode;            /* PLX_WCACHE_ON (the default) or PLX_WCACHE_AUTO */
    double threshold_ms; /* 0: PLX_WCACHE_AUTO_ON_MS */
};
/* Apply one setting "key=value" (len bytes of it) to c. Returns 0, 1 when the key is not a
 * write-cache setting (c unchanged), or -EINVAL with a message in err for a bad value. */
int plx_wcache_config_set(struct plx_wcache_config *c, const char *setting, size_t len, char *err,
                          size_t errlen);
/* Read the host's write-cache settings file: $PARALLAX_WRITE_CACHE_FILE, else
 * /etc/parallax/write-cache; one setting a line, blank lines and # comments ignored. c is
 * cleared first. Returns 0 (an absent file is no write cache), or a negative errno with a
 * message naming the file and line in err. */
int plx_wcache_config_read(struct plx_wcache_config *c, char *err, size_t errlen);

/* Forget the writes of VDI `vdi` (name or id) that a write log holds and nobody can replay (its
 * disk is lost): the record stops naming the log, and the VDI opens at the older point the
 * blockstore holds. The VDI must not be open for writing. Blocking. */
int plx_vdi_wcache_discard(plx_store *st, const char *vdi);

#ifdef __cplusplus
}
#endif

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#endif
