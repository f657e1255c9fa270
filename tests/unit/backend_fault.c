/*
 * backend_fault.c - the fault-injection and crash-simulation backend (test builds only).
 *
 * The medium tests read back through the backend is the cache's view (every completed write
 * applied). Separately, every write and flush is logged, with the written data shared by
 * reference with the medium; a crash cursor replays the log to rebuild what a power failure at
 * any log position could leave behind.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "backend_done.h"
#include "backend_fault.h"
#include "backend_mem_shared.h"

enum ev_type {
    EV_WRITE_SUBMIT,
    EV_WRITE_DONE,
    EV_FLUSH_SUBMIT,
    EV_FLUSH_DONE,
};

struct fault_event {
    enum ev_type type;
    int fua;
    uint32_t nblocks;
    uint64_t block;
    uint64_t id;           /* write or flush number, dense over the logged ones */
    struct plx_blk **data; /* EV_WRITE_SUBMIT: one reference per block */
};

struct fail_rule {
    enum plx_io_op op;
    uint64_t first, count;
    int err;
    int times; /* -1 = forever */
};

struct nth_rule {
    uint64_t seq; /* absolute io number */
    int err;
};

/* The backend's per-I/O state while in flight; plx_io has no room for it. */
struct fault_req {
    struct plx_done done; /* first: the I/O, its status, the queue's link (backend_done.h) */
    uint64_t id;
    uint64_t ev; /* writes: log index of the submission, which holds the data */
    uint64_t release_ns; /* held I/O: carried out by a waiting poll after this time */
    struct fault_req *next; /* the held list */
};

struct fault_backend {
    plx_backend base;
    struct plx_blk_table *initial; /* the medium at creation: where cursors start */
    struct plx_blk_table *cur;     /* what reads see */
    struct plx_done_queue q;       /* the completion eventfd and what the next poll carries out */
    unsigned inflight;
    int admin_locked; /* the medium's admin lock */

    struct fault_event *log;
    uint64_t log_len, log_cap;
    uint64_t nwrites, nflushes;

    uint64_t io_count, errors;
    uint64_t urgent_writes; /* writes submitted with PLX_IO_URGENT */
    uint64_t fua_writes;    /* writes submitted with PLX_IO_FUA */
    struct nth_rule *nth;
    size_t nnth;
    struct fail_rule *rules;
    size_t nrules;

    struct fail_rule hold; /* hold.times != 0: I/O it matches is held (err unused) */
    int hold_max_ms;
    struct fault_req *held_head, *held_tail;
    unsigned nheld;
};

static const struct plx_backend_ops fault_ops;

