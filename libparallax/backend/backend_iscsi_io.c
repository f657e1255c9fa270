/*
 * backend_iscsi_io.c - the iSCSI backend's requests (the bottom of its three files): the
 * request lists, libiscsi tasks for READ(16), WRITE(16), SYNCHRONIZE CACHE and UNMAP, what a
 * finished task means (done, retry, held for the registration check, failed), the held list's
 * release, the backend's event set (libiscsi's socket, the clock) and libiscsi's log.
 *
 * The session (backend_iscsi_session.c: losing the connection, logging in again) and the seam,
 * fencing and opening (backend_iscsi.c) sit above it and call down into it; it calls neither.
 * backend_iscsi.c's header describes the event model, completions and the reconnect as a whole.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>

#include "backend.h"
#include "backend_iscsi_shared.h"

#define TICK_MS 250 /* libiscsi's clock while I/O is in flight or a reconnect waits */

/* ---- Lists and signals (the lists and the completion queue are backend_done.h's) ------------ */

void plx_iscsi_list_push(struct plx_done_list *l, struct iscsi_req *r)
{
    plx_done_push(l, &r->done);
}

struct iscsi_req *plx_iscsi_list_pop(struct plx_done_list *l)
{
    struct plx_done *d = plx_done_pop(l);
    return d != NULL ? plx_iscsi_req(d) : NULL;
}

static void all_add(struct iscsi_backend *b, struct iscsi_req *r)
{
    r->all_prev = NULL;
    r->all_next = b->all;
    if (b->all != NULL)
        b->all->all_prev = r;
    b->all = r;
}

static void all_remove(struct iscsi_backend *b, struct iscsi_req *r)
{
    if (r->all_prev != NULL)
        r->all_prev->all_next = r->all_next;
    else
        b->all = r->all_next;
    if (r->all_next != NULL)
        r->all_next->all_prev = r->all_prev;
    r->all_prev = r->all_next = NULL;
}

void plx_iscsi_finish(struct iscsi_backend *b, struct iscsi_req *r, int status)
{
    plx_done_finish(&b->done, &r->done, status);
}

/* ---- The event set -------------------------------------------------------------------------- */

/* Register libiscsi's socket for what it wants now. Called after anything that may change the
 * answer: a submit (PDUs to send), a service call (a reconnect replaces the socket behind the same
 * number, so that path re-registers unconditionally: force). */
void plx_iscsi_sync_socket(struct iscsi_backend *b, int force)
{
    if (b->blocking)
        return;
    int fd = iscsi_get_fd(b->iscsi);
    int want = fd >= 0 ? iscsi_which_events(b->iscsi) : 0;
    int ev = (want & POLLIN ? EPOLLIN : 0) | (want & POLLOUT ? EPOLLOUT : 0);
    if (!force && fd == b->sock_fd && ev == b->sock_events)
        return;
    if (b->sock_fd >= 0 && (fd != b->sock_fd || ev == 0)) {
        /* ENOENT/EBADF: the old description is gone already (closed or replaced). */
        epoll_ctl(b->epfd, EPOLL_CTL_DEL, b->sock_fd, NULL);
        b->sock_fd = -1;
    }
    if (fd < 0 || ev == 0) {
        /* No events wanted (a reconnect backs off): wake on the clock instead. A socket that
         * wants nothing is not registered at all, or its POLLHUP would spin the loop. */
        b->sock_events = 0;
        return;
    }
    struct epoll_event e = {.events = (uint32_t)ev};
    int rc = -1;
    if (b->sock_fd == fd)
        rc = epoll_ctl(b->epfd, EPOLL_CTL_MOD, fd, &e);
    if (rc != 0)
        rc = epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &e);
    if (rc != 0 && errno == EEXIST)
        rc = epoll_ctl(b->epfd, EPOLL_CTL_MOD, fd, &e);
    if (rc != 0) {
        perror("parallax: iscsi: epoll_ctl");
        b->sock_fd = -1;
        return;
    }
    b->sock_fd = fd;
    b->sock_events = ev;
}

