/*
 * test_engine.c - the engine's behaviour through the public API (parallax.h), on memory media:
 * formatting and opening, VDI administration, snapshots and clones, byte-granular I/O, trim,
 * block status, the asynchronous interface and persistence across a reopen.
 */
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "backend_fault.h"
#include "engine.h" /* plx_defer_turn */
#include "format.h"
#include "parallax.h"
#include "read_plan.h" /* plx_read_plan_make */
#include "size.h"      /* plx_size_parse */
#include "snaplog.h"   /* PLX_LABELS_FOLD_TAIL */
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

/* ---- Fixtures ----------------------------------------------------------------------------------
 */

/* A memory medium of `bytes`, formatted with 1 MiB extents. */
static plx_backend *new_medium(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, MiB, err, sizeof(err));
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

/* Open a store on `mem` without giving it away. */
static plx_store *open_kept(plx_backend *mem)
{
    char err[256] = "";
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    ck_assert_ptr_nonnull(st);
    return st;
}

/* The same with data placed by leaf (plx_open_opts.placement). */
static plx_store *open_kept_by_leaf(plx_backend *mem)
{
    char err[256] = "";
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o, .placement = PLX_PLACEMENT_LEAF};
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

/* Open a store on a medium, returning the error (the medium is kept). */
static int try_open(plx_backend *mem, char *err, size_t errlen)
{
    plx_store *st = NULL;
    err[0] = '\0';
    int rc = plx_store_open_backend(tu_keep_wrap(mem), NULL, &st, err, errlen);
    if (rc == 0) {
        ck_assert_ptr_nonnull(st);
        ck_assert_int_eq(plx_store_close(st), 0);
    } else {
        ck_assert_ptr_null(st);
    }
    return rc;
}

static void check_line(void *arg, int is_error, const char *line)
{
    int *shown = arg;
    if (is_error && (*shown)++ < 10)
        fprintf(stderr, "engine: check: %s\n", line);
}

/* plx_check must find nothing wrong. */
static void check_clean(plx_store *st, const char *what)
{
    struct plx_check_report rep;
    int shown = 0;
    int rc = plx_check(st, &rep, check_line, &shown);
    ck_assert_msg(rc == 0, "%s: plx_check could not run: %d (%s)", what, rc, plx_store_errmsg(st));
    ck_assert_msg(rep.errors == 0, "%s: plx_check found %llu errors (see stderr)", what,
                  (unsigned long long)rep.errors);
    ck_assert_uint_gt(rep.trees, 0);
}

static void close_ok(plx_store *st)
{
    int rc = plx_store_close(st);
    ck_assert_msg(rc == 0, "close: %d", rc);
}

#define EXPECT_ERR(st, call, want)                                                                 \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == (want), "%s: got %d (%s), want %d", #call, rc_, plx_store_errmsg(st), \
                      (want));                                                                     \
        ck_assert_msg(plx_store_errmsg(st)[0] != '\0', "%s: no error message", #call);             \
    } while (0)

#define OK(st, call)                                                                               \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ >= 0, "%s: %d (%s)", #call, rc_, plx_store_errmsg(st));                  \
    } while (0)

static plx_vdi *open_vdi(plx_store *st, const char *spec, unsigned flags)
{
    plx_vdi *v = NULL;
    int rc = plx_vdi_open(st, spec, flags, &v);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", spec, rc, plx_store_errmsg(st));
    ck_assert_ptr_nonnull(v);
    return v;
}

static void close_vdi(plx_store *st, plx_vdi *v)
{
    int rc = plx_vdi_close(v);
    ck_assert_msg(rc == 0, "vdi close: %d (%s)", rc, plx_store_errmsg(st));
}

static uint64_t create_vdi(plx_store *st, const char *name, uint64_t size)
{
    uint64_t id = 0;
    int rc = plx_vdi_create(st, name, size, &id);
    ck_assert_msg(rc == 0, "create %s: %d (%s)", name, rc, plx_store_errmsg(st));
    ck_assert_uint_ne(id, 0);
    return id;
}

static void pwrite_ok(plx_store *st, plx_vdi *v, const void *buf, uint64_t off, size_t len)
{
    int rc = plx_vdi_pwrite(v, buf, off, len, 0);
    ck_assert_msg(rc == 0, "write %llu+%zu: %d (%s)", (unsigned long long)off, len, rc,
                  plx_store_errmsg(st));
}

static void pread_ok(plx_store *st, plx_vdi *v, void *buf, uint64_t off, size_t len)
{
    int rc = plx_vdi_pread(v, buf, off, len);
    ck_assert_msg(rc == 0, "read %llu+%zu: %d (%s)", (unsigned long long)off, len, rc,
                  plx_store_errmsg(st));
}

/* Read [off, off+len) and compare with want; names the first differing byte. */
static void expect_bytes(plx_store *st, plx_vdi *v, const unsigned char *want, uint64_t off,
                         size_t len, const char *what)
{
    unsigned char *got = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(got);
    memset(got, 0xa5, len);
    pread_ok(st, v, got, off, len);
    /* One assertion, not one per byte: every passing Check assertion costs a write. */
    size_t i = 0;
    int differ = memcmp(got, want, len) != 0;
    if (differ)
        while (got[i] == want[i])
            i++;
    ck_assert_msg(!differ, "%s: byte %llu is 0x%02x, want 0x%02x", what,
                  (unsigned long long)(off + i), got[i], want[i]);
    free(got);
}

static void expect_zero(plx_store *st, plx_vdi *v, uint64_t off, size_t len, const char *what)
{
    unsigned char *got = malloc(len);
    ck_assert_ptr_nonnull(got);
    memset(got, 0xa5, len);
    pread_ok(st, v, got, off, len);
    size_t i = 0;
    while (i < len && got[i] == 0)
        i++;
    ck_assert_msg(i == len, "%s: byte %llu is 0x%02x, want 0", what, (unsigned long long)(off + i),
                  i < len ? got[i] : 0);
    free(got);
}

/* A block-sized pattern for block `blk` of generation `gen`. */
static void pattern(unsigned char *buf, size_t len, uint64_t gen, uint64_t blk)
{
    tu_fill(buf, len, gen * 1000003ull + blk);
}

/* ---- Format, open, info -----------------------------------------------------------------------
 */

START_TEST(test_format_open_info)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    struct plx_store_info in;
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_eq(in.format_version, PLX_FORMAT_VERSION);
    ck_assert_uint_eq(in.extent_size, MiB);
    ck_assert_uint_eq(in.extent_count, 16);
    ck_assert_uint_eq(in.block_count, 16 * MiB / BS);
    ck_assert_uint_eq(in.size_bytes, 16 * MiB);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_SYSTEM], 1);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_UNUSED], 15);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_METADATA], 0);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_DATA], 0);
    ck_assert_uint_eq(in.vdi_count, 0);
    ck_assert_uint_eq(in.vdi_slots, 0); /* version 2: no fixed number of VDIs */
    ck_assert_str_eq(in.lockd_addr, "");
    for (int t = 0; t < 4; t++)
        ck_assert_uint_eq(in.blocks_used_by_type[t] + in.blocks_free_by_type[t],
                          in.extents_by_type[t] * (MiB / BS));

    /* A VDI takes a metadata extent (its root); data takes a data extent. */
    create_vdi(st, "disk", 4 * MiB);
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_eq(in.vdi_count, 1);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_METADATA], 1);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_DATA], 0);
    plx_vdi *v = open_vdi(st, "disk", 0);
    unsigned char *buf = malloc(MiB);
    pattern(buf, MiB, 1, 0);
    pwrite_ok(st, v, buf, 0, 512 * KiB);
    close_vdi(st, v);
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_ge(in.extents_by_type[PLX_EXTENT_DATA], 1);
    ck_assert_uint_ge(in.blocks_used_by_type[PLX_EXTENT_DATA], 128);
    for (int t = 0; t < 4; t++)
        ck_assert_uint_eq(in.blocks_used_by_type[t] + in.blocks_free_by_type[t],
                          in.extents_by_type[t] * (MiB / BS));
    ck_assert_uint_eq(in.extents_by_type[0] + in.extents_by_type[1] + in.extents_by_type[2] +
                          in.extents_by_type[3],
                      16);
    create_vdi(st, "disk2", MiB);
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_eq(in.vdi_count, 2);
    close_ok(st);

    /* Round trip: the same counts after reopening. */
    st = open_kept(mem);
    struct plx_store_info again;
    OK(st, plx_store_info(st, &again));
    ck_assert_uint_eq(again.vdi_count, 2);
    ck_assert_uint_eq(again.extent_count, 16);
    ck_assert_uint_eq(again.extents_by_type[PLX_EXTENT_DATA], in.extents_by_type[PLX_EXTENT_DATA]);
    v = open_vdi(st, "disk", PLX_OPEN_READONLY);
    expect_bytes(st, v, buf, 0, 512 * KiB, "after reopen");
    close_vdi(st, v);
    close_ok(st);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_format_refuses)
{
    char err[256] = "";
    /* Fewer than three extents. */
    plx_backend *mem = plx_backend_mem_create(2 * MiB / BS);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof(err)), -EINVAL);
    ck_assert_str_ne(err, "");
    mem->ops->destroy(mem);
    /* Extent size not a power of two, or below 1 MiB. */
    mem = plx_backend_mem_create(16 * MiB / BS);
    err[0] = '\0';
    ck_assert_int_eq(plx_format_backend(mem, 3 * MiB, err, sizeof(err)), -EINVAL);
    ck_assert_str_ne(err, "");
    ck_assert_int_eq(plx_format_backend(mem, 512 * KiB, err, sizeof(err)), -EINVAL);
    /* Nothing was written: the medium is not a store. */
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EUCLEAN);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_open_bad_magic)
{
    plx_backend *mem = new_medium(8 * MiB);
    unsigned char *junk = malloc(BS);
    tu_fill(junk, BS, 77);
    plx_backend_mem_poke(mem, 0, junk);
    char err[256];
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EUCLEAN);
    ck_assert_msg(strstr(err, "magic") != NULL || strstr(err, "not a Parallax") != NULL,
                  "message does not name the problem: '%s'", err);

    /* An all-zero medium is not a store either. */
    plx_backend_mem_poke(mem, 0, NULL);
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EUCLEAN);
    ck_assert_str_ne(err, "");
    free(junk);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_open_bad_checksum)
{
    plx_backend *mem = new_medium(8 * MiB);
    unsigned char *sb = malloc(BS);
    memcpy(sb, plx_backend_mem_peek(mem, 0), BS);
    sb[200] ^= 0x40; /* past the header: only the checksum can tell */
    plx_backend_mem_poke(mem, 0, sb);
    char err[256];
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EUCLEAN);
    ck_assert_msg(strstr(err, "checksum") != NULL, "message: '%s'", err);
    free(sb);
    mem->ops->destroy(mem);
}
END_TEST

