/*
 * iscsi.c - Parallax on an iSCSI LUN against the same LUN driven raw, in one run.
 *
 *   bench-iscsi URL [--seconds N] [--size SIZE] [--json FILE]
 *
 * URL is an iSCSI LUN (iscsi://HOST:PORT/IQN/LUN) of at least three times SIZE (default 1 GiB)
 * that this program overwrites. Its first 2 x SIZE bytes are formatted as a Parallax blockstore
 * holding one VDI of SIZE; the last SIZE bytes are the raw region. Four workloads of N seconds
 * each (default 5): 1 MiB sequential writes at queue depth 8, 4 KiB random reads and 4 KiB
 * random writes at queue depth 32, 1 MiB sequential reads at queue depth 8; each write workload
 * ends with a flush, inside its time. Each runs on both sides, alternating, for ROUNDS rounds
 * (default 3); medians are reported:
 *   raw       the raw region through the iSCSI backend alone (libiscsi's async API behind the
 *             backend seam, opened for the run): what the LUN gives with no Parallax on top
 *   parallax  the VDI through the engine's asynchronous API (plx_vdi_submit_*), store opened
 *             for the run: radix tree, allocation, commit
 * Before the first round the VDI is written once, so reads find mapped blocks. bench/iscsi.sh
 * starts tgtd, fills the LUN, runs libiscsi's own iscsi-perf for reads as an outside
 * reference, then this.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "parallax.h"
#include "size.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define MAX_QD 32

enum workload { SEQ_WRITE, RAND_READ, RAND_WRITE, SEQ_READ, NWORK };
static const char *work_name[NWORK] = {"seqwrite-1m-qd8", "randread-4k-qd32", "randwrite-4k-qd32",
                                       "seqread-1m-qd8"};
static const size_t work_bs[NWORK] = {MiB, 4 * KiB, 4 * KiB, MiB};
static const int work_qd[NWORK] = {8, 32, 32, 8};
static const int work_write[NWORK] = {1, 0, 1, 0};
static const int work_seq[NWORK] = {1, 0, 0, 1};

static __attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench-iscsi: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One run of a workload: the offsets it issues and what it counted. */
struct run {
    enum workload w;
    uint64_t base, size, next_seq, rng;
    double deadline;
    int stopping;
    unsigned inflight;
    uint64_t ops, errors;
};

static uint64_t next_offset(struct run *r)
{
    size_t bs = work_bs[r->w];
    if (work_seq[r->w]) {
        uint64_t off = r->next_seq;
        r->next_seq = (r->next_seq + bs) % (r->size - r->size % bs);
        return off;
    }
    return splitmix64(&r->rng) % (r->size / bs) * bs;
}

/* ---- raw: the backend seam -------------------------------------------------------------- */

struct raw_slot {
    struct plx_io io;
    struct run *r;
    plx_backend *be;
};

static void raw_issue(struct raw_slot *s);

static void raw_done(struct plx_io *io, int status)
{
    struct raw_slot *s = io->owner;
    s->r->inflight--;
    if (status != 0)
        s->r->errors++;
    else if (io->op != PLX_IO_FLUSH)
        s->r->ops++;
    if (!s->r->stopping && now_s() < s->r->deadline)
        raw_issue(s);
    else
        s->r->stopping = 1;
}

static void raw_issue(struct raw_slot *s)
{
    struct run *r = s->r;
    uint64_t off = next_offset(r);
    s->io.op = work_write[r->w] ? PLX_IO_WRITE : PLX_IO_READ;
    s->io.flags = 0;
    s->io.block = (r->base + off) / PLX_BLOCK_SIZE;
    s->io.nblocks = (uint32_t)(work_bs[r->w] / PLX_BLOCK_SIZE);
    s->io.done = raw_done;
    s->io.owner = s;
    if (s->be->ops->submit(s->be, &s->io) != 0)
        die("raw submit failed");
    r->inflight++;
}

static void raw_wait(plx_backend *be, const unsigned *inflight)
{
    while (*inflight > 0)
        if (be->ops->poll(be, -1) < 0)
            die("raw poll failed");
}

