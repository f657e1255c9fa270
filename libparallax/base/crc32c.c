/*
 * crc32c.c - CRC-32C (Castagnoli) and the self-validating block header built on it.
 *
 * The write cache checksums every data block it logs (wlog.c), on the engine thread, so the
 * checksum is on the write path: on x86-64 with SSE4.2 it runs on the CPU's crc32 instruction,
 * eight bytes at a time (measured: 1 MiB in some 0.1 ms, against 3 ms and more byte by byte
 * from a table, which capped the cache's burst at some 300 MiB/s), in three lanes at once from
 * 12 KiB up (crc_hw_run). Elsewhere the table, byte at
 * a time: metadata blocks alone are written rarely enough for it.
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

static uint32_t crc_table_run(uint32_t c, const uint8_t *p, size_t len)
{
    if (!crc_table_ready)
        crc_table_init();
    while (len--)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

/* a * b modulo the polynomial, both bit-reflected like the register (bit 31 is x^0). Some 32
 * steps: twice per 3 * LANE bytes in crc_hw_run, a few dozen times in plx_crc32c_reseed. */
static uint32_t gf2_mulmod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            p ^= b;
        b = (b & 1) ? (b >> 1) ^ 0x82f63b78u : b >> 1;
    }
    return p;
}

/* x^(8 * 2^k) modulo the polynomial (reflected), k = 0 ... 63: x^8, x^16, x^32, ... each the
 * square of the one before (gf2_mulmod; entry 12 is LANE_SHIFT). From a table, so that changing
 * the seed of a 4 KiB or 1 MiB record (one bit set in its length) costs a single
 * multiplication, less than checksumming the 4 KiB again. */
static const uint32_t x8pow2[64] = {
    0x00800000u, 0x00008000u, 0x82f63b78u, 0x6ea2d55cu, 0x18b8ea18u, 0x510ac59au, 0xb82be955u,
    0xb8fdb1e7u, 0x88e56f72u, 0x74c360a4u, 0xe4172b16u, 0x0d65762au, 0x35d73a62u, 0x28461564u,
    0xbf455269u, 0xe2ea32dcu, 0xfe7740e6u, 0xf946610bu, 0x3c204f8fu, 0x538586e3u, 0x59726915u,
    0x734d5309u, 0xbc1ac763u, 0x7d0722ccu, 0xd289cabeu, 0xe94ca9bcu, 0x05b74f3fu, 0xa51e1f42u,
    0x40000000u, 0x20000000u, 0x08000000u, 0x00800000u, 0x00008000u, 0x82f63b78u, 0x6ea2d55cu,
    0x18b8ea18u, 0x510ac59au, 0xb82be955u, 0xb8fdb1e7u, 0x88e56f72u, 0x74c360a4u, 0xe4172b16u,
    0x0d65762au, 0x35d73a62u, 0x28461564u, 0xbf455269u, 0xe2ea32dcu, 0xfe7740e6u, 0xf946610bu,
    0x3c204f8fu, 0x538586e3u, 0x59726915u, 0x734d5309u, 0xbc1ac763u, 0x7d0722ccu, 0xd289cabeu,
    0xe94ca9bcu, 0x05b74f3fu, 0xa51e1f42u, 0x40000000u, 0x20000000u, 0x08000000u, 0x00800000u,
    0x00008000u,
};

/* v * x^(8 * len) modulo the polynomial: one multiplication per bit set in len. */
static uint32_t shift8n(uint32_t v, uint64_t len)
{
    for (unsigned k = 0; len; len >>= 1, k++)
        if (len & 1)
            v = gf2_mulmod(x8pow2[k], v);
    return v;
}

/* The register after len bytes is linear in the seed and the data: run(c, D) = c * x^(8 len) xor
 * run(0, D). plx_crc32c inverts the seed on the way in and the register on the way out, and
 * the two inversions of ~s1 and ~s2 cancel in the difference, so plx_crc32c(s2, D) =
 * plx_crc32c(s1, D) xor (s1 xor s2) * x^(8 len): the checksum with another seed, without D. */
uint32_t plx_crc32c_reseed(uint32_t crc, uint32_t seed_old, uint32_t seed_new, uint64_t len)
{
    uint32_t d = seed_old ^ seed_new;
    return d ? crc ^ shift8n(d, len) : crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CRC_HW 1
/* The crc32 instruction computes CRC-32C (the same reflected polynomial, no inversions). */
/* Three lanes: one crc32 instruction takes three cycles before the next can use its result, but
 * the CPU starts one per cycle, so three independent running CRCs over three adjacent LANE-byte
 * pieces go about three times as fast as one; they are then joined. The register of a CRC is
 * linear in its input: the CRC of A||B from seed c is shift(CRC of A from c, |B|) xor the CRC
 * of B from 0, where shift multiplies by x^(8|B|) modulo the polynomial. */
#define LANE 4096u
/* x^(8 * LANE) modulo the CRC-32C polynomial, bit-reflected like the register (bit 31 is x^0):
 * x^0 multiplied by x 32768 times. test_engine's test_crc32c checks the lanes against the
 * table. */
#define LANE_SHIFT 0x35d73a62u

__attribute__((target("sse4.2"))) static uint32_t crc_hw_run(uint32_t c, const uint8_t *p,
                                                             size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi(c, *p++);
        len--;
    }
    uint64_t c64 = c;
    for (; len >= 3 * LANE; p += 3 * LANE, len -= 3 * LANE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < LANE; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + LANE + i, 8);
            memcpy(&w2, p + 2 * LANE + i, 8);
            c64 = __builtin_ia32_crc32di(c64, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
        }
        uint32_t ab = gf2_mulmod(LANE_SHIFT, (uint32_t)c64) ^ (uint32_t)c1;
        c64 = gf2_mulmod(LANE_SHIFT, ab) ^ (uint32_t)c2;
    }
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
    }
    c = (uint32_t)c64;
    while (len--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t plx_crc32c(uint32_t seed, const void *data, size_t len)
{
#ifdef CRC_HW
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_hw_run(~seed, data, len);
#endif
    return ~crc_table_run(~seed, data, len);
}

/* The table form whatever the CPU (tests compare the two). */
uint32_t plx_crc32c_table(uint32_t seed, const void *data, size_t len)
{
    return ~crc_table_run(~seed, data, len);
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