/* Sizes as the command line, /etc/parallax/write-cache and the benchmarks take them: one parser. */
START_TEST(test_size_parse)
{
    static const struct {
        const char *s;
        int ok;
        uint64_t v;
    } cases[] = {
        {"0", 1, 0},
        {"4096", 1, 4096},
        {"8M", 1, 8ull << 20},
        {"8m", 1, 8ull << 20},
        {"2GiB", 1, 2ull << 30},
        {"1t", 1, 1ull << 40},
        {"16777215T", 1, 16777215ull << 40},
        {"16777216T", 0, 0}, /* 2^64: beyond 64 bits */
        {"18446744073709551615", 1, UINT64_MAX},
        {"18446744073709551616", 0, 0},
        {"", 0, 0},
        {"-1", 0, 0},
        {" 1", 0, 0},
        {"1.5G", 0, 0},
        {"8X", 0, 0},
        {"8MB", 0, 0},
        {"8Mi", 0, 0},
        {"lots", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        int rc = plx_size_parse(cases[i].s, &v);
        ck_assert_msg(cases[i].ok ? rc == 0 && v == cases[i].v : rc < 0 && v == 12345,
                      "\"%s\": rc %d value %llu", cases[i].s, rc, (unsigned long long)v);
    }
    char buf[32];
    plx_size_format(512, buf, sizeof buf);
    ck_assert_str_eq(buf, "512 B");
    plx_size_format(3ull << 29, buf, sizeof buf);
    ck_assert_str_eq(buf, "1.5 GiB");
}
END_TEST

/* CRC-32C: the check value of "123456789", and the hardware form (crc32 instruction, where the
 * CPU has it) against the table on every length up to a few blocks, at every alignment and with
 * any seed: a difference would make every checksum written before an upgrade look corrupt. */
START_TEST(test_crc32c)
{
    ck_assert_uint_eq(plx_crc32c(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(plx_crc32c_table(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(plx_crc32c(0, "", 0), 0);
    enum { N = 3 * 4096 + 64 };
    uint8_t *buf = malloc(N);
    uint64_t rng = 11;
    tu_fill(buf, N, 5);
    for (int i = 0; i < 3000; i++) {
        size_t off = (size_t)(tu_rand(&rng) % 8);
        size_t len = i < 300 ? (size_t)i : (size_t)(tu_rand(&rng) % (N - 8));
        uint32_t seed = (uint32_t)tu_rand(&rng);
        ck_assert_msg(plx_crc32c(seed, buf + off, len) == plx_crc32c_table(seed, buf + off, len),
                      "length %zu at offset %zu, seed %08x", len, off, seed);
    }
    free(buf);
    /* Long runs (a write log's 1 MiB records) go through the three-lane loop many times. */
    enum { BIG = (1 << 20) + 64 };
    buf = malloc(BIG);
    tu_fill(buf, BIG, 6);
    for (int i = 0; i < 20; i++) {
        size_t off = (size_t)(tu_rand(&rng) % 8);
        size_t len = i == 0 ? (size_t)1 << 20 : (size_t)(tu_rand(&rng) % (BIG - 8));
        uint32_t seed = (uint32_t)tu_rand(&rng);
        ck_assert_msg(plx_crc32c(seed, buf + off, len) == plx_crc32c_table(seed, buf + off, len),
                      "length %zu at offset %zu, seed %08x", len, off, seed);
    }
    free(buf);
}
END_TEST

/* plx_crc32c_reseed against checksumming the data again with the new seed: the write cache
 * checksums a record with seed 0 when it arrives and stores the checksum with the batch's seq,
 * which replay and the drain check with plx_crc32c. Every length from 0 to a few hundred bytes
 * (each bit of the length picks a power of x), random longer ones up to 1 MiB, random seeds. */
START_TEST(test_crc32c_reseed)
{
    enum { BIG = (1 << 20) + 8 };
    uint8_t *buf = malloc(BIG);
    tu_fill(buf, BIG, 7);
    uint64_t rng = 13;
    for (int i = 0; i < 1000; i++) {
        size_t off = (size_t)(tu_rand(&rng) % 8);
        size_t len = i < 600   ? (size_t)i
                     : i < 610 ? (size_t)(4096u << (i - 600)) % (BIG - 7)
                               : (size_t)(tu_rand(&rng) % (BIG - 8));
        uint32_t s1 = i % 3 == 0 ? 0 : (uint32_t)tu_rand(&rng);
        uint32_t s2 = (uint32_t)tu_rand(&rng);
        uint32_t c1 = plx_crc32c(s1, buf + off, len), c2 = plx_crc32c(s2, buf + off, len);
        ck_assert_msg(plx_crc32c_reseed(c1, s1, s2, len) == c2,
                      "length %zu, seed %08x to %08x: %08x, want %08x", len, s1, s2,
                      plx_crc32c_reseed(c1, s1, s2, len), c2);
        ck_assert_uint_eq(plx_crc32c_reseed(c2, s2, s1, len), c1);
        ck_assert_uint_eq(plx_crc32c_reseed(c1, s1, s1, len), c1);
    }
    free(buf);
}
END_TEST

START_TEST(test_open_wrong_version)
{
    plx_backend *mem = new_medium(8 * MiB);
    unsigned char *buf = malloc(BS);
    memcpy(buf, plx_backend_mem_peek(mem, 0), BS);
    struct plx_superblock sb;
    memcpy(&sb, buf, sizeof(sb));
    ck_assert_uint_eq(sb.version, PLX_FORMAT_VERSION);
    sb.version = PLX_FORMAT_VERSION + 1;
    memcpy(buf, &sb, sizeof(sb));
    plx_blkhdr_seal(buf, PLX_MAGIC_SUPER, 0);
    plx_backend_mem_poke(mem, 0, buf);
    char err[256];
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EPROTONOSUPPORT);
    ck_assert_msg(strstr(err, "version") != NULL, "message: '%s'", err);

    /* An unknown incompatible feature is refused the same way. */
    sb.version = PLX_FORMAT_VERSION;
    sb.incompat_features = 1ull << 40;
    memcpy(buf, &sb, sizeof(sb));
    plx_blkhdr_seal(buf, PLX_MAGIC_SUPER, 0);
    plx_backend_mem_poke(mem, 0, buf);
    ck_assert_int_eq(try_open(mem, err, sizeof(err)), -EPROTONOSUPPORT);
    ck_assert_str_ne(err, "");
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_open_truncated)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_backend *small = plx_backend_mem_create(8 * MiB / BS);
    for (uint64_t b = 0; b < small->nblocks; b++) {
        const void *p = plx_backend_mem_peek(mem, b);
        if (p != NULL)
            plx_backend_mem_poke(small, b, p);
    }
    char err[256];
    ck_assert_int_eq(try_open(small, err, sizeof(err)), -EUCLEAN);
    ck_assert_msg(strstr(err, "truncated") != NULL, "message: '%s'", err);
    small->ops->destroy(small);
    mem->ops->destroy(mem);
}
END_TEST

/* ---- VDI administration -----------------------------------------------------------------------
 */

START_TEST(test_vdi_create_rules)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    uint64_t id1 = create_vdi(st, "alpha", 1 * GiB);
    EXPECT_ERR(st, plx_vdi_create(st, "alpha", GiB, NULL), -EEXIST);
    EXPECT_ERR(st, plx_vdi_create(st, "", GiB, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "a@b", GiB, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "123", GiB, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "a b", GiB, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "a/b", GiB, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "tab\there", GiB, NULL), -EINVAL);
    char name[300];
    memset(name, 'n', 256);
    name[256] = '\0';
    EXPECT_ERR(st, plx_vdi_create(st, name, GiB, NULL), -EINVAL);
    name[255] = '\0'; /* 255 bytes: the longest allowed */
    uint64_t idlong = create_vdi(st, name, MiB);
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, name, &vi));
    ck_assert_uint_eq(vi.id, idlong);
    ck_assert_str_eq(vi.name, name);

    EXPECT_ERR(st, plx_vdi_create(st, "zero", 0, NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_create(st, "huge", PLX_MAX_VDI_SIZE + 1, NULL), -EFBIG);
    EXPECT_ERR(st, plx_vdi_create(st, "huger", UINT64_MAX, NULL), -EFBIG);
    /* Failed creations took no id and no name. */
    EXPECT_ERR(st, plx_vdi_lookup(st, "zero", &vi), -ENOENT);
    EXPECT_ERR(st, plx_vdi_lookup(st, "huge", &vi), -ENOENT);

    OK(st, plx_vdi_lookup(st, "alpha", &vi));
    ck_assert_uint_eq(vi.id, id1);
    ck_assert_uint_eq(vi.size, GiB);
    ck_assert_uint_eq(vi.height, 3);
    ck_assert_uint_eq(vi.snap_count, 0);
    ck_assert_uint_eq(vi.parent_id, 0);
    ck_assert_int_eq(vi.deleted, 0);
    ck_assert_str_eq(vi.lock_holder, "");
    ck_assert_uint_ne(vi.root, 0);
    ck_assert_uint_gt(vi.created_ns, 0);

    uint64_t id600 = create_vdi(st, "big", 600 * GiB);
    OK(st, plx_vdi_lookup(st, "big", &vi));
    ck_assert_uint_eq(vi.id, id600);
    ck_assert_uint_eq(vi.size, 600 * GiB);
    ck_assert_uint_eq(vi.height, 4);
    /* The three-level limit is exactly 512 GiB. */
    create_vdi(st, "edge3", 512 * GiB);
    OK(st, plx_vdi_lookup(st, "edge3", &vi));
    ck_assert_uint_eq(vi.height, 3);
    create_vdi(st, "edge4", 512 * GiB + BS);
    OK(st, plx_vdi_lookup(st, "edge4", &vi));
    ck_assert_uint_eq(vi.height, 4);
    create_vdi(st, "max", PLX_MAX_VDI_SIZE);
    OK(st, plx_vdi_lookup(st, "max", &vi));
    ck_assert_uint_eq(vi.height, 4);
    ck_assert_uint_eq(vi.size, PLX_MAX_VDI_SIZE);
    /* Sizes are rounded up to whole blocks. */
    create_vdi(st, "odd", 10000);
    OK(st, plx_vdi_lookup(st, "odd", &vi));
    ck_assert_uint_eq(vi.size, 3 * BS);

    /* Ids are distinct and lookups by decimal id work. */
    char idstr[32];
    snprintf(idstr, sizeof(idstr), "%llu", (unsigned long long)id600);
    OK(st, plx_vdi_lookup(st, idstr, &vi));
    ck_assert_str_eq(vi.name, "big");
    ck_assert_uint_ne(id1, id600);
    EXPECT_ERR(st, plx_vdi_lookup(st, "nosuch", &vi), -ENOENT);
    EXPECT_ERR(st, plx_vdi_lookup(st, "999999", &vi), -ENOENT);

    struct plx_vdi_info *list = NULL;
    size_t n = 0;
    OK(st, plx_vdi_list(st, &list, &n));
    ck_assert_uint_eq(n, 7);
    free(list);
    struct plx_store_info in;
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_eq(in.vdi_count, 7);

    /* A VDI of the largest size can be written at its very end and read back. */
    plx_vdi *v = open_vdi(st, "max", 0);
    ck_assert_uint_eq(plx_vdi_size(v), PLX_MAX_VDI_SIZE);
    unsigned char b[BS], r[BS];
    pattern(b, BS, 9, 9);
    pwrite_ok(st, v, b, PLX_MAX_VDI_SIZE - BS, BS);
    pread_ok(st, v, r, PLX_MAX_VDI_SIZE - BS, BS);
    ck_assert_mem_eq(r, b, BS);
    expect_zero(st, v, PLX_MAX_VDI_SIZE - 2 * BS, BS, "block before the last");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_snapshot_names)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    uint64_t id = create_vdi(st, "vm", 8 * MiB);
    uint64_t idx = 0;
    OK(st, plx_vdi_snapshot(st, "vm", NULL, &idx));
    ck_assert_uint_eq(idx, 1);
    OK(st, plx_vdi_snapshot(st, "vm", "gold", &idx));
    ck_assert_uint_eq(idx, 2);
    EXPECT_ERR(st, plx_vdi_snapshot(st, "vm", "gold", &idx), -EEXIST);
    EXPECT_ERR(st, plx_vdi_snapshot(st, "vm", "12", &idx), -EINVAL);
    EXPECT_ERR(st, plx_vdi_snapshot(st, "vm", "a@b", &idx), -EINVAL);
    char longlabel[PLX_LABEL_MAX + 2];
    memset(longlabel, 'l', PLX_LABEL_MAX + 1);
    longlabel[PLX_LABEL_MAX + 1] = '\0';
    EXPECT_ERR(st, plx_vdi_snapshot(st, "vm", longlabel, &idx), -EINVAL);
    longlabel[PLX_LABEL_MAX] = '\0';
    OK(st, plx_vdi_snapshot(st, "vm", longlabel, &idx));
    ck_assert_uint_eq(idx, 3);
    EXPECT_ERR(st, plx_vdi_snapshot(st, "nosuch", NULL, &idx), -ENOENT);

    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "vm", &vi));
    ck_assert_uint_eq(vi.snap_count, 3);

    struct plx_snap_info s1, s2, s3, sg;
    OK(st, plx_snap_lookup(st, "vm@1", &s1));
    OK(st, plx_snap_lookup(st, "vm@2", &s2));
    OK(st, plx_snap_lookup(st, "vm@gold", &sg));
    char spec[PLX_LABEL_MAX + 8];
    snprintf(spec, sizeof(spec), "vm@%s", longlabel);
    OK(st, plx_snap_lookup(st, spec, &s3));
    ck_assert_uint_eq(s3.index, 3);
    ck_assert_uint_eq(s1.index, 1);
    ck_assert_uint_eq(s1.vdi_id, id);
    ck_assert_str_eq(s1.label, "");
    ck_assert_uint_eq(s2.index, 2);
    ck_assert_str_eq(s2.label, "gold");
    ck_assert_uint_eq(sg.index, 2);
    ck_assert_uint_eq(sg.root, s2.root);
    ck_assert_uint_ne(s1.root, s2.root);
    ck_assert_uint_ne(s2.root, vi.root);
    ck_assert_int_eq(s1.deleted, 0);
    /* The id works as the VDI part too. */
    snprintf(spec, sizeof(spec), "%llu@gold", (unsigned long long)id);
    OK(st, plx_snap_lookup(st, spec, &sg));
    ck_assert_uint_eq(sg.index, 2);

    EXPECT_ERR(st, plx_snap_lookup(st, "vm@4", &sg), -ENOENT);
    EXPECT_ERR(st, plx_snap_lookup(st, "vm@0", &sg), -ENOENT);
    EXPECT_ERR(st, plx_snap_lookup(st, "vm@silver", &sg), -ENOENT);
    EXPECT_ERR(st, plx_snap_lookup(st, "nosuch@1", &sg), -ENOENT);
    EXPECT_ERR(st, plx_snap_lookup(st, "vm", &sg), -EINVAL);

    /* Relabelling. */
    OK(st, plx_snap_label(st, "vm@gold", "silver"));
    OK(st, plx_snap_lookup(st, "vm@silver", &sg));
    ck_assert_uint_eq(sg.index, 2);
    ck_assert_str_eq(sg.label, "silver");
    EXPECT_ERR(st, plx_snap_lookup(st, "vm@gold", &sg), -ENOENT);
    OK(st, plx_snap_label(st, "vm@1", "gold"));
    OK(st, plx_snap_lookup(st, "vm@gold", &sg));
    ck_assert_uint_eq(sg.index, 1);
    EXPECT_ERR(st, plx_snap_label(st, "vm@1", "silver"), -EEXIST);
    EXPECT_ERR(st, plx_snap_label(st, "vm@1", "99"), -EINVAL);
    EXPECT_ERR(st, plx_snap_label(st, "vm@7", "x"), -ENOENT);
    /* Labelling a snapshot with its own label is not a clash. */
    OK(st, plx_snap_label(st, "vm@1", "gold"));
    /* Clearing. */
    OK(st, plx_snap_label(st, "vm@silver", ""));
    EXPECT_ERR(st, plx_snap_lookup(st, "vm@silver", &sg), -ENOENT);
    OK(st, plx_snap_lookup(st, "vm@2", &sg));
    ck_assert_str_eq(sg.label, "");
    /* A freed label can be given to a new snapshot. */
    OK(st, plx_vdi_snapshot(st, "vm", "silver", &idx));
    ck_assert_uint_eq(idx, 4);

    struct plx_snap_info *list = NULL;
    size_t n = 0;
    OK(st, plx_snap_list(st, id, &list, &n));
    ck_assert_uint_eq(n, 4);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(list[i].index, i + 1);
    ck_assert_str_eq(list[0].label, "gold");
    ck_assert_str_eq(list[1].label, "");
    ck_assert_str_eq(list[3].label, "silver");
    free(list);

    /* Labels survive a reopen. */
    close_ok(st);
    st = open_kept(mem);
    OK(st, plx_snap_lookup(st, "vm@gold", &sg));
    ck_assert_uint_eq(sg.index, 1);
    OK(st, plx_snap_lookup(st, "vm@silver", &sg));
    ck_assert_uint_eq(sg.index, 4);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Many snapshots: the log spans several blocks; every snapshot keeps its own contents. */
START_TEST(test_many_snapshots)
{
    const int nsnap = tu_quick() ? 70 : 140;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "vm", 4 * MiB);
    plx_vdi *v = open_vdi(st, "vm", 0);
    unsigned char buf[BS], got[BS];
    for (int i = 1; i <= nsnap; i++) {
        pattern(buf, BS, (uint64_t)i, 0);
        pwrite_ok(st, v, buf, 0, BS);
        pattern(buf, BS, (uint64_t)i, 1);
        pwrite_ok(st, v, buf, (uint64_t)(i % 7) * BS + BS, BS);
        char label[16];
        snprintf(label, sizeof(label), "s%d", i);
        uint64_t idx = 0;
        OK(st, plx_vdi_snapshot_open(v, i % 3 ? label : NULL, &idx));
        ck_assert_uint_eq(idx, (uint64_t)i);
    }
    close_vdi(st, v);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i <= nsnap; i++) {
            char spec[32];
            snprintf(spec, sizeof(spec), "vm@%d", i);
            v = open_vdi(st, spec, 0);
            ck_assert(plx_vdi_readonly(v));
            pread_ok(st, v, got, 0, BS);
            pattern(buf, BS, (uint64_t)i, 0);
            ck_assert_msg(memcmp(got, buf, BS) == 0, "pass %d: snapshot %d block 0", pass, i);
            close_vdi(st, v);
            if (i % 3) {
                snprintf(spec, sizeof(spec), "vm@s%d", i);
                struct plx_snap_info si;
                OK(st, plx_snap_lookup(st, spec, &si));
                ck_assert_uint_eq(si.index, (uint64_t)i);
            }
        }
        close_ok(st);
        st = open_kept(mem);
    }
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "vm", &vi));
    ck_assert_uint_eq(vi.snap_count, (uint64_t)nsnap);
    fprintf(stderr, "engine: %d snapshots of one VDI, each read back twice across reopens\n",
            nsnap);
    check_clean(st, "many snapshots");
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_delete)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    uint64_t id = create_vdi(st, "gone", 2 * MiB);
    OK(st, plx_vdi_snapshot(st, "gone", "s", NULL));
    plx_vdi *v = open_vdi(st, "gone", 0);
    EXPECT_ERR(st, plx_vdi_delete(st, "gone"), -EBUSY);
    unsigned char buf[BS];
    pattern(buf, BS, 5, 5);
    pwrite_ok(st, v, buf, 0, BS);
    close_vdi(st, v);
    OK(st, plx_vdi_delete(st, "gone"));
    struct plx_vdi_info vi;
    EXPECT_ERR(st, plx_vdi_lookup(st, "gone", &vi), -ENOENT);
    char idstr[32];
    snprintf(idstr, sizeof(idstr), "%llu", (unsigned long long)id);
    EXPECT_ERR(st, plx_vdi_lookup(st, idstr, &vi), -ENOENT);
    struct plx_snap_info si;
    EXPECT_ERR(st, plx_snap_lookup(st, "gone@s", &si), -ENOENT);
    EXPECT_ERR(st, plx_vdi_open(st, "gone", 0, &v), -ENOENT);
    ck_assert_ptr_null(v);
    EXPECT_ERR(st, plx_vdi_delete(st, "gone"), -ENOENT);

    /* The list still shows it, marked deleted. */
    struct plx_vdi_info *list = NULL;
    size_t n = 0;
    OK(st, plx_vdi_list(st, &list, &n));
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(list[0].deleted, 1);
    ck_assert_uint_eq(list[0].id, id);
    free(list);

    /* The name can be used again, with a new id and fresh (zero) contents. */
    uint64_t id2 = create_vdi(st, "gone", 2 * MiB);
    ck_assert_uint_ne(id2, id);
    OK(st, plx_vdi_lookup(st, "gone", &vi));
    ck_assert_uint_eq(vi.id, id2);
    ck_assert_uint_eq(vi.snap_count, 0);
    v = open_vdi(st, "gone", 0);
    expect_zero(st, v, 0, BS, "reused name");
    close_vdi(st, v);
    struct plx_store_info in;
    OK(st, plx_store_info(st, &in));
    ck_assert_uint_eq(in.vdi_count, 1);
    close_ok(st);

    st = open_kept(mem);
    OK(st, plx_vdi_lookup(st, "gone", &vi));
    ck_assert_uint_eq(vi.id, id2);
    EXPECT_ERR(st, plx_vdi_lookup(st, idstr, &vi), -ENOENT);
    check_clean(st, "delete");
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* ---- I/O
 * ----------------------------------------------------------------------------------------- */

