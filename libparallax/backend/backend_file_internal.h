/*
 * backend_file_internal.h - the file backend's state, shared by backend_file.c (the aio
 * backend) and backend_file_prepare.c (zeroing ahead, its second helper thread). Nothing
 * outside these two files includes it.
 */
#ifndef PLX_BACKEND_FILE_INTERNAL_H
#define PLX_BACKEND_FILE_INTERNAL_H

#include <errno.h>
#include <libaio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backend.h"

#define PREP_CHUNK 256u  /* blocks zeroed ahead at a time: 1 MiB */
#define PREP_STREAMS 8u  /* sequential streams told apart (backend_file_prepare.c) */
#define PREP_RANDOM_N 8u /* small writes out of any stream that resume zeroing ahead at once */

enum slot_stage {
    ST_RW,   /* transferring data */
    ST_SYNC, /* flush, or the fdatasync that makes a FUA write durable */
};

struct file_slot {
    struct iocb cb;
    struct iovec iov;
    struct plx_io *io;
    size_t total, done; /* bytes */
    enum slot_stage stage;
    int fua, dsync; /* dsync: the write itself carries RWF_DSYNC */
    int fua_data;   /* a FUA write that is not urgent: counted in fua_data_inflight */
    int status;
    struct file_slot *next; /* free, stalled, ready or helper-thread list */
};

struct slot_list {
    struct file_slot *head, *tail;
};

struct file_backend {
    plx_backend base;
    int fd, efd;
    int direct, rdonly;
    int buffered; /* PLX_BACKEND_BUFFERED: writes start their writeback (sync_file_range) */
    int dfd;      /* buffered: the same file opened O_DIRECT, for PLX_IO_DIRECT (else -1) */
    size_t dio_align; /* memory alignment of a PLX_IO_DIRECT buffer (plx_backend_dio_align) */
    uint64_t wb_off, wb_len; /* buffered: written bytes whose writeback is not started yet */
    int blocking;            /* PLX_BACKEND_BLOCKING: no aio context, ctx unused */
    io_context_t ctx;
    struct file_slot *slots;
    struct file_slot *free_slots;
    struct plx_io *wait_head, *wait_tail; /* accepted, waiting for a slot */
    struct slot_list stalled;             /* io_submit said EAGAIN: retry from poll */
    struct slot_list ready;               /* finished, callback not yet run */
    unsigned inflight;                    /* accepted and callback not yet run */
    unsigned in_kernel;                   /* iocbs the kernel holds */
    /* The eventfd's count is known to be 0: drained when nothing could signal it later (no iocb
     * with the kernel, no job with the helper thread, no zeroing thread), and nothing signalled
     * since. poll() then skips its read: a QD1 stream paid one per idle poll. */
    int efd_clear;
    int aio_fdsync, rwf_dsync; /* cleared when the kernel refuses them */

    /* fdatasync helper thread, started on first need */
    int thr_started, thr_stop;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct slot_list thr_jobs, thr_done;
    unsigned thr_busy; /* handed to the thread and not yet reaped */

