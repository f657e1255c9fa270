#!/usr/bin/env bash
# tests/check-exports.sh LIBRARY.so INCLUDE_DIR [MAP]
#
# Checks that the shared library exports exactly the functions declared in the public headers
# INCLUDE_DIR/*.h: every declared function is exported, with symbol version PARALLAX_<major>
# (or PARALLAX_<major>.<minor>, the node of the version that added it), and nothing else is (no
# internal function, no data symbol). With MAP (the linker version script), also that the map lists exactly the declared functions. Used by the install and
# package tests; prints what differs and exits 1 on any difference.
set -euo pipefail

[[ $# -ge 2 && $# -le 3 ]] || { echo "usage: $0 LIBRARY.so INCLUDE_DIR [MAP]" >&2; exit 2; }
lib=$1 incdir=$2 map=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The declared functions, as the compiler sees them: -aux-info writes one prototype per
# function declared, with the file it comes from.
for h in "$incdir"/*.h; do echo "#include \"$(basename "$h")\""; done >"$tmp/all.c"
cc -std=c11 -I"$incdir" -aux-info "$tmp/aux" -c "$tmp/all.c" -o "$tmp/all.o"
# The name is the first "identifier (" after the comment (a parameter may be a function pointer).
grep -F "$incdir/" "$tmp/aux" | sed 's|^/\*[^*]*\*/||' |
    awk 'match($0, /[A-Za-z_][A-Za-z0-9_]* \(/) {print substr($0, RSTART, RLENGTH - 2)}' |
    sort -u >"$tmp/declared"
[[ -s $tmp/declared ]] || { echo "check-exports: no functions declared in $incdir" >&2; exit 1; }

# What the library exports: defined dynamic symbols (readelf shows their versions).
readelf --dyn-syms --wide "$lib" |
    awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && $5 != "LOCAL" && $8 != "" {print $4, $8}' >"$tmp/dyn"
awk '$1 == "FUNC" {print $2}' "$tmp/dyn" | sed 's/@.*//' | sort -u >"$tmp/exported"
# Anything but functions: the version definition itself (an ABS "OBJECT"/"NOTYPE" named after the
# node) is fine; data would be an ABI promise nobody made.
awk '$1 != "FUNC" {print $2}' "$tmp/dyn" | grep -v '^PARALLAX_[0-9.]*$' >"$tmp/other" || true

status=0
major=$(sed -n 's/^#define PLX_API_VERSION_MAJOR *\([0-9]*\).*/\1/p' "$incdir/parallax.h")
if ! diff -u --label declared --label exported "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then
    echo "check-exports: $lib does not export exactly the functions of $incdir/*.h" \
        "(- declared only, + exported only):"
    sed -n '3,$p' "$tmp/diff" | grep '^[-+]'
    status=1
fi
if [[ -s $tmp/other ]]; then
    echo "check-exports: $lib exports symbols that are not functions:" $(cat "$tmp/other")
    status=1
fi
# PARALLAX_<major>, or the node of the minor version that added the function (PARALLAX_1.7).
unversioned=$(awk -v v="PARALLAX_$major" '$1 == "FUNC" && $2 !~ ("@@?" v "([.][0-9]+)?$") {print $2}' "$tmp/dyn")
if [[ -n $unversioned ]]; then
    echo "check-exports: functions without version PARALLAX_$major or PARALLAX_$major.N:" $unversioned
    status=1
fi
if [[ -n $map ]]; then
    # The names in the map's global: sections.
    sed 's|/\*.*\*/||; s|#.*||' "$map" | tr -d ' \t' |
        awk '/global:/ {g = 1; next} /local:/ {g = 0} g && /;$/ {sub(/;$/, ""); if ($0 != "" && $0 !~ /[{}]/) print}' |
        sort -u >"$tmp/mapped"
    if ! diff -u --label declared --label "$map" "$tmp/declared" "$tmp/mapped" >"$tmp/diff"; then
        echo "check-exports: $map does not list exactly the declared functions:"
        sed -n '3,$p' "$tmp/diff" | grep '^[-+]'
        status=1
    fi
fi
[[ $status -ne 0 ]] || echo "check-exports: $(wc -l <"$tmp/exported") functions exported, all declared, version PARALLAX_$major[.N]"
exit $status
