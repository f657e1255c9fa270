/*
 * scale.c - costs against the number of snapshots of one VDI (bench/README.md, "Scale").
 *
 * One VDI on a file blockstore (libaio, O_DIRECT) is snapshotted up to each count in
 * --counts (clean snapshots, a 4 KiB write before every 10th, submitted 32 at a time), and at
 * each count this measures, in the same run:
 *   snap_ms       a blocking snapshot of the open writer (mean of 20; they add to the count)
 *   lookup_ms     plx_snap_lookup "v@1" and "v@newest" (mean of 50 each)
 *   label_ms      plx_snap_lookup by label (every 10th snapshot N is labelled "lN"): the oldest
 *                 label "l1", the newest one, and a label nobody has (mean of 50 each)
 *   list_ms       plx_snap_list: the whole log, which is what every lookup and every writable
 *                 open read before skip links (the baseline)
 *   open_snap_ms  plx_vdi_open "v@1" read-only + close (the snapshot export's open), mean of 20
 *   open_rw_ms    plx_vdi_open "v" for writing + close, mean of 5
 *   label_snap_ms a labelled snapshot right after a writable open (mean of 5): the writer's
 *                 label check, which read the whole log (list_ms) before it used the label index
 *   iops          4 KiB random reads of the newest snapshot, 32 in flight, for 2 s, over the
 *                 16 MiB the benchmark wrote (the radix nodes stay cached; the data does not)
 *   iops_oldest   the same on VDI@1, right after: the baseline of the same moment (the machine
 *                 is shared, so a drop in both is the machine, not the snapshot count)
 * Output: one CSV line per count on stdout.
 *
 * --gc NODES: the collector's mark phase on scattered nodes instead. Eight VDIs of 64 GiB take
 * NODES random 4 KiB writes each, interleaved, so their leaf nodes interleave in the metadata
 * extents; seven are deleted, and `gc --dry-run` (which reads every live node, frees nothing)
 * runs 3 times: nodes read per second, and plx_check's time with 32 node reads in flight (the
 * default) and with one at a time (read_depth 1: the walk before it kept reads in flight, the
 * baseline of the same run), as CSV.
 *
 * --gc-seq LEAVES [--clones N]: the mark phase where the nodes are contiguous. A golden VDI of
 * LEAVES * 2 MiB is written whole (1 MiB writes, ascending), snapshotted, and cloned N times
 * (default 63); each clone takes one 4 KiB write per 2 MiB leaf span, in ascending order, so it
 * holds its own copy of every leaf (512 links each, 511 shared with the golden image) and its
 * leaves follow each other in the metadata extents (a parent node every 512 leaves). Then
 * `gc --dry-run` runs 3 times: nodes read, mark seconds, MiB/s of nodes read and the CPU time
 * of the whole collection (user + system), as CSV. The script (scale.sh) measures fio's
 * sequential 1 MiB reads on the same disk as the baseline.
 *
 * --vdis 1,100,...: costs against the number of VDIs in the store instead. VDIs of 1 GiB are
 * created up to each count, and at each count, in the same run:
 *   create_ms     plx_vdi_create of one more VDI (mean of 20; they add to the count)
 *   lookup_first_ms, lookup_last_ms   plx_vdi_lookup by name of the oldest and the newest VDI
 *                 (mean of 50 each)
 *   open_rw_ms    plx_vdi_open of the oldest VDI for writing + close (mean of 5)
 *   page_ms       plx_vdi_list_each: a page of 100 VDIs from the middle of the id range
 *   list_ms       plx_vdi_list: every record, which is what every lookup by name and every
 *                 create read in format version 1 (the baseline)
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "parallax.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* This process's CPU time, user + system. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void die(plx_store *st, int rc, const char *what)
{
    fprintf(stderr, "scale: %s: %d %s\n", what, rc, st ? plx_store_errmsg(st) : "");
    exit(1);
}

struct counter {
    unsigned done, failed;
};

static void snap_done(void *arg, int status)
{
    struct counter *c = arg;
    c->done++;
    c->failed += status != 0;
}

struct reader {
    plx_vdi *s;
    uint64_t state, done;
    char *buf;
};

static void read_done(void *arg, int status);

static void read_next(struct reader *r, char *buf)
{
    r->state = r->state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t off = ((r->state >> 33) % 4096) * 4096;
    if (plx_vdi_submit_read(r->s, buf, off, 4096, read_done, buf))
        exit(1);
}

static struct reader *the_reader;

static void read_done(void *arg, int status)
{
    if (status)
        exit(1);
    if (!the_reader)
        return;
    the_reader->done++;
    read_next(the_reader, arg);
}

/* 4 KiB random reads of snapshot `spec`, 32 in flight, for 2 s: IOPS. */
static double random_reads(plx_store *st, const char *spec)
{
    struct reader r = {.state = 42};
    int rc = plx_vdi_open(st, spec, PLX_OPEN_READONLY, &r.s);
    if (rc)
        die(st, rc, "open for reading");
    r.buf = aligned_alloc(4096, 32 * 4096);
    the_reader = &r;
    for (int i = 0; i < 32; i++)
        read_next(&r, r.buf + i * 4096);
    double t0 = now_ms(), t1;
    uint64_t d0 = 0;
    bool warm = false;
    for (;;) {
        rc = plx_store_service(st);
        if (rc < 0)
            die(st, rc, "service");
        t1 = now_ms();
        if (!warm && t1 - t0 > 300) {
            warm = true, t0 = t1, d0 = r.done;
        } else if (warm && t1 - t0 > 2000) {
            break;
        }
    }
    double iops = (double)(r.done - d0) / ((t1 - t0) / 1000);
    /* Let the reads in flight finish before closing: they resubmit, so stop them first. */
    the_reader = NULL;
    plx_vdi_close(r.s);
    free(r.buf);
    return iops;
}

