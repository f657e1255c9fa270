/*
 * format.h - the on-disk format, version 2. docs/FORMAT.md describes the same structures byte by
 * byte; change both in the same commit.
 *
 * Everything is little-endian (the build refuses other hosts rather than byte-swap). Blocks are
 * 4 KiB and are addressed by 64-bit block number (byte offset / 4096).
 *
 * Blocks that have room validate themselves: they start with struct plx_blkhdr, whose checksum
 * is CRC-32C over the whole block (checksum field taken as zero) seeded with the block's magic,
 * and which names the block's own address, so a block written to the wrong place or read from
 * the wrong place is detected. Radix nodes and allocation bitmaps have no room for a header;
 * radix links are validated instead (see plx_link_valid and FORMAT.md).
 */
#ifndef PLX_FORMAT_H
#define PLX_FORMAT_H

#include <assert.h>
#include <stdint.h>
#include "parallax.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the on-disk format is little-endian; this host is not"
#endif

#define PLX_FORMAT_VERSION 2u
static_assert(PLX_FORMAT_VERSION == PLX_FORMAT_VERSION_CURRENT, "parallax.h names this version");
#define PLX_FORMAT_VERSION_V1 1u /* fixed registry in extent 0; `parallax upgrade` converts it */

/* Block magics (ASCII, little-endian). */
#define PLX_MAGIC_SUPER 0x5355504cu    /* bytes "LPUS": superblock */
#define PLX_MAGIC_STATE 0x5453504cu    /* system state block */
#define PLX_MAGIC_CATALOG 0x5441434cu  /* extent catalogue block */
#define PLX_MAGIC_VDI 0x4944564cu      /* VDI registry record */
#define PLX_MAGIC_SNAPLOG 0x474f4c53u  /* snapshot log block */
#define PLX_MAGIC_STATE_V2 0x3253504cu /* bytes "LPS2": system state block of version 2 */
#define PLX_MAGIC_VDITAB 0x4254564cu   /* bytes "LVTB": VDI table block */
#define PLX_MAGIC_NAMEIDX 0x584e494cu  /* bytes "LINX": name index node */
#define PLX_MAGIC_NAMEBKT 0x4b424e4cu  /* bytes "LNBK": name index bucket */
/* Write log (a host's local file, not the blockstore; wlog.c, FORMAT.md §12). */
#define PLX_MAGIC_WLOG_HEAD 0x4857504cu /* bytes "LPWH": the log's header, block 0 */
#define PLX_MAGIC_WLOG_BATCH 0x4257504cu /* bytes "LPWB": one log write (a batch of records) */
#define PLX_MAGIC_LABELIDX 0x5844494cu /* bytes "LIDX": label index node */
#define PLX_MAGIC_RECLAIM_REQ 0x5152524cu  /* bytes "LRRQ": reclaim record, collector's block */
#define PLX_MAGIC_RECLAIM_ACK 0x4b52524cu  /* bytes "LRRK": reclaim record, holder's answer */
#define PLX_MAGIC_RECLAIM_BITS 0x4252524cu /* bytes "LRRB": reclaim record, candidate bits */
#define PLX_MAGIC_HOLD 0x444c484cu     /* bytes "LHLD": hold table block (read-only opens) */

struct plx_blkhdr {
    uint32_t magic;
    uint32_t crc;  /* CRC-32C of the block with this field zero, seeded with magic */
    uint64_t self; /* this block's own address */
};
static_assert(sizeof(struct plx_blkhdr) == 16, "blkhdr layout");

/* ---- Links (radix tree entries) ---------------------------------------------------------------
 * A link is a block address; bit 63 set means read-only (the subtree below is shared with a
 * snapshot and must be copied before it is changed); 0 means "not present" (reads as zeros).
 * Bits 48..62 are always zero. */
