/*
 * backend_file_prepare.c - zeroing ahead for the file backend (plx_backend_prepare, backend.h;
 * docs/DESIGN.md "Zeroing ahead").
 *
 * A second helper thread writes zeros over the holes of ranges the allocator is about to fill,
 * so that the engine's writes land in written space (on ext4 a random 4 KiB write into a hole or
 * unwritten space is 2-5 times slower). The ranges and the state of each 1 MiB chunk are shared
 * with the thread under prep_mu; a write into a chunk that is not done is held on held_head (the
 * loop's own list) until the thread says so through the eventfd, and backend_file.c's poll
 * starts it then (plx_file_prep_release). f is always the backend's struct file_prep
 * (backend_file_prepare.h): this file knows nothing else of the file backend.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libaio.h>

#include "backend_done.h"
#include "clock.h"
#include "backend_file_prepare.h"

static uint64_t u64_max(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}
static uint64_t u64_min(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Under prep_mu: the number of held writes becomes n. The waits add up to the integral of that
 * number over time, so no I/O needs a timestamp of its own. */
static void held_count(struct file_prep *f, uint64_t n)
{
    uint64_t now = plx_mono_ns();
    if (f->held_n > 0)
        f->prep_stats.wait_ns += f->held_n * (now - f->held_since_ns);
    f->held_n = n;
    f->held_since_ns = now;
    if (n > f->prep_stats.held_max)
        f->prep_stats.held_max = n;
}

/* Blocks of chunk k of r: [*a, *b). */
static void chunk_bounds(const struct prep_range *r, uint64_t k, uint64_t *a, uint64_t *b)
{
    *a = u64_max(k * PREP_CHUNK, r->first);
    *b = u64_min((k + 1) * PREP_CHUNK, r->end);
}

static void chunk_set_done(struct file_prep *f, struct prep_range *r, uint64_t i)
{
    if (r->state[i] == CH_URGENT)
        f->prep_urgent--;
    r->state[i] = CH_DONE;
    r->left--;
}

/* Under prep_mu: visit every chunk not done that [block, block + n) touches: fn(f, r, i, whole)
 * with whole set when the I/O covers the chunk's blocks in full. */
static void for_chunks(struct file_prep *f, uint64_t block, uint64_t n,
                       void (*fn)(struct file_prep *, struct prep_range *, uint64_t, int, void *),
                       void *arg)
{
    uint64_t end = block + n;
    for (struct prep_range *r = f->prep_ranges; r != NULL; r = r->next) {
        if (r->left == 0 || end <= r->first || block >= r->end)
            continue;
        uint64_t lo = u64_max(block, r->first), hi = u64_min(end, r->end);
        for (uint64_t k = lo / PREP_CHUNK; k <= (hi - 1) / PREP_CHUNK; k++) {
            uint64_t i = k - r->c0, a, b;
            if (r->state[i] == CH_DONE)
                continue;
            chunk_bounds(r, k, &a, &b);
            fn(f, r, i, block <= a && end >= b, arg);
        }
    }
}

static void find_busy(struct file_prep *f, struct prep_range *r, uint64_t i, int whole, void *arg)
{
    (void)f;
    (void)whole;
    if (r->state[i] == CH_BUSY)
        *(int *)arg = 1;
}

/* The I/O goes ahead: a chunk it covers whole counts as done (the write replaces whatever
 * zeroing would have written there); in one it covers in part it is counted as in flight, and
 * the chunk, now in use, is zeroed before those nobody writes to yet, unless the write belongs
 * to a stream (*arg set), whose next writes will fill the rest of the chunk themselves. */
static void go_ahead(struct file_prep *f, struct prep_range *r, uint64_t i, int whole, void *arg)
{
    if (whole) {
        chunk_set_done(f, r, i);
        f->prep_stats.chunks_covered++;
        return;
    }
    r->writing[i]++;
    if (r->state[i] == CH_PENDING && !(arg != NULL && *(const int *)arg)) {
        r->state[i] = CH_URGENT;
        f->prep_urgent++;
    }
}

