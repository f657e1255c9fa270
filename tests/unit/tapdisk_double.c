/*
 * tapdisk_double.c - test double of the tapdisk functions a driver calls (see tapdisk_double.h).
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tapdisk_double.h"

/* ---- Completions ----------------------------------------------------------------------------- */

static struct tdd_completion *completions;
static size_t ncompletions, completions_cap;

void td_complete_request(td_request_t treq, int res)
{
    if (ncompletions == completions_cap) {
        size_t cap = completions_cap ? completions_cap * 2 : 256;
        struct tdd_completion *c = realloc(completions, cap * sizeof *c);
        if (!c) {
            fprintf(stderr, "tapdisk double: out of memory\n");
            abort();
        }
        completions = c;
        completions_cap = cap;
    }
    completions[ncompletions].req = treq;
    completions[ncompletions].status = res;
    ncompletions++;
    /* The real td_complete_request calls the request's callback; requests made by
     * tdd_request have none. */
    if (treq.cb)
        treq.cb(treq, res);
}

size_t tdd_completion_count(void)
{
    return ncompletions;
}

const struct tdd_completion *tdd_completion_at(size_t i)
{
    return i < ncompletions ? &completions[i] : NULL;
}

unsigned tdd_completions_of(const void *tag, int *status)
{
    unsigned n = 0;
    for (size_t i = 0; i < ncompletions; i++) {
        if (completions[i].req.cb_data == tag) {
            n++;
            if (status)
                *status = completions[i].status;
        }
    }
    return n;
}

uint64_t tdd_sectors_completed_of(const void *tag)
{
    uint64_t secs = 0;
    for (size_t i = 0; i < ncompletions; i++)
        if (completions[i].req.cb_data == tag)
            secs += (uint64_t)completions[i].req.secs;
    return secs;
}

/* ---- Log ------------------------------------------------------------------------------------- */

#define TDD_LOG_LINES 128
static char log_lines[TDD_LOG_LINES][512];
static unsigned nlog;

void tlog_syslog(int level, const char *fmt, ...)
{
    char *line = log_lines[nlog % TDD_LOG_LINES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof log_lines[0], fmt, ap);
    va_end(ap);
    nlog++;
    const char *v = getenv("TDD_VERBOSE");
    if (v && *v && strcmp(v, "0") != 0)
        fprintf(stderr, "tapdisk[%d]: %s\n", level, line);
}

unsigned tdd_log_count(void)
{
    return nlog;
}

int tdd_log_contains(const char *needle)
{
    unsigned first = nlog > TDD_LOG_LINES ? nlog - TDD_LOG_LINES : 0;
    for (unsigned i = first; i < nlog; i++)
        if (strstr(log_lines[i % TDD_LOG_LINES], needle))
            return 1;
    return 0;
}

const char *tdd_log_last(void)
{
    return nlog ? log_lines[(nlog - 1) % TDD_LOG_LINES] : "";
}

void tdd_reset(void)
{
    free(completions);
    completions = NULL;
    ncompletions = completions_cap = 0;
    nlog = 0;
}

/* ---- Events ---------------------------------------------------------------------------------- */

#define TDD_MAX_EVENTS 64

struct tdd_event {
    int used;
    event_id_t id;
    char mode;
    int fd;
    event_cb_t cb;
    void *private;
    /* SCHEDULER_POLL_TIMEOUT: due in the next round (the driver only ever arms TV_ZERO: now). */
    int due;
};

static unsigned timeout_sets;

static struct tdd_event events[TDD_MAX_EVENTS];
static event_id_t next_event_id = 1;
static unsigned bad_unregisters;

event_id_t tapdisk_server_register_event(char mode, int fd, struct timeval timeout, event_cb_t cb,
                                         void *private)
{
    if (!cb ||
        ((mode & (SCHEDULER_POLL_READ_FD | SCHEDULER_POLL_WRITE_FD | SCHEDULER_POLL_EXCEPT_FD)) &&
         fd < 0))
        return -EINVAL;
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (events[i].used)
            continue;
        int due = (mode & SCHEDULER_POLL_TIMEOUT) && timeout.tv_sec >= 0;
        events[i] = (struct tdd_event){.used = 1,
                                       .id = next_event_id++,
                                       .mode = mode,
                                       .fd = fd,
                                       .cb = cb,
                                       .private = private,
                                       .due = due};
        return events[i].id;
    }
    return -ENOMEM;
}

void tapdisk_server_unregister_event(event_id_t id)
{
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (events[i].used && events[i].id == id) {
            events[i].used = 0;
            return;
        }
    }
    bad_unregisters++;
}

int tapdisk_server_event_set_timeout(event_id_t id, struct timeval timeout)
{
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (events[i].used && events[i].id == id) {
            if (!(events[i].mode & SCHEDULER_POLL_TIMEOUT))
                return -EINVAL;
            timeout_sets++;
            events[i].due = timeout.tv_sec >= 0;
            return 0;
        }
    }
    return -ENOENT;
}

