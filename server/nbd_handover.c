/*
 * nbd_handover.c - an export whose VDI another process holds for writing (a guest migrating
 * here, whose source still runs): the client gets the export at once, its requests wait in
 * order (nbd_transmission.c queues them), and a timer tries the VDI's open again until the
 * source lets go (then they are submitted) or the wait ($PARALLAX_HANDOVER_WAIT) ends (then
 * they fail).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "nbd_internal.h"

/* Try the waiting exports' VDIs again (every few ms, from the retry timer; each try is
 * asynchronous: host/parallax_handover.h). */
static void retry_ready(struct et_fd_handler *h, plx_store *st)
{
    struct nbd_server *srv = (struct nbd_server *)((char *)h - offsetof(struct nbd_server, retry));
    uint64_t junk;
    if (read(h->fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    int still_waiting = 0;
    for (struct export *e = srv->exports; e; e = e->next) {
        if (e->v || e->failed || !e->settled || e->open_rc)
            continue;
        still_waiting = 1;
        int rc;
        plx_vdi *v;
        if (handover_try_step(&e->retry, e->name, &rc, &v))
            continue;
        if (handover_keep_waiting(rc, now_ns() - e->wait_since_ns))
            continue;
        e->v = v;
        if (rc) {
            e->v = NULL;
            e->failed = rc == -EBUSY ? -ETIMEDOUT : rc;
            fprintf(stderr, "parallax: serve: export '%s': gave up waiting for it: %s\n", e->name,
                    e->retry.err);
        } else {
            fprintf(stderr, "parallax: serve: export '%s': handed over after %.1f ms\n", e->name,
                    (double)(now_ns() - e->wait_since_ns) / 1e6);
            export_opened(st, e);
        }
        struct req *r = e->pending_head;
        e->pending_head = e->pending_tail = NULL;
        while (r) {
            struct req *next = r->pending_next;
            if (e->v)
                nbd_req_submit(r);
            else
                nbd_req_finish(r, e->failed);
            r = next;
        }
    }
    if (!still_waiting) {
        struct itimerspec off = {0};
        timerfd_settime(h->fd, 0, &off, NULL);
        srv->retry_armed = 0;
    }
}

/* Start the retry timer (5 ms) for an export that waits. */
int nbd_retry_arm(struct nbd_server *srv)
{
    if (srv->retry.fd <= 0) {
        srv->retry.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        srv->retry.on_ready = retry_ready;
        if (srv->retry.fd < 0 || et_watch(srv->et, &srv->retry) != 0)
            return -errno;
    }
    if (!srv->retry_armed) {
        struct itimerspec its = {.it_interval = {0, 5000000}, .it_value = {0, 5000000}};
        if (timerfd_settime(srv->retry.fd, 0, &its, NULL) != 0)
            return -errno;
        srv->retry_armed = 1;
    }
    return 0;
}
