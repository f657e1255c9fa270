/*
 * gc_fixture.c - the stores, the model and the workloads of the garbage collector's tests
 * (gc_fixture.h).
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

/* What the test is doing, for messages. */
char g_where[256] = "setup";

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

struct keep_be *keep_wrap(plx_backend *inner)
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

plx_backend *new_medium(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, EXTENT_BYTES, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

/* Open a store on be (consumed). host NULL = this host (this process). */
plx_store *open_be(plx_backend *be, int read_only, const char *host)
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

plx_store *open_kept(plx_backend *medium, int read_only, const char *host)
{
    return open_be(&keep_wrap(medium)->base, read_only, host);
}

void close_store(plx_store *st)
{
    int rc = plx_store_close(st);
    ck_assert_msg(rc == 0, "%s: close: %d", g_where, rc);
}

uint64_t sum4(const uint64_t *a)
{
    return a[0] + a[1] + a[2] + a[3];
}

struct plx_store_info info_of(plx_store *st)
{
    struct plx_store_info in;
    int rc = plx_store_info(st, &in);
    ck_assert_msg(rc == 0, "%s: info: %d %s", g_where, rc, plx_store_errmsg(st));
    return in;
}

uint64_t total_free(plx_store *st)
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

struct plx_check_report check_of(plx_store *st)
{
    struct plx_check_report r;
    unsigned printed = 0;
    memset(&r, 0, sizeof r);
    int rc = plx_check(st, &r, print_line, &printed);
    ck_assert_msg(rc == 0, "%s: check could not run: %d %s", g_where, rc, plx_store_errmsg(st));
    return r;
}

void assert_clean(plx_store *st, bool no_leaks)
{
    struct plx_check_report r = check_of(st);
    ck_assert_msg(r.errors == 0, "%s: check found %llu errors", g_where,
                  (unsigned long long)r.errors);
    if (no_leaks)
        ck_assert_msg(r.leaked_blocks == 0, "%s: check found %llu leaked blocks", g_where,
                      (unsigned long long)r.leaked_blocks);
}

struct plx_gc_report gc_of(plx_store *st, int dry_run)
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
void pattern(uint8_t *blk, uint32_t wid, uint64_t vb)
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

void m_init(struct model *m)
{
    memset(m, 0, sizeof *m);
    m->next_wid = 1;
    m->touched_len = MAX_VBLOCKS;
    m->touched = calloc(MAX_VBLOCKS, 1);
    ck_assert_ptr_nonnull(m->touched);
}

void m_free(struct model *m)
{
    for (int i = 0; i < m->nv; i++) {
        free(m->v[i].cur);
        for (int s = 0; s <= MAXS; s++)
            free(m->v[i].snap[s]);
    }
    free(m->touched);
    memset(m, 0, sizeof *m);
}

uint32_t *map_copy(const uint32_t *src, uint64_t n)
{
    uint32_t *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

int m_find(const struct model *m, const char *name)
{
    for (int i = 0; i < m->nv; i++)
        if (strcmp(m->v[i].name, name) == 0)
            return i;
    ck_abort_msg("no VDI %s in the model", name);
    return -1;
}

int m_create(plx_store *st, struct model *m, const char *name, uint64_t bytes)
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

int m_clone(plx_store *st, struct model *m, const char *name, int src, int idx)
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

plx_vdi *vopen(plx_store *st, const char *spec, unsigned flags)
{
    plx_vdi *h = NULL;
    int rc = plx_vdi_open(st, spec, flags, &h);
    ck_assert_msg(rc == 0, "%s: open %s: %d %s", g_where, spec, rc, plx_store_errmsg(st));
    return h;
}

void vclose(plx_vdi *h)
{
    int rc = plx_vdi_close(h);
    ck_assert_msg(rc == 0, "%s: vdi close: %d", g_where, rc);
}

/* Write each of vbs[0..n) as its own single-block write (a new write id each). */
void m_write(plx_store *st, struct model *m, int vi, const uint64_t *vbs, size_t n)
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
void m_write_run(plx_store *st, struct model *m, int vi, uint64_t vb0, uint64_t n)
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

int m_snapshot(plx_store *st, struct model *m, int vi)
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

void m_snap_delete(plx_store *st, struct model *m, int vi, int idx)
{
    struct mv *v = &m->v[vi];
    char spec[64];
    snprintf(spec, sizeof spec, "%s@%d", v->name, idx);
    int rc = plx_snap_delete(st, spec);
    ck_assert_msg(rc == 0, "%s: snap-delete %s: %d %s", g_where, spec, rc, plx_store_errmsg(st));
    v->snap_deleted[idx] = true;
}

void m_delete(plx_store *st, struct model *m, int vi)
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
void verify_all(plx_store *st, const struct model *m)
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
void random_vbs(uint64_t *out, size_t n, uint64_t nblocks, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        out[i] = tu_rand(rng) % nblocks;
}

void build_mixed(plx_store *st, struct model *m)
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

/* Deletes part of build_mixed's trees: a snapshot and a VDI that others depend on, and more. */
void partial_delete(plx_store *st, struct model *m)
{
    m_snap_delete(st, m, m_find(m, "alpha"), 1); /* gamma (and zeta) depend on it */
    m_delete(st, m, m_find(m, "beta"));          /* delta depends on beta@2 */
    m_snap_delete(st, m, m_find(m, "gamma"), 1); /* zeta depends on it */
    m_delete(st, m, m_find(m, "eps"));
}
