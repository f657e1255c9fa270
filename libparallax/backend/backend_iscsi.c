/*
 * backend_iscsi.c - an iSCSI LUN through libiscsi, driven the way libiscsi is meant to be driven:
 * its socket, the events it wants (iscsi_which_events) and its service call, inside the engine's
 * event loop.
 *
 * The LUN is named by a URL, iscsi://[user%password@]host[:port]/TARGET-IQN/LUN. The engine's
 * 4 KiB blocks become LBAs of the LUN's logical block size (512 to 4096 bytes). Reads and writes
 * are READ(16) and WRITE(16) straight from and into the engine's buffers; a FUA write sets the FUA
 * bit of WRITE(16); a flush is SYNCHRONIZE CACHE(10) over the whole LUN.
 *
 * The event model. The seam asks for one descriptor that stays the same for the backend's life
 * and is readable whenever poll() has work. libiscsi's socket is not that descriptor: it wants
 * POLLOUT while PDUs wait to be sent, it is a new socket (a new context's) after the session is
 * re-established, and while logging in again backs off there is no socket at all and the next
 * attempt is due on a clock. So the backend's descriptor is an epoll set of its own holding: the
 * socket, registered for exactly what iscsi_which_events() says and re-registered after every
 * service call (an EPOLLOUT wish of libiscsi thus makes the backend's fd readable); a timerfd that
 * ticks while I/O is in flight, the session is being re-established or the registration is in
 * doubt; and an eventfd that says completions wait in the ready list. The host's epoll set watches
 * that one fd for POLLIN, as for every other backend.
 *
 * Four files, each calling only down: backend_iscsi_io.c (requests, the event set, libiscsi's
 * log), backend_iscsi_session.c (the session), backend_iscsi_fence.c (fencing: persistent
 * reservations, registering again) and this one (the seam's operations, opening), sharing
 * backend_iscsi_shared.h.
 *
 * Completions. libiscsi's callbacks run inside iscsi_service(), which only poll() calls. They
 * never call io->done: they move the request to the ready list, and poll() delivers the list, so
 * done never runs inside submit() and a callback may submit more.
 *
 * A dropped connection (backend_iscsi_session.c). libiscsi's automatic reconnect is off: it would
 * re-send the commands in flight at login, before our registration check, and a write of a host
 * that was fenced meanwhile could land. When the connection drops (POLLHUP, POLLERR, the target
 * closing its side, a failed read or write) every request libiscsi held comes back cancelled and
 * waits, unsent, in the held list, with the ones submitted meanwhile. A fresh context logs in
 * asynchronously; then the held requests go out, writes only once rejoin_try has settled our
 * registration (reads too wait for that, being in the same list). Each is whole (a WRITE carries
 * all its data again, and the engine never has two overlapping writes in flight, so a re-issued
 * write cannot undo a later one). A request completes only when the target has answered it GOOD.
 * A UNIT ATTENTION (what a restarted target answers first) or BUSY/TASK SET FULL is retried a few
 * times. When logging in fails $PARALLAX_ISCSI_RETRIES times in a row (default 8, about 30 s of
 * back-off) every held request fails with -EIO, later ones too, and the backend says so on
 * stderr: a write is never reported done when the target did not confirm it.
 *
 * Blocking mode (PLX_BACKEND_BLOCKING, short-lived tools) uses libiscsi's synchronous calls, which
 * libiscsi builds on the same asynchronous machinery: each I/O runs to completion inside submit()
 * and is delivered by the next poll(), as in the file backend. A command that meets a dropped
 * connection is sent again after a synchronous login and, when fencing, rejoin_wait.
 *
 * Fencing (plx_backend_fence_ops; docs/DESIGN.md "The lock manager"): SCSI-3 persistent
 * reservations. A writing engine of a store with a lock manager registers its key, the LUN is
 * reserved "write exclusive, registrants only", and a host taking over a dead holder's locks
 * preempts that holder's key; the preempted engine's commands then meet RESERVATION CONFLICT and
 * fail with -ESTALE.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>

#include "backend.h"
#include "backend_iscsi_shared.h"
#include "backend_mem_shared.h"
#include "test_hooks.h"

#define ISCSI_PREFIX "iscsi://"
#define DEFAULT_RECONNECTS 8 /* failed login attempts before I/O fails with -EIO */

