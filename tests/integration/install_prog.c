/*
 * install_prog.c - a program outside the tree, built by tests/integration/install.sh and
 * deb_package.sh against an installed libparallax through its pkg-config file: it may only use
 * the public headers. Formats a blockstore, creates a VDI, writes, reads back after reopening
 * through a backend of its own stacked on the store's (parallax_backend.h: it counts the writes),
 * checks the store, and prints the library version.
 *
 *   install_prog STORE    exit 0 and "ok VERSION" when everything worked
 *   install_prog STORE old    the same, built against an older header than the library's (a
 *                         library of a later minor version will do): install.sh builds it
 *                         against API 1.7's parallax_backend.h, whose struct plx_backend_ops
 *                         ends at lock, and its symbol versions (tests/integration/abi-1.7/)
 */
#include <parallax.h>
#include <parallax_backend.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A stacked backend of this program's own: forwards everything, counts what it submits. Its ops
 * are followed by a pattern the library must neither change (the forwarding ops of the header's
 * version fill the struct as this program knows it) nor take for operations (the library reads
 * what lies past lock only from a program whose header has it). */
#define GUARD 0xa5
static struct {
    struct plx_backend_ops ops;
    unsigned char after[256];
} count;
#define count_ops count.ops
static int (*lower_submit)(plx_backend *be, struct plx_io *io);
static unsigned long submitted;

static int count_submit(plx_backend *be, struct plx_io *io)
{
    submitted++;
    return lower_submit(be, io);
}

static int fail(const char *what, plx_store *st, int rc)
{
    fprintf(stderr, "install_prog: %s failed (%d): %s\n", what, rc, st ? plx_store_errmsg(st) : "");
    return 1;
}

int main(int argc, char **argv)
{
    char err[256], buf[4096];
    plx_store *st = NULL;
    plx_vdi *v = NULL;
    uint64_t id;
    int rc;

    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "old") == 0))
        return 2;
    int old = argc == 3;
    memset(count.after, GUARD, sizeof count.after);
    if (old ? plx_version() / 10000 != PLX_API_VERSION / 10000 || plx_version() < PLX_API_VERSION
            : plx_version() != PLX_API_VERSION) {
        fprintf(stderr, "install_prog: header says %u, library says %u\n", PLX_API_VERSION,
                plx_version());
        return 1;
    }
    if ((rc = plx_format(argv[1], 64u << 20, 1u << 20, 0, err, sizeof err)) < 0) {
        fprintf(stderr, "install_prog: format: %s\n", err);
        return 1;
    }
    if ((rc = plx_store_open(argv[1], NULL, &st, err, sizeof err)) < 0) {
        fprintf(stderr, "install_prog: open: %s\n", err);
        return 1;
    }
    if ((rc = plx_vdi_create(st, "disk", 8u << 20, &id)) < 0)
        return fail("vdi_create", st, rc);
    if ((rc = plx_vdi_open(st, "disk", 0, &v)) < 0)
        return fail("vdi_open", st, rc);
    memset(buf, 'p', sizeof buf);
    if ((rc = plx_vdi_pwrite(v, buf, 12288, sizeof buf, PLX_WRITE_FUA)) < 0)
        return fail("pwrite", st, rc);
    if ((rc = plx_vdi_close(v)) < 0 || (rc = plx_store_close(st)) < 0)
        return fail("close", st, rc);

    /* Reopen read-only through the counting backend stacked on the store's own: the data and a
     * clean check are what the library promised. */
    int berr = 0;
    plx_backend *lower = plx_backend_open(argv[1], PLX_BACKEND_RDONLY, &berr, err, sizeof err);
    struct plx_backend_stack *top = calloc(1, sizeof *top);
    if (!lower || !top) {
        fprintf(stderr, "install_prog: backend: %s\n", err);
        return 1;
    }
    plx_backend_stack_forward_ops(&count_ops);
    for (size_t i = 0; i < sizeof count.after; i++)
        if (count.after[i] != GUARD) {
            fprintf(stderr, "install_prog: plx_backend_stack_forward_ops wrote past the ops\n");
            return 1;
        }
    lower_submit = count_ops.submit;
    count_ops.submit = count_submit;
    plx_backend_stack_init(top, &count_ops, lower, 1, "counter");
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1};
    if ((rc = plx_store_open_backend(&top->base, &o, &st, err, sizeof err)) < 0) {
        fprintf(stderr, "install_prog: reopen: %s\n", err);
        return 1;
    }
    if ((rc = plx_vdi_open(st, "disk", PLX_OPEN_READONLY, &v)) < 0)
        return fail("vdi_open read-only", st, rc);
    memset(buf, 0, sizeof buf);
    if ((rc = plx_vdi_pread(v, buf, 12288, sizeof buf)) < 0)
        return fail("pread", st, rc);
    if (buf[0] != 'p' || buf[sizeof buf - 1] != 'p') {
        fprintf(stderr, "install_prog: read back the wrong data\n");
        return 1;
    }
    plx_vdi_close(v);
    struct plx_check_report r;
    struct plx_check_opts co = {.struct_size = sizeof co};
    if ((rc = plx_check_ex(st, &co, &r)) < 0)
        return fail("check", st, rc);
    if (r.errors != 0 || r.trees != 1) {
        fprintf(stderr, "install_prog: check: %llu errors, %llu trees\n",
                (unsigned long long)r.errors, (unsigned long long)r.trees);
        return 1;
    }
    if ((rc = plx_store_close(st)) < 0)
        return fail("close", NULL, rc);
    if (submitted == 0) {
        fprintf(stderr, "install_prog: nothing went through the stacked backend\n");
        return 1;
    }
    printf("ok %u\n", plx_version());
    return 0;
}
