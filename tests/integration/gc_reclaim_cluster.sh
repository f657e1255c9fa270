#!/usr/bin/env bash
# Space comes back while every host serves (issue 30, item 1): three hosts (h1, h2, h3) on one
# tgtd LUN with parallax-lockd serve for the whole test, each under a writer (fio) on a VDI of
# its own. Each host writes a VDI three times over with a snapshot between; the snapshots are
# deleted and `parallax gc` runs from a fourth host (admin) while all three serve: the deleted
# snapshots' space is free in gc's report and in `parallax info`, no server restarted, and every
# flushed byte reads back. Before, gc skipped every extent the serving hosts held and freed
# nothing. Then two collectors from two hosts at once: both end cleanly (one may give up).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
require_cmd fio jq
# shellcheck source=tests/integration/cluster.bash
. "$(dirname "$0")/cluster.bash"

# gc waits for the holders' answers and folds as long as they take on a loaded machine.
export PARALLAX_RECLAIM_WAIT_MS=30000
lockd_start 3
lun format --size 256M --extent-size 2M >/dev/null
lun lockd-set "127.0.0.1:$LOCKD_PORT"
hosts=(h1 h2 h3)
for h in "${hosts[@]}"; do
    lun vdi-create "v$h" --size 8M >/dev/null
    lun vdi-create "bg$h" --size 4M >/dev/null
    truncate -s 8M "$T/model-v$h.img"
done
for h in "${hosts[@]}"; do start_host "$h" "127.0.0.1:$LOCKD_PORT" PARALLAX_RECLAIM_POLL_MS=200; done

# A writer per host for the whole test, on a VDI no snapshot freezes (once every block is
# written it allocates nothing, so the space counts below hold still).
declare -A FIO
for h in "${hosts[@]}"; do
    qemu-io -f raw -c "write -P 0x11 0 4M" "$(uri "$h" "bg$h")" >/dev/null || fail "filling bg$h"
    fio --name="bg$h" --ioengine=nbd --uri="$(uri "$h" "bg$h")" --rw=randwrite --bs=4k \
        --iodepth=2 --size=4M --time_based --runtime=600 >"$T/fio-$h.log" 2>&1 &
    FIO[$h]=$!
    bg_pid "${FIO[$h]}"
done
sleep 1
for h in "${hosts[@]}"; do kill -0 "${FIO[$h]}" || fail "fio on $h: $(cat "$T/fio-$h.log")"; done

used_data() { lun info --json | jq '.blocks_used.data'; }
# write (cluster.bash) that says why it failed.
wr() { # HOST VDI PATTERN OFFSET LENGTH
    local out
    out=$(qemu-io -f raw -c "write -P $3 $4 $5" -c flush "$(uri "$1" "$2")" 2>&1) &&
        ! grep -qi 'error\|fail' <<<"$out" ||
        fail "writing $2 through $1: $out; host log: $(tail -5 "$T/$1.log")"
    model "$2" "$3" "$4" "$5"
}
for h in "${hosts[@]}"; do
    wr "$h" "v$h" 65 0 8388608
    lun vdi-snapshot "v$h" >/dev/null
    wr "$h" "v$h" 66 0 8388608
    lun vdi-snapshot "v$h" >/dev/null
    wr "$h" "v$h" 67 0 4194304
done
before=$(used_data)
for h in "${hosts[@]}"; do lun snap-delete "v$h@1" && lun snap-delete "v$h@2"; done

lun gc --json >"$T/gc.json" || fail "gc: $(cat "$T/gc.json")"
freed=$(jq '.freed.data' "$T/gc.json")
after=$(used_data)
# Per host, 8 MiB (2,048 blocks) only v@1 reached and 4 MiB only v@2 did.
((freed >= 3 * 3072)) || fail "gc freed $freed data blocks, expected at least 9216: $(cat "$T/gc.json")"
((before - after >= 3 * 3072)) ||
    fail "parallax info: data blocks used $before before gc, $after after (expected 9216 fewer)"

for h in "${hosts[@]}"; do
    kill -0 "${SRV[$h]}" || fail "host $h exited: $(tail -5 "$T/$h.log")"
    verify "$h" "v$h" "after gc"
done

# Two collectors from two hosts at once, beside the writers: each ends cleanly, or gives up
# because the other freed blocks while it marked (run gc again).
wr h1 vh1 68 0 8388608
lun vdi-snapshot vh1 >/dev/null
wr h1 vh1 69 0 8388608
lun snap-delete vh1@3
PARALLAX_HOST_ID=gc1 "$PARALLAX" -b "$URL" gc --json >"$T/gc1.json" 2>"$T/gc1.err" &
g1=$!
PARALLAX_HOST_ID=gc2 "$PARALLAX" -b "$URL" gc --json >"$T/gc2.json" 2>"$T/gc2.err" &
g2=$!
rc1=0 rc2=0
wait $g1 || rc1=$?
wait $g2 || rc2=$?
for i in 1 2; do
    r=rc$i
    ((${!r} == 0)) || grep -q "another collection freed blocks" "$T/gc$i.err" ||
        fail "gc $i: exit ${!r}: $(cat "$T/gc$i.err")"
done
lun gc --json >"$T/gc3.json" || fail "gc after the two: $(cat "$T/gc3.json")"
verify h1 vh1 "after two collectors"

for h in "${hosts[@]}"; do
    kill "${FIO[$h]}"
    wait "${FIO[$h]}" 2>/dev/null || true
    verify "$h" "v$h" "at the end"
    stop_host "$h"
done
lun check >"$T/check.out" || fail "check: $(cat "$T/check.out")"
