/*
 * hold.h - the hold table: which trees read-only handles read (layer 1, beside the locks).
 *
 * A writer of a VDI is recorded in the VDI's record (its lock fields); a reader was recorded
 * nowhere, so a collection in another process freed the tree it read as soon as the snapshot or
 * VDI was deleted, and the blocks were handed out again under it. Every read-only open of a
 * writable store records a hold here (the tree's root, and who holds it); the collector marks the
 * trees of live holders like those of live snapshots, so a deleted tree is freed by the first
 * collection after its last reader let go (docs/DESIGN.md "Readers hold what they read"; the
 * table: FORMAT.md §7.5).
 */
#ifndef PLX_HOLD_H
#define PLX_HOLD_H

#include "engine.h"
#include "format.h"

/* Where the table lies: blocks [*first, *first + *n) of extent 0 (n may be 0: no room). */
void plx_hold_area(const plx_store *st, uint64_t *first, uint32_t *n);
/* Record that this process reads the tree at `root` (VDI vdi_id, snapshot snap or 0). Under the
 * admin lock, in the same hold as the lookup that found the tree live, so that a collection
 * either sees the hold or saw the tree live. Reuses a free entry or one whose holder is gone;
 * -ENOSPC with a message when the table is full. *slot names the entry for plx_hold_drop. */
int plx_hold_add(plx_store *st, uint64_t vdi_id, uint64_t snap, uint64_t root, uint32_t height,
                 uint32_t *slot);
/* Forget the hold at slot (if it is still this process's, for root). Takes the admin lock. */
int plx_hold_drop(plx_store *st, uint32_t slot, uint64_t root);
/* Call fn for every hold whose holder is alive (this process included); stops at fn's first
 * nonzero return and returns it. Reads the table from the medium. */
int plx_hold_each_live(plx_store *st, int (*fn)(void *arg, const struct plx_hold *h), void *arg);

#endif
