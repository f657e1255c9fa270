/*
 * bench/wcache-engine.c - the write cache's own cost, without the NBD transport: a burst and
 * 4 KiB QD1 writes through the library with the cache on, against the same pattern with libaio
 * and O_DIRECT straight on a file on the local disk (bench/README.md, "Write cache").
 *
 *   bench-wcache-engine --store STORE --log PATH --local FILE [--log-size SIZE] [--writers N]
 *                       [--burst SIZE] [--bs LIST] [--qd N] [--rounds N] [--qd1-writes N]
 *
 * STORE is an existing blockstore (a file, or the iscsi:// URL of bench/wcache.sh's throttled
 * LUN); the bench creates its VDIs in it (one per writer, and one for QD1, named wce-PID-...)
 * and deletes them at the end. PATH is the write log (created; removed at the end), FILE the
 * local reference (created and written through once, so both sides overwrite allocated blocks;
 * removed at the end). Both must be on the same local disk.
 *
 * Per round and per block size (--bs, default 4k,64k,1m), in alternating order:
 *   local   WRITERS regions of FILE, each written sequentially with BS writes at QD (libaio,
 *           O_DIRECT), then fdatasync: fio's --rw=write --iodepth=QD --end_fsync=1 per job;
 *   cache   WRITERS VDIs with the cache on, each written sequentially with BS writes at QD
 *           through plx_vdi_submit_write, then a flush of each: the same shape. Before it the
 *           log is drained (the burst must fit the log), so its time has the drain competing
 *           only with the burst's own records.
 * Each prints MiB/s and the process's CPU time per MiB. Then per round QD1: --qd1-writes 4 KiB
 * random writes at QD 1 on FILE (libaio, O_DIRECT) and on the QD1 VDI with the cache on,
 * alternating; median, mean and 99th percentile of each write's latency (submit to completion).
 * The summary gives the ratios of the means over the rounds: cache / local for the burst
 * (target >= 0.8) and for QD1 (target <= 1.2), with the same write pattern and no transport.
 *
 * Build: make build/bench-wcache-engine
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libaio.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallax.h"
#include "size.h"

#define KiB ((uint64_t)1024)
#define MiB ((uint64_t)1024 * 1024)
#define MAX_WRITERS 16
#define MAX_BS 8
#define MAX_ROUNDS 16
#define MAX_QD 64

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench-wcache-engine: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static uint64_t now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}
static uint64_t cpu_ns(void)
{
    return clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *aligned(size_t len)
{
    void *p;
    if (posix_memalign(&p, 4096, len))
        die("out of memory");
    for (size_t i = 0; i < len; i += 8) {
        uint64_t x = i * 0x9e3779b97f4a7c15ull;
        memcpy((char *)p + i, &x, 8);
    }
    return p;
}

/* ---- The local disk: libaio, O_DIRECT ------------------------------------------------------- */

struct local {
    int fd;
    io_context_t ctx;
};

static void local_open(struct local *l, const char *path, uint64_t size)
{
    /* Written through once (not sparse, not unwritten extents): the blocks are allocated, as the
     * log's are. */
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die("%s: %s", path, strerror(errno));
    void *buf = aligned(MiB);
    for (uint64_t off = 0; off < size; off += MiB)
        if (pwrite(fd, buf, MiB, (off_t)off) != (ssize_t)MiB)
            die("writing %s: %s", path, strerror(errno));
    free(buf);
    if (fdatasync(fd))
        die("fdatasync %s: %s", path, strerror(errno));
    close(fd);
    l->fd = open(path, O_RDWR | O_DIRECT);
    if (l->fd < 0)
        die("%s: %s", path, strerror(errno));
    memset(&l->ctx, 0, sizeof l->ctx);
    if (io_setup(MAX_QD * MAX_WRITERS, &l->ctx))
        die("io_setup failed");
}

