/*
 * test_check.c - the consistency checker (plx_check): clean stores are clean, and each kind of
 * damage, made by poking the memory medium directly, is found and reported as what it is.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_fault.h"
#include "format.h"
#include "parallax.h"
#include "testutil.h"

#define BS PLX_BLOCK_SIZE
#define MiB (1ull << 20)
#define EXTENT_BLOCKS (MiB / BS)
#define MEDIUM_BLOCKS (16 * EXTENT_BLOCKS)


/* ---- Collecting the report ------------------------------------------------------------------- */

#define MAX_LINES 64

struct lines {
    unsigned n, errors, warnings;
    char text[MAX_LINES][1024];
    int is_error[MAX_LINES];
};

static void collect(void *arg, int is_error, const char *line)
{
    struct lines *l = arg;
    ck_assert_ptr_nonnull(line);
    if (is_error)
        l->errors++;
    else
        l->warnings++;
    if (l->n < MAX_LINES) {
        snprintf(l->text[l->n], sizeof(l->text[0]), "%s", line);
        l->is_error[l->n] = is_error;
        l->n++;
    }
}

static void dump(const struct lines *l)
{
    for (unsigned i = 0; i < l->n; i++)
        fprintf(stderr, "  %s: %s\n", l->is_error[i] ? "error" : "warning", l->text[i]);
}

/* Is there a line of the given kind containing `needle`? */
static int has_line(const struct lines *l, int is_error, const char *needle)
{
    for (unsigned i = 0; i < l->n; i++)
        if (l->is_error[i] == is_error && strstr(l->text[i], needle))
            return 1;
    return 0;
}

/* Run the checker; it must run (return 0) and its counts must agree with the lines. */
static struct plx_check_report run_check(plx_store *st, struct lines *l)
{
    struct plx_check_report r;
    memset(&r, 0xa5, sizeof(r));
    memset(l, 0, sizeof(*l));
    int rc = plx_check(st, &r, collect, l);
    ck_assert_msg(rc == 0, "plx_check: %d %s", rc, plx_store_errmsg(st));
    ck_assert_uint_eq(r.errors, l->errors);
    if (getenv("PLX_TEST_VERBOSE"))
        dump(l);
    return r;
}

#define ASSERT_LINE(l, is_error, needle)                                                           \
    do {                                                                                           \
        if (!has_line((l), (is_error), (needle))) {                                                \
            dump(l);                                                                               \
            ck_abort_msg("no %s line containing '%s'", (is_error) ? "error" : "warning",           \
                         (needle));                                                                \
        }                                                                                          \
    } while (0)

/* ---- Fixtures -------------------------------------------------------------------------------- */

static plx_backend *new_medium(void)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(MEDIUM_BLOCKS);
    ck_assert_ptr_nonnull(mem);
    int rc = plx_format_backend(mem, MiB, err, sizeof(err));
    ck_assert_msg(rc == 0, "format: %d %s", rc, err);
    return mem;
}

