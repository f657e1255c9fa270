#!/usr/bin/env bash
# plx-test: alone (asserts that no write waits 1 s: another script beside it could cause that)
# A lock manager outage stalls no VDI already open, even when another VDI of the same server
# needs new extents or takes snapshots (issue 30): while fio overwrites VDI a through
# `parallax serve` (in place: no allocation), lockd is frozen (SIGSTOP) and VDI b, on the same
# server, is snapshotted with `parallax vdi-snapshot` (which finds the server without lockd and
# has it snapshot b in b's request stream) and rewritten over many leaves until the allocator's
# extents and its spare run out. A new extent is claimed under the admin lock, which is lockd's
# to grant: the claim waits on the server's loop as a request waits, so no write or flush of a
# waits a second; b's snapshot or write that needs the extent waits, and fails after
# $PARALLAX_LOCK_TIMEOUT with a message naming the lock manager; a snapshot that needs none is
# taken. Once lockd answers again, b's snapshots and writes succeed. Before, the serving thread
# slept in the admin lock's retry loop for the whole timeout at each such claim, every guest of
# the server waited with it, and the server fenced itself (its lease ran out).
# Small extents (1 MiB) so that a few hundred blocks use one up. With --iscsi the store is a
# tgtd LUN (lockd_outage_iscsi.sh), as in a pool; else a file.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio jq python3 qemu-io
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
lease=3

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$LOCKD" --listen "127.0.0.1:$port" --lease $lease >>"$T/lockd.log" 2>&1 &
LOCKD_PID=$!
bg_pid $LOCKD_PID
on_exit "kill -CONT $LOCKD_PID 2>/dev/null"
for ((i = 0; i < 50; i++)); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
    sleep 0.1
done
STORE=$T/store.img
if [[ ${1:-} == --iscsi ]]; then
    tgt_start
    STORE=$(tgt_add_lun 1 2G)
fi
plx() { "$PARALLAX" -b "$STORE" "$@"; }
if [[ $STORE == iscsi:* ]]; then plx format --extent-size 1M >/dev/null; else plx format --size 2G --extent-size 1M >/dev/null; fi
plx lockd-set "127.0.0.1:$port"
plx vdi-create a --size 4M >/dev/null
plx vdi-create b --size 1G >/dev/null

PARALLAX_HOST_ID=h1 PARALLAX_LOCK_TIMEOUT=4 \
    "$PARALLAX" -b "$STORE" serve --unix "$T/h1.sock" >"$T/h1.log" 2>&1 &
H1=$!
bg_pid $H1
wait_socket "$T/h1.sock" "$H1" "$T/h1.log"

# Clients keep a and b open for the whole test (so b's snapshots go to the server).
for v in a b; do
    mkfifo "$T/hold$v.fifo"
    qemu-io -f raw "nbd+unix:///$v?socket=$T/h1.sock" <"$T/hold$v.fifo" >"$T/hold$v.log" 2>&1 &
    bg_pid $!
done
exec 3>"$T/holda.fifo" 4>"$T/holdb.fifo"
for v in a b; do
    for ((i = 0; i < 50; i++)); do grep -q 'qemu-io>' "$T/hold$v.log" && break; sleep 0.1; done
    grep -q 'qemu-io>' "$T/hold$v.log" || fail "qemu-io did not open $v: $(cat "$T/hold$v.log")"
done
# a written whole first: fio's writes below overwrite in place and need no new block.
qemu-io -f raw -c "write -P 7 0 4M" -c flush "nbd+unix:///a?socket=$T/h1.sock" >"$T/fill.log" 2>&1 ||
    fail "filling a: $(cat "$T/fill.log")"
# One block in each of 256 leaves of b (a leaf maps 2 MiB): after a snapshot, rewriting them
# copies 256 leaves, a quarter of a megabyte of metadata, and takes 256 data blocks.
leaves=()
for ((k = 0; k < 256; k++)); do leaves+=(-c "write -P $((k % 200 + 1)) $((k * 2))M 4k"); done
qemu-io -f raw "${leaves[@]}" -c flush "nbd+unix:///b?socket=$T/h1.sock" >"$T/b0.log" 2>&1 ||
    fail "writing b: $(cat "$T/b0.log")"