static void *xrealloc(void *p, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        fprintf(stderr, "parallax: allocation of %zu x %zu bytes overflows\n", n, size);
        abort();
    }
    size_t len = n * size;
    void *q = realloc(p, len != 0 ? len : 1);
    if (q == NULL) {
        fprintf(stderr, "parallax: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return q;
}

static struct fault_backend *fault_of(const plx_backend *be)
{
    if (be == NULL || be->ops != &fault_ops) {
        fprintf(stderr, "parallax: fault-backend call on a backend that is not one\n");
        abort();
    }
    return (struct fault_backend *)be;
}

static struct fault_event *log_append(struct fault_backend *f, enum ev_type type)
{
    if (f->log_len == f->log_cap) {
        f->log_cap = f->log_cap ? f->log_cap * 2 : 256;
        f->log = xrealloc(f->log, f->log_cap, sizeof(*f->log));
    }
    struct fault_event *ev = &f->log[f->log_len++];
    memset(ev, 0, sizeof(*ev));
    ev->type = type;
    return ev;
}

/* ---- Error injection ------------------------------------------------------------------------- */

static int overlaps(const struct fail_rule *r, const struct plx_io *io)
{
    /* A flush touches no block, so a flush rule matches every flush whatever its range: that is
     * the only way to make flushes fail selectively. */
    if (io->op == PLX_IO_FLUSH)
        return 1;
    uint64_t end = io->block + io->nblocks;
    uint64_t rend = r->count > UINT64_MAX - r->first ? UINT64_MAX : r->first + r->count;
    return io->block < rend && r->first < end;
}

static int injected_error(struct fault_backend *f, const struct plx_io *io, uint64_t seq)
{
    for (size_t i = 0; i < f->nnth; i++) {
        if (f->nth[i].seq == seq) {
            int err = f->nth[i].err;
            f->nth[i] = f->nth[--f->nnth];
            return err;
        }
    }
    for (size_t i = 0; i < f->nrules; i++) {
        struct fail_rule *r = &f->rules[i];
        if (r->op != io->op || r->times == 0 || !overlaps(r, io))
            continue;
        int err = r->err;
        if (r->times > 0 && --r->times == 0)
            f->rules[i--] = f->rules[--f->nrules];
        return err;
    }
    return 0;
}

void plx_fault_fail_nth(plx_backend *be, uint64_t n, int err)
{
    struct fault_backend *f = fault_of(be);
    if (n == 0)
        return;
    f->nth = xrealloc(f->nth, f->nnth + 1, sizeof(*f->nth));
    f->nth[f->nnth++] = (struct nth_rule){.seq = f->io_count + n, .err = err};
}

void plx_fault_fail_blocks(plx_backend *be, enum plx_io_op op, uint64_t first, uint64_t count,
                           int err, int times)
{
    struct fault_backend *f = fault_of(be);
    if (times == 0 || (count == 0 && op != PLX_IO_FLUSH))
        return;
    f->rules = xrealloc(f->rules, f->nrules + 1, sizeof(*f->rules));
    f->rules[f->nrules++] = (struct fail_rule){
        .op = op, .first = first, .count = count, .err = err, .times = times < 0 ? -1 : times};
}

void plx_fault_clear(plx_backend *be)
{
    struct fault_backend *f = fault_of(be);
    f->nnth = 0;
    f->nrules = 0;
}

uint64_t plx_fault_io_count(const plx_backend *be)
{
    return fault_of(be)->io_count;
}

uint64_t plx_fault_urgent_writes(const plx_backend *be)
{
    return fault_of(be)->urgent_writes;
}

void plx_fault_counts(const plx_backend *be, uint64_t *writes, uint64_t *fua_writes,
                      uint64_t *flushes)
{
    const struct fault_backend *f = fault_of(be);
    *writes = f->nwrites;
    *fua_writes = f->fua_writes;
    *flushes = f->nflushes;
}

uint64_t plx_fault_errors_injected(const plx_backend *be)
{
    return fault_of(be)->errors;
}

/* ---- Holding I/O ---------------------------------------------------------------------------- */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void plx_fault_hold_blocks(plx_backend *be, enum plx_io_op op, uint64_t first, uint64_t count,
                           int max_ms)
{
    struct fault_backend *f = fault_of(be);
    f->hold = (struct fail_rule){.op = op, .first = first, .count = count, .times = -1};
    f->hold_max_ms = max_ms;
}

static void queue_req(struct fault_backend *f, struct fault_req *r)
{
    plx_done_push(&f->q.ready, &r->done);
}

/* Move held I/O whose time has come (all of it when `all`) to the queue; how many moved. */
static unsigned unhold(struct fault_backend *f, bool all)
{
    uint64_t now = all ? 0 : mono_ns();
    struct fault_req **pp = &f->held_head, *last = NULL;
    unsigned moved = 0;
    while (*pp != NULL) {
        struct fault_req *r = *pp;
        if (all || now >= r->release_ns) {
            *pp = r->next;
            queue_req(f, r);
            f->nheld--;
            moved++;
        } else {
            last = r;
            pp = &r->next;
        }
    }
    f->held_tail = last;
    return moved;
}

void plx_fault_release(plx_backend *be)
{
    struct fault_backend *f = fault_of(be);
    f->hold.times = 0;
    if (unhold(f, true))
        plx_efd_signal(f->q.efd);
}

unsigned plx_fault_held(const plx_backend *be)
{
    return fault_of(be)->nheld;
}

/* ---- The backend ----------------------------------------------------------------------------- */

static int fault_submit(plx_backend *be, struct plx_io *io)
{
    struct fault_backend *f = (struct fault_backend *)be;
    int rc = plx_backend_check_io(be, io);
    if (rc < 0)
        return rc;

    struct fault_req *r = xrealloc(NULL, 1, sizeof(*r));
    memset(r, 0, sizeof(*r));
    r->done.io = io;
    r->done.status = injected_error(f, io, ++f->io_count);
    if (r->done.status != 0) {
        /* A failed I/O leaves no trace in the log: it never reached the medium, so no crash
         * image may contain it. */
        f->errors++;
    } else if (io->op == PLX_IO_WRITE) {
        f->urgent_writes += (io->flags & PLX_IO_URGENT) != 0;
        f->fua_writes += (io->flags & PLX_IO_FUA) != 0;
        /* Copied now: a crash before completion may still have landed the data as it was at
         * submission. */
        r->ev = f->log_len;
        struct fault_event *ev = log_append(f, EV_WRITE_SUBMIT);
        const unsigned char *p = io->buf;
        ev->fua = (io->flags & PLX_IO_FUA) != 0;
        ev->block = io->block;
        ev->nblocks = io->nblocks;
        ev->id = r->id = f->nwrites++;
        ev->data = xrealloc(NULL, io->nblocks, sizeof(*ev->data));
        for (uint32_t i = 0; i < io->nblocks; i++)
            ev->data[i] = plx_blk_new(p + (size_t)i * PLX_BLOCK_SIZE);
    } else if (io->op == PLX_IO_FLUSH) {
        struct fault_event *ev = log_append(f, EV_FLUSH_SUBMIT);
        ev->id = r->id = f->nflushes++;
    }

    f->inflight++;
    if (r->done.status == 0 && f->hold.times != 0 && io->op == f->hold.op &&
        overlaps(&f->hold, io)) {
        r->release_ns = mono_ns() + (uint64_t)f->hold_max_ms * 1000000u;
        if (f->held_tail != NULL)
            f->held_tail->next = r;
        else
            f->held_head = r;
        f->held_tail = r;
        f->nheld++;
        return 0;
    }
    queue_req(f, r);
    plx_efd_signal(f->q.efd);
    return 0;
}

static void fault_execute(struct fault_backend *f, struct fault_req *r)
{
    struct plx_io *io = r->done.io;
    unsigned char *p = io->buf;

    switch (io->op) {
    case PLX_IO_READ:
        for (uint32_t i = 0; i < io->nblocks; i++) {
            const void *d = plx_blk_data(plx_blk_table_get(f->cur, io->block + i));
            if (d != NULL)
                memcpy(p + (size_t)i * PLX_BLOCK_SIZE, d, PLX_BLOCK_SIZE);
            else
                memset(p + (size_t)i * PLX_BLOCK_SIZE, 0, PLX_BLOCK_SIZE);
        }
        break;
    case PLX_IO_WRITE: {
        const struct fault_event *sub = &f->log[r->ev];
        for (uint32_t i = 0; i < io->nblocks; i++)
            plx_blk_table_set(f->cur, io->block + i, plx_blk_ref(sub->data[i]));
        struct fault_event *ev = log_append(f, EV_WRITE_DONE);
        ev->id = r->id;
        ev->fua = (io->flags & PLX_IO_FUA) != 0;
        break;
    }
    case PLX_IO_FLUSH:
        log_append(f, EV_FLUSH_DONE)->id = r->id;
        break;
    case PLX_IO_TRIM: /* refused at submit */
        break;
    }
}

/* A delivered request (plx_done_deliver): carried out now, just before its callback. */
static void fault_release(void *arg, struct plx_done *d)
{
    struct fault_backend *f = arg;
    struct fault_req *r = (struct fault_req *)(void *)d;
    if (d->status == 0)
        fault_execute(f, r);
    d->io->be_next = NULL;
    free(r);
    f->inflight--;
}

static int fault_poll(plx_backend *be, int timeout_ms)
{
    struct fault_backend *f = (struct fault_backend *)be;

    /* As for the memory backend: everything queued is complete, and only what was queued
     * before this call is delivered. */
    plx_efd_drain(f->q.efd);
    /* A caller that waits (timeout != 0) for held I/O only gets it after its hold time: a
     * blocking caller is delayed, not stuck. */
    unhold(f, false);
    while (timeout_ms != 0 && f->q.ready.head == NULL && f->held_head != NULL) {
        usleep(1000);
        unhold(f, false);
    }
    return plx_done_deliver(&f->q, fault_release, f);
}

static int fault_fd(const plx_backend *be)
{
    return ((const struct fault_backend *)be)->q.efd;
}

static unsigned fault_inflight(const plx_backend *be)
{
    return ((const struct fault_backend *)be)->inflight;
}

static void fault_destroy(plx_backend *be)
{
    struct fault_backend *f = (struct fault_backend *)be;
    if (f == NULL)
        return;
    unhold(f, true);
    struct plx_done *d;
    while ((d = plx_done_pop(&f->q.ready)) != NULL)
        free(d);
    for (uint64_t i = 0; i < f->log_len; i++) {
        if (f->log[i].data == NULL)
            continue;
        for (uint32_t j = 0; j < f->log[i].nblocks; j++)
            plx_blk_unref(f->log[i].data[j]);
        free(f->log[i].data);
    }
    free(f->log);
    free(f->nth);
    free(f->rules);
    plx_blk_table_free(f->initial);
    plx_blk_table_free(f->cur);
    plx_done_close(&f->q);
    free(f);
}

static int fault_lock(plx_backend *be, int take)
{
    struct fault_backend *f = (struct fault_backend *)be;
    if (take && f->admin_locked)
        return -EWOULDBLOCK;
    f->admin_locked = take != 0;
    return 0;
}

static const struct plx_backend_ops fault_ops = {
    .submit = fault_submit,
    .poll = fault_poll,
    .fd = fault_fd,
    .inflight = fault_inflight,
    .destroy = fault_destroy,
    .lock = fault_lock,
};

plx_backend *plx_fault_create(const plx_backend *initial, uint64_t nblocks)
{
    struct plx_blk_table *src = NULL;
    if (initial != NULL) {
        src = plx_backend_mem_table(initial);
        if (src == NULL && initial->ops == &fault_ops)
            src = ((const struct fault_backend *)initial)->cur;
        if (src == NULL) {
            fprintf(stderr, "parallax: plx_fault_create: initial is not a memory backend\n");
            return NULL;
        }
    }
    struct fault_backend *f = xrealloc(NULL, 1, sizeof(*f));
    memset(f, 0, sizeof(*f));
    if (plx_done_open(&f->q) < 0) {
        perror("parallax: eventfd");
        free(f);
        return NULL;
    }
    f->initial = src != NULL ? plx_blk_table_clone(src) : plx_blk_table_new(nblocks);
    f->cur = plx_blk_table_clone(f->initial);
    f->base.ops = &fault_ops;
    f->base.nblocks = plx_blk_table_nblocks(f->initial);
    snprintf(f->base.desc, sizeof(f->base.desc), "fault-injection memory");
    return &f->base;
}

/* ---- Crash cursor ---------------------------------------------------------------------------- */

/*
 * The cursor keeps, at its position, the durable image and for every block the writes to it that
 * may or may not have landed ("pending"), oldest first. When a write becomes durable on a block,
 * it and every older pending write to that block leave the list: the cache would never write an
 * older version back over a newer one that reached the medium. An image is then the durable
 * table plus, per block, some pending writes applied in submission order.
 */

struct unit {
    struct plx_blk *data; /* borrowed from the log */
    uint64_t write_id;
    uint64_t block;
    struct unit *next; /* in the block's pending list */
    int alive;
};

struct wrec {
    struct unit *units;
    uint32_t n;
    uint32_t live;
};

struct pend_slot {
    uint64_t block;
    struct unit *head, *tail;
    int used;
};

struct plx_crash_cursor {
    const struct fault_backend *f;
    uint64_t pos;
    uint64_t pending;
    struct plx_blk_table *durable;

    struct wrec *writes; /* indexed by write id */
    uint64_t nwrites;
    uint64_t *completed; /* non-FUA write ids in completion order */
    uint64_t ncompleted, qhead;
    uint64_t *cover; /* by flush id: writes completed[0..cover) precede the flush */
    uint64_t ncover;

    struct pend_slot *map; /* open addressing by block */
    size_t map_cap, map_used;
};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static struct pend_slot *map_slot(struct plx_crash_cursor *c, uint64_t block)
{
    if (2 * (c->map_used + 1) > c->map_cap) {
        size_t ocap = c->map_cap;
        struct pend_slot *old = c->map;
        c->map_cap = ocap ? ocap * 2 : 1024;
        c->map = xrealloc(NULL, c->map_cap, sizeof(*c->map));
        memset(c->map, 0, c->map_cap * sizeof(*c->map));
        for (size_t i = 0; i < ocap; i++) {
            if (!old[i].used)
                continue;
            size_t j = mix64(old[i].block) & (c->map_cap - 1);
            while (c->map[j].used)
                j = (j + 1) & (c->map_cap - 1);
            c->map[j] = old[i];
        }
        free(old);
    }
    size_t j = mix64(block) & (c->map_cap - 1);
    while (c->map[j].used && c->map[j].block != block)
        j = (j + 1) & (c->map_cap - 1);
    if (!c->map[j].used) {
        c->map[j].used = 1;
        c->map[j].block = block;
        c->map_used++;
    }
    return &c->map[j];
}

static void unit_durable(struct plx_crash_cursor *c, struct unit *u)
{
    if (!u->alive)
        return; /* a newer write to the block is already durable */
    struct pend_slot *s = map_slot(c, u->block);
    while (s->head != NULL && s->head->write_id <= u->write_id) {
        struct unit *v = s->head;
        s->head = v->next;
        v->alive = 0;
        if (--c->writes[v->write_id].live == 0)
            c->pending--;
    }
    if (s->head == NULL)
        s->tail = NULL;
    plx_blk_table_set(c->durable, u->block, plx_blk_ref(u->data));
}

static void write_durable(struct plx_crash_cursor *c, uint64_t id)
{
    struct wrec *w = &c->writes[id];
    for (uint32_t i = 0; i < w->n; i++)
        unit_durable(c, &w->units[i]);
}

static void cursor_apply(struct plx_crash_cursor *c, const struct fault_event *ev)
{
    switch (ev->type) {
    case EV_WRITE_SUBMIT: {
        if (c->nwrites % 256 == 0)
            c->writes = xrealloc(c->writes, c->nwrites + 256, sizeof(*c->writes));
        struct wrec *w = &c->writes[c->nwrites++];
        w->n = w->live = ev->nblocks;
        w->units = xrealloc(NULL, ev->nblocks, sizeof(*w->units));
        for (uint32_t i = 0; i < ev->nblocks; i++) {
            struct unit *u = &w->units[i];
            *u = (struct unit){
                .data = ev->data[i], .write_id = ev->id, .block = ev->block + i, .alive = 1};
            struct pend_slot *s = map_slot(c, u->block);
            if (s->tail != NULL)
                s->tail->next = u;
            else
                s->head = u;
            s->tail = u;
        }
        c->pending++;
        break;
    }
    case EV_WRITE_DONE:
        if (ev->fua) {
            write_durable(c, ev->id);
        } else {
            if (c->ncompleted % 256 == 0)
                c->completed = xrealloc(c->completed, c->ncompleted + 256, sizeof(*c->completed));
            c->completed[c->ncompleted++] = ev->id;
        }
        break;
    case EV_FLUSH_SUBMIT:
        if (c->ncover % 256 == 0)
            c->cover = xrealloc(c->cover, c->ncover + 256, sizeof(*c->cover));
        c->cover[c->ncover++] = c->ncompleted;
        break;
    case EV_FLUSH_DONE:
        while (c->qhead < c->cover[ev->id])
            write_durable(c, c->completed[c->qhead++]);
        break;
    }
}

static void cursor_release(struct plx_crash_cursor *c)
{
    for (uint64_t i = 0; i < c->nwrites; i++)
        free(c->writes[i].units);
    free(c->writes);
    free(c->completed);
    free(c->cover);
    free(c->map);
    plx_blk_table_free(c->durable);
}

static void cursor_reset(struct plx_crash_cursor *c)
{
    const struct fault_backend *f = c->f;
    cursor_release(c);
    memset(c, 0, sizeof(*c));
    c->f = f;
    c->durable = plx_blk_table_clone(f->initial);
}

/* The cursor reads the backend's log as it moves (the log may still grow), so the backend must
 * outlive it; images made from it need neither. */
struct plx_crash_cursor *plx_crash_cursor_new(const plx_backend *fault)
{
    struct plx_crash_cursor *c = xrealloc(NULL, 1, sizeof(*c));
    memset(c, 0, sizeof(*c));
    c->f = fault_of(fault);
    c->durable = plx_blk_table_clone(c->f->initial);
    return c;
}

void plx_crash_cursor_free(struct plx_crash_cursor *c)
{
    if (c == NULL)
        return;
    cursor_release(c);
    free(c);
}

void plx_crash_cursor_seek(struct plx_crash_cursor *c, uint64_t pos)
{
    if (pos > c->f->log_len) {
        fprintf(stderr, "parallax: crash cursor seek to %llu beyond the log (%llu events)\n",
                (unsigned long long)pos, (unsigned long long)c->f->log_len);
        abort();
    }
    /* Going back is allowed but costs a replay from the start. */
    if (pos < c->pos)
        cursor_reset(c);
    while (c->pos < pos)
        cursor_apply(c, &c->f->log[c->pos++]);
}

uint64_t plx_crash_cursor_pending(const struct plx_crash_cursor *c)
{
    return c->pending;
}

plx_backend *plx_crash_cursor_image(struct plx_crash_cursor *c, enum plx_crash_mode mode,
                                    uint64_t seed)
{
    struct plx_blk_table *t = plx_blk_table_clone(c->durable);
    if (mode != PLX_CRASH_DROP_UNFLUSHED) {
        for (size_t i = 0; i < c->map_cap; i++) {
            const struct pend_slot *s = &c->map[i];
            if (!s->used || s->head == NULL)
                continue;
            const struct unit *pick = NULL;
            if (mode == PLX_CRASH_KEEP_ALL) {
                pick = s->tail;
            } else {
                /* One coin per block of each write, derived from (seed, write, block) rather
                 * than drawn in sequence, so an image depends only on the seed and not on the
                 * hash table's layout. A multi-block write may land partly: only single blocks
                 * are atomic. */
                for (const struct unit *u = s->head; u != NULL; u = u->next)
                    if (mix64(seed ^ mix64(u->write_id * 0x9e3779b97f4a7c15ull + u->block)) & 1)
                        pick = u;
            }
            if (pick != NULL)
                plx_blk_table_set(t, pick->block, plx_blk_ref(pick->data));
        }
    }
    return plx_backend_mem_from_table(t);
}

uint64_t plx_fault_log_position(const plx_backend *be)
{
    return fault_of(be)->log_len;
}

uint64_t plx_fault_crash_points(const plx_backend *be, uint64_t *out, uint64_t max)
{
    const struct fault_backend *f = fault_of(be);
    /* Every logged event is a write or flush being submitted or completed, so each position
     * just after one is a crash point. */
    for (uint64_t i = 0; i < f->log_len && i < max; i++)
        out[i] = i + 1;
    return f->log_len;
}

uint64_t plx_fault_points_near_writes(const plx_backend *be, uint64_t first, uint64_t count,
                                      uint64_t *out, uint64_t max)
{
    const struct fault_backend *f = fault_of(be);
    uint64_t n = 0;
#define ADD_POINT(p)                                                                               \
    do {                                                                                           \
        if (n < max)                                                                               \
            out[n] = (p);                                                                          \
        n++;                                                                                       \
    } while (0)
    for (uint64_t i = 0; i < f->log_len; i++) {
        const struct fault_event *ev = &f->log[i];
        if (ev->type != EV_WRITE_SUBMIT || ev->block >= first + count ||
            ev->block + ev->nblocks <= first)
            continue;
        ADD_POINT(i); /* just before the submission */
        ADD_POINT(i + 1);
        bool done = false, flush_submitted = false;
        uint64_t flush_id = 0;
        for (uint64_t j = i + 1; j < f->log_len; j++) {
            const struct fault_event *e2 = &f->log[j];
            if (!done && e2->type == EV_WRITE_DONE && e2->id == ev->id) {
                done = true;
                ADD_POINT(j + 1);
            } else if (done && !flush_submitted && e2->type == EV_FLUSH_SUBMIT) {
                flush_submitted = true;
                flush_id = e2->id;
                ADD_POINT(j + 1);
            } else if (flush_submitted && e2->type == EV_FLUSH_DONE && e2->id == flush_id) {
                ADD_POINT(j + 1);
                break;
            }
        }
    }
#undef ADD_POINT
    return n;
}