/* TCP_CORK on (1) or off (0, which sends what it held); false when it cannot be set. */
static bool set_cork(int fd, int on)
{
    return setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof on) == 0;
}

/* One round of libiscsi's event processing, without waiting. */
static void service(struct iscsi_backend *b)
{
    uint64_t ticks = 0;
    int tick = read(b->tfd, &ticks, sizeof(ticks)) > 0;
    int fd = iscsi_get_fd(b->iscsi);
    int want = fd >= 0 ? iscsi_which_events(b->iscsi) : 0;
    short revents = 0;
    if (fd >= 0 && want != 0) {
        /* POLLRDHUP: a target that closed its side is gone, even while it has data for us. */
        struct pollfd p = {.fd = fd, .events = (short)(want | POLLRDHUP)};
        if (poll(&p, 1, 0) > 0)
            revents = p.revents;
    }
    if (revents != 0 || tick || want == 0) {
        if (b->conn == CONN_UP && !b->dead) {
            /* Responses that arrived before a hangup are processed first; with its reconnect
             * off, libiscsi then cancels what it still holds (held by task_cb). */
            /* Corked while libiscsi writes out what is queued, one PDU after another: the
             * PDUs of one call leave in full segments when uncorked at its end, not a segment
             * (and a wake-up of the target) each. The write cache's drain sends hundreds of
             * 4 KiB WRITEs at once (bench/notes/wcache.md, "QD1 mean with the drain beside the
             * writer"). */
            bool cork = (revents & POLLOUT) != 0 && set_cork(fd, 1);
            int rc = iscsi_service(b->iscsi, revents & ~POLLRDHUP);
            if (cork && iscsi_get_fd(b->iscsi) == fd)
                set_cork(fd, 0); /* (a reconnect replaced the socket: the new one is not corked) */
            if (rc < 0 || b->dropped || (revents & (POLLHUP | POLLERR | POLLRDHUP)))
                plx_iscsi_session_lost(b, rc < 0 ? iscsi_get_error(b->iscsi)
                                                 : "the connection was closed");
        }
        if (b->conn != CONN_UP)
            plx_iscsi_session_step(b, revents & ~POLLRDHUP);
        plx_iscsi_run_retries(b);
        plx_iscsi_sync_socket(b, 1);
    }
    plx_iscsi_set_ticking(b, (b->inflight > 0 || b->conn != CONN_UP || b->rejoin) && !b->dead);
}

/* Wait up to ms (-1: forever) for the socket or the clock. */
static int wait_events(struct iscsi_backend *b, int ms)
{
    struct epoll_event e;
    int rc = epoll_wait(b->epfd, &e, 1, ms);
    if (rc < 0 && errno != EINTR)
        return -errno;
    return 0;
}

/* ---- Blocking path -------------------------------------------------------------------------- */

