#!/usr/bin/env bash
# The write cache's automatic mode against a really slow shared store: a tgtd LUN (O_DIRECT)
# whose tgtd is throttled with cgroup v1 blkio. `serve --write-cache-mode auto`: the cache stays
# off while the store is fast, turns on once the store's writes slow down, and turns off again
# (drained) once the store is fast again. Everything written reads back, from the server and
# from the blockstore alone afterwards, and `parallax check` is clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io nbdcopy jq lsblk findmnt

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"

tgt_start
STORE=$(tgt_add_direct_lun 1 1G)
plx() { "$PARALLAX" -b "$STORE" "$@"; }
tgt_throttle 0 # tgtd in its blkio group, no limit yet

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create vm0 --size 64M >/dev/null

"$PARALLAX" -b "$STORE" serve --unix "$T/s.sock" --write-cache "$T/wlog" \
    --write-cache-size 64M --write-cache-mode auto --write-cache-threshold 200 >"$T/s.log" 2>&1 &
srv=$!
bg_pid $srv
wait_socket "$T/s.sock" "$srv" "$T/s.log"
uri="nbd+unix:///vm0?socket=$T/s.sock"

# A connection held open keeps the VDI open (and its mode) between the writes below.
cc -std=c11 -O2 -Wall -Wextra -Werror "$(dirname "$0")/nbd_hold.c" -o "$T/nbd_hold" \
    $(pkg-config --cflags --libs libnbd) || fail "building nbd_hold"
exec {HOLD_IN}> >(exec "$T/nbd_hold" "$T/s.sock" vm 1 >"$T/hold.log" 2>&1)
HOLD_PID=$!
bg_pid $HOLD_PID
for ((i = 0; i < 100; i++)); do
    grep -q ready "$T/hold.log" 2>/dev/null && break
    kill -0 $HOLD_PID 2>/dev/null || fail "nbd_hold exited: $(cat "$T/hold.log")"
    sleep 0.1
done

status() { plx cache status --json | jq -r ".[] | select(.vdi == \"vm0\") | .$1"; }
wait_for() { # WHAT SECONDS CONDITION...
    local what=$1 n=$(($2 * 10))
    shift 2
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.1
    done
    fail "$what: $(plx cache status; tail -5 "$T/s.log")"
}
cache_on() { [[ $(status cache_on) == "$1" ]]; }
mib=$((1 << 20))

[[ $(status mode) == auto ]] || fail "mode: $(plx cache status --json)"
cache_on false || fail "the cache is on before anything was written: $(plx cache status)"

# The store slows down to 1 MiB/s: writes take far longer than 200 ms, the cache turns on. (The
# threshold is high because a loaded test machine gives the unthrottled LUN tens of ms too.)
tgt_throttle $mib
timeout 120 qemu-io -f raw -c "write -P 0x21 0 8M" "$uri" >"$T/w1.log" 2>&1 &
w1=$!
wait_for "the cache did not turn on with a slow store" 60 cache_on true
wait $w1 || fail "writing while the store is slow: $(cat "$T/w1.log")"
echo "cache on after the store slowed down (store write latency $(status store_write_latency_ms) ms)"

# Writes with the cache on go to the log: the next 8 MiB does not wait for a 1 MiB/s store.
start=$(date +%s)
timeout 120 qemu-io -f raw -c "write -P 0x42 8M 8M" -c flush "$uri" >"$T/w2.log" 2>&1 ||
    fail "writing with the cache on: $(cat "$T/w2.log")"
took=$(($(date +%s) - start))
((took < 6)) || fail "8 MiB with the cache on took $took s: admitted at the store's speed"
echo "8 MiB written and flushed through the cache in $took s with the store at 1 MiB/s"
cache_on true || fail "the cache turned off while the store is slow and the log is full of writes"

# The log drains into the slow store; then the store is fast again, and the cache turns off
# with nothing more written (the engine's latency figure decays while the store is idle; it used
# to stand at the last slow mean for good, and the cache stayed on).
drained() { [[ $(status backlog_records) == 0 ]]; }
wait_for "the log did not drain into the slow store" 90 drained
tgt_throttle 0
wait_for "the cache did not turn off with a fast, idle store" 30 cache_on false
echo "cache off (drained) after the store was fast again"
[[ $(status backlog_records) -le 64 ]] || fail "backlog after turning off: $(plx cache status)"

python3 - "$T/model.img" "$mib" <<'PY2'
import sys
mib = int(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    f.write(bytes([0x21]) * 8 * mib + bytes([0x42]) * 8 * mib)
    f.truncate(64 * mib)
PY2
nbdcopy "$uri" "$T/read.img" || fail "reading the VDI back"
cmp -s "$T/model.img" "$T/read.img" || fail "the VDI read through the server differs"
exec {HOLD_IN}>&-
wait $HOLD_PID 2>/dev/null || true
kill $srv
wait $srv 2>/dev/null || true
# The blockstore alone (the log detached; the VDI's record must not name it any more).
plx vdi-export vm0 "$T/export.img" || fail "export without the server"
cmp -s "$T/model.img" "$T/export.img" || fail "the blockstore alone differs from what was written"
plx check --json >"$T/check.json" || fail "check: $(cat "$T/check.json")"
echo ok
