/*
 * backend_iscsi_shared.h - what the iSCSI backend's four files share, from the bottom up:
 * backend_iscsi_io.c (requests), backend_iscsi_session.c (the session: its context, losing it,
 * logging in again), backend_iscsi_fence.c (persistent reservations) and backend_iscsi.c (the
 * seam, opening). Nothing else includes it.
 */
#ifndef PLX_BACKEND_ISCSI_SHARED_H
#define PLX_BACKEND_ISCSI_SHARED_H

#include <limits.h>
#include <stdint.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#include "backend.h"
#include "backend_done.h"
#include "clock.h"

#define MAX_RETRIES 8 /* per request: UNIT ATTENTION, BUSY, TASK SET FULL */

struct iscsi_req {
    struct plx_done done; /* first: the I/O, its status, the ready, retry or held list's link */
    struct iscsi_backend *b;
    struct scsi_task *task;
    int retries;
    uint64_t trimmed; /* trim: LBAs unmapped so far (one UNMAP per max_unmap LBAs) */
    struct unmap_list unmap;
    int abandoned;          /* failed by fail_all(): a late libiscsi callback only frees the task */
    int cancelling;         /* we cancelled its task ourselves: it fails, it is not held */
    struct iscsi_req *all_prev, *all_next; /* every request libiscsi holds */
};

/* The request a list entry is (done is its first member). */
static inline struct iscsi_req *plx_iscsi_req(struct plx_done *d)
{
    return (struct iscsi_req *)(void *)d;
}

/* The session, in asynchronous mode (backend_iscsi_session.c). */
enum iscsi_conn {
    CONN_UP,         /* logged in: requests go out */
    CONN_DOWN,       /* lost: a fresh context waits for the next attempt (next_attempt_ns) */
    CONN_CONNECTING, /* a fresh context connects and logs in (iscsi_full_connect_async) */
};

struct iscsi_backend {
    plx_backend base;
    struct iscsi_context *iscsi; /* never NULL once open; replaced when the session is lost */
    char *url;                   /* as given, credentials included: every new context parses it */
    char initiator[300];
    char portal[MAX_STRING_SIZE + 1]; /* from the URL */
    int lun;
    uint32_t lba_size;       /* the LUN's logical block size */
    uint32_t lbas_per_block; /* PLX_BLOCK_SIZE / lba_size */
    int rdonly, blocking;
    uint32_t max_unmap; /* LBAs per UNMAP; 0 = the LUN does not unmap */
    int dead;           /* reconnecting gave up: everything fails with -EIO */
    int epfd, tfd;      /* the backend's fd; the clock */
    struct plx_done_queue done; /* finished requests, and the eventfd that says so */
    int sock_fd;        /* socket as registered in epfd, -1 when not */
    int sock_events;    /* EPOLLIN/EPOLLOUT registered for it */
    int ticking;
    unsigned inflight; /* accepted and done not yet called */
    struct plx_done_list retry;
    struct iscsi_req *all;        /* requests whose task libiscsi holds */
    struct iscsi_req *abandoned;  /* failed by fail_all, freed at destroy */
    int lock_fd;                  /* flock stand-in for the admin lock (one host) */
    uint64_t pr_key;              /* our persistent reservation key; 0: not fencing */
    int fenced;                   /* our key was preempted: everything fails with -ESTALE */
    struct plx_fence_hooks hooks; /* the layer above's word on registering again (backend.h) */
    int rejoin;               /* registration in doubt: writes held until rejoin_try settles it */
    int rejoin_checked;       /* ... and we looked whether our key is still on the LUN: */
    int rejoin_key_gone;      /* it was gone: confirm the lease first */
    uint64_t rejoin_since_ns; /* when the doubt began (CLOCK_MONOTONIC) */
    struct plx_done_list held; /* waiting for a login or a rejoin, in order */
    /* The session (backend_iscsi_session.c). */
    enum iscsi_conn conn;
    int dropped;              /* a callback saw the session's commands cancelled under it */
    int connect_result;       /* CONNECTING: 0 pending, 1 logged in, -1 failed */
    int attempts;             /* failed login attempts since the session was lost */
    int max_attempts;         /* $PARALLAX_ISCSI_RETRIES; < 0: no limit */
    uint64_t next_attempt_ns; /* DOWN: when to try again */
    uint64_t attempt_end_ns;  /* CONNECTING: when this attempt counts as failed */
    char lock_path[PATH_MAX];
};

/* backend_iscsi_io.c: requests, the event set, libiscsi's log (the bottom layer). */
void plx_iscsi_list_push(struct plx_done_list *l, struct iscsi_req *r);
struct iscsi_req *plx_iscsi_list_pop(struct plx_done_list *l);
void plx_iscsi_finish(struct iscsi_backend *b, struct iscsi_req *r, int status);
void plx_iscsi_sync_socket(struct iscsi_backend *b, int force);
void plx_iscsi_set_ticking(struct iscsi_backend *b, int on);
int plx_iscsi_retryable(int status, const struct scsi_task *task);
int plx_iscsi_task_outcome(struct iscsi_backend *b, struct iscsi_req *r, int status,
                           struct scsi_task *task);
void plx_iscsi_next_unmap(const struct iscsi_backend *b, struct iscsi_req *r);
int plx_iscsi_trim_continues(const struct iscsi_backend *b, struct iscsi_req *r);
int plx_iscsi_issue(struct iscsi_backend *b, struct iscsi_req *r);
void plx_iscsi_run_retries(struct iscsi_backend *b);
void plx_iscsi_fail_all(struct iscsi_backend *b, const char *why);
void plx_iscsi_registration_in_doubt(struct iscsi_backend *b);
void plx_iscsi_release_held(struct iscsi_backend *b);
void plx_iscsi_log_fn(int level, const char *message);
void plx_iscsi_log_capture(int on); /* while opening: keep the first error, print nothing */
const char *plx_iscsi_log_first(void);

/* backend_iscsi_fence.c: persistent reservations (the fence operations). */
extern const struct plx_fence_ops plx_iscsi_fence_ops;
/* After a synchronous call in asynchronous mode: the socket's events, callbacks that ran. */
void plx_iscsi_after_sync(struct iscsi_backend *b);
/* Settle a registration in doubt, once (b->rejoin stays set when it must be tried again). */
void plx_iscsi_rejoin_try(struct iscsi_backend *b);
/* plx_iscsi_rejoin_try until settled, waiting: 0, -ESTALE (fenced) or -EIO. */
int plx_iscsi_rejoin_wait(struct iscsi_backend *b);
/* At close: unregister unless we hold the reservation. */
void plx_iscsi_pr_leave(struct iscsi_backend *b);

/* backend_iscsi_session.c */
struct iscsi_context *plx_iscsi_new_context(struct iscsi_backend *b, struct iscsi_url **url);
void plx_iscsi_session_lost(struct iscsi_backend *b, const char *why);
void plx_iscsi_session_step(struct iscsi_backend *b, short revents);
int plx_iscsi_reconnect_blocking(struct iscsi_backend *b, const char *why);

#endif