/* Under prep_mu: must a write or trim of [block, block + n) wait? Only while the thread zeroes a
 * chunk it touches (between the thread's look for holes and its zero write, a data write there
 * could be overwritten by zeros). Otherwise it is counted and goes ahead, into holes if the
 * thread has not been there yet: slower on ext4 than written space, but far faster than waiting
 * for 1 MiB zero writes one after another when a snapshot has just made every leaf take a fresh
 * slot (bench/notes/snapshots.md, issue 16). */
static void wait_all(struct file_prep *f, struct prep_range *r, uint64_t i, int whole, void *arg)
{
    if (whole && r->state[i] != CH_BUSY) {
        chunk_set_done(f, r, i);
        f->prep_stats.chunks_covered++;
        return;
    }
    if (r->state[i] == CH_PENDING) {
        r->state[i] = CH_URGENT;
        f->prep_urgent++;
        if (f->prep_idle)
            pthread_cond_signal(&f->prep_cv);
    }
    *(int *)arg = 1;
}

static int prep_blocked(struct file_prep *f, uint64_t block, uint64_t n, int stream)
{
    if (f->prep_wait_all) {
        /* PARALLAX_ZERO_WAIT=1 (measurements): every write into a chunk not done waits for
         * it, as before 2026-11-26. */
        int blocked = 0;
        for_chunks(f, block, n, wait_all, &blocked);
        return blocked;
    }
    int busy = 0;
    for_chunks(f, block, n, find_busy, &busy);
    if (!busy)
        for_chunks(f, block, n, go_ahead, &stream);
    return busy;
}

/* Streams. A writer that fills fresh chunks in order or in large pieces (a copy, an image being
 * written, and after every snapshot a sequential writer's copy-on-write into fresh slots) needs
 * no zeros: its own writes fill the chunks, and zeroing ahead of it only makes the medium write
 * everything twice. With a snapshot every 10 ms that cost a 1 MiB writer a quarter of its speed
 * (bench/notes/snapshots.md, issue 16, "Zeroing ahead stands aside for streams"). So while writes
 * into chunks not done arrive as streams (each of 64 KiB or more starting where an earlier write
 * ended, or large, or covering a chunk whole) and fewer than PREP_RANDOM_N small writes out of
 * any stream land in such chunks within prep_stream_ns, the thread zeroes only urgent chunks
 * (those small writes' chunks) and leaves the rest pending; it zeroes ahead again once the
 * streams stop or small writes come. Only the choice of what to zero changes, never the rules
 * that keep zero writes and data writes apart. */
#define PREP_LARGE (PREP_CHUNK / 4) /* blocks: a write this large is a stream on its own */
/* Blocks: a sequential write smaller than this is no stream. Each small write into a hole pays
 * for its allocation on ext4 (the reason for zeroing ahead), sequential or not, so a small
 * sequential writer keeps having its chunks zeroed as it reaches them. */
#define PREP_SEQ_MIN 16u

struct touch {
    unsigned chunks, whole;
};

static void count_touch(struct file_prep *f, struct prep_range *r, uint64_t i, int whole, void *arg)
{
    (void)f;
    (void)r;
    (void)i;
    struct touch *t = arg;
    t->chunks++;
    t->whole += whole != 0;
}

/* Under prep_mu, once per write or trim when it is submitted: note where it ends and whether it
 * streams into chunks not done (1) or is a small write out of any stream (0). */
static int prep_classify(struct file_prep *f, uint64_t block, uint64_t n, uint64_t now)
{
    int seq = 0, stream;
    for (unsigned k = 0; k < PREP_STREAMS && !seq; k++)
        if (f->prep_ends[k] == block && block != 0) {
            f->prep_ends[k] = block + n;
            seq = 1;
        }
    if (!seq) {
        f->prep_ends[f->prep_ends_next] = block + n;
        f->prep_ends_next = (f->prep_ends_next + 1) % PREP_STREAMS;
    }
    struct touch t = {0, 0};
    for_chunks(f, block, n, count_touch, &t);
    stream = n >= PREP_LARGE || (seq && n >= PREP_SEQ_MIN) || t.whole > 0;
    if (t.chunks == 0)
        return stream;
    if (stream) {
        f->prep_streamed_at = now;
        f->prep_stats.writes_streamed++;
        return 1;
    }
    f->prep_random_at[f->prep_random_next] = now;
    f->prep_random_next = (f->prep_random_next + 1) % PREP_RANDOM_N;
    f->prep_stats.writes_random++;
    return 0;
}

