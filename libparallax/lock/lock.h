/*
 * lock.h - who this process is, and the locks processes sharing a medium take (layer 1).
 *
 * Today: the admin lock is the backend's (flock on a file or device of this host; a flag on the
 * memory medium), and a holder recorded on the medium (a VDI's writer lock, an extent's
 * allocation lock) is alive while its process is (same host, same pid and start time). This is
 * the one place a lock manager for many hosts plugs in (lockd/, docs/DESIGN.md "Locking").
 */
#ifndef PLX_LOCK_H
#define PLX_LOCK_H

#include "engine.h"

/* The lock seam: how a process takes the admin lock, judges holders recorded on the medium
 * (a VDI's writer lock, an extent's allocation lock), and keeps its lease when a lock manager
 * grants leases. Two implementations: plx_lock_local (lock_local.c) and the lock manager's
 * client plx_lock_lockd (lock_lockd.c); lock.c is the front both sit under, and the only file
 * that picks one (plx_identity_init, plx_lock_attach). Nothing outside lock/ calls an
 * implementation: the rest of the library goes through the front's functions below. */
struct plx_lock_ops {
    const char *name;
    /* take != 0: try the admin lock once (0, -EWOULDBLOCK when another process holds it, or
     * -errno); take == 0: release it. Never called nested (plx_admin_lock counts). */
    int (*admin_try)(plx_store *st, int take);
    /* Optional: try the admin lock without waiting more than a moment, from the event loop (a
     * claim made ahead): 0, -EWOULDBLOCK (held elsewhere, or the answer is not in yet: try
     * again later), -ENOTCONN, -EOPNOTSUPP. NULL: admin_try(st, 1) never waits. */
    int (*admin_try_now)(plx_store *st);
    /* Is this holder, never this process and never host 0, alive? */
    bool (*holder_alive)(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
    /* Optional: why admin_try answered -ENOTCONN (the lock manager cannot be reached). */
    const char *(*unreachable)(const plx_store *st);
    /* Optional: ask for the admin lock without waiting, for a waiter on the event loop
     * (plx_admin_lock_async): 0 (held now), -EINPROGRESS (asked; the answer arrives later and
     * wakes the loop through the kick given to attach: ask again then), -EWOULDBLOCK (held
     * elsewhere: ask again later), -ENOTCONN (unreachable: ask again later), or -errno with the
     * store's message set. NULL: admin_try(st, 1) answers at once. */
    int (*admin_ask)(plx_store *st);
    /* Optional: nobody waits any more: withdraw an ask still outstanding, or give back a grant
     * that came in after its waiter left. Never waits. */
    void (*admin_withdraw)(plx_store *st);
    /* Optional: after an ask made at since_ns timed out: has the lock manager stopped answering
     * (a heartbeat went unanswered), rather than kept us queued behind another holder? */
    bool (*silent)(const plx_store *st, uint64_t since_ns);

    /* The rest is a lock manager's (leases); all NULL in plx_lock_local. */
    /* Set this store up to use the lock manager at addr (plx_lock_attach). kick: called when an
     * answer to admin_ask came in (lock.c's waiters look then); the implementation never calls
     * up into lock.c otherwise. On failure nothing is left attached. Blocking. */
    int (*attach)(plx_store *st, const char *addr, void (*kick)(plx_store *st));
    void (*detach)(plx_store *st);
    /* Fence the store (plx_fence) when this process has lost its lease. One clock read. */
    void (*lease_check)(plx_store *st);
    /* plx_lease_confirmed, plx_lease_ns and plx_lock_status below. */
    int (*lease_confirmed)(plx_store *st, uint64_t since_ns);
    uint64_t (*lease_ns)(const plx_store *st);
    int (*status)(plx_store *st, void (*line)(void *arg, const char *text), void *arg);
};
/* Single host: the backend's lock (flock) and /proc (pid and start time) on this host; holders
 * on other hosts count as alive. */
extern const struct plx_lock_ops plx_lock_local;
int plx_lock_local_admin_try(plx_store *st, int take);
/* Many hosts: parallax-lockd (lock_lockd.c) for the admin lock and for holders on other hosts. */
extern const struct plx_lock_ops plx_lock_lockd;

/* Use the lock manager at addr ("host:port", or several separated by commas) for this store:
 * connect and say who we are, start the heartbeat, switch the store to plx_lock_lockd.
 * Blocking. */
int plx_lock_attach(plx_store *st, const char *addr);
/* Back to plx_lock_local; nothing when the store has no lock manager. */
void plx_lock_detach(plx_store *st);
/* Before a request is accepted: 0, or -ESTALE when this process has lost its lease (fenced;
 * the store's message says why). One clock read. */
int plx_lease_check(plx_store *st);
/* Has the lock manager renewed this process's lease (answered a heartbeat) after since_ns
 * (CLOCK_MONOTONIC)? 1 yes; 0 not yet: a heartbeat is sent (or a connection started) so that a
 * later call can say yes. Never blocks. 0 when the store has no lock manager. */
int plx_lease_confirmed(plx_store *st, uint64_t since_ns);
/* The lease the lock manager grants (0: the store has none). */
uint64_t plx_lease_ns(const plx_store *st);
/* The lock manager's status lines, one call of `line` each; -ENOENT when the store has none. */
int plx_lock_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg);

