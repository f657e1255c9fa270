#!/usr/bin/env bash
# bench/suite/depth-pair.sh - one Parallax build at two (or more) snapshot depths side by side,
# and direct (qemu-storage-daemon, raw file) as a control: is a difference the suite's depth
# section shows between depths the build's, or the machine's at that moment? Each depth gets a
# disk of its own (a store of its own, one server each), the same fill as run.sh's depth section
# and the same snapshots with GROW_KIB written at random offsets before each; then every round
# runs the job on each disk and on direct in turn (the order rotates every round), and the
# per-round ratio of each depth to the first is printed with the median, lowest and highest.
#
#   bench/suite/depth-pair.sh PARALLAX OUTDIR
#   environment: VDI (1G) RUNTIME (3) ROUNDS (6) DEPTHS ("1 1000") GROW_KIB (16)
#                JOB ("--rw=randread --bs=4k --iodepth=32") DIR (/var/tmp)
# Take the bench lock around it (flock /work/bench.lock ...) on a shared machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE_DIR=$ROOT/bench/suite
# shellcheck source=bench/suite/lib.sh
. "$SUITE_DIR/lib.sh"
[[ $# -eq 2 ]] || {
    echo "usage: bench/suite/depth-pair.sh PARALLAX OUTDIR" >&2
    exit 2
}
PARALLAX=$1 OUT=$2
VDI=${VDI:-1G} RUNTIME=${RUNTIME:-3} ROUNDS=${ROUNDS:-6} DEPTHS=${DEPTHS:-"1 1000"} GROW_KIB=${GROW_KIB:-16}
JOB=${JOB:-"--rw=randread --bs=4k --iodepth=32"}
BASE_DIR=${DIR:-/var/tmp}
DATA=$BASE_DIR/plx-dpair-$$
SUITE_TMP=$DATA/tmp
mkdir -p "$DATA" "$SUITE_TMP" "$OUT"
export PARALLAX_RUN_DIR=$DATA/run
mkdir -p "$PARALLAX_RUN_DIR"
S="python3 $SUITE_DIR/suite.py"
trap 'set +e; suite_cleanup; rm -rf "$DATA"' EXIT
trap 'exit 130' INT TERM
bytes() { numfmt --from=iec "$1"; }
names=()
for d in $DEPTHS; do
    n=p$d dir=$DATA/p$d
    mkdir -p "$dir"
    plx_format "$dir/store.img" $(($(bytes "$VDI") * 16 + (1 << 30)))
    "$PARALLAX" -b "$dir/store.img" vdi-create v --size "$VDI" >/dev/null
    plx_start "$dir/store.img" "$dir/nbd.sock" "$dir/serve.log"
    hold_start "$dir/nbd.sock" v
    printf -v "${n}_pid" %s "$PLX_PID"
    printf -v "${n}_sock" %s "$dir/nbd.sock"
    fio_nbd "$SUITE_TMP/fill.json" "$dir/nbd.sock" v --rw=write --bs=1M --iodepth=8 --size="$VDI"
    t0=$(date +%s.%N)
    $S grow --plx-ctl "$PLX_CTL" --vdi-id "$(plx_vdi_id "$dir/store.img" v)" --nbd "$dir/nbd.sock" --export v \
        --count "$d" --write-kib "$GROW_KIB" --seed "$d" >"$OUT/grow-$d.json"
    log "depth $d: grown in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
    names+=("$n")
done
mkdir -p "$DATA/dd"
fallocate -l "$VDI" "$DATA/dd/disk.raw"
qsd_start raw "$DATA/dd/disk.raw" "$DATA/dd/nbd.sock" "$DATA/dd/qmp.sock" "$DATA/dd/qsd.log"
# read through ${n}_pid and ${n}_sock
# shellcheck disable=SC2034
dd_pid=$QSD_PID dd_sock=$DATA/dd/nbd.sock
fio_nbd "$SUITE_TMP/fill.json" "$dd_sock" v --rw=write --bs=1M --iodepth=8 --size="$VDI"
names+=(dd)
echo "load-start $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/load"
k=${#names[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    line="round $r:"
    for ((i = 0; i < k; i++)); do
        n=${names[$(((i + r - 1) % k))]}
        p=${n}_pid s=${n}_sock
        # shellcheck disable=SC2086 # the job's fio options, split
        CPU_PID=${!p} fio_nbd "$OUT/$n-r$r.json" "${!s}" v $JOB --size="$VDI" --runtime="$RUNTIME" --time_based
        line+=" $n $(fio_value "$OUT/$n-r$r.json" | cut -d. -f1)"
    done
    log "$line"
done
echo "load-end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/load"
cat "$OUT/load"
# per-round ratios of each disk to the first depth's
python3 - "$OUT" "$ROUNDS" "${names[@]}" <<'EOF'
import json, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def val(n, r):
    j = json.load(open("%s/%s-r%d.json" % (out, n, r)))["jobs"][0]
    s = j["read"] if j["read"]["io_bytes"] else j["write"]
    return s["iops"]  # the ratios of MiB/s are the same
for n in names:
    v = [val(n, r) for r in range(1, rounds + 1)]
    print("%-6s per round: %s; median %.0f" % (n, " ".join("%.0f" % x for x in v), statistics.median(v)))
def cpu_us(n, r):  # the server's CPU time per request, microseconds
    j = json.load(open("%s/%s-r%d.json" % (out, n, r)))["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    return 1e6 * float(open("%s/%s-r%d.cpu" % (out, n, r)).read()) / ios
for n in names:
    c = [cpu_us(n, r) for r in range(1, rounds + 1)]
    print("%-6s server CPU per request (us): %s; median %.2f" % (n, " ".join("%.2f" % x for x in c), statistics.median(c)))
for n in names[1:]:
    q = [val(n, r) / val(names[0], r) for r in range(1, rounds + 1)]
    print("%s / %s per round: %s; median %.3f, lowest %.3f, highest %.3f" % (
        n, names[0], " ".join("%.3f" % x for x in q), statistics.median(q), min(q), max(q)))
EOF
