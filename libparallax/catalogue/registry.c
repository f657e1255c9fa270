/*
 * registry.c - the VDI registry (layer 4, registry.h): one record block per VDI, found by id
 * through the VDI table (vditab.c) and by name through the name index (nameidx.c); reading,
 * writing, finding and listing records. Creating, cloning and deleting VDIs is vdi_admin.c.
 *
 * Registry changes are read-modify-write under the admin lock, always reading slots fresh from
 * the medium: another process may have changed them. Writes are ordered so that a crash leaves
 * either the old registry or the new one: everything a record points to (root block, claims)
 * is flushed before the record is written.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lock.h"
#include "registry.h"
#include "system.h"

/* A VDI spec or snapshot suffix that is all digits is an id / index, not a name / label. */
bool plx_all_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

unsigned plx_height_for_size(uint64_t size)
{
    uint64_t blocks = (size + PLX_BLOCK_SIZE - 1) / PLX_BLOCK_SIZE;
    return blocks <= (1ull << (3 * PLX_RADIX_BITS)) ? PLX_HEIGHT_SMALL : PLX_HEIGHT_LARGE;
}

void plx_registry_seal(struct plx_vdi_record *rec, uint64_t slot_addr, void *block)
{
    memset(block, 0, PLX_BLOCK_SIZE);
    rec->version = 1;
    memcpy(block, rec, sizeof *rec);
    plx_blkhdr_seal(block, PLX_MAGIC_VDI, slot_addr);
    memcpy(rec, block, sizeof *rec);
}

static int record_check(plx_store *st, const struct plx_vdi_record *r, uint64_t addr)
{
    bool ok = r->id != 0 && r->size % PLX_BLOCK_SIZE == 0 &&
              r->size > 0 && r->size <= PLX_MAX_VDI_SIZE &&
              (r->height == PLX_HEIGHT_SMALL || r->height == PLX_HEIGHT_LARGE) &&
              r->height >= plx_height_for_size(r->size) && r->root != 0 &&
              r->root < st->sb.block_count && r->name[PLX_NAME_MAX] == 0 && r->name[0] != 0;
    if (!ok)
        return plx_err(st, -EUCLEAN, "the VDI record at block %llu is invalid",
                       (unsigned long long)addr);
    return 0;
}

int plx_registry_read(plx_store *st, uint64_t slot_addr, struct plx_vdi_record *rec)
{
    uint8_t *buf = plx_block_alloc(1);
    int rc = plx_sync_io(st, PLX_IO_READ, slot_addr, 1, buf, 0);
    const char *why = "";
    if (rc) {
        plx_err(st, rc, "reading the VDI record at block %llu: %s", (unsigned long long)slot_addr,
                strerror(-rc));
    } else {
        rc = plx_blkhdr_verify(buf, PLX_MAGIC_VDI, slot_addr, &why);
        if (rc == -EUCLEAN)
            plx_err(st, rc, "the VDI record at block %llu is corrupt: %s",
                    (unsigned long long)slot_addr, why);
        if (rc == 0) {
            memcpy(rec, buf, sizeof *rec);
            rc = record_check(st, rec, slot_addr);
        }
    }
    plx_block_free(buf);
    return rc;
}

int plx_registry_write(plx_store *st, uint64_t slot_addr, const struct plx_vdi_record *rec)
{
    uint8_t *buf = plx_block_alloc(1);
    struct plx_vdi_record copy = *rec;
    copy.seq++;
    plx_registry_seal(&copy, slot_addr, buf);
    int rc = plx_sync_io(st, PLX_IO_WRITE, slot_addr, 1, buf, 0);
    plx_block_free(buf);
    if (rc)
        return plx_err(st, rc, "writing the record of VDI %s: %s", rec->name, strerror(-rc));
    return 0;
}

bool plx_registry_legacy_slot(const plx_store *st, uint64_t rec_addr)
{
    return rec_addr >= st->sb.registry_start &&
           rec_addr < st->sb.registry_start + st->sb.registry_slots;
}

