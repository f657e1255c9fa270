#include "utf8.h"

size_t utf8_seq_len(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char lo = 0x80, hi = 0xBF;
    size_t n;

    /* Overlong forms, surrogates and code points past U+10FFFF are rejected through the range
     * allowed for the second byte (RFC 3629, section 4). */
    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        n = 2;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        n = 3;
        lo = p[0] == 0xE0 ? 0xA0 : lo;
        hi = p[0] == 0xED ? 0x9F : hi;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        n = 4;
        lo = p[0] == 0xF0 ? 0x90 : lo;
        hi = p[0] == 0xF4 ? 0x8F : hi;
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}
