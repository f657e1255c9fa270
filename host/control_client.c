/*
 * control_client.c - where control sockets live, and the client side of the protocol
 * (see parallax_control.h). Shared by the server and the `parallax` command.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "parallax_control.h"

void control_dir(char *buf, size_t len)
{
    const char *env = getenv("PARALLAX_RUN_DIR");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return;
    }
    if (access("/run", W_OK) == 0) {
        snprintf(buf, len, "/run/parallax");
        return;
    }
    snprintf(buf, len, "/tmp/parallax-%u", (unsigned)getuid());
}

void control_path(int pid, char *buf, size_t len)
{
    char dir[200];
    control_dir(dir, sizeof dir);
    snprintf(buf, len, "%.80s/serve-%d.sock", dir, pid);
}

void control_sweep_stale(void)
{
    char dir[200];
    control_dir(dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid, end = 0;
        if (sscanf(e->d_name, "serve-%d.sock%n", &pid, &end) != 1 || e->d_name[end] != '\0' ||
            pid <= 0)
            continue;
        /* Only a pid that no process has: a live one (EPERM included) may be the socket's
         * server, still serving. */
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode))
            unlink(path);
    }
    closedir(d);
}

int control_request(int pid, const char *line, char *reply, size_t replylen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    control_path(pid, sa.sun_path, sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        snprintf(reply, replylen, "cannot reach the server (pid %d) at %s: %s", pid, sa.sun_path,
                 strerror(e));
        return -e;
    }
    size_t n = strlen(line);
    ssize_t w = write(fd, line, n);
    if (w != (ssize_t)n || write(fd, "\n", 1) != 1) {
        close(fd);
        snprintf(reply, replylen, "writing to the server's control socket failed");
        return -EIO;
    }
    size_t got = 0;
    while (got + 1 < replylen) {
        ssize_t r = read(fd, reply + got, replylen - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    reply[got] = 0;
    char *nl = strchr(reply, '\n');
    if (nl)
        *nl = 0;
    if (strncmp(reply, "ok", 2) == 0)
        return 0;
    if (strncmp(reply, "err ", 4) == 0) {
        int e = atoi(reply + 4);
        char *msg = strchr(reply + 4, ' ');
        memmove(reply, msg ? msg + 1 : "", strlen(msg ? msg + 1 : "") + 1);
        return e > 0 ? -e : -EIO;
    }
    snprintf(reply, replylen, "the server closed its control socket without answering");
    return -EIO;
}
