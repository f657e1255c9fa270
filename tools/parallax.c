/*
 * parallax.c - the `parallax` administration command: global options and dispatch.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

struct command {
    const char *name;
    cmd_fn fn;
    const char *synopsis;
    const char *summary;
};

static const struct command commands[] = {
    {"format", cmd_format, "[--size SIZE] [--extent-size SIZE] [--force] [--preallocate]",
     "create a blockstore (a sparse file if absent; --preallocate: written through)"},
    {"info", cmd_info, "[--json]", "show the blockstore's geometry and usage"},
    {"upgrade", cmd_upgrade, "",
     "convert a blockstore of an older format version (stop every older process first)"},
    {"vdi-create", cmd_vdi_create, "NAME (--size SIZE | --from SNAP)",
     "create an empty VDI, or clone one from a snapshot"},
    {"vdi-delete", cmd_vdi_delete, "VDI", "delete a VDI and its snapshots"},
    {"vdi-snapshot", cmd_vdi_snapshot, "VDI [--label LABEL]", "snapshot a VDI"},
    {"vdi-list", cmd_vdi_list, "[--json] [--limit N] [--after VDI|ID]",
     "list VDIs in id order, a page at a time"},
    {"snap-list", cmd_snap_list, "VDI [--json] [--limit N] [--after N] [--newest-first]",
     "list a VDI's snapshots, a page at a time"},
    {"snap-label", cmd_snap_label, "SNAP LABEL", "set (or clear, with \"\") a snapshot's label"},
    {"vdi-tree", cmd_vdi_tree, "[--dot]", "draw VDIs, snapshots and clones as a forest"},
    {"vdi-import", cmd_vdi_import, "VDI FILE [--quiet]", "copy FILE (or - for stdin) into a VDI"},
    {"vdi-export", cmd_vdi_export, "VDI|SNAP FILE [--quiet]",
     "write a VDI or snapshot to FILE (or -)"},
    {"snap-delete", cmd_snap_delete, "SNAP", "delete a snapshot (gc frees what nothing else uses)"},
    {"gc", cmd_gc, "[--dry-run] [--json] [--quiet]",
     "free the blocks no live VDI or snapshot reaches"},
    {"check", cmd_check, "[--live] [--json] [--quiet]", "check the blockstore's consistency"},
    {"serve", cmd_serve,
     "(--unix PATH | --port N) [--ipaddr ADDR] [--cache SIZE] [--placement leaf|arrival]\n"
     "        [--tls=off|on|require] [--tls-certificates DIR] [--tls-psk FILE] [--tls-verify-peer]\n"
     "        [--write-cache PATH [--write-cache-size SIZE] [--write-cache-mode on|auto]\n"
     "        [--write-cache-threshold MS]]",
     "export every VDI and snapshot over NBD"},
    {"lockd-set", cmd_lockd_set, "HOST:PORT[,HOST:PORT...] | none",
     "name the lock managers that the hosts sharing this blockstore use"},
    {"lockd-status", cmd_lockd_status, "", "show the engines the lock manager sees"},
    {"cache", cmd_cache,
     "enable (VDI|--all) [--log PATH] [--size SIZE] | disable (VDI|--all) |\n"
     "        auto (VDI|--all) [--threshold MS] [--log PATH] [--size SIZE] | status [--json] |\n"
     "        discard VDI --force",
     "the write cache of the servers on this host"},
};
#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static int print_help(void)
{
    puts("usage: parallax [-b BLOCKSTORE] COMMAND [ARGS...]\n"
         "       parallax --help | --version\n"
         "\n"
         "Manage a Parallax blockstore and the virtual disk images (VDIs) in it.\n"
         "\n"
         "Commands:");
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        printf("  %-13s %s\n  %-13s   %s\n", commands[i].name, commands[i].synopsis, "",
               commands[i].summary);
    puts("\n"
         "  -b BLOCKSTORE  file, block device or iSCSI LUN holding the store (default:\n"
         "                 $PARALLAX_BLOCKSTORE, else the first line of " CLI_BLOCKSTORE_FILE ")\n"
         "  SIZE           bytes, or a number with K, M, G or T (powers of 1024), e.g. 4G\n"
         "  VDI            a VDI's name or decimal id\n"
         "  SNAP           VDI@N (the Nth snapshot, from 1) or VDI@LABEL\n"
         "\n"
         "Options may come before or after a command's arguments; 'parallax COMMAND --help'\n"
         "shows one command. Exit status: 0 success, 1 error, 2 usage error, 3 not run\n"
         "because another process uses the store (check without --live, format --force).");
    return fflush(stdout) == 0 ? EXIT_OK : EXIT_ERR;
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* `parallax help [COMMAND]` */
static int help_command(int argc, char **argv)
{
    if (argc < 2)
        return print_help();
    const struct command *c = find_command(argv[1]);
    if (c == NULL || argc > 2)
        return cli_usage_error(NULL, "help: unknown command '%s'", argv[1]);
    printf("usage: parallax [-b BLOCKSTORE] %s %s\n%s\n", c->name, c->synopsis, c->summary);
    return EXIT_OK;
}

/* Global options before the command. Returns the index of the command, or -1 with *rc set. */
static int parse_global(struct cli_ctx *ctx, int argc, char **argv, int *rc)
{
    int i = 1;

    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return i + 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *rc = print_help();
            return -1;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            /* The command and the library are one release: print the library's version. */
            unsigned v = plx_version();
            printf("parallax %u.%u.%u\n", v / 10000, v / 100 % 100, v % 100);
            *rc = EXIT_OK;
            return -1;
        }
        if (strcmp(a, "-b") == 0 || strcmp(a, "--blockstore") == 0) {
            if (++i >= argc) {
                *rc = cli_usage_error(NULL, "option '%s' needs a value", a);
                return -1;
            }
            ctx->blockstore = argv[i];
        } else if (strncmp(a, "-b", 2) == 0) {
            ctx->blockstore = a + 2;
        } else if (strncmp(a, "--blockstore=", 13) == 0) {
            ctx->blockstore = a + 13;
        } else {
            *rc = cli_usage_error(NULL, "unknown option '%s'", a);
            return -1;
        }
    }
    return i;
}

static int finish_stdout(int rc)
{
    /* A full disk or closed pipe on stdout must not pass for success. */
    if (fflush(stdout) != 0 || ferror(stdout))
        return rc != EXIT_OK ? rc : cli_error("writing to standard output failed");
    return rc;
}

int main(int argc, char **argv)
{
    struct cli_ctx ctx = {0};
    int rc = EXIT_OK;
    int i = parse_global(&ctx, argc, argv, &rc);

    if (i < 0)
        return finish_stdout(rc);
    if (i >= argc)
        return cli_usage_error(NULL, "no command given");
    if (strcmp(argv[i], "help") == 0)
        return finish_stdout(help_command(argc - i, argv + i));
    const struct command *c = find_command(argv[i]);
    if (c == NULL)
        return cli_usage_error(NULL, "unknown command '%s'", argv[i]);
    ctx.command = c->name;
    ctx.synopsis = c->synopsis;
    return finish_stdout(c->fn(&ctx, argc - i, argv + i));
}
