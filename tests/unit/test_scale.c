/*
 * test_scale.c - costs that must not grow with history: looking up VDI@N, opening a VDI for
 * writing and checking labels read O(log n) snapshot-log blocks, not the log (snaplog.c skip
 * links). Reads are counted on a memory medium through a counting wrapper; the bounds below
 * would be broken many times over by reading the log (100 blocks here).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "backend_fault.h"
#include "format.h"
#include "parallax.h"
#include "registry.h"
#include "testutil.h"

#define MiB (1ull << 20)
#define MEDIUM_BLOCKS (64 * MiB / PLX_BLOCK_SIZE)
#define NSNAPS (100 * PLX_SNAPLOG_PER_BLOCK) /* 6,300 snapshots: 100 log blocks */
/* Log blocks a lookup may read: the skip path is at most about 3 log2(100) = 20 blocks long. */
#define MAX_LOG_READS 24u

static plx_store *open_store(plx_backend *mem, int read_only)
{
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = read_only};
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

struct counter {
    unsigned done, failed;
};

static void snap_done(void *arg, int status)
{
    struct counter *c = arg;
    c->done++;
    c->failed += status != 0;
}

/* A store with VDI "v" holding NSNAPS snapshots; every 7th follows a write (so roots differ),
 * the others are clean. Snapshot 1 is labelled "first", snapshot 4000 "middle", and one in five
 * others "sN" (N = its index): 1,261 labels, so the label index has interior nodes. */
static plx_backend *many_snapshots(void)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(MEDIUM_BLOCKS);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof err), 0);
    plx_store *st = open_store(mem, 0);
    ck_assert_int_eq(plx_vdi_create(st, "v", 64 * MiB, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    static uint64_t idx[NSNAPS];
    struct counter c = {0, 0};
    char buf[PLX_BLOCK_SIZE];
    for (unsigned i = 0; i < NSNAPS; i++) {
        if (i % 7 == 0) {
            memset(buf, (int)(i & 0xff), sizeof buf);
            ck_assert_int_eq(plx_vdi_pwrite(v, buf, (uint64_t)(i % 512) * 4096, sizeof buf, 0), 0);
        }
        char label[PLX_LABEL_MAX + 1] = "";
        if (i == 0 || i == 3999)
            snprintf(label, sizeof label, "%s", i == 0 ? "first" : "middle");
        else if (i % 5 == 2)
            snprintf(label, sizeof label, "s%u", i + 1);
        ck_assert_int_eq(plx_vdi_submit_snapshot(v, label, &idx[i], snap_done, &c), 0);
        while (c.done + 64 <= i + 1 || (i + 1 == NSNAPS && c.done < NSNAPS))
            ck_assert_int_ge(plx_store_service(st), 0);
    }
    ck_assert_uint_eq(c.failed, 0);
    ck_assert_uint_eq(idx[NSNAPS - 1], NSNAPS);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    return mem;
}

static void print_problem(void *arg, int is_error, const char *line)
{
    unsigned *n = arg;
    if (is_error && (*n)++ < 5)
        fprintf(stderr, "check: %s\n", line);
}

static void assert_check_clean(plx_backend *mem, uint64_t snapshots)
{
    plx_store *st = open_store(mem, 1);
    struct plx_check_report r;
    unsigned shown = 0;
    ck_assert_int_eq(plx_check(st, &r, print_problem, &shown), 0);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.snapshots, snapshots);
    plx_store_close(st);
}

/* Every snapshot resolves as VDI@N to the record the linear reader (plx_snap_list) finds, and
 * each lookup reads at most `max_reads` blocks (0: not counted). */
static void assert_lookups(plx_backend *mem, unsigned max_reads, size_t step)
{
    plx_store *st = open_store(mem, 1);
    struct plx_vdi_info vi;
    ck_assert_int_eq(plx_vdi_lookup(st, "v", &vi), 0);
    struct plx_snap_info *list;
    size_t n;
    ck_assert_int_eq(plx_snap_list(st, vi.id, &list, &n), 0);
    ck_assert_uint_eq(n, NSNAPS);
    unsigned long worst = 0;
    for (size_t i = 0; i < n; i = i + step < n || i + 1 == n ? i + step : n - 1) {
        char spec[64];
        snprintf(spec, sizeof spec, "v@%zu", i + 1);
        struct plx_snap_info si;
        unsigned long before = tu_reads;
        int rc = plx_snap_lookup(st, spec, &si);
        ck_assert_msg(rc == 0, "%s: %d %s", spec, rc, plx_store_errmsg(st));
        if (tu_reads - before > worst)
            worst = tu_reads - before;
        ck_assert_uint_eq(si.index, i + 1);
        ck_assert_uint_eq(si.root, list[i].root);
        ck_assert_str_eq(si.label, list[i].label);
    }
    free(list);
    fprintf(stderr, "scale: VDI@N over %u snapshots: at most %lu reads per lookup\n", NSNAPS,
            worst);
    if (max_reads)
        ck_assert_msg(worst <= max_reads, "a lookup read %lu blocks (bound %u)", worst, max_reads);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@middle", &si), 0);
    ck_assert_uint_eq(si.index, 4000);
    ck_assert_int_eq(plx_snap_lookup(st, "v@first", &si), 0);
    ck_assert_uint_eq(si.index, 1);
    ck_assert_int_eq(plx_snap_lookup(st, "v@6301", &si), -ENOENT);
    ck_assert_int_eq(plx_snap_lookup(st, "v@0", &si), -ENOENT);
    ck_assert_int_eq(plx_snap_lookup(st, "v@nosuch", &si), -ENOENT);
    plx_store_close(st);
}

