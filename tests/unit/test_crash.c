/*
 * test_crash.c - the proof of crash safety.
 *
 * Workloads run on the fault backend (backend_fault.h) through the asynchronous API, with up to
 * 64 requests in flight. Every guest-visible event is recorded with its event-log position: at
 * submission (before the submit call) and at completion (inside the callback). Afterwards, for
 * a sample of crash positions, the medium as a power failure there could leave it is rebuilt
 * with a crash cursor in three modes (only durable writes; every write; random subsets under
 * several seeds), opened read-only, and checked against the model:
 *   1. the store opens and plx_check finds no errors (leaked blocks are fine);
 *   2. durability: every tracked block of every VDI holds an acceptable value. Let F be the last
 *      flush of the VDI whose completion was logged before the crash. The base value is that of
 *      the latest write (in submission order) acknowledged before F was submitted, or of a FUA
 *      write acknowledged before the crash if later; acceptable are the base value (the initial
 *      contents when there is none) and the value of any later write submitted before the crash.
 *      Trims are writes of zeros;
 *   3. snapshots: every snapshot whose callback ran before the crash exists and reads back
 *      exactly what was submitted before it; one that had not completed may be missing, but if
 *      it is there it must read back exactly too (the strict part: after recovery it cannot be
 *      told from a completed one, and the VDI itself holds the writes that preceded it);
 *   4. clones exist once plx_vdi_clone returned, and read as their source snapshot plus their
 *      own writes under rule 2;
 *   5. nothing else changed: untracked blocks read as zeros, no unknown VDI appears, and the
 *      snapshot count lies between the completed and the submitted snapshots.
 * Every written block holds a pattern naming the write (its id) and the virtual block, so the
 * write whose data a block holds is read back exactly (torn, misplaced or foreign data shows).
 *
 * A second group injects EIO (data read, data write, metadata write, flush, and the n-th I/O
 * for a range of n) into an asynchronous workload: the affected requests complete with -EIO,
 * the others complete, later requests succeed, and the store reopened from the final image is
 * clean with every acknowledged write intact. One exception (DESIGN.md, "Failed commits"): when
 * a commit fails after writes of it were acknowledged (a write completes when its data is
 * written), the VDI fails every request, a flush included, until it is opened again; then the
 * writes acknowledged since its last successful flush or snapshot (not FUA) count as failed
 * ones (may or may not be there), and everything flushed must be intact (reopen_failed).
 *
 * Everything is deterministic (fixed seeds, printed). PLX_TEST_QUICK=1 shrinks the workloads
 * and the number of crash images. Each workload prints one line of statistics; each violation
 * prints a line "VIOLATION [workload seed S] crash at position P, mode M, seed X: ..." with the
 * history of the block concerned (write ids, submission and acknowledgement positions), enough
 * to replay it: the same workload and seed give the same event log.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

#include "backend.h"
#include "backend_fault.h"
#include "alloc.h"
#include "format.h"
#include "hold.h"
#include "lock.h"
#include "parallax.h"
#include "testutil.h"
#include "wlog.h"

#define BS PLX_BLOCK_SIZE
#define MIB (1ull << 20)
#define STORE_BYTES (48 * MIB)
#define EXTENT_BYTES MIB
#define MAXV 6      /* VDIs per workload */
#define MAXR 6      /* tracked ranges per VDI */
#define MAX_MSGS 40 /* violations printed per workload */
#define IMG_MSGS 4  /* violations printed per crash image */
#define PAT_MAGIC 0x4b53415243584c50ull

/* ---- Totals shared across the forked test processes ------------------------------------------ */

struct totals {
    unsigned long long images; /* (position, mode, seed) images opened and verified */
    unsigned long long positions;
    unsigned long long workloads;
    unsigned long long failures; /* model violations */
    unsigned long long strict;   /* of which: an unfinished snapshot exists with wrong contents */
    unsigned long long eio_runs, eio_failures; /* error-injection tests */
    unsigned long long checks;                 /* plx_check runs */
};
static struct totals *g_tot;
static struct totals g_tot_local;

/* What the test is doing, printed if the process dies (engine crash on a corrupt image). */
static char g_ctx[512];

void __sanitizer_set_death_callback(void (*cb)(void));
#pragma weak __sanitizer_set_death_callback

static void print_ctx(void)
{
    if (g_ctx[0]) {
        static const char pre[] = "test_crash: died while ";
        ssize_t r = write(2, pre, sizeof pre - 1);
        r = write(2, g_ctx, strlen(g_ctx));
        r = write(2, "\n", 1);
        (void)r;
    }
}

static void on_fatal_signal(int sig)
{
    print_ctx();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_death_report(void)
{
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(print_ctx);
        return;
    }
    signal(SIGSEGV, on_fatal_signal);
    signal(SIGBUS, on_fatal_signal);
    signal(SIGABRT, on_fatal_signal);
    signal(SIGFPE, on_fatal_signal);
}

/* ---- Block patterns -------------------------------------------------------------------------- */

static const uint8_t zero_blk[BS];

static uint64_t pat_seed(uint32_t wid, uint64_t vb)
{
    uint64_t s = ((uint64_t)wid << 40) ^ vb ^ 0x5eed;
    return tu_rand(&s);
}

static void pat_fill(uint8_t *blk, uint32_t wid, uint64_t vb)
{
    uint64_t w[BS / 8];
    uint64_t s = pat_seed(wid, vb);
    w[0] = PAT_MAGIC;
    w[1] = wid;
    w[2] = vb;
    for (size_t i = 3; i < BS / 8; i++)
        w[i] = s + i * 0x9e3779b97f4a7c15ull;
    memcpy(blk, w, BS);
}

/* The write id a block holds (0 = zeros). Returns 0, or -1 with a description in why. */
static int pat_decode(const uint8_t *blk, uint64_t vb, uint32_t *val, char *why, size_t wlen)
{
    uint64_t w[BS / 8];
    memcpy(w, blk, BS);
    if (w[0] == 0 && w[1] == 0 && w[2] == 0) {
        if (memcmp(blk, zero_blk, BS) == 0) {
            *val = 0;
            return 0;
        }
        snprintf(why, wlen, "garbage (zero header, nonzero body)");
        return -1;
    }
    if (w[0] != PAT_MAGIC || w[1] == 0 || w[1] > UINT32_MAX) {
        snprintf(why, wlen, "garbage (first words %016llx %016llx)", (unsigned long long)w[0],
                 (unsigned long long)w[1]);
        return -1;
    }
    if (w[2] != vb) {
        snprintf(why, wlen, "the data of virtual block %llu (write #%llu)",
                 (unsigned long long)w[2], (unsigned long long)w[1]);
        return -1;
    }
    uint64_t s = pat_seed((uint32_t)w[1], vb);
    for (size_t i = 3; i < BS / 8; i++) {
        if (w[i] != s + i * 0x9e3779b97f4a7c15ull) {
            snprintf(why, wlen, "write #%llu torn or corrupt at byte %zu", (unsigned long long)w[1],
                     i * 8);
            return -1;
        }
    }
    *val = (uint32_t)w[1];
    return 0;
}

/* ---- The model ------------------------------------------------------------------------------- */

struct ivec {
    uint32_t *v;
    uint32_t n, cap;
};

static void ivec_push(struct ivec *iv, uint32_t x)
{
    if (iv->n == iv->cap) {
        iv->cap = iv->cap ? iv->cap * 2 : 4;
        iv->v = realloc(iv->v, iv->cap * sizeof *iv->v);
        ck_assert_ptr_nonnull(iv->v);
    }
    iv->v[iv->n++] = x;
}

/* A run of tracked virtual blocks; writes never cross a range's end. */
struct range {
    uint64_t vb0;
    uint32_t n;
    uint32_t t0; /* tracked index of vb0 */
};

struct wrec { /* a write or a trim */
    int vdi;
    uint32_t t0, nb;
    uint64_t b0;
    uint32_t wid; /* 0: trim (zeros) */
    bool fua, trim, acked;
    /* Acknowledged, but its VDI failed afterwards (a commit failed after writes of it were
     * acknowledged: pipeline.h, `failed`) before a flush or snapshot made it durable: like a
     * failed write, it may or may not be there once the VDI is opened again. */
    bool lost;
    int status;
    uint64_t sub_seq, sub_pos, ack_seq, ack_pos;
};

struct frec {
    int vdi;
    bool done;
    int status;
    uint64_t sub_seq, sub_pos, done_seq, done_pos;
};

struct srec {
    int vdi;
    bool done;
    int status;
    uint64_t sub_seq, sub_pos, done_pos;
    uint64_t index;      /* from the callback */
    uint64_t pred_index; /* predicted at submission: snapshots are numbered in request order */
    uint32_t *hlen;      /* per tracked block: writes submitted before the snapshot */
    char label[PLX_LABEL_MAX + 1]; /* given at creation */
    bool delete_submitted;
};

/* A label or a deletion of a completed snapshot of an open VDI (plx_vdi_submit_snap_label /
 * _delete). Per VDI they run one at a time in submission order. */
struct erec {
    int vdi;
    size_t snap; /* srec index */
    bool del;
    char label[PLX_LABEL_MAX + 1];
    bool done;
    int status;
    uint64_t sub_pos, done_pos;
};

struct mvdi {
    char name[48];
    uint64_t id;
    plx_vdi *h;
    uint64_t size;
    struct range r[MAXR];
    int nr;
    uint32_t nt;         /* tracked blocks */
    uint32_t *init;      /* per tracked block: value before any write (clones: the source) */
    struct ivec *hist;   /* per tracked block: writes in submission order */
    struct ivec snaps;   /* srec indices in submission order */
    struct ivec flushes; /* frec indices */
    uint64_t create_pos; /* the VDI exists in any image from here on */
    int parent;          /* clones: model index of the source VDI, else -1 */
    uint64_t parent_index;
    uint32_t cursor; /* sequential writes */
    bool pred_ok;    /* snapshot numbering still predictable (no snapshot failed) */
    uint64_t snaps_submitted;
    unsigned label_seq;
};

struct wl {
    const char *name;
    uint64_t seed, rng;
    plx_backend *fb; /* the fault backend: owned here, outlives the store */
    plx_store *st;
    plx_store *other; /* a second engine on the same medium (another host), or NULL */
    struct mvdi v[MAXV];
    int nv;
    struct wrec *w;
    size_t nw, capw;
    struct frec *f;
    size_t nf, capf;
    struct srec *s;
    size_t ns, caps;
    struct erec *e;
    size_t ne, cape;
    uint64_t seq;
    unsigned inflight;
    uint32_t next_wid;
    bool expect_ok; /* no error injected: every request must succeed */
    /* results */
    unsigned long long violations, msgs, img_msgs, strict;
    unsigned long long reads_checked, failed_reqs, completed;
    unsigned long long images, positions;
    unsigned reopened; /* VDIs opened again after they failed (reopen_failed) */
    char where[200];     /* prefix for violation messages */
    char first_err[300]; /* the engine's message at the first failed request */
    uint8_t *sb0;        /* block 0 as formatted: nothing may write it again */
    /* Write-cache workloads: the log lives in the fault medium's last log_blocks blocks, after
     * the store, so one event log orders both (0: no cache). */
    uint64_t log_blocks;
    /* Blocks whose writes every crash point near is verified (not only sampled): the extent
     * catalogue for the claim-ahead workload (0 blocks: none). */
    uint64_t focus_first, focus_count;
    /* Write-cache workloads: where the new log was durable (attach returned); a crash before
     * it may leave no log at all, and nothing was written through one. */
    uint64_t log_ready_pos;
};

static uint64_t rnd(struct wl *wl)
{
    return tu_rand(&wl->rng);
}

static uint64_t pos_of(const struct wl *wl)
{
    return plx_fault_log_position(wl->fb);
}

static void violation(struct wl *wl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(struct wl *wl, const char *fmt, ...)
{
    wl->violations++;
    if (wl->msgs >= MAX_MSGS || wl->img_msgs >= IMG_MSGS)
        return;
    wl->msgs++;
    wl->img_msgs++;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "VIOLATION [%s seed %llu] %s: %s\n", wl->name, (unsigned long long)wl->seed,
            wl->where, buf);
}

/* ---- A forwarding backend ------------------------------------------------------------------ */

/* The store owns (and destroys on close) this wrapper, while the fault backend and its event log
 * live on for the crash cursor. */

struct fwd {
    plx_backend base;
    plx_backend *in;
    uint64_t key; /* registered fence key (persistent reservations, as on an iSCSI LUN); 0: none */
};

/* The medium's registered fence keys, shared by every engine on it (the takeover workload): a
 * stand-in for the target's persistent reservations. An engine whose key was preempted has its
 * writes refused, as RESERVATION CONFLICT would. */
#define MAX_KEYS 8
static uint64_t g_keys[MAX_KEYS];
static int g_nkeys;

static int key_index(uint64_t key)
{
    for (int i = 0; i < g_nkeys; i++)
        if (g_keys[i] == key)
            return i;
    return -1;
}

static int fwd_submit(plx_backend *be, struct plx_io *io)
{
    struct fwd *f = (struct fwd *)be;
    if (f->key && key_index(f->key) < 0 && io->op != PLX_IO_READ)
        return -ESTALE;
    return f->in->ops->submit(f->in, io);
}

static int fwd_fence_join(plx_backend *be, uint64_t key, const struct plx_fence_hooks *hooks)
{
    (void)hooks;
    ck_assert_int_lt(g_nkeys, MAX_KEYS);
    g_keys[g_nkeys++] = key;
    ((struct fwd *)be)->key = key;
    return 0;
}

static int fwd_fence_preempt(plx_backend *be, uint64_t victim)
{
    if (key_index(((struct fwd *)be)->key) < 0)
        return -ESTALE;
    int i = key_index(victim);
    if (i >= 0)
        g_keys[i] = g_keys[--g_nkeys];
    return 0;
}

static int fwd_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *in = ((struct fwd *)be)->in;
    return in->ops->poll(in, timeout_ms);
}

static int fwd_fd(const plx_backend *be)
{
    const plx_backend *in = ((const struct fwd *)be)->in;
    return in->ops->fd(in);
}

static unsigned fwd_inflight(const plx_backend *be)
{
    const plx_backend *in = ((const struct fwd *)be)->in;
    return in->ops->inflight(in);
}

static void fwd_destroy(plx_backend *be)
{
    free(be);
}

static const struct plx_backend_ops fwd_ops = {
    .submit = fwd_submit,
    .poll = fwd_poll,
    .fd = fwd_fd,
    .inflight = fwd_inflight,
    .destroy = fwd_destroy,
};

static const struct plx_fence_ops fwd_fence_ops = {
    .join = fwd_fence_join,
    .preempt = fwd_fence_preempt,
};

/* A window of blocks [first, first + nblocks) of a medium it does not own: the store and its
 * write log share one fault medium, so every crash position cuts both at the same moment. (One
 * medium also means one volatile cache: a flush of either makes both durable, which is kinder
 * than two disks would be.) */
struct win {
    plx_backend base;
    plx_backend *in;
    uint64_t first;
};

static void win_done(struct plx_io *io, int status)
{
    struct plx_io *parent = io->owner;
    free(io);
    parent->done(parent, status);
}

static int win_submit(plx_backend *be, struct plx_io *io)
{
    struct win *w = (struct win *)be;
    struct plx_io *c = malloc(sizeof *c);
    ck_assert_ptr_nonnull(c);
    *c = *io;
    if (io->op != PLX_IO_FLUSH)
        c->block += w->first;
    c->done = win_done;
    c->owner = io;
    int rc = w->in->ops->submit(w->in, c);
    if (rc)
        free(c);
    return rc;
}

static int win_poll(plx_backend *be, int timeout_ms)
{
    plx_backend *in = ((struct win *)be)->in;
    return in->ops->poll(in, timeout_ms);
}

static int win_fd(const plx_backend *be)
{
    const plx_backend *in = ((const struct win *)be)->in;
    return in->ops->fd(in);
}

static unsigned win_inflight(const plx_backend *be)
{
    const plx_backend *in = ((const struct win *)be)->in;
    return in->ops->inflight(in);
}

static const struct plx_backend_ops win_ops = {
    .submit = win_submit,
    .poll = win_poll,
    .fd = win_fd,
    .inflight = win_inflight,
    .destroy = fwd_destroy,
};

static plx_backend *win_new(plx_backend *in, uint64_t first, uint64_t nblocks)
{
    struct win *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->base.ops = &win_ops;
    w->base.nblocks = nblocks;
    snprintf(w->base.desc, sizeof w->base.desc, "window %llu+%llu",
             (unsigned long long)first, (unsigned long long)nblocks);
    w->in = in;
    w->first = first;
    return &w->base;
}

static plx_backend *fwd_new(plx_backend *in)
{
    struct fwd *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->base.ops = &fwd_ops;
    f->base.nblocks = in->nblocks;
    snprintf(f->base.desc, sizeof f->base.desc, "%s", in->desc);
    f->in = in;
    return &f->base;
}

/* ---- Workload setup -------------------------------------------------------------------------- */

