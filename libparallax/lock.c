/*
 * lock.c - identity, holder liveness and the admin lock (lock.h): the single-host implementation
 * a lock manager will replace for many hosts.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include "lock.h"
#include "lockd_proto.h"

/* ---- Identity -------------------------------------------------------------------------------- */

static uint64_t process_start_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Field 22 (starttime); skip past the command name, which may contain spaces. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long v = 0;
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
        /* A zombie (state Z) is gone as a lock holder, even before its parent reaps it. */
        if (++field == 3 && tok[0] == 'Z')
            return 0;
        if (field == 22) {
            v = strtoull(tok, NULL, 10);
            break;
        }
    }
    return v;
}

/* The configured host id, if any: one word on the first line of the file. */
static bool host_id_file(char *buf, size_t len)
{
    FILE *f = fopen("/etc/parallax/host-id", "r");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (ok)
        buf[strcspn(buf, " \t\r\n")] = 0;
    return ok && *buf;
}

void plx_identity_init(plx_store *st, const char *host)
{
    const char *env = getenv("PARALLAX_HOST_ID");
    if (!(host && *host) && env && *env)
        host = env;
    if (host && *host) {
        snprintf(st->host, sizeof st->host, "%s", host);
    } else if (!host_id_file(st->host, sizeof st->host) &&
               gethostname(st->host, sizeof st->host - 1) != 0) {
        snprintf(st->host, sizeof st->host, "localhost");
    }
    /* A word: it travels in the lock manager's protocol and in messages. */
    for (char *p = st->host; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n')
            *p = '_';
    st->host_hash = plx_host_hash(st->host);
    st->pid = (uint32_t)getpid();
    st->epoch = process_start_ticks(getpid());
    st->lock_ops = &plx_lock_local;
}

/* ---- The local implementation of the lock seam ----------------------------------------------- */

int plx_lock_local_admin_try(plx_store *st, int take)
{
    return st->be->ops->lock ? st->be->ops->lock(st->be, take) : 0;
}

/* A holder on this host is alive while a process with its pid and start time runs. A holder on
 * another host cannot be judged from here: it counts as alive (a lock manager decides). */
static bool local_holder_alive(const plx_store *st, uint64_t host, uint32_t pid, uint64_t epoch)
{
    if (host != st->host_hash)
        return true;
    uint64_t now = process_start_ticks((pid_t)pid);
    return now != 0 && now == epoch;
}

const struct plx_lock_ops plx_lock_local = {
    .name = "local",
    .admin_try = plx_lock_local_admin_try,
    .holder_alive = local_holder_alive,
};

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

/* ---- The admin lock ---------------------------------------------------------------------------- */

/* How long to wait for the admin lock: $PARALLAX_LOCK_TIMEOUT seconds, default 30. Holders keep
 * it for one read-modify-write of a few blocks, so a long wait means a stuck holder: better a
 * clear error than a hang. */
static double lock_timeout(void)
{
    const char *env = getenv("PARALLAX_LOCK_TIMEOUT");
    double t = env ? strtod(env, NULL) : 30.0;
    return t > 0 ? t : 30.0;
}

uint64_t plx_admin_lock_timeout_ns(void)
{
    return (uint64_t)(lock_timeout() * 1e9);
}

int plx_admin_lock(plx_store *st)
{
    if (st->admin_depth++)
        return 0;
    double limit = lock_timeout(), t0 = plx_now_ns() / 1e9;
    for (unsigned sleep_us = 1000;; sleep_us = sleep_us < 50000 ? sleep_us * 2 : 50000) {
        int rc = st->lock_ops->admin_try(st, 1);
        if (rc == 0)
            return 0;
        double waited = plx_now_ns() / 1e9 - t0;
        /* -ENOTCONN: the lock manager cannot be reached; it may come back within the wait. */
        bool retry = rc == -EWOULDBLOCK || rc == -ENOTCONN;
        if (!retry || waited >= limit) {
            st->admin_depth--;
            if (rc == -EWOULDBLOCK)
                return plx_err(st, -EBUSY,
                               "%s: another process has held the blockstore's admin lock for "
                               "%.0f s",
                               st->be->desc, waited);
            if (rc == -ENOTCONN)
                return plx_err(st, -EHOSTUNREACH,
                               "%s: waited %.0f s for the lock manager, which cannot be "
                               "reached (%s); data already open is still served",
                               st->be->desc, waited,
                               st->lock_ops->unreachable ? st->lock_ops->unreachable(st) : "");
            if (rc == -EACCES || rc == -EPROTO)
                return rc; /* the message is set */
            return plx_err(st, rc, "locking %s: %s", st->be->desc, strerror(-rc));
        }
        usleep(sleep_us);
        /* Keep our own lease while we wait (a server waits here on its engine thread). */
        if (st->service_tick)
            st->service_tick(st);
    }
}

void plx_admin_unlock(plx_store *st)
{
    if (--st->admin_depth == 0)
        st->lock_ops->admin_try(st, 0);
}
