/*
 * cmd_store.c - commands about the blockstore as a whole: format, info, check.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "json.h"
#include "preallocate.h"
#include "progress.h"
#include "signature.h"
#include "size.h"

#define ERRBUF_MAX 4096

static const char *const extent_type_names[4] = {"unused", "system", "metadata", "data"};

/* The engine rounds sizes and picks defaults, so report what it made rather than what was
 * asked for. */
static int report_format(const struct cli_ctx *ctx, const char *path)
{
    struct plx_store_info info;
    char size[32], extent[32];
    plx_store *st = NULL;
    int rc = cli_open_store(ctx, 1, &st);

    if (rc != EXIT_OK)
        return rc;
    int err = plx_store_info(st, &info);
    if (err < 0)
        return cli_close_store(st, cli_engine_error(st, err));
    plx_size_format(info.size_bytes, size, sizeof size);
    plx_size_format(info.extent_size, extent, sizeof extent);
    char shown[PATH_MAX];
    printf("formatted %s: %s, %llu extents of %s\n",
           plx_blockstore_shown(path, shown, sizeof shown), size,
           (unsigned long long)info.extent_count, extent);
    return cli_close_store(st, EXIT_OK);
}

/* --preallocate after a successful format: the store's holes written through with zeros. A new
 * file that cannot be written through is removed (a refused format leaves no file behind); an
 * existing one stays a formatted, usable store, sparse where the zeros did not reach. */
static int format_preallocate(const char *path, int existed)
{
    char err[ERRBUF_MAX] = "";
    uint64_t written = 0;
    int ret = preallocate_holes(path, &written, err, sizeof err);
    if (ret == 0)
        return EXIT_OK;
    if (!existed) {
        unlink(path);
        return cli_error("%s; %s removed", err, path);
    }
    char w[32];
    plx_size_format(written, w, sizeof w);
    return cli_error("%s; the store is formatted and usable, %s written through, the rest sparse",
                     err, w);
}

/* --force over a Parallax store that a live process uses (a VDI open for writing, an extent it
 * allocates in; the same test as check's): the process would go on writing into the new store's
 * structures. Refused, naming it. A target that does not open as a store has nobody to protect.
 * (A process that opens the store after this look is not caught: stop the servers first.) */
static int refuse_if_in_use(const char *path)
{
    struct plx_open_opts opts = {.struct_size = sizeof opts, .read_only = 1, .blocking_io = 1};
    char err[ERRBUF_MAX], who[PLX_NAME_MAX + 160];
    plx_store *st = NULL;
    if (plx_store_open(path, &opts, &st, err, sizeof err) < 0)
        return EXIT_OK;
    int n = plx_store_writers(st, who, sizeof who);
    if (n < 0)
        return cli_close_store(st, cli_engine_error(st, n));
    if (n > 0)
        cli_error("format: refused, the blockstore is in use: %s%s. Stop every process that "
                  "uses it (servers, tapdisks, imports) before formatting it again; nothing "
                  "was changed",
                  who, n > 1 ? " (and other processes use it too)" : "");
    plx_store_close(st);
    return n > 0 ? EXIT_BUSY : EXIT_OK;
}

int cmd_format(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *size_arg = NULL, *extent_arg = NULL, *path = NULL;
    int force = 0, preallocate = 0;
    const struct cli_opt opts[] = {{"size", 1, &size_arg, NULL},
                                   {"extent-size", 1, &extent_arg, NULL},
                                   {"force", 0, NULL, &force},
                                   {"preallocate", 0, NULL, &preallocate},
                                   {0}};
    uint64_t size = 0, extent = 0;
    char err[ERRBUF_MAX] = "";
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK && size_arg != NULL)
        rc = cli_parse_size(ctx, "--size", size_arg, &size);
    /* 0 used to mean "keep the size" (silently, even with --force): leaving --size out says so. */
    if (rc == EXIT_OK && size_arg != NULL && size == 0)
        rc = cli_usage_error(ctx, "--size must be more than 0 (leave it out to keep the size of "
                                  "an existing file or device)");
    if (rc == EXIT_OK && extent_arg != NULL)
        rc = cli_parse_size(ctx, "--extent-size", extent_arg, &extent);
    if (rc == EXIT_OK)
        rc = cli_blockstore(ctx, &path);
    if (rc != EXIT_OK)
        return rc;
    struct stat sb;
    int existed = stat(path, &sb) == 0;
    if (preallocate && (plx_blockstore_is_url(path) || (existed && !S_ISREG(sb.st_mode))))
        return cli_usage_error(ctx, "--preallocate is for a blockstore in a file, not %s", path);
    if (!force && existed && !plx_blockstore_is_url(path)) {
        char what[160];
        int found = signature_probe(path, what, sizeof what);
        if (found < 0)
            return cli_error("%s: looking for what it holds: %s", path, strerror(-found));
        if (found > 0)
            return cli_error("%s holds %s; use --force to overwrite it", path, what);
    }
    if (force && (existed || plx_blockstore_is_url(path)) &&
        (rc = refuse_if_in_use(path)) != EXIT_OK)
        return rc;
    int ret = plx_format(path, size, extent, force, err, sizeof err);
    if (ret < 0)
        return cli_error("%s", err[0] != '\0' ? err : strerror(-ret));
    if (preallocate && (rc = format_preallocate(path, existed)) != EXIT_OK)
        return rc;
    return report_format(ctx, path);
}