static void wl_init_log(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes,
                        uint64_t log_blocks)
{
    memset(wl, 0, sizeof *wl);
    wl->log_blocks = log_blocks;
    wl->name = name;
    wl->seed = seed;
    wl->rng = seed;
    wl->next_wid = 1;
    wl->expect_ok = true;
    snprintf(wl->where, sizeof wl->where, "workload");

    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(STORE_BYTES / BS + log_blocks);
    ck_assert_ptr_nonnull(mem);
    /* Junk everywhere first, as on a used disk: a block linked before its own contents are
     * durable then reads as junk instead of passing for zeros. */
    enum { JUNK_RUN = 256 };
    unsigned char *junk = plx_block_alloc(JUNK_RUN);
    memset(junk, 0xee, (size_t)JUNK_RUN * BS);
    for (uint64_t b = 0; b < STORE_BYTES / BS + log_blocks; b += JUNK_RUN)
        ck_assert_int_eq(tu_io(mem, PLX_IO_WRITE, b,
                               (uint32_t)(STORE_BYTES / BS + log_blocks - b < JUNK_RUN
                                              ? STORE_BYTES / BS + log_blocks - b
                                              : JUNK_RUN),
                               junk, 0),
                         0);
    plx_block_free(junk);
    if (log_blocks)
        plx_backend_mem_poke(mem, STORE_BYTES / BS, NULL); /* an empty log: its head is zero */
    plx_backend *fmt = log_blocks ? win_new(mem, 0, STORE_BYTES / BS) : mem;
    int rc = plx_format_backend(fmt, EXTENT_BYTES, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    if (fmt != mem)
        fmt->ops->destroy(fmt);
    wl->fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(wl->fb);
    mem->ops->destroy(mem);
    wl->sb0 = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(wl->fb, PLX_IO_READ, 0, 1, wl->sb0, 0), 0);
    struct plx_open_opts o = {.struct_size = sizeof o, .cache_bytes = cache_bytes};
    rc = plx_store_open_backend(log_blocks ? win_new(wl->fb, 0, STORE_BYTES / BS)
                                           : fwd_new(wl->fb),
                                &o, &wl->st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    if (log_blocks) {
        /* This engine plays a process that crashes: its locks name a start time no process
         * has, so the process that replays a crash image finds them stale. */
        wl->st->epoch ^= 0x5a5a5a;
        rc = plx_wlog_attach(wl->st, win_new(wl->fb, STORE_BYTES / BS, log_blocks), 1, "log");
        ck_assert_msg(rc == 0, "attach the write log: %d %s", rc, plx_store_errmsg(wl->st));
        wl->log_ready_pos = plx_fault_log_position(wl->fb);
    }
}

static void wl_init(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes)
{
    wl_init_log(wl, name, seed, cache_bytes, 0);
}

static void wl_free(struct wl *wl)
{
    for (int i = 0; i < wl->nv; i++) {
        struct mvdi *m = &wl->v[i];
        for (uint32_t t = 0; t < m->nt; t++)
            free(m->hist[t].v);
        free(m->hist);
        free(m->init);
        free(m->snaps.v);
        free(m->flushes.v);
    }
    for (size_t i = 0; i < wl->ns; i++)
        free(wl->s[i].hlen);
    free(wl->w);
    free(wl->f);
    free(wl->s);
    free(wl->e);
    plx_block_free(wl->sb0);
    if (wl->fb)
        wl->fb->ops->destroy(wl->fb);
    memset(wl, 0, sizeof *wl);
}

static void vdi_setup(struct mvdi *m, const char *name, uint64_t size, const struct range *r,
                      int nr)
{
    snprintf(m->name, sizeof m->name, "%s", name);
    m->size = size;
    m->nr = nr;
    m->nt = 0;
    for (int i = 0; i < nr; i++) {
        m->r[i] = r[i];
        m->r[i].t0 = m->nt;
        ck_assert((r[i].vb0 + r[i].n) * BS <= size);
        m->nt += r[i].n;
    }
    m->init = calloc(m->nt, sizeof *m->init);
    m->hist = calloc(m->nt, sizeof *m->hist);
    ck_assert(m->init && m->hist);
    m->parent = -1;
    m->pred_ok = true;
}

static int add_vdi(struct wl *wl, const char *name, uint64_t size, const struct range *r, int nr)
{
    ck_assert_int_lt(wl->nv, MAXV);
    struct mvdi *m = &wl->v[wl->nv];
    vdi_setup(m, name, size, r, nr);
    int rc = plx_vdi_create(wl->st, name, size, &m->id);
    ck_assert_msg(rc == 0, "create %s: %d %s", name, rc, plx_store_errmsg(wl->st));
    m->create_pos = pos_of(wl);
    return wl->nv++;
}

/* The value tracked block t holds in a view that saw the first hlen writes to it: the latest
 * that succeeded (or the initial contents), or one that failed or was lost after it (such a
 * write may or may not have landed). Returns whether val is acceptable; *expect gets the
 * definite value. */
static bool prefix_ok(const struct wl *wl, const struct mvdi *m, uint32_t t, uint32_t hlen,
                      uint32_t val, uint32_t *expect)
{
    const struct ivec *h = &m->hist[t];
    bool ok = false;
    int64_t j = (int64_t)hlen - 1;
    while (j >= 0 && (wl->w[h->v[j]].status != 0 || wl->w[h->v[j]].lost)) {
        if (wl->w[h->v[j]].wid == val)
            ok = true;
        j--;
    }
    *expect = j >= 0 ? wl->w[h->v[j]].wid : m->init[t];
    return ok || val == *expect;
}

static int add_clone(struct wl *wl, const char *name, int parent, size_t srec_idx)
{
    ck_assert_int_lt(wl->nv, MAXV);
    const struct srec *sr = &wl->s[srec_idx];
    ck_assert(sr->done && sr->status == 0);
    struct mvdi *pm = &wl->v[parent];
    struct mvdi *m = &wl->v[wl->nv];
    vdi_setup(m, name, pm->size, pm->r, pm->nr);
    for (uint32_t t = 0; t < m->nt; t++) {
        uint32_t e;
        prefix_ok(wl, pm, t, sr->hlen[t], 0, &e);
        m->init[t] = e;
    }
    m->parent = parent;
    m->parent_index = sr->index;
    char spec[96];
    snprintf(spec, sizeof spec, "%s@%llu", pm->name, (unsigned long long)sr->index);
    int rc = plx_vdi_clone(wl->st, name, spec, &m->id);
    ck_assert_msg(rc == 0, "clone %s from %s: %d %s", name, spec, rc, plx_store_errmsg(wl->st));
    m->create_pos = pos_of(wl);
    return wl->nv++;
}

/* Odd-numbered VDIs open and close through the asynchronous calls (plx_vdi_open_async,
 * plx_vdi_close_async: the admin lock waited for on the loop, the open or close run from a
 * timer of the service pass), even ones through the blocking calls: both under every crash. */
struct async_res {
    int fired, rc;
    plx_vdi *v;
};

static void async_open_done(void *arg, int status, plx_vdi *v)
{
    struct async_res *r = arg;
    r->fired = 1;
    r->rc = status;
    r->v = v;
}

static void async_close_done(void *arg, int status)
{
    struct async_res *r = arg;
    r->fired = 1;
    r->rc = status;
}

/* Run the store's loop until r fired: 0, or the service pass's error. */
static int loop_until(plx_store *st, const struct async_res *r)
{
    while (!r->fired) {
        struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
        (void)poll(&p, 1, 100);
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int open_any(plx_store *st, const char *name, int async, plx_vdi **h)
{
    if (!async)
        return plx_vdi_open(st, name, 0, h);
    struct async_res r = {0};
    plx_open_req *req;
    int rc = plx_vdi_open_async(st, name, 0, async_open_done, &r, &req);
    if (!rc && (rc = loop_until(st, &r)) != 0)
        plx_vdi_open_cancel(req);
    *h = rc ? NULL : r.v;
    return rc ? rc : r.rc;
}

static int close_any(plx_store *st, plx_vdi *h, int async)
{
    struct async_res r = {0};
    int rc = async ? plx_vdi_close_async(h, async_close_done, &r) : -EAGAIN;
    if (rc == -EAGAIN) /* the write cache still drains it: the blocking close waits for that */
        return plx_vdi_close(h);
    if (rc)
        return rc;
    rc = loop_until(st, &r);
    return rc ? plx_vdi_close(h) /* the close under way is finished here */ : r.rc;
}

static void open_vdi(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    int rc = open_any(wl->st, m->name, vi & 1, &m->h);
    ck_assert_msg(rc == 0, "open %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    if (wl->log_blocks) {
        rc = plx_wlog_vdi_enable(m->h);
        ck_assert_msg(rc == 0, "cache on for %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    }
}

static void close_vdi(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    int rc = close_any(wl->st, m->h, vi & 1);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing VDI %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    m->h = NULL;
}

/* Hand every open VDI to the other engine (opened on first use as another host): wait for the
 * requests in flight, close the VDIs here and open them there. The engine that let go keeps
 * its node cache, which must not be trusted when the VDIs come back (writer_gen). */
static void drain(struct wl *wl);

static void switch_engine(struct wl *wl)
{
    drain(wl);
    bool was_open[MAXV] = {false};
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h) {
            was_open[vi] = true;
            close_vdi(wl, vi);
        }
    if (!wl->other) {
        char err[256] = "";
        struct plx_open_opts o = {.struct_size = sizeof o, .host = "second-host"};
        int rc = plx_store_open_backend(fwd_new(wl->fb), &o, &wl->other, err, sizeof err);
        ck_assert_msg(rc == 0, "opening the second engine: %d %s", rc, err);
    }
    plx_store *t = wl->st;
    wl->st = wl->other;
    wl->other = t;
    for (int vi = 0; vi < wl->nv; vi++)
        if (was_open[vi])
            open_vdi(wl, vi);
}

/* The last successful snapshot of VDI vi that completed, or -1. */
static long last_done_snap(const struct wl *wl, int vi)
{
    const struct mvdi *m = &wl->v[vi];
    for (uint32_t k = m->snaps.n; k-- > 0;) {
        const struct srec *s = &wl->s[m->snaps.v[k]];
        if (s->done && s->status == 0)
            return (long)m->snaps.v[k];
    }
    return -1;
}

/* ---- Requests -------------------------------------------------------------------------------- */

enum kind { K_WRITE, K_FLUSH, K_SNAP, K_READ, K_EDIT };

struct ctx {
    struct wl *wl;
    enum kind kind;
    size_t idx;
    void *mem;      /* buffer to free */
    uint64_t index; /* snapshots: *index_out */
    /* reads */
    int vdi;
    uint32_t t0, nb;
    uint64_t b0;
    uint8_t *buf;
    uint32_t *hlen;
};

static void check_status(struct wl *wl, const char *what, int status)
{
    if (status != 0 && wl->failed_reqs++ == 0)
        snprintf(wl->first_err, sizeof wl->first_err, "%s: %s", what, plx_store_errmsg(wl->st));
    if (wl->expect_ok && status != 0)
        violation(wl, "%s failed with %d (%s) with no error injected: %s", what, status,
                  strerror(-status), plx_store_errmsg(wl->st));
    else if (status != 0 && status != -EIO)
        violation(wl, "%s failed with %d (%s), expected 0 or -EIO", what, status,
                  strerror(-status));
}

static void req_done(void *arg, int status)
{
    struct ctx *c = arg;
    struct wl *wl = c->wl;
    uint64_t pos = pos_of(wl);
    uint64_t seq = ++wl->seq;
    char what[160];
    wl->inflight--;
    wl->completed++;
    switch (c->kind) {
    case K_WRITE: {
        struct wrec *w = &wl->w[c->idx];
        if (w->acked)
            violation(wl, "write #%u: callback ran twice", w->wid);
        w->acked = true;
        w->status = status;
        w->ack_seq = seq;
        w->ack_pos = pos;
        snprintf(what, sizeof what, "%s of %s blocks %llu+%u", w->trim ? "trim" : "write",
                 wl->v[w->vdi].name, (unsigned long long)w->b0, w->nb);
        check_status(wl, what, status);
        break;
    }
    case K_FLUSH: {
        struct frec *f = &wl->f[c->idx];
        if (f->done)
            violation(wl, "flush: callback ran twice");
        f->done = true;
        f->status = status;
        f->done_seq = seq;
        f->done_pos = pos;
        snprintf(what, sizeof what, "flush of %s", wl->v[f->vdi].name);
        check_status(wl, what, status);
        break;
    }
    case K_SNAP: {
        struct srec *s = &wl->s[c->idx];
        struct mvdi *m = &wl->v[s->vdi];
        if (s->done)
            violation(wl, "snapshot: callback ran twice");
        s->done = true;
        s->status = status;
        s->done_pos = pos;
        snprintf(what, sizeof what, "snapshot of %s", m->name);
        check_status(wl, what, status);
        if (status == 0) {
            s->index = c->index;
            if (m->pred_ok && s->index != s->pred_index)
                violation(wl, "snapshot of %s got index %llu, expected %llu", m->name,
                          (unsigned long long)s->index, (unsigned long long)s->pred_index);
        } else {
            m->pred_ok = false;
        }
        break;
    }
    case K_EDIT: {
        struct erec *e = &wl->e[c->idx];
        if (e->done)
            violation(wl, "snapshot edit: callback ran twice");
        e->done = true;
        e->status = status;
        e->done_pos = pos;
        snprintf(what, sizeof what, "%s of %s@%llu", e->del ? "deletion" : "label",
                 wl->v[e->vdi].name, (unsigned long long)wl->s[e->snap].index);
        check_status(wl, what, status);
        break;
    }
    case K_READ: {
        struct mvdi *m = &wl->v[c->vdi];
        snprintf(what, sizeof what, "read of %s blocks %llu+%u", m->name, (unsigned long long)c->b0,
                 c->nb);
        check_status(wl, what, status);
        for (uint32_t i = 0; status == 0 && i < c->nb; i++) {
            uint32_t t = c->t0 + i, val = 0, e = 0;
            char why[160] = "";
            int d = pat_decode(c->buf + (size_t)i * BS, c->b0 + i, &val, why, sizeof why);
            if (d == 0 && prefix_ok(wl, m, t, c->hlen[i], val, &e))
                continue;
            if (d == 0)
                snprintf(why, sizeof why, "write #%u", val);
            else
                prefix_ok(wl, m, t, c->hlen[i], 0, &e);
            violation(wl, "live read of %s block %llu returned %s, expected write #%u", m->name,
                      (unsigned long long)(c->b0 + i), why, e);
            break;
        }
        wl->reads_checked += c->nb;
        free(c->hlen);
        break;
    }
    }
    free(c->mem);
    free(c);
}

static struct ctx *ctx_new(struct wl *wl, enum kind k, size_t idx)
{
    struct ctx *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    c->wl = wl;
    c->kind = k;
    c->idx = idx;
    return c;
}

static void submit_failed(struct wl *wl, const char *what, int rc)
{
    violation(wl, "submitting %s failed: %d (%s) %s", what, rc, strerror(-rc),
              plx_store_errmsg(wl->st));
}

/* Write (wid > 0) or trim (trim) tracked blocks [t0, t0 + nb) of VDI vi, one range. */
/* Three writes in four are submitted as the NBD server submits them, with PLX_WRITE_CACHED
 * (complete when the data is written); the rest complete when the metadata that reaches their
 * data is written too. Rule 2 is the same for both. */
static unsigned write_flags(const struct wrec *w)
{
    if (w->fua)
        return PLX_WRITE_FUA;
    return w->wid % 4 ? PLX_WRITE_CACHED : 0;
}

static void sub_write(struct wl *wl, int vi, uint32_t t0, uint32_t nb, bool fua, bool trim)
{
    struct mvdi *m = &wl->v[vi];
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    const struct range *r = &m->r[ri];
    ck_assert(t0 >= r->t0 && t0 + nb <= r->t0 + r->n && nb > 0);
    uint64_t b0 = r->vb0 + (t0 - r->t0);
    if (wl->nw == wl->capw) {
        wl->capw = wl->capw ? wl->capw * 2 : 256;
        wl->w = realloc(wl->w, wl->capw * sizeof *wl->w);
        ck_assert_ptr_nonnull(wl->w);
    }
    size_t idx = wl->nw;
    struct wrec *w = &wl->w[idx];
    memset(w, 0, sizeof *w);
    w->vdi = vi;
    w->t0 = t0;
    w->nb = nb;
    w->b0 = b0;
    w->fua = fua;
    w->trim = trim;
    w->wid = trim ? 0 : wl->next_wid++;

    struct ctx *c = ctx_new(wl, K_WRITE, idx);
    uint8_t *buf = NULL;
    if (!trim) {
        /* Mostly block-aligned buffers (the engine writes from them directly); some are not
         * (the engine stages them). */
        bool aligned = rnd(wl) % 5 != 0;
        if (aligned) {
            c->mem = aligned_alloc(BS, (size_t)nb * BS);
            buf = c->mem;
        } else {
            c->mem = malloc((size_t)nb * BS + 64);
            buf = (uint8_t *)c->mem + 8 * (1 + rnd(wl) % 7);
        }
        ck_assert_ptr_nonnull(c->mem);
        for (uint32_t i = 0; i < nb; i++)
            pat_fill(buf + (size_t)i * BS, w->wid, b0 + i);
    }
    w->sub_seq = ++wl->seq;
    w->sub_pos = pos_of(wl);
    wl->nw++;
    for (uint32_t i = 0; i < nb; i++)
        ivec_push(&m->hist[t0 + i], (uint32_t)idx);
    wl->inflight++;
    int rc = trim ? plx_vdi_submit_trim(m->h, b0 * BS, (uint64_t)nb * BS, req_done, c)
                  : plx_vdi_submit_write(m->h, buf, b0 * BS, (size_t)nb * BS, write_flags(w),
                                         req_done, c);
    if (rc != 0) {
        /* No callback: the write never happened. */
        wl->inflight--;
        w->acked = true;
        w->status = rc;
        w->ack_seq = ++wl->seq;
        w->ack_pos = pos_of(wl);
        submit_failed(wl, trim ? "a trim" : "a write", rc);
        free(c->mem);
        free(c);
    }
}

static void sub_flush(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    if (wl->nf == wl->capf) {
        wl->capf = wl->capf ? wl->capf * 2 : 64;
        wl->f = realloc(wl->f, wl->capf * sizeof *wl->f);
        ck_assert_ptr_nonnull(wl->f);
    }
    size_t idx = wl->nf++;
    struct frec *f = &wl->f[idx];
    memset(f, 0, sizeof *f);
    f->vdi = vi;
    f->sub_seq = ++wl->seq;
    f->sub_pos = pos_of(wl);
    ivec_push(&m->flushes, (uint32_t)idx);
    struct ctx *c = ctx_new(wl, K_FLUSH, idx);
    wl->inflight++;
    int rc = plx_vdi_submit_flush(m->h, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        f->done = true;
        f->status = rc;
        submit_failed(wl, "a flush", rc);
        free(c);
    }
}

static void sub_snap(struct wl *wl, int vi, bool labelled)
{
    struct mvdi *m = &wl->v[vi];
    if (wl->ns == wl->caps) {
        wl->caps = wl->caps ? wl->caps * 2 : 64;
        wl->s = realloc(wl->s, wl->caps * sizeof *wl->s);
        ck_assert_ptr_nonnull(wl->s);
    }
    size_t idx = wl->ns++;
    struct srec *s = &wl->s[idx];
    memset(s, 0, sizeof *s);
    s->vdi = vi;
    s->hlen = malloc(m->nt * sizeof *s->hlen);
    ck_assert_ptr_nonnull(s->hlen);
    for (uint32_t t = 0; t < m->nt; t++)
        s->hlen[t] = m->hist[t].n;
    s->pred_index = ++m->snaps_submitted;
    s->sub_seq = ++wl->seq;
    s->sub_pos = pos_of(wl);
    ivec_push(&m->snaps, (uint32_t)idx);
    char label[PLX_LABEL_MAX + 1] = "";
    if (labelled)
        snprintf(label, sizeof label, "snap-%u", ++m->label_seq);
    memcpy(s->label, label, sizeof s->label);
    struct ctx *c = ctx_new(wl, K_SNAP, idx);
    wl->inflight++;
    int rc = plx_vdi_submit_snapshot(m->h, label, &c->index, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        s->done = true;
        s->status = rc;
        m->pred_ok = false;
        char what[80];
        snprintf(what, sizeof what, "a snapshot labelled '%s' of %s", label, m->name);
        submit_failed(wl, what, rc);
        free(c);
    }
}

/* Relabel (two times in three) or delete a completed snapshot of VDI vi; false when it has
 * none left to change. Labels are new each time, so none is ever taken. */
static bool sub_edit(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    uint32_t cand = 0;
    for (uint32_t k = 0; k < m->snaps.n; k++) {
        const struct srec *sr = &wl->s[m->snaps.v[k]];
        cand += sr->done && sr->status == 0 && !sr->delete_submitted;
    }
    if (!cand)
        return false;
    uint32_t pick = (uint32_t)(rnd(wl) % cand), k = 0;
    size_t si = 0;
    for (;; k++) {
        si = m->snaps.v[k];
        const struct srec *sr = &wl->s[si];
        if (sr->done && sr->status == 0 && !sr->delete_submitted && pick-- == 0)
            break;
    }
    if (wl->ne == wl->cape) {
        wl->cape = wl->cape ? wl->cape * 2 : 64;
        wl->e = realloc(wl->e, wl->cape * sizeof *wl->e);
        ck_assert_ptr_nonnull(wl->e);
    }
    size_t idx = wl->ne++;
    struct erec *e = &wl->e[idx];
    memset(e, 0, sizeof *e);
    e->vdi = vi;
    e->snap = si;
    e->del = rnd(wl) % 3 == 0;
    if (!e->del)
        snprintf(e->label, sizeof e->label, "edit-%u", ++m->label_seq);
    wl->s[si].delete_submitted = e->del;
    e->sub_pos = pos_of(wl);
    ++wl->seq;
    struct ctx *c = ctx_new(wl, K_EDIT, idx);
    wl->inflight++;
    uint64_t index = wl->s[si].index;
    int rc = e->del ? plx_vdi_submit_snap_delete(m->h, index, req_done, c)
                    : plx_vdi_submit_snap_label(m->h, index, e->label, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        e->done = true;
        e->status = rc;
        submit_failed(wl, e->del ? "a snapshot deletion" : "a snapshot label", rc);
        free(c);
    }
    return true;
}

static void sub_read(struct wl *wl, int vi, uint32_t t0, uint32_t nb)
{
    struct mvdi *m = &wl->v[vi];
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    const struct range *r = &m->r[ri];
    ck_assert(t0 + nb <= r->t0 + r->n);
    struct ctx *c = ctx_new(wl, K_READ, 0);
    c->vdi = vi;
    c->t0 = t0;
    c->nb = nb;
    c->b0 = r->vb0 + (t0 - r->t0);
    c->mem = aligned_alloc(BS, (size_t)nb * BS);
    c->buf = c->mem;
    c->hlen = malloc(nb * sizeof *c->hlen);
    ck_assert(c->mem && c->hlen);
    for (uint32_t i = 0; i < nb; i++)
        c->hlen[i] = m->hist[t0 + i].n;
    wl->inflight++;
    int rc = plx_vdi_submit_read(m->h, c->buf, c->b0 * BS, (size_t)nb * BS, req_done, c);
    if (rc != 0) {
        wl->inflight--;
        submit_failed(wl, "a read", rc);
        free(c->hlen);
        free(c->mem);
        free(c);
    }
}

/* ---- Driving --------------------------------------------------------------------------------- */

static void wait_events(struct wl *wl)
{
    if (!plx_store_busy(wl->st)) {
        violation(wl, "%u requests in flight but the store is idle: callbacks lost", wl->inflight);
        ck_abort_msg("[%s] %u requests never completed", wl->name, wl->inflight);
    }
    struct pollfd pfd = {.fd = plx_store_fd(wl->st), .events = POLLIN};
    int n = poll(&pfd, 1, 2000);
    ck_assert_msg(n >= 0, "poll: %s", strerror(errno));
}

static void service(struct wl *wl, bool need_progress)
{
    int rc = plx_store_service(wl->st);
    ck_assert_msg(rc >= 0, "[%s] plx_store_service: %d %s", wl->name, rc, plx_store_errmsg(wl->st));
    if (rc == 0 && need_progress && wl->inflight > 0)
        wait_events(wl);
}

static void drain(struct wl *wl)
{
    while (wl->inflight > 0)
        service(wl, true);
}

/* Every request has completed, but the batches of cached writes (PLX_WRITE_CACHED) may still be
 * committing: wait until VDI vi's pipeline is idle, so that a commit that fails shows. */
static void settle(struct wl *wl, int vi)
{
    plx_vdi *h = wl->v[vi].h;
    while (h && !plx_vdi_idle(h)) {
        int rc = plx_store_service(wl->st);
        ck_assert_msg(rc >= 0, "[%s] plx_store_service: %d", wl->name, rc);
        if (rc == 0 && !plx_vdi_idle(h))
            wait_events(wl);
    }
}

struct mix {
    unsigned write, fua, trim, flush, snap, read, edit; /* weights; edit: snapshot label/delete */
    unsigned max_nb, max_trim;                    /* blocks per write / trim */
    unsigned hot;       /* percent of writes and trims aimed at the first 48 tracked blocks */
    bool seq;           /* writes walk the tracked blocks in order */
    unsigned inflight;  /* most requests in flight */
    unsigned max_snaps; /* per VDI */
    unsigned label;     /* percent of snapshots with a label */
};

static uint32_t pick_start(struct wl *wl, const struct mvdi *m, const struct mix *mx)
{
    if (mx->hot && rnd(wl) % 100 < mx->hot)
        return (uint32_t)(rnd(wl) % (m->nt < 48 ? m->nt : 48));
    return (uint32_t)(rnd(wl) % m->nt);
}

/* Clip [t0, t0 + nb) to the range holding t0. */
static uint32_t clip(const struct mvdi *m, uint32_t t0, uint32_t nb)
{
    int ri = 0;
    while (ri + 1 < m->nr && t0 >= m->r[ri + 1].t0)
        ri++;
    uint32_t end = m->r[ri].t0 + m->r[ri].n;
    return t0 + nb > end ? end - t0 : nb;
}

static void gen_op(struct wl *wl, const struct mix *mx, unsigned vmask)
{
    int cand[MAXV], nc = 0;
    for (int i = 0; i < wl->nv; i++)
        if ((vmask >> i) & 1)
            cand[nc++] = i;
    ck_assert_int_gt(nc, 0);
    int vi = cand[rnd(wl) % (uint64_t)nc];
    struct mvdi *m = &wl->v[vi];
    unsigned total = mx->write + mx->fua + mx->trim + mx->flush + mx->snap + mx->read + mx->edit;
    unsigned r = (unsigned)(rnd(wl) % total);
    if (r < mx->write + mx->fua) {
        uint32_t nb = 1 + (uint32_t)(rnd(wl) % mx->max_nb);
        uint32_t t0;
        if (mx->seq) {
            if (m->cursor >= m->nt)
                m->cursor = 0;
            t0 = m->cursor;
        } else {
            t0 = pick_start(wl, m, mx);
        }
        nb = clip(m, t0, nb);
        if (mx->seq)
            m->cursor = t0 + nb;
        sub_write(wl, vi, t0, nb, r >= mx->write, false);
        return;
    }
    r -= mx->write + mx->fua;
    if (r < mx->trim) {
        uint32_t t0 = pick_start(wl, m, mx);
        sub_write(wl, vi, t0, clip(m, t0, 1 + (uint32_t)(rnd(wl) % mx->max_trim)), false, true);
        return;
    }
    r -= mx->trim;
    if (r < mx->flush) {
        sub_flush(wl, vi);
        return;
    }
    r -= mx->flush;
    if (r < mx->edit) {
        if (!sub_edit(wl, vi))
            sub_flush(wl, vi);
        return;
    }
    r -= mx->edit;
    if (r < mx->snap) {
        if (m->snaps.n < mx->max_snaps)
            sub_snap(wl, vi, rnd(wl) % 100 < mx->label);
        else
            sub_flush(wl, vi);
        return;
    }
    uint32_t t0 = pick_start(wl, m, mx);
    sub_read(wl, vi, t0, clip(m, t0, 1 + (uint32_t)(rnd(wl) % 16)));
}

/* Submit nops requests to the VDIs in vmask, in bursts, with at most mx->inflight in flight. */
static void run_phase(struct wl *wl, const struct mix *mx, unsigned nops, unsigned vmask)
{
    unsigned done_ops = 0;
    while (done_ops < nops) {
        unsigned burst = 1 + (unsigned)(rnd(wl) % 24);
        while (burst-- > 0 && done_ops < nops && wl->inflight < mx->inflight) {
            gen_op(wl, mx, vmask);
            done_ops++;
        }
        service(wl, wl->inflight >= mx->inflight);
    }
    drain(wl);
}

/* ---- Verification ---------------------------------------------------------------------------- */

/* The base of rule 2 for VDI vi at crash position p: the sequence number of the submission of
 * the last flush that completed before p (0 when none). */
static uint64_t flush_seq_at(const struct wl *wl, int vi, uint64_t p)
{
    const struct mvdi *m = &wl->v[vi];
    uint64_t best = 0;
    for (uint32_t k = 0; k < m->flushes.n; k++) {
        const struct frec *f = &wl->f[m->flushes.v[k]];
        if (f->done && f->status == 0 && f->done_pos <= p && f->sub_seq > best)
            best = f->sub_seq;
    }
    return best;
}

/* The writes to tracked block t around index `focus` of its history (the base of rule 2, or
 * the last write a snapshot must hold), for messages. */
static void describe_hist(const struct wl *wl, const struct mvdi *m, uint32_t t, int64_t focus,
                          uint64_t p, char *out, size_t len)
{
    const struct ivec *h = &m->hist[t];
    size_t o = (size_t)snprintf(out, len, "initial #%u", m->init[t]);
    uint32_t from = h->n > 8 ? h->n - 8 : 0;
    if (focus >= 0 && (uint32_t)focus < from + 3)
        from = focus > 3 ? (uint32_t)focus - 3 : 0;
    if (from > 0)
        o += (size_t)snprintf(out + o, len - o, "; (%u older)", from);
    for (uint32_t j = from; j < h->n && j < from + 10 && o < len; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        o += (size_t)snprintf(out + o, len - o, "; %s#%u%s sub@%llu ack@%llu st%d%s%s",
                              w->trim ? "trim" : "", w->wid, w->fua ? " fua" : "",
                              (unsigned long long)w->sub_pos,
                              w->acked ? (unsigned long long)w->ack_pos : 0ull, w->status,
                              (int64_t)j == focus ? " [*]" : "", w->sub_pos < p ? "" : " [later]");
    }
}

/* Rule 2 for tracked block t of VDI vi at crash position p (fseq from flush_seq_at). */
static bool durable_ok(const struct wl *wl, int vi, uint32_t t, uint64_t p, uint64_t fseq,
                       uint32_t val, int64_t *base_out)
{
    const struct mvdi *m = &wl->v[vi];
    const struct ivec *h = &m->hist[t];
    int64_t base = -1;
    for (uint32_t j = 0; j < h->n; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        if (w->acked && w->status == 0 && !w->lost &&
            (w->ack_seq < fseq || (w->fua && w->ack_pos <= p)))
            base = j;
    }
    *base_out = base;
    uint32_t bval = base < 0 ? m->init[t] : wl->w[h->v[base]].wid;
    if (val == bval)
        return true;
    for (uint32_t j = (uint32_t)(base + 1); j < h->n; j++) {
        const struct wrec *w = &wl->w[h->v[j]];
        if (w->sub_pos < p && w->wid == val)
            return true;
    }
    return false;
}

struct vctx {
    struct wl *wl;
    plx_store *st;
    uint8_t *buf;
    uint64_t p; /* crash position (UINT64_MAX: live store) */
    bool live;  /* verifying the running store, not an image */
};

enum vmode { V_DURABLE, V_LIVE, V_SNAP };

/* Read every tracked range of handle h (model VDI vi) and check each block: against rule 2
 * (V_DURABLE), against all writes (V_LIVE) or against snapshot sr (V_SNAP); then a sample of
 * untracked blocks, which must be zeros. */
static void verify_blocks(struct vctx *x, int vi, plx_vdi *h, enum vmode mode,
                          const struct srec *sr, const char *what)
{
    struct wl *wl = x->wl;
    const struct mvdi *m = &wl->v[vi];
    uint64_t fseq = mode == V_DURABLE ? flush_seq_at(wl, vi, x->p) : 0;
    for (int ri = 0; ri < m->nr; ri++) {
        const struct range *r = &m->r[ri];
        int rc = plx_vdi_pread(h, x->buf, r->vb0 * BS, (size_t)r->n * BS);
        if (rc != 0) {
            violation(wl, "%s: reading blocks %llu+%u failed: %d %s", what,
                      (unsigned long long)r->vb0, r->n, rc, plx_store_errmsg(x->st));
            return;
        }
        for (uint32_t i = 0; i < r->n; i++) {
            uint32_t t = r->t0 + i, val = 0, e = 0;
            uint64_t vb = r->vb0 + i;
            char why[160] = "";
            int d = pat_decode(x->buf + (size_t)i * BS, vb, &val, why, sizeof why);
            bool ok = false;
            int64_t base = -1;
            if (d == 0) {
                if (mode == V_DURABLE)
                    ok = durable_ok(wl, vi, t, x->p, fseq, val, &base);
                else
                    ok = prefix_ok(wl, m, t, mode == V_SNAP ? sr->hlen[t] : m->hist[t].n, val, &e);
            }
            if (ok)
                continue;
            char hist[900];
            int64_t focus = mode == V_DURABLE ? base
                            : mode == V_SNAP  ? (int64_t)sr->hlen[t] - 1
                                              : (int64_t)m->hist[t].n - 1;
            describe_hist(wl, m, t, focus, x->p, hist, sizeof hist);
            char found[200];
            if (d)
                snprintf(found, sizeof found, "%s", why);
            else
                snprintf(found, sizeof found, "write #%u", val);
            if (mode == V_SNAP && !(sr->done && sr->status == 0 && sr->done_pos <= x->p))
                wl->strict++;
            if (mode == V_DURABLE)
                violation(wl,
                          "%s block %llu holds %s; not acceptable (last flush done: seq %llu). "
                          "History: %s",
                          what, (unsigned long long)vb, found, (unsigned long long)fseq, hist);
            else
                violation(wl, "%s block %llu holds %s; expected write #%u. History: %s", what,
                          (unsigned long long)vb, found, e, hist);
            return;
        }
    }
    /* Untracked blocks: zeros. */
    uint64_t nblocks = m->size / BS, tracked = m->nt;
    for (int k = 0; k < 4 && nblocks > tracked; k++) {
        uint64_t vb = rnd(wl) % nblocks;
        bool in = false;
        for (int ri = 0; ri < m->nr; ri++)
            in = in || (vb >= m->r[ri].vb0 && vb < m->r[ri].vb0 + m->r[ri].n);
        if (in)
            continue;
        int rc = plx_vdi_pread(h, x->buf, vb * BS, BS);
        if (rc != 0)
            violation(wl, "%s: reading untracked block %llu failed: %d %s", what,
                      (unsigned long long)vb, rc, plx_store_errmsg(x->st));
        else if (memcmp(x->buf, zero_blk, BS) != 0)
            violation(wl, "%s: untracked block %llu is not zero", what, (unsigned long long)vb);
    }
}

static void verify_snapshot(struct vctx *x, int vi, uint64_t index, const struct srec *sr)
{
    struct wl *wl = x->wl;
    const struct mvdi *m = &wl->v[vi];
    char spec[96], what[256];
    snprintf(spec, sizeof spec, "%s@%llu", m->name, (unsigned long long)index);
    if (sr->done && sr->status == 0 && sr->done_pos <= x->p)
        snprintf(what, sizeof what, "snapshot %s (submitted at %llu, completed at %llu)", spec,
                 (unsigned long long)sr->sub_pos, (unsigned long long)sr->done_pos);
    else
        snprintf(what, sizeof what,
                 "snapshot %s (submitted at %llu, NOT completed at the crash: callback at %llu)",
                 spec, (unsigned long long)sr->sub_pos, (unsigned long long)sr->done_pos);
    plx_vdi *h = NULL;
    int rc = plx_vdi_open(x->st, spec, PLX_OPEN_READONLY, &h);
    if (rc != 0) {
        violation(wl, "opening %s: %d %s", what, rc, plx_store_errmsg(x->st));
        return;
    }
    verify_blocks(x, vi, h, V_SNAP, sr, what);
    rc = plx_vdi_close(h);
    if (rc != 0)
        violation(wl, "closing %s: %d", what, rc);
}

/* The model's snapshot numbered `index` in VDI vi, or NULL when unknown. */
static const struct srec *snap_by_index(const struct wl *wl, int vi, uint64_t index)
{
    const struct mvdi *m = &wl->v[vi];
    for (uint32_t k = 0; k < m->snaps.n; k++) {
        const struct srec *s = &wl->s[m->snaps.v[k]];
        if (s->done && s->status == 0 && s->index == index)
            return s;
        if (m->pred_ok && s->pred_index == index)
            return s;
    }
    return NULL;
}

static void check_report(void *arg, int is_error, const char *line)
{
    struct wl *wl = arg;
    if (is_error)
        violation(wl, "plx_check: %s", line);
}

static void run_check(struct vctx *x)
{
    struct wl *wl = x->wl;
    struct plx_check_report rep;
    memset(&rep, 0, sizeof rep);
    int rc = plx_check(x->st, &rep, check_report, wl);
    g_tot->checks++;
    if (rc != 0)
        violation(wl, "plx_check could not run: %d %s", rc, plx_store_errmsg(x->st));
    else if (rep.errors != 0)
        violation(wl, "plx_check found %llu errors", (unsigned long long)rep.errors);
}

/* Rule 3 for the record of completed snapshot si as found at crash position p: deleted exactly
 * when a deletion completed before p (either way while one was in flight, or failed), and
 * labelled as the last label that completed before p says (or as at creation), or as a label
 * submitted after that one, before p. */
static void verify_snap_record(struct wl *wl, int vi, size_t si, const struct plx_snap_info *got,
                               uint64_t p)
{
    const struct srec *s = &wl->s[si];
    const char *name = wl->v[vi].name;
    bool del_done = false, del_maybe = false;
    const char *base = s->label;
    size_t nlater = 0;
    const char *later[64];
    for (size_t i = 0; i < wl->ne; i++) {
        const struct erec *e = &wl->e[i];
        if (e->snap != si || e->sub_pos >= p)
            continue;
        bool completed = e->done && e->status == 0 && e->done_pos <= p;
        if (e->del) {
            del_done |= completed;
            del_maybe |= !completed;
        } else if (completed) {
            base = e->label;
            nlater = 0;
        } else if (nlater < 64) {
            later[nlater++] = e->label;
        }
    }
    if (got->deleted != del_done && !(del_maybe && got->deleted)) {
        violation(wl, "snapshot %s@%llu is %s at position %llu, but its deletion %s", name,
                  (unsigned long long)s->index, got->deleted ? "deleted" : "not deleted",
                  (unsigned long long)p,
                  del_done    ? "had completed"
                  : del_maybe ? "was still in flight"
                              : "was never submitted before");
        return;
    }
    if (got->deleted)
        return;
    bool ok = strcmp(got->label, base) == 0;
    for (size_t i = 0; i < nlater && !ok; i++)
        ok = strcmp(got->label, later[i]) == 0;
    if (!ok)
        violation(wl, "snapshot %s@%llu is labelled '%s' at position %llu, expected '%s'%s", name,
                  (unsigned long long)s->index, got->label, (unsigned long long)p, base,
                  nlater ? " or a label still in flight" : "");
}

/* Rules 1-5 on a store (an image at crash position x->p, or the live store). nsnap: how many
 * snapshots per VDI to read back (the newest ones and a random sample). */
static void verify_store(struct vctx *x, unsigned nsnap)
{
    struct wl *wl = x->wl;
    uint64_t p = x->p;
    if (!x->live)
        run_check(x);

    struct plx_vdi_info *list = NULL;
    size_t nlist = 0;
    int rc = plx_vdi_list(x->st, &list, &nlist);
    if (rc != 0) {
        violation(wl, "plx_vdi_list: %d %s", rc, plx_store_errmsg(x->st));
        return;
    }
    for (size_t i = 0; i < nlist; i++) {
        bool known = list[i].deleted;
        for (int vi = 0; vi < wl->nv && !known; vi++)
            known = strcmp(list[i].name, wl->v[vi].name) == 0;
        if (!known)
            violation(wl, "unknown VDI '%s' (id %llu) in the registry", list[i].name,
                      (unsigned long long)list[i].id);
    }
    free(list);

    for (int vi = 0; vi < wl->nv; vi++) {
        const struct mvdi *m = &wl->v[vi];
        struct plx_vdi_info info;
        rc = plx_vdi_lookup(x->st, m->name, &info);
        if (rc == -ENOENT && p < m->create_pos)
            continue; /* not created yet */
        if (rc != 0) {
            violation(wl, "VDI %s (created at position %llu) is missing: %d %s", m->name,
                      (unsigned long long)m->create_pos, rc, plx_store_errmsg(x->st));
            continue;
        }
        if (info.id != m->id || info.size != m->size)
            violation(wl, "VDI %s has id %llu size %llu, expected id %llu size %llu", m->name,
                      (unsigned long long)info.id, (unsigned long long)info.size,
                      (unsigned long long)m->id, (unsigned long long)m->size);
        if (m->parent >= 0 &&
            (info.parent_id != wl->v[m->parent].id || info.parent_snap != m->parent_index))
            violation(wl, "clone %s has parent %llu@%llu, expected %llu@%llu", m->name,
                      (unsigned long long)info.parent_id, (unsigned long long)info.parent_snap,
                      (unsigned long long)wl->v[m->parent].id, (unsigned long long)m->parent_index);

        /* Rule 2 (or, live, every write). */
        char what[160];
        plx_vdi *h = m->h;
        if (!x->live || !h) {
            rc = plx_vdi_open(x->st, m->name, PLX_OPEN_READONLY, &h);
            if (rc != 0) {
                violation(wl, "opening VDI %s read-only: %d %s", m->name, rc,
                          plx_store_errmsg(x->st));
                continue;
            }
        }
        snprintf(what, sizeof what, "VDI %s", m->name);
        verify_blocks(x, vi, h, x->live ? V_LIVE : V_DURABLE, NULL, what);
        if (h != m->h || !x->live) {
            rc = plx_vdi_close(h);
            if (rc != 0)
                violation(wl, "closing VDI %s: %d", m->name, rc);
        }

        /* Rule 3: snapshots. */
        struct plx_snap_info *sl = NULL;
        size_t n = 0;
        rc = plx_snap_list(x->st, info.id, &sl, &n);
        if (rc != 0) {
            violation(wl, "listing the snapshots of %s: %d %s", m->name, rc,
                      plx_store_errmsg(x->st));
            continue;
        }
        uint64_t submitted = 0;
        for (uint32_t k = 0; k < m->snaps.n; k++) {
            size_t si = m->snaps.v[k];
            const struct srec *s = &wl->s[si];
            if (s->sub_pos < p)
                submitted++;
            if (!(s->done && s->status == 0 && s->done_pos <= p))
                continue;
            if (s->index > n)
                violation(wl,
                          "snapshot %s@%llu completed at position %llu but the log holds "
                          "%zu snapshots",
                          m->name, (unsigned long long)s->index, (unsigned long long)s->done_pos,
                          n);
            else
                verify_snap_record(wl, vi, si, &sl[s->index - 1], p);
        }
        if (m->pred_ok && n > submitted)
            violation(wl, "VDI %s has %zu snapshots but only %llu were submitted", m->name, n,
                      (unsigned long long)submitted);
        /* Every live label names its snapshot through the label index and the log's tail. */
        for (size_t k = 0; k < n; k++) {
            if (sl[k].deleted || !sl[k].label[0])
                continue;
            char spec[PLX_NAME_MAX + PLX_LABEL_MAX + 2];
            snprintf(spec, sizeof spec, "%s@%s", m->name, sl[k].label);
            struct plx_snap_info si;
            rc = plx_snap_lookup(x->st, spec, &si);
            if (rc != 0 || si.index != sl[k].index)
                violation(wl, "%s names snapshot %llu (%d %s), the log says %llu", spec,
                          (unsigned long long)si.index, rc, plx_store_errmsg(x->st),
                          (unsigned long long)sl[k].index);
        }
        /* Read back the newest snapshots (most exposed to the crash) and a random sample. */
        for (unsigned k = 0; k < nsnap && k < n; k++) {
            uint64_t index = k < 2 ? n - k : 1 + rnd(wl) % n;
            const struct srec *s = snap_by_index(wl, vi, index);
            if (s && !sl[index - 1].deleted)
                verify_snapshot(x, vi, index, s);
        }
        free(sl);
    }
}

static const char *mode_name(enum plx_crash_mode md)
{
    switch (md) {
    case PLX_CRASH_DROP_UNFLUSHED:
        return "drop-unflushed";
    case PLX_CRASH_KEEP_ALL:
        return "keep-all";
    case PLX_CRASH_RANDOM:
        return "random";
    }
    return "?";
}

/* Open image (consumed) as the medium after a crash at p, and verify it. */
static void verify_image(struct wl *wl, plx_backend *img, uint64_t p, enum plx_crash_mode md,
                         uint64_t seed, unsigned nsnap)
{
    snprintf(wl->where, sizeof wl->where, "crash at position %llu, mode %s, seed %llu",
             (unsigned long long)p, mode_name(md), (unsigned long long)seed);
    snprintf(g_ctx, sizeof g_ctx, "verifying [%s seed %llu] %s", wl->name,
             (unsigned long long)wl->seed, wl->where);
    wl->img_msgs = 0;
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1, .cache_bytes = 2 * MIB};
    plx_store *st = NULL;
    char err[256] = "";
    plx_backend *medium = img;
    if (wl->log_blocks) {
        /* Restart on this host: a new process (another start time) attaches the log, which is
         * replayed, and closes the store again; then the store is checked as always. */
        struct plx_open_opts wo = {.struct_size = sizeof wo, .cache_bytes = 2 * MIB};
        int rc = plx_store_open_backend(win_new(medium, 0, STORE_BYTES / BS), &wo, &st, err,
                                        sizeof err);
        if (rc != 0) {
            violation(wl, "the store does not open for the replay: %d %s", rc, err);
            medium->ops->destroy(medium);
            return;
        }
        rc = plx_wlog_attach(st, win_new(medium, STORE_BYTES / BS, wl->log_blocks), 0, "log");
        if (rc != 0 && p >= wl->log_ready_pos)
            violation(wl, "the write log does not replay: %d %s", rc, plx_store_errmsg(st));
        rc = plx_store_close(st);
        if (rc != 0)
            violation(wl, "closing the store after the replay: %d", rc);
        st = NULL;
        img = win_new(medium, 0, STORE_BYTES / BS);
    }
    int rc = plx_store_open_backend(img, &o, &st, err, sizeof err);
    wl->images++;
    if (rc != 0) {
        violation(wl, "the store does not open: %d %s", rc, err);
        if (medium != img)
            medium->ops->destroy(medium);
        return;
    }
    uint8_t *buf = aligned_alloc(BS, 512 * BS);
    ck_assert_ptr_nonnull(buf);
    struct vctx x = {.wl = wl, .st = st, .buf = buf, .p = p, .live = false};
    verify_store(&x, nsnap);
    free(buf);
    rc = plx_store_close(st);
    if (rc != 0)
        violation(wl, "closing the read-only store: %d", rc);
    if (medium != img)
        medium->ops->destroy(medium);
    g_ctx[0] = 0;
}

/* Read everything back from the running store: every write, every snapshot. */
static void verify_live(struct wl *wl)
{
    snprintf(wl->where, sizeof wl->where, "live store");
    wl->img_msgs = 0;
    uint8_t *buf = aligned_alloc(BS, 512 * BS);
    ck_assert_ptr_nonnull(buf);
    struct vctx x = {.wl = wl, .st = wl->st, .buf = buf, .p = UINT64_MAX, .live = true};
    verify_store(&x, 1000000);
    free(buf);
}

/* The superblock is written once, by format: check the medium (as reads see it) still holds it. */
static void check_superblock(struct wl *wl)
{
    uint8_t *b = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(wl->fb, PLX_IO_READ, 0, 1, b, 0), 0);
    if (memcmp(b, wl->sb0, BS) != 0) {
        uint64_t w[2];
        memcpy(w, b, sizeof w);
        violation(wl, "block 0 (the superblock) was overwritten: it now holds magic 0x%08llx",
                  (unsigned long long)(w[0] & 0xffffffffu));
    }
    plx_block_free(b);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Close the workload's VDIs and store, then verify crash images at npos positions: a random
 * sample of the crash points plus points at and just before guest-visible completions, and just
 * after each snapshot was submitted. */
static void crash_sweep(struct wl *wl, unsigned npos, unsigned nseeds, unsigned nsnap)
{
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h)
            close_vdi(wl, vi);
    int rc = plx_store_close(wl->st);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing the store: %d", rc);
    wl->st = NULL;
    if (wl->other && (rc = plx_store_close(wl->other)) != 0 && wl->expect_ok)
        violation(wl, "closing the second engine: %d", rc);
    wl->other = NULL;
    snprintf(wl->where, sizeof wl->where, "after the workload");
    check_superblock(wl);

    uint64_t total = plx_fault_crash_points(wl->fb, NULL, 0);
    ck_assert_uint_gt(total, 0);
    uint64_t *pts = malloc(total * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    plx_fault_crash_points(wl->fb, pts, total);

    /* Candidates tied to guest events: acknowledgements (the earliest positions where a
     * guarantee applies) and the position just before each. */
    size_t ncand = 0, capc = 2 * (wl->nf + wl->nw + (size_t)wl->nv) + 5 * wl->ns + 2;
    uint64_t *cand = malloc(capc * sizeof *cand);
    ck_assert_ptr_nonnull(cand);
    for (size_t i = 0; i < wl->nf; i++)
        if (wl->f[i].done && wl->f[i].done_pos > 0) {
            cand[ncand++] = wl->f[i].done_pos;
            cand[ncand++] = wl->f[i].done_pos - 1;
        }
    for (size_t i = 0; i < wl->ns; i++) {
        if (wl->s[i].done && wl->s[i].done_pos > 0) {
            cand[ncand++] = wl->s[i].done_pos;
            cand[ncand++] = wl->s[i].done_pos - 1;
        }
        /* Just after the snapshot swapped roots: the data of writes before and after it in
         * flight together (a snapshot waits only until earlier writes are in the tree). */
        for (uint64_t d = 1; d <= 4; d *= 2)
            cand[ncand++] = wl->s[i].sub_pos + d;
    }
    for (size_t i = 0; i < wl->nw; i++)
        if (wl->w[i].fua && wl->w[i].acked && wl->w[i].ack_pos > 0)
            cand[ncand++] = wl->w[i].ack_pos;
    for (int i = 0; i < wl->nv; i++)
        cand[ncand++] = wl->v[i].create_pos;

    uint64_t nfocus =
        wl->focus_count ? plx_fault_points_near_writes(wl->fb, wl->focus_first, wl->focus_count,
                                                       NULL, 0)
                        : 0;
    uint64_t *sel = malloc((npos + nfocus + 1) * sizeof *sel);
    ck_assert_ptr_nonnull(sel);
    size_t nsel = 0;
    sel[nsel++] = total; /* after everything, the store closed */
    if (nfocus) {
        plx_fault_points_near_writes(wl->fb, wl->focus_first, wl->focus_count, sel + nsel,
                                     nfocus);
        nsel += nfocus;
        npos += (unsigned)nfocus;
    }
    while (nsel < npos) {
        uint64_t p;
        if (ncand > 0 && rnd(wl) % 3 == 0)
            p = cand[rnd(wl) % ncand];
        else
            p = pts[rnd(wl) % total];
        if (p >= 1 && p <= total)
            sel[nsel++] = p;
    }
    qsort(sel, nsel, sizeof *sel, cmp_u64);

    struct plx_crash_cursor *c = plx_crash_cursor_new(wl->fb);
    uint64_t last = 0;
    for (size_t i = 0; i < nsel; i++) {
        uint64_t p = sel[i];
        if (i > 0 && p == last)
            continue;
        last = p;
        plx_crash_cursor_seek(c, p);
        wl->positions++;
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0), p,
                     PLX_CRASH_DROP_UNFLUSHED, 0, nsnap);
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0), p, PLX_CRASH_KEEP_ALL, 0,
                     nsnap);
        for (unsigned k = 0; k < nseeds; k++) {
            uint64_t seed = wl->seed * 1000003 + p * 31 + k;
            verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_RANDOM, seed), p, PLX_CRASH_RANDOM,
                         seed, nsnap);
        }
    }
    plx_crash_cursor_free(c);
    free(sel);
    free(cand);
    free(pts);
}

