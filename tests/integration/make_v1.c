/*
 * make_v1.c - test-only tool: rewrite a blockstore file made by this Parallax (format version 2)
 * as format version 1, for tests/integration/cli_upgrade.sh. Version 1 can no longer be made by
 * `parallax format`; this is the unit tests' tu_make_v1 (tests/unit/testutil.c: every record
 * copied into its legacy slot, the version-1 state block and superblock) on a file.
 *
 *   make-v1 STORE
 *
 * Exit status 0 when the store was rewritten (it runs as a one-test Check suite, since
 * tu_make_v1 asserts with Check).
 */
#include <stdio.h>
#include "parallax_backend.h"
#include "testutil.h"

static const char *store_path;

/* tu_make_v1 asserts with Check, so it runs as a test. */
START_TEST(test_make_v1)
{
    int err = 0;
    char msg[256] = "";
    plx_backend *be =
        plx_backend_file_open(store_path, PLX_BACKEND_BLOCKING, &err, msg, sizeof msg);
    ck_assert_msg(be != NULL, "%s: %s", store_path, msg);
    tu_make_v1(be);
    be->ops->destroy(be);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make-v1 STORE\n");
        return 2;
    }
    store_path = argv[1];
    Suite *s = suite_create("make-v1");
    TCase *tc = tcase_create("make-v1");
    tcase_add_test(tc, test_make_v1);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
