/*
 * engine_thread.c - the thread that owns a plx_store; see engine_thread.h.
 */
#include "engine_thread.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

struct et {
    plx_store *st;
    pthread_t thread;
    pthread_mutex_t lock;       /* guards head/tail/stopping */
    struct et_job *head, *tail;
    int job_fd;                 /* eventfd: jobs queued */
    int epoll_fd;
    int stopping;
    void (*idle)(void *arg, plx_store *st); /* engine thread only */
    void *idle_arg;
    int trace; /* $PARALLAX_SNAP_TRACE: report loop turns that held the thread >= 10 ms */
    int schedstat_fd; /* with trace: /proc/thread-self/schedstat of the engine thread, or -1 */
};

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The engine thread's time spent runnable but waiting for a CPU (ns, /proc schedstat), or 0. */
static uint64_t runq_ns(int fd)
{
    char buf[96];
    ssize_t n = fd < 0 ? -1 : pread(fd, buf, sizeof buf - 1, 0);
    unsigned long long run = 0, wait = 0;
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return sscanf(buf, "%llu %llu", &run, &wait) == 2 ? wait : 0;
}

/* $PARALLAX_SNAP_TRACE: a turn of the loop that kept it from epoll for 10 ms or more, split
 * into its parts, with the thread's CPU time and its time waiting for a CPU (wall >> CPU +
 * run queue: it waited in a system call). */
static void trace_turn(const struct et *et, const uint64_t t[5], uint64_t cpu0, uint64_t rq0,
                       int nev)
{
    if (t[4] - t[0] < 10000000)
        return;
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    uint64_t rq = runq_ns(et->schedstat_fd) - rq0;
    fprintf(stderr,
            "parallax: loop trace: turn %.3f ms (cpu %.3f, run queue %.3f): %d events %.3f, "
            "jobs %.3f, service %.3f, idle %.3f\n",
            (double)(t[4] - t[0]) / 1e6, (double)cpu / 1e6, (double)rq / 1e6, nev,
            (double)(t[1] - t[0]) / 1e6, (double)(t[2] - t[1]) / 1e6, (double)(t[3] - t[2]) / 1e6,
            (double)(t[4] - t[3]) / 1e6);
}

plx_store *et_store(struct et *et)
{
    return et->st;
}

void et_job_done(struct et_job *job, plx_store *st, int status)
{
    job->status = status;
    if (status < 0 && st)
        snprintf(job->errmsg, sizeof job->errmsg, "%s", plx_store_errmsg(st));
    sem_post(&job->done);
}

int et_watch(struct et *et, struct et_fd_handler *h)
{
    return et_watch_events(et, h, EPOLLIN);
}

int et_watch_events(struct et *et, struct et_fd_handler *h, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.ptr = h};
    return epoll_ctl(et->epoll_fd, EPOLL_CTL_ADD, h->fd, &e) ? -errno : 0;
}

int et_modify(struct et *et, struct et_fd_handler *h, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.ptr = h};
    return epoll_ctl(et->epoll_fd, EPOLL_CTL_MOD, h->fd, &e) ? -errno : 0;
}

void et_set_idle(struct et *et, void (*fn)(void *arg, plx_store *st), void *arg)
{
    et->idle = fn;
    et->idle_arg = arg;
}

void et_unwatch(struct et *et, struct et_fd_handler *h)
{
    epoll_ctl(et->epoll_fd, EPOLL_CTL_DEL, h->fd, NULL);
}

static struct et_job *take_jobs(struct et *et, int signalled, int *stopping)
{
    uint64_t n;
    /* Only when epoll said so: every turn of the loop looks at the list anyway, and a read per
     * turn was a system call per request served. */
    if (signalled && read(et->job_fd, &n, sizeof n) < 0) {
        /* EAGAIN: taken by an earlier turn. */
    }
    pthread_mutex_lock(&et->lock);
    struct et_job *jobs = et->head;
    et->head = et->tail = NULL;
    *stopping = et->stopping;
    pthread_mutex_unlock(&et->lock);
    return jobs;
}