/* VDI v's record on the medium (a memory backend), and its address. */
static const struct plx_vdi_record *find_record(plx_backend *mem, uint64_t *addr)
{
    for (uint64_t b = 0; b < mem->nblocks; b++) {
        const struct plx_vdi_record *r = plx_backend_mem_peek(mem, b);
        if (r && r->hdr.magic == PLX_MAGIC_VDI && strcmp(r->name, "v") == 0) {
            if (addr)
                *addr = b;
            return r;
        }
    }
    ck_abort_msg("no record of VDI v");
    return NULL;
}

/* Label index nodes a label lookup may read: a root and two levels for 1,261 labels. */
#define MAX_INDEX_READS 4u
/* Finding the VDI by name in the registry (format version 2: name index, bucket, record). */
#define MAX_REGISTRY_READS 4u

/* Every live labelled snapshot resolves as VDI@LABEL, within max_reads block reads each (0: not
 * counted); so does a label nobody has (-ENOENT). Returns the worst count. */
static unsigned long assert_label_lookups(plx_backend *mem, unsigned max_reads, size_t step)
{
    plx_store *st = open_store(mem, 1);
    struct plx_vdi_info vi;
    ck_assert_int_eq(plx_vdi_lookup(st, "v", &vi), 0);
    struct plx_snap_info *list;
    size_t n, labels = 0;
    ck_assert_int_eq(plx_snap_list(st, vi.id, &list, &n), 0);
    unsigned long worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (list[i].deleted || !list[i].label[0] || (i % step && list[i].index != 4000))
            continue;
        char spec[64];
        snprintf(spec, sizeof spec, "v@%s", list[i].label);
        struct plx_snap_info si;
        unsigned long before = tu_reads;
        int rc = plx_snap_lookup(st, spec, &si);
        ck_assert_msg(rc == 0, "%s: %d %s", spec, rc, plx_store_errmsg(st));
        if (tu_reads - before > worst)
            worst = tu_reads - before;
        ck_assert_uint_eq(si.index, list[i].index);
        ck_assert_uint_eq(si.root, list[i].root);
        labels++;
    }
    free(list);
    struct plx_snap_info si;
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_snap_lookup(st, "v@nosuch", &si), -ENOENT);
    unsigned long miss = tu_reads - before;
    fprintf(stderr, "scale: VDI@LABEL over %zu labels: at most %lu reads per lookup, %lu for a "
                    "missing label\n",
            labels, worst, miss);
    if (max_reads) {
        ck_assert_msg(worst <= max_reads, "a label lookup read %lu blocks (bound %u)", worst,
                      max_reads);
        ck_assert_msg(miss <= MAX_REGISTRY_READS + MAX_INDEX_READS, "a missing label read %lu blocks",
                      miss);
    }
    plx_store_close(st);
    return worst > miss ? worst : miss;
}

struct page {
    struct plx_snap_info *got;
    size_t n, cap;
};

static int page_add(void *arg, const struct plx_snap_info *si)
{
    struct page *p = arg;
    ck_assert_uint_lt(p->n, p->cap);
    p->got[p->n++] = *si;
    return 0;
}

/* plx_snap_iterate pages through the log in both directions, giving what plx_snap_list gives
 * (deleted snapshots left out), each page of 500 reading the start's skip path and the page's
 * own blocks, not the log. */
static void assert_pages(plx_backend *mem)
{
    plx_store *st = open_store(mem, 1);
    struct plx_vdi_info vi;
    ck_assert_int_eq(plx_vdi_lookup(st, "v", &vi), 0);
    struct plx_snap_info *list;
    size_t n, live = 0;
    ck_assert_int_eq(plx_snap_list(st, vi.id, &list, &n), 0);
    for (size_t i = 0; i < n; i++)
        live += !list[i].deleted;
    struct page p = {.got = calloc(n, sizeof *p.got), .cap = n};
    ck_assert_ptr_nonnull(p.got);
    unsigned long worst = 0;
    for (int newest = 0; newest < 2; newest++) {
        p.n = 0;
        struct plx_snap_iter_opts o = {.struct_size = sizeof o, .limit = 500,
                                       .newest_first = newest};
        for (;;) {
            size_t before_n = p.n;
            unsigned long before = tu_reads;
            ck_assert_int_eq(plx_snap_iterate(st, "v", &o, page_add, &p), 0);
            if (tu_reads - before > worst)
                worst = tu_reads - before;
            if (p.n == before_n)
                break;
            ck_assert_uint_le(p.n - before_n, 500);
            o.after = p.got[p.n - 1].index;
        }
        ck_assert_uint_eq(p.n, live);
        for (size_t i = 0, k = 0; i < n; i++) {
            const struct plx_snap_info *want = &list[newest ? n - 1 - i : i];
            if (want->deleted)
                continue;
            ck_assert_uint_eq(p.got[k].index, want->index);
            ck_assert_uint_eq(p.got[k].root, want->root);
            ck_assert_str_eq(p.got[k].label, want->label);
            k++;
        }
    }
    fprintf(stderr, "scale: snapshot pages of 500: at most %lu reads per page\n", worst);
    /* registry + skip path + the page's blocks (500 / 63, plus a partial one at each end) */
    ck_assert_uint_le(worst, 1 + MAX_LOG_READS + 10);
    free(p.got);
    free(list);
    plx_store_close(st);
}

START_TEST(test_lookup_reads_log_n)
{
    plx_backend *mem = many_snapshots();
    /* registry (1) + skip path + the block itself */
    assert_lookups(mem, 1 + MAX_LOG_READS, 1);
    /* registry + index path + the record's skip path */
    assert_label_lookups(mem, MAX_REGISTRY_READS + MAX_INDEX_READS + MAX_LOG_READS, 1);
    assert_pages(mem);
    assert_check_clean(mem, NSNAPS);
    mem->ops->destroy(mem);
}
END_TEST

