/*
 * test_crash.c - the proof of crash safety.
 *
 * Workloads run on the fault backend (backend_fault.h) through the asynchronous API, with up to
 * 64 requests in flight. Every guest-visible event is recorded with its event-log position: at
 * submission (before the submit call) and at completion (inside the callback). Afterwards, for
 * a sample of crash positions, the medium as a power failure there could leave it is rebuilt
 * with a crash cursor in three modes (only durable writes; every write; random subsets under
 * several seeds), opened read-only, and checked against the model:
 *   1. the store opens and plx_check finds no errors (leaked blocks are fine);
 *   2. durability: every tracked block of every VDI holds an acceptable value. Let F be the last
 *      flush of the VDI whose completion was logged before the crash. The base value is that of
 *      the latest write (in submission order) acknowledged before F was submitted, or of a FUA
 *      write acknowledged before the crash if later; acceptable are the base value (the initial
 *      contents when there is none) and the value of any later write submitted before the crash.
 *      Trims are writes of zeros;
 *   3. snapshots: every snapshot whose callback ran before the crash exists and reads back
 *      exactly what was submitted before it; one that had not completed may be missing, but if
 *      it is there it must read back exactly too (the strict part: after recovery it cannot be
 *      told from a completed one, and the VDI itself holds the writes that preceded it);
 *   4. clones exist once plx_vdi_clone returned, and read as their source snapshot plus their
 *      own writes under rule 2;
 *   5. nothing else changed: untracked blocks read as zeros, no unknown VDI appears, and the
 *      snapshot count lies between the completed and the submitted snapshots.
 * Every written block holds a pattern naming the write (its id) and the virtual block, so the
 * write whose data a block holds is read back exactly (torn, misplaced or foreign data shows).
 *
 * A second group injects EIO (data read, data write, metadata write, flush, and the n-th I/O
 * for a range of n) into an asynchronous workload: the affected requests complete with -EIO,
 * the others complete, later requests succeed, and the store reopened from the final image is
 * clean with every acknowledged write intact. One exception (DESIGN.md, "Failed commits"): when
 * a commit fails after writes of it were acknowledged (a write completes when its data is
 * written), the VDI fails every request, a flush included, until it is opened again; then the
 * writes acknowledged since its last successful flush or snapshot (not FUA) count as failed
 * ones (may or may not be there), and everything flushed must be intact (reopen_failed).
 *
 * Everything is deterministic (fixed seeds, printed). PLX_TEST_QUICK=1 shrinks the workloads
 * and the number of crash images. Each workload prints one line of statistics; each violation
 * prints a line "VIOLATION [workload seed S] crash at position P, mode M, seed X: ..." with the
 * history of the block concerned (write ids, submission and acknowledgement positions), enough
 * to replay it: the same workload and seed give the same event log.
 *
 * This file holds the suite: the table of workloads, the shards and the totals. The harness's
 * other rooms (one binary, EXTRA_test_crash in the Makefile; crash.h is what they share):
 * crash_model.c (block patterns, the model's records, a workload's setup), crash_backend.c (the
 * forwarding and window backends), crash_requests.c (submitting and driving requests),
 * crash_verify.c (crash images checked against the model), crash_workloads.c (the workloads),
 * crash_eio.c (error injection, commit order) and crash_registry.c (the registry, held trees
 * and the upgrade under crashes).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "crash.h"

/* ---- Totals shared across the forked test processes ------------------------------------------ */

struct totals *g_tot;
static struct totals g_tot_local;

/* What the test is doing, printed if the process dies (engine crash on a corrupt image). */
char g_ctx[512];

void __sanitizer_set_death_callback(void (*cb)(void));
#pragma weak __sanitizer_set_death_callback

static void print_ctx(void)
{
    if (g_ctx[0]) {
        static const char pre[] = "test_crash: died while ";
        ssize_t r = write(2, pre, sizeof pre - 1);
        r = write(2, g_ctx, strlen(g_ctx));
        r = write(2, "\n", 1);
        (void)r;
    }
}

