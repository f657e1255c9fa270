/*
 * commands.h - the `parallax` subcommands. Each takes its own argv (argv[0] is the command
 * name) and returns the process exit code, having printed any error itself.
 */
#ifndef PLX_TOOLS_COMMANDS_H
#define PLX_TOOLS_COMMANDS_H

#include "cli.h"

typedef int (*cmd_fn)(struct cli_ctx *ctx, int argc, char **argv);

int cmd_format(struct cli_ctx *ctx, int argc, char **argv);
int cmd_info(struct cli_ctx *ctx, int argc, char **argv);
int cmd_upgrade(struct cli_ctx *ctx, int argc, char **argv);
int cmd_check(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_create(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_delete(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_snapshot(struct cli_ctx *ctx, int argc, char **argv);
int cmd_snap_label(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_list(struct cli_ctx *ctx, int argc, char **argv);
int cmd_snap_list(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_tree(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_import(struct cli_ctx *ctx, int argc, char **argv);
int cmd_vdi_export(struct cli_ctx *ctx, int argc, char **argv);
int cmd_snap_delete(struct cli_ctx *ctx, int argc, char **argv);
int cmd_gc(struct cli_ctx *ctx, int argc, char **argv);
int cmd_serve(struct cli_ctx *ctx, int argc, char **argv);
int cmd_lockd_set(struct cli_ctx *ctx, int argc, char **argv);
int cmd_lockd_status(struct cli_ctx *ctx, int argc, char **argv);
int cmd_cache(struct cli_ctx *ctx, int argc, char **argv);

#endif
