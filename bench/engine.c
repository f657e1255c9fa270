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
 * This file holds the options and main; the benchmark's other rooms (bench_engine.h is what
 * they share): engine_util.c (cleanup, messages, clocks, latency samples, device accounting),
 * engine_run.c (targets, the I/O-counting backend, block stamps, timed runs), engine_parts.c
 * (setup and the four measurements, the check) and engine_report.c (machine, table, JSON).
 *
 * Build: make bench-engine     Run: build/bench-engine [--quick] [--dir DIR] [--json FILE] ...
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/statvfs.h>

#include "bench_engine.h"
#include "size.h"

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
    signal(SIGINT, bench_on_signal);
    signal(SIGTERM, bench_on_signal);
    signal(SIGHUP, bench_on_signal);

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
        bench_target_close(&c.plx);
        bench_raw_close(&c.raw);
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
