/*
 * bench/engine_run.c - the engine benchmark's timed runs (bench/engine.c): the targets (the raw
 * file driven through the file backend, or a Parallax VDI), the backend that counts the engine's
 * I/O, block stamps, and a workload run on a target with snapshots in its request stream.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_engine.h"

/* ---- Counting the engine's I/O (--count-io) ------------------------------------------------- */

/* --count-io: Parallax stores are opened on a wrapper of the file backend that counts the I/Os
 * the engine issues (plx_store_open_backend instead of plx_store_open: the same backend and
 * engine, without the admin flock, which only the rare extent claims take). */
int g_count_io;

static struct io_counts g_io;

struct count_backend {
    plx_backend base;
    plx_backend *in;
};

static int count_submit(plx_backend *be, struct plx_io *io)
{
    struct count_backend *w = (struct count_backend *)be;
    int rc = w->in->ops->submit(w->in, io);
    if (rc == 0 && (unsigned)io->op < 3) {
        g_io.n[io->op]++;
        g_io.blocks[io->op] += io->nblocks;
    }
    return rc;
}

static int count_poll(plx_backend *be, int timeout_ms)
{
    struct count_backend *w = (struct count_backend *)be;
    return w->in->ops->poll(w->in, timeout_ms);
}

static int count_fd(const plx_backend *be)
{
    const struct count_backend *w = (const struct count_backend *)be;
    return w->in->ops->fd(w->in);
}

static unsigned count_inflight(const plx_backend *be)
{
    const struct count_backend *w = (const struct count_backend *)be;
    return w->in->ops->inflight(w->in);
}

static void count_destroy(plx_backend *be)
{
    struct count_backend *w = (struct count_backend *)be;
    w->in->ops->destroy(w->in);
    free(w);
}

static const struct plx_backend_ops count_ops = {
    .submit = count_submit,
    .poll = count_poll,
    .fd = count_fd,
    .inflight = count_inflight,
    .destroy = count_destroy,
};

static struct io_counts io_delta(const struct io_counts *since)
{
    struct io_counts d;
    for (int i = 0; i < 3; i++) {
        d.n[i] = g_io.n[i] - since->n[i];
        d.blocks[i] = g_io.blocks[i] - since->blocks[i];
    }
    return d;
}

void io_add(struct io_counts *sum, const struct io_counts *d)
{
    for (int i = 0; i < 3; i++) {
        sum->n[i] += d->n[i];
        sum->blocks[i] += d->blocks[i];
    }
}

/* ---- Targets: the raw file (backend driven directly) or a Parallax VDI ---------------------- */

static void slot_complete(struct slot *s, int status);

static void raw_io_done(struct plx_io *io, int status)
{
    slot_complete((struct slot *)io, status);
}

static void plx_req_done(void *arg, int status)
{
    slot_complete(arg, status);
}

void die_store(plx_store *st, int rc, const char *what)
{
    die("%s: %s (%s)", what, strerror(-rc), st ? plx_store_errmsg(st) : "");
}

void target_submit(struct target *t, struct slot *s)
{
    s->busy = 1;
    s->done = 0;
    s->status = 0;
    s->t_submit = bench_now_ns();
    int rc;
    if (t->kind == T_RAW) {
        memset(&s->io, 0, sizeof s->io);
        s->io.op = s->write ? PLX_IO_WRITE : PLX_IO_READ;
        s->io.block = s->off / BLK;
        s->io.nblocks = (uint32_t)(s->len / BLK);
        s->io.buf = s->buf;
        s->io.done = raw_io_done;
        s->io.owner = s;
        rc = t->be->ops->submit(t->be, &s->io);
        if (rc < 0)
            die("raw file: submit %s of %zu bytes at %" PRIu64 ": %s", s->write ? "write" : "read",
                s->len, s->off, strerror(-rc));
        return;
    }
    if (s->write)
        rc = plx_vdi_submit_write(t->v, s->buf, s->off, s->len, 0, plx_req_done, s);
    else
        rc = plx_vdi_submit_read(t->v, s->buf, s->off, s->len, plx_req_done, s);
    if (rc < 0) {
        char what[128];
        snprintf(what, sizeof what, "plx_vdi_submit_%s of %zu bytes at %" PRIu64,
                 s->write ? "write" : "read", s->len, s->off);
        die_store(t->st, rc, what);
    }
}

