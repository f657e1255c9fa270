/*
 * test_tapdisk_host.c - the blktap3 driver (tapdisk/block-parallax.c) as a part of its host,
 * against the tapdisk test double (tapdisk_double.c): the control socket served from tapdisk's
 * loop (live snapshots, commands that never block the loop), migration (the destination's open
 * waits for the source to let go), a write that needs new extents while another process holds
 * the admin lock, and the real lock manager (parallax-lockd) going away under an open disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "parallax_control.h"
#include "backend_fault.h"
#include "parallax.h"
#include "tapdisk_double.h"
#include "tapdisk_fixture.h"
#include "testutil.h"
#include "tgtd.h"

/* While tapdisk holds web1, a snapshot taken through the control socket freezes the writes
 * before it and not those after; labels and deletes work too; the socket goes with the disk. */
START_TEST(test_control_snapshot)
{
    uint64_t id = vdi_id_of("web1");
    td_driver_t *drv = open_ok("web1", 0);
    char *a = malloc(8 * SEC), *b = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(a, 8 * SEC, 71);
    tu_fill(b, 8 * SEC, 72);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, a, 16, 8), 0);
    char line[64], reply[512];
    snprintf(line, sizeof line, "snapshot %llu before", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 1");
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, b, 16, 8), 0);
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 2");
    snprintf(line, sizeof line, "snap-label %llu 2 after", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)id + 100);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 2 ", 6) == 0, "reply: %s", reply);
    /* The snapshots hold what was written before each, seen by a read-only opener in this
     * tapdisk too. */
    td_driver_t *snap = open_ok("web1@before", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(snap, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, a, 8 * SEC);
    close_ok(snap);
    snap = open_ok("web1@after", TD_OPEN_RDONLY);
    ck_assert_int_eq(io_sync(snap, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, b, 8 * SEC);
    close_ok(snap);
    snprintf(line, sizeof line, "snap-delete %llu 1", (unsigned long long)id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    close_ok(drv);
    char path[256];
    control_path((int)getpid(), path, sizeof path);
    ck_assert_msg(access(path, F_OK) != 0, "control socket %s left behind", path);
    ck_assert_uint_eq(tdd_event_count(), 0);

    plx_store *st = NULL;
    char err[256];
    ck_assert_int_eq(plx_store_open(store_path, NULL, &st, err, sizeof err), 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "web1@before", &si), -ENOENT);
    ck_assert_int_eq(plx_snap_lookup(st, "web1@after", &si), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    free(a);
    free(b);
    free(back);
}
END_TEST

/* ---- Control commands never block tapdisk's loop -----------------------------------------------
 */

static uint64_t held_disk_id;

/* A store on the fault backend with VDIs "disk" (snapshot 1 labelled "old") and "disk2". */
static int open_on_fault_snapped(const char *path, const struct plx_open_opts *opts,
                                 plx_store **out, char *errbuf, size_t errlen)
{
    open_on_fault(path, opts, out, errbuf, errlen);
    uint64_t idx = 0;
    ck_assert_int_eq(plx_vdi_snapshot(*out, "disk", "old", &idx), 0);
    ck_assert_uint_eq(idx, 1);
    ck_assert_int_eq(plx_vdi_create(*out, "disk2", 4 * MiB, NULL), 0);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(*out, "disk", &info), 0);
    held_disk_id = info.id;
    return 0;
}

/* Connect to this process's control socket and send `line` without waiting for the reply. */
static int control_send(const char *line)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    control_path((int)getpid(), sa.sun_path, sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Whatever the server has answered on fd so far (the loop is not run here). */
static size_t control_poll(int fd, char *reply, size_t len, size_t got)
{
    ssize_t r = read(fd, reply + got, len - 1 - got);
    if (r > 0)
        got += (size_t)r;
    reply[got] = 0;
    return got;
}

/* Send `line` while the medium holds I/O of kind `op`, and show the command is carried out
 * without stopping the loop: its I/O gets held and it stays unanswered, while `serve` (a
 * request on another part of the disk, or another disk) completes meanwhile; released, the
 * command answers `expect`. On a loop that blocks, the callback that runs the command waits
 * out the hold (2 s) and the command is answered before any other request is looked at. */
static void command_beside_io(plx_backend *be, enum plx_io_op op, const char *line,
                              td_driver_t *other, int other_op, void *buf, const char *expect)
{
    char reply[256];
    size_t got = 0;
    plx_fault_hold_blocks(be, op, 0, be->nblocks, 2000);
    int fd = control_send(line);
    for (int i = 0; i < 100 && !plx_fault_held(be) && !got; i++) {
        tdd_fire_ready(20);
        got = control_poll(fd, reply, sizeof reply, got);
    }
    ck_assert_msg(got == 0 && plx_fault_held(be) > 0,
                  "'%s': answered '%s' with %u I/O held: the loop waited for the medium", line,
                  reply, plx_fault_held(be));
    size_t before = tdd_completion_count();
    static uintptr_t tag = 5000000;
    td_request_t r = tdd_request(other_op, buf, 0, 8, (void *)++tag);
    if (other_op == TD_OP_WRITE)
        other->ops->td_queue_write(other, r);
    else
        other->ops->td_queue_read(other, r);
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of((void *)tag, &status), 1);
    ck_assert_int_eq(status, 0);
    got = control_poll(fd, reply, sizeof reply, got);
    ck_assert_msg(got == 0, "'%s' answered '%s' before its I/O completed", line, reply);
    ck_assert_uint_gt(plx_fault_held(be), 0);
    plx_fault_release(be);
    for (int i = 0; i < 400 && !(got && reply[got - 1] == '\n'); i++) {
        tdd_fire_ready(20);
        got = control_poll(fd, reply, sizeof reply, got);
    }
    close(fd);
    char *nl = strchr(reply, '\n');
    if (nl)
        *nl = 0;
    ck_assert_msg(strcmp(reply, expect) == 0, "'%s': expected '%s', got '%s'", line, expect, reply);
}

START_TEST(test_control_commands_never_block)
{
    tdd_store_opener = open_on_fault_snapped;
    td_driver_t *drv = open_ok("disk", 0);
    tdd_store_opener = NULL;
    td_driver_t *drv2 = open_ok("disk2", 0); /* the same store: one engine, one loop */
    char *data = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(data, 8 * SEC, 91);
    ck_assert_int_eq(io_sync(drv, TD_OP_WRITE, data, 0, 8), 0);
    ck_assert_int_eq(io_sync(drv2, TD_OP_WRITE, data, 0, 8), 0); /* its nodes now cached */
    char line[128];
    unsigned long long id = (unsigned long long)held_disk_id;

    /* The first labelled snapshot since open reads the log's labels: with reads held, the
     * other disk's writes go on. */
    snprintf(line, sizeof line, "snapshot %llu new", id);
    command_beside_io(fault_be, PLX_IO_READ, line, drv2, TD_OP_WRITE, data, "ok 2");
    /* A label and a delete rewrite a log block: with writes held, reads go on. */
    snprintf(line, sizeof line, "snap-label %llu 1 renamed", id);
    command_beside_io(fault_be, PLX_IO_WRITE, line, drv, TD_OP_READ, back, "ok");
    ck_assert_mem_eq(back, data, 8 * SEC);
    snprintf(line, sizeof line, "snap-delete %llu 2", id);
    command_beside_io(fault_be, PLX_IO_WRITE, line, drv, TD_OP_READ, back, "ok");

    /* What they did: "new" is gone, "old" is "renamed", and a label in use is refused. */
    char reply[256];
    snprintf(line, sizeof line, "snap-label %llu 1 renamed", id);
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok");
    snprintf(line, sizeof line, "snapshot %llu renamed", id);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 17 ", 7) == 0, "reply: %s", reply);
    snprintf(line, sizeof line, "snap-label %llu 2 again", id);
    control_call(line, reply, sizeof reply);
    ck_assert_msg(strncmp(reply, "err 2 ", 6) == 0, "reply: %s", reply);
    td_driver_t *snap = open_ok("disk@renamed", TD_OPEN_RDONLY);
    close_ok(snap);
    td_driver_t *gone = NULL;
    char params[4400];
    snprintf(params, sizeof params, "%s:disk@new", store_path);
    ck_assert_int_eq(try_open(params, TD_OPEN_RDONLY, &gone), -ENOENT);
    close_ok(drv2);
    close_ok(drv);
    free(data);
    free(back);
}
END_TEST

/* ---- Migration: the destination's open waits for the source to let go ----------------------- */

/* The "source host": an engine on the same blockstore with another host identity, holding web1
 * for writing, as the source's tapdisk does while libxl attaches the disk on the destination. */
static plx_store *source_open(plx_vdi **v)
{
    plx_store *st = NULL;
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .host = "source-host"};
    ck_assert_msg(plx_store_open(store_path, &o, &st, err, sizeof err) == 0, "source: %s", err);
    ck_assert_int_eq(plx_vdi_open(st, "web1", 0, v), 0);
    return st;
}

