/*
 * backend_fail.c - how a backend's open reports that it failed: the errno for *err and the
 * message for errbuf, both optional (plx_backend_open, parallax_backend.h). Every backend's
 * open says it the same way, so it is one function, at the bottom of the backends' row.
 */
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"

plx_backend *plx_backend_open_fail(int *err, char *errbuf, size_t errlen, int e, const char *fmt,
                                   ...)
{
    if (err != NULL)
        *err = -e;
    if (errbuf != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return NULL;
}
