/*
 * cmd_vdi.c - commands that change the VDI registry: create/clone, delete, snapshot, label.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "parallax_control.h"

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

    if (rc == EXIT_OK && strchr(vdi, '@') != NULL)
        return cli_error("%s is a snapshot: 'parallax snap-delete %s' deletes it (vdi-delete "
                         "deletes a whole VDI with all its snapshots)",
                         vdi, vdi);
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_vdi_delete(st, vdi);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

/* "parallax vdi-import" for a parallax process (its command line), else /proc/PID/comm, or "". */
static void process_name(int pid, char *buf, size_t len)
{
    char path[64], raw[256];
    *buf = 0;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(raw, 1, sizeof raw - 1, f);
    fclose(f);
    raw[n] = 0;
    const char *prog = strrchr(raw, '/') ? strrchr(raw, '/') + 1 : raw;
    if (strcmp(prog, "parallax") != 0) {
        snprintf(buf, len, "%s", prog);
        return;
    }
    /* argv: parallax [-b STORE] COMMAND ...: the first argument after the options. */
    const char *arg = raw + strlen(raw) + 1;
    while (arg < raw + n && *arg == '-') {
        bool takes_value = strcmp(arg, "-b") == 0 || strcmp(arg, "--blockstore") == 0;
        arg += strlen(arg) + 1;
        if (takes_value && arg < raw + n)
            arg += strlen(arg) + 1;
    }
    snprintf(buf, len, "parallax%s%.40s", arg < raw + n ? " " : "", arg < raw + n ? arg : "");
}

/* A VDI open for writing in a server on this host is changed by that server, inside its
 * request stream (single writer): send it the command over its control socket. Returns 1 and
 * sets *rc when the command was routed. */
/* Send the command to the holder named in info (lock_pid != 0); sets *rc. */
static void route_to(const struct plx_vdi_info *info, const char *line, char *reply, size_t len,
                     int *rc)
{
    int err = control_request((int)info->lock_pid, line, reply, len);
    if (err == -ENOENT || err == -ECONNREFUSED) {
        /* No control socket: the writer is not a server (vdi-import, a library user). */
        char comm[64];
        process_name((int)info->lock_pid, comm, sizeof comm);
        *rc = cli_error("VDI %s is open for writing by pid %u%s%s%s, which is not a server "
                        "and takes no commands: try again when it has finished",
                        info->name, info->lock_pid, *comm ? " (" : "", comm, *comm ? ")" : "");
        return;
    }
    *rc = err ? cli_error("%s (VDI %s, served by pid %u)", reply, info->name, info->lock_pid)
              : EXIT_OK;
}

static int route(plx_store *st, uint64_t vdi_id, const char *line, char *reply, size_t len,
                 int *rc)
{
    char id[32];
    struct plx_vdi_info info;
    snprintf(id, sizeof id, "%llu", (unsigned long long)vdi_id);
    if (plx_vdi_lookup(st, id, &info) != 0 || info.lock_pid == 0)
        return 0;
    route_to(&info, line, reply, len, rc);
    return 1;
}

/* snap-label and snap-delete of a snapshot whose VDI a server holds. */
static int route_snap(plx_store *st, const char *snap, const char *cmd, const char *label,
                      int *rc)
{
    struct plx_snap_info si;
    char line[PLX_LABEL_MAX + 96], reply[400];
    if (plx_snap_lookup(st, snap, &si) != 0)
        return 0;
    snprintf(line, sizeof line, "%s %llu %llu %s", cmd, (unsigned long long)si.vdi_id,
             (unsigned long long)si.index, label ? label : "");
    return route(st, si.vdi_id, line, reply, sizeof reply, rc);
}

static int open_to_route(struct cli_ctx *ctx, plx_store **st);

/* snap-label and snap-delete of a snapshot whose VDI a server on this host holds, sent to it
 * first, as snapshot_held does. Returns 1 and sets *rc when routed (or the store cannot be
 * opened), 0 when the caller must do it here. */
static int snap_held(struct cli_ctx *ctx, const char *snap, const char *cmd, const char *label,
                     int *rc)
{
    plx_store *st = NULL;
    if ((*rc = open_to_route(ctx, &st)) != EXIT_OK)
        return 1;
    int routed = route_snap(st, snap, cmd, label, rc);
    plx_store_close(st);
    return routed;
}

