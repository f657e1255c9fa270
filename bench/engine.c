/*
 * bench/engine.c - in-process benchmark of the Parallax engine against the raw file it runs on.
 *
 * One run measures, on files in one directory (removed at the end):
 *   1. throughput: 4 KiB random read/write at QD 32 and 1 MiB sequential read/write at QD 8 for a
 *      fixed time, on (a) a preallocated, fully written raw file driven through the same libaio +
 *      O_DIRECT file backend the engine uses, and (b) a fully written Parallax VDI of the same
 *      size, with a warm node cache (full untimed read pass first) and a cold one (store closed
 *      and reopened right before the timed run); same access pattern and seeds on both;
 *   2. snapshot latency: blocking snapshots of an idle VDI, and snapshots submitted back to back
 *      in the request stream of a VDI under a 4 KiB random write load at QD 32;
 *   3. snapshot frequency cost: 1 MiB sequential writes at QD 8 into a fresh region (a fresh
 *      store per run) with no snapshots, then with a snapshot every 1 s, 100 ms, 20 ms, 10 ms;
 *      throughput lost and metadata blocks consumed per snapshot;
 *   4. single 4 KiB write latency at QD 1 to a writable, a sparse and a read-only (faulted) path,
 *      each against a raw-file write (the thesis's figure 5.6).
 * It prints a table (and, with --json FILE, the same numbers as JSON) with the machine it ran on.
 *
 * The event loop never spins: the Parallax side submits, calls plx_store_service() and, when no
 * callback ran, waits in poll() on plx_store_fd(); the raw side waits in the backend's
 * poll(be, -1) whenever its queue is full.
 *
 * Every 4 KiB block written carries a stamp (magic, block number); reads of written regions
 * check it, so a misdirected read or write shows up as a data error (exit status 3).
 *
 * The medium may be noisy (a VM disk, other tenants) and show order effects: throughput and
 * frequency runs are repeated (--repeat, default 4) with the order of the compared runs
 * alternating; values are medians, ratios the geometric means of the paired runs' ratios; the
 * share of the disk's traffic during timed runs that this process did not issue is printed.
 * --count-io adds the I/Os the engine issued per request.
 *
 * Build: make bench-engine     Run: build/bench-engine [--quick] [--dir DIR] [--json FILE] ...
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "parallax.h"
#include "size.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)
#define GiB (1024ull * 1024 * 1024)
#define BLK PLX_BLOCK_SIZE
#define NS_PER_S 1000000000ull
#define EXTENT_SIZE (64 * MiB)
#define HANG_NS (60 * NS_PER_S) /* no completion for this long with work outstanding: a hang */
#define STAMP_MAGIC 0x48434e4258414c50ull /* "PLXBNCH" */

/* ---- Options -------------------------------------------------------------------------------- */

enum { PART_THROUGHPUT = 1, PART_SNAPLAT = 2, PART_FREQ = 4, PART_WLAT = 8, PART_ALL = 15 };

struct opts {
    const char *dir;
    uint64_t size;  /* VDI (and raw file) size */
    double runtime; /* seconds per timed run */
    int quick;
    const char *json;
    unsigned snaps;       /* snapshots per latency test */
    unsigned lat_writes;  /* QD 1 writes per latency test */
    uint64_t cache_bytes; /* node cache, 0 = engine default */
    uint64_t freq_size;   /* fresh region per snapshot-frequency run */
    int check;            /* run plx_check on the main store at the end */
    unsigned parts;
    unsigned repeat; /* throughput and frequency runs: repetitions, median reported */
    char command[1024];
};

#define MAX_REPEAT 15

/* ---- Small utilities ------------------------------------------------------------------------ */

static char *g_paths[4]; /* files to remove on exit */
static int g_keep;       /* --keep: leave them for inspection */

static void cleanup_files(void)
{
    if (g_keep) {
        for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++)
            if (g_paths[i] != NULL)
                fprintf(stderr, "bench-engine: kept %s\n", g_paths[i]);
        return;
    }
    for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++)
        if (g_paths[i] != NULL)
            unlink(g_paths[i]);
}

static void on_signal(int sig)
{
    cleanup_files();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void track_path(const char *path)
{
    for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++) {
        if (g_paths[i] == NULL) {
            g_paths[i] = strdup(path);
            return;
        }
    }
}

static void untrack_path(const char *path)
{
    if (g_keep)
        return;
    for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++) {
        if (g_paths[i] != NULL && strcmp(g_paths[i], path) == 0) {
            unlink(g_paths[i]);
            free(g_paths[i]);
            g_paths[i] = NULL;
        }
    }
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench-engine: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1); /* atexit removes the files */
}

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  .. ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const char *fmt_bytes(uint64_t b, char *buf, size_t len)
{
    if (b >= GiB && b % (GiB / 4) == 0)
        snprintf(buf, len, "%.4g GiB", (double)b / GiB);
    else if (b >= MiB)
        snprintf(buf, len, "%.4g MiB", (double)b / MiB);
    else
        snprintf(buf, len, "%.4g KiB", (double)b / KiB);
    return buf;
}

/* ---- Latency samples ------------------------------------------------------------------------ */

struct lat {
    double *us;
    size_t n, cap;
};

struct lat_summary {
    size_t n;
    double mean, p50, p90, p99, max; /* microseconds */
};

static void lat_add(struct lat *l, uint64_t ns)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 1024;
        l->us = realloc(l->us, l->cap * sizeof *l->us);
        if (l->us == NULL)
            die("out of memory");
    }
    l->us[l->n++] = (double)ns / 1000.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted samples. */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    return v[rank ? rank - 1 : 0];
}

static struct lat_summary lat_summarize(const struct lat *l)
{
    struct lat_summary s = {0};
    s.n = l->n;
    if (l->n == 0)
        return s;
    double *v = malloc(l->n * sizeof *v);
    if (v == NULL)
        die("out of memory");
    memcpy(v, l->us, l->n * sizeof *v);
    qsort(v, l->n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < l->n; i++)
        sum += v[i];
    s.mean = sum / (double)l->n;
    s.p50 = pct(v, l->n, 50);
    s.p90 = pct(v, l->n, 90);
    s.p99 = pct(v, l->n, 99);
    s.max = v[l->n - 1];
    free(v);
    return s;
}

static void lat_free(struct lat *l)
{
    free(l->us);
    memset(l, 0, sizeof *l);
}

static void lat_append(struct lat *dst, const struct lat *src)
{
    for (size_t i = 0; i < src->n; i++)
        lat_add(dst, (uint64_t)(src->us[i] * 1000.0));
}

/* Median, minimum and maximum of n values. */
struct spread {
    double med, min, max;
};

/* Geometric mean: for ratios of paired runs whose order alternates, so that a multiplicative
 * order effect cancels. */
static double geomean(const double *v, unsigned n)
{
    double sum = 0;
    for (unsigned i = 0; i < n; i++)
        sum += log(v[i]);
    return n ? exp(sum / n) : 0;
}

static struct spread spread_of(const double *v, unsigned n)
{
    struct spread sp = {0, 0, 0};
    if (n == 0)
        return sp;
    double t[MAX_REPEAT];
    memcpy(t, v, n * sizeof *t);
    qsort(t, n, sizeof *t, cmp_double);
    sp.min = t[0];
    sp.max = t[n - 1];
    sp.med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    return sp;
}

/* ---- Process and device accounting --------------------------------------------------------- */

static uint64_t cpu_now_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * NS_PER_S +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000;
}

/* Device traffic of the disk under --dir (/proc/diskstats), to tell how much I/O other
 * processes did during a timed run. */
static int g_dev_found;
static unsigned g_dev_major, g_dev_minor;
static char g_dev_name[64];

