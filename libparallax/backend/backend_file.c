/*
 * backend_file.c - file or block device backend: libaio + O_DIRECT, completions signalled on an
 * eventfd.
 *
 * Each accepted I/O occupies one slot (an iocb) while it is with the kernel. At most nslots are
 * with the kernel at once; beyond that, I/Os wait in a queue and are started from poll() as
 * slots free up, as are I/Os that io_submit refused with EAGAIN.
 *
 * Flushes and FUA writes must not block the single-threaded engine, so fdatasync is never
 * called inline. By default fdatasync runs on a helper thread, which reports completion through
 * the same eventfd and takes the real-time I/O priority class for urgent flushes, and an urgent
 * FUA write (a commit's: PLX_IO_URGENT) is a plain write followed by such a flush; the writes a
 * snapshot, flush or FUA write waits for (PLX_IO_URGENT) get that class too (DESIGN.md, "Commit
 * writes go first"). Other FUA writes (the engine's FUA data writes: a FUA overwrite in place)
 * are plain writes; those whose data is reaped share one aio FDSYNC, two in flight at most,
 * which waits while other FUA data writes are still being written, up to 16 pending
 * (fua_group_submit), and complete with it. With $PARALLAX_FUA_GROUP=0 such a write carries
 * RWF_DSYNC while another one is in flight, else goes through the helper thread (see
 * slot_begin). With $PARALLAX_IOPRIO=0, flushes go to the kernel as IO_CMD_FDSYNC and the other
 * FUA writes carry RWF_DSYNC; kernels before 4.18 (FDSYNC) or 4.13 (per-I/O flags) refuse them
 * with EINVAL, and then the backend falls back for good to the helper thread.
 *
 * Blocking mode (PLX_BACKEND_BLOCKING) is for short-lived tools. It creates no aio context,
 * because tearing one down (io_destroy, or exit_aio when the process exits) waits for the
 * kernel's percpu reference kills, i.e. RCU grace periods: some 30 ms, more than the whole of a
 * command such as a snapshot. Each I/O runs to completion inside submit() with pread, pwrite,
 * pwritev2(RWF_DSYNC) for FUA and fdatasync for flushes, and its completion waits in the same
 * ready list for the next poll(), so the contract and the durability rules are the same; only
 * nothing overlaps.
 *
 * Zeroing ahead (plx_backend_prepare, backend.h) is in backend_file_prepare.c: a write into the
 * chunk being zeroed is held there (plx_file_prep_hold) and started from poll once the chunk is
 * done (plx_file_prep_release); any other write into a prepared range is counted there until
 * its completion is delivered (plx_file_prep_finished). That file is the layer below this one:
 * its state (struct file_prep, backend_file_prepare.h) sits inside ours, and it calls nothing
 * here. The eventfd and the list of finished slots are the backends' common ones
 * (backend_done.h).
 *
 * Opening (backend_file_open.c) is the layer above: it sets up the state this file works on
 * (backend_file_shared.h) and hands the backend these operations (plx_file_ops).
 */
#include <errno.h>
#include <sys/file.h>
#include <fcntl.h>
#include <libaio.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "aio_ring.h"
#include "backend.h"
#include "backend_done.h"
#include "clock.h"
#include "backend_file_prepare.h"
#include "backend_file_shared.h"
#include "backend_mem_shared.h"

/* <linux/aio_abi.h> and <linux/ioprio.h> (not included: the first clashes with libaio.h). */
#ifndef IOCB_FLAG_IOPRIO
#define IOCB_FLAG_IOPRIO (1 << 1)
#endif
#define PLX_IOPRIO_RT ((1 << 13) | 4) /* IOPRIO_PRIO_VALUE(IOPRIO_CLASS_RT, 4) */

#define REAP_BATCH 256

/* The slot a list entry is (link is its first member); NULL for NULL. */
static struct file_slot *slot_of(struct plx_done *d)
{
    return (struct file_slot *)(void *)d;
}

static void list_push(struct plx_done_list *l, struct file_slot *s)
{
    plx_done_push(l, &s->link);
}

static struct file_slot *list_pop(struct plx_done_list *l)
{
    return slot_of(plx_done_pop(l));
}

/* A buffered backend's PLX_IO_DIRECT transfer goes through the O_DIRECT descriptor. */
static int slot_direct(const struct file_backend *f, const struct file_slot *s)
{
    return f->dfd >= 0 && s->stage == ST_RW && (s->link.io->flags & PLX_IO_DIRECT);
}

