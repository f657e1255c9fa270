/*
 * backend_stack.c - the common part of a backend stacked on another (parallax_backend.h): every
 * operation forwarded to the lower backend, for a stacked backend to replace what it changes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"

static plx_backend *lower_of(const plx_backend *be)
{
    return ((const struct plx_backend_stack *)be)->lower;
}

static int fwd_submit(plx_backend *be, struct plx_io *io)
{
    plx_backend *lo = lower_of(be);
    return lo->ops->submit(lo, io);
}

static int fwd_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *lo = lower_of(be);
    return lo->ops->poll(lo, timeout_ms);
}

static int fwd_fd(const plx_backend *be)
{
    const plx_backend *lo = lower_of(be);
    return lo->ops->fd(lo);
}

static unsigned fwd_inflight(const plx_backend *be)
{
    const plx_backend *lo = lower_of(be);
    return lo->ops->inflight(lo);
}

static int fwd_lock(plx_backend *be, int take)
{
    plx_backend *lo = lower_of(be);
    return lo->ops->lock ? lo->ops->lock(lo, take) : 0;
}

static void fwd_destroy(plx_backend *be)
{
    struct plx_backend_stack *s = (struct plx_backend_stack *)be;
    if (s->owns_lower && s->lower)
        s->lower->ops->destroy(s->lower);
    free(s);
}

static const struct plx_backend_ops forward = {
    .submit = fwd_submit,
    .poll = fwd_poll,
    .fd = fwd_fd,
    .inflight = fwd_inflight,
    .destroy = fwd_destroy,
    .lock = fwd_lock,
    .size = sizeof(struct plx_backend_ops),
};

const struct plx_backend_ops *plx_backend_stack_forward(void)
{
    return &forward;
}

/* API 1.8: the whole struct, size set, no optional ability. */
void plx_backend_stack_forward_ops_1_8(struct plx_backend_ops *ops);
PLX_SYMVER("plx_backend_stack_forward_ops@@PARALLAX_1.8")
void plx_backend_stack_forward_ops_1_8(struct plx_backend_ops *ops)
{
    *ops = forward;
}

/* API 1.0 to 1.7: the caller's struct ends at lock; writing more would write past its end. */
void plx_backend_stack_forward_ops_1_0(struct plx_backend_ops *ops);
PLX_SYMVER("plx_backend_stack_forward_ops@PARALLAX_1")
void plx_backend_stack_forward_ops_1_0(struct plx_backend_ops *ops)
{
    memcpy(ops, &forward, offsetof(struct plx_backend_ops, size));
}

void plx_backend_stack_init(struct plx_backend_stack *s, const struct plx_backend_ops *ops,
                            plx_backend *lower, int owns_lower, const char *what)
{
    s->base.ops = ops;
    s->base.nblocks = lower->nblocks;
    snprintf(s->base.desc, sizeof s->base.desc, "%s%s%.100s", what ? what : "",
             what && *what ? " over " : "", lower->desc);
    s->lower = lower;
    s->owns_lower = owns_lower;
}
