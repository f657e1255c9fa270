/*
 * nbd_server.h - the built-in NBD server of `parallax serve`, running on the engine thread.
 *
 * Export names: a VDI's name or id (read-write), "VDI@N" or "VDI@LABEL" (a snapshot,
 * read-only); NBD_OPT_LIST lists every VDI and every live snapshot as VDI@N. Everything (the
 * listening sockets, the connections, the requests) is driven by the engine thread's event loop
 * (engine_thread.c): sockets are non-blocking, requests are submitted to the engine
 * asynchronously and answered in completion order, so one connection keeps many requests in
 * flight without any other thread. Connections to the same VDI share one open handle, which is
 * why multi-conn is safe: a flush on any connection covers the writes completed on every one.
 */
#ifndef PLX_NBD_SERVER_H
#define PLX_NBD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "engine_thread.h"
#include "nbd_tls.h"

struct nbd_server;

/* Listen on the unix socket unix_path (replacing a stale socket file), or else on TCP `port` of
 * ipaddr (NULL: 127.0.0.1; port "0": any free port, see nbd_server_port), and serve on the engine thread of `et`. tls: NULL or mode OFF for
 * plain NBD; otherwise the credentials are loaded here (an error names the file). One server
 * per process. Call from any thread but the engine thread. */
int nbd_server_start(struct et *et, const char *unix_path, const char *port, const char *ipaddr,
                     const struct nbd_tls_config *tls, struct nbd_server **out, char *err,
                     size_t errlen);
/* The TCP port the server listens on: the one given, or the kernel's pick for port "0"; 0 for a
 * unix socket. */
uint16_t nbd_server_port(const struct nbd_server *srv);
/* Stop listening, drop every connection (their requests in flight are completed first), close
 * the VDIs and the control socket (control_stop). The engine thread keeps running. */
void nbd_server_stop(struct nbd_server *srv);
/* The writable VDI with this id that the server has open, or NULL (for control_start). Engine
 * thread. */
plx_vdi *nbd_server_find_writable(uint64_t id);
/* With on != 0, every VDI the server opens for writing gets the write cache (the store has a
 * write log attached: `serve --write-cache`). Call before nbd_server_start. */
void nbd_server_cache_all(int on);

#endif