/* The clock runs while anything could need iscsi_service() without socket events: I/O in flight
 * (libiscsi's timeouts) or a reconnect backing off. */
void plx_iscsi_set_ticking(struct iscsi_backend *b, int on)
{
    if (b->blocking || b->ticking == on)
        return;
    struct itimerspec its = {{0, 0}, {0, 0}};
    if (on) {
        its.it_interval.tv_nsec = TICK_MS * 1000000L;
        its.it_value = its.it_interval;
    }
    if (timerfd_settime(b->tfd, 0, &its, NULL) == 0)
        b->ticking = on;
}

/* ---- Request outcome ------------------------------------------------------------------------ */

int plx_iscsi_retryable(int status, const struct scsi_task *task)
{
    if (status == SCSI_STATUS_BUSY || status == SCSI_STATUS_TASK_SET_FULL)
        return 1;
    /* A target that restarted, or a LUN that was resized or reset, says so once per nexus. */
    return status == SCSI_STATUS_CHECK_CONDITION && task != NULL &&
           task->sense.key == SCSI_SENSE_UNIT_ATTENTION;
}

static const char *const op_names[] = {"read", "write", "flush", "trim"};

/* What a finished task means for its request: 0, -EIO, or 1 = issue it again. */
int plx_iscsi_task_outcome(struct iscsi_backend *b, struct iscsi_req *r, int status,
                           struct scsi_task *task)
{
    if (status == SCSI_STATUS_GOOD) {
        /* No partial transfers: a read or write that moved less than asked failed. */
        if (task != NULL && task->residual_status != SCSI_RESIDUAL_NO_RESIDUAL &&
            task->residual != 0 &&
            (r->done.io->op == PLX_IO_READ || r->done.io->op == PLX_IO_WRITE))
            return -EIO;
        return 0;
    }
    if (plx_iscsi_retryable(status, task) && r->retries++ < MAX_RETRIES)
        return 1;
    /* Refused by a reservation: preempted (fenced), our registration belonged to a session that
     * was replaced by a reconnect, or a restarted target forgot it. rejoin_try tells which. */
    if (status == SCSI_STATUS_RESERVATION_CONFLICT && b->pr_key != 0)
        return b->fenced ? -ESTALE : 2;
    if (status == SCSI_STATUS_CHECK_CONDITION && task != NULL)
        fprintf(stderr, "parallax: %s: %s of block %llu failed: %s (%s)\n", b->base.desc,
                op_names[r->done.io->op], (unsigned long long)r->done.io->block,
                scsi_sense_key_str(task->sense.key), scsi_sense_ascq_str(task->sense.ascq));
    else if (status != SCSI_STATUS_CANCELLED)
        fprintf(stderr, "parallax: %s: SCSI status 0x%x: %s\n", b->base.desc, (unsigned)status,
                iscsi_get_error(b->iscsi));
    return -EIO;
}

/* ---- Asynchronous path ---------------------------------------------------------------------- */

static void task_cb(struct iscsi_context *iscsi, int status, void *command_data, void *private);

/* The next UNMAP of a trim: at most max_unmap LBAs from where the last one ended. */
void plx_iscsi_next_unmap(const struct iscsi_backend *b, struct iscsi_req *r)
{
    uint64_t total = (uint64_t)r->done.io->nblocks * b->lbas_per_block;
    uint64_t left = total - r->trimmed;
    r->unmap.lba = r->done.io->block * b->lbas_per_block + r->trimmed;
    r->unmap.num = (uint32_t)(left < b->max_unmap ? left : b->max_unmap);
}

/* A trim longer than one UNMAP goes on with the next (1), or is over (0). */
int plx_iscsi_trim_continues(const struct iscsi_backend *b, struct iscsi_req *r)
{
    if (r->done.io->op != PLX_IO_TRIM)
        return 0;
    r->trimmed += r->unmap.num;
    return r->trimmed < (uint64_t)r->done.io->nblocks * b->lbas_per_block;
}

