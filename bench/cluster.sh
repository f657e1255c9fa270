#!/usr/bin/env bash
# Many hosts on one iSCSI LUN (bench/README.md, "Cluster"). Starts tgtd on loopback (free ports,
# LUN on a sparse file under --dir) and parallax-lockd, formats the LUN with the lock manager
# set, then:
#   1. for 1, 2, 4 and 8 hosts: that many `parallax serve` processes, each its own host
#      (PARALLAX_HOST_ID hN, so its own iSCSI session, initiator name and reservation key) and
#      its own fresh VDI; fio's nbd engine drives all of them at once, 4 KiB random writes at
#      queue depth 32, then 1 MiB sequential writes at queue depth 8; the aggregate against
#      one host on the same LUN in the same run (target >= 0.9x: no lock on the data path);
#      The same 1 MiB load without Parallax is the baseline of what the target gives N
#      sessions: build/bench-lun-writers, N processes with their own iSCSI sessions writing
#      N sequential streams into their own regions of a second LUN of the same tgtd.
#      Then every host writes the first 32 MiB of its VDI again with fio's crc32c verification
#      and reads it back (each host's VDI verifies), and `parallax check` must be clean;
#   2. VDI handover latency between two hosts (build/bench-handover: from the source's close
#      to the destination's first completed write; target p50 < 50 ms).
# Results: bench/results/cluster-HOST-STAMP.txt (not committed) and bench/plots/cluster.png.
# --smoke (make check): 1 and 3 hosts, 1 s per run, 64 MiB VDIs, no handover, no plot, no
# results file; fails when a run, a verification or the check fails, judges no number.
#
#   bench/cluster.sh [--dir DIR] [--seconds N] [--hops N] [--size SIZE] [--hosts "1 2 4 8"]
#                    [--quick | --smoke] [--plot FILE]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
cd "$root"
dir=/var/tmp seconds=10 hops=100 size=512M plot=bench/plots/cluster.png hosts="1 2 4 8" smoke=
while [[ $# -gt 0 ]]; do
    case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --smoke) seconds=1 size=64M hosts="1 3" smoke=1; shift ;;
    --dir) dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --hops) hops=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    --quick) seconds=2 hops=10 size=64M; shift ;;
    *) echo "usage: $0 [--dir DIR] [--seconds N] [--hops N] [--size SIZE] [--hosts LIST] [--quick | --smoke] [--plot FILE]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/cluster.sh: tgtd needs root" >&2; exit 1; }
grep -qw nbd <<<"$(fio --enghelp 2>/dev/null)" || { echo "bench/cluster.sh: fio has no nbd engine" >&2; exit 1; }
make -s all build/bench-handover build/bench-lun-writers
PLX=$root/build/parallax

work=$(mktemp -d "$dir/plx-bench-cluster.XXXXXX")
pids=()
tgtd_pid=""
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ -n $tgtd_pid ]]; then
        kill -9 "$tgtd_pid" 2>/dev/null || true
        wait "$tgtd_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # the EXIT trap then stops what was started (an untrapped TERM would skip it)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

vdi_bytes=$(numfmt --from=iec "$size")
truncate -s $((vdi_bytes * 20 + (1 << 30))) "$work/lun.img"
max_hosts=$(tr ' ' '\n' <<<"$hosts" | sort -n | tail -1)
truncate -s $((vdi_bytes * max_hosts)) "$work/raw.img"
tgtd_start "$work/tgtd.log"
iqn=iqn.2026-11.org.parallax.bench:cluster
adm() { tgtadm -C "$ctl" --lld iscsi "$@"; }
adm --op new --mode target --tid 1 -T "$iqn"
adm --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img"
adm --op new --mode logicalunit --tid 1 --lun 2 -b "$work/raw.img"
adm --op bind --mode target --tid 1 -I ALL
url=iscsi://127.0.0.1:$port/$iqn/1
raw_url=iscsi://127.0.0.1:$port/$iqn/2

lport=$(free_port)
build/parallax-lockd --listen "127.0.0.1:$lport" >"$work/lockd.log" 2>&1 &
pids+=($!)
sleep 0.3
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR"
admin() { PARALLAX_HOST_ID=admin "$PLX" -b "$url" "$@"; }
admin format >/dev/null
admin lockd-set "127.0.0.1:$lport"

