/*
 * wcache_auto.c - the write cache's automatic mode: on for a VDI while the shared store is slow,
 * off once it is fast again and the VDI's backlog is drained (thesis 3.4.5; issue 14).
 *
 * The signal is the store's write latency as the engine measures it (engine.c: a weighted mean
 * of its writes' submit-to-completion times, st->write_lat_ns). With the cache on, the drain's
 * writes keep sampling the store, so the mean follows the store while guests write to the log.
 * Hysteresis, so that a burst or a single slow write does not flap the switch: on after the
 * latency has stayed above on_ms for hold_ms; off only when the VDI has next to nothing left in
 * the log (at most AUTO_OFF_MAX_BACKLOG records, which the switch drains first) and the latency has
 * stayed below off_ms (< on_ms) for hold_ms. Switching is exactly the operator's
 * plx_vdi_wcache, so the log's ordering and durability rules hold as they do for `parallax cache
 * enable|disable`.
 *
 * The rule runs from plx_vdi_wcache_tick, which the serving loop calls periodically where it
 * may block (turning the cache on or off writes the VDI's record), never from a completion.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "parallax.h"
#include "pipeline.h"
#include "wlog.h"

#define DEFAULT_HOLD_MS 1000u
/* Turning off waits for the VDI's records to drain (plx_vdi_wcache). A guest that keeps writing
 * keeps a few records in the log at any moment, so "drained" means at most this many, which a
 * fast store drains in a few ms: the loop that ticks is held that long, never longer. */
#define AUTO_OFF_MAX_BACKLOG 64u

double plx_store_write_latency_ms(const plx_store *st)
{
    return (double)st->write_lat_ns / 1e6;
}

int plx_vdi_wcache_auto(plx_vdi *v, const struct plx_wcache_auto *a)
{
    plx_store *st = v->st;
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only: nothing to cache", v->rec.name);
    if (!st->wlog)
        return plx_err(st, -ENOENT, "no write log is attached to this store");
    double on_ms = a && a->on_ms > 0 ? a->on_ms : PLX_WCACHE_AUTO_ON_MS;
    double off_ms = a && a->off_ms > 0 ? a->off_ms : on_ms / 2;
    if (on_ms > 60000 || off_ms >= on_ms)
        return plx_err(st, -EINVAL,
                       "automatic write cache: the threshold to turn off (%.3f ms) must be below "
                       "the one to turn on (%.3f ms), which is at most 60000 ms",
                       off_ms, on_ms);
    v->wauto.on = true;
    v->wauto.on_us = (uint32_t)(on_ms * 1000);
    v->wauto.off_us = (uint32_t)(off_ms * 1000);
    v->wauto.hold_ms = a && a->hold_ms ? a->hold_ms : DEFAULT_HOLD_MS;
    v->wauto.since_ns = 0;
    return 0;
}

int plx_vdi_wcache_set_mode(plx_vdi *v, int mode, const struct plx_wcache_auto *a)
{
    if (mode == PLX_WCACHE_AUTO)
        return plx_vdi_wcache_auto(v, a);
    if (mode != PLX_WCACHE_ON && mode != PLX_WCACHE_OFF)
        return plx_err(v->st, -EINVAL, "unknown write cache mode %d", mode);
    v->wauto.on = false;
    return plx_vdi_wcache(v, mode == PLX_WCACHE_ON);
}

int plx_vdi_wcache_mode(const plx_vdi *v, struct plx_wcache_auto *a)
{
    if (a) {
        memset(a, 0, sizeof *a);
        if (v->wauto.on) {
            a->on_ms = v->wauto.on_us / 1000.0;
            a->off_ms = v->wauto.off_us / 1000.0;
            a->hold_ms = v->wauto.hold_ms;
        }
    }
    if (v->wauto.on)
        return PLX_WCACHE_AUTO;
    return plx_vdi_wcache_on(v) ? PLX_WCACHE_ON : PLX_WCACHE_OFF;
}

int plx_vdi_wcache_tick(plx_vdi *v)
{
    plx_store *st = v->st;
    if (!v->wauto.on || !st->wlog)
        return 0;
    uint64_t lat_us = st->write_lat_ns / 1000;
    bool cached = plx_vdi_wcache_on(v);
    if (!cached) {
        /* A failed log takes no writes: nothing to turn on (the status says why). */
        struct plx_wcache_status ws;
        plx_wcache_status(st, &ws);
        if (ws.failed)
            return 0;
    }
    /* The condition for the other state: slow store (to turn on), or fast store and (almost)
     * nothing of this VDI left in the log (to turn off). */
    bool want_switch =
        cached ? lat_us < v->wauto.off_us && plx_wlog_vdi_backlog(v) <= AUTO_OFF_MAX_BACKLOG
               : lat_us > v->wauto.on_us;
    if (!want_switch) {
        v->wauto.since_ns = 0;
        return 0;
    }
    uint64_t now = plx_mono_ns();
    if (!v->wauto.since_ns) {
        v->wauto.since_ns = now;
        return 0;
    }
    if (now - v->wauto.since_ns < (uint64_t)v->wauto.hold_ms * 1000000u)
        return 0;
    v->wauto.since_ns = 0;
    int rc = plx_vdi_wcache(v, !cached);
    return rc < 0 ? rc : 1;
}
