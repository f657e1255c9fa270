/*
 * bench/engine_parts.c - the engine benchmark's parts (bench/engine.c): the setup of the raw
 * file and the filled VDI, then throughput, single-write latency, snapshot latency, snapshot
 * frequency cost, and the consistency check at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_engine.h"

/* ---- Setup: the raw file and the filled VDI ------------------------------------------------- */

static const struct workload *fill_workload(uint64_t size)
{
    static struct workload w;
    w = (struct workload){.name = "fill (1 MiB sequential writes, QD 8)",
                          .write = 1,
                          .bs = MiB,
                          .qd = 8,
                          .random = 0,
                          .seed = 7,
                          .region_off = 0,
                          .region_len = size,
                          .stop_at_end = 1};
    return &w;
}

static const struct workload *warm_workload(uint64_t size)
{
    static struct workload w;
    w = (struct workload){.name = "full read pass (1 MiB sequential reads, QD 8)",
                          .write = 0,
                          .bs = MiB,
                          .qd = 8,
                          .random = 0,
                          .seed = 8,
                          .region_off = 0,
                          .region_len = size,
                          .stop_at_end = 1,
                          .verify = 1};
    return &w;
}

static void pass(struct target *t, const struct workload *w)
{
    struct run r;
    run_workload(&r, t, w, 0);
    bench_progress("%s %s: %.0f MiB/s (%.1f s)", t->label, w->name, run_mibs(&r), run_secs(&r));
    run_free(&r);
}

static uint64_t main_store_size(const struct opts *o)
{
    /* The VDI, its radix nodes, and room for copy-on-write after the snapshot tests. */
    uint64_t extra = o->size / 2 + (o->quick ? 256 * MiB : 2 * GiB);
    uint64_t sz = 2 * o->size + extra;
    return (sz + EXTENT_SIZE - 1) / EXTENT_SIZE * EXTENT_SIZE;
}

