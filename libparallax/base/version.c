/*
 * version.c - which API version this library is (parallax.h, PLX_API_VERSION).
 *
 * Compiled into the library, so a program can compare the version it was built against (the
 * macro) with the one it runs with (this function).
 */
#include "parallax.h"

unsigned plx_version(void)
{
    return PLX_API_VERSION;
}
