/*
 * nbd_wcache.c - the write cache's modes for the VDIs the server opens for writing: the mode
 * every VDI gets once open (on, or automatic: nbd_server_cache_all), and the automatic mode's
 * timer, which applies its rule to every export's VDI.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "nbd_internal.h"

int nbd_cache_all;
double nbd_cache_all_threshold_ms;

void nbd_server_cache_all(int mode, double threshold_ms)
{
    nbd_cache_all = mode;
    nbd_cache_all_threshold_ms = threshold_ms;
}

/* A VDI just opened for writing: the write cache on (or automatic), when the server caches
 * every VDI. */
void export_opened(plx_store *st, struct export *e)
{
    if (!nbd_cache_all || !e->v || plx_vdi_readonly(e->v))
        return;
    struct plx_wcache_auto a = {.on_ms = nbd_cache_all_threshold_ms};
    int rc = plx_vdi_wcache_set_mode(e->v, nbd_cache_all, &a);
    if (rc)
        fprintf(stderr, "parallax: serve: export '%s': write cache not on: %s\n", e->name,
                plx_store_errmsg(st));
}

/* The write cache's automatic mode: its rule for every VDI open for writing (blocking while it
 * switches, as a `parallax cache` command does; plx_vdi_wcache_tick). */
static void wauto_ready(struct et_fd_handler *h, plx_store *st)
{
    struct nbd_server *srv = (struct nbd_server *)((char *)h - offsetof(struct nbd_server, wauto));
    uint64_t junk;
    if (read(h->fd, &junk, sizeof junk) < 0) {
        /* EAGAIN: a spurious wake-up. */
    }
    for (struct export *e = srv->exports; e; e = e->next) {
        if (!e->v || e->closing == 2 || plx_vdi_readonly(e->v))
            continue;
        int rc = plx_vdi_wcache_tick(e->v);
        if (rc > 0)
            fprintf(stderr,
                    "parallax: serve: export '%s': write cache %s automatically (store write "
                    "latency %.2f ms)\n",
                    e->name, rc == 1 ? "on" : "turning off (draining its last writes)",
                    plx_store_write_latency_ms(st));
        else if (rc < 0)
            fprintf(stderr, "parallax: serve: export '%s': automatic write cache: %s\n", e->name,
                    plx_store_errmsg(st));
    }
}

int nbd_wauto_start(struct nbd_server *srv)
{
    srv->wauto.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    srv->wauto.on_ready = wauto_ready;
    struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
    if (srv->wauto.fd < 0 || timerfd_settime(srv->wauto.fd, 0, &its, NULL) != 0 ||
        et_watch(srv->et, &srv->wauto) != 0) {
        int e = -errno;
        if (srv->wauto.fd >= 0)
            close(srv->wauto.fd);
        srv->wauto.fd = 0;
        return e ? e : -EIO;
    }
    return 0;
}
