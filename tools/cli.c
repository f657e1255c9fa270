#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"

#define CLI_MSG_MAX 4096

/* Messages may quote file names or engine text; keep them to the promised single line. */
static void print_one_line(const char *fmt, va_list ap)
{
    char msg[CLI_MSG_MAX];

    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *p = msg; *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fprintf(stderr, "parallax: %s\n", msg);
}

int cli_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    print_one_line(fmt, ap);
    va_end(ap);
    return EXIT_ERR;
}

int cli_usage_error(const struct cli_ctx *ctx, const char *fmt, ...)
{
    char msg[CLI_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx != NULL && ctx->command != NULL)
        cli_error("%s: %s", ctx->command, msg);
    else
        cli_error("%s", msg);
    fputs("(see 'parallax --help')\n", stderr);
    return EXIT_USAGE;
}

int cli_engine_error(const plx_store *st, int rc)
{
    const char *msg = st != NULL ? plx_store_errmsg(st) : NULL;

    if (msg == NULL || *msg == '\0')
        msg = strerror(rc < 0 ? -rc : EIO);
    return cli_error("%s", msg);
}

static const struct cli_opt *find_opt(const struct cli_opt *opts, const char *name, size_t len)
{
    for (; opts->name != NULL; opts++)
        if (strlen(opts->name) == len && strncmp(opts->name, name, len) == 0)
            return opts;
    return NULL;
}

static void print_command_help(const struct cli_ctx *ctx)
{
    printf("usage: parallax [-b BLOCKSTORE] %s %s\n", ctx->command, ctx->synopsis);
    exit(fflush(stdout) == 0 ? EXIT_OK : EXIT_ERR);
}

/* -b and --blockstore are accepted after the command too, so options can go anywhere. */
static int take_blockstore(struct cli_ctx *ctx, int argc, char **argv, int *i)
{
    const char *a = argv[*i];

    if (strncmp(a, "-b", 2) == 0 && a[2] != '\0') {
        ctx->blockstore = a + 2;
        return EXIT_OK;
    }
    if (strncmp(a, "--blockstore=", 13) == 0) {
        ctx->blockstore = a + 13;
        return EXIT_OK;
    }
    if (*i + 1 >= argc)
        return cli_usage_error(ctx, "option '%s' needs a value", a);
    ctx->blockstore = argv[++*i];
    return EXIT_OK;
}

static int take_long_opt(struct cli_ctx *ctx, const struct cli_opt *opts, int argc, char **argv,
                         int *i)
{
    const char *name = argv[*i] + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    const struct cli_opt *o = find_opt(opts, name, len);

    if (o == NULL)
        return cli_usage_error(ctx, "unknown option '--%.*s'", (int)len, name);
    if (!o->has_arg) {
        if (eq != NULL)
            return cli_usage_error(ctx, "option '--%s' takes no value", o->name);
        *o->flag = 1;
        return EXIT_OK;
    }
    if (eq != NULL) {
        *o->value = eq + 1;
        return EXIT_OK;
    }
    /* The value is taken verbatim even when it looks like an option, so "--size -1" is
     * reported as a bad size rather than as an unknown option. */
    if (*i + 1 >= argc)
        return cli_usage_error(ctx, "option '--%s' needs a value", o->name);
    *o->value = argv[++*i];
    return EXIT_OK;
}

static int is_blockstore_opt(const char *a)
{
    return strncmp(a, "-b", 2) == 0 || strcmp(a, "--blockstore") == 0 ||
           strncmp(a, "--blockstore=", 13) == 0;
}

static int take_option(struct cli_ctx *ctx, const struct cli_opt *opts, int argc, char **argv,
                       int *i)
{
    const char *a = argv[*i];

    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
        print_command_help(ctx);
    if (is_blockstore_opt(a))
        return take_blockstore(ctx, argc, argv, i);
    if (a[1] == '-')
        return take_long_opt(ctx, opts, argc, argv, i);
    return cli_usage_error(ctx, "unknown option '%s'", a);
}