/* Signal our own eventfd from the loop's thread (the helper and zeroing threads call
 * plx_efd_signal, while efd_clear is 0: see poll). */
static void efd_signal(struct file_backend *f)
{
    f->efd_clear = 0;
    f->efd_owed++;
    plx_efd_signal(f->done.efd);
}

/* A FUA data write's data stage is over (written, or failed): it no longer holds back its
 * group's flush (fua_group_submit). */
static void fua_written(struct file_backend *f, struct file_slot *s)
{
    if (s->fua_writing) {
        s->fua_writing = 0;
        f->fua_writing--;
    }
}

static void slot_finish(struct file_backend *f, struct file_slot *s, int status)
{
    fua_written(f, s);
    s->link.status = status;
    list_push(&f->done.ready, s);
}

/* Account for a data transfer step of res bytes (or -errno). Returns 1 when all the data has
 * moved, 0 when more is left, or a negative errno. */
static int transfer_progress(struct file_backend *f, struct file_slot *s, long res)
{
    if (res < 0)
        return (int)res;
    if (res == 0) {
        /* No progress: end of file (the file shrank under us) or a device that gave up. */
        return -EIO;
    }
    s->done += (size_t)res;
    if (s->done > s->total)
        return -EIO;
    if (s->done < s->total && (f->direct || slot_direct(f, s)) && s->done % PLX_BLOCK_SIZE != 0) {
        /* O_DIRECT stops mid-block only at end of file; the rest cannot be read aligned. */
        return -EIO;
    }
    return s->done == s->total;
}

/* ---- fdatasync helper thread ----------------------------------------------------------------- */