static int run_blocking(struct iscsi_backend *b, struct iscsi_req *r)
{
    struct plx_io *io = r->done.io;
    uint64_t lba = io->block * b->lbas_per_block;
    uint32_t len = io->nblocks * PLX_BLOCK_SIZE;

    for (;;) {
        struct scsi_task *t = NULL;
        switch (io->op) {
        case PLX_IO_READ:
            t = iscsi_read16_sync(b->iscsi, b->lun, lba, len, (int)b->lba_size, 0, 0, 0, 0, 0);
            break;
        case PLX_IO_WRITE:
            t = iscsi_write16_sync(b->iscsi, b->lun, lba, io->buf, len, (int)b->lba_size, 0, 0,
                                   (io->flags & PLX_IO_FUA) != 0, 0, 0);
            break;
        case PLX_IO_FLUSH:
            t = iscsi_synchronizecache10_sync(b->iscsi, b->lun, 0, 0, 0, 0);
            break;
        case PLX_IO_TRIM:
            plx_iscsi_next_unmap(b, r);
            t = iscsi_unmap_sync(b->iscsi, b->lun, 0, 0, &r->unmap, 1);
            break;
        }
        if (t == NULL || t->status == SCSI_STATUS_CANCELLED) {
            /* The session is gone (libiscsi's reconnect is off: it sent nothing again). Log in
             * again, settle the registration, then send the command again. */
            const char *why = t != NULL ? "the connection was closed" : iscsi_get_error(b->iscsi);
            char whybuf[256];
            snprintf(whybuf, sizeof(whybuf), "%s", why);
            if (t != NULL)
                scsi_free_scsi_task(t);
            if (r->retries++ >= MAX_RETRIES || plx_iscsi_reconnect_blocking(b, whybuf) < 0)
                return -EIO;
            if (b->pr_key != 0) {
                int joined = plx_iscsi_rejoin_wait(b);
                if (joined < 0)
                    return joined;
            }
            continue;
        }
        int rc = plx_iscsi_task_outcome(b, r, t->status, t);
        if (rc == 2) {
            int joined = r->retries++ < MAX_RETRIES ? plx_iscsi_rejoin_wait(b) : -EIO;
            rc = joined == 0 ? 1 : joined;
        }
        if (rc == 0 && io->op == PLX_IO_READ) {
            if (t->datain.data == NULL || t->datain.size < (int)len)
                rc = -EIO;
            else
                memcpy(io->buf, t->datain.data, len);
        }
        scsi_free_scsi_task(t);
        if (rc == 0 && plx_iscsi_trim_continues(b, r))
            rc = 1;
        if (rc != 1)
            return rc;
    }
}

/* ---- The seam ------------------------------------------------------------------------------- */

static int iscsi_submit(plx_backend *be, struct plx_io *io)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    int rc = 0;
    if (io != NULL && io->op == PLX_IO_TRIM) {
        if (io->done == NULL || io->nblocks == 0 || io->nblocks > be->nblocks ||
            io->block > be->nblocks - io->nblocks)
            return -EINVAL;
        if (b->max_unmap == 0)
            return -EOPNOTSUPP;
    } else {
        rc = plx_backend_check_io(be, io);
    }
    if (rc < 0)
        return rc;
    if ((io->op == PLX_IO_WRITE || io->op == PLX_IO_TRIM) && b->rdonly)
        return -EBADF;
    if (b->fenced)
        return -ESTALE;
    if (b->dead)
        return -EIO;
    struct iscsi_req *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->done.io = io;
    r->b = b;
    if (b->blocking) {
        plx_iscsi_finish(b, r, run_blocking(b, r));
        b->inflight++;
        return 0;
    }
    rc = plx_iscsi_issue(b, r);
    if (rc < 0) {
        free(r);
        return rc;
    }
    b->inflight++;
    /* The PDU waits in libiscsi's queue: ask for POLLOUT now, so the host wakes to send it. */
    plx_iscsi_sync_socket(b, 0);
    plx_iscsi_set_ticking(b, 1);
    return 0;
}

/* A poll without waiting where nothing can have happened: the session is up, the socket's
 * registration in the epoll set matches what libiscsi wants now, and that set (the eventfd of
 * completions, the clock, the socket) has nothing ready. One epoll_wait answers what a
 * service() round asks with three system calls; the engine polls between every two steps of
 * its service loop, several times for each request a server answers. */
static int nothing_ready(struct iscsi_backend *b)
{
    if (b->blocking || b->rejoin || b->dead || b->conn != CONN_UP || b->done.ready.head != NULL)
        return 0;
    int fd = iscsi_get_fd(b->iscsi);
    int want = fd >= 0 ? iscsi_which_events(b->iscsi) : 0;
    int ev = (want & POLLIN ? EPOLLIN : 0) | (want & POLLOUT ? EPOLLOUT : 0);
    if (fd < 0 || ev == 0 || fd != b->sock_fd || ev != b->sock_events)
        return 0;
    struct epoll_event e;
    return epoll_wait(b->epfd, &e, 1, 0) == 0;
}

