/*
 * control.h - the control socket of a process that serves VDIs.
 *
 * While a server holds a VDI open for writing, no other process may change that VDI (single
 * writer). Administrative commands for it are therefore carried out by the server, inside its
 * request stream: the `parallax` command finds the server through the VDI's lock holder (pid on
 * this host) and the socket path below, and sends one line:
 *
 *     snapshot ID [LABEL]          ->  "ok N"           (N: index of the new snapshot)
 *     snap-label ID N [LABEL]      ->  "ok"
 *     snap-delete ID N             ->  "ok"
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

#ifdef PLX_CONTROL_SERVER
#include "engine_thread.h"
/* Serve commands on the engine thread. find_vdi returns the writable VDI with that id that this
 * process has open, or NULL. */
int control_start(struct et *et, plx_vdi *(*find_vdi)(uint64_t id), char *err, size_t errlen);
void control_stop(void);
#endif

/* Client side (the parallax command): send one command line to the server of `pid` and read the
 * reply into reply. Returns 0 when the server answered "ok ...", the negative errno it sent, or a
 * negative errno when it could not be reached. */
int control_request(int pid, const char *line, char *reply, size_t replylen);

#endif