/* ---- upgrade --------------------------------------------------------------------------------- */

int cmd_upgrade(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *path = NULL;
    char err[ERRBUF_MAX] = "";
    int upgraded = 0;
    int rc = cli_parse(ctx, argc, argv, NULL, NULL, 0, 0);

    if (rc == EXIT_OK)
        rc = cli_blockstore(ctx, &path);
    if (rc != EXIT_OK)
        return rc;
    int ret = plx_store_upgrade(path, NULL, &upgraded, err, sizeof err);
    if (ret < 0)
        return cli_error("%s", err[0] != '\0' ? err : strerror(-ret));
    char shown[PATH_MAX];
    printf("%s %s: format version %u\n", upgraded ? "upgraded" : "already current:",
           plx_blockstore_shown(path, shown, sizeof shown), (unsigned)PLX_FORMAT_VERSION_CURRENT);
    return EXIT_OK;
}

/* ---- info ------------------------------------------------------------------------------------ */

static void info_json(const struct plx_store_info *in)
{
    const struct {
        const char *key;
        const uint64_t *by_type;
    } groups[] = {{"extents", in->extents_by_type},
                  {"blocks_used", in->blocks_used_by_type},
                  {"blocks_free", in->blocks_free_by_type},
                  {"blocks_leaked", in->blocks_unreachable_by_type}};
    struct json_writer w;

    json_init(&w, stdout);
    json_begin_object(&w);
    json_key(&w, "format_version");
    json_u64(&w, in->format_version);
    json_key(&w, "size_bytes");
    json_u64(&w, in->size_bytes);
    json_key(&w, "block_size");
    json_u64(&w, PLX_BLOCK_SIZE);
    json_key(&w, "block_count");
    json_u64(&w, in->block_count);
    json_key(&w, "extent_size");
    json_u64(&w, in->extent_size);
    json_key(&w, "extent_count");
    json_u64(&w, in->extent_count);
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        json_key(&w, groups[g].key);
        json_begin_object(&w);
        for (int t = 0; t < 4; t++) {
            json_key(&w, extent_type_names[t]);
            if (groups[g].by_type[t] == PLX_UNKNOWN)
                json_null(&w); /* leaked blocks behind a corrupt radix node */
            else
                json_u64(&w, groups[g].by_type[t]);
        }
        json_end_object(&w);
    }
    json_key(&w, "vdi_slots");
    json_u64(&w, in->vdi_slots);
    json_key(&w, "vdi_count");
    json_u64(&w, in->vdi_count);
    json_key(&w, "lockd_addr");
    json_string(&w, in->lockd_addr);
    json_end_object(&w);
    json_finish(&w);
}

