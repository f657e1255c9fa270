/*
 * xen_attach.c - which Xen domains have a VDI attached. Block backends live in dom0's xenstore
 * under /local/domain/0/backend/vbd (blkback, fed by the block-parallax hotplug script) and
 * .../vbd3 (tapdisk on Xen 4.19+); their `params` node holds the target: "VDI",
 * "BLOCKSTORE:VDI" or "parallax:..." (xen-configs/). We read it with the xenstore-list and
 * xenstore-read tools, which use the Xen libraries and answer only where a xenstore runs.
 */
#include "xen_attach.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Run a xenstore tool; one line of output per entry. Returns the number of lines, -1 on error. */
static int xs_lines(const char *tool, const char *path, char lines[][512], int max)
{
    char cmd[700];
    /* Paths are built from numbers and fixed words only, so quoting them is enough. */
    snprintf(cmd, sizeof cmd, "%s '%s' 2>/dev/null", tool, path);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    int n = 0;
    char buf[512];
    while (n < max && fgets(buf, sizeof buf, p)) {
        buf[strcspn(buf, "\n")] = 0;
        snprintf(lines[n++], 512, "%s", buf);
    }
    int rc = pclose(p);
    return rc == 0 ? n : -1;
}

static void read_node(const char *path, char *out, size_t len)
{
    char line[1][512];
    out[0] = 0;
    if (xs_lines("xenstore-read", path, line, 1) == 1)
        snprintf(out, len, "%.*s", (int)len - 1, line[0]);
}

static int add(struct xen_attach **out, size_t *n, unsigned domid, const char *params)
{
    struct xen_attach *a = realloc(*out, (*n + 1) * sizeof *a);
    if (!a)
        return -1;
    *out = a;
    a = &a[(*n)++];
    memset(a, 0, sizeof *a);
    a->domid = domid;
    snprintf(a->params, sizeof a->params, "%s", params);
    char path[64];
    snprintf(path, sizeof path, "/local/domain/%u/name", domid);
    read_node(path, a->domname, sizeof a->domname);
    return 0;
}

int xen_attachments(struct xen_attach **out, size_t *n)
{
    static char doms[256][512], devs[256][512];
    static const char *const kinds[] = {"vbd", "vbd3"};
    *out = NULL;
    *n = 0;
    /* The domain list answers only where a xenstore runs. */
    if (xs_lines("xenstore-list", "/local/domain", doms, 1) < 0)
        return 0;
    for (int k = 0; k < 2; k++) {
        char base[64];
        snprintf(base, sizeof base, "/local/domain/0/backend/%s", kinds[k]);
        int nd = xs_lines("xenstore-list", base, doms, 256);
        for (int d = 0; d < nd; d++) {
            char path[700];
            snprintf(path, sizeof path, "%s/%.40s", base, doms[d]);
            int nv = xs_lines("xenstore-list", path, devs, 256);
            for (int v = 0; v < nv; v++) {
                char node[1300], params[512], script[512];
                snprintf(node, sizeof node, "%s/%.40s/params", path, devs[v]);
                read_node(node, params, sizeof params);
                snprintf(node, sizeof node, "%s/%.40s/script", path, devs[v]);
                read_node(node, script, sizeof script);
                int ours = strstr(script, "block-parallax") != NULL ||
                           strncmp(params, "parallax:", 9) == 0;
                if (ours && params[0])
                    add(out, n, (unsigned)strtoul(doms[d], NULL, 10), params);
            }
        }
    }
    return 1;
}

int xen_attach_names(const struct xen_attach *a, const char *name)
{
    const char *p = a->params;
    if (strncmp(p, "parallax:", 9) == 0)
        p += 9;
    if (strcmp(p, name) == 0)
        return 1;
    /* BLOCKSTORE:VDI: the blockstore is a path, the VDI follows the last colon after it. */
    const char *colon = strrchr(p, ':');
    return colon && strchr(p, '/') && strcmp(colon + 1, name) == 0;
}
