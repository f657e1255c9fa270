/*
 * check.c - the consistency checker: walks the registry, every snapshot log and every radix tree
 * of the store and compares what is reachable with the allocation bitmaps.
 *
 * The walk reads the medium directly (plx_sync_io into its own buffers), never through the node
 * cache: the cache trusts nodes only after validating them, and the checker wants to see and
 * report exactly what is on disk, on a store opened read-only too.
 *
 * Trees are walked level by level over all trees at once rather than recursively: every child
 * address of a level is collected, sorted, and read in runs of consecutive blocks, so that a
 * store of tens of GiB is read in large, mostly sequential I/Os. A node shared by many trees
 * (through read-only links) is queued the first time it is reached and read once.
 *
 * Per block the checker keeps these bits:
 *   reach  reached at least once (from a live tree, a snapshot log or as a root);
 *   wr     reached writable: the block is a current root, a snapshot log block, or is reached
 *          from a current root through writable links only. The engine writes such blocks in
 *          place, so they must be referenced from exactly one place: any second reference to a
 *          wr block is an error. Links inside snapshot trees do not make a block wr whatever
 *          their bit says: a snapshot's root is the VDI's former current root, frozen with its
 *          writable links, and nothing writes through it again (so the children of a snapshot
 *          root are legitimately linked writable from it and read-only from the current root);
 *   wl     has an owning reference: a writable link anywhere (snapshot trees included), or it
 *          is a current root or log block. The engine only ever creates a writable link to a
 *          block it has just allocated, and every copy of a link (copy-on-write, snapshot,
 *          clone) is made read-only, so a second owning reference is an error too;
 *   dup    already reported as shared, so a block is reported once;
 *   alloc  the allocation bitmaps, as read from the medium.
 *
 * Levels: a tree of height h has its root at level h-1; links of level L >= 1 name nodes of
 * level L-1 in metadata extents; links of level 0 name data blocks in data extents. Deleted VDIs
 * and deleted snapshots are skipped: their blocks are garbage for the collector, so they show up
 * as leaked (allocated, unreachable), which is not an error. Unless a live process holds one
 * open (hold.h): the collector keeps such a tree, so it is walked like a live one.
 *
 * This file runs the steps in order; each step is a file of its own (check_shared.h names
 * them): check_catalogue.c, check_walk.c, check_extents.c, check_report.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "check_shared.h"
#include "hold.h"
#include "lock.h"
#include "registry.h"

/* ---- Entry point ----------------------------------------------------------------------------- */

static void ck_free(struct ck *c)
{
    free(c->types);
    free(c->bm_ok);
    free(c->reach);
    free(c->wr);
    free(c->wl);
    free(c->dup);
    free(c->alloc);
    free(c->vdis);
    free(c->trees);
    free(c->logs);
    free(c->skips);
    free(c->log_labels.v);
    free(c->idx_labels.v);
    for (unsigned i = 0; i < PLX_HEIGHT_LARGE; i++)
        free(c->levels[i].v);
    plx_block_free(c->iobuf);
    plx_block_free(c->blkbuf);
}

/* ---- Who else writes ------------------------------------------------------------------------------ */


static void describe_holder(const plx_store *st, uint64_t host, uint32_t pid, const char *what,
                            char *who, size_t len)
{
    if (host != st->host_hash) {
        snprintf(who, len, "a process on another host (pid %u there) %s", pid, what);
        return;
    }
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    snprintf(who, len, "pid %u%s%s%s on this host %s", pid, *comm ? " (" : "", comm,
             *comm ? ")" : "", what);
}

/* The VDIs that are open for writing: only they name a holder. */
struct locked {
    struct plx_vdi_record *v;
    size_t n;
};

static int collect_locked(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    (void)rec_addr;
    struct locked *l = arg;
    if (!rec->lock_host || (rec->flags & PLX_VDI_DELETED))
        return 0;
    struct plx_vdi_record *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    l->v = v;
    l->v[l->n++] = *rec;
    return 0;
}

int plx_store_writers(plx_store *st, char *who, size_t len)
{
    if (who && len)
        *who = 0;
    int rc = plx_catalogue_read(st);
    struct locked l = {NULL, 0};
    if (!rc)
        rc = plx_registry_each(st, 0, collect_locked, &l);
    if (rc == -ENOMEM)
        plx_err(st, rc, "out of memory");
    if (rc) {
        free(l.v);
        return rc;
    }
    size_t n = l.n;
    const struct plx_vdi_record *recs = l.v;
    /* Distinct live holders: each (host, pid, epoch) counted once. */
    struct holder {
        uint64_t host, epoch;
        uint32_t pid;
    } *seen = calloc(n + st->sb.extent_count, sizeof *seen);
    if (!seen) {
        free(l.v);
        return plx_err(st, -ENOMEM, "out of memory");
    }
    size_t count = 0;
    for (size_t i = 0; i < n + st->sb.extent_count; i++) {
        uint64_t host, epoch;
        uint32_t pid;
        char what[PLX_NAME_MAX + 64];
        if (i < n) {
            host = recs[i].lock_host, pid = recs[i].lock_pid, epoch = recs[i].lock_epoch;
            snprintf(what, sizeof what, "has VDI %s open for writing", recs[i].name);
        } else {
            const struct plx_extent_entry *c = &st->cat[i - n];
            host = c->holder_host, pid = c->holder_pid, epoch = c->holder_epoch;
            snprintf(what, sizeof what, "allocates in extent %llu", (unsigned long long)(i - n));
        }
        if (!host || plx_holder_stale(st, host, pid, epoch) ||
            plx_holder_is_me(st, host, pid, epoch))
            continue;
        size_t k = 0;
        while (k < count && !(seen[k].host == host && seen[k].pid == pid && seen[k].epoch == epoch))
            k++;
        if (k < count)
            continue;
        seen[count++] = (struct holder){.host = host, .epoch = epoch, .pid = pid};
        if (count == 1 && who && len)
            describe_holder(st, host, pid, what, who, len);
    }
    free(seen);
    free(l.v);
    return (int)count;
}

