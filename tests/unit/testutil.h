/*
 * testutil.h - helpers shared by the Check unit tests.
 */
#ifndef PLX_TESTUTIL_H
#define PLX_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <check.h>

#include "backend.h"

/* Every test a suite adds passes through here (check.h's tcase_add_*test macros all end in
 * _tcase_add_test), so that tu_run_suite knows how many tests the binary holds. */
void tu_tcase_add(TCase *tc, const TTest *ttest, int sig, int allowed_exit, int start, int end);
#define _tcase_add_test(tc, ttest, sig, allowed_exit, start, end)                                  \
    tu_tcase_add((tc), (ttest), (sig), (allowed_exit), (start), (end))

/* Run a suite (CK_ENV verbosity, so CK_VERBOSITY/CK_RUN_CASE work) and return the exit status
 * for main: EXIT_SUCCESS when every test passed. Frees the suite. Unless a CK_RUN_* or CK_*_TAGS
 * variable picks tests, a run with fewer results than the tests added fails: a lost result must
 * not pass as a shorter run. */
int tu_run_suite(Suite *s);
/* main() for a test file whose suite is built by `fn` (Suite *fn(void)). */
#define TU_MAIN(fn)                                                                                \
    int main(void)                                                                                 \
    {                                                                                              \
        return tu_run_suite(fn());                                                                 \
    }

/* Deterministic PRNG (splitmix64): same state, same sequence, on every platform. */
uint64_t tu_rand(uint64_t *state);
/* Fill len bytes with the sequence for seed, so that contents can be regenerated to compare. */
void tu_fill(void *buf, size_t len, uint64_t seed);
/* Nonzero when PLX_TEST_QUICK is set (and not "0"): shrink long loops (sanitizer runs). */
int tu_quick(void);
/* $TMPDIR, or /tmp. */
const char *tu_tmpdir(void);

/* Poll be until *done is nonzero; fails the test if the backend reports an error or runs out
 * of I/O while *done is still zero. */
void tu_wait_io(plx_backend *be, int *done);
/* Submit one I/O and wait for it; returns the submit error or the completion status. */
int tu_io(plx_backend *be, enum plx_io_op op, uint64_t block, uint32_t nblocks, void *buf,
          unsigned flags);

/* A backend that forwards everything (the admin lock included) to a medium it does not own:
 * plx_store_open_backend destroys its backend on close, and opening through this wrapper keeps
 * the medium, so a test can close a store and open it again on the same bytes. */
plx_backend *tu_keep_wrap(plx_backend *inner);
/* Flushes, reads (requests and blocks) and writes submitted through every tu_keep_wrap backend
 * so far: what reaches the medium, for tests of placement and request merging. */
extern unsigned long tu_flushes, tu_reads, tu_read_blocks, tu_writes;
/* For a test case whose tests count those: the stores its tests open run no reclaim poll
 * (PARALLAX_RECLAIM_POLL_MS=0, an unchecked fixture of tc). The poll reads the catalogue from the
 * service loop every second (reclaim.c), so a poll that fell inside a counted read was counted
 * with it: test_read_merge_depth_history failed that way under load (77 reads for 76), and
 * always with a poll every millisecond. None of these tests is about reclaim. */
void tu_no_reclaim_poll(TCase *tc);

/* Holding a write back (tests of request ordering), through tu_keep_wrap backends: after
 * tu_hold_next_write() the next write submitted is not passed to the medium but kept until
 * tu_release_held(), so it stays in flight for as long as the test likes. */
void tu_hold_next_write(void);
/* Writes held now. */
unsigned tu_held(void);
/* Pass the held writes to the medium (they complete from a later poll). */
void tu_release_held(void);
/* Was a write whose data starts at buf submitted (held or not) since tu_hold_next_write()? */
int tu_write_seen(const void *buf);

/* Rewrite the version-2 store on `be` (no process may have it open) in format version 1's
 * layout: every VDI record copied, in id order, into the fixed registry slots of extent 0, the
 * state block and superblock of version 1. What `parallax upgrade` converts back. */
void tu_make_v1(plx_backend *be);

/* A TCP port on the loopback that nobody listens on now. */
int tu_free_port(void);
/* parallax-lockd (built beside the test binary's folder: build/parallax-lockd for build/unit and
 * build/unit-san) started with --listen 127.0.0.1:port --lease lease, its stderr to /dev/null;
 * returns its pid once it accepts connections (the test fails if it never does). */
pid_t tu_lockd_start(int port, const char *lease);

#endif
