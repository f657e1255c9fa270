/*
 * test_lockwait.c - opening a VDI without waiting for the lock manager (plx_vdi_open_async,
 * issue 30): the wait for the admin lock is an event on the store's loop, and the loop serves
 * the VDIs already open meanwhile.
 *
 * Two stores on one memory medium stand for two processes: the medium's admin lock is a flag
 * both see. Then the real parallax-lockd (built beside this binary), frozen with SIGSTOP and
 * killed, on a file store.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lock.h"
#include "parallax.h"
#include "testutil.h"

#define MIB (1024ull * 1024)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct opened {
    int fired;
    int status;
    plx_vdi *v;
    char msg[512];
    plx_store *st;
};

static void on_open(void *arg, int status, plx_vdi *v)
{
    struct opened *o = arg;
    o->fired++;
    o->status = status;
    o->v = v;
    snprintf(o->msg, sizeof o->msg, "%s", status ? plx_store_errmsg(o->st) : "");
}

static void on_close(void *arg, int status)
{
    struct opened *o = arg;
    o->fired++;
    o->status = status;
    snprintf(o->msg, sizeof o->msg, "%s", status ? plx_store_errmsg(o->st) : "");
}

/* One turn of a host's loop: wait for the store's fd (at most ms), then service it. */
static void turn(plx_store *st, int ms)
{
    struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
    (void)poll(&p, 1, ms);
    ck_assert_int_ge(plx_store_service(st), 0);
}

static void write_done(void *arg, int status)
{
    int *d = arg;
    ck_assert_int_eq(status, 0);
    *d = 1;
}

/* A write and a flush of v through the loop: how long they took (ns). */
static uint64_t write_and_flush(plx_store *st, plx_vdi *v, uint64_t off)
{
    static uint8_t *blk;
    if (!blk)
        blk = plx_block_alloc(1);
    memset(blk, (int)(off >> 12), PLX_BLOCK_SIZE);
    uint64_t t0 = now_ns();
    int wd = 0, fd = 0;
    ck_assert_int_eq(plx_vdi_submit_write(v, blk, off, PLX_BLOCK_SIZE, 0, write_done, &wd), 0);
    while (!wd)
        turn(st, 100);
    ck_assert_int_eq(plx_vdi_submit_flush(v, write_done, &fd), 0);
    while (!fd)
        turn(st, 100);
    return now_ns() - t0;
}

struct two {
    plx_backend *mem;
    plx_store *st[2];
};

static void two_open(struct two *t)
{
    char err[256] = "";
    t->mem = plx_backend_mem_create(256 * MIB / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(t->mem);
    ck_assert_int_eq(plx_format_backend(t->mem, 16 * MIB, err, sizeof err), 0);
    static const char *const hosts[2] = {"host-a", "host-b"};
    for (int i = 0; i < 2; i++) {
        struct plx_open_opts o = {.struct_size = sizeof o, .host = hosts[i]};
        int rc = plx_store_open_backend(tu_keep_wrap(t->mem), &o, &t->st[i], err, sizeof err);
        ck_assert_msg(rc == 0, "open %s: %s", hosts[i], err);
    }
}

static void two_close(struct two *t)
{
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(plx_store_close(t->st[i]), 0);
    t->mem->ops->destroy(t->mem);
}

/* Another process holds the admin lock: b's open waits on the loop while a is written and
 * flushed through it, and completes once the lock is free. */
START_TEST(test_open_waits_on_the_loop)
{
    struct two t;
    two_open(&t);
    plx_store *st = t.st[0];
    ck_assert_int_eq(plx_vdi_create(st, "a", 4 * MIB, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "b", 4 * MIB, NULL), 0);
    plx_vdi *a;
    ck_assert_int_eq(plx_vdi_open(st, "a", 0, &a), 0);
    (void)write_and_flush(st, a, 0); /* a's extents are claimed now */

    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened o = {.st = st};
    plx_open_req *req;
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &o, &req), 0);
    ck_assert_int_eq(o.fired, 0); /* never inside the call */
    for (int i = 0; i < 20; i++)
        ck_assert_uint_lt(write_and_flush(st, a, (uint64_t)i * PLX_BLOCK_SIZE), 1000000000ull);
    for (int i = 0; i < 10; i++)
        turn(st, 10);
    ck_assert_int_eq(o.fired, 0); /* still waiting for the lock */

    plx_admin_unlock(t.st[1]);
    for (uint64_t t0 = now_ns(); !o.fired && now_ns() - t0 < 5000000000ull;)
        turn(st, 50);
    ck_assert_int_eq(o.fired, 1);
    ck_assert_msg(o.status == 0, "open b: %s", o.msg);
    ck_assert_ptr_nonnull(o.v);
    ck_assert_int_eq(plx_vdi_readonly(o.v), 0);
    /* The open let go of the admin lock: the other process takes it at once. */
    ck_assert_int_eq(plx_admin_lock_try(t.st[1]), 0);
    plx_admin_unlock(t.st[1]);
    /* b is held by us now: the other process cannot open it for writing. */
    plx_vdi *b2;
    ck_assert_int_eq(plx_vdi_open(t.st[1], "b", 0, &b2), -EBUSY);
    ck_assert_int_eq(plx_vdi_close(o.v), 0);
    ck_assert_int_eq(plx_vdi_close(a), 0);
    two_close(&t);
}
END_TEST

