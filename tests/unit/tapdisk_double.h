/*
 * tapdisk_double.h - a test double of the tapdisk functions a driver calls (declared in
 * tapdisk/tapdisk-iface.h): td_complete_request records each completion, the event functions
 * keep a table the test fires from, and tlog_syslog keeps the log lines. Single-threaded, like
 * tapdisk. Set TDD_VERBOSE=1 to echo the driver's log lines to stderr.
 */
#ifndef PLX_TAPDISK_DOUBLE_H
#define PLX_TAPDISK_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

#include "parallax.h"
#include "tapdisk-iface.h"

/* The driver under test (tapdisk/block-parallax.c). */
extern struct tap_disk tapdisk_parallax;

/* The test build of the driver is compiled with -Dplx_store_open=tdd_store_open (Makefile), so
 * the driver opens its stores through tdd_store_open: plx_store_open unless a test sets
 * tdd_store_opener, e.g. to give the driver a store on a fault-injection backend. The driver's
 * source carries no test hook, and tapdisk's copy of it calls plx_store_open directly. */
int tdd_store_open(const char *path, const struct plx_open_opts *opts, plx_store **out,
                   char *errbuf, size_t errlen);
extern int (*tdd_store_opener)(const char *path, const struct plx_open_opts *opts, plx_store **out,
                               char *errbuf, size_t errlen);

/* Forget all completions and log lines (registered events are kept: they belong to drivers
 * still open). */
void tdd_reset(void);

/* ---- Drivers and requests ------------------------------------------------------------------ */

/* A driver handle as tapdisk allocates it: zeroed private data of ops->private_data_size. */
td_driver_t *tdd_driver_new(const struct tap_disk *ops, const char *name);
void tdd_driver_free(td_driver_t *driver);
/* A request; `tag` (cb_data) identifies it in the completion record. */
td_request_t tdd_request(int op, void *buf, td_sector_t sec, int secs, void *tag);

/* ---- Completions ----------------------------------------------------------------------------- */

struct tdd_completion {
    td_request_t req;
    int status;
};

size_t tdd_completion_count(void);
const struct tdd_completion *tdd_completion_at(size_t i);
/* How many times the request tagged `tag` was completed, and (if any) the last status. */
unsigned tdd_completions_of(const void *tag, int *status);
/* Number of sectors completed for `tag` (sum of secs over its completions). */
uint64_t tdd_sectors_completed_of(const void *tag);

/* ---- Events ---------------------------------------------------------------------------------- */

/* Events currently registered. */
unsigned tdd_event_count(void);
/* Calls of tapdisk_server_event_set_timeout (arming or disarming a timeout event). */
unsigned tdd_timeout_sets(void);
/* Calls of tapdisk_server_unregister_event naming no registered event. */
unsigned tdd_bad_unregisters(void);
/* Wait up to timeout_ms for any registered read descriptor to become readable, then run the
 * callbacks of the ready ones (as tapdisk's scheduler does). Returns how many ran. */
int tdd_fire_ready(int timeout_ms);
/* Run every registered event's callback once, ready or not (a spurious wake-up). */
int tdd_fire_all(void);
/* Fire ready events until at least `n` completions are recorded; 0, or -ETIMEDOUT after
 * timeout_ms without reaching n. */
int tdd_run_until(size_t n, int timeout_ms);

/* ---- Log ------------------------------------------------------------------------------------- */

/* Number of log lines recorded since the last reset, and whether any contains `needle`. */
unsigned tdd_log_count(void);
int tdd_log_contains(const char *needle);
/* The last line recorded ("" when none). */
const char *tdd_log_last(void);

#endif
