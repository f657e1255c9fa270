#!/usr/bin/env bash
# plx-test: alone
# `parallax cache disable` and `parallax serve`'s stop drain a VDI's writes from the write log
# into a slow shared store (a tgtd LUN opened O_DIRECT, tgtd in a cgroup v1 blkio group limited
# to 1 MiB/s of writes) while the server goes on serving its other VDIs (issue 14). Both used to
# drain while the engine thread waited, so every other client waited for the whole drain, and
# the stop dropped the replies of requests in flight.
# - client A writes 6 MiB to VDI a through the cache, flushes, and stays connected;
# - `parallax cache disable a` returns only once a is drained (some 6 s at 1 MiB/s);
# - meanwhile client B writes 1 MiB to VDI b (cache on) and flushes: done within 2 s;
# - A writes 6 MiB more (the cache on again) and stays; B sends a write and a flush and at once
#   SIGTERM: B gets both replies and then the end of its connection, without waiting for a's
#   drain, while the server says what it waits for and exits once a is drained;
# - everything reads back from the blockstore alone, and check is clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd python3 jq lsblk findmnt
[[ $(id -u) -eq 0 ]] || skip "tgtd and cgroups need root"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
tgt_start
url=$(tgt_add_direct_lun 1 512M)
tgt_throttle 0 # tgtd in its blkio group, no limit yet
P() { "$PARALLAX" -b "$url" "$@"; }
P format --size 512M >/dev/null
P vdi-create a --size 16M >/dev/null
P vdi-create b --size 16M >/dev/null

# The drain is held (PARALLAX_WCACHE_HOLD_DRAIN) until something waits for it, so that A's
# writes are all in the log when `cache disable` or the stop begins.
PARALLAX_WCACHE_HOLD_DRAIN=1 "$PARALLAX" -b "$url" serve --unix "$T/s.sock" --write-cache "$T/wlog" \
    --write-cache-size 64M >"$T/serve.log" 2>&1 &
srv=$!
bg_pid $srv
wait_socket "$T/s.sock" "$srv" "$T/serve.log"

# An NBD client: `client.py SOCK EXPORT SCRIPT`, where SCRIPT is a list of steps separated by
# commas: wN:MIB:BYTE (write MIB MiB of BYTE at N MiB), f (flush), t (print the time the steps
# since the last t took), g:FILE (wait for FILE), p:TEXT (print TEXT), s:SECONDS (sleep),
# k:PID (SIGTERM PID, then
# expect the replies of every request sent and the end of the connection), q (disconnect).
cat >"$T/client.py" <<'PY'
import os, signal, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def recvn(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("server closed the connection")
        b += c
    return b
recvn(18)
s.sendall(struct.pack(">I", 3))
name = sys.argv[2].encode()
s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, len(name)) + name)
recvn(10)
print("connected", flush=True)
handle = 0
unanswered = 0
t0 = time.monotonic()
def send(typ, off=0, data=b""):
    global handle, unanswered
    handle += 1
    unanswered += 1
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, typ, handle, off, len(data)) + data)
def answer():
    global unanswered
    magic, err, h = struct.unpack(">IIQ", recvn(16))
    if magic != 0x67446698 or err:
        raise SystemExit("bad reply %x err %d" % (magic, err))
    unanswered -= 1
for step in sys.argv[3].split(","):
    op, _, arg = step.partition(":")
    if op.startswith("w"):
        at, mib, byte = int(op[1:]), int(arg.split(":")[0]), int(arg.split(":")[1], 0)
        for i in range(mib):
            send(1, (at + i) << 20, bytes([byte]) * (1 << 20))
    elif op == "f":
        send(3)
    elif op == "t":
        while unanswered:
            answer()
        print("took %.3f" % (time.monotonic() - t0), flush=True)
        t0 = time.monotonic()
    elif op == "g":
        while not os.path.exists(arg):
            time.sleep(0.01)
        t0 = time.monotonic()
    elif op == "p":
        print(arg, flush=True)
    elif op == "s":
        time.sleep(float(arg))
    elif op == "k":
        os.kill(int(arg), signal.SIGTERM)
        while unanswered:
            answer()
        if s.recv(1) != b"":
            raise SystemExit("data after the last reply")
        print("closed %.3f" % (time.monotonic() - t0), flush=True)
        sys.exit(0)
    elif op == "q":
        send(2)
        unanswered -= 1
PY
client() { timeout 120 python3 "$T/client.py" "$T/s.sock" "$@"; }

client b "g:$T/go,w0:1:0x6b,f,t,g:$T/stop,w1:1:0x6c,f,k:$srv" >"$T/b.out" 2>&1 &
bpid=$!
bg_pid $bpid
for ((i = 0; i < 100; i++)); do
    grep -q connected "$T/b.out" 2>/dev/null && break
    sleep 0.1
