/*
 * bench/fua.c - FUA writes: what durable-on-completion writes cost, and how many device flushes
 * they need, in the engine and through the NBD server, against a raw file.
 *
 * 4 KiB random writes for a fixed time at queue depth 1 and 32 (--qd N: 1 and N, e.g. 8, what
 * tapdisk's NBD server keeps in flight), each with and without FUA, on:
 *   raw      a preallocated, fully written file through the file backend (libaio + O_DIRECT):
 *            FUA is RWF_DSYNC, i.e. a write plus a device flush for each write;
 *   engine   a fully written Parallax VDI in this process: the engine's own I/O is counted
 *            (flush commands it submitted, and writes it submitted with FUA), per 4 KiB write;
 *   nbd      the same VDI served by `parallax serve` over a unix socket, and the raw file served
 *            by qemu-storage-daemon (cache.direct=on, aio=native), driven by libnbd with
 *            NBD_CMD_FLAG_FUA or without; the device flushes per write are the block device's
 *            flush counter (/sys/dev/block/M:m/stat) over the run, so other traffic on that
 *            device counts too (the table says how much was written that this run did not).
 * The VDI and the file are written in full first, so writes overwrite (the steady state of a VM
 * disk); the order of the compared runs alternates over --repeat rounds; values are medians.
 *
 * Build: make build/bench-fua     Run: build/bench-fua [--dir DIR] [--quick] [--runtime S]
 *                                      [--rounds N] [--qd N] [--no-nbd]
 * --no-nbd: only the raw and engine rows (no parallax serve, qemu-storage-daemon or libnbd run).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libnbd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "parallax.h"

#define MiB (1024ull * 1024)
#define BLK 4096u
#define MAX_QD 32
#define MAX_ROUNDS 5

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench-fua: ");
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

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- The device under --dir: flush and write counters ---------------------------------------- */

static char dev_stat[64];

static void dev_counters(uint64_t *flushes, uint64_t *sectors_written)
{
    *flushes = *sectors_written = 0;
    FILE *f = fopen(dev_stat, "r");
    if (!f)
        return;
    unsigned long long v[17] = {0};
    int n = 0;
    while (n < 17 && fscanf(f, "%llu", &v[n]) == 1)
        n++;
    fclose(f);
    *sectors_written = v[6];
    *flushes = n >= 16 ? v[15] : 0; /* field 16: flush requests completed (Linux 5.5+) */
}

/* ---- Counting the I/O the engine (or the raw side) submits ------------------------------------ */

struct counter {
    plx_backend base;
    plx_backend *in;
    uint64_t writes, fua_writes, flushes;
};

static int count_submit(plx_backend *be, struct plx_io *io)
{
    struct counter *c = (struct counter *)be;
    int rc = c->in->ops->submit(c->in, io);
    if (rc == 0 && io->op == PLX_IO_WRITE) {
        c->writes++;
        c->fua_writes += (io->flags & PLX_IO_FUA) != 0;
    } else if (rc == 0 && io->op == PLX_IO_FLUSH) {
        c->flushes++;
    }
    return rc;
}
static int count_poll(plx_backend *be, int ms)
{
    struct counter *c = (struct counter *)be;
    return c->in->ops->poll(c->in, ms);
}
static int count_fd(const plx_backend *be)
{
    const struct counter *c = (const struct counter *)be;
    return c->in->ops->fd(c->in);
}
static unsigned count_inflight(const plx_backend *be)
{
    const struct counter *c = (const struct counter *)be;
    return c->in->ops->inflight(c->in);
}
static void count_destroy(plx_backend *be)
{
    struct counter *c = (struct counter *)be;
    c->in->ops->destroy(c->in);
    free(c);
}
static const struct plx_backend_ops count_ops = {
    .submit = count_submit,
    .poll = count_poll,
    .fd = count_fd,
    .inflight = count_inflight,
    .destroy = count_destroy,
};

static struct counter *counter_open(const char *path)
{
    char err[512];
    int e = 0;
    plx_backend *in = plx_backend_file_open(path, 0, &e, err, sizeof err);
    if (!in)
        die("opening %s: %s", path, err);
    struct counter *c = calloc(1, sizeof *c);
    if (!c)
        die("out of memory");
    c->base = *in;
    c->base.ops = &count_ops;
    c->in = in;
    return c;
}

