/*
 * test_gc.c - the garbage collector (plx_gc) with plx_snap_delete and plx_vdi_delete, against
 * expectations computed from the workload rather than from the collector's own report.
 *
 * Every written block holds a pattern naming its write id and virtual block, and a model keeps,
 * per VDI and per snapshot, the write id each virtual block must hold; every tree is read back
 * and compared. Counts come from plx_store_info (blocks_free_by_type, extents_by_type,
 * blocks_unreachable_by_type) and plx_check.
 *
 * group "gc"
 *   free_all     everything deleted: gc brings the store back to its format-time free count,
 *                every extent unused, the registry empty, check clean; still true reopened.
 *   snap_middle  deleting @2 of 4 frees exactly the blocks only @2 reached, computed from the
 *                write sets of the epochs; a clone of @2 keeps what it still shares with @2
 *                until it is deleted too; every other tree reads back exactly.
 *   dry_run      frees nothing (medium byte-identical, read-only and writable opens) and
 *                reports exactly what the real run after it frees.
 *   skip_held    extents another live process holds and that does not answer the collector are
 *                skipped, collected once released.
 *   fold_held    the holder answers (its engine serviced while gc waits): the garbage in the
 *                extents it holds is freed while it holds them, counted in gc's report, and it
 *                writes on into the freed space; every tree reads back exactly.
 *   fold_barrier the holder's commit of new blocks is held at the medium (its data and bitmap
 *                landed, the leaf that links them not): it does not answer gc until the commit
 *                lands, so gc skips its extents and frees none of them; after the commit every
 *                block reads back and check is clean.
 *   open_writer  gc while this process has writes in flight on an open VDI.
 *   held_reader  a reader (this process, or another host) holds a deleted snapshot, clone or
 *                VDI open while it is collected and new VDIs take the freed space: it reads
 *                exactly what it opened; the tree goes with the first gc after its close.
 *   hold_table_full  the hold table refuses a read-only open when full, with a message, and
 *                takes a closed handle's entry again.
 *
 * Other processes are simulated with stores opened on the same medium under another host name
 * (an extent held by another host is never stale from here, like a live process's). Everything
 * is deterministic. The crash cases are in test_gc_crash.c, the races in test_gc_races.c;
 * the model and helpers in gc_fixture.c.
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

/* ---- (a) everything deleted ------------------------------------------------------------------ */

START_TEST(test_free_all)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    plx_store *st = open_kept(med, 0, NULL);
    snprintf(g_where, sizeof g_where, "fresh store");
    struct plx_store_info i0 = info_of(st);
    uint64_t free0 = sum4(i0.blocks_free_by_type);
    ck_assert_uint_eq(i0.extents_by_type[PLX_EXTENT_UNUSED], i0.extent_count - 1);
    ck_assert_uint_eq(sum4(i0.blocks_unreachable_by_type), 0);

    struct model m;
    m_init(&m);
    build_mixed(st, &m);
    snprintf(g_where, sizeof g_where, "after the workload");
    verify_all(st, &m);
    struct plx_store_info i1 = info_of(st);
    ck_assert_uint_lt(sum4(i1.blocks_free_by_type), free0);
    /* The trim left 100 data blocks unreachable, nothing else. */
    ck_assert_uint_eq(i1.blocks_unreachable_by_type[PLX_EXTENT_DATA], 100);
    ck_assert_uint_eq(i1.blocks_unreachable_by_type[PLX_EXTENT_METADATA], 0);

    snprintf(g_where, sizeof g_where, "deleting everything");
    for (int i = m.nv - 1; i >= 0; i--)
        m_delete(st, &m, i);
    /* info (its dry run) gives this process's claimed-but-unused blocks back: after it, every
     * allocated block is unreachable. */
    info_of(st);
    struct plx_store_info i2 = info_of(st);
    /* Used blocks include each extent's own bitmap block (one for a 1 MiB extent). */
    uint64_t used2 = i2.blocks_used_by_type[PLX_EXTENT_METADATA] +
                     i2.blocks_used_by_type[PLX_EXTENT_DATA] -
                     i2.extents_by_type[PLX_EXTENT_METADATA] - i2.extents_by_type[PLX_EXTENT_DATA];
    ck_assert_uint_eq(i2.blocks_unreachable_by_type[PLX_EXTENT_METADATA] +
                          i2.blocks_unreachable_by_type[PLX_EXTENT_DATA],
                      used2);

    snprintf(g_where, sizeof g_where, "gc in the writing process");
    struct plx_gc_report r = gc_of(st, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_METADATA],
                      i2.blocks_unreachable_by_type[PLX_EXTENT_METADATA]);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA],
                      i2.blocks_unreachable_by_type[PLX_EXTENT_DATA]);
    ck_assert_uint_eq(r.extents_skipped, 0);
    ck_assert_uint_eq(r.vdis_purged, (uint64_t)m.nv);
    ck_assert_uint_eq(r.extents_released, i2.extents_by_type[PLX_EXTENT_METADATA] +
                                              i2.extents_by_type[PLX_EXTENT_DATA]);
    ck_assert_uint_eq(r.store_blocks, i0.block_count);

    struct plx_store_info i3 = info_of(st);
    ck_assert_msg(sum4(i3.blocks_free_by_type) == free0,
                  "free blocks after gc: %llu, at format time: %llu",
                  (unsigned long long)sum4(i3.blocks_free_by_type), (unsigned long long)free0);
    ck_assert_uint_eq(i3.extents_by_type[PLX_EXTENT_UNUSED], i0.extent_count - 1);
    ck_assert_uint_eq(sum4(i3.blocks_unreachable_by_type), 0);
    ck_assert_uint_eq(i3.vdi_count, 0);
    struct plx_vdi_info *list = NULL;
    size_t n = 99;
    ck_assert_int_eq(plx_vdi_list(st, &list, &n), 0);
    ck_assert_uint_eq(n, 0); /* deleted records purged too */
    free(list);
    struct plx_check_report cr = check_of(st);
    ck_assert_uint_eq(cr.errors, 0);
    ck_assert_uint_eq(cr.leaked_blocks, 0);
    ck_assert_uint_eq(cr.trees, 0);
    close_store(st);

    snprintf(g_where, sizeof g_where, "reopened after gc");
    st = open_kept(med, 1, NULL);
    struct plx_store_info i4 = info_of(st);
    ck_assert_uint_eq(sum4(i4.blocks_free_by_type), free0);
    ck_assert_uint_eq(i4.extents_by_type[PLX_EXTENT_UNUSED], i0.extent_count - 1);
    assert_clean(st, true);
    close_store(st);

    /* The store is usable again. */
    st = open_kept(med, 0, NULL);
    m_free(&m);
    m_init(&m);
    build_mixed(st, &m);
    verify_all(st, &m);
    assert_clean(st, false); /* the trim's 100 blocks are garbage */
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* ---- (b) deleting a snapshot in the middle of a log ------------------------------------------ */