/* Opening for writing reads the head block and the skip path, not the log; so does taking a
 * snapshot after it. The first label check then reads the log once. */
START_TEST(test_writable_open_reads_log_n)
{
    plx_backend *mem = many_snapshots();
    plx_store *st = open_store(mem, 0);
    plx_vdi *v;
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    unsigned long open_reads = tu_reads - before;
    fprintf(stderr, "scale: writable open with %u snapshots: %lu reads\n", NSNAPS, open_reads);
    ck_assert_msg(open_reads <= 4 + MAX_LOG_READS, "open read %lu blocks", open_reads);
    uint64_t idx = 0;
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "", &idx), 0);
    ck_assert_uint_eq(idx, NSNAPS + 1);
    ck_assert_uint_le(tu_reads - before, 4);
    /* Labels: taken ones are refused even though the log was not read at open. */
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "first", &idx), -EEXIST);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "middle", &idx), -EEXIST);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "new", &idx), 0);
    ck_assert_uint_eq(idx, NSNAPS + 2);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "new", &idx), -EEXIST);
    /* A label freed by relabelling or deleting can be used again. */
    ck_assert_int_eq(plx_vdi_snap_label(v, 1, "renamed"), 0);
    ck_assert_int_eq(plx_vdi_snap_delete(v, 4000), 0);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "first", &idx), 0);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "middle", &idx), 0);
    ck_assert_int_eq(plx_vdi_snap_label(v, 2, "renamed"), -EEXIST);
    ck_assert_int_eq(plx_vdi_close(v), 0);

    /* The same rules after a reopen, with the changes made before it read from the log. */
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_snap_label(v, 3, "renamed"), -EEXIST);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "first", &idx), -EEXIST);
    ck_assert_int_eq(plx_vdi_snap_delete(v, NSNAPS + 3), 0);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "first", &idx), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@renamed", &si), 0);
    ck_assert_uint_eq(si.index, 1);
    ck_assert_int_eq(plx_snap_lookup(st, "v@middle", &si), 0);
    ck_assert_uint_eq(si.index, NSNAPS + 4);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, NSNAPS + 5 - 2);
    mem->ops->destroy(mem);
}
END_TEST

