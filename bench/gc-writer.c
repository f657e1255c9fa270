/*
 * bench/gc-writer.c - the C side of bench/gc.sh (the garbage collector benchmark).
 *
 *   gc-writer populate STORE [--vdis N] [--vdi-size BYTES] [--snaps K] [--scatter B]
 *                            [--clones C] [--delete D]
 *       Build the collector's data set in one process, quickly (the collector's cost is in
 *       metadata, so a few MiB of data per VDI suffice): N VDIs (default 50 of 1 GiB); per VDI,
 *       K epochs (default 20) of B scattered 4 KiB writes (default 16) plus one 64 KiB run, all
 *       in flight together, each epoch ended by a snapshot in the request stream; then C clones
 *       (default 10) of snapshots, with a few writes each; then D VDIs deleted (default 5) and two
 *       snapshots deleted in each of D other VDIs, so the first collection has garbage to free.
 *       Prints what it made.
 *
 *   gc-writer write STORE --vdi NAME --seconds T [--size BYTES] [--depth Q]
 *       Create VDI NAME (default 32 GiB) and write it sequentially, from offset 0, in 1 MiB
 *       requests with Q in flight (default 4) for T seconds (wrapping at the end), then flush.
 *       Prints one line: "write: NAME MiB/s M bytes N seconds S".
 *
 * Deterministic: fixed seeds, fixed names (vdi-I, clone-I). Exit status 0, or 1 with a message.
 *
 * Build: bench/gc.sh builds it (by hand until the Makefile has these lines):
 *   bench-gc-writer: $(B)/bench-gc-writer
 *   $(B)/bench-gc-writer: bench/gc-writer.c $(B)/libparallax.a | builddeps
 *       $(CC) $(WARN) $(CFLAGS) $(INC) $< $(B)/libparallax.a $(LIBS) -o $@
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallax.h"
#include "size.h"

#define KiB (1024ull)
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define BS PLX_BLOCK_SIZE

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gc-writer: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void check(plx_store *st, int rc, const char *what)
{
    if (rc < 0)
        die("%s: %s (%d)", what, plx_store_errmsg(st), rc);
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A size argument (bytes, or with K, M, G or T), or the program stops. */
static uint64_t size_arg(const char *s)
{
    uint64_t v;
    if (plx_size_parse(s, &v) < 0)
        die("bad size %s", s);
    return v;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static plx_store *open_store(const char *path)
{
    struct plx_open_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    plx_store *st = NULL;
    char err[512] = "";
    int rc = plx_store_open(path, &o, &st, err, sizeof err);
    if (rc < 0)
        die("open %s: %s", path, err);
    return st;
}

/* ---- Completion counting --------------------------------------------------------------------- */

struct waitset {
    unsigned pending;
    int progress; /* set by every completion */
    int status;
};

static void done_cb(void *arg, int status)
{
    struct waitset *w = arg;
    if (status && !w->status)
        w->status = status;
    w->pending--;
    w->progress = 1;
}

/* Wait until at most `left` requests are in flight. */
static void wait_until(plx_store *st, struct waitset *w, unsigned left)
{
    while (w->pending > left) {
        w->progress = 0;
        check(st, plx_store_wait(st, &w->progress), "waiting for writes");
    }
    if (w->status)
        die("a write failed: %s (%d)", plx_store_errmsg(st), w->status);
}

static void wait_all(plx_store *st, struct waitset *w)
{
    wait_until(st, w, 0);
}

/* Fill a block with a stamp so it is never all zeros. */
static void stamp(uint8_t *blk, uint64_t a, uint64_t b)
{
    uint64_t s = a * 0x100000001b3ull ^ b;
    for (size_t i = 0; i < BS; i += 8) {
        uint64_t v = rnd(&s);
        memcpy(blk + i, &v, 8);
    }
}

/* ---- populate
 * ------------------------------------------------------------------------------------ */

static int cmd_populate(const char *path, int argc, char **argv)
{
    unsigned nvdis = 50, snaps = 20, scatter = 16, clones = 10, ndelete = 5;
    uint64_t vsize = GiB;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            die("%s needs a value", a);
        if (!strcmp(a, "--vdis"))
            nvdis = (unsigned)atoi(v);
        else if (!strcmp(a, "--vdi-size"))
            vsize = size_arg(v);
        else if (!strcmp(a, "--snaps"))
            snaps = (unsigned)atoi(v);
        else if (!strcmp(a, "--scatter"))
            scatter = (unsigned)atoi(v);
        else if (!strcmp(a, "--clones"))
            clones = (unsigned)atoi(v);
        else if (!strcmp(a, "--delete"))
            ndelete = (unsigned)atoi(v);
        else
            die("populate: unknown option %s", a);
        i++;
    }
    if (nvdis == 0 || snaps == 0 || 2 * ndelete > nvdis || scatter > 64)
        die("populate: bad counts");
    plx_store *st = open_store(path);
    uint64_t nb = vsize / BS, rng = 0x6763626e6368ull, written = 0;
    /* One buffer per request in flight: scatter single blocks plus one 16-block run. */
    uint8_t *bufs = aligned_alloc(BS, (size_t)(scatter + 16) * BS);
    if (!bufs)
        die("out of memory");
    double t0 = now();
    char name[64], spec[96];
    for (unsigned i = 0; i < nvdis; i++) {
        snprintf(name, sizeof name, "vdi-%u", i);
        check(st, plx_vdi_create(st, name, vsize, NULL), name);
        plx_vdi *v = NULL;
        check(st, plx_vdi_open(st, name, 0, &v), name);
        for (unsigned e = 0; e < snaps; e++) {
            struct waitset w = {0, 0, 0};
            for (unsigned k = 0; k < scatter; k++) {
                uint64_t vb = rnd(&rng) % nb;
                stamp(bufs + (size_t)k * BS, i * 1000003ull + e, vb);
                w.pending++;
                check(st,
                      plx_vdi_submit_write(v, bufs + (size_t)k * BS, vb * BS, BS, 0, done_cb, &w),
                      "write");
            }
            uint64_t run = (rnd(&rng) % (nb / 16)) * 16;
            for (unsigned k = 0; k < 16; k++)
                stamp(bufs + (size_t)(scatter + k) * BS, i * 1000003ull + e, run + k);
            w.pending++;
            check(st,
                  plx_vdi_submit_write(v, bufs + (size_t)scatter * BS, run * BS, 16 * BS, 0,
                                       done_cb, &w),
                  "write");
            wait_all(st, &w);
            written += (uint64_t)(scatter + 16) * BS;
            uint64_t idx = 0;
            check(st, plx_vdi_snapshot_open(v, NULL, &idx), "snapshot");
        }
        check(st, plx_vdi_close(v), "close");
    }
    for (unsigned c = 0; c < clones; c++) {
        unsigned src = (unsigned)(rnd(&rng) % nvdis);
        snprintf(spec, sizeof spec, "vdi-%u@%u", src, 1 + (unsigned)(rnd(&rng) % snaps));
        snprintf(name, sizeof name, "clone-%u", c);
        check(st, plx_vdi_clone(st, name, spec, NULL), name);
        plx_vdi *v = NULL;
        check(st, plx_vdi_open(st, name, 0, &v), name);
        struct waitset w = {0, 0, 0};
        for (unsigned k = 0; k < scatter; k++) {
            uint64_t vb = rnd(&rng) % nb;
            stamp(bufs + (size_t)k * BS, 7777777ull + c, vb);
            w.pending++;
            check(st, plx_vdi_submit_write(v, bufs + (size_t)k * BS, vb * BS, BS, 0, done_cb, &w),
                  "write");
        }
        wait_all(st, &w);
        written += (uint64_t)scatter * BS;
        check(st, plx_vdi_close(v), "close");
    }
    /* Garbage: whole VDIs from the end of the list, two snapshots in each of as many others. */
    for (unsigned d = 0; d < ndelete; d++) {
        snprintf(name, sizeof name, "vdi-%u", nvdis - 1 - d);
        check(st, plx_vdi_delete(st, name), name);
        for (unsigned k = 0; k < 2; k++) {
            snprintf(spec, sizeof spec, "vdi-%u@%u", d, 2 + k * (snaps / 2));
            if (2 + k * (snaps / 2) <= snaps)
                check(st, plx_snap_delete(st, spec), spec);
        }
    }
    double t = now() - t0;
    check(st, plx_store_close(st), "close store");
    free(bufs);
    printf("populate: %u VDIs of %llu MiB, %u snapshots each, %u clones; %u VDIs and %u "
           "snapshots deleted; %.1f MiB written in %.1f s\n",
           nvdis, (unsigned long long)(vsize / MiB), snaps, clones, ndelete, 2 * ndelete,
           (double)written / (double)MiB, t);
    return 0;
}