#define PLX_LINK_RO (1ull << 63)
#define PLX_LINK_ADDR_MASK ((1ull << 48) - 1)
#define PLX_LINK_RESERVED_MASK (~(PLX_LINK_RO | PLX_LINK_ADDR_MASK))
static inline uint64_t plx_link_addr(uint64_t link)
{
    return link & PLX_LINK_ADDR_MASK;
}
static inline int plx_link_ro(uint64_t link)
{
    return (link & PLX_LINK_RO) != 0;
}

#define PLX_RADIX_FANOUT 512u /* links per node: 9 address bits per level */
#define PLX_RADIX_BITS 9u
#define PLX_HEIGHT_SMALL 3u   /* up to 512 GiB */
#define PLX_HEIGHT_LARGE 4u   /* up to 256 TiB */

/* ---- Superblock (block 0); written once, at format time -------------------------------------- */
#define PLX_INCOMPAT_KNOWN 0ull /* incompat feature bits this code understands */
struct plx_superblock {
    struct plx_blkhdr hdr;
    uint32_t version;            /* PLX_FORMAT_VERSION */
    uint32_t block_size;         /* 4096 */
    uint64_t compat_features;    /* unknown bits: ignore */
    uint64_t incompat_features;  /* unknown bits: refuse to open */
    uint64_t extent_blocks;      /* blocks per extent (power of two, >= 256) */
    uint64_t extent_count;       /* extents in the store (extent 0 = system) */
    uint64_t block_count;        /* extent_count * extent_blocks */
    uint64_t state_block;        /* the system state block */
    uint64_t catalogue_start;    /* first extent-catalogue block */
    uint64_t catalogue_blocks;
    uint64_t registry_start;     /* first block after the catalogue; in a store upgraded from
                                  * version 1, its first legacy registry slot */
    uint64_t registry_slots;     /* legacy registry slots in extent 0 (0 in a new store) */
    uint64_t created_ns;
    uint8_t uuid[16];
};
static_assert(sizeof(struct plx_superblock) <= PLX_BLOCK_SIZE, "superblock fits");

/* ---- System state block: the few fields of extent 0 that change after format -----------------
 * Version 2 seals it with PLX_MAGIC_STATE_V2 (a running version-1 process then fails to read it
 * instead of rewriting it without the registry roots). */
#define PLX_PREEMPTED_KEYS 494u
struct plx_state_block {
    struct plx_blkhdr hdr;
    uint64_t seq;                /* incremented on every write */
    uint64_t next_vdi_id;        /* ids are never reused; a VDI exists only if id < this */
    uint64_t registry_used;      /* version 1: slots ever used. Version 2: legacy slots of an
                                  * upgraded store (informative; nothing scans them) */
    uint64_t gc_epoch;           /* bumped by every collection that freed blocks: a process
                                  * that sees it change drops cached nodes, whose blocks may
                                  * have been freed and reused */
    char lockd_addr[64];         /* lock manager(s): "host:port[,host:port...]", "" = none */
    /* Version 2: the registry's roots (registry.c). */
    uint64_t vdi_table_root;     /* VDI table (id -> record block), 0 = no VDI yet */
    uint32_t vdi_table_height;   /* levels of the VDI table, 0 with no root */
    uint32_t reserved0;
    uint64_t name_index_root;    /* name index root node, 0 = no name yet */
    /* Reservation keys that hosts taking over a dead holder's locks preempted (a ring: the
     * oldest entry is overwritten). A process whose key is listed never registers again, even
     * at a target that forgot the preempt (DESIGN.md "The lock manager", Fencing). */
    uint32_t preempted_count;    /* valid entries, at most PLX_PREEMPTED_KEYS */
    uint32_t preempted_next;     /* the entry the next key goes into */
    uint64_t preempted_keys[PLX_PREEMPTED_KEYS];
};
static_assert(sizeof(struct plx_state_block) == PLX_BLOCK_SIZE, "state block layout");