int plx_registry_get(plx_store *st, uint64_t id, struct plx_vdi_record *rec, uint64_t *rec_addr)
{
    uint64_t addr = 0;
    int rc = id && id < st->state.next_vdi_id ? plx_vditab_get(st, id, &addr) : 0;
    if (rc)
        return rc;
    if (addr == 0)
        return -ENOENT;
    rc = plx_registry_read(st, addr, rec);
    if (!rc && rec->id != id)
        rc = plx_err(st, -EUCLEAN, "VDI table: the entry of id %llu names the record of id %llu",
                     (unsigned long long)id, (unsigned long long)rec->id);
    if (!rc && rec_addr)
        *rec_addr = addr;
    return rc;
}

/* A live VDI named `name`: via the name index, each candidate's record compared. */
static int find_by_name(plx_store *st, const char *name, struct plx_vdi_record *rec,
                        uint64_t *rec_addr)
{
    uint64_t ids[16];
    size_t n = 0;
    int rc = plx_nameidx_lookup(st, plx_name_hash(name), ids, 16, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        rc = plx_registry_get(st, ids[i], rec, rec_addr);
        if (rc == -ENOENT) {
            rc = 0; /* an entry no VDI stands behind (FORMAT.md §7.2) */
            continue;
        }
        if (!rc && !(rec->flags & PLX_VDI_DELETED) && strcmp(rec->name, name) == 0)
            return 0;
    }
    return rc ? rc : -ENOENT;
}

int plx_record_unwritten(plx_store *st, const struct plx_vdi_record *rec, const char *then)
{
    if (rec->lock_host && !plx_holder_stale(st, rec->lock_host, rec->lock_pid, rec->lock_epoch))
        return plx_err(st, -EBUSY, "VDI %s is open for writing (pid %u)%s", rec->name,
                       rec->lock_pid, then);
    return 0;
}

int plx_registry_find(plx_store *st, const char *spec, struct plx_vdi_record *rec,
                      uint64_t *rec_addr)
{
    int rc = plx_state_read(st);
    if (rc)
        return rc;
    rc = strlen(spec) <= PLX_NAME_MAX ? find_by_name(st, spec, rec, rec_addr) : -ENOENT;
    if (rc == -ENOENT && plx_all_digits(spec)) {
        rc = plx_registry_get(st, strtoull(spec, NULL, 10), rec, rec_addr);
        if (!rc && (rec->flags & PLX_VDI_DELETED))
            rc = -ENOENT;
    }
    if (rc == -ENOENT && plx_all_digits(spec))
        return plx_err(st, -ENOENT, "no VDI named '%s' and none with id %s", spec, spec);
    if (rc == -ENOENT)
        return plx_err(st, -ENOENT, "no VDI named '%s'", spec);
    return rc;
}

struct each {
    plx_store *st;
    plx_registry_fn fn;
    void *arg;
};

static int each_entry(void *arg, uint64_t id, uint64_t rec_addr)
{
    struct each *e = arg;
    struct plx_vdi_record rec;
    int rc = plx_registry_read(e->st, rec_addr, &rec);
    if (!rc && rec.id != id)
        rc = plx_err(e->st, -EUCLEAN,
                     "VDI table: the entry of id %llu names the record of id %llu",
                     (unsigned long long)id, (unsigned long long)rec.id);
    return rc ? rc : e->fn(e->arg, &rec, rec_addr);
}

int plx_registry_each(plx_store *st, uint64_t after_id, plx_registry_fn fn, void *arg)
{
    int rc = plx_state_read(st);
    if (rc)
        return rc;
    struct each e = {st, fn, arg};
    return plx_vditab_walk(st, after_id, NULL, each_entry, &e);
}

