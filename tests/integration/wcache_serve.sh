#!/usr/bin/env bash
# The write cache of `parallax serve --write-cache` with a real NBD client (qemu-io):
# - bad logs are refused with a clear message: on tmpfs, the blockstore itself, too small, a log
#   of another host; a new log is written through (no unwritten extents);
# - writes go through the log; `cache status` (text and JSON) shows it; disable drains;
# - kill -9 with a full log (the drain held, a writer blocked on the full log): the VDI record
#   names the log, so the VDI cannot be opened for writing without it; a restarted server
#   replays it, and everything written and flushed before the kill reads back; check is clean;
#   until then vdi-export of the VDI is refused too (it would miss the log's writes), while a
#   snapshot taken before exports whole;
# - `cache discard --force` on a copy of the blockstore drops the log's writes (the older data).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io python3 jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
plx format --size 512M --extent-size 16M >/dev/null
plx vdi-create vm --size 64M >/dev/null

start_server() { # SOCK LOG ARGS... -> SERVER_PID
    local sock=$1 log=$2 i
    shift 2
    "$PARALLAX" -b "$T/store.img" serve --unix "$sock" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$log"
}
uri() { echo "nbd+unix:///vm?socket=$1"; }

# ---- Refusals ----------------------------------------------------------------------------------
echo "== refusals"
if [[ -d /dev/shm && $(stat -f -c %T /dev/shm) == tmpfs ]]; then
    expect_fail 1 plx serve --unix "$T/x.sock" --write-cache "/dev/shm/plx-wlog-$$"
    [[ $PLX_LAST_STDERR == *tmpfs* ]] || fail "tmpfs log: $PLX_LAST_STDERR"
    [[ ! -e /dev/shm/plx-wlog-$$ ]] || fail "a refused log was created"
fi
expect_fail 1 plx serve --unix "$T/x.sock" --write-cache "$T/store.img"
[[ $PLX_LAST_STDERR == *"blockstore itself"* ]] || fail "log on the store: $PLX_LAST_STDERR"
expect_fail 1 plx serve --unix "$T/x.sock" --write-cache "$T/tiny" --write-cache-size 64K
[[ $PLX_LAST_STDERR == *"too small"* ]] || fail "tiny log: $PLX_LAST_STDERR"
[[ ! -e $T/tiny ]] || fail "a refused log was left behind"

# ---- Writes through the cache, status, disable -------------------------------------------------
echo "== writes through the cache"
start_server "$T/a.sock" "$T/a.log" --write-cache "$T/wlog" --write-cache-size 8M
# The new log is written through: no unwritten extents (posix_fallocate's), whose conversion at
# the first write of each region waits in the filesystem's journal.
if command -v filefrag >/dev/null && filefrag -v "$T/wlog" >"$T/frag" 2>/dev/null; then
    ! grep -q unwritten "$T/frag" || fail "the new log has unwritten extents: $(cat "$T/frag")"
fi
qemu-io -f raw -c "write -P 0x11 0 4M" -c flush "$(uri "$T/a.sock")" >/dev/null
# A client keeps the VDI open while we look at it.
python3 - "$T/a.sock" >"$T/hold.out" 2>&1 <<'PY' &
import socket, sys, time
# Hold an NBD connection open (handshake only) so the server keeps the VDI open.
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.recv(18); s.sendall((1).to_bytes(4, "big"))
name = b"vm"
s.sendall(b"IHAVEOPT" + (1).to_bytes(4, "big") + len(name).to_bytes(4, "big") + name)
s.recv(1024)
print("connected", flush=True)
time.sleep(30)
PY
holder=$!
bg_pid $holder
# (The VDI stays open after qemu-io left until the log has drained it: status alone does not
# say the holder has it.)
for ((i = 0; i < 100; i++)); do
    grep -q connected "$T/hold.out" && break
    sleep 0.1
done
grep -q connected "$T/hold.out" || fail "the holder did not connect: $(cat "$T/hold.out")"
for ((i = 0; i < 50; i++)); do
    plx cache status | contains "^vm .*cache on" && break
    sleep 0.1
done
plx cache status | contains "^vm .*cache on .*wlog" || fail "status: $(plx cache status)"
plx cache status --json | jq -e '.[0].mode == "on" and .[0].log_bytes == 8388608' >/dev/null ||
    fail "status --json: $(plx cache status --json)"
plx cache disable vm | contains "off (drained)" || fail "disable"
plx cache status --json | jq -e '.[0].mode == "off" and .[0].backlog_bytes == 0' >/dev/null ||
    fail "status after disable: $(plx cache status --json)"
plx cache enable vm | contains "write cache on" || fail "enable"
kill $holder
wait $holder 2>/dev/null || true
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
plx check --quiet || fail "check after a clean stop"

