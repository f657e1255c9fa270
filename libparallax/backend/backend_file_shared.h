/*
 * backend_file_shared.h - what the file backend's two files share: its state and its slots.
 * backend_file_open.c opens the medium and sets the state up; backend_file.c, below it, is the
 * I/O (submission, the helper thread, completion) and the seam's operations. Nothing else
 * includes it.
 */
#ifndef PLX_BACKEND_FILE_SHARED_H
#define PLX_BACKEND_FILE_SHARED_H

#include <libaio.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "backend.h"
#include "backend_done.h"
#include "backend_file_prepare.h"

enum slot_stage {
    ST_RW,   /* transferring data */
    ST_SYNC, /* flush, or the fdatasync that makes a FUA write durable */
};

struct file_slot {
    /* First: the I/O, its status, the link of the stalled, ready or helper-thread list
     * (backend_done.h); of the free list too. */
    struct plx_done link;
    struct iocb cb;
    struct iovec iov;
    size_t total, done; /* bytes */
    enum slot_stage stage;
    int fua, dsync; /* dsync: the write itself carries RWF_DSYNC */
    int fua_data;   /* a FUA write that is not urgent: counted in fua_data_inflight */
    int fua_writing; /* fua_data, its data not written yet: counted in fua_writing */
};

/* A FUA data write's flush, shared: one aio FDSYNC for the FUA data writes whose data was reaped
 * (fua_group_submit). Its iocb goes to the kernel tagged (data | 1), which tells it from a slot's
 * in reap_kernel. */
struct fua_group {
    struct iocb cb;
    struct plx_done_list members; /* their data is written; durable once this completes */
};

struct file_backend {
    plx_backend base;
    int fd;
    /* The completion eventfd (the backend's fd) and the slots finished, callback not yet run. */
    struct plx_done_queue done;
    int direct, rdonly;
    int buffered;     /* PLX_BACKEND_BUFFERED: writes start their writeback (sync_file_range) */
    int dfd;          /* buffered: the same file opened O_DIRECT, for PLX_IO_DIRECT (else -1) */
    size_t dio_align; /* memory alignment of a PLX_IO_DIRECT buffer (plx_backend_dio_align) */
    uint64_t wb_off, wb_len; /* buffered: written bytes whose writeback is not started yet */
    int blocking;            /* PLX_BACKEND_BLOCKING: no aio context, ctx unused */
    io_context_t ctx;
    struct file_slot *slots;
    struct file_slot *free_slots;
    struct plx_io *wait_head, *wait_tail; /* accepted, waiting for a slot */
    struct plx_done_list stalled;         /* io_submit said EAGAIN: retry from poll */
    unsigned inflight;                    /* accepted and callback not yet run */
    unsigned in_kernel;                   /* iocbs the kernel holds */
    /* The eventfd's count is known to be 0: drained when nothing could signal it later (no iocb
     * with the kernel, no job with the helper thread, no zeroing thread), and nothing signalled
     * since. poll() then skips its read: a QD1 stream paid one per idle poll. */
    int efd_clear;
    /* The aio context's completion ring, read in user space (aio_ring.h) instead of with
     * io_getevents; NULL when this reader does not know its layout, in blocking mode or with
     * $PARALLAX_AIO_RING=0. Reading it, poll() reads the eventfd only when a signal may be in
     * it: efd_owed counts the signals known to be sent (each event reaped from the ring: the
     * kernel signals once per iocb of ours, after the event is in the ring; each of our own;
     * each of the helper thread's, counted under its mutex) less the counts the reads took. With
     * the ring empty, the helper thread idle, no zeroing ahead and efd_owed <= 0 the count is 0,
     * and a poll that finds nothing makes no system call (efd_clear is not used then). */
    struct plx_aio_ring *ring;
    int64_t efd_owed;
    unsigned thr_signals, thr_signals_seen; /* the helper thread's signals, under mu */
    /* System calls poll() made, for tests: io_getevents, and reads of the eventfd. */
    uint64_t getevents_calls, efd_reads;
    int aio_fdsync, rwf_dsync; /* cleared when the kernel refuses them */

    /* fdatasync helper thread, started on first need */
    int thr_started, thr_stop;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct plx_done_list thr_jobs, thr_done;
    unsigned thr_busy; /* handed to the thread and not yet reaped */

    /* Zeroing ahead (backend_file_prepare.c); prep.held_*: writes it holds. */
    struct file_prep prep;
    int trace; /* $PARALLAX_SNAP_TRACE: report io_submit calls that held the caller >= 5 ms */
    /* PLX_IO_URGENT writes go to the kernel with the real-time I/O priority class: 1 until the
     * kernel refuses it (no CAP_SYS_NICE, or a kernel without per-request priorities) or
     * $PARALLAX_IOPRIO=0 turns it off. */
    int ioprio_rt;
    int sync_rt; /* the fdatasync helper thread asks for the real-time class */
    /* FUA writes without PLX_IO_URGENT accepted and not yet delivered (slot_begin): with
     * sync_rt, such a write carries RWF_DSYNC only while another one is in flight. */
    unsigned fua_data_inflight;
    /* FUA data writes are plain writes whose data completions are gathered (fua_pending) and
     * made durable by one aio FDSYNC for all those reaped (struct fua_group): 0 when the kernel
     * refuses aio FDSYNC, in blocking mode, with PLX_BACKEND_FLUSH_THREAD or
     * $PARALLAX_FUA_GROUP=0. */
    int fua_group;
    struct plx_done_list fua_pending;
    unsigned fua_groups;     /* groups (their FDSYNC) with the kernel: at most fua_groups_max */
    unsigned fua_groups_max; /* 2, or $PARALLAX_FUA_GROUP when it is a number from 1 */
    /* A group's flush waits while fewer than fua_hold writes are pending and other FUA data
     * writes are still being written (fua_group_submit): 16, or $PARALLAX_FUA_HOLD (0: never). */
    unsigned fua_hold;
    unsigned fua_pending_n; /* in fua_pending */
    unsigned fua_writing;   /* FUA data writes whose data is not written yet (slot fua_writing) */
};

/* The seam's operations of a file backend (backend_file.c). */
extern const struct plx_backend_ops plx_file_ops;
/* Put s on f's free list (at open, every slot; after an I/O, its slot). */
void plx_file_slot_release(struct file_backend *f, struct file_slot *s);

#endif