/* Under prep_mu: until when (monotonic ns) the thread leaves pending chunks alone, or 0 when it
 * zeroes ahead now. */
static uint64_t prep_aside_until(const struct file_prep *f, uint64_t now)
{
    uint64_t w = f->prep_stream_ns, oldest = f->prep_random_at[f->prep_random_next];
    if (w == 0 || f->prep_streamed_at == 0 || now - f->prep_streamed_at >= w)
        return 0;
    if (oldest != 0 && now - oldest < w)
        return 0; /* PREP_RANDOM_N small writes within the window: they want zeros */
    return f->prep_streamed_at + w;
}

static void uncount(struct file_prep *f, struct prep_range *r, uint64_t i, int whole, void *arg)
{
    (void)whole;
    (void)arg;
    /* 0 only for an I/O that was not counted here: one from before its range existed, which
     * the engine never issues (it prepares only blocks it has not handed out). */
    if (r->writing[i] > 0 && --r->writing[i] == 0 && f->prep_idle)
        pthread_cond_signal(&f->prep_cv);
}

void plx_file_prep_finished(struct file_prep *f, const struct plx_io *io)
{
    pthread_mutex_lock(&f->prep_mu);
    for_chunks(f, io->block, io->nblocks, uncount, NULL);
    pthread_mutex_unlock(&f->prep_mu);
}

/* Hold io if its chunks are not ready (1), else 0: it goes the usual way. */
int plx_file_prep_hold(struct file_prep *f, struct plx_io *io)
{
    pthread_mutex_lock(&f->prep_mu);
    int stream = prep_classify(f, io->block, io->nblocks, plx_mono_ns());
    int blocked = prep_blocked(f, io->block, io->nblocks, stream);
    if (blocked) {
        if (f->held_tail != NULL)
            f->held_tail->be_next = io;
        else
            f->held_head = io;
        f->held_tail = io;
        f->prep_waiters = 1;
        f->prep_stats.writes_waited++;
        held_count(f, f->held_n + 1);
    }
    pthread_mutex_unlock(&f->prep_mu);
    return blocked;
}

/* Every chunk not yet done counts as done (an error, or the backend closing). Under prep_mu. */
static void prep_abandon(struct file_prep *f)
{
    for (struct prep_range *r = f->prep_ranges; r != NULL; r = r->next)
        for (uint64_t i = 0; i < r->nchunks && r->left > 0; i++)
            if (r->state[i] == CH_PENDING || r->state[i] == CH_URGENT)
                chunk_set_done(f, r, i);
}

/* Under prep_mu: the chunk to zero next, urgent ones first; none with writes in flight; none
 * that is only pending while streams are being written (prep_aside_until). */
static int prep_pick(struct file_prep *f, struct prep_range **rp, uint64_t *ip)
{
    for (struct prep_range *r = f->prep_ranges; r != NULL && f->prep_urgent > 0; r = r->next)
        for (uint64_t i = 0; i < r->nchunks && r->left > 0; i++)
            if (r->state[i] == CH_URGENT && r->writing[i] == 0) {
                *rp = r;
                *ip = i;
                return 1;
            }
    if (prep_aside_until(f, plx_mono_ns()) != 0)
        return 0;
    for (struct prep_range *r = f->prep_ranges; r != NULL; r = r->next) {
        while (r->cursor < r->nchunks && r->state[r->cursor] != CH_PENDING)
            r->cursor++;
        for (uint64_t i = r->cursor; i < r->nchunks; i++)
            if (r->state[i] == CH_PENDING && r->writing[i] == 0) {
                *rp = r;
                *ip = i;
                return 1;
            }
    }
    return 0;
}

/* Zero writes in flight together: the thread takes up to PREP_PARALLEL chunks at a time and
 * sends all their zero writes at once. One 1 MiB write at a time left the medium idle between
 * them while, right after a snapshot, hundreds of chunks were wanted within a second. */
#define PREP_PARALLEL 8u
#define PREP_IOCBS 64u

