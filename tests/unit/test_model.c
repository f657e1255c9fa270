/*
 * test_model.c - a randomized model test of the engine.
 *
 * Thousands of operations (writes of 1 byte to 300 KiB at offsets biased towards a few hot
 * regions, reads, trims, flushes, snapshots with and without labels, clones of random
 * snapshots, snapshot and VDI deletion, bursts of asynchronous requests in flight together)
 * run against the engine and against an in-memory model of every VDI and every snapshot. Every
 * read is compared byte for byte with the model. Periodically the store is closed and opened
 * again on the same medium; then every VDI and every snapshot is compared in full and plx_check
 * must find no error.
 *
 * Each run is a fixed seed; a failure names the seed and the operation number. To replay one
 * run: CK_RUN_CASE=<case> with the loop index, or edit the seed table.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define KiB (1ull << 10)
#define MiB (1ull << 20)


/* ---- The model: images of refcounted 4 KiB blocks, shared copy-on-write ------------------- */

struct mblk {
    int refs;
    unsigned char data[BS];
};

struct mimg {
    uint64_t nblocks;
    struct mblk **b; /* NULL = zeros */
};

static void mimg_init(struct mimg *m, uint64_t nblocks)
{
    m->nblocks = nblocks;
    m->b = calloc(nblocks, sizeof(*m->b));
    ck_assert_ptr_nonnull(m->b);
}

static void mblk_unref(struct mblk *b)
{
    if (b != NULL && --b->refs == 0)
        free(b);
}

static void mimg_free(struct mimg *m)
{
    for (uint64_t i = 0; i < m->nblocks; i++)
        mblk_unref(m->b[i]);
    free(m->b);
    m->b = NULL;
    m->nblocks = 0;
}

static void mimg_copy(struct mimg *dst, const struct mimg *src)
{
    mimg_init(dst, src->nblocks);
    for (uint64_t i = 0; i < src->nblocks; i++) {
        dst->b[i] = src->b[i];
        if (dst->b[i] != NULL)
            dst->b[i]->refs++;
    }
}

/* A private, writable copy of block i. */
static struct mblk *mimg_own(struct mimg *m, uint64_t i)
{
    struct mblk *b = m->b[i];
    if (b != NULL && b->refs == 1)
        return b;
    struct mblk *n = malloc(sizeof(*n));
    ck_assert_ptr_nonnull(n);
    n->refs = 1;
    if (b != NULL)
        memcpy(n->data, b->data, BS);
    else
        memset(n->data, 0, BS);
    mblk_unref(b);
    m->b[i] = n;
    return n;
}

static void mimg_write(struct mimg *m, uint64_t off, const unsigned char *src, uint64_t len)
{
    while (len > 0) {
        uint64_t i = off / BS, in = off % BS;
        uint64_t n = BS - in < len ? BS - in : len;
        memcpy(mimg_own(m, i)->data + in, src, n);
        off += n;
        src += n;
        len -= n;
    }
}

static void mimg_zero(struct mimg *m, uint64_t off, uint64_t len)
{
    while (len > 0) {
        uint64_t i = off / BS, in = off % BS;
        uint64_t n = BS - in < len ? BS - in : len;
        if (n == BS) {
            mblk_unref(m->b[i]);
            m->b[i] = NULL;
        } else if (m->b[i] != NULL) {
            memset(mimg_own(m, i)->data + in, 0, n);
        }
        off += n;
        len -= n;
    }
}

static void mimg_read(const struct mimg *m, uint64_t off, unsigned char *dst, uint64_t len)
{
    while (len > 0) {
        uint64_t i = off / BS, in = off % BS;
        uint64_t n = BS - in < len ? BS - in : len;
        if (m->b[i] != NULL)
            memcpy(dst, m->b[i]->data + in, n);
        else
            memset(dst, 0, n);
        off += n;
        dst += n;
        len -= n;
    }
}

/* ---- Run state ------------------------------------------------------------------------------- */

#define MAX_VDIS 6
#define MAX_SNAPS 5
#define MAX_SLOTS 64 /* VDIs ever created in one run, deleted ones included */
#define NHOT 4

struct msnap {
    uint64_t index;
    char label[16];
    struct mimg img;
    int deleted;
};

struct mvdi {
    char name[32];
    uint64_t id;
    uint64_t size;
    int live;
    plx_vdi *h; /* writable handle, or NULL when closed */
    struct mimg img;
    struct msnap snaps[MAX_SNAPS * 2];
    int nsnaps; /* records in the VDI's log (deleted ones included) */
    int nlive;  /* snapshots not deleted */
    uint64_t hot[NHOT];
};