static void report(struct wl *wl, double secs)
{
    g_tot->images += wl->images;
    g_tot->positions += wl->positions;
    g_tot->workloads++;
    g_tot->failures += wl->violations;
    g_tot->strict += wl->strict;
    printf(
        "crash[%s]: seed %llu, %zu writes/trims, %zu flushes, %zu snapshots, %zu labels/deletes, "
        "%llu blocks read live, log %llu events, %llu positions, %llu images, %llu violations "
        "(%llu of an unfinished snapshot), %.1f s\n",
        wl->name, (unsigned long long)wl->seed, wl->nw, wl->nf, wl->ns, wl->ne,
        (unsigned long long)wl->reads_checked, (unsigned long long)plx_fault_log_position(wl->fb),
        (unsigned long long)wl->positions, (unsigned long long)wl->images,
        (unsigned long long)wl->violations, (unsigned long long)wl->strict, secs);
    fflush(stdout);
}

static void eio_report(struct wl *wl)
{
    g_tot->eio_runs++;
    g_tot->eio_failures += wl->violations;
    printf("crash[%s]: seed %llu, %zu writes/trims, %zu flushes, %zu snapshots, %llu failed "
           "requests, %llu errors injected, %llu violations%s%s\n",
           wl->name, (unsigned long long)wl->seed, wl->nw, wl->nf, wl->ns,
           (unsigned long long)wl->failed_reqs,
           (unsigned long long)plx_fault_errors_injected(wl->fb),
           (unsigned long long)wl->violations, wl->first_err[0] ? "; first failure: " : "",
           wl->first_err);
    fflush(stdout);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Crash workloads ------------------------------------------------------------------------- */

static unsigned scale(unsigned full)
{
    return tu_quick() ? (full + 3) / 4 : full;
}

/* Positions per workload run: up to 560 x 6 images in full runs, 20 x 4 in quick ones. */
static unsigned npositions(void)
{
    return tu_quick() ? 20 : 560;
}

static unsigned nseeds(void)
{
    return tu_quick() ? 2 : 4;
}

#define R(a, b)                                                                                    \
    {                                                                                              \
        .vb0 = (a), .n = (b)                                                                       \
    }

static void wl_sequential(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(700, 300)};
    int a = add_vdi(wl, "seq", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {
        .write = 80, .fua = 5, .flush = 10, .read = 5, .max_nb = 16, .seq = true, .inflight = 32};
    run_phase(wl, &mx, scale(300), 1u << a);
    /* Close (the record's lock is released) and open again (taken) between two phases. */
    close_vdi(wl, a);
    open_vdi(wl, a);
    run_phase(wl, &mx, scale(300), 1u << a);
}

static void wl_random(struct wl *wl)
{
    static const struct range ra[] = {R(0, 200), R(400, 100), R(900, 124)};
    static const struct range rb[] = {R(10, 300)};
    int a = add_vdi(wl, "rand-a", 4 * MIB, ra, 3);
    int b = add_vdi(wl, "rand-b", 2 * MIB, rb, 1);
    open_vdi(wl, a);
    open_vdi(wl, b);
    struct mix mx = {.write = 64, .fua = 8, .flush = 8, .read = 12, .max_nb = 8, .inflight = 64};
    run_phase(wl, &mx, scale(520), (1u << a) | (1u << b));
}

static void wl_snap_overwrite(struct wl *wl)
{
    static const struct range r[] = {R(0, 256), R(300, 64)};
    int a = add_vdi(wl, "snapow", 2 * MIB, r, 2);
    open_vdi(wl, a);
    /* Fill, snapshot, then overwrite the same hot blocks between snapshots. */
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(40), 1u << a);
    struct mix mx = {.write = 70,
                     .fua = 4,
                     .flush = 6,
                     .snap = 8,
                     .read = 12,
                     .max_nb = 6,
                     .hot = 70,
                     .inflight = 48,
                     .max_snaps = 40,
                     .label = 30};
    run_phase(wl, &mx, scale(400), 1u << a);
}

