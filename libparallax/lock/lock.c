/*
 * lock.c - holder liveness, the lock manager's attach, leases and status, fencing at the medium
 * and the admin lock (lock.h), through the lock seam: the single-host implementation
 * (lock_local.c) or the lock manager's (lock_lockd.c). Only this file picks one.
 */
#include <errno.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include "lock.h"
#include "backend.h"
#include "system.h"
#include "test_hooks.h"

/* ---- Holders --------------------------------------------------------------------------------- */

bool plx_holder_stale(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host == 0)
        return true;
    if (plx_holder_is_me(st, host, pid, epoch))
        return false;
    return !st->lock_ops->holder_alive(st, host, pid, epoch);
}

void plx_holder_set_me(const plx_store *st, uint64_t *host, uint32_t *pid, uint64_t *epoch)
{
    *host = st->host_hash;
    *pid = st->pid;
    *epoch = st->epoch;
}

bool plx_holder_is_me(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    return host == st->host_hash && pid == st->pid && epoch == st->epoch;
}

/* ---- The lock manager: attach, leases, status --------------------------------------------- */

int plx_lock_attach(plx_store *st, const char *addr)
{
    const struct plx_lock_ops *ops = &plx_lock_lockd;
    int rc = ops->attach(st, addr, plx_admin_lock_kick);
    if (!rc)
        st->lock_ops = ops;
    return rc;
}

void plx_lock_detach(plx_store *st)
{
    if (!st->lock_ops || !st->lock_ops->detach)
        return;
    st->lock_ops->detach(st);
    st->lock_ops = &plx_lock_local;
}

int plx_lease_check(plx_store *st)
{
    if (st->lock_ops->lease_check)
        st->lock_ops->lease_check(st);
    return st->fenced ? -ESTALE : 0;
}

int plx_lease_confirmed(plx_store *st, uint64_t since_ns)
{
    return st->lock_ops->lease_confirmed ? st->lock_ops->lease_confirmed(st, since_ns) : 0;
}

uint64_t plx_lease_ns(const plx_store *st)
{
    return st->lock_ops->lease_ns ? st->lock_ops->lease_ns(st) : 0;
}

int plx_lock_status(plx_store *st, void (*line)(void *arg, const char *text), void *arg)
{
    if (!st->lock_ops->status)
        return plx_err(st, -ENOENT, "this blockstore has no lock manager");
    return st->lock_ops->status(st, line, arg);
}

/* ---- Fencing at the medium ---------------------------------------------------------------------
 */

/* A key names one engine process, like a holder record (host, pid, start time): a dead holder's
 * key is computed from its record, and preempting it cuts off that process and nothing else
 * (another engine process of the same host keeps its own key and its VDIs). FNV-1a, never 0
 * (0 means "no key" to a SCSI target). */
uint64_t plx_fence_key(uint64_t host, uint32_t pid, uint64_t epoch)
{
    uint64_t words[3] = {host, pid, epoch}, h = 14695981039346656037ull;
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 8; i++) {
            h ^= (words[w] >> (8 * i)) & 0xff;
            h *= 1099511628211ull;
        }
    return h ? h : 1;
}

/* Hooks the backend calls when its registration is in doubt (backend.h). */
static int hook_lease_confirmed(void *arg, uint64_t since_ns)
{
    return plx_lease_confirmed(arg, since_ns);
}

static bool key_in_list(const struct plx_state_block *s, uint64_t key)
{
    for (uint32_t i = 0; i < s->preempted_count && i < PLX_PREEMPTED_KEYS; i++)
        if (s->preempted_keys[i] == key)
            return true;
    return false;
}

static int hook_key_preempted(void *arg, const void *block, uint64_t key)
{
    plx_store *st = arg;
    const char *why;
    if (plx_blkhdr_verify(block, PLX_MAGIC_STATE_V2, st->sb.state_block, &why) &&
        plx_blkhdr_verify(block, PLX_MAGIC_STATE, st->sb.state_block, &why))
        return -EIO;
    return key_in_list(block, key);
}

int plx_fence_join(plx_store *st)
{
    if (!st->fence_ops)
        st->fence_ops = plx_backend_fence_ops(st->be);
    /* Fencing is for a store whose lock manager grants leases: it decides who is dead. */
    if (!st->lock_ops->lease_ns || st->read_only || !st->fence_ops)
        return 0;
    uint64_t key = plx_fence_key(st->host_hash, st->pid, st->epoch);
    struct plx_fence_hooks hooks = {
        .arg = st,
        .lease_confirmed = hook_lease_confirmed,
        .lease_wait_ns = plx_lease_ns(st),
        .preempted_block = st->sb.state_block,
        .key_preempted = hook_key_preempted,
    };
    int rc = st->fence_ops->join(st->be, key, &hooks);
    if (rc)
        return plx_err(st, rc,
                       "%s: cannot register this host's reservation key %016llx on the LUN "
                       "(SCSI persistent reservations, which fence dead hosts): %s",
                       st->be->desc, (unsigned long long)key, strerror(-rc));
    st->fencing = true;
    return 0;
}