/* Clear every skip link of v's log, as a Parallax without them wrote it. */
static unsigned unlink_log(plx_backend *mem)
{
    plx_store *st = open_store(mem, 1);
    struct plx_vdi_info vi;
    ck_assert_int_eq(plx_vdi_lookup(st, "v", &vi), 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@1", &si), 0);
    plx_store_close(st);
    /* Walk the chain from the head, found through the registry record. */
    uint64_t head = 0;
    for (uint64_t b = 0; b < mem->nblocks && !head; b++) {
        const struct plx_vdi_record *r = plx_backend_mem_peek(mem, b);
        if (r && r->hdr.magic == PLX_MAGIC_VDI && r->id == vi.id)
            head = r->snaplog_head;
    }
    ck_assert_uint_ne(head, 0);
    unsigned n = 0;
    for (uint64_t a = head; a; n++) {
        struct plx_snaplog_block lb;
        memcpy(&lb, plx_backend_mem_peek(mem, a), sizeof lb);
        lb.skip = 0;
        lb.skip_first = 0;
        uint8_t blk[PLX_BLOCK_SIZE] = {0};
        memcpy(blk, plx_backend_mem_peek(mem, a), sizeof blk);
        memcpy(blk, &lb, sizeof lb);
        plx_blkhdr_seal(blk, PLX_MAGIC_SNAPLOG, a);
        plx_backend_mem_poke(mem, a, blk);
        a = lb.prev;
    }
    /* ... and without a label index (those record words were reserved, zero). */
    uint64_t slot;
    uint8_t rb[PLX_BLOCK_SIZE];
    memcpy(rb, find_record(mem, &slot), sizeof rb);
    struct plx_vdi_record *rec = (struct plx_vdi_record *)rb;
    rec->label_index = 0;
    rec->label_indexed = 0;
    plx_blkhdr_seal(rb, PLX_MAGIC_VDI, slot);
    plx_backend_mem_poke(mem, slot, rb);
    return n;
}

/* A log written without skip links is read correctly (prev only) and linked on the first
 * writable open; a crash at any point of that linking leaves a log that resolves every snapshot
 * to the right root and checks clean. */
START_TEST(test_old_log_is_linked)
{
    plx_backend *mem = many_snapshots();
    ck_assert_uint_eq(unlink_log(mem), 100);
    assert_lookups(mem, 0, 1);
    /* Without an index a missing label reads the whole log: what the index saves. */
    ck_assert_uint_gt(assert_label_lookups(mem, 0, 1), 100);
    assert_check_clean(mem, NSNAPS);

    plx_backend *fb = plx_fault_create(mem, 0);
    ck_assert_ptr_nonnull(fb);
    plx_store *st = open_store(fb, 0);
    uint64_t start = plx_fault_log_position(fb);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    uint64_t end = plx_fault_log_position(fb);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Crash images from before the first link write to after the flush. */
    struct plx_crash_cursor *c = plx_crash_cursor_new(fb);
    unsigned images = 0;
    for (uint64_t p = start; p <= end; p += 1 + (end - start) / 12) {
        plx_crash_cursor_seek(c, p);
        for (int mode = 0; mode < 3; mode++) {
            plx_backend *img = plx_crash_cursor_image(c, (enum plx_crash_mode)mode, p);
            if (mode != PLX_CRASH_KEEP_ALL)
                assert_check_clean(img, NSNAPS);
            assert_lookups(img, 0, 61);
            assert_label_lookups(img, 0, 97);
            img->ops->destroy(img);
            images++;
        }
    }
    plx_crash_cursor_free(c);
    ck_assert_uint_gt(images, 30);
    /* After the linking: lookups are O(log n) again. */
    c = plx_crash_cursor_new(fb);
    plx_crash_cursor_seek(c, plx_fault_log_position(fb));
    plx_backend *img = plx_crash_cursor_image(c, PLX_CRASH_DROP_UNFLUSHED, 0);
    assert_lookups(img, 1 + MAX_LOG_READS, 1);
    assert_label_lookups(img, MAX_REGISTRY_READS + MAX_INDEX_READS + MAX_LOG_READS, 1);
    img->ops->destroy(img);
    plx_crash_cursor_free(c);
    fb->ops->destroy(fb);
    mem->ops->destroy(mem);
}
END_TEST

/* A skip link naming the wrong block is reported by check and refused by lookups, never
 * followed to a wrong root. */
START_TEST(test_bad_skip_link)
{
    plx_backend *mem = many_snapshots();
    uint64_t head = 0;
    for (uint64_t b = 0; b < mem->nblocks && !head; b++) {
        const struct plx_vdi_record *r = plx_backend_mem_peek(mem, b);
        if (r && r->hdr.magic == PLX_MAGIC_VDI && strcmp(r->name, "v") == 0)
            head = r->snaplog_head;
    }
    uint8_t blk[PLX_BLOCK_SIZE];
    memcpy(blk, plx_backend_mem_peek(mem, head), sizeof blk);
    struct plx_snaplog_block *lb = (struct plx_snaplog_block *)blk;
    ck_assert_uint_ne(lb->skip, 0);
    lb->skip = lb->prev; /* block 98, while skip_first claims block 0 */
    lb->skip_first = 1;
    plx_blkhdr_seal(blk, PLX_MAGIC_SNAPLOG, head);
    plx_backend_mem_poke(mem, head, blk);
    plx_store *st = open_store(mem, 1);
    struct plx_check_report r;
    ck_assert_int_eq(plx_check(st, &r, NULL, NULL), 0);
    ck_assert_uint_gt(r.errors, 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@1", &si), -EUCLEAN);
    plx_store_close(st);
    mem->ops->destroy(mem);
}
END_TEST

/* A writer's label checks read the label index path and the log's tail, not the log, so a label
 * costs the same on a VDI of 6,300 snapshots as on a new one; relabelling a snapshot the index
 * covers writes a new index path instead of making the index cover less, so the fold at close
 * reads no log either. (Before: the first label checked after open read all 100 log blocks,
 * and a relabel of snapshot 2 made the close read them again.) */
#define MAX_WRITER_LABEL_READS (MAX_INDEX_READS + 2 * MAX_LOG_READS + 4)
START_TEST(test_writer_label_reads_log_n)
{
    plx_backend *mem = many_snapshots();
    plx_store *st = open_store(mem, 0);
    plx_vdi *v;
    uint64_t idx = 0;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "fresh", &idx), 0);
    unsigned long fresh = tu_reads - before;
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "s3", &idx), -EEXIST); /* snapshot 3, indexed */
    unsigned long taken = tu_reads - before;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "fresh", &idx), -EEXIST); /* in the tail */
    ck_assert_int_eq(plx_vdi_close(v), 0);

    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_snap_label(v, 2, "relabelled"), 0);
    unsigned long relabel = tu_reads - before;
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_snap_label(v, 8, "middle"), -EEXIST);
    ck_assert_int_eq(plx_vdi_snap_label(v, 8, "relabelled"), -EEXIST);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "relabelled", &idx), -EEXIST);
    unsigned long refused = tu_reads - before;
    /* The label of snapshot 3 is free once it is relabelled or deleted. */
    ck_assert_int_eq(plx_vdi_snap_label(v, 3, ""), 0);
    ck_assert_int_eq(plx_vdi_snap_label(v, 13, "s3"), 0);
    ck_assert_int_eq(plx_vdi_snap_delete(v, 13), 0);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "s3", &idx), 0);
    ck_assert_uint_eq(idx, NSNAPS + 2);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_close(v), 0);
    unsigned long closing = tu_reads - before;
    fprintf(stderr,
            "scale: writer labels over %u snapshots: new %lu, taken %lu, relabel %lu, three "
            "refusals %lu, close %lu reads\n",
            NSNAPS, fresh, taken, relabel, refused, closing);
    ck_assert_msg(fresh <= MAX_WRITER_LABEL_READS, "a new label read %lu blocks", fresh);
    ck_assert_msg(taken <= MAX_WRITER_LABEL_READS, "a taken label read %lu blocks", taken);
    ck_assert_msg(relabel <= 2 * MAX_WRITER_LABEL_READS, "a relabel read %lu blocks", relabel);
    ck_assert_msg(refused <= 3 * MAX_WRITER_LABEL_READS, "refusals read %lu blocks", refused);
    ck_assert_msg(closing <= 8, "the close read %lu blocks", closing);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@relabelled", &si), 0);
    ck_assert_uint_eq(si.index, 2);
    ck_assert_int_eq(plx_snap_lookup(st, "v@s3", &si), 0);
    ck_assert_uint_eq(si.index, NSNAPS + 2);
    ck_assert_int_eq(plx_snap_lookup(st, "v@fresh", &si), 0);
    ck_assert_uint_eq(si.index, NSNAPS + 1);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, NSNAPS + 2 - 1);
    mem->ops->destroy(mem);
}
END_TEST