/* A delivered request (plx_done_deliver). */
static void iscsi_release(void *arg, struct plx_done *d)
{
    struct iscsi_backend *b = arg;
    free(plx_iscsi_req(d));
    b->inflight--;
}

static int iscsi_poll(plx_backend *be, int timeout_ms)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    int64_t deadline = plx_poll_deadline(timeout_ms);

    if (timeout_ms == 0 && nothing_ready(b)) {
        plx_iscsi_set_ticking(b, b->inflight > 0);
        return 0;
    }

    for (;;) {
        plx_efd_drain(b->done.efd);
        if (!b->blocking)
            service(b);
        if (b->rejoin) {
            plx_iscsi_rejoin_try(b);
            if (!b->blocking)
                plx_iscsi_after_sync(b);
        }
        if (b->done.ready.head != NULL || timeout_ms == 0 || b->inflight == 0)
            break;
        int wait = plx_poll_wait(timeout_ms, deadline);
        if (wait == 0)
            break;
        int rc = wait_events(b, wait);
        if (rc < 0)
            return rc;
    }

    int n = plx_done_deliver(&b->done, iscsi_release, b);
    if (b->done.ready.head != NULL)
        plx_efd_signal(b->done.efd);
    return n;
}

static int iscsi_fd(const plx_backend *be)
{
    return ((const struct iscsi_backend *)be)->epfd;
}

static unsigned iscsi_inflight(const plx_backend *be)
{
    return ((const struct iscsi_backend *)be)->inflight;
}

static void iscsi_destroy(plx_backend *be)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    if (b == NULL)
        return;
    if (b->iscsi != NULL) {
        /* Log out only from a working session, and give a silent target 2 s, not forever. */
        if (!b->dead && b->conn == CONN_UP && iscsi_is_logged_in(b->iscsi)) {
            iscsi_set_timeout(b->iscsi, 2);
            plx_iscsi_pr_leave(b);
            iscsi_logout_sync(b->iscsi);
        }
        iscsi_destroy_context(b->iscsi); /* requests it still held come back to the held list */
    }
    /* Requests not delivered (a destroy with I/O in flight) are freed; done is not called. */
    struct plx_done_list *lists[] = {&b->held, &b->retry, &b->done.ready};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        struct iscsi_req *r;
        while ((r = plx_iscsi_list_pop(lists[i])) != NULL)
            free(r);
    }
    free(b->url);
    while (b->abandoned != NULL) {
        struct iscsi_req *r = b->abandoned;
        b->abandoned = plx_iscsi_req(r->done.next);
        free(r);
    }
    if (b->lock_fd >= 0)
        close(b->lock_fd);
    if (b->epfd >= 0)
        close(b->epfd);
    plx_done_close(&b->done);
    if (b->tfd >= 0)
        close(b->tfd);
    free(b);
}

/* The admin lock. Until a lock manager exists (issue 12, part 2), processes sharing a LUN must
 * run on one host: a flock on a file named after the LUN's URL serialises them like the file
 * backend's flock on the medium. */
static int iscsi_lock(plx_backend *be, int take)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    if (b->lock_fd < 0) {
        b->lock_fd = open(b->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (b->lock_fd < 0)
            return -errno;
    }
    for (;;) {
        if (flock(b->lock_fd, take ? LOCK_EX | LOCK_NB : LOCK_UN) == 0)
            return 0;
        if (errno != EINTR)
            return errno == EWOULDBLOCK ? -EWOULDBLOCK : -errno;
    }
}

static const struct plx_backend_ops iscsi_ops = {
    .submit = iscsi_submit,
    .poll = iscsi_poll,
    .fd = iscsi_fd,
    .inflight = iscsi_inflight,
    .destroy = iscsi_destroy,
    .lock = iscsi_lock,
    .size = sizeof(struct plx_backend_ops),
    .fence = &plx_iscsi_fence_ops,
};

/* ---- Opening -------------------------------------------------------------------------------- */

