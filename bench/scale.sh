#!/bin/sh
# bench/scale.sh - costs against the number of snapshots of one VDI and against the number of
# VDIs (bench/README.md, "Scale").
#   bench/scale.sh [--dir DATA_DIR] [--counts 1,10,...] [--vdi-counts 1,10,...] [--out RESULTS_DIR]
# Runs build/bench-scale on a blockstore in a fresh directory under DATA_DIR (a real disk, default
# /var/tmp), writes scale.csv to RESULTS_DIR (default bench/results/scale-HOST-STAMP) and plots
# bench/plots/scale-snapshots.png; then costs against the VDI count (vdis.csv, scale-vdis.png),
# the collector's mark rate against fio (gc.csv,
# scale-gc.png) and a server's memory against the VDIs it serves (serve-memory.csv,
# scale-serve-memory.png). Stores are removed at the end.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=/var/tmp
COUNTS=1,10,100,1000,10000,100000
VDI_COUNTS=1,10,100,1000,10000,100000
GC_SIZES=2000,8000,24000
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --counts) COUNTS=$2; shift 2 ;;
    --gc-sizes) GC_SIZES=$2; shift 2 ;;
    --vdi-counts) VDI_COUNTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: bench/scale.sh [--dir DIR] [--counts LIST] [--gc-sizes LIST] [--vdi-counts LIST] [--out DIR]" >&2; exit 2 ;;
    esac
done
[ -n "$OUT" ] || OUT="$ROOT/bench/results/scale-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
WORK=$(mktemp -d "$DIR/plx-scale.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
start=$(date +%s)
"$ROOT/build/bench-scale" --store "$WORK/store" --counts "$COUNTS" > "$OUT/scale.csv" \
    2> "$OUT/scale.log"
cat "$OUT/scale.csv" "$OUT/scale.log"
rm -f "$WORK/store"

# The registry: costs against the number of VDIs (create, lookup, open, a page, every record).
"$ROOT/build/bench-scale" --store "$WORK/store" --vdis "$VDI_COUNTS" > "$OUT/vdis.csv" \
    2>> "$OUT/scale.log"
cat "$OUT/vdis.csv"
rm -f "$WORK/store"

# The collector's mark phase on scattered nodes, against fio's 4 KiB random reads on the same
# disk in the same run (QD32: what the mark phase should approach; QD1: one read at a time).
fio_iops() {
    fio --name=r --filename="$WORK/fio" --size=2G --rw=randread --bs=4k --iodepth="$1" \
        --ioengine=libaio --direct=1 --runtime=5 --time_based --output-format=json 2>/dev/null |
        sed -n '/^{/,$p' | jq '.jobs[0].read.iops | floor'
}
echo "nodes_per_vdi,metadata_read,mark_seconds,mark_nodes_per_s,check_seconds,fio_qd32_iops,fio_qd1_iops" \
    > "$OUT/gc.csv"
for n in $(echo "$GC_SIZES" | tr , ' '); do
    "$ROOT/build/bench-scale" --store "$WORK/store" --gc "$n" > "$WORK/gc.out" 2>> "$OUT/scale.log"
    rm -f "$WORK/store"
    q32=$(fio_iops 32)
    q1=$(fio_iops 1)
    rm -f "$WORK/fio"
    # the best of the three collections (the machine is shared)
    tail -n +2 "$WORK/gc.out" | sort -t, -k5 -n -r | head -1 |
        awk -F, -v n="$n" -v a="$q32" -v b="$q1" '{print n "," $2 "," $4 "," $5 "," $6 "," a "," b}' \
        >> "$OUT/gc.csv"
done
cat "$OUT/gc.csv"

# A server's memory against the VDIs it serves (one NBD connection each, all kept open).
python3 "$ROOT/bench/serve-memory.py" --parallax "$ROOT/build/parallax" --dir "$WORK" \
    --counts 1,10,100,1000 > "$OUT/serve-memory.csv"
cat "$OUT/serve-memory.csv"
echo "$(( $(date +%s) - start ))" > "$OUT/wall-seconds"
if command -v gnuplot > /dev/null; then
    gnuplot -e "csv='$OUT/scale.csv'; out='$ROOT/bench/plots/scale-snapshots.png'; gccsv='$OUT/gc.csv'; gcout='$ROOT/bench/plots/scale-gc.png'; memcsv='$OUT/serve-memory.csv'; memout='$ROOT/bench/plots/scale-serve-memory.png'; vdicsv='$OUT/vdis.csv'; vdiout='$ROOT/bench/plots/scale-vdis.png'" \
        "$ROOT/bench/scale.gp"
    echo "plots: bench/plots/scale-snapshots.png scale-gc.png scale-serve-memory.png scale-vdis.png"
fi