static void *sync_thread(void *arg)
{
    struct file_backend *f = arg;

    int rt = 0; /* this thread's I/O class is real-time */
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (f->thr_jobs.head == NULL && !f->thr_stop)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->thr_jobs.head == NULL)
            break;
        /* One fdatasync serves every job queued before it started: they were all submitted
         * (and their writes completed) before this point. */
        struct plx_done_list jobs = plx_done_take(&f->thr_jobs);
        pthread_mutex_unlock(&f->mu);
        /* The metadata that fdatasync writes (ext4 without a journal writes the bitmaps and
         * extent blocks that writes into holes dirtied, then the inode) is submitted from this
         * thread with its I/O class: real-time when an urgent flush is among the jobs
         * (PLX_IO_URGENT), so that it passes the data writes queued in the kernel as the
         * commit's own writes do; else the default, not to hold the data writes back. Refused
         * without CAP_SYS_NICE: then it flushes as any thread would. */
        int urgent = 0;
        for (const struct plx_done *j = jobs.head; j; j = j->next)
            urgent |= (j->io->flags & PLX_IO_URGENT) != 0;
        if (f->sync_rt && urgent != rt &&
            syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, urgent ? PLX_IOPRIO_RT : 0) == 0)
            rt = urgent;
        int rc = fdatasync(f->fd) < 0 ? -errno : 0;
        pthread_mutex_lock(&f->mu);
        struct file_slot *s;
        while ((s = list_pop(&jobs)) != NULL) {
            s->link.status = rc;
            list_push(&f->thr_done, s);
        }
        f->thr_signals++;
        plx_efd_signal(f->done.efd);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void thread_enqueue(struct file_backend *f, struct file_slot *s)
{
    if (!f->thr_started) {
        int rc = pthread_create(&f->thr, NULL, sync_thread, f);
        if (rc != 0) {
            /* Without a thread the only way left is to block; better than losing durability. */
            slot_finish(f, s, fdatasync(f->fd) < 0 ? -errno : 0);
            efd_signal(f);
            return;
        }
        f->thr_started = 1;
    }
    pthread_mutex_lock(&f->mu);
    list_push(&f->thr_jobs, s);
    f->thr_busy++;
    f->efd_clear = 0;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void reap_thread(struct file_backend *f)
{
    /* thr_busy is this thread's: nothing with the helper, nothing to take under its mutex (a
     * lock per poll met the helper holding it, preempted, on a busy machine). */
    if (!f->thr_started || f->thr_busy == 0)
        return;
    pthread_mutex_lock(&f->mu);
    struct plx_done_list done = plx_done_take(&f->thr_done);
    f->efd_owed += (int64_t)(f->thr_signals - f->thr_signals_seen);
    f->thr_signals_seen = f->thr_signals;
    pthread_mutex_unlock(&f->mu);
    struct file_slot *s;
    while ((s = list_pop(&done)) != NULL) {
        f->thr_busy--;
        slot_finish(f, s, s->link.status);
    }
}

/* ---- Submission ------------------------------------------------------------------------------ */

static void slot_prep(struct file_backend *f, struct file_slot *s)
{
    struct plx_io *io = s->link.io;
    unsigned char *buf = (unsigned char *)io->buf + s->done;
    size_t len = s->total - s->done;
    long long off = (long long)(io->block * PLX_BLOCK_SIZE + s->done);
    int fd = slot_direct(f, s) ? f->dfd : f->fd;

    if (s->stage == ST_SYNC)
        io_prep_fdsync(&s->cb, f->fd);
    else if (io->op == PLX_IO_READ)
        io_prep_pread(&s->cb, fd, buf, len, off);
    else if (s->dsync) {
        s->iov.iov_base = buf;
        s->iov.iov_len = len;
        io_prep_pwritev2(&s->cb, fd, &s->iov, 1, off, RWF_DSYNC);
    } else
        io_prep_pwrite(&s->cb, fd, buf, len, off);
    io_set_eventfd(&s->cb, f->done.efd);
    s->cb.data = s;
    /* A write a snapshot or flush waits for (PLX_IO_URGENT) must not queue behind the data writes
     * in the kernel's I/O scheduler: mq-deadline hands writes to the device in sector order, so a
     * small write below a stream of data writes waited for the stream to pause, up to 0.5 s
     * with a 1 MiB writer (DESIGN.md, "Commit writes go first"). Real-time class requests are
     * dispatched before best-effort ones. */
    if (f->ioprio_rt && s->stage == ST_RW && io->op == PLX_IO_WRITE &&
        (io->flags & PLX_IO_URGENT)) {
        s->cb.u.c.flags |= IOCB_FLAG_IOPRIO;
        s->cb.aio_reqprio = (short)PLX_IOPRIO_RT;
    }
}

/* Blocking mode: run the slot's I/O to the end here and now. Returns its status. */
static int slot_run_blocking(struct file_backend *f, struct file_slot *s)
{
    struct plx_io *io = s->link.io;

    for (;;) {
        if (s->stage == ST_SYNC) {
            int rc;
            while ((rc = fdatasync(f->fd)) < 0 && errno == EINTR)
                ;
            return rc < 0 ? -errno : 0;
        }
        unsigned char *buf = (unsigned char *)io->buf + s->done;
        size_t len = s->total - s->done;
        off_t off = (off_t)(io->block * PLX_BLOCK_SIZE + s->done);
        int fd = slot_direct(f, s) ? f->dfd : f->fd;
        ssize_t r;
        if (io->op == PLX_IO_READ) {
            r = pread(fd, buf, len, off);
        } else if (s->dsync) {
            struct iovec iov = {.iov_base = buf, .iov_len = len};
            r = pwritev2(fd, &iov, 1, off, RWF_DSYNC);
            if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
                /* Before Linux 4.13: a plain write, then fdatasync. */
                f->rwf_dsync = 0;
                s->dsync = 0;
                continue;
            }
        } else {
            r = pwrite(fd, buf, len, off);
        }
        if (r < 0 && errno == EINTR)
            continue;
        int rc = transfer_progress(f, s, r < 0 ? -(long)errno : (long)r);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            if (!s->fua || s->dsync)
                return 0;
            s->stage = ST_SYNC;
        }
    }
}

/* $PARALLAX_SNAP_TRACE: an io_submit that held the engine's thread for 5 ms or more (the kernel
 * may block in it, e.g. allocating blocks of a sparse file). */
static void trace_submit(const struct file_backend *f, const struct file_slot *s, uint64_t ns)
{
    if (ns < 5000000)
        return;
    const char *what = s->stage == ST_SYNC             ? "flush"
                       : s->link.io->op == PLX_IO_READ ? "read"
                                                       : "write";
    fprintf(stderr, "parallax: backend trace: io_submit of a %s at block %llu of %s took %.3f ms\n",
            what, (unsigned long long)s->link.io->block, f->base.desc, (double)ns / 1e6);
}

/* Hand the slot's next step to the kernel (or the helper thread). Returns 0 when it is under
 * way, 1 when io_submit said EAGAIN (nothing started), or a negative errno. In blocking mode
 * the I/O is over when this returns 0: it waits in the ready list, and the eventfd says so. */