done
grep -q connected "$T/b.out" || fail "client B did not connect: $(cat "$T/b.out")"

# From here the store writes 1 MiB/s.
tgt_throttle $((1 << 20))

client a "w0:6:0x5a,f,t,p:a-ready,g:$T/again,w6:6:0x5b,f,t,g:$T/never" >"$T/a.out" 2>&1 &
apid=$!
bg_pid $apid
for ((i = 0; i < 300; i++)); do
    grep -q a-ready "$T/a.out" 2>/dev/null && break
    sleep 0.1
done
grep -q a-ready "$T/a.out" || fail "client A: $(cat "$T/a.out")"

# `cache disable a` drains a's 6 MiB; B writes meanwhile.
t0=$(date +%s.%N)
timeout 120 "$PARALLAX" -b "$url" cache disable a >"$T/disable.out" 2>&1 &
dpid=$!
sleep 2 # (the command opens the blockstore first)
touch "$T/go"
for ((i = 0; i < 100; i++)); do
    grep -q took "$T/b.out" && break
    sleep 0.1
done
wait $dpid || fail "cache disable: $(cat "$T/disable.out")"
disabled=$(echo "$(date +%s.%N) - $t0" | bc)
took=$(awk '/^took/ {print $2; exit}' "$T/b.out")
[[ -n $took ]] || fail "client B: $(cat "$T/b.out")"
echo "cache disable a: $disabled s; B's 1 MiB write and flush meanwhile: $took s"
awk -v d="$disabled" 'BEGIN { exit !(d >= 4.0) }' ||
    skip "the throttled store drained A's 6 MiB in $disabled s: too fast to tell"
awk -v t="$took" 'BEGIN { exit !(t < 2.0) }' ||
    fail "B's write and flush took $took s while a was drained by cache disable: it waited"
[[ $(P cache status --json | jq -r '.[] | select(.vdi == "a") | .cache_on') == false ]] ||
    fail "the cache of a is still on: $(P cache status)"

# The stop: the cache on again for a and 6 MiB more in the log (A stays connected); B sends a
# write and a flush and stops the server at once: B must get its replies and then the end of
# the connection, while a's drain goes on after.
P cache enable a >/dev/null || fail "cache enable a"
touch "$T/again"
for ((i = 0; i < 300; i++)); do
    [[ $(grep -c took "$T/a.out") == 2 ]] && break
    sleep 0.1
done
[[ $(grep -c took "$T/a.out") == 2 ]] || fail "client A: $(cat "$T/a.out")"
t_stop=$(date +%s.%N)
touch "$T/stop"
timeout 60 tail --pid=$bpid -f /dev/null || true
closed=$(awk '/^closed/ {print $2}' "$T/b.out")
[[ -n $closed ]] || fail "client B at the stop: $(cat "$T/b.out")"
timeout 120 tail --pid=$srv -f /dev/null || fail "the server did not exit after its drain"
stopped=$(echo "$(date +%s.%N) - $t_stop" | bc)
wait $srv || fail "the server exited with $?: $(cat "$T/serve.log")"
kill "$apid" 2>/dev/null || true
echo "stop: B answered and its connection ended $closed s after the signal; the server exited" \
    "$stopped s after B began"
grep -q "waiting for the write cache to drain" "$T/serve.log" ||
    fail "the server did not say what it waits for: $(cat "$T/serve.log")"
awk -v d="$stopped" 'BEGIN { exit !(d >= 4.0) }' ||
    skip "the throttled store drained a's 6 MiB in $stopped s: too fast to tell"
awk -v t="$closed" 'BEGIN { exit !(t < 3.5) }' ||
    fail "B's connection ended $closed s after the stop: it waited for a's drain"
grep -q "closing" "$T/serve.log" && fail "a close failed: $(cat "$T/serve.log")"

python3 - "$T/model_a.img" "$T/model_b.img" <<'PY2'
import sys
mib = 1 << 20
with open(sys.argv[1], "wb") as f:
    f.write(bytes([0x5a]) * 6 * mib + bytes([0x5b]) * 6 * mib + bytes(4 * mib))
with open(sys.argv[2], "wb") as f:
    f.write(bytes([0x6b]) * mib + bytes([0x6c]) * mib + bytes(14 * mib))
PY2
P vdi-export a "$T/a.img" || fail "export a"
P vdi-export b "$T/b.img" || fail "export b"
cmp -s "$T/model_a.img" "$T/a.img" || fail "a differs from what was written"
cmp -s "$T/model_b.img" "$T/b.img" || fail "b differs from what was written"
P check --quiet || fail "check"
echo "wcache_disable: ok"
