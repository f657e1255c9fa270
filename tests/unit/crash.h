/*
 * crash.h - what the rooms of the crash harness share (tests/unit/test_crash.c describes the
 * harness; EXTRA_test_crash in the Makefile lists its rooms): the model of a workload, its
 * requests, the verification, the workloads and the cases beside them.
 */
#ifndef PLX_TEST_CRASH_H
#define PLX_TEST_CRASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "backend_fault.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define MIB (1ull << 20)
#define STORE_BYTES (48 * MIB)
#define EXTENT_BYTES MIB
#define MAXV 6      /* VDIs per workload */
#define MAXR 6      /* tracked ranges per VDI */
#define MAX_MSGS 40 /* violations printed per workload */
#define IMG_MSGS 4  /* violations printed per crash image */
#define PAT_MAGIC 0x4b53415243584c50ull

/* Totals shared across the forked test processes (test_crash.c). */
struct totals {
    unsigned long long images; /* (position, mode, seed) images opened and verified */
    unsigned long long positions;
    unsigned long long workloads;
    unsigned long long failures; /* model violations */
    unsigned long long strict;   /* of which: an unfinished snapshot exists with wrong contents */
    unsigned long long eio_runs, eio_failures; /* error-injection tests */
    unsigned long long checks;                 /* plx_check runs */
};

/* ---- The model (crash_model.c) --------------------------------------------------------------- */

struct ivec {
    uint32_t *v;
    uint32_t n, cap;
};

/* A run of tracked virtual blocks; writes never cross a range's end. */
struct range {
    uint64_t vb0;
    uint32_t n;
    uint32_t t0; /* tracked index of vb0 */
};

struct wrec { /* a write or a trim */
    int vdi;
    uint32_t t0, nb;
    uint64_t b0;
    uint32_t wid; /* 0: trim (zeros) */
    bool fua, trim, acked;
    /* Acknowledged, but its VDI failed afterwards (a commit failed after writes of it were
     * acknowledged: pipeline.h, `failed`) before a flush or snapshot made it durable: like a
     * failed write, it may or may not be there once the VDI is opened again. */
    bool lost;
    int status;
    uint64_t sub_seq, sub_pos, ack_seq, ack_pos;
};

struct frec {
    int vdi;
    bool done;
    int status;
    uint64_t sub_seq, sub_pos, done_seq, done_pos;
};

struct srec {
    int vdi;
    bool done;
    int status;
    uint64_t sub_seq, sub_pos, done_pos;
    uint64_t index;      /* from the callback */
    uint64_t pred_index; /* predicted at submission: snapshots are numbered in request order */
    uint32_t *hlen;      /* per tracked block: writes submitted before the snapshot */
    char label[PLX_LABEL_MAX + 1]; /* given at creation */
    bool delete_submitted;
};

/* A label or a deletion of a completed snapshot of an open VDI (plx_vdi_submit_snap_label /
 * _delete). Per VDI they run one at a time in submission order. */
struct erec {
    int vdi;
    size_t snap; /* srec index */
    bool del;
    char label[PLX_LABEL_MAX + 1];
    bool done;
    int status;
    uint64_t sub_pos, done_pos;
};

struct mvdi {
    char name[48];
    uint64_t id;
    plx_vdi *h;
    uint64_t size;
    struct range r[MAXR];
    int nr;
    uint32_t nt;         /* tracked blocks */
    uint32_t *init;      /* per tracked block: value before any write (clones: the source) */
    struct ivec *hist;   /* per tracked block: writes in submission order */
    struct ivec snaps;   /* srec indices in submission order */
    struct ivec flushes; /* frec indices */
    uint64_t create_pos; /* the VDI exists in any image from here on */
    int parent;          /* clones: model index of the source VDI, else -1 */
    uint64_t parent_index;
    uint32_t cursor; /* sequential writes */
    bool pred_ok;    /* snapshot numbering still predictable (no snapshot failed) */
    uint64_t snaps_submitted;
    unsigned label_seq;
};

struct wl {
    const char *name;
    uint64_t seed, rng;
    plx_backend *fb; /* the fault backend: owned here, outlives the store */
    plx_store *st;
    plx_store *other; /* a second engine on the same medium (another host), or NULL */
    struct mvdi v[MAXV];
    int nv;
    struct wrec *w;
    size_t nw, capw;
    struct frec *f;
    size_t nf, capf;
    struct srec *s;
    size_t ns, caps;
    struct erec *e;
    size_t ne, cape;
    uint64_t seq;
    unsigned inflight;
    uint32_t next_wid;
    bool expect_ok; /* no error injected: every request must succeed */
    /* results */
    unsigned long long violations, msgs, img_msgs, strict;
    unsigned long long reads_checked, failed_reqs, completed;
    unsigned long long images, positions;
    unsigned reopened;   /* VDIs opened again after they failed (reopen_failed) */
    char where[200];     /* prefix for violation messages */
    char first_err[300]; /* the engine's message at the first failed request */
    uint8_t *sb0;        /* block 0 as formatted: nothing may write it again */
    /* Write-cache workloads: the log lives in the fault medium's last log_blocks blocks, after
     * the store, so one event log orders both (0: no cache). */
    uint64_t log_blocks;
    /* Blocks whose writes every crash point near is verified (not only sampled): the extent
     * catalogue for the claim-ahead workload (0 blocks: none). */
    uint64_t focus_first, focus_count;
    /* Write-cache workloads: where the new log was durable (attach returned); a crash before
     * it may leave no log at all, and nothing was written through one. */
    uint64_t log_ready_pos;
};

