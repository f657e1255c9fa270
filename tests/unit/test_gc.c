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
 * group "crash"
 *   crash_gc     a crash at every event-log position of a gc run (durable writes only, all
 *                writes, random subsets): every image opens, check finds no error, every live
 *                VDI and snapshot reads back exactly, and a second gc finishes the job (the
 *                free count of the uncrashed run; the format-time count when all is deleted).
 *   crash_leaks  blocks a crash leaked (claimed, never linked) are counted as unreachable by
 *                info and check, and gc frees exactly them without touching live data.
 *   gc_eio       the n-th I/O of a gc run fails, for every n: gc returns -EIO, nothing live
 *                is lost, and a gc on the healthy medium finishes the job.
 * group "races" (other processes simulated at chosen points, honouring the admin lock)
 *   writer_during_mark  a writer allocates in checkpointed extents while gc marks: the sweep
 *                must not free what was allocated after the checkpoint.
 *   two_collectors  two collectors overlap, with a writer reusing what the first freed: the
 *                second must not free the writer's new blocks.
 *   clone_vs_delete  a snap-delete + gc lands while a clone is resolving its snapshot: the
 *                clone must not end up linking freed blocks.
 *
 * Other processes are simulated with stores opened on the same medium under another host name
 * (an extent held by another host is never stale from here, like a live process's). Everything
 * is deterministic. PLX_TEST_QUICK=1 samples the crash positions and I/O-error positions.
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
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define EXTENT_BYTES MiB
#define MEDIUM_BYTES (64 * MiB)

/* What the test is doing, for messages. */
static char g_where[256] = "setup";

/* ---- A backend that forwards to a medium it does not own, with a hook --------------------------
 * plx_store_open_backend destroys its backend on close; stores open the shared medium through
 * this wrapper so it survives them. The hook runs before an I/O is passed on (race repros). */
struct keep_be {
    plx_backend base;
    plx_backend *inner;
    void (*hook)(struct keep_be *k, const struct plx_io *io);
    void *hook_arg;
};

static int keep_submit(plx_backend *be, struct plx_io *io)
{
    struct keep_be *k = (struct keep_be *)be;
    if (k->hook)
        k->hook(k, io);
    return k->inner->ops->submit(k->inner, io);
}

static int keep_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *in = ((struct keep_be *)be)->inner;
    return in->ops->poll(in, timeout_ms);
}

static int keep_fd(const plx_backend *be)
{
    const plx_backend *in = ((const struct keep_be *)be)->inner;
    return in->ops->fd(in);
}

static unsigned keep_inflight(const plx_backend *be)
{
    const plx_backend *in = ((const struct keep_be *)be)->inner;
    return in->ops->inflight(in);
}

static void keep_destroy(plx_backend *be)
{
    free(be);
}

/* The admin lock is the medium's: stores sharing it exclude each other as processes do. */
static int keep_lock(plx_backend *be, int take)
{
    plx_backend *in = ((struct keep_be *)be)->inner;
    return in->ops->lock ? in->ops->lock(in, take) : 0;
}

static const struct plx_backend_ops keep_ops = {
    .submit = keep_submit,
    .poll = keep_poll,
    .fd = keep_fd,
    .inflight = keep_inflight,
    .destroy = keep_destroy,
    .lock = keep_lock,
};

static struct keep_be *keep_wrap(plx_backend *inner)
{
    struct keep_be *k = calloc(1, sizeof *k);
    ck_assert_ptr_nonnull(k);
    k->base.ops = &keep_ops;
    k->base.nblocks = inner->nblocks;
    snprintf(k->base.desc, sizeof k->base.desc, "%s", inner->desc);
    k->inner = inner;
    return k;
}

/* ---- Stores ------------------------------------------------------------------------------------
 */

