/*
 * medium_path.h - is a path the store's medium (medium_path.c)?
 */
#ifndef PLX_MEDIUM_PATH_H
#define PLX_MEDIUM_PATH_H

#include <stdbool.h>

/* Would writing `path` reach the bytes of `medium` (a file or block device), or the other way
 * round: the same file or device (through symlinks and bind mounts too), a file on the device, a
 * loop device over the file, a partition and its disk. False when either does not exist (an
 * iSCSI URL is never a path on this host). */
bool plx_path_on_medium(const char *medium, const char *path);

#endif