static void on_fatal_signal(int sig)
{
    print_ctx();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_death_report(void)
{
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(print_ctx);
        return;
    }
    signal(SIGSEGV, on_fatal_signal);
    signal(SIGBUS, on_fatal_signal);
    signal(SIGABRT, on_fatal_signal);
    signal(SIGFPE, on_fatal_signal);
}

/* ---- The workloads and the shards ------------------------------------------------------------ */

struct workload {
    const char *name;
    void (*run)(struct wl *wl);
    uint64_t cache_bytes;
};

static const struct workload workloads[] = {
    {"sequential", wl_sequential, 0},
    {"random", wl_random, 0},
    {"snap-overwrite", wl_snap_overwrite, 0},
    {"clone", wl_clone, 0},
    {"snap-storm", wl_snap_storm, 0},
    {"trim", wl_trim, 0},
    {"sparse-1TiB", wl_sparse, 256 * 1024},
    {"checkpoint", wl_checkpoint, 0},
    {"handover", wl_handover, 0},
    {"takeover", wl_takeover, 0},
    {"placement", wl_placement, 64 * 1024},
    {"snap-many", wl_snap_many, 0},
    {"snap-inflight", wl_snap_inflight, 0},
    {"snap-edit", wl_snap_edit, 0},
    {"claim-ahead", wl_claim_ahead, 0},
    {"fua-overwrite", wl_fua_overwrite, 0},
    {"gc-fold", wl_gc_fold, 0},
    {"claim-room", wl_claim_room, 0},
};
/* Write-cache workloads: a test case of their own (CK_RUN_CASE=wcache runs only them). */
static const struct workload wcache_workload = {"wcache", wl_wcache, 0};
#define NWORKLOADS ((int)(sizeof workloads / sizeof workloads[0]))

/* Each workload runs under this many seeds (full runs) or one (quick runs). */
#define FULL_RUNS 2

/* PLX_CRASH_SHARD=K/N runs only the workload runs whose index is K modulo N (the loop of this
 * shard counts only those), the write-cache cases in shards 0 and 1 (mod N), the EIO cases only
 * in shard 1 (mod N) and the registry cases only in shard N-1, so that N processes share the
 * harness (make check runs three beside the other tests on two cores); unset, everything runs.
 * PLX_CRASH_RUNS=first runs only the first run (seed) of each workload and the other cases
 * (make check); PLX_CRASH_RUNS=rest only the runs after the first (make check-long); unset,
 * all of them. */
static unsigned g_shard, g_shards = 1;
static int g_first_run, g_end_run = FULL_RUNS; /* the runs [first, end) of each workload */
static bool g_other_cases = true;              /* the write-cache, EIO and registry cases */

static void parse_shard(void)
{
    const char *e = getenv("PLX_CRASH_SHARD");
    unsigned k, n;
    if (e && sscanf(e, "%u/%u", &k, &n) == 2 && n > 0 && k < n) {
        g_shard = k;
        g_shards = n;
    } else if (e) {
        fprintf(stderr, "test_crash: PLX_CRASH_SHARD=%s is not K/N with K < N\n", e);
        exit(2);
    }
    if (tu_quick())
        g_end_run = 1;
    const char *r = getenv("PLX_CRASH_RUNS");
    if (r && strcmp(r, "first") == 0) {
        g_end_run = 1;
    } else if (r && strcmp(r, "rest") == 0) {
        g_first_run = 1;
        g_other_cases = false;
    } else if (r) {
        fprintf(stderr, "test_crash: PLX_CRASH_RUNS=%s is not 'first' or 'rest'\n", r);
        exit(2);
    }
}

/* The workload runs of all shards together. */
static int workload_runs(void)
{
    return g_end_run > g_first_run ? NWORKLOADS * (g_end_run - g_first_run) : 0;
}

static void run_workload(const struct workload *wk, int i, uint64_t run, uint64_t log_blocks);

START_TEST(test_crash_workload)
{
    int i = _i * (int)g_shards + (int)g_shard; /* this shard's _i-th run */
    run_workload(&workloads[i % NWORKLOADS], i % NWORKLOADS,
                 (uint64_t)(g_first_run + i / NWORKLOADS), 0);
}
END_TEST