static void queue_io(td_driver_t *drv, int op, void *buf, td_sector_t sec, int secs, void *tag)
{
    td_request_t r = tdd_request(op, buf, sec, secs, tag);
    if (op == TD_OP_WRITE)
        drv->ops->td_queue_write(drv, r);
    else
        drv->ops->td_queue_read(drv, r);
}

/* libxl opens the disk on the destination while the source still holds the VDI: the open
 * succeeds at once, its requests wait (none is served while the source can still write), and
 * once the source lets go they are served in order, seeing everything the source wrote. */
START_TEST(test_open_waits_for_holder)
{
    setenv("PARALLAX_HANDOVER_WAIT", "30", 1);
    plx_vdi *sv = NULL;
    plx_store *src = source_open(&sv);
    char *a = malloc(8 * SEC), *b = malloc(8 * SEC), *c = malloc(8 * SEC);
    char *back = malloc(8 * SEC), *back2 = malloc(8 * SEC);
    tu_fill(a, 8 * SEC, 31);
    tu_fill(b, 8 * SEC, 32);
    tu_fill(c, 8 * SEC, 33);
    ck_assert_int_eq(plx_vdi_pwrite(sv, a, 0, 8 * SEC, PLX_WRITE_FUA), 0);

    td_driver_t *drv = open_ok("web1", 0);
    ck_assert_uint_eq(drv->info.size, WEB1_SIZE / SEC);
    ck_assert_msg(tdd_log_contains("waiting for it"), "no log line about the wait: %s",
                  tdd_log_last());
    queue_io(drv, TD_OP_READ, back, 0, 8, tag_of(0));
    queue_io(drv, TD_OP_WRITE, b, 16, 8, tag_of(1));
    queue_io(drv, TD_OP_READ, back2, 8, 8, tag_of(2)); /* the source writes this below */
    for (int i = 0; i < 10; i++)
        tdd_fire_ready(20);
    ck_assert_msg(tdd_completion_count() == 0,
                  "%zu requests answered while the source still held the VDI",
                  tdd_completion_count());
    /* The source goes on writing, then lets go (the guest stopped there; libxl's remove). */
    ck_assert_int_eq(plx_vdi_pwrite(sv, c, 8 * SEC, 8 * SEC, PLX_WRITE_FUA), 0);
    ck_assert_int_eq(plx_vdi_close(sv), 0);
    ck_assert_int_eq(tdd_run_until(3, WAIT_MS), 0);
    for (int i = 0; i < 3; i++) {
        int status = 1;
        ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
        ck_assert_int_eq(status, 0);
    }
    ck_assert_mem_eq(back, a, 8 * SEC);
    ck_assert_mem_eq(back2, c, 8 * SEC);
    ck_assert_msg(tdd_log_contains("handed over after"), "no handover log line: %s",
                  tdd_log_last());
    /* The destination holds it now: the source cannot take it back, and commands reach it.
     * The destination may still hold the admin lock for a claim of extents ahead (alloc_claim.c),
     * whose I/O completes only when this thread runs the destination's loop: the source's try
     * then waits out PARALLAX_LOCK_TIMEOUT (30 s) and fails with EBUSY for the wrong reason.
     * So the source tries with a short lock timeout, the loop runs between tries, and the
     * refusal must name the holder. */
    setenv("PARALLAX_LOCK_TIMEOUT", "0.2", 1);
    int rc = 0;
    for (int i = 0; i < 50; i++) {
        rc = plx_vdi_open(src, "web1", 0, &sv);
        if (rc != -EBUSY || !strstr(plx_store_errmsg(src), "admin lock"))
            break;
        tdd_fire_ready(20);
    }
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    ck_assert_int_eq(rc, -EBUSY);
    ck_assert_msg(strstr(plx_store_errmsg(src), "already open for writing by"),
                  "the source's open failed for another reason: %s", plx_store_errmsg(src));
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, back, 16, 8), 0);
    ck_assert_mem_eq(back, b, 8 * SEC);
    char line[64], reply[256];
    snprintf(line, sizeof line, "snapshot %llu", (unsigned long long)vdi_id_of("web1"));
    control_call(line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ok 1");
    close_ok(drv);
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_int_eq(plx_store_close(src), 0);
    unsetenv("PARALLAX_HANDOVER_WAIT");
    free(a);
    free(b);
    free(c);
    free(back);
    free(back2);
}
END_TEST

