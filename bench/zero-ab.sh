#!/usr/bin/env bash
# bench/zero-ab.sh - 4 KiB random writes right after snapshots: Parallax's placement modes
# against a raw file, in interleaved rounds (issue 16; DESIGN.md "Zeroing ahead").
#
# Each round, for each system in turn (the order rotates every round so that a noisy neighbour
# hits each alike): a fresh store (or raw file), a VDI filled with 1 MiB writes, SNAPS live
# snapshots (parallax vdi-snapshot through the server), then fio 4 KiB random writes at each
# depth in DEPTHS for RUNTIME seconds (a snapshot before each depth's run, so every run starts
# right after one), IOPS per half second logged. Systems:
#   arrival  parallax serve --placement arrival
#   leaf     parallax serve (leaf placement, zeroing ahead)
#   leaf0    parallax serve with PARALLAX_ZERO_AHEAD=0 (leaf placement, no zeroing ahead)
#   leafwait parallax serve with PARALLAX_ZERO_WAIT=1 (leaf placement, zeroing ahead, and every
#            write into a chunk not zeroed yet waits for it, as before 2026-11-26)
#   direct   qemu-storage-daemon on a raw file written in full (cache.direct=on, aio=native)
#   before   like leaf, with the build $BEFORE (another parallax binary: an A/B of two builds)
# All over NBD on a unix socket. Prints one line per run (IOPS, the server's CPU time per request)
# and a summary of ratios to direct and to arrival per round; the server's stderr (PARALLAX_PREP_STATS=1: zeroing-ahead counters at
# close) goes to OUT/*.log.
#
#   bench/zero-ab.sh [--rounds N] [--runtime S] [--depths "1 32"] [--size 1G] [--snaps N]
#                    [--systems "arrival leaf leaf0 leafwait before direct"] [--dir DIR] [--out DIR]
# Needs fio (nbd engine), qemu-storage-daemon, jq, python3; PARALLAX (default build/parallax).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE_DIR=$ROOT/bench/suite
# shellcheck source=bench/suite/lib.sh
. "$SUITE_DIR/lib.sh"

ROUNDS=3 RUNTIME=5 DEPTHS="1 32" SIZE=1G SNAPS=2 SYSTEMS="arrival leaf leaf0 direct"
BASE_DIR=/var/tmp OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) ROUNDS=$2 && shift ;;
    --runtime) RUNTIME=$2 && shift ;;
    --depths) DEPTHS=$2 && shift ;;
    --size) SIZE=$2 && shift ;;
    --snaps) SNAPS=$2 && shift ;;
    --systems) SYSTEMS=$2 && shift ;;
    --dir) BASE_DIR=$2 && shift ;;
    --out) OUT=$2 && shift ;;
    -h | --help)
        sed -n '2,20p' "$0"
        exit 0
        ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

