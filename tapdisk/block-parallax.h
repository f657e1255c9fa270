/*
 * block-parallax.h - what the tapdisk driver's two files share: block-parallax.c (the driver's
 * entry points, its request slots, the engine's completions, the wait for a VDI another process
 * holds) and block-parallax-open.c (what opening a disk sets up: the store shared by the disks on
 * one blockstore, the parameters, the write cache, the control socket). Nothing else includes it.
 */
#ifndef PLX_BLOCK_PARALLAX_H
#define PLX_BLOCK_PARALLAX_H

#include <limits.h>
#include <stddef.h>

#include "parallax.h"
#include "parallax_control.h"
#include "parallax_handover.h"
#include "tapdisk-iface.h"

/* Requests in flight per open disk. Large enough that tapdisk rarely meets the limit (an
 * 8-page blkif ring holds 256 requests of up to 11 segments, and tapdisk merges contiguous
 * segments into one request to the driver), small enough to bound memory (about 100 KiB). */
#define PLX_TD_SLOTS 1024

/* ---- State ---------------------------------------------------------------------------------- */

struct plx_td_disk;
struct plx_td_pool;

enum slot_state {
    SLOT_FREE = 0,
    SLOT_BUSY,      /* submitted to the engine; tapdisk waits for its completion */
    SLOT_ABANDONED, /* already completed towards tapdisk (close or store failure); the engine
                     * still owes its callback, which must then only release the slot */
};

struct plx_td_slot {
    struct plx_td_pool *pool;
    enum slot_state state;
    int op;            /* TD_OP_READ, TD_OP_WRITE or TD_OP_BLOCK_STATUS */
    td_request_t treq; /* block status: the part not answered yet */
    uint64_t run;      /* block status: the engine's answer */
    int mapped;
    struct plx_td_slot *next_free; /* also: the next request waiting for a handover */
};

/* The slots live outside tapdisk's private data (driver->data), because tapdisk frees that on
 * close, and after an engine failure the engine may still owe callbacks naming a slot. A pool
 * whose disk is gone is freed by the last such callback. */
struct plx_td_pool {
    struct plx_td_disk *disk; /* NULL once the disk is closed */
    unsigned engine_pending;  /* callbacks the engine still owes (busy + abandoned slots) */
    struct plx_td_slot *free;
    struct plx_td_slot slots[PLX_TD_SLOTS];
};

/* One engine per blockstore in this process (tapdisk is single-threaded: no locking). */
struct plx_td_store {
    char path[PATH_MAX]; /* canonical (realpath) */
    plx_store *st;
    int read_only;
    int refs;
    int failed;       /* negative errno once plx_store_service reported the store stopped */
    event_id_t event; /* -1 when not registered */
    /* A timeout event, off (TV_INF) until a request is submitted from tapdisk's loop, then due
     * at once (TV_ZERO): the next loop turn services the store, so the engine needs no wake-up
     * of its own (an eventfd write and read per request) for what the submission deferred.
     * tapdisk arms its own events this way (its log reopen). -1: none (the engine wakes). */
    event_id_t kick_event;
    int kicked;     /* kick_event is due and the engine was told it will be serviced */
    int in_service; /* inside plx_store_service, called from here */
    /* With a write log attached by a disk's parameters: a 100 ms timer applying the write
     * cache's automatic mode to the store's writable disks (plx_vdi_wcache_tick). */
    int tick_fd;            /* -1: none */
    event_id_t tick_event;  /* -1 when not registered */
    struct plx_td_disk *disks;
    struct plx_td_store *next;
};

/* tapdisk's private data for one open image (driver->data, zeroed by tapdisk). */
struct plx_td_disk {
    td_driver_t *driver;
    struct plx_td_store *store;
    plx_vdi *vdi;
    struct plx_td_pool *pool;
    int read_only;
    unsigned write_flags; /* PLX_WRITE_FUA (durability=fua) or 0 (durability=ordered) */
    int write_cache;      /* 0, PLX_WCACHE_ON or PLX_WCACHE_AUTO (write-cache=PATH) */
    struct plx_wcache_auto wauto; /* write-cache-threshold= */
    td_sector_t sectors;
    unsigned inflight; /* busy slots: requests tapdisk is waiting for */
    int control;       /* this disk counts among the control socket's users */
    /* Handover (migration): opened while another process held the VDI for writing. Requests
     * wait, in order, until this process gets the VDI; none is served before. */
    int waiting;         /* the VDI is not ours yet */
    int handover_failed; /* negative errno once the wait gave up */
    uint64_t wait_since_ns;
    int retry_fd; /* timerfd: try to open the VDI again every 5 ms */
    event_id_t retry_event;
    /* The tries of the open (host/parallax_handover.h): each waits on the store's loop, and
     * this tapdisk's other disks are served meanwhile. */
    struct handover_try retry;
    struct plx_td_slot *wait_head, *wait_tail;
    char vdi_spec[PLX_NAME_MAX + PLX_LABEL_MAX + 32];
    struct plx_td_disk *next; /* on store->disks */
};

/* block-parallax.c: tapdisk read event on plx_store_fd(): the engine has completions or I/O to
 * advance. */
void plx_td_store_event(event_id_t id, char mode, void *private);
void plx_td_store_kick(event_id_t id, char mode, void *private);

/* block-parallax-open.c */
/* Find or open the process's store for `path` (blocking: open() may); drop a reference (1: the
 * store was closed). */
int plx_td_store_get(const char *path, int want_ro, struct plx_td_store **out);
int plx_td_store_put(struct plx_td_store *ps);
void plx_td_store_add_disk(struct plx_td_store *ps, struct plx_td_disk *d);
void plx_td_store_remove_disk(struct plx_td_store *ps, struct plx_td_disk *d);
/* The params: leading options, then [blockstore:]vdi. */
int plx_td_parse_options(const char **params, unsigned *write_flags, struct plx_wcache_config *wc);
int plx_td_parse_params(const char *params, char *bs, size_t bslen, char *vdi, size_t vdilen);
int plx_td_attach_write_cache(struct plx_td_store *ps, const struct plx_wcache_config *wc);
/* A writable disk serves the control socket while it is open. */
void plx_td_control_use(void);
void plx_td_control_unuse(void);

#endif