#define SM_VDI_BYTES (5 * GiB / 2) /* 3-level tree with 3 interior nodes under the root */
#define SM_EPOCHS 5                /* writes before @1, @1..@2, @2..@3, @3..@4, after @4 */
#define SM_WRITES 48

struct sets {
    uint64_t vbs[SM_EPOCHS][SM_WRITES];
};

/* Each epoch writes a mix of a hot set (shared with other epochs: overwrites) and fresh blocks. */
static void epoch_sets(struct sets *s)
{
    uint64_t rng = 0x67630b0bull, nb = SM_VDI_BYTES / BS, hot[64];
    for (int i = 0; i < 64; i++)
        hot[i] = tu_rand(&rng) % nb;
    for (int e = 0; e < SM_EPOCHS; e++)
        for (int i = 0; i < SM_WRITES; i++)
            s->vbs[e][i] = (tu_rand(&rng) % 3 == 0) ? tu_rand(&rng) % nb : hot[tu_rand(&rng) % 64];
}

static bool in_epoch(const struct sets *s, int e, uint64_t key, unsigned shift)
{
    for (int i = 0; i < SM_WRITES; i++)
        if (s->vbs[e][i] >> shift == key)
            return true;
    return false;
}

/* Distinct keys (vb >> shift) written in epoch a and also in epoch b and, when c is given, among
 * c[0..nc). */
static uint64_t both_epochs_in(const struct sets *s, int a, int b, unsigned shift,
                               const uint64_t *c, size_t nc)
{
    uint64_t n = 0;
    for (int i = 0; i < SM_WRITES; i++) {
        uint64_t key = s->vbs[a][i] >> shift;
        bool first = true, in_c = c == NULL;
        for (int j = 0; j < i; j++)
            if (s->vbs[a][j] >> shift == key)
                first = false;
        for (size_t j = 0; j < nc; j++)
            if (c[j] >> shift == key)
                in_c = true;
        if (first && in_c && in_epoch(s, b, key, shift))
            n++;
    }
    return n;
}

static uint64_t both_epochs(const struct sets *s, int a, int b, unsigned shift)
{
    return both_epochs_in(s, a, b, shift, NULL, 0);
}

/* Distinct keys (vb >> shift) among v[0..n). */
static uint64_t distinct_keys(const uint64_t *v, size_t n, unsigned shift)
{
    uint64_t d = 0;
    for (size_t i = 0; i < n; i++) {
        bool first = true;
        for (size_t j = 0; j < i; j++)
            if (v[j] >> shift == v[i] >> shift)
                first = false;
        d += first;
    }
    return d;
}

