/*
 * backend_iscsi_session.c - the iSCSI backend's session: making a libiscsi context, noticing
 * that the connection is gone, and logging in again ourselves.
 *
 * Why not libiscsi's own reconnect. libiscsi logs in again by itself and at once re-sends every
 * SCSI command that had not completed, before the backend gets a say. A WRITE that was in
 * flight when the connection dropped could then land after another host had fenced us: after a
 * target restart nothing on the LUN refuses it (the target forgot every registration and the
 * reservation), and the taker may already have written the same blocks
 * (tests/integration/fence_inflight.sh). So every context runs with iscsi_set_noautoreconnect:
 * when the connection drops, libiscsi only cancels the commands it holds (their callbacks see
 * SCSI_STATUS_CANCELLED), and the backend keeps those requests in its held list, unsent. It then
 * destroys the context (which cancels whatever is left the same way), makes a fresh one from the
 * same URL, and connects and logs in asynchronously inside the event loop. Only once the new
 * session is up and the registration check (backend_iscsi_fence.c, rejoin_try) has settled
 * do the held requests go out again; when we were fenced they fail with -ESTALE instead.
 *
 * Attempts: the first right after the loss, then after 1, 2, 3 ... s (at most 30 s) following
 * each failure; a connect and login that take longer than 30 s failed. After
 * $PARALLAX_ISCSI_RETRIES failed attempts in a row (default 8, about 30 s; negative: no limit)
 * the backend gives up: every held and later request fails with -EIO.
 *
 * Blocking mode (PLX_BACKEND_BLOCKING) does the same with libiscsi's synchronous calls:
 * plx_iscsi_reconnect_blocking runs between a failed command and its retry.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>

#include "backend_iscsi_shared.h"

#define ATTEMPT_NS (30ull * 1000000000ull) /* one connect and login */
#define MAX_BACKOFF_S 30

/* A fresh context for b's LUN with our session parameters, not connected; *url is the parsed
 * URL (the caller frees it), NULL when the URL does not parse (iscsi_get_error says why). NULL
 * when no context could be made. */
struct iscsi_context *plx_iscsi_new_context(struct iscsi_backend *b, struct iscsi_url **url)
{
    *url = NULL;
    struct iscsi_context *ctx = iscsi_create_context(b->initiator);
    if (ctx == NULL)
        return NULL;
    iscsi_set_log_level(ctx, 1);
    iscsi_set_log_fn(ctx, plx_iscsi_log_fn);
    struct iscsi_url *u = iscsi_parse_full_url(ctx, b->url);
    if (u == NULL)
        return ctx;
    iscsi_set_targetname(ctx, u->target);
    iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL);
    iscsi_set_header_digest(ctx, ISCSI_HEADER_DIGEST_NONE_CRC32C);
    if (u->user[0] != '\0')
        iscsi_set_initiator_username_pwd(ctx, u->user, u->passwd);
    /* We log in again ourselves, after the registration check (the header comment). */
    iscsi_set_noautoreconnect(ctx, 1);
    /* A portal that drops SYNs fails in about 15 s (3 retries), not the kernel's 2 minutes. */
    iscsi_set_tcp_syncnt(ctx, 3);
    b->lun = u->lun;
    snprintf(b->portal, sizeof(b->portal), "%s", u->portal);
    *url = u;
    return ctx;
}

/* Replace the context by a fresh, unconnected one. Commands the old one still held come back
 * through task_cb as cancelled, into the held list. */
static int replace_context(struct iscsi_backend *b)
{
    if (b->sock_fd >= 0) {
        epoll_ctl(b->epfd, EPOLL_CTL_DEL, b->sock_fd, NULL);
        b->sock_fd = -1;
        b->sock_events = 0;
    }
    iscsi_destroy_context(b->iscsi);
    /* libiscsi calls back only for a context it counts as logged in: anything it did not
     * return is held here all the same (its task is ours to free). */
    while (b->all != NULL) {
        struct iscsi_req *r = b->all;
        b->all = r->all_next;
        r->all_prev = r->all_next = NULL;
        if (r->task != NULL)
            scsi_free_scsi_task(r->task);
        r->task = NULL;
        plx_iscsi_list_push(&b->held, r);
    }
    struct iscsi_url *u;
    b->iscsi = plx_iscsi_new_context(b, &u);
    if (u != NULL)
        iscsi_destroy_url(u);
    b->dropped = 0;
    b->connect_result = 0;
    if (b->iscsi == NULL || u == NULL) {
        if (b->iscsi == NULL)
            b->iscsi = iscsi_create_context(b->initiator); /* an inert stand-in, or none */
        return -ENOMEM;
    }
    return 0;
}

static void give_up(struct iscsi_backend *b, const char *why)
{
    b->conn = CONN_DOWN;
    plx_iscsi_fail_all(b, why);
}

/* The connection is gone (or the context failed): hold everything it carried, and log in again
 * from the event loop. */