int plx_backend_is_iscsi(const char *where)
{
    return where != NULL && strncmp(where, ISCSI_PREFIX, strlen(ISCSI_PREFIX)) == 0;
}

/* Used inside format strings. */
#define URL_FORM "iscsi://[USER%%PASSWORD@]HOST[:PORT]/TARGET-IQN/LUN"

/* Check the URL's shape ourselves, to name what is missing; libiscsi parses it afterwards. The
 * description (for messages) is the URL without its credentials. */
static int check_url(const char *url, char *desc, size_t desclen, char *msg, size_t msglen)
{
    const char *host = url + strlen(ISCSI_PREFIX);
    const char *slash = strchr(host, '/');
    const char *at = strchr(host, '@');
    if (at != NULL && (slash == NULL || at < slash))
        host = at + 1;
    snprintf(desc, desclen, ISCSI_PREFIX "%s", host);
    if (slash == NULL || slash == host) {
        snprintf(msg, msglen, "%s: no target: the form is " URL_FORM, desc);
        return -EINVAL;
    }
    const char *iqn = slash + 1;
    const char *lun = strrchr(iqn, '/');
    if (*iqn == '\0' || iqn == lun) {
        snprintf(msg, msglen, "%s: no target IQN: the form is " URL_FORM, desc);
        return -EINVAL;
    }
    if (lun == NULL || lun[1] == '\0') {
        snprintf(msg, msglen, "%s: no LUN number after the target IQN: the form is " URL_FORM,
                 desc);
        return -EINVAL;
    }
    char *end;
    errno = 0;
    long n = strtol(lun + 1, &end, 10);
    if (*end != '\0' || errno != 0 || n < 0 || n > 65535) {
        snprintf(msg, msglen, "%s: LUN '%s' is not a number from 0 to 65535 (" URL_FORM ")", desc,
                 lun + 1);
        return -EINVAL;
    }
    return 0;
}
/* The initiator name: $PARALLAX_ISCSI_INITIATOR, else one derived from the host id (backend.h:
 * $PARALLAX_HOST_ID, /etc/parallax/host-id, the host name). Hosts sharing a target need
 * distinct names: the target tells their sessions apart by them. */
static void initiator_name(char *out, size_t len)
{
    const char *env = getenv("PARALLAX_ISCSI_INITIATOR");
    if (env != NULL && *env != '\0') {
        snprintf(out, len, "%s", env);
        return;
    }
    char host[200];
    plx_host_id_default(host, sizeof(host));
    /* An iqn's name part: lower case letters, digits, '.', '-' and ':'. */
    for (char *p = host; *p; p++) {
        *p = (char)tolower((unsigned char)*p);
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-' && *p != ':')
            *p = '-';
    }
    snprintf(out, len, "iqn.2026-11.org.parallax:%.200s", host);
}

/* Why connecting failed, with a hint where libiscsi's words need one. Returns the errno:
 * ENOENT (no such target or LUN), EACCES (CHAP refused), ECONNREFUSED (anything else). */
static int connect_error(struct iscsi_backend *b, const char *desc, const struct iscsi_url *u,
                         char *msg, size_t msglen)
{
    char e[256];
    /* Trailing " [target]" and newlines from libiscsi's log lines go. */
    snprintf(e, sizeof(e), "%s",
             *plx_iscsi_log_first() ? plx_iscsi_log_first() : iscsi_get_error(b->iscsi));
    char *cut = strstr(e, " [");
    if (cut != NULL)
        *cut = '\0';
    for (char *p = e; *p; p++)
        if (*p == '\n')
            *p = ' ';
    const char *hint = "";
    int rc = ECONNREFUSED;
    if (strstr(e, "uthentication") != NULL || strstr(e, "CHAP") != NULL ||
        strstr(e, "uthorization") != NULL) {
        hint = u->user[0] ? " (wrong CHAP user or password?)"
                          : " (the target wants CHAP: iscsi://USER%PASSWORD@HOST/...)";
        rc = EACCES;
    } else if (strstr(e, "not found") != NULL || strstr(e, "Target not") != NULL) {
        hint = " (no such target IQN on that portal?)";
        rc = ENOENT;
    } else if (strstr(e, "LOGICAL_UNIT_NOT_SUPPORTED") != NULL) {
        snprintf(msg, msglen, "%s: target %s has no LUN %d (iscsi-ls -s iscsi://%s lists them)",
                 desc, u->target, u->lun, u->portal);
        return ENOENT;
    } else if (strstr(e, "onnect") != NULL) {
        hint = " (is the portal reachable, and is a target listening there?)";
    }
    snprintf(msg, msglen, "%s: connecting to portal %s: %s%s", desc, u->portal, e, hint);
    return rc;
}

