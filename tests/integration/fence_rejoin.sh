#!/usr/bin/env bash
# Registering again at the target (docs/DESIGN.md "The lock manager", Fencing). tgt keeps
# persistent reservations in memory only, and a re-established session is not registered.
# 1. tgtd is killed and started again while five hosts (h1, h2, h3, h6, h7) keep a VDI each open
#    with a client writing, and another process (h4) opens the LUN first after the restart, so it
#    reserves the LUN for itself: the hosts find their keys gone, have lockd confirm their
#    leases, register again at once and go on serving; every flushed byte is there.
# 2. The expired-lease variant: h1 is cut off from lockd (its connection runs through a relay
#    that is frozen) past its lease, h2 takes h1's VDI (listing and preempting h1's key), then
#    the target restarts and forgets the preempt, and h1 can reach lockd again: h1 finds its key
#    listed as preempted and stays fenced; none of its writes lands.
# 3. The reconnect-vs-preempt race: h5 (cut off from lockd past its lease) has its iSCSI
#    connection dropped; while it is between "my key is still there" and registering the new
#    session (held there by PLX_TEST_REJOIN_DELAY_MS), h2 takes its VDI and preempts its key.
#    h5's registration undoes the preempt at the target for a moment, but h5 then reads the
#    list of preempted keys, finds its own, unregisters and fences itself: none of its writes
#    lands.
# Afterwards parallax check is clean and every flushed byte is there (byte model).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"
# Case 3 holds a host in a window with a test hook (PLX_TEST_REJOIN_DELAY_MS), which only the test
# build of the command reads (libparallax/base/test_hooks.h).
PARALLAX=$(dirname "$PARALLAX")/test/parallax
[[ -x $PARALLAX ]] || fail "$PARALLAX is not built (make build/test/parallax)"
size=$((8 << 20))
lease=3
lockd_start $lease
port=$LOCKD_PORT
# A TCP relay to lockd: freezing it (SIGSTOP) partitions a host from lockd, not from the LUN.
rport=$(free_port)
relay_start "$rport:$port"

lun format --extent-size 8M >/dev/null
lun lockd-set "127.0.0.1:$port"
for v in a b c e f; do lun vdi-create $v --size $size >/dev/null; truncate -s $size "$T/model-$v.img"; done

# 1. The target restarts under five writing hosts: all of them register again at once.
HOSTS=(h1 h2 h3 h6 h7)
for h in "${HOSTS[@]}"; do start_host $h; done
declare -A VDI_OF=([h1]=a [h2]=b [h3]=c [h6]=e [h7]=f)
for h in "${HOSTS[@]}"; do
    session_open $h $h "${VDI_OF[$h]}"
    session_cmd $h "write -P 11 0 65536"
    session_cmd $h "flush"
done
sleep 1
for h in "${HOSTS[@]}"; do
    [[ $(session_errors $h) == 0 ]] || fail "$h refused a write before the restart: $(cat "$T/qio-$h.log")"
    model "${VDI_OF[$h]}" 11 0 65536
done
tgt_restart 1
# A new process opens the LUN for writing first: it registers and reserves the LUN, so from
# now on the target refuses every session whose key is not registered.
PARALLAX_HOST_ID=h4 "$PARALLAX" -b "$URL" vdi-create d --size $size >/dev/null ||
    fail "h4 could not open the LUN after the restart"
for h in "${HOSTS[@]}"; do
    session_cmd $h "write -P 22 131072 65536"
    session_cmd $h "flush"
done
for h in "${HOSTS[@]}"; do session_close $h; done
for h in "${HOSTS[@]}"; do
    [[ $(session_errors $h) == 0 ]] || fail "$h failed a write after the target restart: $(cat "$T/qio-$h.log") $(tail -5 "$T/$h.log")"
    grep -q "registered our reservation key .* again (it was gone from the LUN" "$T/$h.log" ||
        fail "$h does not say it registered again: $(cat "$T/$h.log")"
    model "${VDI_OF[$h]}" 22 131072 65536
    write $h "${VDI_OF[$h]}" 33 262144 4096 || fail "$h: a new client after the restart: $(tail -5 "$T/$h.log")"
