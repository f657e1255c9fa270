/*
 * test_gc_races.c - the garbage collector (plx_gc) racing other processes, against the model
 * of gc_fixture.c (see test_gc.c).
 *
 * group "races" (other processes simulated at chosen points, honouring the admin lock)
 *   writer_during_mark  a writer allocates in checkpointed extents while gc marks: the sweep
 *                must not free what was allocated after the checkpoint.
 *   two_collectors  two collectors overlap, with a writer reusing what the first freed: the
 *                second must not free the writer's new blocks.
 *   clone_vs_delete  a snap-delete + gc lands while a clone is resolving its snapshot: the
 *                clone must not end up linking freed blocks.
 *
 * Other processes are simulated with stores opened on the same medium under another host name.
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

/* ---- Races between processes -------------------------------------------------------------------
 * Stores opened on the same medium under different host names stand for processes; the admin
 * lock is the medium's (backend lock op), so they exclude each other as processes do. A hook in
 * one store's I/O path runs another "process" at a chosen point, but only if the admin lock is
 * free there: a real process would block on the lock otherwise, so the hook waits for the first
 * later I/O at which it is free.
 *
 * two_collectors. Two collectors overlap: B checkpoints (block X: allocated, garbage), then A,
 * from start to end, frees X; a writer takes the extent and allocates X for a new VDI; then B
 * sweeps: X was allocated in B's checkpoint and is allocated now, and B's marking never saw the
 * new VDI (created after B read the registry), so B would free X under the new VDI. A and the
 * writer run while B is marking, which holds no lock. B must give up (-EAGAIN) or free nothing
 * live. (Found against the first version of gc.c, 56c5c88, which freed "new"'s root; fixed
 * by gc_epoch in e39c4fc.)
 *
 * clone_vs_delete. A clone resolves its snapshot and reads the snapshot's root; a snap-delete
 * and a gc in another process at that moment must not leave the clone linking freed blocks:
 * either the clone fails with -ENOENT, or the collector sees the clone and keeps what it shares.
 * (Found against the first version of plx_vdi_clone, 56c5c88, which took the admin lock only
 * to write the record; fixed in e39c4fc.) */

/* Could another process take the medium's admin lock right now? */
static bool admin_lock_free(plx_backend *med)
{
    ck_assert_ptr_nonnull(med->ops->lock);
    if (med->ops->lock(med, 1) != 0)
        return false;
    med->ops->lock(med, 0);
    return true;
}

struct race {
    plx_backend *med;
    uint64_t trigger_block; /* arm at the first read covering it */
    bool armed, fired;
    struct model *m;
};

/* Arm at the trigger read; return true (and disarm) at the first I/O from then on at which
 * another process could take the admin lock. */
static bool race_due(struct keep_be *k, const struct plx_io *io)
{
    struct race *rc = k->hook_arg;
    if (!rc->armed && io->op == PLX_IO_READ && io->block <= rc->trigger_block &&
        rc->trigger_block < io->block + io->nblocks)
        rc->armed = true;
    if (!rc->armed || !admin_lock_free(rc->med))
        return false;
    k->hook = NULL;
    rc->fired = true;
    return true;
}

static void two_collectors_hook(struct keep_be *k, const struct plx_io *io)
{
    if (!race_due(k, io))
        return;
    struct race *rc = k->hook_arg;
    snprintf(g_where, sizeof g_where, "collector A and a writer while collector B marks");
    plx_store *a = open_kept(rc->med, 0, "host-a");
    struct plx_gc_report r = gc_of(a, 0);
    ck_assert_uint_gt(r.freed_by_type[PLX_EXTENT_DATA], 0);
    int nv = m_create(a, rc->m, "new", 8 * MiB);
    m_write_run(a, rc->m, nv, 0, 150);
    close_store(a); /* the writer exits: its extents are released */
    snprintf(g_where, sizeof g_where, "collector B, after A and the writer");
}

