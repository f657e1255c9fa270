/*
 * progress.h - the progress line of long commands (vdi-import, vdi-export, check, gc).
 *
 * Drawn on standard error, and only when standard error is a terminal and --quiet was not
 * given: a pipe, a log file or a script sees nothing. At most ten redraws a second, each
 * overwriting the line (\r); progress_end() leaves the last state on screen and ends the line,
 * progress_clear() erases it.
 */
#ifndef PLX_TOOLS_PROGRESS_H
#define PLX_TOOLS_PROGRESS_H

#include <stdint.h>

struct progress {
    int on;           /* drawing at all */
    int drawn;        /* a line is on screen, not yet ended */
    const char *what; /* the command, leading the line */
    double start;     /* monotonic seconds */
    double last;      /* when the line was last drawn */
    char line[160];   /* the state last shown or pending */
};

/* Start a progress line for command `what`, drawn only if stderr is a tty and !quiet. */
void progress_init(struct progress *p, const char *what, int quiet);
/* Bytes copied so far of total (0: unknown), with the rate. */
void progress_bytes(struct progress *p, uint64_t done, uint64_t total);
/* A step of work counted in units (a plx_progress_fn: arg is the struct progress). */
void progress_step(void *arg, const char *step, uint64_t done, uint64_t total);
/* Show the last state and end the line (nothing when nothing was drawn). */
void progress_end(struct progress *p);
/* Erase the line, before printing something else on the terminal or when the result printed
 * next says it all; a later update draws it again. */
void progress_clear(struct progress *p);

#endif