fio --name=a --ioengine=nbd --uri="nbd+unix:///a?socket=$T/h1.sock" --rw=randwrite \
    --bs=4k --iodepth=4 --size=4M --fsync=16 --time_based --runtime=20 \
    --output-format=json --output="$T/a.json" >"$T/a.out" 2>&1 &
FIO=$!
bg_pid $FIO
sleep 1.5
kill -STOP "$LOCKD_PID"
t_stop=$(date +%s)
# Snapshot b and rewrite its leaves (random 4 KiB writes over all of b: each copies a leaf)
# until a write needs an extent that cannot be claimed: fio stops at its first error.
# `parallax vdi-snapshot` finds the server without lockd (the holder is a process of this host)
# and sends the snapshot to its control socket.
rewrite() { # NAME
    fio --name="$1" --ioengine=nbd --uri="nbd+unix:///b?socket=$T/h1.sock" --rw=randwrite \
        --bs=4k --iodepth=4 --size=1G --number_ios=512 --randrepeat=0 --fsync=64 \
        --output="$T/$1.out" >/dev/null 2>&1
}
failed=
for ((round = 1; round <= 8; round++)); do
    PARALLAX_HOST_ID=h1 plx vdi-snapshot b >"$T/snap$round.out" 2>&1 || failed="snapshot $round"
    [[ -n $failed ]] || rewrite "rewrite$round" || failed="rewrite $round"
    [[ -z $failed ]] || break
done
t_fail=$(date +%s)
echo "with lockd frozen, b's $failed failed after $((t_fail - t_stop)) s"
[[ -n $failed ]] || fail "b never needed a new extent: the test does not test anything"
# The first snapshot needed no new extent: taken with lockd frozen.
[[ $failed != "snapshot 1" ]] || fail "b's first snapshot failed with room left: $(cat "$T/snap1.out")"
# The metadata room is spent: a snapshot of b (b changed since its last one: a new root) waits
# for the claim and fails, naming the lock manager.
snap_failed=
for ((k = 0; k < 4 && !snap_failed; k++)); do
    if ! PARALLAX_HOST_ID=h1 plx vdi-snapshot b >"$T/snapx$k.out" 2>&1; then
        snap_failed=1
        cat "$T/snapx$k.out"
        contains "lock manager" <"$T/snapx$k.out" ||
            fail "b's snapshot failed without naming the lock manager: $(cat "$T/snapx$k.out")"
    else
        qemu-io -f raw -c "write -P 3 $((k * 2 + 1))M 4k" "nbd+unix:///b?socket=$T/h1.sock" >/dev/null 2>&1 || true
    fi
done
[[ -n $snap_failed ]] || fail "every snapshot of b succeeded with the extents spent and lockd frozen"
wait "$FIO" || fail "fio: $(cat "$T/a.out")"
kill -CONT "$LOCKD_PID"
sed -n '/^{/,$p' "$T/a.json" >"$T/a.clean.json"
[[ $(jq '.jobs[0].error' "$T/a.clean.json") == 0 ]] || fail "fio reported an error"
ios=$(jq '.jobs[0].write.total_ios' "$T/a.clean.json")
max_ms=$(jq '.jobs[0].write.clat_ns.max / 1000000 | floor' "$T/a.clean.json")
sync_max_ms=$(jq '(.jobs[0].sync.lat_ns.max // 0) / 1000000 | floor' "$T/a.clean.json")
echo "fio a: $ios writes, slowest write $max_ms ms, slowest flush $sync_max_ms ms"
((ios > 100)) || fail "fio: only $ios writes completed"
((max_ms < 1000)) || fail "a write of a waited $max_ms ms: the serving thread waited for the lock manager while b claimed extents"
((sync_max_ms < 1000)) || fail "a flush of a waited $sync_max_ms ms while b claimed extents"

# lockd answers again: b takes snapshots and new blocks again.
sleep 1
PARALLAX_HOST_ID=h1 plx vdi-snapshot b >"$T/snap_after.out" 2>&1 || fail "b's snapshot with lockd back: $(cat "$T/snap_after.out")"
rewrite after || fail "rewriting b with lockd back: $(cat "$T/after.out")"
qemu-io -f raw -c "read -P 1 0 4k" "nbd+unix:///b?socket=$T/h1.sock" >"$T/b_read.log" 2>&1 ||
    fail "reading b: $(cat "$T/b_read.log")"
echo quit >&3
echo quit >&4
exec 3>&- 4>&-
echo ok
