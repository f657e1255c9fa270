/*
 * wcache_auto.c - the write cache's automatic mode: on for a VDI while the shared store is slow,
 * off once it is fast again and the VDI's backlog is drained (thesis 3.4.5; issue 14).
 *
 * The signal is the store's write latency as the engine measures it (engine.c: a weighted mean
 * of its writes' submit-to-completion times, st->write_lat_ns, decayed while the store is idle:
 * plx_store_write_lat_now). With the cache on, the drain's writes keep sampling the store, so
 * the mean follows the store while guests write to the log; once nothing is written it decays.
 *
 * Turning on must be quick: a burst that meets a slow store should reach the log at once, not
 * after the writes already queued to the store. So the mode binds the VDI's record to the log
 * when it is set (plx_wlog_vdi_bind: the record names the log with the cache off), and turning
 * on then writes nothing to the store: the next request goes to the log. The price: while the
 * VDI is open in this mode, its record names this host's log, as with the cache on (a crashed
 * host's VDI waits for the log's replay or `cache discard`).
 *
 * Hysteresis, so that the switch does not flap: on after the latency (or the age of the VDI's
 * oldest write in flight, whichever is more) has stayed above on_ms for a fifth of hold_ms
 * (cheap: nothing is written, and turning back off takes longer); off only when the VDI has
 * next to nothing left in the log (at most auto_off_max_backlog records, wlog_policy.h) and the
 * latency has stayed below off_ms (< on_ms) for hold_ms. Turning off does not wait either: the
 * VDI's new requests are held while its last records drain, and then go to the pipeline in order
 * (plx_wlog_vdi_try_detach). The log's ordering and durability rules hold as they do for
 * `parallax cache enable|disable`.
 *
 * The rule runs from plx_vdi_wcache_tick, which the serving loop calls periodically, never from
 * a completion.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "parallax.h"
#include "pipeline.h"
#include "wlog.h"
#include "wlog_policy.h"

double plx_store_write_latency_ms(const plx_store *st)
{
    return (double)plx_store_write_lat_now(st) / 1e6;
}

int plx_vdi_wcache_auto(plx_vdi *v, const struct plx_wcache_auto *a)
{
    plx_store *st = v->st;
    if (v->ro)
        return plx_err(st, -EROFS, "VDI %s is open read-only: nothing to cache", v->rec.name);
    if (!st->wlog)
        return plx_err(st, -ENOENT, "no write log is attached to this store");
    const struct plx_wlog_policy *pol = plx_wlog_policy(st);
    double on_ms = a && a->on_ms > 0 ? a->on_ms : pol->auto_on_ms;
    double off_ms = a && a->off_ms > 0 ? a->off_ms : on_ms / 2;
    if (on_ms > 60000 || off_ms >= on_ms)
        return plx_err(st, -EINVAL,
                       "automatic write cache: the threshold to turn off (%.3f ms) must be below "
                       "the one to turn on (%.3f ms), which is at most 60000 ms",
                       off_ms, on_ms);
    int rc = plx_wlog_vdi_bind(v);
    if (rc)
        return rc;
    v->wauto.on = true;
    v->wauto.on_us = (uint32_t)(on_ms * 1000);
    v->wauto.off_us = (uint32_t)(off_ms * 1000);
    v->wauto.hold_ms = a && a->hold_ms ? a->hold_ms : pol->auto_hold_ms;
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
    int rc = plx_vdi_wcache(v, mode == PLX_WCACHE_ON);
    if (!rc && mode == PLX_WCACHE_OFF)
        plx_wlog_pass_forget(v); /* (turning off flushed the store: they are durable) */
    return rc;
}

int plx_vdi_wcache_off_nowait(plx_vdi *v)
{
    v->wauto.on = false;
    if (!v->st->wlog)
        return 0;
    int rc = plx_wlog_vdi_try_detach(v);
    if (rc)
        return rc;
    rc = plx_vdi_wcache(v, 0); /* drained: this clears the record */
    if (!rc)
        plx_wlog_pass_forget(v);
    return rc;
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
    if (plx_wlog_vdi_detaching(v))
        return 0; /* turning off: the drain finishes it */
    uint64_t lat_us = plx_store_write_lat_now(st) / 1000;
    bool cached = plx_vdi_wcache_on(v);
    if (!cached) {
        /* A failed log takes no writes: nothing to turn on (the status says why). */
        struct plx_wcache_status ws;
        plx_wcache_status(st, &ws);
        if (ws.failed)
            return 0;
    }
    /* The condition for the other state: slow store (to turn on), or fast store and (almost)
     * nothing of this VDI left in the log (to turn off). To turn on, a write of the VDI still
     * in flight counts too, with the time it has taken so far: at the start of a burst against
     * a slow store nothing completes for a while (queued writes complete a batch at a time). */
    uint64_t now = plx_mono_ns();
    if (!cached) {
        uint64_t oldest = plx_vdi_oldest_write_ns(v);
        if (oldest && oldest < now && (now - oldest) / 1000 > lat_us)
            lat_us = (now - oldest) / 1000;
    }
    /* Fast again: the deferred drain (wlog_drain.c, drain_defer) would keep the VDI's backlog above
     * auto_off_max_backlog while the guest writes, so it drains at once until it is turned
     * off or the store is slow again. (Deferral also lets the latency decay with no writes to
     * the store: the drain's writes then sample it afresh.) */
    if (cached)
        plx_wlog_vdi_hurry(v, lat_us < v->wauto.off_us);
    bool want_switch =
        cached ? lat_us < v->wauto.off_us &&
                     plx_wlog_vdi_backlog(v) <= plx_wlog_policy(st)->auto_off_max_backlog
               : lat_us > v->wauto.on_us;
    if (!want_switch) {
        v->wauto.since_ns = 0;
        return 0;
    }
    if (!v->wauto.since_ns)
        v->wauto.since_ns = now;
    uint64_t hold_ns = (uint64_t)v->wauto.hold_ms * 1000000u / (cached ? 1 : 5);
    if (now - v->wauto.since_ns < hold_ns)
        return 0;
    v->wauto.since_ns = 0;
    if (!cached) {
        int rc = plx_wlog_vdi_enable(v);
        return rc < 0 ? rc : 1;
    }
    int rc = plx_wlog_vdi_try_detach(v);
    return rc < 0 && rc != -EAGAIN ? rc : 2;
}