struct cfg {
    uint64_t seed;
    int ops_full, ops_quick;
    uint64_t cache_bytes; /* 0 = default */
    int gc;               /* run the collector at some reopens */
    int file;             /* a blockstore file in $TMPDIR rather than a memory medium */
    uint64_t store_mib;   /* 0 = 256; nothing is reclaimed without the collector */
};

struct run {
    const struct cfg *cfg;
    uint64_t rng;
    int op;
    plx_store *st;
    plx_backend *mem;
    char path[4096];
    struct mvdi v[MAX_SLOTS];
    int nv;
    uint64_t data_seq;
    unsigned char *buf, *buf2; /* scratch, 1 MiB + slack */
    /* statistics */
    int n_write, n_read, n_trim, n_flush, n_snap, n_clone, n_del, n_sdel, n_burst, n_reopen;
    int n_label, n_gc, n_create;
    uint64_t bytes_written, bytes_read;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char where_buf[128];

static const char *where(const struct run *r)
{
    snprintf(where_buf, sizeof(where_buf), "seed %llu op %d", (unsigned long long)r->cfg->seed,
             r->op);
    return where_buf;
}

static uint64_t rnd(struct run *r, uint64_t n)
{
    return n ? tu_rand(&r->rng) % n : 0;
}

#define RUN_OK(r, call)                                                                            \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ >= 0, "%s: %s: %d (%s)", where(r), #call, rc_,                           \
                      plx_store_errmsg((r)->st));                                                  \
    } while (0)

/* ---- Store open / close ------------------------------------------------------------------------
 */

static void store_open(struct run *r)
{
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof(o), .cache_bytes = r->cfg->cache_bytes};
    int rc;
    if (r->cfg->file)
        rc = plx_store_open(r->path, &o, &r->st, err, sizeof(err));
    else
        rc = plx_store_open_backend(tu_keep_wrap(r->mem), &o, &r->st, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s: open store: %d %s", where(r), rc, err);
}

static void check_line(void *arg, int is_error, const char *line)
{
    int *shown = arg;
    if (is_error && (*shown)++ < 20)
        fprintf(stderr, "model: check: %s\n", line);
}

static void run_check(struct run *r)
{
    struct plx_check_report rep;
    int shown = 0;
    int rc = plx_check(r->st, &rep, check_line, &shown);
    ck_assert_msg(rc == 0, "%s: plx_check could not run: %d (%s)", where(r), rc,
                  plx_store_errmsg(r->st));
    ck_assert_msg(rep.errors == 0, "%s: plx_check found %llu errors (first ones on stderr)",
                  where(r), (unsigned long long)rep.errors);
    ck_assert_uint_gt(rep.trees, 0);
}

static void vdi_close(struct run *r, struct mvdi *m)
{
    if (m->h == NULL)
        return;
    int rc = plx_vdi_close(m->h);
    m->h = NULL;
    ck_assert_msg(rc == 0, "%s: close VDI %s: %d (%s)", where(r), m->name, rc,
                  plx_store_errmsg(r->st));
}

static void vdi_open(struct run *r, struct mvdi *m)
{
    if (m->h != NULL)
        return;
    int rc = plx_vdi_open(r->st, m->name, 0, &m->h);
    ck_assert_msg(rc == 0, "%s: open VDI %s: %d (%s)", where(r), m->name, rc,
                  plx_store_errmsg(r->st));
    ck_assert_uint_eq(plx_vdi_size(m->h), m->size);
    ck_assert_uint_eq(plx_vdi_id(m->h), m->id);
}

/* ---- Comparing the engine with the model ------------------------------------------------------
 */

static void compare(struct run *r, plx_vdi *h, const struct mimg *img, uint64_t off, uint64_t len,
                    const char *what)
{
    /* Odd buffer address unless the request is aligned, where an aligned buffer is used so the
     * engine's direct (no bounce) path is exercised. */
    unsigned char *got = (off % BS == 0 && len % BS == 0 && rnd(r, 2)) ? r->buf : r->buf + 1;
    memset(got, 0xa5, len);
    int rc = plx_vdi_pread(h, got, off, len);
    ck_assert_msg(rc == 0, "%s: read %s %llu+%llu: %d (%s)", where(r), what,
                  (unsigned long long)off, (unsigned long long)len, rc, plx_store_errmsg(r->st));
    mimg_read(img, off, r->buf2, len);
    if (memcmp(got, r->buf2, len) != 0) {
        uint64_t i = 0;
        while (got[i] == r->buf2[i])
            i++;
        ck_assert_msg(0, "%s: %s: byte %llu is 0x%02x, model has 0x%02x (read %llu+%llu)", where(r),
                      what, (unsigned long long)(off + i), got[i], r->buf2[i],
                      (unsigned long long)off, (unsigned long long)len);
    }
    r->bytes_read += len;
}