START_TEST(test_sparse_reads_zero)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "d", 700 * GiB); /* four levels */
    create_vdi(st, "s", 8 * MiB);
    plx_vdi *v = open_vdi(st, "d", 0);
    expect_zero(st, v, 0, 3 * BS + 17, "fresh");
    expect_zero(st, v, 700 * GiB - 100000, 100000, "fresh end");
    expect_zero(st, v, 300 * GiB + 5, 1, "one byte");
    /* A write far away leaves the neighbourhood zero. */
    unsigned char buf[BS];
    pattern(buf, BS, 1, 1);
    pwrite_ok(st, v, buf, 513 * GiB, BS);
    expect_zero(st, v, 513 * GiB - 2 * BS, 2 * BS, "before");
    expect_zero(st, v, 513 * GiB + BS, 5 * BS, "after");
    expect_bytes(st, v, buf, 513 * GiB, BS, "written");
    close_vdi(st, v);
    v = open_vdi(st, "s", 0);
    expect_zero(st, v, 0, 8 * MiB, "whole small VDI");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_unaligned_io)
{
    const uint64_t size = 2 * MiB;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "u", size);
    plx_vdi *v = open_vdi(st, "u", 0);
    unsigned char *ref = calloc(1, size);
    unsigned char *raw = malloc(size + 64);
    unsigned char *got = malloc(size + 64);
    ck_assert(ref && raw && got);
    static const struct {
        uint64_t off;
        size_t len;
    } cases[] = {
        {4095, 2},
        {1, 8191},
        {0, 1},
        {4096, 4096},
        {8191, 1},
        {12288 - 7, 7},
        {100, 3 * BS + 5},
        {0, 3 * BS - 1},
        {5 * BS + 1, BS},
        {65535, 65537},
        {4097, 4094},
        {2 * MiB - 1, 1},
        {2 * MiB - 5000, 5000},
        {123457, 301 * 1024},
    };
    uint64_t gen = 100;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (unsigned mis = 0; mis < 3; mis++) {
            uint64_t off = cases[c].off;
            size_t len = cases[c].len;
            /* Buffers at odd addresses: 1, 3 and 0 mod 4096 (malloc'd, rarely aligned). */
            unsigned char *src = raw + (mis == 0 ? 1 : mis == 1 ? 3 : 0);
            tu_fill(src, len, ++gen);
            pwrite_ok(st, v, src, off, len);
            memcpy(ref + off, src, len);
            /* Read the written range, a wider one and a narrower one. */
            unsigned char *dst = got + 1 + mis;
            memset(dst, 0x5a, len);
            pread_ok(st, v, dst, off, len);
            ck_assert_msg(memcmp(dst, ref + off, len) == 0, "case %zu/%u: %llu+%zu", c, mis,
                          (unsigned long long)off, len);
            uint64_t lo = off > 3000 ? off - 3000 : 0;
            uint64_t hi = off + len + 3000 < size ? off + len + 3000 : size;
            pread_ok(st, v, got + 5, lo, hi - lo);
            ck_assert_msg(memcmp(got + 5, ref + lo, hi - lo) == 0, "case %zu/%u: around", c, mis);
            if (len > 2) {
                pread_ok(st, v, got + 7, off + 1, len - 2);
                ck_assert_msg(memcmp(got + 7, ref + off + 1, len - 2) == 0, "case %zu: inside", c);
            }
        }
    }
    /* The whole VDI, once with an aligned buffer. */
    unsigned char *al = plx_block_alloc(size / BS);
    pread_ok(st, v, al, 0, size);
    ck_assert(memcmp(al, ref, size) == 0);
    /* Aligned writes from an aligned buffer go straight through; check they land too. */
    tu_fill(al, 8 * BS, 4242);
    pwrite_ok(st, v, al, 16 * BS, 8 * BS);
    memcpy(ref + 16 * BS, al, 8 * BS);
    pread_ok(st, v, got + 1, 0, size);
    ck_assert(memcmp(got + 1, ref, size) == 0);
    /* Zero-length requests complete. */
    OK(st, plx_vdi_pwrite(v, got, 100, 0, 0));
    OK(st, plx_vdi_pread(v, got, size, 0));
    close_vdi(st, v);
    close_ok(st);

    st = open_kept(mem);
    v = open_vdi(st, "u", PLX_OPEN_READONLY);
    expect_bytes(st, v, ref, 0, size, "after reopen");
    close_vdi(st, v);
    check_clean(st, "unaligned");
    close_ok(st);
    plx_block_free(al);
    free(ref);
    free(raw);
    free(got);
    mem->ops->destroy(mem);
}
END_TEST

static void count_cb(void *arg, int status)
{
    int *calls = arg;
    (void)status;
    (*calls)++;
}

START_TEST(test_range_and_readonly_errors)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "r", MiB);
    plx_vdi *v = open_vdi(st, "r", 0);
    ck_assert_uint_eq(plx_vdi_size(v), MiB);
    ck_assert_int_eq(plx_vdi_readonly(v), 0);
    unsigned char buf[2 * BS];
    memset(buf, 1, sizeof(buf));
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB, 1, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB - 1, 2, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, MiB - BS, 2 * BS, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, UINT64_MAX - 1, 4, 0), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pread(v, buf, MiB - 1, 2), -EINVAL);
    EXPECT_ERR(st, plx_vdi_pread(v, buf, 2 * MiB, 1), -EINVAL);
    EXPECT_ERR(st, plx_vdi_trim(v, MiB - BS, 2 * BS), -EINVAL);
    uint64_t run = 0;
    EXPECT_ERR(st, plx_vdi_block_status(v, MiB, BS, &run), -EINVAL);
    /* The last byte is fine. */
    OK(st, plx_vdi_pwrite(v, buf, MiB - 1, 1, 0));
    /* A rejected asynchronous request never calls back. */
    int calls = 0;
    EXPECT_ERR(st, plx_vdi_submit_write(v, buf, MiB, BS, 0, count_cb, &calls), -EINVAL);
    EXPECT_ERR(st, plx_vdi_submit_read(v, buf, MiB, BS, count_cb, &calls), -EINVAL);
    for (int i = 0; i < 5; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(calls, 0);
    ck_assert_int_eq(plx_store_busy(st), 0);
    close_vdi(st, v);

    OK(st, plx_vdi_snapshot(st, "r", "one", NULL));
    /* Snapshots are read-only, whichever way they are named and opened. */
    const char *specs[] = {"r@1", "r@one"};
    for (int i = 0; i < 2; i++) {
        v = open_vdi(st, specs[i], 0);
        ck_assert_int_ne(plx_vdi_readonly(v), 0);
        EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 0, BS, 0), -EROFS);
        EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 1, 10, 0), -EROFS);
        EXPECT_ERR(st, plx_vdi_trim(v, 0, BS), -EROFS);
        EXPECT_ERR(st, plx_vdi_snapshot_open(v, NULL, NULL), -EROFS);
        calls = 0;
        EXPECT_ERR(st, plx_vdi_submit_write(v, buf, 0, BS, 0, count_cb, &calls), -EROFS);
        ck_assert_int_ge(plx_store_service(st), 0);
        ck_assert_int_eq(calls, 0);
        /* Reading and flushing a read-only VDI are fine. */
        OK(st, plx_vdi_pread(v, buf, 0, BS));
        OK(st, plx_vdi_flush(v));
        close_vdi(st, v);
    }
    /* A VDI opened read-only refuses writes too. */
    v = open_vdi(st, "r", PLX_OPEN_READONLY);
    ck_assert_int_ne(plx_vdi_readonly(v), 0);
    EXPECT_ERR(st, plx_vdi_pwrite(v, buf, 0, BS, 0), -EROFS);
    close_vdi(st, v);
    EXPECT_ERR(st, plx_vdi_open(st, "r@2", 0, &v), -ENOENT);
    EXPECT_ERR(st, plx_vdi_open(st, "nosuch", 0, &v), -ENOENT);
    EXPECT_ERR(st, plx_vdi_open(st, "r@nolabel", 0, &v), -ENOENT);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_single_writer)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "w", MiB);
    plx_vdi *v = open_vdi(st, "w", 0);
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "w", &vi));
    ck_assert_msg(vi.lock_holder[0] != '\0', "no lock holder while open for writing");
    plx_vdi *v2 = NULL;
    EXPECT_ERR(st, plx_vdi_open(st, "w", 0, &v2), -EBUSY);
    ck_assert_ptr_null(v2);
    /* The refused open must not release the lock of the handle that holds it. */
    OK(st, plx_vdi_lookup(st, "w", &vi));
    ck_assert_msg(vi.lock_holder[0] != '\0',
                  "a second open refused with -EBUSY released the first opener's lock");
    /* Readers are welcome; admin snapshots need the VDI closed. */
    v2 = open_vdi(st, "w", PLX_OPEN_READONLY);
    close_vdi(st, v2);
    EXPECT_ERR(st, plx_vdi_snapshot(st, "w", NULL, NULL), -EBUSY);
    close_vdi(st, v);
    OK(st, plx_vdi_lookup(st, "w", &vi));
    ck_assert_str_eq(vi.lock_holder, "");
    /* Once closed it can be opened for writing again. */
    v = open_vdi(st, "w", 0);
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_clone)
{
    const uint64_t size = 3 * MiB;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    uint64_t src_id = create_vdi(st, "src", size);
    unsigned char *ref = calloc(1, size), *snap = calloc(1, size), *cl = NULL;
    unsigned char *buf = malloc(size);
    plx_vdi *v = open_vdi(st, "src", 0);
    /* Blocks 0..299 written, some partially; the rest sparse. */
    tu_fill(buf, 300 * BS, 1);
    pwrite_ok(st, v, buf, 0, 300 * BS);
    memcpy(ref, buf, 300 * BS);
    tu_fill(buf, 999, 2);
    pwrite_ok(st, v, buf, 400 * BS + 3, 999);
    memcpy(ref + 400 * BS + 3, buf, 999);
    uint64_t idx = 0;
    OK(st, plx_vdi_snapshot_open(v, "base", &idx));
    ck_assert_uint_eq(idx, 1);
    memcpy(snap, ref, size);
    close_vdi(st, v);

    uint64_t clone_id = 0;
    OK(st, plx_vdi_clone(st, "cl", "src@base", &clone_id));
    ck_assert_uint_ne(clone_id, 0);
    ck_assert_uint_ne(clone_id, src_id);
    EXPECT_ERR(st, plx_vdi_clone(st, "cl", "src@1", NULL), -EEXIST);
    EXPECT_ERR(st, plx_vdi_clone(st, "cl2", "src@2", NULL), -ENOENT);
    EXPECT_ERR(st, plx_vdi_clone(st, "cl2", "src", NULL), -EINVAL);
    EXPECT_ERR(st, plx_vdi_clone(st, "bad@name", "src@1", NULL), -EINVAL);
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "cl", &vi));
    ck_assert_uint_eq(vi.id, clone_id);
    ck_assert_uint_eq(vi.size, size);
    ck_assert_uint_eq(vi.parent_id, src_id);
    ck_assert_uint_eq(vi.parent_snap, 1);
    ck_assert_uint_eq(vi.snap_count, 0);

    cl = malloc(size);
    memcpy(cl, snap, size);
    plx_vdi *c = open_vdi(st, "cl", 0);
    expect_bytes(st, c, cl, 0, size, "clone starts as the snapshot");
    /* Overwrite part of the shared range, partially and wholly, and a sparse range. */
    tu_fill(buf, 50 * BS + 10, 3);
    pwrite_ok(st, c, buf, 10 * BS - 5, 50 * BS + 10);
    memcpy(cl + 10 * BS - 5, buf, 50 * BS + 10);
    tu_fill(buf, 7, 4);
    pwrite_ok(st, c, buf, 299 * BS + 4090, 7);
    memcpy(cl + 299 * BS + 4090, buf, 7);
    tu_fill(buf, 5 * BS, 5);
    pwrite_ok(st, c, buf, 600 * BS, 5 * BS);
    memcpy(cl + 600 * BS, buf, 5 * BS);
    expect_bytes(st, c, cl, 0, size, "clone after writes");
    close_vdi(st, c);

    /* The source and its snapshot are untouched. */
    v = open_vdi(st, "src", 0);
    expect_bytes(st, v, ref, 0, size, "source after clone writes");
    plx_vdi *s = open_vdi(st, "src@1", 0);
    expect_bytes(st, s, snap, 0, size, "snapshot after clone writes");
    close_vdi(st, s);
    /* Writing the source does not show in the clone or the snapshot. */
    tu_fill(buf, 20 * BS, 6);
    pwrite_ok(st, v, buf, 5 * BS, 20 * BS);
    memcpy(ref + 5 * BS, buf, 20 * BS);
    expect_bytes(st, v, ref, 0, size, "source after its writes");
    close_vdi(st, v);
    c = open_vdi(st, "cl", PLX_OPEN_READONLY);
    expect_bytes(st, c, cl, 0, size, "clone after source writes");
    close_vdi(st, c);
    s = open_vdi(st, "src@base", 0);
    expect_bytes(st, s, snap, 0, size, "snapshot after source writes");
    close_vdi(st, s);

    /* A clone of a clone's snapshot. */
    OK(st, plx_vdi_snapshot(st, "cl", NULL, NULL));
    OK(st, plx_vdi_clone(st, "cl2", "cl@1", NULL));
    c = open_vdi(st, "cl2", 0);
    expect_bytes(st, c, cl, 0, size, "clone of clone");
    tu_fill(buf, BS, 7);
    pwrite_ok(st, c, buf, 10 * BS, BS);
    close_vdi(st, c);
    c = open_vdi(st, "cl", PLX_OPEN_READONLY);
    expect_bytes(st, c, cl, 0, size, "clone after its clone was written");
    close_vdi(st, c);

    /* Deleting the source leaves the clone readable. */
    OK(st, plx_vdi_delete(st, "src"));
    close_ok(st);
    st = open_kept(mem);
    c = open_vdi(st, "cl", 0);
    expect_bytes(st, c, cl, 0, size, "clone after source deleted and reopen");
    close_vdi(st, c);
    check_clean(st, "clone");
    close_ok(st);
    free(ref);
    free(snap);
    free(cl);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_clone_height4)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "big", 600 * GiB);
    plx_vdi *v = open_vdi(st, "big", 0);
    unsigned char a[BS], b[BS];
    pattern(a, BS, 1, 1);
    pwrite_ok(st, v, a, 550 * GiB, BS);
    pwrite_ok(st, v, a, 3 * BS, BS);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    close_vdi(st, v);
    OK(st, plx_vdi_clone(st, "bigc", "big@1", NULL));
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "bigc", &vi));
    ck_assert_uint_eq(vi.height, 4);
    ck_assert_uint_eq(vi.size, 600 * GiB);
    v = open_vdi(st, "bigc", 0);
    expect_bytes(st, v, a, 550 * GiB, BS, "clone far block");
    pattern(b, BS, 2, 2);
    pwrite_ok(st, v, b, 550 * GiB, BS);
    expect_bytes(st, v, b, 550 * GiB, BS, "clone rewritten");
    expect_bytes(st, v, a, 3 * BS, BS, "clone near block");
    close_vdi(st, v);
    v = open_vdi(st, "big", PLX_OPEN_READONLY);
    expect_bytes(st, v, a, 550 * GiB, BS, "source far block");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_trim)
{
    const uint64_t size = 4 * MiB;
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", size);
    plx_vdi *v = open_vdi(st, "t", 0);
    unsigned char *ref = malloc(size), *snap = malloc(size);
    tu_fill(ref, size, 11);
    pwrite_ok(st, v, ref, 0, size);
    uint64_t run = 0;
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, size);
    OK(st, plx_vdi_snapshot_open(v, "before", NULL));
    memcpy(snap, ref, size);

    /* Unaligned on both ends: blocks 11..19 become sparse, edges of 10 and 20 become zero. */
    uint64_t off = 10 * BS + 100, len = 10 * BS;
    OK(st, plx_vdi_trim(v, off, len));
    memset(ref + off, 0, len);
    expect_bytes(st, v, ref, 0, size, "after trim");
    ck_assert_int_eq(plx_vdi_block_status(v, 11 * BS, 9 * BS, &run), 0);
    ck_assert_uint_eq(run, 9 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 11 * BS, 20 * BS, &run), 0);
    ck_assert_uint_eq(run, 9 * BS);
    /* The edge blocks keep data outside the range, so they stay mapped. */
    ck_assert_int_eq(plx_vdi_block_status(v, 10 * BS, BS, &run), 1);
    ck_assert_int_eq(plx_vdi_block_status(v, 20 * BS, BS, &run), 1);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, 11 * BS);
    /* Aligned trim of a large range. */
    OK(st, plx_vdi_trim(v, MiB, 2 * MiB));
    memset(ref + MiB, 0, 2 * MiB);
    ck_assert_int_eq(plx_vdi_block_status(v, MiB, 2 * MiB, &run), 0);
    ck_assert_uint_eq(run, 2 * MiB);
    /* Within one block, and across one block boundary without a whole block. */
    OK(st, plx_vdi_trim(v, 30 * BS + 5, 100));
    memset(ref + 30 * BS + 5, 0, 100);
    OK(st, plx_vdi_trim(v, 40 * BS - 50, 100));
    memset(ref + 40 * BS - 50, 0, 100);
    /* Trimming what is already sparse is fine. */
    OK(st, plx_vdi_trim(v, MiB, MiB));
    OK(st, plx_vdi_trim(v, 0, 0));
    expect_bytes(st, v, ref, 0, size, "after all trims");
    /* A trimmed block can be written again. */
    unsigned char blk[BS];
    pattern(blk, BS, 3, 15);
    pwrite_ok(st, v, blk, 15 * BS, BS);
    memcpy(ref + 15 * BS, blk, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 15 * BS, BS, &run), 1);
    expect_bytes(st, v, ref, 0, size, "after rewrite");
    close_vdi(st, v);

    v = open_vdi(st, "t@before", 0);
    expect_bytes(st, v, snap, 0, size, "snapshot after trims");
    ck_assert_int_eq(plx_vdi_block_status(v, 0, size, &run), 1);
    ck_assert_uint_eq(run, size);
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "t", 0);
    expect_bytes(st, v, ref, 0, size, "after reopen");
    ck_assert_int_eq(plx_vdi_block_status(v, 12 * BS, BS, &run), 0);
    close_vdi(st, v);
    v = open_vdi(st, "t@1", 0);
    expect_bytes(st, v, snap, 0, size, "snapshot after reopen");
    close_vdi(st, v);
    check_clean(st, "trim");
    close_ok(st);
    free(ref);
    free(snap);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_block_status)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "b", 8 * MiB);
    create_vdi(st, "h", 600 * GiB);
    plx_vdi *v = open_vdi(st, "b", 0);
    uint64_t run = 0;
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 8 * MiB, &run), 0);
    ck_assert_uint_eq(run, 8 * MiB);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 0, &run), 0);
    ck_assert_uint_eq(run, 0);
    unsigned char buf[4 * BS];
    tu_fill(buf, sizeof(buf), 1);
    pwrite_ok(st, v, buf, 100 * BS, 4 * BS);
    pwrite_ok(st, v, buf, 2 * MiB + 10, 1); /* a byte maps its whole block */
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 8 * MiB, &run), 0);
    ck_assert_uint_eq(run, 100 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 100 * BS, 8 * MiB - 100 * BS, &run), 1);
    ck_assert_uint_eq(run, 4 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 101 * BS + 7, BS, &run), 1);
    ck_assert_uint_eq(run, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 102 * BS, 2 * BS, &run), 1);
    ck_assert_uint_eq(run, 2 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 104 * BS, 8 * MiB - 104 * BS, &run), 0);
    ck_assert_uint_eq(run, 2 * MiB - 104 * BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 2 * MiB, BS, &run), 1);
    ck_assert_uint_eq(run, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 2 * MiB + BS, 6 * MiB - BS, &run), 0);
    ck_assert_uint_eq(run, 6 * MiB - BS);
    close_vdi(st, v);

    /* Snapshots and clones report what they share as mapped. */
    OK(st, plx_vdi_snapshot(st, "b", NULL, NULL));
    OK(st, plx_vdi_clone(st, "bc", "b@1", NULL));
    v = open_vdi(st, "bc", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 100 * BS, 8 * BS, &run), 1);
    ck_assert_uint_eq(run, 4 * BS);
    close_vdi(st, v);
    v = open_vdi(st, "b@1", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 101 * BS, &run), 0);
    ck_assert_uint_eq(run, 100 * BS);
    close_vdi(st, v);

    /* A huge sparse VDI answers without walking every block. */
    v = open_vdi(st, "h", 0);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 600 * GiB, &run), 0);
    ck_assert_uint_eq(run, 600 * GiB);
    pwrite_ok(st, v, buf, 599 * GiB, BS);
    ck_assert_int_eq(plx_vdi_block_status(v, 0, 600 * GiB, &run), 0);
    ck_assert_uint_eq(run, 599 * GiB);
    ck_assert_int_eq(plx_vdi_block_status(v, 599 * GiB, GiB, &run), 1);
    ck_assert_uint_eq(run, BS);
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* ---- The asynchronous interface -------------------------------------------------------------- */

