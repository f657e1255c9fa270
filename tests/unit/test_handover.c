/*
 * test_handover.c - a VDI handed back and forth between two engines on one blockstore.
 *
 * Two stores opened on the same medium with different host identities stand for two processes
 * (two `parallax serve`, serve and tapdisk, or two hosts). Each keeps its own node cache. When
 * the VDI moves, the engine that held it before must not trust the writable radix nodes it
 * cached, because the other engine may have changed them in place (docs/DESIGN.md, "VDI
 * handover"). A byte model checks every byte read through either engine; the store is checked
 * clean, with no leaked block, at the end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallax.h"
#include "testutil.h"

#define MIB (1024ull * 1024)
#define VDI_BYTES (8 * MIB)

struct two {
    plx_backend *mem;
    plx_store *st[2];
};

static void two_open(struct two *t, uint64_t store_bytes, uint64_t extent)
{
    char err[256] = "";
    t->mem = plx_backend_mem_create(store_bytes / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(t->mem);
    ck_assert_int_eq(plx_format_backend(t->mem, extent, err, sizeof err), 0);
    static const char *const hosts[2] = {"host-a", "host-b"};
    for (int i = 0; i < 2; i++) {
        struct plx_open_opts o = {.struct_size = sizeof o, .host = hosts[i]};
        int rc = plx_store_open_backend(tu_keep_wrap(t->mem), &o, &t->st[i], err, sizeof err);
        ck_assert_msg(rc == 0, "open %s: %s", hosts[i], err);
    }
}

static void two_close_and_check(struct two *t)
{
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(plx_store_close(t->st[i]), 0);
    char err[256] = "";
    plx_store *st;
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1};
    ck_assert_int_eq(plx_store_open_backend(tu_keep_wrap(t->mem), &o, &st, err, sizeof err), 0);
    struct plx_check_report rep;
    ck_assert_int_eq(plx_check(st, &rep, NULL, NULL), 0);
    ck_assert_msg(rep.errors == 0, "check: %llu errors", (unsigned long long)rep.errors);
    ck_assert_msg(rep.leaked_blocks == 0, "check: %llu leaked blocks",
                  (unsigned long long)rep.leaked_blocks);
    ck_assert_int_eq(plx_store_close(st), 0);
    t->mem->ops->destroy(t->mem);
}

static void compare(plx_vdi *v, const uint8_t *model, uint64_t off, size_t len, int round)
{
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(plx_vdi_pread(v, buf, off, len), 0);
    for (size_t i = 0; i < len; i++)
        if (buf[i] != model[off + i])
            ck_abort_msg("round %d: byte %llu reads 0x%02x, the model says 0x%02x", round,
                         (unsigned long long)(off + i), buf[i], model[off + i]);
    free(buf);
}

/* The reproduction: engine A writes and closes, engine B writes (new blocks and an
 * overwrite) and closes, engine A reads and writes again. */
START_TEST(test_handover_simple)
{
    struct two t;
    two_open(&t, 256 * MIB, 16 * MIB);
    ck_assert_int_eq(plx_vdi_create(t.st[0], "vm", VDI_BYTES, NULL), 0);
    uint8_t *blk = plx_block_alloc(1);
    plx_vdi *v;

    memset(blk, 'a', PLX_BLOCK_SIZE);
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_pwrite(v, blk, 0, PLX_BLOCK_SIZE, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);

    memset(blk, 'b', PLX_BLOCK_SIZE);
    ck_assert_int_eq(plx_vdi_open(t.st[1], "vm", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_pwrite(v, blk, 0, PLX_BLOCK_SIZE, 0), 0);              /* overwrite */
    ck_assert_int_eq(plx_vdi_pwrite(v, blk, 3 * MIB, PLX_BLOCK_SIZE, 0), 0);        /* new block */
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);

    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, blk, 0, PLX_BLOCK_SIZE), 0);
    ck_assert_msg(blk[0] == 'b', "engine A reads its own stale block 0 ('%c')", blk[0]);
    ck_assert_int_eq(plx_vdi_pread(v, blk, 3 * MIB, PLX_BLOCK_SIZE), 0);
    ck_assert_msg(blk[0] == 'b', "engine A misses engine B's new block ('%c')", blk[0]);
    memset(blk, 'c', PLX_BLOCK_SIZE);
    ck_assert_int_eq(plx_vdi_pwrite(v, blk, 4096 * 7, PLX_BLOCK_SIZE, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);

    ck_assert_int_eq(plx_vdi_open(t.st[1], "vm", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, blk, 3 * MIB, PLX_BLOCK_SIZE), 0);
    ck_assert_msg(blk[0] == 'b', "engine A's write lost engine B's new block ('%c')", blk[0]);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    plx_block_free(blk);
    two_close_and_check(&t);
}
END_TEST

