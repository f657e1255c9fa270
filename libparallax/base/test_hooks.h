/*
 * test_hooks.h - environment variables that exist only for tests (a window held open between two
 * steps to force an interleaving, a device limit made small), compiled only into test builds.
 *
 * The Makefile builds the library's files that read one a second time with -DPLX_TEST_HOOKS, for
 * the unit tests (build/test/libparallax.a, and the sanitized build) and for build/test/parallax,
 * which the integration scripts that need a hook run. The library others link (libparallax.so
 * and .a) and the installed command read none: there the hook's name is not even in the binary
 * (tests/integration/abi_versions.sh looks). docs/DESIGN.md, "The library as others link it".
 */
#ifndef PLX_TEST_HOOKS_H
#define PLX_TEST_HOOKS_H

#include <stdlib.h>

/* The value of the test hook `name` (an environment variable), or NULL: always NULL outside test
 * builds, where the name is dropped with the call. */
#ifdef PLX_TEST_HOOKS
#define plx_test_hook(name) getenv(name)
#else
#define plx_test_hook(name) ((const char *)NULL)
#endif

#endif