/* Sequential BS writes at QD per region, `writers` regions of `len` each, then fdatasync. */
static void local_burst(struct local *l, unsigned writers, uint64_t len, size_t bs, unsigned qd,
                        const void *data)
{
    struct iocb cbs[MAX_WRITERS * MAX_QD], *pcb[1];
    uint64_t next[MAX_WRITERS];
    unsigned inflight = 0;
    for (unsigned w = 0; w < writers; w++)
        next[w] = 0;
    unsigned slot = 0;
    for (unsigned w = 0; w < writers; w++)
        for (unsigned q = 0; q < qd && next[w] < len; q++, slot++) {
            io_prep_pwrite(&cbs[slot], l->fd, (void *)data, bs, (long long)(w * len + next[w]));
            cbs[slot].data = (void *)(uintptr_t)w;
            next[w] += bs;
            pcb[0] = &cbs[slot];
            if (io_submit(l->ctx, 1, pcb) != 1)
                die("io_submit failed");
            inflight++;
        }
    struct io_event ev[MAX_WRITERS * MAX_QD];
    while (inflight) {
        int n = io_getevents(l->ctx, 1, MAX_WRITERS * MAX_QD, ev, NULL);
        if (n < 0)
            die("io_getevents: %s", strerror(-n));
        for (int i = 0; i < n; i++) {
            if (ev[i].res != bs)
                die("a local write failed (%ld)", (long)ev[i].res);
            inflight--;
            struct iocb *cb = ev[i].obj;
            unsigned w = (unsigned)(uintptr_t)cb->data;
            if (next[w] < len) {
                io_prep_pwrite(cb, l->fd, (void *)data, bs, (long long)(w * len + next[w]));
                cb->data = (void *)(uintptr_t)w;
                next[w] += bs;
                pcb[0] = cb;
                if (io_submit(l->ctx, 1, pcb) != 1)
                    die("io_submit failed");
                inflight++;
            }
        }
    }
    if (fdatasync(l->fd))
        die("fdatasync: %s", strerror(errno));
}

static uint64_t local_qd1_one(struct local *l, uint64_t off, const void *data)
{
    struct iocb cb, *pcb = &cb;
    struct io_event ev;
    uint64_t t0 = now_ns();
    io_prep_pwrite(&cb, l->fd, (void *)data, 4096, (long long)off);
    if (io_submit(l->ctx, 1, &pcb) != 1)
        die("io_submit failed");
    if (io_getevents(l->ctx, 1, 1, &ev, NULL) != 1 || ev.res != 4096)
        die("a local write failed");
    return now_ns() - t0;
}

/* ---- Parallax with the cache on ------------------------------------------------------------- */

static plx_store *g_st;

static void service(int timeout_ms)
{
    int rc = plx_store_service(g_st);
    if (rc < 0)
        die("plx_store_service: %s", plx_store_errmsg(g_st));
    if (rc == 0) {
        struct pollfd p = {.fd = plx_store_fd(g_st), .events = POLLIN};
        poll(&p, 1, timeout_ms);
    }
}

struct pwriter {
    plx_vdi *v;
    uint64_t next, len;
    unsigned inflight;
    size_t bs;
    const void *data;
    int flushed; /* 0 none, 1 submitted, 2 done */
};

static unsigned g_qd = 8;

static void pw_fill(struct pwriter *w);

static void pw_done(void *arg, int status)
{
    struct pwriter *w = arg;
    if (status)
        die("a cached write failed: %s", strerror(-status));
    w->inflight--;
    pw_fill(w); /* at once, as fio does: the queue stays full */
}

static void pw_flushed(void *arg, int status)
{
    struct pwriter *w = arg;
    if (status)
        die("a flush failed: %s", strerror(-status));
    w->flushed = 2;
}