done
verify h2 a "after the target restart"; verify h3 b "after the target restart"; verify h1 c "after the target restart"
verify h7 e "after the target restart"; verify h6 f "after the target restart"
echo "five hosts kept serving through a target restart; nothing flushed was lost"
for h in "${HOSTS[@]}"; do stop_host $h; done

# 2. A host whose lease expired and whose VDI was taken stays fenced across a target restart.
start_host h1 "127.0.0.1:$rport"
start_host h2
session_open q1 h1 a
session_cmd q1 "write -P 44 0 4096"
session_cmd q1 "flush"
sleep 1
[[ $(session_errors q1) == 0 ]] || fail "h1 refused a write: $(cat "$T/qio-q1.log")"
model a 44 0 4096
kill -STOP $RELAY
sleep $((lease + 2))
write h2 a 55 8192 4096 || fail "h2 could not take a from the cut-off h1: $(tail -5 "$T/h2.log")"
grep -q "preempted the reservation key" "$T/h2.log" || fail "h2 does not say it preempted h1: $(cat "$T/h2.log")"
tgt_restart 1
kill -CONT $RELAY # h1 can have its lease confirmed again: only the list stops it now
sleep 1
for off in 16384 1048576 4194304; do
    session_cmd q1 "write -P 99 $off 4096"
    session_cmd q1 "flush"
done
sleep 2
session_close q1
[[ $(session_errors q1) -ge 3 ]] || fail "the fenced h1 reported a write done after the restart: $(cat "$T/qio-q1.log")"
grep -q "our reservation key was preempted by a host that took over our locks" "$T/h1.log" ||
    fail "h1 does not say it stays fenced: $(cat "$T/h1.log")"
verify h2 a "after the restart with a fenced host"
echo "a host preempted before the target restarted stayed fenced after it"
stop_host h1

# 3. A preempt in the middle of a re-registration.
start_host h5 "127.0.0.1:$rport" PLX_TEST_REJOIN_DELAY_MS=4000
session_open q2 h5 b
session_cmd q2 "write -P 66 0 4096"
session_cmd q2 "flush"
sleep 1
[[ $(session_errors q2) == 0 ]] || fail "h5 refused a write: $(cat "$T/qio-q2.log")"
model b 66 0 4096
kill -STOP $RELAY
sleep $((lease + 2))
sid=$(nexus_of h5)
[[ -n $sid ]] || fail "no session of h5 at the target: $(tgt_adm --op show --mode target)"
tgt_adm --op delete --mode conn --tid 1 --sid "$sid" --cid 0
wait_log "$T/h5.log" "logged in again" "h5 did not log in again"
# h5 now waits (PLX_TEST_REJOIN_DELAY_MS) before registering its new session: take b now.
write h2 b 77 8192 4096 || fail "h2 could not take b from the cut-off h5: $(tail -5 "$T/h2.log")"
# h5 settles its registration after the delay, one way or the other.
wait_log "$T/h5.log" "took over our locks while we registered again\|again for this session" \
    "h5 did not settle its registration"
kill -CONT $RELAY
for off in 16384 1048576 4194304; do
    session_cmd q2 "write -P 98 $off 4096"
    session_cmd q2 "flush"
done
sleep 2
session_close q2
verify h2 b "after the preempt raced h5's registration"
[[ $(session_errors q2) -ge 3 ]] || fail "h5 reported a write done after the preempt: $(cat "$T/qio-q2.log")"
grep -q "took over our locks while we registered again" "$T/h5.log" ||
    fail "h5 does not say it found its key preempted after registering: $(cat "$T/h5.log")"
echo "a preempt racing a re-registration was not undone; none of the fenced host's writes landed"

# The end: parallax check clean, every flushed byte there.
for h in h5 h2; do stop_host $h; done
lun check >"$T/check.out" 2>&1 || fail "check: $(cat "$T/check.out")"
for v in a b c e f; do
    lun vdi-export $v "$T/final.img"
    cmp -s "$T/model-$v.img" "$T/final.img" || fail "$v: the final image differs from the model"
done
echo "check clean; nothing flushed was lost"
