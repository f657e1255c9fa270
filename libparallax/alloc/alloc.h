/*
 * alloc.h - the extent catalogue and the block allocator (layer 2; alloc.c says how claims are
 * made durable before the links that use them).
 */
#ifndef PLX_ALLOC_H
#define PLX_ALLOC_H

#include "engine.h"

/* Per extent type (metadata, data): the extents this process holds and a run of claimed blocks
 * ready to hand out. Claims are made durable by the batch that uses them (see alloc.c). */
struct plx_extent_state {
    uint8_t *bitmap;            /* in-memory bitmap of a held extent, NULL otherwise */
    uint64_t free;              /* clear bits */
    uint64_t *dirty_blocks;     /* per bitmap block: generation of its last change */
    struct plx_leaf_slot *slots; /* data extents: per slot, the leaf placing blocks in it */
    uint8_t *reserved;          /* data extents: set in the bitmap for an owned slot, not handed out */
    bool held;
    bool spare;                 /* held, claimed ahead, not handed out from yet (alloc.c) */
    /* Reclaim rounds (alloc.c, "Folding in what a collector found"): the blocks handed out
     * since round r began, in young[r & 1], for the current round and the one before; the
     * round that was current when the extent was taken (hold_round), and the last collector's
     * publication folded in (folded_nonce: never twice). */
    uint8_t *young[2];
    uint64_t hold_round;
    uint64_t folded_nonce;
};

/* A slot is an aligned run of PLX_RADIX_FANOUT blocks (one leaf's worth of data; less when the
 * extent is smaller) in a held data extent. A leaf that takes a slot puts the data block for its
 * entry i at slot + i, so a leaf's blocks lie in virtual order whatever order they are written
 * in. A slot is claimed with all its free blocks when taken (one bitmap change, not one per
 * block); what its leaf has not used is given back when the slot is released (a snapshot or a
 * close of the VDI, or when the store has no other free block). */
struct plx_leaf_slot {
    uint64_t leaf; /* address of the owning leaf, 0: none */
    uint64_t tag;  /* who owns it (a VDI id): released together at a snapshot or a close */
};

struct plx_alloc_pool {
    uint64_t next, end;         /* claimed, unused blocks [next, end) */
    uint64_t extent;            /* extent the pool is in */
    bool valid;
};

struct plx_alloc_waiter {
    uint64_t gen;
    void (*cb)(void *arg, int status);
    void *arg;
    struct plx_alloc_waiter *next;
};

struct plx_claim;

/* A request waiting for room to allocate in (plx_alloc_room): ready runs once, from a service
 * pass's deferred callbacks, with 0 (look again: a claim ended, room may be there now) or the
 * negative errno of the claim that failed (the store's message says why). */
struct plx_alloc_room {
    struct plx_deferred d;
    void (*ready)(struct plx_alloc_room *w, int status);
    uint64_t meta, data; /* blocks wanted */
    int status;
    bool queued; /* waiting: plx_alloc_room is not to be called again until ready runs */
    bool full;   /* the caller's: a claim found no extent, go on without (the pipeline's) */
    struct plx_alloc_room *next;
};

struct plx_alloc {
    bool by_leaf;                      /* data placement: leaf slots (plx_alloc_leaf_block) */
    struct plx_extent_state *ext;      /* extent_count entries */
    struct plx_alloc_pool pool[2];     /* [0] metadata, [1] data */
    uint64_t gen;                      /* bumped on every bitmap or catalogue change */
    uint64_t written_gen;              /* every change up to here is written */
    uint64_t round_target;             /* generation the writes in flight will reach */
    int round_status;
    struct plx_alloc_waiter *waiters;  /* batches waiting for claims to be written */
    unsigned writes_inflight;
    uint64_t claim_chunk;              /* blocks per claim */
    uint64_t slots_owned;              /* slots with an owner, in all held data extents */
    uint64_t empty_cursor, fill_cursor; /* where slot searches start (alloc.c, slot_choose) */
    uint64_t spill;                     /* slot for blocks whose place was taken (alloc.c) */
    uint64_t reserved;                  /* blocks reserved by owned slots, all extents */
    /* Claims ahead (alloc_claim.c, "Claiming ahead"): per type, a held extent nothing is handed out
     * from until the held ones run out (0: none); the asynchronous claim in progress. */
    uint64_t spare[2];
    struct plx_claim *claim;
    bool claim_busy;                    /* a claim is in progress (plx_drive_handler_while) */
    uint64_t claim_retry_ns;            /* no claim ahead before then (lock busy, none free) */
    bool closing;
    /* How extents were taken: a spare ready (ahead), a spare waited for (waited: the I/O path
     * blocked until the claim in flight finished), or claimed synchronously (sync). */
    uint64_t claims_ahead, claims_waited, claims_sync;
    uint64_t claims_failed; /* claims ahead ended by an error (the next one, or the fallback, tries
                             * again: no request sees it) */
    uint64_t stall_ns, stall_max_ns; /* time the allocating request waited in claims (sync, waited) */
    uint64_t round;                  /* reclaim round (0: none begun yet) */
    uint64_t folded;                 /* blocks freed by folding collectors' publications in */
    bool no_ahead;                   /* $PARALLAX_CLAIM_AHEAD=0: every claim synchronous */
    /* Requests waiting for room (plx_alloc_room), in order; the message of the claim that
     * failed them, set again before they learn it. */
    struct plx_alloc_room *room_head, *room_tail;
    char claim_err[512];
    bool no_zero_ahead;              /* $PARALLAX_ZERO_AHEAD=0: data extents not prepared */
};