static void run_epochs(plx_store *st, struct model *m, int vi, const struct sets *s)
{
    for (int e = 0; e < SM_EPOCHS; e++) {
        m_write(st, m, vi, s->vbs[e], SM_WRITES);
        if (e < 4)
            m_snapshot(st, m, vi);
    }
}

START_TEST(test_snap_middle)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    plx_store *st = open_kept(med, 0, NULL);
    struct model m;
    m_init(&m);
    struct sets s;
    epoch_sets(&s);
    snprintf(g_where, sizeof g_where, "snap_middle workload");
    int a = m_create(st, &m, "a", SM_VDI_BYTES);
    int b = m_create(st, &m, "b", SM_VDI_BYTES);
    run_epochs(st, &m, a, &s);
    run_epochs(st, &m, b, &s);
    /* A clone of b@2 that writes under the first interior node only (so it keeps sharing the
     * other two with b@2), including two blocks whose b@2 version is b@2's alone. */
    int bc = m_clone(st, &m, "bc", b, 2);
    enum { NBC = 10 };
    uint64_t bc_vbs[NBC], rng = 0x67630c0cull;
    random_vbs(bc_vbs, NBC - 2, 1ull << 18, &rng);
    for (int i = 0, k = NBC - 2; i < SM_WRITES && k < NBC; i++)
        if (in_epoch(&s, 2, s.vbs[1][i], 0) && (k == NBC - 2 || bc_vbs[k - 1] != s.vbs[1][i]))
            bc_vbs[k++] = s.vbs[1][i];
    m_write(st, &m, bc, bc_vbs, NBC);

    /* A clean workload leaves nothing to collect. */
    struct plx_gc_report r0 = gc_of(st, 0);
    ck_assert_uint_eq(r0.freed_by_type[PLX_EXTENT_METADATA], 0);
    ck_assert_uint_eq(r0.freed_by_type[PLX_EXTENT_DATA], 0);

    /* Epoch k (0-based) holds the writes made just before @k+1. The version of a block written
     * between @1 and @2 (epoch 1) is reached by @2 only when the block is written again between
     * @2 and @3 (epoch 2); otherwise @3 shares it. The same holds for the nodes: a leaf (vb>>9)
     * or interior node (vb>>18) copied in epoch 1 is @2's alone when epoch 2 copies it again.
     * @2's root is always its own: the VDI's root at @2 was replaced by a new one.
     * For b, the clone bc also reaches what b@2 reached, except what bc copied for its own
     * writes: b@2's block (or node) k goes too when bc wrote under k. */
    uint64_t want_data = both_epochs(&s, 1, 2, 0);
    uint64_t want_meta = 1 + both_epochs(&s, 1, 2, 9) + both_epochs(&s, 1, 2, 18);
    uint64_t b_data = both_epochs_in(&s, 1, 2, 0, bc_vbs, NBC);
    uint64_t b_meta =
        1 + both_epochs_in(&s, 1, 2, 9, bc_vbs, NBC) + both_epochs_in(&s, 1, 2, 18, bc_vbs, NBC);
    ck_assert_uint_gt(want_data, 0);
    /* Some of @2's blocks are shared with @3, and the clone keeps some of b@2's own blocks. */
    ck_assert_uint_lt(want_data, distinct_keys(s.vbs[1], SM_WRITES, 0));
    ck_assert_uint_gt(b_data, 0);
    ck_assert_uint_lt(b_meta + b_data, want_meta + want_data);
    snprintf(g_where, sizeof g_where, "deleting a@2 and b@2 (b@2 has a clone)");
    m_snap_delete(st, &m, a, 2);
    struct plx_store_info in = info_of(st);
    ck_assert_uint_eq(in.blocks_unreachable_by_type[PLX_EXTENT_DATA], want_data);
    ck_assert_uint_eq(in.blocks_unreachable_by_type[PLX_EXTENT_METADATA], want_meta);
    m_snap_delete(st, &m, b, 2);
    in = info_of(st);
    ck_assert_uint_eq(in.blocks_unreachable_by_type[PLX_EXTENT_DATA], want_data + b_data);
    ck_assert_uint_eq(in.blocks_unreachable_by_type[PLX_EXTENT_METADATA], want_meta + b_meta);
    struct plx_gc_report r = gc_of(st, 0);
    ck_assert_msg(r.freed_by_type[PLX_EXTENT_DATA] == want_data + b_data,
                  "data blocks freed: %llu, only a@2 reached %llu and only b@2 %llu",
                  (unsigned long long)r.freed_by_type[PLX_EXTENT_DATA],
                  (unsigned long long)want_data, (unsigned long long)b_data);
    ck_assert_msg(r.freed_by_type[PLX_EXTENT_METADATA] == want_meta + b_meta,
                  "metadata blocks freed: %llu, only a@2 reached %llu and only b@2 %llu",
                  (unsigned long long)r.freed_by_type[PLX_EXTENT_METADATA],
                  (unsigned long long)want_meta, (unsigned long long)b_meta);
    ck_assert_uint_eq(r.vdis_purged, 0);
    snprintf(g_where, sizeof g_where, "after deleting a@2 and b@2");
    verify_all(st, &m);
    assert_clean(st, true);
    r = gc_of(st, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_METADATA] + r.freed_by_type[PLX_EXTENT_DATA], 0);

    /* The clone goes: the rest of b@2's own blocks go (as a@2's did), with the clone's own: its
     * root, its record block, the interior nodes and leaves its writes copied, and its data
     * blocks. */
    snprintf(g_where, sizeof g_where, "deleting the clone of b@2");
    m_delete(st, &m, bc);
    r = gc_of(st, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA],
                      want_data - b_data + distinct_keys(bc_vbs, NBC, 0));
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_METADATA], want_meta - b_meta + 2 +
                                                                distinct_keys(bc_vbs, NBC, 9) +
                                                                distinct_keys(bc_vbs, NBC, 18));
    ck_assert_uint_eq(r.vdis_purged, 1);
    snprintf(g_where, sizeof g_where, "after deleting bc");
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    st = open_kept(med, 1, NULL);
    snprintf(g_where, sizeof g_where, "reopened");
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* ---- (d) dry run ----------------------------------------------------------------------------- */