/* ---- Reclaim records (FORMAT.md §6.1) -------------------------------------------------------
 * A collector that finds unreachable blocks in an extent a live process holds cannot clear their
 * bits itself (the holder writes that bitmap from memory). It hands them to the holder through
 * the extent's reclaim record instead: three kinds of block, each sealed with its own address
 * and magic, found from the catalogue entry's `reclaim`. The request block and the candidate
 * bits are written only by collectors (under the admin lock), the ack block only by the holder
 * the request names. */
#define PLX_RECLAIM_REQUEST 1u   /* the collector asks the holder for a round (a barrier) */
#define PLX_RECLAIM_PUBLISHED 2u /* candidates for the round are in the bit blocks */
#define PLX_RECLAIM_BITS_HDR 64u
#define PLX_RECLAIM_BITS_PER_BLOCK ((PLX_BLOCK_SIZE - PLX_RECLAIM_BITS_HDR) * 8u) /* 32256 */
#define PLX_RECLAIM_MAX_BITS_BLOCKS 496u /* extents up to 496 * 32256 blocks (61 GiB) */
struct plx_reclaim_req {
    struct plx_blkhdr hdr; /* PLX_MAGIC_RECLAIM_REQ, self */
    uint64_t extent;       /* the extent this record belongs to */
    uint64_t nonce;        /* the collection's request (random, never 0) */
    uint32_t state;        /* PLX_RECLAIM_REQUEST or PLX_RECLAIM_PUBLISHED */
    uint32_t bits_blocks;  /* candidate bit blocks in bits_addr */
    uint64_t holder_host;  /* the holder the request is for (catalogue holder fields) */
    uint32_t holder_pid;
    uint32_t reserved0;
    uint64_t holder_epoch;
    uint64_t round;      /* PUBLISHED: the holder's round the candidates hold for */
    uint64_t candidates; /* PUBLISHED: bits set in the candidate blocks */
    uint64_t gc_epoch;   /* PUBLISHED: state.gc_epoch after the collector's bump */
    uint64_t ack_addr;   /* the ack block */
    uint64_t reserved1[4];
    uint64_t bits_addr[PLX_RECLAIM_MAX_BITS_BLOCKS];
};
static_assert(sizeof(struct plx_reclaim_req) == PLX_BLOCK_SIZE, "reclaim request layout");
struct plx_reclaim_ack {
    struct plx_blkhdr hdr; /* PLX_MAGIC_RECLAIM_ACK, self */
    uint64_t extent;
    uint64_t holder_host; /* who answers: the holder named in the request */
    uint32_t holder_pid;
    uint32_t reserved0;
    uint64_t holder_epoch;
    uint64_t acked_nonce;  /* the request answered: every block handed out before the round
                            * began was linked (or abandoned) when this was written */
    uint64_t round;        /* the round begun for acked_nonce */
    uint64_t folded_nonce; /* the last publication folded into the holder's allocator */
    uint64_t folded;       /* blocks it freed */
};
static_assert(sizeof(struct plx_reclaim_ack) <= PLX_BLOCK_SIZE, "reclaim ack fits");
struct plx_reclaim_bits {
    struct plx_blkhdr hdr; /* PLX_MAGIC_RECLAIM_BITS, self */
    uint64_t extent;
    uint64_t nonce; /* the publication these bits belong to */
    uint32_t index; /* bits cover blocks [index * PLX_RECLAIM_BITS_PER_BLOCK, ...) */
    uint32_t reserved0;
    uint64_t reserved1[3];
    uint8_t bits[PLX_BLOCK_SIZE - PLX_RECLAIM_BITS_HDR];
};
static_assert(sizeof(struct plx_reclaim_bits) == PLX_BLOCK_SIZE, "reclaim bits layout");