int cmd_snap_delete(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *snap;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &snap, 1, 1);

    if (rc == EXIT_OK && snap_held(ctx, snap, "snap-delete", NULL, &rc))
        return rc;
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_snap_delete(st, snap);
    if (err == -EBUSY && route_snap(st, snap, "snap-delete", NULL, &rc))
        return cli_close_store(st, rc);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

static int snapshot(plx_store *st, const char *vdi, const char *label)
{
    struct plx_vdi_info info;
    uint64_t index;
    int err = plx_vdi_snapshot(st, vdi, label, &index);

    if (err == -EBUSY && plx_vdi_lookup(st, vdi, &info) == 0 && info.lock_pid) {
        char line[PLX_LABEL_MAX + 64], reply[400];
        int rc;
        snprintf(line, sizeof line, "snapshot %llu %s", (unsigned long long)info.id,
                 label ? label : "");
        route(st, info.id, line, reply, sizeof reply, &rc);
        if (rc != EXIT_OK)
            return rc;
        index = strtoull(reply + 2, NULL, 10);
        err = 0;
    }
    /* VDI may be an id; the printed form uses the name so it can be pasted as a SNAP. */
    if (err == 0)
        err = plx_vdi_lookup(st, vdi, &info);
    if (err < 0)
        return cli_engine_error(st, err);
    printf("%s@%llu\n", info.name, (unsigned long long)index);
    return EXIT_OK;
}

/* Open the store read-only to find the server that holds a VDI: one record read, nothing
 * written, no lock taken, and no lock manager either (PARALLAX_LOCKD=none for this open: the
 * holder is a process of this host, judged alive from /proc as lockd would). So a command for a
 * VDI a server holds reaches that server while the lock manager is unreachable, and the server
 * does it without lockd unless it needs a new extent (docs/DESIGN.md, "Waiting for the admin
 * lock on the loop"). */
static int open_to_route(struct cli_ctx *ctx, plx_store **st)
{
    const char *was = getenv("PARALLAX_LOCKD");
    char *saved = was ? strdup(was) : NULL;
    setenv("PARALLAX_LOCKD", "none", 1);
    int rc = cli_open_store(ctx, 1, st);
    if (saved)
        setenv("PARALLAX_LOCKD", saved, 1);
    else
        unsetenv("PARALLAX_LOCKD");
    free(saved);
    return rc;
}

/* The common case first: a running VM's VDI, held by a server (parallax serve or tapdisk) on
 * this host. The store is opened read-only, the VDI record read once and the command sent to
 * the holder: no lock taken, nothing written, no flush at close (a writable open and close cost
 * this command most of its time before it reached the server). Returns 1 and sets *rc when the
 * VDI is held (whatever the server answered), 0 when the caller must snapshot it here. */
static int snapshot_held(struct cli_ctx *ctx, const char *vdi, const char *label, int *rc)
{
    plx_store *st = NULL;
    struct plx_vdi_info info;
    /* A store that cannot be opened to read cannot be opened to write either: its one error
     * line is the command's. */
    if ((*rc = open_to_route(ctx, &st)) != EXIT_OK)
        return 1;
    if (plx_vdi_lookup(st, vdi, &info) != 0 || info.lock_pid == 0) {
        plx_store_close(st);
        return 0;
    }
    char line[PLX_LABEL_MAX + 64], reply[400];
    snprintf(line, sizeof line, "snapshot %llu %s", (unsigned long long)info.id,
             label ? label : "");
    route_to(&info, line, reply, sizeof reply, rc);
    if (*rc == EXIT_OK)
        printf("%s@%llu\n", info.name, strtoull(reply + 2, NULL, 10));
    *rc = cli_close_store(st, *rc);
    return 1;
}

int cmd_vdi_snapshot(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *label = NULL, *vdi;
    const struct cli_opt opts[] = {{"label", 1, &label, NULL}, {0}};
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &vdi, 1, 1);

    if (rc == EXIT_OK && snapshot_held(ctx, vdi, label, &rc))
        return rc;
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    /* Not held a moment ago; if a server took it since, snapshot() routes to it. */
    return cli_close_store(st, snapshot(st, vdi, label));
}

int cmd_snap_label(struct cli_ctx *ctx, int argc, char **argv)
{
    const struct cli_opt opts[] = {{0}};
    const char *pos[2];
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, pos, 2, 2);

    if (rc == EXIT_OK && snap_held(ctx, pos[0], "snap-label", pos[1], &rc))
        return rc;
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_snap_label(st, pos[0], pos[1]);
    if (err == -EBUSY && route_snap(st, pos[0], "snap-label", pos[1], &rc))
        return cli_close_store(st, rc);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}
