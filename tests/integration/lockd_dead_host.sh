#!/usr/bin/env bash
# plx-test: alone (asserts that no write waits 1 s: another script beside it could cause that)
# A lockd whose host is down (no answer, no reset) does not stall the engine's service loop.
# A host serves a VDI; lockd is killed and its port becomes a black hole: a listening socket
# that never accepts, with its backlog full, so the kernel drops every SYN to it and a connect
# neither succeeds nor fails (as with a host that went away). The engine keeps trying to reach
# lockd (its heartbeat starts a connect every quarter lease) while fio writes through it: no
# request waits anywhere near the 2 s a blocking connect took (the connect is non-blocking and
# advanced by later ticks). Then lockd comes back on the port and the engine reconnects.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio jq python3 ss qemu-io
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
lease=3

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_lockd() {
    "$LOCKD" --listen "127.0.0.1:$port" --lease $lease >>"$T/lockd.log" 2>&1 &
    LOCKD_PID=$!
    bg_pid $LOCKD_PID
    sleep 0.3
    kill -0 $LOCKD_PID || fail "lockd did not start: $(cat "$T/lockd.log")"
}
start_lockd
plx format --size 1G >/dev/null
plx lockd-set "127.0.0.1:$port"
plx vdi-create a --size 16M >/dev/null
PARALLAX_HOST_ID=h1 "$PARALLAX" -b "$T/store.img" serve --unix "$T/h1.sock" >"$T/h1.log" 2>&1 &
H1=$!
bg_pid $H1
wait_socket "$T/h1.sock" "$H1" "$T/h1.log"

# A client keeps the VDI open (opening it needs lockd; serving it does not).
export PARALLAX_LOCK_TIMEOUT=3
hold_open hold "nbd+unix:///a?socket=$T/h1.sock" 3
# Written whole first: fio's writes below overwrite in place and need no new extent (claiming
# one takes the admin lock, which needs lockd).
qemu-io -f raw -c "write -P 7 0 16M" -c flush "nbd+unix:///a?socket=$T/h1.sock" >"$T/fill.log" 2>&1 ||
    fail "filling a: $(cat "$T/fill.log")"

# lockd's host goes down: the port answers nothing from now on.
kill -9 $LOCKD_PID
wait $LOCKD_PID 2>/dev/null || true
python3 - "$port" >"$T/hole.log" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(0)
fillers = []
for _ in range(3):  # fill the accept queue; never accept
    c = socket.socket(); c.setblocking(False)
    try: c.connect(("127.0.0.1", port))
    except BlockingIOError: pass
    fillers.append(c)
time.sleep(0.5)
probe = socket.socket(); probe.settimeout(1.5)
try:
    probe.connect(("127.0.0.1", port)); print("ANSWERED", flush=True)
except OSError as e:
    print("BLACKHOLE", e, flush=True)
while True: time.sleep(60)
PY
HOLE=$!
bg_pid $HOLE
for ((i = 0; i < 50; i++)); do grep -q . "$T/hole.log" && break; sleep 0.1; done
grep -q BLACKHOLE "$T/hole.log" || fail "could not make the port a black hole: $(cat "$T/hole.log")"

# fio writes through h1 while its heartbeat keeps trying to reach lockd.
(for ((i = 0; i < 40; i++)); do ss -tnH state syn-sent "dport = :$port" 2>/dev/null; sleep 0.2; done >"$T/syn-sent.txt") &
SS=$!
fio --name=w --ioengine=nbd --uri="nbd+unix:///a?socket=$T/h1.sock" --rw=randwrite --bs=4k \
    --iodepth=4 --size=16M --time_based --runtime=6 --output-format=json \
    --output="$T/fio.json" >"$T/fio.out" 2>&1 || fail "fio: $(cat "$T/fio.out")"
wait $SS || true
sed -n '/^{/,$p' "$T/fio.json" >"$T/fio.clean.json"
[[ $(jq '.jobs[0].error' "$T/fio.clean.json") == 0 ]] || fail "fio reported an error"
ios=$(jq '.jobs[0].write.total_ios' "$T/fio.clean.json")
max_ms=$(jq '.jobs[0].write.clat_ns.max / 1000000 | floor' "$T/fio.clean.json")
echo "fio: $ios writes, slowest $max_ms ms, while lockd's port was a black hole"
[[ -s $T/syn-sent.txt ]] || fail "h1 never tried to reach lockd during the run (no SYN-SENT socket to port $port)"
((ios > 100)) || fail "only $ios writes completed in 6 s"
# A blocking connect held the loop 2 s at every heartbeat (every 0.75 s here).
((max_ms < 1000)) || fail "a write waited $max_ms ms: the service loop stalled on the unreachable lockd"
kill -0 $H1 || fail "h1 exited: $(cat "$T/h1.log")"

echo quit >&3
exec 3>&-

# lockd's host comes back: the engine connects again by itself.
kill $HOLE
wait $HOLE 2>/dev/null || true
start_lockd
for ((i = 0; i < 100; i++)); do
    plx lockd-status 2>/dev/null | contains "^HOST h1 " && break
    sleep 0.1
done
plx lockd-status | contains "^HOST h1 " || fail "h1 did not reconnect to lockd: $(plx lockd-status)"
echo ok
