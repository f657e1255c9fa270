/*
 * test_gc_crash.c - the garbage collector (plx_gc) under crashes and I/O errors, against the
 * model of gc_fixture.c (see test_gc.c).
 *
 * group "crash"
 *   crash_gc     a crash at every event-log position of a gc run (durable writes only, all
 *                writes, random subsets): every image opens, check finds no error, every live
 *                VDI and snapshot reads back exactly, and a second gc finishes the job (the
 *                free count of the uncrashed run; the format-time count when all is deleted).
 *   crash_leaks  blocks a crash leaked (claimed, never linked) are counted as unreachable by
 *                info and check, and gc frees exactly them without touching live data.
 *   gc_eio       the n-th I/O of a gc run fails, for every n: gc returns -EIO, nothing live
 *                is lost, and a gc on the healthy medium finishes the job.
 *
 * PLX_TEST_QUICK=1 samples the crash positions and I/O-error positions.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "pipeline.h"
#include "backend.h"
#include "backend_fault.h"
#include "format.h"
#include "gc_fixture.h"
#include "parallax.h"
#include "testutil.h"

/* ---- (c) crash at every position of a gc run ------------------------------------------------- */

struct crash_ref {
    uint64_t free_blocks; /* after a complete gc */
    uint64_t unused_extents;
    uint64_t images;
};

/* Open a crash image (consumed), check it, read everything back, collect again, check again. */
static void verify_crash_image(plx_backend *img, const struct model *m, struct crash_ref *ref)
{
    plx_store *st = open_be(img, 0, NULL);
    assert_clean(st, false);
    verify_all(st, m);
    gc_of(st, 0);
    assert_clean(st, true);
    struct plx_store_info in = info_of(st);
    ck_assert_msg(sum4(in.blocks_free_by_type) == ref->free_blocks,
                  "%s: after a second gc %llu blocks are free, after an uncrashed gc %llu", g_where,
                  (unsigned long long)sum4(in.blocks_free_by_type),
                  (unsigned long long)ref->free_blocks);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_UNUSED], ref->unused_extents);
    ck_assert_uint_eq(sum4(in.blocks_unreachable_by_type), 0);
    verify_all(st, m);
    close_store(st);
    ref->images++;
}

static void crash_gc(bool delete_all)
{
    plx_backend *mem = new_medium(MEDIUM_BYTES);
    snprintf(g_where, sizeof g_where, "crash_gc: fresh store");
    plx_store *st = open_kept(mem, 1, NULL);
    uint64_t free0 = total_free(st);
    close_store(st);
    plx_backend *fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(fb);
    mem->ops->destroy(mem);

    struct model m;
    m_init(&m);
    st = open_kept(fb, 0, NULL);
    build_mixed(st, &m);
    snprintf(g_where, sizeof g_where, "crash_gc: deleting");
    if (delete_all) {
        for (int i = m.nv - 1; i >= 0; i--)
            m_delete(st, &m, i);
    } else {
        partial_delete(st, &m);
    }
    close_store(st);

    /* The gc run whose every crash position is tried. */
    snprintf(g_where, sizeof g_where, "crash_gc: the gc run");
    st = open_kept(fb, 0, NULL);
    uint64_t p0 = plx_fault_log_position(fb);
    struct plx_gc_report r = gc_of(st, 0);
    uint64_t p1 = plx_fault_log_position(fb);
    ck_assert_uint_gt(sum4(r.freed_by_type), 0);
    struct plx_store_info in = info_of(st);
    struct crash_ref ref = {sum4(in.blocks_free_by_type), in.extents_by_type[0], 0};
    if (delete_all) {
        ck_assert_uint_eq(ref.free_blocks, free0);
        ck_assert_uint_eq(ref.unused_extents, in.extent_count - 1);
    }
    verify_all(st, &m);
    close_store(st);

    uint64_t total = plx_fault_crash_points(fb, NULL, 0);
    uint64_t *pts = malloc((total + 1) * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(fb, pts, total);
    size_t nsel = 0;
    pts[nsel++] = p0; /* before gc wrote anything */
    for (uint64_t i = 0; i < total; i++)
        if (pts[i] > p0 && pts[i] <= p1 && pts[i] != pts[nsel - 1])
            pts[nsel++] = pts[i];
    ck_assert_uint_gt(nsel, 10);
    unsigned step = tu_quick() ? 7 : 1;
    unsigned seeds = tu_quick() ? 1 : 4;

    struct plx_crash_cursor *c = plx_crash_cursor_new(fb);
    uint64_t tried = 0;
    for (size_t i = 0; i < nsel; i++) {
        if (i % step != 0 && i != nsel - 1)
            continue;
        plx_crash_cursor_seek(c, pts[i]);
        snprintf(g_where, sizeof g_where,
                 "crash_gc(%s) at position %llu (%zu of %zu), durable only",
                 delete_all ? "all deleted" : "partial", (unsigned long long)pts[i], i, nsel);
        verify_crash_image(plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0), &m, &ref);
        snprintf(g_where, sizeof g_where, "crash_gc(%s) at position %llu (%zu of %zu), all landed",
                 delete_all ? "all deleted" : "partial", (unsigned long long)pts[i], i, nsel);
        verify_crash_image(plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0), &m, &ref);
        for (unsigned k = 0; k < seeds; k++) {
            uint64_t seed = pts[i] * 7919 + k;
            snprintf(g_where, sizeof g_where, "crash_gc(%s) at position %llu, random seed %llu",
                     delete_all ? "all deleted" : "partial", (unsigned long long)pts[i],
                     (unsigned long long)seed);
            verify_crash_image(plx_crash_cursor_image(c, PLX_CRASH_RANDOM, seed), &m, &ref);
        }
        tried++;
    }
    plx_crash_cursor_free(c);
    if (getenv("CK_VERBOSITY") && strcmp(getenv("CK_VERBOSITY"), "verbose") == 0)
        fprintf(stderr, "crash_gc(%s): %llu positions of %zu in the gc run, %llu images\n",
                delete_all ? "all deleted" : "partial", (unsigned long long)tried, nsel,
                (unsigned long long)ref.images);
    free(pts);
    m_free(&m);
    fb->ops->destroy(fb);
}

