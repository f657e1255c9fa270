/*
 * test_registry.c - the VDI registry past format version 1's cap, and the upgrade to version 2.
 *
 * Version 1 held at most 65,536 VDIs (one slot per block in extent 0) and found a VDI by name by
 * reading every slot. Here 70,000 VDIs are created on a sparse memory medium, found by name and by
 * id, listed a page at a time, partly deleted and collected, and checked; reads are counted
 * through a counting wrapper, and the bounds below would be broken many times over by reading
 * the registry (70,000 blocks). The upgrade tests build a version-1 store (tu_make_v1) and
 * convert it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "format.h"
#include "parallax.h"
#include "registry.h"
#include "system.h"
#include "testutil.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define NMANY 70000u /* past version 1's 65,536 */
/* A lookup by name reads the state block, the name index (node(s) and a bucket), the VDI table
 * (2 levels here) and the record: 6 blocks, a few more with index entries that share a bucket
 * by hash prefix. */
#define MAX_LOOKUP_READS 10u

static plx_store *open_store(plx_backend *mem, int read_only)
{
    char err[256] = "";
    struct plx_open_opts o = {.struct_size = sizeof o, .read_only = read_only};
    plx_store *st = NULL;
    int rc = plx_store_open_backend(tu_keep_wrap(mem), &o, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

static plx_backend *new_medium(uint64_t bytes)
{
    char err[256] = "";
    plx_backend *mem = plx_backend_mem_create(bytes / PLX_BLOCK_SIZE);
    ck_assert_ptr_nonnull(mem);
    ck_assert_int_eq(plx_format_backend(mem, 8 * MiB, err, sizeof err), 0);
    return mem;
}

static void name_of(unsigned i, char *buf, size_t len)
{
    snprintf(buf, len, "vm-%06u", i);
}

static void assert_check_clean(plx_store *st, uint64_t trees)
{
    struct plx_check_report r;
    ck_assert_int_eq(plx_check(st, &r, NULL, NULL), 0);
    ck_assert_uint_eq(r.errors, 0);
    ck_assert_uint_eq(r.leaked_blocks, 0);
    ck_assert_uint_eq(r.trees, trees);
}

struct page {
    uint64_t ids[64];
    unsigned n, want;
    unsigned deleted;
};

static int page_add(void *arg, const struct plx_vdi_info *info)
{
    struct page *p = arg;
    if (info->deleted) {
        p->deleted++;
        return 0;
    }
    p->ids[p->n++] = info->id;
    return p->n == p->want ? 1 : 0;
}

static unsigned long reads_now(void)
{
    return tu_reads;
}

START_TEST(test_past_the_old_cap)
{
    plx_backend *mem = new_medium(2 * GiB);
    plx_store *st = open_store(mem, 0);
    char name[32];
    uint64_t id = 0;
    for (unsigned i = 0; i < NMANY; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_create(st, name, 4 * MiB, &id), 0);
        ck_assert_uint_eq(id, i + 1);
    }
    /* What one more create costs at this size. */
    unsigned long r0 = tu_reads, w0 = tu_writes, f0 = tu_flushes;
    ck_assert_int_eq(plx_vdi_create(st, "one-more", 4 * MiB, NULL), 0);
    printf("registry: a create at %u VDIs: %lu reads, %lu writes, %lu flushes\n", NMANY,
           tu_reads - r0, tu_writes - w0, tu_flushes - f0);
    ck_assert_uint_le(tu_reads - r0, 20);
    ck_assert_int_eq(plx_vdi_delete(st, "one-more"), 0);

    /* Names stay unique past the cap. */
    name_of(NMANY - 1, name, sizeof name);
    ck_assert_int_eq(plx_vdi_create(st, name, 4 * MiB, NULL), -EEXIST);
    name_of(12, name, sizeof name);
    ck_assert_int_eq(plx_vdi_create(st, name, 4 * MiB, NULL), -EEXIST);

    /* Found by name and by id in a few reads, wherever they are. */
    const unsigned probe[] = {0, 1, 508, 30000, 65535, 65536, 65537, NMANY - 1};
    unsigned long most_name = 0, most_id = 0;
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        struct plx_vdi_info vi;
        name_of(probe[k], name, sizeof name);
        r0 = reads_now();
        ck_assert_int_eq(plx_vdi_lookup(st, name, &vi), 0);
        unsigned long used = reads_now() - r0;
        ck_assert_msg(used <= MAX_LOOKUP_READS, "lookup of %s read %lu blocks", name, used);
        most_name = used > most_name ? used : most_name;
        ck_assert_uint_eq(vi.id, probe[k] + 1);
        ck_assert_str_eq(vi.name, name);
        char idstr[24];
        snprintf(idstr, sizeof idstr, "%u", probe[k] + 1);
        r0 = reads_now();
        ck_assert_int_eq(plx_vdi_lookup(st, idstr, &vi), 0);
        ck_assert_str_eq(vi.name, name);
        most_id = reads_now() - r0 > most_id ? reads_now() - r0 : most_id;
    }
    printf("registry: lookup at %u VDIs: at most %lu reads by name, %lu by id\n", NMANY, most_name,
           most_id);
    ck_assert_int_eq(plx_vdi_lookup(st, "vm-999999", &(struct plx_vdi_info){0}), -ENOENT);

    /* One past the old cap holds data. */
    plx_vdi *v;
    name_of(NMANY - 1, name, sizeof name);
    ck_assert_int_eq(plx_vdi_open(st, name, 0, &v), 0);
    char buf[PLX_BLOCK_SIZE], back[PLX_BLOCK_SIZE];
    tu_fill(buf, sizeof buf, 70000);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, 3 * MiB, sizeof buf, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);

    /* A page of the listing costs its size: the records it shows and the table above them. */
    struct page p = {.want = 10};
    r0 = reads_now();
    ck_assert_int_eq(plx_vdi_list_each(st, 65530, page_add, &p), 1);
    unsigned long used = reads_now() - r0;
    ck_assert_uint_eq(p.n, 10);
    for (unsigned i = 0; i < 10; i++)
        ck_assert_uint_eq(p.ids[i], 65531 + i);
    ck_assert_msg(used <= 10 + 4, "a page of 10 read %lu blocks", used);
    printf("registry: a page of 10 after id 65530: %lu reads\n", used);

    /* Delete a stretch across the old cap; names become free, ids are not reused. */
    for (unsigned i = 65000; i < 66000; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_delete(st, name), 0);
    }
    name_of(65536, name, sizeof name);
    ck_assert_int_eq(plx_vdi_lookup(st, name, &(struct plx_vdi_info){0}), -ENOENT);
    ck_assert_int_eq(plx_vdi_create(st, name, 4 * MiB, &id), 0);
    ck_assert_uint_eq(id, NMANY + 2); /* after "one-more" */
    p = (struct page){.want = 3};
    ck_assert_int_eq(plx_vdi_list_each(st, 65000, page_add, &p), 1);
    ck_assert_uint_eq(p.deleted, 1000);
    ck_assert_uint_eq(p.ids[0], 66001);

    /* gc takes the deleted VDIs' records; check finds every live VDI by name in the index. */
    struct plx_gc_report gr;
    ck_assert_int_eq(plx_gc(st, 0, &gr), 0);
    ck_assert_uint_eq(gr.vdis_purged, 1001);
    ck_assert_uint_ge(gr.freed_by_type[PLX_EXTENT_METADATA], 2000); /* roots and records */
    assert_check_clean(st, NMANY - 1000 + 1);
    p = (struct page){.want = 3};
    ck_assert_int_eq(plx_vdi_list_each(st, 65000, page_add, &p), 1);
    ck_assert_uint_eq(p.deleted, 0); /* purged: not in the table any more */
    ck_assert_uint_eq(p.ids[0], 66001);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Reopened: all there, the data too. */
    st = open_store(mem, 1);
    name_of(NMANY - 1, name, sizeof name);
    ck_assert_int_eq(plx_vdi_open(st, name, PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, back, 3 * MiB, sizeof back), 0);
    ck_assert_int_eq(memcmp(buf, back, sizeof buf), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    struct plx_store_info in;
    ck_assert_int_eq(plx_store_info(st, &in), 0);
    ck_assert_uint_eq(in.vdi_count, NMANY - 1000 + 1);
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* Blocks of the registry: VDI table blocks and name index blocks (nodes and buckets). */
static int count_block(void *arg, uint64_t addr)
{
    (*(unsigned *)arg)++;
    return 0;
}

static int count_entry(void *arg, uint64_t id, uint64_t rec_addr)
{
    return 0;
}

static int count_index_block(void *arg, uint64_t addr, const void *blk)
{
    (*(unsigned *)arg)++;
    return 0;
}

static void registry_blocks(plx_store *st, unsigned *table, unsigned *index)
{
    *table = *index = 0;
    ck_assert_int_eq(plx_state_read(st), 0);
    ck_assert_int_eq(plx_vditab_walk(st, 0, count_block, count_entry, table), 0);
    ck_assert_int_eq(plx_nameidx_walk(st, count_index_block, index), 0);
}

/* The registry shrinks with the VDIs: deleting (and collecting) most of them merges the name
 * index's thin buckets and drops the VDI table blocks left empty, so the space it keeps follows
 * the VDIs there are, not those there were. (Before: buckets never merged and table blocks
 * stayed until the store was empty: 4 table and 9 index blocks for 10 VDIs here.) */
START_TEST(test_registry_shrinks)
{
    plx_backend *mem = new_medium(512 * MiB);
    plx_store *st = open_store(mem, 0);
    char name[32];
    const unsigned n = 1500, keep = 10;
    for (unsigned i = 0; i < n; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_create(st, name, 1 * MiB, NULL), 0);
    }
    unsigned table_full, index_full, table, index;
    registry_blocks(st, &table_full, &index_full);
    for (unsigned i = 0; i < n - keep; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_delete(st, name), 0);
    }
    struct plx_gc_report gr;
    ck_assert_int_eq(plx_gc(st, 0, &gr), 0);
    ck_assert_uint_eq(gr.vdis_purged, n - keep);
    registry_blocks(st, &table, &index);
    printf("registry: %u VDIs: %u table and %u index blocks; %u left: %u and %u\n", n, table_full,
           index_full, keep, table, index);
    ck_assert_uint_ge(index_full, 8);
    ck_assert_uint_eq(table_full, 4); /* a root and 3 leaves of 508 ids */
    ck_assert_uint_le(index, 3);      /* the root node and a bucket or two */
    ck_assert_uint_eq(table, 2);      /* the root and the leaf of the ids kept */
    assert_check_clean(st, keep);
    /* The rest is found, named and listed as before; new VDIs go where the dropped blocks were
     * not, and old names come back. */
    for (unsigned i = n - keep; i < n; i++) {
        struct plx_vdi_info vi;
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_lookup(st, name, &vi), 0);
        ck_assert_uint_eq(vi.id, i + 1);
    }
    name_of(3, name, sizeof name);
    ck_assert_int_eq(plx_vdi_lookup(st, name, &(struct plx_vdi_info){0}), -ENOENT);
    uint64_t id;
    ck_assert_int_eq(plx_vdi_create(st, name, 1 * MiB, &id), 0);
    ck_assert_uint_eq(id, n + 1);
    struct page p = {.want = 20};
    ck_assert_int_eq(plx_vdi_list_each(st, 0, page_add, &p), 0);
    ck_assert_uint_eq(p.n, keep + 1);
    ck_assert_uint_eq(p.ids[0], n - keep + 1);
    ck_assert_int_eq(plx_gc(st, 0, &gr), 0);
    assert_check_clean(st, keep + 1);
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

