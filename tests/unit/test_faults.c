/*
 * test_faults.c - the engine under injected I/O errors (the fault backend of backend_fault.h).
 *
 * - sweep: a fixed workload (create, write, snapshot, write, snapshot, clone, write the clone)
 *   runs once for every N with the N-th I/O failing with -EIO, until a run needs fewer than N
 *   I/Os. Every call must succeed or fail cleanly (-EIO and a message); afterwards the medium as
 *   it stands (a keep-all crash image) must open, pass plx_check, and hold every VDI and
 *   snapshot the workload was told exists, with the acknowledged writes (blocks of failed writes
 *   may hold the old or the new contents);
 * - a data block that cannot be read; radix node loads that fail once;
 * - metadata writes failing during copy-on-write;
 * - a store that fills up (-ENOSPC).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_fault.h"
#include "format.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define KiB (1ull << 10)
#define MiB (1ull << 20)

/* ---- A backend that forwards to a medium it does not own (so the medium outlives the store) */
struct keep_be {
    plx_backend base;
    plx_backend *inner;
};

/* Diagnostics: what the I/O numbered watch_n (counted over every wrapper) was. */
static uint64_t submits, watch_n;
static char watch_what[64];

static int keep_submit(plx_backend *be, struct plx_io *io)
{
    plx_backend *in = ((struct keep_be *)be)->inner;
    if (++submits == watch_n) {
        static const char *const names[] = {"read", "write", "flush"};
        if (io->op == PLX_IO_FLUSH)
            snprintf(watch_what, sizeof(watch_what), "flush");
        else
            snprintf(watch_what, sizeof(watch_what), "%s of block %llu+%u", names[io->op],
                     (unsigned long long)io->block, io->nblocks);
    }
    return in->ops->submit(in, io);
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

static const struct plx_backend_ops keep_ops = {
    .submit = keep_submit,
    .poll = keep_poll,
    .fd = keep_fd,
    .inflight = keep_inflight,
    .destroy = keep_destroy,
};

static plx_backend *keep_wrap(plx_backend *inner)
{
    struct keep_be *k = calloc(1, sizeof(*k));
    ck_assert_ptr_nonnull(k);
    k->base.ops = &keep_ops;
    k->base.nblocks = inner->nblocks;
    snprintf(k->base.desc, sizeof(k->base.desc), "%s", inner->desc);
    k->inner = inner;
    return &k->base;
}

/* ---- Helpers --------------------------------------------------------------------------------- */

static plx_backend *formatted(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, MiB, err, sizeof(err));
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

static plx_store *open_on(plx_backend *medium, const char *what)
{
    char err[256] = "";
    plx_store *st = NULL;
    int rc = plx_store_open_backend(keep_wrap(medium), NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s: open: %d %s", what, rc, err);
    return st;
}

/* The medium as it stands now (every write submitted so far has landed). */
static plx_backend *image_now(plx_backend *fault)
{
    struct plx_crash_cursor *c = plx_crash_cursor_new(fault);
    plx_crash_cursor_seek(c, plx_fault_log_position(fault));
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0);
    plx_crash_cursor_free(c);
    return img;
}

struct check_ctx {
    const char *what;
    int shown;
};

static void check_line(void *arg, int is_error, const char *line)
{
    struct check_ctx *c = arg;
    if (is_error && c->shown++ < 10)
        fprintf(stderr, "faults: %s: check: %s\n", c->what, line);
}

static void check_clean(plx_store *st, const char *what)
{
    struct plx_check_report rep;
    struct check_ctx c = {what, 0};
    int rc = plx_check(st, &rep, check_line, &c);
    ck_assert_msg(rc == 0, "%s: plx_check could not run: %d (%s)", what, rc, plx_store_errmsg(st));
    ck_assert_msg(rep.errors == 0, "%s: plx_check found %llu errors (see stderr)", what,
                  (unsigned long long)rep.errors);
}

/* ---- A model of a small VDI in which some blocks may hold one of two versions ---------------- */

#define VDI_SIZE (1 * MiB)
#define NBLK (VDI_SIZE / BS)

struct tree {
    int exists; /* the workload was told it was created */
    char spec[64];
    unsigned char cur[VDI_SIZE]; /* contents if every failed write did not land */
    unsigned char alt[VDI_SIZE]; /* contents if the failed write landed (uncertain blocks) */
    unsigned char uncertain[NBLK];
};

static void tree_apply(struct tree *t, uint64_t off, const unsigned char *src, uint64_t len, int ok)
{
    if (ok) {
        memcpy(t->cur + off, src, len);
        memcpy(t->alt + off, src, len);
        return;
    }
    for (uint64_t b = off / BS; b < (off + len + BS - 1) / BS; b++) {
        if (!t->uncertain[b])
            memcpy(t->alt + b * BS, t->cur + b * BS, BS);
        t->uncertain[b] = 1;
    }
    memcpy(t->alt + off, src, len);
}

static void tree_copy(struct tree *dst, const struct tree *src, const char *spec)
{
    memcpy(dst->cur, src->cur, VDI_SIZE);
    memcpy(dst->alt, src->alt, VDI_SIZE);
    memcpy(dst->uncertain, src->uncertain, NBLK);
    snprintf(dst->spec, sizeof(dst->spec), "%s", spec);
    dst->exists = 1;
}

/* Compare a tree with what the store holds; returns a description of the first mismatch. */
static int tree_verify(plx_store *st, const struct tree *t, char *why, size_t whylen)
{
    plx_vdi *v = NULL;
    int rc = plx_vdi_open(st, t->spec, PLX_OPEN_READONLY, &v);
    if (rc) {
        snprintf(why, whylen, "open %s: %d (%s)", t->spec, rc, plx_store_errmsg(st));
        return -1;
    }
    unsigned char *got = malloc(VDI_SIZE);
    rc = plx_vdi_pread(v, got, 0, VDI_SIZE);
    int bad = 0;
    if (rc) {
        snprintf(why, whylen, "read %s: %d (%s)", t->spec, rc, plx_store_errmsg(st));
        bad = 1;
    }
    for (uint64_t b = 0; b < NBLK && !bad; b++) {
        const unsigned char *g = got + b * BS;
        if (memcmp(g, t->cur + b * BS, BS) == 0)
            continue;
        if (t->uncertain[b] && memcmp(g, t->alt + b * BS, BS) == 0)
            continue;
        snprintf(why, whylen, "%s block %llu holds neither the acknowledged contents%s", t->spec,
                 (unsigned long long)b, t->uncertain[b] ? " nor the failed write's" : "");
        bad = 1;
    }
    free(got);
    plx_vdi_close(v);
    return bad ? -1 : 0;
}

/* ---- (a) The sweep ------------------------------------------------------------------------------
 */

struct sweep {
    plx_backend *fault;
    plx_store *st;
    uint64_t n; /* the injected I/O, 0 = none */
    int failures;
    char failed_ops[256];
    struct tree w, s1, s2, s3, c;
};

/* Injected errors that no call reported (store close included). */
static char absorbed[1024];

/* Calls that failed without setting any message ("" from plx_store_errmsg). */
static char no_message[2048];

/* Every call of the workload goes through here: success, or -EIO with a message. */
static int step(struct sweep *s, const char *what, int rc)
{
    if (rc >= 0)
        return 0;
    ck_assert_msg(rc == -EIO, "N=%llu: %s failed with %d, not -EIO (%s)", (unsigned long long)s->n,
                  what, rc, s->st ? plx_store_errmsg(s->st) : "store not open");
    if (s->st != NULL && plx_store_errmsg(s->st)[0] == '\0') {
        /* Reported at the end of the sweep, so that one missing message does not hide the
         * rest of the runs. */
        size_t l = strlen(no_message);
        snprintf(no_message + l, sizeof(no_message) - l, "%s %s (N=%llu: %s)", l ? "," : "", what,
                 (unsigned long long)s->n, watch_what);
    }
    s->failures++;
    size_t l = strlen(s->failed_ops);
    snprintf(s->failed_ops + l, sizeof(s->failed_ops) - l, "%s%s", l ? ", " : "", what);
    return -1;
}

static void sweep_write(struct sweep *s, plx_vdi *v, struct tree *t, uint64_t off, uint64_t len,
                        uint64_t seed, const char *what)
{
    unsigned char *raw = plx_block_alloc(len / BS + 2);
    /* Whole-block writes from an aligned buffer, others from an odd address. */
    unsigned char *buf = (off % BS == 0 && len % BS == 0) ? raw : raw + 1;
    tu_fill(buf, len, seed);
    int ok = step(s, what, plx_vdi_pwrite(v, buf, off, len, 0)) == 0;
    tree_apply(t, off, buf, len, ok);
    plx_block_free(raw);
}

struct inflight {
    int done, status;
    uint64_t off, len, index;
    unsigned char *raw;
};

static void inflight_done(void *arg, int status)
{
    struct inflight *f = arg;
    f->done++;
    f->status = status;
}

/* Writes to distinct ranges in flight together, with a snapshot among them and a flush at the
 * end; each completes with 0 or -EIO. */
static void sweep_burst(struct sweep *s, plx_vdi *v)
{
    enum { NW = 8, SNAP_AT = 4, NQ = NW + 2 };
    struct inflight q[NQ];
    memset(q, 0, sizeof(q));
    for (int i = 0; i < NQ; i++) {
        struct inflight *f = &q[i];
        int rc;
        int k = i < SNAP_AT ? i : i - 1;
        if (i == SNAP_AT) {
            rc = plx_vdi_submit_snapshot(v, "s3", &f->index, inflight_done, f);
        } else if (i == NQ - 1) {
            rc = plx_vdi_submit_flush(v, inflight_done, f);
        } else {
            /* Distinct ranges (a failed commit may fail several of them): some whole blocks,
             * some partial, some shared with snapshots. */
            static const uint64_t base[NW] = {0, 20, 3, 40, 8, 60, 11, 200};
            f->off = base[k] * BS + (k % 3 ? 0 : 33);
            f->len = (uint64_t)(1 + k % 3) * BS - (k % 3 ? 0 : 66);
            f->raw = plx_block_alloc(4);
            tu_fill(f->raw + 1, f->len, 1000 + (uint64_t)k);
            rc = plx_vdi_submit_write(v, f->raw + 1, f->off, f->len, 0, inflight_done, f);
        }
        if (step(s, "burst submit", rc))
            f->done = -1; /* never calls back */
    }
    for (int i = 0; i < NQ; i++) {
        if (q[i].done < 0)
            continue;
        int rc = plx_store_wait(s->st, &q[i].done);
        ck_assert_msg(rc == 0, "N=%llu: waiting for burst request %d: %d (%s)",
                      (unsigned long long)s->n, i, rc, plx_store_errmsg(s->st));
    }
    /* The model, in submission order. */
    for (int i = 0; i < NQ; i++) {
        struct inflight *f = &q[i];
        if (f->done < 0)
            continue;
        ck_assert_msg(f->done == 1, "N=%llu: burst request %d called back %d times",
                      (unsigned long long)s->n, i, f->done);
        int ok = step(s, "burst request", f->status) == 0;
        if (i == SNAP_AT) {
            if (ok) {
                char spec[32];
                snprintf(spec, sizeof(spec), "w@%llu", (unsigned long long)f->index);
                tree_copy(&s->s3, &s->w, spec);
            }
        } else if (f->raw != NULL) {
            tree_apply(&s->w, f->off, f->raw + 1, f->len, ok);
        }
        plx_block_free(f->raw);
    }
}

static void sweep_workload(struct sweep *s)
{
    char err[256] = "";
    int rc = plx_store_open_backend(keep_wrap(s->fault), NULL, &s->st, err, sizeof(err));
    if (rc) {
        ck_assert_msg(rc == -EIO, "N=%llu: open failed with %d (%s)", (unsigned long long)s->n, rc,
                      err);
        ck_assert_msg(err[0] != '\0', "N=%llu: open failed without a message",
                      (unsigned long long)s->n);
        ck_assert_ptr_null(s->st);
        s->failures++;
        snprintf(s->failed_ops, sizeof(s->failed_ops), "open");
        return;
    }
    plx_store *st = s->st;
    if (step(s, "create", plx_vdi_create(st, "w", VDI_SIZE, NULL)))
        return;
    s->w.exists = 1;
    snprintf(s->w.spec, sizeof(s->w.spec), "w");
    plx_vdi *v = NULL;
    if (step(s, "open w", plx_vdi_open(st, "w", 0, &v)))
        return;
    sweep_write(s, v, &s->w, 0, 4 * BS, 1, "write 1");
    sweep_write(s, v, &s->w, 10 * BS + 100, 3 * BS, 2, "write 2");
    sweep_write(s, v, &s->w, 100 * BS + 7, 1, 3, "write 3");
    uint64_t i1 = 0, i2 = 0;
    if (step(s, "snapshot 1", plx_vdi_snapshot_open(v, "s1", &i1)) == 0) {
        ck_assert_uint_ge(i1, 1);
        tree_copy(&s->s1, &s->w, "w@s1");
    } else {
        i1 = 0;
    }
    /* Copy-on-write of shared blocks, whole and partial. */
    sweep_write(s, v, &s->w, 2 * BS, 4 * BS, 4, "write 4");
    sweep_write(s, v, &s->w, 10 * BS + 50, 200, 5, "write 5");
    sweep_write(s, v, &s->w, 200 * BS, 2 * BS, 6, "write 6");
    if (step(s, "snapshot 2", plx_vdi_snapshot_open(v, NULL, &i2)) == 0) {
        char spec[32];
        snprintf(spec, sizeof(spec), "w@%llu", (unsigned long long)i2);
        ck_assert_uint_gt(i2, i1);
        tree_copy(&s->s2, &s->w, spec);
    }
    sweep_write(s, v, &s->w, 0, BS, 7, "write 7");
    /* A trim that failed may have zeroed part of its range: like a failed write of zeros. */
    static const unsigned char zeros[2 * BS];
    int ok = step(s, "trim w", plx_vdi_trim(v, 3 * BS + 10, 2 * BS)) == 0;
    tree_apply(&s->w, 3 * BS + 10, zeros, 2 * BS, ok);
    sweep_burst(s, v);
    step(s, "close w", plx_vdi_close(v));
    const struct tree *src = s->s1.exists ? &s->s1 : s->s2.exists ? &s->s2 : NULL;
    if (src == NULL)
        return;
    if (step(s, "clone", plx_vdi_clone(st, "c", src->spec, NULL)))
        return;
    tree_copy(&s->c, src, "c");
    if (step(s, "open c", plx_vdi_open(st, "c", 0, &v)))
        return;
    sweep_write(s, v, &s->c, 1 * BS, 2 * BS, 8, "write c 1");
    sweep_write(s, v, &s->c, 300, 5000, 9, "write c 2");
    step(s, "flush c", plx_vdi_flush(v));
    step(s, "close c", plx_vdi_close(v));
}

/* One run with the n-th I/O failing (0: none). Returns the I/Os the run submitted. */
static uint64_t sweep_run(const plx_backend *formatted_mem, uint64_t n, int *injected,
                          int *swallowed)
{
    struct sweep *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    s->n = n;
    submits = 0;
    watch_n = n;
    snprintf(watch_what, sizeof(watch_what), "?");
    s->fault = plx_fault_create(formatted_mem, 0);
    if (n)
        plx_fault_fail_nth(s->fault, n, -EIO);
    sweep_workload(s);
    int close_rc = 0;
    if (s->st != NULL)
        close_rc = plx_store_close(s->st); /* may fail: the image is checked below */
    uint64_t ios = plx_fault_io_count(s->fault);
    *injected = plx_fault_errors_injected(s->fault) > 0;
    if (*injected && s->failures == 0 && close_rc == 0) {
        size_t l = strlen(absorbed);
        snprintf(absorbed + l, sizeof(absorbed) - l, " N=%llu (%s)", (unsigned long long)n,
                 watch_what);
        (*swallowed)++;
    }
    plx_fault_clear(s->fault);

    plx_backend *img = image_now(s->fault);
    char what[320], why[256];
    snprintf(what, sizeof(what), "N=%llu (failed: %s)", (unsigned long long)n,
             s->failed_ops[0] ? s->failed_ops : "nothing");
    char err[256] = "";
    plx_store *st = NULL;
    int rc = plx_store_open_backend(img, NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s: the medium does not open: %d %s", what, rc, err);
    check_clean(st, what);
    struct tree *trees[] = {&s->w, &s->s1, &s->s2, &s->s3, &s->c};
    for (int i = 0; i < 5; i++)
        if (trees[i]->exists)
            ck_assert_msg(tree_verify(st, trees[i], why, sizeof(why)) == 0, "%s: %s", what, why);
    /* A run without failures did everything. */
    if (!*injected)
        ck_assert(s->w.exists && s->s1.exists && s->s2.exists && s->s3.exists && s->c.exists);
    ck_assert_int_eq(plx_store_close(st), 0);
    s->fault->ops->destroy(s->fault);
    free(s);
    return ios;
}

#define SWEEP_PARTS 4

START_TEST(test_sweep)
{
    plx_backend *mem = formatted(32 * MiB);
    int injected = 0, swallowed = 0;
    uint64_t total = sweep_run(mem, 0, &injected, &swallowed);
    ck_assert_int_eq(injected, 0);
    ck_assert_uint_gt(total, 20);
    /* Part _i takes N = _i+1, _i+1+PARTS, ...; one N beyond the end shows the run completes. */
    uint64_t runs = 0, n;
    for (n = (uint64_t)_i + 1;; n += SWEEP_PARTS) {
        sweep_run(mem, n, &injected, &swallowed);
        runs++;
        if (!injected)
            break;
        ck_assert_msg(n <= total + 64, "N=%llu: still injecting beyond the clean run's %llu I/Os",
                      (unsigned long long)n, (unsigned long long)total);
    }
    ck_assert_uint_gt(n, total);
    ck_assert_msg(no_message[0] == '\0', "calls failed with -EIO but no message:%s", no_message);
    fprintf(stderr,
            "faults: sweep part %d: %llu runs (N up to %llu of %llu I/Os), %d with the error "
            "absorbed without a failed call:%s\n",
            _i, (unsigned long long)runs, (unsigned long long)n, (unsigned long long)total,
            swallowed, absorbed);
    mem->ops->destroy(mem);
}
END_TEST

/* ---- (b) Read errors ----------------------------------------------------------------------------
 */

/* The block of the medium holding exactly `data`, or UINT64_MAX. */
static uint64_t find_block(const plx_backend *mem, const void *data)
{
    for (uint64_t b = 0; b < mem->nblocks; b++) {
        const void *p = plx_backend_mem_peek(mem, b);
        if (p != NULL && memcmp(p, data, BS) == 0)
            return b;
    }
    return UINT64_MAX;
}

START_TEST(test_data_read_error)
{
    plx_backend *mem = formatted(16 * MiB);
    plx_store *st = open_on(mem, "setup");
    ck_assert_int_eq(plx_vdi_create(st, "r", MiB, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "r", 0, &v), 0);
    unsigned char *ref = plx_block_alloc(16);
    tu_fill(ref, 16 * BS, 42);
    ck_assert_int_eq(plx_vdi_pwrite(v, ref, 0, 16 * BS, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    uint64_t pb = find_block(mem, ref + 5 * BS);
    ck_assert_msg(pb != UINT64_MAX, "VDI block 5 not found on the medium");

    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    st = open_on(fault, "faulty");
    ck_assert_int_eq(plx_vdi_open(st, "r", 0, &v), 0);
    plx_fault_fail_blocks(fault, PLX_IO_READ, pb, 1, -EIO, -1);
    unsigned char *got = plx_block_alloc(16);
    /* The block itself, alone and inside a larger request, unaligned too. */
    ck_assert_int_eq(plx_vdi_pread(v, got, 5 * BS, BS), -EIO);
    ck_assert_str_ne(plx_store_errmsg(st), "");
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, 16 * BS), -EIO);
    ck_assert_int_eq(plx_vdi_pread(v, got + 1, 5 * BS + 7, 10), -EIO);
    /* Its neighbours read fine, before and after the failures. */
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, 5 * BS), 0);
    ck_assert_mem_eq(got, ref, 5 * BS);
    ck_assert_int_eq(plx_vdi_pread(v, got, 6 * BS, 10 * BS), 0);
    ck_assert_mem_eq(got, ref + 6 * BS, 10 * BS);
    /* A partial write of the block needs its old contents: it fails; a whole-block write does
     * not read and succeeds; other blocks can be written. */
    unsigned char *w = plx_block_alloc(2);
    tu_fill(w, 2 * BS, 43);
    ck_assert_int_eq(plx_vdi_pwrite(v, w + 1, 5 * BS + 100, 50, 0), -EIO);
    ck_assert_int_eq(plx_vdi_pwrite(v, w, 9 * BS, 2 * BS, 0), 0);
    memcpy(ref + 9 * BS, w, 2 * BS);
    ck_assert_int_eq(plx_vdi_pwrite(v, w, 5 * BS, BS, 0), 0);
    memcpy(ref + 5 * BS, w, BS);
    /* Written in place: still the failing block. */
    int now = plx_vdi_pread(v, got, 5 * BS, BS);
    ck_assert(now == -EIO || (now == 0 && memcmp(got, w, BS) == 0));
    plx_fault_clear(fault);
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, 16 * BS), 0);
    ck_assert_mem_eq(got, ref, 16 * BS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st, "after read errors");
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_on(fault, "reopened");
    check_clean(st, "reopened after read errors");
    ck_assert_int_eq(plx_vdi_open(st, "r", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, 16 * BS), 0);
    ck_assert_mem_eq(got, ref, 16 * BS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(ref);
    plx_block_free(got);
    plx_block_free(w);
    fault->ops->destroy(fault);
}
END_TEST

