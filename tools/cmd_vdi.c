/*
 * cmd_vdi.c - commands that change the VDI registry: create/clone, delete, snapshot, label.
 */
#include <stdio.h>

#include "cli.h"
#include "commands.h"

static int create_or_clone(plx_store *st, const char *name, uint64_t size, const char *from)
{
    uint64_t id;
    int err =
        from != NULL ? plx_vdi_clone(st, name, from, &id) : plx_vdi_create(st, name, size, &id);

    if (err < 0)
        return cli_engine_error(st, err);
    printf("%s %llu\n", name, (unsigned long long)id);
    return EXIT_OK;
}

int cmd_vdi_create(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *size_arg = NULL, *from = NULL, *name;
    const struct cli_opt opts[] = {{"size", 1, &size_arg, NULL}, {"from", 1, &from, NULL}, {0}};
    uint64_t size = 0;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &name, 1, 1);

    if (rc != EXIT_OK)
        return rc;
    if ((size_arg == NULL) == (from == NULL))
        return cli_usage_error(ctx, "give exactly one of --size SIZE and --from SNAP");
    if (size_arg != NULL) {
        rc = cli_parse_size(ctx, "--size", size_arg, &size);
        if (rc == EXIT_OK && size == 0)
            rc = cli_usage_error(ctx, "--size must be more than 0");
        if (rc != EXIT_OK)
            return rc;
    }
    rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    return cli_close_store(st, create_or_clone(st, name, size, from));
}

int cmd_vdi_delete(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *vdi;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &vdi, 1, 1);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_vdi_delete(st, vdi);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

int cmd_snap_delete(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *snap;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &snap, 1, 1);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_snap_delete(st, snap);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

static int snapshot(plx_store *st, const char *vdi, const char *label)
{
    struct plx_vdi_info info;
    uint64_t index;
    int err = plx_vdi_snapshot(st, vdi, label, &index);

    /* VDI may be an id; the printed form uses the name so it can be pasted as a SNAP. */
    if (err == 0)
        err = plx_vdi_lookup(st, vdi, &info);
    if (err < 0)
        return cli_engine_error(st, err);
    printf("%s@%llu\n", info.name, (unsigned long long)index);
    return EXIT_OK;
}

int cmd_vdi_snapshot(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *label = NULL, *vdi;
    const struct cli_opt opts[] = {{"label", 1, &label, NULL}, {0}};
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &vdi, 1, 1);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    return cli_close_store(st, snapshot(st, vdi, label));
}

int cmd_snap_label(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *pos[2];
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, pos, 2, 2);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_snap_label(st, pos[0], pos[1]);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}
