/*
 * crash_registry.c - the crash harness's registry cases (test_crash.c): the registry under
 * crashes (many VDIs, the upgrade from version 1) and held trees under crashes.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crash.h"
#include "hold.h"

/* ---- The registry under crashes: many VDIs, and the upgrade from version 1 -------------------
 *
 * Creates and deletes that grow the VDI table past one block (508 ids) and split name-index
 * buckets (254 names), then an upgrade of a version-1 store, each crashed at sampled positions.
 * After a crash at P the registry must be the one after the last operation that returned before
 * P, or after the one in flight: every VDI live in both is found by name with its id, every name
 * absent from both is not found, check finds no error. A writable reopen then creates, deletes,
 * collects and checks clean. */

#define REG_NAMES 700u

enum { REG_CREATE, REG_DELETE, REG_GC };
struct reg_op {
    int kind;
    unsigned name;
    uint64_t id;  /* REG_CREATE: the id it got */
    uint64_t end; /* log position once it returned */
};

struct reg_run {
    plx_backend *fb;
    struct reg_op *ops;
    size_t nops, cap;
    unsigned long long images, violations;
};

static void reg_name(unsigned i, char *buf, size_t len)
{
    snprintf(buf, len, "r%04u", i);
}

static void reg_do(struct reg_run *r, plx_store *st, int kind, unsigned name)
{
    char nm[32];
    reg_name(name, nm, sizeof nm);
    struct reg_op op = {.kind = kind, .name = name};
    if (kind == REG_CREATE)
        ck_assert_int_eq(plx_vdi_create(st, nm, 2 * MIB, &op.id), 0);
    else if (kind == REG_DELETE)
        ck_assert_int_eq(plx_vdi_delete(st, nm), 0);
    else
        ck_assert_int_eq(plx_gc(st, 0, &(struct plx_gc_report){0}), 0);
    op.end = plx_fault_log_position(r->fb);
    if (r->nops == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 1024;
        r->ops = realloc(r->ops, r->cap * sizeof *r->ops);
        ck_assert_ptr_nonnull(r->ops);
    }
    r->ops[r->nops++] = op;
}

/* The id of each name after the first `upto` operations (0 = not live). */
static void reg_state(const struct reg_run *r, size_t upto, uint64_t *ids)
{
    memset(ids, 0, REG_NAMES * sizeof *ids);
    for (size_t i = 0; i < upto && i < r->nops; i++) {
        if (r->ops[i].kind == REG_CREATE)
            ids[r->ops[i].name] = r->ops[i].id;
        else if (r->ops[i].kind == REG_DELETE)
            ids[r->ops[i].name] = 0;
    }
}

