#!/usr/bin/env bash
# `parallax format` never changes what is there when it refuses: an existing blockstore asked to
# be re-formatted without --force, or with a size or extent size that cannot work, keeps its size
# and every byte; a refused format of a new path leaves no file behind. Small stores get an
# extent size that leaves room for several engines.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd sha256sum jq

T=$PLX_TEST_TMP
fp() { echo "$(stat -c %s "$1") $(sha256sum <"$1" | cut -c1-64)"; }

# A store holding data: 256 MiB, a VDI with a written block.
plx format --size 256M >/dev/null
plx vdi-create gold --size 16M >/dev/null
head -c 1M /dev/urandom >"$T/data"
plx vdi-import gold "$T/data" >/dev/null
before=$(fp "$T/store.img")

refuse() { # EXPECTED-STDERR-PART ARGS...: format refused, store unchanged
    local want=$1
    shift
    expect_fail 1 plx format "$@"
    [[ $PLX_LAST_STDERR == *"$want"* ]] || fail "format $*: message [$PLX_LAST_STDERR] lacks [$want]"
    assert_eq "$before" "$(fp "$T/store.img")" "store changed by refused 'format $*'"
}
refuse "already holds a Parallax blockstore" --size 64M
refuse "already holds a Parallax blockstore" --size 2G
refuse "already holds a Parallax blockstore" --size 256M --extent-size 64M
refuse "already holds a Parallax blockstore"
refuse "already holds a Parallax blockstore" --size 4M --extent-size 1M
# Impossible geometry is refused even with --force, before anything changes.
refuse "fewer than 3 extents" --size 64M --extent-size 32M --force
refuse "fewer than 3 extents" --extent-size 128M --force
refuse "power of two" --size 1G --extent-size 3M --force
# Version 2 keeps only the extent catalogue in extent 0 (the registry lives in metadata extents).
refuse "no room for the extent catalogue" --size 64G --extent-size 1M --force
plx check >/dev/null || fail "store no longer checks clean"
plx vdi-export gold "$T/out"
cmp <(head -c 1M "$T/out") "$T/data" || fail "VDI contents changed"

# A refused format of a new path leaves no file.
for args in "--size 2M" "--size 64M --extent-size 32M" "--size 64M --extent-size 3M"; do
    # shellcheck disable=SC2086
    expect_fail 1 "$PARALLAX" -b "$T/new.img" format $args
    [[ ! -e $T/new.img ]] || fail "refused 'format $args' left $T/new.img behind"
done
expect_fail 1 "$PARALLAX" -b "$T/new.img" format
[[ $PLX_LAST_STDERR == *"give --size"* ]] || fail "format without --size: $PLX_LAST_STDERR"
[[ ! -e $T/new.img ]] || fail "format without --size created a file"

# --force re-formats, at the new size.
plx format --size 64M --force >/dev/null
assert_eq $((64 << 20)) "$(stat -c %s "$T/store.img")" "forced format size"
assert_eq 0 "$(plx vdi-list --json | jq length)" "VDIs after forced format"

# Default extents scale with the store: about 32 extents, so several engines each get theirs.
for sz in 64M 4G 8G 64G; do
    rm -f "$T/s.img"
    "$PARALLAX" -b "$T/s.img" format --size $sz >/dev/null
    n=$("$PARALLAX" -b "$T/s.img" info --json | jq .extent_count)
    ((n >= 31 && n <= 32)) || fail "format --size $sz: $n extents, expected about 32"
done
rm -f "$T/s.img"
"$PARALLAX" -b "$T/s.img" format --size 256G >/dev/null
"$PARALLAX" -b "$T/s.img" info --json | jq -e '.extent_size == 2147483648' >/dev/null ||
    fail "256G store: extents should be capped at 2 GiB"
echo "ok"