if [[ -n $smoke ]]; then
    base=$work/cluster-smoke
else
    mkdir -p bench/results "$(dirname "$plot")"
    base=bench/results/cluster-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
fi
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "target:  tgtd $(tgtd -V 2>/dev/null || true) on 127.0.0.1, LUN on a sparse file in $dir; $(nproc) cores"
    echo "hosts:   parallax serve processes with their own host ids, lockd on 127.0.0.1"
    echo "load:    fio nbd engine, one job per host on its own fresh $size VDI, $seconds s per run"
} | tee "$base.txt"

host_pids=()
start_hosts() { # N PREFIX: hosts h1..hN serving; VDIs PREFIX-1..PREFIX-N created fresh
    local i
    for ((i = 1; i <= $1; i++)); do admin vdi-create "$2-$i" --size "$size" >/dev/null; done
    host_pids=()
    for ((i = 1; i <= $1; i++)); do
        rm -f "$work/h$i.sock"
        PARALLAX_HOST_ID=h$i "$PLX" -b "$url" serve --unix "$work/h$i.sock" >"$work/h$i.log" 2>&1 &
        host_pids+=($!)
        pids+=($!)
    done
    for ((i = 1; i <= $1; i++)); do
        for ((t = 0; t < 100; t++)); do [[ -S $work/h$i.sock ]] && break; sleep 0.1; done
        [[ -S $work/h$i.sock ]] || { echo "host h$i did not start: $(cat "$work/h$i.log")" >&2; exit 1; }
    done
}
stop_hosts() {
    local p
    for p in "${host_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${host_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    host_pids=()
}
# run_fio N PREFIX RW BS DEPTH: aggregate "IOPS MiB/s" over the N hosts.
run_fio() {
    local args=() i
    for ((i = 1; i <= $1; i++)); do
        args+=(--name="h$i" --uri="nbd+unix:///$2-$i?socket=$work/h$i.sock")
    done
    fio --ioengine=nbd --rw="$3" --bs="$4" --iodepth="$5" --size="$size" --time_based \
        --runtime="$seconds" --group_reporting --output-format=json --output="$work/fio.json" \
        "${args[@]}" >"$work/fio.out" 2>&1 || { cat "$work/fio.out" >&2; exit 1; }
    sed -n '/^{/,$p' "$work/fio.json" >"$work/fio.clean.json"
    [[ $(jq '.jobs[0].error' "$work/fio.clean.json") == 0 ]] || { echo "fio reported an error" >&2; exit 1; }
    jq -r '"\(.jobs[0].write.iops | floor) \(.jobs[0].write.bw / 1024 | floor)"' "$work/fio.clean.json"
}

# verify_fio N PREFIX: every host writes the first 32 MiB (at most) of its VDI with crc32c
# verification headers and reads it back; fails on any mismatch.
verify_fio() {
    local args=() i vsize=$((vdi_bytes < (32 << 20) ? vdi_bytes : (32 << 20)))
    for ((i = 1; i <= $1; i++)); do
        args+=(--name="h$i" --uri="nbd+unix:///$2-$i?socket=$work/h$i.sock")
    done
    fio --ioengine=nbd --rw=write --bs=64k --iodepth=8 --size="$vsize" --verify=crc32c \
        --do_verify=1 --verify_fatal=1 --verify_state_save=0 --output-format=json --output="$work/verify.json" \
        "${args[@]}" >"$work/verify.out" 2>&1 || { cat "$work/verify.out" >&2; exit 1; }
    sed -n '/^{/,$p' "$work/verify.json" >"$work/verify.clean.json"
    [[ $(jq '[.jobs[].error] | add' "$work/verify.clean.json") == 0 ]] || { echo "fio verify reported an error" >&2; exit 1; }
    [[ $(jq '[.jobs[].read.io_bytes] | add' "$work/verify.clean.json") -ge $(($1 * vsize)) ]] ||
        { echo "fio verify read back less than it wrote" >&2; exit 1; }
}

# raw_writers N: aggregate MiB/s of N raw sessions, 1 MiB sequential writes at QD 8.
raw_writers() {
    build/bench-lun-writers "$raw_url" "$1" "$seconds" 0 "$vdi_bytes" 1024 8 2>>"$work/raw.log" ||
        { tail -5 "$work/raw.log" >&2; exit 1; }
}

