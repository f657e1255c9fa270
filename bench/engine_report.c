/*
 * bench/engine_report.c - the engine benchmark's report (bench/engine.c): the machine it ran
 * on, the printed table against the targets, and the same numbers as JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/statfs.h>
#include <sys/utsname.h>

#include "bench_engine.h"

void read_loadavg(char *buf, size_t len)
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

void machine_info(struct machine *m, const char *dir, const char *raw_path)
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
            bench_raw_open(&t, probe, 1 * MiB);
            if (strstr(t.be->desc, "buffered") != NULL)
                snprintf(m->io_mode, sizeof m->io_mode, "libaio, buffered (O_DIRECT refused)");
            bench_raw_close(&t);
        }
        unlink(probe);
    }
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

void print_report(const struct ctx *c)
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

void write_json(const struct ctx *c, const char *path)
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
