#!/usr/bin/env bash
# A write-cache server's memory does not grow with the log's undrained records beyond a small
# index cost each: every record's data is on the log's disk, and what the server keeps per
# record until it is drained (DESIGN.md, "The write cache", Memory) is its index entry and its
# batch's list of records, sized to the records it holds. The drain is held
# (PARALLAX_WCACHE_HOLD_DRAIN=1), fio writes N 4 KiB blocks at QD 1 (N batches of one record
# each), and the server's peak resident memory (VmHWM) may grow by at most PER_RECORD_B bytes a
# record (default 3072; measured 1.2 KiB) over what it held before. A batch that kept room for
# 126 records until drained cost some 12 KiB a record: 80,000 writes, 960 MB.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio jq cc pkg-config
pkg-config --exists libnbd || skip "libnbd development files are missing"
N=${PLX_TEST_WCACHE_RECORDS:-80000}
PER_RECORD_B=${PLX_TEST_PER_RECORD_B:-3072}
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/s.sock
plx format --size 2G >/dev/null
plx vdi-create vm0 --size 512M >/dev/null

PARALLAX_WCACHE_HOLD_DRAIN=1 "$PARALLAX" -b "$T/store.img" serve --unix "$sock" \
    --write-cache "$T/wlog" --write-cache-size 1G >"$T/serve.log" 2>&1 &
srv=$!
bg_pid $srv
wait_socket "$sock" "$srv" "$T/serve.log"
kib() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$srv/status"; }
uri="nbd+unix:///vm0?socket=$sock"

# A connection held open keeps the VDI open: fio's own first connection (it asks the size and
# leaves) would otherwise close it, and a close drains, which ends the hold.
# shellcheck disable=SC2046 # pkg-config prints several words
cc -std=c11 -O2 -Wall -Wextra -Werror "$(dirname "$0")/nbd_hold.c" -o "$T/nbd_hold" \
    $(pkg-config --cflags --libs libnbd) || fail "building nbd_hold"
: >"$T/hold.log"
exec {HOLD_IN}> >(exec "$T/nbd_hold" "$sock" vm 1 >"$T/hold.log" 2>&1)
HOLD_PID=$!
bg_pid $HOLD_PID
for ((i = 0; i < 100; i++)); do
    contains ready <"$T/hold.log" && break
    kill -0 $HOLD_PID 2>/dev/null || fail "nbd_hold exited: $(cat "$T/hold.log")"
    sleep 0.1
done

base=$(kib VmHWM)
fio --name=qd1 --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 --number_ios="$N" \
    --size=512M --randrepeat=0 >"$T/fio.out" 2>&1 &
fio_pid=$!
bg_pid $fio_pid
# The most records the log held undrained while fio wrote (the hold works: nearly all of them).
records=0
while kill -0 $fio_pid 2>/dev/null; do
    r=$("$PARALLAX" -b "$T/store.img" cache status --json | jq '[.[].backlog_records] | add // 0')
    ((r > records)) && records=$r
    sleep 0.2
done
wait $fio_pid || fail "fio: $(tail -5 "$T/fio.out")"
peak=$(kib VmHWM)
grow_b=$(((peak - base) * 1024))
echo "VmHWM $base KiB before, $peak KiB after $N writes (up to $records records undrained): $((grow_b / N)) bytes a record"
((records >= N / 2)) || fail "at most $records records undrained during $N writes with the drain held: the test measures nothing"
((grow_b <= N * PER_RECORD_B)) ||
    fail "the server grew by $((grow_b / N)) bytes per undrained 4 KiB record (at most $PER_RECORD_B)"
echo "wcache_memory: ok"
