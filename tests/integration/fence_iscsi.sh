#!/usr/bin/env bash
# Fencing by SCSI-3 persistent reservations on a tgtd LUN. Two hosts (h1, h2) and lockd.
# 1. h1 is cut off from lockd but not from the LUN (its lockd connection runs through a relay
#    that is then frozen): its lease lapses while it keeps serving. h2 takes h1's VDI, which
#    preempts h1's reservation key. Every write h1 then attempts is refused by the target
#    (RESERVATION CONFLICT), h1 says it was fenced, and none of those writes lands.
# 2. h1 (restarted) is frozen with SIGSTOP past its lease while a client writes through it;
#    h2 takes its VDI; after SIGCONT nothing it is asked to write lands.
# Afterwards parallax check is clean and every flushed byte is there (byte model).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"
size=$((8 << 20))
lease=3
lockd_start $lease
port=$LOCKD_PORT
# A TCP relay to lockd: freezing it (SIGSTOP) partitions a host from lockd, not from the LUN.
rport=$(free_port)
relay_start "$rport:$port"

lun format --extent-size 8M >/dev/null
lun lockd-set "127.0.0.1:$port"
for v in a b; do lun vdi-create $v --size $size >/dev/null; truncate -s $size "$T/model-$v.img"; done

# A client session kept open on HOST VDI: commands go in on fd 3.
open_session() {
    rm -f "$T/qio.fifo"
    mkfifo "$T/qio.fifo"
    qemu-io -f raw "$(uri "$1" "$2")" <"$T/qio.fifo" >"$T/qio.log" 2>&1 &
    QIO=$!
    bg_pid $QIO
    exec 3>"$T/qio.fifo"
}
close_session() { exec 3>&-; wait $QIO 2>/dev/null || true; }

start_host h1 "127.0.0.1:$rport"
start_host h2

# 1. Partitioned from lockd, not from the LUN.
open_session h1 a
echo "write -P 11 0 65536" >&3
echo "flush" >&3
sleep 1
grep -qi 'error\|fail' "$T/qio.log" && fail "h1 refused a write before anything happened: $(cat "$T/qio.log")"
model a 11 0 65536
kill -STOP $RELAY
sleep $((lease + 2))
write h2 a 22 4096 8192 || fail "h2 could not take a from the partitioned h1: $(tail -5 "$T/h2.log")"
grep -q "preempted the reservation key" "$T/h2.log" || fail "h2 does not say it preempted h1: $(cat "$T/h2.log")"
# h1 still runs and still has a open: every write it now tries reaches the target, and is refused.
kill -0 "${SRV[h1]}" || fail "h1 exited"
for off in 0 131072 1048576 4194304; do
    echo "write -P 99 $off 4096" >&3
    echo "flush" >&3
done
sleep 2
close_session
grep -q "RESERVATION CONFLICT" "$T/h1.log" || fail "h1 does not say the target refused it: $(cat "$T/h1.log")"
grep -q "stopped for" "$T/h1.log" && fail "h1 fenced itself by its clock, so the target was not what stopped it"
[[ $(grep -ci 'error\|fail' "$T/qio.log") -ge 4 ]] || fail "a write through the fenced h1 was reported done: $(cat "$T/qio.log")"
kill -CONT $RELAY
verify h2 a "after h1 was fenced by the target"
echo "a host partitioned from lockd was fenced by the target; none of its writes landed"
kill "${SRV[h1]}"; wait "${SRV[h1]}" 2>/dev/null || true

# 2. Frozen past its lease with a client writing through it.
start_host h1
open_session h1 b
echo "write -P 33 0 65536" >&3
echo "flush" >&3
sleep 1
model b 33 0 65536
kill -STOP "${SRV[h1]}"
# Every thread of h1 stopped before the next write is sent (a signal takes effect a moment
# later: a write h1 still served would be a write done before the takeover, correctly).
for ((i = 0; i < 100; i++)); do
    awk '{ if ($3 != "T") bad = 1 } END { exit bad }' /proc/"${SRV[h1]}"/task/*/stat && break
    sleep 0.05
done
echo "write -P 98 262144 4096" >&3 # waits in h1's socket while it is stopped
sleep $((lease + 2))
write h2 b 44 8192 4096 || fail "h2 could not take b from the frozen h1: $(tail -5 "$T/h2.log")"
kill -CONT "${SRV[h1]}"
echo "write -P 97 524288 4096" >&3
echo "flush" >&3
sleep 1
close_session
[[ $(grep -ci 'error\|fail' "$T/qio.log") -ge 2 ]] || fail "the resumed h1 reported a write done: $(cat "$T/qio.log")"
verify h2 b "after the frozen h1 resumed"
echo "a host frozen past its lease wrote nothing after it resumed"

# The end: parallax check clean, every flushed byte there.
for h in h1 h2; do kill "${SRV[$h]}" 2>/dev/null; wait "${SRV[$h]}" 2>/dev/null || true; done
lun check >"$T/check.out" 2>&1 || fail "check: $(cat "$T/check.out")"
for v in a b; do
    lun vdi-export $v "$T/final.img"
    cmp -s "$T/model-$v.img" "$T/final.img" || fail "$v: the final image differs from the model"
done
echo "check clean; nothing flushed was lost"
