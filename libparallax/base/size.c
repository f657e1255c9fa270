#include "size.h"

#include <stdio.h>
#include <string.h>

static unsigned suffix_shift(char c)
{
    switch (c) {
    case 'K':
    case 'k':
        return 10;
    case 'M':
    case 'm':
        return 20;
    case 'G':
    case 'g':
        return 30;
    case 'T':
    case 't':
        return 40;
    default:
        return 0;
    }
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int plx_size_parse(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;

    /* strtoull would accept spaces and a minus sign and wrap "-1" to 2^64-1. */
    if (!is_digit(*p))
        return -1;
    for (; is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    unsigned shift = 0;
    if (*p != '\0') {
        shift = suffix_shift(*p++);
        if (shift == 0 || (*p != '\0' && strcmp(p, "iB") != 0))
            return -1;
        if (v > (UINT64_MAX >> shift))
            return -1;
    }
    *out = v << shift;
    return 0;
}

void plx_size_format(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;

    while (u + 1 < sizeof units / sizeof units[0] && bytes >= (1ull << (10 * (u + 1))))
        u++;
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.1f %s", (double)bytes / (double)(1ull << (10 * u)), units[u]);
}