struct cb_rec {
    int *in_submit; /* nonzero while a submit call is running */
    int fired;
    int status;
    int bad_context;
    int *order; /* completion order log */
    int *norder;
    int id;
};

static void rec_cb(void *arg, int status)
{
    struct cb_rec *r = arg;
    if (*r->in_submit)
        r->bad_context = 1;
    r->fired++;
    r->status = status;
    if (r->order != NULL)
        r->order[(*r->norder)++] = r->id;
}

/* Service until every record has fired, with a bound on idle rounds. */
static void drain_all(plx_store *st, struct cb_rec *recs, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = plx_store_wait(st, &recs[i].fired);
        ck_assert_msg(rc == 0, "wait for request %d: %d (%s)", i, rc, plx_store_errmsg(st));
    }
}

/* Block status without blocking: on a cold cache (the nodes are read asynchronously), it gives
 * the same answers as the blocking call; it sees a write submitted before it; its callback never
 * runs inside the submit call. */
START_TEST(test_async_block_status)
{
    plx_backend *mem = new_medium(64 * MiB);
    plx_store *st = open_kept(mem);
    const uint64_t size = 16 * MiB; /* several leaves (2 MiB each) */
    create_vdi(st, "s", size);
    plx_vdi *v = open_vdi(st, "s", 0);
    unsigned char *buf = malloc(MiB);
    tu_fill(buf, MiB, 5);
    /* Mapped: [0, 8K), [1M, 1M+12K), [5M, 6M), the last block; the rest sparse. */
    pwrite_ok(st, v, buf, 0, 2 * BS);
    pwrite_ok(st, v, buf, MiB, 3 * BS);
    pwrite_ok(st, v, buf, 5 * MiB, MiB);
    pwrite_ok(st, v, buf, size - BS, BS);
    close_vdi(st, v);
    close_ok(st);

    uint64_t seed = 42;
    enum { N = 64 };
    uint64_t offs[N], lens[N], runs[N];
    int mapped[N], in_submit = 0;
    struct cb_rec recs[N];
    memset(recs, 0, sizeof recs);
    st = open_kept(mem); /* cold cache: every node below the root must be read */
    v = open_vdi(st, "s", 0);
    for (int i = 0; i < N; i++) {
        offs[i] = tu_rand(&seed) % size;
        lens[i] = 1 + tu_rand(&seed) % (size - offs[i]);
        recs[i].in_submit = &in_submit;
        in_submit = 1;
        OK(st, plx_vdi_submit_block_status(v, offs[i], lens[i], &runs[i], &mapped[i], rec_cb,
                                           &recs[i]));
        in_submit = 0;
        ck_assert_int_eq(recs[i].fired, 0);
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_int_eq(recs[i].status, 0);
        uint64_t run = 0;
        int want = plx_vdi_block_status(v, offs[i], lens[i], &run);
        ck_assert_int_ge(want, 0);
        ck_assert_msg(mapped[i] == want && runs[i] == run,
                      "status of [%llu, +%llu): async %d/%llu, blocking %d/%llu",
                      (unsigned long long)offs[i], (unsigned long long)lens[i], mapped[i],
                      (unsigned long long)runs[i], want, (unsigned long long)run);
    }
    /* Spot checks against the layout written above. */
    uint64_t run = 0;
    int m = -1;
    struct cb_rec one = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_block_status(v, 2 * BS, size - 2 * BS, &run, &m, rec_cb, &one));
    drain_all(st, &one, 1);
    ck_assert_int_eq(m, 0);
    ck_assert_uint_eq(run, MiB - 2 * BS);
    /* A write submitted just before is seen. */
    struct cb_rec w = {.in_submit = &in_submit}, bs = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_write(v, buf, 9 * MiB, BS, 0, rec_cb, &w));
    OK(st, plx_vdi_submit_block_status(v, 9 * MiB, MiB, &run, &m, rec_cb, &bs));
    drain_all(st, &bs, 1);
    ck_assert_int_eq(w.fired, 1);
    ck_assert_int_eq(m, 1);
    ck_assert_uint_eq(run, BS);
    /* Bad ranges are refused at submission, without a callback. */
    int calls = 0;
    EXPECT_ERR(st, plx_vdi_submit_block_status(v, size, BS, &run, &m, count_cb, &calls), -EINVAL);
    EXPECT_ERR(st, plx_vdi_submit_block_status(v, 0, 0, &run, &m, count_cb, &calls), -EINVAL);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(calls, 0);
    close_vdi(st, v);
    close_ok(st);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_async_many_in_flight)
{
    enum { N = 256 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "a", 4 * MiB);
    plx_vdi *v = open_vdi(st, "a", 0);
    unsigned char *bufs = plx_block_alloc(N);
    static struct cb_rec recs[N];
    int in_submit = 0;
    int order[N], norder = 0;
    for (int i = 0; i < N; i++) {
        /* Distinct blocks, in a scattered order. */
        uint64_t blk = (uint64_t)(i * 37 % N) * 3;
        pattern(bufs + (size_t)i * BS, BS, 7, blk);
        recs[i] =
            (struct cb_rec){.in_submit = &in_submit, .order = order, .norder = &norder, .id = i};
        in_submit = 1;
        int rc = plx_vdi_submit_write(v, bufs + (size_t)i * BS, blk * BS, BS, 0, rec_cb, &recs[i]);
        in_submit = 0;
        ck_assert_msg(rc == 0, "submit %d: %d (%s)", i, rc, plx_store_errmsg(st));
        ck_assert_int_eq(recs[i].fired, 0);
    }
    ck_assert_int_ne(plx_store_busy(st), 0);
    ck_assert_int_ge(plx_store_fd(st), 0);
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    ck_assert_int_eq(norder, N);
    /* Nothing fires twice. */
    for (int i = 0; i < 5; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(recs[i].fired, 1);

    /* Read everything back asynchronously too, all in flight at once. */
    unsigned char *rb = plx_block_alloc(N);
    in_submit = 0;
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i * 37 % N) * 3;
        recs[i] = (struct cb_rec){.in_submit = &in_submit, .id = i};
        in_submit = 1;
        OK(st, plx_vdi_submit_read(v, rb + (size_t)i * BS, blk * BS, BS, rec_cb, &recs[i]));
        in_submit = 0;
        ck_assert_int_eq(recs[i].fired, 0);
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_msg(memcmp(rb + (size_t)i * BS, bufs + (size_t)i * BS, BS) == 0,
                      "request %d read back wrong data", i);
    }
    fprintf(stderr, "engine: %d writes then %d reads in flight at once\n", N, N);
    /* And the blocks in between are still zero. */
    expect_zero(st, v, BS, 2 * BS, "between");
    close_vdi(st, v);
    plx_block_free(bufs);
    plx_block_free(rb);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Requests on the same block are carried out in submission order, reads included. */
START_TEST(test_async_same_block_order)
{
    enum { N = 40 };
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "o", MiB);
    plx_vdi *v = open_vdi(st, "o", 0);
    unsigned char *w = malloc((size_t)N * BS);
    unsigned char *r = malloc((size_t)N * BS);
    unsigned char ref[3 * BS], want[N][64];
    memset(ref, 0, sizeof(ref));
    static struct cb_rec recs[2 * N];
    int in_submit = 0;
    for (int i = 0; i < N; i++) {
        /* Overlapping unaligned writes around block 1, each followed by a read of 64 bytes. */
        uint64_t off = BS - 30 + (uint64_t)(i * 13 % 60);
        size_t len = 20 + (size_t)(i * 7 % 40);
        tu_fill(w + (size_t)i * BS, len, 500 + (uint64_t)i);
        memcpy(ref + off, w + (size_t)i * BS, len);
        memcpy(want[i], ref + BS - 32, 64);
        recs[2 * i] = (struct cb_rec){.in_submit = &in_submit};
        recs[2 * i + 1] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st, plx_vdi_submit_write(v, w + (size_t)i * BS, off, len, 0, rec_cb, &recs[2 * i]));
        OK(st, plx_vdi_submit_read(v, r + (size_t)i * BS, BS - 32, 64, rec_cb, &recs[2 * i + 1]));
        in_submit = 0;
    }
    drain_all(st, recs, 2 * N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[2 * i].status, 0);
        ck_assert_int_eq(recs[2 * i + 1].status, 0);
        ck_assert_int_eq(recs[2 * i].bad_context + recs[2 * i + 1].bad_context, 0);
        ck_assert_msg(memcmp(r + (size_t)i * BS, want[i], 64) == 0,
                      "read %d did not see exactly the writes submitted before it", i);
    }
    expect_bytes(st, v, ref, 0, sizeof(ref), "final");
    close_vdi(st, v);
    close_ok(st);
    free(w);
    free(r);
    mem->ops->destroy(mem);
}
END_TEST