/* Run completions; block only when none ran, at most until `until` (monotonic ns). Returns the
 * number of completions (callbacks) delivered. */
int target_wait(struct target *t, uint64_t until)
{
    if (t->kind == T_RAW) {
        if (t->be->ops->inflight(t->be) == 0)
            return 0;
        int n = t->be->ops->poll(t->be, -1);
        if (n < 0 && n != -EINTR)
            die("raw file: poll: %s", strerror(-n));
        return n < 0 ? 0 : n;
    }
    int n = plx_store_service(t->st);
    if (n < 0)
        die_store(t->st, n, "plx_store_service");
    if (n > 0)
        return n;
    uint64_t now = bench_now_ns();
    if (until <= now)
        return 0;
    uint64_t left = until - now;
    if (left > NS_PER_S)
        left = NS_PER_S; /* wake up now and then to notice a hang */
    struct timespec ts = {(time_t)(left / NS_PER_S), (long)(left % NS_PER_S)};
    struct pollfd pfd = {.fd = plx_store_fd(t->st), .events = POLLIN};
    if (ppoll(&pfd, 1, &ts, NULL) < 0 && errno != EINTR)
        die("poll on plx_store_fd: %s", strerror(errno));
    return 0;
}

void bench_raw_open(struct target *t, const char *path, uint64_t size)
{
    char err[256];
    int e = 0;
    memset(t, 0, sizeof *t);
    t->kind = T_RAW;
    t->label = "raw";
    t->size = size;
    t->be = plx_backend_file_open(path, 0, &e, err, sizeof err);
    if (t->be == NULL)
        die("opening %s: %s", path, err);
}

void bench_raw_close(struct target *t)
{
    if (t->be != NULL)
        t->be->ops->destroy(t->be);
    t->be = NULL;
}

plx_store *bench_store_open(const char *path, uint64_t cache_bytes)
{
    struct plx_open_opts oo;
    memset(&oo, 0, sizeof oo);
    oo.struct_size = sizeof oo;
    oo.cache_bytes = cache_bytes;
    plx_store *st = NULL;
    char err[512];
    int rc;
    if (g_count_io) {
        int e = 0;
        plx_backend *in = plx_backend_file_open(path, 0, &e, err, sizeof err);
        if (in == NULL)
            die("opening %s: %s", path, err);
        struct count_backend *w = calloc(1, sizeof *w);
        if (w == NULL)
            die("out of memory");
        w->base = *in;
        w->base.ops = &count_ops;
        w->in = in;
        rc = plx_store_open_backend(&w->base, &oo, &st, err, sizeof err);
    } else {
        rc = plx_store_open(path, &oo, &st, err, sizeof err);
    }
    if (rc < 0)
        die("plx_store_open %s: %s", path, err);
    return st;
}

void bench_store_close(plx_store *st)
{
    int rc = plx_store_close(st);
    if (rc < 0)
        die("plx_store_close: %s", strerror(-rc));
}

void bench_target_open(struct target *t, const char *path, uint64_t cache_bytes, const char *vdi)
{
    memset(t, 0, sizeof *t);
    t->kind = T_PLX;
    t->label = "parallax";
    t->st = bench_store_open(path, cache_bytes);
    int rc = plx_vdi_open(t->st, vdi, 0, &t->v);
    if (rc < 0)
        die_store(t->st, rc, "plx_vdi_open");
    t->size = plx_vdi_size(t->v);
}

void bench_target_close(struct target *t)
{
    if (t->v != NULL) {
        int rc = plx_vdi_close(t->v);
        if (rc < 0)
            die_store(t->st, rc, "plx_vdi_close");
        t->v = NULL;
    }
    if (t->st != NULL)
        bench_store_close(t->st);
    t->st = NULL;
}

