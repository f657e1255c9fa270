/*
 * cmd_lockd.c - `parallax lockd-set ADDR[,ADDR...]|none` and `parallax lockd-status`: which lock
 * manager the hosts sharing this blockstore use, and what it sees (docs/parallax.md).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

int cmd_lockd_set(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *addr = NULL;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &addr, 1, 1);

    /* Several lock managers (one active, the others standbys: parallax-lockd --store) are
     * given as one list, separated by commas; each engine tries them in turn. */
    if (rc == EXIT_OK && strcmp(addr, "none") != 0) {
        for (const char *p = addr; rc == EXIT_OK;) {
            size_t n = strcspn(p, ",");
            const char *colon = memchr(p, ':', n);
            if (colon == NULL || colon == p || colon + 1 == p + n)
                rc = cli_usage_error(ctx,
                                     "lock manager address '%s': give HOST:PORT (several "
                                     "separated by commas), or none",
                                     addr);
            if (p[n] == 0)
                break;
            p += n + 1;
        }
    }
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_store_set_lockd(st, strcmp(addr, "none") == 0 ? "" : addr);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

static void print_line(void *arg, const char *text)
{
    (void)arg;
    printf("%s\n", text);
}

int cmd_lockd_status(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_store_lockd_status(st, print_line, NULL);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}
