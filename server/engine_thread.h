/*
 * engine_thread.h - one thread that owns a plx_store, fed with jobs by other threads.
 *
 * The engine is single-threaded and never blocks; other threads (the command's main thread
 * starting and stopping the NBD server) hand work to this thread as a job and wait for its
 * completion.
 * A job's fn runs on the engine thread; it submits asynchronous engine requests (or does quick
 * work) and eventually calls et_job_done(), which wakes the waiting caller.
 */
#ifndef PLX_ENGINE_THREAD_H
#define PLX_ENGINE_THREAD_H

#include <semaphore.h>
#include <stdint.h>

#include "parallax.h"

struct et;

struct et_job {
    void (*fn)(struct et_job *job, plx_store *st); /* runs on the engine thread */
    int status;                                    /* set by et_job_done: 0 or -errno */
    char errmsg[256];                              /* message when status < 0 */
    sem_t done;
    struct et_job *next;
};

/* Extra file descriptors the engine thread watches (the control socket, NBD connections). */
struct et_fd_handler {
    int fd;
    void (*on_ready)(struct et_fd_handler *h, plx_store *st);
    uint32_t revents; /* set before on_ready: the epoll events that fired */
};

/* Open the blockstore (placement: plx_open_opts.placement) and start the thread. */
int et_start(const char *blockstore, uint64_t cache_bytes, int placement, struct et **out, char *err,
             size_t errlen);
/* Stop the thread (after the jobs queued so far) and close the store. */
void et_stop(struct et *et);
/* Run a job on the engine thread and wait for et_job_done. Returns job->status. */
int et_call(struct et *et, struct et_job *job);
/* Complete a job (engine thread). A failure copies the store's current message. */
void et_job_done(struct et_job *job, plx_store *st, int status);
/* Watch a descriptor from the engine thread (call on the engine thread, e.g. from a job). */
int et_watch(struct et *et, struct et_fd_handler *h);
void et_unwatch(struct et *et, struct et_fd_handler *h);
/* The same with explicit epoll events (EPOLLIN, EPOLLOUT; et_watch is EPOLLIN), and a change of
 * the events of a descriptor already watched. */
int et_watch_events(struct et *et, struct et_fd_handler *h, uint32_t events);
int et_modify(struct et *et, struct et_fd_handler *h, uint32_t events);
/* A function the engine thread calls once per loop iteration, after the fd handlers, the jobs
 * and plx_store_service() (so never inside a completion callback, and never while an epoll
 * batch still refers to handlers: the place to free them). NULL removes it. Engine thread. */
void et_set_idle(struct et *et, void (*fn)(void *arg, plx_store *st), void *arg);
/* The store (for code already running on the engine thread). */
plx_store *et_store(struct et *et);

#endif