int plx_check(plx_store *st, struct plx_check_report *out,
              void (*report)(void *arg, int is_error, const char *line), void *arg)
{
    struct plx_check_opts o = {.struct_size = sizeof o, .report = report, .report_arg = arg};
    return plx_check_ex(st, &o, out);
}

int plx_check_ex(plx_store *st, const struct plx_check_opts *opts, struct plx_check_report *out)
{
    /* Fields beyond the caller's struct_size (an older caller) stay zero. */
    struct plx_check_opts o = {0};
    if (opts)
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    if (!st || !out)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    struct ck c;
    memset(&c, 0, sizeof c);
    c.st = st;
    c.out = out;
    c.report = o.report;
    c.arg = o.report_arg;
    c.progress = o.progress;
    c.progress_arg = o.progress_arg;
    c.nb = st->sb.block_count;
    c.eb = st->sb.extent_blocks;
    c.bmb = plx_bitmap_blocks(c.eb);
    c.next = st->sb.extent_count;
    size_t words = (size_t)((c.nb + 63) / 64);
    c.types = calloc(c.next, 1);
    c.bm_ok = calloc(c.next, 1);
    c.reach = calloc(words, sizeof(uint64_t));
    c.wr = calloc(words, sizeof(uint64_t));
    c.wl = calloc(words, sizeof(uint64_t));
    c.dup = calloc(words, sizeof(uint64_t));
    c.alloc = calloc(words, sizeof(uint64_t));
    c.read_depth = o.read_depth == 0 || o.read_depth > CK_QD_MAX ? CK_QD_MAX : o.read_depth;
    c.iobuf = plx_block_alloc_unzeroed((size_t)CK_RUN * c.read_depth);
    c.blkbuf = plx_block_alloc(1);
    int rc = 0;
    if (!c.types || !c.bm_ok || !c.reach || !c.wr || !c.wl || !c.dup || !c.alloc) {
        rc = plx_err(st, -ENOMEM, "check: out of memory for the block maps of %llu blocks",
                     (unsigned long long)c.nb);
        goto out;
    }
    rc = ck_system(&c);
    if (rc)
        goto out;
    ck_read_bitmaps(&c);
    rc = ck_registry(&c);
    for (size_t i = 0; !rc && i < c.nvdis; i++)
        rc = ck_tree_add(&c, i, 0, c.vdis[i].root);
    /* Logs before roots, current roots before snapshot roots: a block that must be private is
     * then reported from the place that should not reach it. */
    size_t ncurrent = c.ntrees;
    for (size_t i = 0; !rc && i < c.nvdis; i++) {
        ck_progress(&c, "reading snapshot logs", i, c.nvdis);
        rc = ck_log(&c, i);
    }
    for (size_t t = 0; !rc && t < ncurrent; t++)
        ck_add_root(&c, t);
    for (size_t t = ncurrent; !rc && t < c.ntrees; t++)
        ck_add_root(&c, t);
    if (!rc) {
        rc = plx_hold_each_live(st, ck_hold_tree, &c);
        if (rc && rc != -ENOMEM) {
            ck_problem(&c, 1, "hold table: %s", st->errmsg);
            c.incomplete = true; /* a held tree's blocks may show as leaks */
            rc = 0;
        }
    }
    for (int level = PLX_HEIGHT_LARGE - 1; !rc && !c.nomem && level >= 0; level--)
        ck_walk_level(&c, (unsigned)level);
    if (!rc && c.nomem)
        rc = -ENOMEM;
    if (rc == -ENOMEM) {
        plx_err(st, rc, "check: out of memory");
        goto out;
    }
    if (!rc)
        ck_reclaim_records(&c);
    ck_progress(&c, "counting leaks", 0, 0);
    ck_leaks(&c);
    for (size_t w = 0; w < words; w++)
        out->reachable_blocks += (uint64_t)__builtin_popcountll(c.reach[w]);
    if (c.suppressed && c.report) {
        char line[128];
        snprintf(line, sizeof line, "%llu more problems were found but are not listed",
                 (unsigned long long)c.suppressed);
        c.report(c.arg, 0, line);
    }
out:
    ck_free(&c);
    return rc;
}