/* ---- One measurement ---------------------------------------------------------------------------- */

struct result {
    double iops;
    double flushes_per_write;     /* flush commands (engine/raw: submitted; nbd: the device's) */
    double fua_per_write;         /* engine/raw: writes submitted with FUA per 4 KiB write */
    double foreign_mib;           /* nbd: MiB the device wrote beyond this run's 4 KiB writes */
};

struct writer {
    uint64_t size, rng;
    unsigned qd, inflight;
    int fua;
    uint64_t done;
    double until;
    uint8_t *buf; /* one 4 KiB block per slot */
    struct plx_io io[MAX_QD];
    int busy[MAX_QD];
    plx_vdi *v;
    plx_backend *be;
};

static uint64_t random_block(struct writer *w)
{
    return rng_next(&w->rng) % (w->size / BLK);
}

static void engine_done(void *arg, int status)
{
    struct writer *w = arg;
    if (status)
        die("engine write failed: %s", strerror(-status));
    w->inflight--;
    w->done++;
}

static void raw_done(struct plx_io *io, int status)
{
    struct writer *w = io->owner;
    if (status)
        die("raw write failed: %s", strerror(-status));
    w->busy[io - w->io] = 0;
    w->inflight--;
    w->done++;
}

static void writer_fill(struct writer *w, plx_store *st)
{
    while (now_s() < w->until) {
        while (w->inflight < w->qd) {
            uint8_t *b = w->buf + (size_t)(w->done % MAX_QD) * BLK;
            uint64_t blk = random_block(w);
            int rc;
            if (st) {
                rc = plx_vdi_submit_write(w->v, b, blk * BLK, BLK, w->fua ? PLX_WRITE_FUA : 0,
                                          engine_done, w);
            } else {
                struct plx_io *io = NULL;
                for (unsigned i = 0; i < MAX_QD && !io; i++)
                    if (!w->busy[i])
                        io = &w->io[i];
                if (!io)
                    die("no free slot");
                w->busy[io - w->io] = 1;
                memset(io, 0, sizeof *io);
                io->op = PLX_IO_WRITE;
                io->flags = w->fua ? PLX_IO_FUA : 0;
                io->block = blk;
                io->nblocks = 1;
                io->buf = b;
                io->done = raw_done;
                io->owner = w;
                rc = w->be->ops->submit(w->be, io);
            }
            if (rc)
                die("submit: %s", strerror(-rc));
            w->inflight++;
        }
        if (st) {
            int n = plx_store_service(st);
            if (n < 0)
                die("plx_store_service: %s", strerror(-n));
            if (n == 0) {
                struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
                poll(&p, 1, 100);
            }
        } else {
            w->be->ops->poll(w->be, -1);
        }
    }
    while (w->inflight) {
        if (st) {
            if (plx_store_service(st) == 0) {
                struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
                poll(&p, 1, 100);
            }
        } else {
            w->be->ops->poll(w->be, -1);
        }
    }
}

/* Random 4 KiB writes for `secs` on the engine (st, v) or the raw backend (be, counted by c). */
static struct result run_local(plx_store *st, plx_vdi *v, struct counter *c, uint64_t size,
                               unsigned qd, int fua, double secs, uint64_t seed)
{
    struct writer w = {.size = size, .rng = seed, .qd = qd, .fua = fua, .v = v, .be = &c->base};
    w.buf = aligned_alloc(BLK, (size_t)MAX_QD * BLK);
    memset(w.buf, 0x5a, (size_t)MAX_QD * BLK);
    uint64_t f0 = c->flushes, fw0 = c->fua_writes;
    double t0 = now_s();
    w.until = t0 + secs;
    writer_fill(&w, st);
    double t = now_s() - t0;
    free(w.buf);
    struct result r = {0};
    r.iops = (double)w.done / t;
    r.flushes_per_write = (double)(c->flushes - f0) / (double)w.done;
    r.fua_per_write = (double)(c->fua_writes - fw0) / (double)w.done;
    return r;
}

/* ---- NBD: libnbd client at QD 1 or 32 --------------------------------------------------------- */

