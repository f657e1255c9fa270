#!/usr/bin/env bash
# The iSCSI connection fails under `parallax serve` while fio writes over NBD:
#  1. tgtd closes the connection (tgtadm --op delete --mode conn): the backend logs in again and
#     re-issues what was in flight; fio sees no error and every block verifies afterwards.
#  2. tgtd is killed (-9) and started again 2 s later: the same.
#  3. tgtd goes away for good (reconnect attempts limited by PARALLAX_ISCSI_RETRIES): writes
#     fail with EIO to the client instead of hanging or being acknowledged; after the target is
#     back, `parallax check` finds the LUN consistent and data flushed before is intact.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio qemu-io jq
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"
tgt_start
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
URL=$(tgt_add_lun 1 512M)
lun() { "$PARALLAX" -b "$URL" "$@"; }
lun format --extent-size 16M >/dev/null
lun vdi-create disk --size 128M >/dev/null
lun vdi-create keep --size 16M >/dev/null

sock=$T/nbd.sock
start_server() {
    local i
    rm -f "$sock"
    "$PARALLAX" -b "$URL" serve --unix "$sock" >>"$T/serve.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$T/serve.log"
}
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
}

# fio writing 96 MiB of random 4 KiB blocks, several passes, with verify headers; the verify
# pass (same seed, --verify_only) reads every block back and checks it.
FIO=(--ioengine=nbd --uri="nbd+unix:///disk?socket=$sock" --rw=randwrite --bs=4k --iodepth=32
    --size=96M --verify=crc32c --randrepeat=1 --verify_fatal=1)

# fault_under_writes NAME CMD...: run CMD while fio writes; fio must finish without an error.
fault_under_writes() {
    local name=$1 rc=0
    shift
    fio --name="$name" "${FIO[@]}" --loops=3 --do_verify=0 >"$T/$name.out" 2>&1 &
    local fio_pid=$!
    sleep 1.5
    kill -0 "$fio_pid" 2>/dev/null || fail "$name: fio finished before the fault"
    "$@"
    wait "$fio_pid" || rc=$?
    [[ $rc -eq 0 ]] || fail "$name: fio exited $rc: $(grep -i err "$T/$name.out" | head -5)"
    grep -q "err= 0" "$T/$name.out" || fail "$name: fio reported errors"
    fio --name="$name" "${FIO[@]}" --verify_only >"$T/$name.verify" 2>&1 ||
        fail "$name: verify failed: $(grep -iE 'verify|err' "$T/$name.verify" | head -5)"
    echo "$name: writes continued, every block verified"
}

start_server
qemu-io -f raw -c "write -P 0x3c 0 1M" -c flush "nbd+unix:///keep?socket=$sock" >/dev/null ||
    fail "qemu-io write to keep"

drop() {
    local n
    n=$(tgt_drop_connections)
    [[ $n -ge 1 ]] || fail "no connection to drop"
    echo "dropped $n connection(s)"
}
fault_under_writes drop drop
grep -q "connection lost" "$T/serve.log" && grep -q "logged in again" "$T/serve.log" ||
    fail "the server did not report the drop and the new login: $(cat "$T/serve.log")"

fault_under_writes restart tgt_restart 2
stop_server
lun check >"$T/check1.out" || fail "check: $(cat "$T/check1.out")"
grep -q "^check: 0 errors" "$T/check1.out" || fail "check: $(tail -1 "$T/check1.out")"
tail -n1 "$T/check1.out"

# The target goes away for good: with one reconnect attempt allowed, the server gives up.
PARALLAX_ISCSI_RETRIES=1 start_server
# (fio prints its state every second: the target stops once fio is writing, not after a fixed
# sleep that a loaded machine can outlast before fio has connected.)
fio --name=gone "${FIO[@]}" --loops=50 --do_verify=0 --eta=always --eta-newline=1 \
    >"$T/gone.out" 2>&1 &
fio_pid=$!
for ((i = 0; i < 600; i++)); do
    grep -q '\[w(1)\]' "$T/gone.out" && break
    kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before the target was stopped: $(tail -5 "$T/gone.out")"
    sleep 0.1
done
grep -q '\[w(1)\]' "$T/gone.out" || fail "fio did not start writing within 60 s: $(tail -5 "$T/gone.out")"
sleep 0.5
tgt_stop
rc=0
timeout 120 tail --pid="$fio_pid" -f /dev/null || fail "fio still running 120 s after the target died"
wait "$fio_pid" || rc=$?
[[ $rc -ne 0 ]] || fail "fio succeeded although the target was gone"
grep -qiE "Input/output error|error=5|err= *5" "$T/gone.out" ||
    fail "fio failed, but not with EIO: $(grep -v '^Jobs:' "$T/gone.out" | tail -8; tail -5 "$T/serve.log")"
grep -q "failing I/O with EIO" "$T/serve.log" || fail "the server did not say it gave up"
echo "target gone: fio got EIO, the server said: $(grep -m1 'failing I/O' "$T/serve.log")"
kill -9 "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true

tgt_restart
lun check >"$T/check2.out" || fail "check after the target came back: $(cat "$T/check2.out")"
grep -q "^check: 0 errors" "$T/check2.out" || fail "check: $(tail -1 "$T/check2.out")"
tail -n1 "$T/check2.out"
start_server
qemu-io -f raw -r -c "read -P 0x3c 0 1M" "nbd+unix:///keep?socket=$sock" >"$T/keep.out" 2>&1 ||
    fail "flushed data of another VDI lost: $(cat "$T/keep.out")"
stop_server