static void compare_all(struct run *r, plx_vdi *h, const struct mimg *img, const char *what)
{
    uint64_t size = img->nblocks * BS;
    for (uint64_t off = 0; off < size; off += MiB)
        compare(r, h, img, off, size - off < MiB ? size - off : MiB, what);
}

static void verify_snapshot(struct run *r, struct mvdi *m, struct msnap *s, int full)
{
    char spec[64], what[96];
    /* Name it by label when it has one, else by index. */
    if (s->label[0] != '\0' && rnd(r, 2))
        snprintf(spec, sizeof(spec), "%s@%s", m->name, s->label);
    else
        snprintf(spec, sizeof(spec), "%s@%llu", m->name, (unsigned long long)s->index);
    plx_vdi *h = NULL;
    int rc = plx_vdi_open(r->st, spec, 0, &h);
    if (s->deleted) {
        ck_assert_msg(rc == -ENOENT, "%s: deleted snapshot %s opened: %d", where(r), spec, rc);
        return;
    }
    ck_assert_msg(rc == 0, "%s: open %s: %d (%s)", where(r), spec, rc, plx_store_errmsg(r->st));
    ck_assert_int_ne(plx_vdi_readonly(h), 0);
    snprintf(what, sizeof(what), "snapshot %s", spec);
    if (full) {
        compare_all(r, h, &s->img, what);
    } else {
        uint64_t off = rnd(r, m->size), len = 1 + rnd(r, 300 * KiB);
        if (len > m->size - off)
            len = m->size - off;
        compare(r, h, &s->img, off, len, what);
    }
    rc = plx_vdi_close(h);
    ck_assert_msg(rc == 0, "%s: close %s: %d", where(r), spec, rc);
}

static void verify_everything(struct run *r)
{
    for (int i = 0; i < r->nv; i++) {
        struct mvdi *m = &r->v[i];
        struct plx_vdi_info vi;
        char idstr[32];
        snprintf(idstr, sizeof(idstr), "%llu", (unsigned long long)m->id);
        int rc = plx_vdi_lookup(r->st, idstr, &vi);
        if (!m->live) {
            ck_assert_msg(rc == -ENOENT, "%s: deleted VDI %s (id %s) found: %d", where(r), m->name,
                          idstr, rc);
            continue;
        }
        ck_assert_msg(rc == 0, "%s: lookup %s: %d (%s)", where(r), idstr, rc,
                      plx_store_errmsg(r->st));
        ck_assert_str_eq(vi.name, m->name);
        ck_assert_uint_eq(vi.size, m->size);
        ck_assert_uint_eq(vi.snap_count, (uint64_t)m->nsnaps);
        vdi_open(r, m);
        char what[64];
        snprintf(what, sizeof(what), "VDI %s", m->name);
        compare_all(r, m->h, &m->img, what);
        for (int s = 0; s < m->nsnaps; s++)
            verify_snapshot(r, m, &m->snaps[s], 1);
    }
}

static void reopen(struct run *r)
{
    for (int i = 0; i < r->nv; i++)
        vdi_close(r, &r->v[i]);
    int rc = plx_store_close(r->st);
    r->st = NULL;
    ck_assert_msg(rc == 0, "%s: close store: %d", where(r), rc);
    store_open(r);
    r->n_reopen++;
    run_check(r);
    if (r->cfg->gc && r->n_reopen % 2 == 0) {
        struct plx_gc_report g;
        RUN_OK(r, plx_gc(r->st, 0, &g));
        r->n_gc++;
        run_check(r);
    }
    verify_everything(r);
}

/* ---- Operations ---------------------------------------------------------------------------------
 */

static struct mvdi *pick_live(struct run *r)
{
    int live[MAX_SLOTS], n = 0;
    for (int i = 0; i < r->nv; i++)
        if (r->v[i].live)
            live[n++] = i;
    return n ? &r->v[live[rnd(r, (uint64_t)n)]] : NULL;
}

