/*
 * bind.h - what a program built against API 1.7 links to, for install.sh's build of
 * install_prog.c beside this directory's parallax_backend.h (API 1.7's, as installed then: its
 * struct plx_backend_ops ends at lock). Linking against the library of now would bind the
 * functions that changed in 1.8 to their new default versions; a program linked against 1.7 has
 * the versions of then, PARALLAX_1, which these directives ask for (force-included: cc -include).
 */
__asm__(".symver plx_backend_stack_forward_ops,plx_backend_stack_forward_ops@PARALLAX_1");
__asm__(".symver plx_store_open_backend,plx_store_open_backend@PARALLAX_1");
__asm__(".symver plx_store_upgrade_backend,plx_store_upgrade_backend@PARALLAX_1");
