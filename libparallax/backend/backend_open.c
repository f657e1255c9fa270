/*
 * backend_open.c - the table of URL schemes: which backend a blockstore's name opens
 * (plx_backend_open, parallax_backend.h), whether the name is a URL, and which backends are the
 * library's own; where a URL ends and how it is shown (plx_blockstore_url_len,
 * plx_blockstore_shown: tapdisk's "URL:VDI" parameters, the command line's listings). Store open,
 * format, tapdisk and the command line find a backend through it; a new backend is its file and
 * one line here.
 */
#include <string.h>

#include "backend.h"
#include "backend_mem_shared.h"

/* In order; the first whose prefix the name starts with opens it. The last has none: a path. */
static const struct plx_backend_scheme *const schemes[] = {
    &plx_backend_iscsi_scheme, /* iscsi://[user%password@]host[:port]/target-iqn/lun */
    &plx_backend_file_scheme,  /* a file or a block device */
};
#define NSCHEMES (sizeof(schemes) / sizeof(schemes[0]))

const struct plx_backend_scheme *plx_backend_scheme_of(const char *where)
{
    for (size_t i = 0; i < NSCHEMES; i++) {
        const char *p = schemes[i]->prefix;
        if (p == NULL || (where != NULL && strncmp(where, p, strlen(p)) == 0))
            return schemes[i];
    }
    return schemes[NSCHEMES - 1];
}

plx_backend *plx_backend_open(const char *where, unsigned flags, int *err, char *errbuf,
                              size_t errlen)
{
    return plx_backend_scheme_of(where)->open(where, flags, err, errbuf, errlen);
}

int plx_blockstore_is_url(const char *where)
{
    return plx_backend_scheme_of(where)->prefix != NULL;
}

size_t plx_blockstore_url_len(const char *s)
{
    const struct plx_backend_scheme *scheme = plx_backend_scheme_of(s);
    return scheme->prefix != NULL && scheme->url_len != NULL ? scheme->url_len(s) : 0;
}

const char *plx_blockstore_shown(const char *where, char *buf, size_t len)
{
    const struct plx_backend_scheme *scheme = plx_backend_scheme_of(where);
    return scheme->shown != NULL ? scheme->shown(where, buf, len) : where;
}

int plx_backend_own(const plx_backend *be)
{
    for (size_t i = 0; i < NSCHEMES; i++)
        if (be->ops == schemes[i]->ops)
            return 1;
    return plx_backend_mem_table(be) != NULL;
}