static int slot_start(struct file_backend *f, struct file_slot *s)
{
    if (f->blocking) {
        int was_empty = f->done.ready.head == NULL;
        slot_finish(f, s, slot_run_blocking(f, s));
        /* poll() drains the eventfd and signals again if it leaves anything ready, so the
         * eventfd is readable whenever the list is not empty. */
        if (was_empty)
            efd_signal(f);
        return 0;
    }
    for (;;) {
        if (s->stage == ST_SYNC && !f->aio_fdsync) {
            thread_enqueue(f, s);
            return 0;
        }
        slot_prep(f, s);
        struct iocb *p = &s->cb;
        uint64_t t0 = f->trace ? plx_mono_ns() : 0;
        int rc = io_submit(f->ctx, 1, &p);
        if (f->trace)
            trace_submit(f, s, plx_mono_ns() - t0);
        if (rc == 1) {
            f->in_kernel++;
            if (!f->ring)
                f->efd_clear = 0; /* (with the ring, its signal is counted: efd_owed) */
            return 0;
        }
        if (rc == -EAGAIN)
            return 1;
        if (rc == -EINTR)
            continue;
        if ((rc == -EPERM || rc == -EINVAL) && (s->cb.u.c.flags & IOCB_FLAG_IOPRIO)) {
            /* Not allowed the real-time class (no CAP_SYS_NICE), or a kernel without
             * per-request priorities: the write goes as any other, and so do the later ones. */
            f->ioprio_rt = 0;
            continue;
        }
        if (rc == -EINVAL && s->stage == ST_SYNC) {
            f->aio_fdsync = 0;
            continue;
        }
        if ((rc == -EINVAL || rc == -EOPNOTSUPP) && s->dsync) {
            f->rwf_dsync = 0;
            s->dsync = 0;
            continue;
        }
        return rc < 0 ? rc : -EIO;
    }
}

static int slot_begin(struct file_backend *f, struct file_slot *s, struct plx_io *io)
{
    memset(s, 0, sizeof(*s));
    s->link.io = io;
    if (io->op == PLX_IO_FLUSH) {
        s->stage = ST_SYNC;
    } else {
        s->stage = ST_RW;
        s->total = (size_t)io->nblocks * PLX_BLOCK_SIZE;
        s->fua = io->op == PLX_IO_WRITE && (io->flags & PLX_IO_FUA);
        /* A FUA data write's flush is its group's (fua_group). Without groups: with the helper
         * thread in use (sync_rt), an urgent FUA write's flush goes there, in the
         * real-time class, and so does that of a FUA write alone in flight: alone, RWF_DSYNC was
         * far slower (4 KiB FUA writes at depth 1, in process: 133-190 IOPS against 3,400-3,900
         * through the helper thread), likely because the kernel runs its flush from a worker
         * bound to the CPU that completed the write, which waits for that CPU on a busy machine.
         * Among other FUA writes in flight, RWF_DSYNC: one completion per write for the engine,
         * and the kernel shares their flushes (bench/notes/fua-tapdisk.md). */
        s->fua_data = s->fua && !(io->flags & PLX_IO_URGENT);
        s->dsync = s->fua && f->rwf_dsync && !(s->fua_data && f->fua_group) &&
                   (!f->sync_rt || (s->fua_data && f->fua_data_inflight > 0));
        f->fua_data_inflight += (unsigned)s->fua_data;
        s->fua_writing = s->fua_data;
        f->fua_writing += (unsigned)s->fua_data;
    }
    return slot_start(f, s);
}

void plx_file_slot_release(struct file_backend *f, struct file_slot *s)
{
    if (s->fua_data)
        f->fua_data_inflight--;
    fua_written(f, s);
    s->fua_data = 0;
    s->link.io = NULL;
    s->link.next = f->free_slots != NULL ? &f->free_slots->link : NULL;
    f->free_slots = s;
}

/* With nothing at the kernel or the helper thread, no completion will ever make the fd readable
 * and an engine waiting on it would never call poll() to retry: signal it ourselves. EAGAIN with
 * an idle context is rare and transient, so the busy loop this makes is short. */
static void kick_if_stalled(struct file_backend *f)
{
    if (f->stalled.head != NULL && f->in_kernel == 0 && f->thr_busy == 0)
        efd_signal(f);
}