static int count_live(const struct run *r)
{
    int n = 0;
    for (int i = 0; i < r->nv; i++)
        n += r->v[i].live;
    return n;
}

static void pick_hot(struct run *r, struct mvdi *m)
{
    for (int k = 0; k < NHOT; k++)
        m->hot[k] = rnd(r, m->size);
}

static struct mvdi *new_slot(struct run *r, const char *prefix)
{
    ck_assert_msg(r->nv < MAX_SLOTS, "%s: too many VDIs", where(r));
    struct mvdi *m = &r->v[r->nv];
    memset(m, 0, sizeof(*m));
    snprintf(m->name, sizeof(m->name), "%s%d", prefix, r->nv);
    return m;
}

static void op_create(struct run *r)
{
    struct mvdi *m = new_slot(r, "v");
    /* 1..16 MiB, sometimes not a whole number of blocks (the engine rounds up). */
    uint64_t size = (1 + rnd(r, 16)) * MiB - rnd(r, 4) * BS;
    uint64_t asked = size - (rnd(r, 4) == 0 ? rnd(r, BS - 1) : 0);
    int rc = plx_vdi_create(r->st, m->name, asked, &m->id);
    ck_assert_msg(rc == 0, "%s: create %s: %d (%s)", where(r), m->name, rc,
                  plx_store_errmsg(r->st));
    m->size = size;
    m->live = 1;
    mimg_init(&m->img, size / BS);
    pick_hot(r, m);
    r->nv++;
    r->n_create++;
    vdi_open(r, m);
}

/* An offset and length: mostly near a hot spot, sizes from 1 byte to 300 KiB. */
static void pick_range(struct run *r, struct mvdi *m, uint64_t *off, uint64_t *len)
{
    uint64_t l;
    switch (rnd(r, 10)) {
    case 0:
    case 1:
    case 2:
    case 3:
        l = 1 + rnd(r, BS);
        break;
    case 4:
    case 5:
    case 6:
        l = 1 + rnd(r, 64 * KiB);
        break;
    case 7:
    case 8:
        l = 1 + rnd(r, 300 * KiB);
        break;
    default:
        l = (1 + rnd(r, 16)) * BS;
        break;
    }
    if (l > m->size)
        l = m->size;
    uint64_t o;
    if (rnd(r, 10) < 7) {
        uint64_t h = m->hot[rnd(r, NHOT)];
        uint64_t d = rnd(r, 128 * KiB);
        o = rnd(r, 2) ? h + d : (h > d ? h - d : 0);
    } else {
        o = rnd(r, m->size);
    }
    if (rnd(r, 4) == 0)
        o -= o % BS; /* block-aligned */
    if (o > m->size - l)
        o = m->size - l;
    *off = o;
    *len = l;
}

static void op_write(struct run *r)
{
    struct mvdi *m = pick_live(r);
    vdi_open(r, m);
    uint64_t off, len;
    pick_range(r, m, &off, &len);
    int aligned = off % BS == 0 && len % BS == 0 && rnd(r, 2);
    unsigned char *src = aligned ? r->buf : r->buf + 3;
    tu_fill(src, len, ++r->data_seq);
    unsigned flags = rnd(r, 10) == 0 ? PLX_WRITE_FUA : 0;
    int rc = plx_vdi_pwrite(m->h, src, off, len, flags);
    ck_assert_msg(rc == 0, "%s: write %s %llu+%llu: %d (%s)", where(r), m->name,
                  (unsigned long long)off, (unsigned long long)len, rc, plx_store_errmsg(r->st));
    mimg_write(&m->img, off, src, len);
    r->n_write++;
    r->bytes_written += len;
}

static void op_read(struct run *r)
{
    struct mvdi *m = pick_live(r);
    uint64_t off, len;
    pick_range(r, m, &off, &len);
    if (m->nlive > 0 && rnd(r, 3) == 0) {
        int s;
        do
            s = (int)rnd(r, (uint64_t)m->nsnaps);
        while (m->snaps[s].deleted);
        verify_snapshot(r, m, &m->snaps[s], 0);
    } else {
        vdi_open(r, m);
        char what[64];
        snprintf(what, sizeof(what), "VDI %s", m->name);
        compare(r, m->h, &m->img, off, len, what);
    }
    r->n_read++;
}