static void dev_init(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return;
    g_dev_major = major(sb.st_dev);
    g_dev_minor = minor(sb.st_dev);
    FILE *f = fopen("/proc/diskstats", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned ma, mi;
        char name[64];
        if (sscanf(line, "%u %u %63s", &ma, &mi, name) == 3 && ma == g_dev_major &&
            mi == g_dev_minor) {
            g_dev_found = 1;
            snprintf(g_dev_name, sizeof g_dev_name, "%s", name);
        }
    }
    fclose(f);
}

/* Bytes read + written on the device so far (0 when unknown). */
static uint64_t dev_bytes(void)
{
    if (!g_dev_found)
        return 0;
    FILE *f = fopen("/proc/diskstats", "r");
    if (f == NULL)
        return 0;
    char line[512];
    uint64_t total = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned ma, mi;
        unsigned long long rd_ios, rd_merged, rd_sec, rd_ms, wr_ios, wr_merged, wr_sec;
        char name[64];
        if (sscanf(line, "%u %u %63s %llu %llu %llu %llu %llu %llu %llu", &ma, &mi, name, &rd_ios,
                   &rd_merged, &rd_sec, &rd_ms, &wr_ios, &wr_merged, &wr_sec) == 10 &&
            ma == g_dev_major && mi == g_dev_minor)
            total = (uint64_t)(rd_sec + wr_sec) * 512;
    }
    fclose(f);
    return total;
}

/* Share of the device's traffic during timed runs that this benchmark did not issue. */
#define MAX_FOREIGN 256
static double g_foreign[MAX_FOREIGN];
static unsigned g_nforeign;

static void foreign_note(uint64_t dev, uint64_t own)
{
    if (!g_dev_found || dev == 0 || g_nforeign == MAX_FOREIGN)
        return;
    g_foreign[g_nforeign++] = dev > own ? (double)(dev - own) / (double)dev : 0;
}

/* ---- Counting the engine's I/O (--count-io) ------------------------------------------------- */

/* --count-io: Parallax stores are opened on a wrapper of the file backend that counts the I/Os
 * the engine issues (plx_store_open_backend instead of plx_store_open: the same backend and
 * engine, without the admin flock, which only the rare extent claims take). */
static int g_count_io;

struct io_counts {
    uint64_t n[3]; /* by enum plx_io_op */
    uint64_t blocks[3];
};

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

static void io_add(struct io_counts *sum, const struct io_counts *d)
{
    for (int i = 0; i < 3; i++) {
        sum->n[i] += d->n[i];
        sum->blocks[i] += d->blocks[i];
    }
}

/* ---- Targets: the raw file (backend driven directly) or a Parallax VDI ---------------------- */

enum target_kind { T_RAW, T_PLX };

struct target {
    enum target_kind kind;
    const char *label;
    plx_backend *be; /* T_RAW */
    plx_store *st;   /* T_PLX */
    plx_vdi *v;
    uint64_t size;
};

struct run;

/* One outstanding request. io is first: the raw backend hands the plx_io back on completion. */
struct slot {
    struct plx_io io;
    struct run *run;
    uint8_t *buf;
    size_t len;
    uint64_t off;
    int write;
    uint64_t t_submit, t_done;
    int busy, done, status;
};

static void slot_complete(struct slot *s, int status);

static void raw_io_done(struct plx_io *io, int status)
{
    slot_complete((struct slot *)io, status);
}

static void plx_req_done(void *arg, int status)
{
    slot_complete(arg, status);
}

static void die_store(plx_store *st, int rc, const char *what)
{
    die("%s: %s (%s)", what, strerror(-rc), st ? plx_store_errmsg(st) : "");
}

static void target_submit(struct target *t, struct slot *s)
{
    s->busy = 1;
    s->done = 0;
    s->status = 0;
    s->t_submit = now_ns();
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
static int target_wait(struct target *t, uint64_t until)
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
    uint64_t now = now_ns();
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

static void raw_open(struct target *t, const char *path, uint64_t size)
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

static void raw_close(struct target *t)
{
    if (t->be != NULL)
        t->be->ops->destroy(t->be);
    t->be = NULL;
}

static plx_store *store_open(const char *path, uint64_t cache_bytes)
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

static void store_close(plx_store *st)
{
    int rc = plx_store_close(st);
    if (rc < 0)
        die("plx_store_close: %s", strerror(-rc));
}

static void plx_target_open(struct target *t, const char *path, uint64_t cache_bytes,
                            const char *vdi)
{
    memset(t, 0, sizeof *t);
    t->kind = T_PLX;
    t->label = "parallax";
    t->st = store_open(path, cache_bytes);
    int rc = plx_vdi_open(t->st, vdi, 0, &t->v);
    if (rc < 0)
        die_store(t->st, rc, "plx_vdi_open");
    t->size = plx_vdi_size(t->v);
}

static void plx_target_close(struct target *t)
{
    if (t->v != NULL) {
        int rc = plx_vdi_close(t->v);
        if (rc < 0)
            die_store(t->st, rc, "plx_vdi_close");
        t->v = NULL;
    }
    if (t->st != NULL)
        store_close(t->st);
    t->st = NULL;
}

/* Format a store at path. A new file is created sparse; an existing one (prefilled=1) is
 * formatted in place, so the filesystem has its blocks allocated already. */
static void store_format(const char *path, uint64_t size, int prefilled)
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

static void vdi_create(plx_store *st, const char *name, uint64_t size)
{
    uint64_t id;
    int rc = plx_vdi_create(st, name, size, &id);
    if (rc < 0)
        die_store(st, rc, "plx_vdi_create");
}

static uint64_t metadata_blocks(plx_store *st, uint64_t *data_blocks)
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

static void stamp(uint8_t *buf, uint64_t off, size_t len, uint64_t tag)
{
    for (size_t i = 0; i < len; i += BLK) {
        uint64_t *w = (uint64_t *)(buf + i);
        w[0] = STAMP_MAGIC;
        w[1] = (off + i) / BLK;
        w[2] = tag;
    }
}

static void fill_random(uint8_t *buf, size_t len, uint64_t seed)
{
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t v = splitmix64(&seed);
        memcpy(buf + i, &v, 8);
    }
}

/* ---- Timed runs: a workload on a target, with optional snapshots in the request stream ------- */

struct workload {
    const char *name;
    int write;
    size_t bs;
    unsigned qd;
    int random;
    uint64_t seed;
    uint64_t region_off, region_len;
    int stop_at_end; /* sequential: stop once the region is covered (else wrap around) */
    int verify;      /* reads: check block stamps */
};

enum snap_mode { SNAP_NONE, SNAP_PERIODIC, SNAP_BACK_TO_BACK };

struct snapsched {
    enum snap_mode mode;
    uint64_t interval_ns;
    uint64_t next_due;
    unsigned want; /* back to back: how many */
    unsigned submitted, completed, pending;
    uint64_t first_submit, last_submit;
    struct lat lat;
};

struct snap_token {
    struct run *run;
    uint64_t t0;
    uint64_t index;
};

struct run {
    struct target *t;
    const struct workload *w;
    struct slot *slots;
    unsigned inflight;
    uint64_t rng, seq_next, tag;
    int exhausted, stopping;
    uint64_t ops, bytes, errors, mismatches;
    char first_err[512];
    uint64_t t_start, t_end;
    uint64_t cpu_ns;     /* user + system CPU of the process during the run */
    struct io_counts io; /* --count-io: engine I/O during the run */
    uint64_t dev_bytes;  /* traffic of the device under --dir during the run */
    struct snapsched snap;
};

static uint64_t g_mismatches; /* data errors over the whole run */
static char g_first_mismatch[512];

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
    s->t_done = now_ns();
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

static void run_init(struct run *r, struct target *t, const struct workload *w)
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

