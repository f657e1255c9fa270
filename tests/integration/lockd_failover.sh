#!/usr/bin/env bash
# Lock manager fail-over without an operator, on a tgtd LUN: parallax-lockd on hosts h1 and h2
# (--store: the active one is decided on the LUN with persistent reservation keys, the other is
# a standby), three hosts serving (h1, h2, h3), the store naming both lock managers.
# 1. A standby that never reaches the active one (they never talk) does not take over while the
#    active one renews its key on the LUN (a lease).
# 2. Host h1 dies: its lockd (the active one) and its server are killed -9 together. On the
#    survivors, within two leases of the kill: a VDI is created, the VDI h1 held is taken over
#    by h2 (the target refuses h1's key), and a VDI moves from h2 to h3 (handover).
# 3. The active lockd (now h2's) is frozen with SIGSTOP while a client of it waits for the admin
#    lock: the standby (h1's, restarted) takes over and grants the admin lock to another client;
#    after SIGCONT the frozen one grants nothing (it says it is a standby and drops its clients).
# 4. The active lockd (h1's) is cut off from the LUN (its iSCSI session runs through a relay
#    that is then frozen) but not from the engines: it stops granting, steps down and drops its
#    clients; h2's takes over; a client that asked the cut-off one is never granted by it.
# 5. The target drops every connection: the active lockd logs in again and keeps its role.
# Afterwards every flushed byte is there (byte model) and parallax check is clean.
# make check runs parts 1 and 2 (a takeover after the active lockd's host died), make check-long
# all five (each part waits out one or two 15 s leases).
# plx-test: alone
# plx-test: long-parts
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"

# A lease long enough that the operations after a takeover (a CLI's store open and close, a
# qemu-io's connect) fit in the rest of the two leases on a loaded machine.
lease=15
size=$((8 << 20))
# A CLI that opens the store while only standbys answer waits for one to take over, as long as
# it would wait for the admin lock.
export PARALLAX_LOCK_TIMEOUT=25
port_a=$(free_port)
port_b=$(free_port)
list="127.0.0.1:$port_a,127.0.0.1:$port_b"

declare -A LK
lockd_up() { # NAME PORT STORE-URL
    "$LOCKD" --listen "127.0.0.1:$2" --lease $lease --store "$3" --id "$1" >>"$T/lockd-$1.log" 2>&1 &
    LK[$1]=$!
    bg_pid "${LK[$1]}"
}
active_count() { grep -c "active: engines may connect" "$T/lockd-$1.log" || true; }
wait_active() { # NAME N WHAT: wait (two leases) until NAME's lockd has become active N times
    local i
    for ((i = 0; i < 20 * lease; i++)); do
        (($(active_count "$1") >= $2)) && return 0
        sleep 0.1
    done
    fail "$3: $(tail -5 "$T/lockd-$1.log")"
}
mono() { python3 -c 'import time; print("%.3f" % time.monotonic())'; }
since() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(mono)"; }

# A raw lockd client: PORT NAME OUT [WAIT-FILE|- [retry]]. Says HELLO (with retry: again every
# 0.2 s while the lockd is a standby); with WAIT-FILE, waits for that file before asking for the
# admin lock; prints every line it receives (with the monotonic time) until the connection
# closes, sending a heartbeat every second.
probe() {
    python3 - "$@" <<'PY' &
import os, socket, sys, time
port, name, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
wait = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
retry = len(sys.argv) > 5
f = open(out, "w", buffering=1)
def hello():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("HELLO %s probe %d 1\n" % (name, os.getpid())).encode())
    return s
s = hello()
buf = b""
def lines(timeout):
    global buf
    s.settimeout(timeout)
    try:
        d = s.recv(4096)
    except socket.timeout:
        return []
    if not d:
        f.write("%.3f EOF\n" % time.monotonic())
        sys.exit(0)
    buf += d
    *done, buf = buf.split(b"\n")
    return [l.decode() for l in done]
while True:
    got = lines(1)
    for l in got:
        f.write("%.3f %s\n" % (time.monotonic(), l))
    if any(l.startswith("OK") for l in got):
        break
    if retry and any(l.startswith("STANDBY") for l in got):
        s.close()
        time.sleep(0.2)
        s, buf = hello(), b""
        continue
    if any(l.startswith(("ERR", "STANDBY")) for l in got):
        sys.exit(0)
