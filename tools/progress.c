/*
 * progress.c - the progress line of long commands: see progress.h.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"
#include "size.h"

#define REDRAW_SECONDS 0.1

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void progress_init(struct progress *p, const char *what, int quiet)
{
    memset(p, 0, sizeof *p);
    p->on = !quiet && isatty(STDERR_FILENO);
    p->what = what;
    p->start = now();
}

/* Draw p->line if the last redraw is old enough (or `force`). */
static void draw(struct progress *p, int force)
{
    double t = now();
    if (!force && p->drawn && t - p->last < REDRAW_SECONDS)
        return;
    /* \r back to the start of the line, \033[K clears what a longer line left behind. */
    fprintf(stderr, "\r%s\033[K", p->line);
    fflush(stderr);
    p->drawn = 1;
    p->last = t;
}

static int percent(uint64_t done, uint64_t total)
{
    return total ? (int)((double)done * 100.0 / (double)total) : 0;
}

void progress_bytes(struct progress *p, uint64_t done, uint64_t total)
{
    if (!p->on)
        return;
    char d[32], t[32], r[32];
    double secs = now() - p->start;
    plx_size_format(done, d, sizeof d);
    plx_size_format(secs > 0 ? (uint64_t)((double)done / secs) : 0, r, sizeof r);
    if (total) {
        plx_size_format(total, t, sizeof t);
        snprintf(p->line, sizeof p->line, "%s: %s of %s (%d%%), %s/s", p->what, d, t,
                 percent(done, total), r);
    } else {
        snprintf(p->line, sizeof p->line, "%s: %s, %s/s", p->what, d, r);
    }
    draw(p, 0);
}

void progress_step(void *arg, const char *step, uint64_t done, uint64_t total)
{
    struct progress *p = arg;
    if (!p->on)
        return;
    if (total)
        snprintf(p->line, sizeof p->line, "%s: %s, %llu of %llu (%d%%)", p->what, step,
                 (unsigned long long)done, (unsigned long long)total, percent(done, total));
    else
        snprintf(p->line, sizeof p->line, "%s: %s", p->what, step);
    draw(p, 0);
}

void progress_end(struct progress *p)
{
    if (!p->on || !p->line[0])
        return;
    draw(p, 1);
    fputc('\n', stderr);
    p->drawn = 0;
}

void progress_clear(struct progress *p)
{
    if (!p->on || !p->drawn)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->drawn = 0;
}
