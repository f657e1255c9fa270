#!/bin/sh
# bench/scale.sh - costs against the number of snapshots of one VDI (bench/README.md, "Scale").
#   bench/scale.sh [--dir DATA_DIR] [--counts 1,10,...] [--out RESULTS_DIR]
# Runs build/bench-scale on a blockstore in a fresh directory under DATA_DIR (a real disk, default
# /var/tmp), writes scale.csv to RESULTS_DIR (default bench/results/scale-HOST-STAMP) and plots
# bench/plots/scale-snapshots.png. The store is removed at the end.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=/var/tmp
COUNTS=1,10,100,1000,10000,100000
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --counts) COUNTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: bench/scale.sh [--dir DIR] [--counts LIST] [--out DIR]" >&2; exit 2 ;;
    esac
done
[ -n "$OUT" ] || OUT="$ROOT/bench/results/scale-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
WORK=$(mktemp -d "$DIR/plx-scale.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
start=$(date +%s)
"$ROOT/build/bench-scale" --store "$WORK/store" --counts "$COUNTS" > "$OUT/scale.csv" \
    2> "$OUT/scale.log"
echo "$(( $(date +%s) - start ))" > "$OUT/wall-seconds"
cat "$OUT/scale.csv" "$OUT/scale.log"
if command -v gnuplot > /dev/null; then
    gnuplot -e "csv='$OUT/scale.csv'; out='$ROOT/bench/plots/scale-snapshots.png'" \
        "$ROOT/bench/scale.gp"
    echo "plot: bench/plots/scale-snapshots.png"
fi
