/*
 * backend_iscsi_fence.c - the iSCSI backend's fencing (plx_backend_fence_ops; docs/DESIGN.md
 * "The lock manager", Fencing): SCSI-3 persistent reservations on the LUN, joining (register,
 * reserve), preempting a dead holder's key, settling a registration in doubt after the session
 * was re-established or a command met RESERVATION CONFLICT (rejoin_try: writes stay held until
 * then), and leaving at close. Below the seam (backend_iscsi.c), above the session and the
 * requests (backend_iscsi_session.c, backend_iscsi_io.c); backend_iscsi_shared.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_iscsi_shared.h"
#include "test_hooks.h"

/* The LUN is reserved "Write Exclusive, Registrants Only": every engine process that writes
 * registers its key (lock.c: plx_fence_key), and the target refuses writes from any session
 * whose key is not registered. A host that takes over a dead holder's locks first preempts its
 * key (PREEMPT), so whatever the dead holder still sends is refused (RESERVATION CONFLICT).
 * These are libiscsi's synchronous calls: they run at open, under the admin lock, and when a
 * conflict must be judged, never inside a libiscsi callback. */
#define PR_TYPE SCSI_PERSISTENT_RESERVE_TYPE_WRITE_EXCLUSIVE_REGISTRANTS_ONLY
#define PR_KEYS_BYTES 16384 /* READ KEYS allocation: some 2000 keys */

/* A synchronous call needs a logged-in session: while ours is being re-established the context
 * has no connection (backend_iscsi_session.c), and the call fails at once instead. */
static int session_up(const struct iscsi_backend *b)
{
    return b->blocking || (b->conn == CONN_UP && !b->dead);
}

/* After a synchronous call in asynchronous mode: the socket may want other events now, and
 * callbacks of our own requests may have run inside it. */
void plx_iscsi_after_sync(struct iscsi_backend *b)
{
    plx_iscsi_sync_socket(b, 1);
    if (b->done.ready.head != NULL)
        plx_efd_signal(b->done.efd);
}

/* PERSISTENT RESERVE OUT: the SCSI status, or -1 when the session failed. UNIT ATTENTION (a
 * reconnect, "reservations preempted" for others) is answered by sending the command again. */
static int pr_out(struct iscsi_backend *b, int sa, uint64_t key, uint64_t sa_key, int type)
{
    if (!session_up(b))
        return -1;
    for (int i = 0;; i++) {
        struct scsi_persistent_reserve_out_basic p = {.reservation_key = key,
                                                      .service_action_reservation_key = sa_key};
        struct scsi_task *t = iscsi_persistent_reserve_out_sync(
            b->iscsi, b->lun, sa, SCSI_PERSISTENT_RESERVE_SCOPE_LU, type, &p);
        int status = t != NULL ? t->status : -1;
        int again = plx_iscsi_retryable(status, t) && i < MAX_RETRIES;
        if (t != NULL)
            scsi_free_scsi_task(t);
        if (!again)
            return status;
    }
}

/* PERSISTENT RESERVE IN, unmarshalled into *out (the task, to free); -EIO on failure. */
static int pr_in(struct iscsi_backend *b, int sa, struct scsi_task **task, void **out)
{
    if (!session_up(b))
        return -EIO;
    for (int i = 0;; i++) {
        struct scsi_task *t = iscsi_persistent_reserve_in_sync(b->iscsi, b->lun, sa, PR_KEYS_BYTES);
        if (t != NULL && t->status == SCSI_STATUS_GOOD) {
            *out = scsi_datain_unmarshall(t);
            if (*out == NULL) {
                scsi_free_scsi_task(t);
                return -EIO;
            }
            *task = t;
            return 0;
        }
        int again = t != NULL && plx_iscsi_retryable(t->status, t) && i < MAX_RETRIES;
        if (t != NULL)
            scsi_free_scsi_task(t);
        if (!again)
            return -EIO;
    }
}

/* 1 when `key` is registered on the LUN, 0 when not, -EIO. */
static int pr_key_registered(struct iscsi_backend *b, uint64_t key)
{
    struct scsi_task *t;
    void *data;
    if (pr_in(b, SCSI_PERSISTENT_RESERVE_READ_KEYS, &t, &data) < 0)
        return -EIO;
    const struct scsi_persistent_reserve_in_read_keys *rk = data;
    int found = 0;
    for (int i = 0; i < rk->num_keys && !found; i++)
        found = rk->keys[i] == key;
    scsi_free_scsi_task(t);
    return found;
}

/* Register our key for this session (also for a session that replaced one by reconnecting:
 * the target ties a registration to the session, not to the key). */
static int pr_register(struct iscsi_backend *b)
{
    int status =
        pr_out(b, SCSI_PERSISTENT_RESERVE_REGISTER_AND_IGNORE_EXISTING_KEY, 0, b->pr_key, 0);
    return status == SCSI_STATUS_GOOD ? 0 : -EIO;
}

/* Make sure the LUN is reserved "write exclusive, registrants only" (by anyone registered):
 * 0, -EBUSY (another kind of reservation: another user owns the LUN) or -EIO. */
