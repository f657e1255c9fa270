/*
 * test_scheme.c - what the table of URL schemes (backend_open.c) answers about a blockstore's
 * name without opening it: whether it is a URL, where the URL ends (plx_blockstore_url_len:
 * tapdisk's "URL:VDI" parameters) and how it is shown (plx_blockstore_shown: no password in
 * the command line's listings). Names only: no target is reached.
 */
#include <string.h>

#include "parallax.h"
#include "testutil.h"

#define URL "iscsi://host.example:3260/iqn.2026-11.org.parallax:store/12"

START_TEST(test_url_len)
{
    /* A whole URL, alone or with a name after it: it ends after the LUN number. An IQN holds
     * colons, so the first colon is not where it ends. */
    ck_assert_uint_eq(plx_blockstore_url_len(URL), strlen(URL));
    ck_assert_uint_eq(plx_blockstore_url_len(URL ":web1@gold"), strlen(URL));
    ck_assert_uint_eq(plx_blockstore_url_len(URL ":"), strlen(URL));
    ck_assert_uint_eq(plx_blockstore_url_len("iscsi://u%p@h/iqn.x:y/0:v"),
                      strlen("iscsi://u%p@h/iqn.x:y/0"));
    /* A URL cut short names no whole LUN. */
    ck_assert_uint_eq(plx_blockstore_url_len("iscsi://host"), 0);
    ck_assert_uint_eq(plx_blockstore_url_len("iscsi://host/iqn.x:y"), 0);
    ck_assert_uint_eq(plx_blockstore_url_len("iscsi://host/iqn.x:y/"), 0);
    ck_assert_uint_eq(plx_blockstore_url_len("iscsi://host/iqn.x:y/lun:v"), 0);
    /* Not a URL at all. */
    ck_assert_uint_eq(plx_blockstore_url_len("/dev/disk/by-path/pci-0000:00:1f.2/1:web1"), 0);
    ck_assert_uint_eq(plx_blockstore_url_len("web1"), 0);
    ck_assert_uint_eq(plx_blockstore_url_len(""), 0);
    ck_assert_int_ne(plx_blockstore_is_url(URL), 0);
    ck_assert_int_eq(plx_blockstore_is_url("/srv/store.img"), 0);
}
END_TEST

START_TEST(test_shown)
{
    char buf[256];
    /* The CHAP password goes; the user stays. */
    const char *s = plx_blockstore_shown("iscsi://plx%s3cret@host:3260/iqn.x:y/1", buf, sizeof buf);
    ck_assert_str_eq(s, "iscsi://plx@host:3260/iqn.x:y/1");
    /* Nothing to hide: the name itself. */
    const char *names[] = {
        "iscsi://plx@host/iqn.x:y/1", /* a user, no password */
        "iscsi://host/iqn.x:y/1",     /* no credentials */
        "iscsi://host/iqn.x%y@z/1",   /* '%' and '@' past the host: not credentials */
        "/srv/a%b@c.img",             /* a path */
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ck_assert_ptr_eq(plx_blockstore_shown(names[i], buf, sizeof buf), names[i]);
}
END_TEST

static Suite *scheme_suite(void)
{
    Suite *s = suite_create("scheme");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_url_len);
    tcase_add_test(tc, test_shown);
    suite_add_tcase(s, tc);
    return s;
}

TU_MAIN(scheme_suite)