/* ---- Extent catalogue -------------------------------------------------------------------------- */
struct plx_extent_entry {
    uint8_t type;       /* enum plx_extent_type */
    uint8_t flags;      /* PLX_EXTENT_FULL */
    uint16_t reserved0;
    uint32_t holder_pid;   /* process holding the allocation lock, 0 = none */
    uint64_t holder_host;  /* hash of the holder's host name, 0 = unlocked */
    uint64_t holder_epoch; /* holder process start time (clock ticks since boot, from
                            * /proc/PID/stat): tells a reused pid apart */
    uint64_t reclaim;      /* the extent's reclaim record (its request block), 0 = none: how a
                            * collector hands what it found unreachable in a held extent to
                            * the holder (struct plx_reclaim_req; DESIGN.md "Space comes back
                            * while hosts serve"). Was reserved (0) before. */
};
static_assert(sizeof(struct plx_extent_entry) == 32, "extent entry layout");
#define PLX_EXTENT_FULL 1u
#define PLX_CATALOG_HDR 32u
#define PLX_CATALOG_PER_BLOCK ((PLX_BLOCK_SIZE - PLX_CATALOG_HDR) / 32u) /* 127 */
struct plx_catalog_block {
    struct plx_blkhdr hdr;
    uint64_t first_extent;  /* extent number of entries[0] */
    uint32_t count;         /* valid entries in this block */
    uint32_t reserved;
    struct plx_extent_entry entries[PLX_CATALOG_PER_BLOCK];
};
static_assert(sizeof(struct plx_catalog_block) <= PLX_BLOCK_SIZE, "catalogue block fits");

/* Every metadata and data extent starts with its allocation bitmap: bit b (LSB-first within each
 * byte) set = block (extent start + b) allocated. The bitmap's own blocks are set. */
static inline uint64_t plx_bitmap_blocks(uint64_t extent_blocks)
{
    return (extent_blocks + PLX_BLOCK_SIZE * 8 - 1) / (PLX_BLOCK_SIZE * 8);
}

/* ---- VDI table: id -> VDI record block, a radix tree of VDI_TABLE_FANOUT-way blocks -----------
 * A block of level L covers ids [first_id, first_id + FANOUT^(L+1)); entry i of a level-0 block
 * is the record block of VDI first_id + i (0 = none), of a higher level the child table block
 * covering first_id + i * FANOUT^L. */
#define PLX_VDITAB_HDR 32u
#define PLX_VDITAB_FANOUT ((PLX_BLOCK_SIZE - PLX_VDITAB_HDR) / 8u) /* 508 */
#define PLX_VDITAB_MAX_HEIGHT 6u
struct plx_vditab_block {
    struct plx_blkhdr hdr;
    uint32_t level;
    uint32_t reserved;
    uint64_t first_id;
    uint64_t entries[PLX_VDITAB_FANOUT];
};
static_assert(sizeof(struct plx_vditab_block) == PLX_BLOCK_SIZE, "VDI table block layout");

/* ---- Name index: hash(name) -> VDI ids, extendible hashing paged as a trie ----------------------
 * A node of level L routes by byte L of the 64-bit name hash (most significant first) to 256
 * children: nodes of level L+1 or buckets. A bucket of local depth d (0..8) fills the 2^(8-d)
 * consecutive child entries starting at `lo`: the hashes whose byte L has the same top d bits. */
#define PLX_NAMEIDX_FANOUT 256u
struct plx_nameidx_node {
    struct plx_blkhdr hdr;
    uint32_t level;             /* which byte of the hash routes here: 0..7 */
    uint32_t reserved;
    uint64_t children[PLX_NAMEIDX_FANOUT];
};
static_assert(sizeof(struct plx_nameidx_node) <= PLX_BLOCK_SIZE, "name index node fits");
struct plx_name_entry {
    uint64_t hash;
    uint64_t id;
};
#define PLX_NAMEBKT_HDR 32u
#define PLX_NAMEBKT_CAP ((PLX_BLOCK_SIZE - PLX_NAMEBKT_HDR) / 16u) /* 254 */
struct plx_namebkt_block {
    struct plx_blkhdr hdr;
    uint32_t level;             /* level of the node that links it */
    uint32_t depth;             /* local depth: 0..8 */
    uint32_t lo;                /* first child entry of that node that links it */
    uint32_t count;             /* entries in use */
    struct plx_name_entry entries[PLX_NAMEBKT_CAP];
};
static_assert(sizeof(struct plx_namebkt_block) <= PLX_BLOCK_SIZE, "name bucket fits");