static void reg_violation(struct reg_run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void reg_violation(struct reg_run *r, const char *fmt, ...)
{
    if (r->violations++ < MAX_MSGS) {
        va_list ap;
        va_start(ap, fmt);
        fputs("VIOLATION [registry] ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

/* Every name: found with the id both acceptable states agree on, or absent from both. */
static void reg_verify_names(struct reg_run *r, plx_store *st, const uint64_t *a, const uint64_t *b,
                             const char *where)
{
    for (unsigned i = 0; i < REG_NAMES; i++) {
        char nm[32];
        reg_name(i, nm, sizeof nm);
        struct plx_vdi_info vi;
        int rc = plx_vdi_lookup(st, nm, &vi);
        if (a[i] == b[i] && a[i] && (rc != 0 || vi.id != a[i]))
            reg_violation(r, "%s: %s should be VDI %llu: rc %d %s", where, nm,
                          (unsigned long long)a[i], rc, rc ? plx_store_errmsg(st) : "");
        else if (a[i] == b[i] && !a[i] && rc != -ENOENT)
            reg_violation(r, "%s: %s should not exist: rc %d, id %llu", where, nm, rc,
                          (unsigned long long)vi.id);
        else if (a[i] != b[i] && rc == 0 && vi.id != a[i] && vi.id != b[i])
            reg_violation(r, "%s: %s is VDI %llu, neither %llu nor %llu", where, nm,
                          (unsigned long long)vi.id, (unsigned long long)a[i],
                          (unsigned long long)b[i]);
        else if (rc != 0 && rc != -ENOENT)
            reg_violation(r, "%s: looking up %s: %d %s", where, nm, rc, plx_store_errmsg(st));
    }
}

static plx_store *reg_open(plx_backend *img, int read_only, const char *where, struct reg_run *r)
{
    char err[512] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = read_only};
    plx_store *st = NULL;
    int rc = plx_store_open_backend(img, &o, &st, err, sizeof err);
    if (rc)
        reg_violation(r, "%s: open: %d %s", where, rc, err);
    return st;
}

static void reg_check(struct reg_run *r, plx_store *st, bool leaks_too, const char *where)
{
    struct plx_check_report cr;
    int rc = plx_check(st, &cr, NULL, NULL);
    g_tot->checks++;
    if (rc || cr.errors || (leaks_too && cr.leaked_blocks))
        reg_violation(r, "%s: check: rc %d, %llu errors, %llu leaked", where, rc,
                      (unsigned long long)cr.errors, (unsigned long long)cr.leaked_blocks);
}

/* A writable reopen after the crash: the registry takes new work and collects clean. */
static void reg_recover(struct reg_run *r, plx_backend *img, const uint64_t *ids, const char *where)
{
    plx_store *st = reg_open(img, 0, where, r);
    if (!st)
        return;
    uint64_t id = 0;
    int rc = plx_vdi_create(st, "after-crash", 2 * MIB, &id);
    struct plx_vdi_info vi;
    if (rc || plx_vdi_lookup(st, "after-crash", &vi) || vi.id != id)
        reg_violation(r, "%s: create after the crash: %d %s", where, rc, plx_store_errmsg(st));
    for (unsigned i = 0; i < REG_NAMES; i++) {
        char nm[32];
        reg_name(i, nm, sizeof nm);
        if (ids[i]) { /* a name live in both states: delete it and take it again */
            if (plx_vdi_delete(st, nm) || plx_vdi_create(st, nm, 2 * MIB, NULL) ||
                plx_vdi_lookup(st, nm, &vi))
                reg_violation(r, "%s: recreating %s: %s", where, nm, plx_store_errmsg(st));
            break;
        }
    }
    rc = plx_gc(st, 0, &(struct plx_gc_report){0});
    if (rc)
        reg_violation(r, "%s: gc: %d %s", where, rc, plx_store_errmsg(st));
    reg_check(r, st, true, where);
    plx_store_close(st);
}

static void reg_sweep(struct reg_run *r, uint64_t from, uint64_t to, unsigned want)
{
    uint64_t total = plx_fault_crash_points(r->fb, NULL, 0);
    uint64_t *pts = malloc((total + 1) * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(r->fb, pts, total);
    size_t n = 0;
    for (uint64_t i = 0; i < total; i++)
        if (pts[i] > from && pts[i] <= to && (n == 0 || pts[i] != pts[n - 1]))
            pts[n++] = pts[i];
    size_t step = n > want ? n / want : 1;
    uint64_t *a = calloc(REG_NAMES, sizeof *a), *b = calloc(REG_NAMES, sizeof *b);
    uint64_t *both = calloc(REG_NAMES, sizeof *both);
    struct plx_crash_cursor *c = plx_crash_cursor_new(r->fb);
    size_t done = 0; /* operations that returned before the position */
    for (size_t k = 0; k < n; k += step) {
        uint64_t p = pts[k];
        while (done < r->nops && r->ops[done].end <= p)
            done++;
        reg_state(r, done, a);
        reg_state(r, done + 1, b);
        for (unsigned i = 0; i < REG_NAMES; i++)
            both[i] = a[i] == b[i] ? a[i] : 0;
        plx_crash_cursor_seek(c, p);
        const enum plx_crash_mode modes[] = {PLX_CRASH_DROP_UNFLUSHED, PLX_CRASH_KEEP_ALL,
                                             PLX_CRASH_RANDOM};
        for (size_t m = 0; m < 3; m++) {
            char where[96];
            snprintf(where, sizeof where, "crash at %llu (after op %zu), mode %zu",
                     (unsigned long long)p, done, m);
            snprintf(g_ctx, sizeof g_ctx, "registry %s", where);
            plx_store *st = reg_open(plx_crash_cursor_image(c, modes[m], p), 1, where, r);
            r->images++;
            if (st) {
                reg_check(r, st, false, where);
                reg_verify_names(r, st, a, b, where);
                plx_store_close(st);
            }
            if (m != 1 && (k / step) % 4 == 0)
                reg_recover(r, plx_crash_cursor_image(c, modes[m], p), both, where);
        }
    }
    g_ctx[0] = 0;
    plx_crash_cursor_free(c);
    free(pts);
    free(a);
    free(b);
    free(both);
}

START_TEST(test_crash_registry)
{
    struct reg_run r = {0};
    plx_backend *mem = plx_backend_mem_create(STORE_BYTES / BS * 4);
    char err[256] = "";
    ck_assert_int_eq(plx_format_backend(mem, EXTENT_BYTES, err, sizeof err), 0);
    r.fb = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    plx_store *st = reg_open(tu_keep_wrap(r.fb), 0, "workload", &r);
    ck_assert_ptr_nonnull(st);
    uint64_t p0 = plx_fault_log_position(r.fb);
    /* 600 creates: the table grows a level at id 508, buckets split from name 255 on. */
    for (unsigned i = 0; i < 600; i++)
        reg_do(&r, st, REG_CREATE, i);
    for (unsigned i = 0; i < 600; i += 3)
        reg_do(&r, st, REG_DELETE, i);
    reg_do(&r, st, REG_GC, 0);
    for (unsigned i = 0; i < 600; i += 6) /* names taken again, new ids */
        reg_do(&r, st, REG_CREATE, i);
    for (unsigned i = 600; i < REG_NAMES; i++)
        reg_do(&r, st, REG_CREATE, i);
    /* Most of the rest go: the purge merges the name buckets they thinned and drops the VDI
     * table's first leaf (ids 1..507, all deleted now). */
    for (unsigned i = 0; i < 560; i++)
        if (i % 3 != 0)
            reg_do(&r, st, REG_DELETE, i);
    reg_do(&r, st, REG_GC, 0);
    uint64_t p1 = plx_fault_log_position(r.fb);
    ck_assert_int_eq(plx_store_close(st), 0);
    reg_sweep(&r, p0, p1, tu_quick() ? 60 : 160);
    printf("crash[registry]: %zu operations, %llu images, %llu violations\n", r.nops, r.images,
           r.violations);
    g_tot->images += r.images;
    g_tot->failures += r.violations;
    free(r.ops);
    r.fb->ops->destroy(r.fb);
    ck_assert_msg(r.violations == 0, "%llu violations", r.violations);
}
END_TEST

/* ---- Held trees under crashes (issue 29): deletes and gc while readers hold the trees ----------
 *
 * A reader (another store of this process, so alive in every image) holds a snapshot, a clone
 * and a VDI open read-only; the writer deletes all three (and the snapshot's VDI), collects,
 * writes a new VDI into the space a collection could have freed and collects again. A crash at
 * every position of the deletes and the first collection, and at sampled ones after: every image
 * opens, check finds no error (it walks the held trees: a freed or reused block of one is an
 * error), the three holds are there and each held tree reads back exactly what the reader opened,
 * and so does the live VDI beside them. Every fourth image is reopened writable and collected
 * again: the same must hold after that collection. */

enum { HELD_TREES = 3 };
struct held_run {
    plx_backend *fb;
    uint64_t id[HELD_TREES], snap[HELD_TREES]; /* what each hold names */
    unsigned long long images, violations;
};

static void held_violation(struct held_run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void held_violation(struct held_run *r, const char *fmt, ...)
{
    if (r->violations++ < MAX_MSGS) {
        va_list ap;
        va_start(ap, fmt);
        fputs("VIOLATION [held] ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

/* Block vb of tree t (0 ro@1, 1 cl, 2 plain, 3 live) as written: (tag, vb) patterns. */
static uint32_t held_tag(int t, uint64_t vb)
{
    switch (t) {
    case 0: /* ro@1: 300 blocks of tag 1 */
        return vb < 300 ? 1 : 0;
    case 1: /* cl: a clone of ro@1 with 100..199 rewritten */
        return vb < 300 ? (vb >= 100 && vb < 200 ? 3 : 1) : 0;
    case 2: /* plain */
        return vb < 200 ? 4 : 0;
    default: /* live */
        return vb < 100 ? 5 : 0;
    }
}

static void held_pattern(uint8_t *blk, uint32_t tag, uint64_t vb)
{
    if (!tag) {
        memset(blk, 0, BS);
        return;
    }
    tu_fill(blk, BS, ((uint64_t)tag << 32) ^ vb ^ 0x686c64ull);
}

static void held_write(plx_store *st, const char *vdi, uint64_t vb0, uint64_t n, uint32_t tag)
{
    plx_vdi *v = NULL;
    ck_assert_int_eq(plx_vdi_open(st, vdi, 0, &v), 0);
    uint8_t *buf = plx_block_alloc(n);
    for (uint64_t i = 0; i < n; i++)
        held_pattern(buf + i * BS, tag, vb0 + i);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, vb0 * BS, n * BS, 0), 0);
    plx_block_free(buf);
    ck_assert_int_eq(plx_vdi_close(v), 0);
}

/* Read virtual block vb of the tree at root straight from the medium (a deleted tree has no
 * name to open it by). */
static int held_read_block(plx_store *st, uint64_t root, unsigned height, uint64_t vb, uint8_t *out)
{
    uint64_t *node = plx_block_alloc(1), addr = root;
    int rc = 0;
    for (int level = (int)height - 1; level >= 0 && !rc; level--) {
        rc = plx_sync_io(st, PLX_IO_READ, addr, 1, node, 0);
        uint64_t link = node[(vb >> ((unsigned)level * PLX_RADIX_BITS)) & (PLX_RADIX_FANOUT - 1)];
        if (!rc && !link) {
            memset(out, 0, BS);
            plx_block_free(node);
            return 0;
        }
        addr = plx_link_addr(link);
    }
    if (!rc)
        rc = plx_sync_io(st, PLX_IO_READ, addr, 1, out, 0);
    plx_block_free(node);
    return rc;
}

static uint64_t held_compare(plx_store *st, uint64_t root, unsigned height, int t)
{
    uint8_t *got = plx_block_alloc(1), *want = plx_block_alloc(1);
    uint64_t bad = 0;
    for (uint64_t vb = 0; vb < 320; vb++) {
        held_pattern(want, held_tag(t, vb), vb);
        if (held_read_block(st, root, height, vb, got) || memcmp(got, want, BS) != 0)
            bad++;
    }
    plx_block_free(got);
    plx_block_free(want);
    return bad;
}

struct held_seen {
    struct held_run *r;
    plx_store *st;
    unsigned found;
    uint64_t bad;
};

static int held_each(void *arg, const struct plx_hold *h)
{
    struct held_seen *s = arg;
    for (int t = 0; t < HELD_TREES; t++) {
        if (h->vdi_id == s->r->id[t] && h->snap == s->r->snap[t]) {
            s->found |= 1u << t;
            s->bad += held_compare(s->st, h->root, h->height, t);
        }
    }
    return 0;
}

static void held_verify(struct held_run *r, plx_store *st, const char *where)
{
    struct plx_check_report cr;
    int rc = plx_check(st, &cr, NULL, NULL);
    g_tot->checks++;
    if (rc || cr.errors)
        held_violation(r, "%s: check: rc %d, %llu errors", where, rc,
                       (unsigned long long)cr.errors);
    struct held_seen s = {.r = r, .st = st};
    rc = plx_hold_each_live(st, held_each, &s);
    if (rc || s.found != (1u << HELD_TREES) - 1 || s.bad)
        held_violation(r, "%s: holds: rc %d, found 0x%x of 0x7, %llu blocks read back wrong", where,
                       rc, s.found, (unsigned long long)s.bad);
    struct plx_vdi_info vi;
    rc = plx_vdi_lookup(st, "live", &vi);
    uint64_t bad = rc ? 1 : held_compare(st, vi.root, vi.height, 3);
    if (bad)
        held_violation(r, "%s: VDI live: rc %d, %llu blocks wrong", where, rc,
                       (unsigned long long)bad);
}

static plx_store *held_open(struct held_run *r, plx_backend *img, int read_only, const char *where)
{
    char err[512] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = read_only};
    plx_store *st = NULL;
    int rc = plx_store_open_backend(img, &o, &st, err, sizeof err);
    if (rc)
        held_violation(r, "%s: open: %d %s", where, rc, err);
    return st;
}

START_TEST(test_crash_held)
{
    struct held_run r = {0};
    plx_backend *mem = plx_backend_mem_create(STORE_BYTES / BS);
    char err[256] = "";
    ck_assert_int_eq(plx_format_backend(mem, EXTENT_BYTES, err, sizeof err), 0);
    r.fb = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    snprintf(g_ctx, sizeof g_ctx, "held: fixture");
    plx_store *st = held_open(&r, tu_keep_wrap(r.fb), 0, "writer");
    ck_assert_ptr_nonnull(st);
    uint64_t ro = 0, cl = 0, plain = 0;
    ck_assert_int_eq(plx_vdi_create(st, "ro", 8 * MIB, &ro), 0);
    held_write(st, "ro", 0, 300, 1);
    ck_assert_int_eq(plx_vdi_snapshot(st, "ro", NULL, NULL), 0);
    held_write(st, "ro", 0, 50, 2);
    ck_assert_int_eq(plx_vdi_clone(st, "cl", "ro@1", &cl), 0);
    held_write(st, "cl", 100, 100, 3);
    ck_assert_int_eq(plx_vdi_create(st, "plain", 8 * MIB, &plain), 0);
    held_write(st, "plain", 0, 200, 4);
    ck_assert_int_eq(plx_vdi_create(st, "live", 8 * MIB, NULL), 0);
    held_write(st, "live", 0, 100, 5);
    r.id[0] = ro, r.snap[0] = 1;
    r.id[1] = cl, r.id[2] = plain;

    /* The reader: holds the three trees (and has read them) through the whole run. */
    plx_store *rd = held_open(&r, tu_keep_wrap(r.fb), 0, "reader");
    ck_assert_ptr_nonnull(rd);
    plx_vdi *h[HELD_TREES];
    static const char *specs[HELD_TREES] = {"ro@1", "cl", "plain"};
    uint8_t *buf = plx_block_alloc(320);
    for (int t = 0; t < HELD_TREES; t++) {
        ck_assert_int_eq(plx_vdi_open(rd, specs[t], PLX_OPEN_READONLY, &h[t]), 0);
        ck_assert_int_eq(plx_vdi_pread(h[t], buf, 0, 320 * BS), 0);
    }

    snprintf(g_ctx, sizeof g_ctx, "held: deletes and gc");
    uint64_t p0 = plx_fault_log_position(r.fb);
    ck_assert_int_eq(plx_snap_delete(st, "ro@1"), 0);
    ck_assert_int_eq(plx_vdi_delete(st, "ro"), 0);
    ck_assert_int_eq(plx_vdi_delete(st, "cl"), 0);
    ck_assert_int_eq(plx_vdi_delete(st, "plain"), 0);
    ck_assert_int_eq(plx_gc(st, 0, &(struct plx_gc_report){0}), 0);
    uint64_t p_gc = plx_fault_log_position(r.fb);
    ck_assert_int_eq(plx_vdi_create(st, "filler", 16 * MIB, NULL), 0);
    held_write(st, "filler", 0, 2000, 6);
    ck_assert_int_eq(plx_gc(st, 0, &(struct plx_gc_report){0}), 0);
    uint64_t p1 = plx_fault_log_position(r.fb);
    /* What the reader reads is what it opened. */
    uint8_t *want = plx_block_alloc(1);
    uint64_t bad = 0;
    for (int t = 0; t < HELD_TREES; t++) {
        ck_assert_int_eq(plx_vdi_pread(h[t], buf, 0, 320 * BS), 0);
        for (uint64_t vb = 0; vb < 320; vb++) {
            held_pattern(want, held_tag(t, vb), vb);
            bad += memcmp(buf + vb * BS, want, BS) != 0;
        }
    }
    ck_assert_msg(bad == 0, "the reader read %llu blocks wrong", (unsigned long long)bad);
    plx_block_free(want);
    plx_block_free(buf);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Every crash point of the deletes and the first gc, sampled ones of the rest. */
    uint64_t total = plx_fault_crash_points(r.fb, NULL, 0);
    uint64_t *pts = malloc((total + 1) * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(r.fb, pts, total);
    size_t n = 0;
    for (uint64_t i = 0; i < total; i++)
        if (pts[i] > p0 && pts[i] <= p1 && (n == 0 || pts[i] != pts[n - 1]))
            pts[n++] = pts[i];
    size_t late = 0;
    while (late < n && pts[late] <= p_gc)
        late++;
    size_t want_late = tu_quick() ? 10 : 40;
    size_t step = n - late > want_late ? (n - late) / want_late : 1;
    struct plx_crash_cursor *c = plx_crash_cursor_new(r.fb);
    size_t done = 0;
    for (size_t k = 0; k < n; k += k < late ? 1 : step, done++) {
        uint64_t p = pts[k];
        plx_crash_cursor_seek(c, p);
        const enum plx_crash_mode modes[] = {PLX_CRASH_DROP_UNFLUSHED, PLX_CRASH_KEEP_ALL,
                                             PLX_CRASH_RANDOM};
        for (size_t m = 0; m < 3; m++) {
            char where[96];
            snprintf(where, sizeof where, "crash at %llu (%s), mode %zu", (unsigned long long)p,
                     p <= p_gc ? "deletes and gc" : "filler and gc", m);
            snprintf(g_ctx, sizeof g_ctx, "held %s", where);
            plx_store *im = held_open(&r, plx_crash_cursor_image(c, modes[m], p), 1, where);
            r.images++;
            if (im) {
                held_verify(&r, im, where);
                plx_store_close(im);
            }
            if (m != 1 && done % 4 == 0) {
                char w2[128];
                snprintf(w2, sizeof w2, "%s, reopened and collected", where);
                im = held_open(&r, plx_crash_cursor_image(c, modes[m], p), 0, w2);
                if (im) {
                    int rc = plx_gc(im, 0, &(struct plx_gc_report){0});
                    if (rc)
                        held_violation(&r, "%s: gc: %d %s", w2, rc, plx_store_errmsg(im));
                    held_verify(&r, im, w2);
                    plx_store_close(im);
                }
            }
        }
    }
    g_ctx[0] = 0;
    plx_crash_cursor_free(c);
    free(pts);
    for (int t = 0; t < HELD_TREES; t++)
        ck_assert_int_eq(plx_vdi_close(h[t]), 0);
    ck_assert_int_eq(plx_store_close(rd), 0);
    printf("crash[held]: %zu crash points (%zu of the deletes and gc), %llu images, %llu "
           "violations\n",
           done, late, r.images, r.violations);
    g_tot->images += r.images;
    g_tot->failures += r.violations;
    r.fb->ops->destroy(r.fb);
    ck_assert_msg(r.violations == 0, "%llu violations", r.violations);
}
END_TEST

/* The upgrade of a version-1 store, crashed at every position: whatever the crash left, the
 * upgrade run again finishes it, and the VDIs are all there. */
START_TEST(test_crash_upgrade)
{
    struct reg_run r = {0};
    plx_backend *mem = plx_backend_mem_create(STORE_BYTES / BS * 4);
    char err[512] = "";
    ck_assert_int_eq(plx_format_backend(mem, 4 * MIB, err, sizeof err), 0);
    plx_store *st = reg_open(tu_keep_wrap(mem), 0, "fixture", &r);
    ck_assert_ptr_nonnull(st);
    uint64_t ids[REG_NAMES] = {0};
    for (unsigned i = 0; i < 300; i++) {
        char nm[32];
        reg_name(i, nm, sizeof nm);
        ck_assert_int_eq(plx_vdi_create(st, nm, 2 * MIB, &ids[i]), 0);
    }
    for (unsigned i = 0; i < 300; i += 7) {
        char nm[32];
        reg_name(i, nm, sizeof nm);
        ck_assert_int_eq(plx_vdi_delete(st, nm), 0);
        ids[i] = 0;
    }
    ck_assert_int_eq(plx_store_close(st), 0);
    tu_make_v1(mem); /* 4 MiB extents: room for 1,020 version-1 slots in extent 0 */
    r.fb = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);

    uint64_t p0 = plx_fault_log_position(r.fb);
    int upgraded = 0;
    ck_assert_int_eq(
        plx_store_upgrade_backend(tu_keep_wrap(r.fb), NULL, &upgraded, err, sizeof err), 0);
    ck_assert_int_eq(upgraded, 1);
    uint64_t p1 = plx_fault_log_position(r.fb);

    uint64_t total = plx_fault_crash_points(r.fb, NULL, 0);
    uint64_t *pts = malloc((total + 1) * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(r.fb, pts, total);
    size_t n = 0;
    pts[n++] = p0;
    for (uint64_t i = 0; i < total; i++)
        if (pts[i] > p0 && pts[i] <= p1 && pts[i] != pts[n - 1])
            pts[n++] = pts[i];
    size_t want = tu_quick() ? 40 : 100, step = n > want ? n / want : 1;
    struct plx_crash_cursor *c = plx_crash_cursor_new(r.fb);
    for (size_t k = 0; k < n; k += step) {
        plx_crash_cursor_seek(c, pts[k]);
        for (int m = 0; m < 3; m++) {
            char where[96];
            snprintf(where, sizeof where, "upgrade crashed at %llu, mode %d",
                     (unsigned long long)pts[k], m);
            snprintf(g_ctx, sizeof g_ctx, "%s", where);
            plx_backend *img = plx_crash_cursor_image(c, (enum plx_crash_mode)m, pts[k]);
            r.images++;
            /* Either version, never a damaged store. */
            plx_store *probe = NULL;
            int rc = plx_store_open_backend(
                tu_keep_wrap(img),
                &(struct plx_open_opts){.struct_size = sizeof(struct plx_open_opts),
                                        .read_only = 1},
                &probe, err, sizeof err);
            if (rc == 0)
                plx_store_close(probe);
            else if (rc != -EPROTONOSUPPORT)
                reg_violation(&r, "%s: open before finishing: %d %s", where, rc, err);
            rc = plx_store_upgrade_backend(tu_keep_wrap(img), NULL, &upgraded, err, sizeof err);
            if (rc) {
                reg_violation(&r, "%s: upgrade again: %d %s", where, rc, err);
                img->ops->destroy(img);
                continue;
            }
            st = reg_open(tu_keep_wrap(img), 0, where, &r);
            if (st) {
                reg_check(&r, st, false, where);
                reg_verify_names(&r, st, ids, ids, where);
                plx_store_close(st);
            }
            if (m == 2)
                reg_recover(&r, img, ids, where);
            else
                img->ops->destroy(img);
        }
    }
    g_ctx[0] = 0;
    plx_crash_cursor_free(c);
    free(pts);
    printf("crash[upgrade]: %zu positions, %llu images, %llu violations\n", n, r.images,
           r.violations);
    g_tot->images += r.images;
    g_tot->failures += r.violations;
    r.fb->ops->destroy(r.fb);
    ck_assert_msg(r.violations == 0, "%llu violations", r.violations);
}
END_TEST

/* The registry cases of the suite (test_crash.c, crash_suite). */
void crash_registry_tests(TCase *tc)
{
    tcase_add_test(tc, test_crash_registry);
    tcase_add_test(tc, test_crash_held);
    tcase_add_test(tc, test_crash_upgrade);
}
