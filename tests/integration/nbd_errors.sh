#!/usr/bin/env bash
# The NBD export under misuse and failure: an unknown export name, writes to a snapshot, and
# requests past the end fail while the server keeps serving; a client killed -9 with writes in
# flight leaves the server serving and the store consistent; a server killed -9 in the middle
# of writes loses nothing that was flushed (or written with FUA), the store checks without
# errors, and the dead server's lock is taken over so the VDI can be written again.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdinfo qemu-io fio python3

T=$PLX_TEST_TMP
ulimit -c unlimited 2>/dev/null || true # an abort leaves a core in $T (PLX_KEEP_TMP=1 keeps it)
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=$sock"; }

# start_server: sets SERVER_PID. A killed server leaves its socket file behind, so remove it
# first; then wait (bounded) for the new one.
start_server() {
    local i
    rm -f "$sock"
    # shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
    "$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >>"$T/serve.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$T/serve.log"
}
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
}
serving() { # the server is alive and answers
    if ! kill -0 "$SERVER_PID" 2>/dev/null || ! nbdinfo --list "nbd+unix:///?socket=$sock" >/dev/null; then
        sleep 0.5 # let a dying server finish its last words
        echo "server log (tail):" >&2
        tail -n 20 "$T/serve.log" >&2
        fail "the server died or does not answer ($1)"
    fi
}
qio() { # URI CMD...: fails the test unless every command succeeds
    local u=$1 out rc=0 a=()
    shift
    [[ $u == *@* ]] && a+=(-r)
    for c in "$@"; do a+=(-c "$c"); done
    out=$(qemu-io -f raw "${a[@]}" "$u" 2>&1) || rc=$?
    if [[ $rc -ne 0 ]] || contains -Ei 'fail|error' <<<"$out"; then
        printf '%s\n' "$out" >&2
        fail "qemu-io on $u (exit $rc): $*"
    fi
}
check_store() { # check must pass; leaked blocks are allowed
    plx check >"$T/check.out" 2>&1 || { cat "$T/check.out" >&2; fail "check $1"; }
    grep -q '^check: 0 errors' "$T/check.out" || fail "check $1: $(tail -1 "$T/check.out")"
}

# A minimal NBD client that checks nothing itself, so the server's own answers are seen.
cat >"$T/nbdraw.py" <<'EOF'
# nbdraw.py SOCKET EXPORT CMD OFFSET LENGTH: one request (read, write, flush, trim, zero) after
# a newstyle-fixed handshake with NBD_OPT_EXPORT_NAME, simple replies. Prints "error N" (the
# errno the server replied, 0 for success) and exits 0; exits 3 if the export was refused,
# 4 if the server closed the connection instead of replying.
import socket, struct, sys
path, export, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
off, length = int(sys.argv[4]), int(sys.argv[5])
IHAVEOPT = 0x49484156454F5054
s = socket.socket(socket.AF_UNIX)
s.connect(path)
def recv(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b
magic, opt_magic, hflags = struct.unpack(">8sQH", recv(18))
assert magic == b"NBDMAGIC" and opt_magic == IHAVEOPT, "not a newstyle NBD server"
s.sendall(struct.pack(">I", 1 | (hflags & 2)))
name = export.encode()
s.sendall(struct.pack(">QII", IHAVEOPT, 1, len(name)) + name)
try:
    recv(10)
    if not hflags & 2:
        recv(124)
except EOFError:
    print("export refused")
    sys.exit(3)
t = {"read": 0, "write": 1, "flush": 3, "trim": 4, "zero": 6}[cmd]
payload = b"\x5a" * length if cmd == "write" else b""
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, t, 0xC0FFEE, off, length) + payload)
try:
    rmagic, err, handle = struct.unpack(">IIQ", recv(16))
except EOFError:
    print("connection closed")
    sys.exit(4)
assert rmagic == 0x67446698 and handle == 0xC0FFEE, "bad reply"
if t == 0 and err == 0:
    recv(length)
print("error %d" % err)
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 2, 1, 0, 0))
EOF
raw() { python3 "$T/nbdraw.py" "$sock" "$@"; }

size=$((64 << 20))
plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 64M >/dev/null
plx vdi-snapshot disk --label empty >/dev/null
start_server

# ---- Unknown export name --------------------------------------------------------------------------
if nbdinfo "$(uri nope)" >/dev/null 2>&1; then fail "nbdinfo connected to a missing VDI"; fi
if qemu-io -f raw -c "read 0 4k" "$(uri disk@7)" >/dev/null 2>&1; then fail "opened a missing snapshot"; fi
rc=0
raw nope read 0 4096 >/dev/null || rc=$?
assert_eq 3 "$rc" "raw client: missing export refused"
grep -q "no VDI named 'nope'" "$T/serve.log" || fail "no server message for the missing export"
serving "after unknown export names"

# ---- Writes to a snapshot (read-only export) --------------------------------------------------------
if qemu-io -f raw -c "write -P 1 0 4k" "$(uri disk@1)" >/dev/null 2>&1; then
    fail "qemu-io wrote to a snapshot"
fi
assert_eq "error 1" "$(raw disk@1 write 0 4096)" "write to a snapshot: EPERM"
# A large payload is received into a buffer of its own (not the input buffer): refused all the same.
assert_eq "error 1" "$(raw disk@1 write 0 1048576)" "1 MiB write to a snapshot: EPERM"
assert_eq "error 1" "$(raw disk@empty trim 0 4096)" "trim of a snapshot: EPERM"
assert_eq "error 1" "$(raw disk@1 zero 0 4096)" "write-zeroes to a snapshot: EPERM"
assert_eq "error 0" "$(raw disk@1 read 0 4096)" "read of a snapshot"
qio "$(uri disk@1)" "read -P 0 0 1M"
serving "after writes to a snapshot"