printf "%-6s %12s %8s %14s %8s %12s %8s %10s\n" hosts randw-4k-IOPS ratio seqw-1M-MiB/s ratio \
    raw-1M-MiB/s ratio plx/raw | tee -a "$base.txt"
: >"$work/plot.dat"
for n in $hosts; do
    start_hosts "$n" "r$n"
    read -r iops _ < <(run_fio "$n" "r$n" randwrite 4k 32)
    read -r _ mibs < <(run_fio "$n" "r$n" write 1M 8)
    verify_fio "$n" "r$n"
    stop_hosts
    raw=$(raw_writers "$n")
    [[ -z ${iops1:-} ]] && { iops1=$iops; mibs1=$mibs; raw1=$raw; }
    ri=$(awk -v a="$iops" -v b="$iops1" 'BEGIN { printf "%.2f", a / b }')
    rm=$(awk -v a="$mibs" -v b="$mibs1" 'BEGIN { printf "%.2f", a / b }')
    rr=$(awk -v a="$raw" -v b="$raw1" 'BEGIN { printf "%.2f", a / b }')
    pr=$(awk -v a="$mibs" -v b="$raw" 'BEGIN { printf "%.2f", a / b }')
    printf "%-6s %12s %8s %14s %8s %12s %8s %10s\n" "$n" "$iops" "${ri}x" "$mibs" "${rm}x" \
        "$raw" "${rr}x" "${pr}x" | tee -a "$base.txt"
    echo "$n $iops $mibs $ri $rm $raw" >>"$work/plot.dat"
done
echo "verify:  every host's VDI read back what fio wrote (crc32c)" | tee -a "$base.txt"
# Where the hosts' data went: each allocates in extents of its own, so N hosts are N
# sequential streams into N regions, as the raw writers are.
echo "extents: $(admin info --json | jq -c '{extent_size_mib: (.extent_size / 1048576), extents}')" | tee -a "$base.txt"
admin check --quiet >"$work/check.out" 2>&1 || { echo "check after the cluster runs: $(cat "$work/check.out")" >&2; exit 1; }
echo "check:   clean after the cluster runs" | tee -a "$base.txt"
if [[ -n $smoke ]]; then
    exit 0
fi

# Handover latency between two hosts.
start_hosts 2 hand
admin vdi-create mover --size 64M >/dev/null
build/bench-handover "nbd+unix:///mover?socket=$work/h1.sock" "nbd+unix:///mover?socket=$work/h2.sock" \
    "$hops" >"$work/handover.out" || { tail -5 "$work/handover.out" >&2; exit 1; }
stop_hosts
tail -1 "$work/handover.out" | tee -a "$base.txt"
p50=$(awk '/^handover:/ { print $3 }' "$work/handover.out")

gnuplot <<GP
set terminal pngcairo size 1000,420 font "DejaVu Sans,10"
set output "$plot"
set multiplot layout 1,2 title "Hosts on one tgtd LUN (loopback, $(nproc) cores): aggregate of N hosts, each its own engine and VDI; handover p50 $p50 ms"
set xlabel "hosts"
set logscale x 2
set xtics (1, 2, 4, 8)
set xrange [0.8:10]
set grid ytics
set key bottom right
set yrange [0:*]
set ylabel "4 KiB random writes, IOPS (QD 32 per host)"
plot "$work/plot.dat" using 1:2 with linespoints lw 2 pt 7 title "aggregate", \
     "" using 1:(\$2 * 0 + $iops1 * 0.9) with lines dt 2 title "0.9 x one host"
set ylabel "1 MiB sequential writes, MiB/s (QD 8 per host)"
plot "$work/plot.dat" using 1:3 with linespoints lw 2 pt 7 title "aggregate", \
     "" using 1:6 with linespoints lw 2 pt 5 dt 3 title "raw sessions, no Parallax", \
     "" using 1:(\$3 * 0 + $mibs1 * 0.9) with lines dt 2 title "0.9 x one host"
unset multiplot
GP
echo "plot:    $plot" | tee -a "$base.txt"
echo "saved: $base.txt" >&2