/* Snapshots submitted from completion callbacks (as a server does) still get their labels
 * folded into the index as they go: the tail stays a few blocks long while the VDI is open.
 * (Before: no fold ran inside a completion, and the tail grew until close.) */
struct chain {
    plx_vdi *v;
    unsigned next, total, done, failed;
    uint64_t idx;
};

static void chain_next(void *arg, int status)
{
    struct chain *c = arg;
    c->done++;
    c->failed += status != 0;
    if (c->next == c->total)
        return;
    char label[32] = "";
    if (c->next % 2)
        snprintf(label, sizeof label, "c%u", c->next);
    c->next++;
    if (plx_vdi_submit_snapshot(c->v, label, &c->idx, chain_next, c) != 0)
        c->failed++, c->done++;
}

START_TEST(test_label_tail_bounded_in_completions)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(MEDIUM_BLOCKS);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof err), 0);
    plx_store *st = open_store(mem, 0);
    ck_assert_int_eq(plx_vdi_create(st, "v", 64 * MiB, NULL), 0);
    struct chain c = {.total = 1500};
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &c.v), 0);
    c.next = 1;
    ck_assert_int_eq(plx_vdi_submit_snapshot(c.v, "c0", &c.idx, chain_next, &c), 0);
    while (c.done < c.total)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_uint_eq(c.failed, 0);
    struct plx_snap_info si;
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_snap_lookup(st, "v@nosuch", &si), -ENOENT);
    unsigned long miss = tu_reads - before;
    fprintf(stderr, "scale: missing label after 1,500 snapshots from completions: %lu reads\n",
            miss);
    /* registry + index path + a tail of at most 4 blocks (not the 24 of the session) */
    ck_assert_msg(miss <= MAX_REGISTRY_READS + MAX_INDEX_READS + 4,
                  "a missing label read %lu blocks", miss);
    ck_assert_int_eq(plx_snap_lookup(st, "v@c1499", &si), 0);
    ck_assert_uint_eq(si.index, 1500);
    ck_assert_int_eq(plx_snap_lookup(st, "v@c1", &si), 0);
    ck_assert_uint_eq(si.index, 2);
    /* Taken labels are still refused, wherever they are. */
    uint64_t idx;
    ck_assert_int_eq(plx_vdi_snapshot_open(c.v, "c0", &idx), -EEXIST);
    ck_assert_int_eq(plx_vdi_snapshot_open(c.v, "c1499", &idx), -EEXIST);
    ck_assert_int_eq(plx_vdi_close(c.v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, 1500);
    mem->ops->destroy(mem);
}
END_TEST

/* vdi-list's snapshot count comes from the VDI record (snap_count - snap_deleted), not from a
 * read of the log: O(1) reads per VDI (against the 100 of the log read it replaces, measured
 * here as the baseline), correct after deletions by the writer and by the admin path, and for
 * a record from before the count (read from the log until a writable open counts it). */
/* The state block, the registry path to the record and the record. */
#define MAX_COUNT_READS (MAX_REGISTRY_READS + 1)
START_TEST(test_live_count_reads_o1)
{
    plx_backend *mem = many_snapshots();
    plx_store *st = open_store(mem, 0);
    uint64_t live = 0;
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_vdi_live_snapshots(st, "v", &live), 0);
    unsigned long counted = tu_reads - before;
    ck_assert_uint_eq(live, NSNAPS);
    struct plx_vdi_info vi;
    ck_assert_int_eq(plx_vdi_lookup(st, "v", &vi), 0);
    struct plx_snap_info *list;
    size_t n;
    before = tu_reads;
    ck_assert_int_eq(plx_snap_list(st, vi.id, &list, &n), 0);
    unsigned long whole_log = tu_reads - before;
    free(list);
    fprintf(stderr, "scale: live snapshot count over %u snapshots: %lu reads (the log: %lu)\n",
            NSNAPS, counted, whole_log);
    ck_assert_msg(counted <= MAX_COUNT_READS, "the count read %lu blocks", counted);
    ck_assert_uint_ge(whole_log, 100);

    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_snap_delete(v, 5), 0);
    ck_assert_int_eq(plx_vdi_snap_delete(v, NSNAPS), 0);
    ck_assert_int_eq(plx_vdi_snap_delete(v, 5), -ENOENT);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_live_snapshots(st, "v", &live), 0);
    ck_assert_uint_le(tu_reads - before, MAX_COUNT_READS + MAX_LOG_READS);
    ck_assert_uint_eq(live, NSNAPS - 2);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_snap_delete(st, "v@7"), 0);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_live_snapshots(st, "v", &live), 0);
    ck_assert_uint_le(tu_reads - before, MAX_COUNT_READS);
    ck_assert_uint_eq(live, NSNAPS - 3);

    /* A record from before the count: its log is read, until a writable open counts it. */
    struct plx_vdi_record rec;
    uint64_t addr;
    ck_assert_int_eq(plx_registry_find(st, "v", &rec, &addr), 0);
    rec.flags &= ~PLX_VDI_SNAPS_COUNTED;
    rec.snap_deleted = 0;
    ck_assert_int_eq(plx_registry_write(st, addr, &rec), 0);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_live_snapshots(st, "v", &live), 0);
    ck_assert_uint_ge(tu_reads - before, 100);
    ck_assert_uint_eq(live, NSNAPS - 3);
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    before = tu_reads;
    ck_assert_int_eq(plx_vdi_live_snapshots(st, "v", &live), 0);
    ck_assert_uint_le(tu_reads - before, MAX_COUNT_READS);
    ck_assert_uint_eq(live, NSNAPS - 3);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, NSNAPS - 3);

    /* check notices a count that disagrees with the log. */
    st = open_store(mem, 0);
    ck_assert_int_eq(plx_registry_find(st, "v", &rec, &addr), 0);
    rec.snap_deleted = 1;
    ck_assert_int_eq(plx_registry_write(st, addr, &rec), 0);
    struct plx_check_report r;
    unsigned shown = 0;
    ck_assert_int_eq(plx_check(st, &r, print_problem, &shown), 0);
    ck_assert_uint_eq(r.errors, 1);
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* A writer taking snapshots one at a time folds the log's tail into the label index as it goes:
 * a missing label costs the index path and a tail of a few blocks, not the log of the session. */