/* UNMAP only where the LUN allows it: thin provisioning enabled (LBPME, checked by the caller),
 * UNMAP supported (Logical Block Provisioning VPD page: LBPU), and a nonzero UNMAP LBA count in
 * the Block Limits VPD page. Anything missing or unanswered leaves trim unsupported. */
static void probe_unmap(struct iscsi_backend *b)
{
    int lbpu = 0;
    struct scsi_task *t = iscsi_inquiry_sync(b->iscsi, b->lun, 1,
                                             SCSI_INQUIRY_PAGECODE_LOGICAL_BLOCK_PROVISIONING, 255);
    if (t != NULL && t->status == SCSI_STATUS_GOOD) {
        struct scsi_inquiry_logical_block_provisioning *lbp = scsi_datain_unmarshall(t);
        lbpu = lbp != NULL && lbp->lbpu;
    }
    if (t != NULL)
        scsi_free_scsi_task(t);
    if (!lbpu)
        return;
    t = iscsi_inquiry_sync(b->iscsi, b->lun, 1, SCSI_INQUIRY_PAGECODE_BLOCK_LIMITS, 255);
    if (t != NULL && t->status == SCSI_STATUS_GOOD) {
        struct scsi_inquiry_block_limits *bl = scsi_datain_unmarshall(t);
        if (bl != NULL && bl->max_unmap != 0 && bl->max_unmap_bdc != 0)
            /* 0xffffffff means no limit; keep each command to 1 GiB of 512-byte LBAs anyway. */
            b->max_unmap = bl->max_unmap < (1u << 21) ? bl->max_unmap : (1u << 21);
    }
    /* Test builds only (test_hooks.h): lets tests split a trim into many UNMAPs. */
    const char *force = plx_test_hook("PLX_TEST_ISCSI_MAX_UNMAP");
    if (b->max_unmap != 0 && force != NULL && atoi(force) > 0)
        b->max_unmap = (uint32_t)atoi(force);
    if (t != NULL)
        scsi_free_scsi_task(t);
}

static int read_geometry(struct iscsi_backend *b, const char *desc, char *msg, size_t msglen)
{
    struct scsi_task *t = iscsi_readcapacity16_sync(b->iscsi, b->lun);
    struct scsi_readcapacity16 *rc16 = NULL;
    if (t != NULL && t->status == SCSI_STATUS_GOOD)
        rc16 = scsi_datain_unmarshall(t);
    if (rc16 == NULL) {
        snprintf(msg, msglen, "%s: READ CAPACITY(16) failed: %s", desc,
                 t != NULL && t->status == SCSI_STATUS_CHECK_CONDITION
                     ? scsi_sense_ascq_str(t->sense.ascq)
                     : iscsi_get_error(b->iscsi));
        if (t != NULL)
            scsi_free_scsi_task(t);
        return -EIO;
    }
    b->lba_size = rc16->block_length;
    uint64_t lbas = rc16->returned_lba + 1;
    int lbpme = rc16->lbpme;
    scsi_free_scsi_task(t);
    if (lbpme)
        probe_unmap(b);
    if (b->lba_size == 0 || b->lba_size > PLX_BLOCK_SIZE || PLX_BLOCK_SIZE % b->lba_size != 0) {
        snprintf(msg, msglen,
                 "%s: logical block size %u bytes: Parallax needs one that divides 4096", desc,
                 (unsigned)b->lba_size);
        return -EINVAL;
    }
    b->lbas_per_block = PLX_BLOCK_SIZE / b->lba_size;
    b->base.nblocks = lbas / b->lbas_per_block;
    return 0;
}

