/*
 * size.h - byte sizes as people type and read them: the command line, /etc/parallax/write-cache
 * (wcache_config.c) and the benchmark programs parse them here.
 */
#ifndef PLX_SIZE_H
#define PLX_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* Parse a decimal byte count with an optional K, M, G or T suffix (powers of 1024, either case,
 * optionally followed by "iB" so that what plx_size_format prints can be typed back). No sign, no
 * spaces, no fractions. Returns 0, or -1 for garbage or a value beyond 64 bits. */
int plx_size_parse(const char *s, uint64_t *out);

/* Render for humans, e.g. "4.0 GiB" or "512 B". Exact counts belong in JSON output. */
void plx_size_format(uint64_t bytes, char *buf, size_t len);

#endif
