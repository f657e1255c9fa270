#!/usr/bin/env bash
# bench/suite/depth-ab.sh - the depth section of run.sh (section_depth, without qcow2) for two
# Parallax builds at once: build A, build B and direct (qemu-storage-daemon, raw file) each get
# a disk of their own, the same fill and the same snapshots with the same random writes between
# them, and every fio job runs on A, B and direct in turn (A and B swap places every other
# repetition). For A/B comparisons of two builds: both see the same machine at the same moments.
# Beside MiB/s and server CPU it prints, for 1 MiB reads, how many requests reached the disk
# under --dir per MiB read (from /sys/block/DEV/stat: other processes' reads count too).
#
#   bench/suite/depth-ab.sh PARALLAX_A PARALLAX_B OUTDIR
#   environment: VDI (256M) RUNTIME (2) REPS (2) DEPTHS ("1 10 100") GROW_KIB (8)
#                JOBS ("4k-randread 1M-read 4k-randwrite 1M-write") DIR (/var/tmp)
# Take the bench lock around it (flock /work/bench.lock ...) on a shared machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE_DIR=$ROOT/bench/suite
# shellcheck source=bench/suite/lib.sh
. "$SUITE_DIR/lib.sh"
[[ $# -eq 3 ]] || {
    echo "usage: bench/suite/depth-ab.sh PARALLAX_A PARALLAX_B OUTDIR" >&2
    exit 2
}
PA=$1 PB=$2 OUT=$3
VDI=${VDI:-256M} RUNTIME=${RUNTIME:-2} REPS=${REPS:-2} DEPTHS=${DEPTHS:-"1 10 100"} GROW_KIB=${GROW_KIB:-8}
JOBS=${JOBS:-"4k-randread 1M-read 4k-randwrite 1M-write"}
BASE_DIR=${DIR:-/var/tmp}
# The disk under BASE_DIR, for counting its read requests (none: not counted).
DEVSTAT=""
src=$(findmnt -no SOURCE --target "$BASE_DIR" 2>/dev/null || true)
if [[ $src == /dev/* ]]; then
    dev=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
    dev=${dev:-$(basename "$src")}
    [[ -r /sys/block/$dev/stat ]] && DEVSTAT=/sys/block/$dev/stat
fi
devreads() { if [[ -n $DEVSTAT ]]; then awk '{ print $1, $3 }' "$DEVSTAT"; else echo 0 0; fi; }
DATA=$BASE_DIR/plx-ab-$$
SUITE_TMP=$DATA/tmp
mkdir -p "$DATA" "$SUITE_TMP" "$OUT"
export PARALLAX_RUN_DIR=$DATA/run
mkdir -p "$PARALLAX_RUN_DIR"
S="python3 $SUITE_DIR/suite.py"
trap 'set +e; suite_cleanup; rm -rf "$DATA"' EXIT
trap 'exit 130' INT TERM
bytes() { numfmt --from=iec "$1"; }
start_plx() { # NAME BIN
    local name=$1 d=$DATA/$1
    PARALLAX=$2
    mkdir -p "$d"
    local ssize=$(($(bytes "$VDI") * 16 + (1 << 30)))
    plx_format "$d/store.img" "$ssize"
    "$PARALLAX" -b "$d/store.img" vdi-create v --size "$VDI" >/dev/null
    plx_start "$d/store.img" "$d/nbd.sock" "$d/serve.log"
    hold_start "$d/nbd.sock" v
    printf -v "${name}_pid" %s "$PLX_PID"
    printf -v "${name}_ctl" %s "$PLX_CTL"
    printf -v "${name}_id" %s "$(plx_vdi_id "$d/store.img" v)"
    printf -v "${name}_sock" %s "$d/nbd.sock"
}
start_direct() {
    local d=$DATA/dd
    mkdir -p "$d"
    fallocate -l "$VDI" "$d/disk.raw"
    qsd_start raw "$d/disk.raw" "$d/nbd.sock" "$d/qmp.sock" "$d/qsd.log"
    # read through ${n}_pid and ${n}_sock
    # shellcheck disable=SC2034
    dd_pid=$QSD_PID dd_sock=$d/nbd.sock
}
start_plx pa "$PA"
start_plx pb "$PB"
start_direct
for n in pa pb dd; do s=${n}_sock; fio_nbd "$SUITE_TMP/fill.json" "${!s}" v --rw=write --bs=1M --iodepth=8 --size="$VDI"; done
declare -A JOBARGS=(
    [4k-randread]="--rw=randread --bs=4k --iodepth=32"
    [4k-randwrite]="--rw=randwrite --bs=4k --iodepth=32"
    [1M-read]="--rw=read --bs=1M --iodepth=8"
    [1M-write]="--rw=write --bs=1M --iodepth=8"
)
cur=0
echo "uptime-start $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/load"
for d in $DEPTHS; do
    for n in pa pb; do
        c=${n}_ctl i=${n}_id s=${n}_sock
        $S grow --plx-ctl "${!c}" --vdi-id "${!i}" --nbd "${!s}" --export v --count $((d - cur)) \
            --write-kib "$GROW_KIB" --seed "$d" >"$OUT/grow-$n-$d.json"
    done
    cur=$d
    for job in $JOBS; do
        for ((rep = 1; rep <= REPS; rep++)); do
            order="pa pb dd"; ((rep % 2 == 0)) && order="pb pa dd"
            for n in $order; do
                p=${n}_pid s=${n}_sock
                read -r r0 s0 < <(devreads)
                # shellcheck disable=SC2086 # the job's fio options, split
                CPU_PID=${!p} fio_nbd "$OUT/$n-d$d-$job-r$rep.json" "${!s}" v ${JOBARGS[$job]} \
                    --size="$VDI" --runtime="$RUNTIME" --time_based
                # shellcheck disable=SC2034
                read -r r1 s1 < <(devreads)
                echo "$(( (s1 - s0) / 2048 )) MiB in $((r1 - r0)) device reads" >"$OUT/$n-d$d-$job-r$rep.dev"
            done
            [[ $job == 1M-read ]] && log "  dev: A $(cat "$OUT/pa-d$d-$job-r$rep.dev") B $(cat "$OUT/pb-d$d-$job-r$rep.dev") direct $(cat "$OUT/dd-d$d-$job-r$rep.dev")"
            log "depth $d $job #$rep: A $(fio_value "$OUT/pa-d$d-$job-r$rep.json" | cut -d. -f1) B $(fio_value "$OUT/pb-d$d-$job-r$rep.json" | cut -d. -f1) direct $(fio_value "$OUT/dd-d$d-$job-r$rep.json" | cut -d. -f1)  cpuA $(cat "$OUT/pa-d$d-$job-r$rep.cpu") cpuB $(cat "$OUT/pb-d$d-$job-r$rep.cpu")"
        done
    done
done
echo "uptime-end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/load"
cat "$OUT/load"
