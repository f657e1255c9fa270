/*
 * nbd_proto.h - the NBD protocol's numbers (doc/proto.md of the NBD project) and its byte order
 * (big-endian on the wire), as the server uses them.
 */
#ifndef PLX_NBD_PROTO_H
#define PLX_NBD_PROTO_H

#include <stdint.h>

/* ---- constants ----------------------------------------------------------------------------- */

#define NBD_MAGIC_INIT 0x4e42444d41474943ull /* "NBDMAGIC" */
#define NBD_MAGIC_OPT 0x49484156454f5054ull  /* "IHAVEOPT" */
#define NBD_MAGIC_REP 0x0003e889045565a9ull
#define NBD_MAGIC_REQUEST 0x25609513u
#define NBD_MAGIC_SIMPLE 0x67446698u
#define NBD_MAGIC_STRUCTURED 0x668e33efu

#define NBD_FLAG_FIXED_NEWSTYLE 1u
#define NBD_FLAG_NO_ZEROES 2u

#define NBD_OPT_EXPORT_NAME 1u
#define NBD_OPT_ABORT 2u
#define NBD_OPT_LIST 3u
#define NBD_OPT_STARTTLS 5u
#define NBD_OPT_INFO 6u
#define NBD_OPT_GO 7u
#define NBD_OPT_STRUCTURED_REPLY 8u
#define NBD_OPT_LIST_META_CONTEXT 9u
#define NBD_OPT_SET_META_CONTEXT 10u

#define NBD_REP_ACK 1u
#define NBD_REP_SERVER 2u
#define NBD_REP_INFO 3u
#define NBD_REP_META_CONTEXT 4u
#define NBD_REP_ERR_UNSUP 0x80000001u
#define NBD_REP_ERR_INVALID 0x80000003u
#define NBD_REP_ERR_PLATFORM 0x80000004u
#define NBD_REP_ERR_TLS_REQD 0x80000005u
#define NBD_REP_ERR_UNKNOWN 0x80000006u

#define NBD_INFO_EXPORT 0u
#define NBD_INFO_BLOCK_SIZE 3u

#define NBD_TFLAG_HAS_FLAGS (1u << 0)
#define NBD_TFLAG_READ_ONLY (1u << 1)
#define NBD_TFLAG_SEND_FLUSH (1u << 2)
#define NBD_TFLAG_SEND_FUA (1u << 3)
#define NBD_TFLAG_SEND_TRIM (1u << 5)
#define NBD_TFLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_TFLAG_CAN_MULTI_CONN (1u << 8)

#define NBD_CMD_READ 0u
#define NBD_CMD_WRITE 1u
#define NBD_CMD_DISC 2u
#define NBD_CMD_FLUSH 3u
#define NBD_CMD_TRIM 4u
#define NBD_CMD_WRITE_ZEROES 6u
#define NBD_CMD_BLOCK_STATUS 7u

#define NBD_CMD_FLAG_FUA (1u << 0)
#define NBD_CMD_FLAG_REQ_ONE (1u << 3)

#define NBD_REPLY_FLAG_DONE 1u
#define NBD_REPLY_TYPE_NONE 0u
#define NBD_REPLY_TYPE_OFFSET_DATA 1u
#define NBD_REPLY_TYPE_BLOCK_STATUS 5u
#define NBD_REPLY_TYPE_ERROR 32769u

#define NBD_STATE_HOLE 1u
#define NBD_STATE_ZERO 2u

#define NBD_EPERM 1u
#define NBD_EIO 5u
#define NBD_ENOMEM 12u
#define NBD_EINVAL 22u
#define NBD_ENOSPC 28u

/* ---- byte order ------------------------------------------------------------------------------ */

static inline void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void put32(unsigned char *p, uint32_t v)
{
    put16(p, (uint16_t)(v >> 16));
    put16(p + 2, (uint16_t)v);
}

static inline void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static inline uint16_t get16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t get32(const unsigned char *p)
{
    return ((uint32_t)get16(p) << 16) | get16(p + 2);
}

static inline uint64_t get64(const unsigned char *p)
{
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

#endif
