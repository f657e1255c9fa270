#!/usr/bin/env bash
# bench/snapwrite.sh - issue 16's pair, two builds interleaved: a 1 MiB sequential writer (fio,
# nbd engine, QD 8, --loops passes over a fresh VDI) through `parallax serve`, without snapshots
# and with one every INTERVAL through the control socket (suite.py snaploop, as the suite's
# frequency section does). Each round runs, for each build in turn, the writer alone and then
# with snapshots, each on a fresh store; prints one line per run (MiB/s, snapshots taken @ their
# achieved mean interval, snapshot latency p50 / p99 / max, load average) and, per build, the
# summed ratio with/without and the median, lowest and highest of the rounds' ratios (one slow
# run without snapshots moves the sum: the median of paired rounds does not). A snapshot that
# takes longer than the interval delays the next, so compare the achieved intervals too.
#
#   bench/snapwrite.sh [--rounds N] [--size SIZE] [--loops N] [--interval S] [--dir DIR]
#                      [--logs DIR] [--prewrite] [--loop] NAME=PARALLAX-BINARY...
#
# --prewrite writes the whole store file through (zeros, O_DIRECT) before formatting it, so the
# runs write into space the medium has written before, as on a block device or a store in use;
# by default the store is a fresh sparse file, and on this VM's disk a write into space the file
# system allocates fresh is about 1.45x slower than one into written space (bench/notes/snapshots.md,
# "Fresh space").
#
# --loop puts the store on a block device: a loop device (direct I/O) over a file under --dir
# written through with zeros once, formatted again (--force) for every run, so that the file
# system's allocation is out of the writer's path (needs root and a free loop device).
#
# --logs DIR keeps each server's stderr as DIR/NAME-rROUND-INTERVAL.log (with
# PARALLAX_SNAP_TRACE=1 in the environment: one line per snapshot, where its time went).
#
#   e.g. bench/snapwrite.sh before=/tmp/base/parallax after=build/parallax
#
# Needs fio, jq, python3. Every server is stopped by pid on exit. Outputs go to a temporary
# directory that is removed at the end (nothing is written into bench/).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE_DIR=$ROOT/bench/suite
# shellcheck source=bench/suite/lib.sh
. "$SUITE_DIR/lib.sh"

ROUNDS=3 SIZE=1G LOOPS=2 INTERVAL=0.01 BASE_DIR=/var/tmp KEEP_LOGS="" PREWRITE=0 LOOPDEV=0
BUILDS=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) ROUNDS=$2 && shift ;;
    --size) SIZE=$2 && shift ;;
    --loops) LOOPS=$2 && shift ;;
    --interval) INTERVAL=$2 && shift ;;
    --dir) BASE_DIR=$2 && shift ;;
    --logs) KEEP_LOGS=$2 && shift ;;
    --prewrite) PREWRITE=1 ;;
    --loop) LOOPDEV=1 ;;
    *=*) BUILDS+=("$1") ;;
    *)
        sed -n '2,30p' "$0" >&2
        exit 2
        ;;
    esac
    shift
