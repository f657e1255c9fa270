/*
 * bench/bench_engine.h - what the rooms of the engine benchmark share (bench/engine.c describes
 * the benchmark; the Makefile's BENCH_ENGINE_SRCS lists its rooms): options, latency samples,
 * targets and timed runs, results, and the functions one room calls in another.
 */
#ifndef PLX_BENCH_ENGINE_H
#define PLX_BENCH_ENGINE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "parallax.h"

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

/* ---- Latency samples and accounting (engine_util.c) ------------------------------------------ */

struct lat {
    double *us;
    size_t n, cap;
};

struct lat_summary {
    size_t n;
    double mean, p50, p90, p99, max; /* microseconds */
};

/* Median, minimum and maximum of n values. */
struct spread {
    double med, min, max;
};

/* Timed runs whose share of foreign device traffic is noted (g_foreign). */
#define MAX_FOREIGN 256

/* ---- Targets and timed runs (engine_run.c) --------------------------------------------------- */

struct io_counts {
    uint64_t n[3]; /* by enum plx_io_op */
    uint64_t blocks[3];
};

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

/* ---- The benchmark's state (engine.c, engine_parts.c) ---------------------------------------- */

struct ctx {
    struct opts o;
    char raw_path[PATH_MAX];
    char store_path[PATH_MAX];
    char freq_path[PATH_MAX];
    struct target raw, plx;
    int plx_open;
    struct results res;
};

/* ---- Functions by room ----------------------------------------------------------------------- */

/* engine_util.c */
extern int g_keep;
void cleanup_files(void);
void bench_on_signal(int sig);
void track_path(const char *path);
void untrack_path(const char *path);
__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...);
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t bench_now_ns(void);
uint64_t splitmix64(uint64_t *state);
const char *fmt_bytes(uint64_t b, char *buf, size_t len);
void lat_add(struct lat *l, uint64_t ns);
int cmp_double(const void *a, const void *b);
struct lat_summary lat_summarize(const struct lat *l);
void lat_free(struct lat *l);
void lat_append(struct lat *dst, const struct lat *src);
double geomean(const double *v, unsigned n);
struct spread spread_of(const double *v, unsigned n);
uint64_t cpu_now_ns(void);
extern char g_dev_name[64];
void dev_init(const char *dir);
uint64_t dev_bytes(void);
extern double g_foreign[MAX_FOREIGN];
extern unsigned g_nforeign;
void foreign_note(uint64_t dev, uint64_t own);

/* engine_run.c */
extern int g_count_io;
void io_add(struct io_counts *sum, const struct io_counts *d);
void die_store(plx_store *st, int rc, const char *what);
void target_submit(struct target *t, struct slot *s);
int target_wait(struct target *t, uint64_t until);
void bench_raw_open(struct target *t, const char *path, uint64_t size);
void bench_raw_close(struct target *t);
plx_store *bench_store_open(const char *path, uint64_t cache_bytes);
void bench_store_close(plx_store *st);
void bench_target_open(struct target *t, const char *path, uint64_t cache_bytes, const char *vdi);
void bench_target_close(struct target *t);
void bench_store_format(const char *path, uint64_t size, int prefilled);
void bench_vdi_create(plx_store *st, const char *name, uint64_t size);
uint64_t metadata_blocks(plx_store *st, uint64_t *data_blocks);
void stamp(uint8_t *buf, uint64_t off, size_t len, uint64_t tag);
void fill_random(uint8_t *buf, size_t len, uint64_t seed);
extern uint64_t g_mismatches;
extern char g_first_mismatch[512];
void run_init(struct run *r, struct target *t, const struct workload *w);
void run_free(struct run *r);
void run_exec(struct run *r, double seconds);
double run_secs(const struct run *r);
double run_iops(const struct run *r);
double run_mibs(const struct run *r);
void run_workload(struct run *r, struct target *t, const struct workload *w, double seconds);
uint64_t one_write(struct target *t, struct slot *s, uint64_t off, uint64_t tag);
uint64_t bench_raw_flush(struct target *t);

/* engine_parts.c */
void setup_raw(struct ctx *c);
void setup_plx(struct ctx *c);
void bench_throughput(struct ctx *c);
void bench_write_latency(struct ctx *c);
void bench_snapshot_latency(struct ctx *c);
uint64_t freq_store_size(const struct opts *o);
void bench_snapshot_frequency(struct ctx *c);
void run_check(struct ctx *c);

/* engine_report.c */
void read_loadavg(char *buf, size_t len);
void machine_info(struct machine *m, const char *dir, const char *raw_path);
void print_report(const struct ctx *c);
void write_json(const struct ctx *c, const char *path);

#endif
