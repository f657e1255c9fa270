#!/usr/bin/env bash
# Parallax on an iSCSI LUN against the same LUN without Parallax, in one run (bench/README.md,
# "iSCSI backend"). Starts tgtd on loopback (free ports, LUN on a sparse file under --dir), then:
#   1. libiscsi's own iscsi-perf reads the raw LUN: 4 KiB random at queue depth 32, 1 MiB
#      sequential at queue depth 8 (the outside reference; iscsi-perf only reads);
#   2. build/bench-iscsi: the four workloads (1 MiB sequential write and read at QD 8, 4 KiB
#      random read and write at QD 32) on a raw region of the LUN through the iSCSI backend and
#      on a VDI through the engine, alternating, medians of --rounds rounds, and the ratio.
# Results: bench/results/iscsi-HOST-STAMP.{txt,json} (not committed).
#
#   bench/iscsi.sh [--dir DIR] [--seconds N] [--size SIZE] [--rounds N] [--quick]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
cd "$root"
dir=/var/tmp seconds=5 size=1G rounds=3
while [[ $# -gt 0 ]]; do
    case $1 in
    --dir) dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --quick) seconds=1 size=128M rounds=1; shift ;;
    *) echo "usage: $0 [--dir DIR] [--seconds N] [--size SIZE] [--quick]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/iscsi.sh: tgtd needs root" >&2; exit 1; }
make -s build/bench-iscsi

work=$(mktemp -d "$dir/plx-bench-iscsi.XXXXXX")
tgtd_pid=""
cleanup() {
    [[ -n $tgtd_pid ]] && kill -9 "$tgtd_pid" 2>/dev/null && wait "$tgtd_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # the EXIT trap then stops what was started (an untrapped TERM would skip it)

# The LUN is three times SIZE: a blockstore of 2 x SIZE (the VDI, metadata, extents) and a raw
# region of SIZE.
lun_bytes=$(numfmt --from=iec "$size")
truncate -s $((lun_bytes * 3)) "$work/lun.img"
tgtd_start "$work/tgtd.log"
iqn=iqn.2026-11.org.parallax.bench:lun
adm() { tgtadm -C "$ctl" --lld iscsi "$@"; }
adm --op new --mode target --tid 1 -T "$iqn"
adm --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img"
adm --op bind --mode target --tid 1 -I ALL
url=iscsi://127.0.0.1:$port/$iqn/1

mkdir -p bench/results
base=bench/results/iscsi-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "target:  tgtd $(tgtd -V 2>/dev/null || true) on 127.0.0.1, LUN on a sparse file in $dir"
    echo "size:    $size VDI and raw region, $seconds s per workload, $rounds rounds"
} | tee "$base.txt"

# iscsi-perf: the last "iops average N (M MB/s)" of a run of the given seconds.
perf() {
    local out
    out=$(timeout -s INT "$seconds" iscsi-perf "$@" "$url" 2>&1 || true)
    grep -o 'iops average [0-9]* ([0-9]* MB/s)' <<<"$out" | tail -1
}
# Reads of a sparse LUN measure tgt's hole path: give every block real data first.
dd if=/dev/zero of="$work/lun.img" bs=1M count=$((lun_bytes * 3 >> 20)) conv=notrunc status=none
echo "iscsi-perf randread-4k-qd32: $(perf -m 32 -b 8 -r)" | tee -a "$base.txt"
echo "iscsi-perf seqread-1m-qd8:   $(perf -m 8 -b 2048)" | tee -a "$base.txt"
build/bench-iscsi "$url" --seconds "$seconds" --size "$size" --rounds "$rounds" \
    --json "$base.json" 2>&1 | tee -a "$base.txt"
echo "saved: $base.txt $base.json" >&2
