# shellcheck shell=bash
# Helpers for the scripts that run several hosts (engine processes with their own host ids,
# initiator names and reservation keys) on one tgtd LUN with parallax-lockd: fence_iscsi.sh,
# fence_rejoin.sh, fence_inflight.sh. Source it after lib.sh; it needs qemu-io, nbdcopy and python3, and it
# starts tgtd (tgt_start) with LUN 1 of 256 MiB.
#
#   URL                              the LUN; lun ARGS... runs parallax on it as host "admin"
#   T                                $PLX_TEST_TMP
#   free_port                        a free TCP port on 127.0.0.1
#   lockd_start LEASE                parallax-lockd on a free port: LOCKD_PORT, LOCKD_PID
#   relay_start LPORT:DPORT...       a TCP relay (python) from each 127.0.0.1:LPORT to
#                                    127.0.0.1:DPORT, all in one process: RELAY is its pid.
#                                    kill -STOP freezes every connection through it (data sent
#                                    to it waits unread), kill -9 drops them (relay_kill)
#   relay_kill                       kill -9 the relay and wait for it
#   start_host HOST [LOCKD [ENV=V...]]  parallax serve --unix $T/HOST.sock as host HOST, with
#                                    PARALLAX_LOCKD=LOCKD and the given environment, on
#                                    ${HOST_URL:-$URL}; SRV[HOST] is its pid, $T/HOST.log its log
#   stop_host HOST                   SIGTERM and wait
#   uri HOST VDI                     its NBD URI
#   model VDI PATTERN OFFSET LENGTH  record a flushed write in $T/model-VDI.img
#   write HOST VDI PATTERN OFFSET LENGTH  write + flush through HOST (qemu-io); model follows
#   verify HOST VDI WHAT             the VDI read through HOST equals its model, else fail
#   session_open NAME HOST VDI       a qemu-io kept open on HOST's VDI, log $T/qio-NAME.log
#   session_cmd NAME CMD             one command, waiting for its prompt (30 s)
#   session_send NAME CMD            one command, not waiting; session_wait NAME N [SECONDS]
#                                    waits until the log holds N prompts; prompts NAME counts
#   session_close NAME               quit and wait
#   session_errors NAME              how many lines of its log say error or fail
#   nexus_of HOST                    the target's session id (I_T nexus) of HOST's initiator
#   wait_log FILE PATTERN WHAT [S]   wait (default 10 s) until FILE has PATTERN, else fail WHAT
#   initiator HOST                   HOST's initiator name (iqn.2026-11.org.parallax:HOST)

require_cmd qemu-io nbdcopy python3
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"
tgt_start
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
export PARALLAX_LOCK_TIMEOUT=4
URL=$(tgt_add_lun 1 256M)
lun() { PARALLAX_HOST_ID="admin" "$PARALLAX" -b "$URL" "$@"; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
initiator() { echo "iqn.2026-11.org.parallax:$1"; }

lockd_start() {
    LOCKD_PORT=$(free_port)
    "$LOCKD" --listen "127.0.0.1:$LOCKD_PORT" --lease "$1" >"$T/lockd.log" 2>&1 &
    LOCKD_PID=$!
    bg_pid $LOCKD_PID
    sleep 0.3
    kill -0 $LOCKD_PID || fail "lockd did not start: $(cat "$T/lockd.log")"
}

relay_start() {
    python3 - "$@" >>"$T/relay.log" 2>&1 <<'PY' &
import socket, sys, threading
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
def serve(ls, dport):
    while True:
        c, _ = ls.accept()
        try: u = socket.create_connection(("127.0.0.1", dport))
        except OSError:
            c.close()
            continue
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c), daemon=True).start()
threads = []
for pair in sys.argv[1:]:
    lport, dport = (int(p) for p in pair.split(":"))
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", lport)); ls.listen(8)
    threads.append(threading.Thread(target=serve, args=(ls, dport), daemon=True))