/* Start an accepted I/O (a slot, or the queue waiting for one). */
static void start_accepted(struct file_backend *f, struct plx_io *io)
{
    if (f->free_slots == NULL || f->wait_head != NULL) {
        if (f->wait_tail != NULL)
            f->wait_tail->be_next = io;
        else
            f->wait_head = io;
        f->wait_tail = io;
        return;
    }
    struct file_slot *s = f->free_slots;
    f->free_slots = slot_of(s->link.next);
    int rc = slot_begin(f, s, io);
    if (rc == 1) {
        list_push(&f->stalled, s);
        kick_if_stalled(f);
    } else if (rc < 0) {
        slot_finish(f, s, rc);
    }
}

static void writeback_note(struct file_backend *f, uint64_t off, uint64_t len);

/* PLX_IO_INLINE (backend.h): a buffered write done here with pwrite, and its completion
 * delivered before submit returns. Only with nothing queued or stalled ahead of it (it would
 * overtake them) and no zeroing ahead (which may have to hold it). */
static bool write_inline_ok(const struct file_backend *f, const struct plx_io *io)
{
    return (io->flags & PLX_IO_INLINE) && io->op == PLX_IO_WRITE && f->buffered && !f->rdonly &&
           !(io->flags & (PLX_IO_FUA | PLX_IO_DIRECT)) && f->prep.prep_ranges == NULL &&
           f->wait_head == NULL && f->stalled.head == NULL;
}

static void write_inline(struct file_backend *f, struct plx_io *io)
{
    const unsigned char *buf = io->buf;
    size_t total = (size_t)io->nblocks * PLX_BLOCK_SIZE, done = 0;
    uint64_t off = io->block * PLX_BLOCK_SIZE;
    int status = 0;
    while (done < total) {
        ssize_t r = pwrite(f->fd, buf + done, total - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            status = r < 0 ? -errno : -EIO; /* 0: no progress, as transfer_progress */
            break;
        }
        done += (size_t)r;
    }
    if (status == 0)
        writeback_note(f, off, total);
    io->done(io, status);
}

static int file_submit(plx_backend *be, struct plx_io *io)
{
    struct file_backend *f = (struct file_backend *)be;
    int rc = plx_backend_check_io(be, io);
    if (rc < 0)
        return rc;
    if (io->op == PLX_IO_WRITE && f->rdonly)
        return -EBADF;

    io->be_next = NULL;
    if (write_inline_ok(f, io)) {
        write_inline(f, io);
        return 0;
    }
    if ((io->op == PLX_IO_WRITE || io->op == PLX_IO_TRIM) && f->prep.prep_ranges != NULL &&
        plx_file_prep_hold(&f->prep, io)) {
        f->inflight++;
        return 0;
    }
    /* Queue behind earlier waiters rather than overtake them when a slot is free. */
    if (f->free_slots == NULL || f->wait_head != NULL) {
        if (f->wait_tail != NULL)
            f->wait_tail->be_next = io;
        else
            f->wait_head = io;
        f->wait_tail = io;
        f->inflight++;
        return 0;
    }
    struct file_slot *s = f->free_slots;
    f->free_slots = slot_of(s->link.next);
    rc = slot_begin(f, s, io);
    if (rc < 0) {
        plx_file_slot_release(f, s);
        return rc;
    }
    if (rc == 1) {
        list_push(&f->stalled, s);
        kick_if_stalled(f);
    }
    f->inflight++;
    return 0;
}

/* Start what waits: stalled slots, then queued I/Os on free slots. Failures become completions
 * with the error. */
static void pump(struct file_backend *f)
{
    struct file_slot *s;
    while ((s = list_pop(&f->stalled)) != NULL) {
        int rc = slot_start(f, s);
        if (rc == 1) {
            /* Still no room: keep order and try again on the next poll. */
            s->link.next = f->stalled.head;
            f->stalled.head = &s->link;
            if (f->stalled.tail == NULL)
                f->stalled.tail = &s->link;
            kick_if_stalled(f);
            return;
        }
        if (rc < 0)
            slot_finish(f, s, rc);
    }
    while (f->wait_head != NULL && f->free_slots != NULL) {
        struct plx_io *io = f->wait_head;
        f->wait_head = io->be_next;
        if (f->wait_head == NULL)
            f->wait_tail = NULL;
        io->be_next = NULL;
        s = f->free_slots;
        f->free_slots = slot_of(s->link.next);
        int rc = slot_begin(f, s, io);
        if (rc == 1) {
            list_push(&f->stalled, s);
            kick_if_stalled(f);
            return;
        }
        if (rc < 0)
            slot_finish(f, s, rc);
    }
}