static uint32_t *medium_crcs(const plx_backend *med)
{
    uint32_t *c = calloc(med->nblocks, sizeof *c);
    ck_assert_ptr_nonnull(c);
    for (uint64_t b = 0; b < med->nblocks; b++) {
        const void *p = plx_backend_mem_peek(med, b);
        c[b] = p ? plx_crc32c(1, p, BS) : 0;
    }
    return c;
}

static void assert_same_medium(const plx_backend *med, const uint32_t *before)
{
    uint32_t *now = medium_crcs(med);
    uint64_t changed = 0, first = 0;
    for (uint64_t b = 0; b < med->nblocks; b++)
        if (now[b] != before[b] && changed++ == 0)
            first = b;
    free(now);
    ck_assert_msg(changed == 0, "%s: %llu blocks of the medium changed (first: %llu)", g_where,
                  (unsigned long long)changed, (unsigned long long)first);
}

START_TEST(test_dry_run)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    plx_store *st = open_kept(med, 0, NULL);
    struct model m;
    m_init(&m);
    build_mixed(st, &m);
    partial_delete(st, &m);
    close_store(st);

    snprintf(g_where, sizeof g_where, "dry run, read-only store");
    uint32_t *crc = medium_crcs(med);
    st = open_kept(med, 1, NULL);
    struct plx_gc_report d1 = gc_of(st, 1);
    struct plx_store_info in = info_of(st);
    struct plx_check_report cr = check_of(st);
    close_store(st);
    assert_same_medium(med, crc);
    for (int t = 0; t < 4; t++)
        ck_assert_uint_eq(d1.freed_by_type[t], in.blocks_unreachable_by_type[t]);
    ck_assert_uint_eq(cr.leaked_blocks, d1.freed_by_type[2] + d1.freed_by_type[3]);
    ck_assert_uint_gt(d1.freed_by_type[PLX_EXTENT_METADATA], 0);
    ck_assert_uint_gt(d1.freed_by_type[PLX_EXTENT_DATA], 0);
    ck_assert_uint_eq(d1.vdis_purged, 0);
    ck_assert_uint_eq(d1.extents_released, 0);
    ck_assert_uint_eq(d1.reachable, cr.reachable_blocks);

    snprintf(g_where, sizeof g_where, "dry run, writable store");
    st = open_kept(med, 0, NULL);
    struct plx_gc_report d2 = gc_of(st, 1);
    assert_same_medium(med, crc);
    snprintf(g_where, sizeof g_where, "real run after the dry runs");
    struct plx_gc_report r = gc_of(st, 0);
    for (int t = 0; t < 4; t++) {
        ck_assert_uint_eq(d2.freed_by_type[t], d1.freed_by_type[t]);
        ck_assert_uint_eq(r.freed_by_type[t], d1.freed_by_type[t]);
    }
    ck_assert_uint_eq(d2.reachable, d1.reachable);
    ck_assert_uint_eq(r.reachable, d1.reachable);
    ck_assert_uint_eq(r.metadata_read, d1.metadata_read);
    ck_assert_uint_eq(r.store_blocks, d1.store_blocks);
    ck_assert_uint_eq(r.vdis_purged, 2);
    struct plx_gc_report d3 = gc_of(st, 1);
    ck_assert_uint_eq(sum4(d3.freed_by_type), 0);
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    free(crc);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* ---- Extents held by another live process are skipped ------------------------------------------
 */