static void op_trim(struct run *r)
{
    struct mvdi *m = pick_live(r);
    vdi_open(r, m);
    uint64_t off, len;
    pick_range(r, m, &off, &len);
    if (rnd(r, 3) == 0 && off + len * 4 <= m->size)
        len *= 4;
    int rc = plx_vdi_trim(m->h, off, len);
    ck_assert_msg(rc == 0, "%s: trim %s %llu+%llu: %d (%s)", where(r), m->name,
                  (unsigned long long)off, (unsigned long long)len, rc, plx_store_errmsg(r->st));
    mimg_zero(&m->img, off, len);
    r->n_trim++;
}

static void op_flush(struct run *r)
{
    struct mvdi *m = pick_live(r);
    vdi_open(r, m);
    RUN_OK(r, plx_vdi_flush(m->h));
    r->n_flush++;
}

static void add_snapshot(struct run *r, struct mvdi *m, uint64_t index, const char *label)
{
    struct msnap *s = &m->snaps[m->nsnaps++];
    memset(s, 0, sizeof(*s));
    s->index = index;
    snprintf(s->label, sizeof(s->label), "%s", label ? label : "");
    mimg_copy(&s->img, &m->img);
    m->nlive++;
}

static void op_snapshot(struct run *r)
{
    struct mvdi *m = pick_live(r);
    if (m->nlive >= MAX_SNAPS || m->nsnaps >= MAX_SNAPS * 2)
        return;
    char label[16];
    const char *lp = NULL;
    if (rnd(r, 2)) {
        snprintf(label, sizeof(label), "L%d", r->op);
        lp = label;
    }
    uint64_t idx = 0;
    int rc;
    if (rnd(r, 4) == 0) {
        /* The administrative form, on a closed VDI. */
        vdi_close(r, m);
        rc = plx_vdi_snapshot(r->st, m->name, lp, &idx);
    } else {
        vdi_open(r, m);
        rc = plx_vdi_snapshot_open(m->h, lp, &idx);
    }
    ck_assert_msg(rc == 0, "%s: snapshot %s: %d (%s)", where(r), m->name, rc,
                  plx_store_errmsg(r->st));
    ck_assert_msg(idx == (uint64_t)m->nsnaps + 1, "%s: snapshot %s got index %llu, want %d",
                  where(r), m->name, (unsigned long long)idx, m->nsnaps + 1);
    add_snapshot(r, m, idx, lp);
    /* Writes shift to new places from time to time. */
    if (rnd(r, 2))
        m->hot[rnd(r, NHOT)] = rnd(r, m->size);
    r->n_snap++;
}

static void op_clone(struct run *r)
{
    if (count_live(r) >= MAX_VDIS || r->nv >= MAX_SLOTS)
        return;
    struct mvdi *src = pick_live(r);
    if (src->nlive == 0)
        return;
    int s;
    do
        s = (int)rnd(r, (uint64_t)src->nsnaps);
    while (src->snaps[s].deleted);
    struct msnap *sn = &src->snaps[s];
    char spec[64];
    if (sn->label[0] != '\0' && rnd(r, 2))
        snprintf(spec, sizeof(spec), "%s@%s", src->name, sn->label);
    else
        snprintf(spec, sizeof(spec), "%s@%llu", src->name, (unsigned long long)sn->index);
    struct mvdi *m = new_slot(r, "c");
    int rc = plx_vdi_clone(r->st, m->name, spec, &m->id);
    ck_assert_msg(rc == 0, "%s: clone %s from %s: %d (%s)", where(r), m->name, spec, rc,
                  plx_store_errmsg(r->st));
    m->size = src->size;
    m->live = 1;
    mimg_copy(&m->img, &sn->img);
    memcpy(m->hot, src->hot, sizeof(m->hot));
    r->nv++;
    struct plx_vdi_info vi;
    RUN_OK(r, plx_vdi_lookup(r->st, m->name, &vi));
    ck_assert_uint_eq(vi.parent_id, src->id);
    ck_assert_uint_eq(vi.parent_snap, sn->index);
    vdi_open(r, m);
    r->n_clone++;
}

static void op_delete(struct run *r)
{
    struct mvdi *m = pick_live(r);
    vdi_close(r, m);
    RUN_OK(r, plx_vdi_delete(r->st, m->name));
    m->live = 0;
    mimg_free(&m->img);
    for (int s = 0; s < m->nsnaps; s++)
        mimg_free(&m->snaps[s].img);
    m->nsnaps = m->nlive = 0;
    struct plx_vdi_info vi;
    int rc = plx_vdi_lookup(r->st, m->name, &vi);
    ck_assert_msg(rc == -ENOENT, "%s: deleted VDI %s still found: %d", where(r), m->name, rc);
    r->n_del++;
}