/* ---- Completion ------------------------------------------------------------------------------ */

/* PLX_BACKEND_BUFFERED: start writing the pages of completed writes to the disk without
 * waiting, so that they reach it while the next ones are copied and a flush finds little left
 * (a burst's final flush would otherwise write all of it then). sync_file_range submits the
 * pages' I/O inside the call, a few microseconds: it is issued at the start of a poll, after the
 * completions (and the replies they lead to) have run, with adjacent writes merged into one
 * range, and only once the range holds WB_BATCH bytes: a QD1 stream of small records paid one
 * call (and a device kick) per record. What stays below that is at most WB_BATCH of dirty pages,
 * which a flush's fdatasync or the kernel's flusher writes. Failures are only a hint: the flush
 * still writes the pages and reports them. */
#define WB_BATCH (256u << 10)

static void writeback_start(struct file_backend *f)
{
    if (!f->wb_len)
        return;
    if (sync_file_range(f->fd, (off_t)f->wb_off, (off_t)f->wb_len, SYNC_FILE_RANGE_WRITE) != 0) {
        /* EINVAL/ESPIPE on odd files: the flusher and fdatasync still write the pages */
    }
    f->wb_len = 0;
}

static void writeback_note(struct file_backend *f, uint64_t off, uint64_t len)
{
    if (f->wb_len && off == f->wb_off + f->wb_len) {
        f->wb_len += len;
        return;
    }
    writeback_start(f);
    f->wb_off = off;
    f->wb_len = len;
}

static void slot_event(struct file_backend *f, struct file_slot *s, long res)
{
    if (s->stage == ST_SYNC) {
        slot_finish(f, s, res < 0 ? (int)res : 0);
        return;
    }
    int rc = transfer_progress(f, s, res);
    if (rc < 0) {
        slot_finish(f, s, rc);
        return;
    }
    if (rc == 1) {
        if (f->buffered && s->link.io->op == PLX_IO_WRITE && !slot_direct(f, s))
            writeback_note(f, s->link.io->block * PLX_BLOCK_SIZE, s->total);
        if (!s->fua || s->dsync) {
            slot_finish(f, s, 0);
            return;
        }
        s->stage = ST_SYNC;
        if (s->fua_data && f->fua_group) {
            /* Its flush is the group's that this poll submits (fua_group_submit). */
            list_push(&f->fua_pending, s);
            f->fua_pending_n++;
            fua_written(f, s);
            return;
        }
    }
    rc = slot_start(f, s);
    if (rc == 1)
        list_push(&f->stalled, s);
    else if (rc < 0)
        slot_finish(f, s, rc);
}

static void fua_group_done(struct file_backend *f, struct fua_group *g, long res)
{
    struct file_slot *s;
    while ((s = list_pop(&g->members)) != NULL)
        slot_finish(f, s, res < 0 ? (int)res : 0);
    free(g);
    f->fua_groups--;
}

/* Each FUA data write's flush on its own: the helper thread's (or its own aio FDSYNC). */
static void fua_sync_each(struct file_backend *f, struct plx_done_list *l)
{
    struct file_slot *s;
    while ((s = list_pop(l)) != NULL) {
        int rc = slot_start(f, s);
        if (rc == 1)
            list_push(&f->stalled, s);
        else if (rc < 0)
            slot_finish(f, s, rc);
    }
    kick_if_stalled(f);
}

/* Make the FUA data writes whose data was reaped durable with one aio FDSYNC: it runs after their
 * writes completed, so its flush covers them all. It waits while other FUA data writes are still
 * being written (their completions are a device write away), until fua_hold (16) are pending:
 * then one flush, one completion burst and one wakeup of the client serve them all, where the
 * first few written took one flush and the rest another (at QD 32 through tapdisk: ~12 writes a
 * flush instead of 6-7, 1.08-1.15x the throughput: bench/notes/fua-tapdisk.md; the flush itself
 * is ~35 us at the device there, what a flush costs is the wakeups around it). The wait is
 * bounded: by those writes' completions, which it does not hold up, or by fua_hold; a write
 * alone in flight (QD 1) is flushed at once. Two in flight at most (fua_groups_max): the
 * second waits for the first at the block layer, which starts it the moment the first ends,
 * where a group waiting in the engine for that end started its flush only after a round through
 * the engine's loop (bench/notes/fua-tapdisk.md: 1.6x at QD 32 through tapdisk on a loaded
 * machine, equal on a quiet one); the writes reaped while both run wait and form the next group.
 * Not one per write: a FUA write with RWF_DSYNC (or an aio FDSYNC of its own) costs a kernel worker
 * that blocks in its own flush, several context switches per write on a busy machine; nor the
 * helper thread, whose hand-offs (its mutex, its wakeup, its eventfd) cost more still
 * (bench/notes/fua-tapdisk.md). */