/* A batch of zero writes through the thread's own aio context. A synchronous O_DIRECT write that
 * allocates (into a hole) holds the file's inode lock exclusively on ext4 until its I/O is over,
 * and every io_submit of the engine's thread on the same file waits behind it
 * (PARALLAX_SNAP_TRACE showed 74-178 io_submit calls of 5 ms or more per run, 1.2-1.5 s in all,
 * against 4-8 without zeroing); an aio write holds it only while the blocks are allocated and
 * the I/O is sent. Without a context (io_setup failed), pwrite one at a time. */
struct zero_batch {
    io_context_t ctx;
    const void *zeros; /* PREP_CHUNK blocks of zeros */
    struct iocb cbs[PREP_IOCBS];
    unsigned n;     /* prepared, not yet submitted */
    int rc;         /* the first error */
    uint64_t bytes; /* zeros written */
};

static void zb_error(struct zero_batch *z, long rc)
{
    if (z->rc == 0)
        z->rc = (int)rc;
}

/* Submit what is prepared and wait for all of it. */
static void zb_flush(struct zero_batch *z)
{
    struct iocb *ps[PREP_IOCBS];
    unsigned sent = 0, got = 0;
    for (unsigned k = 0; k < z->n; k++)
        ps[k] = &z->cbs[k];
    while (sent < z->n) {
        int rc = io_submit(z->ctx, (long)(z->n - sent), ps + sent);
        if (rc == -EINTR || rc == -EAGAIN)
            continue;
        if (rc <= 0) {
            zb_error(z, rc < 0 ? rc : -EIO);
            break;
        }
        sent += (unsigned)rc;
    }
    while (got < sent) {
        struct io_event ev[PREP_IOCBS];
        int rc = io_getevents(z->ctx, 1, (long)(sent - got), ev, NULL);
        if (rc == -EINTR)
            continue;
        if (rc < 0) {
            /* Cannot happen with a valid context; io_destroy at exit waits for the rest. */
            zb_error(z, rc);
            break;
        }
        for (int k = 0; k < rc; k++) {
            long res = (long)ev[k].res;
            if (res < 0)
                zb_error(z, res);
            else if ((unsigned long)res != ev[k].obj->u.c.nbytes)
                zb_error(z, -EIO); /* a short O_DIRECT write: the file system is full */
            else
                z->bytes += (uint64_t)res;
        }
        got += (unsigned)rc;
    }
    z->n = 0;
}

static void zb_add(struct file_prep *f, struct zero_batch *z, off_t off, size_t len)
{
    if (z->ctx == 0) {
        while (len > 0 && z->rc == 0) {
            ssize_t w = pwrite(f->fd, z->zeros, len, off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0 || w % PLX_BLOCK_SIZE != 0) {
                zb_error(z, w < 0 ? -errno : -EIO);
                break;
            }
            off += w;
            len -= (size_t)w;
            z->bytes += (uint64_t)w;
        }
        return;
    }
    if (z->n == PREP_IOCBS)
        zb_flush(z);
    io_prep_pwrite(&z->cbs[z->n++], f->fd, (void *)z->zeros, len, off);
}

/* Add zero writes over the holes of blocks [a, b) to z, whole blocks only. A hole reads as
 * zeros, so this changes no block's contents; the chunk is busy meanwhile, so no write of the
 * engine's is in flight there or starts there before z is flushed. */