START_TEST(test_crash_gc)
{
    crash_gc(_i == 1);
}
END_TEST

/* ---- (e) blocks leaked by a crash ------------------------------------------------------------ */

START_TEST(test_crash_leaks)
{
    plx_backend *mem = new_medium(MEDIUM_BYTES);
    plx_backend *fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(fb);
    mem->ops->destroy(mem);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "crash_leaks workload");
    plx_store *st = open_kept(fb, 0, NULL);
    int v = m_create(st, &m, "v", 8 * MiB);
    m_write_run(st, &m, v, 0, 64); /* durable: the VDI is closed after it */
    uint32_t *durable = map_copy(m.v[v].cur, m.v[v].nblocks);

    /* Then writes that are acknowledged but not flushed when the crash comes. */
    plx_vdi *h = vopen(st, "v", 0);
    uint8_t *buf = plx_block_alloc(1);
    uint32_t wid0 = m.next_wid;
    for (uint64_t vb = 512; vb < 512 + 200; vb++) {
        pattern(buf, m.next_wid, vb);
        ck_assert_int_eq(plx_vdi_pwrite(h, buf, vb * BS, BS, 0), 0);
        m.v[v].cur[vb] = m.next_wid++;
        m.touched[vb] = 1;
    }
    uint64_t crash_at = plx_fault_log_position(fb);
    ck_assert_int_eq(plx_vdi_flush(h), 0);
    vclose(h);
    plx_block_free(buf);
    close_store(st);

    struct plx_crash_cursor *c = plx_crash_cursor_new(fb);
    plx_crash_cursor_seek(c, crash_at);
    for (int mode = 0; mode < 2; mode++) {
        enum plx_crash_mode md = mode ? PLX_CRASH_KEEP_ALL : PLX_CRASH_DROP_UNFLUSHED;
        snprintf(g_where, sizeof g_where, "crash before the flush, %s",
                 mode ? "every write landed" : "durable writes only");
        st = open_be(plx_crash_cursor_image(c, md, 0), 0, NULL);
        struct plx_store_info in = info_of(st);
        struct plx_check_report cr = check_of(st);
        uint64_t leaked = in.blocks_unreachable_by_type[PLX_EXTENT_METADATA] +
                          in.blocks_unreachable_by_type[PLX_EXTENT_DATA];
        ck_assert_uint_eq(cr.errors, 0);
        ck_assert_msg(leaked > 0, "%s: no leaked blocks: the test does not test anything", g_where);
        ck_assert_uint_eq(cr.leaked_blocks, leaked);

        /* What the crash left: the durable part exactly, each later block old or new. */
        uint64_t nb = m.v[v].nblocks;
        uint8_t *img = plx_block_alloc(nb), *want = plx_block_alloc(1);
        plx_vdi *r = vopen(st, "v", PLX_OPEN_READONLY);
        ck_assert_int_eq(plx_vdi_pread(r, img, 0, nb * BS), 0);
        vclose(r);
        for (uint64_t vb = 0; vb < nb; vb++) {
            pattern(want, durable[vb], vb);
            bool ok = memcmp(img + vb * BS, want, BS) == 0;
            if (!ok && vb >= 512 && vb < 712) {
                pattern(want, wid0 + (uint32_t)(vb - 512), vb);
                ok = memcmp(img + vb * BS, want, BS) == 0;
            }
            ck_assert_msg(ok, "%s: block %llu after the crash", g_where, (unsigned long long)vb);
        }

        struct plx_gc_report gr = gc_of(st, 0);
        for (int t = 0; t < 4; t++)
            ck_assert_uint_eq(gr.freed_by_type[t], in.blocks_unreachable_by_type[t]);
        struct plx_store_info after = info_of(st);
        ck_assert_uint_eq(sum4(after.blocks_unreachable_by_type), 0);
        /* An extent left empty goes back to the unused pool, its bitmap blocks with it (with
         * placement by leaf the unflushed writes went to slots of an extent of their own). */
        uint64_t bitmaps = gr.extents_released * plx_bitmap_blocks(EXTENT_BYTES / BS);
        ck_assert_uint_eq(sum4(after.blocks_free_by_type),
                          sum4(in.blocks_free_by_type) + leaked + bitmaps);
        assert_clean(st, true);
        /* gc changed nothing a reader sees. */
        uint8_t *again = plx_block_alloc(nb);
        r = vopen(st, "v", PLX_OPEN_READONLY);
        ck_assert_int_eq(plx_vdi_pread(r, again, 0, nb * BS), 0);
        vclose(r);
        ck_assert_msg(memcmp(img, again, nb * BS) == 0, "%s: gc changed the VDI", g_where);
        plx_block_free(again);
        plx_block_free(img);
        plx_block_free(want);
        close_store(st);
    }
    plx_crash_cursor_free(c);
    free(durable);
    m_free(&m);
    fb->ops->destroy(fb);
}
END_TEST

