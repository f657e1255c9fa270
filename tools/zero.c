#include "zero.h"

#include <string.h>

#include "parallax.h"

int is_zero(const unsigned char *p, size_t len)
{
    /* Comparing the buffer with itself shifted by one byte lets memcmp do the scanning. */
    return len == 0 || (p[0] == 0 && memcmp(p, p + 1, len - 1) == 0);
}

size_t zero_run(const unsigned char *p, size_t len, int zero)
{
    size_t n = 0;

    while (n < len) {
        size_t blk = len - n < PLX_BLOCK_SIZE ? len - n : PLX_BLOCK_SIZE;
        if (!is_zero(p + n, blk) != !zero)
            break;
        n += blk;
    }
    return n;
}
