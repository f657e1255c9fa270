/*
 * cmd_serve.c - `parallax serve (--unix PATH | --port N) [--ipaddr ADDR] [--cache SIZE]
 * [--nbdkit [--threads N]]`: export every VDI (read-write) and snapshot (read-only) over NBD.
 *
 * By default the server is built in (tapdisk/nbd_server.c): it runs in this process, on the
 * engine thread, next to the control socket, until SIGINT or SIGTERM. With --nbdkit the command
 * instead finds the Parallax nbdkit plugin (tapdisk/nbd_plugin.c) and replaces itself with
 * nbdkit (same pid, so the VDI locks it takes name this process, and `parallax vdi-snapshot`
 * finds its control socket). nbdkit leaves its --unix socket behind when it exits, so the
 * plugin is told the path (socket=PATH) and removes it at unload, as the built-in server does.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define PLX_CONTROL_SERVER
#include "cli.h"
#include "commands.h"
#include "control.h"
#include "engine_thread.h"
#include "nbd_server.h"

#define PLUGIN_NAME "nbdkit-parallax-plugin.so"

/* $PARALLAX_NBDKIT_PLUGIN, else beside this binary (the build tree), else the install dir. */
static int find_plugin(char *buf, size_t len)
{
    const char *env = getenv("PARALLAX_NBDKIT_PLUGIN");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return access(buf, R_OK) == 0 ? 0 : -errno;
    }
    char exe[PATH_MAX - 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, len, "%s/%s", exe, PLUGIN_NAME);
            if (access(buf, R_OK) == 0)
                return 0;
            snprintf(buf, len, "%s/../lib/parallax/%s", exe, PLUGIN_NAME);
            if (access(buf, R_OK) == 0)
                return 0;
        }
    }
    snprintf(buf, len, "%s", PLUGIN_NAME);
    return -ENOENT;
}

/* nbdkit 1.32.4 to 1.33.9 abort when a client hangs up while several of its requests are being
 * answered by different threads (upstream commit 9d82aa4f, "server: Don't assert on send if
 * client hangs up early"), which would take every other client's disk down with it. Debian 12
 * ships 1.32.5. On those versions one thread per connection is the safe default: requests of
 * one connection are then served one at a time (connections still run in parallel). */
static const char *default_threads(void)
{
    FILE *p = popen("nbdkit --version 2>/dev/null", "r");
    unsigned maj = 0, min = 0, pat = 0;
    if (p) {
        if (fscanf(p, "nbdkit %u.%u.%u", &maj, &min, &pat) != 3)
            maj = 0;
        pclose(p);
    }
    unsigned v = maj * 10000 + min * 100 + pat;
    return v >= 13204 && v < 13310 ? "1" : NULL;
}

/* A socket file at path that nobody accepts on (a server killed before it could remove it)
 * would make nbdkit fail with EADDRINUSE: remove it. A live server's socket is left alone. */
static void remove_stale_socket(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat sb;
    if (strlen(path) >= sizeof sa.sun_path || lstat(path, &sb) != 0 || !S_ISSOCK(sb.st_mode))
        return;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno == ECONNREFUSED)
        unlink(path);
    close(fd);
}

/* The built-in server: runs until SIGINT or SIGTERM. */
static int serve_builtin(const char *path, uint64_t cache_bytes, const char *unix_path,
                         const char *port, const char *ipaddr)
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
    if (et_start(path, cache_bytes, &et, err, sizeof err) != 0)
        return cli_error("%s", err);
    struct nbd_server *srv = NULL;
    if (nbd_server_start(et, unix_path, port, ipaddr, &srv, err, sizeof err) != 0) {
        et_stop(et);
        return cli_error("%s", err);
    }
    if (control_start(et, nbd_server_find_writable, err, sizeof err) != 0)
        cli_error("%s (live snapshots through `parallax` will not find this server)", err);
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
    return v >= 1 && v <= 65535;
}

