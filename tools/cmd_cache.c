/*
 * cmd_cache.c - `parallax cache enable|disable|auto|status|discard`: the write cache of the servers
 * on this host (docs/parallax.md, "cache"; docs/DESIGN.md, "The write cache").
 *
 * The cache lives in the process that serves a VDI (`parallax serve`, tapdisk); these commands
 * find that process through the VDI's lock holder and talk to it over its control socket
 * (host/parallax_control.h). `discard` works on the blockstore itself, for a VDI nobody serves.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "parallax_control.h"
#include "json.h"
#include "size.h"
#include "utf8.h"

/* The VDIs a server on this host holds for writing (all of them, or the one named). */
static int held_vdis(plx_store *st, const char *vdi, struct plx_vdi_info **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (vdi) {
        struct plx_vdi_info *one = calloc(1, sizeof *one);
        if (!one)
            return cli_error("out of memory");
        int err = plx_vdi_lookup(st, vdi, one);
        if (err < 0) {
            free(one);
            return cli_engine_error(st, err);
        }
        if (!one->lock_pid) {
            int rc = cli_error("VDI %s is not open in a server on this host: the write cache "
                               "works inside the process that serves a VDI (parallax serve "
                               "--write-cache PATH, or this command once it serves it)",
                               one->name);
            free(one);
            return rc;
        }
        *out = one;
        *n = 1;
        return EXIT_OK;
    }
    struct plx_vdi_info *all;
    size_t count;
    int err = plx_vdi_list(st, &all, &count);
    if (err < 0)
        return cli_engine_error(st, err);
    size_t k = 0;
    for (size_t i = 0; i < count; i++)
        if (!all[i].deleted && all[i].lock_pid)
            all[k++] = all[i];
    *out = all;
    *n = k;
    return EXIT_OK;
}

static int send(const struct plx_vdi_info *vi, const char *line, char *reply, size_t len)
{
    int err = control_request((int)vi->lock_pid, line, reply, len);
    if (err)
        return cli_error("VDI %s (pid %u): %s", vi->name, vi->lock_pid, reply);
    return EXIT_OK;
}

/* on: 1 enable, 0 disable, 2 automatic mode with `threshold_ms` (0: the default). */
static int enable_disable(plx_store *st, const char *vdi, int on, const char *log, uint64_t size,
                          double threshold_ms)
{
    struct plx_vdi_info *v;
    size_t n;
    int rc = held_vdis(st, vdi, &v, &n);
    if (rc != EXIT_OK)
        return rc;
    if (!n) {
        free(v);
        return cli_error("no server on this host holds a VDI of this blockstore");
    }
    for (size_t i = 0; i < n && rc == EXIT_OK; i++) {
        char line[400], reply[512];
        if (on && log) {
            snprintf(line, sizeof line, "cache-attach %llu %llu %s", (unsigned long long)v[i].id,
                     (unsigned long long)size, log);
            rc = send(&v[i], line, reply, sizeof reply);
            if (rc != EXIT_OK)
                break;
        }
        if (on == 2)
            snprintf(line, sizeof line, "cache-auto %llu %.3f", (unsigned long long)v[i].id,
                     threshold_ms);
        else
            snprintf(line, sizeof line, "cache-%s %llu", on ? "enable" : "disable",
                     (unsigned long long)v[i].id);
        rc = control_request((int)v[i].lock_pid, line, reply, sizeof reply) == 0
                 ? EXIT_OK
                 : cli_error("VDI %s (pid %u): %s%s", v[i].name, v[i].lock_pid, reply,
                             on && !log && strstr(reply, "no write log") != NULL
                                 ? ": give it one with --log PATH (and --size SIZE), or start "
                                   "the server with --write-cache PATH"
                                 : "");
        if (rc == EXIT_OK && on == 2)
            printf("%s: write cache automatic (on above %.3g ms of store write latency)\n",
                   v[i].name, threshold_ms > 0 ? threshold_ms : PLX_WCACHE_AUTO_ON_MS);
        else if (rc == EXIT_OK)
            printf("%s: write cache %s\n", v[i].name, on ? "on" : "off (drained)");
    }
    free(v);
    return rc;
}

/* One value of a "key=value ..." status reply ("" when absent; path and error run to the end
 * of their field: error is last, path is followed by " error=" or the end). */
static void field(const char *reply, const char *key, char *out, size_t len)
{
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(reply, pat);
    *out = 0;
    if (!p)
        return;
    p += strlen(pat);
    const char *end = strcmp(key, "error") == 0 ? p + strlen(p)
                      : strcmp(key, "path") == 0
                          ? (strstr(p, " error=") ? strstr(p, " error=") : p + strlen(p))
                          : p + strcspn(p, " ");
    snprintf(out, len, "%.*s", (int)(end - p), p);
}

static uint64_t ufield(const char *reply, const char *key)
{
    char v[32];
    field(reply, key, v, sizeof v);
    return strtoull(v, NULL, 10);
}

/* The name padded to 20 terminal columns (not bytes: names may be UTF-8), as the rows' first
 * column. */