/* why_unknown: what stopped the count of leaked blocks (the engine's message), or "". */
static void info_human(const char *path, const struct plx_store_info *in, const char *why_unknown)
{
    char size[32], extent[32];

    plx_size_format(in->size_bytes, size, sizeof size);
    plx_size_format(in->extent_size, extent, sizeof extent);
    char shown[PATH_MAX];
    printf("blockstore      %s\n", plx_blockstore_shown(path, shown, sizeof shown));
    printf("format version  %u\n", (unsigned)in->format_version);
    printf("size            %s (%llu bytes, %llu blocks)\n", size,
           (unsigned long long)in->size_bytes, (unsigned long long)in->block_count);
    printf("block size      %u\n", PLX_BLOCK_SIZE);
    printf("extent size     %s\n", extent);
    printf("extents         %llu\n", (unsigned long long)in->extent_count);
    printf("VDIs            %llu\n", (unsigned long long)in->vdi_count);
    printf("lock manager    %s\n", in->lockd_addr[0] != '\0' ? in->lockd_addr : "none");
    printf("\n%-10s %12s %14s %14s %14s\n", "TYPE", "EXTENTS", "USED BLOCKS", "FREE BLOCKS",
           "LEAKED BLOCKS");
    for (int t = 1; t <= 4; t++) {
        int type = t % 4; /* unused last: it is the least interesting row */
        char leaked[24] = "unknown";
        if (in->blocks_unreachable_by_type[type] != PLX_UNKNOWN)
            snprintf(leaked, sizeof leaked, "%llu",
                     (unsigned long long)in->blocks_unreachable_by_type[type]);
        printf("%-10s %12llu %14llu %14llu %14s\n", extent_type_names[type],
               (unsigned long long)in->extents_by_type[type],
               (unsigned long long)in->blocks_used_by_type[type],
               (unsigned long long)in->blocks_free_by_type[type], leaked);
    }
    if (in->blocks_unreachable_by_type[0] == PLX_UNKNOWN)
        printf("(leaked: unknown: %s; `parallax check` lists every problem)\n",
               *why_unknown ? why_unknown : "a radix node or snapshot log block is corrupt");
    else
        printf("(leaked: allocated, reachable from no live VDI or snapshot; `parallax gc` frees "
               "it)\n");
}

int cmd_info(struct cli_ctx *ctx, int argc, char **argv)
{
    int json = 0;
    const struct cli_opt opts[] = {{"json", 0, NULL, &json}, {0}};
    struct plx_store_info info;
    const char *path = NULL;
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    if (rc == EXIT_OK)
        rc = cli_blockstore(ctx, &path);
    if (rc == EXIT_OK)
        rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    int err = plx_store_info(st, &info);
    if (err < 0)
        return cli_close_store(st, cli_engine_error(st, err));
    /* The count of leaked blocks stops at the first corrupt structure; its message is the
     * store's last. */
    const char *why = info.blocks_unreachable_by_type[0] == PLX_UNKNOWN ? plx_store_errmsg(st) : "";
    if (json)
        info_json(&info);
    else
        info_human(path, &info, why ? why : "");
    return cli_close_store(st, EXIT_OK);
}

/* ---- check ----------------------------------------------------------------------------------- */

#define LIVE_PASSES 5       /* --live: most passes before what persists is reported */
#define LIVE_PAUSE_US 200000 /* between passes: let half-made changes finish */

struct check_out {
    char **lines; /* "error: ..." and "warning: ..." of one pass, in the engine's order */
    size_t count, cap;
    int nomem;
};

static void lines_free(struct check_out *o)
{
    for (size_t i = 0; i < o->count; i++)
        free(o->lines[i]);
    free(o->lines);
    memset(o, 0, sizeof *o);
}

static void keep_line(struct check_out *o, char *s)
{
    if (s == NULL) {
        o->nomem = 1;
        return;
    }
    if (o->count == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        char **lines = realloc(o->lines, cap * sizeof *lines);
        if (lines == NULL) {
            free(s);
            o->nomem = 1;
            return;
        }
        o->lines = lines;
        o->cap = cap;
    }
    o->lines[o->count++] = s;
}

static void check_report(void *arg, int is_error, const char *line)
{
    const char *kind = is_error ? "error: " : "warning: ";
    size_t len = strlen(kind) + strlen(line) + 1;
    char *s = malloc(len);
    if (s != NULL)
        snprintf(s, len, "%s%s", kind, line);
    keep_line(arg, s);
}

static int is_error_line(const char *s)
{
    return strncmp(s, "error: ", 7) == 0;
}

static int has_line(const struct check_out *o, const char *s)
{
    for (size_t i = 0; i < o->count; i++)
        if (strcmp(o->lines[i], s) == 0)
            return 1;
    return 0;
}

/* --live: keep the error lines of `prev` that `cur` reports too, and every warning of `cur`:
 * a problem that a writer's half-made change showed goes away on the next pass; a real one
 * stays, with the same text. Returns the errors that did not persist. */
static uint64_t keep_persistent(struct check_out *prev, struct check_out *cur)
{
    uint64_t gone = 0;
    struct check_out next = {0};
    for (size_t i = 0; i < cur->count; i++) {
        char *s = cur->lines[i];
        cur->lines[i] = NULL;
        if (!is_error_line(s) || has_line(prev, s))
            keep_line(&next, s);
        else
            free(s);
    }
    for (size_t i = 0; i < prev->count; i++)
        if (is_error_line(prev->lines[i]) && !has_line(&next, prev->lines[i]))
            gone++;
    next.nomem |= prev->nomem | cur->nomem;
    lines_free(prev);
    lines_free(cur);
    *prev = next;
    return gone;
}

