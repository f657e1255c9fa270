/*
 * crash_model.c - the crash harness's model (test_crash.c describes the harness): the block
 * patterns that name the write a block holds, the records of a workload's requests, and the
 * setup of a workload (its medium, store and VDIs) that the requests and the verification use.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crash.h"
#include "wlog.h"

/* ---- Block patterns -------------------------------------------------------------------------- */

const uint8_t zero_blk[BS];

static uint64_t pat_seed(uint32_t wid, uint64_t vb)
{
    uint64_t s = ((uint64_t)wid << 40) ^ vb ^ 0x5eed;
    return tu_rand(&s);
}

void pat_fill(uint8_t *blk, uint32_t wid, uint64_t vb)
{
    uint64_t w[BS / 8];
    uint64_t s = pat_seed(wid, vb);
    w[0] = PAT_MAGIC;
    w[1] = wid;
    w[2] = vb;
    for (size_t i = 3; i < BS / 8; i++)
        w[i] = s + i * 0x9e3779b97f4a7c15ull;
    memcpy(blk, w, BS);
}

/* The write id a block holds (0 = zeros). Returns 0, or -1 with a description in why. */
int pat_decode(const uint8_t *blk, uint64_t vb, uint32_t *val, char *why, size_t wlen)
{
    uint64_t w[BS / 8];
    memcpy(w, blk, BS);
    if (w[0] == 0 && w[1] == 0 && w[2] == 0) {
        if (memcmp(blk, zero_blk, BS) == 0) {
            *val = 0;
            return 0;
        }
        snprintf(why, wlen, "garbage (zero header, nonzero body)");
        return -1;
    }
    if (w[0] != PAT_MAGIC || w[1] == 0 || w[1] > UINT32_MAX) {
        snprintf(why, wlen, "garbage (first words %016llx %016llx)", (unsigned long long)w[0],
                 (unsigned long long)w[1]);
        return -1;
    }
    if (w[2] != vb) {
        snprintf(why, wlen, "the data of virtual block %llu (write #%llu)",
                 (unsigned long long)w[2], (unsigned long long)w[1]);
        return -1;
    }
    uint64_t s = pat_seed((uint32_t)w[1], vb);
    for (size_t i = 3; i < BS / 8; i++) {
        if (w[i] != s + i * 0x9e3779b97f4a7c15ull) {
            snprintf(why, wlen, "write #%llu torn or corrupt at byte %zu", (unsigned long long)w[1],
                     i * 8);
            return -1;
        }
    }
    *val = (uint32_t)w[1];
    return 0;
}

/* ---- The model ------------------------------------------------------------------------------- */

void ivec_push(struct ivec *iv, uint32_t x)
{
    if (iv->n == iv->cap) {
        iv->cap = iv->cap ? iv->cap * 2 : 4;
        iv->v = realloc(iv->v, iv->cap * sizeof *iv->v);
        ck_assert_ptr_nonnull(iv->v);
    }
    iv->v[iv->n++] = x;
}

uint64_t rnd(struct wl *wl)
{
    return tu_rand(&wl->rng);
}

uint64_t pos_of(const struct wl *wl)
{
    return plx_fault_log_position(wl->fb);
}

void violation(struct wl *wl, const char *fmt, ...)
{
    wl->violations++;
    if (wl->msgs >= MAX_MSGS || wl->img_msgs >= IMG_MSGS)
        return;
    wl->msgs++;
    wl->img_msgs++;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "VIOLATION [%s seed %llu] %s: %s\n", wl->name, (unsigned long long)wl->seed,
            wl->where, buf);
}

/* ---- Workload setup -------------------------------------------------------------------------- */

