/*
 * wlog_policy.c - the defaults of the write cache's policy, and the environment's overrides
 * (layer 6; wlog_policy.h).
 */
#include <stdlib.h>

#include "wlog_shared.h"

#define DRAIN_DELAY_MS 50u
#define DRAIN_MAX_AGE_MS 2000u
#define ZC_MIN 64u
#define PASS_COPY_MAX (64ull << 20)
#define AUTO_HOLD_MS 1000u
#define AUTO_OFF_MAX_BACKLOG 64u

void plx_wlog_policy_init(struct plx_wlog_policy *p)
{
    *p = (struct plx_wlog_policy){
        .zc_min = ZC_MIN,
        .pass_copy_max = PASS_COPY_MAX,
        .auto_on_ms = PLX_WCACHE_AUTO_ON_MS,
        .auto_hold_ms = AUTO_HOLD_MS,
        .auto_off_max_backlog = AUTO_OFF_MAX_BACKLOG,
    };
    const char *zc = getenv("PARALLAX_WCACHE_ZC_MIN");
    if (zc && *zc)
        p->zc_min = (uint32_t)strtoul(zc, NULL, 10);
    /* The deferred drain (drain_defer): on by default; a delay of 0 drains at once, as before. */
    uint64_t delay_ms = DRAIN_DELAY_MS, age_ms = DRAIN_MAX_AGE_MS;
    const char *d = getenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
    if (d && *d)
        delay_ms = strtoull(d, NULL, 10);
    const char *age = getenv("PARALLAX_WCACHE_DRAIN_MAX_AGE_MS");
    if (age && *age)
        age_ms = strtoull(age, NULL, 10);
    p->drain_delay_ns = delay_ms * 1000000ull;
    p->drain_max_age_ns = age_ms * 1000000ull;
}

const struct plx_wlog_policy *plx_wlog_policy(const plx_store *st)
{
    return &st->wlog->pol;
}
