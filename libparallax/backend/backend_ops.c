/*
 * backend_ops.c - the seam's optional operations (struct plx_backend_ops from size on): what the
 * layers above call, and what a backend without the operation (or no backend: NULL) answers;
 * and the door by which a backend of a program built before the operations existed comes in.
 * Nothing here knows a particular backend.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

size_t plx_backend_dio_align(const plx_backend *be)
{
    size_t (*op)(const plx_backend *) = be ? PLX_BACKEND_OP(be, dio_align) : NULL;
    return op ? op(be) : PLX_BLOCK_SIZE;
}

const struct plx_fence_ops *plx_backend_fence_ops(const plx_backend *be)
{
    return be != NULL ? PLX_BACKEND_OP(be, fence) : NULL;
}

int plx_backend_prepare(plx_backend *be, uint64_t first, uint64_t nblocks)
{
    int (*op)(plx_backend *, uint64_t, uint64_t) = be ? PLX_BACKEND_OP(be, prepare) : NULL;
    return op ? op(be, first, nblocks) : -EOPNOTSUPP;
}

void plx_backend_prepare_stop(plx_backend *be, uint64_t first, uint64_t nblocks)
{
    void (*op)(plx_backend *, uint64_t, uint64_t) = be ? PLX_BACKEND_OP(be, prepare_stop) : NULL;
    if (op)
        op(be, first, nblocks);
}

void plx_backend_prepare_stats(const plx_backend *be, struct plx_prepare_stats *out)
{
    void (*op)(const plx_backend *, struct plx_prepare_stats *) =
        be ? PLX_BACKEND_OP(be, prepare_stats) : NULL;
    if (op)
        op(be, out);
    else
        memset(out, 0, sizeof *out);
}

plx_backend *plx_backend_v1_adopt(plx_backend *be)
{
    if (plx_backend_own(be))
        return be;
    struct plx_backend_stack *s = malloc(sizeof *s);
    if (s == NULL) {
        be->ops->destroy(be);
        return NULL;
    }
    plx_backend_stack_init(s, plx_backend_stack_forward(), be, 1, NULL);
    /* The same name in messages as before, whole. */
    memcpy(s->base.desc, be->desc, sizeof s->base.desc);
    return &s->base;
}