static void pw_fill(struct pwriter *w)
{
    while (w->inflight < g_qd && w->next < w->len) {
        int rc = plx_vdi_submit_write(w->v, w->data, w->next, w->bs, PLX_WRITE_CACHED, pw_done, w);
        if (rc)
            die("plx_vdi_submit_write: %s", plx_store_errmsg(g_st));
        w->next += w->bs;
        w->inflight++;
    }
    if (w->next >= w->len && !w->inflight && !w->flushed) {
        w->flushed = 1;
        if (plx_vdi_submit_flush(w->v, pw_flushed, w))
            die("plx_vdi_submit_flush: %s", plx_store_errmsg(g_st));
    }
}

static void cache_burst(plx_vdi **v, unsigned writers, uint64_t len, size_t bs, const void *data)
{
    struct pwriter w[MAX_WRITERS];
    for (unsigned i = 0; i < writers; i++)
        w[i] = (struct pwriter){.v = v[i], .len = len, .bs = bs, .data = data};
    for (;;) {
        unsigned done = 0;
        for (unsigned i = 0; i < writers; i++) {
            pw_fill(&w[i]);
            done += w[i].flushed == 2;
        }
        if (done == writers)
            break;
        service(1000);
    }
}

static void wait_drained(void)
{
    struct plx_wcache_status s;
    for (;;) {
        if (plx_wcache_status(g_st, &s))
            die("plx_wcache_status: %s", plx_store_errmsg(g_st));
        if (!s.backlog_records && !s.used_bytes)
            return;
        service(100);
    }
}

static int g_one_done;
static void one_done(void *arg, int status)
{
    (void)arg;
    if (status)
        die("a cached write failed: %s", strerror(-status));
    g_one_done = 1;
}

static uint64_t cache_qd1_one(plx_vdi *v, uint64_t off, const void *data)
{
    uint64_t t0 = now_ns();
    g_one_done = 0;
    if (plx_vdi_submit_write(v, data, off, 4096, PLX_WRITE_CACHED, one_done, NULL))
        die("plx_vdi_submit_write: %s", plx_store_errmsg(g_st));
    while (!g_one_done)
        service(1000);
    return now_ns() - t0;
}

/* ---- Statistics --------------------------------------------------------------------------------
 */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct lat {
    double median, mean, p99;
};

static struct lat lat_of(uint64_t *ns, size_t n)
{
    qsort(ns, n, sizeof *ns, cmp_u64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)ns[i];
    return (struct lat){.median = (double)ns[n / 2] / 1e3,
                        .mean = sum / (double)n / 1e3,
                        .p99 = (double)ns[n * 99 / 100] / 1e3};
}

/* ---- Main
 * ---------------------------------------------------------------------------------------- */

static char g_vdis[MAX_WRITERS + 1][64];
static unsigned g_nvdis;