/* A source that never lets go: after $PARALLAX_HANDOVER_WAIT the queued requests fail with EIO
 * (a log line says why), later ones too; and a disk closed while it waits answers its queued
 * requests with EIO. */
START_TEST(test_open_wait_times_out)
{
    setenv("PARALLAX_HANDOVER_WAIT", "0.3", 1);
    plx_vdi *sv = NULL;
    plx_store *src = source_open(&sv);
    char *buf = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 5);
    td_driver_t *drv = open_ok("web1", 0);
    queue_io(drv, TD_OP_READ, buf, 0, 8, tag_of(0));
    queue_io(drv, TD_OP_WRITE, buf, 8, 8, tag_of(1));
    ck_assert_int_eq(tdd_run_until(2, WAIT_MS), 0);
    for (int i = 0; i < 2; i++) {
        int status = 0;
        ck_assert_uint_eq(tdd_completions_of(tag_of((size_t)i), &status), 1);
        ck_assert_int_eq(status, -EIO);
    }
    ck_assert_msg(tdd_log_contains("gave up waiting"), "no log line: %s", tdd_log_last());
    ck_assert_msg(tdd_log_contains("already open for writing by"),
                  "the log line names no holder: %s", tdd_log_last());
    ck_assert_int_eq(io_sync(drv, TD_OP_READ, buf, 0, 8), -EIO);
    close_ok(drv);
    ck_assert_uint_eq(tdd_event_count(), 0);

    /* Closed while waiting. */
    setenv("PARALLAX_HANDOVER_WAIT", "30", 1);
    tdd_reset();
    drv = open_ok("web1", 0);
    queue_io(drv, TD_OP_READ, buf, 0, 8, tag_of(5));
    tdd_fire_ready(20);
    ck_assert_uint_eq(tdd_completion_count(), 0);
    close_ok(drv);
    int status = 0;
    ck_assert_uint_eq(tdd_completions_of(tag_of(5), &status), 1);
    ck_assert_int_eq(status, -EIO);
    ck_assert_uint_eq(tdd_event_count(), 0);
    ck_assert_uint_eq(tdd_bad_unregisters(), 0);
    /* The source still holds it, untouched. */
    ck_assert_int_eq(plx_vdi_pwrite(sv, buf, 0, 8 * SEC, PLX_WRITE_FUA), 0);
    ck_assert_int_eq(plx_vdi_close(sv), 0);
    ck_assert_int_eq(plx_store_close(src), 0);
    unsetenv("PARALLAX_HANDOVER_WAIT");
    free(buf);
}
END_TEST

