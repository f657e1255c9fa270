/*
 * tapdisk_fixture.c - the fixture and helpers of the tests of the blktap3 driver
 * (tapdisk_fixture.h).
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

char dir[4096];
char store_path[4200];
char run_dir[4200];

/* ---- Fixture: a file blockstore with VDIs web1 (16 MiB) and web2 (8 MiB) -------------------- */

void setup(void)
{
    snprintf(dir, sizeof dir, "%s/plx-test-tapdisk-XXXXXX", tu_tmpdir());
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
    snprintf(store_path, sizeof store_path, "%s/store.img", dir);
    char err[512] = "";
    int rc = plx_format(store_path, 64 * MiB, MiB, 0, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    plx_store *st = NULL;
    rc = plx_store_open(store_path, NULL, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    ck_assert_int_eq(plx_vdi_create(st, "web1", WEB1_SIZE, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "web2", WEB2_SIZE, NULL), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    unsetenv("PARALLAX_BLOCKSTORE");
    setenv("PARALLAX_BLOCKSTORE_FILE", "/nonexistent/parallax-blockstore", 1);
    setenv("PARALLAX_WRITE_CACHE_FILE", "/nonexistent/parallax-write-cache", 1);
    /* The control socket of a writable disk goes here, never under /run. */
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    setenv("PARALLAX_RUN_DIR", run_dir, 1);
    tdd_reset();
}

void teardown(void)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/store.img", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/blockstore.conf", dir);
    unlink(p);
    control_path((int)getpid(), p, sizeof p);
    unlink(p);
    rmdir(run_dir);
    rmdir(dir);
    tdd_reset();
}

/* ---- Helpers ------------------------------------------------------------------------------------
 */

int try_open(const char *params, td_flag_t flags, td_driver_t **out)
{
    td_driver_t *drv = tdd_driver_new(&tapdisk_parallax, params);
    ck_assert_ptr_nonnull(drv);
    int rc = drv->ops->td_open(drv, params, NULL, flags);
    if (rc != 0) {
        tdd_driver_free(drv);
        drv = NULL;
    }
    *out = drv;
    return rc;
}

td_driver_t *open_ok(const char *vdi, td_flag_t flags)
{
    char params[4400];
    snprintf(params, sizeof params, "%s:%s", store_path, vdi);
    td_driver_t *drv = NULL;
    int rc = try_open(params, flags, &drv);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", params, rc, tdd_log_last());
    return drv;
}

void close_ok(td_driver_t *drv)
{
    ck_assert_int_eq(drv->ops->td_close(drv), 0);
    tdd_driver_free(drv);
}

void *tag_of(size_t i)
{
    return (void *)(uintptr_t)(i + 1);
}

/* Submit one request and wait for it; asserts it completed exactly once; returns its status. */
int io_sync(td_driver_t *drv, int op, void *buf, td_sector_t sec, int secs)
{
    static uintptr_t next_tag = 1000000;
    void *tag = (void *)next_tag++;
    size_t before = tdd_completion_count();
    td_request_t r = tdd_request(op, buf, sec, secs, tag);
    if (op == TD_OP_WRITE)
        drv->ops->td_queue_write(drv, r);
    else
        drv->ops->td_queue_read(drv, r);
    ck_assert_int_eq(tdd_run_until(before + 1, WAIT_MS), 0);
    int status = 1;
    ck_assert_uint_eq(tdd_completions_of(tag, &status), 1);
    ck_assert_uint_eq(tdd_sectors_completed_of(tag), (uint64_t)secs);
    return status;
}

/* Every recorded completion names a distinct request (no request completed twice). */
void assert_each_once(size_t expected)
{
    ck_assert_uint_eq(tdd_completion_count(), expected);
    for (size_t i = 0; i < expected; i++) {
        const struct tdd_completion *c = tdd_completion_at(i);
        ck_assert_uint_eq(tdd_completions_of(c->req.cb_data, NULL), 1);
    }
}

/* ---- Stores on a fault-injection backend, through the test hook ---------------------------- */

plx_backend *fault_be;

int open_on_fault(const char *path, const struct plx_open_opts *opts, plx_store **out, char *errbuf,
                  size_t errlen)
{
    plx_backend *mem = plx_backend_mem_create(16 * MiB / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, MiB, errbuf, errlen), 0);
    plx_backend *init = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    int rc = plx_store_open_backend(init, opts, out, errbuf, errlen);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(plx_vdi_create(*out, "disk", 4 * MiB, NULL), 0);
    fault_be = init;
    return 0;
}

/* The same, but the store does not own the fault backend (tu_keep_wrap), so that the test can
 * build crash images from its log after the disk is closed. */
int open_on_fault_kept(const char *path, const struct plx_open_opts *opts, plx_store **out,
                       char *errbuf, size_t errlen)
{
    plx_backend *mem = plx_backend_mem_create(16 * MiB / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, MiB, errbuf, errlen), 0);
    fault_be = plx_fault_create(mem, 0);
    mem->ops->destroy(mem);
    int rc = plx_store_open_backend(tu_keep_wrap(fault_be), opts, out, errbuf, errlen);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(plx_vdi_create(*out, "disk", 4 * MiB, NULL), 0);
    return 0;
}

/* ---- Control socket: admin commands served from tapdisk's loop
 * ----------------------------------- */

/* Send one control line to this process's control socket and run tapdisk's loop until the reply
 * arrives (the client must not block: the server runs in this thread). Returns the reply line. */
void control_call(const char *line, char *reply, size_t len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    control_path((int)getpid(), sa.sun_path, sizeof sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect %s: %s",
                  sa.sun_path, strerror(errno));
    ck_assert_int_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    size_t got = 0;
    for (int i = 0; i < 400; i++) {
        tdd_fire_ready(50);
        ssize_t r = read(fd, reply + got, len - 1 - got);
        if (r > 0)
            got += (size_t)r;
        if (r == 0 || (got && reply[got - 1] == '\n'))
            break;
    }
    close(fd);
    reply[got] = 0;
    char *nl = strchr(reply, '\n');
    if (nl)
        *nl = 0;
}

uint64_t vdi_id_of(const char *name)
{
    plx_store *st = NULL;
    char err[256];
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = 1};
    ck_assert_int_eq(plx_store_open(store_path, &o, &st, err, sizeof err), 0);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(st, name, &info), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    return info.id;
}