START_TEST(test_skip_held)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    /* The writer: another process (another host name, so never stale from here), still open;
     * nobody services its engine, so it never answers the collector (which waits 0.3 s). */
    setenv("PARALLAX_RECLAIM_WAIT_MS", "300", 1);
    snprintf(g_where, sizeof g_where, "writer");
    plx_store *w = open_kept(med, 0, "writer-host");
    int live = m_create(w, &m, "live", 8 * MiB);
    int gone = m_create(w, &m, "gone", 8 * MiB);
    m_write_run(w, &m, gone, 0, 300);
    m_write_run(w, &m, live, 0, 100);
    m_delete(w, &m, gone);

    snprintf(g_where, sizeof g_where, "gc beside a live writer");
    plx_store *g = open_kept(med, 0, "gc-host");
    struct plx_store_info in = info_of(g);
    struct plx_gc_report r = gc_of(g, 0);
    ck_assert_uint_eq(r.extents_skipped, in.extents_by_type[PLX_EXTENT_METADATA] +
                                             in.extents_by_type[PLX_EXTENT_DATA]);
    ck_assert_uint_eq(sum4(r.freed_by_type), 0);
    uint64_t purged = r.vdis_purged;

    /* The writer goes on in the extents it holds, then exits (releasing them). */
    snprintf(g_where, sizeof g_where, "writer, after the skipped gc");
    m_write_run(w, &m, live, 100, 100);
    verify_all(w, &m);
    close_store(w);

    snprintf(g_where, sizeof g_where, "gc after the writer exited");
    r = gc_of(g, 0);
    ck_assert_uint_eq(r.extents_skipped, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA], 300);
    ck_assert_uint_gt(r.freed_by_type[PLX_EXTENT_METADATA], 0);
    /* The deleted record may go in either run (its blocks are garbage without it). */
    ck_assert_uint_eq(purged + r.vdis_purged, 1);
    verify_all(g, &m);
    assert_clean(g, true);
    close_store(g);
    m_free(&m);
    med->ops->destroy(med);
    unsetenv("PARALLAX_RECLAIM_WAIT_MS");
}
END_TEST

/* gc's progress calls: the holder's engine runs while the collector waits, marks and sweeps,
 * as a server's loop would beside it. */
static void service_holder(void *arg, const char *step, uint64_t done, uint64_t total)
{
    (void)step, (void)done, (void)total;
    ck_assert_int_ge(plx_store_service(arg), 0);
}

/* The leaf of virtual block vb of open VDI h, read from the medium. */
static uint64_t leaf_of(plx_store *st, plx_vdi *h, uint64_t vb)
{
    uint64_t addr = h->root_addr, *links = plx_block_alloc(1);
    for (unsigned level = h->height - 1; level > 0; level--) {
        ck_assert_int_eq(plx_sync_io(st, PLX_IO_READ, addr, 1, links, 0), 0);
        addr = plx_link_addr(links[plx_index_at(vb, level)]);
        ck_assert_uint_ne(addr, 0);
    }
    plx_block_free(links);
    return addr;
}

static void write_done(void *arg, int status)
{
    int *f = arg;
    f[0] = status;
    f[1] = 1;
}

