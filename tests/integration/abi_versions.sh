#!/usr/bin/env bash
# The library as others link it (docs/DESIGN.md): symbol versions and test hooks.
# - A program linked against an older library still runs against today's: install_prog.c (it
#   uses only functions of API 1.0 to 1.6) is linked against a libparallax.so.1 that has only
#   the node PARALLAX_1 (today's objects with the map cut after that node, as 1.6 shipped it);
#   every function it takes from the library carries version PARALLAX_1 (objdump -T), and it
#   runs against today's build/libparallax.so.1.
# - The other way round is refused at start, not at the first call: a program that uses
#   plx_store_path_conflict (1.7) needs PARALLAX_1.7, cannot be linked against the 1.6 library,
#   and the dynamic loader refuses to start it with that library.
# - The closed nodes hold exactly what abi_nodes.txt lists (a new function in an old node fails
#   here), and no function is in a node newer than the version.
# - Test hooks are only in test builds: the names of the hooks the sources read
#   (plx_test_hook) are in build/test/parallax and in none of libparallax.so, libparallax.a and
#   build/parallax.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd cc readelf objdump strings ldd nm objcopy
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=$(cd "$(dirname "$PARALLAX")" && pwd)
T=$PLX_TEST_TMP
inc="-I$src/libparallax/include -I$src/libparallax/backend"
[[ -e $build/libparallax.so.1 ]] || fail "$build/libparallax.so.1 is not built (make all)"
major=$(sed -n 's/^#define PLX_API_VERSION_MAJOR *\([0-9]*\).*/\1/p' "$src/libparallax/include/parallax.h")
minor=$(sed -n 's/^#define PLX_API_VERSION_MINOR *\([0-9]*\).*/\1/p' "$src/libparallax/include/parallax.h")
[[ $major == 1 && -n $minor ]] || fail "no version in parallax.h ($major.$minor)"

# ---- the 1.6 library: only the node PARALLAX_1 ---------------------------------------------------
mkdir -p "$T/old"
awk '{print} /^};/ && seen {exit} /^PARALLAX_1 \{/ {seen = 1}' "$src/libparallax/libparallax.map" \
    >"$T/old/old.map"
grep -q '^PARALLAX_1\.' "$T/old/old.map" && fail "the cut map still has a newer node"
# A function with two versions (PLX_SYMVER: NAME@PARALLAX_1 and NAME@@PARALLAX_1.N, backend.h)
# was plain NAME then, which the map made NAME@@PARALLAX_1: the objects as they were.
syms=$(nm "$build/libparallax.a" 2>/dev/null | awk '$2 ~ /^[TDR]$/ && $3 ~ /@/ {print $3}' | sort -u |
    awk '/@@PARALLAX_/ {printf " --strip-symbol=%s", $0; next}
         {n = $0; sub(/@PARALLAX_1$/, "", n); printf " --redefine-sym=%s=%s", $0, n}')
# shellcheck disable=SC2086 # $syms is many words
objcopy $syms "$build/libparallax.a" "$T/old/objects.a" || fail "objcopy of the archive"
cc -shared -Wl,-soname,libparallax.so.1 -Wl,--version-script="$T/old/old.map" \
    -o "$T/old/libparallax.so.1" -Wl,--whole-archive "$T/old/objects.a" \
    -Wl,--no-whole-archive -laio -liscsi -lpthread || fail "building the 1.6 library"
ln -sf libparallax.so.1 "$T/old/libparallax.so"
readelf --dyn-syms --wide "$T/old/libparallax.so.1" | grep -q 'PARALLAX_1\.' &&
    fail "the 1.6 library has a node after PARALLAX_1"

# ---- a program linked against it runs against today's library -----------------------------------
# shellcheck disable=SC2086 # $inc is two words
cc -std=c11 -Wall -Wextra -Werror $inc "$src/tests/integration/install_prog.c" \
    -o "$T/old-prog" -L"$T/old" -lparallax || fail "building install_prog against the 1.6 library"
# Every library function it calls, and the version it asks for.
# (objdump -T: "... (PARALLAX_1) plx_vdi_open"; the parentheses mark a reference's version.)
refs() { objdump -T "$1" | awk '$NF ~ /^plx_/ {v = $(NF-1); gsub(/[()]/, "", v); print v, $NF}' | sort; }
refs "$T/old-prog" >"$T/old-refs"
[[ -s $T/old-refs ]] || fail "install_prog takes no function from the library?"
others=$(grep -v '^PARALLAX_1 ' "$T/old-refs" || true)
[[ -z $others ]] || fail "linked against the 1.6 library, install_prog asks for: $others"
out=$(LD_BIND_NOW=1 LD_LIBRARY_PATH="$build" "$T/old-prog" "$T/old.img") ||
    fail "install_prog linked against 1.6 does not run against today's library: $out"
[[ $out == "ok "* ]] || fail "install_prog said: $out"
deps=$(LD_LIBRARY_PATH="$build" ldd "$T/old-prog" 2>&1)
grep -q "libparallax.so.1 => $build/libparallax.so.1 " <<<"$deps" ||
    fail "install_prog did not load today's library: $deps"

# ---- a program of API 1.7 needs PARALLAX_1.7 -------------------------------------------------------
cat >"$T/new-prog.c" <<'EOF'
#include <parallax.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    /* plx_store_path_conflict came with API 1.7; the test links it, never calls it. */
    if (argc > 9)
        return plx_store_path_conflict(NULL, argv[1], NULL, 0);
    printf("%u\n", plx_version());
    return 0;
}
EOF
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror $inc "$T/new-prog.c" -o "$T/new-prog" -L"$build" -lparallax ||
    fail "building a 1.7 program against today's library"
