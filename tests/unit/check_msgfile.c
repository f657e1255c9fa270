/*
 * check_msgfile.c - room for Check's message file, taken before a test starts writing to it.
 *
 * Check (0.15) reports each test's progress and result through a temporary file that the runner
 * creates with mkstemp() in $TEMP (else /tmp) before it forks the test: every passing ck_assert
 * appends a 35-byte "location" message, the end of the test a "duration" message, and after the
 * test exits the runner reads the messages back in order. The writer ignores what fflush()
 * returns (check_pack.c, ppack), so a write that the file system cuts short (no room for the
 * next block: a full disk; the crash harness writes some hundreds of KiB per test, so it crosses
 * a block boundary every hundred assertions) loses the tail of one message while the test goes
 * on writing whole ones. The reader then parses from the middle of a message and the whole run
 * dies: "check_pack.c:156: Bad message type arg 1537125" is the runner reading the bytes at
 * offset 6 of a location message ("\0\x17te" of the name length 23 and "tests/unit/...") after
 * 6 bytes of the message before it were lost (tests/check-msgfile-full.sh makes it happen).
 *
 * The unit tests are linked with -Wl,--wrap=mkstemp (Makefile), so the runner's mkstemp()
 * comes here: a file of Check's gets its space allocated at once (FALLOC_FL_KEEP_SIZE: the file
 * stays empty, so the reader still stops at the last message), and the test's writes land in
 * blocks it already has. A file system with no room even for that makes the runner wait for
 * room (a disk filled by someone else is usually emptied again soon) and, after a minute, fail
 * with Check's own "Unable to create temporary file" instead of a corrupt report.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int __real_mkstemp(char *tmpl);
int __wrap_mkstemp(char *tmpl);

/* Space taken for each test's messages: 8 MiB, some 25 times what the longest test measured
 * writes (the crash harness's claim-ahead workload: 8,278 passing assertions, 290 KiB).
 * Unwritten extents on ext4 cost no writes; the file is deleted once the test has been read. */
#define RESERVE_BYTES (8ll << 20)
#define WAIT_SECONDS 60

static int is_check_file(const char *path)
{
    const char *base = strrchr(path, '/');
    return strncmp(base ? base + 1 : path, "check_", 6) == 0;
}

int __wrap_mkstemp(char *tmpl)
{
    int fd = __real_mkstemp(tmpl);
    if (fd < 0 || !is_check_file(tmpl))
        return fd;
    for (int waited_ms = 0;; waited_ms += 100) {
        if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, RESERVE_BYTES) == 0)
            return fd;
        int err = errno;
        if (err == EOPNOTSUPP || err == ENOSYS)
            return fd; /* a file system that cannot reserve: as before */
        if ((err != ENOSPC && err != EDQUOT) || waited_ms >= WAIT_SECONDS * 1000) {
            fprintf(stderr, "unit test runner: no room for Check's message file %s: %s\n", tmpl,
                    strerror(err));
            close(fd);
            unlink(tmpl);
            errno = err;
            return -1;
        }
        if (waited_ms == 0)
            fprintf(stderr,
                    "unit test runner: no room for Check's message file %s (%s); waiting up to "
                    "%d s\n",
                    tmpl, strerror(err), WAIT_SECONDS);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
}