START_TEST(test_label_tail_bounded)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(MEDIUM_BLOCKS);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof err), 0);
    plx_store *st = open_store(mem, 0);
    ck_assert_int_eq(plx_vdi_create(st, "v", 64 * MiB, NULL), 0);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    unsigned long worst = 0;
    for (unsigned i = 1; i <= 2000; i++) {
        char label[32];
        snprintf(label, sizeof label, "t%u", i);
        uint64_t idx;
        ck_assert_int_eq(plx_vdi_snapshot_open(v, i % 3 ? label : "", &idx), 0);
        ck_assert_uint_eq(idx, i);
        if (i % 100)
            continue;
        struct plx_snap_info si;
        unsigned long before = tu_reads;
        ck_assert_int_eq(plx_snap_lookup(st, "v@nosuch", &si), -ENOENT);
        if (tu_reads - before > worst)
            worst = tu_reads - before;
        ck_assert_int_eq(plx_snap_lookup(st, "v@t100", &si), 0);
        ck_assert_uint_eq(si.index, 100);
        /* Taken labels are refused whether they sit in the index or in the tail. */
        ck_assert_int_eq(plx_vdi_snapshot_open(v, "t100", &idx), -EEXIST);
        snprintf(label, sizeof label, "t%u", (i - 1) % 3 ? i - 1 : i - 2);
        ck_assert_int_eq(plx_vdi_snapshot_open(v, label, &idx), -EEXIST);
    }
    fprintf(stderr, "scale: missing label during 2,000 snapshots: at most %lu reads\n", worst);
    /* registry + index path + a tail of at most 2 * 63 + 62 records (4 blocks) */
    ck_assert_msg(worst <= MAX_REGISTRY_READS + MAX_INDEX_READS + 4,
                  "a missing label read %lu blocks", worst);
    /* Snapshots that always overlap (16 in flight): the writer waits for them to fold once the
     * tail reaches 8 * 126, so 3,000 more leave a tail of at most about 17 blocks, not 48. */
    struct counter c = {0, 0};
    static uint64_t sidx[3000];
    for (unsigned i = 0; i < 3000; i++) {
        char label[32];
        snprintf(label, sizeof label, "q%u", i);
        ck_assert_int_eq(plx_vdi_submit_snapshot(v, i % 3 ? label : "", &sidx[i], snap_done, &c),
                         0);
        while (c.done + 16 <= i + 1)
            ck_assert_int_ge(plx_store_service(st), 0);
    }
    while (c.done < 3000)
        ck_assert_int_ge(plx_store_service(st), 0);
    ck_assert_uint_eq(c.failed, 0);
    struct plx_snap_info si;
    unsigned long before = tu_reads;
    ck_assert_int_eq(plx_snap_lookup(st, "v@nosuch", &si), -ENOENT);
    unsigned long miss = tu_reads - before;
    fprintf(stderr, "scale: missing label after 3,000 overlapping snapshots: %lu reads\n", miss);
    ck_assert_msg(miss <= MAX_REGISTRY_READS + MAX_INDEX_READS + 18,
                  "a missing label read %lu blocks", miss);
    ck_assert_int_eq(plx_snap_lookup(st, "v@q2998", &si), 0);
    ck_assert_uint_eq(si.index, sidx[2998]);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, 5000);
    mem->ops->destroy(mem);
}
END_TEST

/* Relabelling indexed snapshots through the admin path writes new index paths (copy on write);
 * gc keeps the index the record names and frees the old paths; check and every lookup agree. */
START_TEST(test_label_index_gc)
{
    plx_backend *mem = many_snapshots();
    plx_store *st = open_store(mem, 0);
    uint64_t before = find_record(mem, NULL)->label_index;
    ck_assert_uint_ne(before, 0);
    ck_assert_int_eq(plx_snap_label(st, "v@middle", "moved"), 0);
    ck_assert_int_eq(plx_snap_label(st, "v@2", "two"), 0);
    ck_assert_int_eq(plx_snap_label(st, "v@8", "s3"), -EEXIST); /* snapshot 3 has it */
    ck_assert_int_eq(plx_snap_label(st, "v@3", "s3"), 0);        /* its own label again */
    ck_assert_int_eq(plx_snap_label(st, "v@first", ""), 0);
    ck_assert_uint_ne(find_record(mem, NULL)->label_index, before);
    struct plx_gc_report g;
    ck_assert_int_eq(plx_gc(st, 0, &g), 0);
    ck_assert_uint_gt(g.freed_by_type[PLX_EXTENT_METADATA], 0);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@moved", &si), 0);
    ck_assert_uint_eq(si.index, 4000);
    ck_assert_int_eq(plx_snap_lookup(st, "v@two", &si), 0);
    ck_assert_uint_eq(si.index, 2);
    ck_assert_int_eq(plx_snap_lookup(st, "v@middle", &si), -ENOENT);
    ck_assert_int_eq(plx_snap_lookup(st, "v@first", &si), -ENOENT);
    ck_assert_int_eq(plx_store_close(st), 0);
    assert_check_clean(mem, NSNAPS);
    assert_label_lookups(mem, MAX_REGISTRY_READS + MAX_INDEX_READS + MAX_LOG_READS, 1);
    mem->ops->destroy(mem);
}
END_TEST

