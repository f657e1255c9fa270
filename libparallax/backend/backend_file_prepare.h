/*
 * backend_file_prepare.h - zeroing ahead for the file backend (backend_file_prepare.c): its
 * state, which the file backend embeds, and its calls. The layer below backend_file.c: it knows
 * the file's descriptors and the seam's types, nothing of the aio backend, and calls nothing in
 * backend_file.c; the aio backend calls it (plx_file_prep_*). Nothing else includes it.
 */
#ifndef PLX_BACKEND_FILE_PREPARE_H
#define PLX_BACKEND_FILE_PREPARE_H

#include <pthread.h>
#include <stdint.h>

#include "backend.h"

#define PREP_CHUNK 256u  /* blocks zeroed ahead at a time: 1 MiB */
#define PREP_STREAMS 8u  /* sequential streams told apart (backend_file_prepare.c) */
#define PREP_RANDOM_N 8u /* small writes out of any stream that resume zeroing ahead at once */

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

/* The zeroing ahead of one file backend. */
struct file_prep {
    const plx_backend *be; /* the file backend (its desc and size) */
    int fd;                /* the file, O_DIRECT */
    int efd;               /* the backend's completion eventfd: wakes its poll */
    /* prep_ranges and everything in it, prep_* flags and counters: under prep_mu
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
};

/* Set up f (not started: the thread starts with the first range) for the backend be over fd,
 * whose poll efd wakes; ok: the medium gains from it (a regular file, O_DIRECT, aio, writable). */
void plx_file_prep_init(struct file_prep *f, const plx_backend *be, int fd, int efd, int ok);
/* The seam's plx_backend_prepare* (backend.h), for the file backend. */
int plx_file_prep_add(struct file_prep *f, uint64_t first, uint64_t nblocks);
void plx_file_prep_stop(struct file_prep *f, uint64_t first, uint64_t nblocks);
void plx_file_prep_stats(struct file_prep *f, struct plx_prepare_stats *out);
void plx_file_prep_test(struct file_prep *f, int fail_next, int pause);
/* Hold a write or trim into a chunk being zeroed on f->held_*: 1; else count it in its chunks
 * not done (plx_file_prep_finished uncounts it) and return 0: it goes ahead. */
int plx_file_prep_hold(struct file_prep *f, struct plx_io *io);
/* From poll: the held I/Os whose chunks are done now, in order (linked by be_next), for poll
 * to start. */
struct plx_io *plx_file_prep_release(struct file_prep *f);
/* From poll, before its callback: a write or trim has completed (the kernel has it, so a later
 * look for holes sees its blocks as data); its chunks may be zeroed again. */
void plx_file_prep_finished(struct file_prep *f, const struct plx_io *io);
/* At destroy: stop the thread (a chunk being zeroed is finished), free the ranges, and destroy
 * what plx_file_prep_init set up. */
void plx_file_prep_shutdown(struct file_prep *f);

#endif
