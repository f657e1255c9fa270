/*
 * tapdisk_driver.c - the tapdisk driver as the unit tests build it: tapdisk/block-parallax.c and
 * block-parallax-open.c unchanged, except that it opens its stores through tdd_store_open
 * (tapdisk_double.h), which a test can point at a store on a fault-injection backend. tapdisk's
 * own build compiles the driver's files directly, so no test hook reaches it.
 */
#define plx_store_open tdd_store_open
#include "block-parallax.c"
#include "block-parallax-open.c"