static void wl_clone(struct wl *wl)
{
    static const struct range r[] = {R(0, 160), R(512, 96), R(1000, 24)};
    int a = add_vdi(wl, "base", 4 * MIB, r, 3);
    open_vdi(wl, a);
    struct mix mx = {.write = 70,
                     .fua = 5,
                     .flush = 8,
                     .snap = 5,
                     .read = 12,
                     .max_nb = 12,
                     .hot = 30,
                     .inflight = 48,
                     .max_snaps = 30,
                     .label = 20};
    run_phase(wl, &mx, scale(160), 1u << a);
    sub_snap(wl, a, false);
    drain(wl);
    long s1 = last_done_snap(wl, a);
    ck_assert_int_ge(s1, 0);
    int c1 = add_clone(wl, "clone1", a, (size_t)s1);
    open_vdi(wl, c1);
    /* The parent and the clone written at once; the clone's writes hit shared blocks. */
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << c1));
    sub_snap(wl, c1, true);
    drain(wl);
    long s2 = last_done_snap(wl, c1);
    ck_assert_int_ge(s2, 0);
    int c2 = add_clone(wl, "clone2", c1, (size_t)s2);
    /* A clone of the parent's first snapshot, never opened: it must stay as it was. */
    size_t s0 = wl->v[a].snaps.v[0];
    if (wl->s[s0].done && wl->s[s0].status == 0)
        add_clone(wl, "clone-old", a, s0);
    open_vdi(wl, c2);
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << c1) | (1u << c2));
}