/* A radix node that fails to load fails the request, and is loaded again by the next one. */
START_TEST(test_node_read_error_not_sticky)
{
    plx_backend *mem = formatted(16 * MiB);
    plx_store *st = open_on(mem, "setup");
    ck_assert_int_eq(plx_vdi_create(st, "n", 64 * MiB, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "n", 0, &v), 0);
    unsigned char *ref = plx_block_alloc(1);
    tu_fill(ref, BS, 7);
    ck_assert_int_eq(plx_vdi_pwrite(v, ref, 40 * MiB, BS, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);

    unsigned char *got = plx_block_alloc(1);
    /* Fail each of the first few I/Os of a cold read in turn. */
    for (uint64_t n = 1; n <= 4; n++) {
        st = open_on(fault, "cold");
        ck_assert_int_eq(plx_vdi_open(st, "n", 0, &v), 0);
        uint64_t before = plx_fault_errors_injected(fault);
        plx_fault_fail_nth(fault, n, -EIO);
        int rc = plx_vdi_pread(v, got, 40 * MiB, BS);
        int injected = plx_fault_errors_injected(fault) > before;
        ck_assert_msg(rc == (injected ? -EIO : 0), "n=%llu: read returned %d with %s injected",
                      (unsigned long long)n, rc, injected ? "an error" : "nothing");
        plx_fault_clear(fault);
        rc = plx_vdi_pread(v, got, 40 * MiB, BS);
        ck_assert_msg(rc == 0, "n=%llu: read after a failed load: %d (%s)", (unsigned long long)n,
                      rc, plx_store_errmsg(st));
        ck_assert_mem_eq(got, ref, BS);
        /* Writing through the same path works too. */
        rc = plx_vdi_pwrite(v, ref, 40 * MiB + BS, BS, 0);
        ck_assert_msg(rc == 0, "n=%llu: write: %d (%s)", (unsigned long long)n, rc,
                      plx_store_errmsg(st));
        ck_assert_int_eq(plx_vdi_close(v), 0);
        ck_assert_int_eq(plx_store_close(st), 0);
    }
    st = open_on(fault, "final");
    check_clean(st, "after node read errors");
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(ref);
    plx_block_free(got);
    fault->ops->destroy(fault);
}
END_TEST

/* ---- (c) Metadata write errors during copy-on-write --------------------------------------------
 */

/* Extents of `type`, read from the catalogue on the medium (block 2, first 127 extents). */
static int extents_of_type(const plx_backend *mem, unsigned type, uint64_t *out, int max)
{
    const struct plx_catalog_block *cb = plx_backend_mem_peek(mem, 2);
    ck_assert_ptr_nonnull(cb);
    ck_assert_uint_eq(cb->hdr.magic, PLX_MAGIC_CATALOG);
    int n = 0;
    for (uint32_t i = 0; i < cb->count && n < max; i++)
        if (cb->entries[i].type == type)
            out[n++] = cb->first_extent + i;
    return n;
}

START_TEST(test_metadata_write_error_cow)
{
    const uint64_t eb = MiB / BS;
    plx_backend *mem = formatted(16 * MiB);
    plx_store *st = open_on(mem, "setup");
    ck_assert_int_eq(plx_vdi_create(st, "m", 4 * MiB, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "m", 0, &v), 0);
    unsigned char *ref = malloc(4 * MiB), *snap = malloc(4 * MiB), *got = malloc(4 * MiB);
    tu_fill(ref, 4 * MiB, 5);
    ck_assert_int_eq(plx_vdi_pwrite(v, ref, 0, 4 * MiB, 0), 0);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "base", NULL), 0);
    memcpy(snap, ref, 4 * MiB);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    uint64_t meta[8];
    int nmeta = extents_of_type(mem, PLX_EXTENT_METADATA, meta, 8);
    ck_assert_int_eq(nmeta, 1);

    /* The variants: which of the metadata writes of the copy-on-write fails (1st, 2nd, ...). */
    for (int variant = 0; variant < (_i == 0 ? 1 : 4); variant++) {
        plx_backend *fault = plx_fault_create(mem, 0);
        unsigned char *mine = malloc(4 * MiB);
        memcpy(mine, ref, 4 * MiB);
        st = open_on(fault, "cow");
        ck_assert_int_eq(plx_vdi_open(st, "m", 0, &v), 0);
        unsigned char *w = malloc(3 * BS);
        tu_fill(w, 3 * BS, 100 + (uint64_t)variant);
        if (_i == 0) {
            plx_fault_fail_blocks(fault, PLX_IO_WRITE, meta[0] * eb, eb, -EIO, 1);
        } else {
            /* Let `variant` metadata writes through, then fail one. */
            plx_fault_fail_blocks(fault, PLX_IO_WRITE, meta[0] * eb, eb, 0, variant);
            plx_fault_fail_blocks(fault, PLX_IO_WRITE, meta[0] * eb, eb, -EIO, 1);
        }
        /* Unaligned, across a leaf boundary (blocks 511..513): copies two leaves. */
        uint64_t off = 511 * BS + 100;
        int rc = plx_vdi_pwrite(v, w, off, 2 * BS, 0);
        uint64_t inj = plx_fault_errors_injected(fault);
        plx_fault_clear(fault);
        if (inj > 0) {
            ck_assert_msg(rc == -EIO,
                          "variant %d: the write returned %d with a metadata write "
                          "failed",
                          variant, rc);
            ck_assert_str_ne(plx_store_errmsg(st), "");
        } else {
            ck_assert_int_eq(rc, 0);
            memcpy(mine + off, w, 2 * BS);
        }
        /* Later writes elsewhere, through other copied paths, succeed. */
        for (uint64_t k = 0; k < 4; k++) {
            uint64_t o = (100 + k * 200) * BS + k;
            tu_fill(w, 3 * BS, 200 + k);
            rc = plx_vdi_pwrite(v, w, o, 2 * BS, 0);
            ck_assert_msg(rc == 0, "variant %d: write %llu after the failure: %d (%s)", variant,
                          (unsigned long long)k, rc, plx_store_errmsg(st));
            memcpy(mine + o, w, 2 * BS);
        }
        /* And so does the range that failed, written again. */
        tu_fill(w, 3 * BS, 300);
        rc = plx_vdi_pwrite(v, w, off, 2 * BS, 0);
        ck_assert_msg(rc == 0, "variant %d: rewrite of the failed range: %d (%s)", variant, rc,
                      plx_store_errmsg(st));
        memcpy(mine + off, w, 2 * BS);
        ck_assert_int_eq(plx_vdi_pread(v, got, 0, 4 * MiB), 0);
        ck_assert_msg(memcmp(got, mine, 4 * MiB) == 0, "variant %d: contents before reopen",
                      variant);
        ck_assert_int_eq(plx_vdi_close(v), 0);
        plx_store_close(st);

        plx_backend *img = image_now(fault);
        char err[256] = "";
        int orc = plx_store_open_backend(img, NULL, &st, err, sizeof(err));
        ck_assert_msg(orc == 0, "variant %d: reopen: %d %s", variant, orc, err);
        check_clean(st, "after a metadata write error");
        ck_assert_int_eq(plx_vdi_open(st, "m", PLX_OPEN_READONLY, &v), 0);
        ck_assert_int_eq(plx_vdi_pread(v, got, 0, 4 * MiB), 0);
        ck_assert_msg(memcmp(got, mine, 4 * MiB) == 0, "variant %d: contents after reopen",
                      variant);
        ck_assert_int_eq(plx_vdi_close(v), 0);
        ck_assert_int_eq(plx_vdi_open(st, "m@base", 0, &v), 0);
        ck_assert_int_eq(plx_vdi_pread(v, got, 0, 4 * MiB), 0);
        ck_assert_msg(memcmp(got, snap, 4 * MiB) == 0, "variant %d: snapshot after reopen",
                      variant);
        ck_assert_int_eq(plx_vdi_close(v), 0);
        ck_assert_int_eq(plx_store_close(st), 0);
        free(w);
        free(mine);
        fault->ops->destroy(fault);
    }
    free(ref);
    free(snap);
    free(got);
    mem->ops->destroy(mem);
}
END_TEST

