#!/usr/bin/env bash
# With a lock manager, an engine claims its next extent ahead, as it does with the local lock:
# while lockd is down (killed -9), a VDI that is being written goes on allocating past the end of
# the extent it holds (into the spare it claimed earlier) instead of waiting for an admin lock
# nobody can grant. Then lockd comes back, the data reads back and `parallax check` is clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io nbdcopy
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
export PARALLAX_LOCK_TIMEOUT=3

start_lockd() {
    local i
    for ((i = 0; i < 20; i++)); do
        port=${port:-$((20000 + RANDOM % 30000))}
        "$LOCKD" --listen "127.0.0.1:$port" --lease 3 >>"$T/lockd.log" 2>&1 &
        LOCKD_PID=$!
        bg_pid "$LOCKD_PID"
        sleep 0.2
        kill -0 "$LOCKD_PID" 2>/dev/null && return 0
        grep -q "Address already in use" "$T/lockd.log" && [[ -z ${keep_port:-} ]] && port=
    done
    fail "lockd did not start: $(cat "$T/lockd.log")"
}
start_lockd

mib=$((1 << 20))
plx format --size 256M --extent-size 4M >/dev/null
plx lockd-set "127.0.0.1:$port"
plx vdi-create v0 --size 32M >/dev/null

PARALLAX_HOST_ID=h1 PARALLAX_CLAIM_STATS=1 "$PARALLAX" -b "$T/store.img" serve --unix "$T/h1.sock" \
    >"$T/h1.log" 2>&1 &
srv=$!
bg_pid $srv
wait_socket "$T/h1.sock" "$srv" "$T/h1.log"
uri="nbd+unix:///v0?socket=$T/h1.sock"

# A connection held open for the whole test keeps the VDI open in serve: a new open would need
# lockd (only opens wait for it); further connections to an open VDI do not.
cc -std=c11 -O2 -Wall -Wextra -Werror "$(dirname "$0")/nbd_hold.c" -o "$T/nbd_hold" \
    $(pkg-config --cflags --libs libnbd) || fail "building nbd_hold"
exec {HOLD_IN}> >(exec "$T/nbd_hold" "$T/h1.sock" v 1 >"$T/hold.log" 2>&1)
HOLD_PID=$!
bg_pid $HOLD_PID
for ((i = 0; i < 100; i++)); do
    grep -q ready "$T/hold.log" 2>/dev/null && break
    kill -0 $HOLD_PID 2>/dev/null || fail "nbd_hold exited: $(cat "$T/hold.log")"
    sleep 0.1
done
qio_run() {
    timeout 60 qemu-io -f raw "${@/#/-c}" "$uri" >>"$T/qio.log" 2>&1 ||
        fail "qemu-io $*: $(tail -3 "$T/qio.log"; tail -5 "$T/h1.log")"
}

# Fill most of the first data extent (4 MiB): the held extents run low, a spare is claimed.
qio_run "write -P 17 0 $((3 * mib + mib / 2))" flush
sleep 1

kill -9 "$LOCKD_PID"
wait "$LOCKD_PID" 2>/dev/null || true

# Past the end of the held extent, with no lock manager: served from the spare, at once.
start=$(date +%s%N)
qio_run "write -P 34 $((3 * mib + mib / 2)) $((2 * mib))" flush
ms=$((($(date +%s%N) - start) / 1000000))
! grep -qi 'error\|fail' "$T/qio.log" ||
    fail "writing past the held extent without lockd failed: $(cat "$T/qio.log"; tail -5 "$T/h1.log")"
((ms < 2500)) || fail "writing past the held extent waited $ms ms without lockd: $(tail -5 "$T/h1.log")"
echo "wrote past the held extent in $ms ms while lockd was down"
exec {HOLD_IN}>&-
wait $HOLD_PID 2>/dev/null || true

keep_port=1 start_lockd
python3 - "$T/model.img" "$mib" <<'PY'
import sys
mib = int(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    f.write(bytes([17]) * (3 * mib + mib // 2) + bytes([34]) * (2 * mib))
    f.truncate(32 * mib)
PY
nbdcopy "$uri" "$T/read.img" || fail "reading the VDI back"
cmp -s "$T/model.img" "$T/read.img" || fail "the VDI differs from what was written"

kill $srv
wait $srv 2>/dev/null || true
grep -q "extent claims: [1-9][0-9]* spares taken ready" "$T/h1.log" ||
    fail "no spare extent was taken: $(grep 'extent claims' "$T/h1.log")"
for ((i = 0; i < 100; i++)); do plx lockd-status | contains '^GRACE' || break; sleep 0.2; done
plx check --json >"$T/check.json" || fail "check: $(cat "$T/check.json")"
echo ok
