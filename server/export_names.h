/*
 * export_names.h - the names the NBD server exports (every VDI, every live snapshot, labels).
 */
#ifndef PLX_EXPORT_NAMES_H
#define PLX_EXPORT_NAMES_H

#include "parallax.h"

/* Receives one export name and its description (NULL: none); returns 0 or -errno to stop. */
typedef int (*plx_export_fn)(void *arg, const char *name, const char *desc);

/* Call fn for every export of st, in order: each live VDI, then each of its live snapshots as
 * VDI@N and, when labelled, VDI@LABEL (described as the VDI@N it names). Returns 0, the first
 * non-zero value fn returned, or the engine's -errno. */
int plx_export_names(plx_store *st, plx_export_fn fn, void *arg);

#endif