refs "$T/new-prog" | grep -qx "PARALLAX_1\.7 plx_store_path_conflict" ||
    fail "plx_store_path_conflict is not taken at PARALLAX_1.7: $(refs "$T/new-prog")"
# shellcheck disable=SC2086
if cc -std=c11 $inc "$T/new-prog.c" -o "$T/new-prog-old" -L"$T/old" -lparallax 2>"$T/link.err"; then
    fail "a 1.7 program linked against the 1.6 library"
fi
grep -q 'plx_store_path_conflict' "$T/link.err" || fail "unexpected link error: $(cat "$T/link.err")"
if LD_LIBRARY_PATH="$T/old" "$T/new-prog" x >"$T/run.out" 2>&1; then
    fail "a 1.7 program started with the 1.6 library: $(cat "$T/run.out")"
fi
grep -q "version .PARALLAX_1\.7. not found" "$T/run.out" ||
    fail "the loader did not name the missing node: $(cat "$T/run.out")"
LD_LIBRARY_PATH="$build" "$T/new-prog" x >/dev/null || fail "the 1.7 program does not run"

# ---- the closed nodes hold what they held ---------------------------------------------------------
current="PARALLAX_$major.$minor"
grep -v '^#' "$src/tests/integration/abi_nodes.txt" | grep . | sort >"$T/recorded"
# closed_nodes LIB: 0 when LIB's nodes before the current one hold exactly what abi_nodes.txt
# lists and no function is in a node newer than the version; else 1, with what differs on stderr.
closed_nodes() {
    readelf --dyn-syms --wide "$1" |
        awk '$1 ~ /^[0-9]+:$/ && $4 == "FUNC" && $7 != "UND" {split($8, p, "@+"); print p[2], p[1]}' |
        sort >"$T/nodes"
    [[ -s $T/nodes ]] || { echo "no versioned functions in $1" >&2; return 1; }
    local newer
    newer=$(awk -v cur="$minor" '{n = $1; sub(/^PARALLAX_1[.]?/, "", n); if (n != "" && n + 0 > cur + 0) print}' "$T/nodes")
    [[ -z $newer ]] || { echo "functions in a node newer than the version $major.$minor: $newer" >&2; return 1; }
    awk -v cur="$current" '$1 != cur' "$T/nodes" >"$T/closed"
    if ! diff -u --label abi_nodes.txt --label "$1" "$T/recorded" "$T/closed" >"$T/diff"; then
        echo "the closed version nodes changed (- recorded only, + library only):" >&2
        sed -n '3,$p' "$T/diff" | grep '^[-+]' >&2
        return 1
    fi
}
closed_nodes "$build/libparallax.so.1" || fail "a new function goes into $current, not into a closed node"
# The check must be able to fail: the same library with plx_store_path_conflict (1.7) moved
# into PARALLAX_1.
sed 's/^    plx_store_path_conflict;$//; s/^    plx_version;$/    plx_version;\n    plx_store_path_conflict;/' \
    "$src/libparallax/libparallax.map" >"$T/moved.map"
cc -shared -Wl,--version-script="$T/moved.map" -o "$T/moved.so" \
    -Wl,--whole-archive "$build/libparallax.a" -Wl,--no-whole-archive -laio -liscsi -lpthread ||
    fail "building the library with a moved function"
if closed_nodes "$T/moved.so" 2>"$T/moved.err"; then
    fail "the check passed a library with a 1.7 function in PARALLAX_1"
fi
grep -q '^+PARALLAX_1 plx_store_path_conflict$' "$T/moved.err" ||
    fail "the check did not name the moved function: $(cat "$T/moved.err")"
closed_nodes "$build/libparallax.so.1" || fail "closed_nodes"  # $T/nodes of today's, for the summary

# ---- test hooks only in test builds ---------------------------------------------------------------
hooks=$(grep -rhoE 'plx_test_hook\("[A-Z0-9_]+"\)' "$src/libparallax" | sed 's/.*("\(.*\)")/\1/' | sort -u)
[[ -n $hooks ]] || fail "no test hooks found in the sources"
[[ -x $build/test/parallax ]] || fail "$build/test/parallax is not built (make build/test/parallax)"
# (strings' output is kept whole first: grep -q stopping early would fail the pipe with SIGPIPE.)
strings "$build/test/parallax" >"$T/test-strings"
for h in $hooks; do
    grep -qx "$h" "$T/test-strings" || fail "the test build does not read $h"
done
for f in libparallax.so.1 libparallax.a parallax; do
    left=$(strings "$build/$f" | grep 'PLX_TEST_' || true)
    [[ -z $left ]] || fail "the release $f has test hooks: $left"
done
echo "abi_versions: ok ($(wc -l <"$T/recorded") functions in closed nodes, $(grep -c "^$current " "$T/nodes") in $current; hooks only in the test build: ${hooks//$'\n'/ })"
