/*
 * cmd_serve.c - `parallax serve (--unix PATH | --port N) [--ipaddr ADDR] [--cache SIZE]
 * [--tls=off|on|require] [--tls-certificates DIR] [--tls-psk FILE] [--tls-verify-peer]
 * [--write-cache PATH [--write-cache-size SIZE] [--write-cache-mode on|auto]
 * [--write-cache-threshold MS]]`: export every VDI (read-write) and snapshot (read-only) over
 * NBD; with --write-cache, through a write log on this host's disk (the log is replayed first,
 * and the cache is on, or automatic, for every VDI opened for writing). Without --write-cache
 * or $PARALLAX_WRITE_CACHE, the host's settings file /etc/parallax/write-cache may name the log
 * (plx_wcache_config_read).
 *
 * The server (server/nbd_server.c) runs in this process, on the engine thread, next to the
 * control socket, until SIGINT or SIGTERM.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "cli.h"
#include "commands.h"
#include "parallax_control.h"
#include "engine_thread.h"
#include "nbd_server.h"

/* The control socket on the engine thread's loop (struct control_host). */
struct serve_watch {
    struct et_fd_handler h; /* first: the handler is the watch */
    void (*ready)(void *arg);
    void *arg;
};

static void serve_watch_ready(struct et_fd_handler *h, plx_store *st)
{
    struct serve_watch *w = (struct serve_watch *)h;
    w->ready(w->arg); /* may unwatch (free) w: nothing touches it afterwards */
}