static const char *padded(const char *name, char *buf, size_t len)
{
    size_t w = utf8_width(name);
    snprintf(buf, len, "%s%*s", name, w < 20 ? (int)(20 - w) : 0, "");
    return buf;
}

static int status(plx_store *st, int json)
{
    struct plx_vdi_info *v;
    size_t n;
    int rc = held_vdis(st, NULL, &v, &n);
    if (rc != EXIT_OK)
        return rc;
    struct json_writer w;
    if (json) {
        json_init(&w, stdout);
        json_begin_array(&w);
    } else if (!n) {
        printf("no server on this host holds a VDI of this blockstore\n");
    }
    for (size_t i = 0; i < n; i++) {
        char line[64], reply[1024], path[300], error[300], mode[8], setting[8], num[32], sz[4][32];
        char drain[16], name[PLX_NAME_MAX + 24];
        snprintf(line, sizeof line, "cache-status %llu", (unsigned long long)v[i].id);
        int err = control_request((int)v[i].lock_pid, line, reply, sizeof reply);
        if (err) {
            if (!json)
                printf("%s pid %-7u  (no answer: %s)\n", padded(v[i].name, name, sizeof name),
                       v[i].lock_pid, reply);
            continue;
        }
        field(reply, "vdi", mode, sizeof mode);
        field(reply, "mode", setting, sizeof setting); /* "" from a server without auto */
        int automatic = strcmp(setting, "auto") == 0;
        field(reply, "threshold", num, sizeof num);
        double threshold = strtod(num, NULL);
        field(reply, "latency", num, sizeof num);
        double latency = strtod(num, NULL);
        field(reply, "path", path, sizeof path);
        field(reply, "error", error, sizeof error);
        field(reply, "drain", drain, sizeof drain); /* "" from a server before the policy */
        uint64_t delay_ms = ufield(reply, "drain_delay_ms"),
                 max_age_ms = ufield(reply, "drain_max_age_ms"),
                 oldest_ms = ufield(reply, "oldest_ms");
        int attached = ufield(reply, "attached") != 0, failed = ufield(reply, "failed") != 0;
        uint64_t logb = ufield(reply, "log"), used = ufield(reply, "used"),
                 backlog = ufield(reply, "backlog"), rate = ufield(reply, "rate");
        if (json) {
            json_begin_object(&w);
            json_key(&w, "vdi");
            json_string(&w, v[i].name);
            json_key(&w, "pid");
            json_u64(&w, v[i].lock_pid);
            json_key(&w, "mode");
            json_string(&w, !attached   ? "off"
                            : failed    ? "write-through (log failed)"
                            : automatic ? "auto"
                                        : mode);
            json_key(&w, "cache_on");
            json_bool(&w, attached && !failed && strcmp(mode, "on") == 0);
            json_key(&w, "auto_threshold_ms");
            if (automatic)
                json_double(&w, threshold);
            else
                json_null(&w);
            json_key(&w, "store_write_latency_ms");
            json_double(&w, latency);
            json_key(&w, "log");
            if (attached)
                json_string(&w, path);
            else
                json_null(&w);
            json_key(&w, "log_bytes");
            json_u64(&w, logb);
            json_key(&w, "used_bytes");
            json_u64(&w, used);
            json_key(&w, "backlog_bytes");
            json_u64(&w, backlog);
            json_key(&w, "backlog_records");
            json_u64(&w, ufield(reply, "records"));
            json_key(&w, "drained_bytes");
            json_u64(&w, ufield(reply, "drained"));
            json_key(&w, "drain_rate_bytes_per_s");
            json_u64(&w, rate);
            /* The drain's policy (docs/DESIGN.md, "The deferred drain"): what it does now, the
             * idle window and max age it defers for, and the oldest record's age. */
            json_key(&w, "drain");
            if (drain[0] && strcmp(drain, "-") != 0)
                json_string(&w, drain);
            else
                json_null(&w);
            json_key(&w, "drain_delay_ms");
            json_u64(&w, delay_ms);
            json_key(&w, "drain_max_age_ms");
            json_u64(&w, max_age_ms);
            json_key(&w, "oldest_record_ms");
            json_u64(&w, oldest_ms);
            /* How the log was written (0 from an older server): data bytes, and of them the
             * bytes and records written straight from the writers' buffers (no copy). */
            json_key(&w, "logged_bytes");
            json_u64(&w, ufield(reply, "logged"));
            json_key(&w, "zc_bytes");
            json_u64(&w, ufield(reply, "zc"));
            json_key(&w, "zc_records");
            json_u64(&w, ufield(reply, "zc_records"));
            json_key(&w, "error");
            if (error[0])
                json_string(&w, error);
            else
                json_null(&w);
            json_end_object(&w);
            continue;
        }
        if (!attached) {
            printf("%s pid %-7u  cache off (no write log attached)\n",
                   padded(v[i].name, name, sizeof name), v[i].lock_pid);
            continue;
        }
        plx_size_format(logb, sz[0], sizeof sz[0]);
        plx_size_format(used, sz[1], sizeof sz[1]);
        plx_size_format(backlog, sz[2], sizeof sz[2]);
        plx_size_format(rate, sz[3], sizeof sz[3]);
        char shown[64];
        if (failed)
            snprintf(shown, sizeof shown, "failed, writing through");
        else if (automatic)
            snprintf(shown, sizeof shown, "%s (auto: on above %.3g ms, store %.3g ms)", mode,
                     threshold, latency);
        else
            snprintf(shown, sizeof shown, "%s", mode);
        /* Why the drain waits, when it does: all of these hold until one flips. */
        char why[200] = "";
        if (!strcmp(drain, "deferred"))
            snprintf(why, sizeof why,
                     " (deferred: writes within %llu ms, log under half full, oldest record "
                     "%llu ms < %llu ms)",
                     (unsigned long long)delay_ms, (unsigned long long)oldest_ms,
                     (unsigned long long)max_age_ms);
        else if (drain[0])
            snprintf(why, sizeof why, " (%s)", drain);
        printf("%s pid %-7u  cache %-3s  log %s: %s of %s used, backlog %s, drain %s/s%s%s%s\n",
               padded(v[i].name, name, sizeof name), v[i].lock_pid, shown, path, sz[1], sz[0],
               sz[2], sz[3], why, error[0] ? "\n    " : "", error);
    }
    if (json) {
        json_end_array(&w);
        json_finish(&w);
    }
    free(v);
    return EXIT_OK;
}

