#!/usr/bin/env bash
# A blockstore on an iSCSI LUN (tgtd on loopback) works wherever a path does: `parallax format`
# takes the LUN's size, the admin commands, import/export, /etc/parallax/blockstore
# ($PARALLAX_BLOCKSTORE_FILE here), `parallax serve` with fio
# verifying 4 KiB random writes at queue depth 32 and qemu-io patterns over NBD; kill -9 of the
# server in the middle of writes leaves a LUN that `parallax check` finds clean and gc collects.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio qemu-io jq nbdinfo
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"
tgt_start
T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
URL=$(tgt_add_lun 1 512M)
lun() { "$PARALLAX" -b "$URL" "$@"; }

# Format: the whole LUN when no --size is given; a second format needs --force.
lun format --extent-size 16M >"$T/format.out"
grep -q "^formatted $URL: 512.0 MiB" "$T/format.out" || fail "format: $(cat "$T/format.out")"
expect_fail 1 lun format --extent-size 16M
[[ $PLX_LAST_STDERR == *"already"* || $PLX_LAST_STDERR == *"--force"* ]] ||
    fail "second format: $PLX_LAST_STDERR"
assert_eq 536870912 "$(lun info --json | jq .size_bytes)" "store size = LUN size"
lun info | contains "^blockstore      $URL\$" || fail "info names the LUN: $(lun info)"

# Admin commands, and the blockstore named in the configuration file.
echo "# this host's blockstore" >"$T/blockstore.conf"
echo "$URL" >>"$T/blockstore.conf"
PARALLAX_BLOCKSTORE_FILE=$T/blockstore.conf "$PARALLAX" vdi-create disk --size 128M >/dev/null
lun vdi-create small --size 8M >/dev/null
head -c 5M /dev/urandom >"$T/in.bin"
lun vdi-import small "$T/in.bin"
lun vdi-snapshot small --label one >/dev/null
lun vdi-create copy --from small@one >/dev/null
lun vdi-export copy "$T/out.bin"
cmp -n $((5 << 20)) "$T/in.bin" "$T/out.bin" || fail "export of the clone differs from the import"
assert_eq 3 "$(PARALLAX_BLOCKSTORE_FILE=$T/blockstore.conf "$PARALLAX" vdi-list --json | jq length)" \
    "three VDIs listed through the configuration file"

# serve
sock=$T/nbd.sock
start_server() {
    local i
    rm -f "$sock"
    "$PARALLAX" -b "$URL" serve "$@" --unix "$sock" >>"$T/serve.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$T/serve.log"
}
fio_verify() { # NAME SIZE [fio args]: random writes then every block read back and checked
    local name=$1 size=$2 rc=0
    shift 2
    fio --name="$name" --ioengine=nbd --uri="nbd+unix:///disk?socket=$sock" --rw=randwrite \
        --bs=4k --iodepth=32 --size="$size" --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --output-format=json --output="$T/$name.json" "$@" >"$T/$name.out" 2>&1 || rc=$?
    [[ $rc -eq 0 ]] || fail "fio $name exited $rc: $(tail -5 "$T/$name.out")"
    sed -n '/^{/,$p' "$T/$name.json" >"$T/$name.clean.json"
    assert_eq 0 "$(jq '.jobs[0].error' "$T/$name.clean.json")" "fio $name error"
    echo "fio $name: $(jq -r '.jobs[0].write.iops | floor' "$T/$name.clean.json") write IOPS," \
        "$(jq -r '.jobs[0].read.iops | floor' "$T/$name.clean.json") verify-read IOPS"
}

start_server
fio_verify builtin 64M
qemu-io -f raw -c "write -P 0x5a 1M 64k" -c "read -P 0x5a 1M 64k" -c flush \
    "nbd+unix:///disk?socket=$sock" >"$T/qio.out" || fail "qemu-io: $(cat "$T/qio.out")"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true

lun check >"$T/check.out" || fail "check after serving: $(cat "$T/check.out")"
tail -n1 "$T/check.out"

# kill -9 of the server while fio writes: the LUN is consistent, gc reclaims what the dead
# server had claimed, and what was flushed before (to another VDI) is there.
start_server
qemu-io -f raw -c "write -P 0xa5 2M 256k" -c flush "nbd+unix:///copy?socket=$sock" >"$T/qio1.out" ||
    fail "qemu-io: $(cat "$T/qio1.out")"
fio --name=crash --ioengine=nbd --uri="nbd+unix:///disk?socket=$sock" --rw=randwrite --bs=4k \
    --iodepth=32 --size=96M --time_based --runtime=30 >"$T/crash.out" 2>&1 &
fio_pid=$!
bg_pid "$fio_pid"
sleep 2
kill -9 "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
wait "$fio_pid" 2>/dev/null || true
lun check >"$T/check2.out" || fail "check after kill -9: $(cat "$T/check2.out")"
grep -q "^check: 0 errors" "$T/check2.out" || fail "check: $(tail -1 "$T/check2.out")"
tail -n1 "$T/check2.out"
lun gc >"$T/gc.out" 2>&1 || fail "gc after kill -9: $(cat "$T/gc.out")"
lun check | tail -n1
start_server
qemu-io -f raw -r -c "read -P 0xa5 2M 256k" "nbd+unix:///copy?socket=$sock" >"$T/qio2.out" 2>&1 ||
    fail "flushed data lost after kill -9: $(cat "$T/qio2.out")"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true
