#!/usr/bin/env bash
# vdi-import and vdi-export round-trip images exactly, keep zeros sparse, and see snapshots and
# clones as they were when taken.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

tmp=$PLX_TEST_TMP
vsize=$((32 << 20))

# put FILE OFFSET LENGTH: random bytes at OFFSET, leaving the rest of FILE alone.
put() {
    head -c "$3" /dev/urandom |
        dd of="$1" bs=64K seek="$2" oflag=seek_bytes iflag=fullblock conv=notrunc status=none
}
# Bytes FILE really occupies on disk.
allocated() {
    echo $(($(stat -c %b "$1") * $(stat -c %B "$1")))
}

# a: mostly zeros, with data that is block-aligned, dense (many requests in flight), and a
# single byte in an otherwise zero block.
truncate -s "$vsize" "$tmp/a.img"
put "$tmp/a.img" 0 65536
put "$tmp/a.img" $((1 << 20)) 4096
put "$tmp/a.img" $((4 << 20)) $((9 << 20))
printf x | dd of="$tmp/a.img" bs=1 seek=$(((20 << 20) + 100)) conv=notrunc status=none
put "$tmp/a.img" $((vsize - 4096)) 4096
# b: other data, and zeros where a had data (those blocks must read back as zeros).
truncate -s "$vsize" "$tmp/b.img"
put "$tmp/b.img" 0 4096
put "$tmp/b.img" $((2 << 20)) 12288
put "$tmp/b.img" $((6 << 20)) $((1 << 20))

plx format --size 512M --extent-size 16M >/dev/null
plx vdi-create disk --size 32M >/dev/null

plx vdi-import disk "$tmp/a.img"
plx vdi-export disk "$tmp/a.out"
cmp "$tmp/a.img" "$tmp/a.out" || fail "export differs from the imported file"
assert_eq "$vsize" "$(stat -c %s "$tmp/a.out")" "exported size"
(($(allocated "$tmp/a.out") < 16 << 20)) || fail "export has no holes: $(allocated "$tmp/a.out")"
plx vdi-export disk - | cmp - "$tmp/a.img" || fail "export to stdout differs"

assert_eq disk@1 "$(plx vdi-snapshot disk)" "snapshot"
plx vdi-import disk "$tmp/b.img"
plx vdi-export disk "$tmp/b.out"
cmp "$tmp/b.img" "$tmp/b.out" || fail "second import did not replace the first"
plx vdi-export disk@1 "$tmp/snap.out"
cmp "$tmp/a.img" "$tmp/snap.out" || fail "the snapshot changed"

plx vdi-create clone --from disk@1 >/dev/null
plx vdi-export clone "$tmp/clone.out"
cmp "$tmp/a.img" "$tmp/clone.out" || fail "clone differs from its snapshot"
plx vdi-import clone - <"$tmp/b.img"
plx vdi-export clone "$tmp/clone2.out"
cmp "$tmp/b.img" "$tmp/clone2.out" || fail "import from stdin"
plx vdi-export disk@1 "$tmp/snap2.out"
cmp "$tmp/a.img" "$tmp/snap2.out" || fail "writing the clone changed its source snapshot"

# A file whose length is not a multiple of 4 KiB lands at offset 0; the rest stays zero.
plx vdi-create small --size 1M >/dev/null
head -c 10000 /dev/urandom >"$tmp/c.part"
plx vdi-import small "$tmp/c.part"
plx vdi-export small "$tmp/c.out"
cmp -n 10000 "$tmp/c.part" "$tmp/c.out" || fail "partial-block import"
cmp -s -i 10000 -n $(((1 << 20) - 10000)) "$tmp/c.out" /dev/zero || fail "bytes past the file"

truncate -s $((vsize + 4096)) "$tmp/big.img"
expect_fail 1 plx vdi-import disk "$tmp/big.img"
expect_fail 1 plx vdi-import disk@1 "$tmp/a.img"
[[ $PLX_LAST_STDERR == *"disk@1 is a snapshot"*"vdi-create NAME --from disk@1"* ]] ||
    fail "import into a snapshot: $PLX_LAST_STDERR"
expect_fail 1 plx vdi-import disk "$tmp/absent.img"

# The store itself is no target for an export, whichever way it is named (the file, a symlink,
# a bind mount, a loop device over it, stdout pointed at it), nor a source for an import: each is
# refused before anything is written.
sum=$(sha256sum <"$tmp/store.img")
refuse_target() { # TARGET
    expect_fail 1 plx vdi-export disk "$1"
    [[ $PLX_LAST_STDERR == *"is the blockstore itself"*"nothing was written"* ]] ||
        fail "export onto $1: $PLX_LAST_STDERR"
    assert_eq "$sum" "$(sha256sum <"$tmp/store.img")" "store after a refused export onto $1"
}
refuse_target "$tmp/store.img"
ln -s store.img "$tmp/link.img"
refuse_target "$tmp/link.img"
refuse_target "$tmp/../$(basename "$tmp")/store.img"
mkdir "$tmp/bind"
if mount --bind "$tmp" "$tmp/bind" 2>/dev/null; then
    on_exit "umount '$tmp/bind'"
    refuse_target "$tmp/bind/store.img"
    umount "$tmp/bind"
fi
if loop=$(losetup -f --show "$tmp/store.img" 2>/dev/null); then
    on_exit "losetup -d '$loop' 2>/dev/null"
    refuse_target "$loop"
    losetup -d "$loop"
fi
expect_fail 1 plx vdi-export disk - >>"$tmp/store.img"
[[ $PLX_LAST_STDERR == *"is the blockstore itself"* ]] || fail "export to stdout on the store"
assert_eq "$sum" "$(sha256sum <"$tmp/store.img")" "store after a refused export to stdout"
expect_fail 1 plx vdi-import disk "$tmp/link.img"
[[ $PLX_LAST_STDERR == *"is the blockstore itself"* ]] || fail "import from the store"
assert_eq "$sum" "$(sha256sum <"$tmp/store.img")" "store after a refused import of itself"

out=$(plx check)
grep -q '^check: 0 errors,' <<<"$out" || fail "check: $out"