static void run_free(struct run *r)
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
        lat_add(&r->snap.lat, now_ns() - tok->t0);
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
static void run_exec(struct run *r, double seconds)
{
    uint64_t start = now_ns(), cpu0 = cpu_now_ns(), dev0 = dev_bytes();
    struct io_counts io0 = g_io;
    uint64_t deadline = seconds > 0 ? start + (uint64_t)(seconds * 1e9) : UINT64_MAX;
    uint64_t last_progress = start;
    r->t_start = start;
    if (r->snap.mode == SNAP_PERIODIC)
        r->snap.next_due = start + r->snap.interval_ns;
    for (;;) {
        uint64_t now = now_ns();
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
        now = now_ns();
        if (n > 0) {
            last_progress = now;
        } else if (now - last_progress > HANG_NS) {
            die("HANG: %s %s: no completion for %llu s with %u requests and %u snapshots "
                "outstanding (plx_store_busy=%d)",
                r->t->label, r->w->name, (unsigned long long)(HANG_NS / NS_PER_S), r->inflight,
                r->snap.pending, r->t->st ? plx_store_busy(r->t->st) : -1);
        }
    }
    r->t_end = now_ns();
    r->cpu_ns = cpu_now_ns() - cpu0;
    r->io = io_delta(&io0);
    r->dev_bytes = dev_bytes() - dev0;
    if (r->errors)
        die("%s", r->first_err);
}

static double run_secs(const struct run *r)
{
    return (double)(r->t_end - r->t_start) / 1e9;
}

static double run_iops(const struct run *r)
{
    return (double)r->ops / run_secs(r);
}

static double run_mibs(const struct run *r)
{
    return (double)r->bytes / MiB / run_secs(r);
}

/* Run a workload once on a target; returns the run (caller frees) for its counters. */
static void run_workload(struct run *r, struct target *t, const struct workload *w, double seconds)
{
    run_init(r, t, w);
    run_exec(r, seconds);
}

/* A single write at QD 1; returns its latency in ns. */
static uint64_t one_write(struct target *t, struct slot *s, uint64_t off, uint64_t tag)
{
    s->off = off;
    s->write = 1;
    s->len = BLK;
    s->run = NULL;
    stamp(s->buf, off, BLK, tag);
    target_submit(t, s);
    uint64_t last = now_ns();
    while (!s->done) {
        if (target_wait(t, UINT64_MAX) > 0)
            last = now_ns();
        else if (now_ns() - last > HANG_NS)
            die("HANG: %s: single 4 KiB write at %" PRIu64 " did not complete in %llu s", t->label,
                off, (unsigned long long)(HANG_NS / NS_PER_S));
    }
    if (s->status != 0)
        die("%s: single write at %" PRIu64 " failed: %s%s%s", t->label, off, strerror(-s->status),
            t->st ? ": " : "", t->st ? plx_store_errmsg(t->st) : "");
    return s->t_done - s->t_submit;
}

/* A flush (fdatasync) on the raw file at QD 1; returns its latency in ns. */
static uint64_t raw_flush(struct target *t)
{
    struct slot f;
    memset(&f, 0, sizeof f);
    f.busy = 1;
    f.t_submit = now_ns();
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

/* ---- Results ----------------------------------------------------------------------------------
 */

struct tp_result {
    const char *name;
    int iops_unit; /* 4 KiB: report IOPS; 1 MiB: MiB/s */
    int is_read;
    unsigned n;                                                       /* repetitions */
    double raw_v[MAX_REPEAT], warm_v[MAX_REPEAT], cold_v[MAX_REPEAT]; /* in the unit */
    struct spread raw, warm, cold;
    double raw_cpu_v[MAX_REPEAT], warm_cpu_v[MAX_REPEAT]; /* CPU us per request */
    struct spread raw_cpu, warm_cpu;
    struct spread warm_ratio, cold_ratio; /* of each repetition's run to its raw run */
    double warm_gm, cold_gm;              /* their geometric means: the reported ratios */
    uint64_t warm_ops, cold_ops;          /* --count-io: engine I/O over all repetitions */
    struct io_counts warm_io, cold_io;
};

struct wlat_result {
    const char *name;
    const char *what;
    struct lat_summary s;
    double ratio_mean, ratio_p50;
};

/* One snapshot interval, over all repetitions: throughput per repetition, the rest summed. */
struct freq_result {
    double interval_ms; /* 0 = no snapshots */
    unsigned n;
    double mibs_v[MAX_REPEAT];
    struct spread mibs;
    double loss; /* 1 - median / median without snapshots */
    double secs;
    uint64_t bytes;
    int exhausted;
    unsigned snaps, submitted;
    uint64_t span_ns; /* first to last submission, summed over repetitions */
    double avg_interval_ms;
    struct lat lat;
    struct lat_summary snap_lat;
    struct io_counts io; /* --count-io */
    int64_t meta_blocks, data_blocks;
    double kib_per_snap, excess_kib_per_snap;
};

struct machine {
    long nproc;
    char model[256];
    char fs[64];
    char kernel[256];
    char io_mode[192];
    uint64_t mem_bytes;
    char load_start[64], load_end[64]; /* /proc/loadavg, first three fields */
};

static void read_loadavg(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL)
        return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
        snprintf(buf, len, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

struct results {
    char date[64];
    struct machine m;
    int have_tp, have_snaplat, have_freq, have_wlat;
    struct tp_result tp[4];
    struct lat_summary snap_idle, snap_floor, snap_loaded;
    double loaded_write_iops, loaded_secs;
    unsigned loaded_snaps;
    struct freq_result freq[5];
    size_t nfreq;
    double freq_base_mibs, freq_base_meta_per_mib;
    struct wlat_result wlat[7];
    size_t nwlat;
    int check_ran;
    struct plx_check_report check;
    uint64_t check_errors_reported;
};

/* ---- Machine ----------------------------------------------------------------------------------
 */

static const char *fs_name(long type)
{
    switch ((unsigned long)type) {
    case 0xEF53:
        return "ext4";
    case 0x58465342:
        return "xfs";
    case 0x9123683E:
        return "btrfs";
    case 0x01021994:
        return "tmpfs";
    case 0x794c7630:
        return "overlayfs";
    case 0x2fc12fc1:
        return "zfs";
    case 0x6969:
        return "nfs";
    case 0xF2F52010:
        return "f2fs";
    case 0x65735546:
        return "fuse";
    case 0x858458f6:
        return "ramfs";
    default:
        return NULL;
    }
}

static void machine_info(struct machine *m, const char *dir, const char *raw_path)
{
    memset(m, 0, sizeof *m);
    m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(m->model, sizeof m->model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            char *p = strchr(line, ':');
            if (p == NULL)
                continue;
            p++;
            while (*p == ' ' || *p == '\t')
                p++;
            p[strcspn(p, "\n")] = '\0';
            snprintf(m->model, sizeof m->model, "%s", p);
            break;
        }
        fclose(f);
    }
    struct statfs sf;
    if (statfs(dir, &sf) == 0) {
        const char *n = fs_name((long)sf.f_type);
        if (n != NULL)
            snprintf(m->fs, sizeof m->fs, "%s", n);
        else
            snprintf(m->fs, sizeof m->fs, "0x%lx", (unsigned long)sf.f_type);
    } else {
        snprintf(m->fs, sizeof m->fs, "unknown");
    }
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(m->kernel, sizeof m->kernel, "%s %s %s", u.sysname, u.release, u.machine);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        m->mem_bytes = (uint64_t)pages * (uint64_t)psz;
    /* Does the file backend get O_DIRECT on this filesystem? Its description says when not. */
    snprintf(m->io_mode, sizeof m->io_mode, "libaio + O_DIRECT");
    char probe[PATH_MAX + 8];
    snprintf(probe, sizeof probe, "%s.probe", raw_path);
    int fd = open(probe, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        int ok = ftruncate(fd, 1 * MiB) == 0;
        close(fd);
        if (ok) {
            struct target t;
            raw_open(&t, probe, 1 * MiB);
            if (strstr(t.be->desc, "buffered") != NULL)
                snprintf(m->io_mode, sizeof m->io_mode, "libaio, buffered (O_DIRECT refused)");
            raw_close(&t);
        }
        unlink(probe);
    }
}

/* ---- Setup: the raw file and the filled VDI ------------------------------------------------- */

struct ctx {
    struct opts o;
    char raw_path[PATH_MAX];
    char store_path[PATH_MAX];
    char freq_path[PATH_MAX];
    struct target raw, plx;
    int plx_open;
    struct results res;
};

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
    progress("%s %s: %.0f MiB/s (%.1f s)", t->label, w->name, run_mibs(&r), run_secs(&r));
    run_free(&r);
}