/* ---- With the real lock manager ---------------------------------------------------------- */

/* Two disks in one tapdisk: a write to web2 that needs new extents while another process holds
 * the blockstore's admin lock waits alone (its claim waits on tapdisk's loop), web1's in-place
 * overwrites are served meanwhile, and the write completes once the lock is free. Before, the
 * claim slept in the admin lock's retry loop inside tapdisk's event callback: web1 waited with
 * it, and web2's write failed after the lock timeout. */
START_TEST(test_write_needing_extent_waits_alone)
{
    setenv("PARALLAX_LOCK_TIMEOUT", "3", 1);
    td_driver_t *web1 = open_ok("web1", 0);
    td_driver_t *web2 = open_ok("web2", 0);
    char *buf = malloc(2048 * SEC), *big = malloc(8000 * SEC), *back = malloc(8000 * SEC);
    tu_fill(buf, 2048 * SEC, 51);
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 0, 2048), 0);
    /* Another process's admin lock: flock on the store file, as the file backend takes it. */
    int fd = open(store_path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    /* (A claim made ahead may hold it a moment: tapdisk's loop runs until it lets go.) */
    int locked = -1;
    for (int i = 0; i < 400 && (locked = flock(fd, LOCK_EX | LOCK_NB)) != 0; i++)
        tdd_fire_ready(5);
    ck_assert_int_eq(locked, 0);
    tu_fill(big, 8000 * SEC, 52); /* 1000 blocks: more than the held extents and a spare */
    size_t before = tdd_completion_count();
    void *tag = (void *)(uintptr_t)777777;
    web2->ops->td_queue_write(web2, tdd_request(TD_OP_WRITE, big, 0, 8000, tag));
    tdd_run_until(before + 1, 300);
    ck_assert_uint_eq(tdd_completions_of(tag, NULL), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf + i * 8 * SEC, (td_sector_t)i * 64, 8), 0);
    ck_assert_uint_eq(tdd_completions_of(tag, NULL), 0);
    ck_assert_int_eq(flock(fd, LOCK_UN), 0);
    close(fd);
    before = tdd_completion_count();
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of(tag, &status), 1);
    ck_assert_int_eq(status, 0);
    ck_assert_int_eq(io_sync(web2, TD_OP_READ, back, 0, 8000), 0);
    ck_assert(memcmp(back, big, 8000 * SEC) == 0);
    close_ok(web2);
    close_ok(web1);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    free(buf);
    free(big);
    free(back);
}
END_TEST