/* Take snapshots until the VDI has `target`. */
static void grow(plx_store *st, plx_vdi *v, uint64_t *have, uint64_t target)
{
    static char buf[4096];
    static uint64_t idx[32];
    struct counter c = {0, 0};
    uint64_t want = target - *have, sent = 0;
    while (c.done < want) {
        while (sent < want && sent - c.done < 32) {
            if ((*have + sent) % 10 == 0) {
                memset(buf, (int)(sent & 0xff), sizeof buf);
                int rc = plx_vdi_pwrite(v, buf, ((*have + sent) % 4096) * 4096, sizeof buf, 0);
                if (rc)
                    die(st, rc, "write");
            }
            char label[32] = "";
            if ((*have + sent) % 10 == 0)
                snprintf(label, sizeof label, "l%llu", (unsigned long long)(*have + sent + 1));
            int rc = plx_vdi_submit_snapshot(v, label, &idx[sent % 32], snap_done, &c);
            if (rc)
                die(st, rc, "snapshot");
            sent++;
        }
        int rc = plx_store_service(st);
        if (rc < 0)
            die(st, rc, "service");
    }
    if (c.failed)
        die(st, -EIO, "a snapshot failed");
    *have = target;
}

static void write_done(void *arg, int status)
{
    struct counter *c = arg;
    c->done++;
    c->failed += status != 0;
}

/* Timestamps of the collector's steps: marking starts at the first "marking" step and ends at
 * the first "sweeping" one. */
struct gc_times {
    double mark_start, mark_end;
};

static void gc_progress(void *arg, const char *step, uint64_t done, uint64_t total)
{
    struct gc_times *t = arg;
    if (!t->mark_start && strncmp(step, "marking", 7) == 0)
        t->mark_start = now_ms();
    if (!t->mark_end && strncmp(step, "sweeping", 8) == 0)
        t->mark_end = now_ms();
}