/* Fencing at the medium (SCSI-3 persistent reservations; docs/DESIGN.md "The lock manager").
 * A process's key, derived from its holder identity. */
uint64_t plx_fence_key(uint64_t host, uint32_t pid, uint64_t epoch);
/* At open of a writable store with a lock manager whose backend can fence (an iSCSI LUN):
 * register this process's key and make sure the LUN is reserved for registrants. */
int plx_fence_join(plx_store *st);
/* Under the admin lock, before taking over a lock whose holder was judged dead (a VDI lock, an
 * extent): preempt the holder's key, so the target refuses anything it still sends. 0 when the
 * store does not fence or the holder has no key; -ESTALE (and the store fenced) when our own key
 * was preempted. */
int plx_holder_evict(plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);

/* Set the store's identity: host id (`host`, else $PARALLAX_HOST_ID, else the first line of
 * /etc/parallax/host-id, else the host name), its hash, pid and process start time; and its lock
 * implementation (plx_lock_local). */
void plx_identity_init(plx_store *st, const char *host);
/* Is a lock held by (host, pid, epoch) stale, i.e. held by a process on this host that is gone?
 * Locks of other hosts are never stale from here: that is the lock manager's call. */
bool plx_holder_stale(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
bool plx_holder_is_me(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch);
/* Record this process as a holder (VDI lock fields, extent catalogue entry). */
void plx_holder_set_me(const plx_store *st, uint64_t *host, uint32_t *pid, uint64_t *epoch);
/* Serialise catalogue and registry changes between processes sharing the medium. Nests within
 * a process; waits at most $PARALLAX_LOCK_TIMEOUT seconds (default 30), then -EBUSY. */
int plx_admin_lock(plx_store *st);
/* plx_admin_lock for a change: -EROFS first (with its message) when the store is read-only. */
int plx_admin_lock_writable(plx_store *st);
uint64_t plx_admin_lock_timeout_ns(void);
void plx_admin_unlock(plx_store *st);
/* Waiting for the admin lock on the event loop (a VDI opening in a server that serves others:
 * plx_vdi_open_async): the waiter is queued, the loop goes on, and w->done runs once, from a
 * service pass's timers (never inside plx_admin_lock_async), with rc 0 (the admin lock is
 * held: plx_admin_unlock releases it) or -errno with the store's message set: -EBUSY (another
 * process held it for the whole $PARALLAX_LOCK_TIMEOUT), -EHOSTUNREACH (the lock manager could
 * not be reached or stopped answering; the message names it). Waiters are served in order. */
struct plx_lock_wait {
    void (*done)(struct plx_lock_wait *w, int rc);
    uint64_t since_ns, deadline_ns; /* monotonic; set by plx_admin_lock_async */
    struct plx_lock_wait *next;
};
void plx_admin_lock_async(plx_store *st, struct plx_lock_wait *w);
/* Withdraw a waiter whose done has not run: it never will. */
void plx_admin_lock_cancel(plx_store *st, struct plx_lock_wait *w);
/* The lock implementation's answer to an ask came in: look at the waiters in this pass (the
 * kick given to the implementation's attach). */
void plx_admin_lock_kick(plx_store *st);

/* Take the admin lock without waiting (alloc_claim.c's claims ahead, from the service loop): 0
 * (held; plx_admin_unlock releases it), -EWOULDBLOCK (another process holds it: try again later),
 * -EOPNOTSUPP (this lock implementation cannot answer without waiting: lockd), or -errno. */
int plx_admin_lock_try(plx_store *st);

#endif
