/*
 * crc32c.c - CRC-32C (Castagnoli) and the self-validating block header built on it.
 *
 * Table-driven, byte at a time: metadata blocks are written rarely enough that a faster
 * slicing or SSE4.2 version would not show in any benchmark.
 */
#include <errno.h>
#include <string.h>
#include "format.h"

static uint32_t crc_table[256];
static int crc_table_ready;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
    crc_table_ready = 1;
}

uint32_t plx_crc32c(uint32_t seed, const void *data, size_t len)
{
    if (!crc_table_ready)
        crc_table_init();
    const uint8_t *p = data;
    uint32_t c = ~seed;
    while (len--)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

static uint32_t block_crc(const void *block)
{
    /* The checksum field is taken as zero without copying the block: checksum the bytes
     * before it, four zero bytes, and the rest. */
    static const uint8_t zero[4];
    const uint8_t *b = block;
    const struct plx_blkhdr *h = block;
    uint32_t c = plx_crc32c(h->magic, b, offsetof(struct plx_blkhdr, crc));
    c = plx_crc32c(c, zero, sizeof zero);
    size_t rest = offsetof(struct plx_blkhdr, crc) + sizeof zero;
    return plx_crc32c(c, b + rest, PLX_BLOCK_SIZE - rest);
}

void plx_blkhdr_seal(void *block, uint32_t magic, uint64_t self)
{
    struct plx_blkhdr *h = block;
    h->magic = magic;
    h->self = self;
    h->crc = block_crc(block);
}

int plx_blkhdr_verify(const void *block, uint32_t magic, uint64_t self, const char **why)
{
    const struct plx_blkhdr *h = block;
    static const char *dummy;
    if (!why)
        why = &dummy;
    if (h->magic != magic) {
        const uint64_t *w = block;
        for (size_t i = 0; i < PLX_BLOCK_SIZE / 8; i++)
            if (w[i])
                goto bad_magic;
        *why = "block is empty";
        return -ENODATA;
    bad_magic:
        *why = "wrong magic";
        return -EUCLEAN;
    }
    if (h->self != self) {
        *why = "block names another address (misdirected write)";
        return -EUCLEAN;
    }
    if (h->crc != block_crc(block)) {
        *why = "checksum mismatch";
        return -EUCLEAN;
    }
    return 0;
}