int plx_registry_link(plx_store *st, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    uint64_t old = 0;
    int rc = plx_vditab_set(st, rec->id, rec_addr, &old);
    /* A create that crashed before its state block landed may have left this id's entry and
     * its name in the index: take that name out, so stale entries do not pile up. */
    if (!rc && old && old != rec_addr) {
        struct plx_vdi_record prev;
        int prc = plx_registry_read(st, old, &prev);
        if (prc == 0 && prev.id == rec->id)
            rc = plx_nameidx_remove(st, plx_name_hash(prev.name), prev.id);
        else if (prc)
            st->errmsg[0] = 0; /* never durable, or its block reused: nothing to take out */
    }
    if (!rc)
        rc = plx_nameidx_insert(st, plx_name_hash(rec->name), rec->id);
    return rc;
}

int plx_registry_unname(plx_store *st, const struct plx_vdi_record *rec)
{
    return plx_nameidx_remove(st, plx_name_hash(rec->name), rec->id);
}

int plx_registry_purge(plx_store *st, const struct plx_vdi_record *rec)
{
    int rc = plx_registry_unname(st, rec);
    if (!rc)
        rc = plx_vditab_set(st, rec->id, 0, NULL);
    return rc;
}

void plx_record_to_info(const plx_store *st, const struct plx_vdi_record *rec,
                        struct plx_vdi_info *out)
{
    memset(out, 0, sizeof *out);
    out->id = rec->id;
    snprintf(out->name, sizeof out->name, "%s", rec->name);
    out->size = rec->size;
    out->height = rec->height;
    out->root = rec->root;
    out->snap_count = rec->snap_count;
    out->parent_id = rec->parent_id;
    out->parent_snap = rec->parent_snap;
    out->created_ns = rec->created_ns;
    out->deleted = (rec->flags & PLX_VDI_DELETED) != 0;
    if (rec->lock_host && !plx_holder_stale(st, rec->lock_host, rec->lock_pid, rec->lock_epoch)) {
        if (rec->lock_host == st->host_hash) {
            snprintf(out->lock_holder, sizeof out->lock_holder, "%.40s pid %u", st->host,
                     rec->lock_pid);
            out->lock_pid = rec->lock_pid;
        }
        else
            snprintf(out->lock_holder, sizeof out->lock_holder, "host %016llx pid %u",
                     (unsigned long long)rec->lock_host, rec->lock_pid);
    }
}

int plx_vdi_lookup(plx_store *st, const char *vdi, struct plx_vdi_info *out)
{
    struct plx_vdi_record rec;
    int rc = plx_registry_find(st, vdi, &rec, NULL);
    if (rc)
        return rc;
    plx_record_to_info(st, &rec, out);
    return 0;
}

struct list_all {
    plx_store *st;
    struct plx_vdi_info *v;
    size_t n, cap;
};

static int list_one(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    (void)rec_addr;
    struct list_all *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct plx_vdi_info *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return plx_err(l->st, -ENOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    plx_record_to_info(l->st, rec, &l->v[l->n++]);
    return 0;
}

int plx_vdi_list(plx_store *st, struct plx_vdi_info **out, size_t *count)
{
    struct list_all l = {st, NULL, 0, 0};
    *out = NULL;
    *count = 0;
    int rc = plx_registry_each(st, 0, list_one, &l);
    if (rc) {
        free(l.v);
        return rc;
    }
    *out = l.v ? l.v : calloc(1, sizeof *l.v);
    *count = l.n;
    return *out ? 0 : plx_err(st, -ENOMEM, "out of memory");
}

struct list_each {
    plx_store *st;
    plx_vdi_list_fn fn;
    void *arg;
};

static int list_each_one(void *arg, const struct plx_vdi_record *rec, uint64_t rec_addr)
{
    (void)rec_addr;
    struct list_each *l = arg;
    struct plx_vdi_info info;
    plx_record_to_info(l->st, rec, &info);
    return l->fn(l->arg, &info);
}

int plx_vdi_list_each(plx_store *st, uint64_t after_id, plx_vdi_list_fn fn, void *arg)
{
    struct list_each l = {st, fn, arg};
    return plx_registry_each(st, after_id, list_each_one, &l);
}