/* ---- write -------------------------------------------------------------------------------------
 */

static int cmd_write(const char *path, int argc, char **argv)
{
    const char *vdi = NULL;
    double seconds = 0;
    uint64_t vsize = 32 * GiB;
    unsigned depth = 4;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            die("%s needs a value", a);
        if (!strcmp(a, "--vdi"))
            vdi = v;
        else if (!strcmp(a, "--seconds"))
            seconds = atof(v);
        else if (!strcmp(a, "--size"))
            vsize = size_arg(v);
        else if (!strcmp(a, "--depth"))
            depth = (unsigned)atoi(v);
        else
            die("write: unknown option %s", a);
        i++;
    }
    if (!vdi || seconds <= 0 || depth == 0 || depth > 64 || vsize < MiB)
        die("write: need --vdi NAME and --seconds T (and 1 <= depth <= 64)");
    plx_store *st = open_store(path);
    check(st, plx_vdi_create(st, vdi, vsize, NULL), vdi);
    plx_vdi *v = NULL;
    check(st, plx_vdi_open(st, vdi, 0, &v), vdi);
    uint8_t *bufs = aligned_alloc(BS, (size_t)depth * MiB);
    if (!bufs)
        die("out of memory");
    /* Written once: requests in flight may share a buffer, it never changes. */
    for (size_t b = 0; b < (size_t)depth * MiB / BS; b++)
        stamp(bufs + b * BS, 42, b);
    struct waitset w = {0, 0, 0};
    uint64_t off = 0, bytes = 0;
    double t0 = now(), end = t0 + seconds;
    while (now() < end) {
        while (w.pending < depth) {
            w.pending++;
            check(st,
                  plx_vdi_submit_write(v, bufs + (size_t)(off / MiB % depth) * MiB, off, MiB, 0,
                                       done_cb, &w),
                  "write");
            off = (off + MiB) % (vsize / MiB * MiB);
            bytes += MiB;
        }
        wait_until(st, &w, depth - 1);
    }
    wait_all(st, &w);
    check(st, plx_vdi_flush(v), "flush");
    double t = now() - t0;
    check(st, plx_vdi_close(v), "close");
    check(st, plx_store_close(st), "close store");
    free(bufs);
    printf("write: %s MiB/s %.1f bytes %llu seconds %.2f\n", vdi, (double)bytes / (double)MiB / t,
           (unsigned long long)bytes, t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        die("usage: gc-writer populate STORE [options] | gc-writer write STORE --vdi NAME "
            "--seconds T [--size BYTES] [--depth Q]");
    if (!strcmp(argv[1], "populate"))
        return cmd_populate(argv[2], argc - 3, argv + 3);
    if (!strcmp(argv[1], "write"))
        return cmd_write(argv[2], argc - 3, argv + 3);
    die("unknown mode %s", argv[1]);
}
