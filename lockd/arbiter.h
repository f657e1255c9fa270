/*
 * arbiter.h - which of several parallax-lockd instances is the active one, decided on the LUN
 * itself with SCSI-3 persistent reservation keys (lockd/arbiter.c; docs/DESIGN.md "The lock
 * manager", "Fail-over").
 */
#ifndef PLX_LOCKD_ARBITER_H
#define PLX_LOCKD_ARBITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The upper 32 bits of every lockd instance's reservation key ("PLKD"). Engine keys are FNV-1a
 * hashes (lock.c: plx_fence_key); one matching this prefix by chance (2^-32) would be taken for
 * a lockd's. */
#define ARB_KEY_MAGIC 0x504c4b44u

struct arb_config {
    const char *url;    /* the LUN: iscsi://[USER%PASSWORD@]HOST[:PORT]/IQN/LUN */
    const char *id;     /* this instance's name: its initiator name and key */
    uint64_t period_ns; /* how often the active one renews its key, a standby reads the keys */
    uint64_t stale_ns;  /* a key unchanged this long belongs to a dead or cut-off instance */
    uint64_t window_ns; /* a renewal proves the right to grant for this long after it started */
};

/* What the arbiter knows now. */
struct arb_view {
    bool active;
    uint64_t since_ns;       /* active: when it became active (CLOCK_MONOTONIC) */
    uint64_t valid_until_ns; /* active: it may grant until then (last renewal's start + window) */
    uint64_t key;            /* our key on the LUN, 0 = none */
    uint64_t generation;     /* counts the times this instance became active */
};

int arb_start(const struct arb_config *cfg, char *err, size_t errlen);
void arb_get(struct arb_view *v);
/* The main thread gave up being active (its window ran out): drop the key, become a standby. */
void arb_step_down(void);
/* At exit: drop our key if we hold one, stop the thread. */
void arb_stop(void);

#endif