static double raw_run(plx_backend *be, enum workload w, uint64_t base, uint64_t size,
                      double seconds, void **bufs)
{
    struct run r = {.w = w, .base = base, .size = size, .rng = 42};
    struct raw_slot slots[MAX_QD];
    double start = now_s();
    r.deadline = start + seconds;
    for (int i = 0; i < work_qd[w]; i++) {
        slots[i] = (struct raw_slot){.r = &r, .be = be};
        slots[i].io.buf = bufs[i];
        raw_issue(&slots[i]);
    }
    raw_wait(be, &r.inflight);
    if (work_write[w]) {
        struct raw_slot f = {.r = &r, .be = be};
        f.io = (struct plx_io){.op = PLX_IO_FLUSH, .done = raw_done, .owner = &f};
        r.stopping = 1;
        if (be->ops->submit(be, &f.io) != 0)
            die("raw flush failed");
        r.inflight++;
        raw_wait(be, &r.inflight);
    }
    if (r.errors)
        die("raw %s: %llu I/O errors", work_name[w], (unsigned long long)r.errors);
    return (double)r.ops / (now_s() - start);
}

/* ---- parallax: the engine's VDI API --------------------------------------------------------- */

struct vdi_slot {
    struct run *r;
    plx_vdi *v;
    void *buf;
};

static void vdi_issue(struct vdi_slot *s);

static void vdi_done(void *arg, int status)
{
    struct vdi_slot *s = arg;
    s->r->inflight--;
    if (status != 0)
        s->r->errors++;
    else
        s->r->ops++;
    if (!s->r->stopping && now_s() < s->r->deadline)
        vdi_issue(s);
    else
        s->r->stopping = 1;
}

static void vdi_issue(struct vdi_slot *s)
{
    struct run *r = s->r;
    uint64_t off = next_offset(r);
    int rc = work_write[r->w]
                 ? plx_vdi_submit_write(s->v, s->buf, off, work_bs[r->w], 0, vdi_done, s)
                 : plx_vdi_submit_read(s->v, s->buf, off, work_bs[r->w], vdi_done, s);
    if (rc != 0)
        die("VDI submit: %s", strerror(-rc));
    r->inflight++;
}

static void flush_done(void *arg, int status)
{
    int *result = arg;
    result[0] = status;
    result[1] = 1;
}

static void drive(plx_store *st, const unsigned *inflight)
{
    struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
    while (*inflight > 0) {
        if (plx_store_service(st) < 0)
            die("service: %s", plx_store_errmsg(st));
        if (*inflight > 0 && poll(&p, 1, 1000) < 0 && errno != EINTR)
            die("poll: %s", strerror(errno));
    }
}

static double vdi_run(plx_store *st, plx_vdi *v, enum workload w, uint64_t size, double seconds,
                      void **bufs)
{
    struct run r = {.w = w, .size = size, .rng = 42};
    struct vdi_slot slots[MAX_QD];
    double start = now_s();
    r.deadline = start + seconds;
    for (int i = 0; i < work_qd[w]; i++) {
        slots[i] = (struct vdi_slot){.r = &r, .v = v, .buf = bufs[i]};
        vdi_issue(&slots[i]);
    }
    drive(st, &r.inflight);
    if (work_write[w]) {
        int result[2] = {0, 0};
        if (plx_vdi_submit_flush(v, flush_done, result) != 0)
            die("flush submit");
        struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
        while (!result[1]) {
            if (plx_store_service(st) < 0)
                die("service: %s", plx_store_errmsg(st));
            if (!result[1] && poll(&p, 1, 1000) < 0 && errno != EINTR)
                die("poll: %s", strerror(errno));
        }
        if (result[0] != 0)
            die("flush: %s", strerror(-result[0]));
    }
    if (r.errors)
        die("parallax %s: %llu I/O errors", work_name[w], (unsigned long long)r.errors);
    return (double)r.ops / (now_s() - start);
}

/* ---- main ------------------------------------------------------------------------------------ */

/* A size argument (bytes, or with K, M, G or T), or the program stops. */
static uint64_t size_arg(const char *s)
{
    uint64_t v;
    if (plx_size_parse(s, &v) < 0)
        die("bad size %s", s);
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define MAX_ROUNDS 15

static double raw_once(const char *url, enum workload w, uint64_t base, uint64_t size,
                       double seconds, void **bufs)
{
    char err[1024] = "";
    int e = 0;
    plx_backend *be = plx_backend_iscsi_open(url, 0, &e, err, sizeof err);
    if (be == NULL)
        die("%s", err);
    double iops = raw_run(be, w, base, size, seconds, bufs);
    be->ops->destroy(be);
    return iops;
}

static double vdi_once(const char *url, int w, uint64_t size, double seconds, void **bufs)
{
    char err[1024] = "";
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o};
    if (plx_store_open(url, &o, &st, err, sizeof err) != 0)
        die("open: %s", err);
    plx_vdi *v = NULL;
    if (plx_vdi_open(st, "bench", 0, &v) != 0)
        die("VDI: %s", plx_store_errmsg(st));
    double iops = w < 0 ? 0 : vdi_run(st, v, (enum workload)w, size, seconds, bufs);
    if (w < 0) {
        /* Fill: the whole VDI once, 1 MiB at a time. */
        for (uint64_t off = 0; off < size; off += MiB)
            if (plx_vdi_pwrite(v, bufs[0], off, MiB, 0) != 0)
                die("fill: %s", plx_store_errmsg(st));
        if (plx_vdi_flush(v) != 0)
            die("fill flush: %s", plx_store_errmsg(st));
    }
    plx_vdi_close(v);
    if (plx_store_close(st) != 0)
        die("close failed");
    return iops;
}

