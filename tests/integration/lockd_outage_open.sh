#!/usr/bin/env bash
# plx-test: alone (asserts that no write waits 1 s: another script beside it could cause that)
# A lock manager outage stalls no VDI already open (issue 30): while fio writes (and flushes)
# VDI a through `parallax serve`, lockd is killed, and later frozen (SIGSTOP), and a client
# opens VDI b on the same server. Opening b for writing needs the admin lock, which is lockd's
# to grant: the open waits on the server's loop as a request waits (plx_vdi_open_async), so no
# write or flush of a waits a second, and b's client gets an error naming the lock manager after
# $PARALLAX_LOCK_TIMEOUT. A lockd that comes back within that time lets the open succeed. The
# handover path too: a client of VDI d, which another server holds, waits on h1 while lockd is
# down; h1's tries of the open wait on its loop, fio on a goes on, and once lockd is back the
# holder lets go and d is handed over. Before, h1's serving thread slept in the admin lock's
# retry loop for the whole timeout, at each try.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio jq python3 qemu-io nbdinfo
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
lease=3

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOCKD_PID=
start_lockd() {
    "$LOCKD" --listen "127.0.0.1:$port" --lease $lease >>"$T/lockd.log" 2>&1 &
    LOCKD_PID=$!
    bg_pid $LOCKD_PID
    for ((i = 0; i < 50; i++)); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && return
        sleep 0.1
    done
    fail "lockd did not start: $(cat "$T/lockd.log")"
}
kill_lockd() {
    kill -9 "$LOCKD_PID"
    wait "$LOCKD_PID" 2>/dev/null || true
}
start_lockd
plx format --size 1G >/dev/null
plx lockd-set "127.0.0.1:$port"
for v in a b c d; do plx vdi-create $v --size 16M >/dev/null; done

# h1: the server under test. Its admin lock waits 4 s at most.
PARALLAX_HOST_ID=h1 PARALLAX_LOCK_TIMEOUT=4 PARALLAX_HANDOVER_WAIT=40 \
    "$PARALLAX" -b "$T/store.img" serve --unix "$T/h1.sock" >"$T/h1.log" 2>&1 &
H1=$!
bg_pid $H1
wait_socket "$T/h1.sock" "$H1" "$T/h1.log"

# A client keeps a open for the whole test (opening it needs lockd; serving it does not).
hold_open hold "nbd+unix:///a?socket=$T/h1.sock" 3
# Written whole first: fio's writes below overwrite in place and need no new extent (claiming
# one takes the admin lock, which needs lockd).
qemu-io -f raw -c "write -P 7 0 16M" -c flush "nbd+unix:///a?socket=$T/h1.sock" >"$T/fill.log" 2>&1 ||
    fail "filling a: $(cat "$T/fill.log")"

FIO_PID=
fio_start() { # NAME SECONDS: writes with a flush every 16, in the background
    fio --name="$1" --ioengine=nbd --uri="nbd+unix:///a?socket=$T/h1.sock" --rw=randwrite \
        --bs=4k --iodepth=4 --size=16M --fsync=16 --time_based --runtime="$2" \
        --output-format=json --output="$T/$1.json" >"$T/$1.out" 2>&1 &
    FIO_PID=$!
    bg_pid $FIO_PID
}
fio_check() { # NAME WHAT: no write or flush of a waited 1 s
    wait "$FIO_PID" || fail "fio $1: $(cat "$T/$1.out")"
    sed -n '/^{/,$p' "$T/$1.json" >"$T/$1.clean.json"
    [[ $(jq '.jobs[0].error' "$T/$1.clean.json") == 0 ]] || fail "fio $1 reported an error"
    local ios max_ms sync_max_ms
    ios=$(jq '.jobs[0].write.total_ios' "$T/$1.clean.json")
    max_ms=$(jq '.jobs[0].write.clat_ns.max / 1000000 | floor' "$T/$1.clean.json")
    sync_max_ms=$(jq '(.jobs[0].sync.lat_ns.max // 0) / 1000000 | floor' "$T/$1.clean.json")
    echo "fio $1: $ios writes, slowest write $max_ms ms, slowest flush $sync_max_ms ms, $2"
    ((ios > 100)) || fail "fio $1: only $ios writes completed"
    ((max_ms < 1000)) || fail "fio $1: a write of a waited $max_ms ms: the serving thread waited for the lock manager ($2)"
    ((sync_max_ms < 1000)) || fail "fio $1: a flush of a waited $sync_max_ms ms ($2)"
}