static int gc_bench(plx_store *st, uint64_t nodes)
{
    enum { NV = 8 };
    plx_vdi *v[NV];
    char name[16];
    for (int i = 0; i < NV; i++) {
        snprintf(name, sizeof name, "g%d", i);
        int rc = plx_vdi_create(st, name, 64ull << 30, NULL);
        if (!rc)
            rc = plx_vdi_open(st, name, 0, &v[i]);
        if (rc)
            die(st, rc, "create");
    }
    char *buf = aligned_alloc(4096, 4096);
    memset(buf, 0x33, 4096);
    struct counter c = {0, 0};
    uint64_t sent = 0, total = nodes * NV, state = 7;
    while (c.done < total) {
        while (sent < total && sent - c.done < 64) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            /* one write per 2 MiB leaf span: each write is a new leaf */
            uint64_t off = ((state >> 20) % (32768)) * (2u << 20);
            int rc = plx_vdi_submit_write(v[sent % NV], buf, off, 4096, 0, write_done, &c);
            if (rc)
                die(st, rc, "write");
            sent++;
        }
        int rc = plx_store_service(st);
        if (rc < 0)
            die(st, rc, "service");
    }
    if (c.failed)
        die(st, -EIO, "a write failed");
    for (int i = 0; i < NV; i++)
        plx_vdi_close(v[i]);
    for (int i = 1; i < NV; i++) {
        snprintf(name, sizeof name, "g%d", i);
        int rc = plx_vdi_delete(st, name);
        if (rc)
            die(st, rc, "delete");
    }
    printf("run,metadata_read,gc_seconds,mark_seconds,mark_nodes_per_s,check_seconds,"
           "check_qd1_seconds\n");
    for (int run = 0; run < 3; run++) {
        struct plx_gc_report r;
        struct gc_times t = {0, 0};
        struct plx_gc_opts o = {
            .struct_size = sizeof o, .dry_run = 1, .progress = gc_progress, .progress_arg = &t};
        int rc = plx_gc_ex(st, &o, &r);
        if (rc)
            die(st, rc, "gc");
        double mark_s = (t.mark_end - t.mark_start) / 1000;
        struct plx_check_report cr;
        double check_s[2];
        for (int qd = 0; qd < 2; qd++) {
            struct plx_check_opts co = {.struct_size = sizeof co, .read_depth = qd ? 1 : 0};
            double t0 = now_ms();
            if ((rc = plx_check_ex(st, &co, &cr)) || cr.errors)
                die(st, rc ? rc : -EUCLEAN, "check");
            check_s[qd] = (now_ms() - t0) / 1000;
        }
        printf("%d,%llu,%.3f,%.3f,%.0f,%.3f,%.3f\n", run, (unsigned long long)r.metadata_read,
               r.seconds, mark_s, (double)r.metadata_read / mark_s, check_s[0], check_s[1]);
        fflush(stdout);
    }
    free(buf);
    plx_store_close(st);
    return 0;
}

/* Write `count` blocks of `len` bytes `step` apart from offset 0, in ascending order, `depth` in
 * flight: the leaf nodes are allocated in this order, so they follow each other on the store. */
static void write_ascending(plx_store *st, plx_vdi *v, const char *buf, uint64_t len, uint64_t step,
                            uint64_t count, uint64_t depth)
{
    struct counter c = {0, 0};
    uint64_t sent = 0;
    while (c.done < count) {
        while (sent < count && sent - c.done < depth) {
            int rc = plx_vdi_submit_write(v, buf, sent * step, len, 0, write_done, &c);
            if (rc)
                die(st, rc, "write");
            sent++;
        }
        int rc = plx_store_service(st);
        if (rc < 0)
            die(st, rc, "service");
    }
    if (c.failed)
        die(st, -EIO, "a write failed");
}