static void fua_group_submit(struct file_backend *f)
{
    if (f->fua_pending.head == NULL || (f->fua_group && f->fua_groups >= f->fua_groups_max))
        return;
    if (f->fua_writing > 0 && f->fua_pending_n < f->fua_hold)
        return;
    f->fua_pending_n = 0;
    struct plx_done_list members = plx_done_take(&f->fua_pending);
    struct fua_group *g = f->fua_group ? calloc(1, sizeof *g) : NULL;
    if (g == NULL) {
        fua_sync_each(f, &members);
        return;
    }
    g->members = members;
    io_prep_fdsync(&g->cb, f->fd);
    io_set_eventfd(&g->cb, f->done.efd);
    g->cb.data = (void *)((uintptr_t)g | 1);
    struct iocb *p = &g->cb;
    int rc;
    while ((rc = io_submit(f->ctx, 1, &p)) == -EINTR)
        ;
    if (rc == 1) {
        f->in_kernel++;
        f->fua_groups++;
        if (!f->ring)
            f->efd_clear = 0;
        return;
    }
    if (rc == -EINVAL || rc == -EOPNOTSUPP)
        f->fua_group = 0; /* a kernel without aio FDSYNC (before 4.18): for good */
    members = g->members;
    free(g);
    fua_sync_each(f, &members);
}

static int reap_kernel(struct file_backend *f)
{
    struct io_event ev[REAP_BATCH];
    struct timespec zero = {0, 0};

    while (f->in_kernel > 0) {
        int r;
        if (f->ring) {
            r = plx_aio_ring_reap(f->ring, ev, REAP_BATCH);
            f->efd_owed += r;
        } else {
            f->getevents_calls++;
            r = io_getevents(f->ctx, 0, REAP_BATCH, ev, &zero);
        }
        if (r == -EINTR)
            continue;
        if (r < 0)
            return r;
        for (int i = 0; i < r; i++) {
            f->in_kernel--;
            uintptr_t tag = (uintptr_t)ev[i].data;
            if (tag & 1)
                fua_group_done(f, (struct fua_group *)(tag & ~(uintptr_t)1), (long)ev[i].res);
            else
                slot_event(f, ev[i].data, (long)ev[i].res);
        }
        if (r < REAP_BATCH)
            break;
    }
    return 0;
}

/* A finished slot, just before its callback (plx_done_deliver). */
static void file_release(void *arg, struct plx_done *d)
{
    struct file_backend *f = arg;
    struct plx_io *io = d->io;
    plx_file_slot_release(f, slot_of(d));
    f->inflight--;
    if (f->prep.prep_ranges != NULL && (io->op == PLX_IO_WRITE || io->op == PLX_IO_TRIM))
        plx_file_prep_finished(&f->prep, io);
}

