#!/usr/bin/env bash
# A guest's disk migrating between two hosts, in the order libxl works: the destination attaches
# the disk while the source still runs the guest, and the source detaches it only after the
# guest stopped there. Two `parallax serve` processes with their own host ids stand for the two
# hosts' storage appliances. The destination's client gets the export at once (right size), but
# none of its requests is served while the source holds the VDI; the source keeps writing; once
# the source lets go, the waiting requests run, in order, and see every byte the source wrote.
# A handover that never comes fails the waiting requests after $PARALLAX_HANDOVER_WAIT seconds.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io nbdinfo jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
plx format --size 1G >/dev/null
plx vdi-create vm --size 64M >/dev/null
plx vdi-create stuck --size 16M >/dev/null

start_server() { # HOST-ID SOCK [ENV...]
    local id=$1 sock=$2 i
    shift 2
    env PARALLAX_HOST_ID="$id" "$@" "$PARALLAX" -b "$T/store.img" serve --unix "$sock" \
        >"$T/$id.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    for ((i = 0; i < 100; i++)); do
        [[ -S $sock ]] && return 0
        sleep 0.1
    done
    fail "server $id did not start: $(cat "$T/$id.log")"
}
start_server source "$T/src.sock"
src=$SERVER_PID
start_server dest "$T/dst.sock" PARALLAX_HANDOVER_WAIT=8
dst=$SERVER_PID

# qemu-io sessions held open through FIFOs: the guest's disk on each host.
open_client() { # NAME SOCK EXPORT
    mkfifo "$T/$1.fifo"
    qemu-io -f raw "nbd+unix:///$3?socket=$2" <"$T/$1.fifo" >"$T/$1.log" 2>&1 &
    bg_pid $!
    eval "$1_pid=$!"
}
said() { grep -c "$2" "$T/$1.log" || true; }
# wait_said NAME PATTERN COUNT: wait up to 10 s for COUNT lines of PATTERN in NAME's output (a
# loaded machine answers late; the assertion after it still fails if they never come).
wait_said() {
    local i
    for ((i = 0; i < 100; i++)); do
        (($(said "$1" "$2") >= $3)) && return 0
        sleep 0.1
    done
}

# The guest runs on the source.
open_client guest_src "$T/src.sock" vm
exec 3>"$T/guest_src.fifo"
echo "write -P 0x11 0 64k" >&3
echo "flush" >&3
wait_said guest_src 'wrote 65536/65536' 1
assert_eq 1 "$(said guest_src 'wrote 65536/65536')" "the guest's first write on the source"

# Migration starts: the destination attaches the disk. It gets the export at once.
size=$(nbdinfo --size "nbd+unix:///vm?socket=$T/dst.sock")
assert_eq $((64 << 20)) "$size" "the size the destination offers while it waits"
open_client guest_dst "$T/dst.sock" vm
exec 4>"$T/guest_dst.fifo"
echo "read -P 0x22 64k 4k" >&4 # the source writes 0x22 there below
sleep 1
assert_eq 0 "$(said guest_dst 'read 4096/4096')" "a request answered while the source still held the VDI"
grep -q "its requests wait until it lets go" "$T/dest.log" || fail "dest does not say it waits: $(cat "$T/dest.log")"

# The guest is still running on the source (memory copy): its writes go on.
echo "write -P 0x22 64k 4k" >&3
echo "flush" >&3
wait_said guest_src 'wrote' 2
assert_eq 2 "$(said guest_src 'wrote')" "the source's writes during the migration"

# The guest stops on the source; libxl detaches the disk there.
echo "quit" >&3
exec 3>&-
wait "$guest_src_pid" 2>/dev/null || true
for ((i = 0; i < 50; i++)); do (($(said guest_dst 'read 4096/4096') == 1)) && break; sleep 0.1; done
assert_eq 1 "$(said guest_dst 'read 4096/4096')" "the destination's waiting read after the handover"
! grep -qi 'pattern verification failed\|error\|fail' "$T/guest_dst.log" ||
    fail "the destination read other data than the source wrote: $(cat "$T/guest_dst.log")"
grep -q "handed over after" "$T/dest.log" || fail "dest does not log the handover"
echo "read -P 0x11 0 64k" >&4
echo "write -P 0x33 128k 4k" >&4
echo "flush" >&4
echo "quit" >&4
exec 4>&-
wait "$guest_dst_pid" 2>/dev/null || true
! grep -qi 'verification failed\|error\|fail' "$T/guest_dst.log" || fail "destination: $(cat "$T/guest_dst.log")"
assert_eq 1 "$(said guest_dst 'wrote 4096/4096')" "the guest's write on the destination"

# A handover that never comes: the waiting requests fail after PARALLAX_HANDOVER_WAIT (8 s).
open_client hold "$T/src.sock" stuck
exec 5>"$T/hold.fifo"
echo "write -P 1 0 4k" >&5
wait_said hold 'wrote 4096/4096' 1
assert_eq 1 "$(said hold 'wrote 4096/4096')" "the holder's write on the source"
start=$SECONDS
out=$(qemu-io -f raw -c "read 0 4k" "nbd+unix:///stuck?socket=$T/dst.sock" 2>&1) || true
grep -qi 'error\|fail' <<<"$out" || fail "a request waited for a VDI that never came and succeeded: $out"
((SECONDS - start >= 7)) || fail "the waiting request failed before the wait ran out"
grep -q "gave up waiting" "$T/dest.log" || fail "dest does not say it gave up"
echo "quit" >&5
exec 5>&-

kill "$src" "$dst"
wait "$src" "$dst" 2>/dev/null || true
plx check >/dev/null || fail "check after the migration"
plx vdi-export vm "$T/vm.img"
cmp <(head -c 65536 "$T/vm.img") <(head -c 65536 /dev/zero | tr '\0' '\021') || fail "the source's first write"
cmp <(dd if="$T/vm.img" bs=4k skip=16 count=1 status=none) <(head -c 4096 /dev/zero | tr '\0' '\042') ||
    fail "the source's write during the migration"
cmp <(dd if="$T/vm.img" bs=4k skip=32 count=1 status=none) <(head -c 4096 /dev/zero | tr '\0' '\063') ||
    fail "the destination's write"
echo ok