int cli_parse(struct cli_ctx *ctx, int argc, char **argv, const struct cli_opt *opts,
              const char **pos, int min_pos, int max_pos)
{
    int npos = 0, options_done = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && strcmp(a, "--") == 0) {
            options_done = 1;
        } else if (!options_done && a[0] == '-' && a[1] != '\0') {
            int rc = take_option(ctx, opts, argc, argv, &i);
            if (rc != EXIT_OK)
                return rc;
        } else if (npos < max_pos) {
            pos[npos++] = a;
        } else {
            return cli_usage_error(ctx, "unexpected argument '%s'", a);
        }
    }
    if (npos < min_pos) {
        /* The error is one line; the synopsis, which may run over several (cache), follows it
         * as printed by --help, before the hint. */
        cli_error("%s: missing argument", ctx->command);
        fprintf(stderr, "usage: parallax %s %s\n(see 'parallax --help')\n", ctx->command,
                ctx->synopsis);
        return EXIT_USAGE;
    }
    for (int i = npos; i < max_pos; i++)
        pos[i] = NULL;
    return EXIT_OK;
}

int cli_parse_size(const struct cli_ctx *ctx, const char *opt, const char *value, uint64_t *out)
{
    if (plx_size_parse(value, out) < 0)
        return cli_usage_error(ctx, "bad size '%s' for %s (bytes, or a number with K, M, G or T)",
                               value, opt);
    return EXIT_OK;
}

/* The first line of the configuration file that is neither blank nor a # comment, trimmed (the
 * same rule as the tapdisk driver and the hotplug scripts). NULL when there is none. */
static const char *configured_blockstore(const char *conf)
{
    static char line[4096 + 2];
    FILE *f = fopen(conf, "re");
    if (f == NULL)
        return NULL;
    const char *found = NULL;
    while (found == NULL && fgets(line, sizeof line, f) != NULL) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strlen(p);
        while (n > 0 && strchr("\r\n \t", p[n - 1]) != NULL)
            p[--n] = '\0';
        if (n > 0 && p[0] != '#')
            found = p;
    }
    fclose(f);
    return found;
}

int cli_blockstore(const struct cli_ctx *ctx, const char **path)
{
    const char *p = ctx->blockstore;

    if (p == NULL)
        p = getenv("PARALLAX_BLOCKSTORE");
    if (p == NULL || *p == '\0') {
        const char *conf = getenv("PARALLAX_BLOCKSTORE_FILE");
        p = configured_blockstore(conf != NULL && *conf != '\0' ? conf : CLI_BLOCKSTORE_FILE);
    }
    if (p == NULL || *p == '\0')
        return cli_usage_error(ctx, "no blockstore: use -b BLOCKSTORE, set PARALLAX_BLOCKSTORE "
                                    "or name it in " CLI_BLOCKSTORE_FILE);
    *path = p;
    return EXIT_OK;
}

static int open_store(const struct cli_ctx *ctx, int read_only, int blocking_io, int placement,
                      plx_store **st)
{
    struct plx_open_opts opts = {.struct_size = sizeof opts,
                                 .read_only = read_only,
                                 .blocking_io = blocking_io,
                                 .placement = placement};
    char err[CLI_MSG_MAX] = "";
    const char *path = NULL;
    int rc = cli_blockstore(ctx, &path);

    if (rc != EXIT_OK)
        return rc;
    rc = plx_store_open(path, &opts, st, err, sizeof err);
    if (rc < 0)
        return cli_error("%s", err[0] != '\0' ? err : strerror(-rc));
    return EXIT_OK;
}

int cli_open_store(const struct cli_ctx *ctx, int read_only, plx_store **st)
{
    return open_store(ctx, read_only, 1, 0, st);
}

/* The commands that overlap many I/Os: import (a writer from the first block to the last), export
 * and gc. Data is placed in arrival order: for a sequential writer that is the leaves' order
 * anyway, and leaf placement would zero each new data extent ahead (backend_file_prepare.c) only
 * for the import to write over the zeros, up to a whole extent for a small image. */
int cli_open_store_aio(const struct cli_ctx *ctx, int read_only, plx_store **st)
{
    return open_store(ctx, read_only, 0, PLX_PLACEMENT_ARRIVAL, st);
}

int cli_close_store(plx_store *st, int rc)
{
    int crc = plx_store_close(st);

    /* The store (and its message) is gone once close returns, so only errno text is left. */
    if (crc < 0 && rc == EXIT_OK)
        return cli_error("closing the blockstore: %s", strerror(-crc));
    return rc;
}