/* The lock stays held elsewhere past $PARALLAX_LOCK_TIMEOUT: the open fails, saying so; a
 * cancelled open never reports and leaves nothing held; a read-only open needs no lock. */
START_TEST(test_open_times_out_and_cancels)
{
    setenv("PARALLAX_LOCK_TIMEOUT", "0.3", 1);
    struct two t;
    two_open(&t);
    plx_store *st = t.st[0];
    ck_assert_int_eq(plx_vdi_create(st, "b", 4 * MIB, NULL), 0);
    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);

    struct opened o = {.st = st};
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &o, NULL), 0);
    uint64_t t0 = now_ns();
    while (!o.fired && now_ns() - t0 < 5000000000ull)
        turn(st, 50);
    ck_assert_int_eq(o.fired, 1);
    ck_assert_int_eq(o.status, -EBUSY);
    ck_assert_ptr_null(o.v);
    ck_assert_msg(strstr(o.msg, "admin lock"), "message: %s", o.msg);
    ck_assert_uint_ge(now_ns() - t0, 250000000ull);

    struct opened c = {.st = st};
    plx_open_req *req;
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &c, &req), 0);
    turn(st, 10);
    plx_vdi_open_cancel(req);
    plx_admin_unlock(t.st[1]);
    for (int i = 0; i < 20; i++)
        turn(st, 20);
    ck_assert_int_eq(c.fired, 0);
    ck_assert_int_eq(plx_admin_lock_try(t.st[1]), 0); /* nothing left held by st */
    plx_admin_unlock(t.st[1]);

    /* Read-only on a store opened for writing: the open records a hold under the admin lock,
     * so it waits for the lock on the loop as well, and so does its close (dropping it). */
    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened r = {.st = st};
    ck_assert_int_eq(plx_vdi_open_async(st, "b", PLX_OPEN_READONLY, on_open, &r, NULL), 0);
    for (int i = 0; i < 5; i++)
        turn(st, 10);
    ck_assert_int_eq(r.fired, 0);
    plx_admin_unlock(t.st[1]);
    for (uint64_t t1 = now_ns(); !r.fired && now_ns() - t1 < 5000000000ull;)
        turn(st, 20);
    ck_assert_int_eq(r.fired, 1);
    ck_assert_msg(r.status == 0, "read-only open: %s", r.msg);
    ck_assert_int_eq(plx_vdi_readonly(r.v), 1);
    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened rc_ = {.st = st};
    ck_assert_int_eq(plx_vdi_close_async(r.v, on_close, &rc_), 0);
    for (int i = 0; i < 5; i++)
        turn(st, 10);
    ck_assert_int_eq(rc_.fired, 0);
    plx_admin_unlock(t.st[1]);
    for (uint64_t t1 = now_ns(); !rc_.fired && now_ns() - t1 < 5000000000ull;)
        turn(st, 20);
    ck_assert_msg(rc_.fired == 1 && rc_.status == 0, "read-only close: %s", rc_.msg);

    /* An open still waiting when the store closes is dropped without a report. */
    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened z = {.st = st};
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &z, NULL), 0);
    turn(st, 10);
    plx_admin_unlock(t.st[1]);
    two_close(&t);
    ck_assert_int_eq(z.fired, 0);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
}
END_TEST