/* ---- Upgrade from format version 1 ------------------------------------------------------------
 */

/* A version-2 store with VDIs of every kind: data, snapshots (one labelled), a clone, a deleted
 * VDI; turned into version 1. */
static plx_backend *v1_store(unsigned extra)
{
    plx_backend *mem = new_medium(256 * MiB);
    plx_store *st = open_store(mem, 0);
    ck_assert_int_eq(plx_vdi_create(st, "web", 16 * MiB, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "gone", 16 * MiB, NULL), 0);
    ck_assert_int_eq(plx_vdi_create(st, "db", 16 * MiB, NULL), 0);
    plx_vdi *v;
    char buf[PLX_BLOCK_SIZE];
    ck_assert_int_eq(plx_vdi_open(st, "web", 0, &v), 0);
    tu_fill(buf, sizeof buf, 1);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, 0, sizeof buf, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_vdi_snapshot(st, "web", "base", NULL), 0);
    ck_assert_int_eq(plx_vdi_open(st, "web", 0, &v), 0);
    tu_fill(buf, sizeof buf, 2);
    ck_assert_int_eq(plx_vdi_pwrite(v, buf, 0, sizeof buf, 0), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_vdi_clone(st, "web-clone", "web@base", NULL), 0);
    ck_assert_int_eq(plx_vdi_delete(st, "gone"), 0);
    char name[32];
    for (unsigned i = 0; i < extra; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_create(st, name, 4 * MiB, NULL), 0);
    }
    ck_assert_int_eq(plx_store_close(st), 0);
    tu_make_v1(mem);
    return mem;
}