/* Rewrite block `addr` of a memory medium through fn, keeping its header valid. */
static void poke_lidx(plx_backend *mem, uint64_t addr, void (*fn)(struct plx_lidx_block *))
{
    uint8_t blk[PLX_BLOCK_SIZE];
    memcpy(blk, plx_backend_mem_peek(mem, addr), sizeof blk);
    fn((struct plx_lidx_block *)blk);
    plx_blkhdr_seal(blk, PLX_MAGIC_LABELIDX, addr);
    plx_backend_mem_poke(mem, addr, blk);
}

static uint64_t leaf_of(plx_backend *mem, const char *label)
{
    const struct plx_vdi_record *rec = find_record(mem, NULL);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = label; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t a = rec->label_index;
    for (unsigned level = 0;; level++) {
        const struct plx_lidx_block *b = plx_backend_mem_peek(mem, a);
        ck_assert_uint_eq(b->hdr.magic, PLX_MAGIC_LABELIDX);
        if (b->kind == PLX_LIDX_LEAF)
            return a;
        a = b->u.child[(h >> (8 * level)) & 0xff];
        ck_assert_uint_ne(a, 0);
    }
}

static void drop_middle(struct plx_lidx_block *b)
{
    for (uint32_t i = 0; i < b->count; i++)
        if (strcmp(b->u.entry[i].label, "middle") == 0) {
            b->u.entry[i] = b->u.entry[--b->count];
            memset(&b->u.entry[b->count], 0, sizeof b->u.entry[0]);
            return;
        }
    ck_abort_msg("no entry for 'middle'");
}

static void wrong_vdi(struct plx_lidx_block *b)
{
    b->vdi_id += 1000;
}

/* An index that lacks a live label is reported by check (a lookup would miss it); a corrupt
 * node is reported by check, refused by lookups and stops gc before it frees anything. */
START_TEST(test_label_index_damage)
{
    plx_backend *mem = many_snapshots();
    poke_lidx(mem, leaf_of(mem, "middle"), drop_middle);
    plx_store *st = open_store(mem, 1);
    struct plx_check_report r;
    ck_assert_int_eq(plx_check(st, &r, NULL, NULL), 0);
    ck_assert_uint_eq(r.errors, 1);
    plx_store_close(st);

    plx_backend *mem2 = many_snapshots();
    poke_lidx(mem2, leaf_of(mem2, "s3"), wrong_vdi);
    st = open_store(mem2, 0);
    ck_assert_int_eq(plx_check(st, &r, NULL, NULL), 0);
    ck_assert_uint_ge(r.errors, 1);
    struct plx_snap_info si;
    ck_assert_int_eq(plx_snap_lookup(st, "v@s3", &si), -EUCLEAN);
    struct plx_gc_report g;
    ck_assert_int_eq(plx_gc(st, 0, &g), -EUCLEAN);
    ck_assert_uint_eq(g.freed_by_type[PLX_EXTENT_METADATA] + g.freed_by_type[PLX_EXTENT_DATA], 0);
    /* A writer can still take snapshots; a labelled one is refused with the damage named,
     * since its label check reads the index too. */
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "v", 0, &v), 0);
    uint64_t idx;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "", &idx), 0);
    ck_assert_uint_eq(idx, NSNAPS + 1);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "s3", &idx), -EUCLEAN);
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "", &idx), 0);
    ck_assert_uint_eq(idx, NSNAPS + 2);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    plx_store_close(st);
    mem->ops->destroy(mem);
    mem2->ops->destroy(mem2);
}
END_TEST

/* The largest VDI, 256 TiB (a 4-level tree), on a 64 MiB store (st, writable; closed here):
 * written and read at both ends and in the middle, snapshotted, cloned, collected. */