void wl_init_log(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes,
                 uint64_t log_blocks)
{
    memset(wl, 0, sizeof *wl);
    wl->log_blocks = log_blocks;
    wl->name = name;
    wl->seed = seed;
    wl->rng = seed;
    wl->next_wid = 1;
    wl->expect_ok = true;
    snprintf(wl->where, sizeof wl->where, "workload");

    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(STORE_BYTES / BS + log_blocks);
    ck_assert_ptr_nonnull(mem);
    /* Junk everywhere first, as on a used disk: a block linked before its own contents are
     * durable then reads as junk instead of passing for zeros. */
    enum { JUNK_RUN = 256 };
    unsigned char *junk = plx_block_alloc(JUNK_RUN);
    memset(junk, 0xee, (size_t)JUNK_RUN * BS);
    for (uint64_t b = 0; b < STORE_BYTES / BS + log_blocks; b += JUNK_RUN)
        ck_assert_int_eq(tu_io(mem, PLX_IO_WRITE, b,
                               (uint32_t)(STORE_BYTES / BS + log_blocks - b < JUNK_RUN
                                              ? STORE_BYTES / BS + log_blocks - b
                                              : JUNK_RUN),
                               junk, 0),
                         0);
    plx_block_free(junk);
    if (log_blocks)
        plx_backend_mem_poke(mem, STORE_BYTES / BS, NULL); /* an empty log: its head is zero */
    plx_backend *fmt = log_blocks ? win_new(mem, 0, STORE_BYTES / BS) : mem;
    int rc = plx_format_backend(fmt, EXTENT_BYTES, err, sizeof err);
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    if (fmt != mem)
        fmt->ops->destroy(fmt);
    wl->fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(wl->fb);
    mem->ops->destroy(mem);
    wl->sb0 = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(wl->fb, PLX_IO_READ, 0, 1, wl->sb0, 0), 0);
    struct plx_open_opts o = {.struct_size = sizeof o, .cache_bytes = cache_bytes};
    rc = plx_store_open_backend(log_blocks ? win_new(wl->fb, 0, STORE_BYTES / BS) : fwd_new(wl->fb),
                                &o, &wl->st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    if (log_blocks) {
        /* This engine plays a process that crashes: its locks name a start time no process
         * has, so the process that replays a crash image finds them stale. */
        wl->st->epoch ^= 0x5a5a5a;
        rc = plx_wlog_attach(wl->st, win_new(wl->fb, STORE_BYTES / BS, log_blocks), 1, "log");
        ck_assert_msg(rc == 0, "attach the write log: %d %s", rc, plx_store_errmsg(wl->st));
        wl->log_ready_pos = plx_fault_log_position(wl->fb);
    }
}

void wl_init(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes)
{
    wl_init_log(wl, name, seed, cache_bytes, 0);
}

void wl_free(struct wl *wl)
{
    for (int i = 0; i < wl->nv; i++) {
        struct mvdi *m = &wl->v[i];
        for (uint32_t t = 0; t < m->nt; t++)
            free(m->hist[t].v);
        free(m->hist);
        free(m->init);
        free(m->snaps.v);
        free(m->flushes.v);
    }
    for (size_t i = 0; i < wl->ns; i++)
        free(wl->s[i].hlen);
    free(wl->w);
    free(wl->f);
    free(wl->s);
    free(wl->e);
    plx_block_free(wl->sb0);
    if (wl->fb)
        wl->fb->ops->destroy(wl->fb);
    memset(wl, 0, sizeof *wl);
}

static void vdi_setup(struct mvdi *m, const char *name, uint64_t size, const struct range *r,
                      int nr)
{
    snprintf(m->name, sizeof m->name, "%s", name);
    m->size = size;
    m->nr = nr;
    m->nt = 0;
    for (int i = 0; i < nr; i++) {
        m->r[i] = r[i];
        m->r[i].t0 = m->nt;
        ck_assert((r[i].vb0 + r[i].n) * BS <= size);
        m->nt += r[i].n;
    }
    m->init = calloc(m->nt, sizeof *m->init);
    m->hist = calloc(m->nt, sizeof *m->hist);
    ck_assert(m->init && m->hist);
    m->parent = -1;
    m->pred_ok = true;
}

int add_vdi(struct wl *wl, const char *name, uint64_t size, const struct range *r, int nr)
{
    ck_assert_int_lt(wl->nv, MAXV);
    struct mvdi *m = &wl->v[wl->nv];
    vdi_setup(m, name, size, r, nr);
    int rc = plx_vdi_create(wl->st, name, size, &m->id);
    ck_assert_msg(rc == 0, "create %s: %d %s", name, rc, plx_store_errmsg(wl->st));
    m->create_pos = pos_of(wl);
    return wl->nv++;
}

/* The value tracked block t holds in a view that saw the first hlen writes to it: the latest
 * that succeeded (or the initial contents), or one that failed or was lost after it (such a
 * write may or may not have landed). Returns whether val is acceptable; *expect gets the
 * definite value. */
bool prefix_ok(const struct wl *wl, const struct mvdi *m, uint32_t t, uint32_t hlen, uint32_t val,
               uint32_t *expect)
{
    const struct ivec *h = &m->hist[t];
    bool ok = false;
    int64_t j = (int64_t)hlen - 1;
    while (j >= 0 && (wl->w[h->v[j]].status != 0 || wl->w[h->v[j]].lost)) {
        if (wl->w[h->v[j]].wid == val)
            ok = true;
        j--;
    }
    *expect = j >= 0 ? wl->w[h->v[j]].wid : m->init[t];
    return ok || val == *expect;
}

