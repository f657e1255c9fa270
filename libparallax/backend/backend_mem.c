/*
 * backend_mem.c - the memory backend and the copy-on-write block table behind it.
 */
#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "backend_done.h"
#include "backend_mem_shared.h"

/* ---- Refcounted blocks ----------------------------------------------------------------------- */

struct plx_blk {
    atomic_uint refs;
    alignas(16) unsigned char data[PLX_BLOCK_SIZE];
};

static void *xmalloc(size_t len)
{
    void *p = malloc(len);
    if (p == NULL) {
        fprintf(stderr, "parallax: out of memory allocating %zu bytes\n", len);
        abort();
    }
    return p;
}

static void *xcalloc(size_t n, size_t len)
{
    void *p = calloc(n ? n : 1, len);
    if (p == NULL) {
        fprintf(stderr, "parallax: out of memory allocating %zu x %zu bytes\n", n, len);
        abort();
    }
    return p;
}

static int all_zero(const void *data)
{
    const uint64_t *w = data;
    for (size_t i = 0; i < PLX_BLOCK_SIZE / sizeof(*w); i++)
        if (w[i] != 0)
            return 0;
    return 1;
}

struct plx_blk *plx_blk_new(const void *data)
{
    /* Zero blocks are stored as NULL so that a large, sparsely written medium stays small. */
    if (data == NULL || all_zero(data))
        return NULL;
    struct plx_blk *b = xmalloc(sizeof(*b));
    atomic_init(&b->refs, 1);
    memcpy(b->data, data, PLX_BLOCK_SIZE);
    return b;
}

