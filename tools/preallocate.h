/*
 * preallocate.h - `parallax format --preallocate`: write a store file's holes through with zeros.
 */
#ifndef PLX_TOOLS_PREALLOCATE_H
#define PLX_TOOLS_PREALLOCATE_H

#include <stddef.h>
#include <stdint.h>

/* Write zeros over every hole of the regular file at path (O_DIRECT where it can), then
 * fdatasync; what the file reads does not change. A progress line on a terminal. Returns 0
 * or a negative errno with a message in err; *written counts the bytes written either way. */
int preallocate_holes(const char *path, uint64_t *written, char *err, size_t errlen);

#endif