void setup_raw(struct ctx *c)
{
    const struct opts *o = &c->o;
    int fd = open(c->raw_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("creating %s: %s", c->raw_path, strerror(errno));
    track_path(c->raw_path);
    int e = posix_fallocate(fd, 0, (off_t)o->size);
    if (e != 0 && ftruncate(fd, (off_t)o->size) != 0)
        die("sizing %s: %s", c->raw_path, strerror(errno));
    close(fd);
    bench_raw_open(&c->raw, c->raw_path, o->size);
    pass(&c->raw, fill_workload(o->size));
}

void setup_plx(struct ctx *c)
{
    const struct opts *o = &c->o;
    bench_store_format(c->store_path, main_store_size(o), 0);
    plx_store *st = bench_store_open(c->store_path, o->cache_bytes);
    bench_vdi_create(st, "bench", o->size);
    bench_store_close(st);
    bench_target_open(&c->plx, c->store_path, o->cache_bytes, "bench");
    c->plx_open = 1;
    pass(&c->plx, fill_workload(o->size));
    int rc = plx_vdi_flush(c->plx.v);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_vdi_flush");
}

static void reopen_plx(struct ctx *c)
{
    bench_target_close(&c->plx);
    bench_target_open(&c->plx, c->store_path, c->o.cache_bytes, "bench");
}

/* ---- 1. Throughput ----------------------------------------------------------------------------
 */

static void tp_workloads(const struct opts *o, struct workload w[4])
{
    w[0] = (struct workload){.name = "4K randread QD32",
                             .write = 0,
                             .bs = 4 * KiB,
                             .qd = 32,
                             .random = 1,
                             .seed = 101,
                             .region_len = o->size,
                             .verify = 1};
    w[1] = (struct workload){.name = "4K randwrite QD32",
                             .write = 1,
                             .bs = 4 * KiB,
                             .qd = 32,
                             .random = 1,
                             .seed = 102,
                             .region_len = o->size};
    w[2] = (struct workload){.name = "1M seqread QD8",
                             .write = 0,
                             .bs = MiB,
                             .qd = 8,
                             .random = 0,
                             .seed = 103,
                             .region_len = o->size,
                             .verify = 1};
    w[3] = (struct workload){.name = "1M seqwrite QD8",
                             .write = 1,
                             .bs = MiB,
                             .qd = 8,
                             .random = 0,
                             .seed = 104,
                             .region_len = o->size};
}

static double tp_value(const struct run *r)
{
    return r->w->bs == MiB ? run_mibs(r) : run_iops(r);
}

static double timed(struct target *t, const struct workload *w, double secs, const char *tag,
                    double *cpu_per_op, uint64_t *ops, struct io_counts *io)
{
    struct run r;
    run_workload(&r, t, w, secs);
    foreign_note(r.dev_bytes, r.bytes);
    if (ops != NULL) {
        *ops += r.ops;
        io_add(io, &r.io);
    }
    double v = tp_value(&r);
    double cpu = r.ops ? (double)r.cpu_ns / 1000.0 / (double)r.ops : 0;
    if (cpu_per_op != NULL)
        *cpu_per_op = cpu;
    bench_progress("%-8s %-5s %-18s %10.0f %-5s  CPU %6.2f us/request", t->label, tag, w->name, v,
                   w->bs == MiB ? "MiB/s" : "IOPS", cpu);
    run_free(&r);
    return v;
}

void bench_throughput(struct ctx *c)
{
    const struct opts *o = &c->o;
    struct workload w[4];
    tp_workloads(o, w);
    fprintf(stderr, "[1] throughput: raw file vs Parallax VDI (%.1f s per run)\n", o->runtime);
    for (int i = 0; i < 4; i++) {
        c->res.tp[i].name = w[i].name;
        c->res.tp[i].iops_unit = w[i].bs != MiB;
        c->res.tp[i].is_read = !w[i].write;
    }
    for (unsigned k = 0; k < o->repeat; k++) {
        if (o->repeat > 1)
            fprintf(stderr, "  repetition %u of %u\n", k + 1, o->repeat);
        /* Warm: every radix node resident after a full read pass. The raw file gets the same
         * pass, so whatever caches below (the host's, for a VM disk) see both alike. The raw
         * and the warm Parallax run of a workload are back to back, so slow drifts of the
         * medium hit both. */
        pass(&c->raw, warm_workload(o->size));
        pass(&c->plx, warm_workload(o->size));
        for (int i = 0; i < 4; i++) {
            struct tp_result *t = &c->res.tp[i];
            /* Alternate which side goes first, so an order effect cancels out. */
            for (int side = 0; side < 2; side++) {
                if ((side == 0) == (k % 2 == 0))
                    t->raw_v[k] =
                        timed(&c->raw, &w[i], o->runtime, "", &t->raw_cpu_v[k], NULL, NULL);
                else
                    t->warm_v[k] = timed(&c->plx, &w[i], o->runtime, "warm", &t->warm_cpu_v[k],
                                         &t->warm_ops, &t->warm_io);
            }
        }
        /* Cold: the store is closed and reopened right before each timed run. */
        for (int i = 0; i < 4; i++) {
            reopen_plx(c);
            struct tp_result *t = &c->res.tp[i];
            t->cold_v[k] =
                timed(&c->plx, &w[i], o->runtime, "cold", NULL, &t->cold_ops, &t->cold_io);
        }
    }
    for (int i = 0; i < 4; i++) {
        struct tp_result *t = &c->res.tp[i];
        t->n = o->repeat;
        t->raw = spread_of(t->raw_v, t->n);
        t->warm = spread_of(t->warm_v, t->n);
        t->cold = spread_of(t->cold_v, t->n);
        t->raw_cpu = spread_of(t->raw_cpu_v, t->n);
        t->warm_cpu = spread_of(t->warm_cpu_v, t->n);
        double wr[MAX_REPEAT], cr[MAX_REPEAT];
        for (unsigned k = 0; k < t->n; k++) {
            wr[k] = t->warm_v[k] / t->raw_v[k];
            cr[k] = t->cold_v[k] / t->raw_v[k];
        }
        t->warm_ratio = spread_of(wr, t->n);
        t->cold_ratio = spread_of(cr, t->n);
        t->warm_gm = geomean(wr, t->n);
        t->cold_gm = geomean(cr, t->n);
    }
    c->res.have_tp = 1;
}

/* ---- 4. Single-write latency (QD 1) --------------------------------------------------------- */

/* The rows of the single-write latency table. Raw rows first: ratios are to row 0. */
enum {
    WL_RAW,       /* a 4 KiB write to the raw file */
    WL_RAW_FLUSH, /* write, then flush */
    WL_RAW_CHAIN, /* write, write, flush, write: the serial chain of an allocating write */
    WL_WRITABLE,
    WL_SPARSE,
    WL_SPARSE_TOP,
    WL_FAULTED,
    WL_ROWS
};

static const char *const wl_names[WL_ROWS] = {
    "raw write",     "raw write+flush", "raw w,w,flush,w",    "writable",
    "sparse (leaf)", "sparse (top)",    "faulted (read-only)"};
static const char *const wl_what[WL_ROWS] = {
    "4 KiB write to the preallocated, fully written raw file",
    "raw-file write, then a flush",
    "raw-file write, write, flush, write, one after the other: the serial chain an allocating "
    "Parallax write goes through (data; new nodes and bitmap; flush; commit node)",
    "overwrite of a block already written since the last snapshot: in place",
    "first write into a never-written 2 MiB range: new data block and leaf node",
    "first write under an empty root slot (thesis fig. 5.6): new level-1 node, leaf, data block",
    "first write after a snapshot (thesis fig. 5.6): copies of the level-1 node and leaf, new "
    "data block"};

static plx_vdi *open_extra_vdi(struct ctx *c, const char *name, uint64_t size, struct target *t)
{
    bench_vdi_create(c->plx.st, name, size);
    *t = c->plx;
    int rc = plx_vdi_open(c->plx.st, name, 0, &t->v);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_vdi_open");
    t->size = plx_vdi_size(t->v);
    return t->v;
}

static void close_extra_vdi(struct ctx *c, struct target *t)
{
    int rc = plx_vdi_close(t->v);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_vdi_close");
}

/* All rows are measured interleaved (one sample of each in turn), so a slow drift or a bad
 * moment of the medium hits every row alike. */
void bench_write_latency(struct ctx *c)
{
    const struct opts *o = &c->o;
    unsigned n = o->lat_writes;
    unsigned ntop = n < 512 ? n : 512; /* 512 root slots in a 512 GiB (height 3) VDI */
    uint64_t blocks = o->size / BLK;
    uint64_t rng = 201, tag = 1;
    struct slot s;
    memset(&s, 0, sizeof s);
    s.buf = plx_block_alloc(1);
    fill_random(s.buf, BLK, 42);
    struct lat l[WL_ROWS];
    memset(l, 0, sizeof l);
    struct target sp, top;
    open_extra_vdi(c, "sparse", (uint64_t)n * 2 * MiB, &sp);
    open_extra_vdi(c, "sparsetop", 512 * GiB, &top);

    fprintf(stderr, "[4] single 4 KiB write latency at QD 1 (%u writes per path, interleaved)\n",
            n);
    for (unsigned i = 0; i < n; i++) {
        uint64_t off = splitmix64(&rng) % blocks * BLK;
        uint64_t off2 = splitmix64(&rng) % blocks * BLK;
        uint64_t r = splitmix64(&rng);
        lat_add(&l[WL_RAW], one_write(&c->raw, &s, off, tag++));

        uint64_t t0 = bench_now_ns();
        one_write(&c->raw, &s, off, tag++);
        bench_raw_flush(&c->raw);
        lat_add(&l[WL_RAW_FLUSH], bench_now_ns() - t0);

        t0 = bench_now_ns();
        one_write(&c->raw, &s, off, tag++);
        one_write(&c->raw, &s, off2, tag++);
        bench_raw_flush(&c->raw);
        one_write(&c->raw, &s, off, tag++);
        lat_add(&l[WL_RAW_CHAIN], bench_now_ns() - t0);

        /* Writable: the first write makes the path writable again after the last iteration's
         * snapshot; the second, timed, overwrites in place. */
        one_write(&c->plx, &s, off, tag++);
        lat_add(&l[WL_WRITABLE], one_write(&c->plx, &s, off, tag++));

        lat_add(&l[WL_SPARSE], one_write(&sp, &s, (uint64_t)i * 2 * MiB + r % 512 * BLK, tag++));
        if (i < ntop)
            lat_add(&l[WL_SPARSE_TOP],
                    one_write(&top, &s, (uint64_t)i * GiB + (r >> 16) % (GiB / BLK) * BLK, tag++));

        /* Read-only: a snapshot (untimed), then the first write: faults at the top of the tree. */
        uint64_t idx;
        int rc = plx_vdi_snapshot_open(c->plx.v, "", &idx);
        if (rc < 0)
            die_store(c->plx.st, rc, "plx_vdi_snapshot_open");
        lat_add(&l[WL_FAULTED], one_write(&c->plx, &s, off2, tag++));
    }
    close_extra_vdi(c, &sp);
    close_extra_vdi(c, &top);

    struct results *res = &c->res;
    res->nwlat = WL_ROWS;
    for (int k = 0; k < WL_ROWS; k++) {
        struct wlat_result *w = &res->wlat[k];
        w->name = wl_names[k];
        w->what = wl_what[k];
        w->s = lat_summarize(&l[k]);
        lat_free(&l[k]);
        w->ratio_mean = w->s.mean / res->wlat[0].s.mean;
        w->ratio_p50 = w->s.p50 / res->wlat[0].s.p50;
        bench_progress("%-20s mean %8.1f us  p50 %8.1f us  (x%.2f of a raw write)", w->name,
                       w->s.mean, w->s.p50, w->ratio_p50);
    }
    plx_block_free(s.buf);
    res->have_wlat = 1;
}

/* ---- 2. Snapshot latency ------------------------------------------------------------------- */

void bench_snapshot_latency(struct ctx *c)
{
    const struct opts *o = &c->o;
    struct lat l = {0};
    fprintf(stderr, "[2] snapshot latency (%u snapshots idle, %u under load)\n", o->snaps,
            o->snaps);
    /* Each snapshot is followed by the same I/O pattern on the raw file, done by hand: two
     * block writes at once (new root, log block), flush, one write (VDI record), flush. That is
     * the floor the medium sets for a snapshot. */
    struct lat floor = {0};
    struct slot a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.buf = plx_block_alloc(1);
    b.buf = plx_block_alloc(1);
    a.len = b.len = BLK;
    a.write = b.write = 1;
    for (unsigned i = 0; i < o->snaps; i++) {
        uint64_t idx, t0 = bench_now_ns();
        int rc = plx_vdi_snapshot_open(c->plx.v, "", &idx);
        if (rc < 0)
            die_store(c->plx.st, rc, "plx_vdi_snapshot_open");
        lat_add(&l, bench_now_ns() - t0);

        t0 = bench_now_ns();
        a.off = 0;
        b.off = BLK;
        stamp(a.buf, a.off, BLK, i);
        stamp(b.buf, b.off, BLK, i);
        target_submit(&c->raw, &a);
        target_submit(&c->raw, &b);
        while (!a.done || !b.done)
            target_wait(&c->raw, UINT64_MAX);
        if (a.status || b.status)
            die("raw file: write failed: %s", strerror(-(a.status ? a.status : b.status)));
        bench_raw_flush(&c->raw);
        one_write(&c->raw, &a, 2 * BLK, i);
        bench_raw_flush(&c->raw);
        lat_add(&floor, bench_now_ns() - t0);
    }
    plx_block_free(a.buf);
    plx_block_free(b.buf);
    c->res.snap_idle = lat_summarize(&l);
    c->res.snap_floor = lat_summarize(&floor);
    lat_free(&l);
    lat_free(&floor);
    bench_progress("idle:   p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms",
                   c->res.snap_idle.p50 / 1000, c->res.snap_idle.p90 / 1000,
                   c->res.snap_idle.p99 / 1000, c->res.snap_idle.max / 1000);

    /* Loaded: 4 KiB random writes at QD 32 on the same VDI, snapshots submitted back to back
     * into the same request stream. */
    struct workload w = {.name = "4K randwrite QD32 + snapshots",
                         .write = 1,
                         .bs = 4 * KiB,
                         .qd = 32,
                         .random = 1,
                         .seed = 301,
                         .region_len = o->size};
    struct run r;
    run_init(&r, &c->plx, &w);
    r.snap.mode = SNAP_BACK_TO_BACK;
    r.snap.want = o->snaps;
    run_exec(&r, 0);
    c->res.snap_loaded = lat_summarize(&r.snap.lat);
    c->res.loaded_write_iops = run_iops(&r);
    c->res.loaded_secs = run_secs(&r);
    c->res.loaded_snaps = r.snap.completed;
    bench_progress(
        "loaded: p50 %.3f ms  p99 %.3f ms  max %.3f ms  mean %.3f ms  (writes %.0f IOPS)",
        c->res.snap_loaded.p50 / 1000, c->res.snap_loaded.p99 / 1000, c->res.snap_loaded.max / 1000,
        c->res.snap_loaded.mean / 1000, c->res.loaded_write_iops);
    run_free(&r);
    c->res.have_snaplat = 1;
}

/* ---- 3. Snapshot frequency cost -------------------------------------------------------------- */

uint64_t freq_store_size(const struct opts *o)
{
    uint64_t sz = o->freq_size + o->freq_size / 64 + (o->quick ? 128 * MiB : 512 * MiB);
    return (sz + EXTENT_SIZE - 1) / EXTENT_SIZE * EXTENT_SIZE;
}

/* Each run gets a freshly formatted store (so a fresh, never-written VDI region) on the same
 * file, which was written in full once so that no run pays for filesystem block allocation. */
static void freq_one(struct ctx *c, struct freq_result *fr, double interval_ms, unsigned k)
{
    const struct opts *o = &c->o;
    bench_store_format(c->freq_path, freq_store_size(o), 1);
    plx_store *st = bench_store_open(c->freq_path, o->cache_bytes);
    bench_vdi_create(st, "freq", o->freq_size);
    bench_store_close(st);
    /* Metadata in use, measured on a freshly opened store (no claimed-but-unused blocks). */
    st = bench_store_open(c->freq_path, o->cache_bytes);
    uint64_t d0, m0 = metadata_blocks(st, &d0);
    bench_store_close(st);

    struct target t;
    bench_target_open(&t, c->freq_path, o->cache_bytes, "freq");
    struct workload w = {.name = "1M seqwrite QD8 (fresh region)",
                         .write = 1,
                         .bs = MiB,
                         .qd = 8,
                         .random = 0,
                         .seed = 401,
                         .region_len = o->freq_size,
                         .stop_at_end = 1};
    struct run r;
    run_init(&r, &t, &w);
    if (interval_ms > 0) {
        r.snap.mode = SNAP_PERIODIC;
        r.snap.interval_ns = (uint64_t)(interval_ms * 1e6);
    }
    run_exec(&r, o->runtime);
    bench_target_close(&t);

    st = bench_store_open(c->freq_path, o->cache_bytes);
    uint64_t d1, m1 = metadata_blocks(st, &d1);
    bench_store_close(st);

    fr->interval_ms = interval_ms;
    fr->mibs_v[k] = run_mibs(&r);
    fr->n = k + 1;
    fr->secs += run_secs(&r);
    fr->bytes += r.bytes;
    fr->exhausted |= r.exhausted;
    fr->snaps += r.snap.completed;
    fr->submitted += r.snap.submitted;
    if (r.snap.submitted > 1)
        fr->span_ns += r.snap.last_submit - r.snap.first_submit;
    lat_append(&fr->lat, &r.snap.lat);
    io_add(&fr->io, &r.io);
    /* Own traffic: the data plus the metadata blocks it allocated (an estimate). */
    foreign_note(r.dev_bytes, r.bytes + (m1 - m0) * BLK);
    fr->meta_blocks += (int64_t)m1 - (int64_t)m0;
    fr->data_blocks += (int64_t)d1 - (int64_t)d0;
    bench_progress("%-8s %7.0f MiB/s in %.2f s%s, %u snapshots, metadata +%" PRId64 " blocks",
                   interval_ms > 0 ? "" : "none", run_mibs(&r), run_secs(&r),
                   r.exhausted ? " (region full)" : "", r.snap.completed,
                   (int64_t)m1 - (int64_t)m0);
    run_free(&r);
}

void bench_snapshot_frequency(struct ctx *c)
{
    static const double intervals[] = {0, 1000, 100, 20, 10};
    struct results *res = &c->res;
    fprintf(stderr,
            "[3] snapshot frequency cost (1 MiB sequential writes, QD 8, fresh %s "
            "region per run)\n",
            fmt_bytes(c->o.freq_size, (char[32]){0}, 32));
    int fd = open(c->freq_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("creating %s: %s", c->freq_path, strerror(errno));
    track_path(c->freq_path);
    uint64_t fsize = freq_store_size(&c->o);
    if (posix_fallocate(fd, 0, (off_t)fsize) != 0 && ftruncate(fd, (off_t)fsize) != 0)
        die("sizing %s: %s", c->freq_path, strerror(errno));
    close(fd);
    struct target t;
    bench_raw_open(&t, c->freq_path, fsize);
    pass(&t, fill_workload(fsize));
    bench_raw_close(&t);

    res->nfreq = sizeof intervals / sizeof intervals[0];
    /* Repetitions interleave the intervals, so a slow drift of the medium spreads evenly. */
    for (unsigned k = 0; k < c->o.repeat; k++) {
        if (c->o.repeat > 1)
            fprintf(stderr, "  repetition %u of %u\n", k + 1, c->o.repeat);
        for (size_t j = 0; j < res->nfreq; j++) {
            size_t i = k % 2 ? res->nfreq - 1 - j : j; /* every other repetition backwards */
            if (intervals[i] > 0)
                fprintf(stderr, "  .. snapshot every %g ms\n", intervals[i]);
            freq_one(c, &res->freq[i], intervals[i], k);
        }
    }
    untrack_path(c->freq_path);
    /* Baseline: the runs without snapshots. */
    const struct freq_result *b = &res->freq[0];
    res->freq_base_mibs = spread_of(b->mibs_v, b->n).med;
    double mib = (double)b->bytes / MiB;
    res->freq_base_meta_per_mib = mib > 0 ? (double)b->meta_blocks / mib : 0;
    for (size_t i = 0; i < res->nfreq; i++) {
        struct freq_result *fr = &res->freq[i];
        fr->mibs = spread_of(fr->mibs_v, fr->n);
        double rel[MAX_REPEAT];
        for (unsigned k = 0; k < fr->n; k++)
            rel[k] = fr->mibs_v[k] / b->mibs_v[k];
        fr->loss = 1.0 - geomean(rel, fr->n);
        fr->snap_lat = lat_summarize(&fr->lat);
        lat_free(&fr->lat);
        if (fr->submitted > fr->n)
            fr->avg_interval_ms = (double)fr->span_ns / 1e6 / (double)(fr->submitted - fr->n);
        if (fr->snaps > 0) {
            fr->kib_per_snap = (double)fr->meta_blocks * (BLK / KiB) / fr->snaps;
            double expected = res->freq_base_meta_per_mib * (double)fr->bytes / MiB;
            fr->excess_kib_per_snap =
                ((double)fr->meta_blocks - expected) * (BLK / KiB) / fr->snaps;
        }
    }
    res->have_freq = 1;
}

/* ---- Consistency check ---------------------------------------------------------------------- */

static void check_line(void *arg, int is_error, const char *line)
{
    struct results *res = arg;
    if (is_error && res->check_errors_reported++ < 10)
        fprintf(stderr, "plx_check: %s\n", line);
}

void run_check(struct ctx *c)
{
    fprintf(stderr, "[check] plx_check on the main store\n");
    int rc = plx_check(c->plx.st, &c->res.check, check_line, &c->res);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_check");
    c->res.check_ran = 1;
    bench_progress("%" PRIu64 " trees, %" PRIu64 " reachable blocks, %" PRIu64 " errors",
                   c->res.check.trees, c->res.check.reachable_blocks, c->res.check.errors);
}
