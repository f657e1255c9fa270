/*
 * wlog_fixture.h - what the tests of the write cache (test_wlog.c, test_wlog_auto.c,
 * test_wlog_drain.c) share: stores and logs on memory media, a random asynchronous workload
 * against a shadow copy of what was written, and reading it all back.
 */
#ifndef PLX_WLOG_FIXTURE_H
#define PLX_WLOG_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "parallax.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define STORE_BLOCKS (64 * MiB / BS)
#define VDI_BYTES (8 * MiB)
#define LOG_BLOCKS 1024 /* 4 MiB: twice the smallest log, so the ring wraps often */
plx_backend *new_store_medium(void);
plx_store *open_store(plx_backend *medium, const char *host);
extern bool g_zc;
void zc_mode(int i);

/* In zc_mode, records were written from the writers' buffers. */
void check_zc(plx_store *st);

int attach(plx_store *st, plx_backend *log_medium, int init);

struct shadow {
    uint8_t *bytes; /* what the VDI must read */
    uint8_t *busy;  /* per block: a write in flight covers it */
    unsigned inflight;
    unsigned failed;
    uint64_t rng;
    unsigned read_pct, trim_pct; /* of the operations run_writes submits */
};

struct wctx {
    struct shadow *sh;
    uint64_t b0, b1;
    void *buf;
};

void write_done(void *arg, int status);
void flush_done(void *arg, int status);

/* Submit one write of a random range (sub-block when `unaligned`), not overlapping any write in
 * flight, and copy it into the shadow. */
void random_write(plx_vdi *v, struct shadow *sh, bool unaligned, unsigned max_blocks);

void wait_all(plx_store *st, struct shadow *sh);

/* A read of blocks no write in flight covers: it must return what the shadow held when it was
 * submitted. */
struct rctx {
    struct shadow *sh;
    uint64_t off, len;
    uint8_t *buf, *expect;
};

void run_writes(plx_store *st, plx_vdi *v, struct shadow *sh, unsigned nops, unsigned qd,
                unsigned unaligned_pct, unsigned flush_pct);

void shadow_init(struct shadow *sh, uint64_t seed);
void shadow_free(struct shadow *sh);

/* The whole VDI reads as the shadow. */
void verify(plx_vdi *v, const struct shadow *sh, const char *when);

void check_clean(plx_store *st);
void int_done(void *arg, int status);

/* The log medium of loop test _i: memory, or (_i 2) a file through the page cache as
 * wlog_file.c opens it, whose small records complete inside submit (backend.h, PLX_IO_INLINE). */
plx_backend *log_medium(int i);

uint64_t mono_ms(void);

/* Every block of v written once and flushed: later writes then need no extent claim (the first
 * claim of a pool is a synchronous write, which would wait for a held store). */
void prefill(plx_vdi *v);

/* VDI "vm" read back through a store opened on `medium` by another host (host-b, no log attached:
 * the store alone) equals the shadow, and check finds that store clean. */
void verify_from_store(plx_backend *medium, const struct shadow *sh, const char *when);

#endif
