/*
 * wlog_fixture.c - the media, the shadow-copy workload and the checks of the write cache's tests
 * (wlog_fixture.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "backend_fault.h"
#include "engine.h"
#include "format.h"
#include "parallax.h"
#include "pipeline.h"
#include "testutil.h"
#include "wlog_fixture.h"
#include "wlog.h"

plx_backend *new_store_medium(void)
{
    plx_backend *mem = plx_backend_mem_create(STORE_BLOCKS);
    char err[256] = "";
    int rc = plx_format_backend(mem, MiB, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %s", err);
    return mem;
}

plx_store *open_store(plx_backend *medium, const char *host)
{
    struct plx_open_opts o = {.struct_size = sizeof o, .host = host};
    plx_store *st = NULL;
    char err[256] = "";
    int rc = plx_store_open_backend(tu_keep_wrap(medium), &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open store: %d %s", rc, err);
    return st;
}

/* Loop tests: _i 1 writes from block-aligned buffers, and the log writes records of 8 blocks
 * and more straight from them (wlog.c, ZC_MIN). */
bool g_zc;

void zc_mode(int i)
{
    g_zc = i == 1;
    if (g_zc)
        setenv("PARALLAX_WCACHE_ZC_MIN", "8", 1);
    else
        unsetenv("PARALLAX_WCACHE_ZC_MIN");
}

/* In zc_mode, records were written from the writers' buffers. */
void check_zc(plx_store *st)
{
    struct plx_wlog_stats ws;
    plx_wlog_stats(st, &ws);
    if (g_zc)
        ck_assert_uint_gt(ws.zc_bytes, 0);
    else
        ck_assert_uint_eq(ws.zc_bytes, 0);
}

int attach(plx_store *st, plx_backend *log_medium, int init)
{
    return plx_wlog_attach(st, tu_keep_wrap(log_medium), init, "test-log");
}

/* ---- A random asynchronous workload against a shadow copy -------------------------------------
 */

void write_done(void *arg, int status)
{
    struct wctx *c = arg;
    if (status)
        c->sh->failed++;
    for (uint64_t b = c->b0; b < c->b1; b++)
        c->sh->busy[b] = 0;
    c->sh->inflight--;
    free(c->buf);
    free(c);
}

void flush_done(void *arg, int status)
{
    struct shadow *sh = arg;
    if (status)
        sh->failed++;
    sh->inflight--;
}

/* Submit one write of a random range (sub-block when `unaligned`), not overlapping any write in
 * flight, and copy it into the shadow. */
void random_write(plx_vdi *v, struct shadow *sh, bool unaligned, unsigned max_blocks)
{
    uint64_t nblocks = VDI_BYTES / BS;
    for (int tries = 0; tries < 100; tries++) {
        uint64_t b0 = tu_rand(&sh->rng) % nblocks;
        uint64_t n = 1 + tu_rand(&sh->rng) % max_blocks;
        if (b0 + n > nblocks)
            n = nblocks - b0;
        uint64_t off = b0 * BS, len = n * BS;
        if (unaligned) {
            off += tu_rand(&sh->rng) % BS;
            len = 1 + tu_rand(&sh->rng) % (n * BS - (off - b0 * BS));
        }
        uint64_t e0 = off / BS, e1 = (off + len + BS - 1) / BS;
        bool free_range = true;
        for (uint64_t b = e0; b < e1; b++)
            if (sh->busy[b])
                free_range = false;
        if (!free_range)
            continue;
        struct wctx *c = calloc(1, sizeof *c);
        c->sh = sh;
        c->b0 = e0;
        c->b1 = e1;
        c->buf = g_zc ? aligned_alloc(BS, (len + BS - 1) / BS * BS) : malloc(len);
        tu_fill(c->buf, len, tu_rand(&sh->rng));
        memcpy(sh->bytes + off, c->buf, len);
        for (uint64_t b = e0; b < e1; b++)
            sh->busy[b] = 1;
        sh->inflight++;
        unsigned flags = tu_rand(&sh->rng) % 16 == 0 ? PLX_WRITE_FUA : 0;
        int rc = plx_vdi_submit_write(v, c->buf, off, len, flags, write_done, c);
        ck_assert_msg(rc == 0, "submit write: %d", rc);
        return;
    }
}

void wait_all(plx_store *st, struct shadow *sh)
{
    while (sh->inflight) {
        int rc = plx_store_service(st);
        ck_assert_msg(rc >= 0, "service: %d %s", rc, plx_store_errmsg(st));
        if (!sh->inflight)
            break;
        ck_assert_msg(plx_store_busy(st), "%u requests in flight but the store is idle",
                      sh->inflight);
        usleep(100);
    }
}

static void read_done(void *arg, int status)
{
    struct rctx *c = arg;
    ck_assert_int_eq(status, 0);
    for (uint64_t o = 0; o < c->len; o += BS)
        ck_assert_msg(memcmp(c->buf + o, c->expect + o, BS) == 0,
                      "a read of block %llu returned other data than was last written",
                      (unsigned long long)((c->off + o) / BS));
    c->sh->inflight--;
    free(c->buf);
    free(c->expect);
    free(c);
}