START_TEST(test_fold_barrier)
{
    plx_backend *mem = new_medium(MEDIUM_BYTES);
    plx_backend *med = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    struct model m;
    m_init(&m);
    setenv("PARALLAX_RECLAIM_POLL_MS", "1", 1);
    snprintf(g_where, sizeof g_where, "writer");
    plx_store *w = open_kept(med, 0, "writer-host");
    unsetenv("PARALLAX_RECLAIM_POLL_MS");
    int live = m_create(w, &m, "live", 8 * MiB);
    m_write_run(w, &m, live, 0, 100);

    /* A write of new blocks whose commit (the leaf that links them, written in place) is held
     * at the medium: its data and the bitmap that claims them are written first. */
    plx_vdi *h = vopen(w, "live", 0);
    uint64_t leaf = leaf_of(w, h, 200);
    plx_fault_hold_blocks(med, PLX_IO_WRITE, leaf, 1, 60000);
    uint8_t *buf = plx_block_alloc(64);
    uint32_t wid = m.next_wid++;
    for (uint64_t i = 0; i < 64; i++) {
        pattern(buf + i * BS, wid, 200 + i);
        m.v[live].cur[200 + i] = wid;
        m.touched[200 + i] = 1;
    }
    int f[2] = {0, 0};
    ck_assert_int_eq(plx_vdi_submit_write(h, buf, 200 * BS, 64 * BS, 0, write_done, f), 0);
    while (plx_fault_held(med) == 0)
        ck_assert_int_ge(plx_store_service(w), 0);
    ck_assert_int_eq(f[1], 0);

    /* gc beside it, the holder serviced all along: it cannot answer while the commit is out. */
    setenv("PARALLAX_RECLAIM_WAIT_MS", "500", 1);
    snprintf(g_where, sizeof g_where, "gc while the holder's commit is held");
    plx_store *g = open_kept(med, 0, "gc-host");
    struct plx_gc_opts o = {.struct_size = sizeof o, .progress = service_holder, .progress_arg = w};
    struct plx_gc_report r;
    int rc = plx_gc_ex(g, &o, &r);
    unsetenv("PARALLAX_RECLAIM_WAIT_MS");
    ck_assert_msg(rc == 0, "%s: %d %s", g_where, rc, plx_store_errmsg(g));
    ck_assert_uint_gt(r.extents_skipped, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA], 0);
    ck_assert_uint_eq(w->alloc->folded, 0);

    /* The commit lands; everything reads back, and nothing linked is free. */
    snprintf(g_where, sizeof g_where, "after the commit");
    plx_fault_release(med);
    while (!f[1])
        ck_assert_int_ge(plx_store_service(w), 0);
    ck_assert_int_eq(f[0], 0);
    plx_block_free(buf);
    vclose(h);
    m_write_run(w, &m, live, 300, 200); /* into whatever the allocator has free */
    verify_all(w, &m);
    close_store(w);
    gc_of(g, 0);
    verify_all(g, &m);
    assert_clean(g, true);
    close_store(g);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

START_TEST(test_fold_held)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    /* The holder looks for requests every millisecond. */
    setenv("PARALLAX_RECLAIM_POLL_MS", "1", 1);
    snprintf(g_where, sizeof g_where, "writer");
    plx_store *w = open_kept(med, 0, "writer-host");
    unsetenv("PARALLAX_RECLAIM_POLL_MS");
    int live = m_create(w, &m, "live", 8 * MiB);
    int gone = m_create(w, &m, "gone", 8 * MiB);
    m_write_run(w, &m, gone, 0, 300);
    m_write_run(w, &m, live, 0, 100);
    m_delete(w, &m, gone);
    struct plx_store_info in = info_of(w);

    snprintf(g_where, sizeof g_where, "gc beside a live writer that answers");
    plx_store *g = open_kept(med, 0, "gc-host");
    struct plx_gc_opts o = {.struct_size = sizeof o, .progress = service_holder, .progress_arg = w};
    struct plx_gc_report r;
    int rc = plx_gc_ex(g, &o, &r);
    ck_assert_msg(rc == 0, "%s: %d %s", g_where, rc, plx_store_errmsg(g));
    ck_assert_uint_eq(r.extents_skipped, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA], 300);
    ck_assert_uint_gt(r.freed_by_type[PLX_EXTENT_METADATA], 0);
    /* Freed in the holder's bitmaps while it holds them (and its slot reservations given
     * back by the info call: at least the 300). */
    struct plx_store_info out = info_of(w);
    ck_assert_uint_ge(out.blocks_free_by_type[PLX_EXTENT_DATA],
                      in.blocks_free_by_type[PLX_EXTENT_DATA] + 300);
    ck_assert_uint_eq(w->alloc->folded, sum4(r.freed_by_type));

    /* The holder writes on, into what it freed. */
    snprintf(g_where, sizeof g_where, "writer, after the fold");
    m_write_run(w, &m, live, 100, 400);
    verify_all(w, &m);
    close_store(w);
    snprintf(g_where, sizeof g_where, "gc after the writer exited");
    gc_of(g, 0);
    verify_all(g, &m);
    assert_clean(g, true);
    close_store(g);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* ---- gc in a process with writes in flight --------------------------------------------------- */

struct wdone {
    int done, status;
};

static void wdone_cb(void *arg, int status)
{
    struct wdone *d = arg;
    d->done++;
    d->status = status ? status : d->status;
}