static uint64_t main_store_size(const struct opts *o)
{
    /* The VDI, its radix nodes, and room for copy-on-write after the snapshot tests. */
    uint64_t extra = o->size / 2 + (o->quick ? 256 * MiB : 2 * GiB);
    uint64_t sz = 2 * o->size + extra;
    return (sz + EXTENT_SIZE - 1) / EXTENT_SIZE * EXTENT_SIZE;
}

static void setup_raw(struct ctx *c)
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
    raw_open(&c->raw, c->raw_path, o->size);
    pass(&c->raw, fill_workload(o->size));
}

static void setup_plx(struct ctx *c)
{
    const struct opts *o = &c->o;
    store_format(c->store_path, main_store_size(o), 0);
    plx_store *st = store_open(c->store_path, o->cache_bytes);
    vdi_create(st, "bench", o->size);
    store_close(st);
    plx_target_open(&c->plx, c->store_path, o->cache_bytes, "bench");
    c->plx_open = 1;
    pass(&c->plx, fill_workload(o->size));
    int rc = plx_vdi_flush(c->plx.v);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_vdi_flush");
}

static void reopen_plx(struct ctx *c)
{
    plx_target_close(&c->plx);
    plx_target_open(&c->plx, c->store_path, c->o.cache_bytes, "bench");
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
    progress("%-8s %-5s %-18s %10.0f %-5s  CPU %6.2f us/request", t->label, tag, w->name, v,
             w->bs == MiB ? "MiB/s" : "IOPS", cpu);
    run_free(&r);
    return v;
}

static void bench_throughput(struct ctx *c)
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
    vdi_create(c->plx.st, name, size);
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
static void bench_write_latency(struct ctx *c)
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

        uint64_t t0 = now_ns();
        one_write(&c->raw, &s, off, tag++);
        raw_flush(&c->raw);
        lat_add(&l[WL_RAW_FLUSH], now_ns() - t0);

        t0 = now_ns();
        one_write(&c->raw, &s, off, tag++);
        one_write(&c->raw, &s, off2, tag++);
        raw_flush(&c->raw);
        one_write(&c->raw, &s, off, tag++);
        lat_add(&l[WL_RAW_CHAIN], now_ns() - t0);

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
        progress("%-20s mean %8.1f us  p50 %8.1f us  (x%.2f of a raw write)", w->name, w->s.mean,
                 w->s.p50, w->ratio_p50);
    }
    plx_block_free(s.buf);
    res->have_wlat = 1;
}

/* ---- 2. Snapshot latency ------------------------------------------------------------------- */

static void bench_snapshot_latency(struct ctx *c)
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
        uint64_t idx, t0 = now_ns();
        int rc = plx_vdi_snapshot_open(c->plx.v, "", &idx);
        if (rc < 0)
            die_store(c->plx.st, rc, "plx_vdi_snapshot_open");
        lat_add(&l, now_ns() - t0);

        t0 = now_ns();
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
        raw_flush(&c->raw);
        one_write(&c->raw, &a, 2 * BLK, i);
        raw_flush(&c->raw);
        lat_add(&floor, now_ns() - t0);
    }
    plx_block_free(a.buf);
    plx_block_free(b.buf);
    c->res.snap_idle = lat_summarize(&l);
    c->res.snap_floor = lat_summarize(&floor);
    lat_free(&l);
    lat_free(&floor);
    progress("idle:   p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms",
             c->res.snap_idle.p50 / 1000, c->res.snap_idle.p90 / 1000, c->res.snap_idle.p99 / 1000,
             c->res.snap_idle.max / 1000);

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
    progress("loaded: p50 %.3f ms  p99 %.3f ms  max %.3f ms  mean %.3f ms  (writes %.0f IOPS)",
             c->res.snap_loaded.p50 / 1000, c->res.snap_loaded.p99 / 1000,
             c->res.snap_loaded.max / 1000, c->res.snap_loaded.mean / 1000,
             c->res.loaded_write_iops);
    run_free(&r);
    c->res.have_snaplat = 1;
}

/* ---- 3. Snapshot frequency cost -------------------------------------------------------------- */

static uint64_t freq_store_size(const struct opts *o)
{
    uint64_t sz = o->freq_size + o->freq_size / 64 + (o->quick ? 128 * MiB : 512 * MiB);
    return (sz + EXTENT_SIZE - 1) / EXTENT_SIZE * EXTENT_SIZE;
}

/* Each run gets a freshly formatted store (so a fresh, never-written VDI region) on the same
 * file, which was written in full once so that no run pays for filesystem block allocation. */
static void freq_one(struct ctx *c, struct freq_result *fr, double interval_ms, unsigned k)
{
    const struct opts *o = &c->o;
    store_format(c->freq_path, freq_store_size(o), 1);
    plx_store *st = store_open(c->freq_path, o->cache_bytes);
    vdi_create(st, "freq", o->freq_size);
    store_close(st);
    /* Metadata in use, measured on a freshly opened store (no claimed-but-unused blocks). */
    st = store_open(c->freq_path, o->cache_bytes);
    uint64_t d0, m0 = metadata_blocks(st, &d0);
    store_close(st);

    struct target t;
    plx_target_open(&t, c->freq_path, o->cache_bytes, "freq");
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
    plx_target_close(&t);

    st = store_open(c->freq_path, o->cache_bytes);
    uint64_t d1, m1 = metadata_blocks(st, &d1);
    store_close(st);

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
    progress("%-8s %7.0f MiB/s in %.2f s%s, %u snapshots, metadata +%" PRId64 " blocks",
             interval_ms > 0 ? "" : "none", run_mibs(&r), run_secs(&r),
             r.exhausted ? " (region full)" : "", r.snap.completed, (int64_t)m1 - (int64_t)m0);
    run_free(&r);
}

static void bench_snapshot_frequency(struct ctx *c)
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
    raw_open(&t, c->freq_path, fsize);
    pass(&t, fill_workload(fsize));
    raw_close(&t);

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

static void run_check(struct ctx *c)
{
    fprintf(stderr, "[check] plx_check on the main store\n");
    int rc = plx_check(c->plx.st, &c->res.check, check_line, &c->res);
    if (rc < 0)
        die_store(c->plx.st, rc, "plx_check");
    c->res.check_ran = 1;
    progress("%" PRIu64 " trees, %" PRIu64 " reachable blocks, %" PRIu64 " errors",
             c->res.check.trees, c->res.check.reachable_blocks, c->res.check.errors);
}

/* ---- Report -----------------------------------------------------------------------------------
 */

#define TARGET_WARM_READ 0.95
#define TARGET_WARM_WRITE 0.90
#define TARGET_SNAP_P50_MS 1.0
#define TARGET_SNAP_MAX_MS 3.25
#define TARGET_SNAP_LOADED_MEAN_MS 10.0
#define TARGET_FREQ_LOSS 0.04
#define TARGET_FREQ_KIB 5.84