/* Reads and writes of mixed lengths on overlapping ranges, all in flight at once: each read sees
 * exactly the writes submitted before it. Ranges of up to PLX_BUSY_MAX_BLOCKS blocks start
 * through may_start's busy filter, longer ones through the walk of the active list; both kinds
 * are mixed here, and the short ones also start beside each other on blocks that share a
 * counter (64 blocks in 4096 counters: a few do). */
START_TEST(test_async_mixed_ranges_order)
{
    enum { N = 120, SPAN = 64 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "m", MiB);
    plx_vdi *v = open_vdi(st, "m", 0);
    unsigned char *buf = plx_block_alloc((size_t)N * 24);
    unsigned char *ref = calloc(SPAN, BS), *want = calloc((size_t)N * 24, BS);
    static struct cb_rec recs[N];
    uint64_t off[N], len[N];
    bool is_read[N];
    int in_submit = 0;
    for (int i = 0; i < N; i++) {
        /* 1 to 24 blocks (some past PLX_BUSY_MAX_BLOCKS), every third a read. */
        uint64_t n = 1 + (uint64_t)(i * 7 % 24), b = (uint64_t)(i * 37 % (SPAN - 24));
        off[i] = b * BS;
        len[i] = n * BS;
        is_read[i] = i % 3 == 2;
        unsigned char *p = buf + (size_t)i * 24 * BS;
        if (is_read[i])
            memcpy(want + (size_t)i * 24 * BS, ref + off[i], len[i]);
        else {
            tu_fill(p, len[i], 900 + (uint64_t)i);
            memcpy(ref + off[i], p, len[i]);
        }
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        if (is_read[i])
            OK(st, plx_vdi_submit_read(v, p, off[i], len[i], rec_cb, &recs[i]));
        else
            OK(st, plx_vdi_submit_write(v, p, off[i], len[i], 0, rec_cb, &recs[i]));
        in_submit = 0;
    }
    drain_all(st, recs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].bad_context, 0);
        size_t at = (size_t)i * 24 * BS;
        if (is_read[i])
            ck_assert_msg(memcmp(buf + at, want + at, len[i]) == 0,
                          "read %d did not see exactly the writes submitted before it", i);
    }
    expect_bytes(st, v, ref, 0, (size_t)SPAN * BS, "final");
    close_vdi(st, v);
    close_ok(st);
    plx_block_free(buf);
    free(ref);
    free(want);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_async_snapshot_between_batches)
{
    enum { N = 64 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "s", 2 * MiB);
    plx_vdi *v = open_vdi(st, "s", 0);
    unsigned char *a = plx_block_alloc(N), *b = plx_block_alloc(N);
    static struct cb_rec recs[2 * N + 1];
    int in_submit = 0;
    uint64_t idx = 0;
    /* First batch: blocks 0..N-1 with generation 1. */
    for (int i = 0; i < N; i++) {
        pattern(a + (size_t)i * BS, BS, 1, (uint64_t)i);
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st,
           plx_vdi_submit_write(v, a + (size_t)i * BS, (uint64_t)i * BS, BS, 0, rec_cb, &recs[i]));
        in_submit = 0;
    }
    recs[N] = (struct cb_rec){.in_submit = &in_submit};
    in_submit = 1;
    OK(st, plx_vdi_submit_snapshot(v, "mid", &idx, rec_cb, &recs[N]));
    in_submit = 0;
    /* Second batch: the same blocks, generation 2, plus blocks beyond. */
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i % 2 ? i : N + i);
        pattern(b + (size_t)i * BS, BS, 2, blk);
        recs[N + 1 + i] = (struct cb_rec){.in_submit = &in_submit};
        in_submit = 1;
        OK(st,
           plx_vdi_submit_write(v, b + (size_t)i * BS, blk * BS, BS, 0, rec_cb, &recs[N + 1 + i]));
        in_submit = 0;
    }
    drain_all(st, recs, 2 * N + 1);
    for (int i = 0; i < 2 * N + 1; i++) {
        ck_assert_msg(recs[i].status == 0, "request %d: %d", i, recs[i].status);
        ck_assert_int_eq(recs[i].bad_context, 0);
        ck_assert_int_eq(recs[i].fired, 1);
    }
    ck_assert_uint_eq(idx, 1);
    /* The VDI has generation 2 where it was rewritten. */
    for (int i = 0; i < N; i++) {
        uint64_t blk = (uint64_t)(i % 2 ? i : N + i);
        expect_bytes(st, v, b + (size_t)i * BS, blk * BS, BS, "vdi, second batch");
        if (i % 2 == 0)
            expect_bytes(st, v, a + (size_t)i * BS, (uint64_t)i * BS, BS, "vdi, first batch");
    }
    close_vdi(st, v);
    /* The snapshot has exactly the first batch. */
    for (int pass = 0; pass < 2; pass++) {
        v = open_vdi(st, pass ? "s@mid" : "s@1", 0);
        expect_bytes(st, v, a, 0, (size_t)N * BS, "snapshot");
        expect_zero(st, v, (uint64_t)N * BS, (size_t)N * BS, "snapshot beyond the first batch");
        close_vdi(st, v);
    }
    check_clean(st, "async snapshot");
    close_ok(st);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* A snapshot does not drain the queue (issue 16). The medium holds back the data write of a
 * write that allocates a block; a snapshot submitted after it swaps roots as soon as that write
 * is in the tree, and a write after the snapshot (to the same leaf, so it copies the leaf with
 * the new link in it) reaches the medium while the first is still held. The snapshot completes
 * only once the held data is written, and holds it; the later write is not in it. */
START_TEST(test_snapshot_does_not_drain)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "d", 4 * MiB);
    plx_vdi *v = open_vdi(st, "d", 0);
    unsigned char *old = plx_block_alloc(1), *a = plx_block_alloc(1), *b = plx_block_alloc(1);
    pattern(old, BS, 1, 0);
    pwrite_ok(st, v, old, 0, BS); /* the leaf exists and is on the medium */
    pattern(a, BS, 2, 2);
    pattern(b, BS, 3, 1);
    int in_submit = 0;
    struct cb_rec recs[3];
    for (int i = 0; i < 3; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t idx = 0;
    tu_hold_next_write();
    OK(st, plx_vdi_submit_write(v, a, 2 * BS, BS, 0, rec_cb, &recs[0]));
    ck_assert_uint_eq(tu_held(), 1); /* the data write of block 2 */
    OK(st, plx_vdi_submit_snapshot(v, "mid", &idx, rec_cb, &recs[1]));
    OK(st, plx_vdi_submit_write(v, b, 1 * BS, BS, 0, rec_cb, &recs[2]));
    for (int i = 0; i < 200 && !tu_write_seen(b); i++) {
        ck_assert_int_ge(plx_store_service(st), 0);
        usleep(1000);
    }
    ck_assert_uint_eq(tu_held(), 1);
    ck_assert_msg(tu_write_seen(b),
                  "the write after the snapshot waited for the held write before it: the "
                  "snapshot drained the queue");
    ck_assert_msg(!recs[1].fired, "the snapshot completed before the data of a write in it");
    tu_release_held();
    drain_all(st, recs, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    ck_assert_uint_eq(idx, 1);
    expect_bytes(st, v, old, 0, BS, "vdi block 0");
    expect_bytes(st, v, b, BS, BS, "vdi block 1, written after the snapshot");
    expect_bytes(st, v, a, 2 * BS, BS, "vdi block 2, written before the snapshot");
    close_vdi(st, v);
    v = open_vdi(st, "d@mid", 0);
    expect_bytes(st, v, old, 0, BS, "snapshot block 0");
    expect_zero(st, v, BS, BS, "snapshot block 1 (written after it)");
    expect_bytes(st, v, a, 2 * BS, BS, "snapshot block 2 (written before it, held)");
    close_vdi(st, v);
    check_clean(st, "snapshot beside a held write");
    close_ok(st);
    plx_block_free(old);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* The snapshot that brings the log's tail to PLX_LABELS_FOLD_TAIL records starts a fold of the
 * tail into the label index; submitting it must not wait for the medium. It used to fold right
 * there, with blocking I/O (read the tail, write the VDI record, flush) inside the submit call:
 * inside `parallax serve`'s loop, every request of every VDI of the process stood still for that
 * long, one snapshot in 126 (issue 16's busy-disk outliers). Writes are held by the medium for
 * a second: a submit that waits for one takes that second. */
static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

START_TEST(test_snapshot_fold_does_not_block)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept(fault);
    create_vdi(st, "f", 2 * MiB);
    plx_vdi *v = open_vdi(st, "f", 0);
    unsigned char *buf = plx_block_alloc(1);
    uint64_t idx = 0;
    for (unsigned i = 1; i <= PLX_LABELS_FOLD_TAIL; i++) {
        pattern(buf, BS, i, 0);
        pwrite_ok(st, v, buf, (i % 16) * BS, BS);
        OK(st, plx_vdi_snapshot_open(v, i % 2 ? "" : NULL, &idx));
        ck_assert_uint_eq(idx, i);
    }
    int in_submit = 0;
    struct cb_rec rec = {.in_submit = &in_submit};
    plx_fault_hold_blocks(fault, PLX_IO_WRITE, 0, fault->nblocks, 1000);
    uint64_t t0 = mono_ms();
    in_submit = 1;
    OK(st, plx_vdi_submit_snapshot(v, "", &idx, rec_cb, &rec));
    in_submit = 0;
    uint64_t took = mono_ms() - t0;
    ck_assert_msg(took < 500,
                  "submitting the snapshot that starts a fold took %llu ms with the medium "
                  "holding writes: it waited for I/O",
                  (unsigned long long)took);
    ck_assert_int_eq(rec.fired, 0);
    plx_fault_release(fault);
    drain_all(st, &rec, 1);
    ck_assert_msg(rec.status == 0, "snapshot: %d (%s)", rec.status, plx_store_errmsg(st));
    ck_assert_int_eq(rec.bad_context, 0);
    ck_assert_uint_eq(idx, PLX_LABELS_FOLD_TAIL + 1);
    /* The next one queues behind the fold and works as usual. */
    OK(st, plx_vdi_snapshot_open(v, "after", &idx));
    ck_assert_uint_eq(idx, PLX_LABELS_FOLD_TAIL + 2);
    close_vdi(st, v);
    v = open_vdi(st, "f@after", 0);
    close_vdi(st, v);
    check_clean(st, "snapshot starting a fold");
    close_ok(st);
    plx_block_free(buf);
    fault->ops->destroy(fault);
}
END_TEST

/* The commit writes a snapshot waits for go to the medium marked urgent (the file backend gives
 * them the real-time I/O class); plain commits are not marked, since while an urgent write is
 * in flight mq-deadline serves nothing else (DESIGN.md, "Commit writes go first"). */
START_TEST(test_urgent_only_with_a_waiter)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept(fault);
    create_vdi(st, "u", 2 * MiB);
    plx_vdi *v = open_vdi(st, "u", 0);
    unsigned char *buf = plx_block_alloc(1);
    uint64_t idx = 0, u0 = plx_fault_urgent_writes(fault);
    for (unsigned i = 0; i < 16; i++) {
        pattern(buf, BS, i, 0);
        pwrite_ok(st, v, buf, (uint64_t)i * 29 * BS, BS);
    }
    ck_assert_uint_eq(plx_fault_urgent_writes(fault), u0);
    OK(st, plx_vdi_snapshot_open(v, "", &idx));
    uint64_t u1 = plx_fault_urgent_writes(fault);
    ck_assert_uint_ge(u1, u0 + 2); /* at least the log block and the VDI record */
    for (unsigned i = 0; i < 16; i++) {
        pattern(buf, BS, 100 + i, 0);
        pwrite_ok(st, v, buf, (uint64_t)i * 29 * BS, BS); /* copy-on-write: new leaves */
    }
    ck_assert_uint_eq(plx_fault_urgent_writes(fault), u1);
    close_vdi(st, v);
    check_clean(st, "urgent writes");
    close_ok(st);
    plx_block_free(buf);
    fault->ops->destroy(fault);
}
END_TEST

/* Two snapshots submitted back to back, the second labelled: both succeed, in order, and the
 * second label is unique. */
START_TEST(test_async_two_snapshots)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", MiB);
    plx_vdi *v = open_vdi(st, "t", 0);
    unsigned char a[BS], b[BS];
    pattern(a, BS, 1, 0);
    pattern(b, BS, 2, 0);
    int in_submit = 0;
    struct cb_rec recs[4];
    for (int i = 0; i < 4; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t i1 = 0, i2 = 0;
    OK(st, plx_vdi_submit_write(v, a, 0, BS, 0, rec_cb, &recs[0]));
    int rc = plx_vdi_submit_snapshot(v, NULL, &i1, rec_cb, &recs[1]);
    ck_assert_msg(rc == 0, "first snapshot: %d (%s)", rc, plx_store_errmsg(st));
    OK(st, plx_vdi_submit_write(v, b, 0, BS, 0, rec_cb, &recs[2]));
    rc = plx_vdi_submit_snapshot(v, "second", &i2, rec_cb, &recs[3]);
    ck_assert_msg(rc == 0, "labelled snapshot submitted while another is in flight: %d (%s)", rc,
                  plx_store_errmsg(st));
    drain_all(st, recs, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    ck_assert_uint_eq(i1, 1);
    ck_assert_uint_eq(i2, 2);
    close_vdi(st, v);
    v = open_vdi(st, "t@1", 0);
    expect_bytes(st, v, a, 0, BS, "first snapshot");
    close_vdi(st, v);
    v = open_vdi(st, "t@second", 0);
    expect_bytes(st, v, b, 0, BS, "second snapshot");
    close_vdi(st, v);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* A snapshot whose batch has no commit nodes flies beside an older batch: one flush before its
 * record makes the older batch's commit nodes and its own stage-A writes (the root copy, the log
 * block) durable at once. It used to flush after its stage A too, one more flush on the path of
 * every such snapshot on a busy disk (issue 16): 3 flushes here where 2 do. */
START_TEST(test_snapshot_beside_batch_one_flush)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "o", 4 * MiB);
    plx_vdi *v = open_vdi(st, "o", 0);
    unsigned char *a = plx_block_alloc(1), *b = plx_block_alloc(1);
    pattern(a, BS, 1, 0);
    pwrite_ok(st, v, a, 0, BS); /* the leaf exists: the next write makes it a commit node */
    OK(st, plx_vdi_flush(v));
    int in_submit = 0;
    struct cb_rec recs[2];
    for (int i = 0; i < 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    uint64_t idx = 0;
    pattern(b, BS, 2, 1);
    unsigned long flushes0 = tu_flushes;
    tu_hold_next_write();
    OK(st, plx_vdi_submit_write(v, b, BS, BS, 0, rec_cb, &recs[0])); /* batch 1, flying */
    ck_assert_uint_eq(tu_held(), 1);
    OK(st, plx_vdi_submit_snapshot(v, NULL, &idx, rec_cb, &recs[1])); /* batch 2: the snapshot */
    for (int i = 0; i < 20; i++)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(recs[1].fired, 0);
    tu_release_held();
    drain_all(st, recs, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    unsigned long flushes = tu_flushes - flushes0;
    ck_assert_msg(flushes == 2,
                  "a write's batch and a snapshot's beside it took %lu flushes (1 + 1 expected)",
                  flushes);
    close_vdi(st, v);
    v = open_vdi(st, "o@1", 0);
    expect_bytes(st, v, a, 0, BS, "snapshot block 0");
    expect_bytes(st, v, b, BS, BS, "snapshot block 1 (written just before it)");
    close_vdi(st, v);
    check_clean(st, "snapshot beside a batch");
    close_ok(st);
    plx_block_free(a);
    plx_block_free(b);
    mem->ops->destroy(mem);
}
END_TEST

/* A burst of snapshots with writes between them, submitted while a batch is in flight: they share
 * batches (and their flushes) instead of taking one batch each, cross a snapshot-log block, and
 * each holds exactly the writes submitted before it. */
START_TEST(test_async_snapshot_burst)
{
    enum { NSNAP = 80, NBLK = 8 };
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "b", 2 * MiB);
    plx_vdi *v = open_vdi(st, "b", 0);
    unsigned char *w = plx_block_alloc(NSNAP + 1);
    static struct cb_rec recs[2 * NSNAP + 2];
    static uint64_t idx[NSNAP];
    int in_submit = 0, nr = 0;
    for (int i = 0; i < 2 * NSNAP + 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    unsigned long flushes0 = tu_flushes;
    /* Write g goes to block g % NBLK; every fourth snapshot follows a write, the others follow
     * the previous snapshot with no write between (clean snapshots). */
    pattern(w, BS, 0, 0);
    OK(st, plx_vdi_submit_write(v, w, 0, BS, 0, rec_cb, &recs[nr++]));
    int last_write[NSNAP + 1];
    int g = 0;
    for (int k = 1; k <= NSNAP; k++) {
        if (k % 4 == 1) {
            g++;
            pattern(w + (size_t)g * BS, BS, (uint64_t)g, (uint64_t)(g % NBLK));
            OK(st, plx_vdi_submit_write(v, w + (size_t)g * BS, (uint64_t)(g % NBLK) * BS, BS, 0,
                                        rec_cb, &recs[nr++]));
        }
        last_write[k] = g;
        int rc = plx_vdi_submit_snapshot(v, NULL, &idx[k - 1], rec_cb, &recs[nr++]);
        ck_assert_msg(rc == 0, "snapshot %d: %d (%s)", k, rc, plx_store_errmsg(st));
    }
    drain_all(st, recs, (size_t)nr);
    for (int i = 0; i < nr; i++)
        ck_assert_msg(recs[i].status == 0, "request %d: %d (%s)", i, recs[i].status,
                      plx_store_errmsg(st));
    unsigned long flushes = tu_flushes - flushes0;
    fprintf(stderr, "engine: %d snapshots and %d writes in one burst: %lu flushes\n", NSNAP, g,
            flushes);
    /* One batch per snapshot would flush at least twice per snapshot. */
    ck_assert_msg(flushes <= NSNAP, "%lu flushes for %d snapshots", flushes, NSNAP);
    close_vdi(st, v);
    unsigned char got[BS], want[BS];
    for (int k = 1; k <= NSNAP; k++) {
        ck_assert_uint_eq(idx[k - 1], (uint64_t)k);
        char spec[32];
        snprintf(spec, sizeof spec, "b@%d", k);
        v = open_vdi(st, spec, 0);
        for (int blk = 0; blk < NBLK; blk++) {
            int gen = -1;
            for (int x = 0; x <= last_write[k]; x++)
                if (x % NBLK == blk)
                    gen = x;
            pread_ok(st, v, got, (uint64_t)blk * BS, BS);
            if (gen < 0) {
                memset(want, 0, BS);
            } else {
                pattern(want, BS, (uint64_t)gen, (uint64_t)blk);
            }
            ck_assert_msg(memcmp(got, want, BS) == 0, "snapshot %d block %d: want write %d", k, blk,
                          gen);
        }
        close_vdi(st, v);
    }
    check_clean(st, "snapshot burst");
    close_ok(st);
    plx_block_free(w);
    mem->ops->destroy(mem);
}
END_TEST

/* A label must stay unique even when two snapshots asking for it are in flight together. */
START_TEST(test_async_duplicate_label_in_flight)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "t", MiB);
    plx_vdi *v = open_vdi(st, "t", 0);
    int in_submit = 0;
    struct cb_rec recs[2];
    for (int i = 0; i < 2; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    OK(st, plx_vdi_submit_snapshot(v, "dup", NULL, rec_cb, &recs[0]));
    int rc = plx_vdi_submit_snapshot(v, "dup", NULL, rec_cb, &recs[1]);
    if (rc == 0) {
        drain_all(st, recs, 2);
        rc = recs[1].status;
    } else {
        drain_all(st, recs, 1);
    }
    ck_assert_int_eq(recs[0].status, 0);
    ck_assert_msg(rc == -EEXIST, "second snapshot labelled 'dup': %d, want -EEXIST", rc);
    close_vdi(st, v);
    struct plx_snap_info *list = NULL;
    size_t n = 0;
    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "t", &vi));
    OK(st, plx_snap_list(st, vi.id, &list, &n));
    int with_label = 0;
    for (size_t i = 0; i < n; i++)
        with_label += strcmp(list[i].label, "dup") == 0;
    free(list);
    ck_assert_int_eq(with_label, 1);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* plx_defer_turn: a callback queued from inside a service pass runs in the next pass, not in
 * the one that queued it (the write log's drain steps give the loop back between them), and
 * the queue counts as work (plx_engine_busy). */
struct turn {
    struct plx_deferred now, later;
    plx_store *st;
    int ran_now, ran_later;
};

static void turn_later(struct plx_deferred *d)
{
    struct turn *t = (struct turn *)((char *)d - offsetof(struct turn, later));
    t->ran_later++;
}

static void turn_now(struct plx_deferred *d)
{
    struct turn *t = (struct turn *)((char *)d - offsetof(struct turn, now));
    t->ran_now++;
    t->later.run = turn_later;
    plx_defer_turn(t->st, &t->later);
}

START_TEST(test_defer_turn_runs_in_the_next_pass)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct turn t = {.st = st};
    t.now.run = turn_now;
    plx_defer(st, &t.now);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 1);
    ck_assert_int_eq(t.ran_later, 0);
    ck_assert(plx_engine_busy(st));
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 1);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* plx_store_will_service: work queued before the promised service pass does not make
 * plx_store_fd() readable (a wake-up is two system calls per request); work that only a later
 * pass runs (plx_defer_turn from inside the pass) still does, and so does everything queued
 * without the promise. */
