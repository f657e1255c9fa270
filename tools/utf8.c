#include "utf8.h"

#include <locale.h>
#include <wchar.h>

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

size_t utf8_width(const char *s)
{
    /* wcwidth follows LC_CTYPE: ask a UTF-8 one for this thread, whatever the user's is. */
    static locale_t utf8;
    if (!utf8)
        utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    locale_t old = utf8 ? uselocale(utf8) : (locale_t)0;
    size_t cols = 0;
    while (*s) {
        const unsigned char *p = (const unsigned char *)s;
        size_t n = utf8_seq_len(s);
        if (n == 0) {
            cols++; /* ASCII, or a stray byte the terminal shows as one cell */
            s++;
            continue;
        }
        unsigned cp = p[0] & (0x7Fu >> n);
        for (size_t i = 1; i < n; i++)
            cp = (cp << 6) | (p[i] & 0x3Fu);
        int w = utf8 ? wcwidth((wchar_t)cp) : 1;
        cols += w < 0 ? 1 : (size_t)w;
        s += n;
    }
    if (utf8)
        uselocale(old);
    return cols;
}
