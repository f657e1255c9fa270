#!/usr/bin/env bash
# A host keeps its lease while its engine waits for synchronous I/O. The target stalls (tgtd
# stopped with SIGSTOP) for longer than three quarters of the lease while the server opens a VDI
# (the open reads its record synchronously on the engine thread). The engine must go on sending
# its heartbeat while it waits, so lockd never sees its lease lapse and the engine never judges
# itself frozen: when the target resumes, the open completes and the host goes on serving every
# VDI, with nothing lost. (Before, the engine found a gap of several seconds between two
# heartbeats after the wait and fenced itself: every VDI it served failed with ESTALE.)
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"
lease=3
lockd_start $lease
size=$((8 << 20))
lun format --extent-size 8M >/dev/null
lun lockd-set "127.0.0.1:$LOCKD_PORT"
for v in a b; do lun vdi-create $v --size $size >/dev/null; truncate -s $size "$T/model-$v.img"; done

start_host h1
session_open q h1 a
session_cmd q "write -P 17 0 65536"
session_cmd q "flush"
[[ $(session_errors q) == 0 ]] || fail "a write failed before the stall: $(cat "$T/qio-q.log")"
model a 17 0 65536

kill -STOP "$TGT_PID"
# A new client of VDI b: h1 opens b, and its synchronous reads wait for the stalled target.
write h1 b 34 0 4096 >"$T/open.log" 2>&1 &
opener=$!
sleep $((lease + 1))
kill -CONT "$TGT_PID"
wait $opener || fail "opening b across a $((lease + 1)) s stall failed: $(tail -5 "$T/h1.log")"
model b 34 0 4096
! grep -q "was stopped for" "$T/h1.log" || fail "h1 fenced itself while it waited: $(tail -5 "$T/h1.log")"

session_cmd q "write -P 51 65536 65536"
session_cmd q "flush"
session_close q
[[ $(session_errors q) == 0 ]] || fail "h1 stopped serving a after the stall: $(cat "$T/qio-q.log"; tail -5 "$T/h1.log")"
model a 51 65536 65536
verify h1 a "after the stall"
verify h1 b "after the stall"
stop_host h1
lun check >"$T/check.out" 2>&1 || fail "check: $(cat "$T/check.out")"
echo ok