START_TEST(test_crash_wcache)
{
    /* Records of 8 blocks and more (of block-aligned buffers, most of this harness's) are
     * written from the writer's buffer, their batch in pieces (wlog_batch.c, zc_min; 256 KiB
     * outside tests): crash images fall between the pieces too. */
    setenv("PARALLAX_WCACHE_ZC_MIN", "8", 1);
    /* Run 0 with the drain's default policy (deferred while the workload writes: it drains when
     * the log is half full, or for a waiter); run 1 with the delay 0, so that the drain also runs
     * between single writes, as it did before the policy (wlog_drain.c, drain_defer). */
    if (_i == 1)
        setenv("PARALLAX_WCACHE_DRAIN_DELAY_MS", "0", 1);
    run_workload(&wcache_workload, NWORKLOADS, (uint64_t)_i, WCACHE_LOG_BLOCKS);
    unsetenv("PARALLAX_WCACHE_ZC_MIN");
    unsetenv("PARALLAX_WCACHE_DRAIN_DELAY_MS");
}
END_TEST

static void run_workload(const struct workload *wk, int i, uint64_t run, uint64_t log_blocks)
{
    struct wl wl;
    double t0 = now_s();
    wl_init_log(&wl, wk->name, 0xc0ffee00u + (uint64_t)i * 7919 + run * 104729, wk->cache_bytes,
                log_blocks);
    wk->run(&wl);
    verify_live(&wl);
    crash_sweep(&wl, npositions(), nseeds(), tu_quick() ? 3 : 4);
    report(&wl, now_s() - t0);
    unsigned long long v = wl.violations;
    wl_free(&wl);
    ck_assert_msg(v == 0, "workload %s: %llu violations (see VIOLATION lines)", wk->name, v);
}

/* ---- Suite ----------------------------------------------------------------------------------- */

static Suite *crash_suite(void)
{
    Suite *s = suite_create("crash");
    TCase *tc = tcase_create("workloads");
    tcase_set_timeout(tc, 900);
    int runs = workload_runs(), mine = (runs - (int)g_shard + (int)g_shards - 1) / (int)g_shards;
    tcase_add_loop_test(tc, test_crash_workload, 0, mine);
    suite_add_tcase(s, tc);

    /* The write-cache cases: two seeds, the drain deferred (run 0, in shard 0) and eager (run 1,
     * in shard 1 mod N): some 15 s each in full runs, the longest cases of the harness. */
    for (int run = 0; run < 2; run++) {
        if (!g_other_cases || g_shard != (unsigned)run % g_shards)
            continue;
        tc = tcase_create("wcache");
        tcase_set_timeout(tc, 900);
        tcase_add_loop_test(tc, test_crash_wcache, run, run + 1);
        suite_add_tcase(s, tc);
    }
    if (g_other_cases && g_shard == 1 % g_shards) { /* the EIO cases */
        tc = tcase_create("eio");
        tcase_set_timeout(tc, 600);
        crash_eio_tests(tc);
        suite_add_tcase(s, tc);
    }
    if (g_other_cases && g_shard == g_shards - 1) { /* the registry cases */
        tc = tcase_create("registry");
        tcase_set_timeout(tc, 900);
        crash_registry_tests(tc);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    void *shared = mmap(NULL, sizeof(struct totals), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_tot = shared != MAP_FAILED ? shared : &g_tot_local;
    memset(g_tot, 0, sizeof *g_tot);
    install_death_report();
    parse_shard();
    printf("test_crash: %s mode, shard %u of %u\n", tu_quick() ? "quick" : "full", g_shard + 1,
           g_shards);
    fflush(stdout);
    int rc = tu_run_suite(crash_suite());
    printf("crash: %llu crash points (positions x modes), %d workloads (%llu runs), %llu failures "
           "(%llu of them an unfinished snapshot that exists with wrong contents; %llu distinct "
           "positions, %llu plx_check runs)\n",
           g_tot->images, NWORKLOADS, g_tot->workloads, g_tot->failures, g_tot->strict,
           g_tot->positions, g_tot->checks);
    printf("crash: error injection: %llu runs, %llu failures\n", g_tot->eio_runs,
           g_tot->eio_failures);
    return rc;
}
