/*
 * signature.h - what a file or device already holds (signature.c).
 */
#ifndef PLX_TOOLS_SIGNATURE_H
#define PLX_TOOLS_SIGNATURE_H

#include <stddef.h>

/* Look for a known signature in `path`: a disk image format, a file system, swap, LVM, RAID, an
 * encrypted volume, a partition table. 1 when one is found (`what` receives it in words, such as
 * "a qcow2 image" or "an ext4 file system"), 0 when none is (or path does not exist, or is
 * empty), or a negative errno. Reads only. */
int signature_probe(const char *path, char *what, size_t len);

#endif