/* lockd stops answering (SIGSTOP), then goes away, while this tapdisk serves web1 from a store
 * shared through it: opening web2 (same store) fails after $PARALLAX_LOCK_TIMEOUT, and the log
 * line says the lock manager does not answer / cannot be reached; web1 is still served. */
START_TEST(test_open_with_lockd_gone)
{
    int port = tu_free_port();
    pid_t lockd = tu_lockd_start(port, "3");
    char err[256] = "", addr[64];
    plx_store *st = NULL;
    ck_assert_msg(plx_store_open(store_path, NULL, &st, err, sizeof err) == 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_msg(plx_store_set_lockd(st, addr) == 0, "%s", plx_store_errmsg(st));
    ck_assert_int_eq(plx_store_close(st), 0);
    setenv("PARALLAX_LOCK_TIMEOUT", "1", 1);

    td_driver_t *web1 = open_ok("web1", 0);
    char *buf = malloc(8 * SEC), *back = malloc(8 * SEC);
    tu_fill(buf, 8 * SEC, 41);
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 0, 8), 0);

    /* Let a claim made ahead give its TRY grant back (the heartbeat does): an admin lock held
     * here would let the open through. */
    for (int i = 0; i < 40; i++)
        tdd_fire_ready(50);
    char params[4400];
    snprintf(params, sizeof params, "%s:web2", store_path);
    td_driver_t *web2 = NULL;
    /* Frozen: the connection stays up and nothing answers (before, the log blamed "another
     * process" holding the admin lock). */
    kill(lockd, SIGSTOP);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = try_open(params, 0, &web2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kill(lockd, SIGCONT);
    ck_assert_int_eq(rc, -EHOSTUNREACH);
    /* The lock timeout (1 s), not lockd's reply timeout on top (5 s more before). */
    ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 4);
    ck_assert_msg(tdd_log_contains("cannot open VDI web2") && tdd_log_contains("lock manager") &&
                      tdd_log_contains("has not answered"),
                  "the log does not say the lock manager does not answer: %s", tdd_log_last());
    kill(lockd, SIGKILL);
    waitpid(lockd, NULL, 0);
    rc = try_open(params, 0, &web2);
    ck_assert_int_eq(rc, -EHOSTUNREACH);
    ck_assert_msg(tdd_log_contains("cannot open VDI web2") && tdd_log_contains("lock manager"),
                  "the log does not say the lock manager cannot be reached: %s", tdd_log_last());
    ck_assert_int_eq(io_sync(web1, TD_OP_WRITE, buf, 8, 8), 0);
    ck_assert_int_eq(io_sync(web1, TD_OP_READ, back, 8, 8), 0);
    ck_assert_mem_eq(back, buf, 8 * SEC);
    (void)web1->ops->td_close(web1); /* clearing web1's lock needs lockd: it fails, said */
    tdd_driver_free(web1);
    unsetenv("PARALLAX_LOCK_TIMEOUT");
    free(buf);
    free(back);
}
END_TEST

static Suite *tapdisk_host_suite(void)
{
    Suite *s = suite_create("tapdisk-host");
    TCase *tc;
    tc = tcase_create("host");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_control_snapshot);
    tcase_add_test(tc, test_control_commands_never_block);
    tcase_add_test(tc, test_open_waits_for_holder);
    tcase_add_test(tc, test_open_wait_times_out);
    tcase_add_test(tc, test_open_with_lockd_gone);
    suite_add_tcase(s, tc);

    tc = tcase_create("room");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_write_needing_extent_waits_alone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(tapdisk_host_suite());
}
