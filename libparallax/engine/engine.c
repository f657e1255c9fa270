/*
 * engine.c - the engine's event loop: engine I/O as events whose handlers run from the service
 * loop, deferred callbacks (how requests complete to their callers), the store's error
 * message, and the blocking single I/O of admin paths. See engine.h for the layers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include "engine.h"

int plx_err(plx_store *st, int err, const char *fmt, ...)
{
    /* A fenced store's failures all come from the fence: its message says why, keep it. */
    if (st->fenced && err == -ESTALE)
        return err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->errmsg, sizeof st->errmsg, fmt, ap);
    va_end(ap);
    return err;
}

const char *plx_store_errmsg(const plx_store *st)
{
    return st->errmsg;
}

void plx_set_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
{
    if (!errbuf || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

/* ---- I/O plumbing ------------------------------------------------------------------------------
 */

/* The medium refused our I/O because another host preempted our reservation key (backend.h,
 * plx_fence_ops): it declared us dead and took over our locks. Nothing more may be written. */
static void fence_refused(plx_store *st)
{
    plx_fence(st,
              "%s: the target refused this process's I/O (SCSI RESERVATION CONFLICT): another "
              "host preempted its reservation key after the lock manager declared it dead, and "
              "took over its locks; it writes nothing more (restart it and reopen the VDIs)",
              st->be->desc);
}

static void ev_io_done(struct plx_io *io, int status)
{
    struct plx_ev *ev = (struct plx_ev *)io;
    plx_store *st = io->owner;
    if (status == -ESTALE)
        fence_refused(st);
    if (ev->write_submit_ns && st->store_writes_inflight)
        st->store_writes_inflight--;
    if (ev->write_submit_ns && status == 0) {
        /* A latency sample of the store (st->write_lat_ns). */
        uint64_t now = plx_mono_ns(), lat = now - ev->write_submit_ns;
        st->write_lat_ns =
            st->write_lat_at_ns ? st->write_lat_ns - st->write_lat_ns / 8 + lat / 8 : lat;
        st->write_lat_at_ns = now;
    }
    ev->status = status;
    ev->next = NULL;
    if (st->ready_tail)
        st->ready_tail->next = ev;
    else
        st->ready_head = ev;
    st->ready_tail = ev;
}

/* Does work queued now need the wake-up (a write to wake_fd, and a read in the next service)?
 * Not inside the service loop, which drains its queues before it returns, nor when the thread's
 * loop said it services next (plx_store_will_service): a system call each, per request. */
static bool wake_needed(const plx_store *st)
{
    return !st->in_service && !st->service_next;
}

int plx_submit(plx_store *st, struct plx_ev *ev)
{
    if (st->fenced)
        return -ESTALE;
    ev->io.done = ev_io_done;
    ev->io.owner = st;
    /* Not on the store: the write latency and in-flight counts below assume done comes later. */
    ev->io.flags &= ~PLX_IO_INLINE;
    ev->write_submit_ns = ev->io.op == PLX_IO_WRITE ? plx_mono_ns() : 0;
    if (ev->write_submit_ns && !st->store_writes_inflight && st->write_lat_at_ns) {
        st->write_lat_ns = plx_store_write_lat_now(st); /* the idle decay, made permanent */
        st->write_lat_at_ns = ev->write_submit_ns;
    }
    int rc = st->be->ops->submit(st->be, &ev->io);
    if (rc == 0) {
        st->internal_ios++;
        st->be_submits++;
        if (ev->write_submit_ns)
            st->store_writes_inflight++;
    } else if (rc == -ESTALE)
        fence_refused(st);
    return rc;
}

/* The idle decay of the write latency: a grace period (a pause between a writer's bursts, a
 * drain round's commit), then halving per period. */
#define LAT_IDLE_NS 200000000ull

uint64_t plx_store_write_lat_now(const plx_store *st)
{
    if (st->store_writes_inflight || !st->write_lat_at_ns)
        return st->write_lat_ns;
    uint64_t idle = plx_mono_ns() - st->write_lat_at_ns;
    if (idle <= LAT_IDLE_NS)
        return st->write_lat_ns;
    uint64_t halvings = (idle - LAT_IDLE_NS) / LAT_IDLE_NS + 1;
    return halvings >= 64 ? 0 : st->write_lat_ns >> halvings;
}

int plx_submit_side(plx_store *st, struct plx_ev *ev)
{
    if (st->fenced)
        return -ESTALE;
    ev->io.done = ev_io_done;
    ev->io.owner = st;
    ev->write_submit_ns = 0; /* the log is not the store: its latency is not sampled */
    /* ev_io_done only queues the event, so the log's backend may complete it inside submit
     * (backend.h, PLX_IO_INLINE): a small buffered record is then one pwrite, with no eventfd
     * signal and no io_getevents to learn that it is done. */
    ev->io.flags |= PLX_IO_INLINE;
    int rc = st->side_be->ops->submit(st->side_be, &ev->io);
    if (rc == 0) {
        st->internal_ios++;
        /* Done already (it is the newest ready event): its handler needs a service pass. */
        if (st->ready_tail == ev && wake_needed(st))
            plx_wake(st);
    }
    return rc;
}

/* Reap the side medium's completions (they join the ready list). */
static int poll_side(plx_store *st, int timeout_ms)
{
    if (!st->side_be)
        return 0;
    int rc = st->side_be->ops->poll(st->side_be, timeout_ms);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN)
        return plx_err(st, rc, "polling %s: %s", st->side_be->desc, strerror(-rc));
    return 0;
}

static void sync_done(struct plx_io *io, int status)
{
    int *result = io->owner;
    result[0] = status;
    result[1] = 1;
}

int plx_poll_medium(plx_store *st)
{
    if (!st->service_tick)
        return st->be->ops->poll(st->be, -1);
    int rc = st->be->ops->poll(st->be, 250);
    st->service_tick(st);
    return rc;
}

int plx_sync_io(plx_store *st, enum plx_io_op op, uint64_t block, uint32_t n, void *buf,
                unsigned flags)
{
    if (st->service_tick)
        st->service_tick(st); /* long blocking admin work keeps its lease too */
    if (st->fenced)
        return -ESTALE;
    int result[2] = {0, 0};
    struct plx_io io = {.op = op, .flags = flags, .block = block, .nblocks = n, .buf = buf};
    io.done = sync_done;
    io.owner = result;
    int rc = st->be->ops->submit(st->be, &io);
    if (rc == -ESTALE)
        fence_refused(st);
    if (rc)
        return rc;
    while (!result[1]) {
        rc = plx_poll_medium(st);
        if (rc < 0 && rc != -EINTR)
            return rc;
    }
    if (result[0] == -ESTALE) {
        fence_refused(st);
        return -ESTALE;
    }
    /* A baseline message: callers with more context replace it. */
    if (result[0]) {
        static const char *const names[] = {"read", "write", "flush", "trim"};
        if (op == PLX_IO_FLUSH)
            plx_err(st, result[0], "flushing %s: %s", st->be->desc, strerror(-result[0]));
        else
            plx_err(st, result[0], "%s of block %llu on %s: %s", names[op],
                    (unsigned long long)block, st->be->desc, strerror(-result[0]));
    }
    return result[0];
}

void plx_wake(plx_store *st)
{
    uint64_t one = 1;
    st->wake_pending = true;
    st->wakes++;
    if (write(st->wake_fd, &one, sizeof one) < 0) {
        /* The counter cannot overflow in practice; a failed wake only delays work to the next
         * service call. */
    }
}

void plx_defer(plx_store *st, struct plx_deferred *d)
{
    d->next = NULL;
    if (st->deferred_tail)
        st->deferred_tail->next = d;
    else
        st->deferred_head = d;
    st->deferred_tail = d;
    if (wake_needed(st))
        plx_wake(st);
}

void plx_store_will_service(plx_store *st)
{
    st->service_next = true;
    st->serving = true;
}

void plx_defer_turn(plx_store *st, struct plx_deferred *d)
{
    d->next = NULL;
    if (st->turn_tail)
        st->turn_tail->next = d;
    else
        st->turn_head = d;
    st->turn_tail = d;
    /* Before the promised service (plx_store_will_service), that pass is the next one. */
    if (!st->service_next)
        plx_wake(st);
}

int plx_store_fd(const plx_store *st)
{
    return st->epoll_fd;
}

/* ---- Timers ---------------------------------------------------------------------------------- */

/* Program the timerfd for at_ns (0: disarm). timerfd_settime also clears an expiry not yet
 * read, so the fd is never left readable with nothing due (a busy loop in the host). */
static void timer_fd_set(plx_store *st, uint64_t at_ns)
{
    struct itimerspec its = {0};
    if (at_ns) {
        its.it_value.tv_sec = (time_t)(at_ns / 1000000000ull);
        its.it_value.tv_nsec = (long)(at_ns % 1000000000ull);
    }
    if (timerfd_settime(st->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) != 0)
        return; /* (cannot fail with valid arguments; the service pass checks the clock too) */
    st->timer_fd_at = at_ns;
}

void plx_timer_arm(plx_store *st, struct plx_timer *t, uint64_t at_ns)
{
    if (!at_ns)
        at_ns = 1;
    if (!t->at_ns) {
        t->next = st->timers;
        st->timers = t;
    }
    t->at_ns = at_ns;
    if (!st->timer_fd_at || at_ns < st->timer_fd_at)
        timer_fd_set(st, at_ns);
}

void plx_timer_cancel(plx_store *st, struct plx_timer *t)
{
    if (!t->at_ns)
        return;
    for (struct plx_timer **pp = &st->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    t->at_ns = 0;
    t->next = NULL;
    /* The timerfd may still fire for it: that pass finds nothing due and programs it anew. */
}

/* Run the timers that are due, and keep the timerfd programmed for the earliest left. The
 * clock decides, not the fd: a caller that calls plx_store_service in a loop without waiting
 * on plx_store_fd() gets its timers too. */
static void run_timers(plx_store *st)
{
    uint64_t now = plx_mono_ns();
    bool fd_due = st->timer_fd_at && st->timer_fd_at <= now;
    for (;;) {
        struct plx_timer *due = NULL;
        for (struct plx_timer **pp = &st->timers; *pp; pp = &(*pp)->next)
            if ((*pp)->at_ns <= now) {
                due = *pp;
                *pp = due->next;
                break;
            }
        if (!due)
            break;
        due->at_ns = 0;
        due->next = NULL;
        due->run(due); /* (may arm timers again: a deadline in the past runs in this loop) */
        now = plx_mono_ns();
    }
    uint64_t next = 0;
    for (const struct plx_timer *t = st->timers; t; t = t->next)
        if (!next || t->at_ns < next)
            next = t->at_ns;
    if (fd_due || (next && (!st->timer_fd_at || next < st->timer_fd_at)))
        timer_fd_set(st, next);
}

void plx_run_ready(plx_store *st)
{
    while (st->ready_head) {
        struct plx_ev *ev = st->ready_head;
        st->ready_head = ev->next;
        if (!st->ready_head)
            st->ready_tail = NULL;
        st->internal_ios--;
        ev->handler(st, ev);
    }
}

int plx_store_service(plx_store *st)
{
    /* Only this thread writes wake_fd (plx_wake): no write since the last read, nothing to
     * clear (a read per pass was a system call per request). */
    st->service_next = false;
    if (st->wake_pending) {
        uint64_t junk;
        st->wake_pending = false;
        if (read(st->wake_fd, &junk, sizeof junk) < 0) {
            /* EAGAIN: taken already. */
        }
    }
    if (st->service_tick)
        st->service_tick(st);
    /* What plx_defer_turn queued during the last pass runs in this one. */
    if (st->turn_head) {
        if (st->deferred_tail)
            st->deferred_tail->next = st->turn_head;
        else
            st->deferred_head = st->turn_head;
        st->deferred_tail = st->turn_tail;
        st->turn_head = st->turn_tail = NULL;
    }
    int ran = 0;
    st->in_service = true;
    if (st->timers || st->timer_fd_at)
        run_timers(st);
    /* The store's medium is polled once per pass, and again only after the pass handed it I/O:
     * what completes meanwhile keeps plx_store_fd() readable for the next pass. A poll per
     * round of deferred callbacks was three per request served (a system call each on iSCSI),
     * finding nothing: the write cache's requests complete from the log, not from the store. */
    uint64_t polled_at = st->be_submits;
    bool poll_main = true;
    for (;;) {
        int rc = 0;
        if (poll_main || st->be_submits != polled_at) {
            polled_at = st->be_submits;
            poll_main = false;
            rc = st->be->ops->poll(st->be, 0);
        }
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
            st->in_service = false;
            return plx_err(st, rc, "polling %s: %s", st->be->desc, strerror(-rc));
        }
        rc = poll_side(st, 0);
        if (rc < 0) {
            st->in_service = false;
            return rc;
        }
        plx_run_ready(st);
        if (!st->deferred_head)
            break;
        while (st->deferred_head) {
            struct plx_deferred *d = st->deferred_head;
            st->deferred_head = d->next;
            if (!st->deferred_head)
                st->deferred_tail = NULL;
            ran++;
            d->run(d);
        }
    }
    st->in_service = false;
    return ran;
}

/* Blocking internal wait: run engine I/O handlers until *flag is set. User callbacks are not
 * run here (they stay queued for the next plx_store_service), so admin paths may use this. */
int plx_drive_until(plx_store *st, const int *flag)
{
    plx_run_ready(st);
    while (!*flag) {
        if (!st->internal_ios && !st->ready_head)
            return plx_err(st, -EDEADLK, "internal wait with nothing in flight");
        /* Wait on the medium that has I/O in flight (the side medium: only the write log). */
        bool main_busy = st->be->ops->inflight(st->be) > 0 || !st->side_be;
        int rc = !main_busy ? 0 : st->side_be ? st->be->ops->poll(st->be, 10) : plx_poll_medium(st);
        if (rc < 0 && rc != -EINTR)
            return plx_err(st, rc, "polling %s: %s", st->be->desc, strerror(-rc));
        rc = poll_side(st, main_busy ? 0 : -1);
        if (rc < 0)
            return rc;
        plx_run_ready(st);
    }
    return 0;
}

/* Blocking: run only the handlers `handler` of completed engine I/O until *busy is false; every
 * other completion stays queued, in order, for the service loop. For an admin step that must
 * wait for one asynchronous job of its own layer (alloc.c: a claim ahead in flight) from inside
 * the I/O path, where running other handlers would re-enter the caller. */
int plx_drive_handler_while(plx_store *st, void (*handler)(plx_store *st, struct plx_ev *ev),
                            const bool *busy)
{
    for (;;) {
        struct plx_ev *prev = NULL, *ev = st->ready_head;
        while (ev) {
            if (ev->handler != handler) {
                prev = ev;
                ev = ev->next;
                continue;
            }
            if (prev)
                prev->next = ev->next;
            else
                st->ready_head = ev->next;
            if (st->ready_tail == ev)
                st->ready_tail = prev;
            st->internal_ios--;
            handler(st, ev);
            prev = NULL; /* the handler may have queued or reaped more: look again */
            ev = st->ready_head;
        }
        if (!*busy)
            return 0;
        if (st->be->ops->inflight(st->be) == 0)
            return plx_err(st, -EDEADLK, "internal wait with nothing in flight");
        int rc = plx_poll_medium(st);
        if (rc < 0 && rc != -EINTR)
            return plx_err(st, rc, "polling %s: %s", st->be->desc, strerror(-rc));
    }
}

int plx_engine_init(plx_store *st)
{
    st->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    st->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    st->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (st->wake_fd < 0 || st->epoll_fd < 0 || st->timer_fd < 0)
        return plx_err(st, -errno, "creating event descriptors: %s", strerror(errno));
    struct epoll_event e = {.events = EPOLLIN};
    if (epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, st->wake_fd, &e) != 0 ||
        epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, st->timer_fd, &e) != 0)
        return plx_err(st, -errno, "epoll_ctl: %s", strerror(errno));
    int bfd = st->be->ops->fd(st->be);
    if (bfd >= 0 && epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, bfd, &e) != 0)
        return plx_err(st, -errno, "epoll_ctl: %s", strerror(errno));
    return 0;
}

