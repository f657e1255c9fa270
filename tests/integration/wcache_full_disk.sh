#!/usr/bin/env bash
# The write cache on a local disk that is full: a small ext4 file system (a loop device) with
# less room than the log needs. `serve --write-cache` must refuse at start-up with a message that
# says the disk has no room, leave no file behind, and serve nothing; with a size that fits it
# starts, and the log's space is reserved at once (a disk that fills up later cannot fail a log
# write for want of space).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd losetup mkfs.ext4 mount umount qemu-io
[[ $(id -u) -eq 0 ]] || skip "needs root (loop devices, mount)"
losetup -f >/dev/null 2>&1 || skip "no free loop device (losetup -f failed)"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR" "$T/disk"
plx format --size 256M --extent-size 16M >/dev/null
plx vdi-create vm --size 32M >/dev/null

truncate -s 24M "$T/disk.img"
mkfs.ext4 -q -F "$T/disk.img"
loop=$(losetup -f --show "$T/disk.img") || skip "losetup could not attach a loop device"
on_exit "losetup -d '$loop' 2>/dev/null"
mount "$loop" "$T/disk" || skip "mount of a loop device failed"
on_exit "umount '$T/disk' 2>/dev/null"
# Fill it up but for a few MiB.
fallocate -l 14M "$T/disk/filler" 2>/dev/null || dd if=/dev/zero of="$T/disk/filler" bs=1M count=14 status=none
free_kib=$(df -k --output=avail "$T/disk" | tail -1 | tr -d ' ')
[[ $free_kib -lt 16384 ]] || fail "the small disk still has $free_kib KiB free"

expect_fail 1 plx serve --unix "$T/x.sock" --write-cache "$T/disk/wlog" --write-cache-size 16M
[[ $PLX_LAST_STDERR == *"no room"* ]] || fail "full disk: $PLX_LAST_STDERR"
# What to do, in serve's own terms (it named cache's --size).
[[ $PLX_LAST_STDERR == *"--write-cache-size"* ]] || fail "full disk, the option: $PLX_LAST_STDERR"
[[ ! -e $T/disk/wlog ]] || fail "a log the disk had no room for was left behind"
[[ ! -S $T/x.sock ]] || fail "the server listened although the log was refused"

# A log that fits: it starts, its space is taken at once, and writes go through it.
"$PARALLAX" -b "$T/store.img" serve --unix "$T/a.sock" --write-cache "$T/disk/wlog" \
    --write-cache-size 4M >"$T/a.log" 2>&1 &
pid=$!
bg_pid $pid
wait_socket "$T/a.sock" "$pid" "$T/a.log"
used_kib=$(du -k "$T/disk/wlog" | cut -f1)
[[ $used_kib -ge 4096 ]] || fail "the log's space was not reserved: $used_kib KiB"
# Take what is left of the disk: the log keeps working.
fallocate -l "$(($(df -k --output=avail "$T/disk" | tail -1 | tr -d ' ') - 64))K" \
    "$T/disk/filler2" 2>/dev/null || true
qemu-io -f raw -c "write -P 0x5c 0 12M" -c flush -c "read -P 0x5c 0 12M" \
    "nbd+unix:///vm?socket=$T/a.sock" | contains "^read 12582912/12582912" ||
    fail "writes through a log on a full disk"
kill $pid
wait $pid 2>/dev/null || true
plx check --quiet || fail "check"
echo "wcache_full_disk: ok"