/* ---- VDI registry record: one block per VDI; a metadata block (version 2) or a legacy slot in
 * extent 0 (version 1, kept in place by the upgrade) ----------------------------------------- */
#define PLX_VDI_DELETED 1u
/* snap_deleted counts the deleted snapshots of the log (FORMAT.md §7); clear in records written
 * before the count existed, which the first writable open counts. */
#define PLX_VDI_SNAPS_COUNTED 2u
struct plx_vdi_record {
    struct plx_blkhdr hdr;
    uint32_t version;       /* record layout version, 1 */
    uint32_t flags;         /* PLX_VDI_DELETED */
    uint64_t id;            /* unique, never reused */
    uint64_t size;          /* bytes, multiple of 4096 */
    uint32_t height;        /* radix levels: 3 or 4 */
    uint32_t reserved0;
    uint64_t root;          /* current radix root (always writable, never shared) */
    uint64_t snaplog_head;  /* newest snapshot-log block, 0 = no log yet */
    uint64_t snap_count;    /* snapshots in this VDI's log; records beyond it are incomplete */
    uint64_t parent_id;     /* clone source: VDI id, snapshot index, its root and log block */
    uint64_t parent_snap;
    uint64_t parent_root;
    uint64_t parent_log_block;
    uint64_t created_ns;
    uint64_t seq;           /* incremented on every write of this record */
    uint64_t lock_host;     /* single-writer lock: host hash, pid, epoch; 0 = unlocked */
    uint32_t lock_pid;
    uint32_t reserved1;
    uint64_t lock_epoch;
    uint64_t lock_time_ns;
    uint64_t writer_gen;    /* bumped each time a writer takes the lock: another process's
                             * cached nodes of this VDI from an older generation are stale */
    /* Write cache: the host (hash) and log (id) holding writes of this VDI not yet drained into
     * the store; 0 = none. Nobody else opens the VDI for writing until that log is replayed
     * (wlog.c; FORMAT.md §7). */
    uint64_t wlog_host;
    uint64_t wlog_id;
    /* Label index (labelidx.c; in words reserved in version 1: 0 = no
     * index, every label is found by reading the log). The index covers the labels of
     * snapshots 1..label_indexed; a reader scans the log records after it. */
    uint64_t label_index;   /* root node of the label index, 0 = none */
    uint64_t label_indexed; /* snapshots 1..label_indexed have their labels in the index */
    /* Snapshot count (in words reserved before; valid with PLX_VDI_SNAPS_COUNTED): the live
     * snapshots are snap_count - snap_deleted, plus one when the log record of snap_deleting
     * (a deletion counted here first, then written to the log) is not deleted yet. */
    uint64_t snap_deleted;
    uint64_t snap_deleting;
    uint64_t reserved2;
    char name[PLX_NAME_MAX + 1];
};
static_assert(sizeof(struct plx_vdi_record) <= PLX_BLOCK_SIZE, "VDI record fits");

/* ---- Hold table: the trees that read-only handles read, in extent 0's tail ------------------ */
/* A process that opens a snapshot or a VDI read-only records here which tree it reads, so that
 * a collection in any process keeps that tree while the holder lives, deleted or not (hold.c,
 * FORMAT.md §7.5). Written only under the admin lock. */