unsigned tdd_timeout_sets(void)
{
    return timeout_sets;
}

unsigned tdd_event_count(void)
{
    unsigned n = 0;
    for (int i = 0; i < TDD_MAX_EVENTS; i++)
        n += events[i].used != 0;
    return n;
}

unsigned tdd_bad_unregisters(void)
{
    return bad_unregisters;
}

/* Run one event's callback if it is still registered (an earlier callback of the same round may
 * have unregistered it, as tapdisk's scheduler allows). */
static int fire_id(event_id_t id, char mode)
{
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (events[i].used && events[i].id == id) {
            struct tdd_event ev = events[i];
            ev.cb(ev.id, mode, ev.private);
            return 1;
        }
    }
    return 0;
}

/* One round of tapdisk's scheduler: wait for the read descriptors (not at all when a timeout
 * event is due, as select with a zero timeout), then run the ready and due events in the order
 * they were registered; a due timeout event stays due (tapdisk re-arms it with its timeout)
 * until its owner sets it off. */
int tdd_fire_ready(int timeout_ms)
{
    struct pollfd pfd[TDD_MAX_EVENTS];
    event_id_t ids[TDD_MAX_EVENTS];
    char modes[TDD_MAX_EVENTS];
    int slot_of_fd[TDD_MAX_EVENTS];
    int n = 0, due = 0;
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        slot_of_fd[i] = -1;
        if (events[i].used && (events[i].mode & SCHEDULER_POLL_TIMEOUT) && events[i].due)
            due = 1;
        if (!events[i].used || !(events[i].mode & SCHEDULER_POLL_READ_FD))
            continue;
        pfd[n].fd = events[i].fd;
        pfd[n].events = POLLIN;
        pfd[n].revents = 0;
        slot_of_fd[i] = n;
        n++;
    }
    if (n == 0 && !due)
        return 0;
    int rc = n ? poll(pfd, (nfds_t)n, due ? 0 : timeout_ms) : 0;
    if (rc < 0)
        return 0;
    int m = 0;
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (!events[i].used)
            continue;
        int j = slot_of_fd[i];
        if (j >= 0 && (pfd[j].revents & (POLLIN | POLLERR | POLLHUP))) {
            ids[m] = events[i].id;
            modes[m++] = SCHEDULER_POLL_READ_FD;
        } else if ((events[i].mode & SCHEDULER_POLL_TIMEOUT) && events[i].due) {
            ids[m] = events[i].id;
            modes[m++] = SCHEDULER_POLL_TIMEOUT;
        }
    }
    int fired = 0;
    for (int i = 0; i < m; i++)
        fired += fire_id(ids[i], modes[i]);
    return fired;
}

int tdd_fire_all(void)
{
    event_id_t ids[TDD_MAX_EVENTS];
    char modes[TDD_MAX_EVENTS];
    int n = 0;
    for (int i = 0; i < TDD_MAX_EVENTS; i++) {
        if (events[i].used) {
            ids[n] = events[i].id;
            modes[n] = events[i].mode;
            n++;
        }
    }
    int fired = 0;
    for (int i = 0; i < n; i++)
        fired += fire_id(ids[i], modes[i]);
    return fired;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tdd_run_until(size_t n, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    while (ncompletions < n) {
        long long left = deadline - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        tdd_fire_ready(left > 100 ? 100 : (int)left);
    }
    return 0;
}

/* ---- Drivers and requests ------------------------------------------------------------------ */

td_driver_t *tdd_driver_new(const struct tap_disk *ops, const char *name)
{
    td_driver_t *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->ops = ops;
    d->storage = -1;
    d->name = strdup(name ? name : "");
    d->data = calloc(1, (size_t)ops->private_data_size);
    if (!d->name || !d->data) {
        free(d->name);
        free(d->data);
        free(d);
        return NULL;
    }
    return d;
}

void tdd_driver_free(td_driver_t *driver)
{
    if (!driver)
        return;
    free(driver->name);
    free(driver->data);
    free(driver);
}

td_request_t tdd_request(int op, void *buf, td_sector_t sec, int secs, void *tag)
{
    td_request_t r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.buf = buf;
    r.sec = sec;
    r.secs = secs;
    r.cb_data = tag;
    return r;
}

/* ---- Opening stores (the driver's plx_store_open in the test build) ------------------------- */

int (*tdd_store_opener)(const char *path, const struct plx_open_opts *opts, plx_store **out,
                        char *errbuf, size_t errlen);

int tdd_store_open(const char *path, const struct plx_open_opts *opts, plx_store **out,
                   char *errbuf, size_t errlen)
{
    if (tdd_store_opener)
        return tdd_store_opener(path, opts, out, errbuf, errlen);
    return plx_store_open(path, opts, out, errbuf, errlen);
}