static char read_byte(plx_store *st, const char *spec, uint64_t off)
{
    plx_vdi *v;
    uint8_t *blk = plx_block_alloc(1);
    int rc = plx_vdi_open(st, spec, PLX_OPEN_READONLY, &v);
    ck_assert_msg(rc == 0, "open %s: %s", spec, plx_store_errmsg(st));
    ck_assert_int_eq(plx_vdi_pread(v, blk, off, PLX_BLOCK_SIZE), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    char c = (char)blk[0];
    plx_block_free(blk);
    return c;
}

static void write_block(plx_vdi *v, uint64_t off, char c)
{
    uint8_t *blk = plx_block_alloc(1);
    memset(blk, c, PLX_BLOCK_SIZE);
    ck_assert_int_eq(plx_vdi_pwrite(v, blk, off, PLX_BLOCK_SIZE, 0), 0);
    plx_block_free(blk);
}

/* Nodes engine A cached while it wrote the VDI are changed in place by engine B, which then
 * snapshots and clones the VDI: A reaches the same nodes through the snapshot and the clone
 * (as immutable nodes) and must read B's version of them. */
START_TEST(test_handover_through_snapshot)
{
    struct two t;
    two_open(&t, 256 * MIB, 16 * MIB);
    ck_assert_int_eq(plx_vdi_create(t.st[0], "vm", VDI_BYTES, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &v), 0);
    write_block(v, 0, 'a');
    ck_assert_int_eq(plx_vdi_close(v), 0);

    ck_assert_int_eq(plx_vdi_open(t.st[1], "vm", 0, &v), 0);
    write_block(v, 0, 'b');
    write_block(v, 5 * PLX_BLOCK_SIZE, 'b');
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "s", NULL), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_vdi_clone(t.st[1], "c", "vm@s", NULL), 0);

    ck_assert_int_eq(read_byte(t.st[0], "vm@s", 5 * PLX_BLOCK_SIZE), 'b');
    ck_assert_int_eq(read_byte(t.st[0], "c", 5 * PLX_BLOCK_SIZE), 'b');
    ck_assert_int_eq(read_byte(t.st[0], "c", 0), 'b');
    two_close_and_check(&t);
}
END_TEST

/* Engine B reads the VDI while engine A writes it; once A lets go, B writes it: B must not
 * trust what it cached while A was writing. */
START_TEST(test_handover_reader_then_writer)
{
    struct two t;
    two_open(&t, 256 * MIB, 16 * MIB);
    ck_assert_int_eq(plx_vdi_create(t.st[0], "vm", VDI_BYTES, NULL), 0);
    plx_vdi *va, *vb;
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &va), 0);
    write_block(va, 0, 'a');
    ck_assert_int_eq(plx_vdi_flush(va), 0);
    ck_assert_int_eq(read_byte(t.st[1], "vm", 0), 'a');
    write_block(va, 9 * PLX_BLOCK_SIZE, 'a');
    ck_assert_int_eq(plx_vdi_close(va), 0);

    ck_assert_int_eq(plx_vdi_open(t.st[1], "vm", 0, &vb), 0);
    write_block(vb, 10 * PLX_BLOCK_SIZE, 'b');
    ck_assert_int_eq(plx_vdi_close(vb), 0);
    ck_assert_int_eq(read_byte(t.st[0], "vm", 9 * PLX_BLOCK_SIZE), 'a');
    ck_assert_int_eq(read_byte(t.st[0], "vm", 10 * PLX_BLOCK_SIZE), 'b');
    ck_assert_int_eq(read_byte(t.st[1], "vm", 9 * PLX_BLOCK_SIZE), 'a');
    two_close_and_check(&t);
}
END_TEST

/* A handle this process keeps open read-only, after another process wrote the VDI, stops a
 * writer here from trusting its nodes: the open for writing is refused with a reason. */
START_TEST(test_handover_refuses_stale_reader)
{
    struct two t;
    two_open(&t, 256 * MIB, 16 * MIB);
    ck_assert_int_eq(plx_vdi_create(t.st[0], "vm", VDI_BYTES, NULL), 0);
    plx_vdi *ra, *vb, *wa;
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", PLX_OPEN_READONLY, &ra), 0);
    ck_assert_int_eq(plx_vdi_open(t.st[1], "vm", 0, &vb), 0);
    write_block(vb, 0, 'b');
    ck_assert_int_eq(plx_vdi_close(vb), 0);
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &wa), -EBUSY);
    ck_assert_ptr_nonnull(strstr(plx_store_errmsg(t.st[0]), "close it"));
    ck_assert_int_eq(plx_vdi_close(ra), 0);
    ck_assert_int_eq(plx_vdi_open(t.st[0], "vm", 0, &wa), 0);
    ck_assert_int_eq(plx_vdi_close(wa), 0);
    ck_assert_int_eq(read_byte(t.st[0], "vm", 0), 'b');
    two_close_and_check(&t);
}
END_TEST

