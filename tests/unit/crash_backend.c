/*
 * crash_backend.c - the backends the crash harness puts between a store and its fault medium
 * (test_crash.c): a forwarding one that stands in for the medium's fence keys, and a window of
 * blocks, so that a store and its write log share one medium and one event log.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "crash.h"

/* ---- A forwarding backend ------------------------------------------------------------------ */

/* The store owns (and destroys on close) this wrapper, while the fault backend and its event log
 * live on for the crash cursor. */

struct fwd {
    plx_backend base;
    plx_backend *in;
    uint64_t key; /* registered fence key (persistent reservations, as on an iSCSI LUN); 0: none */
};

/* The medium's registered fence keys, shared by every engine on it (the takeover workload): a
 * stand-in for the target's persistent reservations. An engine whose key was preempted has its
 * writes refused, as RESERVATION CONFLICT would. */
#define MAX_KEYS 8
static uint64_t g_keys[MAX_KEYS];
int g_nkeys;

static int key_index(uint64_t key)
{
    for (int i = 0; i < g_nkeys; i++)
        if (g_keys[i] == key)
            return i;
    return -1;
}

static int fwd_submit(plx_backend *be, struct plx_io *io)
{
    struct fwd *f = (struct fwd *)be;
    if (f->key && key_index(f->key) < 0 && io->op != PLX_IO_READ)
        return -ESTALE;
    return f->in->ops->submit(f->in, io);
}

static int fwd_fence_join(plx_backend *be, uint64_t key, const struct plx_fence_hooks *hooks)
{
    (void)hooks;
    ck_assert_int_lt(g_nkeys, MAX_KEYS);
    g_keys[g_nkeys++] = key;
    ((struct fwd *)be)->key = key;
    return 0;
}

static int fwd_fence_preempt(plx_backend *be, uint64_t victim)
{
    if (key_index(((struct fwd *)be)->key) < 0)
        return -ESTALE;
    int i = key_index(victim);
    if (i >= 0)
        g_keys[i] = g_keys[--g_nkeys];
    return 0;
}

static int fwd_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *in = ((struct fwd *)be)->in;
    return in->ops->poll(in, timeout_ms);
}

static int fwd_fd(const plx_backend *be)
{
    const plx_backend *in = ((const struct fwd *)be)->in;
    return in->ops->fd(in);
}

static unsigned fwd_inflight(const plx_backend *be)
{
    const plx_backend *in = ((const struct fwd *)be)->in;
    return in->ops->inflight(in);
}

static void fwd_destroy(plx_backend *be)
{
    free(be);
}

static const struct plx_backend_ops fwd_ops = {
    .submit = fwd_submit,
    .poll = fwd_poll,
    .fd = fwd_fd,
    .inflight = fwd_inflight,
    .destroy = fwd_destroy,
};

const struct plx_fence_ops fwd_fence_ops = {
    .join = fwd_fence_join,
    .preempt = fwd_fence_preempt,
};

/* A window of blocks [first, first + nblocks) of a medium it does not own: the store and its
 * write log share one fault medium, so every crash position cuts both at the same moment. (One
 * medium also means one volatile cache: a flush of either makes both durable, which is kinder
 * than two disks would be.) */
struct win {
    plx_backend base;
    plx_backend *in;
    uint64_t first;
};

static void win_done(struct plx_io *io, int status)
{
    struct plx_io *parent = io->owner;
    free(io);
    parent->done(parent, status);
}

static int win_submit(plx_backend *be, struct plx_io *io)
{
    struct win *w = (struct win *)be;
    struct plx_io *c = malloc(sizeof *c);
    ck_assert_ptr_nonnull(c);
    *c = *io;
    if (io->op != PLX_IO_FLUSH)
        c->block += w->first;
    c->done = win_done;
    c->owner = io;
    int rc = w->in->ops->submit(w->in, c);
    if (rc)
        free(c);
    return rc;
}

static int win_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *in = ((struct win *)be)->in;
    return in->ops->poll(in, timeout_ms);
}

static int win_fd(const plx_backend *be)
{
    const plx_backend *in = ((const struct win *)be)->in;
    return in->ops->fd(in);
}

static unsigned win_inflight(const plx_backend *be)
{
    const plx_backend *in = ((const struct win *)be)->in;
    return in->ops->inflight(in);
}

static const struct plx_backend_ops win_ops = {
    .submit = win_submit,
    .poll = win_poll,
    .fd = win_fd,
    .inflight = win_inflight,
    .destroy = fwd_destroy,
};

plx_backend *win_new(plx_backend *in, uint64_t first, uint64_t nblocks)
{
    struct win *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->base.ops = &win_ops;
    w->base.nblocks = nblocks;
    snprintf(w->base.desc, sizeof w->base.desc, "window %llu+%llu", (unsigned long long)first,
             (unsigned long long)nblocks);
    w->in = in;
    w->first = first;
    return &w->base;
}

plx_backend *fwd_new(plx_backend *in)
{
    struct fwd *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->base.ops = &fwd_ops;
    f->base.nblocks = in->nblocks;
    snprintf(f->base.desc, sizeof f->base.desc, "%s", in->desc);
    f->in = in;
    return &f->base;
}
