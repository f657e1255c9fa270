/*
 * timefmt.h - timestamps for humans.
 */
#ifndef PLX_TOOLS_TIMEFMT_H
#define PLX_TOOLS_TIMEFMT_H

#include <stddef.h>
#include <stdint.h>

/* ISO 8601 in UTC, to the second: "2026-11-22T04:30:00Z". Needs 21 bytes. */
#define TIMEFMT_LEN 32
void time_format_ns(uint64_t ns, char *buf, size_t len);

#endif