/* ---- I/O errors during gc ---------------------------------------------------------------------
 * The n-th I/O of a gc run fails (every n: reads, writes and flushes): gc reports the error, and
 * the medium is still consistent: nothing live was freed (a read error is never taken for "no
 * link"), and a gc once the medium is healthy again finishes the job.
 * Fails at 2026-11-22 (b97603d): purge_deleted() treats any failure of plx_registry_read() as
 * "slot already purged or reused" and goes on, so a read error there is swallowed and gc
 * returns 0 (the deleted record stays until the next run). */

START_TEST(test_gc_eio)
{
    plx_backend *mem = new_medium(MEDIUM_BYTES);
    plx_backend *fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(fb);
    mem->ops->destroy(mem);
    struct model m;
    m_init(&m);
    plx_store *st = open_kept(fb, 0, NULL);
    build_mixed(st, &m);
    partial_delete(st, &m);
    close_store(st);
    /* The medium before gc, as a plain memory image to start each run from. */
    struct plx_crash_cursor *c = plx_crash_cursor_new(fb);
    plx_crash_cursor_seek(c, plx_fault_log_position(fb));
    plx_backend *before = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
    plx_crash_cursor_free(c);
    fb->ops->destroy(fb);

    /* The reference run: how many I/Os, and the free count it reaches. */
    snprintf(g_where, sizeof g_where, "gc_eio: reference run");
    fb = plx_fault_create(before, 0);
    st = open_kept(fb, 0, NULL);
    uint64_t io0 = plx_fault_io_count(fb);
    gc_of(st, 0);
    uint64_t nio = plx_fault_io_count(fb) - io0;
    uint64_t ref_free = total_free(st);
    close_store(st);
    fb->ops->destroy(fb);
    ck_assert_uint_gt(nio, 10);

    for (uint64_t n = 1; n <= nio; n++) {
        /* Quick runs: every 5th I/O, and every one of the last sweep and the purge. */
        if (tu_quick() && n % 5 != 1 && n + 12 < nio)
            continue;
        snprintf(g_where, sizeof g_where, "gc_eio: I/O %llu of %llu fails", (unsigned long long)n,
                 (unsigned long long)nio);
        fb = plx_fault_create(before, 0);
        st = open_kept(fb, 0, NULL);
        plx_fault_fail_nth(fb, n, -EIO);
        struct plx_gc_report r;
        int rc = plx_gc(st, 0, &r);
        ck_assert_msg(rc == -EIO, "%s: gc returned %d", g_where, rc);
        ck_assert_uint_eq(plx_fault_errors_injected(fb), 1);
        plx_store_close(st); /* may report the error again */
        plx_fault_clear(fb);
        st = open_kept(fb, 0, NULL);
        assert_clean(st, false);
        verify_all(st, &m);
        gc_of(st, 0);
        assert_clean(st, true);
        ck_assert_uint_eq(total_free(st), ref_free);
        verify_all(st, &m);
        close_store(st);
        fb->ops->destroy(fb);
    }
    before->ops->destroy(before);
    m_free(&m);
}
END_TEST

static Suite *gc_crash_suite(void)
{
    Suite *s = suite_create("gc-crash");
    TCase *tc;

    tc = tcase_create("crash");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, test_crash_gc, 0, 2);
    tcase_add_test(tc, test_crash_leaks);
    tcase_add_test(tc, test_gc_eio);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(gc_crash_suite)