static int fd_readable(plx_store *st)
{
    struct pollfd pfd = {.fd = plx_store_fd(st), .events = POLLIN};
    return poll(&pfd, 1, 0);
}

START_TEST(test_will_service_skips_the_wake)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct turn t = {.st = st};
    t.now.run = turn_now;
    ck_assert_int_eq(fd_readable(st), 0);
    plx_store_will_service(st);
    plx_defer(st, &t.now);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 1);
    /* turn_now queued the next pass's work from inside this one: that needs the wake-up. */
    ck_assert_int_eq(fd_readable(st), 1);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 1);
    ck_assert_int_eq(fd_readable(st), 0);
    /* The promise ended with that pass: a plain defer wakes again. */
    plx_defer(st, &t.now);
    ck_assert_int_eq(fd_readable(st), 1);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_now, 2);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 2);
    ck_assert_int_eq(fd_readable(st), 0);
    /* A turn queued before the promised pass runs in it: no wake-up either. */
    plx_store_will_service(st);
    t.later.run = turn_later;
    plx_defer_turn(st, &t.later);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 1);
    ck_assert_int_eq(t.ran_later, 3);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* Engine timers (plx_timer_arm): a timer makes plx_store_fd() readable when it is due, and
 * the service pass then runs it and leaves the fd quiet; a timer moved later fires at its new
 * time only (the early wake-up finds nothing due and goes quiet); a cancelled one never runs;
 * and a loop that calls plx_store_service without waiting on the fd gets it too. */
struct tick {
    struct plx_timer t;
    int ran;
};

static void tick_run(struct plx_timer *t)
{
    ((struct tick *)((char *)t - offsetof(struct tick, t)))->ran++;
}

START_TEST(test_timer_wakes_the_fd)
{
    plx_backend *mem = new_medium(8 * MiB);
    plx_store *st = open_kept(mem);
    struct tick k = {.t = {.run = tick_run}};
    ck_assert_int_eq(fd_readable(st), 0);
    uint64_t t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 30000000ull);
    ck_assert_int_eq(fd_readable(st), 0);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 0); /* not due */
    struct pollfd pfd = {.fd = plx_store_fd(st), .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
    ck_assert_uint_ge(plx_mono_ns() - t0, 29000000ull);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 1);
    ck_assert_int_eq(fd_readable(st), 0);
    /* Moved later before it was due: the early wake-up runs nothing and goes quiet. */
    t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 20000000ull);
    plx_timer_arm(st, &k.t, t0 + 80000000ull);
    ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, plx_mono_ns() - t0 >= 80000000ull ? 2 : 1);
    if (k.ran == 1) {
        ck_assert_int_eq(fd_readable(st), 0);
        ck_assert_int_eq(poll(&pfd, 1, 2000), 1);
        ck_assert_uint_ge(plx_mono_ns() - t0, 79000000ull);
        ck_assert_int_ge(plx_store_service(st), 0);
        ck_assert_int_eq(k.ran, 2);
    }
    ck_assert_int_eq(fd_readable(st), 0);
    /* Cancelled: never runs, and the fd goes quiet after its wake-up. */
    plx_timer_arm(st, &k.t, plx_mono_ns() + 10000000ull);
    plx_timer_cancel(st, &k.t);
    usleep(20000);
    ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 2);
    ck_assert_int_eq(fd_readable(st), 0);
    /* A service loop that never waits on the fd. */
    t0 = plx_mono_ns();
    plx_timer_arm(st, &k.t, t0 + 10000000ull);
    while (k.ran == 2 && plx_mono_ns() - t0 < 2000000000ull)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_int_eq(k.ran, 3);
    ck_assert(!plx_engine_busy(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(test_async_flush_trim_fua)
{
    plx_backend *mem = new_medium(16 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "f", MiB);
    plx_vdi *v = open_vdi(st, "f", 0);
    unsigned char *a = plx_block_alloc(8);
    tu_fill(a, 8 * BS, 3);
    int in_submit = 0;
    struct cb_rec recs[5];
    for (int i = 0; i < 5; i++)
        recs[i] = (struct cb_rec){.in_submit = &in_submit};
    in_submit = 1;
    OK(st, plx_vdi_submit_write(v, a, 0, 8 * BS, PLX_WRITE_FUA, rec_cb, &recs[0]));
    OK(st, plx_vdi_submit_trim(v, 2 * BS + 1, 3 * BS, rec_cb, &recs[1]));
    OK(st, plx_vdi_submit_flush(v, rec_cb, &recs[2]));
    OK(st, plx_vdi_submit_trim(v, 0, 0, rec_cb, &recs[3]));
    OK(st, plx_vdi_submit_write(v, a, 100, 0, 0, rec_cb, &recs[4]));
    in_submit = 0;
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(recs[i].fired, 0);
    drain_all(st, recs, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_int_eq(recs[i].fired, 1);
        ck_assert_int_eq(recs[i].bad_context, 0);
    }
    memset(a + 2 * BS + 1, 0, 3 * BS);
    expect_bytes(st, v, a, 0, 8 * BS, "after FUA write and trim");
    close_vdi(st, v);
    close_ok(st);
    plx_block_free(a);
    mem->ops->destroy(mem);
}
END_TEST

/* Large writes spanning many extents and the 2048-block I/O split. */
START_TEST(test_large_write)
{
    const uint64_t size = 24 * MiB;
    plx_backend *mem = new_medium(96 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "L", size);
    plx_vdi *v = open_vdi(st, "L", 0);
    unsigned char *ref = malloc(size);
    tu_fill(ref, size, 99);
    pwrite_ok(st, v, ref + 3, 3, 10 * MiB);
    unsigned char *al = plx_block_alloc(size / BS);
    memcpy(al, ref, size);
    pwrite_ok(st, v, al + 10 * MiB, 10 * MiB, 14 * MiB);
    memset(ref, 0, 3);
    memcpy(ref + 10 * MiB, al + 10 * MiB, 14 * MiB);
    expect_bytes(st, v, ref, 0, size, "large writes");
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "L", 0);
    expect_bytes(st, v, ref, 0, size, "large writes after reopen");
    close_vdi(st, v);
    check_clean(st, "large write");
    close_ok(st);
    plx_block_free(al);
    free(ref);
    mem->ops->destroy(mem);
}
END_TEST

/* Persistence through a file blockstore and through a crash image of the fault backend. */
START_TEST(test_reopen_file)
{
    char path[4096], err[256] = "";
    snprintf(path, sizeof(path), "%s/plx-test-engine-%d.img", tu_tmpdir(), (int)getpid());
    unlink(path);
    int rc = plx_format(path, 64 * MiB, MiB, 0, err, sizeof(err));
    ck_assert_msg(rc == 0, "format %s: %d %s", path, rc, err);
    /* A second format refuses without force. */
    ck_assert_int_eq(plx_format(path, 0, MiB, 0, err, sizeof(err)), -EEXIST);
    plx_store *st = NULL;
    rc = plx_store_open(path, NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, err);
    create_vdi(st, "p", 4 * MiB);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *ref = calloc(1, 4 * MiB);
    tu_fill(ref + 5, 700 * KiB, 8);
    pwrite_ok(st, v, ref + 5, 5, 700 * KiB);
    OK(st, plx_vdi_snapshot_open(v, "snap", NULL));
    unsigned char *snap = malloc(4 * MiB);
    memcpy(snap, ref, 4 * MiB);
    tu_fill(ref + MiB, 3 * BS, 9);
    pwrite_ok(st, v, ref + MiB, MiB, 3 * BS);
    OK(st, plx_vdi_flush(v));
    close_vdi(st, v);
    close_ok(st);

    struct plx_open_opts ro = {.struct_size = sizeof(ro), .read_only = 1};
    rc = plx_store_open(path, &ro, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "reopen read-only: %d %s", rc, err);
    EXPECT_ERR(st, plx_vdi_create(st, "x", MiB, NULL), -EROFS);
    EXPECT_ERR(st, plx_vdi_open(st, "p", 0, &v), -EROFS);
    v = open_vdi(st, "p", PLX_OPEN_READONLY);
    expect_bytes(st, v, ref, 0, 4 * MiB, "file: VDI after reopen");
    close_vdi(st, v);
    v = open_vdi(st, "p@snap", 0);
    expect_bytes(st, v, snap, 0, 4 * MiB, "file: snapshot after reopen");
    close_vdi(st, v);
    close_ok(st);
    unlink(path);
    free(ref);
    free(snap);
}
END_TEST

START_TEST(test_reopen_crash_image)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept(fault);
    create_vdi(st, "c", 2 * MiB);
    plx_vdi *v = open_vdi(st, "c", 0);
    unsigned char *ref = calloc(1, 2 * MiB);
    tu_fill(ref + BS, 100 * BS, 21);
    pwrite_ok(st, v, ref + BS, BS, 100 * BS);
    OK(st, plx_vdi_flush(v));
    close_vdi(st, v);
    close_ok(st);

    /* Everything the store did was flushed before close returned: the durable image has it. */
    struct plx_crash_cursor *c = plx_crash_cursor_new(fault);
    plx_crash_cursor_seek(c, plx_fault_log_position(fault));
    ck_assert_uint_eq(plx_crash_cursor_pending(c), 0);
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    plx_crash_cursor_free(c);
    char err[256] = "";
    int rc = plx_store_open_backend(img, NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open crash image: %d %s", rc, err);
    v = open_vdi(st, "c", 0);
    expect_bytes(st, v, ref, 0, 2 * MiB, "crash image");
    close_vdi(st, v);
    close_ok(st);
    free(ref);
    fault->ops->destroy(fault);
}
END_TEST

/* A small node cache must not make requests fail: nodes are evicted and reloaded. */
START_TEST(test_small_cache)
{
    const uint64_t size = 256 * MiB;
    plx_backend *mem = new_medium(256 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "c", size);
    close_ok(st);
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof(o), .cache_bytes = 64 * BS};
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    plx_vdi *v = open_vdi(st, "c", 0);
    unsigned char *buf = malloc(3 * BS);
    /* Touch one block in each of 100 leaves (100+ nodes), then snapshot and rewrite, so every
     * write copies a read-only path through a cache too small to hold the tree. */
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 100; i++) {
            uint64_t off = i * 512 * BS + (uint64_t)round * BS + 100;
            pattern(buf, 2 * BS, (uint64_t)round, i);
            rc = plx_vdi_pwrite(v, buf, off, 2 * BS, 0);
            ck_assert_msg(rc == 0, "round %d write %llu: %d (%s)", round, (unsigned long long)i, rc,
                          plx_store_errmsg(st));
        }
        OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    }
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 100; i++) {
            uint64_t off = i * 512 * BS + (uint64_t)round * BS + 100;
            pattern(buf, 2 * BS, (uint64_t)round, i);
            if (round < 2) /* later rounds overwrite the first 100 bytes after it */
                expect_bytes(st, v, buf, off, BS - 100, "small cache");
            else
                expect_bytes(st, v, buf, off, 2 * BS, "small cache");
        }
    }
    close_vdi(st, v);
    check_clean(st, "small cache");
    close_ok(st);
    free(buf);
    mem->ops->destroy(mem);
}
END_TEST

