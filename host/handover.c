/*
 * handover.c - the tries of a VDI's open while another process holds it (parallax_handover.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "parallax_handover.h"

uint64_t handover_wait_ns(void)
{
    const char *env = getenv("PARALLAX_HANDOVER_WAIT");
    double s = env ? strtod(env, NULL) : 60.0;
    return (uint64_t)((s > 0 ? s : 60.0) * 1e9);
}

/* A try reported (from the service pass): the retry timer's next tick, outside the service
 * pass, acts on it. */
static void handover_try_done(void *arg, int status, plx_vdi *v)
{
    struct handover_try *t = arg;
    t->req = NULL;
    t->done = 1;
    t->rc = status;
    t->v = v;
    if (status)
        snprintf(t->err, sizeof t->err, "%s", plx_store_errmsg(t->st));
}

int handover_try_step(struct handover_try *t, const char *name, int *rc, plx_vdi **v)
{
    if (t->req)
        return 1;
    if (!t->done) {
        if (plx_vdi_open_async(t->st, name, 0, handover_try_done, t, &t->req) == 0)
            return 1;
        t->done = 1;
        t->rc = -ENOMEM;
        snprintf(t->err, sizeof t->err, "%s", plx_store_errmsg(t->st));
    }
    t->done = 0;
    *rc = t->rc;
    *v = t->v;
    t->v = NULL;
    return 0;
}

int handover_keep_waiting(int rc, uint64_t waited_ns)
{
    return (rc == -EBUSY || rc == -EHOSTUNREACH) && waited_ns < handover_wait_ns();
}