/* Format a store at path. A new file is created sparse; an existing one (prefilled=1) is
 * formatted in place, so the filesystem has its blocks allocated already. */
void bench_store_format(const char *path, uint64_t size, int prefilled)
{
    char err[512];
    if (!prefilled) {
        unlink(path);
        track_path(path);
    }
    int rc = plx_format(path, size, EXTENT_SIZE, 1, err, sizeof err);
    if (rc < 0)
        die("plx_format %s: %s", path, err);
}

void bench_vdi_create(plx_store *st, const char *name, uint64_t size)
{
    uint64_t id;
    int rc = plx_vdi_create(st, name, size, &id);
    if (rc < 0)
        die_store(st, rc, "plx_vdi_create");
}

uint64_t metadata_blocks(plx_store *st, uint64_t *data_blocks)
{
    struct plx_store_info si;
    int rc = plx_store_info(st, &si);
    if (rc < 0)
        die_store(st, rc, "plx_store_info");
    if (data_blocks != NULL)
        *data_blocks = si.blocks_used_by_type[PLX_EXTENT_DATA];
    return si.blocks_used_by_type[PLX_EXTENT_METADATA];
}

/* ---- Block stamps ---------------------------------------------------------------------------- */

void stamp(uint8_t *buf, uint64_t off, size_t len, uint64_t tag)
{
    for (size_t i = 0; i < len; i += BLK) {
        uint64_t *w = (uint64_t *)(buf + i);
        w[0] = STAMP_MAGIC;
        w[1] = (off + i) / BLK;
        w[2] = tag;
    }
}

void fill_random(uint8_t *buf, size_t len, uint64_t seed)
{
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t v = splitmix64(&seed);
        memcpy(buf + i, &v, 8);
    }
}

/* ---- Timed runs: a workload on a target, with optional snapshots in the request stream ------- */

uint64_t g_mismatches; /* data errors over the whole run */
char g_first_mismatch[512];

static void verify_read(struct run *r, struct slot *s)
{
    for (size_t i = 0; i < s->len; i += BLK) {
        const uint64_t *w = (const uint64_t *)(s->buf + i);
        uint64_t vb = (s->off + i) / BLK;
        if (w[0] == STAMP_MAGIC && w[1] == vb)
            continue;
        r->mismatches++;
        if (g_mismatches++ == 0)
            snprintf(g_first_mismatch, sizeof g_first_mismatch,
                     "%s %s: read of %zu bytes at offset %" PRIu64 ": block %" PRIu64
                     " holds stamp (magic %016" PRIx64 ", block %" PRIu64 ", tag %" PRIu64 ")",
                     r->t->label, r->w->name, s->len, s->off, vb, w[0], w[1], w[2]);
        return;
    }
}

static void slot_complete(struct slot *s, int status)
{
    struct run *r = s->run;
    s->t_done = bench_now_ns();
    s->busy = 0;
    s->done = 1;
    s->status = status;
    if (r == NULL)
        return;
    r->inflight--;
    if (status != 0) {
        if (r->errors++ == 0)
            snprintf(r->first_err, sizeof r->first_err,
                     "%s %s: %s of %zu bytes at %" PRIu64 " failed: %s%s%s", r->t->label,
                     r->w->name, s->write ? "write" : "read", s->len, s->off, strerror(-status),
                     r->t->st ? ": " : "", r->t->st ? plx_store_errmsg(r->t->st) : "");
        return;
    }
    r->ops++;
    r->bytes += s->len;
    if (!s->write && r->w->verify)
        verify_read(r, s);
}

