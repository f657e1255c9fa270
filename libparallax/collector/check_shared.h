/*
 * check_shared.h - what the parts of the consistency checker share (check.c and the files it
 * names): its limits, its state (struct ck, the per-block bits check.c's top comment describes)
 * and the calls each part makes into another. Not for anything outside collector/check*.c: the
 * checker's interface is plx_check_ex (parallax.h).
 *
 *   check.c            the entry point: the steps below in order; who else writes the store
 *   check_catalogue.c  the VDI registry, every snapshot log and label index
 *   check_walk.c       marking references; the radix trees, level by level; trees held open
 *   check_extents.c    superblock, state block, extent catalogue, bitmaps; reclaim records; leaks
 *   check_report.c     the caller's lines and progress; the names of trees and places in them
 *
 * Each calls only the ones listed after it (docs/DESIGN.md, Layers).
 */
#ifndef PLX_CHECK_SHARED_H
#define PLX_CHECK_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "engine.h"

struct plx_hold;

#define CK_RUN 64u          /* blocks per read of radix nodes */
#define CK_QD_MAX 32u       /* reads of radix nodes in flight (plx_check_opts.read_depth) */
#define CK_MAX_LINES 10000u /* a badly damaged store must not flood the caller */
#define CK_TYPE_BAD 0xffu   /* catalogue entry with an invalid type */

struct ck_tree {
    size_t vdi;    /* index in ck.vdis */
    uint64_t snap; /* snapshot index, 0 = the VDI's current tree */
    uint64_t root;
};

struct ck_item {
    uint64_t addr;
    size_t tree; /* the tree that reached the node first, for messages */
};

struct ck_list {
    struct ck_item *v;
    size_t n, cap;
};

/* A snapshot-log block's place and skip link, to check the links once the chain is known. */
struct ck_skip {
    uint64_t addr, first, skip, skip_first;
};

struct ck_logblk {
    uint64_t addr;
    size_t vdi;
};

/* A label: of a live snapshot in the log, or of an entry in the label index. */
struct ck_label {
    uint64_t index;
    char label[PLX_LABEL_MAX + 1];
};

struct ck_labels {
    struct ck_label *v;
    size_t n, cap;
};

enum ck_ref_kind { REF_NODE, REF_CUR_ROOT, REF_SNAP_ROOT, REF_LOG, REF_REGISTRY, REF_LIDX };

/* Where a reference comes from; only turned into text when something is wrong. */
struct ck_ref {
    enum ck_ref_kind kind;
    size_t tree;    /* REF_NODE, REF_*_ROOT */
    size_t vdi;     /* REF_LOG */
    uint64_t node;  /* REF_NODE: the node holding the link */
    unsigned level; /* REF_NODE: that node's level */
    unsigned idx;   /* REF_NODE: the entry */
};

struct ck {
    plx_store *st;
    struct plx_check_report *out;
    void (*report)(void *arg, int is_error, const char *line);
    void *arg;
    plx_progress_fn progress; /* may be NULL */
    void *progress_arg;
    uint64_t nb, eb, bmb, next;   /* blocks, blocks per extent, bitmap blocks, extents */
    struct plx_state_block state; /* as on disk now (falls back to the one read at open) */
    uint8_t *types;               /* per extent: catalogue type or CK_TYPE_BAD */
    uint8_t *bm_ok;               /* per extent: its allocation bitmap was read */
    uint64_t *reach, *wr, *wl, *dup, *alloc;
    struct plx_vdi_record *vdis; /* valid, live records */
    size_t nvdis;
    struct ck_tree *trees;
    size_t ntrees, trees_cap;
    struct ck_logblk *logs;
    size_t nlogs, logs_cap;
    struct ck_skip *skips; /* the log blocks of the VDI being checked, newest first */
    size_t nskips, skips_cap;
    struct ck_labels log_labels, idx_labels; /* of the VDI being checked */
    size_t lidx_vdi;                         /* while walking its label index */
    struct ck_list levels[PLX_HEIGHT_LARGE];
    unsigned read_depth; /* radix node reads in flight, 1..CK_QD_MAX */
    uint8_t *iobuf;      /* read_depth runs of CK_RUN blocks */
    uint8_t *blkbuf;     /* one block */
    uint64_t lines, suppressed;
    int nomem;
    bool incomplete; /* some reference could not be followed: "leaks" may be live blocks */
};

/* ---- Bits ------------------------------------------------------------------------------------ */

static inline bool bit_test(const uint64_t *m, uint64_t i)
{
    return (m[i >> 6] >> (i & 63)) & 1;
}

static inline void bit_set(uint64_t *m, uint64_t i)
{
    m[i >> 6] |= 1ull << (i & 63);
}

static inline void bit_clear(uint64_t *m, uint64_t i)
{
    m[i >> 6] &= ~(1ull << (i & 63));
}

/* ---- check_catalogue.c ----------------------------------------------------------------------- */

/* The VDI registry: its blocks marked, every live record kept in c->vdis. */
int ck_registry(struct ck *c);
/* VDI vi's snapshot log and label index: blocks marked, live snapshots' trees added. */
int ck_log(struct ck *c, size_t vi);

/* ---- check_walk.c ---------------------------------------------------------------------------- */

/* NULL if block a may hold something of extent type `want`; otherwise why not. */
const char *ck_addr_problem(const struct ck *c, uint64_t a, unsigned want, char *buf, size_t len);
/* ck_ref_block's answers. */
enum { REF_AGAIN = 0, REF_NEW = 1, REF_NEW_UNALLOCATED = 2 };
/* Record one reference to block a (see check_walk.c). */
int ck_ref_block(struct ck *c, uint64_t a, bool wr, bool wl, const struct ck_ref *r);
/* A tree to walk: VDI vdi's current tree (snap 0) or one of its snapshots. */
int ck_tree_add(struct ck *c, size_t vdi, uint64_t snap, uint64_t root);
/* Mark tree t's root and queue it for the walk of its level. */
void ck_add_root(struct ck *c, size_t t);
/* Read and check every node queued at `level`, queueing their children a level down. */
void ck_walk_level(struct ck *c, unsigned level);
/* plx_hold_each_live's callback: walk a held tree nothing live reaches. */
int ck_hold_tree(void *arg, const struct plx_hold *h);

/* ---- check_extents.c ------------------------------------------------------------------------- */

/* Superblock, state block and extent catalogue (fills c->types). */
int ck_system(struct ck *c);
/* Every extent's allocation bitmap into c->alloc. */
void ck_read_bitmaps(struct ck *c);
/* Mark the blocks of the extents' reclaim records. */
void ck_reclaim_records(struct ck *c);
/* Allocated but unreached blocks, counted and reported. */
void ck_leaks(struct ck *c);

/* ---- check_report.c -------------------------------------------------------------------------- */

void ck_progress(const struct ck *c, const char *step, uint64_t done, uint64_t total);
/* One line for the caller (an error counts in the report), up to CK_MAX_LINES. */
void ck_problem(struct ck *c, int is_error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *ck_type_name(unsigned t);
void ck_tree_name(const struct ck *c, size_t t, char *buf, size_t len);
void ck_ref_text(const struct ck *c, const struct ck_ref *r, char *buf, size_t len);
/* What a block that must be private is, for the message about it being shared. */
void ck_block_role(const struct ck *c, uint64_t a, char *buf, size_t len);

#endif
