#include "timefmt.h"

#include <stdio.h>
#include <time.h>

void time_format_ns(uint64_t ns, char *buf, size_t len)
{
    time_t secs = (time_t)(ns / 1000000000ull);
    struct tm tm;

    if (gmtime_r(&secs, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "?");
}