int plx_iscsi_issue(struct iscsi_backend *b, struct iscsi_req *r)
{
    struct plx_io *io = r->done.io;
    if (!b->blocking && b->conn != CONN_UP) {
        /* The session is being re-established (backend_iscsi_session.c): sent after the login
         * (and, for a write, the registration check). */
        plx_iscsi_list_push(&b->held, r);
        return 0;
    }
    if (b->pr_key != 0 && !b->blocking && io->op != PLX_IO_READ && b->rejoin) {
        /* Our registration is in doubt: nothing that writes goes out until rejoin_try has
         * settled it. Reads are never refused by a write-exclusive reservation. */
        plx_iscsi_registration_in_doubt(b);
        plx_iscsi_list_push(&b->held, r);
        return 0;
    }
    uint64_t lba = io->block * b->lbas_per_block;
    uint32_t len = io->nblocks * PLX_BLOCK_SIZE;
    struct scsi_task *t = NULL;

    switch (io->op) {
    case PLX_IO_READ:
        t = iscsi_read16_task(b->iscsi, b->lun, lba, len, (int)b->lba_size, 0, 0, 0, 0, 0, task_cb,
                              r);
        /* Into the engine's buffer directly. Data cannot arrive before the loop runs again. */
        if (t != NULL && scsi_task_add_data_in_buffer(t, (int)len, io->buf) != 0) {
            /* The cancelled task's callback completes the request with -EIO. */
            r->task = t;
            r->cancelling = 1;
            all_add(b, r);
            iscsi_scsi_cancel_task(b->iscsi, t);
            return 0;
        }
        break;
    case PLX_IO_WRITE:
        t = iscsi_write16_task(b->iscsi, b->lun, lba, io->buf, len, (int)b->lba_size, 0, 0,
                               (io->flags & PLX_IO_FUA) != 0, 0, 0, task_cb, r);
        break;
    case PLX_IO_FLUSH:
        /* lba 0, 0 blocks: the whole LUN's volatile cache. */
        t = iscsi_synchronizecache10_task(b->iscsi, b->lun, 0, 0, 0, 0, task_cb, r);
        break;
    case PLX_IO_TRIM:
        plx_iscsi_next_unmap(b, r);
        t = iscsi_unmap_task(b->iscsi, b->lun, 0, 0, &r->unmap, 1, task_cb, r);
        break;
    }
    if (t == NULL)
        return -EIO;
    r->task = t;
    all_add(b, r);
    return 0;
}

static void task_cb(struct iscsi_context *iscsi, int status, void *command_data, void *private)
{
    struct iscsi_req *r = private;
    struct iscsi_backend *b = r->b;
    struct scsi_task *task = command_data;
    (void)iscsi;

    if (r->abandoned) {
        /* Already failed with -EIO; the memory stays until destroy. */
        if (task != NULL)
            scsi_free_scsi_task(task);
        r->task = NULL;
        return;
    }
    all_remove(b, r);
    if (status == SCSI_STATUS_CANCELLED && !r->cancelling && !b->blocking) {
        /* libiscsi cancels what it holds when the connection drops (its own reconnect is off)
         * and when we destroy the context: the request is held, unsent, until a new session is
         * logged in and our registration is settled (backend_iscsi_session.c). */
        if (task != NULL)
            scsi_free_scsi_task(task);
        r->task = NULL;
        b->dropped = 1;
        plx_iscsi_list_push(&b->held, r);
        return;
    }
    int rc = plx_iscsi_task_outcome(b, r, status, task);
    if (task != NULL)
        scsi_free_scsi_task(task);
    r->task = NULL;
    if (rc == 0 && plx_iscsi_trim_continues(b, r))
        rc = 1;
    if (rc == 1) {
        /* Not from inside libiscsi's callback: poll() issues it again after the service call. */
        plx_iscsi_list_push(&b->retry, r);
        return;
    }
    if (rc == 2 && r->retries++ < MAX_RETRIES) {
        /* Refused by the reservation: held until poll() has settled our registration (it may
         * send commands of its own, which it cannot do from inside libiscsi's callback). */
        plx_iscsi_registration_in_doubt(b);
        plx_iscsi_list_push(&b->held, r);
        return;
    }
    plx_iscsi_finish(b, r, rc == 2 ? -EIO : rc);
}

