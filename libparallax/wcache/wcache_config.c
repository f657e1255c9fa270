/*
 * wcache_config.c - the write-cache settings a program starts with when no option names a log:
 * "key=value" settings (write-cache=PATH, write-cache-size=SIZE, write-cache-mode=on|auto,
 * write-cache-threshold=MS), from the tapdisk parameters
 * or from the host's settings file /etc/parallax/write-cache ($PARALLAX_WRITE_CACHE_FILE). One
 * parser, so that `serve` and the tapdisk driver read the same words the same way.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallax.h"
#include "size.h"

#define WCACHE_CONF_DEFAULT "/etc/parallax/write-cache"

/* The value of a "write-cache-size=" line (not NUL-terminated), in the command line's syntax. */
static int parse_size(const char *s, size_t n, uint64_t *out)
{
    char buf[32];
    if (n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return plx_size_parse(buf, out);
}

int plx_wcache_config_set(struct plx_wcache_config *c, const char *setting, size_t len, char *err,
                          size_t errlen)
{
    static const char path_key[] = "write-cache=", size_key[] = "write-cache-size=";
    if (len >= sizeof path_key - 1 && strncmp(setting, path_key, sizeof path_key - 1) == 0) {
        const char *v = setting + sizeof path_key - 1;
        size_t n = len - (sizeof path_key - 1);
        if (n == 0 || n >= sizeof c->path) {
            snprintf(err, errlen, "write-cache=%.*s: %s", (int)n, v,
                     n ? "the path is too long" : "names no log file");
            return -EINVAL;
        }
        memcpy(c->path, v, n);
        c->path[n] = '\0';
        return 0;
    }
    if (len >= sizeof size_key - 1 && strncmp(setting, size_key, sizeof size_key - 1) == 0) {
        const char *v = setting + sizeof size_key - 1;
        size_t n = len - (sizeof size_key - 1);
        if (parse_size(v, n, &c->size) < 0) {
            snprintf(err, errlen,
                     "write-cache-size=%.*s: expected bytes, or a number with K, M, G or T", (int)n,
                     v);
            return -EINVAL;
        }
        return 0;
    }
    static const char mode_key[] = "write-cache-mode=", thr_key[] = "write-cache-threshold=";
    if (len >= sizeof mode_key - 1 && strncmp(setting, mode_key, sizeof mode_key - 1) == 0) {
        const char *v = setting + sizeof mode_key - 1;
        size_t n = len - (sizeof mode_key - 1);
        if (n == 2 && strncmp(v, "on", 2) == 0) {
            c->mode = PLX_WCACHE_ON;
        } else if (n == 4 && strncmp(v, "auto", 4) == 0) {
            c->mode = PLX_WCACHE_AUTO;
        } else {
            snprintf(err, errlen, "write-cache-mode=%.*s: expected on or auto", (int)n, v);
            return -EINVAL;
        }
        return 0;
    }
    if (len >= sizeof thr_key - 1 && strncmp(setting, thr_key, sizeof thr_key - 1) == 0) {
        const char *v = setting + sizeof thr_key - 1;
        size_t n = len - (sizeof thr_key - 1);
        char num[32];
        char *end = num;
        double ms = 0;
        if (n > 0 && n < sizeof num) {
            memcpy(num, v, n);
            num[n] = '\0';
            ms = strtod(num, &end);
        }
        if (n == 0 || n >= sizeof num || *end || !(ms > 0 && ms <= 60000)) {
            snprintf(err, errlen,
                     "write-cache-threshold=%.*s: expected milliseconds, above 0 and at most "
                     "60000",
                     (int)n, v);
            return -EINVAL;
        }
        c->threshold_ms = ms;
        return 0;
    }
    return 1;
}

int plx_wcache_config_read(struct plx_wcache_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->mode = PLX_WCACHE_ON;
    const char *conf = getenv("PARALLAX_WRITE_CACHE_FILE");
    if (!conf || !*conf)
        conf = WCACHE_CONF_DEFAULT;
    FILE *f = fopen(conf, "re");
    if (!f) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        snprintf(err, errlen, "%s: %s", conf, strerror(e));
        return -e;
    }
    char line[4096 + 64];
    int rc = 0;
    for (unsigned no = 1; rc == 0 && fgets(line, sizeof line, f); no++) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strlen(p);
        while (n > 0 && strchr("\r\n \t", p[n - 1]))
            p[--n] = '\0';
        if (n == 0 || p[0] == '#')
            continue;
        char why[sizeof line + 128];
        int r = plx_wcache_config_set(c, p, n, why, sizeof why);
        if (r == 1)
            snprintf(why, sizeof why,
                     "'%s': expected write-cache=PATH, write-cache-size=SIZE, "
                     "write-cache-mode=on|auto or write-cache-threshold=MS",
                     p);
        if (r != 0) {
            snprintf(err, errlen, "%s line %u: %s", conf, no, why);
            rc = -EINVAL;
        }
    }
    fclose(f);
    if (rc == 0 && (c->size || c->mode != PLX_WCACHE_ON || c->threshold_ms) && !c->path[0]) {
        snprintf(err, errlen, "%s: the write-cache settings need write-cache=PATH", conf);
        rc = -EINVAL;
    }
    return rc;
}