# ---- Another host may not attach this host's log -----------------------------------------------
echo "== another host"
PARALLAX_HOST_ID=other-host expect_fail 1 plx serve --unix "$T/x.sock" --write-cache "$T/wlog"
[[ $PLX_LAST_STDERR == *"belongs to host"* ]] || fail "other host: $PLX_LAST_STDERR"

# ---- kill -9 with a full log -----------------------------------------------------------------------
echo "== kill -9"
plx vdi-snapshot vm --label before-kill >/dev/null
PARALLAX_WCACHE_HOLD_DRAIN=1 start_server "$T/b.sock" "$T/b.log" --write-cache "$T/wlog"
# One client: 4 MiB written and flushed, then more than the 8 MiB log holds: that write waits
# for a drain that is held (the client stays connected, so the VDI stays open).
timeout 60 qemu-io -f raw -c "write -P 0x22 0 3M" -c "write -P 0x33 3M 1M" -c flush \
    -c "write -P 0x44 8M 16M" "$(uri "$T/b.sock")" >"$T/writer.out" 2>&1 &
writer=$!
bg_pid $writer
for ((i = 0; i < 100; i++)); do
    used=$(plx cache status --json | jq '.[0].used_bytes // 0')
    [[ $used -ge $((7 << 20)) ]] && break
    sleep 0.1
done
[[ $used -ge $((7 << 20)) ]] || fail "the log did not fill: $(plx cache status --json)"
# What the log wrote: the 3 MiB and 1 MiB writes come from serve's block-aligned buffers and are
# written from them without a copy (records of 256 KiB and more: logged_bytes, zc_bytes).
for ((i = 0; i < 50; i++)); do
    plx cache status --json | jq -e '.[0].logged_bytes >= 7340032 and .[0].zc_bytes >= 1048576
        and .[0].zc_records >= 1 and .[0].zc_bytes <= .[0].logged_bytes' >/dev/null && break
    sleep 0.1
done
((i < 50)) || fail "no-copy counters: $(plx cache status --json)"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
wait $writer 2>/dev/null || true

# Without the log nobody may write the VDI (its newest data is only in the log).
expect_fail 1 plx vdi-snapshot vm
[[ $PLX_LAST_STDERR == *"write log"* && $PLX_LAST_STDERR == *"cache discard"* ]] ||
    fail "open without the log: $PLX_LAST_STDERR"
expect_fail 2 plx cache discard vm
# Nor read its current image: an export would miss the log's writes and pass for a backup. The
# message says how to get them out. A snapshot taken before is whole (a snapshot waits for the
# VDI's records to drain), so its export goes on.
expect_fail 1 plx vdi-export vm "$T/vm.raw"
[[ $PLX_LAST_STDERR == *"write log"* && $PLX_LAST_STDERR == *"--write-cache"* ]] ||
    fail "export without the log: $PLX_LAST_STDERR"
[[ ! -e $T/vm.raw ]] || fail "the refused export created $T/vm.raw"
plx vdi-export vm@before-kill "$T/before.raw"
# The log itself, whose writes wait for the replay, is no target for an export.
sum=$(sha256sum <"$T/wlog")
expect_fail 1 plx vdi-export vm@before-kill "$T/wlog"
[[ $PLX_LAST_STDERR == *"is a Parallax write log"* ]] || fail "export onto the log: $PLX_LAST_STDERR"
assert_eq "$sum" "$(sha256sum <"$T/wlog")" "the log after a refused export onto it"
cmp -n 4M "$T/before.raw" <(python3 -c 'import sys; sys.stdout.buffer.write(b"\x11" * (4 << 20))') ||
    fail "the snapshot taken before the kill does not read back"
cp --sparse=always "$T/store.img" "$T/copy.img"

echo "== replay"
# The restarted server replays the log first.
start_server "$T/c.sock" "$T/c.log" --write-cache "$T/wlog"
grep -q "replayed" "$T/c.log" || fail "no replay: $(cat "$T/c.log")"
qemu-io -f raw -c "read -P 0x22 0 3M" -c "read -P 0x33 3M 1M" "$(uri "$T/c.sock")" |
    contains "^read 1048576/1048576" || fail "flushed writes lost after kill -9 and replay"
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
plx check --quiet || fail "check after replay"

# discard on the copy: the VDI opens again, at the older point the blockstore held.
"$PARALLAX" -b "$T/copy.img" cache discard vm --force 2>"$T/discard.err" ||
    fail "discard: $(cat "$T/discard.err")"
grep -q "lost" "$T/discard.err" || fail "discard warns: $(cat "$T/discard.err")"
"$PARALLAX" -b "$T/copy.img" vdi-snapshot vm >/dev/null || fail "open after discard"
"$PARALLAX" -b "$T/copy.img" check --quiet || fail "check after discard"
echo "wcache_serve: ok"
