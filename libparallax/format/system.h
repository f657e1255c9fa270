/*
 * system.h - the superblock and the system state block (layer 1): reading and checking them at
 * open, and the read-modify-write of the state block that admin paths do under the admin lock.
 */
#ifndef PLX_SYSTEM_H
#define PLX_SYSTEM_H

#include "engine.h"

/* Read block 0 into st->sb and check it against the medium. */
int plx_superblock_load(plx_store *st);
/* Write st->sb to block 0 (only the upgrade rewrites it). */
int plx_superblock_write(plx_store *st);
/* Read the state block into st->state (calls st->gc_epoch_moved when gc_epoch moved). */
int plx_state_read(plx_store *st);
/* Write st->state (seq incremented). */
int plx_state_write(plx_store *st);

#endif