struct nbd_ctx {
    uint64_t done;
};

static int nbd_written(void *user_data, int *error)
{
    struct nbd_ctx *n = user_data;
    if (*error)
        die("NBD write failed: %s", strerror(*error));
    n->done++;
    return 1;
}

static struct result run_nbd(const char *sock, const char *export, uint64_t size, unsigned qd,
                             int fua, double secs, uint64_t seed)
{
    struct nbd_handle *h = nbd_create();
    if (!h || nbd_set_export_name(h, export) == -1 || nbd_connect_unix(h, sock) == -1)
        die("libnbd: %s", nbd_get_error());
    if (fua && nbd_can_fua(h) != 1)
        die("%s does not offer FUA", sock);
    uint8_t *buf = aligned_alloc(BLK, BLK);
    memset(buf, 0xa5, BLK);
    struct nbd_ctx n = {0};
    uint64_t rng = seed, dflush0, dsec0, dflush1, dsec1;
    dev_counters(&dflush0, &dsec0);
    double t0 = now_s(), until = t0 + secs;
    while (now_s() < until || nbd_aio_in_flight(h) > 0) {
        while (now_s() < until && nbd_aio_in_flight(h) < (int)qd) {
            uint64_t off = (rng_next(&rng) % (size / BLK)) * BLK;
            nbd_completion_callback cb = {.callback = nbd_written, .user_data = &n};
            if (nbd_aio_pwrite(h, buf, BLK, off, cb, fua ? LIBNBD_CMD_FLAG_FUA : 0) == -1)
                die("nbd_aio_pwrite: %s", nbd_get_error());
        }
        if (nbd_poll(h, -1) == -1)
            die("nbd_poll: %s", nbd_get_error());
    }
    double t = now_s() - t0;
    dev_counters(&dflush1, &dsec1);
    nbd_shutdown(h, 0);
    nbd_close(h);
    free(buf);
    struct result r = {0};
    r.iops = (double)n.done / t;
    r.flushes_per_write = (double)(dflush1 - dflush0) / (double)n.done;
    double own = (double)n.done * BLK / 512.0;
    double dev = (double)(dsec1 - dsec0);
    r.foreign_mib = dev > own ? (dev - own) * 512.0 / MiB : 0;
    return r;
}

/* ---- Servers --------------------------------------------------------------------------------- */

static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static void wait_socket(const char *sock, pid_t pid)
{
    for (int i = 0; i < 200; i++) {
        struct stat sb;
        if (stat(sock, &sb) == 0 && S_ISSOCK(sb.st_mode))
            return;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            die("server for %s exited", sock);
        usleep(50000);
    }
    die("no socket %s after 10 s", sock);
}

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* ---- Main -------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

enum { S_RAW, S_ENGINE, S_NBD_RAW, S_NBD_PLX, SIDES };
static const char *const side_name[SIDES] = {"raw file (file backend)", "Parallax engine",
                                             "NBD: qemu-storage-daemon, raw file",
                                             "NBD: parallax serve"};