static void wl_snap_storm(struct wl *wl)
{
    static const struct range r[] = {R(0, 192), R(256, 64)};
    int a = add_vdi(wl, "storm", 2 * MIB, r, 2);
    open_vdi(wl, a);
    /* About one request in four is a snapshot, with up to 64 requests in flight; over 63
     * snapshots also fill the first snapshot-log block. */
    struct mix mx = {.write = 56,
                     .fua = 4,
                     .flush = 4,
                     .snap = 26,
                     .read = 10,
                     .max_nb = 8,
                     .hot = 40,
                     .inflight = 64,
                     .max_snaps = 140,
                     .label = 15};
    run_phase(wl, &mx, scale(520), 1u << a);
}

/* Snapshots between writes whose data is in flight (issue 16): a snapshot swaps roots once the
 * writes before it are in the tree, not on the medium, so large writes on both sides of it, to
 * the same leaves, have their data in flight together, and later writes copy leaves whose new
 * links are not written yet. crash_sweep also puts crash points right after each snapshot's
 * submission, where the writes around it are in flight. */
static void wl_snap_inflight(struct wl *wl)
{
    static const struct range r[] = {R(0, 320), R(600, 80)};
    int a = add_vdi(wl, "inflight", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 32, .seq = true, .inflight = 32};
    run_phase(wl, &fill, scale(30), 1u << a);
    struct mix mx = {.write = 66,
                     .fua = 3,
                     .flush = 3,
                     .snap = 16,
                     .read = 12,
                     .max_nb = 24,
                     .hot = 50,
                     .inflight = 64,
                     .max_snaps = 60,
                     .label = 10};
    run_phase(wl, &mx, scale(360), 1u << a);
}

/* Labels and deletions of snapshots (requests in the stream, each one FUA rewrite of a log
 * block) among writes and snapshots: in the head block (in memory) and in older blocks (found
 * along the skip links), with snapshots waiting for edits and edits for snapshots; the VDI is
 * reopened between rounds; labels are checked for uniqueness on the medium (the label index and
 * the log's tail) by requests in the stream. */
static void wl_snap_edit(struct wl *wl)
{
    static const struct range r[] = {R(0, 96)};
    int a = add_vdi(wl, "edited", 2 * MIB, r, 1);
    open_vdi(wl, a);
    struct mix mx = {.write = 40,
                     .fua = 4,
                     .flush = 4,
                     .snap = 24,
                     .edit = 20,
                     .read = 8,
                     .max_nb = 4,
                     .hot = 40,
                     .inflight = 32,
                     .max_snaps = 150,
                     .label = 40};
    for (int round = 0; round < 3; round++) {
        run_phase(wl, &mx, scale(200), 1u << a);
        close_vdi(wl, a);
        open_vdi(wl, a);
    }
}

static void wl_trim(struct wl *wl)
{
    static const struct range r[] = {R(0, 384), R(600, 200)};
    int a = add_vdi(wl, "trim", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 90, .flush = 10, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(50), 1u << a);
    struct mix mx = {.write = 48,
                     .fua = 5,
                     .trim = 25,
                     .flush = 10,
                     .snap = 3,
                     .read = 9,
                     .max_nb = 12,
                     .max_trim = 40,
                     .hot = 20,
                     .inflight = 48,
                     .max_snaps = 12};
    run_phase(wl, &mx, scale(480), 1u << a);
}

/* FUA overwrites in place (DESIGN.md, "The request pipeline": a FUA write of writable blocks
 * while every link in memory is durable completes when its FUA data writes do, without a batch
 * commit): a filled VDI overwritten mostly by FUA writes, 8 in flight as tapdisk keeps them,
 * among cached and plain writes (which allocate after trims and snapshots, and whose links are
 * not durable until a flush), trims, flushes and snapshots. */
