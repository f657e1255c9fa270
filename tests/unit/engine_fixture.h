/*
 * engine_fixture.h - helpers the engine's unit tests share (engine_fixture.c).
 */
#ifndef PLX_ENGINE_FIXTURE_H
#define PLX_ENGINE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

/* The call fails with `want` and leaves an error message; the call succeeds. */
#define EXPECT_ERR(st, call, want)                                                                 \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == (want), "%s: got %d (%s), want %d", #call, rc_, plx_store_errmsg(st), \
                      (want));                                                                     \
        ck_assert_msg(plx_store_errmsg(st)[0] != '\0', "%s: no error message", #call);             \
    } while (0)

#define OK(st, call)                                                                               \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ >= 0, "%s: %d (%s)", #call, rc_, plx_store_errmsg(st));                  \
    } while (0)

/* The record of an asynchronous request, filled in by its callback rec_cb. */
struct cb_rec {
    int *in_submit; /* nonzero while a submit call is running */
    int fired;
    int status;
    int bad_context;
    int *order; /* completion order log */
    int *norder;
    int id;
};

plx_backend *new_medium(uint64_t bytes);
plx_store *open_kept(plx_backend *mem);
void check_clean(plx_store *st, const char *what);
void close_ok(plx_store *st);
plx_vdi *open_vdi(plx_store *st, const char *spec, unsigned flags);
void close_vdi(plx_store *st, plx_vdi *v);
uint64_t create_vdi(plx_store *st, const char *name, uint64_t size);
void pwrite_ok(plx_store *st, plx_vdi *v, const void *buf, uint64_t off, size_t len);
void pread_ok(plx_store *st, plx_vdi *v, void *buf, uint64_t off, size_t len);
void expect_bytes(plx_store *st, plx_vdi *v, const unsigned char *want, uint64_t off, size_t len,
                  const char *what);
void expect_zero(plx_store *st, plx_vdi *v, uint64_t off, size_t len, const char *what);
void pattern(unsigned char *buf, size_t len, uint64_t gen, uint64_t blk);
void rec_cb(void *arg, int status);
void drain_all(plx_store *st, struct cb_rec *recs, int n);

#endif
