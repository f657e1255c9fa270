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

/* ---- vdi-list -------------------------------------------------------------------------------- */

/* What the VDI info does not say: the live snapshots (the record counts the deleted ones:
 * O(1) per VDI), and whether a clone's source snapshot was deleted (its skip path). */
struct vdi_extra {
    uint64_t live_snaps;
    int parent_deleted;
};

/* The record of VDI `id`, deleted or not: the one VDI the listing finds after id - 1. */
struct vdi_by_id {
    uint64_t id;
    struct plx_vdi_info info;
    int found;
};

static int take_first(void *arg, const struct plx_vdi_info *info)
{
    struct vdi_by_id *b = arg;
    b->found = info->id == b->id;
    b->info = *info;
    return 1;
}

static int vdi_extra_of(plx_store *st, const struct plx_vdi_info *v, struct vdi_extra *out)
{
    *out = (struct vdi_extra){0};
    char id[24];
    snprintf(id, sizeof id, "%llu", (unsigned long long)v->id);
    int err = plx_vdi_live_snapshots(st, id, &out->live_snaps);
    if (err < 0)
        return err;
    if (v->parent_id != 0) {
        /* By id: the parent may be deleted, its snapshot found (or not) through the skip links. */
        char spec[48];
        struct plx_snap_info si;
        snprintf(spec, sizeof spec, "%llu@%llu", (unsigned long long)v->parent_id,
                 (unsigned long long)v->parent_snap);
        out->parent_deleted = plx_snap_lookup(st, spec, &si) != 0;
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

static int vdi_row(plx_store *st, struct table *t, const struct plx_vdi_info *v,
                   const struct vdi_extra *x)
{
    char id[24], size[32], snaps[24], parent[PLX_NAME_MAX + 32] = "-", attached[256];
    const char *locker = v->lock_holder[0] != '\0' ? v->lock_holder : "-";
    const char *cells[] = {id, v->name, size, snaps, parent, locker, attached};
    attached_cell(v->name, attached, sizeof attached);

    snprintf(id, sizeof id, "%llu", (unsigned long long)v->id);
    plx_size_format(v->size, size, sizeof size);
    snprintf(snaps, sizeof snaps, "%llu", (unsigned long long)x->live_snaps);
    if (v->parent_id != 0) {
        /* A deleted parent still has a name to show. */
        struct vdi_by_id p = {.id = v->parent_id};
        const char *gone = x->parent_deleted ? " (deleted)" : "";
        int err = plx_vdi_list_each(st, v->parent_id - 1, take_first, &p);
        if (err < 0)
            return err;
        if (p.found)
            snprintf(parent, sizeof parent, "%s@%llu%s", p.info.name,
                     (unsigned long long)v->parent_snap, gone);
        else
            snprintf(parent, sizeof parent, "%llu@%llu%s", (unsigned long long)v->parent_id,
                     (unsigned long long)v->parent_snap, gone);
    }
    return table_add_row(t, cells);
}

/* The listing streams: each VDI is printed (JSON) or put in a table of at most TABLE_CHUNK rows
 * (text) as it is read, so memory stays flat however many VDIs the store holds. A text table's
 * columns fit the rows of its chunk. */
#define TABLE_CHUNK 1024u

struct vdi_lister {
    plx_store *st;
    int json;
    uint64_t limit, shown;
    struct json_writer w;
    struct table t;
    int err;
};

static const char *const vdi_head[] = {"ID",     "NAME",      "SIZE",    "SNAPS",
                                       "PARENT", "LOCKED-BY", "ATTACHED"};

static int list_one(void *arg, const struct plx_vdi_info *v)
{
    struct vdi_lister *l = arg;
    struct vdi_extra x;
    if (v->deleted)
        return 0;
    if (l->limit && l->shown == l->limit)
        return 1;
    l->err = vdi_extra_of(l->st, v, &x);
    if (l->err < 0)
        return l->err;
    l->shown++;
    if (l->json) {
        vdi_json(&l->w, v, &x);
        return 0;
    }
    if (l->t.rows >= TABLE_CHUNK) {
        table_print(&l->t, stdout);
        table_free(&l->t);
        table_init(&l->t, xen_known ? 7 : 6);
    }
    l->err = vdi_row(l->st, &l->t, v, &x);
    return l->err < 0 ? l->err : 0;
}

int cmd_vdi_list(struct cli_ctx *ctx, int argc, char **argv)
{
    int json = 0;
    const char *limit_arg = NULL, *after_arg = NULL;
    const struct cli_opt opts[] = {{"json", 0, NULL, &json},
                                   {"limit", 1, &limit_arg, NULL},
                                   {"after", 1, &after_arg, NULL},
                                   {0}};
    plx_store *st = NULL;
    uint64_t after = 0;
    struct vdi_lister l = {.json = 0};
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK && limit_arg != NULL) {
        char *end;
        errno = 0;
        l.limit = strtoull(limit_arg, &end, 10);
        if (errno || *end || !*limit_arg || limit_arg[0] == '-' || l.limit == 0)
            rc = cli_usage_error(ctx, "--limit %s: give a number of VDIs, at least 1",
                                 limit_arg);
    }
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    if (after_arg != NULL) {
        /* An id pages on even when that VDI was deleted since; a name must name a live VDI. */
        struct plx_vdi_info info;
        int digits = after_arg[0] != '\0' && strspn(after_arg, "0123456789") == strlen(after_arg);
        if (digits) {
            after = strtoull(after_arg, NULL, 10);
        } else {
            int err = plx_vdi_lookup(st, after_arg, &info);
            if (err < 0)
                return cli_close_store(st, cli_engine_error(st, err));
            after = info.id;
        }
    }
    l.st = st;
    l.json = json;
    xen_known = xen_attachments(&att, &n_att);
    if (json) {
        json_init(&l.w, stdout);
        json_begin_array(&l.w);
    } else {
        table_init(&l.t, xen_known ? 7 : 6);
        l.err = table_add_row(&l.t, vdi_head);
    }
    int err = l.err < 0 ? l.err : plx_vdi_list_each(st, after, list_one, &l);
    if (err == 1)
        err = 0; /* the limit stopped the walk */
    if (json) {
        json_end_array(&l.w);
        json_finish(&l.w);
    } else {
        if (err == 0)
            table_print(&l.t, stdout);
        table_free(&l.t);
    }
    free(att);
    if (err < 0 && l.err < 0 && err == l.err && !plx_store_errmsg(st)[0])
        rc = cli_error("vdi-list: %s", strerror(-err));
    else if (err < 0)
        rc = cli_engine_error(st, err);
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
