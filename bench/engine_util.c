/*
 * bench/engine_util.c - the engine benchmark's small utilities (bench/engine.c describes the
 * benchmark): the files it removes at exit, messages, clocks, latency samples and their summaries,
 * and the process's and the device's accounting.
 */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "bench_engine.h"

/* ---- Small utilities ------------------------------------------------------------------------ */

static char *g_paths[4]; /* files to remove on exit */
int g_keep;              /* --keep: leave them for inspection */

void cleanup_files(void)
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

void bench_on_signal(int sig)
{
    cleanup_files();
    signal(sig, SIG_DFL);
    raise(sig);
}

void track_path(const char *path)
{
    for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++) {
        if (g_paths[i] == NULL) {
            g_paths[i] = strdup(path);
            return;
        }
    }
}

void untrack_path(const char *path)
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

__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench-engine: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1); /* atexit removes the files */
}

void bench_progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  .. ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

const char *fmt_bytes(uint64_t b, char *buf, size_t len)
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

void lat_add(struct lat *l, uint64_t ns)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 1024;
        l->us = realloc(l->us, l->cap * sizeof *l->us);
        if (l->us == NULL)
            die("out of memory");
    }
    l->us[l->n++] = (double)ns / 1000.0;
}

int cmp_double(const void *a, const void *b)
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

struct lat_summary lat_summarize(const struct lat *l)
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

void lat_free(struct lat *l)
{
    free(l->us);
    memset(l, 0, sizeof *l);
}

void lat_append(struct lat *dst, const struct lat *src)
{
    for (size_t i = 0; i < src->n; i++)
        lat_add(dst, (uint64_t)(src->us[i] * 1000.0));
}

/* Geometric mean: for ratios of paired runs whose order alternates, so that a multiplicative
 * order effect cancels. */
double geomean(const double *v, unsigned n)
{
    double sum = 0;
    for (unsigned i = 0; i < n; i++)
        sum += log(v[i]);
    return n ? exp(sum / n) : 0;
}

struct spread spread_of(const double *v, unsigned n)
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

uint64_t cpu_now_ns(void)
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
char g_dev_name[64];

void dev_init(const char *dir)
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
uint64_t dev_bytes(void)
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
double g_foreign[MAX_FOREIGN];
unsigned g_nforeign;

void foreign_note(uint64_t dev, uint64_t own)
{
    if (!g_dev_found || dev == 0 || g_nforeign == MAX_FOREIGN)
        return;
    g_foreign[g_nforeign++] = dev > own ? (double)(dev - own) / (double)dev : 0;
}
