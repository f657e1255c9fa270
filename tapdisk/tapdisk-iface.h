/*
 * tapdisk-iface.h - the part of blktap3 tapdisk's driver interface that block-parallax.c uses.
 *
 * tapdisk has no plugin loader: a driver is compiled into the tapdisk binary against tapdisk's
 * own headers (drivers/tapdisk.h, tapdisk-driver.h, tapdisk-interface.h, tapdisk-server.h,
 * scheduler.h, timeout-math.h, tapdisk-log.h, tapdisk-disktype.h in the xapi-project/blktap
 * tree). Those headers are not part of this project, so this file declares, in our own words,
 * the minimal subset the driver needs, with blktap3's names, types and signatures, so that:
 *
 *   - this project can compile the driver and test it against a test double of tapdisk
 *     (tests/unit/tapdisk_double.c), and
 *   - in a real blktap tree the same driver source compiles against the real headers: when
 *     HAVE_CONFIG_H (set by blktap's autotools build) or TAPDISK_REAL_HEADERS is defined, this
 *     file only includes them and declares nothing of its own.
 *
 * Only what the driver touches is declared. Structures tapdisk owns are cut down to the members
 * the driver reads or writes (td_driver_t) or the members a caller sets (td_request_t); their
 * layout here is not blktap's ABI, only its names. Do not add to this file what the driver does
 * not use.
 */
#ifndef PLX_TAPDISK_IFACE_H
#define PLX_TAPDISK_IFACE_H

#if defined(HAVE_CONFIG_H) || defined(TAPDISK_REAL_HEADERS)

/* ---- Inside a blktap tree: the real headers ------------------------------------------------- */
#include "tapdisk.h"
#include "tapdisk-driver.h"
#include "tapdisk-interface.h"
#include "tapdisk-server.h"
#include "tapdisk-log.h"
#include "scheduler.h"
#include "timeout-math.h"
#include "tapdisk-disktype.h"

#else

/* ---- Standalone: our declarations ----------------------------------------------------------- */
#include <stdint.h>
#include <sys/time.h>

/* drivers/tapdisk.h */
#define SECTOR_SHIFT 9
#define DEFAULT_SECTOR_SIZE 512
#define TD_NO_PARENT 1 /* td_get_parent_id: this image has no parent */

enum TD_OPS { TD_OP_READ = 0, TD_OP_WRITE, TD_OP_BLOCK_STATUS, TD_OPS_END };

/* Answers to TD_OP_BLOCK_STATUS, in td_request_t.status of each completed piece. */
#define TD_BLOCK_STATE_NONE 0
#define TD_BLOCK_STATE_HOLE (1 << 0)
#define TD_BLOCK_STATE_ZERO (1 << 1)

#define TD_OPEN_QUIET 0x00001
#define TD_OPEN_RDONLY 0x00004

typedef uint32_t td_flag_t;
typedef uint64_t td_sector_t;
typedef struct td_disk_id td_disk_id_t;
typedef struct td_disk_info td_disk_info_t;
typedef struct td_request td_request_t;
typedef struct td_driver_handle td_driver_t;
typedef struct td_image_handle td_image_t;      /* opaque here */
typedef struct td_vbd_request td_vbd_request_t; /* opaque here */
typedef struct td_stats td_stats_t;             /* opaque here (tapdisk-stats.h) */

/* Called by td_complete_request(); tapdisk sets it, a driver never calls it directly. */
typedef void (*td_callback_t)(td_request_t, int);

struct td_disk_id {
    char *name;
    int type;
    int flags;
};

/* What open() reports: size in sectors of sector_size bytes. */
struct td_disk_info {
    td_sector_t size;
    long sector_size;
    uint32_t info;
};

/* One request, passed by value. A driver may complete it in pieces (copies with adjusted
 * sec/secs/buf); every sector must be completed exactly once. */
struct td_request {
    int op;
    void *buf;
    int status; /* block status answers: TD_BLOCK_STATE_* */
    td_sector_t sec;
    int secs;
    td_image_t *image;
    td_callback_t cb;
    void *cb_data;
    int sidx;
    td_vbd_request_t *vreq;
};

/* Encryption parameters handed to open(); Parallax refuses a key. */
struct td_vbd_encryption {
    uint8_t key_size;
    uint8_t *encryption_key;
};

/* A driver: its type name, flags, the size of the private state tapdisk allocates for each
 * open image (driver->data), and its callbacks. */
struct tap_disk {
    const char *disk_type;
    td_flag_t flags;
    int private_data_size;
    int (*td_open)(td_driver_t *, const char *, struct td_vbd_encryption *encryption, td_flag_t);
    int (*td_close)(td_driver_t *);
    int (*td_get_parent_id)(td_driver_t *, td_disk_id_t *);
    int (*td_validate_parent)(td_driver_t *, td_driver_t *, td_flag_t);
    void (*td_queue_read)(td_driver_t *, td_request_t);
    void (*td_queue_block_status)(td_driver_t *, td_request_t);
    void (*td_queue_write)(td_driver_t *, td_request_t);
    void (*td_debug)(td_driver_t *);
    void (*td_stats)(td_driver_t *, td_stats_t *);
    int (*td_rrd)(td_driver_t *, char *buf, int *const off, int *const size);
};

/* drivers/tapdisk-driver.h (cut down: the real handle also has log limiting, list linkage and
 * the tiocb hooks, which this driver does not use). */
#define TD_DRIVER_OPEN 0x0001
#define TD_DRIVER_RDONLY 0x0002
#define SECTOR_SIZE 512

struct td_driver_handle {
    int type;
    char *name;
    int storage;
    int refcnt;
    td_flag_t state;
    td_disk_info_t info;
    void *data; /* private_data_size bytes, zeroed, allocated by tapdisk */
    const struct tap_disk *ops;
};

/* drivers/tapdisk-interface.h */
void td_complete_request(td_request_t, int);

/* drivers/scheduler.h */
#define SCHEDULER_POLL_READ_FD 0x1
#define SCHEDULER_POLL_WRITE_FD 0x2
#define SCHEDULER_POLL_EXCEPT_FD 0x4
#define SCHEDULER_POLL_TIMEOUT 0x8

typedef int32_t event_id_t;
typedef void (*event_cb_t)(event_id_t id, char mode, void *private);

/* drivers/timeout-math.h */
#define TV_ZERO ((struct timeval){0, 0})
#define TV_INF ((struct timeval){(time_t)-1, 0})

/* drivers/tapdisk-server.h: returns the event id (>= 0) or a negative errno. */
event_id_t tapdisk_server_register_event(char mode, int fd, struct timeval timeout, event_cb_t cb,
                                         void *private);
void tapdisk_server_unregister_event(event_id_t id);
/* A timeout event's timeout from now on (TV_INF: never); 0 or a negative errno. */
int tapdisk_server_event_set_timeout(event_id_t id, struct timeval timeout);

/* drivers/tapdisk-log.h */
#define TLOG_WARN 0
#define TLOG_INFO 1
#define TLOG_DBG 2
void tlog_syslog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* drivers/tapdisk-disktype.h: the existing ids end at 15 (nbd); 16 is retired. */
#define DISK_TYPE_NBD 15
#define DISK_TYPE_PARALLAX 17

#endif /* standalone */

#endif
