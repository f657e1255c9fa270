#!/usr/bin/env bash
# `parallax format --preallocate` writes a file store through (no holes left), so that writes
# after snapshots (copy-on-write into blocks the store has never written) do not pay a thin
# medium's first-write cost. What the store reads is unchanged: a VDI written and exported reads
# back; only holes are filled, so an existing file's bytes stay. It refuses a device or an iSCSI
# LUN before changing anything, and on a full file system removes the file it made.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd sha256sum

T=$PLX_TEST_TMP
allocated() { echo $(($(stat -c '%b * %B' "$1"))); }

# A new file: every byte allocated, a clean store that takes and returns data.
plx format --size 64M --preallocate >/dev/null
assert_eq "$((64 << 20))" "$(stat -c %s "$T/store.img")" "size of the preallocated store"
[[ $(allocated "$T/store.img") -ge $((64 << 20)) ]] ||
    fail "preallocated store has holes: $(allocated "$T/store.img") bytes allocated of $((64 << 20))"
plx check >/dev/null || fail "preallocated store does not check clean"
plx vdi-create v --size 8M >/dev/null
head -c 3M /dev/urandom >"$T/data"
plx vdi-import v "$T/data" >/dev/null
plx vdi-export v "$T/out" >/dev/null
cmp -n $((3 << 20)) "$T/data" "$T/out" || fail "data read back from a preallocated store differs"

# Without the option the file stays sparse (so the check above can fail).
rm -f "$T/sparse.img"
"$PARALLAX" -b "$T/sparse.img" format --size 64M >/dev/null
[[ $(allocated "$T/sparse.img") -lt $((8 << 20)) ]] ||
    fail "a plain format allocated $(allocated "$T/sparse.img") bytes"

# An existing file with data and holes: the data stays, the holes are filled.
rm -f "$T/old.img"
truncate -s 32M "$T/old.img"
dd if="$T/data" of="$T/old.img" bs=1M seek=20 count=2 conv=notrunc status=none
"$PARALLAX" -b "$T/old.img" format --preallocate >/dev/null
cmp -n $((2 << 20)) "$T/data" <(tail -c +$(((20 << 20) + 1)) "$T/old.img") ||
    fail "--preallocate changed bytes outside the holes"
[[ $(allocated "$T/old.img") -ge $((32 << 20)) ]] || fail "existing file still has holes"
"$PARALLAX" -b "$T/old.img" check >/dev/null || fail "formatted existing file does not check clean"

# Not a file: refused before anything happens (usage error).
expect_fail 2 "$PARALLAX" -b /dev/null format --preallocate
contains -q "is for a blockstore in a file" <<<"$PLX_LAST_STDERR" || fail "device: $PLX_LAST_STDERR"
expect_fail 2 "$PARALLAX" -b iscsi://127.0.0.1/iqn.2026-11.org.parallax:none/1 format --preallocate
contains -q "is for a blockstore in a file" <<<"$PLX_LAST_STDERR" || fail "iscsi: $PLX_LAST_STDERR"

# A full file system: a clear error and no file left behind (needs root for a small tmpfs).
if [[ $(id -u) -eq 0 ]]; then
    mkdir -p "$T/small"
    mount -t tmpfs -o size=16M tmpfs "$T/small"
    on_exit "umount '$T/small'"
    expect_fail 1 "$PARALLAX" -b "$T/small/s.img" format --size 64M --preallocate
    contains -q "No space left on device" <<<"$PLX_LAST_STDERR" || fail "full disk: $PLX_LAST_STDERR"
    [[ ! -e $T/small/s.img ]] || fail "a refused --preallocate left $T/small/s.img behind"
    # tmpfs has no O_DIRECT: the page-cache path writes it through
    "$PARALLAX" -b "$T/small/t.img" format --size 8M --preallocate >/dev/null
    [[ $(allocated "$T/small/t.img") -ge $((8 << 20)) ]] || fail "tmpfs store has holes"
else
    echo "(full file system case left out: needs root)"
fi
echo "ok"