void run_init(struct run *r, struct target *t, const struct workload *w)
{
    memset(r, 0, sizeof *r);
    r->t = t;
    r->w = w;
    r->rng = w->seed;
    r->tag = w->seed << 32;
    if (w->region_len == 0 || w->region_len % w->bs != 0 || w->region_off % BLK != 0 ||
        w->region_off + w->region_len > t->size)
        die("workload %s: bad region %" PRIu64 "+%" PRIu64 " for a %" PRIu64 "-byte target",
            w->name, w->region_off, w->region_len, t->size);
    r->slots = calloc(w->qd, sizeof *r->slots);
    if (r->slots == NULL)
        die("out of memory");
    for (unsigned i = 0; i < w->qd; i++) {
        struct slot *s = &r->slots[i];
        s->run = r;
        s->len = w->bs;
        s->write = w->write;
        s->buf = plx_block_alloc(w->bs / BLK);
        fill_random(s->buf, w->bs, w->seed * 1000003 + i);
    }
}

void run_free(struct run *r)
{
    for (unsigned i = 0; i < r->w->qd; i++)
        plx_block_free(r->slots[i].buf);
    free(r->slots);
    lat_free(&r->snap.lat);
}

static int next_offset(struct run *r, uint64_t *off)
{
    const struct workload *w = r->w;
    uint64_t units = w->region_len / w->bs;
    if (w->random) {
        *off = w->region_off + splitmix64(&r->rng) % units * w->bs;
        return 1;
    }
    if (r->seq_next >= units) {
        if (w->stop_at_end) {
            r->exhausted = 1;
            return 0;
        }
        r->seq_next = 0;
    }
    *off = w->region_off + r->seq_next++ * w->bs;
    return 1;
}

static void refill(struct run *r)
{
    for (unsigned i = 0; i < r->w->qd && r->inflight < r->w->qd; i++) {
        struct slot *s = &r->slots[i];
        if (s->busy)
            continue;
        if (!next_offset(r, &s->off))
            return;
        if (s->write)
            stamp(s->buf, s->off, s->len, ++r->tag);
        r->inflight++;
        target_submit(r->t, s);
    }
}

static void snap_done(void *arg, int status)
{
    struct snap_token *tok = arg;
    struct run *r = tok->run;
    r->snap.pending--;
    if (status != 0) {
        if (r->errors++ == 0)
            snprintf(r->first_err, sizeof r->first_err, "%s %s: snapshot failed: %s: %s",
                     r->t->label, r->w->name, strerror(-status), plx_store_errmsg(r->t->st));
    } else {
        r->snap.completed++;
        lat_add(&r->snap.lat, bench_now_ns() - tok->t0);
    }
    free(tok);
}

static void snap_submit(struct run *r, uint64_t now)
{
    struct snap_token *tok = calloc(1, sizeof *tok);
    if (tok == NULL)
        die("out of memory");
    tok->run = r;
    tok->t0 = now;
    int rc = plx_vdi_submit_snapshot(r->t->v, "", &tok->index, snap_done, tok);
    if (rc < 0)
        die_store(r->t->st, rc, "plx_vdi_submit_snapshot");
    if (r->snap.submitted++ == 0)
        r->snap.first_submit = now;
    r->snap.last_submit = now;
    r->snap.pending++;
}

static void snap_tick(struct run *r, uint64_t now)
{
    struct snapsched *sc = &r->snap;
    if (sc->mode == SNAP_PERIODIC && now >= sc->next_due) {
        snap_submit(r, now);
        sc->next_due += sc->interval_ns;
        if (sc->next_due <= now) /* fell behind: no catch-up burst */
            sc->next_due = now + sc->interval_ns;
    } else if (sc->mode == SNAP_BACK_TO_BACK && sc->pending == 0 && sc->submitted < sc->want) {
        snap_submit(r, now);
    }
}

/* Run the workload until `seconds` pass (0: no time limit), the region is covered (stop_at_end),
 * the wanted back-to-back snapshots completed, or an error; then drain. */
