/*
 * cmd_gc.c - `parallax gc [--dry-run] [--json] [--quiet]`: run the garbage collector (the logic is
 * plx_gc in libparallax/collector/gc.c) and report what it freed.
 */
#include <stdio.h>

#include "commands.h"
#include "json.h"
#include "progress.h"

static const char *const type_names[4] = {"unused", "system", "metadata", "data"};

static void report_json(const struct plx_gc_report *r, int dry_run)
{
    struct json_writer w;
    json_init(&w, stdout);
    json_begin_object(&w);
    json_key(&w, "dry_run");
    json_u64(&w, (uint64_t)dry_run);
    json_key(&w, "store_blocks");
    json_u64(&w, r->store_blocks);
    json_key(&w, "metadata_read");
    json_u64(&w, r->metadata_read);
    json_key(&w, "reachable");
    json_u64(&w, r->reachable);
    json_key(&w, "freed");
    json_begin_object(&w);
    for (int t = 2; t < 4; t++) {
        json_key(&w, type_names[t]);
        json_u64(&w, r->freed_by_type[t]);
    }
    json_end_object(&w);
    json_key(&w, "extents_released");
    json_u64(&w, r->extents_released);
    json_key(&w, "extents_skipped");
    json_u64(&w, r->extents_skipped);
    json_key(&w, "vdis_purged");
    json_u64(&w, r->vdis_purged);
    json_key(&w, "seconds");
    json_double(&w, r->seconds);
    json_end_object(&w);
    json_finish(&w);
}

static void report_human(const struct plx_gc_report *r, int dry_run)
{
    double gib = (double)r->store_blocks * PLX_BLOCK_SIZE / (double)(1ull << 30);
    printf("gc: %s %llu metadata and %llu data blocks; %llu extents released, %llu VDI records "
           "purged\n",
           dry_run ? "would free" : "freed", (unsigned long long)r->freed_by_type[2],
           (unsigned long long)r->freed_by_type[3], (unsigned long long)r->extents_released,
           (unsigned long long)r->vdis_purged);
    printf("gc: %llu blocks reachable, %llu radix nodes read, %.2f GiB of blockstore in %.3f s "
           "(%.1f GiB/s)\n",
           (unsigned long long)r->reachable, (unsigned long long)r->metadata_read, gib,
           r->seconds, r->seconds > 0 ? gib / r->seconds : 0.0);
    if (r->extents_skipped)
        printf("gc: %llu extents skipped: held by running writers (collected once released)\n",
               (unsigned long long)r->extents_skipped);
}

int cmd_gc(struct cli_ctx *ctx, int argc, char **argv)
{
    int dry_run = 0, json = 0, quiet = 0;
    const struct cli_opt opts[] = {
        {"dry-run", 0, NULL, &dry_run}, {"json", 0, NULL, &json}, {"quiet", 0, NULL, &quiet}, {0}};
    plx_store *st = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);
    if (rc == EXIT_OK)
        rc = cli_open_store_aio(ctx, dry_run, &st);
    if (rc != EXIT_OK)
        return rc;
    struct progress prog;
    progress_init(&prog, "gc", quiet);
    struct plx_gc_opts go = {.struct_size = sizeof go,
                             .dry_run = dry_run,
                             .progress = progress_step,
                             .progress_arg = &prog};
    struct plx_gc_report r;
    int err = plx_gc_ex(st, &go, &r);
    progress_clear(&prog);
    if (err < 0)
        return cli_close_store(st, cli_engine_error(st, err));
    if (json)
        report_json(&r, dry_run);
    else
        report_human(&r, dry_run);
    return cli_close_store(st, EXIT_OK);
}