static void assert_v1_contents(plx_store *st, unsigned extra)
{
    struct plx_vdi_info vi;
    char buf[PLX_BLOCK_SIZE], back[PLX_BLOCK_SIZE];
    ck_assert_int_eq(plx_vdi_lookup(st, "web", &vi), 0);
    ck_assert_uint_eq(vi.id, 1);
    ck_assert_uint_eq(vi.snap_count, 1);
    ck_assert_int_eq(plx_vdi_lookup(st, "db", &vi), 0);
    ck_assert_uint_eq(vi.id, 3);
    ck_assert_int_eq(plx_vdi_lookup(st, "gone", &vi), -ENOENT);
    ck_assert_int_eq(plx_vdi_lookup(st, "web-clone", &vi), 0);
    ck_assert_uint_eq(vi.parent_id, 1);
    plx_vdi *v;
    ck_assert_int_eq(plx_vdi_open(st, "web-clone", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, back, 0, sizeof back), 0);
    tu_fill(buf, sizeof buf, 1);
    ck_assert_int_eq(memcmp(buf, back, sizeof buf), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    ck_assert_int_eq(plx_vdi_open(st, "web", PLX_OPEN_READONLY, &v), 0);
    ck_assert_int_eq(plx_vdi_pread(v, back, 0, sizeof back), 0);
    tu_fill(buf, sizeof buf, 2);
    ck_assert_int_eq(memcmp(buf, back, sizeof buf), 0);
    ck_assert_int_eq(plx_vdi_close(v), 0);
    char name[32];
    for (unsigned i = 0; i < extra; i++) {
        name_of(i, name, sizeof name);
        ck_assert_int_eq(plx_vdi_lookup(st, name, &vi), 0);
        ck_assert_uint_eq(vi.id, 5 + i);
    }
}

START_TEST(test_upgrade_v1)
{
    const unsigned extra = 600; /* past a bucket (254 names) and a table block (508 ids) */
    plx_backend *mem = v1_store(extra);

    /* This Parallax refuses version 1 and says what to do. */
    char err[512] = "";
    plx_store *st = NULL;
    ck_assert_int_eq(plx_store_open_backend(tu_keep_wrap(mem), NULL, &st, err, sizeof err),
                     -EPROTONOSUPPORT);
    ck_assert_msg(strstr(err, "format version 1") && strstr(err, "parallax upgrade"), "%s", err);

    /* A read-only upgrade is refused, the store untouched. */
    int upgraded = -1;
    struct plx_open_opts ro = {.struct_size = sizeof ro, .read_only = 1};
    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(mem), &ro, &upgraded, err, sizeof err),
                     -EROFS);
    ck_assert_int_eq(upgraded, 0);

    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(mem), NULL, &upgraded, err, sizeof err),
                     0);
    ck_assert_int_eq(upgraded, 1);
    st = open_store(mem, 0);
    struct plx_store_info in;
    ck_assert_int_eq(plx_store_info(st, &in), 0);
    ck_assert_uint_eq(in.format_version, 2);
    ck_assert_uint_eq(in.vdi_count, 3 + extra);
    assert_v1_contents(st, extra);

    /* Leaked by the old layout (tu_make_v1): only leaks, never errors; gc takes them. */
    struct plx_check_report r;
    ck_assert_int_eq(plx_check(st, &r, NULL, NULL), 0);
    ck_assert_uint_eq(r.errors, 0);
    struct plx_gc_report gr;
    ck_assert_int_eq(plx_gc(st, 0, &gr), 0);
    ck_assert_uint_eq(gr.vdis_purged, 1); /* "gone", in its legacy slot */
    assert_check_clean(st, 3 + extra + 1);

    /* New VDIs go on from the old ids; the old records stay in their slots. */
    uint64_t id = 0;
    ck_assert_int_eq(plx_vdi_create(st, "after", 4 * MiB, &id), 0);
    ck_assert_uint_eq(id, 5 + extra);
    ck_assert_int_eq(plx_vdi_create(st, "db", 4 * MiB, NULL), -EEXIST);
    ck_assert_int_eq(plx_vdi_delete(st, "db"), 0);
    ck_assert_int_eq(plx_gc(st, 0, &gr), 0);
    ck_assert_uint_eq(gr.vdis_purged, 1);
    ck_assert_int_eq(plx_vdi_create(st, "db", 4 * MiB, NULL), 0);
    assert_check_clean(st, 3 + extra + 1 + 1);
    ck_assert_int_eq(plx_store_close(st), 0);

    /* Once is enough. */
    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(mem), NULL, &upgraded, err, sizeof err),
                     0);
    ck_assert_int_eq(upgraded, 0);
    mem->ops->destroy(mem);
}
END_TEST

