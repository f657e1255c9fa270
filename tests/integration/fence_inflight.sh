#!/usr/bin/env bash
# A write in flight when the iSCSI session drops must not land after the host was fenced
# (docs/DESIGN.md "The lock manager", Fencing; issue 12). Host h1 reaches both lockd and the
# LUN through one relay. The relay is frozen while a client's write of h1 is on its way (the
# WRITE waits, unread, in the relay: outstanding at h1, unseen by the target), and h1's lease
# runs out. h2 takes h1's VDI (listing and preempting h1's key) and writes the same blocks.
# Then h1's connections drop (the relay dies), the target restarts (forgetting every
# registration and the reservation) admitting only h1 at first, and the relay comes back: h1
# logs in to a LUN that nothing reserves. The held write must not be sent again before h1 has
# checked its registration: h1 finds its key listed as preempted, the write fails (the client
# sees an error, not success), h2's data reads back intact and parallax check is clean.
# Before the fix libiscsi's own reconnect re-sent the WRITE at login and it landed.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"

size=$((8 << 20))
# h2 too loses its session at the restart and logs in again after 1, 2, 3 ... s; an engine
# waiting on a synchronous I/O meanwhile does not renew its lease and stops itself after 3/4 of
# it (lock_lockd.c, frozen()), so the lease is the default's 10 s, not 3 s.
lease=10
lockd_start $lease
lun format --extent-size 8M >/dev/null
lun lockd-set "127.0.0.1:$LOCKD_PORT"
lun vdi-create a --size $size >/dev/null
truncate -s $size "$T/model-a.img"

# h1's way to lockd and to the target.
rl=$(free_port)
ri=$(free_port)
relay_start "$rl:$LOCKD_PORT" "$ri:$TGT_PORT"
HOST_URL="iscsi://127.0.0.1:$ri/$TGT_IQN/1" start_host h1 "127.0.0.1:$rl"
start_host h2

session_open q1 h1 a
session_cmd q1 "write -P 11 0 65536"
session_cmd q1 "flush"
[[ $(session_errors q1) == 0 ]] || fail "h1 refused a write: $(cat "$T/qio-q1.log")"
model a 11 0 65536
n=$(prompts q1)

# The write that will be in flight: sent into the frozen relay.
relay_freeze
session_send q1 "write -P 99 0 65536"
sleep $((lease + 2))
session_wait q1 $((n + 1)) 0 && fail "h1's write completed although the relay was frozen: $(cat "$T/qio-q1.log")"

# h2 takes a (h1's lease ran out), preempting h1's key, and writes the same blocks.
write h2 a 77 0 65536 || fail "h2 could not take a from the cut-off h1: $(tail -5 "$T/h2.log")"
grep -q "preempted the reservation key" "$T/h2.log" || fail "h2 does not say it preempted h1: $(cat "$T/h2.log")"
verify h2 a "h2's write"

# h1's connections drop; the target restarts and, for now, admits h1 alone: nothing on the LUN
# would refuse a write of h1's new session.
relay_kill
tgt_restart_only 0 "$(initiator h1)"
relay_start "$rl:$LOCKD_PORT" "$ri:$TGT_PORT"
wait_log "$T/h1.log" "logged in again\|preempted by a host" "h1 did not log in again" 60
# h1 answers its client one way or the other.
session_wait q1 $((n + 1)) 30 || fail "h1 never answered the write held across the drop: $(tail -5 "$T/h1.log")"
tgt_admit_all

# h2 logs in again, registers again (its lease is alive) and reads what it wrote.
verify h2 a "after h1's session came back"
session_close q1
[[ $(session_errors q1) -ge 1 ]] ||
    fail "h1 reported the write held across the drop done after it was fenced: $(cat "$T/qio-q1.log")"
grep -q "our reservation key was preempted by a host that took over our locks" "$T/h1.log" ||
    fail "h1 does not say it was fenced: $(cat "$T/h1.log")"
echo "a write in flight across a drop and a target restart did not land after the preempt"

for h in h1 h2; do stop_host $h; done
lun check >"$T/check.out" 2>&1 || fail "check: $(cat "$T/check.out")"
lun vdi-export a "$T/final.img"
cmp -s "$T/model-a.img" "$T/final.img" || fail "a: the final image differs from the model"
echo "check clean; h2's data intact"