static void *engine_main(void *arg)
{
    struct et *et = arg;
    et->schedstat_fd = et->trace ? open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC) : -1;
    /* Data pointers in epoll events: NULL = store, &job_fd = jobs, else a handler. */
    for (;;) {
        struct epoll_event ev[16];
        int n = epoll_wait(et->epoll_fd, ev, 16, 1000);
        int stopping = 0;
        uint64_t t[5] = {0}, cpu0 = 0, rq0 = 0;
        if (et->trace) {
            t[0] = clock_ns(CLOCK_MONOTONIC);
            cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            rq0 = runq_ns(et->schedstat_fd);
        }
        /* This turn ends in plx_store_service: what the handlers and jobs below queue needs no
         * wake-up of the store's descriptor. */
        plx_store_will_service(et->st);
        int signalled = 0;
        for (int i = 0; i < n; i++) {
            signalled |= ev[i].data.ptr == &et->job_fd;
            if (ev[i].data.ptr && ev[i].data.ptr != &et->job_fd) {
                struct et_fd_handler *h = ev[i].data.ptr;
                h->revents = ev[i].events;
                h->on_ready(h, et->st);
            }
        }
        if (et->trace)
            t[1] = clock_ns(CLOCK_MONOTONIC);
        struct et_job *jobs = take_jobs(et, signalled, &stopping);
        while (jobs) {
            struct et_job *j = jobs;
            jobs = j->next;
            j->fn(j, et->st);
        }
        if (et->trace)
            t[2] = clock_ns(CLOCK_MONOTONIC);
        plx_store_service(et->st);
        if (et->trace)
            t[3] = clock_ns(CLOCK_MONOTONIC);
        if (et->idle)
            et->idle(et->idle_arg, et->st);
        if (et->trace) {
            t[4] = clock_ns(CLOCK_MONOTONIC);
            trace_turn(et, t, cpu0, rq0, n);
        }
        if (stopping && !plx_store_busy(et->st))
            break;
    }
    if (et->schedstat_fd >= 0)
        close(et->schedstat_fd);
    return NULL;
}

int et_start(const char *blockstore, uint64_t cache_bytes, int placement, struct et **out, char *err,
             size_t errlen)
{
    struct et *et = calloc(1, sizeof *et);
    if (!et) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    struct plx_open_opts opts = {
        .struct_size = sizeof opts, .cache_bytes = cache_bytes, .placement = placement};
    int rc = plx_store_open(blockstore, &opts, &et->st, err, errlen);
    if (rc) {
        free(et);
        return rc;
    }
    const char *trace = getenv("PARALLAX_SNAP_TRACE");
    et->trace = trace && *trace && strcmp(trace, "0") != 0;
    pthread_mutex_init(&et->lock, NULL);
    et->job_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    et->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(et->epoll_fd, EPOLL_CTL_ADD, plx_store_fd(et->st), &e);
    e.data.ptr = &et->job_fd;
    epoll_ctl(et->epoll_fd, EPOLL_CTL_ADD, et->job_fd, &e);
    rc = pthread_create(&et->thread, NULL, engine_main, et);
    if (rc) {
        snprintf(err, errlen, "starting the engine thread: %s", strerror(rc));
        plx_store_close(et->st);
        free(et);
        return -rc;
    }
    *out = et;
    return 0;
}

int et_call(struct et *et, struct et_job *job)
{
    sem_init(&job->done, 0, 0);
    job->status = 0;
    job->errmsg[0] = 0;
    job->next = NULL;
    pthread_mutex_lock(&et->lock);
    if (et->tail)
        et->tail->next = job;
    else
        et->head = job;
    et->tail = job;
    pthread_mutex_unlock(&et->lock);
    uint64_t one = 1;
    if (write(et->job_fd, &one, sizeof one) < 0) {
        /* Cannot fail short of counter overflow; the thread also polls every second. */
    }
    while (sem_wait(&job->done) != 0 && errno == EINTR)
        ;
    sem_destroy(&job->done);
    return job->status;
}

void et_stop(struct et *et)
{
    if (!et)
        return;
    pthread_mutex_lock(&et->lock);
    et->stopping = 1;
    pthread_mutex_unlock(&et->lock);
    uint64_t one = 1;
    if (write(et->job_fd, &one, sizeof one) < 0) {
        /* see et_call */
    }
    pthread_join(et->thread, NULL);
    plx_store_close(et->st);
    close(et->job_fd);
    close(et->epoll_fd);
    pthread_mutex_destroy(&et->lock);
    free(et);
}