static struct spread foreign_spread(void)
{
    double v[MAX_FOREIGN];
    memcpy(v, g_foreign, g_nforeign * sizeof *v);
    qsort(v, g_nforeign, sizeof *v, cmp_double);
    struct spread sp = {0, 0, 0};
    if (g_nforeign > 0) {
        sp.min = v[0];
        sp.max = v[g_nforeign - 1];
        sp.med =
            g_nforeign % 2 ? v[g_nforeign / 2] : (v[g_nforeign / 2 - 1] + v[g_nforeign / 2]) / 2;
    }
    return sp;
}

static const char *verdict(int ok)
{
    return ok ? "met" : "MISSED";
}

static const char *fmt_spread(const struct spread *sp, char *buf, size_t len)
{
    if (sp->max > sp->min && sp->med > 0)
        snprintf(buf, len, "%.0f +-%.0f%%", sp->med, 50 * (sp->max - sp->min) / sp->med);
    else
        snprintf(buf, len, "%.0f", sp->med);
    return buf;
}

static void print_report(const struct ctx *c)
{
    const struct opts *o = &c->o;
    const struct results *r = &c->res;
    char b1[32], b2[32], b3[32];
    printf("\nParallax engine benchmark, %s\n", r->date);
    printf("machine:  %ld CPUs, %s, %.1f GiB RAM, %s\n", r->m.nproc, r->m.model,
           (double)r->m.mem_bytes / GiB, r->m.kernel);
    printf("storage:  %s on %s, %s\n", o->dir, r->m.fs, r->m.io_mode);
    printf("settings: VDI %s, runtime %.1f s x %u repetitions, node cache %s, extents %s\n",
           fmt_bytes(o->size, b1, sizeof b1), o->runtime, o->repeat,
           o->cache_bytes ? fmt_bytes(o->cache_bytes, b2, sizeof b2) : "64 MiB (default)",
           fmt_bytes(EXTENT_SIZE, b3, sizeof b3));
    printf("command:  %s\n", o->command);
    if (g_count_io)
        printf("note:     --count-io: stores opened through a counting backend wrapper\n");
    printf("load:     load average %s at the start, %s at the end\n", r->m.load_start,
           r->m.load_end);
    if (g_nforeign > 0) {
        struct spread fs = foreign_spread();
        printf("others:   share of %s's traffic not issued by this benchmark during its %u timed "
               "throughput runs: median %.1f%%, max %.1f%%\n",
               g_dev_name, g_nforeign, 100 * fs.med, 100 * fs.max);
    }

    if (r->have_tp) {
        printf("\n1. Throughput, raw file vs Parallax VDI (same pattern and seeds)\n");
        if (r->tp[0].n > 1)
            printf("   median of %u runs each (+-: half the min-max range, in %% of the median); "
                   "ratio: geometric mean of each repetition's\n   Parallax/raw, raw and warm runs "
                   "back to back, alternating which goes first\n",
                   r->tp[0].n);
        printf("%-18s %6s %15s %15s %6s %15s %6s  %-16s %s\n", "workload", "unit", "raw", "warm",
               "ratio", "cold", "ratio", "target (warm)", "CPU us/req raw/warm");
        for (int i = 0; i < 4; i++) {
            const struct tp_result *t = &r->tp[i];
            double target = t->is_read ? TARGET_WARM_READ : TARGET_WARM_WRITE;
            double wr = t->warm_gm, cr = t->cold_gm;
            char a[32], b[32], d[32];
            char tg[32];
            snprintf(tg, sizeof tg, ">= %.2f %s", target, verdict(wr >= target));
            printf("%-18s %6s %15s %15s %6.3f %15s %6.3f  %-16s %6.2f / %.2f\n", t->name,
                   t->iops_unit ? "IOPS" : "MiB/s", fmt_spread(&t->raw, a, sizeof a),
                   fmt_spread(&t->warm, b, sizeof b), wr, fmt_spread(&t->cold, d, sizeof d), cr, tg,
                   t->raw_cpu.med, t->warm_cpu.med);
        }
    }
    if (r->have_tp && g_count_io) {
        printf("   engine I/O per request (--count-io), warm | cold: reads (blocks), writes "
               "(blocks), flushes\n");
        for (int i = 0; i < 4; i++) {
            const struct tp_result *t = &r->tp[i];
            double wo = t->warm_ops ? (double)t->warm_ops : 1,
                   co = t->cold_ops ? (double)t->cold_ops : 1;
            printf("   %-18s %6.3f (%6.1f) %6.3f (%6.1f) %6.4f | %6.3f (%6.1f) %6.3f (%6.1f) "
                   "%6.4f\n",
                   t->name, t->warm_io.n[0] / wo, t->warm_io.blocks[0] / wo, t->warm_io.n[1] / wo,
                   t->warm_io.blocks[1] / wo, t->warm_io.n[2] / wo, t->cold_io.n[0] / co,
                   t->cold_io.blocks[0] / co, t->cold_io.n[1] / co, t->cold_io.blocks[1] / co,
                   t->cold_io.n[2] / co);
        }
    }
    if (r->have_snaplat) {
        const struct lat_summary *i = &r->snap_idle, *l = &r->snap_loaded;
        printf("\n2. Snapshot latency (ms)\n");
        printf("%-34s %6s %7s %7s %7s %7s %7s  %s\n", "", "n", "p50", "p90", "p99", "max", "mean",
               "target");
        printf("%-34s %6zu %7.3f %7.3f %7.3f %7.3f %7.3f  p50 < %.2f %s, max < %.2f %s\n",
               "idle VDI (plx_vdi_snapshot_open)", i->n, i->p50 / 1000, i->p90 / 1000,
               i->p99 / 1000, i->max / 1000, i->mean / 1000, TARGET_SNAP_P50_MS,
               verdict(i->p50 / 1000 < TARGET_SNAP_P50_MS), TARGET_SNAP_MAX_MS,
               verdict(i->max / 1000 < TARGET_SNAP_MAX_MS));
        const struct lat_summary *fl = &r->snap_floor;
        printf("%-34s %6zu %7.3f %7.3f %7.3f %7.3f %7.3f  (the medium's floor)\n",
               "raw floor: 2 writes,flush,write,flush", fl->n, fl->p50 / 1000, fl->p90 / 1000,
               fl->p99 / 1000, fl->max / 1000, fl->mean / 1000);
        printf("%-34s %6zu %7.3f %7.3f %7.3f %7.3f %7.3f  mean < %.0f %s\n",
               "under 4K randwrite QD32 load", l->n, l->p50 / 1000, l->p90 / 1000, l->p99 / 1000,
               l->max / 1000, l->mean / 1000, TARGET_SNAP_LOADED_MEAN_MS,
               verdict(l->mean / 1000 < TARGET_SNAP_LOADED_MEAN_MS));
        printf("   (thesis, idle: 90%% under 1 ms, max 3.25 ms; here p90 %.3f ms. Write load "
               "during the loaded test: %.0f IOPS over %.2f s)\n",
               i->p90 / 1000, r->loaded_write_iops, r->loaded_secs);
    }
    if (r->have_freq) {
        printf("\n3. Snapshot frequency cost (1 MiB sequential writes QD 8 into a fresh %s "
               "region)\n",
               fmt_bytes(o->freq_size, b1, sizeof b1));
        if (r->freq[0].n > 1)
            printf("   MiB/s: median of %u runs (+-: half the min-max range); the other columns "
                   "are totals over the runs\n",
                   r->freq[0].n);
        printf("%-9s %13s %6s %6s %6s %8s %8s %8s %9s %9s %7s  %s\n", "interval", "MiB/s", "loss",
               "secs", "snaps", "every ms", "snap p50", "snap max", "meta blks", "KiB/snap",
               "excess", "target");
        for (size_t k = 0; k < r->nfreq; k++) {
            const struct freq_result *f = &r->freq[k];
            char iv[32], mb[32];
            if (f->interval_ms > 0)
                snprintf(iv, sizeof iv, "%g ms", f->interval_ms);
            else
                snprintf(iv, sizeof iv, "none");
            printf("%-9s %13s %5.1f%% %6.1f %6u %8.2f %8.3f %8.3f %9" PRId64 " %9.2f %7.2f", iv,
                   fmt_spread(&f->mibs, mb, sizeof mb), 100 * f->loss, f->secs, f->snaps,
                   f->avg_interval_ms, f->snap_lat.p50 / 1000, f->snap_lat.max / 1000,
                   f->meta_blocks, f->kib_per_snap, f->excess_kib_per_snap);
            if (f->interval_ms == 10)
                printf("  loss <= %.0f%% %s, <= %.2f KB/snap %s (excess %s)",
                       100 * TARGET_FREQ_LOSS, verdict(f->loss <= TARGET_FREQ_LOSS),
                       TARGET_FREQ_KIB, verdict(f->kib_per_snap <= TARGET_FREQ_KIB),
                       verdict(f->excess_kib_per_snap <= TARGET_FREQ_KIB));
            printf("%s\n", f->exhausted ? "  [region full before the run time]" : "");
        }
        printf(
            "   (loss: 1 - geometric mean over repetitions of MiB/s / MiB/s of the same "
            "repetition's run without snapshots (median %.0f MiB/s);\n    every other repetition "
            "runs the intervals in reverse order. KiB/snap = "
            "metadata blocks used after reopen / snapshots;\n    excess = the same minus "
            "the radix nodes the same amount of data needs without snapshots, %.3f "
            "blocks/MiB)\n",
            r->freq_base_mibs, r->freq_base_meta_per_mib);
    }
    if (r->have_freq && g_count_io) {
        printf("   engine I/O per MiB written (--count-io): writes, blocks written, flushes, "
               "reads\n");
        for (size_t k = 0; k < r->nfreq; k++) {
            const struct freq_result *f = &r->freq[k];
            double mib = f->bytes ? (double)f->bytes / MiB : 1;
            printf("   %-9g %7.3f %8.2f %7.4f %7.4f\n", f->interval_ms, f->io.n[1] / mib,
                   f->io.blocks[1] / mib, f->io.n[2] / mib, f->io.n[0] / mib);
        }
    }
    if (r->have_wlat) {
        printf("\n4. Single 4 KiB write latency at QD 1 (us)\n");
        printf("%-20s %6s %9s %9s %9s %9s %8s %8s\n", "path", "n", "mean", "p50", "p99", "max",
               "x mean", "x p50");
        for (size_t k = 0; k < r->nwlat; k++) {
            const struct wlat_result *w = &r->wlat[k];
            printf("%-20s %6zu %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f\n", w->name, w->s.n, w->s.mean,
                   w->s.p50, w->s.p99, w->s.max, w->ratio_mean, w->ratio_p50);
        }
        printf("   (thesis fig. 5.6: writable ~ direct disk; sparse and faulted paths cost "
               "extra serialized writes)\n");
    }
    if (r->check_ran)
        printf("\nplx_check: %" PRIu64 " trees, %" PRIu64 " errors, %" PRIu64 " leaked blocks\n",
               r->check.trees, r->check.errors, r->check.leaked_blocks);
    if (g_mismatches)
        printf("\nDATA ERRORS: %" PRIu64 " reads returned wrong blocks; first: %s\n", g_mismatches,
               g_first_mismatch);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_lat(FILE *f, const struct lat_summary *s, double div)
{
    fprintf(f,
            "{\"n\": %zu, \"mean\": %.4f, \"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, "
            "\"max\": %.4f}",
            s->n, s->mean / div, s->p50 / div, s->p90 / div, s->p99 / div, s->max / div);
}

static void json_values(FILE *f, const char *key, const double *v, unsigned n)
{
    fprintf(f, "\"%s\": [", key);
    for (unsigned i = 0; i < n; i++)
        fprintf(f, "%s%.1f", i ? ", " : "", v[i]);
    fprintf(f, "]");
}

static void write_json(const struct ctx *c, const char *path)
{
    const struct opts *o = &c->o;
    const struct results *r = &c->res;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        die("writing %s: %s", path, strerror(errno));
    fprintf(f, "{\n  \"date\": ");
    json_str(f, r->date);
    fprintf(f, ",\n  \"command\": ");
    json_str(f, o->command);
    fprintf(f, ",\n  \"machine\": {\"nproc\": %ld, \"model\": ", r->m.nproc);
    json_str(f, r->m.model);
    fprintf(f, ", \"mem_bytes\": %" PRIu64 ", \"kernel\": ", r->m.mem_bytes);
    json_str(f, r->m.kernel);
    fprintf(f, ", \"dir\": ");
    json_str(f, o->dir);
    fprintf(f, ", \"fs\": ");
    json_str(f, r->m.fs);
    fprintf(f, ", \"io\": ");
    json_str(f, r->m.io_mode);
    fprintf(f, ", \"loadavg_start\": ");
    json_str(f, r->m.load_start);
    fprintf(f, ", \"loadavg_end\": ");
    json_str(f, r->m.load_end);
    if (g_nforeign > 0) {
        struct spread fs = foreign_spread();
        fprintf(f, ", \"device\": ");
        json_str(f, g_dev_name);
        fprintf(f, ", \"foreign_io_share\": {\"runs\": %u, \"median\": %.4f, \"max\": %.4f}",
                g_nforeign, fs.med, fs.max);
    }
    fprintf(f,
            "},\n  \"settings\": {\"vdi_bytes\": %" PRIu64 ", \"runtime_s\": %.3f, "
            "\"quick\": %s, \"cache_bytes\": %" PRIu64 ", \"extent_bytes\": %llu, "
            "\"snapshots\": %u, \"latency_writes\": %u, \"freq_region_bytes\": %" PRIu64
            ", \"repeat\": %u, \"count_io\": %s}",
            o->size, o->runtime, o->quick ? "true" : "false",
            (uint64_t)(o->cache_bytes ? o->cache_bytes : 64 * MiB), EXTENT_SIZE, o->snaps,
            o->lat_writes, o->freq_size, o->repeat, g_count_io ? "true" : "false");
    if (r->have_tp) {
        fprintf(f, ",\n  \"throughput\": [");
        for (int i = 0; i < 4; i++) {
            const struct tp_result *t = &r->tp[i];
            double target = t->is_read ? TARGET_WARM_READ : TARGET_WARM_WRITE;
            fprintf(f, "%s\n    {\"workload\": ", i ? "," : "");
            json_str(f, t->name);
            double wr = t->warm_gm;
            fprintf(f,
                    ", \"unit\": \"%s\", \"raw\": %.1f, \"warm\": %.1f, \"cold\": %.1f, "
                    "\"warm_ratio\": %.4f, \"cold_ratio\": %.4f, \"target_warm_ratio\": "
                    "%.2f, \"met\": %s, \"runs\": {",
                    t->iops_unit ? "IOPS" : "MiB/s", t->raw.med, t->warm.med, t->cold.med, wr,
                    t->cold_gm, target, wr >= target ? "true" : "false");
            json_values(f, "raw", t->raw_v, t->n);
            fprintf(f, ", ");
            json_values(f, "warm", t->warm_v, t->n);
            fprintf(f, ", ");
            json_values(f, "cold", t->cold_v, t->n);
            fprintf(f, "}, \"cpu_us_per_request\": {\"raw\": %.3f, \"warm\": %.3f}", t->raw_cpu.med,
                    t->warm_cpu.med);
            if (g_count_io)
                fprintf(f,
                        ", \"engine_io\": {\"warm_requests\": %" PRIu64 ", \"warm_reads\": %" PRIu64
                        ", \"warm_writes\": %" PRIu64 ", \"warm_flushes\": %" PRIu64
                        ", \"cold_requests\": %" PRIu64 ", \"cold_reads\": %" PRIu64
                        ", \"cold_writes\": %" PRIu64 ", \"cold_flushes\": %" PRIu64 "}",
                        t->warm_ops, t->warm_io.n[0], t->warm_io.n[1], t->warm_io.n[2], t->cold_ops,
                        t->cold_io.n[0], t->cold_io.n[1], t->cold_io.n[2]);
            fprintf(f, "}");
        }
        fprintf(f, "\n  ]");
    }
    if (r->have_snaplat) {
        fprintf(f, ",\n  \"snapshot_latency_ms\": {\n    \"idle\": ");
        json_lat(f, &r->snap_idle, 1000);
        fprintf(f, ",\n    \"raw_floor\": ");
        json_lat(f, &r->snap_floor, 1000);
        fprintf(f, ",\n    \"loaded\": ");
        json_lat(f, &r->snap_loaded, 1000);
        fprintf(f,
                ",\n    \"loaded_write_iops\": %.1f,\n    \"targets\": {\"idle_p50_lt\": %.2f, "
                "\"idle_max_lt\": %.2f, \"loaded_mean_lt\": %.1f, \"idle_p50_met\": %s, "
                "\"idle_max_met\": %s, \"loaded_mean_met\": %s}\n  }",
                r->loaded_write_iops, TARGET_SNAP_P50_MS, TARGET_SNAP_MAX_MS,
                TARGET_SNAP_LOADED_MEAN_MS,
                r->snap_idle.p50 / 1000 < TARGET_SNAP_P50_MS ? "true" : "false",
                r->snap_idle.max / 1000 < TARGET_SNAP_MAX_MS ? "true" : "false",
                r->snap_loaded.mean / 1000 < TARGET_SNAP_LOADED_MEAN_MS ? "true" : "false");
    }
    if (r->have_freq) {
        fprintf(f,
                ",\n  \"snapshot_frequency\": {\"baseline_mibs\": %.1f, "
                "\"baseline_meta_blocks_per_mib\": %.4f, \"runs\": [",
                r->freq_base_mibs, r->freq_base_meta_per_mib);
        for (size_t k = 0; k < r->nfreq; k++) {
            const struct freq_result *fr = &r->freq[k];
            fprintf(f, "%s\n    {\"interval_ms\": %g, \"mibs\": %.1f, ", k ? "," : "",
                    fr->interval_ms, fr->mibs.med);
            json_values(f, "mibs_runs", fr->mibs_v, fr->n);
            fprintf(f,
                    ", \"loss\": %.4f, "
                    "\"secs\": %.3f, \"bytes\": %" PRIu64 ", \"region_full\": %s, "
                    "\"snapshots\": %u, \"avg_interval_ms\": %.3f, \"meta_blocks\": %" PRId64
                    ", \"data_blocks\": %" PRId64 ", \"kib_per_snapshot\": %.3f, "
                    "\"excess_kib_per_snapshot\": %.3f, \"snapshot_latency_ms\": ",
                    fr->loss, fr->secs, fr->bytes, fr->exhausted ? "true" : "false", fr->snaps,
                    fr->avg_interval_ms, fr->meta_blocks, fr->data_blocks, fr->kib_per_snap,
                    fr->excess_kib_per_snap);
            json_lat(f, &fr->snap_lat, 1000);
            if (g_count_io)
                fprintf(f,
                        ", \"engine_io\": {\"reads\": %" PRIu64 ", \"writes\": %" PRIu64
                        ", \"blocks_written\": %" PRIu64 ", \"flushes\": %" PRIu64 "}",
                        fr->io.n[0], fr->io.n[1], fr->io.blocks[1], fr->io.n[2]);
            fprintf(f, "}");
        }
        fprintf(f,
                "\n  ], \"targets\": {\"loss_at_10ms_le\": %.2f, \"kib_per_snapshot_at_10ms_le\": "
                "%.2f}}",
                TARGET_FREQ_LOSS, TARGET_FREQ_KIB);
    }
    if (r->have_wlat) {
        fprintf(f, ",\n  \"write_latency_us\": [");
        for (size_t k = 0; k < r->nwlat; k++) {
            const struct wlat_result *w = &r->wlat[k];
            fprintf(f, "%s\n    {\"path\": ", k ? "," : "");
            json_str(f, w->name);
            fprintf(f, ", \"what\": ");
            json_str(f, w->what);
            fprintf(f, ", \"latency\": ");
            json_lat(f, &w->s, 1);
            fprintf(f, ", \"ratio_mean\": %.4f, \"ratio_p50\": %.4f}", w->ratio_mean, w->ratio_p50);
        }
        fprintf(f, "\n  ]");
    }
    if (r->check_ran)
        fprintf(f,
                ",\n  \"check\": {\"trees\": %" PRIu64 ", \"errors\": %" PRIu64
                ", \"leaked_blocks\": %" PRIu64 "}",
                r->check.trees, r->check.errors, r->check.leaked_blocks);
    fprintf(f, ",\n  \"data_errors\": %" PRIu64 "\n}\n", g_mismatches);
    if (fclose(f) != 0)
        die("writing %s: %s", path, strerror(errno));
}

/* ---- Main -------------------------------------------------------------------------------------
 */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: bench-engine [options]\n"
        "  --dir DIR        where to put the test files (default /var/tmp; removed at the end)\n"
        "  --size SIZE      VDI and raw file size (default 4G; --quick 256M)\n"
        "  --runtime SECS   seconds per timed run (default 5; --quick 1)\n"
        "  --snapshots N    snapshots per latency test (default 1000; --quick 100)\n"
        "  --writes N       QD 1 writes per latency test (default 2000; --quick 200)\n"
        "  --freq-size SIZE fresh region per snapshot-frequency run (default 24G; --quick 512M)\n"
        "  --cache SIZE     radix node cache (default: the engine's, 64 MiB)\n"
        "  --repeat N       throughput and frequency runs: repeat N times, interleaved, and\n"
        "                   report medians and, for ratios, the geometric mean of the paired\n"
        "                   runs (default 4, even so the alternating order balances; --quick 1)\n"
        "  --only LIST      run only some of: throughput,snapshot,frequency,latency\n"
        "  --check          run plx_check on the main store at the end (on with --quick)\n"
        "  --json FILE      also write the results as JSON\n"
        "  --keep           keep the test files (for inspection) instead of removing them\n"
        "  --count-io       count the I/Os the engine issues (opens stores through a counting\n"
        "                   wrapper of the file backend) and print them per request / MiB\n"
        "  --quick          smoke run: 1 s runs and small sizes\n");
}