int plx_alloc_init(plx_store *st);
/* Release claimed-but-unused blocks and extent locks; write everything. Blocking. */
int plx_alloc_shutdown(plx_store *st);
void plx_alloc_free(plx_store *st);
/* Hand out up to `want` contiguous blocks of `type` (METADATA or DATA); returns the count (>= 1)
 * with the first in *first, or -ENOSPC. Does no I/O except to claim a new extent when no spare
 * claimed ahead is ready (alloc_claim.c, "Claiming ahead"); may start such a claim. */
int plx_alloc_blocks(plx_store *st, enum plx_extent_type type, uint64_t want, uint64_t *first);
/* Hand out one data block for entry idx of the leaf at leaf_addr, owned by tag (alloc.c,
 * "Data blocks placed by leaf"): at offset idx of the leaf's slot (*slot, 0 when it has none;
 * updated when the leaf takes one), or in the spill slot when that block is taken. A leaf
 * without a usable slot takes an empty one, else one with offset idx free, else a new extent
 * (while the held ones are at least a quarter used), else any free data block; a new extent
 * also when every held data extent is full. Returns 0, -ENOSPC or another claim error. */
int plx_alloc_leaf_block(plx_store *st, uint64_t tag, uint64_t leaf_addr, unsigned idx,
                         uint64_t *slot, uint64_t *block);
/* On a serving loop (plx_store_will_service), before a request allocates: can `meta` metadata
 * and `data` data blocks be handed out from the extents held (and the spares claimed ahead),
 * with no extent to claim? 0: yes, or the store is not served from a loop (the allocator claims
 * synchronously there when it must). -EINPROGRESS: w is queued and a claim is under way, the
 * admin lock waited for on the loop (plx_admin_lock_async): w->ready says when to look again. */
int plx_alloc_room(plx_store *st, uint64_t meta, uint64_t data, struct plx_alloc_room *w);
/* Every slot owned by tag is released (its leaves were frozen by a snapshot, or closed). */
void plx_alloc_release_slots(plx_store *st, uint64_t tag);
/* Blocks of a held extent were freed (the collector): slot searches start over. */
void plx_alloc_blocks_freed(plx_store *st);
/* Extent e was given back (the collector emptied it): forget its bitmap and slots. */
void plx_alloc_extent_released(plx_store *st, uint64_t e);
/* Current allocator generation: a batch that used blocks must see it written before linking. */
uint64_t plx_alloc_gen(const plx_store *st);
/* Write allocator state up to generation gen; cb fires when written (immediately if already). */
int plx_alloc_sync(plx_store *st, uint64_t gen, void (*cb)(void *arg, int status), void *arg);
/* Read the whole catalogue and every held extent's bitmap from disk (check, info, gc). */
int plx_catalogue_read(plx_store *st);
int plx_bitmap_read(plx_store *st, uint64_t extent, uint8_t *bits);
enum plx_extent_type plx_block_type(const plx_store *st, uint64_t block);
bool plx_block_in_bitmap_area(const plx_store *st, uint64_t block);
/* Write one catalogue entry (under the admin lock). */
int plx_extent_entry_write(plx_store *st, uint64_t e, const struct plx_extent_entry *ent);
/* Give the claimed-but-unused blocks of this process's pools back to the bitmaps (in memory). */
void plx_alloc_return_pools(plx_store *st);
/* Free blocks of extent e: from the bitmap held here, else read from the medium. */
int plx_extent_free(plx_store *st, uint64_t e, uint64_t *free_blocks);
/* Is a claim ahead doing I/O (and holding the admin lock) right now? */
bool plx_alloc_claim_io(const plx_store *st);
/* Let a claim ahead in flight finish (or drop one still waiting for the lock), so that a
 * blocking call returns with no claim holding the admin lock. Blocking. */
void plx_alloc_claim_finish(plx_store *st);
/* Begin reclaim round a->round + 1 (reclaim.c): from now on every block handed out is young
 * for it; the young set of the round before the current one is forgotten. */
uint64_t plx_alloc_round_begin(plx_store *st);
/* Fold a collector's candidates for held extent e (bits: one per block of the extent, set for a
 * block the collector found allocated and unreachable) into the bitmap, for a publication made
 * for reclaim round `round`: every candidate still allocated is freed, except blocks handed out
 * since that round began (their links may postdate the collector's mark), blocks claimed and
 * not handed out (pools, slot reservations), and all of them when the extent was taken after
 * the round began or the round is older than the one before the current. In memory; the next
 * allocator write carries it. Returns the blocks freed, or a negative errno (-ESTALE: the
 * publication cannot be used, nothing freed). */
int64_t plx_alloc_fold(plx_store *st, uint64_t e, uint64_t round, uint64_t nonce,
                       const uint8_t *bits);
/* Write every allocator change made so far and wait for it. Blocking. */
int plx_wait_alloc_written(plx_store *st);

#endif