static int file_poll(plx_backend *be, int timeout_ms)
{
    struct file_backend *f = (struct file_backend *)be;
    int64_t deadline = plx_poll_deadline(timeout_ms);

    if (f->wb_len >= WB_BATCH)
        writeback_start(f);
    for (;;) {
        /* Drain first: anything completing after the reap below signals the eventfd again.
         * Nothing to drain if the count is known to be 0; after a drain it is when nothing
         * left could signal it from another thread or the kernel. */
        if (f->ring) {
            /* What may have signalled uncounted: the helper thread with jobs (its signals are
             * counted when they are reaped), zeroing ahead, and events still in the ring. */
            if (f->efd_owed > 0 || f->thr_busy > 0 || f->prep.prep_started ||
                f->prep.prep_ranges != NULL || !plx_aio_ring_empty(f->ring)) {
                f->efd_reads++;
                f->efd_owed -= (int64_t)plx_efd_take(f->done.efd);
            }
        } else {
            int quiet = f->in_kernel == 0 && f->thr_busy == 0 && !f->prep.prep_started;
            if (!f->efd_clear || !quiet) {
                f->efd_reads++;
                plx_efd_drain(f->done.efd);
                f->efd_clear = quiet;
            }
        }
        int rc = reap_kernel(f);
        if (rc < 0)
            return rc;
        fua_group_submit(f);
        reap_thread(f);
        if (f->prep.prep_ranges != NULL) {
            struct plx_io *go = plx_file_prep_release(&f->prep), *io;
            while ((io = go) != NULL) {
                go = io->be_next;
                io->be_next = NULL;
                start_accepted(f, io);
            }
        }
        pump(f);
        if (f->done.ready.head != NULL || timeout_ms == 0 || f->inflight == 0)
            break;

        int wait = plx_poll_wait(timeout_ms, deadline);
        if (wait == 0)
            break;
        /* Only stalled I/O left: nothing will signal, so come back soon to resubmit. */
        if (f->in_kernel == 0 && f->thr_busy == 0 && f->prep.held_head == NULL &&
            (wait < 0 || wait > 1))
            wait = 1;
        struct pollfd pfd = {.fd = f->done.efd, .events = POLLIN};
        if (poll(&pfd, 1, wait) < 0 && errno != EINTR)
            return -errno;
    }

    /* Callbacks may submit; what they start is delivered by a later poll. */
    int n = plx_done_deliver(&f->done, file_release, f);
    pump(f);
    if (f->done.ready.head != NULL)
        efd_signal(f);
    return n;
}

static int file_fd(const plx_backend *be)
{
    return ((const struct file_backend *)be)->done.efd;
}

static unsigned file_inflight(const plx_backend *be)
{
    return ((const struct file_backend *)be)->inflight;
}

static void file_destroy(plx_backend *be)
{
    struct file_backend *f = (struct file_backend *)be;
    if (f == NULL)
        return;
    if (f->thr_started) {
        pthread_mutex_lock(&f->mu);
        f->thr_stop = 1;
        pthread_cond_signal(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thr, NULL);
    }
    plx_file_prep_shutdown(&f->prep);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    if (!f->blocking)
        io_destroy(f->ctx);
    plx_done_close(&f->done);
    close(f->fd);
    if (f->dfd >= 0)
        close(f->dfd);
    free(f->slots);
    free(f);
}

/* flock: between processes of this host (each store opens the file itself, so two stores in
 * one process exclude each other too). The lock manager will take this role across hosts. */
static int file_lock(plx_backend *be, int take)
{
    struct file_backend *f = (struct file_backend *)be;
    for (;;) {
        if (flock(f->fd, take ? LOCK_EX | LOCK_NB : LOCK_UN) == 0)
            return 0;
        if (errno != EINTR)
            return errno == EWOULDBLOCK ? -EWOULDBLOCK : -errno;
    }
}

/* ---- The optional operations (backend_ops.c): alignment, and zeroing ahead, which
 * backend_file_prepare.c carries out ---- */

static size_t file_dio_align(const plx_backend *be)
{
    return ((const struct file_backend *)be)->dio_align;
}

static int file_prepare(plx_backend *be, uint64_t first, uint64_t nblocks)
{
    return plx_file_prep_add(&((struct file_backend *)be)->prep, first, nblocks);
}

static void file_prepare_stop(plx_backend *be, uint64_t first, uint64_t nblocks)
{
    plx_file_prep_stop(&((struct file_backend *)be)->prep, first, nblocks);
}

static void file_prepare_stats(const plx_backend *be, struct plx_prepare_stats *out)
{
    /* The stats are read under the zeroing thread's mutex, which lives in the backend. */
    struct file_backend *f = (struct file_backend *)(uintptr_t)be;
    plx_file_prep_stats(&f->prep, out);
}

const struct plx_backend_ops plx_file_ops = {
    .submit = file_submit,
    .poll = file_poll,
    .fd = file_fd,
    .inflight = file_inflight,
    .destroy = file_destroy,
    .lock = file_lock,
    .size = sizeof(struct plx_backend_ops),
    .dio_align = file_dio_align,
    .prepare = file_prepare,
    .prepare_stop = file_prepare_stop,
    .prepare_stats = file_prepare_stats,
};

/* A test hook of the file backend's own (backend.h), not an operation of the seam. */
void plx_backend_prepare_test(plx_backend *be, int fail_next, int pause)
{
    if (be != NULL && be->ops == &plx_file_ops)
        plx_file_prep_test(&((struct file_backend *)be)->prep, fail_next, pause);
}