static void *serve_watch(void *host_arg, int fd, void (*ready)(void *arg), void *arg)
{
    struct serve_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->h.fd = fd;
    w->h.on_ready = serve_watch_ready;
    w->ready = ready;
    w->arg = arg;
    if (et_watch(host_arg, &w->h) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void serve_unwatch(void *host_arg, void *handle)
{
    struct serve_watch *w = handle;
    et_unwatch(host_arg, &w->h);
    free(w);
}

static plx_vdi *serve_find_vdi(void *host_arg, uint64_t id, plx_store **st, int *err)
{
    *st = et_store(host_arg);
    *err = 0;
    return nbd_server_find_writable(id);
}

/* Attach the write log on the engine thread, before any client can connect. */
struct attach_job {
    struct et_job job;
    const char *path;
    uint64_t size;
};

static void attach_run(struct et_job *job, plx_store *st)
{
    struct attach_job *a = (struct attach_job *)job;
    int rc = plx_wcache_attach(st, a->path, a->size);
    if (rc == 0) {
        struct plx_wcache_status ws;
        plx_wcache_status(st, &ws);
        fprintf(stderr, "parallax: serve: write cache %s (%llu MiB)%s", a->path,
                (unsigned long long)(ws.log_bytes >> 20), ws.replayed_records ? "" : "\n");
        if (ws.replayed_records)
            fprintf(stderr, ": replayed %llu writes left in it\n",
                    (unsigned long long)ws.replayed_records);
    }
    et_job_done(job, st, rc);
}

/* The control socket's stop on the engine thread, which serves it. */
static void control_stop_run(struct et_job *job, plx_store *st)
{
    control_stop();
    et_job_done(job, st, 0);
}

/* The built-in server: runs until SIGINT or SIGTERM. */
static int serve_builtin(const char *path, uint64_t cache_bytes, int placement,
                         const char *unix_path, const char *port, const char *ipaddr,
                         const struct nbd_tls_config *tls, const char *wcache, uint64_t wcache_size,
                         int wmode, double wthreshold)
{
    /* Block the stop signals in every thread (the engine thread inherits the mask); sigwait. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512];
    struct et *et = NULL;
    if (et_start(path, cache_bytes, placement, &et, err, sizeof err) != 0)
        return cli_error("%s", err);
    if (wcache) {
        struct attach_job a = {.path = wcache, .size = wcache_size};
        a.job.fn = attach_run;
        if (et_call(et, &a.job) != 0) {
            et_stop(et);
            return cli_error("%s", a.job.errmsg);
        }
        nbd_server_cache_all(wmode, wthreshold);
    }
    /* The control socket before the NBD listener: once a client can open a VDI here, a
     * `parallax vdi-snapshot` of it must find this server. The other way round, a script that
     * waited for the NBD socket, wrote and then snapshotted could find the VDI held and no control
     * socket yet ("not a server": seen once in make check at load 15). */
    const struct control_host ctl = {
        .watch = serve_watch, .unwatch = serve_unwatch, .find_vdi = serve_find_vdi, .host_arg = et};
    bool ctl_up = control_start(&ctl, err, sizeof err) == 0;
    if (!ctl_up)
        cli_error("%s (live snapshots through `parallax` will not find this server)", err);
    struct nbd_server *srv = NULL;
    if (nbd_server_start(et, unix_path, port, ipaddr, tls, &srv, err, sizeof err) != 0) {
        if (ctl_up) {
            struct et_job ctl_stop = {.fn = control_stop_run};
            (void)et_call(et, &ctl_stop);
        }
        et_stop(et);
        return cli_error("%s", err);
    }
    /* With --port 0 the kernel picked the port: say which, once listening, so a script (or a
     * test beside others) can connect to this server and no other. */
    if (port && strtol(port, NULL, 10) == 0) {
        fprintf(stderr, "parallax: serve: listening on %s port %u\n", ipaddr ? ipaddr : "127.0.0.1",
                (unsigned)nbd_server_port(srv));
        fflush(stderr);
    }
    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    nbd_server_stop(srv); /* also stops the control socket */
    et_stop(et);
    return EXIT_OK;
}

/* A decimal port 1..65535: getaddrinfo would take 0 (any port), 99999 (wrapped) or a service
 * name, and the server would listen somewhere the user did not ask for. */
static int valid_port(const char *s)
{
    if (*s == 0 || strlen(s) > 5)
        return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    long v = strtol(s, NULL, 10);
    return v >= 0 && v <= 65535;
}

int cmd_serve(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *unix_path = NULL, *port = NULL, *ipaddr = NULL, *cache = NULL;
    const char *tls = NULL, *tls_certs = NULL, *tls_psk = NULL, *placement = NULL;
    const char *wcache = NULL, *wcache_size = NULL, *wcache_mode = NULL, *wcache_thr = NULL;
    int tls_verify = 0;
    const struct cli_opt opts[] = {{"unix", 1, &unix_path, NULL},
                                   {"port", 1, &port, NULL},
                                   {"ipaddr", 1, &ipaddr, NULL},
                                   {"cache", 1, &cache, NULL},
                                   {"placement", 1, &placement, NULL},
                                   {"tls", 1, &tls, NULL},
                                   {"tls-certificates", 1, &tls_certs, NULL},
                                   {"tls-psk", 1, &tls_psk, NULL},
                                   {"tls-verify-peer", 0, NULL, &tls_verify},
                                   {"write-cache", 1, &wcache, NULL},
                                   {"write-cache-size", 1, &wcache_size, NULL},
                                   {"write-cache-mode", 1, &wcache_mode, NULL},
                                   {"write-cache-threshold", 1, &wcache_thr, NULL},
                                   {0}};
    const char *path = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);
    if (rc == EXIT_OK && !!unix_path == !!port)
        rc = cli_usage_error(ctx, "give exactly one of --unix PATH and --port N");
    if (rc == EXIT_OK && port && !valid_port(port))
        rc = cli_usage_error(
            ctx, "--port '%s': not a TCP port number (1 to 65535, or 0 for any free port)", port);
    if (rc == EXIT_OK)
        rc = cli_blockstore(ctx, &path);
    uint64_t cache_bytes = 0;
    if (rc == EXIT_OK && cache)
        rc = cli_parse_size(ctx, "--cache", cache, &cache_bytes);
    struct nbd_tls_config tcfg = {
        .mode = NBD_TLS_OFF, .cert_dir = tls_certs, .psk_file = tls_psk, .verify_peer = tls_verify};
    if (rc == EXIT_OK && tls && nbd_tls_parse_mode(tls, &tcfg.mode) != 0)
        rc = cli_usage_error(ctx, "--tls takes off, on or require, not '%s'", tls);
    int place = PLX_PLACEMENT_LEAF;
    if (rc == EXIT_OK && placement && strcmp(placement, "arrival") == 0)
        place = PLX_PLACEMENT_ARRIVAL;
    else if (rc == EXIT_OK && placement && strcmp(placement, "leaf") != 0)
        rc = cli_usage_error(ctx, "--placement takes arrival or leaf, not '%s'", placement);
    /* The service's settings file (/etc/parallax/serve/NAME.conf) may name the log instead. */
    const char *env_wcache = getenv("PARALLAX_WRITE_CACHE");
    if (!wcache && env_wcache && *env_wcache)
        wcache = env_wcache;
    uint64_t wsize = 0;
    if (rc == EXIT_OK && (wcache_size || wcache_mode || wcache_thr) && !wcache)
        rc = cli_usage_error(ctx, "--write-cache-%s needs --write-cache PATH",
                             wcache_size   ? "size"
                             : wcache_mode ? "mode"
                                           : "threshold");
    if (rc == EXIT_OK && wcache_size)
        rc = cli_parse_size(ctx, "--write-cache-size", wcache_size, &wsize);
    /* Mode and threshold: the settings file's words, parsed by the same code. */
    struct plx_wcache_config opt = {.mode = PLX_WCACHE_ON};
    char wset[4400], werr[4400];
    if (rc == EXIT_OK && wcache_mode) {
        snprintf(wset, sizeof wset, "write-cache-mode=%s", wcache_mode);
        if (plx_wcache_config_set(&opt, wset, strlen(wset), werr, sizeof werr) != 0)
            rc = cli_usage_error(ctx, "--write-cache-mode takes on or auto, not '%s'", wcache_mode);
    }
    if (rc == EXIT_OK && wcache_thr) {
        snprintf(wset, sizeof wset, "write-cache-threshold=%s", wcache_thr);
        if (plx_wcache_config_set(&opt, wset, strlen(wset), werr, sizeof werr) != 0)
            rc = cli_usage_error(ctx,
                                 "--write-cache-threshold '%s': expected milliseconds, above 0 "
                                 "and at most 60000",
                                 wcache_thr);
    }
    /* Neither: the host's write-cache settings (/etc/parallax/write-cache), as tapdisk reads. */
    static struct plx_wcache_config conf;
    if (rc == EXIT_OK && !wcache) {
        char err[4400];
        if (plx_wcache_config_read(&conf, err, sizeof err) < 0)
            rc = cli_error("%s", err);
        else if (conf.path[0]) {
            wcache = conf.path;
            wsize = conf.size;
            opt.mode = conf.mode;
            opt.threshold_ms = conf.threshold_ms;
        }
    }
    if (rc != EXIT_OK)
        return rc;
    return serve_builtin(path, cache_bytes, place, unix_path, port, ipaddr, &tcfg, wcache, wsize,
                         opt.mode, opt.threshold_ms);
}
