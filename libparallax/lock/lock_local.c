/*
 * lock_local.c - who this process is, and the single-host implementation of the lock seam
 * (lock.h): the backend's flock for the admin lock, /proc for holders on this host. Below both
 * the seam's front (lock.c) and the lock manager's client (lock_lockd.c), which falls back on
 * it for holders of this host and shares the admin lock's timeout.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include "backend.h"
#include "lock.h"
#include "lockd_proto.h"
#include "system.h"

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

void plx_identity_init(plx_store *st, const char *host)
{
    if (host && *host)
        snprintf(st->host, sizeof st->host, "%s", host);
    else
        plx_host_id_default(st->host, sizeof st->host);
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