static void wl_fua_overwrite(struct wl *wl)
{
    static const struct range r[] = {R(0, 192), R(512, 64)};
    int a = add_vdi(wl, "fua-ow", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix fill = {.write = 95, .flush = 5, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, scale(40), 1u << a);
    struct mix mx = {.write = 20,
                     .fua = 60,
                     .trim = 3,
                     .flush = 4,
                     .snap = 2,
                     .read = 11,
                     .max_nb = 4,
                     .max_trim = 4,
                     .hot = 60,
                     .inflight = 8,
                     .max_snaps = 10};
    run_phase(wl, &mx, scale(400), 1u << a);
}

/* A sparse 1 TiB VDI (four tree levels) with ranges straddling leaf, level-1 and level-2
 * boundaries, through a node cache small enough to evict. */
static void wl_sparse(struct wl *wl)
{
    static const struct range r[] = {
        R(0, 64),
        R(3 * 512 - 20, 48),
        R((1ull << 18) - 16, 40),
        R((1ull << 27) - 24, 48),
        R((1ull << 28) - 100, 100),
    };
    int a = add_vdi(wl, "sparse", 1ull << 40, r, 5);
    open_vdi(wl, a);
    struct mix mx = {.write = 60,
                     .fua = 6,
                     .trim = 8,
                     .flush = 8,
                     .snap = 6,
                     .read = 12,
                     .max_nb = 12,
                     .max_trim = 16,
                     .inflight = 48,
                     .max_snaps = 24,
                     .label = 10};
    run_phase(wl, &mx, scale(420), 1u << a);
}

/* A checkpointing VM: bursts of writes alternate with runs of snapshots that have no write
 * between them (clean snapshots share the newest snapshot's root), some of them labelled, across
 * a close and reopen (after which the first snapshot copies the root again). */
static void wl_checkpoint(struct wl *wl)
{
    static const struct range r[] = {R(0, 128), R(2000, 64)};
    int a = add_vdi(wl, "checkpoint", 16 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix writes = {
        .write = 80, .fua = 5, .flush = 5, .read = 10, .max_nb = 8, .hot = 50, .inflight = 32};
    struct mix snaps = {.snap = 90, .read = 10, .inflight = 16, .max_snaps = 120, .label = 20};
    for (int round = 0; round < 8; round++) {
        if (round == 4) {
            close_vdi(wl, a);
            open_vdi(wl, a);
            run_phase(wl, &snaps, scale(8), 1u << a); /* clean, but the first copies a root */
        }
        run_phase(wl, &writes, scale(round % 3 == 2 ? 4 : 30), 1u << a);
        run_phase(wl, &snaps, scale(12), 1u << a);
    }
}

/* The collector beside a live holder (reclaim.c, gc.c): the VDI's engine (a host whose reclaim
 * timer looks every millisecond) writes, snapshots and deletes snapshots, and the other engine
 * (another host) collects three times. While the collector waits for the holder, marks and
 * sweeps, the holder serves and takes new requests, snapshot deletions among them; so blocks
 * are handed out, linked and unlinked after the mark began. The holder answers each request,
 * and folds what the collector published into its allocator, freeing blocks of extents it
 * holds. Every write the holder does afterwards lands in blocks a fold may have freed: a fold
 * that freed a linked block shows as data a later write overwrote. Crash points fall in the
 * collector's records and publications and in the holder's answers and folds. */
struct gc_beside {
    struct wl *wl;
    struct mix mx;
    unsigned ops, budget, vmask;
};

static void gc_beside_step(void *arg, const char *step, uint64_t done, uint64_t total)
{
    struct gc_beside *b = arg;
    (void)done, (void)total;
    /* Not while the collector holds the admin lock (its checkpoint): a synchronous claim of the
     * holder would wait for it in this same thread. */
    if (strncmp(step, "waiting", 7) && strncmp(step, "marking", 7) && strcmp(step, "sweeping"))
        return;
    struct wl *wl = b->wl;
    /* A burst, so that requests are in flight (blocks handed out, batches not committed) when
     * the holder's round begins and while the collector marks. */
    for (int k = 0; k < 8 && b->ops < b->budget && wl->inflight < b->mx.inflight; k++) {
        gen_op(wl, &b->mx, b->vmask);
        b->ops++;
    }
    service(wl, false);
}

static void wl_gc_fold(struct wl *wl)
{
    static const struct range r[] = {R(0, 256), R(1500, 64)};
    int a = add_vdi(wl, "folded", 8 * MIB, r, 2);
    open_vdi(wl, a);
    /* Every write near the catalogue (records linked and unlinked) is a crash point too. */
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    /* The holder: an engine opened with a fast reclaim poll. */
    setenv("PARALLAX_RECLAIM_POLL_MS", "1", 1);
    switch_engine(wl);
    unsetenv("PARALLAX_RECLAIM_POLL_MS");
    struct mix mx = {.write = 50,
                     .fua = 5,
                     .trim = 4,
                     .flush = 6,
                     .snap = 12,
                     .edit = 15,
                     .read = 8,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 30,
                     .inflight = 24,
                     .max_snaps = 60,
                     .label = 10};
    uint64_t freed = 0;
    for (int round = 0; round < 3; round++) {
        run_phase(wl, &mx, scale(200), 1u << a);
        struct gc_beside b = {.wl = wl, .mx = mx, .budget = scale(80), .vmask = 1u << a};
        struct plx_gc_opts o = {
            .struct_size = sizeof o, .progress = gc_beside_step, .progress_arg = &b};
        struct plx_gc_report rep;
        snprintf(wl->where, sizeof wl->where, "gc round %d", round);
        int rc = plx_gc_ex(wl->other, &o, &rep);
        ck_assert_msg(rc == 0, "[%s] gc: %d %s", wl->name, rc, plx_store_errmsg(wl->other));
        freed += rep.freed_by_type[PLX_EXTENT_DATA] + rep.freed_by_type[PLX_EXTENT_METADATA];
        drain(wl);
    }
    run_phase(wl, &mx, scale(200), 1u << a);
    printf("crash[gc-fold]: collections freed %llu blocks, %llu of them in the holder's extents\n",
           (unsigned long long)freed, (unsigned long long)wl->st->alloc->folded);
    ck_assert_uint_gt(wl->st->alloc->folded, 0);
}

/* A VDI handed back and forth between two engines (hosts) on one medium, with writes,
 * overwrites, trims and snapshots on both sides: each engine's cached nodes go stale while the
 * other writes. Crash points fall in the writer-lock handovers too. */
/* Data placement by leaf (alloc.h, leaf slots): single-block writes in random order over two
 * leaves' ranges fill slots at their entries' offsets, snapshots release the slots so the copies
 * of the leaves take new ones (copy on write moves every block), writes to blocks already taken
 * collide and go to the nearest free block, a small cache evicts leaves with their slot hint,
 * and a close releases every slot. */
static void wl_placement(struct wl *wl)
{
    wl->st->alloc->by_leaf = true; /* plx_open_opts.placement = PLX_PLACEMENT_LEAF */
    static const struct range r[] = {R(0, 512), R(512, 300), R(1024, 40)}; /* at most 512 each */
    int a = add_vdi(wl, "place", 8 * MIB, r, 3);
    open_vdi(wl, a);
    struct mix fill = {.write = 92, .flush = 4, .read = 4, .max_nb = 1, .inflight = 64};
    run_phase(wl, &fill, scale(300), 1u << a);
    struct mix mx = {.write = 70,
                     .fua = 4,
                     .flush = 4,
                     .snap = 6,
                     .read = 16,
                     .max_nb = 3,
                     .inflight = 48,
                     .max_snaps = 24,
                     .label = 10};
    run_phase(wl, &mx, scale(300), 1u << a);
    close_vdi(wl, a);
    open_vdi(wl, a);
    run_phase(wl, &mx, scale(200), 1u << a);
}

/* Extents claimed ahead (alloc_claim.c, "Claiming ahead"): a sequential writer crosses extent after
 * extent (1 MiB extents: 255 data blocks), each taken from a spare that an asynchronous claim
 * made durable while writes, flushes and FUA writes went on. Every crash point around each
 * catalogue write is verified (before and after its submission and completion, and around the
 * flush after it), beside the usual sample. */
static void wl_claim_ahead(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(512, 512), R(1024, 512), R(1536, 400)};
    int a = add_vdi(wl, "ahead", 8 * MIB, r, 4);
    open_vdi(wl, a);
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    struct mix mx = {
        .write = 80, .fua = 6, .flush = 8, .read = 6, .max_nb = 16, .seq = true, .inflight = 24};
    run_phase(wl, &mx, scale(480), 1u << a);
    /* A second lap over the same blocks, with snapshots: copies on write take extents too. */
    struct mix snap = mx;
    snap.snap = 2;
    snap.max_snaps = 6;
    run_phase(wl, &snap, scale(300), 1u << a);
    struct plx_alloc *al = wl->st->alloc;
    printf("crash[claim-ahead]: %llu extents taken from a spare, %llu waited for, %llu claimed "
           "synchronously\n",
           (unsigned long long)al->claims_ahead, (unsigned long long)al->claims_waited,
           (unsigned long long)al->claims_sync);
    ck_assert_uint_ge(al->claims_ahead, tu_quick() ? 1 : 3);
}

/* The same on a serving loop (a server's engine thread) with no claim made ahead: every extent
 * is claimed by a request that waits for it (plx_alloc_room), its admin lock asked for on the
 * loop, its I/O submitted from the completions, and never synchronously. */
static void wl_claim_room(struct wl *wl)
{
    static const struct range r[] = {R(0, 512), R(512, 512), R(1024, 512), R(1536, 400)};
    int a = add_vdi(wl, "room", 8 * MIB, r, 4);
    open_vdi(wl, a);
    wl->st->serving = true;
    struct plx_alloc *al = wl->st->alloc;
    al->claim_retry_ns = UINT64_MAX;  /* no claim ahead starts; needed ones ignore it */
    uint64_t sync0 = al->claims_sync; /* the open's, before the loop served */
    wl->focus_first = wl->st->sb.catalogue_start;
    wl->focus_count = wl->st->sb.catalogue_blocks;
    struct mix mx = {
        .write = 80, .fua = 6, .flush = 8, .read = 6, .max_nb = 16, .seq = true, .inflight = 24};
    run_phase(wl, &mx, scale(480), 1u << a);
    /* With snapshots, and trims (whose need counts no block below a sparse link). */
    struct mix snap = mx;
    snap.snap = 2;
    snap.max_snaps = 6;
    snap.trim = 8;
    snap.max_trim = 64;
    run_phase(wl, &snap, scale(300), 1u << a);
    printf("crash[claim-room]: %llu extents claimed for waiting requests, %llu synchronously\n",
           (unsigned long long)al->claims_waited, (unsigned long long)(al->claims_sync - sync0));
    ck_assert_uint_ge(al->claims_waited, tu_quick() ? 1 : 3);
    ck_assert_uint_eq(al->claims_sync, sync0);
}

static void wl_handover(struct wl *wl)
{
    static const struct range r[] = {R(0, 160), R(900, 100)};
    int a = add_vdi(wl, "mover", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {.write = 66,
                     .fua = 5,
                     .trim = 6,
                     .flush = 8,
                     .snap = 5,
                     .read = 10,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 50,
                     .inflight = 32,
                     .max_snaps = 30,
                     .label = 10};
    for (int round = 0; round < 10; round++) {
        run_phase(wl, &mx, scale(50), 1u << a);
        switch_engine(wl);
    }
    run_phase(wl, &mx, scale(50), 1u << a);
}

/* Many snapshots of one VDI: its log grows past a dozen blocks, each new block written with a
 * skip link computed in the request stream, across closes and reopens (which rebuild the skip
 * path from the medium and fold the log's labels into the label index); snapshots are read back
 * as VDI@N through the links and every live label as VDI@LABEL through the index. Some are
 * relabelled or deleted in the stream, among them ones the label index covers (the writer
 * writes a new index path and the VDI record naming it before it writes the label), and the
 * tail is folded into the index by requests in the stream while snapshots are in flight. */
static void wl_snap_many(struct wl *wl)
{
    static const struct range r[] = {R(0, 64)};
    int a = add_vdi(wl, "many", 4 * MIB, r, 1);
    open_vdi(wl, a);
    struct mix mx = {.write = 20,
                     .flush = 2,
                     .snap = 70,
                     .read = 8,
                     .max_nb = 4,
                     .hot = 50,
                     .inflight = 16,
                     .max_snaps = 4000,
                     .edit = 3,
                     .label = 5};
    for (int round = 0; round < 4; round++) {
        run_phase(wl, &mx, scale(300), 1u << a);
        close_vdi(wl, a);
        open_vdi(wl, a);
    }
}

/* Lock takeover: the engine writing a VDI loses its lease mid-run (a host frozen past its lease,
 * or partitioned from the lock manager) with the VDI still open, and does not know it. Another
 * engine, to which the first one's holder now counts as dead, takes the VDI over: under the admin
 * lock it preempts the first engine's fence key at the medium (persistent reservations, as on an
 * iSCSI LUN), then writes itself as the holder and goes on writing. Every write the first engine
 * completed is in the VDI the second one sees (the live reads check it), crash images taken
 * during the takeover hold everything flushed by either engine, and when the first engine then
 * writes (its close), the medium refuses it and it stops: nothing of it lands. */
static uint64_t g_dead_host;

static bool takeover_holder_alive(const plx_store *st, uint64_t host, uint32_t pid,
                                  uint64_t epoch)
{
    return host != g_dead_host && plx_lock_local.holder_alive(st, host, pid, epoch);
}

static const struct plx_lock_ops takeover_lock_ops = {
    .name = "test: the first engine's lease lapsed",
    .admin_try = plx_lock_local_admin_try,
    .holder_alive = takeover_holder_alive,
};

/* What plx_fence_join does for a store with a lock manager on a medium that fences. */
static void join_fencing(plx_store *st)
{
    st->fence_ops = &fwd_fence_ops;
    ck_assert_int_eq(
        st->fence_ops->join(st->be, plx_fence_key(st->host_hash, st->pid, st->epoch), NULL), 0);
    st->fencing = true;
}

static void wl_takeover(struct wl *wl)
{
    static const struct range r[] = {R(0, 200), R(700, 64)};
    g_nkeys = 0;
    join_fencing(wl->st);
    int a = add_vdi(wl, "taken", 4 * MIB, r, 2);
    open_vdi(wl, a);
    struct mix mx = {.write = 66,
                     .fua = 6,
                     .trim = 5,
                     .flush = 8,
                     .snap = 5,
                     .read = 10,
                     .max_nb = 8,
                     .max_trim = 8,
                     .hot = 40,
                     .inflight = 32,
                     .max_snaps = 20,
                     .label = 10};
    run_phase(wl, &mx, scale(200), 1u << a);
    drain(wl);
    /* The first engine's lease lapses; it has not noticed (partitioned, not frozen). */
    plx_store *first = wl->st;
    plx_vdi *abandoned = wl->v[a].h;
    g_dead_host = first->host_hash;
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .host = "taking-host"};
    int rc = plx_store_open_backend(fwd_new(wl->fb), &o, &wl->st, err, sizeof err);
    ck_assert_msg(rc == 0, "opening the second engine: %d %s", rc, err);
    join_fencing(wl->st);
    wl->st->lock_ops = &takeover_lock_ops;
    open_vdi(wl, a); /* lists and preempts the dead holder's key, then takes the lock */
    ck_assert_int_eq(g_nkeys, 1);
    /* The key is listed on the medium: the first engine never registers again, even at a
     * target that forgot the preempt. */
    uint64_t first_key = plx_fence_key(first->host_hash, first->pid, first->epoch);
    bool listed = false;
    for (uint32_t i = 0; i < wl->st->state.preempted_count; i++)
        listed |= wl->st->state.preempted_keys[i] == first_key;
    ck_assert_msg(listed, "the preempted key is not listed in the state block");
    run_phase(wl, &mx, scale(300), 1u << a);
    /* The first engine writes again (its close writes the VDI record): the medium refuses it,
     * the store is fenced and says why, and nothing of it lands. */
    ck_assert_int_eq(plx_vdi_close(abandoned), -ESTALE);
    ck_assert_msg(strstr(plx_store_errmsg(first), "RESERVATION CONFLICT") != NULL,
                  "the fenced engine's message: %s", plx_store_errmsg(first));
    plx_store_close(first);
}

/* The write cache (wlog.c): two VDIs cached in a log a little above its smallest size, so the
 * ring wraps and writers wait for the drain; writes, FUA writes, trims, flushes, snapshots and
 * reads; in the middle the drain is held so the log fills with acknowledged writes only it
 * holds, and then one VDI is closed as a server closes a departed client's VDI
 * (plx_vdi_try_close: the other goes on writing while it drains). Every crash image is replayed
 * (a new process attaches the log) before it is checked. */
#define WCACHE_LOG_BLOCKS 640

static void wl_wcache(struct wl *wl)
{
    static const struct range ra[] = {R(0, 200), R(600, 120)};
    static const struct range rb[] = {R(30, 256)};
    int a = add_vdi(wl, "wc-a", 4 * MIB, ra, 2);
    int b = add_vdi(wl, "wc-b", 2 * MIB, rb, 1);
    open_vdi(wl, a);
    open_vdi(wl, b);
    struct mix mx = {.write = 60,
                     .fua = 6,
                     .trim = 3,
                     .flush = 8,
                     .snap = 2,
                     .read = 12,
                     .max_nb = 16,
                     .max_trim = 8,
                     .inflight = 48,
                     .max_snaps = 4};
    run_phase(wl, &mx, scale(300), (1u << a) | (1u << b));
    plx_wlog_pause_drain(wl->st, 1);
    struct mix nosnap = mx;
    nosnap.snap = 0;
    nosnap.trim = 0; /* both wait for the drain */
    run_phase(wl, &nosnap, scale(30), (1u << a) | (1u << b));
    /* b leaves as a server's client does (plx_vdi_try_close): its drain restarts at once, a
     * goes on writing meanwhile, and b closes once the log holds none of its writes. */
    struct mvdi *mb = &wl->v[b];
    int rc = plx_vdi_try_close(mb->h);
    if (rc != -EAGAIN && wl->expect_ok)
        violation(wl, "try_close of %s with the log full of its writes: %d", mb->name, rc);
    if (rc == -EAGAIN) {
        run_phase(wl, &nosnap, scale(40), 1u << a);
        while ((rc = plx_vdi_try_close(mb->h)) == -EAGAIN) {
            service(wl, false);
            usleep(100);
        }
    }
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing VDI %s: %d %s", mb->name, rc, plx_store_errmsg(wl->st));
    mb->h = NULL;
    open_vdi(wl, b);
    plx_wlog_pause_drain(wl->st, 0);
    run_phase(wl, &mx, scale(200), (1u << a) | (1u << b));

    /* The automatic mode (wcache_auto.c): a goes to it with the cache off (its record bound to
     * the log); its writes go to the store, tracked with copies until a flush covers them. The
     * cache turns on, as the rule's tick does, with writes of a in flight: those go to the log
     * as well and complete from there, and so do the completed ones not yet flushed (from their
     * copies). Then it turns off without a wait (try_detach) while b writes on. */
    struct mvdi *ma = &wl->v[a];
    rc = plx_vdi_wcache_set_mode(ma->h, PLX_WCACHE_OFF, NULL);
    if (rc == 0)
        rc = plx_vdi_wcache_set_mode(ma->h, PLX_WCACHE_AUTO, NULL);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "automatic mode for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
    if (rc != 0)
        return;
    struct mix plain = nosnap; /* writes only: completed and not flushed, then in flight */
    plain.flush = plain.fua = plain.read = 0;
    for (int round = 0; round < 2; round++) {
        run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
        for (unsigned i = 0; i < 12; i++)
            gen_op(wl, &plain, 1u << a);
        while (wl->inflight)
            service(wl, true);
        for (unsigned i = 0; i < 12 && wl->inflight < mx.inflight; i++)
            gen_op(wl, &plain, 1u << a);
        rc = plx_wlog_vdi_enable(ma->h);
        if (rc != 0 && wl->expect_ok)
            violation(wl, "cache on for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
        run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
        while ((rc = plx_wlog_vdi_try_detach(ma->h)) == -EAGAIN) {
            gen_op(wl, &nosnap, 1u << b);
            service(wl, false);
            usleep(100);
        }
        if (rc != 0 && wl->expect_ok)
            violation(wl, "cache off for %s: %d %s", ma->name, rc, plx_store_errmsg(wl->st));
        if (rc != 0)
            return;
    }
    run_phase(wl, &mx, scale(60), (1u << a) | (1u << b));
    struct plx_wlog_stats ws;
    plx_wlog_stats(wl->st, &ws);
    if (!ws.zc_bytes && getenv("PARALLAX_WCACHE_ZC_MIN"))
        violation(wl, "no record was written from its writer's buffer (ZC_MIN)");
}

struct workload {
    const char *name;
    void (*run)(struct wl *wl);
    uint64_t cache_bytes;
};

static const struct workload workloads[] = {
    {"sequential", wl_sequential, 0},
    {"random", wl_random, 0},
    {"snap-overwrite", wl_snap_overwrite, 0},
    {"clone", wl_clone, 0},
    {"snap-storm", wl_snap_storm, 0},
    {"trim", wl_trim, 0},
    {"sparse-1TiB", wl_sparse, 256 * 1024},
    {"checkpoint", wl_checkpoint, 0},
    {"handover", wl_handover, 0},
    {"takeover", wl_takeover, 0},
    {"placement", wl_placement, 64 * 1024},
    {"snap-many", wl_snap_many, 0},
    {"snap-inflight", wl_snap_inflight, 0},
    {"snap-edit", wl_snap_edit, 0},
    {"claim-ahead", wl_claim_ahead, 0},
    {"fua-overwrite", wl_fua_overwrite, 0},
    {"gc-fold", wl_gc_fold, 0},
    {"claim-room", wl_claim_room, 0},
};
/* Write-cache workloads: a test case of their own (CK_RUN_CASE=wcache runs only them). */
static const struct workload wcache_workload = {"wcache", wl_wcache, 0};
#define NWORKLOADS ((int)(sizeof workloads / sizeof workloads[0]))

/* Each workload runs under this many seeds (full runs) or one (quick runs). */
#define FULL_RUNS 2

/* PLX_CRASH_SHARD=K/N runs only the workload runs whose index is K modulo N (the loop of this
 * shard counts only those), the write-cache cases in shards 0 and 1 (mod N), the EIO cases only
 * in shard 1 (mod N) and the registry cases only in shard N-1, so that N processes share the
 * harness (make check runs three beside the other tests on two cores); unset, everything runs.
 * PLX_CRASH_RUNS=first runs only the first run (seed) of each workload and the other cases
 * (make check); PLX_CRASH_RUNS=rest only the runs after the first (make check-long); unset,
 * all of them. */
static unsigned g_shard, g_shards = 1;
static int g_first_run, g_end_run = FULL_RUNS; /* the runs [first, end) of each workload */
static bool g_other_cases = true;              /* the write-cache, EIO and registry cases */

static void parse_shard(void)
{
    const char *e = getenv("PLX_CRASH_SHARD");
    unsigned k, n;
    if (e && sscanf(e, "%u/%u", &k, &n) == 2 && n > 0 && k < n) {
        g_shard = k;
        g_shards = n;
    } else if (e) {
        fprintf(stderr, "test_crash: PLX_CRASH_SHARD=%s is not K/N with K < N\n", e);
        exit(2);
    }
    if (tu_quick())
        g_end_run = 1;
    const char *r = getenv("PLX_CRASH_RUNS");
    if (r && strcmp(r, "first") == 0) {
        g_end_run = 1;
    } else if (r && strcmp(r, "rest") == 0) {
        g_first_run = 1;
        g_other_cases = false;
    } else if (r) {
        fprintf(stderr, "test_crash: PLX_CRASH_RUNS=%s is not 'first' or 'rest'\n", r);
        exit(2);
    }
}

/* The workload runs of all shards together. */
static int workload_runs(void)
{
    return g_end_run > g_first_run ? NWORKLOADS * (g_end_run - g_first_run) : 0;
}

static void run_workload(const struct workload *wk, int i, uint64_t run, uint64_t log_blocks);

START_TEST(test_crash_workload)
{
    int i = _i * (int)g_shards + (int)g_shard; /* this shard's _i-th run */
    run_workload(&workloads[i % NWORKLOADS], i % NWORKLOADS,
                 (uint64_t)(g_first_run + i / NWORKLOADS), 0);
}
END_TEST

START_TEST(test_crash_wcache)
{
    /* Records of 8 blocks and more (of block-aligned buffers, most of this harness's) are
     * written from the writer's buffer, their batch in pieces (wlog_batch.c, zc_min; 256 KiB
     * outside tests): crash images fall between the pieces too. */
    setenv("PARALLAX_WCACHE_ZC_MIN", "8", 1);
    /* Run 0 with the drain's default policy (deferred while the workload writes: it drains when
     * the log is half full, or for a waiter); run 1 with the delay 0, so that the drain also runs
     * between single writes, as it did before the policy (wlog_drain.c, drain_defer). */
    if (_i == 1)
        setenv("PARALLAX_WCACHE_DRAIN_DELAY_MS", "0", 1);
    run_workload(&wcache_workload, NWORKLOADS, (uint64_t)_i, WCACHE_LOG_BLOCKS);
    unsetenv("PARALLAX_WCACHE_ZC_MIN");
    unsetenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
}
END_TEST

static void run_workload(const struct workload *wk, int i, uint64_t run, uint64_t log_blocks)
{
    struct wl wl;
    double t0 = now_s();
    wl_init_log(&wl, wk->name, 0xc0ffee00u + (uint64_t)i * 7919 + run * 104729, wk->cache_bytes,
                log_blocks);
    wk->run(&wl);
    verify_live(&wl);
    crash_sweep(&wl, npositions(), nseeds(), tu_quick() ? 3 : 4);
    report(&wl, now_s() - t0);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "workload %s: %llu violations (see VIOLATION lines)", wk->name, v);
}

/* ---- Error injection ------------------------------------------------------------------------- */

/* A store with VDI "eio" (2 MiB, blocks 0-383 tracked) filled and flushed. */
static int eio_setup(struct wl *wl, const char *name, uint64_t seed)
{
    static const struct range r[] = {R(0, 384)};
    wl_init(wl, name, seed, 0);
    int a = add_vdi(wl, "eio", 2 * MIB, r, 1);
    open_vdi(wl, a);
    struct mix fill = {.write = 100, .max_nb = 16, .seq = true, .inflight = 16};
    run_phase(wl, &fill, 40, 1u << a);
    sub_flush(wl, a);
    drain(wl);
    return a;
}

/* The physical block holding tracked block t of VDI vi (its latest write), found by scanning
 * the medium for its pattern. */
static uint64_t find_physical(struct wl *wl, int vi, uint32_t t)
{
    const struct mvdi *m = &wl->v[vi];
    const struct ivec *h = &m->hist[t];
    ck_assert_uint_gt(h->n, 0);
    uint32_t wid = wl->w[h->v[h->n - 1]].wid;
    int ri = 0;
    while (ri + 1 < m->nr && t >= m->r[ri + 1].t0)
        ri++;
    uint64_t vb = m->r[ri].vb0 + (t - m->r[ri].t0);
    uint8_t *buf = plx_block_alloc(256);
    uint64_t found = UINT64_MAX;
    for (uint64_t b = 0; b < wl->fb->nblocks && found == UINT64_MAX; b += 256) {
        ck_assert_int_eq(tu_io(wl->fb, PLX_IO_READ, b, 256, buf, 0), 0);
        for (uint64_t i = 0; i < 256; i++) {
            uint32_t val;
            char why[160];
            if (pat_decode(buf + i * BS, vb, &val, why, sizeof why) == 0 && val == wid) {
                found = b + i;
                break;
            }
        }
    }
    plx_block_free(buf);
    ck_assert_msg(found != UINT64_MAX, "no physical block holds write #%u of block %llu", wid,
                  (unsigned long long)vb);
    return found;
}

/* Close, then verify the images at the end of the log (every write kept, and only durable
 * ones): plx_check clean, every acknowledged write intact. */
static void eio_finish(struct wl *wl)
{
    plx_fault_clear(wl->fb);
    verify_live(wl);
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h)
            close_vdi(wl, vi);
    int rc = plx_store_close(wl->st);
    if (rc != 0)
        violation(wl, "closing the store after the errors were cleared: %d", rc);
    wl->st = NULL;
    check_superblock(wl);
    uint64_t end = plx_fault_log_position(wl->fb);
    struct plx_crash_cursor *c = plx_crash_cursor_new(wl->fb);
    plx_crash_cursor_seek(c, end);
    verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0), end, PLX_CRASH_KEEP_ALL, 0,
                 1000000);
    verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0), end,
                 PLX_CRASH_DROP_UNFLUSHED, 0, 1000000);
    plx_crash_cursor_free(c);
}

