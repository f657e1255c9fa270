#!/usr/bin/env bash
# plx-test: alone
# `parallax serve --write-cache` in front of a slow shared store (a tgtd LUN opened O_DIRECT,
# tgtd in a cgroup v1 blkio group limited to 1 MiB/s of writes): a client that wrote a burst and
# left must not stop the others (issue 14). The server used to close the VDI of a departed
# client with plx_vdi_close, which drains the VDI's writes into the store while the engine
# thread waits, so every other client waited for the whole drain.
# - client B connects to VDI b (opened, cache on) and waits;
# - client A writes 6 MiB to VDI a and flushes (into the log), and leaves: its drain takes some
#   6 s at 1 MiB/s;
# - B then writes 1 MiB and flushes: done within 2 s, while A's drain still runs;
# - A comes back while a is still closing and reads its data (the open VDI is taken over);
# - once drained, a and b are closed (released for other processes), and check is clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io python3 jq lsblk findmnt
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

"$PARALLAX" -b "$url" serve --unix "$T/s.sock" --write-cache "$T/wlog" --write-cache-size 64M \
    >"$T/serve.log" 2>&1 &
srv=$!
bg_pid $srv
wait_socket "$T/s.sock" "$srv" "$T/serve.log"

# Client B: connected first (its VDI's open and record writes are not what is measured); on
# $T/go it writes 1 MiB and flushes, and prints how long that took.
python3 - "$T/s.sock" "$T/go" >"$T/b.out" 2>&1 <<'PY' &
import os, socket, struct, sys, time
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
recvn(18)                                    # NBDMAGIC, IHAVEOPT, handshake flags
s.sendall(struct.pack(">I", 3))              # fixed newstyle, no zeroes
s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, 1) + b"b")  # NBD_OPT_EXPORT_NAME "b"
recvn(10)                                    # size, transmission flags
print("connected", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
t0 = time.monotonic()
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 1, 0, 1 << 20) + b"\x6b" * (1 << 20))
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 3, 2, 0, 0))          # flush
for _ in range(2):
    magic, err, handle = struct.unpack(">IIQ", recvn(16))
    if magic != 0x67446698 or err:
        raise SystemExit("bad reply %x err %d" % (magic, err))
print("b-done %.3f" % (time.monotonic() - t0), flush=True)
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 2, 3, 0, 0))          # disconnect
PY
bpid=$!
bg_pid $bpid
for ((i = 0; i < 100; i++)); do
    grep -q connected "$T/b.out" && break
    sleep 0.1
done
grep -q connected "$T/b.out" || fail "client B did not connect: $(cat "$T/b.out")"

# From here the store writes 1 MiB/s.
tgt_throttle $((1 << 20))

# Client A: 6 MiB into the log, flushed, and gone.
timeout 60 qemu-io -f raw -c "write -P 0x5a 0 6M" -c flush "nbd+unix:///a?socket=$T/s.sock" \
    >"$T/a.out" 2>&1 || fail "client A: $(cat "$T/a.out")"
t_left=$(date +%s.%N)
touch "$T/go"
timeout 60 tail --pid=$bpid -f /dev/null || true
took=$(awk '/^b-done/ {print $2}' "$T/b.out")
[[ -n $took ]] || fail "client B: $(cat "$T/b.out")"

# A again, while a is still closing (its drain takes seconds): the open VDI serves it.
timeout 60 qemu-io -f raw -c "read -P 0x5a 0 6M" "nbd+unix:///a?socket=$T/s.sock" |
    contains "^read 6291456/6291456" || fail "A's data did not read back while a was closing"

# Drained, then closed: no server holds a or b any more. (`cache status` opens the store, which
# may itself wait for the throttled store: only the end is timed.)
for ((i = 0; i < 120; i++)); do
    [[ $(P cache status --json | jq length) == 0 ]] && break
    sleep 0.5
done
[[ $(P cache status --json | jq length) == 0 ]] ||
    fail "a and b were not closed after their drain: $(P cache status --json)"
drained=$(echo "$(date +%s.%N) - $t_left" | bc)
echo "B's 1 MiB write and flush: $took s; a and b closed $drained s after A left"
# The test only tells something if A's drain was still running when B finished.
awk -v d="$drained" 'BEGIN { exit !(d >= 3.0) }' ||
    skip "the throttled store drained A's 6 MiB in $drained s: too fast to tell"
awk -v t="$took" 'BEGIN { exit !(t < 2.0) }' ||
    fail "B's write and flush took $took s while A's VDI was being closed: it waited for A's drain"
kill $srv
wait $srv 2>/dev/null || true
grep -q "closing" "$T/serve.log" && fail "a close failed: $(cat "$T/serve.log")"
P check --quiet || fail "check"
echo "wcache_close: ok"
