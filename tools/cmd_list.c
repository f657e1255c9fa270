/*
 * cmd_list.c - read-only views of the registry: vdi-list, snap-list, vdi-tree.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "json.h"
#include "xen_attach.h"
#include "size.h"
#include "table.h"
#include "timefmt.h"
#include "tree.h"

/* Xen attachments for this listing (xen_attach.c); xen_known is 0 where no xenstore runs. */
static struct xen_attach *att;
static size_t n_att;
static int xen_known;

static const struct plx_vdi_info *vdi_by_id(const struct plx_vdi_info *v, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].id == id)
            return &v[i];
    return NULL;
}

/* ---- vdi-list -------------------------------------------------------------------------------- */

/* What the registry record does not say: snapshots deleted since they were taken still count in
 * snap_count, and a clone's source snapshot may be deleted. Per VDI, from the snapshot logs. */
struct vdi_extra {
    uint64_t live_snaps;
    int parent_deleted;
};

static int snap_deleted(plx_store *st, uint64_t vdi_id, uint64_t index)
{
    struct plx_snap_info *snaps;
    size_t n;
    int deleted = 0;
    if (plx_snap_list(st, vdi_id, &snaps, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (snaps[i].index == index)
            deleted = snaps[i].deleted;
    free(snaps);
    return deleted;
}

static int vdi_extras(plx_store *st, const struct plx_vdi_info *v, size_t n,
                      struct vdi_extra *out)
{
    for (size_t i = 0; i < n; i++) {
        struct plx_snap_info *snaps;
        size_t ns;
        out[i] = (struct vdi_extra){0};
        if (v[i].deleted)
            continue;
        int err = plx_snap_list(st, v[i].id, &snaps, &ns);
        if (err < 0)
            return err;
        for (size_t k = 0; k < ns; k++)
            out[i].live_snaps += !snaps[k].deleted;
        free(snaps);
        if (v[i].parent_id != 0)
            out[i].parent_deleted = snap_deleted(st, v[i].parent_id, v[i].parent_snap);
    }
    return 0;
}

static void vdi_json(struct json_writer *w, const struct plx_vdi_info *v,
                     const struct vdi_extra *x)
{
    json_begin_object(w);
    json_key(w, "id");
    json_u64(w, v->id);
    json_key(w, "name");
    json_string(w, v->name);
    json_key(w, "size");
    json_u64(w, v->size);
    json_key(w, "height");
    json_u64(w, v->height);
    json_key(w, "snapshots");
    json_u64(w, x->live_snaps);
    /* null rather than 0 for "not a clone": ids are numbers, and 0 would read like one. */
    json_key(w, "parent");
    if (v->parent_id != 0)
        json_u64(w, v->parent_id);
    else
        json_null(w);
    json_key(w, "parent_snap");
    if (v->parent_id != 0)
        json_u64(w, v->parent_snap);
    else
        json_null(w);
    json_key(w, "parent_snap_deleted");
    if (v->parent_id != 0)
        json_bool(w, x->parent_deleted);
    else
        json_null(w);
    json_key(w, "created_ns");
    json_u64(w, v->created_ns);
    json_key(w, "lock_holder");
    json_string(w, v->lock_holder);
    json_key(w, "attached_to");
    if (xen_known) {
        json_begin_array(w);
        for (size_t i = 0; i < n_att; i++) {
            if (!xen_attach_names(&att[i], v->name))
                continue;
            json_begin_object(w);
            json_key(w, "domid");
            json_u64(w, att[i].domid);
            json_key(w, "name");
            json_string(w, att[i].domname);
            json_end_object(w);
        }
        json_end_array(w);
    } else {
        json_null(w); /* no xenstore here: unknown, not "nowhere" */
    }
    json_end_object(w);
}

static void vdi_list_json(const struct plx_vdi_info *v, size_t n, const struct vdi_extra *x)
{
    struct json_writer w;

    json_init(&w, stdout);
    json_begin_array(&w);
    for (size_t i = 0; i < n; i++)
        if (!v[i].deleted)
            vdi_json(&w, &v[i], &x[i]);
    json_end_array(&w);
    json_finish(&w);
}

/* The domains a VDI is attached to, e.g. "web1 (3)", or "-". */
static void attached_cell(const char *name, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n_att && used + 1 < len; i++) {
        if (!xen_attach_names(&att[i], name))
            continue;
        int w = snprintf(buf + used, len - used, "%s%s (%u)", used ? ", " : "",
                         att[i].domname[0] ? att[i].domname : "domain", att[i].domid);
        if (w > 0)
            used += (size_t)w;
    }
    if (!buf[0])
        snprintf(buf, len, "-");
}

static int vdi_row(struct table *t, const struct plx_vdi_info *all, size_t n,
                   const struct plx_vdi_info *v, const struct vdi_extra *x)
{
    char id[24], size[32], snaps[24], parent[PLX_NAME_MAX + 32] = "-", attached[256];
    const char *locker = v->lock_holder[0] != '\0' ? v->lock_holder : "-";
    const char *cells[] = {id, v->name, size, snaps, parent, locker, attached};
    attached_cell(v->name, attached, sizeof attached);

    snprintf(id, sizeof id, "%llu", (unsigned long long)v->id);
    size_format(v->size, size, sizeof size);
    snprintf(snaps, sizeof snaps, "%llu", (unsigned long long)x->live_snaps);
    if (v->parent_id != 0) {
        /* The list includes deleted VDIs, so a deleted parent still has a name to show. */
        const struct plx_vdi_info *p = vdi_by_id(all, n, v->parent_id);
        const char *gone = x->parent_deleted ? " (deleted)" : "";
        if (p != NULL)
            snprintf(parent, sizeof parent, "%s@%llu%s", p->name,
                     (unsigned long long)v->parent_snap, gone);
        else
            snprintf(parent, sizeof parent, "%llu@%llu%s", (unsigned long long)v->parent_id,
                     (unsigned long long)v->parent_snap, gone);
    }
    return table_add_row(t, cells);
}

static int vdi_list_table(const struct plx_vdi_info *v, size_t n, const struct vdi_extra *x)
{
    static const char *const head[] = {"ID",     "NAME",      "SIZE",    "SNAPS",
                                       "PARENT", "LOCKED-BY", "ATTACHED"};
    struct table t;
    int err;

    /* The ATTACHED column only where a xenstore answers. */
    table_init(&t, xen_known ? 7 : 6);
    err = table_add_row(&t, head);
    for (size_t i = 0; i < n && err == 0; i++)
        if (!v[i].deleted)
            err = vdi_row(&t, v, n, &v[i], &x[i]);
    if (err == 0)
        table_print(&t, stdout);
    table_free(&t);
    return err < 0 ? cli_error("vdi-list: %s", strerror(-err)) : EXIT_OK;
}

int cmd_vdi_list(struct cli_ctx *ctx, int argc, char **argv)
{
    int json = 0;
    const struct cli_opt opts[] = {{"json", 0, NULL, &json}, {0}};
    struct plx_vdi_info *vdis;
    size_t n;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_vdi_list(st, &vdis, &n);
    if (err < 0)
        return cli_close_store(st, cli_engine_error(st, err));
    struct vdi_extra *extra = calloc(n ? n : 1, sizeof *extra);
    if (extra == NULL) {
        free(vdis);
        return cli_close_store(st, cli_error("vdi-list: out of memory"));
    }
    err = vdi_extras(st, vdis, n, extra);
    if (err < 0) {
        free(vdis);
        free(extra);
        return cli_close_store(st, cli_engine_error(st, err));
    }
    xen_known = xen_attachments(&att, &n_att);
    if (json)
        vdi_list_json(vdis, n, extra);
    else
        rc = vdi_list_table(vdis, n, extra);
    free(extra);
    free(vdis);
    free(att);
    return cli_close_store(st, rc);
}

/* ---- snap-list ------------------------------------------------------------------------------- */

/* Snapshots are printed as plx_snap_iterate hands them out: nothing holds the history. The
 * table's N column is as wide as the VDI's highest snapshot number, so rows need no second pass. */
#define TIME_COL 20 /* "2026-11-22T04:30:00Z" */

struct snap_out {
    int json;
    struct json_writer w;
    int nwidth;
};

static int snap_print(void *arg, const struct plx_snap_info *s)
{
    struct snap_out *o = arg;
    if (o->json) {
        json_begin_object(&o->w);
        json_key(&o->w, "index");
        json_u64(&o->w, s->index);
        json_key(&o->w, "label");
        json_string(&o->w, s->label);
        json_key(&o->w, "time_ns");
        json_u64(&o->w, s->time_ns);
        json_key(&o->w, "root");
        json_u64(&o->w, s->root);
        json_end_object(&o->w);
    } else {
        char when[TIMEFMT_LEN];
        time_format_ns(s->time_ns, when, sizeof when);
        printf("%-*llu  %-*s  %s\n", o->nwidth, (unsigned long long)s->index, TIME_COL,
               when, s->label[0] != '\0' ? s->label : "-");
    }
    return ferror(stdout) ? -EIO : 0;
}

/* A non-negative decimal count for --limit / --after. */
static int parse_count(const struct cli_ctx *ctx, const char *opt, const char *v, uint64_t *out)
{
    char *end;
    if (!v || !*v || *v < '0' || *v > '9')
        return cli_usage_error(ctx, "%s wants a number, not '%s'", opt, v ? v : "");
    errno = 0;
    *out = strtoull(v, &end, 10);
    if (*end || errno)
        return cli_usage_error(ctx, "%s wants a number, not '%s'", opt, v);
    return EXIT_OK;
}

static int snap_list(plx_store *st, const char *vdi, int json,
                     const struct plx_snap_iter_opts *io)
{
    struct plx_vdi_info info;
    int err = plx_vdi_lookup(st, vdi, &info);
    if (err < 0)
        return cli_engine_error(st, err);
    struct snap_out o = {.json = json, .nwidth = 1};
    for (uint64_t n = info.snap_count; n >= 10; n /= 10)
        o.nwidth++;
    if (json) {
        json_init(&o.w, stdout);
        json_begin_array(&o.w);
    } else {
        printf("%-*s  %-*s  %s\n", o.nwidth, "N", TIME_COL, "TIME", "LABEL");
    }
    err = plx_snap_iterate(st, vdi, io, snap_print, &o);
    if (json) {
        json_end_array(&o.w);
        json_finish(&o.w);
    }
    if (fflush(stdout) != 0 && !err)
        err = -EIO;
    if (err == -EIO && ferror(stdout))
        return cli_error("snap-list: writing the list: %s", strerror(EIO));
    return err < 0 ? cli_engine_error(st, err) : EXIT_OK;
}

int cmd_snap_list(struct cli_ctx *ctx, int argc, char **argv)
{
    int json = 0, newest = 0;
    const char *limit = NULL, *after = NULL;
    const struct cli_opt opts[] = {{"json", 0, NULL, &json},
                                   {"limit", 1, &limit, NULL},
                                   {"after", 1, &after, NULL},
                                   {"newest-first", 0, NULL, &newest},
                                   {0}};
    const char *vdi;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, &vdi, 1, 1);
    struct plx_snap_iter_opts io = {.struct_size = sizeof io};
    if (rc == EXIT_OK && limit)
        rc = parse_count(ctx, "--limit", limit, &io.limit);
    if (rc == EXIT_OK && after)
        rc = parse_count(ctx, "--after", after, &io.after);
    io.newest_first = newest;
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    return cli_close_store(st, snap_list(st, vdi, json, &io));
}