/* ---- Requests (crash_requests.c) ------------------------------------------------------------- */

struct mix {
    unsigned write, fua, trim, flush, snap, read, edit; /* weights; edit: snapshot label/delete */
    unsigned max_nb, max_trim;                          /* blocks per write / trim */
    unsigned hot;       /* percent of writes and trims aimed at the first 48 tracked blocks */
    bool seq;           /* writes walk the tracked blocks in order */
    unsigned inflight;  /* most requests in flight */
    unsigned max_snaps; /* per VDI */
    unsigned label;     /* percent of snapshots with a label */
};

/* A tracked range of a workload's VDI: blocks [a, a + b). */
#define R(a, b)                                                                                    \
    {                                                                                              \
        .vb0 = (a), .n = (b)                                                                       \
    }

/* The write-cache workload's log, in blocks (crash_workloads.c, wl_wcache). */
#define WCACHE_LOG_BLOCKS 640

/* ---- Functions by room ----------------------------------------------------------------------- */

/* test_crash.c */
extern struct totals *g_tot;
extern char g_ctx[512];

/* crash_model.c */
extern const uint8_t zero_blk[BS];
void pat_fill(uint8_t *blk, uint32_t wid, uint64_t vb);
int pat_decode(const uint8_t *blk, uint64_t vb, uint32_t *val, char *why, size_t wlen);
void ivec_push(struct ivec *iv, uint32_t x);
uint64_t rnd(struct wl *wl);
uint64_t pos_of(const struct wl *wl);
void violation(struct wl *wl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wl_init_log(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes,
                 uint64_t log_blocks);
void wl_init(struct wl *wl, const char *name, uint64_t seed, uint64_t cache_bytes);
void wl_free(struct wl *wl);
int add_vdi(struct wl *wl, const char *name, uint64_t size, const struct range *r, int nr);
bool prefix_ok(const struct wl *wl, const struct mvdi *m, uint32_t t, uint32_t hlen, uint32_t val,
               uint32_t *expect);
int add_clone(struct wl *wl, const char *name, int parent, size_t srec_idx);
void open_vdi(struct wl *wl, int vi);
void close_vdi(struct wl *wl, int vi);
void switch_engine(struct wl *wl);
long last_done_snap(const struct wl *wl, int vi);

/* crash_backend.c */
extern int g_nkeys;
extern const struct plx_fence_ops fwd_fence_ops;
plx_backend *win_new(plx_backend *in, uint64_t first, uint64_t nblocks);
plx_backend *fwd_new(plx_backend *in);

/* crash_requests.c */
void req_done(void *arg, int status);
unsigned write_flags(const struct wrec *w);
void sub_write(struct wl *wl, int vi, uint32_t t0, uint32_t nb, bool fua, bool trim);
void sub_flush(struct wl *wl, int vi);
void sub_snap(struct wl *wl, int vi, bool labelled);
void sub_read(struct wl *wl, int vi, uint32_t t0, uint32_t nb);
void service(struct wl *wl, bool need_progress);
void drain(struct wl *wl);
void settle(struct wl *wl, int vi);
void gen_op(struct wl *wl, const struct mix *mx, unsigned vmask);
void run_phase(struct wl *wl, const struct mix *mx, unsigned nops, unsigned vmask);

/* crash_verify.c */
uint64_t flush_seq_at(const struct wl *wl, int vi, uint64_t p);
void verify_image(struct wl *wl, plx_backend *img, uint64_t p, enum plx_crash_mode md,
                  uint64_t seed, unsigned nsnap);
void verify_live(struct wl *wl);
void check_superblock(struct wl *wl);
void crash_sweep(struct wl *wl, unsigned npos, unsigned nseeds, unsigned nsnap);
void report(struct wl *wl, double secs);
void eio_report(struct wl *wl);
double now_s(void);

/* crash_workloads.c */
unsigned npositions(void);
unsigned nseeds(void);
void wl_sequential(struct wl *wl);
void wl_random(struct wl *wl);
void wl_snap_overwrite(struct wl *wl);
void wl_clone(struct wl *wl);
void wl_snap_storm(struct wl *wl);
void wl_snap_inflight(struct wl *wl);
void wl_snap_edit(struct wl *wl);
void wl_trim(struct wl *wl);
void wl_fua_overwrite(struct wl *wl);
void wl_sparse(struct wl *wl);
void wl_checkpoint(struct wl *wl);
void wl_gc_fold(struct wl *wl);
void wl_placement(struct wl *wl);
void wl_claim_ahead(struct wl *wl);
void wl_claim_room(struct wl *wl);
void wl_handover(struct wl *wl);
void wl_snap_many(struct wl *wl);
void wl_takeover(struct wl *wl);
void wl_wcache(struct wl *wl);

/* crash_eio.c */
void crash_eio_tests(TCase *tc);

/* crash_registry.c */
void crash_registry_tests(TCase *tc);

#endif