static void big_vdi(plx_store *st)
{
    ck_assert_int_eq(plx_vdi_create(st, "big", PLX_MAX_VDI_SIZE + 4096, NULL), -EFBIG);
    ck_assert_int_eq(plx_vdi_create(st, "big", PLX_MAX_VDI_SIZE, NULL), 0);
    struct plx_vdi_info info;
    ck_assert_int_eq(plx_vdi_lookup(st, "big", &info), 0);
    ck_assert_uint_eq(info.height, 4);
    const uint64_t offs[] = {0, 4096, PLX_MAX_VDI_SIZE / 2 - 4096, PLX_MAX_VDI_SIZE / 2,
                             (PLX_MAX_VDI_SIZE / 3) & ~4095ull, PLX_MAX_VDI_SIZE - 4096};
    const unsigned n = sizeof offs / sizeof offs[0];
    char buf[4096], got[4096];
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "big", 0, &v), 0);
    ck_assert_uint_eq(plx_vdi_size(v), PLX_MAX_VDI_SIZE);
    for (unsigned i = 0; i < n; i++) {
        memset(buf, 'a' + (int)i, sizeof buf);
        ck_assert_int_eq(plx_vdi_pwrite(v, buf, offs[i], sizeof buf, 0), 0);
    }
    /* A write across the end is refused and changes nothing. */
    ck_assert_int_ne(plx_vdi_pwrite(v, buf, PLX_MAX_VDI_SIZE - 2048, sizeof buf, 0), 0);
    uint64_t idx;
    ck_assert_int_eq(plx_vdi_snapshot_open(v, "one", &idx), 0);
    for (unsigned i = 0; i < n; i++) {
        memset(buf, 'A' + (int)i, sizeof buf);
        ck_assert_int_eq(plx_vdi_pwrite(v, buf, offs[i], sizeof buf, 0), 0);
    }
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_vdi_clone(st, "kid", "big@one", NULL), 0);
    ck_assert_int_eq(plx_vdi_open(st, "kid", 0, &v), 0);
    memset(buf, 'z', sizeof buf);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, PLX_MAX_VDI_SIZE - 4096, sizeof buf, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    /* Each view reads what it should at every offset; untouched blocks between read as zeros. */
    const char *views[] = {"big", "big@one", "kid"};
    for (unsigned w = 0; w < 3; w++) {
        ck_assert_int_eq(plx_vdi_open(st, views[w], PLX_OPEN_READONLY, &v), 0);
        for (unsigned i = 0; i < n; i++) {
            ck_assert_int_eq(plx_vdi_pread(v, got, offs[i], sizeof got), 0);
            int want = w == 0 ? 'A' + (int)i : 'a' + (int)i;
            if (w == 2 && i == n - 1)
                want = 'z';
            memset(buf, want, sizeof buf);
            ck_assert_msg(memcmp(got, buf, sizeof got) == 0, "%s at %llu", views[w],
                          (unsigned long long)offs[i]);
        }
        ck_assert_int_eq(plx_vdi_pread(v, got, PLX_MAX_VDI_SIZE / 4, sizeof got), 0);
        memset(buf, 0, sizeof buf);
        ck_assert_int_eq(memcmp(got, buf, sizeof got), 0);
        ck_assert_int_eq(plx_vdi_close(v), 0);
    }
    /* Collect after deleting the clone: it frees the clone's blocks, keeps the rest. */
    ck_assert_int_eq(plx_vdi_delete(st, "kid"), 0);
    struct plx_gc_report r;
    ck_assert_int_eq(plx_gc(st, 0, &r), 0);
    ck_assert_uint_gt(r.freed_by_type[PLX_EXTENT_METADATA] + r.freed_by_type[PLX_EXTENT_DATA], 0);
    ck_assert_int_eq(plx_vdi_open(st, "big@one", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, got, PLX_MAX_VDI_SIZE - 4096, sizeof got), 0);
    memset(buf, 'a' + (int)(n - 1), sizeof buf);
    ck_assert_int_eq(memcmp(got, buf, sizeof got), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_store_close(st), 0);
}

static void assert_big_clean(plx_store *ro)
{
    struct plx_check_report cr;
    ck_assert_int_eq(plx_check(ro, &cr, NULL, NULL), 0);
    ck_assert_uint_eq(cr.errors, 0);
    ck_assert_uint_eq(cr.snapshots, 1);
    plx_store_close(ro);
}

START_TEST(test_vdi_256tib)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(MEDIUM_BLOCKS);
    ck_assert_int_eq(plx_format_backend(mem, MiB, err, sizeof err), 0);
    big_vdi(open_store(mem, 0));
    assert_big_clean(open_store(mem, 1));
    mem->ops->destroy(mem);
}
END_TEST

/* The same on a sparse file through the file backend (libaio, O_DIRECT where the filesystem
 * has it): what a real store does, in seconds, with a few MiB of the 64 MiB file allocated. */
START_TEST(test_vdi_256tib_file)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/plx-256tib-XXXXXX", tu_tmpdir());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_msg(plx_format(path, MEDIUM_BLOCKS * PLX_BLOCK_SIZE, MiB, 1, err, sizeof err) == 0,
                  "format %s: %s", path, err);
    struct plx_open_opts o = {.struct_size = sizeof o};
    plx_store *st = NULL;
    ck_assert_msg(plx_store_open(path, &o, &st, err, sizeof err) == 0, "open: %s", err);
    big_vdi(st);
    o.read_only = 1;
    ck_assert_msg(plx_store_open(path, &o, &st, err, sizeof err) == 0, "open: %s", err);
    assert_big_clean(st);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    fprintf(stderr, "scale: 256 TiB VDI on a sparse file: %lld KiB of %lld allocated\n",
            (long long)sb.st_blocks / 2, (long long)sb.st_size / 1024);
    ck_assert_int_lt((long long)sb.st_blocks * 512, (long long)sb.st_size / 4);
    unlink(path);
}
END_TEST

static Suite *scale_suite(void)
{
    Suite *s = suite_create("scale");
    TCase *tc = tcase_create("snapshot-log");
    tcase_set_timeout(tc, 300);
    tu_no_reclaim_poll(tc); /* its tests count the reads reaching the medium */
    tcase_add_test(tc, test_lookup_reads_log_n);
    tcase_add_test(tc, test_writable_open_reads_log_n);
    tcase_add_test(tc, test_old_log_is_linked);
    tcase_add_test(tc, test_bad_skip_link);
    tcase_add_test(tc, test_label_tail_bounded);
    tcase_add_test(tc, test_writer_label_reads_log_n);
    tcase_add_test(tc, test_label_tail_bounded_in_completions);
    tcase_add_test(tc, test_live_count_reads_o1);
    tcase_add_test(tc, test_label_index_damage);
    tcase_add_test(tc, test_label_index_gc);
    suite_add_tcase(s, tc);
    TCase *big = tcase_create("size");
    tcase_add_test(big, test_vdi_256tib);
    tcase_add_test(big, test_vdi_256tib_file);
    suite_add_tcase(s, big);
    return s;
}

TU_MAIN(scale_suite)