/* ---- vdi-tree -------------------------------------------------------------------------------- */

struct forest_data {
    struct plx_vdi_info *vdis;
    size_t vdi_count;
    struct plx_snap_info **snaps;
    size_t *snap_counts;
};

static void forest_free(struct forest_data *d)
{
    for (size_t i = 0; d->snaps != NULL && i < d->vdi_count; i++)
        free(d->snaps[i]);
    free(d->snaps);
    free(d->snap_counts);
    free(d->vdis);
}

/* Returns 0 or a negative errno; the store's message (if any) explains a failure. */
static int forest_load(plx_store *st, struct forest_data *d)
{
    int err = plx_vdi_list(st, &d->vdis, &d->vdi_count);

    if (err < 0)
        return err;
    d->snaps = calloc(d->vdi_count + 1, sizeof *d->snaps);
    d->snap_counts = calloc(d->vdi_count + 1, sizeof *d->snap_counts);
    if (d->snaps == NULL || d->snap_counts == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < d->vdi_count; i++) {
        struct plx_snap_info *snaps;
        size_t n;
        if (d->vdis[i].deleted)
            continue;
        err = plx_snap_list(st, d->vdis[i].id, &snaps, &n);
        if (err < 0)
            return err;
        d->snaps[i] = snaps;
        d->snap_counts[i] = n;
    }
    return 0;
}

static int vdi_tree(plx_store *st, int dot)
{
    struct forest_data d = {0};
    int err = forest_load(st, &d);

    if (err == 0) {
        struct tree_forest f = {.vdis = d.vdis,
                                .vdi_count = d.vdi_count,
                                .snaps = d.snaps,
                                .snap_counts = d.snap_counts};
        err = dot ? tree_print_dot(stdout, &f) : tree_print_text(stdout, &f);
        if (err < 0)
            cli_error("vdi-tree: %s", strerror(-err));
    } else {
        cli_engine_error(st, err);
    }
    forest_free(&d);
    return err < 0 ? EXIT_ERR : EXIT_OK;
}

int cmd_vdi_tree(struct cli_ctx *ctx, int argc, char **argv)
{
    int dot = 0;
    const struct cli_opt opts[] = {{"dot", 0, NULL, &dot}, {0}};
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    return cli_close_store(st, vdi_tree(st, dot));
}
