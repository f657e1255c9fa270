/*
 * testutil.c - helpers shared by the Check unit tests.
 */
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "format.h"
#include "testutil.h"

/* Large blocks stay on the heap. Under glibc's defaults each allocation of 128 KiB or more (more
 * after the first frees) is a fresh mmap whose pages all fault in when it is first written, and
 * the engine takes such buffers per call: plx_check's 8 MiB read buffer (check.c: CK_RUN blocks
 * times the read depth), zeroed by plx_block_alloc, for every crash image test_crash checks.
 * That was most of the time of test_crash (4.7 million page faults for one workload run: 12.5 s
 * against 3.4 s) and of test_gc (22 s against 6.5 s). The same code runs on the same data; only
 * where the memory comes from changes. The sanitized build has its own allocator and ignores
 * this (and catches a use after free of such a buffer anyway). */
static void keep_large_buffers(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* the largest glibc accepts */
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

static int tests_added; /* loop tests count once per iteration, as Check runs them */

void tu_tcase_add(TCase *tc, const TTest *ttest, int sig, int allowed_exit, int start, int end)
{
    tests_added += end > start ? end - start : 0;
    (_tcase_add_test)(tc, ttest, sig, allowed_exit, start, end); /* the function, not the macro */
}

/* Whether the environment asks Check to run only some of the tests. */
static int tests_picked(void)
{
    static const char *const vars[] = {"CK_RUN_CASE", "CK_RUN_SUITE", "CK_INCLUDE_TAGS",
                                       "CK_EXCLUDE_TAGS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && *v != '\0')
            return 1;
    }
    return 0;
}

int tu_run_suite(Suite *s)
{
    keep_large_buffers();
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    int ran = srunner_ntests_run(sr);
    srunner_free(sr);
    if (!tests_picked() && ran != tests_added) {
        fprintf(stderr, "testutil: Check reported %d results for the %d tests this binary adds\n",
                ran, tests_added);
        return EXIT_FAILURE;
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

uint64_t tu_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tu_fill(void *buf, size_t len, uint64_t seed)
{
    unsigned char *p = buf;
    uint64_t st = seed;
    while (len >= 8) {
        uint64_t v = tu_rand(&st);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len > 0) {
        uint64_t v = tu_rand(&st);
        memcpy(p, &v, len);
    }
}

int tu_quick(void)
{
    const char *v = getenv("PLX_TEST_QUICK");
    return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

const char *tu_tmpdir(void)
{
    const char *d = getenv("TMPDIR");
    return d != NULL && *d != '\0' ? d : "/tmp";
}

void tu_wait_io(plx_backend *be, int *done)
{
    while (!*done) {
        int n = be->ops->poll(be, -1);
        ck_assert_msg(n >= 0, "poll on %s failed: %d", be->desc, n);
        ck_assert_msg(*done || n > 0 || be->ops->inflight(be) > 0,
                      "%s: nothing in flight but the awaited I/O has not completed", be->desc);
    }
}

struct tu_io_wait {
    int done;
    int status;
};

static void tu_io_done(struct plx_io *io, int status)
{
    struct tu_io_wait *w = io->owner;
    w->status = status;
    w->done = 1;
}

int tu_io(plx_backend *be, enum plx_io_op op, uint64_t block, uint32_t nblocks, void *buf,
          unsigned flags)
{
    struct tu_io_wait w = {0, 0};
    struct plx_io io = {
        .op = op,
        .flags = flags,
        .block = block,
        .nblocks = nblocks,
        .buf = buf,
        .done = tu_io_done,
        .owner = &w,
    };
    int rc = be->ops->submit(be, &io);
    if (rc < 0)
        return rc;
    tu_wait_io(be, &w.done);
    return w.status;
}

static void no_reclaim_poll_setup(void)
{
    setenv("PARALLAX_RECLAIM_POLL_MS", "0", 1);
}

static void no_reclaim_poll_teardown(void)
{
    unsetenv("PARALLAX_RECLAIM_POLL_MS");
}

void tu_no_reclaim_poll(TCase *tc)
{
    tcase_add_unchecked_fixture(tc, no_reclaim_poll_setup, no_reclaim_poll_teardown);
}

/* ---- tu_keep_wrap ------------------------------------------------------------------------------ */

/* A stacked backend (parallax_backend.h) that does not own the medium below and counts flushes. */

unsigned long tu_flushes, tu_reads, tu_read_blocks, tu_writes;
static struct plx_backend_ops keep_ops;
static int (*forward_submit)(plx_backend *be, struct plx_io *io);

static int (*forward_poll)(plx_backend *be, int timeout_ms);
static unsigned (*forward_inflight)(const plx_backend *be);

/* Held writes and where they go when released; the buffers of writes seen since the hold. */
#define TU_MAX_HELD 8
#define TU_MAX_SEEN 256
static int hold_next;
static struct plx_io *held[TU_MAX_HELD];
static plx_backend *held_be[TU_MAX_HELD];
static unsigned nheld;
static const void *seen[TU_MAX_SEEN];
static unsigned nseen;

void tu_hold_next_write(void)
{
    hold_next = 1;
    nseen = 0;
}

unsigned tu_held(void)
{
    return nheld;
}

void tu_release_held(void)
{
    for (unsigned i = 0; i < nheld; i++) {
        int rc = forward_submit(held_be[i], held[i]);
        ck_assert_msg(rc == 0, "submitting a held write: %d", rc);
    }
    nheld = 0;
}

int tu_write_seen(const void *buf)
{
    for (unsigned i = 0; i < nseen; i++)
        if (seen[i] == buf)
            return 1;
    return 0;
}

static unsigned keep_inflight(const plx_backend *be)
{
    return forward_inflight(be) + nheld;
}

static int keep_poll(plx_backend *be, int timeout_ms)
{
    /* Waiting for a completion while the only I/O in flight is held would wait forever. */
    if (timeout_ms < 0 && nheld && forward_inflight(be) == 0)
        timeout_ms = 0;
    return forward_poll(be, timeout_ms);
}

static int keep_submit(plx_backend *be, struct plx_io *io)
{
    if (io->op == PLX_IO_WRITE && nseen < TU_MAX_SEEN)
        seen[nseen++] = io->buf;
    if (io->op == PLX_IO_WRITE && hold_next) {
        ck_assert_uint_lt(nheld, TU_MAX_HELD);
        hold_next = 0;
        tu_writes++;
        held[nheld] = io;
        held_be[nheld++] = be;
        return 0;
    }
    if (io->op == PLX_IO_FLUSH)
        tu_flushes++;
    if (io->op == PLX_IO_READ) {
        tu_reads++;
        tu_read_blocks += io->nblocks;
    }
    if (io->op == PLX_IO_WRITE)
        tu_writes++;
    return forward_submit(be, io);
}

plx_backend *tu_keep_wrap(plx_backend *inner)
{
    if (!keep_ops.submit) {
        plx_backend_stack_forward_ops(&keep_ops);
        forward_submit = keep_ops.submit;
        forward_poll = keep_ops.poll;
        forward_inflight = keep_ops.inflight;
        keep_ops.submit = keep_submit;
        keep_ops.poll = keep_poll;
        keep_ops.inflight = keep_inflight;
    }
    struct plx_backend_stack *k = calloc(1, sizeof(*k));
    ck_assert_ptr_nonnull(k);
    plx_backend_stack_init(k, &keep_ops, inner, 0, NULL);
    return &k->base;
}

/* ---- A store of format version 1, for the upgrade tests ---------------------------------------- */

struct v1_walk {
    plx_backend *be;
    uint64_t *recs; /* record block addresses, in id order */
    size_t n, cap;
};

static void v1_collect(struct v1_walk *w, uint64_t addr, unsigned level)
{
    uint8_t *blk = plx_block_alloc(1);
    ck_assert_int_eq(tu_io(w->be, PLX_IO_READ, addr, 1, blk, 0), 0);
    const struct plx_vditab_block *t = (const struct plx_vditab_block *)blk;
    ck_assert_uint_eq(t->hdr.magic, PLX_MAGIC_VDITAB);
    for (unsigned i = 0; i < PLX_VDITAB_FANOUT; i++) {
        if (!t->entries[i])
            continue;
        if (level > 0) {
            v1_collect(w, t->entries[i], level - 1);
            continue;
        }
        if (w->n == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 64;
            w->recs = realloc(w->recs, w->cap * sizeof *w->recs);
            ck_assert_ptr_nonnull(w->recs);
        }
        w->recs[w->n++] = t->entries[i];
    }
    plx_block_free(blk);
}

void tu_make_v1(plx_backend *be)
{
    uint8_t *blk = plx_block_alloc(1);
    struct plx_superblock sb;
    struct plx_state_block state;
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 0, 1, blk, 0), 0);
    memcpy(&sb, blk, sizeof sb);
    ck_assert_uint_eq(sb.version, PLX_FORMAT_VERSION);
    ck_assert_int_eq(tu_io(be, PLX_IO_READ, 1, 1, blk, 0), 0);
    memcpy(&state, blk, sizeof state);

    struct v1_walk w = {be, NULL, 0, 0};
    if (state.vdi_table_root)
        v1_collect(&w, state.vdi_table_root, state.vdi_table_height - 1);
    /* Version 1's geometry: as many one-block slots as extent 0 holds after the catalogue, at
     * most 65,536. */
    uint64_t slots = sb.extent_blocks - sb.registry_start;
    if (slots > 65536)
        slots = 65536;
    ck_assert_uint_le(w.n, slots);
    for (size_t i = 0; i < w.n; i++) {
        ck_assert_int_eq(tu_io(be, PLX_IO_READ, w.recs[i], 1, blk, 0), 0);
        plx_blkhdr_seal(blk, PLX_MAGIC_VDI, sb.registry_start + i);
        ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, sb.registry_start + i, 1, blk, 0), 0);
    }
    /* The version-2 blocks (table, index, the records' new homes) stay behind as leaked
     * metadata, as a version-1 store may well have. */
    state.registry_used = w.n;
    state.vdi_table_root = 0;
    state.vdi_table_height = 0;
    state.name_index_root = 0;
    memset(blk, 0, PLX_BLOCK_SIZE);
    memcpy(blk, &state, sizeof state);
    plx_blkhdr_seal(blk, PLX_MAGIC_STATE, 1);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 1, 1, blk, 0), 0);
    sb.version = PLX_FORMAT_VERSION_V1;
    sb.registry_slots = slots;
    memset(blk, 0, PLX_BLOCK_SIZE);
    memcpy(blk, &sb, sizeof sb);
    plx_blkhdr_seal(blk, PLX_MAGIC_SUPER, 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_WRITE, 0, 1, blk, 0), 0);
    ck_assert_int_eq(tu_io(be, PLX_IO_FLUSH, 0, 0, NULL, 0), 0);
    free(w.recs);
    plx_block_free(blk);
}

int tu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

pid_t tu_lockd_start(int port, const char *lease)
{
    char exe[PATH_MAX], path[PATH_MAX + 32], listen[64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = 0;
    *strrchr(exe, '/') = 0; /* build/unit or build/unit-san */
    snprintf(path, sizeof path, "%s/../parallax-lockd", exe);
    ck_assert_msg(access(path, X_OK) == 0, "%s not built", path);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(126);
        execl(path, path, "--listen", listen, "--lease", lease, (char *)NULL);
        _exit(127);
    }
    /* Up to 5 s: a loaded machine (the sanitized build beside the others) starts it slowly. */
    for (int i = 0; i < 250; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok)
            return pid;
        usleep(20000);
    }
    ck_abort_msg("parallax-lockd did not start on port %d", port);
    return -1;
}
