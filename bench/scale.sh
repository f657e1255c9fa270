#!/bin/sh
# bench/scale.sh - costs against the number of snapshots of one VDI and against the number of
# VDIs (bench/README.md, "Scale").
#   bench/scale.sh [--dir DATA_DIR] [--counts 1,10,...] [--vdi-counts 1,10,...] [--out RESULTS_DIR]
#                  [--gc-sizes 2000,...] [--gc-seq 2048x63,...]
# Runs build/bench-scale on a blockstore in a fresh directory under DATA_DIR (a real disk, default
# /var/tmp), writes scale.csv to RESULTS_DIR (default bench/results/scale-HOST-STAMP) and plots
# bench/plots/scale-snapshots.png; then costs against the VDI count (vdis.csv, scale-vdis.png),
# the collector's mark rate against fio (gc.csv,
# scale-gc.png), the mark on contiguous nodes against fio's sequential reads (gc-seq.csv) and a
# server's memory against the VDIs it serves (serve-memory.csv, scale-serve-memory.png). Stores are
# removed at the end. --gc-only runs only the two collector parts; $BENCH_SCALE names another
# bench-scale binary (e.g. one built from an older gc.c, for a before/after in the same run).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=/var/tmp
COUNTS=1,10,100,1000,10000,100000
VDI_COUNTS=1,10,100,1000,10000,100000
GC_SIZES=2000,8000,24000
GC_SEQ="2048x63"
OUT=""
GC_ONLY=0
BS=${BENCH_SCALE:-$ROOT/build/bench-scale}
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --counts) COUNTS=$2; shift 2 ;;
    --gc-sizes) GC_SIZES=$2; shift 2 ;;
    --gc-seq) GC_SEQ=$(echo "$2" | tr , ' '); shift 2 ;;
    --vdi-counts) VDI_COUNTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --gc-only) GC_ONLY=1; shift ;;
    *) echo "usage: bench/scale.sh [--dir DIR] [--counts LIST] [--gc-sizes LIST] [--gc-seq LEAVESxCLONES,...] [--vdi-counts LIST] [--out DIR] [--gc-only]" >&2; exit 2 ;;
    esac
