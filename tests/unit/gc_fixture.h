/*
 * gc_fixture.h - what the tests of the garbage collector (test_gc.c, test_gc_crash.c,
 * test_gc_races.c) share: stores on a shared memory medium (through a wrapper with a hook, for
 * the races), the block patterns, the model of what every tree must hold, reading every tree
 * back against it, and a mixed workload.
 */
#ifndef PLX_GC_FIXTURE_H
#define PLX_GC_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "parallax.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define EXTENT_BYTES MiB
#define MEDIUM_BYTES (64 * MiB)
extern char g_where[256];

/* ---- A backend that forwards to a medium it does not own, with a hook --------------------------
 * plx_store_open_backend destroys its backend on close; stores open the shared medium through
 * this wrapper so it survives them. The hook runs before an I/O is passed on (race repros). */
struct keep_be {
    plx_backend base;
    plx_backend *inner;
    void (*hook)(struct keep_be *k, const struct plx_io *io);
    void *hook_arg;
};

struct keep_be *keep_wrap(plx_backend *inner);
plx_backend *new_medium(uint64_t bytes);

/* Open a store on be (consumed). host NULL = this host (this process). */
plx_store *open_be(plx_backend *be, int read_only, const char *host);

plx_store *open_kept(plx_backend *medium, int read_only, const char *host);
void close_store(plx_store *st);
uint64_t sum4(const uint64_t *a);
struct plx_store_info info_of(plx_store *st);
uint64_t total_free(plx_store *st);
struct plx_check_report check_of(plx_store *st);
void assert_clean(plx_store *st, bool no_leaks);
struct plx_gc_report gc_of(plx_store *st, int dry_run);

/* Write id `wid` of virtual block vb: (wid, vb) in the first 12 bytes, then noise. 0 = zeros. */
void pattern(uint8_t *blk, uint32_t wid, uint64_t vb);

#define MAXV 12
#define MAXS 8

struct mv {
    char name[32];
    uint64_t nblocks;
    uint32_t *cur;            /* write id per virtual block */
    uint32_t *snap[MAXS + 1]; /* [i]: contents of @i (1-based); NULL: not taken */
    bool snap_deleted[MAXS + 1];
    int nsnap;
    bool deleted;
};

struct model {
    struct mv v[MAXV];
    int nv;
    uint32_t next_wid;
    uint8_t *touched; /* virtual blocks ever written, any VDI (big VDIs: what to read) */
    uint64_t touched_len;
};

#define SMALL_VDI_BLOCKS 4096u /* VDIs up to this size are read back whole */
#define MAX_VBLOCKS (1ull << 20)
void m_init(struct model *m);
void m_free(struct model *m);
uint32_t *map_copy(const uint32_t *src, uint64_t n);
int m_find(const struct model *m, const char *name);
int m_create(plx_store *st, struct model *m, const char *name, uint64_t bytes);
int m_clone(plx_store *st, struct model *m, const char *name, int src, int idx);
plx_vdi *vopen(plx_store *st, const char *spec, unsigned flags);
void vclose(plx_vdi *h);

/* Write each of vbs[0..n) as its own single-block write (a new write id each). */
void m_write(plx_store *st, struct model *m, int vi, const uint64_t *vbs, size_t n);

/* One write of the run [vb0, vb0 + n), one write id. */
void m_write_run(plx_store *st, struct model *m, int vi, uint64_t vb0, uint64_t n);

int m_snapshot(plx_store *st, struct model *m, int vi);
void m_snap_delete(plx_store *st, struct model *m, int vi, int idx);
void m_delete(plx_store *st, struct model *m, int vi);

/* Every live VDI and live snapshot reads back exactly; deleted ones are gone. */
void verify_all(plx_store *st, const struct model *m);

void random_vbs(uint64_t *out, size_t n, uint64_t nblocks, uint64_t *rng);
void build_mixed(plx_store *st, struct model *m);

/* Deletes part of build_mixed's trees: a snapshot and a VDI that others depend on, and more. */
void partial_delete(plx_store *st, struct model *m);

#endif