for t in threads: t.start()
print("ready", flush=True)
for t in threads: t.join()
PY
    RELAY=$!
    bg_pid $RELAY
    local i n
    n=$(grep -c ready "$T/relay.log" || true)
    for ((i = 0; i < 50; i++)); do
        (($(grep -c ready "$T/relay.log" || true) > n)) && return 0
        kill -0 $RELAY 2>/dev/null || fail "the relay did not start: $(cat "$T/relay.log")"
        sleep 0.1
    done
    fail "the relay did not start"
}
# relay_freeze: SIGSTOP the relay and wait until every one of its threads has stopped (kill
# returns once the signal is sent; on a loaded machine a thread can still forward what it was
# handed before it stops).
relay_freeze() {
    local i
    kill -STOP "$RELAY"
    for ((i = 0; i < 100; i++)); do
        grep -qv '^[0-9]* ([^)]*) T ' /proc/"$RELAY"/task/*/stat || return 0
        sleep 0.1
    done
    fail "the relay's threads did not all stop"
}
relay_kill() { kill -9 "$RELAY" 2>/dev/null; wait "$RELAY" 2>/dev/null || true; }

declare -A SRV
start_host() { # HOST-ID [LOCKD-ADDRESS [ENV=VALUE...]]
    local h=$1 addr=${2:-} i
    shift $(($# < 2 ? $# : 2))
    rm -f "$T/$h.sock"
    env PARALLAX_HOST_ID="$h" PARALLAX_LOCKD="$addr" "$@" "$PARALLAX" -b "${HOST_URL:-$URL}" serve \
        --unix "$T/$h.sock" >>"$T/$h.log" 2>&1 &
    SRV[$h]=$!
    bg_pid "${SRV[$h]}"
    for ((i = 0; i < 100; i++)); do
        [[ -S $T/$h.sock ]] && return 0
        kill -0 "${SRV[$h]}" 2>/dev/null || fail "host $h exited: $(cat "$T/$h.log")"
        sleep 0.1
    done
    fail "host $h did not start"
}
stop_host() { kill "${SRV[$1]}" 2>/dev/null; wait "${SRV[$1]}" 2>/dev/null || true; }
uri() { echo "nbd+unix:///$2?socket=$T/$1.sock"; }
model() {
    python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[3])); f.write(bytes([int(sys.argv[2])]) * int(sys.argv[4]))' \
        "$T/model-$1.img" "$2" "$3" "$4"
}
write() {
    local out
    out=$(qemu-io -f raw -c "write -P $3 $4 $5" -c flush "$(uri "$1" "$2")" 2>&1) || return 1
    grep -qi 'error\|fail' <<<"$out" && return 1
    model "$2" "$3" "$4" "$5"
}
verify() {
    rm -f "$T/read.img"
    nbdcopy "$(uri "$1" "$2")" "$T/read.img" || fail "$3: reading $2 through $1: $(tail -5 "$T/$1.log")"
    cmp -s "$T/model-$2.img" "$T/read.img" ||
        fail "$3: $2 read through $1 differs from what was flushed: $(tail -5 "$T/$1.log")"
}

declare -A QFD QPID
session_open() {
    rm -f "$T/qio-$1.fifo"
    mkfifo "$T/qio-$1.fifo"
    qemu-io -f raw "$(uri "$2" "$3")" <"$T/qio-$1.fifo" >"$T/qio-$1.log" 2>&1 &
    QPID[$1]=$!
    bg_pid "${QPID[$1]}"
    local fd
    exec {fd}>"$T/qio-$1.fifo"
    QFD[$1]=$fd
    session_wait "$1" 1 10 || fail "qemu-io did not start on $2: $(cat "$T/qio-$1.log")"
}
# qemu-io reading a pipe handles one line per wakeup, so one command at a time: each waits
# for the prompt that follows it.
prompts() { grep -o 'qemu-io> ' "$T/qio-$1.log" | wc -l; }
session_wait() { # NAME N [SECONDS]: 0 once the log holds N prompts, 1 after SECONDS (30)
    local i
    for ((i = 0; ; i++)); do
        (($(prompts "$1") >= $2)) && return 0
        ((i < ${3:-30} * 10)) || return 1
        sleep 0.1
    done
}
session_send() { echo "$2" >&"${QFD[$1]}"; }
session_cmd() {
    local n
    n=$(prompts "$1")
    session_send "$1" "$2"
    session_wait "$1" $((n + 1)) || fail "qemu-io did not finish '$2' on $1: $(cat "$T/qio-$1.log")"
}
session_close() { # quit, rather than EOF: later children inherit the fifo's write end
    local fd=${QFD[$1]}
    echo quit >&"$fd"
    exec {fd}>&-
    wait "${QPID[$1]}" 2>/dev/null || true
}
session_errors() { grep -ci 'error\|fail' "$T/qio-$1.log" || true; }
nexus_of() {
    tgt_adm --op show --mode target |
        awk -v ini="$(initiator "$1")" '/I_T nexus:/ { n = $3 } $1 == "Initiator:" && $2 == ini { print n }'
}
wait_log() {
    local i
    for ((i = 0; i < ${4:-10} * 10; i++)); do
        grep -q "$2" "$1" && return 0
        sleep 0.1
    done
    fail "$3: $(tail -5 "$1")"
}
