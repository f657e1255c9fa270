/*
 * nbd_hold.c - hold many NBD connections open (for serve_memory.sh), with libnbd as the client.
 *
 *   nbd_hold SOCKET PREFIX COUNT
 *
 * Connects to exports PREFIX0 .. PREFIX<COUNT-1> on the Unix socket, one connection each, reads
 * 4 KiB from each (so the server has opened the VDI and cached a path of its tree), prints
 * "ready" on stdout, then keeps every connection open until stdin closes.
 */
#include <libnbd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: nbd_hold SOCKET PREFIX COUNT\n");
        return 2;
    }
    int count = atoi(argv[3]);
    struct nbd_handle **h = calloc((size_t)count, sizeof *h);
    static char buf[4096];
    for (int i = 0; i < count; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s%d", argv[2], i);
        h[i] = nbd_create();
        if (!h[i] || nbd_set_export_name(h[i], name) == -1 ||
            nbd_connect_unix(h[i], argv[1]) == -1 ||
            nbd_pread(h[i], buf, sizeof buf, (uint64_t)(i % 1000) * 65536, 0) == -1) {
            fprintf(stderr, "nbd_hold: %s: %s\n", name, nbd_get_error());
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    while (getchar() != EOF)
        ;
    for (int i = 0; i < count; i++)
        nbd_close(h[i]);
    free(h);
    return 0;
}
