/*
 * tapdisk_fixture.h - what the tests of the blktap3 driver (test_tapdisk.c, test_tapdisk_host.c,
 * test_tapdisk_durability.c) share: the fixture (a file blockstore with VDIs web1 and web2), the
 * driver opened and driven through the tapdisk test double, stores on a fault-injection backend
 * and calls to this process's control socket.
 */
#ifndef PLX_TAPDISK_FIXTURE_H
#define PLX_TAPDISK_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "parallax.h"
#include "tapdisk_double.h"

#define MiB (1ull << 20)
#define SEC 512u
#define WEB1_SIZE (16 * MiB)
#define WEB2_SIZE (8 * MiB)
#define WAIT_MS 20000

/* The fixture's folder, its blockstore (a file) and its PARALLAX_RUN_DIR. */
extern char dir[4096];
extern char store_path[4200];
extern char run_dir[4200];

/* Checked fixture: the blockstore with VDIs web1 (16 MiB) and web2 (8 MiB), no configured
 * blockstore or write cache, the tapdisk test double reset; teardown removes it all. */
void setup(void);
void teardown(void);

/* Open the driver on `params` (PATH:VDI or a bare VDI): 0 and the driver, or the open's error. */
int try_open(const char *params, td_flag_t flags, td_driver_t **out);
/* Open VDI `vdi` of the fixture's blockstore, asserting that it opens. */
td_driver_t *open_ok(const char *vdi, td_flag_t flags);
void close_ok(td_driver_t *drv);
/* The request tag of the i-th request of a test. */
void *tag_of(size_t i);
/* Submit one request and wait for it; asserts it completed exactly once; returns its status. */
int io_sync(td_driver_t *drv, int op, void *buf, td_sector_t sec, int secs);
/* Every recorded completion names a distinct request (no request completed twice). */
void assert_each_once(size_t expected);

/* Store openers for tdd_store_opener: a 16 MiB memory medium behind a fault backend (fault_be)
 * with the VDI "disk" (4 MiB); the store owns the fault backend, or with _kept does not (so that
 * crash images can be built from its log after the disk is closed). */
extern plx_backend *fault_be;
int open_on_fault(const char *path, const struct plx_open_opts *opts, plx_store **out, char *errbuf,
                  size_t errlen);
int open_on_fault_kept(const char *path, const struct plx_open_opts *opts, plx_store **out,
                       char *errbuf, size_t errlen);

/* One line to this process's control socket, tapdisk's loop run until the reply: the reply. */
void control_call(const char *line, char *reply, size_t len);
/* The id of VDI `name` in the fixture's blockstore. */
uint64_t vdi_id_of(const char *name);

#endif