START_TEST(test_open_writer)
{
    enum { NW = 64 };
    plx_backend *med = new_medium(MEDIUM_BYTES);
    plx_store *st = open_kept(med, 0, NULL);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "open writer");
    int gone = m_create(st, &m, "gone", 8 * MiB);
    m_write_run(st, &m, gone, 0, 200);
    m_delete(st, &m, gone);
    int w = m_create(st, &m, "w", 16 * MiB);
    m_write_run(st, &m, w, 0, 16);
    m_snapshot(st, &m, w);

    /* Writes in flight (copy-on-write of the snapshot's paths, new data blocks) while gc runs. */
    plx_vdi *h = vopen(st, "w", 0);
    uint8_t *bufs = plx_block_alloc(NW);
    struct wdone wd = {0, 0};
    uint64_t rng = 0x67630d0dull;
    for (int i = 0; i < NW; i++) {
        uint64_t vb = (i < 8) ? (uint64_t)i : tu_rand(&rng) % m.v[w].nblocks;
        uint32_t wid = m.next_wid++;
        pattern(bufs + (size_t)i * BS, wid, vb);
        int rc = plx_vdi_submit_write(h, bufs + (size_t)i * BS, vb * BS, BS, 0, wdone_cb, &wd);
        ck_assert_int_eq(rc, 0);
        m.v[w].cur[vb] = wid; /* later writes to the same block complete later */
        m.touched[vb] = 1;
    }
    struct plx_gc_report r = gc_of(st, 0);
    /* The callbacks may still be queued for the next service call. */
    while (wd.done < NW) {
        int before = wd.done;
        ck_assert_int_ge(plx_store_service(st), 0);
        ck_assert_msg(wd.done > before || plx_store_busy(st), "writes lost: %d of %d done", wd.done,
                      NW);
    }
    ck_assert_int_eq(wd.status, 0);
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA], 200);
    ck_assert_uint_eq(r.vdis_purged, 1);
    /* More writes after gc gave this process's claimed blocks back. */
    uint32_t wid = m.next_wid++;
    pattern(bufs, wid, 3000);
    ck_assert_int_eq(plx_vdi_pwrite(h, bufs, 3000ull * BS, BS, 0), 0);
    m.v[w].cur[3000] = wid;
    m.touched[3000] = 1;
    ck_assert_int_eq(plx_vdi_flush(h), 0);
    vclose(h);
    plx_block_free(bufs);
    snprintf(g_where, sizeof g_where, "open writer, after gc");
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    st = open_kept(med, 1, NULL);
    snprintf(g_where, sizeof g_where, "open writer, reopened");
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* ---- Readers of deleted trees (issue 29) -------------------------------------------------------
 * A reader holds a tree open read-only while another process deletes it, collects, and writes
 * new VDIs into the space a collection freed. The reader must go on reading exactly what it
 * opened (never the new VDIs' data), the writer's new VDIs must read back exactly, and the
 * first collection after the reader closed frees the tree. Case (_i % 3): 0 a deleted snapshot
 * (and its VDI deleted too), 1 a deleted clone, 2 a deleted VDI; _i / 3: 0 the reader is another
 * store of this process (this host's identity), 1 a process on another host (a store under
 * another host name on the same medium). */

START_TEST(test_held_reader)
{
    static const char *what[] = {"deleted snapshot", "deleted clone", "deleted VDI"};
    int kind = _i % 3;
    const char *reader_host = _i / 3 ? "reader-host" : NULL;
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "held reader of a %s (%s): setup", what[kind],
             reader_host ? "another host" : "this process");
    plx_store *st = open_kept(med, 0, NULL);
    int src = m_create(st, &m, "src", 8 * MiB);
    m_write_run(st, &m, src, 0, 600);
    m_snapshot(st, &m, src); /* src@1 */
    m_write_run(st, &m, src, 100, 50);
    int cl = m_clone(st, &m, "cl", src, 1);
    m_write_run(st, &m, cl, 300, 200);
    int plain = m_create(st, &m, "plain", 8 * MiB);
    m_write_run(st, &m, plain, 0, 500);

    /* The reader opens its tree and reads it once (its nodes are cached from then on). */
    const char *spec = kind == 0 ? "src@1" : kind == 1 ? "cl" : "plain";
    const uint32_t *map = kind == 0 ? m.v[src].snap[1] : m.v[kind == 1 ? cl : plain].cur;
    plx_store *rst = open_kept(med, 0, reader_host);
    plx_vdi *held = vopen(rst, spec, PLX_OPEN_READONLY);
    uint8_t *buf = plx_block_alloc(2048), *want = plx_block_alloc(1);
    ck_assert_int_eq(plx_vdi_pread(held, buf, 0, 2048 * BS), 0);

    snprintf(g_where, sizeof g_where, "held reader of a %s (%s): delete, gc, new VDIs", what[kind],
             reader_host ? "another host" : "this process");
    if (kind == 0) {
        m_snap_delete(st, &m, src, 1);
        m_delete(st, &m, src);
    }
    /* Case 0 deletes the clone too: it shares src@1's blocks, and only the hold may keep them. */
    m_delete(st, &m, kind == 2 ? plain : cl);
    gc_of(st, 0);
    /* New VDIs fill the space a collection could have freed, and more is collected. */
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "fill%d", i);
        int f = m_create(st, &m, name, 8 * MiB);
        m_write_run(st, &m, f, 0, 1500);
    }
    gc_of(st, 0);
    verify_all(st, &m);
    /* Nothing the reader reads counts as garbage while it holds it: check walks the held tree
     * too (no leaks, no errors), and a dry run would free nothing. */
    assert_clean(st, true);
    struct plx_gc_report dry = gc_of(st, 1);

    uint64_t bad = 0;
    ck_assert_int_eq(plx_vdi_pread(held, buf, 0, 2048 * BS), 0);
    for (uint64_t vb = 0; vb < 2048; vb++) {
        pattern(want, map[vb], vb);
        if (memcmp(buf + vb * BS, want, BS) != 0 && bad++ < 4) {
            uint32_t wid;
            memcpy(&wid, buf + vb * BS, 4);
            fprintf(stderr, "  [%s] %s block %llu: want write #%u, holds #%u\n", g_where, spec,
                    (unsigned long long)vb, map[vb], wid);
        }
    }
    ck_assert_msg(bad == 0, "%s: the held %s read %llu blocks wrong", g_where, spec,
                  (unsigned long long)bad);

    snprintf(g_where, sizeof g_where, "held reader of a %s (%s): after the reader closed",
             what[kind], reader_host ? "another host" : "this process");
    vclose(held);
    close_store(rst);
    struct plx_gc_report r2 = gc_of(st, 0);
    /* The tree's data blocks go now: at least those only it reached (what the writes to the
     * VDI after src@1 and to the clone replaced is not among them). */
    uint64_t only = kind == 0 ? 600 : kind == 1 ? 200 : 500;
    ck_assert_msg(r2.freed_by_type[PLX_EXTENT_DATA] >= only,
                  "%s: freed %llu data blocks, the held tree alone had %llu", g_where,
                  (unsigned long long)r2.freed_by_type[PLX_EXTENT_DATA], (unsigned long long)only);
    ck_assert_uint_eq(sum4(dry.freed_by_type), 0);
    verify_all(st, &m);
    assert_clean(st, true);
    close_store(st);
    plx_block_free(buf);
    plx_block_free(want);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* The hold table is finite: a full table refuses the next read-only open with a message, and a
 * closed handle's entry is taken again. Holds of a store opened read-only are not recorded. */
