#!/usr/bin/env bash
# Live administration of a served VDI. While a client holds a connection and writes (qemu-io,
# driven one command at a time) and fio writes elsewhere in the VDI, `parallax vdi-snapshot`
# is carried out by the server and returns at once; each snapshot holds exactly the data whose
# writes completed before the command; snap-label and snap-delete go through the server too;
# vdi-delete and vdi-import of the served VDI fail with exit 1 saying it is open for writing,
# and so does opening it through a second server.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdinfo nbdcopy qemu-io fio jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=${2:-$sock}"; }
half=$((32 << 20)) # qemu-io writes below this, fio above

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 64M >/dev/null

# start_server SOCK LOG: sets SERVER_PID; waits (bounded) for the NBD socket and, for live
# administration, the control socket in $PARALLAX_RUN_DIR.
start_server() {
    local i
    rm -f "$1"
    # shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
    "$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$1" >"$2" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    for ((i = 0; i < 100; i++)); do
        [[ -S $1 && -S $PARALLAX_RUN_DIR/serve-$SERVER_PID.sock ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited: $(cat "$2")"
        sleep 0.1
    done
    fail "server sockets did not appear within 10 s: $(ls "$PARALLAX_RUN_DIR")"
}
start_server "$sock" "$T/serve.log"
server=$SERVER_PID

# ---- A client holding the VDI: qemu-io reading commands from a FIFO --------------------------
mkfifo "$T/qio.fifo"
qemu-io -f raw "$(uri disk)" <"$T/qio.fifo" >"$T/qio.log" 2>&1 &
qio_pid=$!
bg_pid "$qio_pid"
exec 3>"$T/qio.fifo"
on_exit 'exec 3>&-'
qio_sent=0
# qio_wait: until qemu-io has prompted for the command after the last one sent (bounded).
qio_wait() {
    local i
    for ((i = 0; i < 200; i++)); do
        (($(grep -o 'qemu-io>' "$T/qio.log" | wc -l) > qio_sent)) && break
        sleep 0.05
    done
    (($(grep -o 'qemu-io>' "$T/qio.log" | wc -l) > qio_sent)) || fail "qemu-io stuck: $(cat "$T/qio.log")"
    ! grep -Eqi 'fail|error' "$T/qio.log" || fail "qemu-io: $(cat "$T/qio.log")"
}
# qio CMD: run one command on the held connection and wait until it has completed.
qio() {
    echo "$1" >&3
    qio_sent=$((qio_sent + 1))
    qio_wait
}
qio_wait
plx vdi-list | contains "^1 .* pid $server\$" || fail "the server does not hold disk: $(plx vdi-list)"

# Expected images of the first half, built with the same writes on plain files.
want() { qemu-io -f raw -c "$1" "$T/$2" >/dev/null; }
truncate -s $half "$T/want1" "$T/want2"

qio "write -P 0x11 0 1M"
qio "write -P 0x12 3M 8k"
want "write -P 0x11 0 1M" want1
want "write -P 0x12 3M 8k" want1

# fio keeps writes in flight in the second half while the snapshots are taken.
fio --name=bg --ioengine=nbd --uri="$(uri disk)" --thread --rw=randwrite --bs=4k --iodepth=16 \
    --offset=$half --size=$half --time_based --runtime=4 >"$T/fio.out" 2>&1 &
fio_pid=$!
bg_pid "$fio_pid"
sleep 0.5

start=$(date +%s%N)
snap=$(timeout 20 "$PARALLAX" -b "$T/store.img" vdi-snapshot disk --label x) ||
    fail "live vdi-snapshot failed (exit $?)"
ms=$((($(date +%s%N) - start) / 1000000))
assert_eq disk@1 "$snap" "live snapshot"
((ms < 5000)) || fail "live snapshot took $ms ms"
echo "live snapshot with writes in flight: $ms ms"

cp "$T/want1" "$T/want2"
qio "write -P 0x21 0 512k"
qio "write -P 0x22 5M 4k"
want "write -P 0x21 0 512k" want2
want "write -P 0x22 5M 4k" want2
assert_eq disk@2 "$(plx vdi-snapshot disk)" "second live snapshot"
qio "write -P 0x31 0 4k"
qio "read -P 0x31 0 4k"
qio "read -P 0x21 4k 508k"

# Each snapshot holds exactly the writes completed before it (first half; fio owns the rest).
cmp_export() { # EXPORT WANTFILE
    nbdcopy "$(uri "$1")" "$T/got.raw"
    cmp -n $half "$T/got.raw" "$T/$2" || fail "$1 differs from the writes before it"
}
cmp_export disk@x want1
cmp_export disk@1 want1
cmp_export disk@2 want2
list_names() { nbdinfo --list --json "nbd+unix:///?socket=$sock" | jq -r '.exports[]."export-name"' | sort | tr '\n' ' '; }
assert_eq "disk disk@1 disk@2 disk@x " "$(list_names)" "exports with two snapshots, one labelled"

# ---- snap-label and snap-delete through the server ---------------------------------------------
plx snap-label disk@2 y || fail "live snap-label"
plx snap-list disk | contains -E '^2 +[0-9TZ:-]+ +y$' || fail "label not set: $(plx snap-list disk)"
cmp_export disk@y want2
plx snap-delete disk@x || fail "live snap-delete"
plx snap-list disk | contains '^1 ' && fail "snapshot 1 still listed: $(plx snap-list disk)"
assert_eq "disk disk@2 disk@y " "$(list_names)" "exports after snap-label and snap-delete"
if nbdinfo "$(uri disk@x)" >/dev/null 2>&1; then fail "deleted snapshot still exported"; fi

# ---- What must be refused while the server holds the VDI ----------------------------------------
expect_fail 1 plx vdi-delete disk
[[ $PLX_LAST_STDERR == *"open for writing"* ]] || fail "vdi-delete message: $PLX_LAST_STDERR"
head -c 4096 /dev/urandom >"$T/junk"
expect_fail 1 plx vdi-import disk "$T/junk"
[[ $PLX_LAST_STDERR == *"open for writing"* ]] || fail "vdi-import message: $PLX_LAST_STDERR"
# A second server on the same blockstore starts (it serves every VDI), but cannot open this one:
# its client's requests wait for a handover (server/nbd_handover.c) that does not come, and fail.
sock2=$T/nbd2.sock
export PARALLAX_HANDOVER_WAIT=1
start_server "$sock2" "$T/serve2.log"
unset PARALLAX_HANDOVER_WAIT
server2=$SERVER_PID
if qemu-io -f raw -c "read 0 4k" "$(uri disk "$sock2")" >"$T/q2" 2>&1; then
    fail "a second server opened the VDI that the first one holds"
fi
grep -q "open for writing" "$T/serve2.log" || fail "second server's message: $(cat "$T/serve2.log")"
grep -q "gave up waiting" "$T/serve2.log" || fail "second server did not give up: $(cat "$T/serve2.log")"
kill -TERM "$server2"
wait "$server2" || true

# ---- Wind down: the writer and fio finish cleanly, the store checks clean ------------------------
wait "$fio_pid" || fail "background fio failed: $(cat "$T/fio.out")"
echo quit >&3
exec 3>&-
wait "$qio_pid" || fail "qemu-io failed: $(cat "$T/qio.log")"
kill -TERM "$server"
wait "$server" || true
plx check >"$T/check.out" || { cat "$T/check.out" >&2; fail "check"; }
plx vdi-export disk@y "$T/y.raw"
cmp -n $half "$T/y.raw" "$T/want2" || fail "vdi-export of disk@y after the server stopped"
plx vdi-list | contains '^1 .* -$' || fail "lock not released: $(plx vdi-list)"