static int pr_reserve_if_free(struct iscsi_backend *b)
{
    for (int i = 0; i < 4; i++) {
        struct scsi_task *t;
        void *data;
        if (pr_in(b, SCSI_PERSISTENT_RESERVE_READ_RESERVATION, &t, &data) < 0)
            return -EIO;
        const struct scsi_persistent_reserve_in_read_reservation *rr = data;
        int reserved = rr->reserved, type = rr->pr_type;
        scsi_free_scsi_task(t);
        if (reserved && type == PR_TYPE)
            return 0;
        if (reserved) {
            fprintf(stderr,
                    "parallax: %s: the LUN holds a persistent reservation of type %d, not ours "
                    "(%d, write exclusive for registrants): another user owns it\n",
                    b->base.desc, type, PR_TYPE);
            return -EBUSY;
        }
        /* Nobody reserved it yet: we do. Racing another host is fine: the loser reads again. */
        int status = pr_out(b, SCSI_PERSISTENT_RESERVE_RESERVE, b->pr_key, 0, PR_TYPE);
        if (status != SCSI_STATUS_GOOD && status != SCSI_STATUS_RESERVATION_CONFLICT)
            return -EIO;
    }
    return -EIO;
}

/* Fenced for good: everything held and everything later fails with -ESTALE. */
static void fence_self(struct iscsi_backend *b, const char *why)
{
    if (!b->fenced)
        fprintf(stderr,
                "parallax: %s: the target refused our I/O (RESERVATION CONFLICT) and %s; "
                "no further I/O\n",
                b->base.desc, why);
    b->fenced = 1;
    b->rejoin = 0;
    while (b->held.head != NULL)
        plx_iscsi_finish(b, plx_iscsi_list_pop(&b->held), -ESTALE);
}

/* Is our key in the medium's list of preempted keys (hooks.preempted_block, read now)? 1, 0,
 * or -EIO (unreadable: ask again later). A taker lists a key before it preempts it. */
static int key_listed(struct iscsi_backend *b)
{
    if (b->hooks.key_preempted == NULL)
        return 0;
    if (!session_up(b))
        return -EIO;
    uint64_t lba = b->hooks.preempted_block * b->lbas_per_block;
    struct scsi_task *t =
        iscsi_read16_sync(b->iscsi, b->lun, lba, PLX_BLOCK_SIZE, (int)b->lba_size, 0, 0, 0, 0, 0);
    int rc = -EIO;
    if (t != NULL && t->status == SCSI_STATUS_GOOD && t->datain.data != NULL &&
        t->datain.size >= (int)PLX_BLOCK_SIZE) {
        void *buf = plx_block_alloc(1);
        memcpy(buf, t->datain.data, PLX_BLOCK_SIZE);
        rc = b->hooks.key_preempted(b->hooks.arg, buf, b->pr_key);
        plx_block_free(buf);
    }
    if (t != NULL)
        scsi_free_scsi_task(t);
    return rc;
}

/* Settle a registration in doubt (docs/DESIGN.md "The lock manager", Fencing: "Registering
 * again"). Writes stay held until then. With our key still on the LUN only the session
 * changed. With it gone, either a host that took over our locks preempted it (it listed the
 * key first: fenced), or the target forgot every registration (a restart): then we register
 * again only once the lock manager has answered a heartbeat sent after the doubt began, i.e.
 * our lease is alive now. In both cases we read the list again after registering: a taker
 * lists a key before it preempts it, so a preempt that raced our registration is either seen
 * here (we unregister and fence ourselves) or comes after it (and removes it). Never called
 * from inside a libiscsi callback. Returns with b->rejoin clear when settled, set when it must
 * be tried again later (the session or the lock manager not answering yet). */
void plx_iscsi_rejoin_try(struct iscsi_backend *b)
{
    if (!b->rejoin || b->fenced || b->dead || b->conn != CONN_UP)
        return;
    if (!b->rejoin_checked) { /* once per doubt: what follows depends on it */
        int there = pr_key_registered(b, b->pr_key);
        if (there < 0)
            return;
        b->rejoin_key_gone = !there;
        b->rejoin_checked = 1;
    }
    int listed;
    if (b->rejoin_key_gone) {
        listed = key_listed(b);
        if (listed < 0)
            return;
        if (listed) {
            fence_self(b, "our reservation key was preempted by a host that took over our locks");
            return;
        }
        if (b->hooks.lease_confirmed == NULL ||
            !b->hooks.lease_confirmed(b->hooks.arg, b->rejoin_since_ns)) {
            if (plx_mono_ns() - b->rejoin_since_ns > b->hooks.lease_wait_ns)
                fence_self(b, "our reservation key is gone from the LUN (a restarted target?), "
                              "and the lock manager did not confirm our lease in time: another "
                              "host may hold our locks");
            return;
        }
    }
    /* Test builds only (test_hooks.h): a window before registering (the loop goes on
     * meanwhile), to force a preempt into it (tests/integration/fence_rejoin.sh). */
    const char *delay = plx_test_hook("PLX_TEST_REJOIN_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0 &&
        plx_mono_ns() - b->rejoin_since_ns < (uint64_t)atoi(delay) * 1000000ull) {
        if (b->blocking)
            usleep(20000);
        return;
    }
    int rc = pr_register(b);
    if (rc == 0)
        rc = pr_reserve_if_free(b);
    if (rc == -EBUSY)
        fence_self(b, "the LUN is reserved by another user");
    if (rc < 0)
        return;
    listed = key_listed(b);
    if (listed < 0)
        return; /* registered but not verified: writes stay held, the next try verifies */
    if (listed) {
        pr_out(b, SCSI_PERSISTENT_RESERVE_REGISTER, b->pr_key, 0, 0); /* leave again */
        fence_self(b, "our reservation key was preempted by a host that took over our locks "
                      "while we registered again (we unregistered)");
        return;
    }
    fprintf(stderr, "parallax: %s: registered our reservation key %016llx again%s\n", b->base.desc,
            (unsigned long long)b->pr_key,
            b->rejoin_key_gone ? " (it was gone from the LUN, as after a target restart; the "
                                 "lock manager confirmed our lease and no host preempted it)"
                               : " for this session");
    b->rejoin = 0;
    plx_iscsi_release_held(b);
}

