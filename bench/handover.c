/*
 * bench/handover.c - VDI handover latency between two hosts (bench/cluster.sh).
 *
 *   bench-handover URI-A URI-B COUNT
 *
 * URI-A and URI-B name one VDI served by two hosts (two `parallax serve` processes with their
 * own host ids). COUNT times, alternating the direction: write 4 KiB through the source, flush
 * and disconnect (the source closes the VDI and releases its lock); then connect to the
 * destination, retrying while it still refuses the VDI, and write 4 KiB. The latency is the
 * time from the source's disconnect to the destination's completed write, so it holds the
 * source's close, the destination's open (admin lock, lock record, fence checks) and the first
 * write. In each hop the destination reads back what the source wrote. Prints one line per hop
 * ("hop N ms M retries R") and a summary ("handover: p50 X ms p90 Y ms max Z ms"). Exit 0, or 1.
 */
#include <libnbd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static struct nbd_handle *open_uri(const char *uri)
{
    struct nbd_handle *h = nbd_create();
    if (h == NULL)
        return NULL;
    if (nbd_connect_uri(h, uri) == -1) {
        nbd_close(h);
        return NULL;
    }
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench-handover URI-A URI-B COUNT\n");
        return 2;
    }
    const char *uri[2] = {argv[1], argv[2]};
    int count = atoi(argv[3]);
    double *ms = calloc((size_t)count + 1, sizeof *ms);
    char buf[4096], back[4096];
    for (int i = 0; i < count; i++) {
        int src = i % 2, dst = !src;
        uint64_t off = (uint64_t)(i % 256) * sizeof buf;
        memset(buf, 'a' + i % 26, sizeof buf);
        struct nbd_handle *h = open_uri(uri[src]);
        if (h == NULL || nbd_pwrite(h, buf, sizeof buf, off, 0) == -1 || nbd_flush(h, 0) == -1) {
            fprintf(stderr, "hop %d: writing through the source: %s\n", i, nbd_get_error());
            return 1;
        }
        nbd_shutdown(h, 0);
        nbd_close(h);
        double t0 = now_ms();
        int retries = 0;
        while ((h = open_uri(uri[dst])) == NULL) {
            if (++retries > 20000) {
                fprintf(stderr, "hop %d: the destination never took the VDI: %s\n", i,
                        nbd_get_error());
                return 1;
            }
        }
        if (nbd_pwrite(h, buf, sizeof buf, off + 256 * sizeof buf, 0) == -1) {
            fprintf(stderr, "hop %d: first write on the destination: %s\n", i, nbd_get_error());
            return 1;
        }
        ms[i] = now_ms() - t0;
        if (nbd_pread(h, back, sizeof back, off, 0) == -1 || memcmp(back, buf, sizeof buf) != 0) {
            fprintf(stderr, "hop %d: the destination does not read what the source wrote\n", i);
            return 1;
        }
        nbd_flush(h, 0);
        nbd_shutdown(h, 0);
        nbd_close(h);
        printf("hop %d ms %.2f retries %d\n", i, ms[i], retries);
    }
    qsort(ms, (size_t)count, sizeof *ms, cmp_double);
    printf("handover: p50 %.1f ms p90 %.1f ms max %.1f ms (%d hops)\n", ms[count / 2],
           ms[count * 9 / 10], ms[count - 1], count);
    free(ms);
    return 0;
}