#define PLX_HOLD_BLOCKS 16u /* at most; fewer when extent 0 has less room (plx_hold_area) */
struct plx_hold {
    uint64_t host;    /* holder: host hash, 0 = free entry */
    uint32_t pid;
    uint32_t height;  /* radix levels of the held tree */
    uint64_t epoch;   /* holder's start time (clock ticks), as in the lock fields */
    uint64_t vdi_id;  /* the VDI the tree belongs to */
    uint64_t snap;    /* snapshot index, 0 = the VDI's current tree */
    uint64_t root;    /* the held tree's radix root */
    uint64_t time_ns; /* when it was opened */
};
static_assert(sizeof(struct plx_hold) == 56, "hold entry layout");
#define PLX_HOLD_HDR 32u
#define PLX_HOLDS_PER_BLOCK ((PLX_BLOCK_SIZE - PLX_HOLD_HDR) / 56u) /* 72 */
struct plx_hold_block {
    struct plx_blkhdr hdr;
    uint64_t reserved[2];
    struct plx_hold holds[PLX_HOLDS_PER_BLOCK];
    uint8_t zero[PLX_BLOCK_SIZE - PLX_HOLD_HDR - PLX_HOLDS_PER_BLOCK * 56u];
};
/* Exactly a block: the table is read into an array of them. */
static_assert(sizeof(struct plx_hold_block) == PLX_BLOCK_SIZE, "hold table block layout");

/* ---- Snapshot log: blocks in metadata extents, newest first via prev ------------------------- */
#define PLX_SNAP_DELETED 1u
struct plx_snap_record {
    uint64_t root;          /* frozen radix root of the snapshot */
    uint64_t time_ns;
    uint32_t flags;         /* PLX_SNAP_DELETED */
    uint32_t reserved;
    char label[PLX_LABEL_MAX + 1];
};
static_assert(sizeof(struct plx_snap_record) == 64, "snapshot record layout");
#define PLX_SNAPLOG_HDR 64u
#define PLX_SNAPLOG_PER_BLOCK ((PLX_BLOCK_SIZE - PLX_SNAPLOG_HDR) / 64u) /* 63 */
struct plx_snaplog_block {
    struct plx_blkhdr hdr;
    uint64_t vdi_id;        /* owner */
    uint64_t prev;          /* older log block of the same VDI, 0 = first */
    uint64_t first_index;   /* index (1-based) of records[0] */
    uint32_t count;         /* records written in this block */
    uint32_t reserved0;
    /* Skip link (0 = none: follow prev). Blocks are numbered from the oldest, 0, by
     * (first_index - 1) / PLX_SNAPLOG_PER_BLOCK; block k links to block J(k) of a skew-binary
     * jump structure (snaplog.c), so any block is O(log k) links from the head. */
    uint64_t skip;          /* address of block J(k), older than this one */
    uint64_t skip_first;    /* that block's first_index */
    struct plx_snap_record records[PLX_SNAPLOG_PER_BLOCK];
};
static_assert(sizeof(struct plx_snaplog_block) <= PLX_BLOCK_SIZE, "snapshot log block fits");

/* ---- Label index: a hash trie of label -> snapshot index, copy on write ------------------------ */
#define PLX_LIDX_INTERIOR 1u
#define PLX_LIDX_LEAF 2u
#define PLX_LIDX_FANOUT 256u /* interior node: one child per byte of the label's hash */
#define PLX_LIDX_DEPTH 8u    /* a 64-bit hash has 8 bytes: levels 0..7 */
#define PLX_LIDX_HDR 48u
struct plx_lidx_entry {
    uint64_t index;                /* snapshot that had `label` when the entry was written */
    char label[PLX_LABEL_MAX + 1]; /* NUL-padded */
};
static_assert(sizeof(struct plx_lidx_entry) == 48, "label index entry layout");
#define PLX_LIDX_PER_LEAF ((PLX_BLOCK_SIZE - PLX_LIDX_HDR) / 48u) /* 84 */
struct plx_lidx_block {
    struct plx_blkhdr hdr;
    uint64_t vdi_id;   /* owner */
    uint32_t kind;     /* PLX_LIDX_INTERIOR or PLX_LIDX_LEAF */
    uint32_t level;    /* depth below the root, 0 = root */
    uint32_t count;    /* leaf: entries used */
    uint32_t reserved0;
    uint64_t reserved1;
    union {
        uint64_t child[PLX_LIDX_FANOUT];                    /* interior: 0 = empty */
        struct plx_lidx_entry entry[PLX_LIDX_PER_LEAF]; /* leaf */
        uint8_t raw[PLX_BLOCK_SIZE - PLX_LIDX_HDR];
    } u;
};
static_assert(sizeof(struct plx_lidx_block) == PLX_BLOCK_SIZE, "label index node is a block");