f.write("ready\n")
if wait:
    while not os.path.exists(wait):
        time.sleep(0.05)
s.sendall(b"ADMIN-LOCK\n")
f.write("%.3f asked\n" % time.monotonic())
last = time.monotonic()
while True:
    for l in lines(0.5):
        f.write("%.3f %s\n" % (time.monotonic(), l))
    if time.monotonic() - last >= 1:
        last = time.monotonic()
        try:
            s.sendall(b"PING\n")
        except OSError:
            f.write("%.3f EOF\n" % time.monotonic())
            sys.exit(0)
PY
    PROBE=$!
    bg_pid $PROBE
}
wait_file() { # FILE PATTERN WHAT [SECONDS]
    local i
    for ((i = 0; i < ${4:-20} * 10; i++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "$3: $(cat "$1" 2>/dev/null)"
}

lun format --extent-size 8M >/dev/null
lun lockd-set "$list"
PARALLAX_LOCKD=none lun info | grep -q "lock manager *$list" || fail "lockd-set did not record both: $(PARALLAX_LOCKD=none lun info)"

# h1's lockd first: with no lockd key on the LUN it becomes the active one.
lockd_up h1 "$port_a" "$URL"
wait_active h1 1 "h1's lockd did not become active"
lockd_up h2 "$port_b" "$URL"
sleep 1
for v in a b s; do lun vdi-create $v --size $size >/dev/null; truncate -s $size "$T/model-$v.img"; done
for h in h1 h2 h3; do start_host $h "" PARALLAX_HANDOVER_WAIT=40; done

# 1. Three leases with a standby that never talks to the active one: no takeover, and the
#    standby sends engines on.
session_open a h1 a
session_open b h2 b
for i in 1 2 3; do
    session_cmd a "write -P $i 0 65536"
    session_cmd a "flush"
    model a "$i" 0 65536
    session_cmd b "write -P $((i + 10)) 65536 65536"
    session_cmd b "flush"
    model b $((i + 10)) 65536 65536
    sleep $((lease / 3))
done
(($(active_count h2) == 0)) || fail "the standby took over from a live active lockd: $(cat "$T/lockd-h2.log")"
grep -q "no longer active\|now a standby" "$T/lockd-h1.log" && fail "the active lockd stepped down: $(cat "$T/lockd-h1.log")"
(($(session_errors a) + $(session_errors b) == 0)) || fail "a write failed: $(cat "$T/qio-a.log" "$T/qio-b.log")"
lun lockd-status | grep -q "^HOST h3 " || fail "h3 is not connected to the active lockd: $(lun lockd-status)"
echo "1: a standby that never reaches the active lockd did not take over in $lease s"

# 2. h1 dies: its lockd and its server, killed -9 together.
t0=$(mono)
kill -9 "${LK[h1]}" "${SRV[h1]}"
wait "${LK[h1]}" "${SRV[h1]}" 2>/dev/null || true
session_close a
# At once, on the survivors: a VDI created (h2), a snapshot taken (h3), the VDI the dead h1 held
# opened and written through h2, and b moved from h2 to h3. Each notes when it was done.
done_at() { echo "$(since "$t0")" >"$T/done-$1"; }
(PARALLAX_HOST_ID=h2 "$PARALLAX" -b "$URL" vdi-create c --size $size >/dev/null 2>"$T/create.log" &&
    done_at create) &
ops=($!)
(PARALLAX_HOST_ID=h3 "$PARALLAX" -b "$URL" vdi-snapshot s >/dev/null 2>"$T/snapshot.log" && done_at snapshot) &
ops+=($!)
(write h2 a 21 4096 8192 && done_at takeover) &
ops+=($!)
(session_close b && write h3 b 22 0 4096 && done_at handover) &
ops+=($!)
wait "${ops[@]}" || true
[[ -e $T/done-create ]] || fail "h2 could not create a VDI after h1 died: $(cat "$T/create.log"; tail -5 "$T/lockd-h2.log")"
[[ -e $T/done-snapshot ]] || fail "h3 could not take a snapshot after h1 died: $(cat "$T/snapshot.log")"
[[ -e $T/done-takeover ]] || fail "h2 could not take over a from the dead h1: $(tail -5 "$T/h2.log")"
[[ -e $T/done-handover ]] || fail "b did not move from h2 to h3: $(tail -5 "$T/h3.log")"
# Whoever took the first of h1's locks (an extent the create claimed, or the VDI) preempted
# h1's key at the target.
cat "$T/create.log" "$T/snapshot.log" "$T/h2.log" | grep -q "preempted the reservation key" ||
    fail "nobody says h1's key was preempted: $(cat "$T/create.log" "$T/h2.log")"
echo "2: after h1 (active lockd and server) was killed -9, done on the survivors at: VDI created" \
    "+$(cat "$T/done-create") s, snapshot +$(cat "$T/done-snapshot") s, h1's VDI opened on h2" \
    "+$(cat "$T/done-takeover") s, a VDI moved h2 -> h3 +$(cat "$T/done-handover") s (lease $lease s)"
for op in create snapshot takeover handover; do
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 2 * float(sys.argv[2]) else 1)" \
        "$(cat "$T/done-$op")" $lease || fail "$op took longer than two leases after the lock manager's host died"
done
(($(active_count h2) == 1)) || fail "h2's lockd did not take over: $(cat "$T/lockd-h2.log")"
verify h2 a "h1's VDI on h2"
verify h3 b "b on h3"

if ! long_parts; then
    for h in h2 h3; do stop_host $h; done
    lun check --quiet || fail "parallax check after the fail-over: $(lun check)"
    echo "lock manager fail-over: pool working again within two leases (parts 3-5: make check-long)"
    exit 0
fi

# 3. h1 comes back (its lockd a standby now); h2's lockd, the active one, is frozen while a
#    client of it waits for the admin lock.
lockd_up h1 "$port_a" "$URL"
start_host h1 "" PARALLAX_HANDOVER_WAIT=40
sleep 2
(($(active_count h1) == 1)) || fail "the restarted lockd took over from a live one: $(cat "$T/lockd-h1.log")"
probe "$port_b" p1 "$T/p1.out" "$T/p1.go"
p1=$PROBE
wait_file "$T/p1.out" "^ready" "the probe could not say HELLO to the active lockd"
kill -STOP "${LK[h2]}"
touch "$T/p1.go" # its ADMIN-LOCK reaches the frozen lockd's socket
wait_active h1 2 "h1's lockd did not take over from the frozen one"
probe "$port_a" p2 "$T/p2.out"
p2=$PROBE
wait_file "$T/p2.out" "GRANTED" "the new active lockd did not grant the admin lock" $((2 * lease))
kill -CONT "${LK[h2]}"
wait_file "$T/lockd-h2.log" "now a standby" "the continued lockd did not step down" 10
wait_file "$T/p1.out" "EOF" "the continued lockd did not drop its client" 10
grep -q "GRANTED" "$T/p1.out" &&
    fail "the frozen lockd granted the admin lock after it was continued, while the new one had granted it: $(cat "$T/p1.out" "$T/p2.out")"
kill "$p2"
wait "$p1" "$p2" 2>/dev/null || true
PARALLAX_HOST_ID=h3 "$PARALLAX" -b "$URL" vdi-create d --size $size >/dev/null ||
    fail "h3 could not create a VDI after the frozen lockd was replaced"
write h1 b 23 8192 4096 || fail "b did not move from h3 to h1: $(tail -5 "$T/h1.log")"
echo "3: a frozen active lockd, continued after a standby took over, granted nothing and stepped down"

# 4. h1's lockd (active) restarted with its LUN session through a relay, which is then frozen:
#    cut off from the LUN, not from the engines. Stopping a lockd (SIGTERM) removes its key, so
#    the other one takes over at once: h1's is stopped (h2's takes over), started again through
#    the relay (a standby), then h2's is stopped (h1's takes over) and started again.
rport=$(free_port)
relay_start "$rport:$TGT_PORT"
relay_url=${URL/:$TGT_PORT\//:$rport\/}
kill "${LK[h1]}"
wait "${LK[h1]}" 2>/dev/null || true
wait_active h2 2 "h2's lockd did not take over when h1's stopped"
lockd_up h1 "$port_a" "$relay_url"
sleep 2
kill "${LK[h2]}"
wait "${LK[h2]}" 2>/dev/null || true
wait_active h1 3 "h1's lockd did not take over when h2's stopped"
lockd_up h2 "$port_b" "$URL"
n2=$(active_count h2)
sleep 2
lun vdi-create e --size $size >/dev/null || fail "no VDI created with h1's lockd active"
probe "$port_a" p3 "$T/p3.out" "$T/p3.go"
p3=$PROBE
wait_file "$T/p3.out" "^ready" "the probe could not say HELLO to h1's lockd"
relay_freeze
# Asked right after the cut: the cut-off lockd may still grant it, within the window of its last
# renewal; it must have taken it back (dropped the client) before h2's lockd grants it to p4.
touch "$T/p3.go"
probe "$port_b" p4 "$T/p4.out" - retry
p4=$PROBE
wait_file "$T/lockd-h1.log" "could not renew our key" "the cut-off lockd did not step down" $lease
wait_file "$T/p3.out" "EOF" "the cut-off lockd did not drop its client" 10
wait_active h2 $((n2 + 1)) "h2's lockd did not take over from the cut-off one"
wait_file "$T/p4.out" "GRANTED" "h2's lockd did not grant the admin lock after taking over" $((2 * lease))
python3 - "$T/p3.out" "$T/p4.out" <<'PY' || fail "two lockds granted the admin lock at once: $(cat "$T/p3.out" "$T/p4.out")"
import sys
def at(path, what):
    return [float(l.split()[0]) for l in open(path) if l.split()[1:2] == [what]]
end3, grant4 = at(sys.argv[1], "EOF")[0], at(sys.argv[2], "GRANTED")[0]
print("p3 (cut-off lockd): %s, dropped at %.3f; p4 (new lockd) granted at %.3f" %
      ("granted at %.3f" % at(sys.argv[1], "GRANTED")[0] if at(sys.argv[1], "GRANTED") else "never granted", end3, grant4))
sys.exit(0 if end3 < grant4 else 1)
PY
kill "$p4"
lun vdi-create f --size $size >/dev/null || fail "no VDI created after the cut-off lockd was replaced"
write h2 b 24 12288 4096 || fail "b did not move from h1 to h2: $(tail -5 "$T/h2.log")"
kill -CONT "$RELAY"
sleep 2
(($(active_count h1) == 3)) || fail "the cut-off lockd became active again while h2's renews: $(cat "$T/lockd-h1.log")"
wait "$p3" "$p4" 2>/dev/null || true
echo "4: a lockd cut off from the LUN stopped granting and stepped down; the standby took over"

# 5. The target drops every connection, the active lockd's session to the LUN among them: it logs
#    in again and keeps its role (its key taken back from the old session), without a takeover
#    and without a lease of no grants.
lost() { grep -c "no longer active\|now a standby" "$T/lockd-$1.log" || true; }
n1=$(active_count h1)
n2=$(active_count h2)
l2=$(lost h2)
((n2 > 0)) || fail "h2's lockd is not the active one before the drop"
[[ $(tgt_drop_connections) -gt 0 ]] || fail "the target dropped no connection"
wait_file "$T/lockd-h2.log" "still active after logging in" "the active lockd did not keep its role across the drop" $lease
t5=$(mono)
lun vdi-create g --size $size >/dev/null || fail "no VDI created after the target dropped every connection"
t_create5=$(since "$t5")
(($(active_count h1) == n1 && $(active_count h2) == n2)) ||
    fail "a lockd took over after a connection drop: $(tail -3 "$T/lockd-h1.log" "$T/lockd-h2.log")"
(($(lost h2) == l2)) || fail "the active lockd lost its role: $(tail -5 "$T/lockd-h2.log")"
echo "5: the target dropped every connection: the active lockd logged in again and kept its role; a VDI created ${t_create5} s later"

verify h2 a "a at the end"
verify h2 b "b at the end"
for h in h1 h2 h3; do stop_host $h; done
lun check --quiet || fail "parallax check after the fail-overs: $(lun check)"
echo "lock manager fail-over: pool working again within two leases; never two lockds granting"