# ---- Requests beyond the end ------------------------------------------------------------------------
if qemu-io -f raw -c "write -P 1 $((size - 4096)) 8k" "$(uri disk)" >/dev/null 2>&1; then
    fail "qemu-io wrote beyond the end"
fi
for req in "write $((size - 4096)) 8192" "write $size 4096" "write 18446744073709547520 4096" \
    "write $((size - 4096)) 1048576" "read $size 4096" "trim $((size - 512)) 4096" "zero $size 1"; do
    read -ra args <<<"$req"
    out=$(raw disk "${args[@]}") || fail "raw $req: the server dropped the connection"
    [[ $out == "error 22" || $out == "error 28" ]] || fail "raw $req: want EINVAL or ENOSPC, got [$out]"
done
qio "$(uri disk)" "write -P 0x21 $((size - 4096)) 4k" "read -P 0x21 $((size - 4096)) 4k" \
    "read -P 0 $((size - 8192)) 4k"
serving "after out-of-range requests"

# ---- A client killed -9 with writes in flight --------------------------------------------------------
fio --name=victim --ioengine=nbd --uri="$(uri disk)" --thread --rw=randwrite --bs=4k \
    --iodepth=32 --size=$((32 << 20)) --time_based --runtime=30 >"$T/fio1.out" 2>&1 &
fio_pid=$!
bg_pid "$fio_pid"
sleep 1.5
kill -0 "$fio_pid" 2>/dev/null || fail "fio ended early: $(cat "$T/fio1.out")"
kill -KILL "$fio_pid"
wait "$fio_pid" 2>/dev/null || true
serving "after a client was killed"
qio "$(uri disk)" "write -P 0x31 40M 1M" "flush" "read -P 0x31 40M 1M"
stop_server
check_store "after a client was killed mid-write"

# ---- The server killed -9 in the middle of writes ------------------------------------------------------
start_server
dead=$SERVER_PID
mkfifo "$T/qio.fifo"
qemu-io -f raw "$(uri disk)" <"$T/qio.fifo" >"$T/qio.log" 2>&1 &
qio_pid=$!
bg_pid "$qio_pid"
exec 3>"$T/qio.fifo"
sent=0
qsend() { # one command on the held connection, waiting for its completion (bounded)
    local i
    echo "$1" >&3
    sent=$((sent + 1))
    for ((i = 0; i < 200; i++)); do
        (($(grep -o 'qemu-io>' "$T/qio.log" | wc -l) > sent)) && break
        sleep 0.05
    done
    (($(grep -o 'qemu-io>' "$T/qio.log" | wc -l) > sent)) || fail "qemu-io stuck: $(cat "$T/qio.log")"
    ! grep -Eqi 'fail|error' "$T/qio.log" || fail "qemu-io: $(cat "$T/qio.log")"
}
qsend "write -P 0x44 0 4M"
qsend "flush"
qsend "write -f -P 0x45 4M 64k"
fio --name=busy --ioengine=nbd --uri="$(uri disk)" --thread --rw=randwrite --bs=4k \
    --iodepth=32 --offset=$((16 << 20)) --size=$((32 << 20)) --time_based --runtime=30 \
    >"$T/fio2.out" 2>&1 &
fio_pid=$!
bg_pid "$fio_pid"
echo "write -P 0x46 8M 4M" >&3 # unflushed, possibly still in flight when the server dies
sleep 1
kill -0 "$fio_pid" 2>/dev/null || fail "fio ended early: $(cat "$T/fio2.out")"
kill -KILL "$dead"
wait "$dead" 2>/dev/null || true # reap it, so its pid is really gone
wait "$fio_pid" 2>/dev/null || true
exec 3>&-
wait "$qio_pid" 2>/dev/null || true
[[ -z $(plx vdi-list | awk 'NR > 1 && $NF != "-"') ]] || echo "note: vdi-list still shows the dead holder: $(plx vdi-list | tail -n +2)"
check_store "after the server was killed"
tail -n1 "$T/check.out"

start_server
qio "$(uri disk)" "read -P 0x44 0 4M" "read -P 0x45 4M 64k" "read -P 0x21 $((size - 4096)) 4k"
qio "$(uri disk)" "write -P 0x47 12M 1M" "flush" "read -P 0x47 12M 1M" # the stale lock is taken over
# The last connection gone, the server closes the VDI (soon: the close runs after the client left).
for ((i = 0; i < 50; i++)); do plx vdi-list | contains "^1 .* pid $SERVER_PID\$" || break; sleep 0.1; done
plx vdi-list | contains "^1 .* pid $SERVER_PID\$" && fail "the VDI stays locked 5 s after its client left"
stop_server
head -c 8192 /dev/urandom >"$T/head.raw"
plx vdi-import disk "$T/head.raw" || fail "vdi-import after the restarted server stopped"
plx vdi-export disk "$T/out.raw"
cmp -n 8192 "$T/head.raw" "$T/out.raw" || fail "import after the crash"
cmp -i 4M:0 -n 65536 "$T/out.raw" <(head -c 65536 /dev/zero | tr '\0' '\105') ||
    fail "the FUA write did not survive"
check_store "at the end"