/* Many handovers under a byte model: random writes (aligned and not), trims and snapshots on
 * each side; after each move the new engine reads everything back first. */
START_TEST(test_handover_model)
{
    struct two t;
    two_open(&t, 256 * MIB, 16 * MIB);
    ck_assert_int_eq(plx_vdi_create(t.st[0], "vm", VDI_BYTES, NULL), 0);
    uint8_t *model = calloc(1, VDI_BYTES);
    uint8_t *buf = malloc(256 * 1024);
    ck_assert_ptr_nonnull(model);
    ck_assert_ptr_nonnull(buf);
    uint64_t rng = 0x5eedull + (uint64_t)_i;
    int rounds = tu_quick() ? 30 : 100;
    for (int round = 0; round < rounds; round++) {
        plx_vdi *v;
        int rc = plx_vdi_open(t.st[round % 2], "vm", 0, &v);
        ck_assert_msg(rc == 0, "round %d: open: %s", round, plx_store_errmsg(t.st[round % 2]));
        compare(v, model, 0, VDI_BYTES, round);
        int ops = 5 + (int)(tu_rand(&rng) % 40);
        for (int op = 0; op < ops; op++) {
            uint64_t kind = tu_rand(&rng) % 100;
            /* Writes cluster in the first 2 MiB (overwrites) but reach the whole disk. */
            uint64_t span = tu_rand(&rng) % 4 ? 2 * MIB : VDI_BYTES;
            size_t len = 1 + (size_t)(tu_rand(&rng) % (tu_rand(&rng) % 3 ? 8192 : 65536));
            uint64_t off = tu_rand(&rng) % (span - len);
            if (tu_rand(&rng) % 2) {
                off &= ~(uint64_t)(PLX_BLOCK_SIZE - 1);
                len = (len + PLX_BLOCK_SIZE - 1) & ~(size_t)(PLX_BLOCK_SIZE - 1);
            }
            if (kind < 80) {
                tu_fill(buf, len, tu_rand(&rng));
                ck_assert_int_eq(plx_vdi_pwrite(v, buf, off, len, 0), 0);
                memcpy(model + off, buf, len);
            } else if (kind < 90) {
                ck_assert_int_eq(plx_vdi_trim(v, off, len), 0);
                memset(model + off, 0, len);
            } else if (kind < 95) {
                ck_assert_int_eq(plx_vdi_snapshot_open(v, NULL, NULL), 0);
            } else {
                compare(v, model, off, len, round);
            }
        }
        ck_assert_int_eq(plx_vdi_flush(v), 0);
        ck_assert_int_eq(plx_vdi_close(v), 0);
    }
    /* Both engines read the final state. */
    for (int i = 0; i < 2; i++) {
        plx_vdi *v;
        ck_assert_int_eq(plx_vdi_open(t.st[i], "vm", PLX_OPEN_READONLY, &v), 0);
        compare(v, model, 0, VDI_BYTES, rounds);
        ck_assert_int_eq(plx_vdi_close(v), 0);
    }
    free(model);
    free(buf);
    /* Snapshots taken along the way hold blocks; delete the VDI so check's leak count covers
     * every block the two engines claimed, then collect and check. */
    ck_assert_int_eq(plx_vdi_delete(t.st[0], "vm"), 0);
    struct plx_gc_report gr;
    ck_assert_int_eq(plx_store_close(t.st[1]), 0);
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .host = "host-b"};
    ck_assert_int_eq(plx_store_open_backend(tu_keep_wrap(t.mem), &o, &t.st[1], err, sizeof err),
                     0);
    ck_assert_int_eq(plx_gc(t.st[0], 0, &gr), 0);
    two_close_and_check(&t);
}
END_TEST

static Suite *handover_suite(void)
{
    Suite *s = suite_create("handover");
    TCase *tc = tcase_create("handover");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_handover_simple);
    tcase_add_test(tc, test_handover_through_snapshot);
    tcase_add_test(tc, test_handover_reader_then_writer);
    tcase_add_test(tc, test_handover_refuses_stale_reader);
    tcase_add_loop_test(tc, test_handover_model, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(handover_suite)