START_TEST(test_two_collectors)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "two_collectors setup");
    plx_store *st = open_kept(med, 0, "host-setup");
    int g = m_create(st, &m, "garbage", 8 * MiB);
    m_write_run(st, &m, g, 0, 200);
    int live = m_create(st, &m, "live", 8 * MiB);
    m_write_run(st, &m, live, 0, 20);
    m_delete(st, &m, g);
    struct plx_vdi_info li;
    ck_assert_int_eq(plx_vdi_lookup(st, "live", &li), 0);
    close_store(st);

    struct race rc = {.med = med, .trigger_block = li.root, .m = &m};
    struct keep_be *kb = keep_wrap(med);
    kb->hook = two_collectors_hook;
    kb->hook_arg = &rc;
    plx_store *b = open_be(&kb->base, 0, "host-b");
    snprintf(g_where, sizeof g_where, "collector B");
    struct plx_gc_report r;
    int brc = plx_gc(b, 0, &r);
    ck_assert_msg(rc.fired, "the interleaving did not happen (B never read the live root)");
    ck_assert_msg(brc == 0 || brc == -EAGAIN, "collector B: %d %s", brc, plx_store_errmsg(b));
    close_store(b);

    snprintf(g_where, sizeof g_where, "after two overlapping collectors (B returned %d)", brc);
    st = open_kept(med, 0, "host-check");
    /* Anything allocated now may land on blocks B freed under "new". */
    int other = m_create(st, &m, "other", 8 * MiB);
    m_write_run(st, &m, other, 0, 150);
    assert_clean(st, true);
    verify_all(st, &m);
    gc_of(st, 0); /* a later run finishes whatever B gave up */
    assert_clean(st, true);
    verify_all(st, &m);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

/* writer_during_mark. While a collector marks, a writer (another process) takes an extent the
 * collector checkpointed, allocates blocks for a VDI created after the checkpoint, and exits.
 * The collector never saw that VDI, so nothing marks its blocks: only the checkpoint ("never
 * free a block allocated after it") keeps the sweep off them. */
static void late_writer_hook(struct keep_be *k, const struct plx_io *io)
{
    if (!race_due(k, io))
        return;
    struct race *rc = k->hook_arg;
    snprintf(g_where, sizeof g_where, "a writer while the collector marks");
    plx_store *w = open_kept(rc->med, 0, "host-w");
    int late = m_create(w, rc->m, "late", 8 * MiB);
    m_write_run(w, rc->m, late, 0, 100);
    m_snapshot(w, rc->m, late);
    m_write_run(w, rc->m, late, 50, 100);
    close_store(w); /* its extents are released before the collector sweeps */
    snprintf(g_where, sizeof g_where, "collector, after the writer");
}

START_TEST(test_writer_during_mark)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "writer_during_mark setup");
    plx_store *st = open_kept(med, 0, "host-setup");
    int live = m_create(st, &m, "live", 8 * MiB);
    m_write_run(st, &m, live, 0, 20);
    int g = m_create(st, &m, "garbage", 8 * MiB); /* leaves free room in checkpointed extents */
    m_write_run(st, &m, g, 0, 30);
    m_delete(st, &m, g);
    struct plx_vdi_info li;
    ck_assert_int_eq(plx_vdi_lookup(st, "live", &li), 0);
    struct plx_store_info in = info_of(st);
    close_store(st);

    struct race rc = {.med = med, .trigger_block = li.root, .m = &m};
    struct keep_be *kb = keep_wrap(med);
    kb->hook = late_writer_hook;
    kb->hook_arg = &rc;
    plx_store *c = open_be(&kb->base, 0, "host-gc");
    snprintf(g_where, sizeof g_where, "collector");
    struct plx_gc_report r = gc_of(c, 0);
    ck_assert_msg(rc.fired, "the interleaving did not happen (gc never read the live root)");
    close_store(c);
    /* The writer put its first blocks into the checkpointed extent (its leaf's slot there has
     * room), and only the garbage went. After its snapshot, blocks whose place in that slot is
     * taken spill into a new extent (alloc.c), so the count of data extents may grow. */
    ck_assert_uint_eq(r.freed_by_type[PLX_EXTENT_DATA], 30);

    snprintf(g_where, sizeof g_where, "after a writer ran during marking");
    st = open_kept(med, 0, "host-check");
    struct plx_store_info after = info_of(st);
    ck_assert_uint_ge(after.extents_by_type[PLX_EXTENT_DATA], in.extents_by_type[PLX_EXTENT_DATA]);
    int other = m_create(st, &m, "other", 8 * MiB);
    m_write_run(st, &m, other, 0, 150);
    assert_clean(st, true);
    verify_all(st, &m);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

