/*
 * lockd_proto.h - the protocol between engines and parallax-lockd (lockd/lockd.c), shared by
 * both sides: the library's lock wing (libparallax/lock/, built with -Ilockd) includes this
 * definition, never lockd's code. docs/DESIGN.md ("The lock manager") explains the design.
 *
 * One TCP connection per engine process, lines of ASCII ending in '\n'. The engine sends:
 *
 *   HELLO <host-id> <instance> <pid> <epoch>   first line; -> "OK <lease-ms>" or "ERR <text>"
 *   PING                                       heartbeat, every lease/4; -> "PONG" (the
 *                                                 lease was renewed; may arrive before the
 *                                                 reply to a later request, which skips it)
 *   ADMIN-LOCK                                 -> "GRANTED" once this connection holds the
 *                                                 admin lock (queued until then)
 *   ADMIN-TRY                                  -> "TRY-GRANTED" (this connection holds the
 *                                                 admin lock now) or "TRY-BUSY" (held, or
 *                                                 others are queued), at once; never queued
 *   ADMIN-UNLOCK                               -> "RELEASED" (also withdraws a queued request; a
 *                                                 "GRANTED" may come first)
 *   ALIVE <host-hash> <pid> <epoch>            -> "YES" or "NO": is that holder alive?
 *   STATUS                                     -> lines "HOST ...", then "END"
 *
 * A lock manager that is a standby (parallax-lockd --store: one of several, lockd/arbiter.c)
 * answers HELLO and STATUS with "STANDBY <text>" and nothing else; the engine then tries the
 * next address of its list. STATUS of an active one that took over recently adds the line
 * "TAKEOVER <id> grants in <ms> ms" before "END".
 *
 * host-id is the configured, stable name of the host; instance tells two machines that were
 * given the same id apart (the boot id); host-hash is plx_host_hash(host-id) as recorded in the
 * VDI and extent holder fields (FORMAT.md). A connection's lease lasts lease-ms after its last
 * line. The answers to PING and ADMIN-TRY have names of their own, so the engine can take them
 * whenever they arrive, in between other replies. Everything a connection holds (the admin
 * lock, its place in the queue) goes when it closes.
 */
#ifndef PLX_LOCKD_PROTO_H
#define PLX_LOCKD_PROTO_H

#include <stdint.h>

#define PLX_LOCKD_DEFAULT_PORT 7788
#define PLX_LOCKD_DEFAULT_LEASE_MS 10000u
#define PLX_LOCKD_LINE_MAX 512

/* FNV-1a of the host id: the host field of holders on the medium (never 0). */
static inline uint64_t plx_host_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ? h : 1;
}

#endif