/* If a commit failed after writes of VDI vi were acknowledged, the VDI fails every request
 * until it is opened again (DESIGN.md, "Failed commits"): its next flush must have failed, and
 * what was acknowledged but not made durable by a flush, a FUA or a snapshot may be lost. Mark
 * those writes, then close and open the VDI. */
static void reopen_failed(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    settle(wl, vi);
    if (!m->h || !m->h->failed)
        return;
    uint64_t fseq = flush_seq_at(wl, vi, UINT64_MAX), sseq = 0;
    for (uint32_t k = 0; k < m->snaps.n; k++) {
        const struct srec *s = &wl->s[m->snaps.v[k]];
        if (s->done && s->status == 0 && s->sub_seq > sseq)
            sseq = s->sub_seq;
    }
    bool flush_failed = false;
    for (uint32_t k = 0; k < m->flushes.n; k++) {
        const struct frec *f = &wl->f[m->flushes.v[k]];
        flush_failed |= f->done && f->status != 0 && f->sub_seq > fseq;
    }
    unsigned lost = 0;
    for (size_t i = 0; i < wl->nw; i++) {
        struct wrec *w = &wl->w[i];
        if (w->vdi != vi || !w->acked || w->status != 0 || w->fua || w->ack_seq < fseq ||
            w->sub_seq < sseq)
            continue;
        w->lost = true;
        lost++;
    }
    /* A flush submitted after the failure fails: the guest learns of the loss. */
    size_t f = wl->nf;
    sub_flush(wl, vi);
    drain(wl);
    if (wl->f[f].status != -EIO)
        violation(wl, "VDI %s failed, but a flush after it returned %d", m->name, wl->f[f].status);
    printf("crash[%s]: VDI %s failed (%s); %u acknowledged writes not durable (a flush had %s)\n",
           wl->name, m->name, wl->first_err, lost, flush_failed ? "failed" : "not failed yet");
    wl->reopened++;
    close_vdi(wl, vi);
    open_vdi(wl, vi);
}

/* Requests after the errors are cleared must all succeed (once a failed VDI is opened again). */
static void eio_after(struct wl *wl, int vi)
{
    plx_fault_clear(wl->fb);
    reopen_failed(wl, vi);
    wl->expect_ok = true;
    snprintf(wl->where, sizeof wl->where, "after the injected error");
    struct mix mx = {.write = 60,
                     .fua = 5,
                     .trim = 5,
                     .flush = 10,
                     .snap = 5,
                     .read = 15,
                     .max_nb = 8,
                     .max_trim = 8,
                     .inflight = 16,
                     .max_snaps = 1000};
    run_phase(wl, &mx, 40, 1u << vi);
    sub_flush(wl, vi);
    drain(wl);
}

/* Completion statuses of the writes in [from, nw) and flushes in [ffrom, nf). */
static unsigned count_failed(const struct wl *wl, size_t from, size_t ffrom, size_t sfrom)
{
    unsigned n = 0;
    for (size_t i = from; i < wl->nw; i++)
        n += wl->w[i].status != 0;
    for (size_t i = ffrom; i < wl->nf; i++)
        n += wl->f[i].status != 0;
    for (size_t i = sfrom; i < wl->ns; i++)
        n += wl->s[i].status != 0;
    return n;
}

START_TEST(test_eio_data_read)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-data-read", 101);
    uint32_t target = 100;
    uint64_t pb = find_physical(&wl, a, target);
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "read error on physical block %llu",
             (unsigned long long)pb);
    plx_fault_fail_blocks(wl.fb, PLX_IO_READ, pb, 1, -EIO, 1);
    /* Reads in flight, one of them over the failing block, and writes elsewhere. */
    unsigned long long failed0 = wl.failed_reqs, done0 = wl.completed;
    for (uint32_t i = 0; i < 24; i++)
        sub_read(&wl, a, (i * 16) % 368, 16);
    sub_read(&wl, a, target - 3, 8);
    for (uint32_t i = 0; i < 8; i++)
        sub_write(&wl, a, 200 + i * 8, 8, false, false);
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    ck_assert_uint_eq(wl.completed - done0, 33);
    /* Exactly one read covers the block first: it alone fails. */
    ck_assert_msg(wl.failed_reqs - failed0 == 1, "%llu requests failed, expected 1",
                  wl.failed_reqs - failed0);
    /* The block reads fine once the error is gone. */
    sub_read(&wl, a, target, 1);
    drain(&wl);
    ck_assert_uint_eq(wl.failed_reqs - failed0, 1);
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

START_TEST(test_eio_data_write)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-data-write", 202);

    /* 1. An in-place overwrite (the block is mapped and writable) fails; other writes in
     * flight succeed. */
    uint32_t target = 50;
    uint64_t pb = find_physical(&wl, a, target);
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "in-place write error on physical block %llu",
             (unsigned long long)pb);
    plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, pb, 1, -EIO, 1);
    size_t w0 = wl.nw;
    for (uint32_t i = 0; i < 12; i++)
        sub_write(&wl, a, 100 + i * 8, 8, i % 4 == 0, false);
    sub_write(&wl, a, target - 2, 4, false, false);
    size_t wfail = wl.nw - 1;
    for (uint32_t i = 0; i < 6; i++)
        sub_read(&wl, a, 250 + i * 8, 8);
    sub_flush(&wl, a);
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    ck_assert_int_eq(wl.w[wfail].status, -EIO);
    for (size_t i = w0; i < wl.nw; i++)
        if (i != wfail)
            ck_assert_msg(wl.w[i].status == 0, "write %zu: %d", i, wl.w[i].status);

    /* 2. A write that needs a new block (the old one is in a snapshot) fails: the new link must
     * not survive, the snapshot must not change. */
    wl.expect_ok = true;
    sub_snap(&wl, a, false);
    drain(&wl);
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "write error on a newly allocated data block");
    uint8_t *cat = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(wl.fb, PLX_IO_READ, 2, 1, cat, 0), 0);
    const struct plx_catalog_block *cb = (const struct plx_catalog_block *)cat;
    uint64_t eb = EXTENT_BYTES / BS;
    for (uint32_t e = 1; e < cb->count; e++)
        if (cb->entries[e].type != PLX_EXTENT_METADATA)
            plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, e * eb + 1, eb - 1, -EIO, -1);
    plx_block_free(cat);
    uint64_t inj0 = plx_fault_errors_injected(wl.fb);
    sub_write(&wl, a, 10, 3, false, false);
    wfail = wl.nw - 1;
    for (uint32_t i = 0; i < 8; i++)
        sub_read(&wl, a, 20 + i * 4, 4);
    drain(&wl);
    ck_assert_uint_gt(plx_fault_errors_injected(wl.fb), inj0);
    ck_assert_int_eq(wl.w[wfail].status, -EIO);
    plx_fault_clear(wl.fb);
    /* Read it back: the old contents. */
    sub_read(&wl, a, 8, 8);
    drain(&wl);
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A write error anywhere in the first metadata extent (radix nodes, its bitmap, snapshot log
 * blocks) while writes, trims and snapshots are in flight. _i = 0: one error under a write-heavy
 * mix; 1: one error under a snapshot-heavy mix; 2: three errors. */
START_TEST(test_eio_metadata_write)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-metadata-write", 303 + (uint64_t)_i);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(wl.st, "eio", &info), 0);
    uint64_t eb = EXTENT_BYTES / BS, ext = info.root / eb;
    int times = _i == 2 ? 3 : 1;
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "%d write error(s) in metadata extent %llu", times,
             (unsigned long long)ext);
    size_t w0 = wl.nw, f0 = wl.nf, s0 = wl.ns;
    uint64_t inj0 = plx_fault_errors_injected(wl.fb);
    plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, ext * eb, eb, -EIO, times);
    struct mix writes = {.write = 60,
                         .fua = 8,
                         .trim = 6,
                         .flush = 8,
                         .snap = 4,
                         .read = 10,
                         .max_nb = 8,
                         .max_trim = 8,
                         .inflight = 24,
                         .max_snaps = 1000};
    struct mix snaps = {.write = 50,
                        .fua = 4,
                        .flush = 4,
                        .snap = 30,
                        .read = 12,
                        .max_nb = 8,
                        .inflight = 32,
                        .max_snaps = 1000};
    run_phase(&wl, _i == 1 ? &snaps : &writes, 60, 1u << a);
    uint64_t inj = plx_fault_errors_injected(wl.fb) - inj0;
    ck_assert_msg(inj >= 1 && inj <= (uint64_t)times, "%llu errors injected",
                  (unsigned long long)inj);
    unsigned nfail = count_failed(&wl, w0, f0, s0);
    ck_assert_msg(nfail > 0, "a metadata write failed but every request succeeded");
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A failed flush: in-place writes complete (they need no flush), the user's flush fails and
 * does not count as a durability point; the next flush succeeds. */
START_TEST(test_eio_flush)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-flush", 404);
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "flush error");
    plx_fault_fail_blocks(wl.fb, PLX_IO_FLUSH, 0, 0, -EIO, 1);
    size_t w0 = wl.nw;
    for (uint32_t i = 0; i < 16; i++)
        sub_write(&wl, a, i * 8, 8, false, false);
    size_t f1 = wl.nf;
    sub_flush(&wl, a);
    for (uint32_t i = 0; i < 8; i++)
        sub_read(&wl, a, 200 + i * 8, 8);
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    ck_assert_int_eq(wl.f[f1].status, -EIO);
    for (size_t i = w0; i < wl.nw; i++)
        ck_assert_msg(wl.w[i].status == 0, "write %zu: %d", i, wl.w[i].status);
    /* More writes, then a flush that works: everything acknowledged before it is durable
     * (verified below on the drop-unflushed image at the end of the log). */
    wl.expect_ok = true;
    for (uint32_t i = 0; i < 8; i++)
        sub_write(&wl, a, 300 + i * 8, 8, false, false);
    drain(&wl);
    sub_flush(&wl, a);
    drain(&wl);

    /* A flush error under a batch that must flush (new blocks after a snapshot, FUA). */
    sub_snap(&wl, a, false);
    drain(&wl);
    wl.expect_ok = false;
    plx_fault_fail_blocks(wl.fb, PLX_IO_FLUSH, 0, 0, -EIO, 1);
    size_t w1 = wl.nw, f2 = wl.nf, s2 = wl.ns;
    for (uint32_t i = 0; i < 10; i++)
        sub_write(&wl, a, i * 12, 6, i % 3 == 0, false);
    sub_flush(&wl, a);
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 2);
    ck_assert_msg(count_failed(&wl, w1, f2, s2) > 0, "a flush failed but every request "
                                                     "succeeded");
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* Fail the n-th I/O for a range of n while a mixed workload runs: whatever it hits (data,
 * node, bitmap or log write, node read, flush), every request completes with 0 or -EIO, later
 * requests succeed and the final images are clean. _i picks the mix: 0 writes and snapshots over
 * a snapshotted VDI (copy-on-write everywhere); 1 FUA writes, trims and flushes. */