static plx_store *open_store(plx_backend *be, int read_only)
{
    char err[256] = "";
    struct plx_open_opts o;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.read_only = read_only;
    plx_store *st = NULL;
    int rc = plx_store_open_backend(be, &o, &st, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

static void write_blocks(plx_store *st, const char *vdi, uint64_t vblock, unsigned n, uint64_t seed)
{
    plx_vdi *v = NULL;
    ck_assert_msg(plx_vdi_open(st, vdi, 0, &v) == 0, "open %s: %s", vdi, plx_store_errmsg(st));
    char *buf = malloc((size_t)n * BS);
    ck_assert_ptr_nonnull(buf);
    tu_fill(buf, (size_t)n * BS, seed);
    int rc = plx_vdi_pwrite(v, buf, vblock * BS, (size_t)n * BS, 0);
    ck_assert_msg(rc == 0, "write %s: %d %s", vdi, rc, plx_store_errmsg(st));
    free(buf);
    ck_assert_int_eq(plx_vdi_close(v), 0);
}

/* VDI "a" (8 MiB: a 3-level tree) with data in two leaves, snapshot a@1, block 0 of "a"
 * rewritten after it (a private path and a writable data link), and clone "b" of a@1 with block 5
 * rewritten. Three trees, one snapshot. */
static void populate(plx_store *st)
{
    uint64_t id = 0, idx = 0;
    ck_assert_int_eq(plx_vdi_create(st, "a", 8 * MiB, &id), 0);
    write_blocks(st, "a", 0, 16, 1);
    write_blocks(st, "a", 1024, 1, 2); /* another leaf: 1024 >> 9 = 2 */
    ck_assert_msg(plx_vdi_snapshot(st, "a", "s1", &idx) == 0, "snapshot: %s", plx_store_errmsg(st));
    ck_assert_uint_eq(idx, 1);
    write_blocks(st, "a", 0, 1, 3);
    ck_assert_msg(plx_vdi_clone(st, "b", "a@1", &id) == 0, "clone: %s", plx_store_errmsg(st));
    write_blocks(st, "b", 5, 1, 4);
}

/* A populated medium, the writer closed, and the store reopened read-only on it. */
struct fx {
    plx_backend *mem;
    plx_store *st;
};

static struct fx setup_populated(void)
{
    struct fx f;
    f.mem = new_medium();
    plx_store *w = open_store(tu_keep_wrap(f.mem), 0);
    populate(w);
    ck_assert_int_eq(plx_store_close(w), 0);
    f.st = open_store(f.mem, 1); /* the store owns the medium from here */
    return f;
}

/* ---- Reading and poking the medium ----------------------------------------------------------- */

static void read_block(plx_backend *mem, uint64_t addr, void *out)
{
    const void *p = plx_backend_mem_peek(mem, addr);
    if (p)
        memcpy(out, p, BS);
    else
        memset(out, 0, BS);
}

static uint64_t link_at(plx_backend *mem, uint64_t node, unsigned idx)
{
    uint64_t links[PLX_RADIX_FANOUT];
    read_block(mem, node, links);
    return links[idx];
}

static void set_link(plx_backend *mem, uint64_t node, unsigned idx, uint64_t link)
{
    uint64_t links[PLX_RADIX_FANOUT];
    read_block(mem, node, links);
    links[idx] = link;
    plx_backend_mem_poke(mem, node, links);
}

/* The leaf (level 0) node that maps virtual block vb in the tree under `root`. */
static uint64_t leaf_under(plx_backend *mem, uint64_t root, unsigned height, uint64_t vb)
{
    uint64_t a = root;
    for (unsigned level = height - 1; level > 0; level--) {
        uint64_t l = link_at(mem, a, (unsigned)(vb >> (level * PLX_RADIX_BITS)) & 511);
        ck_assert_msg(l != 0, "no path to block %llu under root %llu", (unsigned long long)vb,
                      (unsigned long long)root);
        a = plx_link_addr(l);
    }
    return a;
}

/* The same in a VDI's current tree. */
static uint64_t leaf_of(plx_store *st, plx_backend *mem, const char *vdi, uint64_t vb)
{
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(st, vdi, &info), 0);
    return leaf_under(mem, info.root, info.height, vb);
}

static uint64_t bitmap_block_of(uint64_t block, unsigned *bit)
{
    uint64_t e = block / EXTENT_BLOCKS, off = block % EXTENT_BLOCKS;
    *bit = (unsigned)(off % (BS * 8));
    return e * EXTENT_BLOCKS + off / (BS * 8);
}

static int alloc_bit(plx_backend *mem, uint64_t block)
{
    unsigned bit;
    uint8_t bits[BS];
    read_block(mem, bitmap_block_of(block, &bit), bits);
    return (bits[bit / 8] >> (bit % 8)) & 1;
}

static void set_alloc_bit(plx_backend *mem, uint64_t block, int value)
{
    unsigned bit;
    uint64_t bb = bitmap_block_of(block, &bit);
    uint8_t bits[BS];
    read_block(mem, bb, bits);
    if (value)
        bits[bit / 8] |= (uint8_t)(1u << (bit % 8));
    else
        bits[bit / 8] &= (uint8_t) ~(1u << (bit % 8));
    plx_backend_mem_poke(mem, bb, bits);
}

/* The block holding the record of `name`: found through the VDI table, read raw. */
static uint64_t record_in(plx_backend *mem, uint64_t addr, unsigned level, const char *name)
{
    uint8_t blk[BS];
    read_block(mem, addr, blk);
    const struct plx_vditab_block *t = (const struct plx_vditab_block *)blk;
    ck_assert_uint_eq(t->hdr.magic, PLX_MAGIC_VDITAB);
    for (unsigned i = 0; i < PLX_VDITAB_FANOUT; i++) {
        uint64_t e = t->entries[i], found = 0;
        if (e == 0)
            continue;
        if (level > 0) {
            found = record_in(mem, e, level - 1, name);
        } else {
            uint8_t rb[BS];
            read_block(mem, e, rb);
            const struct plx_vdi_record *r = (const struct plx_vdi_record *)rb;
            if (r->hdr.magic == PLX_MAGIC_VDI && strcmp(r->name, name) == 0)
                found = e;
        }
        if (found)
            return found;
    }
    return 0;
}

static uint64_t slot_of(plx_backend *mem, const char *name)
{
    uint8_t blk[BS];
    read_block(mem, 1, blk);
    struct plx_state_block state;
    memcpy(&state, blk, sizeof(state));
    uint64_t found = state.vdi_table_root
                         ? record_in(mem, state.vdi_table_root, state.vdi_table_height - 1, name)
                         : 0;
    ck_assert_msg(found, "no VDI record for %s", name);
    return found;
}

/* ---- Clean stores ---------------------------------------------------------------------------- */

START_TEST(test_fresh_store_clean)
{
    plx_backend *mem = new_medium();
    plx_store *st = open_store(tu_keep_wrap(mem), 0);
    struct lines l;
    struct plx_check_report r = run_check(st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ck_assert_uint_eq(r.reachable_blocks, 0);
    ck_assert_uint_eq(r.trees, 0);
    ck_assert_uint_eq(r.snapshots, 0);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    st = open_store(mem, 1);
    r = run_check(st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_int_eq(plx_store_close(st), 0);
}
END_TEST

START_TEST(test_populated_store_clean)
{
    plx_backend *mem = new_medium();
    plx_store *w = open_store(tu_keep_wrap(mem), 0);
    populate(w);

    /* The writer itself, with blocks claimed but not used yet: those are not leaks. */
    struct lines l;
    struct plx_check_report r = run_check(w, &l);
    if (r.errors || r.leaked_blocks)
        dump(&l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ck_assert_uint_eq(r.trees, 3);
    ck_assert_uint_eq(r.snapshots, 1);
    uint64_t reachable = r.reachable_blocks;
    /* At least: 17 + 1 + 1 data blocks, 3 roots, a snapshot log block, level-1 and leaves. */
    ck_assert_uint_ge(reachable, 17 + 1 + 1 + 3 + 1 + 2);
    ck_assert_int_eq(plx_store_close(w), 0);

    plx_store *st = open_store(mem, 1);
    r = run_check(st, &l);
    if (r.errors || r.leaked_blocks)
        dump(&l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ck_assert_uint_eq(r.trees, 3);
    ck_assert_uint_eq(r.snapshots, 1);
    ck_assert_uint_eq(r.reachable_blocks, reachable);
    ck_assert_uint_eq(l.n, 0);

    /* A NULL callback is allowed; the counts are the same. */
    struct plx_check_report r2;
    ck_assert_int_eq(plx_check(st, &r2, NULL, NULL), 0);
    ck_assert_uint_eq(r2.reachable_blocks, reachable);
    ck_assert_uint_eq(r2.errors, 0);
    ck_assert_int_eq(plx_store_close(st), 0);
}
END_TEST

/* A snapshot record beyond snap_count (a snapshot that never completed) is not looked at. */
START_TEST(test_incomplete_snapshot_ignored)
{
    struct fx f = setup_populated();
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(f.st, "a@1", &si), 0);
    struct plx_vdi_record rec;
    uint8_t blk[BS];
    read_block(f.mem, slot_of(f.mem, "a"), blk);
    memcpy(&rec, blk, sizeof(rec));
    uint64_t log = rec.snaplog_head;
    struct plx_snaplog_block *lb = (struct plx_snaplog_block *)blk;
    read_block(f.mem, log, blk);
    ck_assert_uint_eq(lb->count, 1);
    lb->count = 2;
    lb->records[1].root = 7; /* nonsense: it must not be followed */
    plx_blkhdr_seal(lb, PLX_MAGIC_SNAPLOG, log);
    plx_backend_mem_poke(f.mem, log, lb);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    if (r.errors)
        dump(&l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.snapshots, 1);
    ck_assert_uint_eq(r.trees, 3);
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

/* Deleted VDIs and snapshots are not walked: what only they reached is garbage for the
 * collector, reported as leaked (a warning), never as an error. */
START_TEST(test_deleted_trees_skipped)
{
    plx_backend *mem = new_medium();
    plx_store *w = open_store(tu_keep_wrap(mem), 0);
    populate(w);
    ck_assert_msg(plx_vdi_delete(w, "b") == 0, "delete: %s", plx_store_errmsg(w));
    ck_assert_int_eq(plx_store_close(w), 0);
    plx_store *st = open_store(tu_keep_wrap(mem), 1);
    struct lines l;
    struct plx_check_report r = run_check(st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.trees, 2);
    ck_assert_uint_eq(r.snapshots, 1);
    ck_assert_uint_gt(r.leaked_blocks, 0); /* b's root, its copied path and its data block */
    uint64_t leaked_b = r.leaked_blocks;
    ck_assert_int_eq(plx_store_close(st), 0);

    w = open_store(tu_keep_wrap(mem), 0);
    ck_assert_msg(plx_snap_delete(w, "a@1") == 0, "snap delete: %s", plx_store_errmsg(w));
    ck_assert_int_eq(plx_store_close(w), 0);
    st = open_store(mem, 1);
    r = run_check(st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.trees, 1);
    ck_assert_uint_eq(r.snapshots, 0);
    ck_assert_uint_gt(r.leaked_blocks, leaked_b);
    ck_assert_int_eq(plx_store_close(st), 0);
}
END_TEST

/* ---- Damage ---------------------------------------------------------------------------------- */

START_TEST(test_link_to_unallocated_block)
{
    struct fx f = setup_populated();
    uint64_t leaf = leaf_of(f.st, f.mem, "a", 0);
    uint64_t data = plx_link_addr(link_at(f.mem, leaf, 0));
    ck_assert_uint_ne(data, 0);
    ck_assert_int_eq(alloc_bit(f.mem, data), 1);
    set_alloc_bit(f.mem, data, 0);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ASSERT_LINE(&l, 1, "unallocated");
    char needle[64];
    snprintf(needle, sizeof(needle), "block %llu", (unsigned long long)data);
    ASSERT_LINE(&l, 1, needle);
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_link_with_reserved_bits)
{
    struct fx f = setup_populated();
    /* Entry 1 of a's current leaf is read-only, shared with a@1: the data block stays reachable
     * through the snapshot, so the bad link is the only problem. */
    uint64_t leaf = leaf_of(f.st, f.mem, "a", 1);
    uint64_t l1 = link_at(f.mem, leaf, 1);
    ck_assert(plx_link_ro(l1));
    set_link(f.mem, leaf, 1, l1 | (1ull << 50));

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ASSERT_LINE(&l, 1, "reserved bits");
    ASSERT_LINE(&l, 1, "VDI a");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_writable_link_duplicated)
{
    struct fx f = setup_populated();
    /* Block 0 of "a" was rewritten after the snapshot: its data link is writable and private. */
    uint64_t a_leaf = leaf_of(f.st, f.mem, "a", 0);
    uint64_t wlink = link_at(f.mem, a_leaf, 0);
    ck_assert_uint_ne(wlink, 0);
    ck_assert(!plx_link_ro(wlink));
    uint64_t b_leaf = leaf_of(f.st, f.mem, "b", 5);
    ck_assert_uint_ne(b_leaf, a_leaf);
    ck_assert_uint_eq(link_at(f.mem, b_leaf, 100), 0);
    set_link(f.mem, b_leaf, 100, wlink);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "reachable writable from more than one tree/place");
    char needle[64];
    snprintf(needle, sizeof(needle), "block %llu ", (unsigned long long)plx_link_addr(wlink));
    ASSERT_LINE(&l, 1, needle);

    /* The same link read-only in b is still a second reference to a block "a" writes in
     * place. */
    set_link(f.mem, b_leaf, 100, wlink | PLX_LINK_RO);
    r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "reachable writable from more than one tree/place");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

/* Inside a snapshot nothing is written in place any more, but a block still has at most one
 * writable link: the engine makes every copy of a link read-only. */
START_TEST(test_writable_link_duplicated_in_snapshot)
{
    struct fx f = setup_populated();
    struct plx_snap_info si;
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_snap_lookup(f.st, "a@1", &si), 0);
    ck_assert_int_eq(plx_vdi_lookup(f.st, "a", &info), 0);
    uint64_t leaf = leaf_under(f.mem, si.root, info.height, 1);
    uint64_t wlink = link_at(f.mem, leaf, 1);
    ck_assert_uint_ne(wlink, 0);
    ck_assert(!plx_link_ro(wlink)); /* written before the snapshot, from this very leaf */
    ck_assert_uint_eq(link_at(f.mem, leaf, 200), 0);
    set_link(f.mem, leaf, 200, wlink);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "linked writable again from radix node");

    /* A read-only copy of the link is what the engine itself makes: no error. */
    set_link(f.mem, leaf, 200, wlink | PLX_LINK_RO);
    r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_data_link_into_metadata_extent)
{
    struct fx f = setup_populated();
    uint64_t b_leaf = leaf_of(f.st, f.mem, "b", 5);
    ck_assert_uint_eq(link_at(f.mem, b_leaf, 101), 0);
    set_link(f.mem, b_leaf, 101, b_leaf); /* a leaf pointing at itself: a metadata block */

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "in metadata extent");
    ASSERT_LINE(&l, 1, "data expected");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_leak_is_not_an_error)
{
    struct fx f = setup_populated();
    uint64_t leaf = leaf_of(f.st, f.mem, "a", 0);
    uint64_t data = plx_link_addr(link_at(f.mem, leaf, 0));
    uint64_t ext = data / EXTENT_BLOCKS * EXTENT_BLOCKS;
    uint64_t free_blk = 0;
    for (uint64_t b = ext + 1; b < ext + EXTENT_BLOCKS && !free_blk; b++)
        if (!alloc_bit(f.mem, b))
            free_blk = b;
    ck_assert_uint_ne(free_blk, 0);
    set_alloc_bit(f.mem, free_blk, 1);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 1);
    char needle[80];
    snprintf(needle, sizeof(needle), "data block %llu is allocated but not reachable",
             (unsigned long long)free_blk);
    ASSERT_LINE(&l, 0, needle);

    /* Several leaks in one extent make one line. */
    set_alloc_bit(f.mem, free_blk + 1, 1);
    set_alloc_bit(f.mem, free_blk + 3, 1);
    r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 3);
    ck_assert_uint_eq(l.n, 1);
    ASSERT_LINE(&l, 0, "3 blocks are allocated but not reachable");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_current_root_shared_with_snapshot)
{
    struct fx f = setup_populated();
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(f.st, "a", &info), 0);
    struct plx_vdi_record rec;
    uint8_t blk[BS];
    read_block(f.mem, slot_of(f.mem, "a"), blk);
    memcpy(&rec, blk, sizeof(rec));
    struct plx_snaplog_block *lb = (struct plx_snaplog_block *)blk;
    read_block(f.mem, rec.snaplog_head, blk);
    uint64_t old_root = lb->records[0].root;
    lb->records[0].root = info.root;
    plx_blkhdr_seal(lb, PLX_MAGIC_SNAPLOG, rec.snaplog_head);
    plx_backend_mem_poke(f.mem, rec.snaplog_head, lb);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_ge(r.errors, 1);
    ASSERT_LINE(&l, 1, "current root of VDI a");
    /* The snapshot's real root is no longer referenced (nor are the nodes below it that only
     * the snapshot kept): leaks, not errors. */
    ck_assert_uint_ge(r.leaked_blocks, 1);
    char one[80], first[80];
    snprintf(one, sizeof(one), "metadata block %llu is allocated but not reachable",
             (unsigned long long)old_root);
    snprintf(first, sizeof(first), "not reachable (first %llu,", (unsigned long long)old_root);
    if (!has_line(&l, 0, one) && !has_line(&l, 0, first)) {
        dump(&l);
        ck_abort_msg("the old snapshot root %llu is not reported leaked",
                     (unsigned long long)old_root);
    }
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_snapshot_log_damage)
{
    struct fx f = setup_populated();
    uint64_t slot = slot_of(f.mem, "a");
    uint8_t blk[BS];
    struct plx_vdi_record *rec = (struct plx_vdi_record *)blk;
    read_block(f.mem, slot, blk);
    uint64_t log = rec->snaplog_head;

    /* The record counts a snapshot the log does not hold. */
    rec->snap_count = 2;
    plx_blkhdr_seal(blk, PLX_MAGIC_VDI, slot);
    plx_backend_mem_poke(f.mem, slot, blk);
    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "not snapshot 2");

    /* A log block that does not validate. */
    rec->snap_count = 1;
    plx_blkhdr_seal(blk, PLX_MAGIC_VDI, slot);
    plx_backend_mem_poke(f.mem, slot, blk);
    read_block(f.mem, log, blk);
    blk[200] ^= 0x40;
    plx_backend_mem_poke(f.mem, log, blk);
    r = run_check(f.st, &l);
    ck_assert_uint_ge(r.errors, 1);
    ASSERT_LINE(&l, 1, "is corrupt");
    ASSERT_LINE(&l, 1, "snapshot log block");

    /* The log head moved into a data extent. */
    read_block(f.mem, slot, blk);
    uint64_t data = plx_link_addr(link_at(f.mem, leaf_of(f.st, f.mem, "a", 0), 0));
    rec->snaplog_head = data;
    plx_blkhdr_seal(blk, PLX_MAGIC_VDI, slot);
    plx_backend_mem_poke(f.mem, slot, blk);
    r = run_check(f.st, &l);
    ck_assert_uint_ge(r.errors, 1);
    ASSERT_LINE(&l, 1, "outside the metadata extents");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_corrupt_registry_record)
{
    struct fx f = setup_populated();
    uint64_t slot = slot_of(f.mem, "b");
    uint8_t blk[BS];
    read_block(f.mem, slot, blk);
    blk[100] ^= 1;
    plx_backend_mem_poke(f.mem, slot, blk);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    char needle[64];
    snprintf(needle, sizeof(needle), "at block %llu is corrupt", (unsigned long long)slot);
    ASSERT_LINE(&l, 1, needle);
    /* a and a@1 are still walked; b's private blocks are now unreachable. */
    ck_assert_uint_eq(r.trees, 2);
    ck_assert_uint_gt(r.leaked_blocks, 0);
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

START_TEST(test_bad_catalogue_type)
{
    struct fx f = setup_populated();
    uint8_t blk[BS];
    read_block(f.mem, 2, blk); /* the first catalogue block */
    struct plx_catalog_block *cb = (struct plx_catalog_block *)blk;
    cb->entries[15].type = 9;
    plx_blkhdr_seal(blk, PLX_MAGIC_CATALOG, 2);
    plx_backend_mem_poke(f.mem, 2, blk);

    struct lines l;
    struct plx_check_report r = run_check(f.st, &l);
    ck_assert_uint_eq(r.errors, 1);
    ASSERT_LINE(&l, 1, "extent 15 has invalid type 9");
    ck_assert_int_eq(plx_store_close(f.st), 0);
}
END_TEST

/* ---- I/O errors ------------------------------------------------------------------------------ */

START_TEST(test_io_errors)
{
    plx_backend *mem = new_medium();
    plx_store *w = open_store(tu_keep_wrap(mem), 0);
    populate(w);
    ck_assert_int_eq(plx_store_close(w), 0);
    w = open_store(tu_keep_wrap(mem), 1);
    uint64_t leaf = leaf_of(w, mem, "a", 1024);
    ck_assert_int_eq(plx_store_close(w), 0);

    /* The same bytes on a fault backend, which can fail chosen reads. */
    plx_backend *fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(fb);
    mem->ops->destroy(mem);
    plx_store *st = open_store(tu_keep_wrap(fb), 1);

    /* An unreadable node is an error; the walk goes on and still counts every tree. */
    plx_fault_fail_blocks(fb, PLX_IO_READ, leaf, 1, -EIO, -1);
    struct lines l;
    struct plx_check_report r = run_check(st, &l);
    ck_assert_uint_ge(r.errors, 1);
    ASSERT_LINE(&l, 1, "reading radix node");
    ck_assert_uint_eq(r.trees, 3);

    /* Without the superblock region the check cannot run at all. */
    plx_fault_clear(fb);
    plx_fault_fail_blocks(fb, PLX_IO_READ, 0, 2, -EIO, -1);
    struct plx_check_report r2;
    int rc = plx_check(st, &r2, collect, &l);
    ck_assert_int_eq(rc, -EIO);
    ck_assert_ptr_nonnull(strstr(plx_store_errmsg(st), "superblock"));
    plx_fault_clear(fb);
    ck_assert_int_eq(plx_store_close(st), 0);
    fb->ops->destroy(fb);
}
END_TEST

static Suite *check_suite(void)
{
    Suite *s = suite_create("check");
    TCase *tc = tcase_create("clean");
    tcase_add_test(tc, test_fresh_store_clean);
    tcase_add_test(tc, test_populated_store_clean);
    tcase_add_test(tc, test_incomplete_snapshot_ignored);
    tcase_add_test(tc, test_deleted_trees_skipped);
    suite_add_tcase(s, tc);

    tc = tcase_create("damage");
    tcase_add_test(tc, test_link_to_unallocated_block);
    tcase_add_test(tc, test_link_with_reserved_bits);
    tcase_add_test(tc, test_writable_link_duplicated);
    tcase_add_test(tc, test_writable_link_duplicated_in_snapshot);
    tcase_add_test(tc, test_data_link_into_metadata_extent);
    tcase_add_test(tc, test_leak_is_not_an_error);
    tcase_add_test(tc, test_current_root_shared_with_snapshot);
    tcase_add_test(tc, test_snapshot_log_damage);
    tcase_add_test(tc, test_corrupt_registry_record);
    tcase_add_test(tc, test_bad_catalogue_type);
    suite_add_tcase(s, tc);

    tc = tcase_create("io");
    tcase_add_test(tc, test_io_errors);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(check_suite)