static void op_snap_delete(struct run *r)
{
    struct mvdi *m = pick_live(r);
    if (m->nlive == 0)
        return;
    int s;
    do
        s = (int)rnd(r, (uint64_t)m->nsnaps);
    while (m->snaps[s].deleted);
    char spec[64];
    snprintf(spec, sizeof(spec), "%s@%llu", m->name, (unsigned long long)m->snaps[s].index);
    vdi_close(r, m);
    RUN_OK(r, plx_snap_delete(r->st, spec));
    m->snaps[s].deleted = 1;
    mimg_free(&m->snaps[s].img);
    m->nlive--;
    r->n_sdel++;
}

static void op_label(struct run *r)
{
    struct mvdi *m = pick_live(r);
    if (m->nlive == 0)
        return;
    int s;
    do
        s = (int)rnd(r, (uint64_t)m->nsnaps);
    while (m->snaps[s].deleted);
    char spec[64], label[16];
    snprintf(spec, sizeof(spec), "%s@%llu", m->name, (unsigned long long)m->snaps[s].index);
    if (rnd(r, 4) == 0)
        label[0] = '\0';
    else
        snprintf(label, sizeof(label), "R%d", r->op);
    vdi_close(r, m);
    RUN_OK(r, plx_snap_label(r->st, spec, label));
    snprintf(m->snaps[s].label, sizeof(m->snaps[s].label), "%s", label);
    /* The old label must no longer resolve, the new one must. */
    if (label[0] != '\0') {
        struct plx_snap_info si;
        snprintf(spec, sizeof(spec), "%s@%s", m->name, label);
        RUN_OK(r, plx_snap_lookup(r->st, spec, &si));
        ck_assert_uint_eq(si.index, m->snaps[s].index);
    }
    r->n_label++;
}

/* ---- Asynchronous bursts ------------------------------------------------------------------------
 */

enum areq_kind { A_WRITE, A_READ, A_TRIM, A_FLUSH, A_SNAP };

struct areq {
    enum areq_kind kind;
    uint64_t off, len;
    unsigned char *buf;  /* write source or read destination */
    unsigned char *want; /* reads: the model at submission */
    uint64_t index, want_index;
    int done, status;
    struct mvdi *m;
};

static void areq_done(void *arg, int status)
{
    struct areq *a = arg;
    a->done++;
    a->status = status;
}

