/*
 * host_id.c - the configured host id (backend.h): what names this machine to the lock manager
 * (the engine's identity, lock.c) and to an iSCSI target (the initiator name, backend_iscsi.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend.h"

/* One word on the first line of /etc/parallax/host-id, if the file exists. */
static int host_id_file(char *buf, size_t len)
{
    FILE *f = fopen("/etc/parallax/host-id", "r");
    if (!f)
        return 0;
    int ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (ok)
        buf[strcspn(buf, " \t\r\n")] = 0;
    return ok && *buf;
}

void plx_host_id_default(char *out, size_t len)
{
    const char *env = getenv("PARALLAX_HOST_ID");
    if (env && *env)
        snprintf(out, len, "%s", env);
    else if (!host_id_file(out, len) && gethostname(out, len - 1) != 0)
        snprintf(out, len, "localhost");
    out[len - 1] = 0;
}