/* A snapshot whose commit fails, then a snapshot that succeeds: both the store and the second
 * snapshot are intact. */
START_TEST(test_failed_snapshot_then_snapshot)
{
    plx_backend *mem = formatted(16 * MiB);
    plx_store *st = open_on(mem, "setup");
    ck_assert_int_eq(plx_vdi_create(st, "s", MiB, NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    st = open_on(fault, "faulty");
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "s", 0, &v), 0);
    unsigned char *a = plx_block_alloc(1), *b = plx_block_alloc(1), *got = plx_block_alloc(1);
    tu_fill(a, BS, 1);
    tu_fill(b, BS, 2);
    ck_assert_int_eq(plx_vdi_pwrite(v, a, 0, BS, 0), 0);
    /* Every flush fails once: the first snapshot's commit cannot complete. */
    plx_fault_fail_blocks(fault, PLX_IO_FLUSH, 0, 0, -EIO, 1);
    int rc = plx_vdi_snapshot_open(v, NULL, NULL);
    ck_assert_int_eq(rc, -EIO);
    plx_fault_clear(fault);
    ck_assert_int_eq(plx_vdi_pwrite(v, b, 0, BS, 0), 0);
    uint64_t idx = 0;
    rc = plx_vdi_snapshot_open(v, "after", &idx);
    ck_assert_msg(rc == 0, "snapshot after a failed one: %d (%s)", rc, plx_store_errmsg(st));
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    plx_backend *img = image_now(fault);
    char err[256] = "";
    rc = plx_store_open_backend(img, NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "reopen after a failed snapshot and a good one: %d %s", rc, err);
    check_clean(st, "after failed snapshot");
    ck_assert_int_eq(plx_vdi_open(st, "s@after", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, BS), 0);
    ck_assert_mem_eq(got, b, BS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    plx_block_free(a);
    plx_block_free(b);
    plx_block_free(got);
    fault->ops->destroy(fault);
}
END_TEST

/* ---- (d) ENOSPC
 * ------------------------------------------------------------------------------------ */

START_TEST(test_enospc)
{
    const uint64_t vsize = 64 * MiB, chunk = 64 * KiB;
    plx_backend *mem = formatted(8 * MiB); /* 8 extents of 1 MiB: about 6 MiB of data */
    plx_backend *fault = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = open_on(fault, "enospc");
    ck_assert_int_eq(plx_vdi_create(st, "big", vsize, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "big", 0, &v), 0);
    unsigned char *ref = calloc(1, vsize), *got = malloc(vsize);
    uint64_t off = 0, acked = 0;
    int rc = 0;
    for (; off + chunk <= vsize; off += chunk) {
        tu_fill(ref + off, chunk, off);
        rc = plx_vdi_pwrite(v, ref + off, off, chunk, off % (4 * chunk) == 0 ? PLX_WRITE_FUA : 0);
        if (rc)
            break;
        acked = off + chunk;
    }
    ck_assert_msg(rc == -ENOSPC, "writing until full ended with %d (%s) at %llu", rc,
                  plx_store_errmsg(st), (unsigned long long)off);
    ck_assert_str_ne(plx_store_errmsg(st), "");
    ck_assert_uint_gt(acked, 4 * MiB);
    ck_assert_uint_lt(acked, 8 * MiB);
    /* The failed write may have landed in part: forget what the model thought of it. */
    uint64_t lost = off;
    /* More writes to new places fail the same way, and nothing crashes. */
    for (int i = 0; i < 3; i++) {
        rc = plx_vdi_pwrite(v, ref, vsize - chunk * (uint64_t)(i + 1), chunk, 0);
        ck_assert_msg(rc == -ENOSPC, "write %d when full: %d", i, rc);
    }
    /* Acknowledged data is intact; rewriting it in place needs no space. */
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, acked), 0);
    ck_assert_msg(memcmp(got, ref, acked) == 0, "acknowledged data changed after ENOSPC");
    tu_fill(ref + chunk, chunk, 777);
    rc = plx_vdi_pwrite(v, ref + chunk, chunk, chunk, 0);
    ck_assert_msg(rc == 0, "rewriting allocated blocks when full: %d (%s)", rc,
                  plx_store_errmsg(st));
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    struct plx_store_info in;
    ck_assert_int_eq(plx_store_info(st, &in), 0);
    ck_assert_uint_eq(in.extents_by_type[PLX_EXTENT_UNUSED], 0);
    check_clean(st, "full store");
    ck_assert_int_eq(plx_store_close(st), 0);

    plx_backend *img = image_now(fault);
    char err[256] = "";
    rc = plx_store_open_backend(img, NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "reopen full store: %d %s", rc, err);
    check_clean(st, "full store reopened");
    ck_assert_int_eq(plx_vdi_open(st, "big", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, got, 0, acked), 0);
    ck_assert_msg(memcmp(got, ref, acked) == 0, "acknowledged data changed after reopen");
    ck_assert_int_eq(plx_vdi_pread(v, got, lost + chunk, vsize - lost - chunk), 0);
    for (uint64_t i = 0; i < vsize - lost - chunk; i++)
        if (got[i] != 0)
            ck_abort_msg("byte %llu beyond the failed write is not zero",
                         (unsigned long long)(lost + chunk + i));
    /* Still full after reopening: new blocks fail, in-place writes succeed. */
    rc = plx_vdi_pwrite(v, ref, vsize - chunk, chunk, 0);
    ck_assert_msg(rc == -ENOSPC, "write to a new place after reopen: %d", rc);
    rc = plx_vdi_pwrite(v, ref, 0, chunk, 0);
    ck_assert_msg(rc == 0, "in-place write after reopen: %d (%s)", rc, plx_store_errmsg(st));
    /* A snapshot needs a new root: it may fail for lack of space, but cleanly. After one,
     * rewriting needs copies, which fail for lack of space; the snapshot keeps the data. */
    rc = plx_vdi_snapshot_open(v, NULL, NULL);
    ck_assert_msg(rc == 0 || rc == -ENOSPC, "snapshot when full: %d", rc);
    if (rc == 0) {
        rc = plx_vdi_pwrite(v, got, 0, chunk, 0);
        ck_assert_msg(rc == -ENOSPC, "copy-on-write when full: %d", rc);
        plx_vdi *s1 = NULL;
        ck_assert_int_eq(plx_vdi_open(st, "big@1", 0, &s1), 0);
        ck_assert_int_eq(plx_vdi_pread(s1, got, 0, acked), 0);
        ck_assert_msg(memcmp(got, ref, acked) == 0, "snapshot of the full store");
        ck_assert_int_eq(plx_vdi_close(s1), 0);
    }
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st, "full store at the end");
    ck_assert_int_eq(plx_store_close(st), 0);
    free(ref);
    free(got);
    fault->ops->destroy(fault);
}
END_TEST

