/*
 * cli.h - what every `parallax` subcommand shares: exit codes, error reporting, option parsing
 * and opening the blockstore.
 *
 * Error convention: the function that detects a failure prints exactly one "parallax: ..." line
 * and returns an exit code; callers pass the code up without printing again.
 */
#ifndef PLX_TOOLS_CLI_H
#define PLX_TOOLS_CLI_H

#include <stdint.h>

#include "parallax.h"

/* EXIT_BUSY: `check` (or `format --force`) did not run because another process uses the store. */
enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_BUSY = 3 };

struct cli_ctx {
    const char *blockstore; /* from -b; NULL means $PARALLAX_BLOCKSTORE */
    const char *command;    /* the subcommand's name, for messages */
    const char *synopsis;   /* its arguments, printed by COMMAND --help */
};

/* One command option: --name VALUE (has_arg) or --name (a flag). */
struct cli_opt {
    const char *name;
    int has_arg;
    const char **value; /* has_arg: receives the value */
    int *flag;          /* !has_arg: set to 1 */
};

#define CLI_MAX_POS 4

/* Parse argv[1..argc-1] of a subcommand: the options in `opts` (terminated by a zeroed entry)
 * anywhere among the positional arguments, plus -b/--blockstore and --help. "--" ends options;
 * "-" alone is positional. Between min_pos and max_pos positional arguments go to pos[].
 * Returns EXIT_OK or EXIT_USAGE (message printed). --help prints the synopsis and exits 0. */
int cli_parse(struct cli_ctx *ctx, int argc, char **argv, const struct cli_opt *opts,
              const char **pos, int min_pos, int max_pos);

/* Parse a SIZE option value; a usage error names the option. */
int cli_parse_size(const struct cli_ctx *ctx, const char *opt, const char *value, uint64_t *out);

/* "parallax: MESSAGE" on stderr; returns EXIT_ERR. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same followed by the --help hint; returns EXIT_USAGE. */
int cli_usage_error(const struct cli_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Report a failed engine call (rc < 0) with the store's message; returns EXIT_ERR. */
int cli_engine_error(const plx_store *st, int rc);

/* Where the blockstore is named when -b and $PARALLAX_BLOCKSTORE are not given (first line that
 * is not blank or a # comment); $PARALLAX_BLOCKSTORE_FILE overrides the path. */
#define CLI_BLOCKSTORE_FILE "/etc/parallax/blockstore"
/* The blockstore (a path or an iscsi:// URL) from -b, else $PARALLAX_BLOCKSTORE, else the
 * configuration file; usage error when none names one. */
int cli_blockstore(const struct cli_ctx *ctx, const char **path);
/* Open the blockstore for a command that is over in milliseconds: blocking I/O, no kernel aio
 * context, whose teardown alone would take some 30 ms (see PLX_BACKEND_BLOCKING). */
int cli_open_store(const struct cli_ctx *ctx, int read_only, plx_store **st);
/* The same with kernel aio, for commands that stream data through many overlapping I/Os. */
int cli_open_store_aio(const struct cli_ctx *ctx, int read_only, plx_store **st);
/* Close the store. A close failure becomes the result only when rc is still EXIT_OK, so at
 * most one error line is printed. */
int cli_close_store(plx_store *st, int rc);

#endif