void plx_engine_free(plx_store *st)
{
    if (st->wake_fd >= 0)
        close(st->wake_fd);
    if (st->epoll_fd >= 0)
        close(st->epoll_fd);
    if (st->timer_fd >= 0)
        close(st->timer_fd);
    st->wake_fd = st->epoll_fd = st->timer_fd = -1;
    st->timers = NULL;
    st->timer_fd_at = 0;
}

bool plx_engine_busy(const plx_store *st)
{
    return st->internal_ios || st->ready_head || st->deferred_head || st->turn_head;
}

int plx_engine_watch_fd(plx_store *st, int fd)
{
    struct epoll_event e = {.events = EPOLLIN};
    if (epoll_ctl(st->epoll_fd, EPOLL_CTL_ADD, fd, &e) != 0)
        return plx_err(st, -errno, "epoll_ctl: %s", strerror(errno));
    return 0;
}

void plx_engine_unwatch_fd(plx_store *st, int fd)
{
    struct epoll_event e = {0};
    (void)epoll_ctl(st->epoll_fd, EPOLL_CTL_DEL, fd, &e);
}

void plx_fence(plx_store *st, const char *fmt, ...)
{
    if (st->fenced)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->errmsg, sizeof st->errmsg, fmt, ap);
    va_end(ap);
    st->fenced = true;
    st->fatal = -ESTALE;
}
