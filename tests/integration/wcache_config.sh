#!/usr/bin/env bash
# The host's write-cache settings file (/etc/parallax/write-cache; $PARALLAX_WRITE_CACHE_FILE
# here) with a real `parallax serve` and NBD client (qemu-io):
# - serve without --write-cache attaches the log the file names, with its size; the cache is on
#   for a VDI a client opens, and the writes read back;
# - --write-cache on the command line wins over the file;
# - write-cache-mode=auto and write-cache-threshold=MS in the file, `parallax cache auto VDI
#   --threshold MS` at run time, shown by `cache status` (text and JSON); `cache enable` leaves
#   the automatic mode; the drain's state and policy (idle, 50 ms, 2000 ms) in `cache status`;
# - a malformed file stops serve with a message naming the file and line; an absent file means
#   no cache.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io python3 jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
plx format --size 256M --extent-size 16M >/dev/null
plx vdi-create vm --size 32M >/dev/null

start_server() { # SOCK LOG ARGS... -> SERVER_PID
    local sock=$1 log=$2 i
    shift 2
    "$PARALLAX" -b "$T/store.img" serve --unix "$sock" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$log"
}
stop_server() {
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
}
uri() { echo "nbd+unix:///vm?socket=$1"; }

# Hold an NBD connection open (handshake only) so that the server keeps the VDI open.
hold_vdi() { # SOCK -> HOLDER_PID
    python3 - "$1" >"$T/hold.out" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.recv(18); s.sendall((1).to_bytes(4, "big"))
name = b"vm"
s.sendall(b"IHAVEOPT" + (1).to_bytes(4, "big") + len(name).to_bytes(4, "big") + name)
s.recv(1024)
time.sleep(30)
PY
    HOLDER_PID=$!
    bg_pid "$HOLDER_PID"
}
wait_status() { # JQ-EXPRESSION
    local i
    for ((i = 0; i < 50; i++)); do
        plx cache status --json | jq -e "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "cache status never matched $1: $(plx cache status --json)"
}

conf=$T/write-cache
export PARALLAX_WRITE_CACHE_FILE=$conf

echo "== no file: no cache"
start_server "$T/a.sock" "$T/a.log"
hold_vdi "$T/a.sock"
wait_status '.[0].mode == "off"'
kill "$HOLDER_PID"
stop_server
[[ ! -e $T/wlog ]] || fail "a log was created without any setting"

echo "== the file names the log"
cat >"$conf" <<CONF
# this host's write log
write-cache=$T/wlog

write-cache-size=8M
CONF
start_server "$T/b.sock" "$T/b.log"
grep -q "write cache $T/wlog (8 MiB)" "$T/b.log" || fail "no attach: $(cat "$T/b.log")"
qemu-io -f raw -c "write -P 0x5a 0 2M" -c flush "$(uri "$T/b.sock")" >/dev/null
hold_vdi "$T/b.sock"
wait_status '.[0].mode == "on" and .[0].log_bytes == 8388608'
# The drain's policy (docs/DESIGN.md, "The deferred drain"): its defaults, and idle once the
# write above is drained (50 ms after it).
wait_status '.[0].drain == "idle" and .[0].drain_delay_ms == 50 and .[0].drain_max_age_ms == 2000'
plx cache status | contains -F "(idle)" || fail "drain state: $(plx cache status)"
kill "$HOLDER_PID"
qemu-io -f raw -c "read -P 0x5a 0 2M" "$(uri "$T/b.sock")" | contains "^read 2097152/2097152" ||
    fail "the write did not read back"
stop_server
plx check --quiet || fail "check after a clean stop"

echo "== the option wins over the file"
start_server "$T/c.sock" "$T/c.log" --write-cache "$T/wlog2" --write-cache-size 4M
grep -q "write cache $T/wlog2 (4 MiB)" "$T/c.log" || fail "option: $(cat "$T/c.log")"
stop_server

echo "== the automatic mode: from the file, and parallax cache auto"
printf 'write-cache=%s\nwrite-cache-mode=auto\nwrite-cache-threshold=250\n' "$T/wlog" >"$conf"
start_server "$T/d.sock" "$T/d.log"
hold_vdi "$T/d.sock"
# The local file store is fast: automatic, and off.
wait_status '.[0].mode == "auto" and .[0].auto_threshold_ms == 250 and .[0].cache_on == false'
plx cache status | contains "^vm .*cache off (auto: on above 250 ms" || fail "status: $(plx cache status)"
plx cache auto vm --threshold 40 | contains "write cache automatic (on above 40 ms" ||
    fail "cache auto"
wait_status '.[0].mode == "auto" and .[0].auto_threshold_ms == 40'
plx cache status --json | jq -e '.[0].store_write_latency_ms >= 0' >/dev/null ||
    fail "no latency: $(plx cache status --json)"
plx cache enable vm >/dev/null
wait_status '.[0].mode == "on" and .[0].auto_threshold_ms == null and .[0].cache_on'
expect_fail 2 plx cache auto vm --threshold 0
expect_fail 2 plx cache enable vm --threshold 5
expect_fail 2 plx cache auto
kill "$HOLDER_PID"
stop_server
expect_fail 2 plx serve --unix "$T/x.sock" --write-cache "$T/wlog" --write-cache-mode sometimes
expect_fail 2 plx serve --unix "$T/x.sock" --write-cache-mode auto

echo "== a malformed file"
printf 'write-cache=%s\nwrite-cache-sise=8M\n' "$T/wlog" >"$conf"
expect_fail 1 plx serve --unix "$T/x.sock"
[[ $PLX_LAST_STDERR == *"$conf line 2"* ]] || fail "malformed file: $PLX_LAST_STDERR"
printf 'write-cache-size=lots\n' >"$conf"
expect_fail 1 plx serve --unix "$T/x.sock"
[[ $PLX_LAST_STDERR == *"write-cache-size=lots"* ]] || fail "bad size: $PLX_LAST_STDERR"
[[ ! -S $T/x.sock ]] || fail "serve listened despite a malformed settings file"
echo "== no log at all: cache enable says how to give one"
rm -f "$conf"
start_server "$T/e.sock" "$T/e.log"
hold_vdi "$T/e.sock"
for ((i = 0; i < 50; i++)); do
    plx cache status | contains "^vm .*no write log attached" && break
    sleep 0.1
done
expect_fail 1 plx cache enable vm
[[ $PLX_LAST_STDERR == *"no write log"*"--log PATH"* ]] || fail "enable without a log: $PLX_LAST_STDERR"
kill "$HOLDER_PID"
stop_server
echo "wcache_config: ok"