static void op_burst(struct run *r)
{
    enum { MAXQ = 24 };
    /* One VDI, or two with their requests interleaved. */
    struct mvdi *pair[2] = {pick_live(r), pick_live(r)};
    int nvdi = rnd(r, 3) == 0 && pair[0] != pair[1] ? 2 : 1;
    for (int j = 0; j < nvdi; j++)
        vdi_open(r, pair[j]);
    struct areq q[MAXQ];
    int n = 2 + (int)rnd(r, MAXQ - 1);
    memset(q, 0, sizeof(q));
    for (int i = 0; i < n; i++) {
        struct areq *a = &q[i];
        struct mvdi *m = pair[rnd(r, (uint64_t)nvdi)];
        a->m = m;
        uint64_t k = rnd(r, 100);
        a->kind = k < 55 ? A_WRITE : k < 85 ? A_READ : k < 93 ? A_TRIM : k < 97 ? A_FLUSH : A_SNAP;
        if (a->kind == A_SNAP && (m->nlive >= MAX_SNAPS || m->nsnaps >= MAX_SNAPS * 2))
            a->kind = A_FLUSH;
        int rc = 0;
        switch (a->kind) {
        case A_WRITE:
            pick_range(r, m, &a->off, &a->len);
            a->buf = malloc(a->len + 1);
            ck_assert_ptr_nonnull(a->buf);
            tu_fill(a->buf, a->len, ++r->data_seq);
            rc = plx_vdi_submit_write(m->h, a->buf, a->off, a->len,
                                      rnd(r, 8) == 0 ? PLX_WRITE_FUA : 0, areq_done, a);
            if (rc == 0) {
                mimg_write(&m->img, a->off, a->buf, a->len);
                r->bytes_written += a->len;
            }
            break;
        case A_READ:
            pick_range(r, m, &a->off, &a->len);
            a->buf = malloc(a->len + 1);
            a->want = malloc(a->len + 1);
            ck_assert(a->buf && a->want);
            mimg_read(&m->img, a->off, a->want, a->len);
            rc = plx_vdi_submit_read(m->h, a->buf, a->off, a->len, areq_done, a);
            break;
        case A_TRIM:
            pick_range(r, m, &a->off, &a->len);
            rc = plx_vdi_submit_trim(m->h, a->off, a->len, areq_done, a);
            if (rc == 0)
                mimg_zero(&m->img, a->off, a->len);
            break;
        case A_FLUSH:
            rc = plx_vdi_submit_flush(m->h, areq_done, a);
            break;
        case A_SNAP: {
            char label[16];
            snprintf(label, sizeof(label), "B%d.%d", r->op, i);
            const char *lp = rnd(r, 2) ? label : NULL;
            a->want_index = (uint64_t)m->nsnaps + 1;
            rc = plx_vdi_submit_snapshot(m->h, lp, &a->index, areq_done, a);
            if (rc == 0)
                add_snapshot(r, m, a->want_index, lp);
            break;
        }
        }
        ck_assert_msg(rc == 0, "%s: burst request %d (kind %d) submit: %d (%s)", where(r), i,
                      a->kind, rc, plx_store_errmsg(r->st));
        ck_assert_msg(a->done == 0, "%s: burst request %d called back inside submit", where(r), i);
    }
    for (int i = 0; i < n; i++) {
        int rc = plx_store_wait(r->st, &q[i].done);
        ck_assert_msg(rc == 0, "%s: wait for burst request %d: %d (%s)", where(r), i, rc,
                      plx_store_errmsg(r->st));
    }
    for (int i = 0; i < n; i++) {
        struct areq *a = &q[i];
        ck_assert_msg(a->done == 1, "%s: burst request %d called back %d times", where(r), i,
                      a->done);
        ck_assert_msg(a->status == 0, "%s: burst request %d (kind %d, %llu+%llu) failed: %d (%s)",
                      where(r), i, a->kind, (unsigned long long)a->off, (unsigned long long)a->len,
                      a->status, plx_store_errmsg(r->st));
        if (a->kind == A_READ && memcmp(a->buf, a->want, a->len) != 0) {
            uint64_t j = 0;
            while (a->buf[j] == a->want[j])
                j++;
            ck_assert_msg(0, "%s: burst read %d of %s %llu+%llu: byte %llu is 0x%02x, want 0x%02x",
                          where(r), i, a->m->name, (unsigned long long)a->off,
                          (unsigned long long)a->len, (unsigned long long)(a->off + j), a->buf[j],
                          a->want[j]);
        }
        if (a->kind == A_SNAP)
            ck_assert_msg(a->index == a->want_index, "%s: burst snapshot got index %llu, want %llu",
                          where(r), (unsigned long long)a->index,
                          (unsigned long long)a->want_index);
        free(a->buf);
        free(a->want);
    }
    r->n_burst++;
}

static void op_cycle_handle(struct run *r)
{
    struct mvdi *m = pick_live(r);
    vdi_close(r, m);
    if (rnd(r, 2))
        vdi_open(r, m);
}

/* ---- The run ------------------------------------------------------------------------------------
 */

static const struct cfg cfgs[] = {
    {.seed = 1, .ops_full = 20000, .ops_quick = 1500, .store_mib = 1024},
    {.seed = 2, .ops_full = 8000, .ops_quick = 600, .store_mib = 512},
    {.seed = 3, .ops_full = 8000, .ops_quick = 600, .store_mib = 512},
    /* A node cache of 64 nodes: radix nodes are evicted and reloaded all the time. */
    {.seed = 4, .ops_full = 6000, .ops_quick = 600, .cache_bytes = 64 * BS, .store_mib = 512},
    /* The collector runs at every other reopen. */
    {.seed = 5, .ops_full = 8000, .ops_quick = 600, .gc = 1},
    /* A blockstore file (libaio) instead of a memory medium. */
    {.seed = 6, .ops_full = 1000, .ops_quick = 120, .file = 1},
};
#define NCFG ((int)(sizeof(cfgs) / sizeof(cfgs[0])))