static void random_read(plx_vdi *v, struct shadow *sh)
{
    uint64_t b0 = tu_rand(&sh->rng) % (VDI_BYTES / BS - 16), n = 1 + tu_rand(&sh->rng) % 16;
    for (uint64_t b = b0; b < b0 + n; b++)
        if (sh->busy[b])
            return;
    struct rctx *c = calloc(1, sizeof *c);
    c->sh = sh;
    c->off = b0 * BS;
    c->len = n * BS;
    c->buf = malloc(c->len);
    c->expect = malloc(c->len);
    memcpy(c->expect, sh->bytes + c->off, c->len);
    sh->inflight++;
    ck_assert_int_eq(plx_vdi_submit_read(v, c->buf, c->off, c->len, read_done, c), 0);
}

/* A trim of a range no write covers: the shadow holds zeros there from now on. */
static void random_trim(plx_vdi *v, struct shadow *sh)
{
    uint64_t b0 = tu_rand(&sh->rng) % (VDI_BYTES / BS - 8), n = 1 + tu_rand(&sh->rng) % 8;
    for (uint64_t b = b0; b < b0 + n; b++)
        if (sh->busy[b])
            return;
    struct wctx *c = calloc(1, sizeof *c);
    c->sh = sh;
    c->b0 = b0;
    c->b1 = b0 + n;
    memset(sh->bytes + b0 * BS, 0, n * BS);
    for (uint64_t b = b0; b < b0 + n; b++)
        sh->busy[b] = 1;
    sh->inflight++;
    ck_assert_int_eq(plx_vdi_submit_trim(v, b0 * BS, n * BS, write_done, c), 0);
}

void run_writes(plx_store *st, plx_vdi *v, struct shadow *sh, unsigned nops, unsigned qd,
                unsigned unaligned_pct, unsigned flush_pct)
{
    for (unsigned i = 0; i < nops; i++) {
        while (sh->inflight >= qd) {
            int rc = plx_store_service(st);
            ck_assert_msg(rc >= 0, "service: %d %s", rc, plx_store_errmsg(st));
            if (sh->inflight >= qd)
                usleep(50);
        }
        unsigned dice = (unsigned)(tu_rand(&sh->rng) % 100);
        if (sh->read_pct && dice >= 100 - sh->read_pct) {
            random_read(v, sh);
        } else if (sh->trim_pct && dice >= 100 - sh->read_pct - sh->trim_pct) {
            random_trim(v, sh);
        } else if (dice < flush_pct) {
            sh->inflight++;
            ck_assert_int_eq(plx_vdi_submit_flush(v, flush_done, sh), 0);
        } else {
            random_write(v, sh, dice < flush_pct + unaligned_pct, 24);
        }
    }
    wait_all(st, sh);
}

void shadow_init(struct shadow *sh, uint64_t seed)
{
    memset(sh, 0, sizeof *sh);
    sh->bytes = calloc(1, VDI_BYTES);
    sh->busy = calloc(1, VDI_BYTES / BS);
    sh->rng = seed;
}

void shadow_free(struct shadow *sh)
{
    free(sh->bytes);
    free(sh->busy);
}

/* The whole VDI reads as the shadow. */
void verify(plx_vdi *v, const struct shadow *sh, const char *when)
{
    uint8_t *buf = plx_block_alloc(VDI_BYTES / BS);
    int rc = plx_vdi_pread(v, buf, 0, VDI_BYTES);
    ck_assert_msg(rc == 0, "%s: read: %d", when, rc);
    for (uint64_t b = 0; b < VDI_BYTES / BS; b++)
        ck_assert_msg(memcmp(buf + b * BS, sh->bytes + b * BS, BS) == 0,
                      "%s: block %llu differs from what was written", when, (unsigned long long)b);
    plx_block_free(buf);
}

void check_clean(plx_store *st)
{
    struct plx_check_report rep;
    ck_assert_int_eq(plx_check(st, &rep, NULL, NULL), 0);
    ck_assert_msg(rep.errors == 0, "check found %llu errors", (unsigned long long)rep.errors);
}

/* ---- Tests ----------------------------------------------------------------------------------- */

void int_done(void *arg, int status)
{
    ck_assert_int_eq(status, 0);
    *(int *)arg = 1;
}

/* The log medium of loop test _i: memory, or (_i 2) a file through the page cache as
 * wlog_file.c opens it, whose small records complete inside submit (backend.h, PLX_IO_INLINE). */
plx_backend *log_medium(int i)
{
    if (i != 2)
        return plx_backend_mem_create(LOG_BLOCKS);
    char path[512];
    snprintf(path, sizeof path, "%s/wlog-file-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)LOG_BLOCKS * BS), 0);
    close(fd);
    int err = 0;
    char msg[256] = "";
    plx_backend *be = plx_backend_file_open(path, PLX_BACKEND_BUFFERED, &err, msg, sizeof msg);
    ck_assert_msg(be != NULL, "%s", msg);
    unlink(path);
    return be;
}

uint64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Every block of v written once and flushed: later writes then need no extent claim (the first
 * claim of a pool is a synchronous write, which would wait for a held store). */
void prefill(plx_vdi *v)
{
    uint8_t *zero = plx_block_alloc(VDI_BYTES / BS);
    ck_assert_int_eq(plx_vdi_pwrite(v, zero, 0, VDI_BYTES, 0), 0);
    ck_assert_int_eq(plx_vdi_flush(v), 0);
    plx_block_free(zero);
}

void verify_from_store(plx_backend *medium, const struct shadow *sh, const char *when)
{
    plx_store *st = open_store(medium, "host-b");
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "vm", 0, &v), 0);
    verify(v, sh, when);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    check_clean(st);
    ck_assert_int_eq(plx_store_close(st), 0);
}