static int gc_seq_bench(plx_store *st, uint64_t leaves, uint64_t clones)
{
    char *buf = aligned_alloc(4096, 1 << 20);
    memset(buf, 0x44, 1 << 20);
    plx_vdi *v;
    int rc = plx_vdi_create(st, "gold", leaves * (2ull << 20), NULL);
    if (!rc)
        rc = plx_vdi_open(st, "gold", 0, &v);
    if (rc)
        die(st, rc, "create");
    write_ascending(st, v, buf, 1 << 20, 1 << 20, leaves * 2, 8);
    plx_vdi_close(v);
    uint64_t idx = 0;
    if ((rc = plx_vdi_snapshot(st, "gold", NULL, &idx)))
        die(st, rc, "snapshot");
    char snap[32], name[32];
    snprintf(snap, sizeof snap, "gold@%llu", (unsigned long long)idx);
    for (uint64_t i = 0; i < clones; i++) {
        snprintf(name, sizeof name, "c%llu", (unsigned long long)i);
        rc = plx_vdi_clone(st, name, snap, NULL);
        if (!rc)
            rc = plx_vdi_open(st, name, 0, &v);
        if (rc)
            die(st, rc, "clone");
        /* one 4 KiB write per leaf span: the clone's own copy of every leaf (512 links) */
        write_ascending(st, v, buf, 4096, 2u << 20, leaves, 64);
        plx_vdi_close(v);
    }
    free(buf);
    printf("run,metadata_read,gc_seconds,mark_seconds,mark_nodes_per_s,mark_mib_per_s,"
           "gc_cpu_seconds\n");
    for (int run = 0; run < 3; run++) {
        struct plx_gc_report r;
        struct gc_times t = {0, 0};
        struct plx_gc_opts o = {
            .struct_size = sizeof o, .dry_run = 1, .progress = gc_progress, .progress_arg = &t};
        double cpu0 = cpu_seconds();
        rc = plx_gc_ex(st, &o, &r);
        if (rc)
            die(st, rc, "gc");
        double cpu = cpu_seconds() - cpu0;
        double mark_s = (t.mark_end - t.mark_start) / 1000;
        printf("%d,%llu,%.3f,%.3f,%.0f,%.1f,%.3f\n", run, (unsigned long long)r.metadata_read,
               r.seconds, mark_s, (double)r.metadata_read / mark_s,
               (double)r.metadata_read * 4096 / (1 << 20) / mark_s, cpu);
        fflush(stdout);
    }
    plx_store_close(st);
    return 0;
}

static void vdi_name(uint64_t i, char *buf, size_t len)
{
    snprintf(buf, len, "vm-%07llu", (unsigned long long)i);
}

struct page {
    unsigned n, want;
};

static int page_one(void *arg, const struct plx_vdi_info *info)
{
    struct page *p = arg;
    (void)info;
    return ++p->n == p->want;
}

static int vdis_bench(plx_store *st, const char *counts)
{
    char name[32];
    uint64_t have = 0;
    int rc;
    printf("vdis,create_ms,lookup_first_ms,lookup_last_ms,open_rw_ms,page_ms,list_ms\n");
    char *list = strdup(counts);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t target = strtoull(tok, NULL, 10);
        double t0 = now_ms();
        while (have + 20 < target) {
            vdi_name(have++, name, sizeof name);
            if ((rc = plx_vdi_create(st, name, 1ull << 30, NULL)))
                die(st, rc, name);
        }
        fprintf(stderr, "scale: %llu VDIs made in %.1f s\n", (unsigned long long)have,
                (now_ms() - t0) / 1e3);
        t0 = now_ms();
        unsigned made = 0;
        while (have < target || made < 20) {
            vdi_name(have++, name, sizeof name);
            if ((rc = plx_vdi_create(st, name, 1ull << 30, NULL)))
                die(st, rc, name);
            made++;
        }
        double create_ms = (now_ms() - t0) / made;
        struct plx_vdi_info vi;
        char first[32], last[32];
        vdi_name(0, first, sizeof first);
        vdi_name(have - 1, last, sizeof last);
        t0 = now_ms();
        for (int i = 0; i < 50; i++)
            if ((rc = plx_vdi_lookup(st, first, &vi)))
                die(st, rc, first);
        double lookup_first = (now_ms() - t0) / 50;
        t0 = now_ms();
        for (int i = 0; i < 50; i++)
            if ((rc = plx_vdi_lookup(st, last, &vi)))
                die(st, rc, last);
        double lookup_last = (now_ms() - t0) / 50;
        t0 = now_ms();
        for (int i = 0; i < 5; i++) {
            plx_vdi *v;
            if ((rc = plx_vdi_open(st, first, 0, &v)))
                die(st, rc, "open");
            if ((rc = plx_vdi_close(v)))
                die(st, rc, "close");
        }
        double open_rw = (now_ms() - t0) / 5;
        struct page p = {0, 100};
        t0 = now_ms();
        rc = plx_vdi_list_each(st, have / 2, page_one, &p);
        if (rc < 0)
            die(st, rc, "page");
        double page_ms = now_ms() - t0;
        t0 = now_ms();
        struct plx_vdi_info *all;
        size_t n;
        if ((rc = plx_vdi_list(st, &all, &n)))
            die(st, rc, "list");
        free(all);
        double list_ms = now_ms() - t0;
        printf("%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f\n", (unsigned long long)have, create_ms,
               lookup_first, lookup_last, open_rw, page_ms, list_ms);
        fflush(stdout);
    }
    free(list);
    return plx_store_close(st) ? 1 : 0;
}