START_TEST(test_model)
{
    const struct cfg *c = &cfgs[_i];
    struct run *r = calloc(1, sizeof(*r));
    ck_assert_ptr_nonnull(r);
    r->cfg = c;
    r->rng = c->seed * 0x2545f4914f6cdd1dull;
    const int ops = tu_quick() ? c->ops_quick : c->ops_full;
    /* Every reopen compares everything: fewer of them in quick (sanitizer) runs. */
    const int reopens = tu_quick() ? 6 : 12;
    const int reopen_every = ops / reopens > 50 ? ops / reopens : 50;
    const double t0 = now_s();
    r->buf = plx_block_alloc(MiB / BS + 1);
    r->buf2 = malloc(MiB + BS);
    fprintf(stderr, "model: seed %llu: %d ops%s%s%s\n", (unsigned long long)c->seed, ops,
            c->cache_bytes ? ", 64-node cache" : "", c->gc ? ", gc" : "",
            c->file ? ", file medium" : "");

    char err[256] = "";
    const uint64_t store_bytes = (c->store_mib ? c->store_mib : 256) * MiB;
    if (c->file) {
        snprintf(r->path, sizeof(r->path), "%s/plx-test-model-%d-%llu.img", tu_tmpdir(),
                 (int)getpid(), (unsigned long long)c->seed);
        unlink(r->path);
        int rc = plx_format(r->path, store_bytes, MiB, 0, err, sizeof(err));
        ck_assert_msg(rc == 0, "format %s: %d %s", r->path, rc, err);
    } else {
        r->mem = plx_backend_mem_create(store_bytes / BS);
        int rc = plx_format_backend(r->mem, MiB, err, sizeof(err));
        ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    }
    store_open(r);
    for (int i = 0; i < 3; i++)
        op_create(r);

    for (r->op = 1; r->op <= ops; r->op++) {
        if (r->op % reopen_every == 0) {
            reopen(r);
            continue;
        }
        int live = count_live(r);
        if (live < 2) {
            op_create(r);
            continue;
        }
        uint64_t k = rnd(r, 1000);
        if (k < 360)
            op_write(r);
        else if (k < 560)
            op_read(r);
        else if (k < 620)
            op_trim(r);
        else if (k < 650)
            op_flush(r);
        else if (k < 700)
            op_snapshot(r);
        else if (k < 720)
            op_clone(r);
        else if (k < 790)
            op_burst(r);
        else if (k < 800)
            op_label(r);
        else if (k < 810)
            op_snap_delete(r);
        else if (k < 820 && live > 3)
            op_delete(r);
        else if (k < 830 && live < MAX_VDIS && r->nv < MAX_SLOTS)
            op_create(r);
        else if (k < 850)
            op_cycle_handle(r);
        else
            op_write(r);
    }
    reopen(r);

    struct plx_store_info in;
    RUN_OK(r, plx_store_info(r->st, &in));
    fprintf(stderr,
            "model: seed %llu: %d ops (%d writes, %d reads, %d trims, %d flushes, %d snapshots, "
            "%d clones, %d bursts, %d relabels, %d snapshot deletes, %d VDI deletes, %d creates), "
            "%d reopens, %d gc runs, %.1f MiB written, %.1f MiB compared, %llu data blocks of %llu "
            "in use, %.1f s\n",
            (unsigned long long)c->seed, ops, r->n_write, r->n_read, r->n_trim, r->n_flush,
            r->n_snap, r->n_clone, r->n_burst, r->n_label, r->n_sdel, r->n_del, r->n_create,
            r->n_reopen, r->n_gc, (double)r->bytes_written / MiB, (double)r->bytes_read / MiB,
            (unsigned long long)in.blocks_used_by_type[PLX_EXTENT_DATA],
            (unsigned long long)(in.block_count), now_s() - t0);
    ck_assert_int_ge(r->n_reopen, 3);
    ck_assert_int_gt(r->n_snap, 0);

    for (int i = 0; i < r->nv; i++) {
        vdi_close(r, &r->v[i]);
        if (r->v[i].live) {
            mimg_free(&r->v[i].img);
            for (int s = 0; s < r->v[i].nsnaps; s++)
                if (!r->v[i].snaps[s].deleted)
                    mimg_free(&r->v[i].snaps[s].img);
        }
    }
    ck_assert_int_eq(plx_store_close(r->st), 0);
    if (c->file)
        unlink(r->path);
    else
        r->mem->ops->destroy(r->mem);
    plx_block_free(r->buf);
    free(r->buf2);
    free(r);
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_model, 0, NCFG);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(model_suite)