/* Fill the store until a write fails with -ENOSPC, then do `what`, then close the VDI: closing
 * must not wait forever for the failed request's batch. */
static void fill_then(int what)
{
    const uint64_t chunk = 64 * KiB;
    plx_backend *mem = formatted(8 * MiB);
    plx_store *st = open_on(mem, "fill");
    ck_assert_int_eq(plx_vdi_create(st, "f", 64 * MiB, NULL), 0);
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, "f", 0, &v), 0);
    unsigned char *buf = malloc(chunk);
    tu_fill(buf, chunk, 1);
    int rc = 0;
    uint64_t off = 0;
    for (; off < 64 * MiB && rc == 0; off += chunk)
        rc = plx_vdi_pwrite(v, buf, off, chunk, 0);
    ck_assert_int_eq(rc, -ENOSPC);
    if (what == 1) {
        rc = plx_vdi_snapshot_open(v, NULL, NULL);
        ck_assert_msg(rc == 0 || rc == -ENOSPC, "snapshot when full: %d", rc);
    }
    fprintf(stderr, "faults: full after %llu KiB; closing the VDI%s\n",
            (unsigned long long)(off / KiB), what ? " after a snapshot attempt" : "");
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st, "filled");
    ck_assert_int_eq(plx_store_close(st), 0);
    free(buf);
    mem->ops->destroy(mem);
}

START_TEST(test_enospc_then_close)
{
    fill_then(_i);
}
END_TEST

static Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("sweep");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_sweep, 0, SWEEP_PARTS);
    suite_add_tcase(s, tc);

    tc = tcase_create("targeted");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_data_read_error);
    tcase_add_test(tc, test_node_read_error_not_sticky);
    tcase_add_loop_test(tc, test_metadata_write_error_cow, 0, 2);
    tcase_add_test(tc, test_failed_snapshot_then_snapshot);
    suite_add_tcase(s, tc);

    /* Short timeouts: these hang when a failed request leaves its VDI busy for ever. */
    tc = tcase_create("enospc");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_enospc);
    tcase_add_loop_test(tc, test_enospc_then_close, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(faults_suite)