struct plx_blk *plx_blk_ref(struct plx_blk *b)
{
    if (b != NULL)
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void plx_blk_unref(struct plx_blk *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

const void *plx_blk_data(const struct plx_blk *b)
{
    return b != NULL ? b->data : NULL;
}

/* ---- Copy-on-write block tables -------------------------------------------------------------- */

#define CHUNK_SHIFT 9
#define CHUNK_BLOCKS (1u << CHUNK_SHIFT)

struct blk_chunk {
    atomic_uint refs;
    struct plx_blk *b[CHUNK_BLOCKS];
};

struct plx_blk_table {
    uint64_t nblocks;
    size_t nchunks;
    struct blk_chunk **chunks; /* NULL = a chunk of zeros */
};

static void chunk_unref(struct blk_chunk *c)
{
    if (c == NULL || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (unsigned i = 0; i < CHUNK_BLOCKS; i++)
        plx_blk_unref(c->b[i]);
    free(c);
}

struct plx_blk_table *plx_blk_table_new(uint64_t nblocks)
{
    struct plx_blk_table *t = xcalloc(1, sizeof(*t));
    t->nblocks = nblocks;
    t->nchunks = (size_t)((nblocks + CHUNK_BLOCKS - 1) >> CHUNK_SHIFT);
    t->chunks = xcalloc(t->nchunks, sizeof(*t->chunks));
    return t;
}

struct plx_blk_table *plx_blk_table_clone(const struct plx_blk_table *t)
{
    struct plx_blk_table *n = plx_blk_table_new(t->nblocks);
    for (size_t i = 0; i < t->nchunks; i++) {
        n->chunks[i] = t->chunks[i];
        if (n->chunks[i] != NULL)
            atomic_fetch_add_explicit(&n->chunks[i]->refs, 1, memory_order_relaxed);
    }
    return n;
}

void plx_blk_table_free(struct plx_blk_table *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nchunks; i++)
        chunk_unref(t->chunks[i]);
    free(t->chunks);
    free(t);
}

uint64_t plx_blk_table_nblocks(const struct plx_blk_table *t)
{
    return t->nblocks;
}

struct plx_blk *plx_blk_table_get(const struct plx_blk_table *t, uint64_t addr)
{
    if (addr >= t->nblocks)
        return NULL;
    const struct blk_chunk *c = t->chunks[addr >> CHUNK_SHIFT];
    return c != NULL ? c->b[addr & (CHUNK_BLOCKS - 1)] : NULL;
}

void plx_blk_table_set(struct plx_blk_table *t, uint64_t addr, struct plx_blk *b)
{
    if (addr >= t->nblocks) {
        plx_blk_unref(b);
        return;
    }
    struct blk_chunk **slot = &t->chunks[addr >> CHUNK_SHIFT];
    struct blk_chunk *c = *slot;
    unsigned i = addr & (CHUNK_BLOCKS - 1);

    if (c == NULL) {
        if (b == NULL)
            return;
        c = xcalloc(1, sizeof(*c));
        atomic_init(&c->refs, 1);
        *slot = c;
    } else if (atomic_load_explicit(&c->refs, memory_order_acquire) != 1) {
        /* Shared with another table: that table must keep seeing the old contents. A refcount
         * of 1 cannot rise under us, since only this table can reach the chunk. */
        struct blk_chunk *copy = xmalloc(sizeof(*copy));
        atomic_init(&copy->refs, 1);
        for (unsigned j = 0; j < CHUNK_BLOCKS; j++)
            copy->b[j] = plx_blk_ref(c->b[j]);
        chunk_unref(c);
        c = copy;
        *slot = c;
    }
    struct plx_blk *old = c->b[i];
    c->b[i] = b;
    plx_blk_unref(old);
}

/* ---- The memory backend ---------------------------------------------------------------------- */

struct mem_backend {
    plx_backend base;
    struct plx_blk_table *tab;
    int efd;
    unsigned inflight;
    struct plx_io *head, *tail; /* submitted, delivered by the next poll */
    int admin_locked;           /* the medium's admin lock (stores sharing it see it) */
};

static const struct plx_backend_ops mem_ops;

int plx_backend_check_io(const plx_backend *be, const struct plx_io *io)
{
    if (io == NULL || io->done == NULL)
        return -EINVAL;
    switch (io->op) {
    case PLX_IO_FLUSH:
        return 0;
    case PLX_IO_TRIM:
        /* Optional (backend.h); a backend that discards checks the range itself. */
        return -EOPNOTSUPP;
    case PLX_IO_READ:
    case PLX_IO_WRITE:
        if (io->nblocks == 0 || io->buf == NULL || io->nblocks > be->nblocks ||
            io->block > be->nblocks - io->nblocks)
            return -EINVAL;
        /* The memory media do not need alignment, but enforcing it here catches engine bugs
         * that would otherwise only show with O_DIRECT on a real device: a block, or for
         * PLX_IO_DIRECT what plx_backend_dio_align says of a memory medium. */
        if ((uintptr_t)io->buf % ((io->flags & PLX_IO_DIRECT) ? PLX_MEM_DIO_ALIGN : PLX_BLOCK_SIZE))
            return -EINVAL;
        return 0;
    }
    return -EINVAL;
}

static int mem_submit(plx_backend *be, struct plx_io *io)
{
    struct mem_backend *m = (struct mem_backend *)be;
    int rc = plx_backend_check_io(be, io);
    if (rc < 0)
        return rc;
    io->be_next = NULL;
    if (m->tail != NULL)
        m->tail->be_next = io;
    else
        m->head = io;
    m->tail = io;
    m->inflight++;
    plx_efd_signal(m->efd);
    return 0;
}

/* The transfer happens at completion time rather than at submit, so that an engine that reuses
 * a write buffer, or reads a read buffer, before the callback fires is caught by the tests. */
static void mem_execute(struct plx_blk_table *tab, struct plx_io *io)
{
    unsigned char *p = io->buf;
    switch (io->op) {
    case PLX_IO_READ:
        for (uint32_t i = 0; i < io->nblocks; i++) {
            const void *d = plx_blk_data(plx_blk_table_get(tab, io->block + i));
            if (d != NULL)
                memcpy(p + (size_t)i * PLX_BLOCK_SIZE, d, PLX_BLOCK_SIZE);
            else
                memset(p + (size_t)i * PLX_BLOCK_SIZE, 0, PLX_BLOCK_SIZE);
        }
        break;
    case PLX_IO_WRITE:
        for (uint32_t i = 0; i < io->nblocks; i++)
            plx_blk_table_set(tab, io->block + i, plx_blk_new(p + (size_t)i * PLX_BLOCK_SIZE));
        break;
    case PLX_IO_FLUSH:
    case PLX_IO_TRIM: /* refused at submit */
        break;
    }
}

static int mem_poll(plx_backend *be, int timeout_ms)
{
    struct mem_backend *m = (struct mem_backend *)be;
    int n = 0;

    /* Everything is already "done": waiting could only ever wait for nothing. Only the
     * completions queued before this call are delivered, so that a callback that resubmits
     * cannot keep poll() spinning forever. */
    plx_efd_drain(m->efd);
    struct plx_io *io = m->head;
    m->head = m->tail = NULL;
    while (io != NULL) {
        struct plx_io *next = io->be_next;
        mem_execute(m->tab, io);
        m->inflight--;
        n++;
        io->be_next = NULL;
        io->done(io, 0);
        io = next;
    }
    return n;
}

static int mem_fd(const plx_backend *be)
{
    return ((const struct mem_backend *)be)->efd;
}

static unsigned mem_inflight(const plx_backend *be)
{
    return ((const struct mem_backend *)be)->inflight;
}

static void mem_destroy(plx_backend *be)
{
    struct mem_backend *m = (struct mem_backend *)be;
    if (m == NULL)
        return;
    plx_blk_table_free(m->tab);
    close(m->efd);
    free(m);
}

static int mem_lock(plx_backend *be, int take)
{
    struct mem_backend *m = (struct mem_backend *)be;
    if (take && m->admin_locked)
        return -EWOULDBLOCK;
    m->admin_locked = take != 0;
    return 0;
}

/* Checked by plx_backend_check_io, so that tests exercise the write log's unaligned path. */
static size_t mem_dio_align(const plx_backend *be)
{
    return PLX_MEM_DIO_ALIGN;
}

static const struct plx_backend_ops mem_ops = {
    .submit = mem_submit,
    .poll = mem_poll,
    .fd = mem_fd,
    .inflight = mem_inflight,
    .destroy = mem_destroy,
    .lock = mem_lock,
    .size = sizeof(struct plx_backend_ops),
    .dio_align = mem_dio_align,
};

plx_backend *plx_backend_mem_from_table(struct plx_blk_table *t)
{
    struct mem_backend *m = xcalloc(1, sizeof(*m));
    m->efd = plx_efd_open();
    if (m->efd < 0) {
        /* Only fd exhaustion gets here; tests cannot run without descriptors anyway. */
        perror("parallax: eventfd");
        abort();
    }
    m->tab = t;
    m->base.ops = &mem_ops;
    m->base.nblocks = plx_blk_table_nblocks(t);
    snprintf(m->base.desc, sizeof(m->base.desc), "memory");
    return &m->base;
}

struct plx_blk_table *plx_backend_mem_table(const plx_backend *be)
{
    if (be == NULL || be->ops != &mem_ops)
        return NULL;
    return ((const struct mem_backend *)be)->tab;
}

plx_backend *plx_backend_mem_create(uint64_t nblocks)
{
    return plx_backend_mem_from_table(plx_blk_table_new(nblocks));
}

const void *plx_backend_mem_peek(const plx_backend *be, uint64_t block)
{
    const struct plx_blk_table *t = plx_backend_mem_table(be);
    return t != NULL ? plx_blk_data(plx_blk_table_get(t, block)) : NULL;
}

void plx_backend_mem_poke(plx_backend *be, uint64_t block, const void *data)
{
    struct plx_blk_table *t = plx_backend_mem_table(be);
    if (t != NULL)
        plx_blk_table_set(t, block, plx_blk_new(data));
}