START_TEST(test_eio_nth)
{
    static const struct mix mixes[2] = {
        {.write = 60,
         .fua = 8,
         .trim = 6,
         .flush = 8,
         .snap = 6,
         .read = 12,
         .max_nb = 8,
         .max_trim = 8,
         .inflight = 16,
         .max_snaps = 1000},
        {.write = 30,
         .fua = 30,
         .trim = 15,
         .flush = 15,
         .read = 10,
         .max_nb = 8,
         .max_trim = 16,
         .hot = 50,
         .inflight = 24},
    };
    unsigned step = tu_quick() ? 9 : 1;
    unsigned nmax = 100;
    unsigned long long total_v = 0, hit = 0, max_ios = 0;
    for (unsigned n = 1 + (unsigned)_i * (step / 2); n <= nmax; n += step) {
        struct wl wl;
        int a = eio_setup(&wl, _i ? "eio-nth-fua" : "eio-nth", 500 + n + 1000 * (unsigned)_i);
        if (_i == 0) {
            sub_snap(&wl, a, false);
            drain(&wl);
        }
        wl.expect_ok = false;
        snprintf(wl.where, sizeof wl.where, "I/O #%u fails", n);
        uint64_t inj0 = plx_fault_errors_injected(wl.fb), io0 = plx_fault_io_count(wl.fb);
        uint64_t claims_failed0 = wl.st->alloc->claims_failed;
        uint64_t retried0 = wl.st->reads_retried;
        size_t w0 = wl.nw, f0 = wl.nf, s0 = wl.ns;
        plx_fault_fail_nth(wl.fb, n, -EIO);
        run_phase(&wl, &mixes[_i], 40, 1u << a);
        settle(&wl, a); /* the last batches of cached writes commit: their I/O counts too */
        if (plx_fault_io_count(wl.fb) - io0 > max_ios)
            max_ios = plx_fault_io_count(wl.fb) - io0;
        bool injected = plx_fault_errors_injected(wl.fb) > inj0;
        unsigned nfail = count_failed(&wl, w0, f0, s0);
        hit += injected;
        /* An I/O of a claim ahead fails no request: the claim ends, and the next one or the
         * synchronous fallback takes an extent when one is needed. */
        bool claim_hit = wl.st->alloc->claims_failed > claims_failed0;
        /* A commit that failed after all of its writes were acknowledged fails the VDI: the
         * next flush (reopen_failed's) reports it. */
        bool vdi_failed = wl.v[a].h && wl.v[a].h->failed;
        /* A merged read that failed is read again without merging, and may then succeed (the
         * error may have been in a stale block it did not need; here it was a one-off). */
        bool read_retried = wl.st->reads_retried > retried0;
        if (injected && nfail == 0 && wl.failed_reqs == 0 && !claim_hit && !vdi_failed &&
            !read_retried)
            violation(&wl, "I/O #%u failed but every request succeeded", n);
        eio_after(&wl, a);
        eio_finish(&wl);
        if (wl.violations)
            printf("crash[%s]: seed %llu, I/O #%u failed, %llu violations; first failure: %s\n",
                   wl.name, (unsigned long long)wl.seed, n, (unsigned long long)wl.violations,
                   wl.first_err);
        total_v += wl.violations;
        g_tot->eio_runs++;
        g_tot->eio_failures += wl.violations;
        wl_free(&wl);
    }
    printf("crash[eio-nth/%d]: n = %u..%u step %u (the phase issues up to %llu I/Os), %llu "
           "injected, %llu violations\n",
           _i, 1 + (unsigned)_i * (step / 2), nmax, step, max_ios, hit, total_v);
    fflush(stdout);
    ck_assert_msg(total_v == 0, "%llu violations", total_v);
}
END_TEST

/* The first snapshot of a VDI fails (a write in its batch fails); the next snapshot must still
 * go to a log block of its own. */
START_TEST(test_eio_first_snapshot)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-first-snapshot", 606);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(wl.st, "eio", &info), 0);
    uint64_t eb = EXTENT_BYTES / BS, ext = info.root / eb;
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "first snapshot fails");
    plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, ext * eb, eb, -EIO, 1);
    size_t s0 = wl.ns;
    sub_snap(&wl, a, false);
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    ck_assert_int_eq(wl.s[s0].status, -EIO);
    plx_fault_clear(wl.fb);
    wl.expect_ok = true;
    snprintf(wl.where, sizeof wl.where, "second snapshot after the first failed");
    sub_write(&wl, a, 5, 2, false, false);
    sub_snap(&wl, a, false);
    drain(&wl);
    check_superblock(&wl);
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A labelled snapshot submitted while an earlier snapshot is still in flight. */
START_TEST(test_snapshot_label_in_flight)
{
    struct wl wl;
    int a = eio_setup(&wl, "label-in-flight", 707);
    snprintf(wl.where, sizeof wl.where, "labelled snapshot behind an unfinished one");
    sub_write(&wl, a, 0, 4, false, false);
    sub_snap(&wl, a, false);
    sub_snap(&wl, a, true); /* the first is not durable yet */
    drain(&wl);
    sub_snap(&wl, a, true);
    sub_snap(&wl, a, true);
    drain(&wl);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A write whose commit fails, and an overlapping write submitted right behind it (before the
 * failure is known): the second may fail or succeed, but if it is acknowledged its data must
 * be there. */
START_TEST(test_eio_overlapping_write)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-overlapping-write", 808);
    sub_snap(&wl, a, false); /* every link read-only: the next write needs new nodes */
    drain(&wl);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(wl.st, "eio", &info), 0);
    uint64_t eb = EXTENT_BYTES / BS, ext = info.root / eb;
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "commit of W1 fails, W2 overlaps it");
    plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, ext * eb, eb, -EIO, 1);
    size_t w1 = wl.nw;
    sub_write(&wl, a, 20, 1, false, false); /* W1: new leaf, new data block */
    sub_write(&wl, a, 20, 1, false, false); /* W2: same block, waits for W1 */
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    /* W1 fails, or it was acknowledged when its data was written (before the commit failed),
     * and then the VDI fails until it is opened again. */
    ck_assert_msg(wl.w[w1].status == -EIO || (wl.w[w1].status == 0 && wl.v[a].h->failed),
                  "W1: %d, VDI failed: %d", wl.w[w1].status, wl.v[a].h->failed);
    printf("crash[%s]: W1 %d, W2 %d, VDI failed %d\n", wl.name, wl.w[w1].status,
           wl.w[w1 + 1].status, wl.v[a].h->failed);
    sub_read(&wl, a, 20, 1); /* W2's data if W2 succeeded */
    drain(&wl);
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A write that needs new nodes (the VDI was just snapshotted) and whose commit fails: _i = 0,
 * the write is submitted with PLX_WRITE_CACHED and completes when its data is written, before
 * the failed node write: then the VDI must fail (a read of the block and a flush fail, no read
 * returns the older data) until it is opened again, and what was flushed before is intact. _i =
 * 1, the same write without PLX_WRITE_CACHED: it fails, and the VDI recovers at once (a read
 * returns the data before it, a flush succeeds). */
START_TEST(test_eio_cached_commit)
{
    struct wl wl;
    int a = eio_setup(&wl, _i ? "eio-uncached-commit" : "eio-cached-commit", 1101 + (uint64_t)_i);
    sub_snap(&wl, a, false); /* every link read-only: the next write needs new nodes */
    drain(&wl);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(wl.st, "eio", &info), 0);
    uint64_t eb = EXTENT_BYTES / BS, ext = info.root / eb;
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "the commit of a %scached write fails", _i ? "non-" : "");
    /* write_flags: a write id divisible by 4 is submitted without PLX_WRITE_CACHED */
    while ((wl.next_wid % 4 == 0) != (_i == 1))
        wl.next_wid++;
    plx_fault_fail_blocks(wl.fb, PLX_IO_WRITE, ext * eb, eb, -EIO, 1);
    size_t w = wl.nw;
    sub_write(&wl, a, 40, 1, false, false);
    drain(&wl);
    settle(&wl, a);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    plx_fault_clear(wl.fb);
    int failed = wl.v[a].h->failed;
    size_t f = wl.nf;
    sub_read(&wl, a, 40, 1); /* checked against the model in req_done when it succeeds */
    sub_flush(&wl, a);
    drain(&wl);
    printf("crash[%s]: write %d, VDI failed %d, flush after it %d\n", wl.name, wl.w[w].status,
           failed, wl.f[f].status);
    if (_i == 0) {
        ck_assert_msg(wl.w[w].status == 0 && failed == -EIO, "write %d, VDI failed %d",
                      wl.w[w].status, failed);
        ck_assert_int_eq(wl.f[f].status, -EIO);
    } else {
        ck_assert_msg(wl.w[w].status == -EIO && failed == 0, "write %d, VDI failed %d",
                      wl.w[w].status, failed);
        ck_assert_int_eq(wl.f[f].status, 0);
    }
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A write to a new block whose data write fails, while a snapshot and a write to a neighbouring
 * block (which copies the leaf again) went in behind it: the failed block must read as before,
 * and the snapshot, which swapped roots while W's data was in flight, fails. */
START_TEST(test_eio_write_snapshot_cow)
{
    struct wl wl;
    int a = eio_setup(&wl, "eio-write-snapshot-cow", 909);
    /* The case needs W's data write to be the next I/O: in arrival order. Placed by leaf (the
     * default), W takes an empty leaf slot and the allocator claims its next extent ahead first,
     * so the injected error would hit that claim instead (harmless, and not this case). */
    wl.st->alloc->by_leaf = false;
    sub_snap(&wl, a, false);
    drain(&wl);
    wl.expect_ok = false;
    snprintf(wl.where, sizeof wl.where, "data write of W fails after S and W2 went in");
    plx_fault_fail_nth(wl.fb, 1, -EIO); /* the next I/O: W's data write */
    size_t w = wl.nw, s = wl.ns;
    sub_write(&wl, a, 30, 1, false, false); /* W */
    sub_snap(&wl, a, false);                /* S: W is mutated, its data in flight */
    sub_write(&wl, a, 31, 1, false, false); /* W2: copies the leaf W linked */
    drain(&wl);
    ck_assert_uint_eq(plx_fault_errors_injected(wl.fb), 1);
    ck_assert_msg(wl.w[w].status == -EIO, "W: %d (%s)", wl.w[w].status, wl.first_err);
    /* S swapped roots before W's data failed: it fails rather than freeze a block never
     * written (and W2, in its batch, with it). */
    ck_assert_msg(wl.s[s].status == -EIO, "S: %d", wl.s[s].status);
    sub_read(&wl, a, 28, 6);
    drain(&wl);
    eio_after(&wl, a);
    eio_finish(&wl);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* Close everything, then verify the images of every crash position from..to: only flushed
 * writes, every write, and 32 random subsets each. */
static void sweep_every_position(struct wl *wl, uint64_t from, uint64_t to)
{
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h)
            close_vdi(wl, vi);
    ck_assert_int_eq(plx_store_close(wl->st), 0);
    wl->st = NULL;
    struct plx_crash_cursor *c = plx_crash_cursor_new(wl->fb);
    for (uint64_t p = from; p <= to; p++) {
        plx_crash_cursor_seek(c, p);
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0), p,
                     PLX_CRASH_DROP_UNFLUSHED, 0, 3);
        verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_KEEP_ALL, 0), p, PLX_CRASH_KEEP_ALL,
                     0, 3);
        for (uint64_t seed = 1; seed <= 32; seed++)
            verify_image(wl, plx_crash_cursor_image(c, PLX_CRASH_RANDOM, seed), p,
                         PLX_CRASH_RANDOM, seed, 3);
    }
    plx_crash_cursor_free(c);
    printf("crash[%s]: positions %llu..%llu, %llu images, %llu violations\n", wl->name,
           (unsigned long long)from, (unsigned long long)to, wl->images, wl->violations);
}

/* A snapshot that shares its batch with a write: after a crash, the snapshot may be missing, but
 * if its record is on the medium its tree must hold the write (submitted before it). Every crash
 * position from the snapshot's submission to its completion, every mode, 32 random seeds. */
START_TEST(test_snapshot_commit_order)
{
    struct wl wl;
    int a = eio_setup(&wl, "snapshot-commit-order", 1001);
    sub_snap(&wl, a, false); /* everything read-only under a fresh root */
    drain(&wl);
    sub_write(&wl, a, 0, 1, false, false);   /* W0: its batch starts flying at once */
    sub_write(&wl, a, 200, 1, false, false); /* W: waits in the next batch ... */
    size_t si = wl.ns;
    sub_snap(&wl, a, false); /* ... with S */
    drain(&wl);
    sweep_every_position(&wl, wl.s[si].sub_pos, wl.s[si].done_pos);
    eio_report(&wl);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

/* A VDI closed and opened again while its nodes stay cached: batch numbers restart, and a node
 * created by batch 1 of the first opening must still count as an existing (commit) node for
 * batch 1 of the second, written only after the flush that makes what it links durable.
 * Every crash position of the second opening's writes, every mode, 32 random seeds. */
START_TEST(test_reopen_commit_order)
{
    struct wl wl;
    static const struct range r[] = {R(0, 64)};
    wl_init(&wl, "reopen-commit-order", 1103, 0);
    /* Junk in the blocks the workload will get: a block linked before its data is durable
     * shows up as junk, not as zeros. */
    uint64_t junk_id = 0;
    ck_assert_int_eq(plx_vdi_create(wl.st, "junk", 2 * MIB, &junk_id), 0);
    plx_vdi *jh = NULL;
    ck_assert_int_eq(plx_vdi_open(wl.st, "junk", 0, &jh), 0);
    unsigned char *jb = plx_block_alloc(256);
    memset(jb, 0xee, 256 * BS);
    ck_assert_int_eq(plx_vdi_pwrite(jh, jb, 0, 256 * BS, 0), 0);
    plx_block_free(jb);
    ck_assert_int_eq(plx_vdi_close(jh), 0);
    ck_assert_int_eq(plx_vdi_delete(wl.st, "junk"), 0);
    struct plx_gc_report g;
    ck_assert_int_eq(plx_gc(wl.st, 0, &g), 0);
    int a = add_vdi(&wl, "ro", 2 * MIB, r, 1);
    open_vdi(&wl, a);
    sub_write(&wl, a, 0, 1, false, false); /* batch 1: new leaf path */
    sub_flush(&wl, a);
    drain(&wl);
    close_vdi(&wl, a);
    open_vdi(&wl, a);
    size_t first = wl.nw;
    sub_write(&wl, a, 1, 1, false, false); /* batch 1 again: the same leaf, in place */
    sub_write(&wl, a, 2, 1, false, false);
    sub_write(&wl, a, 3, 1, false, false);
    sub_flush(&wl, a);
    drain(&wl);
    sweep_every_position(&wl, wl.w[first].sub_pos, wl.f[wl.nf - 1].done_pos);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "%llu violations", v);
}
END_TEST

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
static void reg_verify_names(struct reg_run *r, plx_store *st, const uint64_t *a,
                             const uint64_t *b, const char *where)
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

static plx_store *reg_open(plx_backend *img, int read_only, const char *where,
                           struct reg_run *r)
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
    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(r.fb), NULL, &upgraded, err,
                                               sizeof err), 0);
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
            int rc = plx_store_open_backend(tu_keep_wrap(img), &(struct plx_open_opts){
                .struct_size = sizeof(struct plx_open_opts), .read_only = 1}, &probe, err,
                sizeof err);
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

/* ---- Suite ----------------------------------------------------------------------------------- */

static Suite *crash_suite(void)
{
    Suite *s = suite_create("crash");
    TCase *tc = tcase_create("workloads");
    tcase_set_timeout(tc, 900);
    int runs = workload_runs(), mine = (runs - (int)g_shard + (int)g_shards - 1) / (int)g_shards;
    tcase_add_loop_test(tc, test_crash_workload, 0, mine);
    suite_add_tcase(s, tc);

    /* The write-cache cases: two seeds, the drain deferred (run 0, in shard 0) and eager (run 1,
     * in shard 1 mod N): some 15 s each in full runs, the longest cases of the harness. */
    for (int run = 0; run < 2; run++) {
        if (!g_other_cases || g_shard != (unsigned)run % g_shards)
            continue;
        tc = tcase_create("wcache");
        tcase_set_timeout(tc, 900);
        tcase_add_loop_test(tc, test_crash_wcache, run, run + 1);
        suite_add_tcase(s, tc);
    }
    if (g_other_cases && g_shard == 1 % g_shards) { /* the EIO cases */
        tc = tcase_create("eio");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, test_eio_data_read);
        tcase_add_test(tc, test_eio_data_write);
        tcase_add_loop_test(tc, test_eio_metadata_write, 0, 3);
        tcase_add_test(tc, test_eio_flush);
        tcase_add_test(tc, test_eio_first_snapshot);
        tcase_add_test(tc, test_snapshot_label_in_flight);
        tcase_add_test(tc, test_eio_overlapping_write);
        tcase_add_test(tc, test_eio_write_snapshot_cow);
        tcase_add_loop_test(tc, test_eio_cached_commit, 0, 2);
        tcase_add_test(tc, test_snapshot_commit_order);
        tcase_add_test(tc, test_reopen_commit_order);
        tcase_add_loop_test(tc, test_eio_nth, 0, 2);
        suite_add_tcase(s, tc);
    }
    if (g_other_cases && g_shard == g_shards - 1) { /* the registry cases */
        tc = tcase_create("registry");
        tcase_set_timeout(tc, 900);
        tcase_add_test(tc, test_crash_registry);
        tcase_add_test(tc, test_crash_held);
        tcase_add_test(tc, test_crash_upgrade);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    void *shared = mmap(NULL, sizeof(struct totals), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_tot = shared != MAP_FAILED ? shared : &g_tot_local;
    memset(g_tot, 0, sizeof *g_tot);
    install_death_report();
    parse_shard();
    printf("test_crash: %s mode, shard %u of %u\n", tu_quick() ? "quick" : "full", g_shard + 1,
           g_shards);
    fflush(stdout);
    int rc = tu_run_suite(crash_suite());
    printf("crash: %llu crash points (positions x modes), %d workloads (%llu runs), %llu failures "
           "(%llu of them an unfinished snapshot that exists with wrong contents; %llu distinct "
           "positions, %llu plx_check runs)\n",
           g_tot->images, NWORKLOADS, g_tot->workloads, g_tot->failures, g_tot->strict,
           g_tot->positions, g_tot->checks);
    printf("crash: error injection: %llu runs, %llu failures\n", g_tot->eio_runs,
           g_tot->eio_failures);
    return rc;
}