/* Writes after a collection that found nothing to free (or something) must commit normally. */
START_TEST(test_write_after_gc)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    /* A VDI whose blocks become garbage, then one whose data fills later extents: the
     * collector frees blocks in some extents and none in others. */
    create_vdi(st, "x", 4 * MiB);
    create_vdi(st, "g", 4 * MiB);
    plx_vdi *v = open_vdi(st, "x", 0);
    unsigned char *ref = calloc(1, 4 * MiB);
    tu_fill(ref, 8 * BS, 1);
    pwrite_ok(st, v, ref, 0, 8 * BS);
    close_vdi(st, v);
    v = open_vdi(st, "g", 0);
    tu_fill(ref, 600 * BS, 3);
    pwrite_ok(st, v, ref, 0, 600 * BS);
    close_vdi(st, v);
    OK(st, plx_vdi_delete(st, "x"));
    struct plx_gc_report g;
    OK(st, plx_gc(st, 0, &g));
    ck_assert_uint_gt(g.freed_by_type[PLX_EXTENT_DATA], 0);
    v = open_vdi(st, "g", 0);
    tu_fill(ref + 100 * BS, 8 * BS, 2);
    pwrite_ok(st, v, ref + 100 * BS, 100 * BS, 8 * BS);
    expect_bytes(st, v, ref, 0, 4 * MiB, "after gc and write");
    close_vdi(st, v);
    close_ok(st);
    st = open_kept(mem);
    v = open_vdi(st, "g", 0);
    expect_bytes(st, v, ref, 0, 4 * MiB, "after reopen");
    close_vdi(st, v);
    check_clean(st, "gc");
    close_ok(st);
    free(ref);
    mem->ops->destroy(mem);
}
END_TEST

/* Used metadata blocks, from the allocation bitmaps of a freshly opened store (closing releases
 * blocks claimed but not used). */
static uint64_t metadata_used(plx_store **st, plx_backend *mem)
{
    close_ok(*st);
    *st = open_kept(mem);
    struct plx_store_info info;
    OK(*st, plx_store_info(*st, &info));
    return info.blocks_used_by_type[PLX_EXTENT_METADATA];
}

/* Snapshots with no write between them share the newest snapshot's root and allocate nothing;
 * the first one after a write, and the first one after a reopen, copy the root. Deleting the
 * older of two sharing snapshots and collecting keeps the other intact. */
START_TEST(test_clean_snapshots_share_root)
{
    plx_backend *mem = new_medium(32 * MiB);
    plx_store *st = open_kept(mem);
    create_vdi(st, "vm", 4 * MiB);
    create_vdi(st, "ref", 4 * MiB);
    unsigned char a[BS], b[BS], got[BS];
    pattern(a, BS, 1, 0);
    /* The same write and one snapshot on "ref", then with four more on "vm": the metadata they
     * use (measured with every VDI closed, so nothing is claimed but unused) is the same. */
    uint64_t used0 = metadata_used(&st, mem);
    plx_vdi *v = open_vdi(st, "ref", 0);
    pwrite_ok(st, v, a, 0, BS);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    close_vdi(st, v);
    uint64_t used1 = metadata_used(&st, mem);
    v = open_vdi(st, "vm", 0);
    pwrite_ok(st, v, a, 0, BS);
    OK(st, plx_vdi_snapshot_open(v, "s1", NULL));
    for (int i = 2; i <= 5; i++)
        OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    close_vdi(st, v);
    ck_assert_uint_eq(metadata_used(&st, mem) - used1, used1 - used0);
    v = open_vdi(st, "vm", 0);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL)); /* 6: after a reopen, a root of its own */
    pattern(b, BS, 2, 0);
    pwrite_ok(st, v, b, 0, BS);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL)); /* 7: after a write, a root of its own */
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL)); /* 8: shares 7's */
    close_vdi(st, v);

    struct plx_vdi_info vi;
    OK(st, plx_vdi_lookup(st, "vm", &vi));
    struct plx_snap_info *list = NULL;
    size_t n = 0;
    OK(st, plx_snap_list(st, vi.id, &list, &n));
    ck_assert_uint_eq(n, 8);
    for (int i = 1; i < 5; i++)
        ck_assert_uint_eq(list[i].root, list[0].root);
    ck_assert_uint_ne(list[5].root, list[0].root); /* 6: copied after the reopen, same data */
    ck_assert_uint_ne(list[6].root, list[5].root);
    ck_assert_uint_eq(list[7].root, list[6].root);
    ck_assert_uint_ne(list[7].root, vi.root);
    free(list);

    /* Delete 1..4 (the root stays reached from 5), collect, read 5 back. */
    for (int i = 1; i <= 4; i++) {
        char spec[16];
        snprintf(spec, sizeof spec, "vm@%d", i);
        OK(st, plx_snap_delete(st, spec));
    }
    struct plx_gc_report g;
    OK(st, plx_gc(st, 0, &g));
    check_clean(st, "clean snapshots after gc");
    const char *specs[] = {"vm@5", "vm@6", "vm@7", "vm@8", "vm"};
    const unsigned char *want[] = {a, a, b, b, b};
    for (int i = 0; i < 5; i++) {
        v = open_vdi(st, specs[i], 0);
        pread_ok(st, v, got, 0, BS);
        ck_assert_msg(memcmp(got, want[i], BS) == 0, "%s block 0", specs[i]);
        close_vdi(st, v);
    }
    /* The newest snapshot deleted: the next one must not share its root (gc may free it). */
    v = open_vdi(st, "vm", 0);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL)); /* 9: copies */
    OK(st, plx_vdi_snap_delete(v, 9));
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL)); /* 10: 9 is gone: copies again */
    close_vdi(st, v);
    OK(st, plx_gc(st, 0, &g));
    OK(st, plx_snap_list(st, vi.id, &list, &n));
    ck_assert_uint_eq(n, 10);
    ck_assert_uint_ne(list[9].root, list[8].root);
    free(list);
    v = open_vdi(st, "vm@10", 0);
    pread_ok(st, v, got, 0, BS);
    ck_assert(memcmp(got, b, BS) == 0);
    close_vdi(st, v);
    check_clean(st, "clean snapshots");
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Submit 4 KiB writes to blocks first + perm[i] all at once (pattern gen), and wait for them. */
static void write_blocks_async(plx_store *st, plx_vdi *v, uint64_t first, const unsigned *perm,
                               unsigned n, uint64_t gen, unsigned char *bufs)
{
    static struct cb_rec recs[PLX_RADIX_FANOUT];
    int in_submit = 0;
    ck_assert_uint_le(n, PLX_RADIX_FANOUT);
    for (unsigned i = 0; i < n; i++) {
        uint64_t blk = first + perm[i];
        pattern(bufs + (size_t)perm[i] * BS, BS, gen, blk);
        recs[i] = (struct cb_rec){.in_submit = &in_submit, .id = (int)i};
        OK(st,
           plx_vdi_submit_write(v, bufs + (size_t)perm[i] * BS, blk * BS, BS, 0, rec_cb, &recs[i]));
    }
    drain_all(st, recs, (int)n);
    for (unsigned i = 0; i < n; i++)
        ck_assert_int_eq(recs[i].status, 0);
}

/* Read len blocks at first in one request; return how many backend reads it took. */
static unsigned long read_requests(plx_store *st, plx_vdi *v, uint64_t first, unsigned len,
                                   const unsigned char *want)
{
    unsigned char *buf = plx_block_alloc(len);
    unsigned long before = tu_reads;
    OK(st, plx_vdi_pread(v, buf, first * BS, (size_t)len * BS));
    unsigned long n = tu_reads - before;
    ck_assert_msg(memcmp(buf, want, (size_t)len * BS) == 0, "read back wrong data");
    plx_block_free(buf);
    return n;
}

/* Data blocks are placed by their leaf: 4 KiB writes to one leaf's range in random order land in
 * one contiguous run on the store, so a sequential read of the range is one backend read; the
 * same after a snapshot, when every write copies on write (figure 5.5's case). */
