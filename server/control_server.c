/*
 * control_server.c - the server side of the control socket (protocol in control.h). Everything
 * here runs on the engine thread, so commands are ordinary requests in the VDI's stream.
 */
#define PLX_CONTROL_SERVER
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"

struct ctl_client {
    struct et_fd_handler h;
    char line[512];
    size_t got;
    uint64_t index;           /* snapshot result */
    plx_store *st;
};

static struct et *ctl_et;
static struct et_fd_handler listener = {.fd = -1};
static char sock_path[108];
static plx_vdi *(*ctl_find)(uint64_t id);

static void reply_close(struct ctl_client *c, const char *text)
{
    size_t n = strlen(text);
    if (write(c->h.fd, text, n) != (ssize_t)n) {
        /* The client went away; nothing to tell it. */
    }
    close(c->h.fd);
    free(c);
}

static void reply_err(struct ctl_client *c, int err, const char *msg)
{
    char buf[400];
    snprintf(buf, sizeof buf, "err %d %s\n", -err, msg);
    reply_close(c, buf);
}

static void snapshot_done(void *arg, int status)
{
    struct ctl_client *c = arg;
    if (status) {
        reply_err(c, status, plx_store_errmsg(c->st));
        return;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "ok %llu\n", (unsigned long long)c->index);
    reply_close(c, buf);
}

static void run_command(struct ctl_client *c, plx_store *st)
{
    char cmd[32] = "", label[PLX_LABEL_MAX + 2] = "";
    unsigned long long id = 0, index = 0;
    int n = sscanf(c->line, "%31s %llu", cmd, &id);
    plx_vdi *v = n == 2 ? ctl_find(id) : NULL;
    if (n != 2) {
        reply_err(c, -EINVAL, "malformed command");
        return;
    }
    if (!v) {
        reply_err(c, -ENOENT, "this server does not have that VDI open for writing");
        return;
    }
    if (strcmp(cmd, "snapshot") == 0) {
        sscanf(c->line, "%*s %*u %40s", label);
        int rc = plx_vdi_submit_snapshot(v, label, &c->index, snapshot_done, c);
        if (rc)
            reply_err(c, rc, plx_store_errmsg(st));
        return;
    }
    if (sscanf(c->line, "%*s %*u %llu %40s", &index, label) < 1) {
        reply_err(c, -EINVAL, "malformed command: snapshot index missing");
        return;
    }
    int rc;
    if (strcmp(cmd, "snap-label") == 0)
        rc = plx_vdi_snap_label(v, index, label);
    else if (strcmp(cmd, "snap-delete") == 0)
        rc = plx_vdi_snap_delete(v, index);
    else
        rc = -EINVAL;
    if (rc == -EINVAL && strcmp(cmd, "snap-label") && strcmp(cmd, "snap-delete"))
        reply_err(c, rc, "unknown command");
    else if (rc)
        reply_err(c, rc, plx_store_errmsg(st));
    else
        reply_close(c, "ok\n");
}

static void client_ready(struct et_fd_handler *h, plx_store *st)
{
    struct ctl_client *c = (struct ctl_client *)h;
    ssize_t r = read(h->fd, c->line + c->got, sizeof c->line - 1 - c->got);
    if (r <= 0) {
        et_unwatch(ctl_et, h);
        close(h->fd);
        free(c);
        return;
    }
    c->got += (size_t)r;
    c->line[c->got] = 0;
    char *nl = strchr(c->line, '\n');
    if (!nl && c->got < sizeof c->line - 1)
        return;
    if (nl)
        *nl = 0;
    /* One command per connection: stop watching; the reply closes it. */
    et_unwatch(ctl_et, h);
    c->st = st;
    run_command(c, st);
}

static void listener_ready(struct et_fd_handler *h, plx_store *st)
{
    int fd = accept4(h->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ctl_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->h.fd = fd;
    c->h.on_ready = client_ready;
    c->st = st;
    if (et_watch(ctl_et, &c->h) != 0) {
        close(fd);
        free(c);
    }
}

int control_start(struct et *et, plx_vdi *(*find_vdi)(uint64_t id), char *err, size_t errlen)
{
    char dir[200];
    control_dir(dir, sizeof dir);
    mkdir(dir, 0700);
    control_path((int)getpid(), sock_path, sizeof sock_path);
    unlink(sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
        snprintf(err, errlen, "control socket %s: %s", sock_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -errno;
    }
    ctl_et = et;
    ctl_find = find_vdi;
    listener.fd = fd;
    listener.on_ready = listener_ready;
    return et_watch(et, &listener);
}

void control_stop(void)
{
    if (listener.fd < 0)
        return;
    close(listener.fd);
    listener.fd = -1;
    unlink(sock_path);
}
