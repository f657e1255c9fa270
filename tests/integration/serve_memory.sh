#!/usr/bin/env bash
# One `parallax serve` serving many VDIs keeps its memory bounded: 400 VDIs, each opened for
# writing by its own NBD connection (libnbd, one 4 KiB read each, all held open), cost at most
# PER_VDI_KIB of resident memory each over the server with one such connection. The stated
# bound (DESIGN.md, "Memory"): about 25 KiB per VDI measured (a 16 KiB connection buffer, the
# VDI handle with its log head block and skip path, and the tree path read, inside the node
# cache budget); the test allows 64 KiB (PLX_TEST_PER_VDI_KIB), so a regression such as 256 KiB
# input buffers per connection (189 KiB per VDI here, as before the 16 KiB start) fails it.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd cc pkg-config
pkg-config --exists libnbd || skip "libnbd development files are missing"

N=400
PER_VDI_KIB=${PLX_TEST_PER_VDI_KIB:-64}
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
# shellcheck disable=SC2046 # pkg-config prints several words
cc -std=c11 -O2 -Wall -Wextra -Werror "$(dirname "$0")/nbd_hold.c" -o "$T/nbd_hold" \
    $(pkg-config --cflags --libs libnbd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
(($(ulimit -n) > 2 * N + 64)) || skip "needs $((2 * N + 64)) open files, the limit is $(ulimit -n)"

plx format --size 4G --extent-size 16M >/dev/null
for ((i = 0; i < N; i++)); do plx vdi-create "m$i" --size 256M >/dev/null; done

"$PARALLAX" -b "$T/store.img" serve --unix "$sock" >>"$T/serve.log" 2>&1 &
SERVER_PID=$!
bg_pid "$SERVER_PID"
wait_socket "$sock" "$SERVER_PID" "$T/serve.log"

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$SERVER_PID/status"; }

# hold COUNT PREFIX: connections held open by a client in the background until release.
hold() {
    exec {HOLD_IN}> >(exec "$T/nbd_hold" "$sock" "$2" "$1" >"$T/hold.$1" 2>&1)
    HOLD_PID=$!
    bg_pid "$HOLD_PID"
    local i
    for ((i = 0; i < 600; i++)); do
        grep -q ready "$T/hold.$1" 2>/dev/null && return 0
        kill -0 "$HOLD_PID" 2>/dev/null || { cat "$T/hold.$1" >&2; fail "nbd_hold exited"; }
        sleep 0.1
    done
    fail "$1 connections did not open within 60 s"
}
release() {
    exec {HOLD_IN}>&-
    wait "$HOLD_PID" || fail "nbd_hold failed: $(cat "$T/hold.$1")"
}

hold 1 m
sleep 0.3
one=$(rss)
release 1
hold "$N" m
sleep 0.3
many=$(rss)
per=$(((many - one) / (N - 1)))
echo "serve: RSS ${one} KiB with 1 VDI served, ${many} KiB with $N: ${per} KiB per VDI" >&2
((per <= PER_VDI_KIB)) || fail "$per KiB of memory per served VDI (bound $PER_VDI_KIB KiB)"
release "$N"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true