int cmd_serve(struct cli_ctx *ctx, int argc, char **argv)
{
    const char *unix_path = NULL, *port = NULL, *ipaddr = NULL, *cache = NULL, *threads = NULL;
    int use_nbdkit = 0;
    const struct cli_opt opts[] = {{"unix", 1, &unix_path, NULL},
                                   {"port", 1, &port, NULL},
                                   {"ipaddr", 1, &ipaddr, NULL},
                                   {"cache", 1, &cache, NULL},
                                   {"nbdkit", 0, NULL, &use_nbdkit},
                                   {"threads", 1, &threads, NULL},
                                   {0}};
    const char *path = NULL;
    int rc = cli_parse(ctx, argc, argv, opts, NULL, 0, 0);
    if (rc == EXIT_OK && !!unix_path == !!port)
        rc = cli_usage_error(ctx, "give exactly one of --unix PATH and --port N");
    if (rc == EXIT_OK && port && !valid_port(port))
        rc = cli_usage_error(ctx, "--port '%s': not a TCP port number (1 to 65535)", port);
    if (rc == EXIT_OK)
        rc = cli_blockstore(ctx, &path);
    uint64_t cache_bytes = 0;
    if (rc == EXIT_OK && cache)
        rc = cli_parse_size(ctx, "--cache", cache, &cache_bytes);
    if (rc == EXIT_OK && threads && !use_nbdkit)
        rc = cli_usage_error(ctx, "--threads only applies to --nbdkit");
    if (rc != EXIT_OK)
        return rc;
    if (!use_nbdkit)
        return serve_builtin(path, cache_bytes, unix_path, port, ipaddr);
    /* Fail here, with our own message, rather than inside nbdkit. */
    plx_store *st = NULL;
    rc = cli_open_store(ctx, 0, &st);
    if (rc != EXIT_OK)
        return rc;
    rc = cli_close_store(st, EXIT_OK);
    if (rc != EXIT_OK)
        return rc;

    char plugin[PATH_MAX], abs[PATH_MAX], bs_arg[PATH_MAX + 16], cache_arg[64];
    char sock_arg[PATH_MAX + 16];
    if (find_plugin(plugin, sizeof plugin) != 0)
        return cli_error("cannot find %s (set PARALLAX_NBDKIT_PLUGIN)", PLUGIN_NAME);
    if (!realpath(path, abs))
        return cli_error("%s: %s", path, strerror(errno));
    snprintf(bs_arg, sizeof bs_arg, "blockstore=%s", abs);
    snprintf(cache_arg, sizeof cache_arg, "cache=%llu", (unsigned long long)cache_bytes);

    if (!threads)
        threads = default_threads();
    char threads_arg[32];
    const char *args[16];
    int n = 0;
    args[n++] = "nbdkit";
    args[n++] = "--foreground";
    if (threads) {
        snprintf(threads_arg, sizeof threads_arg, "--threads=%s", threads);
        args[n++] = threads_arg;
    }
    if (unix_path) {
        remove_stale_socket(unix_path);
        args[n++] = "--unix";
        args[n++] = unix_path;
    } else {
        args[n++] = "--port";
        args[n++] = port;
        args[n++] = "--ipaddr";
        args[n++] = ipaddr ? ipaddr : "127.0.0.1";
    }
    args[n++] = plugin;
    args[n++] = bs_arg;
    if (cache_bytes)
        args[n++] = cache_arg;
    if (unix_path) {
        /* nbdkit runs in the foreground, in this directory: a relative path means the same. */
        snprintf(sock_arg, sizeof sock_arg, "socket=%s", unix_path);
        args[n++] = sock_arg;
    }
    args[n] = NULL;
    fflush(NULL);
    execvp("nbdkit", (char *const *)args);
    return cli_error("cannot run nbdkit: %s (install the nbdkit package)", strerror(errno));
}