int main(int argc, char **argv)
{
    const char *store = NULL, *log = NULL, *local_path = NULL, *bs_list = "4k,64k,1m";
    uint64_t log_size = 1024 * MiB, burst = 32 * MiB;
    unsigned writers = 3, rounds = 3, qd1_writes = 5000;
    static const struct option lo[] = {{"store", 1, 0, 's'},
                                       {"log", 1, 0, 'l'},
                                       {"local", 1, 0, 'L'},
                                       {"log-size", 1, 0, 'S'},
                                       {"writers", 1, 0, 'w'},
                                       {"burst", 1, 0, 'b'},
                                       {"bs", 1, 0, 'B'},
                                       {"qd", 1, 0, 'q'},
                                       {"rounds", 1, 0, 'r'},
                                       {"qd1-writes", 1, 0, 'n'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 's':
            store = optarg;
            break;
        case 'l':
            log = optarg;
            break;
        case 'L':
            local_path = optarg;
            break;
        case 'S':
            if (plx_size_parse(optarg, &log_size))
                die("bad --log-size");
            break;
        case 'w':
            writers = (unsigned)atoi(optarg);
            break;
        case 'b':
            if (plx_size_parse(optarg, &burst))
                die("bad --burst");
            break;
        case 'B':
            bs_list = optarg;
            break;
        case 'q':
            g_qd = (unsigned)atoi(optarg);
            break;
        case 'r':
            rounds = (unsigned)atoi(optarg);
            break;
        case 'n':
            qd1_writes = (unsigned)atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: bench-wcache-engine --store STORE --log PATH --local FILE "
                            "[--log-size SIZE] [--writers N] [--burst SIZE] [--bs LIST] [--qd N] "
                            "[--rounds N] [--qd1-writes N]\n");
            return 2;
        }
    }
    if (!store || !log || !local_path)
        die("--store, --log and --local are needed");
    if (!writers || writers > MAX_WRITERS || !g_qd || g_qd > MAX_QD || !rounds ||
        rounds > MAX_ROUNDS || !qd1_writes)
        die("--writers 1-%d, --qd 1-%d, --rounds 1-%d, --qd1-writes > 0", MAX_WRITERS, MAX_QD,
            MAX_ROUNDS);
    size_t bss[MAX_BS];
    unsigned nbs = 0;
    for (char *list = strdup(bs_list), *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t b;
        if (nbs == MAX_BS || plx_size_parse(tok, &b) || !b || b % 4096 || b > 32 * MiB || burst % b)
            die("bad --bs %s (multiples of 4k dividing --burst)", tok);
        bss[nbs++] = (size_t)b;
    }
    uint64_t qd1_span = 256 * MiB;

    struct plx_open_opts oo = {.struct_size = sizeof oo};
    char err[512];
    if (plx_store_open(store, &oo, &g_st, err, sizeof err) < 0)
        die("opening %s: %s", store, err);
    int rc = plx_wcache_attach(g_st, log, log_size);
    if (rc)
        die("attaching the log: %s", plx_store_errmsg(g_st));
    plx_vdi *v[MAX_WRITERS + 1];
    for (unsigned i = 0; i <= writers; i++) {
        snprintf(g_vdis[i], sizeof g_vdis[i], "wce-%d-%u", (int)getpid(), i);
        if (plx_vdi_create(g_st, g_vdis[i], i < writers ? burst : qd1_span, NULL) < 0)
            die("creating VDI %s: %s", g_vdis[i], plx_store_errmsg(g_st));
        g_nvdis = i + 1;
        if (plx_vdi_open(g_st, g_vdis[i], 0, &v[i]) < 0 || plx_vdi_wcache(v[i], 1) < 0)
            die("opening VDI %s with the cache on: %s", g_vdis[i], plx_store_errmsg(g_st));
    }
    struct local loc;
    uint64_t local_size = writers * burst > qd1_span ? writers * burst : qd1_span;
    local_open(&loc, local_path, local_size);
    size_t maxbs = 0;
    for (unsigned i = 0; i < nbs; i++)
        maxbs = bss[i] > maxbs ? bss[i] : maxbs;
    void *data = aligned(maxbs);

    printf("burst: %u writers x %" PRIu64 " MiB, QD %u each, sequential, flush at the end; "
           "QD1: %u random 4 KiB writes over %" PRIu64 " MiB; %u rounds\n",
           writers, burst / MiB, g_qd, qd1_writes, qd1_span / MiB, rounds);
    double lbw[MAX_BS][MAX_ROUNDS] = {{0}}, cbw[MAX_BS][MAX_ROUNDS] = {{0}};
    double total_mib = (double)(writers * burst) / (double)MiB;
    for (unsigned r = 0; r < rounds; r++) {
        for (unsigned k = 0; k < nbs; k++) {
            double lcpu = 0, ccpu = 0;
            for (int side = 0; side < 2; side++) {
                bool cache = (side + r) % 2 == 1; /* the order alternates between rounds */
                if (cache)
                    wait_drained();
                uint64_t c0 = cpu_ns(), t0 = now_ns();
                if (cache)
                    cache_burst(v, writers, burst, bss[k], data);
                else
                    local_burst(&loc, writers, burst, bss[k], g_qd, data);
                double secs = (double)(now_ns() - t0) / 1e9;
                double cpu = (double)(cpu_ns() - c0) / 1e6 / total_mib;
                (cache ? cbw : lbw)[k][r] = total_mib / secs;
                *(cache ? &ccpu : &lcpu) = cpu;
            }
            printf("burst, round %u, bs %zu KiB: local disk %.0f MiB/s (%.2f ms CPU/MiB), cache "
                   "on %.0f MiB/s (%.2f ms CPU/MiB); cache / local %.2f\n",
                   r + 1, (size_t)(bss[k] / KiB), lbw[k][r], lcpu, cbw[k][r], ccpu,
                   cbw[k][r] / lbw[k][r]);
            fflush(stdout);
        }
    }
    for (unsigned k = 0; k < nbs; k++) {
        double l = 0, cc = 0;
        for (unsigned r = 0; r < rounds; r++)
            l += lbw[k][r], cc += cbw[k][r];
        printf("burst, bs %zu KiB, mean of %u rounds: local disk %.0f MiB/s, cache on %.0f MiB/s; "
               "cache / local %.2f (target >= 0.8)\n",
               (size_t)(bss[k] / KiB), rounds, l / rounds, cc / rounds, cc / l);
    }

    uint64_t *lns = malloc(sizeof *lns * qd1_writes), *cns = malloc(sizeof *cns * qd1_writes);
    if (!lns || !cns)
        die("out of memory");
    double lmed = 0, cmed = 0, lmean = 0, cmean = 0;
    uint64_t seed = 42;
    wait_drained();
    for (unsigned r = 0; r < rounds; r++) {
        struct lat L = {0, 0, 0}, C = {0, 0, 0};
        for (int side = 0; side < 2; side++) {
            bool cache = (side + r) % 2 == 1;
            uint64_t *ns = cache ? cns : lns;
            for (unsigned i = 0; i < qd1_writes; i++) {
                uint64_t off = (rng_next(&seed) % (qd1_span / 4096)) * 4096;
                ns[i] =
                    cache ? cache_qd1_one(v[writers], off, data) : local_qd1_one(&loc, off, data);
            }
            *(cache ? &C : &L) = lat_of(ns, qd1_writes);
        }
        printf("4 KiB QD1, round %u, median (mean, p99): local disk %.1f us (%.1f, %.1f), cache on "
               "%.1f us (%.1f, %.1f); cache / local %.2f (%.2f)\n",
               r + 1, L.median, L.mean, L.p99, C.median, C.mean, C.p99, C.median / L.median,
               C.mean / L.mean);
        fflush(stdout);
        lmed += L.median, cmed += C.median, lmean += L.mean, cmean += C.mean;
    }
    printf("4 KiB QD1, mean of %u rounds, median (mean): local disk %.1f us (%.1f), cache on %.1f "
           "us (%.1f); cache / local %.2f (%.2f) (target <= 1.2)\n",
           rounds, lmed / rounds, lmean / rounds, cmed / rounds, cmean / rounds, cmed / lmed,
           cmean / lmean);

    wait_drained();
    for (unsigned i = 0; i < g_nvdis; i++)
        if (plx_vdi_close(v[i]) < 0)
            die("closing VDI %s: %s", g_vdis[i], plx_store_errmsg(g_st));
    for (unsigned i = 0; i < g_nvdis; i++)
        if (plx_vdi_delete(g_st, g_vdis[i]) < 0)
            die("deleting VDI %s: %s", g_vdis[i], plx_store_errmsg(g_st));
    if (plx_store_close(g_st) < 0)
        die("closing the store");
    io_destroy(loc.ctx);
    close(loc.fd);
    unlink(local_path);
    unlink(log);
    free(data);
    free(lns);
    free(cns);
    return 0;
}
