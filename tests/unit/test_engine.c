/*
 * test_engine.c - the engine's behaviour through the public API (parallax.h), on memory media:
 * formatting and opening, persistence across a reopen, VDI administration, snapshots and
 * clones. Beside it: test_engine_io.c (byte-granular I/O, trim, block status, placement, read
 * merging) and test_engine_async.c (the asynchronous interface); engine_fixture.c holds the
 * helpers the three share.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_fault.h"
#include "format.h"
#include "size.h" /* plx_size_parse */
#include "engine_fixture.h"
#include "testutil.h"

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
    return s;
}

TU_MAIN(engine_suite)