static void zero_holes(struct file_prep *f, struct zero_batch *z, uint64_t a, uint64_t b)
{
    off_t pos = (off_t)(a * PLX_BLOCK_SIZE), end = (off_t)(b * PLX_BLOCK_SIZE);
    while (pos < end && z->rc == 0) {
        off_t h = lseek(f->fd, pos, SEEK_HOLE);
        if (h < 0) {
            if (errno != ENXIO)
                zb_error(z, -errno);
            return;
        }
        if (h >= end)
            return;
        off_t d = lseek(f->fd, h, SEEK_DATA);
        if (d < 0 && errno != ENXIO) {
            zb_error(z, -errno);
            return;
        }
        if (d < 0 || d > end)
            d = end; /* ENXIO: a hole up to the end of the file */
        off_t zs = (h + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
        off_t zend = d / PLX_BLOCK_SIZE * PLX_BLOCK_SIZE;
        while (zs < zend) {
            size_t len = (size_t)u64_min((uint64_t)(zend - zs), PREP_CHUNK * PLX_BLOCK_SIZE);
            zb_add(f, z, zs, len);
            zs += (off_t)len;
        }
        pos = d;
    }
}

/* Under prep_mu: the thread takes chunk i of r. */
static void prep_take(struct file_prep *f, struct prep_range *r, uint64_t i)
{
    if (r->state[i] == CH_URGENT) {
        f->prep_urgent--;
        f->prep_stats.urgent_zeroed++;
    }
    r->state[i] = CH_BUSY;
}

static void *prep_thread(void *arg)
{
    struct file_prep *f = arg;
    struct zero_batch *z = calloc(1, sizeof *z);
    void *zeros = plx_block_alloc(PREP_CHUNK);
    if (z != NULL) {
        z->zeros = zeros;
        if (io_setup(PREP_IOCBS, &z->ctx) != 0)
            z->ctx = 0; /* pwrite then: slower for the engine's writes, still correct */
    }
    pthread_mutex_lock(&f->prep_mu);
    for (;;) {
        struct prep_range *r = NULL, *rs[PREP_PARALLEL];
        uint64_t i = 0, is[PREP_PARALLEL];
        unsigned n = 0;
        while (!f->prep_stop && (f->prep_pause == 1 || !prep_pick(f, &r, &i))) {
            f->prep_idle = 1;
            uint64_t now = plx_mono_ns(), until = prep_aside_until(f, now);
            if (until != 0 && f->prep_pause != 1) {
                /* Standing aside for a stream: look again when its window ends (a write's
                 * completion or a new range wakes the thread sooner). */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                uint64_t ns = (uint64_t)ts.tv_nsec + (until - now) + 1000000u;
                ts.tv_sec += (time_t)(ns / 1000000000u);
                ts.tv_nsec = (long)(ns % 1000000000u);
                pthread_cond_timedwait(&f->prep_cv, &f->prep_mu, &ts);
            } else {
                pthread_cond_wait(&f->prep_cv, &f->prep_mu);
            }
            f->prep_idle = 0;
        }
        if (f->prep_stop)
            break;
        prep_take(f, r, i);
        rs[n] = r;
        is[n++] = i;
        if (f->prep_pause == 2) {
            /* Tests: stop inside the chunk, busy, until the pause is lifted. */
            f->prep_holding = 1;
            pthread_cond_broadcast(&f->prep_done_cv);
            while (f->prep_pause == 2 && !f->prep_stop)
                pthread_cond_wait(&f->prep_cv, &f->prep_mu);
            f->prep_holding = 0;
        } else {
            while (n < PREP_PARALLEL && prep_pick(f, &r, &i)) {
                prep_take(f, r, i);
                rs[n] = r;
                is[n++] = i;
            }
        }
        int rc = f->prep_fail_next;
        f->prep_fail_next = 0;
        uint64_t bytes = 0;
        pthread_mutex_unlock(&f->prep_mu);
        if (rc == 0 && z == NULL)
            rc = -ENOMEM;
        if (rc == 0) {
            z->rc = 0;
            z->bytes = 0;
            for (unsigned k = 0; k < n && z->rc == 0; k++) {
                uint64_t a, b;
                chunk_bounds(rs[k], rs[k]->c0 + is[k], &a, &b);
                zero_holes(f, z, a, b);
            }
            if (z->n > 0)
                zb_flush(z);
            rc = z->rc;
            bytes = z->bytes;
        }
        pthread_mutex_lock(&f->prep_mu);
        for (unsigned k = 0; k < n; k++) {
            rs[k]->state[is[k]] = CH_DONE;
            rs[k]->left--;
        }
        f->prep_stats.chunks_zeroed += n;
        f->prep_stats.bytes_zeroed += bytes;
        if (rc < 0 && !f->prep_error) {
            /* The medium refuses (EIO) or is full (ENOSPC): stop for good; the held writes go
             * ahead and meet the medium's answer themselves. */
            f->prep_error = rc;
            f->prep_stats.error = rc;
            prep_abandon(f);
            fprintf(stderr, "parallax: %s: zeroing ahead stopped: %s\n", f->be->desc,
                    strerror(-rc));
        }
        pthread_cond_broadcast(&f->prep_done_cv);
        if (f->prep_waiters)
            plx_efd_signal(f->efd);
    }
    pthread_mutex_unlock(&f->prep_mu);
    if (z != NULL && z->ctx != 0)
        io_destroy(z->ctx);
    free(z);
    plx_block_free(zeros);
    return NULL;
}

/* From poll: the held writes whose chunks are done, for poll to start; drop finished ranges. */
struct plx_io *plx_file_prep_release(struct file_prep *f)
{
    struct plx_io *go_head = NULL, *go_tail = NULL;
    pthread_mutex_lock(&f->prep_mu);
    struct plx_io *io = f->held_head;
    f->held_head = f->held_tail = NULL;
    uint64_t still = 0;
    while (io != NULL) {
        struct plx_io *next = io->be_next;
        io->be_next = NULL;
        struct plx_io **head = &go_head, **tail = &go_tail;
        if (prep_blocked(f, io->block, io->nblocks, 0)) {
            head = &f->held_head;
            tail = &f->held_tail;
            still++;
        }
        if (*tail != NULL)
            (*tail)->be_next = io;
        else
            *head = io;
        *tail = io;
        io = next;
    }
    f->prep_waiters = f->held_head != NULL;
    if (still != f->held_n)
        held_count(f, still);
    for (struct prep_range **rp = &f->prep_ranges; *rp != NULL;) {
        struct prep_range *r = *rp;
        if (r->left == 0) {
            *rp = r->next;
            free(r->state);
            free(r->writing);
            free(r);
        } else {
            rp = &r->next;
        }
    }
    pthread_mutex_unlock(&f->prep_mu);
    return go_head;
}

int plx_file_prep_add(struct file_prep *f, uint64_t first, uint64_t nblocks)
{
    const plx_backend *be = f->be;
    if (!f->prep_ok)
        return -EOPNOTSUPP;
    if (first > be->nblocks || nblocks > be->nblocks - first)
        return -EINVAL;
    if (nblocks == 0)
        return 0;
    pthread_mutex_lock(&f->prep_mu);
    int err = f->prep_error;
    pthread_mutex_unlock(&f->prep_mu);
    if (err)
        return err;
    struct prep_range *r = calloc(1, sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    r->first = first;
    r->end = first + nblocks;
    r->c0 = first / PREP_CHUNK;
    r->nchunks = (r->end - 1) / PREP_CHUNK - r->c0 + 1;
    r->left = r->nchunks;
    r->state = malloc(r->nchunks);
    r->writing = calloc(r->nchunks, sizeof *r->writing);
    if (r->state == NULL || r->writing == NULL) {
        free(r->state);
        free(r->writing);
        free(r);
        return -ENOMEM;
    }
    memset(r->state, CH_PENDING, r->nchunks);
    if (!f->prep_started) {
        const char *w = getenv("PARALLAX_ZERO_WAIT");
        f->prep_wait_all = w != NULL && strcmp(w, "1") == 0;
        /* How long after the last stream the thread stands aside ("Streams" above); 0 never
         * (measurements: zeroing ahead as before 2026-11-26's evening). */
        const char *sm = getenv("PARALLAX_ZERO_STREAM_MS");
        f->prep_stream_ns = (sm != NULL && *sm != '\0' ? strtoull(sm, NULL, 10) : 200) * 1000000u;
        int rc = pthread_create(&f->prep_thr, NULL, prep_thread, f);
        if (rc != 0) {
            free(r->state);
            free(r->writing);
            free(r);
            return -rc;
        }
        f->prep_started = 1;
    }
    pthread_mutex_lock(&f->prep_mu);
    struct prep_range **tail = &f->prep_ranges;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = r;
    pthread_cond_signal(&f->prep_cv);
    pthread_mutex_unlock(&f->prep_mu);
    return 0;
}

void plx_file_prep_stop(struct file_prep *f, uint64_t first, uint64_t nblocks)
{
    if (!f->prep_started)
        return;
    uint64_t end = first + nblocks;
    pthread_mutex_lock(&f->prep_mu);
    for (;;) {
        int busy = 0;
        for (struct prep_range *r = f->prep_ranges; r != NULL; r = r->next) {
            if (r->left == 0 || end <= r->first || first >= r->end)
                continue;
            uint64_t lo = u64_max(first, r->first), hi = u64_min(end, r->end);
            for (uint64_t k = lo / PREP_CHUNK; k <= (hi - 1) / PREP_CHUNK; k++) {
                uint64_t i = k - r->c0;
                if (r->state[i] == CH_BUSY)
                    busy = 1;
                else if (r->state[i] != CH_DONE)
                    chunk_set_done(f, r, i);
            }
        }
        if (!busy)
            break;
        pthread_cond_wait(&f->prep_done_cv, &f->prep_mu);
    }
    pthread_mutex_unlock(&f->prep_mu);
    /* Writes held in the range may go now: let the next poll start them. */
    if (f->held_head != NULL)
        plx_efd_signal(f->efd);
}

void plx_file_prep_stats(struct file_prep *f, struct plx_prepare_stats *out)
{
    pthread_mutex_lock(&f->prep_mu);
    *out = f->prep_stats;
    for (const struct prep_range *r = f->prep_ranges; r != NULL; r = r->next)
        out->chunks_pending += r->left;
    pthread_mutex_unlock(&f->prep_mu);
}

void plx_file_prep_test(struct file_prep *f, int fail_next, int pause)
{
    pthread_mutex_lock(&f->prep_mu);
    if (fail_next)
        f->prep_fail_next = fail_next;
    if (pause == 3) {
        /* Wait (at most 10 s) until the thread holds a chunk under pause 2. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        while (!f->prep_holding &&
               pthread_cond_timedwait(&f->prep_done_cv, &f->prep_mu, &until) == 0)
            ;
    } else {
        f->prep_pause = pause;
        pthread_cond_broadcast(&f->prep_cv);
    }
    pthread_mutex_unlock(&f->prep_mu);
}

void plx_file_prep_init(struct file_prep *f, const plx_backend *be, int fd, int efd, int ok)
{
    f->be = be;
    f->fd = fd;
    f->efd = efd;
    f->prep_ok = ok;
    pthread_mutex_init(&f->prep_mu, NULL);
    pthread_cond_init(&f->prep_cv, NULL);
    pthread_cond_init(&f->prep_done_cv, NULL);
}

void plx_file_prep_shutdown(struct file_prep *f)
{
    const char *say = getenv("PARALLAX_PREP_STATS");
    if (f->prep_started && say != NULL && strcmp(say, "1") == 0) {
        /* Measurements (bench/zero-ab.sh): what zeroing ahead did and what it cost the writes. */
        const struct plx_prepare_stats *ps = &f->prep_stats;
        fprintf(stderr,
                "parallax: %s: zeroing ahead: %llu chunks zeroed (%llu urgent, %llu MiB of "
                "zeros), %llu covered by writes; %llu writes waited %.3f s in all (at most %llu "
                "at once); writes into chunks not done: %llu streamed, %llu small\n",
                f->be->desc, (unsigned long long)ps->chunks_zeroed,
                (unsigned long long)ps->urgent_zeroed, (unsigned long long)(ps->bytes_zeroed >> 20),
                (unsigned long long)ps->chunks_covered, (unsigned long long)ps->writes_waited,
                (double)ps->wait_ns / 1e9, (unsigned long long)ps->held_max,
                (unsigned long long)ps->writes_streamed, (unsigned long long)ps->writes_random);
    }
    if (f->prep_started) {
        /* The chunks being zeroed are finished (at most 8 MiB of zero writes); the rest stays
         * holes. */
        pthread_mutex_lock(&f->prep_mu);
        f->prep_stop = 1;
        pthread_cond_broadcast(&f->prep_cv);
        pthread_mutex_unlock(&f->prep_mu);
        pthread_join(f->prep_thr, NULL);
    }
    while (f->prep_ranges != NULL) {
        struct prep_range *r = f->prep_ranges;
        f->prep_ranges = r->next;
        free(r->state);
        free(r->writing);
        free(r);
    }
    pthread_cond_destroy(&f->prep_cv);
    pthread_cond_destroy(&f->prep_done_cv);
    pthread_mutex_destroy(&f->prep_mu);
}
