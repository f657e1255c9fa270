/*
 * tgtd.h - a real iSCSI target for unit tests: tgtd on loopback, started by the test on free
 * ports and killed by pid (tests/integration/lib.sh has the same for scripts).
 *
 * Start it in main() before the suite runs: Check forks each test, and the children use the
 * parent's tgtd through its control port.
 */
#ifndef PLX_TEST_TGTD_H
#define PLX_TEST_TGTD_H

#include <stddef.h>
#include <stdint.h>

/* Start tgtd with one target (tid 1, no LUNs yet). Returns 0, or -1 with the reason in why
 * (not root, tgtd not installed, would not start). Stopped at exit. */
int tu_tgtd_start(char *why, size_t whylen);
/* Nonzero once tu_tgtd_start succeeded. */
int tu_tgtd_running(void);
/* Run `tgtadm -C CTL --lld iscsi ARGS` (ARGS formatted); returns its exit status. */
int tu_tgtd_adm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A new LUN of `bytes` (a sparse file in a temp dir) with logical blocks of lba_size bytes;
 * its URL goes to url. The LUN number is picked free from 1..255. Returns the LUN or -1. */
int tu_tgtd_new_lun(uint64_t bytes, unsigned lba_size, char *url, size_t urllen);
/* The portal's TCP port and the target's IQN. */
int tu_tgtd_port(void);
/* The control port (tgtadm -C). */
int tu_tgtd_ctl(void);
const char *tu_tgtd_iqn(void);

#endif
