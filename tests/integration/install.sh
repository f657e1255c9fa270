#!/usr/bin/env bash
# make install / make uninstall into a DESTDIR, as a library user sees it:
# - every promised file lands under PREFIX (the command, the plugin, libparallax.so.1.MINOR.PATCH and its
#   links, the archive, the header, parallax.pc, both man pages, the Xen hotplug scripts, the
#   systemd unit with the install paths written in, its settings);
# - a program outside the tree builds against the installed parallax.pc (PKG_CONFIG_SYSROOT_DIR)
#   with the shared library and again with the static one (--static), and both run: plx_version()
#   equals PLX_API_VERSION, a blockstore is formatted, written, read back and checked;
# - the same program built against API 1.7's parallax_backend.h and symbol versions (its
#   struct plx_backend_ops ends at lock) runs with this library;
# - the installed .so exports exactly the functions parallax.h declares, versioned PARALLAX_1
#   (tests/check-exports.sh), and that check does fail on a library that exports one too few;
# - the installed command runs and reports the same version;
# - make uninstall leaves no file, link or Parallax directory behind.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd make cc pkg-config readelf man ldd objdump
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$PLX_TEST_TMP
dest="$T/dest"
prefix=/opt/plx-test
vars=(PREFIX="$prefix" DESTDIR="$dest")

make -C "$src" --no-print-directory -s "${vars[@]}" install >"$T/install.log" 2>&1 ||
    { cat "$T/install.log"; fail "make install"; }

version=$(sed -n 's/^#define PLX_API_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
    "$src/libparallax/include/parallax.h" | paste -sd.)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "no version in parallax.h ($version)"
root="$dest$prefix"
expected=(
    "bin/parallax"
    "bin/parallax-lockd"
    "lib/libparallax.so.$version"
    "lib/libparallax.so.1"
    "lib/libparallax.so"
    "lib/libparallax.a"
    "include/parallax.h"
    "include/parallax_backend.h"
    "lib/pkgconfig/parallax.pc"
    "share/man/man8/parallax.8"
    "share/man/man3/libparallax.3"
    "etc/xen/scripts/block-parallax"
    "etc/xen/scripts/block-parallax-tap"
    "etc/xen/scripts/parallax-hotplug-common.sh"
    "lib/systemd/system/parallax-serve@.service"
    "etc/parallax/serve/qemu-nbd.conf"
)
for f in "${expected[@]}"; do
    [[ -e $root/$f ]] || fail "make install did not install $prefix/$f"
done
# Nothing is installed outside PREFIX, and nothing unexpected inside it.
unexpected=$(cd "$dest" && find . \( -type f -o -type l \) | sed "s|^\./${prefix#/}/||" |
    grep -vxF -f <(printf '%s\n' "${expected[@]}") || true)
[[ -z $unexpected ]] || fail "make install installed files nobody listed: $unexpected"
assert_eq "libparallax.so.$version" "$(readlink "$root/lib/libparallax.so.1")" "soname link"
assert_eq "libparallax.so.1" "$(readlink "$root/lib/libparallax.so")" "dev link"
assert_eq "libparallax.so.1" \
    "$(readelf -d "$root/lib/libparallax.so.$version" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')" "SONAME"
[[ -x $root/bin/parallax && -x $root/etc/xen/scripts/block-parallax ]] || fail "modes"
grep -qx "ExecStart=$prefix/bin/parallax serve \$PARALLAX_SERVE_ARGS" \
    "$root/lib/systemd/system/parallax-serve@.service" || fail "unit does not run $prefix/bin/parallax"
grep -q "EnvironmentFile=$prefix/etc/parallax/serve/%i.conf" \
    "$root/lib/systemd/system/parallax-serve@.service" || fail "unit reads the wrong settings"
# The man pages render without warnings.
for page in share/man/man8/parallax.8 share/man/man3/libparallax.3; do
    warn=$(MANWIDTH=100 man --warnings -l "$root/$page" 2>&1 >/dev/null || true)
    [[ -z $warn ]] || fail "$page: $warn"
done

# ---- the exports of the installed library ---------------------------------------------------
"$src/tests/check-exports.sh" "$root/lib/libparallax.so.$version" "$root/include" \
    "$src/libparallax/libparallax.map" || fail "exports of the installed library"