void plx_iscsi_session_lost(struct iscsi_backend *b, const char *why)
{
    if (b->dead)
        return;
    if (b->conn == CONN_UP)
        fprintf(stderr, "parallax: %s: connection lost (%s); logging in again\n", b->base.desc,
                why);
    b->conn = CONN_DOWN;
    /* The new session will not be registered, and the target may have forgotten everything:
     * settled by rejoin_try before a held write goes out. */
    plx_iscsi_registration_in_doubt(b);
    if (replace_context(b) < 0) {
        give_up(b, "cannot make a new iSCSI context");
        return;
    }
    if (b->fenced) {
        /* Nothing of ours goes out any more. */
        struct iscsi_req *r;
        while ((r = plx_iscsi_list_pop(&b->held)) != NULL)
            plx_iscsi_finish(b, r, -ESTALE);
        b->dead = 1;
        return;
    }
    b->attempts = 0;
    b->next_attempt_ns = plx_mono_ns();
}

static void connect_cb(struct iscsi_context *iscsi, int status, void *command_data, void *private)
{
    struct iscsi_backend *b = private;
    (void)command_data;
    if (iscsi == b->iscsi && b->conn == CONN_CONNECTING)
        b->connect_result = status == SCSI_STATUS_GOOD ? 1 : -1;
}

static void attempt_failed(struct iscsi_backend *b)
{
    b->attempts++;
    if (b->max_attempts >= 0 && b->attempts >= b->max_attempts) {
        char why[200];
        snprintf(why, sizeof(why), "could not log in again (%d attempts)", b->attempts);
        give_up(b, why);
        return;
    }
    unsigned wait = b->attempts < MAX_BACKOFF_S ? (unsigned)b->attempts : MAX_BACKOFF_S;
    fprintf(stderr, "parallax: %s: logging in again failed (attempt %d); next try in %u s\n",
            b->base.desc, b->attempts, wait);
    b->conn = CONN_DOWN;
    if (replace_context(b) < 0) {
        give_up(b, "cannot make a new iSCSI context");
        return;
    }
    b->next_attempt_ns = plx_mono_ns() + wait * 1000000000ull;
}

static void logged_in(struct iscsi_backend *b)
{
    b->conn = CONN_UP;
    b->attempts = 0;
    unsigned held = 0;
    for (const struct plx_done *r = b->held.head; r != NULL; r = r->next)
        held++;
    if (b->pr_key != 0 && b->rejoin) {
        /* The lock manager is asked from now on: a full lease to confirm ours, counted from
         * the login, however long logging in took. */
        b->rejoin_since_ns = plx_mono_ns();
        fprintf(stderr,
                "parallax: %s: logged in again; %u held request(s) go out once our "
                "registration is settled\n",
                b->base.desc, held);
        return; /* rejoin_try, from poll(), releases them */
    }
    fprintf(stderr, "parallax: %s: logged in again; %u held request(s) re-issued\n", b->base.desc,
            held);
    plx_iscsi_release_held(b);
}

/* Drive a lost session towards a new login: called by service() whenever the backend's fd or
 * clock fires while the session is not up. */
void plx_iscsi_session_step(struct iscsi_backend *b, short revents)
{
    if (b->dead)
        return;
    uint64_t now = plx_mono_ns();
    if (b->conn == CONN_DOWN) {
        if (now < b->next_attempt_ns)
            return;
        b->conn = CONN_CONNECTING;
        b->connect_result = 0;
        b->attempt_end_ns = now + ATTEMPT_NS;
        if (iscsi_full_connect_async(b->iscsi, b->portal, b->lun, connect_cb, b) != 0) {
            attempt_failed(b);
            return;
        }
        plx_iscsi_sync_socket(b, 1);
        return;
    }
    if (b->conn != CONN_CONNECTING)
        return;
    int rc = 0;
    if (revents != 0)
        rc = iscsi_service(b->iscsi, revents);
    if (b->connect_result > 0 && rc == 0 && !b->dropped) {
        logged_in(b);
        return;
    }
    if (rc < 0 || b->connect_result < 0 || b->dropped || now > b->attempt_end_ns)
        attempt_failed(b);
}

/* Blocking mode: a command failed because the session is gone. Log in again with a fresh
 * context (waiting between attempts as above); 0 when logged in, -EIO when we gave up. The
 * caller settles the registration (rejoin_wait) before it sends anything that writes. */
int plx_iscsi_reconnect_blocking(struct iscsi_backend *b, const char *why)
{
    if (b->dead)
        return -EIO;
    fprintf(stderr, "parallax: %s: connection lost (%s); logging in again\n", b->base.desc, why);
    plx_iscsi_registration_in_doubt(b);
    for (int attempt = 1;; attempt++) {
        if (replace_context(b) < 0)
            break;
        if (iscsi_full_connect_sync(b->iscsi, b->portal, b->lun) == 0) {
            fprintf(stderr, "parallax: %s: logged in again\n", b->base.desc);
            return 0;
        }
        if (b->max_attempts >= 0 && attempt >= b->max_attempts) {
            char msg[200];
            snprintf(msg, sizeof(msg), "could not log in again (%d attempts)", attempt);
            plx_iscsi_fail_all(b, msg);
            return -EIO;
        }
        unsigned wait = attempt < MAX_BACKOFF_S ? (unsigned)attempt : MAX_BACKOFF_S;
        fprintf(stderr, "parallax: %s: logging in again failed (attempt %d); next try in %u s\n",
                b->base.desc, attempt, wait);
        sleep(wait);
    }
    plx_iscsi_fail_all(b, "cannot make a new iSCSI context");
    return -EIO;
}
