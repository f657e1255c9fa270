/*
 * parallax_control.h - the control socket of a process that serves VDIs.
 *
 * Built into every host of the engine as it is here: `parallax serve`, the `parallax` command
 * (the client side) and tapdisk's driver, whose build copies host/ into a blktap tree
 * (tapdisk/build-into-blktap.sh): hence a name that no header of blktap's has.
 *
 * While a server holds a VDI open for writing, no other process may change that VDI (single
 * writer). Administrative commands for it are therefore carried out by the server, inside its
 * request stream: the `parallax` command finds the server through the VDI's lock holder (pid on
 * this host) and the socket path below, and sends one line:
 *
 *     snapshot ID [LABEL]          ->  "ok N"           (N: index of the new snapshot)
 *     snap-label ID N [LABEL]      ->  "ok"
 *     snap-delete ID N             ->  "ok"
 *     cache-attach ID SIZE PATH    ->  "ok"   (attach the write log PATH to ID's store; SIZE
 *                                             in bytes, 0 = default; "ok" if already attached)
 *     cache-enable ID              ->  "ok"   (write cache on for VDI ID)
 *     cache-disable ID             ->  "ok"   (off: answers once ID's writes are drained)
 *     cache-auto ID MS             ->  "ok"   (automatic mode, turning on above MS ms of
 *                                             store write latency; 0 = the default)
 *     cache-status ID              ->  "ok vdi=on|off attached=0|1 failed=0|1 log=BYTES
 *                                       used=BYTES backlog=BYTES records=N drained=BYTES
 *                                       rate=BYTES/S cached=N mode=off|on|auto
 *                                       threshold=MS latency=MS
 *                                       drain=idle|running|deferred|paused|eager|stopped
 *                                       drain_delay_ms=MS drain_max_age_ms=MS oldest_ms=MS
 *                                       path=PATH"
 *                                      (then "error=MESSAGE" when the log failed)
 *
 * Errors come back as "err ERRNO MESSAGE". One command per connection.
 */
#ifndef PLX_CONTROL_H
#define PLX_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "parallax.h"

/* Directory of control sockets: $PARALLAX_RUN_DIR, else /run/parallax, else /tmp/parallax-UID. */
void control_dir(char *buf, size_t len);
/* The socket of the server process `pid`. */
void control_path(int pid, char *buf, size_t len);
/* Remove the sockets of servers that are gone (killed: nobody unlinked them), whose pid no
 * process has; called when a server starts. */
void control_sweep_stale(void);

/* Server side. The process that serves VDIs (`parallax serve`'s engine thread, or tapdisk's
 * scheduler) runs the control socket on its own event loop, through these hooks; every
 * callback runs on that loop's thread, where the engine lives, so commands are ordinary requests
 * in the VDI's stream, answered from their completion callbacks: nothing here waits for the
 * medium, and the reply comes once the change is durable. */
struct control_host {
    /* Call ready(arg) whenever fd is readable, until unwatch(handle). Returns a handle, or NULL
     * when the descriptor cannot be watched. unwatch may be called from inside ready. */
    void *(*watch)(void *host_arg, int fd, void (*ready)(void *arg), void *arg);
    void (*unwatch)(void *host_arg, void *handle);
    /* The VDI with this id that the process has open for writing, and its store; NULL when
     * none (and -EEXIST in *err when more than one, from different blockstores). */
    plx_vdi *(*find_vdi)(void *host_arg, uint64_t id, plx_store **st, int *err);
    void *host_arg;
};

/* Listen on control_path(getpid()) (replacing a stale file) and serve commands through host,
 * which must stay valid until control_stop. */
int control_start(const struct control_host *host, char *err, size_t errlen);
/* Stop listening and remove the socket. Connections being answered finish on their own. */
void control_stop(void);

/* Client side (the parallax command): send one command line to the server of `pid` and read the
 * reply into reply. Returns 0 when the server answered "ok ...", the negative errno it sent, or a
 * negative errno when it could not be reached. */
int control_request(int pid, const char *line, char *reply, size_t replylen);

#endif