void plx_iscsi_run_retries(struct iscsi_backend *b)
{
    struct iscsi_req *r;
    while ((r = plx_iscsi_list_pop(&b->retry)) != NULL) {
        int rc = b->dead ? -EIO : plx_iscsi_issue(b, r);
        if (rc < 0)
            plx_iscsi_finish(b, r, rc);
    }
}

/* Everything libiscsi holds fails with -EIO now; libiscsi may still call back for those tasks
 * (at destroy), which then only frees them. */
void plx_iscsi_fail_all(struct iscsi_backend *b, const char *why)
{
    if (!b->dead)
        fprintf(stderr, "parallax: %s: %s; failing I/O with EIO\n", b->base.desc, why);
    b->dead = 1;
    while (b->all != NULL) {
        struct iscsi_req *r = b->all;
        all_remove(b, r);
        /* libiscsi keeps r as its callback's private data: r stays allocated (until destroy),
         * marked abandoned, and a copy carries the -EIO completion to the ready list. */
        struct iscsi_req *d = malloc(sizeof(*d));
        if (d == NULL)
            abort();
        *d = *r;
        d->task = NULL;
        plx_iscsi_finish(b, d, -EIO);
        r->abandoned = 1;
        r->done.next = b->abandoned ? &b->abandoned->done : NULL;
        b->abandoned = r;
    }
    while (b->retry.head != NULL)
        plx_iscsi_finish(b, plx_iscsi_list_pop(&b->retry), -EIO);
    while (b->held.head != NULL)
        plx_iscsi_finish(b, plx_iscsi_list_pop(&b->held), -EIO);
}

/* Our registration may be gone: hold writes until rejoin_try settles it. */
void plx_iscsi_registration_in_doubt(struct iscsi_backend *b)
{
    if (b->pr_key == 0 || b->fenced || b->rejoin)
        return;
    b->rejoin = 1;
    b->rejoin_checked = 0;
    b->rejoin_key_gone = 0;
    b->rejoin_since_ns = plx_mono_ns();
}

/* The held requests go out, in order (only ever filled in asynchronous mode). */
void plx_iscsi_release_held(struct iscsi_backend *b)
{
    /* plx_iscsi_issue() may hold a request again */
    struct plx_done_list held = plx_done_take(&b->held);
    struct iscsi_req *r;
    while ((r = plx_iscsi_list_pop(&held)) != NULL) {
        int rc = b->dead ? -EIO : plx_iscsi_issue(b, r);
        if (rc < 0)
            plx_iscsi_finish(b, r, rc);
    }
}

/* libiscsi's log. While a backend opens, its first error is kept for the open's own message
 * (libiscsi's last error is often a consequence, not the cause) and nothing is printed. Later, the
 * connection's story (lost, reconnect attempts) goes to stderr, without the UNIT ATTENTIONs that
 * every reconnect brings and the backend retries. */
static __thread int log_opening;
static __thread char log_first[256];

void plx_iscsi_log_fn(int level, const char *message)
{
    (void)level;
    if (log_opening) {
        if (log_first[0] == '\0')
            snprintf(log_first, sizeof(log_first), "%s", message);
        return;
    }
    if (strstr(message, "UNIT_ATTENTION") != NULL)
        return;
    fprintf(stderr, "parallax: iscsi: %s\n", message);
}
void plx_iscsi_log_capture(int on)
{
    log_opening = on;
    if (on)
        log_first[0] = '\0';
}

const char *plx_iscsi_log_first(void)
{
    return log_first;
}