static int discard(const struct cli_ctx *ctx, plx_store *st, const char *vdi, int force)
{
    if (!force)
        return cli_usage_error(ctx,
                               "discard drops the writes of VDI %s that a write log holds and "
                               "the blockstore does not: the VDI goes back to an older point. "
                               "Give --force to do it",
                               vdi);
    int err = plx_vdi_wcache_discard(st, vdi);
    if (err < 0)
        return cli_engine_error(st, err);
    fprintf(stderr,
            "parallax: warning: the writes of VDI %s that were still in a write log are lost; "
            "it now holds what the blockstore had, an older point in its history\n",
            vdi);
    return EXIT_OK;
}

int cmd_cache(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *log = NULL, *size_s = NULL, *threshold_s = NULL;
    int all = 0, json = 0, force = 0;
    const struct cli_opt opts[] = {{"log", 1, &log, NULL},
                                   {"size", 1, &size_s, NULL},
                                   {"threshold", 1, &threshold_s, NULL},
                                   {"all", 0, NULL, &all},
                                   {"json", 0, NULL, &json},
                                   {"force", 0, NULL, &force},
                                   {0}};
    const char *pos[2] = {NULL, NULL};
    int rc = cli_parse(ctx, argc, argv, opts, pos, 1, 2);
    if (rc != EXIT_OK)
        return rc;
    const char *sub = pos[0], *vdi = pos[1];
    bool automatic = !strcmp(sub, "auto");
    bool toggle = !strcmp(sub, "enable") || !strcmp(sub, "disable") || automatic;
    if (toggle && !!vdi == !!all)
        return cli_usage_error(ctx, "cache %s: give a VDI or --all", sub);
    if (!strcmp(sub, "status") && vdi)
        return cli_usage_error(ctx, "cache status takes no VDI");
    if (!strcmp(sub, "discard") && !vdi)
        return cli_usage_error(ctx, "cache discard: give the VDI");
    if ((log || size_s) && strcmp(sub, "enable") && !automatic)
        return cli_usage_error(ctx, "--log and --size go with cache enable or cache auto");
    if (threshold_s && !automatic)
        return cli_usage_error(ctx, "--threshold goes with cache auto");
    if (!toggle && strcmp(sub, "status") && strcmp(sub, "discard"))
        return cli_usage_error(
            ctx, "cache takes enable, disable, auto, status or discard, not '%s'", sub);
    double threshold = 0;
    if (threshold_s) {
        char *end;
        threshold = strtod(threshold_s, &end);
        if (end == threshold_s || *end || !(threshold > 0 && threshold <= 60000))
            return cli_usage_error(ctx,
                                   "--threshold '%s': expected milliseconds, above 0 and at "
                                   "most 60000",
                                   threshold_s);
    }
    uint64_t size = 0;
    if (size_s && (rc = cli_parse_size(ctx, "--size", size_s, &size)) != EXIT_OK)
        return rc;
    /* The server runs elsewhere: it needs the log's absolute path. */
    char abs_log[300], cwd[256];
    if (log && log[0] != '/' && getcwd(cwd, sizeof cwd)) {
        snprintf(abs_log, sizeof abs_log, "%s/%s", cwd, log);
        log = abs_log;
    }
    plx_store *st = NULL;
    rc = cli_open_store(ctx, strcmp(sub, "discard") != 0, &st);
    if (rc != EXIT_OK)
        return rc;
    if (toggle)
        rc = enable_disable(st, vdi, automatic ? 2 : !strcmp(sub, "enable"), log, size, threshold);
    else if (!strcmp(sub, "status"))
        rc = status(st, json);
    else
        rc = discard(ctx, st, vdi, force);
    return cli_close_store(st, rc);
}
