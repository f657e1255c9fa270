/*
 * tgtd.c - a real iSCSI target for unit tests (tgtd.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tgtd.h"

#define IQN "iqn.2026-11.org.parallax.test:unit"

static pid_t tgtd_pid;
static int tgtd_port, tgtd_ctl;
static char lun_dir[4096];

int tu_tgtd_running(void)
{
    return tgtd_pid > 0;
}

int tu_tgtd_port(void)
{
    return tgtd_port;
}

int tu_tgtd_ctl(void)
{
    return tgtd_ctl;
}

const char *tu_tgtd_iqn(void)
{
    return IQN;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

static int portal_answers(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)tgtd_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (s >= 0)
        close(s);
    return ok;
}

int tu_tgtd_adm(const char *fmt, ...)
{
    char args[1024], cmd[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "tgtadm -C %d --lld iscsi %s >/dev/null 2>&1", tgtd_ctl, args);
    int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static pid_t starter;

/* Only the process that started tgtd stops it: Check's forked children inherit atexit. */
static void stop_at_exit(void)
{
    if (getpid() != starter || tgtd_pid <= 0)
        return;
    kill(tgtd_pid, SIGKILL);
    waitpid(tgtd_pid, NULL, 0);
    tgtd_pid = 0;
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", lun_dir);
    if (system(cmd) != 0) {
        /* A leftover temp dir is not worth failing the run for. */
    }
}

static int launch(char *why, size_t whylen)
{
    char ctl[16], portal[64];
    snprintf(ctl, sizeof(ctl), "%d", tgtd_ctl);
    snprintf(portal, sizeof(portal), "portal=127.0.0.1:%d", tgtd_port);
    char log[4200];
    snprintf(log, sizeof(log), "%s/tgtd.log", lun_dir);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* Never outlive the test, even when it crashes. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execlp("tgtd", "tgtd", "-f", "-C", ctl, "--iscsi", portal, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            snprintf(why, whylen, "tgtd exited (status %d); see %s", status, log);
            return -1;
        }
        if (tu_tgtd_adm("--op show --mode sys") == 0 && portal_answers()) {
            tgtd_pid = pid;
            return 0;
        }
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    snprintf(why, whylen, "tgtd did not answer within 5 s; see %s", log);
    return -1;
}

int tu_tgtd_start(char *why, size_t whylen)
{
    if (geteuid() != 0) {
        snprintf(why, whylen, "tgtd needs root (its control socket is in /var/run/tgtd)");
        return -1;
    }
    if (system("command -v tgtd >/dev/null 2>&1 && command -v tgtadm >/dev/null 2>&1") != 0) {
        snprintf(why, whylen, "tgtd/tgtadm not installed (Debian package tgt)");
        return -1;
    }
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(lun_dir, sizeof(lun_dir), "%s/plx-tgtd-XXXXXX", tmp);
    if (mkdtemp(lun_dir) == NULL) {
        snprintf(why, whylen, "mkdtemp %s: %s", lun_dir, strerror(errno));
        lun_dir[0] = '\0';
        return -1;
    }
    starter = getpid();
    atexit(stop_at_exit);
    srand((unsigned)getpid());
    for (int attempt = 0; attempt < 5; attempt++) {
        tgtd_port = free_port();
        tgtd_ctl = 20000 + rand() % 12000; /* tgtd takes -C up to 32767 */
        if (tgtd_port > 0 && launch(why, whylen) == 0)
            break;
    }
    if (tgtd_pid <= 0) {
        char cmd[4200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", lun_dir);
        if (system(cmd) != 0) {
            /* Only a leftover temp dir. */
        }
        return -1;
    }
    if (tu_tgtd_adm("--op new --mode target --tid 1 -T %s", IQN) != 0 ||
        tu_tgtd_adm("--op bind --mode target --tid 1 -I ALL") != 0) {
        snprintf(why, whylen, "tgtadm could not create the target");
        return -1;
    }
    return 0;
}

int tu_tgtd_new_lun(uint64_t bytes, unsigned lba_size, char *url, size_t urllen)
{
    static unsigned next;
    char path[4200];
    snprintf(path, sizeof(path), "%s/lun-%d-%u.img", lun_dir, (int)getpid(), next);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    /* Children of one run are sequential; start each one's search at a different place. */
    unsigned start = (unsigned)getpid() * 7u + next++;
    for (unsigned i = 0; i < 254; i++) {
        int lun = 1 + (int)((start + i) % 254); /* never 255: tests ask for it as missing */
        if (tu_tgtd_adm("--op new --mode logicalunit --tid 1 --lun %d -b %s --blocksize=%u", lun,
                        path, lba_size) == 0) {
            /* tgtd holds the file open; the name is not needed. */
            unlink(path);
            snprintf(url, urllen, "iscsi://127.0.0.1:%d/%s/%d", tgtd_port, IQN, lun);
            return lun;
        }
    }
    unlink(path);
    return -1;
}