START_TEST(test_placement_by_leaf)
{
    enum { N = PLX_RADIX_FANOUT };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(64 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 8 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", 16 * MiB);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned perm[N];
    uint64_t rng = 16;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    unsigned char *bufs = plx_block_alloc(N);
    for (int round = 0; round < 3; round++) {
        for (unsigned i = N - 1; i > 0; i--) {
            unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        /* Round 0 on a new VDI, rounds 1 and 2 after a snapshot: copy on write everywhere. */
        if (round) {
            int in_submit = 0;
            struct cb_rec snap = {.in_submit = &in_submit};
            OK(st, plx_vdi_submit_snapshot(v, NULL, NULL, rec_cb, &snap));
            drain_all(st, &snap, 1);
            ck_assert_int_eq(snap.status, 0);
        }
        write_blocks_async(st, v, N, perm, N, 40 + (uint64_t)round, bufs);
        unsigned long reqs = read_requests(st, v, N, N, bufs);
        fprintf(stderr,
                "engine: placement round %d: a 2 MiB read of a leaf written in random "
                "order took %lu backend reads\n",
                round, reqs);
        ck_assert_msg(reqs == 1, "round %d: %lu backend reads for one leaf's blocks", round, reqs);
    }
    close_vdi(st, v);
    check_clean(st, "after placement");
    plx_block_free(bufs);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Backend reads for a 2 MiB read of one leaf written in random 4 KiB writes, on a store opened
 * with opts (NULL: none). */
static unsigned long random_leaf_read_reqs(const struct plx_open_opts *opts)
{
    enum { N = PLX_RADIX_FANOUT };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(64 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 8 * MiB, err, sizeof err), 0);
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), opts, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    create_vdi(st, "p", 16 * MiB);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned perm[N];
    uint64_t rng = 17;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    unsigned char *bufs = plx_block_alloc(N);
    write_blocks_async(st, v, N, perm, N, 43, bufs);
    unsigned long reqs = read_requests(st, v, N, N, bufs);
    close_vdi(st, v);
    check_clean(st, "after the random leaf");
    plx_block_free(bufs);
    close_ok(st);
    mem->ops->destroy(mem);
    return reqs;
}

/* Placement by leaf is the default (issue 16): a store opened without options, with zeroed
 * options or with 1 (PLX_PLACEMENT_LEAF before API 1.3) reads a leaf written in random order
 * back in one backend read; only PLX_PLACEMENT_ARRIVAL places blocks in arrival order. */
START_TEST(test_placement_default_is_leaf)
{
    struct plx_open_opts zero = {.struct_size = sizeof zero};
    struct plx_open_opts old_leaf = {.struct_size = sizeof old_leaf, .placement = 1};
    struct plx_open_opts arrival = {.struct_size = sizeof arrival,
                                    .placement = PLX_PLACEMENT_ARRIVAL};
    unsigned long none = random_leaf_read_reqs(NULL), z = random_leaf_read_reqs(&zero),
                  one = random_leaf_read_reqs(&old_leaf), arr = random_leaf_read_reqs(&arrival);
    fprintf(stderr,
            "engine: placement: backend reads for a leaf written in random order: no options "
            "%lu, zeroed %lu, 1 %lu, arrival %lu\n",
            none, z, one, arr);
    ck_assert_uint_eq(PLX_PLACEMENT_LEAF, 0);
    ck_assert_uint_eq(none, 1);
    ck_assert_uint_eq(z, 1);
    ck_assert_uint_eq(one, 1);
    ck_assert_msg(arr > 100, "arrival order: %lu backend reads (blocks in write order)", arr);
}
END_TEST

/* The depth benchmark's history on a small scale: a disk written sequentially, a snapshot, then
 * every block rewritten in random order (each write copies on write). The held extents fill up
 * on the way; the leaves' copies still get slots of their own (a new extent) instead of blocks
 * scattered over each other's slots, so 1 MiB reads of the result take at most two backend
 * reads each (a slot may share its first block with an extent's bitmap). */
START_TEST(test_placement_after_snapshot_rewrite)
{
    enum { LEAVES = 8, N = LEAVES * PLX_RADIX_FANOUT, CHUNK = 256 };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(96 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 4 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 60, i);
    OK(st, plx_vdi_pwrite(v, want, 0, (size_t)N * BS, 0));
    int in_submit = 0;
    struct cb_rec snap = {.in_submit = &in_submit};
    OK(st, plx_vdi_submit_snapshot(v, NULL, NULL, rec_cb, &snap));
    drain_all(st, &snap, 1);
    static unsigned perm[N];
    uint64_t rng = 61;
    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)(tu_rand(&rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (unsigned k = 0; k < N; k += PLX_RADIX_FANOUT)
        write_blocks_async(st, v, 0, perm + k, PLX_RADIX_FANOUT, 62, want);
    unsigned long total = 0;
    for (unsigned b = 0; b < N; b += CHUNK)
        total += read_requests(st, v, b, CHUNK, want + (size_t)b * BS);
    fprintf(stderr,
            "engine: placement: %u 1 MiB reads after a random rewrite took %lu backend "
            "reads\n",
            N / CHUNK, total);
    ck_assert_msg(total <= 2 * (N / CHUNK), "%lu backend reads for %u 1 MiB reads", total,
                  N / CHUNK);
    close_vdi(st, v);
    check_clean(st, "after the rewrite");
    plx_block_free(want);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* The suite's depth section on a small scale (bench/suite/run.sh, section_depth): a disk written
 * sequentially; then, per depth, snapshots each followed by four random 4 KiB writes (copies on
 * write that leave their leaf's slot: about 0.7 per leaf at depth 100 and 7 at depth 1000, as on
 * the suite's 1 GiB disk), 1 MiB reads of the whole disk, random 4 KiB writes over about half of it
 * and 1 MiB writes over all of it (which copy every leaf into a slot of its own again). A 1 MiB
 * read spanning out-of-place blocks takes one backend read over its run, stale blocks and all,
 * and one per stray block (read merging); it used to take one per piece of the run as well. */
static void write_random_blocks(plx_store *st, plx_vdi *v, unsigned n, uint64_t gen,
                                unsigned char *want, unsigned count, uint64_t *rng)
{
    for (unsigned k = 0; k < count; k++) {
        uint64_t b = tu_rand(rng) % n;
        pattern(want + b * BS, BS, gen + k, b);
        OK(st, plx_vdi_pwrite(v, want + b * BS, b * BS, BS, 0));
    }
}

START_TEST(test_read_merge_depth_history)
{
    enum { LEAVES = 32, N = LEAVES * PLX_RADIX_FANOUT, CHUNK = 256, WRITES = 4 };
    static const unsigned depths[] = {1, 10, 100, 1000};
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(1024 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 16 * MiB, err, sizeof err), 0);
    plx_store *st = open_kept_by_leaf(mem);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 70, i);
    for (unsigned b = 0; b < N; b += CHUNK)
        OK(st, plx_vdi_pwrite(v, want + (size_t)b * BS, (uint64_t)b * BS, (size_t)CHUNK * BS, 0));
    uint64_t rng = 71, gen = 1000;
    unsigned prev = 0;
    for (size_t di = 0; di < sizeof depths / sizeof depths[0]; di++) {
        /* The suite's 1 GiB disk has 512 leaves: as many stray blocks per leaf here. */
        unsigned snaps = (depths[di] - prev) * LEAVES / 512;
        snaps = snaps ? snaps : 1;
        prev = depths[di];
        for (unsigned k = 0; k < snaps; k++) {
            OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
            write_random_blocks(st, v, N, gen, want, WRITES, &rng);
            gen += 100;
        }
        unsigned long rb0 = tu_read_blocks, total = 0;
        for (unsigned b = 0; b < N; b += CHUNK)
            total += read_requests(st, v, b, CHUNK, want + (size_t)b * BS);
        fprintf(stderr,
                "engine: depth %u (%u snapshots, %u stray writes): %.2f backend reads and %.1f "
                "blocks per 1 MiB read\n",
                depths[di], snaps, snaps * WRITES, (double)total / (N / CHUNK),
                (double)(tu_read_blocks - rb0) / (N / CHUNK));
        /* One read per 1 MiB and one per block out of place at most: the strays, and the
         * first block of a slot that starts an extent (its bitmap's place; at most one leaf
         * in four here). Without merging every stray inside a run cost another read for the
         * rest of the run: 1.25 / 1.69 / 8.38 reads per 1 MiB read at depth 10 / 100 / 1000
         * where this is 1.19 / 1.38 / 4.47. */
        ck_assert_msg(total <= N / CHUNK + snaps * WRITES + LEAVES / 4,
                      "depth %u: %lu backend reads for %u 1 MiB reads and %u stray blocks",
                      depths[di], total, N / CHUNK, snaps * WRITES);
        write_random_blocks(st, v, N, gen, want, N * 3 / 4, &rng);
        gen += N;
        for (unsigned b = 0; b < N; b += CHUNK) {
            for (unsigned i = b; i < b + CHUNK; i++)
                pattern(want + (size_t)i * BS, BS, gen, i);
            OK(st,
               plx_vdi_pwrite(v, want + (size_t)b * BS, (uint64_t)b * BS, (size_t)CHUNK * BS, 0));
        }
        gen += N;
    }
    close_vdi(st, v);
    check_clean(st, "after the history");
    plx_block_free(want);
    close_ok(st);
    mem->ops->destroy(mem);
}
END_TEST

/* Carry out a read plan on a pretend store whose block b holds the number b: every request block
 * must end up holding its own store block (0 for a hole), direct reads must not overlap, and the
 * plan must never take more reads than the request has runs. Returns the number of reads. */
static size_t run_read_plan(const uint64_t *phys, uint64_t n, size_t runs)
{
    struct plx_read_plan *p = plx_read_plan_make(phys, n, PLX_READ_MERGE_GAP);
    ck_assert_ptr_nonnull(p);
    uint64_t *out = calloc(n, sizeof *out), *scratch = calloc(p->scratch_blocks + 1, sizeof *out);
    unsigned char *hit = calloc(n, 1);
    ck_assert(out && scratch && hit);
    for (uint64_t i = 0; i < n; i++)
        out[i] = 0xdeadull; /* what the buffer held before */
    for (size_t k = 0; k < p->nios; k++) {
        const struct plx_read_io *io = &p->ios[k];
        ck_assert_uint_ge(io->nblocks, 1);
        ck_assert_uint_le(io->nblocks, PLX_READ_MAX_IO);
        for (uint32_t j = 0; j < io->nblocks; j++) {
            if (io->direct) {
                ck_assert_uint_lt(io->first + j, n);
                ck_assert_msg(!hit[io->first + j], "direct reads overlap at %llu",
                              (unsigned long long)(io->first + j));
                hit[io->first + j] = 1;
                out[io->first + j] = io->block + j;
            } else {
                ck_assert_uint_lt(io->scratch + j, p->scratch_blocks);
                scratch[io->scratch + j] = io->block + j;
            }
        }
    }
    for (size_t k = 0; k < p->nfixes; k++) {
        const struct plx_read_fix *f = &p->fixes[k];
        for (uint64_t j = 0; j < f->n; j++)
            out[f->dst + j] = f->zero ? 0 : scratch[f->src + j];
    }
    for (uint64_t i = 0; i < n; i++)
        ck_assert_msg(out[i] == phys[i], "block %llu: got store block %llu, wants %llu",
                      (unsigned long long)i, (unsigned long long)out[i],
                      (unsigned long long)phys[i]);
    ck_assert_uint_le(p->nios, runs);
    size_t nios = p->nios;
    free(out);
    free(scratch);
    free(hit);
    plx_read_plan_free(p);
    return nios;
}

/* Read merging's plans (read_plan.c): a run with stray blocks and holes in it is one read plus
 * one per stray; strays near each other on the store share a read; random layouts deliver
 * every block. */
START_TEST(test_read_plan)
{
    /* Runs at offset 100 with a stray (store 500) and holes between them; a run elsewhere;
     * a block right after it at another offset; two strays close together on the store. */
    static const uint64_t a[] = {100, 101, 0, 500, 104, 105, 0, 0, 108, 900, 901, 903, 112, 505};
    ck_assert_uint_eq(run_read_plan(a, sizeof a / sizeof a[0], 8), 4);
    /* One long run: one read per 2048 blocks. */
    enum { LONG = 5000 };
    static uint64_t l[LONG];
    for (unsigned i = 0; i < LONG; i++)
        l[i] = 7000 + i;
    ck_assert_uint_eq(run_read_plan(l, LONG, 3), 3);
    /* Two slots interleaved block by block (a leaf half rewritten after a snapshot): two reads. */
    static uint64_t m[256];
    uint64_t rng = 5;
    for (unsigned i = 0; i < 256; i++)
        m[i] = (tu_rand(&rng) & 1 ? 20000 : 40000) + i;
    ck_assert_uint_eq(run_read_plan(m, 256, 256), 2);
    /* Random layouts. */
    static uint64_t r[700];
    for (int round = 0; round < 300; round++) {
        uint64_t base = 1000 + tu_rand(&rng) % 5000;
        size_t runs = 0;
        unsigned n = 1 + (unsigned)(tu_rand(&rng) % 700);
        for (unsigned i = 0; i < n; i++) {
            unsigned what = (unsigned)(tu_rand(&rng) % 16);
            if (what == 0)
                r[i] = 0;
            else if (what == 1)
                r[i] = 1000 + tu_rand(&rng) % 9000;
            else if (what == 2)
                r[i] = base + i + 20 + tu_rand(&rng) % 40;
            else
                r[i] = base + i;
            runs += r[i] && (i == 0 || r[i] != r[i - 1] + 1);
        }
        run_read_plan(r, n, runs);
    }
}
END_TEST

/* The store block holding what pattern(gen, blk) wrote (the medium scanned; 0 when none). */
static uint64_t find_block(plx_backend *be, uint64_t gen, uint64_t blk)
{
    unsigned char *want = plx_block_alloc(1), *got = plx_block_alloc(1);
    uint64_t found = 0;
    pattern(want, BS, gen, blk);
    for (uint64_t b = 1; b < be->nblocks && !found; b++) {
        ck_assert_int_eq(tu_io(be, PLX_IO_READ, b, 1, got, 0), 0);
        if (memcmp(got, want, BS) == 0)
            found = b;
    }
    plx_block_free(want);
    plx_block_free(got);
    return found;
}

/* A merged read reads stale blocks it does not need; a medium error in one of them must not
 * fail the request: it is read again, only its own blocks. An error in a block it needs still
 * fails it. */
START_TEST(test_read_merge_bad_stale_block)
{
    enum { N = PLX_RADIX_FANOUT, STRAY = 100 };
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(16 * MiB / BS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 4 * MiB, err, sizeof err), 0);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_kept_by_leaf(fault);
    create_vdi(st, "p", (uint64_t)N * BS);
    plx_vdi *v = open_vdi(st, "p", 0);
    unsigned char *want = plx_block_alloc(N), *got = plx_block_alloc(N);
    for (unsigned i = 0; i < N; i++)
        pattern(want + (size_t)i * BS, BS, 80, i);
    pwrite_ok(st, v, want, 0, (size_t)N * BS);
    OK(st, plx_vdi_snapshot_open(v, NULL, NULL));
    pattern(want + (size_t)STRAY * BS, BS, 81, STRAY);
    pwrite_ok(st, v, want + (size_t)STRAY * BS, (uint64_t)STRAY * BS, BS);
    uint64_t stale = find_block(fault, 80, STRAY), stray = find_block(fault, 81, STRAY);
    ck_assert_uint_ne(stale, 0);
    ck_assert_uint_ne(stray, 0);

    unsigned long r0 = tu_reads;
    OK(st, plx_vdi_pread(v, got, 0, (size_t)N * BS));
    ck_assert_msg(memcmp(got, want, (size_t)N * BS) == 0, "read back wrong data");
    ck_assert_uint_eq(tu_reads - r0, 2); /* the run, stale block and all, and the stray */

    plx_fault_fail_blocks(fault, PLX_IO_READ, stale, 1, -EIO, -1);
    uint64_t e0 = plx_fault_errors_injected(fault);
    r0 = tu_reads;
    memset(got, 0, (size_t)N * BS);
    OK(st, plx_vdi_pread(v, got, 0, (size_t)N * BS));
    ck_assert_msg(memcmp(got, want, (size_t)N * BS) == 0, "read back wrong data after a retry");
    ck_assert_uint_eq(plx_fault_errors_injected(fault) - e0, 1);
    ck_assert_uint_eq(tu_reads - r0, 2 + 3); /* then the two pieces of the run and the stray */

    plx_fault_clear(fault);
    plx_fault_fail_blocks(fault, PLX_IO_READ, stray, 1, -EIO, -1);
    int rc = plx_vdi_pread(v, got, 0, (size_t)N * BS);
    ck_assert_int_lt(rc, 0);
    plx_fault_clear(fault);
    close_vdi(st, v);
    plx_block_free(want);
    plx_block_free(got);
    close_ok(st);
    fault->ops->destroy(fault);
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_format_open_info);
    tcase_add_test(tc, test_format_refuses);
    tcase_add_test(tc, test_open_bad_magic);
    tcase_add_test(tc, test_open_bad_checksum);
    tcase_add_test(tc, test_crc32c);
    tcase_add_test(tc, test_crc32c_reseed);
    tcase_add_test(tc, test_size_parse);
    tcase_add_test(tc, test_open_wrong_version);
    tcase_add_test(tc, test_open_truncated);
    tcase_add_test(tc, test_reopen_file);
    tcase_add_test(tc, test_reopen_crash_image);
    suite_add_tcase(s, tc);

    tc = tcase_create("admin");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_vdi_create_rules);
    tcase_add_test(tc, test_snapshot_names);
    tcase_add_test(tc, test_many_snapshots);
    tcase_add_test(tc, test_clean_snapshots_share_root);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_single_writer);
    tcase_add_test(tc, test_clone);
    tcase_add_test(tc, test_clone_height4);
    suite_add_tcase(s, tc);

    tc = tcase_create("io");
    tcase_set_timeout(tc, 60);
    tu_no_reclaim_poll(tc); /* the placement tests count the reads reaching the medium */
    tcase_add_test(tc, test_sparse_reads_zero);
    tcase_add_test(tc, test_unaligned_io);
    tcase_add_test(tc, test_range_and_readonly_errors);
    tcase_add_test(tc, test_trim);
    tcase_add_test(tc, test_async_block_status);
    tcase_add_test(tc, test_block_status);
    tcase_add_test(tc, test_large_write);
    tcase_add_test(tc, test_small_cache);
    tcase_add_test(tc, test_write_after_gc);
    tcase_add_test(tc, test_placement_by_leaf);
    tcase_add_test(tc, test_placement_after_snapshot_rewrite);
    tcase_add_test(tc, test_read_merge_depth_history);
    tcase_add_test(tc, test_read_plan);
    tcase_add_test(tc, test_read_merge_bad_stale_block);
    tcase_add_test(tc, test_placement_default_is_leaf);
    suite_add_tcase(s, tc);

    tc = tcase_create("async");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_async_many_in_flight);
    tcase_add_test(tc, test_async_same_block_order);
    tcase_add_test(tc, test_async_mixed_ranges_order);
    tcase_add_test(tc, test_async_snapshot_between_batches);
    tcase_add_test(tc, test_snapshot_does_not_drain);
    tcase_add_test(tc, test_snapshot_fold_does_not_block);
    tcase_add_test(tc, test_urgent_only_with_a_waiter);
    tcase_add_test(tc, test_snapshot_beside_batch_one_flush);
    tcase_add_test(tc, test_async_two_snapshots);
    tcase_add_test(tc, test_async_snapshot_burst);
    tcase_add_test(tc, test_async_duplicate_label_in_flight);
    tcase_add_test(tc, test_async_flush_trim_fua);
    tcase_add_test(tc, test_defer_turn_runs_in_the_next_pass);
    tcase_add_test(tc, test_will_service_skips_the_wake);
    tcase_add_test(tc, test_timer_wakes_the_fd);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(engine_suite)