done
[ -n "$OUT" ] || OUT="$ROOT/bench/results/scale-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
WORK=$(mktemp -d "$DIR/plx-scale.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
start=$(date +%s)
if [ "$GC_ONLY" = 0 ]; then
    "$BS" --store "$WORK/store" --counts "$COUNTS" > "$OUT/scale.csv" \
        2> "$OUT/scale.log"
    cat "$OUT/scale.csv" "$OUT/scale.log"
    rm -f "$WORK/store"

    # The registry: costs against the number of VDIs (create, lookup, open, a page, every record).
    "$BS" --store "$WORK/store" --vdis "$VDI_COUNTS" > "$OUT/vdis.csv" \
        2>> "$OUT/scale.log"
    cat "$OUT/vdis.csv"
    rm -f "$WORK/store"
fi

# The collector's mark phase on scattered nodes, against fio's 4 KiB random reads on the same
# disk in the same run (QD32: what the mark phase should approach; QD1: one read at a time).
fio_iops() {
    fio --name=r --filename="$WORK/fio" --size=2G --rw=randread --bs=4k --iodepth="$1" \
        --ioengine=libaio --direct=1 --runtime=5 --time_based --output-format=json 2>/dev/null |
        sed -n '/^{/,$p' | jq '.jobs[0].read.iops | floor'
}
echo "nodes_per_vdi,metadata_read,mark_seconds,mark_nodes_per_s,check_seconds,fio_qd32_iops,fio_qd1_iops,check_qd1_seconds,check_nodes_per_s,check_qd1_nodes_per_s" \
    > "$OUT/gc.csv"
for n in $(echo "$GC_SIZES" | tr , ' '); do
    "$BS" --store "$WORK/store" --gc "$n" > "$WORK/gc.out" 2>> "$OUT/scale.log"
    rm -f "$WORK/store"
    q32=$(fio_iops 32)
    q1=$(fio_iops 1)
    rm -f "$WORK/fio"
    # the best of the three collections (the machine is shared)
    tail -n +2 "$WORK/gc.out" | sort -t, -k5 -n -r | head -1 |
        awk -F, -v n="$n" -v a="$q32" -v b="$q1" '{printf "%s,%s,%s,%s,%s,%s,%s,%s,%.0f,%.0f\n", n, $2, $4, $5, $6, a, b, $7, $2 / $6, $2 / $7}' \
        >> "$OUT/gc.csv"
done
cat "$OUT/gc.csv"

# The mark phase where the nodes are contiguous (a golden VDI and its clones, each clone's leaves
# in ascending order), against fio's sequential 1 MiB reads on the same disk in the same run
# (QD32, what the mark should approach, and QD1) and its 4 KiB random reads at QD32. O_DIRECT for
# both (the store's file backend opens it O_DIRECT); the page cache is not dropped.
fio_seq_mib() {
    fio --name=r --filename="$WORK/fio" --size=2G --rw=read --bs=1M --iodepth="$1" \
        --ioengine=libaio --direct=1 --runtime=5 --time_based --output-format=json 2>/dev/null |
        sed -n '/^{/,$p' | jq '.jobs[0].read.bw / 1024 | floor'
}
echo "leaves,clones,metadata_read,mark_seconds,mark_mib_per_s,gc_cpu_seconds,fio_seq_qd32_before_mib_per_s,fio_seq_qd32_after_mib_per_s,fio_seq_qd1_mib_per_s,fio_rand_qd32_mib_per_s,mark_to_fio_seq_qd32,load_before,load_after" \
    > "$OUT/gc-seq.csv"
for lc in $(echo "$GC_SEQ" | tr ' ' '\n'); do
    leaves=${lc%%x*} clones=${lc##*x}
    load0=$(cut -d' ' -f1 /proc/loadavg)
    # fio's sequential reads right before and right after the collections (the ratio is to
    # their mean: the shared disk moves by 1.5x within a minute)
    s32a=$(fio_seq_mib 32)
    "$BS" --store "$WORK/store" --gc-seq "$leaves" --clones "$clones" \
        > "$WORK/gc-seq.out" 2>> "$OUT/scale.log"
    rm -f "$WORK/store"
    s32b=$(fio_seq_mib 32)
    s1=$(fio_seq_mib 1)
    r32=$(( $(fio_iops 32) * 4 / 1024 ))
    rm -f "$WORK/fio"
    load1=$(cut -d' ' -f1 /proc/loadavg)
    # the best of the three collections
    tail -n +2 "$WORK/gc-seq.out" | sort -t, -k6 -n -r | head -1 |
        awk -F, -v l="$leaves" -v c="$clones" -v a="$s32a" -v a2="$s32b" -v b="$s1" -v r="$r32" \
            -v l0="$load0" -v l1="$load1" \
            '{printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%.2f,%s,%s\n", l, c, $2, $4, $6, $7, a, a2, b, r, $6 * 2 / (a + a2), l0, l1}' \
        >> "$OUT/gc-seq.csv"
done
cat "$OUT/gc-seq.csv"

if [ "$GC_ONLY" = 0 ]; then
    # A server's memory against the VDIs it serves (one NBD connection each, all kept open).
    python3 "$ROOT/bench/serve-memory.py" --parallax "$ROOT/build/parallax" --dir "$WORK" \
        --counts 1,10,100,1000 > "$OUT/serve-memory.csv"
    cat "$OUT/serve-memory.csv"
fi
echo "$(( $(date +%s) - start ))" > "$OUT/wall-seconds"
if [ "$GC_ONLY" = 0 ] && command -v gnuplot > /dev/null; then
    gnuplot -e "csv='$OUT/scale.csv'; out='$ROOT/bench/plots/scale-snapshots.png'; gccsv='$OUT/gc.csv'; gcout='$ROOT/bench/plots/scale-gc.png'; memcsv='$OUT/serve-memory.csv'; memout='$ROOT/bench/plots/scale-serve-memory.png'; vdicsv='$OUT/vdis.csv'; vdiout='$ROOT/bench/plots/scale-vdis.png'" \
        "$ROOT/bench/scale.gp"
    echo "plots: bench/plots/scale-snapshots.png scale-gc.png scale-serve-memory.png scale-vdis.png"
fi