static unsigned parse_parts(const char *s)
{
    unsigned p = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "throughput") == 0)
            p |= PART_THROUGHPUT;
        else if (strcmp(tok, "snapshot") == 0)
            p |= PART_SNAPLAT;
        else if (strcmp(tok, "frequency") == 0)
            p |= PART_FREQ;
        else if (strcmp(tok, "latency") == 0)
            p |= PART_WLAT;
        else
            die("--only: unknown part '%s'", tok);
    }
    free(dup);
    return p;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    enum {
        O_DIR = 256,
        O_SIZE,
        O_RUNTIME,
        O_SNAPS,
        O_WRITES,
        O_FREQ,
        O_CACHE,
        O_ONLY,
        O_CHECK,
        O_JSON,
        O_QUICK,
        O_HELP,
        O_REPEAT,
        O_KEEP,
        O_COUNT_IO
    };
    static const struct option lo[] = {
        {"dir", required_argument, 0, O_DIR},         {"size", required_argument, 0, O_SIZE},
        {"runtime", required_argument, 0, O_RUNTIME}, {"snapshots", required_argument, 0, O_SNAPS},
        {"writes", required_argument, 0, O_WRITES},   {"freq-size", required_argument, 0, O_FREQ},
        {"cache", required_argument, 0, O_CACHE},     {"only", required_argument, 0, O_ONLY},
        {"check", no_argument, 0, O_CHECK},           {"json", required_argument, 0, O_JSON},
        {"quick", no_argument, 0, O_QUICK},           {"help", no_argument, 0, O_HELP},
        {"repeat", required_argument, 0, O_REPEAT},   {"keep", no_argument, 0, O_KEEP},
        {"count-io", no_argument, 0, O_COUNT_IO},     {0, 0, 0, 0}};
    const char *size = NULL, *runtime = NULL, *snaps = NULL, *writes = NULL, *freq = NULL;
    const char *cache = NULL, *repeat = NULL;
    memset(o, 0, sizeof *o);
    o->dir = "/var/tmp";
    o->parts = PART_ALL;
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case O_DIR:
            o->dir = optarg;
            break;
        case O_SIZE:
            size = optarg;
            break;
        case O_RUNTIME:
            runtime = optarg;
            break;
        case O_SNAPS:
            snaps = optarg;
            break;
        case O_WRITES:
            writes = optarg;
            break;
        case O_FREQ:
            freq = optarg;
            break;
        case O_CACHE:
            cache = optarg;
            break;
        case O_ONLY:
            o->parts = parse_parts(optarg);
            break;
        case O_CHECK:
            o->check = 1;
            break;
        case O_JSON:
            o->json = optarg;
            break;
        case O_QUICK:
            o->quick = 1;
            break;
        case O_REPEAT:
            repeat = optarg;
            break;
        case O_KEEP:
            g_keep = 1;
            break;
        case O_COUNT_IO:
            g_count_io = 1;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind < argc) {
        usage(stderr);
        exit(2);
    }
    o->size = o->quick ? 256 * MiB : 4 * GiB;
    o->runtime = o->quick ? 1.0 : 5.0;
    o->snaps = o->quick ? 100 : 1000;
    o->lat_writes = o->quick ? 200 : 2000;
    o->freq_size = o->quick ? 512 * MiB : 24 * GiB;
    o->repeat = o->quick ? 1 : 4;
    if (o->quick)
        o->check = 1;
    if (repeat != NULL &&
        ((o->repeat = (unsigned)strtoul(repeat, NULL, 10)) == 0 || o->repeat > MAX_REPEAT))
        die("--repeat %s: want 1 .. %d", repeat, MAX_REPEAT);
    if (size != NULL && plx_size_parse(size, &o->size) < 0)
        die("--size %s: not a size", size);
    if (freq != NULL && plx_size_parse(freq, &o->freq_size) < 0)
        die("--freq-size %s: not a size", freq);
    if (cache != NULL && plx_size_parse(cache, &o->cache_bytes) < 0)
        die("--cache %s: not a size", cache);
    if (runtime != NULL && ((o->runtime = strtod(runtime, NULL)) <= 0 || o->runtime > 3600))
        die("--runtime %s: want seconds in (0, 3600]", runtime);
    if (snaps != NULL && (o->snaps = (unsigned)strtoul(snaps, NULL, 10)) == 0)
        die("--snapshots %s: want a positive count", snaps);
    if (writes != NULL && (o->lat_writes = (unsigned)strtoul(writes, NULL, 10)) == 0)
        die("--writes %s: want a positive count", writes);
    o->size = o->size / MiB * MiB;
    o->freq_size = o->freq_size / MiB * MiB;
    if (o->size < 16 * MiB || o->size > 512 * GiB)
        die("--size: want 16 MiB .. 512 GiB");
    if (o->freq_size < 16 * MiB)
        die("--freq-size: want at least 16 MiB");
    size_t n = 0;
    for (int i = 0; i < argc && n + 2 < sizeof o->command; i++)
        n += (size_t)snprintf(o->command + n, sizeof o->command - n, "%s%s", i ? " " : "", argv[i]);
}

