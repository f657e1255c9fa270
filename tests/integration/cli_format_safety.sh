#!/usr/bin/env bash
# `parallax format` never changes what is there when it refuses: an existing blockstore asked to
# be re-formatted without --force, or with a size or extent size that cannot work, keeps its size
# and every byte; a refused format of a new path leaves no file behind. Small stores get an
# extent size that leaves room for several engines. Anything else a target holds (a qcow2 or VHD
# image, an ext4 file system, swap, a partition table: libblkid and the image formats' magic
# numbers) is refused without --force, named; an empty or all-zero file is formatted as before.
# --force is refused while a server has the store's VDIs open, naming it, and changes nothing.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd sha256sum jq qemu-img mkfs.ext4 mkswap qemu-io

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

# What other programs made: refused without --force, named, left as it was.
qemu-img create -q -f qcow2 "$T/disk.qcow2" 64M
qemu-img create -q -f vpc "$T/disk.vhd" 64M
qemu-img create -q -f vmdk "$T/disk.vmdk" 64M
truncate -s 64M "$T/ext4.img"
mkfs.ext4 -q -F "$T/ext4.img"
truncate -s 64M "$T/swap.img"
mkswap "$T/swap.img" >/dev/null 2>&1
truncate -s 64M "$T/mbr.img" # one Linux partition from sector 2048: a DOS partition table
printf '\x00\x20\x21\x00\x83\xfe\xff\xff\x00\x08\x00\x00\x00\xf8\x01\x00' |
    dd of="$T/mbr.img" bs=1 seek=446 conv=notrunc status=none
printf '\x55\xaa' | dd of="$T/mbr.img" bs=1 seek=510 conv=notrunc status=none
for f in disk.qcow2:"a qcow2 image" disk.vhd:"a VHD image" disk.vmdk:"a VMDK image" \
    ext4.img:"an ext4 file system" swap.img:"swap space" mbr.img:"a dos partition table"; do
    file=$T/${f%%:*} what=${f#*:}
    sum=$(fp "$file")
    for args in "" "--size 64M"; do
        # shellcheck disable=SC2086
        expect_fail 1 "$PARALLAX" -b "$file" format $args
        assert_eq "parallax: $file holds $what; use --force to overwrite it" "$PLX_LAST_STDERR" \
            "format $args of ${f%%:*}"
        assert_eq "$sum" "$(fp "$file")" "${f%%:*} changed by a refused format"
    done
done
"$PARALLAX" -b "$T/disk.qcow2" format --force --size 64M >/dev/null
"$PARALLAX" -b "$T/disk.qcow2" check >/dev/null || fail "the forced format over a qcow2 image"
# Nothing there: an all-zero file and a sparse one are formatted without --force.
head -c 16M /dev/zero >"$T/zero.img"
truncate -s 64M "$T/sparse.img"
"$PARALLAX" -b "$T/zero.img" format >/dev/null
"$PARALLAX" -b "$T/sparse.img" format >/dev/null

# --force while a server has a VDI open for writing: refused, naming it, the store unchanged.
plx vdi-create busy --size 4M >/dev/null
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
"$PARALLAX" -b "$T/store.img" serve --unix "$T/s.sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid $server
wait_socket "$T/s.sock" $server "$T/serve.log"
qemu-io -f raw -c "write -P 0x5a 0 1M" -c flush "nbd+unix:///busy?socket=$T/s.sock" >/dev/null
before=$(fp "$T/store.img")
expect_fail 3 plx format --force
[[ $PLX_LAST_STDERR == *"in use: pid $server "*"nothing was changed"* ]] ||
    fail "format --force beside a server: $PLX_LAST_STDERR"
assert_eq "$before" "$(fp "$T/store.img")" "store changed by a refused format --force"
kill $server
wait $server 2>/dev/null || true
plx vdi-export busy "$T/busy.out"
cmp -n 1M "$T/busy.out" <(head -c 1M /dev/zero | tr '\0' '\132') || fail "the VDI after the refusal"

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
