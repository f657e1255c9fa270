/*
 * test_lockd.c - an engine given several lock managers (lockd-set A,B,...: fail-over, docs/
 * DESIGN.md "Fail-over") tries them in turn: past one that refuses connections and one that is
 * a standby, to the active one; away from one that stops answering; and a store open where only
 * standbys answer waits, then fails saying why. Real parallax-lockd processes (build/, beside
 * this binary's directory) and a stand-in standby that answers every line with STANDBY.
 */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lock.h"
#include "parallax.h"
#include "testutil.h"

#define MiB (1024u * 1024u)
#define BS 4096u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void lockd_stop(pid_t pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A stand-in for a standby lock manager: answers each connection's first line with STANDBY. */
static int standby_fd = -1;

static void *standby_run(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(standby_fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char buf[512];
        if (recv(c, buf, sizeof buf, 0) > 0) {
            const char *line = "STANDBY stand-in is a standby lock manager\n";
            send(c, line, strlen(line), MSG_NOSIGNAL);
        }
        usleep(100000);
        close(c);
    }
}

static int standby_start(void)
{
    standby_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(standby_fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(standby_fd, 8), 0);
    ck_assert_int_eq(getsockname(standby_fd, (struct sockaddr *)&a, &len), 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, standby_run, NULL), 0);
    pthread_detach(t);
    return ntohs(a.sin_port);
}

/* A store on a memory medium that names the lock managers `list` ($PARALLAX_LOCKD). */
static plx_backend *medium(void)
{
    char err[256];
    plx_backend *mem = plx_backend_mem_create(16 * MiB / BS);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof err), 0);
    return mem;
}

static int open_with(plx_backend *mem, const char *list, plx_store **st, char *err, size_t len)
{
    setenv("PARALLAX_LOCKD", list, 1);
    setenv("PARALLAX_HOST_ID", "unit", 1);
    int rc = plx_store_open_backend(tu_keep_wrap(mem), NULL, st, err, len);
    unsetenv("PARALLAX_LOCKD");
    return rc;
}

START_TEST(list_skips_dead_and_standby)
{
    int dead = tu_free_port(), standby = standby_start(), live = tu_free_port();
    pid_t lockd = tu_lockd_start(live, "3");
    char list[128], err[512];
    snprintf(list, sizeof list, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", dead, standby, live);
    plx_backend *mem = medium();
    plx_store *st = NULL;
    int rc = open_with(mem, list, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open with %s: %s", list, err);
    /* Connected to the live one: its lease (3 s) is the one in force. */
    ck_assert_uint_eq(plx_lease_ns(st), 3000000000ull);
    ck_assert_int_eq(plx_admin_lock(st), 0);
    plx_admin_unlock(st);
    plx_store_close(st);
    mem->ops->destroy(mem);
    lockd_stop(lockd);
}
END_TEST

START_TEST(leaves_a_lockd_that_stops_answering)
{
    int pa = tu_free_port(), pb = tu_free_port();
    pid_t a = tu_lockd_start(pa, "2"), b = tu_lockd_start(pb, "3");
    char list[128], err[512];
    snprintf(list, sizeof list, "127.0.0.1:%d,127.0.0.1:%d", pa, pb);
    plx_backend *mem = medium();
    plx_store *st = NULL;
    ck_assert_msg(open_with(mem, list, &st, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(plx_lease_ns(st), 2000000000ull);
    /* The first one freezes: after half a lease of unanswered heartbeats the service loop moves
     * to the next (the loop never waits for it meanwhile). */
    kill(a, SIGSTOP);
    double t0 = now_s();
    while (plx_lease_ns(st) != 3000000000ull && now_s() - t0 < 10) {
        struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
        poll(&p, 1, 100);
        plx_store_service(st);
    }
    ck_assert_msg(plx_lease_ns(st) == 3000000000ull,
                  "still on the frozen lock manager after %.1f s", now_s() - t0);
    ck_assert_int_eq(plx_admin_lock(st), 0);
    plx_admin_unlock(st);
    plx_store_close(st);
    mem->ops->destroy(mem);
    lockd_stop(a);
    lockd_stop(b);
}
END_TEST

START_TEST(only_standbys_wait_then_fail)
{
    int standby = standby_start();
    char list[128], err[512];
    snprintf(list, sizeof list, "127.0.0.1:%d,127.0.0.1:%d", tu_free_port(), standby);
    setenv("PARALLAX_LOCK_TIMEOUT", "1", 1);
    plx_backend *mem = medium();
    plx_store *st = NULL;
    double t0 = now_s();
    int rc = open_with(mem, list, &st, err, sizeof err);
    double waited = now_s() - t0;
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    ck_assert_int_eq(rc, -EHOSTUNREACH);
    ck_assert_msg(waited >= 1.0, "gave up after %.2f s, before the lock timeout", waited);
    ck_assert_msg(strstr(err, "standby") != NULL, "the message does not say why: %s", err);
    mem->ops->destroy(mem);
}
END_TEST

START_TEST(bad_list)
{
    char err[512];
    plx_backend *mem = medium();
    plx_store *st = NULL;
    ck_assert_int_eq(open_with(mem, "127.0.0.1:7788,", &st, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "HOST:PORT") != NULL, "%s", err);
    mem->ops->destroy(mem);
}
END_TEST

static Suite *lockd_suite(void)
{
    Suite *s = suite_create("lockd");
    TCase *tc = tcase_create("list");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, list_skips_dead_and_standby);
    tcase_add_test(tc, leaves_a_lockd_that_stops_answering);
    tcase_add_test(tc, only_standbys_wait_then_fail);
    tcase_add_test(tc, bad_list);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(lockd_suite)
