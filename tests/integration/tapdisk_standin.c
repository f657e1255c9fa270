/*
 * tapdisk_standin.c - one tapdisk process serving one disk, for the integration tests that run
 * the block-parallax-tap hotplug script where blktap is not built (CI has no Xen headers or
 * blktap tree). It is the real driver (tapdisk/block-parallax.c, as the unit tests build it) on
 * the tapdisk test double's event loop (tests/unit/tapdisk_double.c); only tapdisk's NBD socket
 * is replaced: the guest's requests arrive as lines on stdin and their answers go to stdout.
 *
 *   tapdisk-standin [-R] PARAMS      PARAMS as tap-ctl passes them after "parallax:"
 *
 * Prints "open 0" (or "open -ERRNO") once td_open has returned, then serves, one line each:
 *
 *   write SECTOR COUNT BYTE   ->  "wrote SECTOR+COUNT STATUS"            (COUNT sectors of BYTE)
 *   read SECTOR COUNT BYTE    ->  "read SECTOR+COUNT 0 ok|mismatch" (expects BYTE),
 *                                  or "read SECTOR+COUNT -ERRNO"
 *   quit (or end of input)    ->  td_close, "closed STATUS", exit
 *
 * STATUS is 0 or -errno, printed when tapdisk would complete the request, so a request held by
 * the driver prints nothing until it is answered. The driver's log lines go to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tapdisk_double.h"

#define SEC 512

struct io {
    int op;
    unsigned long long sector;
    int count;
    int byte;
    unsigned char *buf;
};

static td_driver_t *drv;
static int quit;
static char line[4096];
static size_t got;

static void io_done(td_request_t treq, int status)
{
    struct io *io = treq.cb_data;
    if (io->op == TD_OP_WRITE) {
        printf("wrote %llu+%d %d\n", io->sector, io->count, status);
    } else if (status) {
        printf("read %llu+%d %d\n", io->sector, io->count, status);
    } else {
        int ok = 1;
        for (size_t i = 0; i < (size_t)io->count * SEC; i++)
            ok &= io->buf[i] == io->byte;
        printf("read %llu+%d 0 %s\n", io->sector, io->count, ok ? "ok" : "mismatch");
    }
    fflush(stdout);
    free(io->buf);
    free(io);
}

static void command(const char *cmd)
{
    char op[16];
    unsigned long long sector;
    int count, byte;
    if (strcmp(cmd, "quit") == 0) {
        quit = 1;
        return;
    }
    if (sscanf(cmd, "%15s %llu %d %i", op, &sector, &count, &byte) != 4 || count <= 0 ||
        (strcmp(op, "read") && strcmp(op, "write"))) {
        printf("bad command: %s\n", cmd);
        fflush(stdout);
        return;
    }
    struct io *io = calloc(1, sizeof *io);
    io->op = strcmp(op, "write") == 0 ? TD_OP_WRITE : TD_OP_READ;
    io->sector = sector;
    io->count = count;
    io->byte = byte & 0xff;
    io->buf = malloc((size_t)count * SEC);
    memset(io->buf, io->op == TD_OP_WRITE ? io->byte : 0, (size_t)count * SEC);
    td_request_t treq = tdd_request(io->op, io->buf, sector, count, io);
    treq.cb = io_done;
    if (io->op == TD_OP_WRITE)
        drv->ops->td_queue_write(drv, treq);
    else
        drv->ops->td_queue_read(drv, treq);
}

/* stdin is readable: run every complete line (tapdisk's loop runs this, as it would run its
 * NBD server's callback). */
static void input_ready(event_id_t id, char mode, void *private)
{
    ssize_t n = read(0, line + got, sizeof line - 1 - got);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        quit = 1;
        return;
    }
    got += (size_t)n;
    line[got] = 0;
    char *start = line, *nl;
    while ((nl = strchr(start, '\n'))) {
        *nl = 0;
        if (*start)
            command(start);
        start = nl + 1;
    }
    got = strlen(start);
    memmove(line, start, got + 1);
    if (got == sizeof line - 1)
        got = 0; /* an endless line: drop it */
}

int main(int argc, char **argv)
{
    td_flag_t flags = 0;
    int a = 1;
    if (a < argc && strcmp(argv[a], "-R") == 0) {
        flags |= TD_OPEN_RDONLY;
        a++;
    }
    if (a + 1 != argc) {
        fprintf(stderr, "usage: tapdisk-standin [-R] PARAMS\n");
        return 2;
    }
    drv = tdd_driver_new(&tapdisk_parallax, argv[a]);
    int rc = drv->ops->td_open(drv, argv[a], NULL, flags);
    printf("open %d\n", rc);
    fflush(stdout);
    if (rc != 0)
        return 1;
    event_id_t in =
        tapdisk_server_register_event(SCHEDULER_POLL_READ_FD, 0, TV_ZERO, input_ready, NULL);
    if (in < 0)
        return 1;
    while (!quit)
        tdd_fire_ready(100);
    tapdisk_server_unregister_event(in);
    rc = drv->ops->td_close(drv);
    printf("closed %d\n", rc);
    fflush(stdout);
    tdd_driver_free(drv);
    return 0;
}
