/*
 * system.c - the superblock and the system state block (system.h).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "system.h"

/* ---- Open / close ------------------------------------------------------------------------------ */

int plx_superblock_load(plx_store *st)
{
    if (st->be->nblocks == 0) {
        /* A file of a few bytes is no more a store than an empty one, but it is not empty. */
        struct stat sb;
        if (stat(st->be->desc, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
            return plx_err(st, -EUCLEAN,
                           "%s is not a Parallax blockstore: its %lld bytes are less than the "
                           "4 KiB superblock; 'parallax format --size SIZE' makes one",
                           st->be->desc, (long long)sb.st_size);
        return plx_err(st, -EUCLEAN,
                       "%s is empty (less than one 4 KiB block): not a Parallax blockstore; "
                       "'parallax format --size SIZE' makes one",
                       st->be->desc);
    }
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, 0, 1, buf, 0);
    if (rc) {
        plx_block_free(buf);
        return plx_err(st, rc, "reading the superblock of %s: %s", st->be->desc, strerror(-rc));
    }
    const char *why = NULL;
    rc = plx_blkhdr_verify(buf, PLX_MAGIC_SUPER, 0, &why);
    if (rc == -ENODATA || (rc && ((struct plx_blkhdr *)buf)->magic != PLX_MAGIC_SUPER)) {
        plx_block_free(buf);
        return plx_err(st, -EUCLEAN, "%s is not a Parallax blockstore (no superblock magic)",
                       st->be->desc);
    }
    if (rc) {
        plx_block_free(buf);
        return plx_err(st, -EUCLEAN, "superblock of %s is corrupt: %s", st->be->desc, why);
    }
    memcpy(&st->sb, buf, sizeof st->sb);
    plx_block_free(buf);
    const struct plx_superblock *sb = &st->sb;
    if (sb->version == PLX_FORMAT_VERSION_V1 && !st->upgrading)
        return plx_err(st, -EPROTONOSUPPORT,
                       "%s has format version 1 (a VDI registry of at most 65,536 slots); this "
                       "Parallax reads version %u: once every older Parallax process using it "
                       "has stopped, run 'parallax upgrade' on it (docs/parallax.md)",
                       st->be->desc, PLX_FORMAT_VERSION);
    if (sb->version != PLX_FORMAT_VERSION && sb->version != PLX_FORMAT_VERSION_V1)
        return plx_err(st, -EPROTONOSUPPORT,
                       "%s has format version %u; this Parallax reads version %u",
                       st->be->desc, sb->version, PLX_FORMAT_VERSION);
    if (sb->incompat_features & ~PLX_INCOMPAT_KNOWN)
        return plx_err(st, -EPROTONOSUPPORT,
                       "%s uses format features this Parallax does not know (0x%llx)",
                       st->be->desc, (unsigned long long)sb->incompat_features);
    if (sb->block_size != PLX_BLOCK_SIZE || sb->extent_blocks < 256 ||
        (sb->extent_blocks & (sb->extent_blocks - 1)) || sb->extent_count < 3 ||
        sb->block_count != sb->extent_count * sb->extent_blocks ||
        sb->registry_start + sb->registry_slots > sb->extent_blocks || sb->state_block != 1 ||
        sb->catalogue_start != 2)
        return plx_err(st, -EUCLEAN, "superblock of %s has inconsistent geometry", st->be->desc);
    if (sb->block_count > st->be->nblocks)
        return plx_err(st, -EUCLEAN,
                       "%s is truncated: the blockstore needs %llu bytes, the medium has %llu",
                       st->be->desc, (unsigned long long)(sb->block_count * PLX_BLOCK_SIZE),
                       (unsigned long long)(st->be->nblocks * PLX_BLOCK_SIZE));
    return 0;
}

int plx_superblock_write(plx_store *st)
{
    uint8_t *buf = plx_block_alloc(1);
    memcpy(buf, &st->sb, sizeof st->sb);
    plx_blkhdr_seal(buf, PLX_MAGIC_SUPER, 0);
    int rc = plx_sync_io(st, PLX_IO_WRITE, 0, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing the superblock: %s", strerror(-rc));
    return 0;
}

int plx_state_read(plx_store *st)
{
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, st->sb.state_block, 1, buf, 0);
    const char *why = "";
    /* Version 2 seals the state block with its own magic; an upgrade meets either. */
    uint32_t magic = st->sb.version == PLX_FORMAT_VERSION_V1 ? PLX_MAGIC_STATE : PLX_MAGIC_STATE_V2;
    if (rc == 0 && st->upgrading && ((struct plx_blkhdr *)buf)->magic == PLX_MAGIC_STATE_V2)
        magic = PLX_MAGIC_STATE_V2;
    if (rc == 0)
        rc = plx_blkhdr_verify(buf, magic, st->sb.state_block, &why);
    st->state_v1 = magic == PLX_MAGIC_STATE;
    if (rc == 0)
        memcpy(&st->state, buf, sizeof st->state);
    plx_block_free(buf);
    if (rc == 0 && st->state.gc_epoch != st->seen_gc_epoch) {
        /* A collector freed blocks since we last looked: a cached node may describe a block
         * that now holds something else. Pinned nodes belong to open trees, which the
         * collector never frees: a writer's is live (a VDI open for writing cannot be
         * deleted), a reader's is held (hold.h). */
        if (st->gc_epoch_moved)
            st->gc_epoch_moved(st);
        st->seen_gc_epoch = st->state.gc_epoch;
    }
    if (rc == -ESTALE)
        return rc; /* fenced: the message says why */
    if (rc == -EUCLEAN || rc == -ENODATA)
        return plx_err(st, -EUCLEAN, "system state block is corrupt: %s", why);
    if (rc)
        return plx_err(st, rc, "reading the system state block: %s", strerror(-rc));
    if (st->state.registry_used > st->sb.registry_slots)
        return plx_err(st, -EUCLEAN, "system state block: registry_used beyond the registry");
    if (st->state_v1) /* the registry roots only: the preempted-key list is in both versions */
        memset(&st->state.vdi_table_root, 0,
               offsetof(struct plx_state_block, preempted_count) -
                   offsetof(struct plx_state_block, vdi_table_root));
    if (st->state.preempted_count > PLX_PREEMPTED_KEYS ||
        st->state.preempted_next >= PLX_PREEMPTED_KEYS)
        return plx_err(st, -EUCLEAN, "system state block: preempted-key list out of range");
    return 0;
}

int plx_state_write(plx_store *st)
{
    uint8_t *buf = plx_block_alloc(1);
    st->state.seq++;
    memcpy(buf, &st->state, sizeof st->state);
    plx_blkhdr_seal(buf, st->state_v1 ? PLX_MAGIC_STATE : PLX_MAGIC_STATE_V2, st->sb.state_block);
    int rc = plx_sync_io(st, PLX_IO_WRITE, st->sb.state_block, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing the system state block: %s", strerror(-rc));
    return 0;
}