# 1. lockd killed: b's open fails after the lock timeout, naming the lock manager; c's last
# client leaves meanwhile, and c's close (which clears c's lock under the admin lock) waits on
# the loop too.
hold_open holdc "nbd+unix:///c?socket=$T/h1.sock" 5
fio_start killed 8
sleep 1.5
kill_lockd
echo quit >&5
exec 5>&-
t0=$(date +%s.%N)
# qemu-io shows the text of the server's option reply ("server reported: ..."); nbdinfo does not.
if qemu-io -f raw -c "read 0 4k" "nbd+unix:///b?socket=$T/h1.sock" >"$T/b.out" 2>&1; then
    fail "b opened with lockd down: $(cat "$T/b.out")"
fi
t1=$(date +%s.%N)
cat "$T/b.out"
contains "lock manager" <"$T/b.out" || fail "b's client was not told about the lock manager: $(cat "$T/b.out")"
python3 -c "import sys; w = $t1 - $t0; print('b failed after %.1f s' % w); sys.exit(0 if 3 < w < 30 else 1)" ||
    fail "b's open did not wait for the lock timeout (4 s)"
fio_check killed "lockd killed, b opened and c closed meanwhile"
grep "closing 'c'" "$T/h1.log" | contains "lock manager" || fail "c's close did not say it could not reach the lock manager: $(cat "$T/h1.log")"

# 2. lockd comes back within the lock timeout: c's open, waiting meanwhile, succeeds (c's
# record still names h1, whose close could not clear it: h1 takes its own lock back).
fio_start back 6
sleep 1
nbdinfo --size "nbd+unix:///c?socket=$T/h1.sock" >"$T/c.out" 2>&1 &
C=$!
sleep 1.5
start_lockd
wait $C || fail "c did not open once lockd was back: $(cat "$T/c.out")"
[[ $(cat "$T/c.out") == 16777216 ]] || fail "c's size: $(cat "$T/c.out")"
fio_check back "lockd down, then back while c opened"

# 3. lockd frozen: the connection stays up and nothing answers.
sleep 1 # h1 is connected again
fio_start frozen 8
sleep 1.5
kill -STOP "$LOCKD_PID"
if qemu-io -f raw -c "read 0 4k" "nbd+unix:///b?socket=$T/h1.sock" >"$T/b2.out" 2>&1; then
    kill -CONT "$LOCKD_PID"
    fail "b opened with lockd frozen: $(cat "$T/b2.out")"
fi
cat "$T/b2.out"
contains "lock manager" <"$T/b2.out" || fail "b's client was not told about the lock manager: $(cat "$T/b2.out")"
fio_check frozen "lockd frozen, b opened meanwhile"
kill -CONT "$LOCKD_PID"

# 4. Handover with lockd down: h2 holds d; a client of d on h1 waits for it.
PARALLAX_HOST_ID=h2 PARALLAX_LOCK_TIMEOUT=30 \
    "$PARALLAX" -b "$T/store.img" serve --unix "$T/h2.sock" >"$T/h2.log" 2>&1 &
H2=$!
bg_pid $H2
wait_socket "$T/h2.sock" "$H2" "$T/h2.log"
hold_open hold2 "nbd+unix:///d?socket=$T/h2.sock" 4
qemu-io -f raw -c "write -P 9 0 64k" "nbd+unix:///d?socket=$T/h1.sock" >"$T/d.out" 2>&1 &
D=$!
bg_pid $D
for ((i = 0; i < 50; i++)); do grep -q "export 'd'.*wait" "$T/h1.log" && break; sleep 0.1; done
grep -q "export 'd'.*wait" "$T/h1.log" || fail "h1 did not wait for d: $(cat "$T/h1.log")"
fio_start handover 9
sleep 1
kill_lockd
echo quit >&4 # h2 lets go of d: its close waits for lockd
exec 4>&-
sleep 5 # h1's tries wait for lockd past its lock timeout (4 s) and go on
kill -0 $D 2>/dev/null || fail "d's write ended with lockd down: $(cat "$T/d.out")"
start_lockd
wait $D || fail "d's write failed: $(cat "$T/d.out") $(cat "$T/h1.log")"
grep -q "export 'd': handed over" "$T/h1.log" || fail "d was not handed over: $(cat "$T/h1.log")"
fio_check handover "lockd down while a handover to h1 waited"
qemu-io -f raw -c "read -P 9 0 64k" "nbd+unix:///d?socket=$T/h1.sock" >"$T/dr.out" 2>&1 ||
    fail "d's data: $(cat "$T/dr.out")"

echo quit >&3
exec 3>&-
echo ok