void run_exec(struct run *r, double seconds)
{
    uint64_t start = bench_now_ns(), cpu0 = cpu_now_ns(), dev0 = dev_bytes();
    struct io_counts io0 = g_io;
    uint64_t deadline = seconds > 0 ? start + (uint64_t)(seconds * 1e9) : UINT64_MAX;
    uint64_t last_progress = start;
    r->t_start = start;
    if (r->snap.mode == SNAP_PERIODIC)
        r->snap.next_due = start + r->snap.interval_ns;
    for (;;) {
        uint64_t now = bench_now_ns();
        if (!r->stopping &&
            (now >= deadline || r->exhausted || r->errors ||
             (r->snap.mode == SNAP_BACK_TO_BACK && r->snap.completed >= r->snap.want)))
            r->stopping = 1;
        if (!r->stopping) {
            refill(r);
            if (r->snap.mode != SNAP_NONE)
                snap_tick(r, now);
        }
        if (r->stopping && r->inflight == 0 && r->snap.pending == 0)
            break;
        uint64_t until = UINT64_MAX;
        if (!r->stopping) {
            until = deadline;
            if (r->snap.mode == SNAP_PERIODIC && r->snap.next_due < until)
                until = r->snap.next_due;
        }
        int n = target_wait(r->t, until);
        now = bench_now_ns();
        if (n > 0) {
            last_progress = now;
        } else if (now - last_progress > HANG_NS) {
            die("HANG: %s %s: no completion for %llu s with %u requests and %u snapshots "
                "outstanding (plx_store_busy=%d)",
                r->t->label, r->w->name, (unsigned long long)(HANG_NS / NS_PER_S), r->inflight,
                r->snap.pending, r->t->st ? plx_store_busy(r->t->st) : -1);
        }
    }
    r->t_end = bench_now_ns();
    r->cpu_ns = cpu_now_ns() - cpu0;
    r->io = io_delta(&io0);
    r->dev_bytes = dev_bytes() - dev0;
    if (r->errors)
        die("%s", r->first_err);
}

double run_secs(const struct run *r)
{
    return (double)(r->t_end - r->t_start) / 1e9;
}

double run_iops(const struct run *r)
{
    return (double)r->ops / run_secs(r);
}

double run_mibs(const struct run *r)
{
    return (double)r->bytes / MiB / run_secs(r);
}

/* Run a workload once on a target; returns the run (caller frees) for its counters. */
void run_workload(struct run *r, struct target *t, const struct workload *w, double seconds)
{
    run_init(r, t, w);
    run_exec(r, seconds);
}

/* A single write at QD 1; returns its latency in ns. */
uint64_t one_write(struct target *t, struct slot *s, uint64_t off, uint64_t tag)
{
    s->off = off;
    s->write = 1;
    s->len = BLK;
    s->run = NULL;
    stamp(s->buf, off, BLK, tag);
    target_submit(t, s);
    uint64_t last = bench_now_ns();
    while (!s->done) {
        if (target_wait(t, UINT64_MAX) > 0)
            last = bench_now_ns();
        else if (bench_now_ns() - last > HANG_NS)
            die("HANG: %s: single 4 KiB write at %" PRIu64 " did not complete in %llu s", t->label,
                off, (unsigned long long)(HANG_NS / NS_PER_S));
    }
    if (s->status != 0)
        die("%s: single write at %" PRIu64 " failed: %s%s%s", t->label, off, strerror(-s->status),
            t->st ? ": " : "", t->st ? plx_store_errmsg(t->st) : "");
    return s->t_done - s->t_submit;
}

/* A flush (fdatasync) on the raw file at QD 1; returns its latency in ns. */
uint64_t bench_raw_flush(struct target *t)
{
    struct slot f;
    memset(&f, 0, sizeof f);
    f.busy = 1;
    f.t_submit = bench_now_ns();
    f.io.op = PLX_IO_FLUSH;
    f.io.done = raw_io_done;
    f.io.owner = &f;
    int rc = t->be->ops->submit(t->be, &f.io);
    if (rc < 0)
        die("raw file: submit flush: %s", strerror(-rc));
    while (!f.done)
        target_wait(t, UINT64_MAX);
    if (f.status != 0)
        die("raw file: flush failed: %s", strerror(-f.status));
    return f.t_done - f.t_submit;
}