START_TEST(test_hold_table_full)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "hold table full");
    plx_store *st = open_kept(med, 0, NULL);
    int v = m_create(st, &m, "v", 4 * MiB);
    m_write_run(st, &m, v, 0, 16);
    m_snapshot(st, &m, v);
    enum { MAXH = PLX_HOLD_BLOCKS * PLX_HOLDS_PER_BLOCK };
    plx_vdi **h = calloc(MAXH, sizeof *h);
    ck_assert_ptr_nonnull(h);
    for (int i = 0; i < MAXH; i++)
        h[i] = vopen(st, i % 2 ? "v@1" : "v", PLX_OPEN_READONLY);
    plx_vdi *extra = NULL;
    int rc = plx_vdi_open(st, "v@1", 0, &extra);
    ck_assert_int_eq(rc, -ENOSPC);
    ck_assert_msg(strstr(plx_store_errmsg(st), "hold table is full"), "message: %s",
                  plx_store_errmsg(st));
    /* A reader of a store opened read-only records nothing, so it is not refused. */
    plx_store *ro = open_kept(med, 1, NULL);
    plx_vdi *rh = vopen(ro, "v@1", 0);
    vclose(rh);
    close_store(ro);
    vclose(h[7]);
    h[7] = vopen(st, "v@1", 0);
    for (int i = 0; i < MAXH; i++)
        vclose(h[i]);
    free(h);
    /* Every entry is free again: the next collection keeps nothing for them. */
    m_snap_delete(st, &m, v, 1);
    m_delete(st, &m, v);
    gc_of(st, 0);
    assert_clean(st, true);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

static Suite *gc_suite(void)
{
    Suite *s = suite_create("gc");
    TCase *tc;

    tc = tcase_create("gc");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_free_all);
    tcase_add_test(tc, test_snap_middle);
    tcase_add_test(tc, test_dry_run);
    tcase_add_test(tc, test_skip_held);
    tcase_add_test(tc, test_fold_held);
    tcase_add_test(tc, test_fold_barrier);
    tcase_add_test(tc, test_open_writer);
    tcase_add_loop_test(tc, test_held_reader, 0, 6);
    tcase_add_test(tc, test_hold_table_full);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(gc_suite)
