#!/usr/bin/env bash
# Space comes back while a server keeps serving (issue 30, item 1): one long-running `parallax
# serve` on a file store holds the extents that every write of the test goes into, under a
# writer (fio) for the whole test. Snapshots are taken and deleted through it, and `parallax
# gc` runs beside it: the deleted snapshots' blocks are free afterwards, in gc's report and in
# `parallax info`, the server never restarted, and what was flushed reads back. Before, gc
# skipped every extent the server held and freed nothing.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io fio jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
# gc waits for the holders' answers and folds as long as they take on a loaded machine.
export PARALLAX_RECLAIM_WAIT_MS=30000
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=$sock"; }

plx format --size 512M --extent-size 4M >/dev/null
plx vdi-create disk --size 16M >/dev/null
plx vdi-create bg --size 32M >/dev/null

# The holder looks for collectors' requests every 100 ms (the default is a second).
PARALLAX_RECLAIM_POLL_MS=100 "$PARALLAX" -b "$T/store.img" serve --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve.log"

# A writer for the whole test, on a VDI of its own that no snapshot freezes (so that it
# allocates nothing once it has written every block, and the space counts below hold still).
qemu-io -f raw -c "write -P 0x11 0 32M" "$(uri bg)" >/dev/null || fail "filling bg"
fio --name=bg --ioengine=nbd --uri="$(uri bg)" --rw=randwrite --bs=4k --iodepth=4 \
    --size=32M --time_based --runtime=300 >"$T/fio.log" 2>&1 &
writer=$!
bg_pid "$writer"
sleep 1
kill -0 "$writer" || fail "fio did not start: $(cat "$T/fio.log")"

used_data() { plx info --json | jq '.blocks_used.data'; }
w() { qemu-io -f raw -c "write -P $1 0 16M" -c flush "$(uri disk)" >/dev/null || fail "writing $1"; }

w 0x41
plx vdi-snapshot disk >/dev/null
w 0x42
plx vdi-snapshot disk >/dev/null
w 0x43
before=$(used_data)
plx snap-delete disk@1
plx snap-delete disk@2

plx gc --json >"$T/gc.json" || fail "gc: $(cat "$T/gc.json")"
freed=$(jq '.freed.data' "$T/gc.json")
after=$(used_data)
# The two deleted snapshots held 16 MiB each (4,096 blocks) that nothing reaches any more.
((freed >= 8192)) || fail "gc freed $freed data blocks, expected at least 8192: $(cat "$T/gc.json")"
((before - after >= 8192)) ||
    fail "parallax info: data blocks used $before before gc, $after after (expected 8192 fewer)"

kill -0 "$server" || fail "the server exited: $(tail -5 "$T/serve.log")"
qemu-io -f raw -r -c "read -P 0x43 0 16M" "$(uri disk)" >"$T/read.log" 2>&1 ||
    fail "reading back: $(cat "$T/read.log")"
grep -qi 'fail\|error' "$T/read.log" && fail "reading back: $(cat "$T/read.log")"
kill "$writer"
wait "$writer" 2>/dev/null || true
kill -TERM "$server"
wait "$server" || true
plx check --json >"$T/check.json" || fail "check: $(cat "$T/check.json")"
# The reclaim records are live (their entries name them), not leaks.
[[ $(jq .leaked_blocks "$T/check.json") == 0 ]] || fail "check reports leaks: $(cat "$T/check.json")"