/* List the victim's key among the preempted keys in the state block, durably, before it is
 * preempted: a process whose key is listed never registers again (backend.h, rejoin), even at
 * a target that restarted and forgot the preempt. Under the admin lock. */
static int list_preempted(plx_store *st, uint64_t key)
{
    int rc = plx_state_read(st);
    if (rc || key_in_list(&st->state, key))
        return rc;
    /* Test builds only (test_hooks.h): a window between listing and preempting, to force the
     * interleaving with a host registering again. */
    const char *delay = plx_test_hook("PLX_TEST_PREEMPT_DELAY_MS");
    struct plx_state_block *s = &st->state;
    s->preempted_keys[s->preempted_next] = key;
    s->preempted_next = (s->preempted_next + 1) % PLX_PREEMPTED_KEYS;
    if (s->preempted_count < PLX_PREEMPTED_KEYS)
        s->preempted_count++;
    rc = plx_state_write(st);
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_FLUSH, 0, 0, NULL, 0);
    if (!rc && delay && atoi(delay) > 0)
        usleep((useconds_t)atoi(delay) * 1000u);
    return rc;
}

int plx_holder_evict(plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (!st->fencing || !host || plx_holder_is_me(st, host, pid, epoch))
        return 0;
    uint64_t key = plx_fence_key(host, pid, epoch);
    int rc = list_preempted(st, key);
    if (!rc)
        rc = st->fence_ops->preempt(st->be, key);
    if (rc == -ESTALE) {
        plx_fence(st,
                  "%s: this process's own reservation key was preempted: another host declared "
                  "it dead and took over its locks, so it writes nothing more (restart it)",
                  st->be->desc);
        return -ESTALE;
    }
    if (rc)
        return plx_err(st, rc,
                       "%s: cannot preempt the reservation key %016llx of dead holder (host "
                       "%016llx pid %u) before taking over its locks: %s",
                       st->be->desc, (unsigned long long)key, (unsigned long long)host, pid,
                       strerror(-rc));
    return 0;
}

/* ---- The admin lock ----------------------------------------------------------------------------
 */

/* The message of a wait for the admin lock that ended without it (rc from the lock seam). */
static int lock_wait_error(plx_store *st, int rc, double waited)
{
    if (rc == -EWOULDBLOCK)
        return plx_err(st, -EBUSY,
                       "%s: another process has held the blockstore's admin lock for %.0f s",
                       st->be->desc, waited);
    if (rc == -ENOTCONN)
        return plx_err(st, -EHOSTUNREACH,
                       "%s: waited %.0f s for the lock manager, which cannot be reached (%s); "
                       "data already open is still served",
                       st->be->desc, waited,
                       st->lock_ops->unreachable ? st->lock_ops->unreachable(st) : "");
    if (rc == -EACCES || rc == -EPROTO)
        return rc; /* the message is set */
    return plx_err(st, rc, "locking %s: %s", st->be->desc, strerror(-rc));
}

int plx_admin_lock_writable(plx_store *st)
{
    if (st->read_only)
        return plx_err(st, -EROFS, "blockstore opened read-only");
    return plx_admin_lock(st);
}

int plx_admin_lock(plx_store *st)
{
    if (st->admin_depth++)
        return 0;
    double limit = plx_admin_lock_timeout_ns() / 1e9, t0 = plx_now_ns() / 1e9;
    uint64_t mono0 = plx_mono_ns();
    for (unsigned sleep_us = 1000;; sleep_us = sleep_us < 50000 ? sleep_us * 2 : 50000) {
        int rc = st->lock_ops->admin_try(st, 1);
        if (rc == 0)
            return 0;
        double waited = plx_now_ns() / 1e9 - t0;
        /* -ENOTCONN: the lock manager cannot be reached; it may come back within the wait. */
        bool retry = rc == -EWOULDBLOCK || rc == -ENOTCONN;
        if (!retry || waited >= limit) {
            st->admin_depth--;
            /* Not queued behind another holder: lockd answers nothing (stopped, cut off). */
            if (rc == -EWOULDBLOCK && st->lock_ops->silent && st->lock_ops->silent(st, mono0))
                rc = -ENOTCONN;
            return lock_wait_error(st, rc, waited);
        }
        usleep(sleep_us);
        /* Keep our own lease while we wait (a server waits here on its engine thread). */
        if (st->service_tick)
            st->service_tick(st);
    }
}

