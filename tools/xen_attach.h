/*
 * xen_attach.h - which Xen domains have a VDI attached, from xenstore.
 */
#ifndef PLX_TOOLS_XEN_ATTACH_H
#define PLX_TOOLS_XEN_ATTACH_H

#include <stddef.h>

struct xen_attach {
    char params[512]; /* the backend's target, as the hotplug script or tapdisk got it */
    unsigned domid;
    char domname[64];
};

/* Read every block backend whose target names a Parallax disk. Returns 1 when a xenstore
 * answered (the list may be empty), 0 when there is none here (no Xen tools or no daemon).
 * *out is malloc'd. */
int xen_attachments(struct xen_attach **out, size_t *n);

/* Does this attachment's target name the VDI `name`? */
int xen_attach_names(const struct xen_attach *a, const char *name);

#endif