/* An upgrade while a live process holds a VDI of the store changes nothing. */
START_TEST(test_upgrade_refused_while_held)
{
    plx_backend *mem = v1_store(0);
    static uint8_t blk[PLX_BLOCK_SIZE] __attribute__((aligned(4096)));
    static uint8_t sb0[PLX_BLOCK_SIZE] __attribute__((aligned(4096)));
    static uint8_t state0[PLX_BLOCK_SIZE] __attribute__((aligned(4096)));
    struct plx_superblock sb;
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, 0, 1, sb0, 0), 0);
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, 1, 1, state0, 0), 0);
    memcpy(&sb, sb0, sizeof sb);
    uint64_t slot = sb.registry_start + 2; /* id 3 */
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, slot, 1, blk, 0), 0);
    struct plx_vdi_record *rec = (struct plx_vdi_record *)blk;
    ck_assert_str_eq(rec->name, "db");
    /* Held by a process on another host: without a lock manager, never stale from here. */
    rec->lock_host = 0x1234567;
    rec->lock_pid = 4242;
    rec->lock_epoch = 99;
    plx_blkhdr_seal(blk, PLX_MAGIC_VDI, slot);
    ck_assert_int_eq(tu_io(mem, PLX_IO_WRITE, slot, 1, blk, 0), 0);

    char err[512] = "";
    int upgraded = -1;
    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(mem), NULL, &upgraded, err, sizeof err),
                     -EBUSY);
    ck_assert_int_eq(upgraded, 0);
    ck_assert_msg(strstr(err, "VDI db is open for writing") && strstr(err, "another host"), "%s",
                  err);
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, 0, 1, blk, 0), 0);
    ck_assert_int_eq(memcmp(blk, sb0, sizeof blk), 0);
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, 1, 1, blk, 0), 0);
    ck_assert_int_eq(memcmp(blk, state0, sizeof blk), 0);

    /* Let go: the upgrade goes through, and the lock it carried is still there. */
    ck_assert_int_eq(tu_io(mem, PLX_IO_READ, slot, 1, blk, 0), 0);
    rec->lock_host = 0;
    plx_blkhdr_seal(blk, PLX_MAGIC_VDI, slot);
    ck_assert_int_eq(tu_io(mem, PLX_IO_WRITE, slot, 1, blk, 0), 0);
    ck_assert_int_eq(plx_store_upgrade_backend(tu_keep_wrap(mem), NULL, &upgraded, err, sizeof err),
                     0);
    ck_assert_int_eq(upgraded, 1);
    plx_store *st = open_store(mem, 1);
    assert_v1_contents(st, 0);
    ck_assert_int_eq(plx_store_close(st), 0);
    mem->ops->destroy(mem);
}
END_TEST

static Suite *registry_suite(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("scale");
    tcase_set_timeout(tc, 600);
    tu_no_reclaim_poll(tc); /* its tests count the I/O reaching the medium */
    tcase_add_test(tc, test_past_the_old_cap);
    tcase_add_test(tc, test_registry_shrinks);
    suite_add_tcase(s, tc);
    tc = tcase_create("upgrade");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_upgrade_v1);
    tcase_add_test(tc, test_upgrade_refused_while_held);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(registry_suite)