/* ---- Waiting for the admin lock on the event loop ------------------------------------------ */

/* How often an ask that is outstanding is looked at although no answer woke the loop: the
 * answer wakes it (lock_lockd.c watches the socket while an ask is out), so this only bounds
 * how late a timeout is noticed. */
#define ASK_LOOK_NS 100000000ull

static void lock_timer_arm(plx_store *st, uint64_t at_ns)
{
    if (!st->lock_timer.at_ns || at_ns < st->lock_timer.at_ns)
        plx_timer_arm(st, &st->lock_timer, at_ns);
}

/* The lock timer: ask for the admin lock for the first waiter; hand a grant over; end waits
 * that ran out of time. Runs from a service pass's timers, outside every I/O handler, so a
 * waiter's done may do blocking admin work (an open's reads and writes). */
static void lock_pump(struct plx_timer *t)
{
    plx_store *st = (plx_store *)((char *)t - offsetof(plx_store, lock_timer));
    struct plx_lock_wait *w;
    while ((w = st->lock_waiters) != NULL) {
        int rc = 0;
        if (st->admin_depth) {
            st->admin_depth++; /* held here already (a claim ahead): nests as plx_admin_lock */
        } else {
            rc = st->lock_ops->admin_ask ? st->lock_ops->admin_ask(st)
                                         : st->lock_ops->admin_try(st, 1);
            if (rc == 0)
                st->admin_depth = 1;
        }
        uint64_t now = plx_mono_ns();
        if (rc == -EINPROGRESS || rc == -EWOULDBLOCK || rc == -ENOTCONN) {
            if (now < w->deadline_ns) {
                uint64_t next;
                if (rc == -EINPROGRESS) {
                    next = now + ASK_LOOK_NS;
                } else {
                    /* Held elsewhere or unreachable: ask again soon, then less often. */
                    next = now + (uint64_t)st->lock_backoff_us * 1000u;
                    st->lock_backoff_us =
                        st->lock_backoff_us < 50000 ? st->lock_backoff_us * 2 : 50000;
                }
                lock_timer_arm(st, next < w->deadline_ns ? next : w->deadline_ns);
                return;
            }
            double waited = (double)(now - w->since_ns) / 1e9;
            if (rc == -EINPROGRESS) {
                /* Asked and never answered: queued behind another holder, or lockd stopped
                 * answering (frozen, partitioned) while the connection stays up. */
                bool silent = st->lock_ops->silent && st->lock_ops->silent(st, w->since_ns);
                rc = silent ? -ENOTCONN : -EWOULDBLOCK;
            }
            rc = lock_wait_error(st, rc, waited);
        }
        st->lock_waiters = w->next;
        w->next = NULL;
        st->lock_backoff_us = 1000;
        w->done(w, rc);
    }
    /* Nobody waits: an ask still out is withdrawn, a late grant given back. */
    if (!st->admin_depth && st->lock_ops->admin_withdraw)
        st->lock_ops->admin_withdraw(st);
}

void plx_admin_lock_async(plx_store *st, struct plx_lock_wait *w)
{
    w->since_ns = plx_mono_ns();
    w->deadline_ns = w->since_ns + plx_admin_lock_timeout_ns();
    w->next = NULL;
    struct plx_lock_wait **pp = &st->lock_waiters;
    while (*pp)
        pp = &(*pp)->next;
    *pp = w;
    st->lock_timer.run = lock_pump;
    if (!st->lock_backoff_us)
        st->lock_backoff_us = 1000;
    /* Never inside this call: the first look is the next service pass's. */
    lock_timer_arm(st, w->since_ns);
}

void plx_admin_lock_cancel(plx_store *st, struct plx_lock_wait *w)
{
    for (struct plx_lock_wait **pp = &st->lock_waiters; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            w->next = NULL;
            break;
        }
    }
    /* The pump withdraws what nobody waits for any more. */
    if (!st->lock_waiters)
        lock_timer_arm(st, plx_mono_ns());
}

void plx_admin_lock_kick(plx_store *st)
{
    if (st->lock_timer.run)
        lock_timer_arm(st, plx_mono_ns());
}

int plx_admin_lock_try(plx_store *st)
{
    if (st->admin_depth) {
        st->admin_depth++;
        return 0;
    }
    /* lockd's ADMIN-LOCK queues behind other hosts; its ADMIN-TRY does not. */
    int rc = st->lock_ops->admin_try_now ? st->lock_ops->admin_try_now(st)
                                         : st->lock_ops->admin_try(st, 1);
    if (rc == 0)
        st->admin_depth = 1;
    return rc;
}

void plx_admin_unlock(plx_store *st)
{
    if (--st->admin_depth == 0)
        st->lock_ops->admin_try(st, 0);
}
