/*
 * test_slab.c - the write log's fixed-size object slabs (libparallax/wcache/slab.c).
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slab.h"
#include "testutil.h"

/* Objects are zeroed, 16-byte aligned, distinct, and keep what is written into them. */
START_TEST(test_objects_are_zeroed_aligned_and_distinct)
{
    struct plx_slab s;
    plx_slab_init(&s, 40);
    ck_assert_uint_eq(s.size, 48);
    enum { N = 3 * (1 << 20) / 48 }; /* three chunks' worth */
    uint8_t **p = calloc(N, sizeof *p);
    ck_assert(p != NULL);
    int bad = 0; /* (counted: a ck_assert per byte would take minutes) */
    for (int i = 0; i < N; i++) {
        p[i] = plx_slab_alloc(&s);
        ck_assert(p[i] != NULL);
        bad += (uintptr_t)p[i] % 16 != 0;
        for (int k = 0; k < 40; k++)
            bad += p[i][k] != 0;
        memset(p[i], i % 251 + 1, 40);
    }
    ck_assert_int_eq(bad, 0);
    ck_assert_uint_eq(s.live, N);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 40; k++)
            bad += p[i][k] != i % 251 + 1;
    ck_assert_int_eq(bad, 0);
    /* A freed object is handed out again, zeroed. */
    plx_slab_free(&s, p[7]);
    uint8_t *q = plx_slab_alloc(&s);
#ifndef __SANITIZE_ADDRESS__ /* (there every object is its own calloc) */
    ck_assert_ptr_eq(q, p[7]);
#endif
    for (int k = 0; k < 40; k++)
        ck_assert_uint_eq(q[k], 0);
    p[7] = q;
    plx_slab_free(&s, NULL); /* as free(NULL) */
    for (int i = 0; i < N; i++)
        plx_slab_free(&s, p[i]);
    ck_assert_uint_eq(s.live, 0);
    plx_slab_destroy(&s);
    free(p);
}
END_TEST

/* Once nothing is in use the slab keeps one chunk (a writer at QD 1 empties the log after
 * each write) and unmaps the rest; it then hands out objects from that chunk again. */
START_TEST(test_an_empty_slab_keeps_one_chunk)
{
    struct plx_slab s;
    plx_slab_init(&s, 4096);
    enum { N = 1000 }; /* about four chunks */
    void **p = calloc(N, sizeof *p);
    ck_assert(p != NULL);
    for (int i = 0; i < N; i++)
        ck_assert((p[i] = plx_slab_alloc(&s)) != NULL);
#ifndef __SANITIZE_ADDRESS__
    ck_assert_uint_ge(s.nchunks, 4);
#endif
    for (int i = 0; i < N; i++)
        plx_slab_free(&s, p[i]);
#ifndef __SANITIZE_ADDRESS__
    ck_assert_uint_eq(s.nchunks, 1);
#endif
    for (int r = 0; r < 100; r++) { /* one object in and out: no chunk is mapped again */
        void *o = plx_slab_alloc(&s);
        ck_assert(o != NULL);
        memset(o, 0xee, 4096);
        plx_slab_free(&s, o);
    }
#ifndef __SANITIZE_ADDRESS__
    ck_assert_uint_eq(s.nchunks, 1);
#endif
    for (int i = 0; i < N; i++) /* and it grows again */
        ck_assert((p[i] = plx_slab_alloc(&s)) != NULL);
    for (int i = 0; i < N; i++)
        plx_slab_free(&s, p[i]);
    plx_slab_destroy(&s);
    free(p);
}
END_TEST

static Suite *slab_suite(void)
{
    Suite *s = suite_create("slab");
    TCase *tc = tcase_create("slab");
    tcase_add_test(tc, test_objects_are_zeroed_aligned_and_distinct);
    tcase_add_test(tc, test_an_empty_slab_keeps_one_chunk);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(slab_suite)