done
((${#BUILDS[@]})) || die "name at least one build: NAME=PARALLAX-BINARY"

SUITE_TMP=$(mktemp -d "$BASE_DIR/snapwrite.XXXXXX")
export PARALLAX_RUN_DIR=$SUITE_TMP/run
mkdir -p "$PARALLAX_RUN_DIR"
LOOP=""
trap 'suite_cleanup; [[ -n $LOOP ]] && losetup -d "$LOOP"; rm -rf "$SUITE_TMP"' EXIT
trap 'exit 143' INT TERM
if ((LOOPDEV)); then
    bytes=$(($(numfmt --from=iec "$SIZE") * 4 + (1 << 30)))
    dd if=/dev/zero of="$SUITE_TMP/loop.img" bs=1M count=$((bytes >> 20)) oflag=direct status=none
    LOOP=$(losetup --direct-io=on --show -f "$SUITE_TMP/loop.img") || die "losetup failed"
fi

# one NAME INTERVAL: prints "MiB/s snapshots p50 p99 max" (ms; "- - - -" without snapshots)
one() {
    local iv=$1 d=$SUITE_TMP/d lp="" store bytes
    rm -rf "$d" && mkdir -p "$d"
    store=$d/store.img
    bytes=$(($(numfmt --from=iec "$SIZE") * 4 + (1 << 30)))
    if [[ -n $LOOP ]]; then
        store=$LOOP
        "$PARALLAX" -b "$store" format --force --extent-size "${PLX_EXTENT:-256M}" >/dev/null
    elif ((PREWRITE)); then
        dd if=/dev/zero of="$store" bs=1M count=$((bytes >> 20)) oflag=direct status=none
        "$PARALLAX" -b "$store" format --extent-size "${PLX_EXTENT:-256M}" >/dev/null # keeps the file
    else
        plx_format "$store" "$bytes"
    fi
    "$PARALLAX" -b "$store" vdi-create v --size "$SIZE" >/dev/null
    plx_start "$store" "$d/nbd.sock" "$d/serve.log"
    local spid=$PLX_PID ctl=$PLX_CTL
    hold_start "$d/nbd.sock" v
    local hpid=$HOLD_PID id
    id=$(plx_vdi_id "$store" v)
    if [[ $iv != none ]]; then
        python3 "$SUITE_DIR/suite.py" snaploop --plx-ctl "$ctl" --vdi-id "$id" --interval "$iv" \
            --stop-file "$d/stop" --ready "$d/ready" >"$d/loop.json" 2>"$d/loop.err" &
        lp=$!
        track_pid "$lp"
        WAIT_S=20 wait_for -e "$d/ready" || die "snapshot loop did not start: $(cat "$d/loop.err")"
    fi
    fio_nbd "$d/fio.json" "$d/nbd.sock" v --rw=write --bs=1M --iodepth=8 --size="$SIZE" --loops="$LOOPS"
    local bw
    bw=$(jq '.jobs[0].write.bw_bytes / 1048576' "$d/fio.json")
    local snaps="- - - -"
    if [[ -n $lp ]]; then
        touch "$d/stop"
        wait "$lp" || die "snapshot loop failed: $(cat "$d/loop.json")"
        snaps=$(jq -r '(.mean_interval_s * 1e4 | round / 10) as $iv | .latency_ns | sort |
            length as $n | "\($n)@\($iv)ms \(.[($n * 0.5 | floor)] / 1e5 | round / 10) \(.[($n * 0.99 | floor)] / 1e5 | round / 10) \(.[-1] / 1e5 | round / 10)"' "$d/loop.json")
    fi
    stop_pid "$hpid"
    stop_pid "$spid"
    [[ -n $KEEP_LOGS ]] && cp "$d/serve.log" "$KEEP_LOGS/$name-r$r-$iv.log"
    printf '%.1f %s\n' "$bw" "$snaps"
}

declare -A SUM_NONE SUM_SNAP RATIOS
for ((r = 1; r <= ROUNDS; r++)); do
    for b in "${BUILDS[@]}"; do
        name=${b%%=*}
        PARALLAX=$(realpath "${b#*=}")
        for iv in none "$INTERVAL"; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            one "$iv" >"$SUITE_TMP/res" # not in $(...): its servers must stay ours on exit
            read -r bw n p50 p99 max <"$SUITE_TMP/res"
            printf 'round %d %-8s snapshots %-5s %8.1f MiB/s  snapshots %s  p50/p99/max ms %s / %s / %s  load %s\n' \
                "$r" "$name" "$iv" "$bw" "$n" "$p50" "$p99" "$max" "$load"
            if [[ $iv == none ]]; then
                SUM_NONE[$name]=$(echo "${SUM_NONE[$name]:-0} + $bw" | bc -l)
                bw_none=$bw
            else
                SUM_SNAP[$name]=$(echo "${SUM_SNAP[$name]:-0} + $bw" | bc -l)
                RATIOS[$name]+=" $(echo "$bw / $bw_none" | bc -l)"
            fi
        done
    done
done
for b in "${BUILDS[@]}"; do
    name=${b%%=*}
    read -r med lo hi < <(tr ' ' '\n' <<<"${RATIOS[$name]}" | sed '/^$/d' | sort -g |
        awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }')
    printf '%-8s with snapshots / without, summed over %d rounds: %.3f; per round: median %s, lowest %s, highest %s\n' \
        "$name" "$ROUNDS" "$(echo "${SUM_SNAP[$name]} / ${SUM_NONE[$name]}" | bc -l)" "$med" "$lo" "$hi"
done
