/*
 * engine_fixture.c - what the engine's unit tests (test_engine.c, test_engine_io.c,
 * test_engine_async.c) share: memory media formatted and opened, VDIs opened, written, read and
 * compared, plx_check run, and the records of asynchronous requests.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_fixture.h"
#include "testutil.h"

/* ---- Fixtures ----------------------------------------------------------------------------------
 */

/* A memory medium of `bytes`, formatted with 1 MiB extents. */
plx_backend *new_medium(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / BS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, MiB, err, sizeof(err));
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

/* Open a store on `mem` without giving it away. */
plx_store *open_kept(plx_backend *mem)
{
    char err[256] = "";
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), NULL, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    ck_assert_ptr_nonnull(st);
    return st;
}

static void check_line(void *arg, int is_error, const char *line)
{
    int *shown = arg;
    if (is_error && (*shown)++ < 10)
        fprintf(stderr, "engine: check: %s\n", line);
}

/* plx_check must find nothing wrong. */
void check_clean(plx_store *st, const char *what)
{
    struct plx_check_report rep;
    int shown = 0;
    int rc = plx_check(st, &rep, check_line, &shown);
    ck_assert_msg(rc == 0, "%s: plx_check could not run: %d (%s)", what, rc, plx_store_errmsg(st));
    ck_assert_msg(rep.errors == 0, "%s: plx_check found %llu errors (see stderr)", what,
                  (unsigned long long)rep.errors);
    ck_assert_uint_gt(rep.trees, 0);
}

void close_ok(plx_store *st)
{
    int rc = plx_store_close(st);
    ck_assert_msg(rc == 0, "close: %d", rc);
}

plx_vdi *open_vdi(plx_store *st, const char *spec, unsigned flags)
{
    plx_vdi *v = NULL;
    int rc = plx_vdi_open(st, spec, flags, &v);
    ck_assert_msg(rc == 0, "open %s: %d (%s)", spec, rc, plx_store_errmsg(st));
    ck_assert_ptr_nonnull(v);
    return v;
}

void close_vdi(plx_store *st, plx_vdi *v)
{
    int rc = plx_vdi_close(v);
    ck_assert_msg(rc == 0, "vdi close: %d (%s)", rc, plx_store_errmsg(st));
}

uint64_t create_vdi(plx_store *st, const char *name, uint64_t size)
{
    uint64_t id = 0;
    int rc = plx_vdi_create(st, name, size, &id);
    ck_assert_msg(rc == 0, "create %s: %d (%s)", name, rc, plx_store_errmsg(st));
    ck_assert_uint_ne(id, 0);
    return id;
}

void pwrite_ok(plx_store *st, plx_vdi *v, const void *buf, uint64_t off, size_t len)
{
    int rc = plx_vdi_pwrite(v, buf, off, len, 0);
    ck_assert_msg(rc == 0, "write %llu+%zu: %d (%s)", (unsigned long long)off, len, rc,
                  plx_store_errmsg(st));
}

void pread_ok(plx_store *st, plx_vdi *v, void *buf, uint64_t off, size_t len)
{
    int rc = plx_vdi_pread(v, buf, off, len);
    ck_assert_msg(rc == 0, "read %llu+%zu: %d (%s)", (unsigned long long)off, len, rc,
                  plx_store_errmsg(st));
}

/* Read [off, off+len) and compare with want; names the first differing byte. */
void expect_bytes(plx_store *st, plx_vdi *v, const unsigned char *want, uint64_t off, size_t len,
                  const char *what)
{
    unsigned char *got = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(got);
    memset(got, 0xa5, len);
    pread_ok(st, v, got, off, len);
    /* One assertion, not one per byte: every passing Check assertion costs a write. */
    size_t i = 0;
    int differ = memcmp(got, want, len) != 0;
    if (differ)
        while (got[i] == want[i])
            i++;
    ck_assert_msg(!differ, "%s: byte %llu is 0x%02x, want 0x%02x", what,
                  (unsigned long long)(off + i), got[i], want[i]);
    free(got);
}

void expect_zero(plx_store *st, plx_vdi *v, uint64_t off, size_t len, const char *what)
{
    unsigned char *got = malloc(len);
    ck_assert_ptr_nonnull(got);
    memset(got, 0xa5, len);
    pread_ok(st, v, got, off, len);
    size_t i = 0;
    while (i < len && got[i] == 0)
        i++;
    ck_assert_msg(i == len, "%s: byte %llu is 0x%02x, want 0", what, (unsigned long long)(off + i),
                  i < len ? got[i] : 0);
    free(got);
}

/* A block-sized pattern for block `blk` of generation `gen`. */
void pattern(unsigned char *buf, size_t len, uint64_t gen, uint64_t blk)
{
    tu_fill(buf, len, gen * 1000003ull + blk);
}

/* ---- The asynchronous interface -------------------------------------------------------------- */

void rec_cb(void *arg, int status)
{
    struct cb_rec *r = arg;
    if (*r->in_submit)
        r->bad_context = 1;
    r->fired++;
    r->status = status;
    if (r->order != NULL)
        r->order[(*r->norder)++] = r->id;
}

/* Service until every record has fired, with a bound on idle rounds. */
void drain_all(plx_store *st, struct cb_rec *recs, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = plx_store_wait(st, &recs[i].fired);
        ck_assert_msg(rc == 0, "wait for request %d: %d (%s)", i, rc, plx_store_errmsg(st));
    }
}