/* The close of a writable VDI clears its lock under the admin lock: that wait is on the loop
 * too. Held elsewhere past the timeout, the handle closes all the same and the record keeps
 * our lock (nobody else takes the VDI; we can open it again); granted, the lock is cleared. */
START_TEST(test_close_waits_on_the_loop)
{
    setenv("PARALLAX_LOCK_TIMEOUT", "0.5", 1);
    struct two t;
    two_open(&t);
    plx_store *st = t.st[0];
    ck_assert_int_eq(plx_vdi_create(st, "a", 4 * MIB, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "b", 4 * MIB, NULL), 0);
    plx_vdi *a, *b;
    ck_assert_int_eq(plx_vdi_open(st, "a", 0, &a), 0);
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &b), 0);
    (void)write_and_flush(st, a, 0);
    (void)write_and_flush(st, b, 0);

    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened c = {.st = st};
    ck_assert_int_eq(plx_vdi_close_async(b, on_close, &c), 0);
    ck_assert_int_eq(c.fired, 0);
    unsigned n = 0;
    while (!c.fired) { /* a is served the whole time */
        ck_assert_uint_lt(write_and_flush(st, a, (uint64_t)(n++ % 64) * PLX_BLOCK_SIZE),
                          1000000000ull);
        ck_assert_uint_lt(n, 100000);
    }
    ck_assert_int_eq(c.status, -EBUSY);
    ck_assert_msg(strstr(c.msg, "admin lock"), "message: %s", c.msg);
    plx_admin_unlock(t.st[1]);
    plx_vdi *b2;
    ck_assert_int_eq(plx_vdi_open(t.st[1], "b", 0, &b2), -EBUSY); /* still ours */
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &b), 0);            /* ours to take back */

    struct opened c2 = {.st = st};
    ck_assert_int_eq(plx_vdi_close_async(b, on_close, &c2), 0);
    for (uint64_t t0 = now_ns(); !c2.fired && now_ns() - t0 < 5000000000ull;)
        turn(st, 20);
    ck_assert_int_eq(c2.fired, 1);
    ck_assert_msg(c2.status == 0, "close b: %s", c2.msg);
    ck_assert_int_eq(plx_vdi_open(t.st[1], "b", 0, &b2), 0); /* cleared: the other takes it */
    ck_assert_int_eq(plx_vdi_close(b2), 0);

    /* A close under way is finished by plx_vdi_close, without its callback. */
    ck_assert_int_eq(plx_admin_lock(t.st[1]), 0);
    struct opened c3 = {.st = st};
    ck_assert_int_eq(plx_vdi_close_async(a, on_close, &c3), 0);
    turn(st, 10);
    plx_admin_unlock(t.st[1]);
    ck_assert_int_eq(plx_vdi_close(a), 0);
    for (int i = 0; i < 5; i++)
        turn(st, 10);
    ck_assert_int_eq(c3.fired, 0);
    two_close(&t);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
}
END_TEST

/* ---- With the real parallax-lockd ---------------------------------------------------------- */

/* Open b while lockd does not answer: a is written and flushed through the loop the whole time,
 * none waits a second, and the open's report names the lock manager. */