static uint64_t count_errors(const struct check_out *o)
{
    uint64_t n = 0;
    for (size_t i = 0; i < o->count; i++)
        n += is_error_line(o->lines[i]) != 0;
    return n;
}

static void check_json(const struct plx_check_report *r, const struct check_out *o, int live,
                       unsigned passes, uint64_t transient)
{
    const struct {
        const char *key;
        uint64_t value;
    } counts[] = {{"errors", r->errors},
                  {"leaked_blocks", r->leaked_blocks},
                  {"reachable_blocks", r->reachable_blocks},
                  {"trees", r->trees},
                  {"snapshots", r->snapshots}};
    struct json_writer w;

    json_init(&w, stdout);
    json_begin_object(&w);
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        json_key(&w, counts[i].key);
        json_u64(&w, counts[i].value);
    }
    if (live) {
        json_key(&w, "passes");
        json_u64(&w, passes);
        json_key(&w, "transient_errors");
        json_u64(&w, transient);
    }
    json_key(&w, "messages");
    json_begin_array(&w);
    for (size_t i = 0; i < o->count; i++)
        json_string(&w, o->lines[i]);
    json_end_array(&w);
    json_end_object(&w);
    json_finish(&w);
}

/* One pass over a freshly opened store (nothing cached from an earlier pass). */
static int check_pass(const struct cli_ctx *ctx, struct plx_check_report *rep,
                      struct check_out *out, int refuse_writers, struct progress *prog)
{
    plx_store *st = NULL;
    int rc = cli_open_store(ctx, 1, &st);
    if (rc != EXIT_OK)
        return rc;
    if (refuse_writers) {
        char who[PLX_NAME_MAX + 160];
        int n = plx_store_writers(st, who, sizeof who);
        if (n < 0)
            return cli_close_store(st, cli_engine_error(st, n));
        if (n > 0) {
            cli_error("check: not run: %s%s. A check beside a writer sees its changes half "
                      "made; stop the writer, or run 'parallax check --live', which reports "
                      "only the problems that persist",
                      who, n > 1 ? " (and other processes write too)" : "");
            return cli_close_store(st, EXIT_BUSY);
        }
    }
    struct plx_check_opts co = {.struct_size = sizeof co,
                                .report = check_report,
                                .report_arg = out,
                                .progress = progress_step,
                                .progress_arg = prog};
    int err = plx_check_ex(st, &co, rep);
    progress_clear(prog);
    return cli_close_store(st, err < 0 ? cli_engine_error(st, err) : EXIT_OK);
}

int cmd_check(struct cli_ctx *ctx, int argc, char **argv)
{
    int json = 0, live = 0, quiet = 0;
    const struct cli_opt opts[] = {
        {"json", 0, NULL, &json}, {"live", 0, NULL, &live}, {"quiet", 0, NULL, &quiet}, {0}};
    struct progress prog;
    struct plx_check_report report = {0};
    struct check_out out = {0};
    uint64_t transient = 0;
    unsigned passes = 1;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);

    progress_init(&prog, "check", quiet);
    if (rc == EXIT_OK)
        rc = check_pass(ctx, &report, &out, !live, &prog);
    while (rc == EXIT_OK && live && count_errors(&out) > 0 && passes < LIVE_PASSES) {
        struct plx_check_report again = {0};
        struct check_out cur = {0};
        usleep(LIVE_PAUSE_US);
        rc = check_pass(ctx, &again, &cur, 0, &prog);
        passes++;
        if (rc != EXIT_OK) {
            lines_free(&cur);
            break;
        }
        transient += keep_persistent(&out, &cur);
        report = again;
        report.errors = count_errors(&out);
    }
    if (rc == EXIT_OK) {
        if (json)
            check_json(&report, &out, live, passes, transient);
        else {
            for (size_t i = 0; i < out.count; i++)
                printf("%s\n", out.lines[i]);
            printf("check: %llu errors, %llu leaked blocks, %llu trees, %llu snapshots",
                   (unsigned long long)report.errors, (unsigned long long)report.leaked_blocks,
                   (unsigned long long)report.trees, (unsigned long long)report.snapshots);
            if (live)
                printf(" (%u pass%s; %llu problems seen beside writers did not persist)", passes,
                       passes == 1 ? "" : "es", (unsigned long long)transient);
            printf("\n");
        }
        if (out.nomem)
            rc = cli_error("check: out of memory keeping the messages");
        else if (report.errors > 0)
            rc = cli_error("check found %llu error%s", (unsigned long long)report.errors,
                           report.errors == 1 ? "" : "s");
    }
    lines_free(&out);
    return rc;
}