static plx_backend *new_medium(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, EXTENT_BYTES, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

/* Open a store on be (consumed). host NULL = this host (this process). */
static plx_store *open_be(plx_backend *be, int read_only, const char *host)
{
    struct plx_open_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.read_only = read_only;
    o.cache_bytes = 4 * MiB;
    o.host = host;
    plx_store *st = NULL;
    char err[256] = "";
    int rc = plx_store_open_backend(be, &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: open: %d %s", g_where, rc, err);
    return st;
}

static plx_store *open_kept(plx_backend *medium, int read_only, const char *host)
{
    return open_be(&keep_wrap(medium)->base, read_only, host);
}

static void close_store(plx_store *st)
{
    int rc = plx_store_close(st);
    ck_assert_msg(rc == 0, "%s: close: %d", g_where, rc);
}

static uint64_t sum4(const uint64_t *a)
{
    return a[0] + a[1] + a[2] + a[3];
}

static struct plx_store_info info_of(plx_store *st)
{
    struct plx_store_info in;
    int rc = plx_store_info(st, &in);
    ck_assert_msg(rc == 0, "%s: info: %d %s", g_where, rc, plx_store_errmsg(st));
    return in;
}

static uint64_t total_free(plx_store *st)
{
    struct plx_store_info in = info_of(st);
    return sum4(in.blocks_free_by_type);
}

static void print_line(void *arg, int is_error, const char *line)
{
    unsigned *n = arg;
    if (is_error && (*n)++ < 8)
        fprintf(stderr, "  check [%s]: %s\n", g_where, line);
}

static struct plx_check_report check_of(plx_store *st)
{
    struct plx_check_report r;
    unsigned printed = 0;
    memset(&r, 0, sizeof r);
    int rc = plx_check(st, &r, print_line, &printed);
    ck_assert_msg(rc == 0, "%s: check could not run: %d %s", g_where, rc, plx_store_errmsg(st));
    return r;
}

static void assert_clean(plx_store *st, bool no_leaks)
{
    struct plx_check_report r = check_of(st);
    ck_assert_msg(r.errors == 0, "%s: check found %llu errors", g_where,
                  (unsigned long long)r.errors);
    if (no_leaks)
        ck_assert_msg(r.leaked_blocks == 0, "%s: check found %llu leaked blocks", g_where,
                      (unsigned long long)r.leaked_blocks);
}

static struct plx_gc_report gc_of(plx_store *st, int dry_run)
{
    struct plx_gc_report r;
    memset(&r, 0xa5, sizeof r);
    int rc = plx_gc(st, dry_run, &r);
    ck_assert_msg(rc == 0, "%s: gc%s: %d %s", g_where, dry_run ? " --dry-run" : "", rc,
                  plx_store_errmsg(st));
    return r;
}

/* ---- Block patterns ----------------------------------------------------------------------------
 */

/* Write id `wid` of virtual block vb: (wid, vb) in the first 12 bytes, then noise. 0 = zeros. */
static void pattern(uint8_t *blk, uint32_t wid, uint64_t vb)
{
    if (wid == 0) {
        memset(blk, 0, BS);
        return;
    }
    tu_fill(blk, BS, ((uint64_t)wid << 32) ^ vb ^ 0x6763ull);
    memcpy(blk, &wid, 4);
    memcpy(blk + 4, &vb, 8);
}

/* ---- The model ------------------------------------------------------------------------------- */

#define MAXV 12
#define MAXS 8

struct mv {
    char name[32];
    uint64_t nblocks;
    uint32_t *cur;            /* write id per virtual block */
    uint32_t *snap[MAXS + 1]; /* [i]: contents of @i (1-based); NULL: not taken */
    bool snap_deleted[MAXS + 1];
    int nsnap;
    bool deleted;
};

struct model {
    struct mv v[MAXV];
    int nv;
    uint32_t next_wid;
    uint8_t *touched; /* virtual blocks ever written, any VDI (big VDIs: what to read) */
    uint64_t touched_len;
};

#define SMALL_VDI_BLOCKS 4096u /* VDIs up to this size are read back whole */
#define MAX_VBLOCKS (1ull << 20)

static void m_init(struct model *m)
{
    memset(m, 0, sizeof *m);
    m->next_wid = 1;
    m->touched_len = MAX_VBLOCKS;
    m->touched = calloc(MAX_VBLOCKS, 1);
    ck_assert_ptr_nonnull(m->touched);
}

static void m_free(struct model *m)
{
    for (int i = 0; i < m->nv; i++) {
        free(m->v[i].cur);
        for (int s = 0; s <= MAXS; s++)
            free(m->v[i].snap[s]);
    }
    free(m->touched);
    memset(m, 0, sizeof *m);
}

static uint32_t *map_copy(const uint32_t *src, uint64_t n)
{
    uint32_t *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

static int m_find(const struct model *m, const char *name)
{
    for (int i = 0; i < m->nv; i++)
        if (strcmp(m->v[i].name, name) == 0)
            return i;
    ck_abort_msg("no VDI %s in the model", name);
    return -1;
}

static int m_create(plx_store *st, struct model *m, const char *name, uint64_t bytes)
{
    ck_assert_int_lt(m->nv, MAXV);
    ck_assert_uint_le(bytes / BS, MAX_VBLOCKS);
    struct mv *v = &m->v[m->nv];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->nblocks = bytes / BS;
    v->cur = calloc(v->nblocks, sizeof *v->cur);
    ck_assert_ptr_nonnull(v->cur);
    uint64_t id = 0;
    int rc = plx_vdi_create(st, name, bytes, &id);
    ck_assert_msg(rc == 0, "%s: create %s: %d %s", g_where, name, rc, plx_store_errmsg(st));
    return m->nv++;
}

static int m_clone(plx_store *st, struct model *m, const char *name, int src, int idx)
{
    ck_assert_int_lt(m->nv, MAXV);
    const struct mv *s = &m->v[src];
    ck_assert_ptr_nonnull(s->snap[idx]);
    char spec[64];
    snprintf(spec, sizeof spec, "%s@%d", s->name, idx);
    struct mv *v = &m->v[m->nv];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->nblocks = s->nblocks;
    v->cur = map_copy(s->snap[idx], s->nblocks);
    uint64_t id = 0;
    int rc = plx_vdi_clone(st, name, spec, &id);
    ck_assert_msg(rc == 0, "%s: clone %s from %s: %d %s", g_where, name, spec, rc,
                  plx_store_errmsg(st));
    return m->nv++;
}

static plx_vdi *vopen(plx_store *st, const char *spec, unsigned flags)
{
    plx_vdi *h = NULL;
    int rc = plx_vdi_open(st, spec, flags, &h);
    ck_assert_msg(rc == 0, "%s: open %s: %d %s", g_where, spec, rc, plx_store_errmsg(st));
    return h;
}

static void vclose(plx_vdi *h)
{
    int rc = plx_vdi_close(h);
    ck_assert_msg(rc == 0, "%s: vdi close: %d", g_where, rc);
}

/* Write each of vbs[0..n) as its own single-block write (a new write id each). */
static void m_write(plx_store *st, struct model *m, int vi, const uint64_t *vbs, size_t n)
{
    struct mv *v = &m->v[vi];
    plx_vdi *h = vopen(st, v->name, 0);
    uint8_t *buf = plx_block_alloc(1);
    for (size_t i = 0; i < n; i++) {
        uint64_t vb = vbs[i];
        ck_assert_uint_lt(vb, v->nblocks);
        uint32_t wid = m->next_wid++;
        pattern(buf, wid, vb);
        int rc = plx_vdi_pwrite(h, buf, vb * BS, BS, 0);
        ck_assert_msg(rc == 0, "%s: write %s block %llu: %d %s", g_where, v->name,
                      (unsigned long long)vb, rc, plx_store_errmsg(st));
        v->cur[vb] = wid;
        m->touched[vb] = 1;
    }
    plx_block_free(buf);
    vclose(h);
}

/* One write of the run [vb0, vb0 + n), one write id. */
static void m_write_run(plx_store *st, struct model *m, int vi, uint64_t vb0, uint64_t n)
{
    struct mv *v = &m->v[vi];
    ck_assert_uint_le(vb0 + n, v->nblocks);
    plx_vdi *h = vopen(st, v->name, 0);
    uint8_t *buf = plx_block_alloc(n);
    uint32_t wid = m->next_wid++;
    for (uint64_t i = 0; i < n; i++) {
        pattern(buf + i * BS, wid, vb0 + i);
        v->cur[vb0 + i] = wid;
        m->touched[vb0 + i] = 1;
    }
    int rc = plx_vdi_pwrite(h, buf, vb0 * BS, (size_t)(n * BS), 0);
    ck_assert_msg(rc == 0, "%s: write %s: %d %s", g_where, v->name, rc, plx_store_errmsg(st));
    plx_block_free(buf);
    vclose(h);
}

static void m_trim(plx_store *st, struct model *m, int vi, uint64_t vb0, uint64_t n)
{
    struct mv *v = &m->v[vi];
    plx_vdi *h = vopen(st, v->name, 0);
    int rc = plx_vdi_trim(h, vb0 * BS, n * BS);
    ck_assert_msg(rc == 0, "%s: trim %s: %d %s", g_where, v->name, rc, plx_store_errmsg(st));
    for (uint64_t i = 0; i < n; i++)
        v->cur[vb0 + i] = 0;
    vclose(h);
}

static int m_snapshot(plx_store *st, struct model *m, int vi)
{
    struct mv *v = &m->v[vi];
    ck_assert_int_lt(v->nsnap, MAXS);
    uint64_t idx = 0;
    int rc = plx_vdi_snapshot(st, v->name, NULL, &idx);
    ck_assert_msg(rc == 0, "%s: snapshot %s: %d %s", g_where, v->name, rc, plx_store_errmsg(st));
    ck_assert_uint_eq(idx, (uint64_t)v->nsnap + 1);
    v->nsnap++;
    v->snap[v->nsnap] = map_copy(v->cur, v->nblocks);
    return v->nsnap;
}

static void m_snap_delete(plx_store *st, struct model *m, int vi, int idx)
{
    struct mv *v = &m->v[vi];
    char spec[64];
    snprintf(spec, sizeof spec, "%s@%d", v->name, idx);
    int rc = plx_snap_delete(st, spec);
    ck_assert_msg(rc == 0, "%s: snap-delete %s: %d %s", g_where, spec, rc, plx_store_errmsg(st));
    v->snap_deleted[idx] = true;
}

static void m_delete(plx_store *st, struct model *m, int vi)
{
    struct mv *v = &m->v[vi];
    int rc = plx_vdi_delete(st, v->name);
    ck_assert_msg(rc == 0, "%s: delete %s: %d %s", g_where, v->name, rc, plx_store_errmsg(st));
    v->deleted = true;
}

/* ---- Reading back ------------------------------------------------------------------------------
 */

static bool want_block(const struct model *m, uint64_t nblocks, uint64_t vb)
{
    if (nblocks <= SMALL_VDI_BLOCKS)
        return true;
    return m->touched[vb] || vb == 0 || vb == nblocks - 1 || vb == nblocks / 2 + 1;
}

/* Read `spec` back and compare with map. Returns the number of wrong blocks (the first few are
 * printed with what they hold instead). */
static uint64_t verify_tree(plx_store *st, const struct model *m, const char *spec,
                            const uint32_t *map, uint64_t nblocks)
{
    enum { RUN = 256 };
    plx_vdi *h = vopen(st, spec, PLX_OPEN_READONLY);
    ck_assert_msg(plx_vdi_size(h) == nblocks * BS, "%s: %s has size %llu, want %llu", g_where, spec,
                  (unsigned long long)plx_vdi_size(h), (unsigned long long)(nblocks * BS));
    uint8_t *buf = plx_block_alloc(RUN), *want = plx_block_alloc(1);
    uint64_t bad = 0;
    for (uint64_t vb = 0; vb < nblocks;) {
        if (!want_block(m, nblocks, vb)) {
            vb++;
            continue;
        }
        uint64_t n = 1;
        while (vb + n < nblocks && n < RUN && want_block(m, nblocks, vb + n))
            n++;
        int rc = plx_vdi_pread(h, buf, vb * BS, (size_t)(n * BS));
        ck_assert_msg(rc == 0, "%s: read %s at block %llu: %d %s", g_where, spec,
                      (unsigned long long)vb, rc, plx_store_errmsg(st));
        for (uint64_t i = 0; i < n; i++) {
            pattern(want, map[vb + i], vb + i);
            if (memcmp(buf + i * BS, want, BS) == 0)
                continue;
            if (bad++ < 4) {
                uint32_t wid;
                uint64_t wvb;
                memcpy(&wid, buf + i * BS, 4);
                memcpy(&wvb, buf + i * BS + 4, 8);
                fprintf(stderr, "  [%s] %s block %llu: want write #%u, holds #%u of block %llu%s\n",
                        g_where, spec, (unsigned long long)(vb + i), map[vb + i], wid,
                        (unsigned long long)wvb, wid ? "" : " (or zeros/garbage)");
            }
        }
        vb += n;
    }
    plx_block_free(buf);
    plx_block_free(want);
    vclose(h);
    return bad;
}

/* Every live VDI and live snapshot reads back exactly; deleted ones are gone. */
static void verify_all(plx_store *st, const struct model *m)
{
    uint64_t bad = 0;
    for (int i = 0; i < m->nv; i++) {
        const struct mv *v = &m->v[i];
        struct plx_vdi_info vi;
        int rc = plx_vdi_lookup(st, v->name, &vi);
        if (v->deleted) {
            ck_assert_msg(rc == -ENOENT, "%s: deleted VDI %s: lookup %d", g_where, v->name, rc);
            continue;
        }
        ck_assert_msg(rc == 0, "%s: lookup %s: %d %s", g_where, v->name, rc, plx_store_errmsg(st));
        ck_assert_uint_eq(vi.snap_count, (uint64_t)v->nsnap);
        bad += verify_tree(st, m, v->name, v->cur, v->nblocks);
        for (int s = 1; s <= v->nsnap; s++) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s@%d", v->name, s);
            if (v->snap_deleted[s]) {
                struct plx_snap_info si;
                rc = plx_snap_lookup(st, spec, &si);
                ck_assert_msg(rc == -ENOENT, "%s: deleted snapshot %s: lookup %d", g_where, spec,
                              rc);
                continue;
            }
            bad += verify_tree(st, m, spec, v->snap[s], v->nblocks);
        }
    }
    ck_assert_msg(bad == 0, "%s: %llu blocks read back wrong", g_where, (unsigned long long)bad);
}

/* ---- A mixed workload ---------------------------------------------------------------------------
 * Small and large (3-level, several interior nodes) VDIs, runs and scattered blocks, snapshots,
 * clones of snapshots (one of a clone's snapshot), writes to the clones, a trim. */
static void random_vbs(uint64_t *out, size_t n, uint64_t nblocks, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        out[i] = tu_rand(rng) % nblocks;
}

static void build_mixed(plx_store *st, struct model *m)
{
    uint64_t rng = 0x67630001ull, vbs[64];
    snprintf(g_where, sizeof g_where, "building the workload");

    int a = m_create(st, m, "alpha", 8 * MiB);
    m_write_run(st, m, a, 0, 128);
    random_vbs(vbs, 20, 2048, &rng);
    m_write(st, m, a, vbs, 20);
    m_snapshot(st, m, a); /* alpha@1 */
    m_write_run(st, m, a, 0, 64);
    random_vbs(vbs, 16, 2048, &rng);
    m_write(st, m, a, vbs, 16);
    m_snapshot(st, m, a); /* alpha@2 */
    m_write_run(st, m, a, 200, 60);

    int b = m_create(st, m, "beta", 2 * GiB);
    random_vbs(vbs, 40, 2 * GiB / BS, &rng);
    m_write(st, m, b, vbs, 40);
    m_snapshot(st, m, b);       /* beta@1 */
    m_write(st, m, b, vbs, 20); /* overwrite half, copy-on-write */
    random_vbs(vbs, 20, 2 * GiB / BS, &rng);
    m_write(st, m, b, vbs, 20);
    m_snapshot(st, m, b); /* beta@2 */
    random_vbs(vbs, 10, 2 * GiB / BS, &rng);
    m_write(st, m, b, vbs, 10);

    int g = m_clone(st, m, "gamma", a, 1);
    random_vbs(vbs, 10, 2048, &rng);
    m_write(st, m, g, vbs, 10);
    m_snapshot(st, m, g); /* gamma@1 */
    m_write_run(st, m, g, 1000, 5);

    int d = m_clone(st, m, "delta", b, 2);
    random_vbs(vbs, 20, 2 * GiB / BS, &rng);
    m_write(st, m, d, vbs, 20);

    int e = m_create(st, m, "eps", 4 * MiB);
    m_write_run(st, m, e, 0, 512);
    m_trim(st, m, e, 100, 100); /* garbage before any delete */

    int z = m_clone(st, m, "zeta", g, 1);
    m_write_run(st, m, z, 10, 3);
    m_snapshot(st, m, z);
}

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

static void partial_delete(plx_store *st, struct model *m)
{
    m_snap_delete(st, m, m_find(m, "alpha"), 1); /* gamma (and zeta) depend on it */
    m_delete(st, m, m_find(m, "beta"));          /* delta depends on beta@2 */
    m_snap_delete(st, m, m_find(m, "gamma"), 1); /* zeta depends on it */
    m_delete(st, m, m_find(m, "eps"));
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
    TCase *tc = tcase_create("gc");
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

    tc = tcase_create("crash");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, test_crash_gc, 0, 2);
    tcase_add_test(tc, test_crash_leaks);
    tcase_add_test(tc, test_gc_eio);
    suite_add_tcase(s, tc);

    tc = tcase_create("races");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_writer_during_mark);
    tcase_add_test(tc, test_two_collectors);
    tcase_add_test(tc, test_clone_vs_delete);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(gc_suite)