    /* Zeroing ahead. prep_ranges and everything in it, prep_* flags and counters: under prep_mu
     * (the list itself is changed only by the loop's thread). held_*: the loop's thread only. */
    int prep_ok; /* a regular file, O_DIRECT, aio, writable */
    int prep_started, prep_stop, prep_fail_next, prep_error, prep_waiters;
    int prep_pause;    /* tests: 1 before the next chunk, 2 inside it (plx_backend_prepare_test) */
    int prep_holding;  /* tests: the thread is paused inside a chunk */
    int prep_idle;     /* the thread waits for work (signal prep_cv when a chunk becomes free) */
    int prep_wait_all; /* $PARALLAX_ZERO_WAIT=1: writes wait for any chunk not done (A/B) */
    pthread_t prep_thr;
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;      /* to the thread: work, pause lifted, or stop */
    pthread_cond_t prep_done_cv; /* from the thread: a chunk is done, or it holds one (tests) */
    struct prep_range *prep_ranges;
    uint64_t prep_urgent; /* chunks in CH_URGENT */
    /* Standing aside for streams (backend_file_prepare.c, "Streams"): where the last writes
     * ended (a write starting at one of them continues a stream), when a write last streamed
     * into chunks not done, and when the last PREP_RANDOM_N small writes out of any stream
     * landed in such chunks. prep_stream_ns 0: never stand aside ($PARALLAX_ZERO_STREAM_MS=0). */
    uint64_t prep_ends[PREP_STREAMS];
    unsigned prep_ends_next;
    uint64_t prep_stream_ns, prep_streamed_at;
    uint64_t prep_random_at[PREP_RANDOM_N];
    unsigned prep_random_next;
    struct plx_prepare_stats prep_stats;
    struct plx_io *held_head, *held_tail; /* writes waiting for their chunks */
    uint64_t held_n, held_since_ns;       /* how many, and since when that many (wait_ns) */
    int trace; /* $PARALLAX_SNAP_TRACE: report io_submit calls that held the caller >= 5 ms */
    /* PLX_IO_URGENT writes go to the kernel with the real-time I/O priority class: 1 until the
     * kernel refuses it (no CAP_SYS_NICE, or a kernel without per-request priorities) or
     * $PARALLAX_IOPRIO=0 turns it off. */
    int ioprio_rt;
    int sync_rt; /* the fdatasync helper thread asks for the real-time class */
    /* FUA writes without PLX_IO_URGENT accepted and not yet delivered (slot_begin): with
     * sync_rt, such a write carries RWF_DSYNC only while another one is in flight. */
    unsigned fua_data_inflight;
};

/* A prepared range: blocks [first, end), cut at absolute 1 MiB boundaries into chunks c0.. */
enum chunk_state {
    CH_DONE = 0, /* zeroed, covered by a write, or given up: writes go straight through */
    CH_PENDING,  /* not zeroed yet: the thread will in its turn */
    CH_URGENT,   /* not zeroed yet and written to: the thread does it before the pending ones */
    CH_BUSY,     /* the thread is zeroing it now: writes into it wait (held_*) until it is done */
};
struct prep_range {
    uint64_t first, end, c0, nchunks;
    uint64_t left;   /* chunks not done */
    uint64_t cursor; /* the thread's next chunk in order: none before it is pending */
    uint8_t *state;
    /* Writes and trims in flight into each chunk that is not done (counted when they go to the
     * kernel, uncounted when poll delivers their completion): the thread does not take a chunk
     * while its count is not 0, and a write into a busy chunk waits, so a zero write and a data
     * write never overlap in time. */
    uint32_t *writing;
    struct prep_range *next;
};

/* Wake poll(): the backend's fd is an eventfd. EAGAIN means the counter is saturated, which
 * still reads as readable. */
static inline void plx_file_efd_signal(int efd)
{
    uint64_t one = 1;
    if (write(efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        perror("parallax: eventfd write");
}

/* backend_file_prepare.c, below backend_file.c: it calls nothing there. The seam's
 * plx_backend_prepare* (backend.h) are backend_file.c's, over plx_file_prep_add and friends. */
int plx_file_prep_add(struct file_backend *f, uint64_t first, uint64_t nblocks);
void plx_file_prep_stop(struct file_backend *f, uint64_t first, uint64_t nblocks);
void plx_file_prep_stats(struct file_backend *f, struct plx_prepare_stats *out);
void plx_file_prep_test(struct file_backend *f, int fail_next, int pause);
/* Hold a write or trim into a chunk being zeroed on f->held_*: 1; else count it in its chunks
 * not done (plx_file_prep_finished uncounts it) and return 0: it goes ahead. */
int plx_file_prep_hold(struct file_backend *f, struct plx_io *io);
/* From poll: the held I/Os whose chunks are done now, in order (linked by be_next), for poll
 * to start. */
struct plx_io *plx_file_prep_release(struct file_backend *f);
/* From poll, before its callback: a write or trim has completed (the kernel has it, so a later
 * look for holes sees its blocks as data); its chunks may be zeroed again. */
void plx_file_prep_finished(struct file_backend *f, const struct plx_io *io);
/* At destroy: stop the thread (a chunk being zeroed is finished) and free the ranges. */
void plx_file_prep_shutdown(struct file_backend *f);

#endif
