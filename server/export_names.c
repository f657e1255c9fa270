/*
 * export_names.c - the names a Parallax NBD server exports (see export_names.h).
 */
#include <stdio.h>
#include <stdlib.h>

#include "export_names.h"

static int snapshot_names(plx_store *st, const struct plx_vdi_info *vdi, plx_export_fn fn,
                          void *arg)
{
    struct plx_snap_info *snaps = NULL;
    size_t ns = 0;
    int rc = plx_snap_list(st, vdi->id, &snaps, &ns);
    for (size_t k = 0; !rc && k < ns; k++) {
        if (snaps[k].deleted)
            continue;
        char name[PLX_NAME_MAX + 32], label[PLX_NAME_MAX + PLX_LABEL_MAX + 2];
        snprintf(name, sizeof name, "%s@%llu", vdi->name, (unsigned long long)snaps[k].index);
        rc = fn(arg, name, NULL);
        /* A labelled snapshot is also exported as VDI@LABEL: list that name too, saying which
         * snapshot it is. */
        if (!rc && snaps[k].label[0]) {
            snprintf(label, sizeof label, "%s@%s", vdi->name, snaps[k].label);
            rc = fn(arg, label, name);
        }
    }
    free(snaps);
    return rc;
}

int plx_export_names(plx_store *st, plx_export_fn fn, void *arg)
{
    struct plx_vdi_info *vdis = NULL;
    size_t n = 0;
    int rc = plx_vdi_list(st, &vdis, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (vdis[i].deleted)
            continue;
        rc = fn(arg, vdis[i].name, NULL);
        if (!rc)
            rc = snapshot_names(st, &vdis[i], fn, arg);
    }
    free(vdis);
    return rc;
}