static void delete_src1_and_collect(struct race *rc)
{
    snprintf(g_where, sizeof g_where, "snap-delete src@1 and gc in another process");
    plx_store *adm = open_kept(rc->med, 0, "host-admin");
    m_snap_delete(adm, rc->m, m_find(rc->m, "src"), 1);
    gc_of(adm, 0);
    close_store(adm);
}

static void clone_hook(struct keep_be *k, const struct plx_io *io)
{
    if (race_due(k, io))
        delete_src1_and_collect(k->hook_arg);
}

START_TEST(test_clone_vs_delete)
{
    plx_backend *med = new_medium(MEDIUM_BYTES);
    struct model m;
    m_init(&m);
    snprintf(g_where, sizeof g_where, "clone_vs_delete setup");
    plx_store *st = open_kept(med, 0, "host-setup");
    int s = m_create(st, &m, "src", 8 * MiB);
    m_write_run(st, &m, s, 0, 100);
    m_snapshot(st, &m, s);
    m_write_run(st, &m, s, 0, 100); /* src@1's data is its own */
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "src@1", &si), 0);
    close_store(st);

    struct race rc = {.med = med, .trigger_block = si.root, .m = &m};
    struct keep_be *kb = keep_wrap(med);
    kb->hook = clone_hook;
    kb->hook_arg = &rc;
    plx_store *cl = open_be(&kb->base, 0, "host-cloner");
    snprintf(g_where, sizeof g_where, "cloning src@1");
    uint64_t id = 0;
    int crc = plx_vdi_clone(cl, "copy", "src@1", &id);
    kb->hook = NULL;
    close_store(cl);
    ck_assert_msg(rc.armed, "the clone never read src@1's root");
    ck_assert_msg(crc == 0 || crc == -ENOENT, "clone: %d", crc);
    if (crc == 0) {
        /* The clone was made: it holds src@1's contents. */
        struct mv *v = &m.v[m.nv++];
        memset(v, 0, sizeof *v);
        snprintf(v->name, sizeof v->name, "copy");
        v->nblocks = m.v[s].nblocks;
        v->cur = map_copy(m.v[s].snap[1], v->nblocks);
    }
    if (!rc.fired)
        delete_src1_and_collect(&rc);

    snprintf(g_where, sizeof g_where, "after the clone raced a snap-delete and gc (clone: %d)",
             crc);
    st = open_kept(med, 0, "host-check");
    int other = m_create(st, &m, "other", 8 * MiB);
    m_write_run(st, &m, other, 0, 150); /* reuses whatever gc freed */
    assert_clean(st, true);
    verify_all(st, &m);
    close_store(st);
    m_free(&m);
    med->ops->destroy(med);
}
END_TEST

static Suite *gc_races_suite(void)
{
    Suite *s = suite_create("gc-races");
    TCase *tc;

    tc = tcase_create("races");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_writer_during_mark);
    tcase_add_test(tc, test_two_collectors);
    tcase_add_test(tc, test_clone_vs_delete);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(gc_races_suite)
