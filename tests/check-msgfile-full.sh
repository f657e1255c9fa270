#!/bin/sh
# Run a Check unit test while the file system that holds Check's message file keeps filling up
# and emptying again (a disk that other processes fill now and then), to show that the test's
# report survives it (tests/unit/check_msgfile.c says why it could not before).
#
#   tests/check-msgfile-full.sh [ROUNDS] [BINARY]
#
# Runs BINARY (default build/unit/test_crash, one crash-harness workload per round:
# CK_RUN_CASE=workloads PLX_CRASH_SHARD=K/30) ROUNDS times (default 3) with TEMP (where Check
# puts the file) on a 128 MiB ext4 file system on a loop device that a background loop fills
# to the last block for 50 ms in every 100 ms. Exits 0 when every round ended with its Check
# summary and exit status 0. A test binary linked without the room-taking wrapper dies here with
# "check_pack.c:...: Bad message type arg ..." (or another check_pack.c error) and no summary.
# Needs root (losetup, mount).
set -u
rounds=${1:-3}
bin=${2:-build/unit/test_crash}
[ "$(id -u)" -eq 0 ] || { echo "check-msgfile-full: needs root (loop device)" >&2; exit 77; }
[ -x "$bin" ] || { echo "check-msgfile-full: $bin not built" >&2; exit 2; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/plx-msgfile.XXXXXX")
filler=""
cleanup() {
    [ -n "$filler" ] && kill "$filler" 2>/dev/null && wait "$filler" 2>/dev/null
    umount "$dir/mnt" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
mkdir "$dir/mnt"
truncate -s 128M "$dir/disk.img"
mkfs.ext4 -q -F -m 0 "$dir/disk.img" # -m 0: no blocks kept back for root
mount -o loop "$dir/disk.img" "$dir/mnt" || { echo "check-msgfile-full: mount failed" >&2; exit 77; }

(
    while :; do
        avail=$(df -k --output=avail "$dir/mnt" | tail -1)
        fallocate -l "${avail}K" "$dir/mnt/fill" 2>/dev/null
        sleep 0.05
        rm -f "$dir/mnt/fill"
        sleep 0.05
    done
) &
filler=$!

status=0
k=0
while [ "$k" -lt "$rounds" ]; do
    TEMP="$dir/mnt" CK_RUN_CASE=workloads PLX_CRASH_SHARD=$((k % 30))/30 "$bin" >"$dir/out" 2>&1
    rc=$?
    summary=$(grep -h "Checks:" "$dir/out")
    echo "round $((k + 1)): exit $rc; ${summary:-no Check summary}"
    grep -h "check_pack\|check_msg\|check_run" "$dir/out" | sed 's/^/    /'
    if [ "$rc" -ne 0 ] || [ -z "$summary" ]; then
        status=1
    fi
    k=$((k + 1))
done
exit "$status"