static void open_while_lockd_out(plx_store *st, plx_vdi *a, const char *how)
{
    struct opened o = {.st = st};
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &o, NULL), 0);
    uint64_t t0 = now_ns(), worst = 0;
    unsigned n = 0;
    while (!o.fired && now_ns() - t0 < 20000000000ull) {
        uint64_t took = write_and_flush(st, a, (uint64_t)(n++ % 64) * PLX_BLOCK_SIZE);
        if (took > worst)
            worst = took;
    }
    ck_assert_int_eq(o.fired, 1);
    ck_assert_msg(o.status == -EHOSTUNREACH, "%s: open b: %d %s", how, o.status, o.msg);
    ck_assert_msg(strstr(o.msg, "lock manager"), "%s: message: %s", how, o.msg);
    ck_assert_msg(worst < 1000000000ull, "%s: a write and flush of a took %.0f ms", how,
                  (double)worst / 1e6);
    ck_assert_uint_gt(n, 10);
    ck_assert_uint_ge(now_ns() - t0, 1000000000ull); /* it waited for the timeout (1.5 s) */
}

START_TEST(test_open_with_lockd_out)
{
    setenv("PARALLAX_LOCK_TIMEOUT", "1.5", 1);
    int port = tu_free_port();
    pid_t lockd = tu_lockd_start(port, "3");
    char path[PATH_MAX], err[256] = "", addr[64];
    snprintf(path, sizeof path, "%s/plx-lockwait-%d.img", tu_tmpdir(), (int)getpid());
    unlink(path);
    ck_assert_int_eq(plx_format(path, 128 * MIB, 16 * MIB, 1, err, sizeof err), 0);
    plx_store *st;
    struct plx_open_opts oo = {.struct_size = sizeof oo, .host = "lockwait"};
    ck_assert_msg(plx_store_open(path, &oo, &st, err, sizeof err) == 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_msg(plx_store_set_lockd(st, addr) == 0, "%s", plx_store_errmsg(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    /* Opened again, the store uses the lock manager its state block names. */
    ck_assert_msg(plx_store_open(path, &oo, &st, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(plx_vdi_create(st, "a", 1 * MIB, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "b", 1 * MIB, NULL), 0);
    plx_vdi *a;
    ck_assert_int_eq(plx_vdi_open(st, "a", 0, &a), 0);
    for (int i = 0; i < 64; i++) /* written whole: no extent claim later */
        (void)write_and_flush(st, a, (uint64_t)i * PLX_BLOCK_SIZE);
    /* Let a claim made ahead finish and its TRY grant go back (the heartbeat does, within a
     * quarter lease): an admin lock we held would let the open through. */
    for (uint64_t t0 = now_ns(); now_ns() - t0 < 1500000000ull;)
        turn(st, 50);

    kill(lockd, SIGSTOP);
    open_while_lockd_out(st, a, "lockd frozen");
    kill(lockd, SIGCONT);

    /* Answering again: the open succeeds. */
    struct opened o = {.st = st};
    ck_assert_int_eq(plx_vdi_open_async(st, "b", 0, on_open, &o, NULL), 0);
    for (uint64_t t0 = now_ns(); !o.fired && now_ns() - t0 < 10000000000ull;)
        turn(st, 50);
    ck_assert_msg(o.fired == 1 && o.status == 0, "open b with lockd back: %s", o.msg);
    ck_assert_int_eq(plx_vdi_close(o.v), 0);

    kill(lockd, SIGKILL);
    waitpid(lockd, NULL, 0);
    open_while_lockd_out(st, a, "lockd killed");

    /* The blocking open says the same. */
    plx_vdi *b;
    ck_assert_int_eq(plx_vdi_open(st, "b", 0, &b), -EHOSTUNREACH);
    ck_assert_ptr_nonnull(strstr(plx_store_errmsg(st), "lock manager"));
    (void)plx_vdi_close(a); /* unlocking a's record needs lockd: it is gone */
    (void)plx_store_close(st);
    unlink(path);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("lockwait");
    TCase *tc = tcase_create("open");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_open_waits_on_the_loop);
    tcase_add_test(tc, test_open_times_out_and_cancels);
    tcase_add_test(tc, test_close_waits_on_the_loop);
    tcase_add_test(tc, test_open_with_lockd_out);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(suite)