/* A LUN that answers, or a message naming the LUNs the target does have. */
static int check_lun(struct iscsi_backend *b, const char *desc, char *msg, size_t msglen)
{
    struct scsi_task *t = iscsi_testunitready_sync(b->iscsi, b->lun);
    int ok =
        t != NULL && (t->status == SCSI_STATUS_GOOD || (t->status == SCSI_STATUS_CHECK_CONDITION &&
                                                        t->sense.key == SCSI_SENSE_UNIT_ATTENTION));
    int no_lun = t != NULL && t->status == SCSI_STATUS_CHECK_CONDITION &&
                 t->sense.ascq == SCSI_SENSE_ASCQ_LOGICAL_UNIT_NOT_SUPPORTED;
    if (t != NULL)
        scsi_free_scsi_task(t);
    if (ok)
        return 0;
    if (!no_lun) {
        snprintf(msg, msglen, "%s: the LUN does not answer TEST UNIT READY: %s", desc,
                 iscsi_get_error(b->iscsi));
        return -EIO;
    }
    char luns[200] = "";
    size_t used = 0;
    t = iscsi_reportluns_sync(b->iscsi, 0, 16384);
    struct scsi_reportluns_list *list =
        t != NULL && t->status == SCSI_STATUS_GOOD ? scsi_datain_unmarshall(t) : NULL;
    for (uint32_t i = 0; list != NULL && i < list->num && used + 8 < sizeof(luns); i++)
        used += (size_t)snprintf(luns + used, sizeof(luns) - used, "%s%u", i ? ", " : "",
                                 (unsigned)list->luns[i]);
    if (t != NULL)
        scsi_free_scsi_task(t);
    snprintf(msg, msglen, "%s: the target has no LUN %d (its LUNs: %s)", desc, b->lun,
             used ? luns : "none reported");
    return -ENOENT;
}

static void lock_path_for(struct iscsi_backend *b, const char *desc)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *s = desc; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    const char *dir = "/run/lock";
    if (access(dir, W_OK) != 0)
        dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(b->lock_path, sizeof(b->lock_path), "%s/parallax-iscsi-%016llx.lock", dir,
             (unsigned long long)h);
}

/* libiscsi writes to its socket without MSG_NOSIGNAL, so a target that hangs up while PDUs are
 * queued raises SIGPIPE, and its default action kills the process: every acknowledged write
 * still in the write cache's memory, every client of a server, gone because a target went away
 * (test_iscsi_gives_up died so under ASan in CI). The engine handles the hang-up (EPIPE, log in
 * again), so a process that left SIGPIPE at its default gets it ignored when it first opens an
 * iSCSI store; a disposition the process chose itself is left alone. */