int main(int argc, char **argv)
{
    const char *url = NULL, *json = NULL;
    double seconds = 5;
    int rounds = 3;
    uint64_t size = 1024 * MiB;
    const char *usage = "usage: bench-iscsi URL [--seconds N] [--size SIZE] [--rounds N] "
                        "[--json FILE]";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = size_arg(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (url == NULL && plx_blockstore_is_url(argv[i]))
            url = argv[i];
        else
            die("%s", usage);
    }
    if (url == NULL || rounds < 1 || rounds > MAX_ROUNDS || size < 64 * MiB)
        die("%s", usage);

    void *bufs[MAX_QD];
    for (int i = 0; i < MAX_QD; i++) {
        bufs[i] = plx_block_alloc(MiB / PLX_BLOCK_SIZE);
        memset(bufs[i], 0x5a + i, MiB);
    }

    char err[1024] = "";
    /* Extents of SIZE/16 (64 MiB at most): room for the VDI, its metadata, and spare extents. */
    uint64_t extent = size / 16 < 64 * MiB ? size / 16 : 64 * MiB;
    if (plx_format(url, 2 * size, extent, 1, err, sizeof err) != 0)
        die("format: %s", err);
    plx_store *st = NULL;
    struct plx_open_opts o = {.struct_size = sizeof o, .blocking_io = 1};
    if (plx_store_open(url, &o, &st, err, sizeof err) != 0)
        die("open: %s", err);
    if (plx_vdi_create(st, "bench", size, NULL) != 0)
        die("VDI: %s", plx_store_errmsg(st));
    plx_store_close(st);
    vdi_once(url, -1, size, seconds, bufs);

    double iops[2][NWORK][MAX_ROUNDS];
    for (int round = 0; round < rounds; round++)
        for (int w = 0; w < NWORK; w++) {
            iops[0][w][round] = raw_once(url, (enum workload)w, 2 * size, size, seconds, bufs);
            iops[1][w][round] = vdi_once(url, w, size, seconds, bufs);
            fprintf(stderr, "round %d %-18s raw %8.0f  parallax %8.0f IOPS\n", round + 1,
                    work_name[w], iops[0][w][round], iops[1][w][round]);
        }

    double med[2][NWORK];
    for (int k = 0; k < 2; k++)
        for (int w = 0; w < NWORK; w++)
            med[k][w] = median(iops[k][w], rounds);
    printf("medians of %d rounds, %g s each\n", rounds, seconds);
    printf("%-18s %12s %12s %12s %12s %7s\n", "workload", "raw IOPS", "raw MB/s", "plx IOPS",
           "plx MB/s", "plx/raw");
    for (int w = 0; w < NWORK; w++)
        printf("%-18s %12.0f %12.1f %12.0f %12.1f %7.2f\n", work_name[w], med[0][w],
               med[0][w] * (double)work_bs[w] / 1e6, med[1][w],
               med[1][w] * (double)work_bs[w] / 1e6, med[1][w] / med[0][w]);
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f == NULL)
            die("%s: %s", json, strerror(errno));
        fprintf(f, "{\"seconds\": %g, \"rounds\": %d, \"size\": %llu, \"workloads\": [", seconds,
                rounds, (unsigned long long)size);
        for (int w = 0; w < NWORK; w++)
            fprintf(f,
                    "%s{\"name\": \"%s\", \"bs\": %zu, \"qd\": %d, \"raw_iops\": %.0f, "
                    "\"parallax_iops\": %.0f}",
                    w ? ", " : "", work_name[w], work_bs[w], work_qd[w], med[0][w], med[1][w]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    for (int i = 0; i < MAX_QD; i++)
        plx_block_free(bufs[i]);
    return 0;
}