int main(int argc, char **argv)
{
    const char *dir = "/var/tmp", *parallax = "build/parallax";
    double secs = 5;
    unsigned rounds = 3;
    uint64_t size = 256 * MiB;
    unsigned qd_hi = 32;
    int no_nbd = 0;
    static const struct option lo[] = {{"dir", 1, 0, 'd'},      {"runtime", 1, 0, 't'},
                                       {"quick", 0, 0, 'q'},    {"rounds", 1, 0, 'r'},
                                       {"parallax", 1, 0, 'p'}, {"qd", 1, 0, 'Q'},
                                       {"no-nbd", 0, 0, 'N'},   {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'd': dir = optarg; break;
        case 't': secs = atof(optarg); break;
        case 'r': rounds = (unsigned)atoi(optarg); break;
        case 'p': parallax = optarg; break;
        case 'Q': qd_hi = (unsigned)atoi(optarg); break;
        case 'N': no_nbd = 1; break;
        case 'q':
            secs = 0.5;
            rounds = 1;
            size = 32 * MiB;
            break;
        default:
            fprintf(stderr, "usage: bench-fua [--dir DIR] [--runtime S] [--rounds N] [--quick] "
                            "[--parallax PATH] [--qd N] [--no-nbd]\n");
            return 2;
        }
    }
    if (secs <= 0 || rounds < 1 || rounds > MAX_ROUNDS || qd_hi < 2 || qd_hi > MAX_QD)
        die("--runtime > 0, --rounds 1..%d and --qd 2..%d", MAX_ROUNDS, MAX_QD);
    signal(SIGPIPE, SIG_IGN);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        die("%s: %s", dir, strerror(errno));
    snprintf(dev_stat, sizeof dev_stat, "/sys/dev/block/%u:%u/stat", major(sb.st_dev),
             minor(sb.st_dev));

    char tmp[4096], store[4200], raw[4200], sock[4200], qsock[4200], qmp[4200], log[4200],
        qlog[4200], run[4200];
    snprintf(tmp, sizeof tmp, "%s/bench-fua.XXXXXX", dir);
    if (!mkdtemp(tmp))
        die("mkdtemp %s: %s", tmp, strerror(errno));
    snprintf(store, sizeof store, "%s/store.img", tmp);
    snprintf(raw, sizeof raw, "%s/raw.img", tmp);
    snprintf(sock, sizeof sock, "%s/plx.sock", tmp);
    snprintf(qsock, sizeof qsock, "%s/qsd.sock", tmp);
    snprintf(qmp, sizeof qmp, "%s/qsd.qmp", tmp);
    snprintf(log, sizeof log, "%s/serve.log", tmp);
    snprintf(qlog, sizeof qlog, "%s/qsd.log", tmp);
    snprintf(run, sizeof run, "%s/run", tmp);
    setenv("PARALLAX_RUN_DIR", run, 1);

    /* The raw file and the VDI, both written in full. */
    char err[512];
    uint8_t *mib = aligned_alloc(BLK, MiB);
    memset(mib, 0x11, MiB);
    int fd = open(raw, O_RDWR | O_CREAT | O_TRUNC, 0644);
    for (uint64_t off = 0; fd >= 0 && off < size; off += MiB)
        if (pwrite(fd, mib, MiB, (off_t)off) != (ssize_t)MiB)
            die("writing %s: %s", raw, strerror(errno));
    if (fd < 0 || fsync(fd) != 0)
        die("%s: %s", raw, strerror(errno));
    close(fd);
    if (plx_format(store, size * 2 + 256 * MiB, 64 * MiB, 1, err, sizeof err) < 0)
        die("format: %s", err);
    struct counter *pc = counter_open(store);
    plx_store *st = NULL;
    if (plx_store_open_backend(&pc->base, NULL, &st, err, sizeof err) < 0)
        die("open: %s", err);
    plx_vdi *v = NULL;
    if (plx_vdi_create(st, "fua", size, NULL) < 0 || plx_vdi_open(st, "fua", 0, &v) < 0)
        die("VDI: %s", plx_store_errmsg(st));
    for (uint64_t off = 0; off < size; off += MiB)
        if (plx_vdi_pwrite(v, mib, off, MiB, 0) < 0)
            die("filling the VDI: %s", plx_store_errmsg(st));
    if (plx_vdi_flush(v) < 0)
        die("flush: %s", plx_store_errmsg(st));
    free(mib);
    struct counter *rc = counter_open(raw);

    /* res[side][qd index][fua][round] */
    static struct result res[SIDES][2][2][MAX_ROUNDS];
    const unsigned qds[2] = {1, qd_hi};
    fprintf(stderr, "bench-fua: %u rounds of %.1f s per run, %llu MiB, in %s\n", rounds, secs,
            (unsigned long long)(size / MiB), dir);
    for (unsigned k = 0; k < rounds; k++) {
        for (int q = 0; q < 2; q++)
            for (int f = 0; f < 2; f++) {
                uint64_t seed = 1000 * k + 10 * (unsigned)q + (unsigned)f;
                for (int side = 0; side < 2; side++) {
                    int s = (side + (int)k) % 2 ? S_RAW : S_ENGINE;
                    res[s][q][f][k] = s == S_RAW
                                          ? run_local(NULL, NULL, rc, size, qds[q], f, secs, seed)
                                          : run_local(st, v, pc, size, qds[q], f, secs, seed);
                }
            }
    }
    plx_vdi_close(v);
    if (plx_store_close(st) < 0)
        die("close");
    rc->base.ops->destroy(&rc->base);

    if (!no_nbd) {
        char *serve[] = {(char *)parallax, "-b", store, "serve", "--unix", sock, NULL};
        char blockdev[4400];
        snprintf(blockdev, sizeof blockdev,
                 "driver=file,node-name=f0,filename=%s,cache.direct=on,aio=native", raw);
        char nbdsrv[4400];
        snprintf(nbdsrv, sizeof nbdsrv, "addr.type=unix,addr.path=%s", qsock);
        char chardev[4400];
        snprintf(chardev, sizeof chardev, "socket,id=qmp,path=%s,server=on,wait=off", qmp);
        char *qsd[] = {"qemu-storage-daemon", "--blockdev", blockdev, "--blockdev",
                       "driver=raw,node-name=r0,file=f0", "--nbd-server", nbdsrv, "--export",
                       "type=nbd,id=e0,node-name=r0,name=v,writable=on", "--chardev", chardev,
                       "--monitor", "chardev=qmp", NULL};
        pid_t sp = spawn(serve, log);
        pid_t qp = spawn(qsd, qlog);
        wait_socket(sock, sp);
        wait_socket(qsock, qp);
        for (unsigned k = 0; k < rounds; k++)
            for (int q = 0; q < 2; q++)
                for (int f = 0; f < 2; f++) {
                    uint64_t seed = 7000 + 1000 * k + 10 * (unsigned)q + (unsigned)f;
                    for (int side = 0; side < 2; side++) {
                        int s = (side + (int)k) % 2 ? S_NBD_RAW : S_NBD_PLX;
                        res[s][q][f][k] = s == S_NBD_RAW
                                              ? run_nbd(qsock, "v", size, qds[q], f, secs, seed)
                                              : run_nbd(sock, "fua", size, qds[q], f, secs, seed);
                    }
                }
        stop(sp);
        stop(qp);
    }

    printf("FUA writes: 4 KiB random overwrites, %.1f s per run, median of %u rounds\n", secs,
           rounds);
    printf("%-36s %4s %4s %10s %8s %10s %8s %8s\n", "target", "QD", "FUA", "IOPS", "vs raw",
           "flush/wr", "FUA/wr", "other MiB");
    for (int s = 0; s < (no_nbd ? S_NBD_RAW : SIDES); s++)
        for (int q = 0; q < 2; q++)
            for (int f = 0; f < 2; f++) {
                double iops[MAX_ROUNDS], fl[MAX_ROUNDS], fu[MAX_ROUNDS], fm[MAX_ROUNDS],
                    ratio[MAX_ROUNDS];
                int base = s == S_ENGINE ? S_RAW : s == S_NBD_PLX ? S_NBD_RAW : s;
                for (unsigned k = 0; k < rounds; k++) {
                    iops[k] = res[s][q][f][k].iops;
                    fl[k] = res[s][q][f][k].flushes_per_write;
                    fu[k] = res[s][q][f][k].fua_per_write;
                    fm[k] = res[s][q][f][k].foreign_mib;
                    ratio[k] = res[s][q][f][k].iops / res[base][q][f][k].iops;
                }
                int nbd = s >= S_NBD_RAW;
                printf("%-36s %4u %4s %10.0f %8.2f %10.3f %8s %8.0f\n", side_name[s], qds[q],
                       f ? "on" : "off", median(iops, rounds), median(ratio, rounds),
                       median(fl, rounds), nbd ? "-" : (snprintf(err, sizeof err, "%.3f", median(fu, rounds)), err),
                       nbd ? median(fm, rounds) : 0.0);
            }
    printf("flush/wr: engine and raw rows: flush commands the process submitted per write; NBD "
           "rows: flushes the device %s completed per write (all processes).\n",
           dev_stat);

    unlink(store);
    unlink(raw);
    unlink(qsock); /* qemu-storage-daemon leaves its NBD socket behind */
    unlink(qmp);
    unlink(sock);
    unlink(log);
    unlink(qlog);
    rmdir(run);
    rmdir(tmp);
    return 0;
}