/* ---- Write log (FORMAT.md §12): a ring on a host's local disk ------------------------------- */
#define PLX_WLOG_VERSION 1u
struct plx_wlog_head {      /* block 0 of the log */
    struct plx_blkhdr hdr;  /* magic PLX_MAGIC_WLOG_HEAD, self 0 */
    uint32_t version;       /* PLX_WLOG_VERSION */
    uint32_t reserved0;
    uint8_t store_uuid[16]; /* the blockstore's superblock uuid */
    uint64_t host_hash;     /* the host whose log this is (FNV-1a of its id) */
    char host[64];          /* that host id, for messages */
    uint64_t log_blocks;    /* size of the log in blocks, this one included */
    uint64_t log_id;        /* random, nonzero: names this log in VDI records and batches */
    uint64_t tail_seq;      /* oldest batch not known to be drained into the store */
    uint64_t tail_pos;      /* ... and its block */
    uint64_t created_ns;
    uint64_t seq;           /* incremented on every write of this block */
};
static_assert(sizeof(struct plx_wlog_head) <= PLX_BLOCK_SIZE, "write log head fits");

#define PLX_WLOG_OP_WRITE 1u /* the only op written; 2 (trim) is reserved */
struct plx_wlog_entry {     /* one record: a write of nblocks data blocks (or a trim) */
    uint64_t vdi_id;
    uint64_t vblock;        /* first virtual block */
    uint32_t nblocks;
    uint16_t op;            /* PLX_WLOG_OP_* */
    uint16_t reserved0;
    uint32_t data_crc;      /* crc32c(seq of the batch, the record's data blocks); 0 for a trim */
    uint32_t reserved1;
};
static_assert(sizeof(struct plx_wlog_entry) == 32, "write log entry layout");

#define PLX_WLOG_BATCH_HDR 48u
#define PLX_WLOG_PER_BATCH ((PLX_BLOCK_SIZE - PLX_WLOG_BATCH_HDR) / 32u) /* 126 */
struct plx_wlog_batch {     /* first block of one log write; the records' data follows it */
    struct plx_blkhdr hdr;  /* magic PLX_MAGIC_WLOG_BATCH, self = its block in the log */
    uint64_t log_id;
    uint64_t seq;           /* consecutive from 1 over the life of the log */
    uint32_t nblocks;       /* blocks of this log write, this one included */
    uint32_t count;         /* records */
    uint32_t flags;         /* 0 */
    uint32_t reserved0;
    struct plx_wlog_entry entries[PLX_WLOG_PER_BATCH];
};
static_assert(sizeof(struct plx_wlog_batch) <= PLX_BLOCK_SIZE, "write log batch header fits");

/* ---- Checksums --------------------------------------------------------------------------------- */
uint32_t plx_crc32c(uint32_t seed, const void *data, size_t len);
/* The same computed from a table, byte at a time, on any CPU (tests compare the two). */
uint32_t plx_crc32c_table(uint32_t seed, const void *data, size_t len);
/* crc, plx_crc32c(seed_old, D) of some len bytes D, turned into plx_crc32c(seed_new, D) without
 * reading D (the write cache checksums a record when its data arrives, before its seed, the
 * batch's seq, is known). */
uint32_t plx_crc32c_reseed(uint32_t crc, uint32_t seed_old, uint32_t seed_new, uint64_t len);
/* Fill hdr (magic, self, crc) of a block buffer before writing it. */
void plx_blkhdr_seal(void *block, uint32_t magic, uint64_t self);
/* 0 if the block carries `magic`, names `self` and its checksum matches; -EUCLEAN otherwise
 * (why: in *why, a static string). An all-zero block returns -ENODATA. */
int plx_blkhdr_verify(const void *block, uint32_t magic, uint64_t self, const char **why);

#endif
