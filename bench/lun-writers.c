/*
 * lun-writers.c - N raw writers on one iSCSI LUN, the baseline of the cluster benchmark's
 * 1 MiB aggregate (bench/cluster.sh, bench/README.md "Cluster").
 *
 *   bench-lun-writers URL N SECONDS START SPAN [BS-KiB] [QD]
 *
 * Forks N processes. Each opens the LUN through the iSCSI backend alone (its own session and
 * initiator name, iqn.2026-11.org.parallax:raw-I, as N Parallax hosts have), then, all at once,
 * writes sequentially at queue depth QD (default 8) in BS-KiB writes (default 1024) through its
 * own region of SPAN bytes starting at START + I * SPAN (wrapping inside it) for SECONDS, and
 * ends with a flush inside its time. Prints the aggregate "MIB_PER_S" (sum of the writers'
 * rates) on stdout, each writer's rate on stderr. No Parallax on top: what the target gives N
 * sessions writing N sequential streams into one LUN.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include "backend.h"

#define MAX_QD 32

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct writer {
    plx_backend *be;
    uint64_t first_block, span_blocks, next, bs_blocks;
    double deadline;
    unsigned inflight;
    uint64_t done_bytes, errors;
};

struct slot {
    struct plx_io io;
    struct writer *w;
};

static void issue(struct slot *s);

static void done(struct plx_io *io, int status)
{
    struct slot *s = io->owner;
    s->w->inflight--;
    if (status != 0)
        s->w->errors++;
    else if (io->op == PLX_IO_WRITE)
        s->w->done_bytes += (uint64_t)io->nblocks * PLX_BLOCK_SIZE;
    if (io->op == PLX_IO_WRITE && now_s() < s->w->deadline)
        issue(s);
}

static void issue(struct slot *s)
{
    struct writer *w = s->w;
    s->io.op = PLX_IO_WRITE;
    s->io.block = w->first_block + w->next;
    s->io.nblocks = (uint32_t)w->bs_blocks;
    s->io.done = done;
    s->io.owner = s;
    w->next = (w->next + w->bs_blocks) % (w->span_blocks - w->span_blocks % w->bs_blocks);
    if (w->be->ops->submit(w->be, &s->io) != 0) {
        fprintf(stderr, "bench-lun-writers: submit failed\n");
        exit(1);
    }
    w->inflight++;
}

static void drain(struct writer *w)
{
    while (w->inflight > 0)
        if (w->be->ops->poll(w->be, -1) < 0) {
            fprintf(stderr, "bench-lun-writers: poll failed\n");
            exit(1);
        }
}

static int run_writer(const char *url, int index, double seconds, uint64_t start, uint64_t span,
                      unsigned bs_kib, int qd, int ready_fd, int go_fd, int out_fd)
{
    char name[64];
    snprintf(name, sizeof(name), "iqn.2026-11.org.parallax:raw-%d", index);
    setenv("PARALLAX_ISCSI_INITIATOR", name, 1);
    char err[512];
    int e = 0;
    plx_backend *be = plx_backend_open(url, 0, &e, err, sizeof(err));
    if (be == NULL) {
        fprintf(stderr, "bench-lun-writers: %s\n", err);
        return 1;
    }
    struct writer w = {.be = be,
                       .first_block = (start + (uint64_t)index * span) / PLX_BLOCK_SIZE,
                       .span_blocks = span / PLX_BLOCK_SIZE,
                       .bs_blocks = bs_kib * 1024u / PLX_BLOCK_SIZE};
    if ((w.first_block + w.span_blocks) > be->nblocks) {
        fprintf(stderr, "bench-lun-writers: the LUN is too small for %d regions\n", index + 1);
        return 1;
    }
    struct slot slots[MAX_QD];
    char go = 'r';
    if (write(ready_fd, &go, 1) != 1 || read(go_fd, &go, 1) != 1) /* all start together */
        return 1;
    double t0 = now_s();
    w.deadline = t0 + seconds;
    for (int i = 0; i < qd; i++) {
        slots[i] = (struct slot){.w = &w};
        slots[i].io.buf = plx_block_alloc(w.bs_blocks);
        issue(&slots[i]);
    }
    drain(&w);
    struct slot f = {.w = &w};
    f.io = (struct plx_io){.op = PLX_IO_FLUSH, .done = done, .owner = &f};
    if (be->ops->submit(be, &f.io) != 0)
        return 1;
    w.inflight++;
    drain(&w);
    double mibs = (double)w.done_bytes / (1 << 20) / (now_s() - t0);
    be->ops->destroy(be);
    if (w.errors) {
        fprintf(stderr, "bench-lun-writers: writer %d: %llu I/O errors\n", index,
                (unsigned long long)w.errors);
        return 1;
    }
    fprintf(stderr, "writer %d: %.1f MiB/s\n", index, mibs);
    return write(out_fd, &mibs, sizeof(mibs)) == sizeof(mibs) ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: bench-lun-writers URL N SECONDS START SPAN [BS-KiB] [QD]\n");
        return 2;
    }
    int n = atoi(argv[2]);
    double seconds = atof(argv[3]);
    uint64_t start = strtoull(argv[4], NULL, 0), span = strtoull(argv[5], NULL, 0);
    unsigned bs_kib = argc > 6 ? (unsigned)atoi(argv[6]) : 1024;
    int qd = argc > 7 ? atoi(argv[7]) : 8;
    if (n < 1 || n > 64 || seconds <= 0 || qd < 1 || qd > MAX_QD || bs_kib < 4 || bs_kib % 4 ||
        span < (uint64_t)bs_kib * 1024) {
        fprintf(stderr, "bench-lun-writers: bad arguments\n");
        return 2;
    }
    int go[2], out[2], ready[2];
    if (pipe(go) != 0 || pipe(out) != 0 || pipe(ready) != 0)
        return 1;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            close(go[1]);
            close(out[0]);
            close(ready[0]);
            _exit(
                run_writer(argv[1], i, seconds, start, span, bs_kib, qd, ready[1], go[0], out[1]));
        }
    }
    close(go[0]);
    close(out[1]);
    close(ready[1]);
    char c;
    for (int i = 0; i < n; i++) /* every writer logged in before the clock starts */
        if (read(ready[0], &c, 1) != 1)
            break;
    for (int i = 0; i < n; i++)
        if (write(go[1], "g", 1) != 1)
            return 1;
    double total = 0, mibs;
    int got = 0;
    while (read(out[0], &mibs, sizeof(mibs)) == sizeof(mibs)) {
        total += mibs;
        got++;
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed || got != n) {
        fprintf(stderr, "bench-lun-writers: %d of %d writers failed\n", n - got, n);
        return 1;
    }
    printf("%.0f\n", total);
    return 0;
}