/* rejoin_try until settled, waiting (blocking calls: the CLI, a preempt under the admin lock).
 * 0 when registered again, -ESTALE when fenced, -EIO when the target or the lock manager did
 * not answer in time. */
int plx_iscsi_rejoin_wait(struct iscsi_backend *b)
{
    plx_iscsi_registration_in_doubt(b);
    uint64_t deadline = plx_mono_ns() + b->hooks.lease_wait_ns + 10000000000ull;
    while (b->rejoin && !b->fenced && !b->dead && plx_mono_ns() < deadline) {
        plx_iscsi_rejoin_try(b);
        if (b->rejoin && !b->fenced)
            usleep(20000);
    }
    if (!b->blocking)
        plx_iscsi_after_sync(b);
    return b->fenced ? -ESTALE : b->rejoin || b->dead ? -EIO : 0;
}

static int iscsi_fence_join(plx_backend *be, uint64_t key, const struct plx_fence_hooks *hooks)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    b->pr_key = key;
    if (hooks != NULL)
        b->hooks = *hooks;
    if (b->hooks.lease_wait_ns == 0)
        b->hooks.lease_wait_ns = 10000000000ull;
    int rc = pr_register(b);
    if (rc == 0)
        rc = pr_reserve_if_free(b);
    if (rc)
        b->pr_key = 0;
    if (!b->blocking)
        plx_iscsi_after_sync(b);
    return rc;
}

static int iscsi_fence_preempt(plx_backend *be, uint64_t victim)
{
    struct iscsi_backend *b = (struct iscsi_backend *)be;
    if (b->fenced)
        return -ESTALE;
    if (b->pr_key == 0 || victim == 0 || victim == b->pr_key)
        return 0;
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        int there = pr_key_registered(b, victim);
        if (there <= 0) {
            rc = there; /* 0: it has no registration, nothing to cut off */
            break;
        }
        int status = pr_out(b, SCSI_PERSISTENT_RESERVE_PREEMPT, b->pr_key, victim, PR_TYPE);
        if (status == SCSI_STATUS_GOOD) {
            fprintf(stderr,
                    "parallax: %s: preempted the reservation key %016llx of a dead "
                    "holder: the target refuses its writes from now on\n",
                    be->desc, (unsigned long long)victim);
            break;
        }
        /* Refused: our own registration is gone (preempted, or left in a replaced session). */
        rc = status == SCSI_STATUS_RESERVATION_CONFLICT ? plx_iscsi_rejoin_wait(b) : -EIO;
        if (rc < 0)
            break;
        rc = i == 2 ? -EIO : 0;
    }
    if (!b->blocking)
        plx_iscsi_after_sync(b);
    return rc;
}

/* At close: a registrant that does not hold the reservation unregisters. The holder stays
 * registered: in tgt, as in SPC, the reservation of type "registrants only" ends when its holder
 * leaves, and a LUN with no reservation would take writes from a host that was fenced. So at
 * most one key outlives its process; the next preempt of a dead holder's key removes it. */
void plx_iscsi_pr_leave(struct iscsi_backend *b)
{
    if (b->pr_key == 0 || b->fenced || b->dead || b->conn != CONN_UP ||
        !iscsi_is_logged_in(b->iscsi))
        return;
    struct scsi_task *t;
    void *data;
    if (pr_in(b, SCSI_PERSISTENT_RESERVE_READ_RESERVATION, &t, &data) < 0)
        return;
    const struct scsi_persistent_reserve_in_read_reservation *rr = data;
    int holder = rr->reserved && rr->reservation_key == b->pr_key;
    scsi_free_scsi_task(t);
    if (!holder)
        pr_out(b, SCSI_PERSISTENT_RESERVE_REGISTER, b->pr_key, 0, 0);
}

const struct plx_fence_ops plx_iscsi_fence_ops = {
    .join = iscsi_fence_join,
    .preempt = iscsi_fence_preempt,
};