int main(int argc, char **argv)
{
    uint64_t gc_nodes = 0, gc_seq = 0, clones = 63;
    const char *vdi_counts = NULL;
    const char *path = NULL;
    const char *counts = "1,10,100,1000,10000,100000";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "--counts") == 0 && i + 1 < argc)
            counts = argv[++i];
        else if (strcmp(argv[i], "--gc") == 0 && i + 1 < argc)
            gc_nodes = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gc-seq") == 0 && i + 1 < argc)
            gc_seq = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--clones") == 0 && i + 1 < argc)
            clones = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--vdis") == 0 && i + 1 < argc)
            vdi_counts = argv[++i];
        else {
            fprintf(stderr, "usage: bench-scale --store FILE [--counts 1,10,... | --gc NODES | "
                            "--gc-seq LEAVES [--clones N] | --vdis 1,100,...]\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "bench-scale: --store FILE is required\n");
        return 2;
    }
    char err[512];
    /* 8 GiB, or room for --gc-seq's data and nodes with a quarter to spare */
    uint64_t size = 8ull << 30, need = gc_seq * ((2ull << 20) + 4096 + clones * 8192);
    if (need + need / 4 > size)
        size = (need + need / 4 + (1ull << 30) - 1) & ~((1ull << 30) - 1);
    int rc = plx_format(path, size, 0, 1, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench-scale: format %s: %s\n", path, err);
        return 1;
    }
    plx_store *st;
    struct plx_open_opts o = {.struct_size = sizeof o};
    rc = plx_store_open(path, &o, &st, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench-scale: open %s: %s\n", path, err);
        return 1;
    }
    if (gc_nodes)
        return gc_bench(st, gc_nodes);
    if (gc_seq)
        return gc_seq_bench(st, gc_seq, clones);
    if (vdi_counts)
        return vdis_bench(st, vdi_counts);
    rc = plx_vdi_create(st, "v", 16ull << 30, NULL);
    if (rc)
        die(st, rc, "create");
    plx_vdi *v;
    rc = plx_vdi_open(st, "v", 0, &v);
    if (rc)
        die(st, rc, "open");
    /* Fill the 16 MiB the random reads cover, so that they reach the medium. */
    char *fill = aligned_alloc(4096, 1 << 20);
    memset(fill, 0x5a, 1 << 20);
    for (uint64_t off = 0; off < (16u << 20); off += 1 << 20)
        if ((rc = plx_vdi_pwrite(v, fill, off, 1 << 20, 0)))
            die(st, rc, "fill");
    free(fill);
    printf("snapshots,snap_ms,lookup_oldest_ms,lookup_newest_ms,list_ms,open_snap_ms,"
           "open_rw_ms,iops,iops_oldest,label_oldest_ms,label_newest_ms,label_missing_ms,"
           "label_snap_ms\n");
    uint64_t have = 0;
    char *list = strdup(counts);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t target = strtoull(tok, NULL, 10);
        if (target > have)
            grow(st, v, &have, target);
        char spec_old[64], spec_new[64];
        snprintf(spec_old, sizeof spec_old, "v@1");
        snprintf(spec_new, sizeof spec_new, "v@%llu", (unsigned long long)have);
        struct plx_snap_info si;
        double t0 = now_ms();
        for (int i = 0; i < 50; i++)
            if ((rc = plx_snap_lookup(st, spec_old, &si)))
                die(st, rc, spec_old);
        double lookup_old = (now_ms() - t0) / 50;
        t0 = now_ms();
        for (int i = 0; i < 50; i++)
            if ((rc = plx_snap_lookup(st, spec_new, &si)))
                die(st, rc, spec_new);
        double lookup_new = (now_ms() - t0) / 50;
        /* Labels: "l1", the newest "lN" (N = 10k + 1), and one nobody has. */
        double label_ms[3];
        for (int k = 0; k < 3; k++) {
            char spec[64];
            uint64_t newest = (have - 1) / 10 * 10 + 1;
            if (k == 2)
                snprintf(spec, sizeof spec, "v@nosuch");
            else
                snprintf(spec, sizeof spec, "v@l%llu", (unsigned long long)(k ? newest : 1));
            t0 = now_ms();
            for (int i = 0; i < 50; i++) {
                rc = plx_snap_lookup(st, spec, &si);
                if (rc != (k == 2 ? -ENOENT : 0))
                    die(st, rc, spec);
            }
            label_ms[k] = (now_ms() - t0) / 50;
        }
        struct plx_vdi_info vi;
        if ((rc = plx_vdi_lookup(st, "v", &vi)))
            die(st, rc, "lookup v");
        int reps = have > 20000 ? 3 : 10;
        t0 = now_ms();
        for (int i = 0; i < reps; i++) {
            struct plx_snap_info *all;
            size_t n;
            if ((rc = plx_snap_list(st, vi.id, &all, &n)))
                die(st, rc, "list");
            free(all);
        }
        double list_ms = (now_ms() - t0) / reps;
        t0 = now_ms();
        for (int i = 0; i < 20; i++) {
            plx_vdi *s;
            if ((rc = plx_vdi_open(st, spec_old, PLX_OPEN_READONLY, &s)))
                die(st, rc, "open snapshot");
            plx_vdi_close(s);
        }
        double open_snap = (now_ms() - t0) / 20;
        if ((rc = plx_vdi_close(v)))
            die(st, rc, "close");
        t0 = now_ms();
        for (int i = 0; i < 5; i++) {
            if ((rc = plx_vdi_open(st, "v", 0, &v)))
                die(st, rc, "open writable");
            if (i < 4 && (rc = plx_vdi_close(v)))
                die(st, rc, "close");
        }
        double open_rw = (now_ms() - t0) / 5;
        t0 = now_ms();
        for (int i = 0; i < 20; i++) {
            uint64_t idx;
            char label[32] = ""; /* every 10th labelled, as grow() does */
            if ((have + (uint64_t)i) % 10 == 0)
                snprintf(label, sizeof label, "l%llu", (unsigned long long)(have + i + 1));
            if ((rc = plx_vdi_snapshot_open(v, label, &idx)))
                die(st, rc, "snapshot");
        }
        double snap = (now_ms() - t0) / 20;
        have += 20;
        /* A labelled snapshot right after a writable open: its label check read the whole log
         * (list_ms) before the writer looked labels up in the index. Mean of 5, each after a
         * close and open (untimed); labelled "lN" like every 10th of grow(). */
        double label_snap = 0;
        for (int i = 0; i < 5; i++) {
            if ((rc = plx_vdi_close(v)) || (rc = plx_vdi_open(st, "v", 0, &v)))
                die(st, rc, "reopen");
            uint64_t idx;
            char label[32];
            snprintf(label, sizeof label, "l%llu", (unsigned long long)(have + 1));
            t0 = now_ms();
            if ((rc = plx_vdi_snapshot_open(v, label, &idx)))
                die(st, rc, "labelled snapshot");
            label_snap += now_ms() - t0;
            have++;
        }
        label_snap /= 5;
        snprintf(spec_new, sizeof spec_new, "v@%llu", (unsigned long long)have);
        double iops = random_reads(st, spec_new);
        double iops_oldest = random_reads(st, spec_old);
        printf("%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.0f,%.0f,%.3f,%.3f,%.3f,%.3f\n",
               (unsigned long long)target, snap, lookup_old, lookup_new, list_ms, open_snap,
               open_rw, iops, iops_oldest, label_ms[0], label_ms[1], label_ms[2], label_snap);
        fflush(stdout);
    }
    free(list);
    /* check of the whole history, with 32 node reads in flight and with one at a time. */
    struct plx_check_report r;
    for (int qd = 0; qd < 2; qd++) {
        struct plx_check_opts co = {.struct_size = sizeof co, .read_depth = qd ? 1 : 0};
        double t0 = now_ms();
        if ((rc = plx_check_ex(st, &co, &r)))
            die(st, rc, "check");
        fprintf(stderr, "bench-scale: check of %llu snapshots (%s): %llu errors, %.0f ms\n",
                (unsigned long long)r.snapshots, qd ? "one read at a time" : "32 reads in flight",
                (unsigned long long)r.errors, now_ms() - t0);
    }
    plx_vdi_close(v);
    plx_store_close(st);
    return r.errors ? 1 : 0;
}