PARALLAX=${PARALLAX:-$ROOT/build/parallax}
[[ -x $PARALLAX ]] || die "no $PARALLAX: run make first"
WORK=$(mktemp -d "$BASE_DIR/zero-ab.XXXXXX")
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
SUITE_TMP=$WORK/tmp
mkdir -p "$SUITE_TMP"
export PARALLAX_RUN_DIR=$WORK/run
mkdir -p "$PARALLAX_RUN_DIR"
cleanup() {
    local i
    for ((i = ${#SUITE_PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${SUITE_PIDS[i]}"; done
    rm -rf "$WORK/store" "$WORK/raw" "$SUITE_TMP"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # the EXIT trap then stops what was started (an untrapped TERM would skip it)

size_mib=$(numfmt --from=iec "$SIZE")
size_mib=$((size_mib >> 20))
# room for the fill, one copy of the disk per depth's run and the extents held ahead
store_mib=$((size_mib * (2 + $(wc -w <<<"$DEPTHS")) + 1024))

sock=$WORK/nbd.sock
# run_system SYS ROUND: one system's runs; appends "SYS ROUND DEPTH IOPS" lines to $OUT/runs.
run_system() {
    local sys=$1 r=$2 d pid qmp=$WORK/qmp.sock
    if [[ $sys == direct ]]; then
        rm -f "$WORK/raw"
        dd if=/dev/zero of="$WORK/raw" bs=1M count="$size_mib" oflag=direct status=none
        qsd_start raw "$WORK/raw" "$sock" "$qmp" "$OUT/$sys-r$r.log"
        pid=$QSD_PID
    else
        plx_format "$WORK/store" "${store_mib}M"
        "$PARALLAX" -b "$WORK/store" vdi-create v --size "$SIZE" >/dev/null
        local env=(PARALLAX_PREP_STATS=1) place=() bin=$PARALLAX
        [[ $sys == before ]] && bin=${BEFORE:?set BEFORE to the other build}
        [[ $sys == leaf0 ]] && env+=(PARALLAX_ZERO_AHEAD=0)
        [[ $sys == leafwait ]] && env+=(PARALLAX_ZERO_WAIT=1)
        [[ $sys == arrival ]] && place=(--placement arrival)
        rm -f "$sock"
        env "${env[@]}" "$bin" -b "$WORK/store" serve --unix "$sock" "${place[@]}" \
            >"$OUT/$sys-r$r.log" 2>&1 &
        pid=$!
        track_pid "$pid"
        WAIT_S=20 wait_for -S "$sock" || die "serve did not start: $(cat "$OUT/$sys-r$r.log")"
        WAIT_S=20 wait_for -S "$PARALLAX_RUN_DIR/serve-$pid.sock" || die "no control socket"
        fio_nbd "$SUITE_TMP/fill.json" "$sock" v --rw=write --bs=1M --iodepth=8 --size="$SIZE"
        for ((i = 0; i < SNAPS - 1; i++)); do
            "$PARALLAX" -b "$WORK/store" vdi-snapshot v >/dev/null
        done
    fi
    for d in $DEPTHS; do
        [[ $sys == direct ]] || "$PARALLAX" -b "$WORK/store" vdi-snapshot v >/dev/null
        local tag=$sys-r$r-d$d
        CPU_PID=$pid fio_nbd "$OUT/$tag.json" "$sock" v --rw=randwrite --bs=4k --iodepth="$d" --size="$SIZE" \
            --runtime="$RUNTIME" --time_based --write_iops_log="$OUT/$tag" --log_avg_msec=500
        local iops prof
        iops=$(fio_value "$OUT/$tag.json" | cut -d. -f1)
        # IOPS per half second (the log's counts are per interval)
        prof=$(awk -F, '{ printf "%d ", $2 }' "$OUT/${tag}_iops.1.log" 2>/dev/null)
        # the server's CPU per request (all its threads), us: a measure the load moves less
        cpu_us=$(jq -r --argjson s "$(cat "$OUT/$tag.cpu")" \
            '.jobs[0].write.total_ios as $n | if $n > 0 then ($s * 1e6 / $n | floor) else 0 end' "$OUT/$tag.json")
        echo "$sys $r $d $iops $cpu_us" >>"$OUT/runs"
        log "round $r $sys depth $d: $iops IOPS, server CPU $cpu_us us/request (per 0.5 s: $prof)" \
            "load $(cut -d' ' -f1 /proc/loadavg)"
    done
    stop_pid "$pid"
    [[ $sys == direct ]] || grep -h "zeroing ahead:" "$OUT/$sys-r$r.log" >&2 || true
}

log "zero-ab: $PARALLAX ($(git -C "$ROOT" describe --always --dirty 2>/dev/null)), $ROUNDS rounds," \
    "$SIZE, depths $DEPTHS, $RUNTIME s, $SNAPS snapshots; load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$OUT/runs"
read -ra sys_list <<<"$SYSTEMS"
n=${#sys_list[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
        run_system "${sys_list[(k + r - 1) % n]}" "$r"
    done
done
log "load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
# summary: per depth and system, IOPS of each round, and ratios to direct and arrival
python3 - "$OUT/runs" <<'EOF'
import sys, collections, math
runs = collections.defaultdict(dict)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    s, r, d, v, c = line.split()
    runs[int(d)][(s, int(r))] = float(v)
    cpu[(int(d), s)].append(int(c))
for d in sorted(runs):
    rs = sorted({r for (_, r) in runs[d]})
    syss = sorted({s for (s, _) in runs[d]})
    print(f"depth {d}:")
    for s in syss:
        vals = [runs[d].get((s, r)) for r in rs]
        line = f"  {s:8s} " + " ".join(f"{v:8.0f}" if v else "       -" for v in vals)
        for base in ("direct", "arrival"):
            if base == s:
                continue
            rat = [runs[d][(s, r)] / runs[d][(base, r)] for r in rs
                   if (s, r) in runs[d] and (base, r) in runs[d]]
            if rat:
                gm = math.exp(sum(map(math.log, rat)) / len(rat))
                line += f"  /{base}: " + " ".join(f"{x:.2f}" for x in rat) + f" (geo {gm:.2f})"
        print(line)
    print("  server CPU per request, us (median): " + ", ".join(
        f"{s} {sorted(cpu[(d, s)])[len(cpu[(d, s)]) // 2]}" for s in syss))
EOF
echo "raw results: $OUT" >&2