static void check_space(const struct ctx *c)
{
    const struct opts *o = &c->o;
    struct statvfs vf;
    if (statvfs(o->dir, &vf) != 0)
        die("%s: %s", o->dir, strerror(errno));
    uint64_t avail = (uint64_t)vf.f_bavail * vf.f_frsize;
    uint64_t need = 0;
    if (o->parts & (PART_THROUGHPUT | PART_WLAT | PART_SNAPLAT))
        need = 2 * o->size + o->size / 2 + (o->quick ? 128 * MiB : 1 * GiB);
    if ((o->parts & PART_FREQ) && freq_store_size(o) > need)
        need = freq_store_size(o);
    char b1[32], b2[32];
    if (avail < need)
        die("%s has %s free; this run needs about %s (use --size / --freq-size)", o->dir,
            fmt_bytes(avail, b1, sizeof b1), fmt_bytes(need, b2, sizeof b2));
}

int main(int argc, char **argv)
{
    static struct ctx c;
    parse_args(argc, argv, &c.o);
    const struct opts *o = &c.o;
    atexit(cleanup_files);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    long pid = (long)getpid();
    snprintf(c.raw_path, sizeof c.raw_path, "%s/plx-bench-%ld.raw", o->dir, pid);
    snprintf(c.store_path, sizeof c.store_path, "%s/plx-bench-%ld.store", o->dir, pid);
    snprintf(c.freq_path, sizeof c.freq_path, "%s/plx-bench-%ld.freq", o->dir, pid);
    time_t now = time(NULL);
    strftime(c.res.date, sizeof c.res.date, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    machine_info(&c.res.m, o->dir, c.raw_path);
    dev_init(o->dir);
    read_loadavg(c.res.m.load_start, sizeof c.res.m.load_start);
    check_space(&c);

    char b1[32];
    fprintf(stderr, "bench-engine: VDI %s, %.1f s runs, files in %s (%s, %s)\n",
            fmt_bytes(o->size, b1, sizeof b1), o->runtime, o->dir, c.res.m.fs, c.res.m.io_mode);
    unsigned main_parts = PART_THROUGHPUT | PART_WLAT | PART_SNAPLAT;
    if (o->parts & main_parts) {
        fprintf(stderr, "[setup] raw file and Parallax VDI, written in full\n");
        setup_raw(&c);
        setup_plx(&c);
        if (o->parts & PART_THROUGHPUT)
            bench_throughput(&c);
        /* Latency before the snapshot tests: the writable path needs a VDI never snapshotted. */
        if (o->parts & PART_WLAT)
            bench_write_latency(&c);
        if (o->parts & PART_SNAPLAT)
            bench_snapshot_latency(&c);
        if (o->check)
            run_check(&c);
        plx_target_close(&c.plx);
        raw_close(&c.raw);
        untrack_path(c.store_path);
        untrack_path(c.raw_path);
    }
    if (o->parts & PART_FREQ)
        bench_snapshot_frequency(&c);

    read_loadavg(c.res.m.load_end, sizeof c.res.m.load_end);
    print_report(&c);
    if (o->json != NULL)
        write_json(&c, o->json);
    fflush(stdout);
    if (g_mismatches) {
        fprintf(stderr,
                "bench-engine: DATA ERRORS: %" PRIu64 " reads returned wrong data; "
                "first: %s\n",
                g_mismatches, g_first_mismatch);
        return 3;
    }
    if (c.res.check_ran && c.res.check.errors) {
        fprintf(stderr, "bench-engine: plx_check found %" PRIu64 " errors\n", c.res.check.errors);
        return 4;
    }
    return 0;
}