int add_clone(struct wl *wl, const char *name, int parent, size_t srec_idx)
{
    ck_assert_int_lt(wl->nv, MAXV);
    const struct srec *sr = &wl->s[srec_idx];
    ck_assert(sr->done && sr->status == 0);
    struct mvdi *pm = &wl->v[parent];
    struct mvdi *m = &wl->v[wl->nv];
    vdi_setup(m, name, pm->size, pm->r, pm->nr);
    for (uint32_t t = 0; t < m->nt; t++) {
        uint32_t e;
        prefix_ok(wl, pm, t, sr->hlen[t], 0, &e);
        m->init[t] = e;
    }
    m->parent = parent;
    m->parent_index = sr->index;
    char spec[96];
    snprintf(spec, sizeof spec, "%s@%llu", pm->name, (unsigned long long)sr->index);
    int rc = plx_vdi_clone(wl->st, name, spec, &m->id);
    ck_assert_msg(rc == 0, "clone %s from %s: %d %s", name, spec, rc, plx_store_errmsg(wl->st));
    m->create_pos = pos_of(wl);
    return wl->nv++;
}

/* Odd-numbered VDIs open and close through the asynchronous calls (plx_vdi_open_async,
 * plx_vdi_close_async: the admin lock waited for on the loop, the open or close run from a
 * timer of the service pass), even ones through the blocking calls: both under every crash. */
struct async_res {
    int fired, rc;
    plx_vdi *v;
};

static void async_open_done(void *arg, int status, plx_vdi *v)
{
    struct async_res *r = arg;
    r->fired = 1;
    r->rc = status;
    r->v = v;
}

static void async_close_done(void *arg, int status)
{
    struct async_res *r = arg;
    r->fired = 1;
    r->rc = status;
}

/* Run the store's loop until r fired: 0, or the service pass's error. */
static int loop_until(plx_store *st, const struct async_res *r)
{
    while (!r->fired) {
        struct pollfd p = {.fd = plx_store_fd(st), .events = POLLIN};
        (void)poll(&p, 1, 100);
        int rc = plx_store_service(st);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int open_any(plx_store *st, const char *name, int async, plx_vdi **h)
{
    if (!async)
        return plx_vdi_open(st, name, 0, h);
    struct async_res r = {0};
    plx_open_req *req;
    int rc = plx_vdi_open_async(st, name, 0, async_open_done, &r, &req);
    if (!rc && (rc = loop_until(st, &r)) != 0)
        plx_vdi_open_cancel(req);
    *h = rc ? NULL : r.v;
    return rc ? rc : r.rc;
}

static int close_any(plx_store *st, plx_vdi *h, int async)
{
    struct async_res r = {0};
    int rc = async ? plx_vdi_close_async(h, async_close_done, &r) : -EAGAIN;
    if (rc == -EAGAIN) /* the write cache still drains it: the blocking close waits for that */
        return plx_vdi_close(h);
    if (rc)
        return rc;
    rc = loop_until(st, &r);
    return rc ? plx_vdi_close(h) /* the close under way is finished here */ : r.rc;
}

void open_vdi(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    int rc = open_any(wl->st, m->name, vi & 1, &m->h);
    ck_assert_msg(rc == 0, "open %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    if (wl->log_blocks) {
        rc = plx_wlog_vdi_enable(m->h);
        ck_assert_msg(rc == 0, "cache on for %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    }
}

void close_vdi(struct wl *wl, int vi)
{
    struct mvdi *m = &wl->v[vi];
    int rc = close_any(wl->st, m->h, vi & 1);
    if (rc != 0 && wl->expect_ok)
        violation(wl, "closing VDI %s: %d %s", m->name, rc, plx_store_errmsg(wl->st));
    m->h = NULL;
}

/* Hand every open VDI to the other engine (opened on first use as another host): wait for the
 * requests in flight, close the VDIs here and open them there. The engine that let go keeps
 * its node cache, which must not be trusted when the VDIs come back (writer_gen). */
void switch_engine(struct wl *wl)
{
    drain(wl);
    bool was_open[MAXV] = {false};
    for (int vi = 0; vi < wl->nv; vi++)
        if (wl->v[vi].h) {
            was_open[vi] = true;
            close_vdi(wl, vi);
        }
    if (!wl->other) {
        char err[256] = "";
        struct plx_open_opts o = {.struct_size = sizeof o, .host = "second-host"};
        int rc = plx_store_open_backend(fwd_new(wl->fb), &o, &wl->other, err, sizeof err);
        ck_assert_msg(rc == 0, "opening the second engine: %d %s", rc, err);
    }
    plx_store *t = wl->st;
    wl->st = wl->other;
    wl->other = t;
    for (int vi = 0; vi < wl->nv; vi++)
        if (was_open[vi])
            open_vdi(wl, vi);
}

/* The last successful snapshot of VDI vi that completed, or -1. */
long last_done_snap(const struct wl *wl, int vi)
{
    const struct mvdi *m = &wl->v[vi];
    for (uint32_t k = m->snaps.n; k-- > 0;) {
        const struct srec *s = &wl->s[m->snaps.v[k]];
        if (s->done && s->status == 0)
            return (long)m->snaps.v[k];
    }
    return -1;
}
