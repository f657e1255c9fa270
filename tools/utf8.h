/*
 * utf8.h - just enough UTF-8 to keep names from breaking JSON and DOT output.
 */
#ifndef PLX_TOOLS_UTF8_H
#define PLX_TOOLS_UTF8_H

#include <stddef.h>

/* Length of the well-formed multi-byte UTF-8 sequence at p (2 to 4), or 0 when p does not start
 * one (ASCII bytes included). Stops at the first bad byte, so a NUL terminator is never passed. */
size_t utf8_seq_len(const char *p);
/* Terminal columns the string takes (wide characters 2, combining marks 0, bad bytes 1). */
size_t utf8_width(const char *s);

#endif
