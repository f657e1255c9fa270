/*
 * clock.h - the engine's two clocks, at the bottom of the layers so that every part, backends
 * included, reads time one way.
 */
#ifndef PLX_CLOCK_H
#define PLX_CLOCK_H
#include <stdint.h>

/* Wall-clock time (CLOCK_REALTIME) in ns: for what is written down (timestamps in records). */
uint64_t plx_now_ns(void);
/* A monotonic clock (CLOCK_MONOTONIC) in ns: for intervals, deadlines and leases. */
uint64_t plx_mono_ns(void);

#endif