# The check itself must be able to fail: a library linked from the same objects with one
# function left out of the export list.
grep -v '^    plx_version;$' "$src/libparallax/libparallax.map" >"$T/short.map"
cc -shared -Wl,--version-script="$T/short.map" -o "$T/short.so" \
    -Wl,--whole-archive "$root/lib/libparallax.a" -Wl,--no-whole-archive -laio -liscsi
if "$src/tests/check-exports.sh" "$T/short.so" "$root/include" >"$T/short.out" 2>&1; then
    fail "check-exports passed a library that does not export plx_version"
fi
grep -q '^-plx_version$' "$T/short.out" || { cat "$T/short.out"; fail "check-exports did not name plx_version"; }

# ---- a program built against the installed parallax.pc ---------------------------------------
export PKG_CONFIG_PATH="$root/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest"
export PKG_CONFIG_LIBDIR="$root/lib/pkgconfig" # nothing of the system's
assert_eq "$version" "$(pkg-config --modversion parallax)" "pkg-config --modversion"
prog="$src/tests/integration/install_prog.c"
# shellcheck disable=SC2046 # word splitting of pkg-config's output is the point
cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags parallax) "$prog" -o "$T/prog-shared" \
    $(pkg-config --libs parallax) || fail "building against the installed parallax.pc"
# It must really use the installed header and library, not the source tree's.
grep -q 'NEEDED.*\[libparallax.so.1\]' <<<"$(readelf -d "$T/prog-shared")" || fail "not linked to libparallax.so.1"
out=$(LD_LIBRARY_PATH="$root/lib" "$T/prog-shared" "$T/store-shared.img") || fail "program (shared)"
[[ $out == "ok "* ]] || fail "program (shared) said: $out"
# Which library it ran with: the installed one.
# (ldd's output is kept whole first: grep -q stopping early would fail the pipe with SIGPIPE.)
deps=$(LD_LIBRARY_PATH="$root/lib" ldd "$T/prog-shared" 2>&1)
grep -q "libparallax.so.1 => $root/lib/libparallax.so.1 " <<<"$deps" ||
    fail "the program does not load $root/lib/libparallax.so.1: $deps"
# A program built against API 1.7 (parallax_backend.h of then: struct plx_backend_ops ends at
# lock; linked to the versions of then, PARALLAX_1) runs with this library: the library neither
# writes past its ops (plx_backend_stack_forward_ops) nor reads them as later operations
# (plx_store_open_backend). Built against this header and versions it fails (install_prog's
# guard after its ops).
abi="$src/tests/integration/abi-1.7"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -I"$abi" $(pkg-config --cflags parallax) -include "$abi/bind.h" \
    "$prog" -o "$T/prog-1.7" $(pkg-config --libs parallax) || fail "building against API 1.7's header"
objdump -T "$T/prog-1.7" | grep -q '(PARALLAX_1) *plx_store_open_backend$' ||
    fail "the 1.7 build does not link plx_store_open_backend@PARALLAX_1"
out=$(LD_LIBRARY_PATH="$root/lib" "$T/prog-1.7" "$T/store-1.7.img" old) || fail "program built against 1.7"
[[ $out == "ok "* ]] || fail "program built against 1.7 said: $out"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags parallax) "$prog" -o "$T/prog-static" \
    "$root/lib/libparallax.a" -laio -liscsi -lpthread ||
    fail "building against the static library"
grep -q 'libparallax' <<<"$(readelf -d "$T/prog-static")" && fail "the static build needs libparallax.so"
out=$("$T/prog-static" "$T/store-static.img") || fail "program (static)"
[[ $out == "ok "* ]] || fail "program (static) said: $out"

# ---- the installed command ---------------------------------------------------------------------
assert_eq "parallax $version" "$("$root/bin/parallax" --version)" "parallax --version"
"$root/bin/parallax" -b "$T/store-shared.img" vdi-list | contains '^1 *disk ' ||
    fail "the installed command does not see the VDI the program made"

# ---- uninstall ---------------------------------------------------------------------------------
make -C "$src" --no-print-directory -s "${vars[@]}" uninstall >"$T/uninstall.log" 2>&1 ||
    { cat "$T/uninstall.log"; fail "make uninstall"; }
left=$(cd "$dest" && find . \( -type f -o -type l \))
[[ -z $left ]] || fail "make uninstall left: $left"
for d in lib/parallax etc/parallax; do
    [[ ! -e $root/$d ]] || fail "make uninstall left the directory $prefix/$d"
done
echo "install: $version installed under $prefix, built against, exports checked, uninstalled"