static void ignore_default_sigpipe(void)
{
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
        sa.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

plx_backend *plx_backend_iscsi_open(const char *url, unsigned flags, int *err, char *errbuf,
                                    size_t errlen)
{
    char desc[sizeof(((plx_backend *)0)->desc)];
    char msg[1200];
    int rc = check_url(url, desc, sizeof(desc), msg, sizeof(msg));
    if (rc < 0)
        return plx_backend_open_fail(err, errbuf, errlen, -rc, "%s", msg);

    ignore_default_sigpipe();
    struct iscsi_backend *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return plx_backend_open_fail(err, errbuf, errlen, ENOMEM, "%s: out of memory", desc);
    b->epfd = b->done.efd = b->tfd = b->sock_fd = b->lock_fd = -1;
    b->rdonly = (flags & PLX_BACKEND_RDONLY) != 0;
    b->blocking = (flags & PLX_BACKEND_BLOCKING) != 0;
    snprintf(b->base.desc, sizeof(b->base.desc), "%s", desc);
    b->base.ops = &iscsi_ops;
    lock_path_for(b, desc);

    initiator_name(b->initiator, sizeof(b->initiator));
    b->url = strdup(url);
    const char *retries = getenv("PARALLAX_ISCSI_RETRIES");
    b->max_attempts = retries != NULL && *retries != '\0' ? atoi(retries) : DEFAULT_RECONNECTS;
    struct iscsi_url *u = NULL;
    if (b->url != NULL)
        b->iscsi = plx_iscsi_new_context(b, &u);
    if (b->iscsi == NULL) {
        iscsi_destroy(&b->base);
        return plx_backend_open_fail(err, errbuf, errlen, ENOMEM,
                                     "%s: cannot create an iSCSI context", desc);
    }
    if (u == NULL) {
        snprintf(msg, sizeof(msg), "%s: %s (the form is " URL_FORM ")", desc,
                 iscsi_get_error(b->iscsi));
        iscsi_destroy(&b->base);
        return plx_backend_open_fail(err, errbuf, errlen, EINVAL, "%s", msg);
    }
    plx_iscsi_log_capture(1);

    if (iscsi_full_connect_sync(b->iscsi, u->portal, u->lun) != 0) {
        int e = connect_error(b, desc, u, msg, sizeof(msg));
        iscsi_destroy_url(u);
        iscsi_destroy_context(b->iscsi);
        b->iscsi = NULL;
        iscsi_destroy(&b->base);
        plx_iscsi_log_capture(0);
        return plx_backend_open_fail(err, errbuf, errlen, e, "%s", msg);
    }
    iscsi_destroy_url(u);
    rc = check_lun(b, desc, msg, sizeof(msg));
    if (rc == 0)
        rc = read_geometry(b, desc, msg, sizeof(msg));
    plx_iscsi_log_capture(0);
    if (rc < 0) {
        iscsi_destroy(&b->base);
        return plx_backend_open_fail(err, errbuf, errlen, -rc, "%s", msg);
    }

    int qrc = plx_done_open(&b->done);
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN};
    if (qrc < 0 || b->epfd < 0 || b->tfd < 0 ||
        epoll_ctl(b->epfd, EPOLL_CTL_ADD, b->done.efd, &e) ||
        epoll_ctl(b->epfd, EPOLL_CTL_ADD, b->tfd, &e)) {
        int e2 = errno;
        iscsi_destroy(&b->base);
        return plx_backend_open_fail(err, errbuf, errlen, e2, "%s: event descriptors: %s", desc,
                                     strerror(e2));
    }
    plx_iscsi_sync_socket(b, 1);
    return &b->base;
}

/* The length of the iscsi://HOST[:PORT]/IQN/LUN at the start of s (IQNs hold colons but no
 * '/', the LUN is digits), or 0 when s does not start with one (plx_blockstore_url_len). */
static size_t iscsi_url_len(const char *s)
{
    const char *p = strchr(s + strlen(ISCSI_PREFIX), '/');
    if (p)
        p = strchr(p + 1, '/');
    if (!p || !isdigit((unsigned char)p[1]))
        return 0;
    p++;
    while (isdigit((unsigned char)*p))
        p++;
    return (size_t)(p - s);
}

/* The URL without the CHAP password: iscsi://USER%PASSWORD@HOST/... as iscsi://USER@HOST/...
 * (plx_blockstore_shown). */
static const char *iscsi_shown(const char *path, char *buf, size_t len)
{
    const char *at, *pct, *slash;
    if ((at = strchr(path, '@')) == NULL)
        return path;
    slash = strchr(path + strlen(ISCSI_PREFIX), '/');
    pct = strchr(path, '%');
    if ((slash != NULL && at > slash) || pct == NULL || pct > at)
        return path;
    snprintf(buf, len, "%.*s%s", (int)(pct - path), path, at);
    return buf;
}

/* Its line in the table of URL schemes (backend_open.c). */
const struct plx_backend_scheme plx_backend_iscsi_scheme = {
    .prefix = ISCSI_PREFIX,
    .open = plx_backend_iscsi_open,
    .ops = &iscsi_ops,
    .url_len = iscsi_url_len,
    .shown = iscsi_shown,
};
