#!/usr/bin/env bash
# The write cache through `parallax serve` and NBD, two builds side by side (bench/README.md,
# "Write cache"): the setup of bench/wcache.sh (a tgtd LUN throttled to a fifth of the local
# disk's speed as the shared store, the log a file on the local disk, nbdkit serving a file on
# the same disk as the reference over NBD), then PAIRS rounds of, per block size:
#   a burst (WRITERS fio jobs x BURST, QD 8, fsync at the end) on the local disk (fio, libaio,
#   O_DIRECT), over NBD from nbdkit, and through serve with the cache on for build A and build B
#   (the order of A and B alternates by round; each burst starts with the log drained); serve's
#   CPU time (all its threads, /proc/PID/task/*/schedstat) per MiB of the burst, and how much of
#   the burst the log wrote without a copy (MiB of records written straight from the server's
#   buffers / MiB logged, and those records: `cache status --json`, 0/0 from a server before
#   API 1.6);
#   4 KiB random writes at QD 1 for SECONDS on each of the four: median, mean, p99, p99.9, max. After each
#   cache-on run the script waits until the log has drained (the server closes a departed
#   client's VDI once drained): a QD1 run of 10 s fills a 1 GiB ring (two blocks a write), and
#   writers then wait for the drain, which is not what the target is about.
# Prints each run and the ratios of the means: cache / local disk, cache / nbdkit, B / A.
# --seconds 0 leaves the QD1 runs out.
#
#   bench/wcache-ab.sh --a DIR [--b DIR] [--dir DIR] [--writers N] [--burst SIZE] [--bs LIST]
#                      [--seconds N] [--slow MIB/S] [--pairs N]
# DIR: a build directory holding `parallax` (A: the old build; B: default build/ of this tree).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
source "$root/bench/lib/wcache.sh" # (fio_json, load, slow_store_start; mean and ratio are its own)
dir=/var/tmp writers=3 burst=32M seconds=2 slow_mibs="" pairs=3 bss="4k 64k 1M" a="" b=$root/build
while [[ $# -gt 0 ]]; do
    case $1 in
    --a) a=$(cd "$2" && pwd); shift 2 ;;
    --b) b=$(cd "$2" && pwd); shift 2 ;;
    --slow) slow_mibs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --writers) writers=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --bs) bss=${2//,/ }; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    *) echo "usage: $0 --a DIR [--b DIR] [--dir DIR] [--writers N] [--burst SIZE] [--bs LIST] [--seconds N] [--slow MIB/S] [--pairs N]" >&2; exit 2 ;;
    esac
done
[[ -n $a && -x $a/parallax && -x $b/parallax ]] || { echo "bench/wcache-ab.sh: --a DIR (and --b DIR) must hold a built parallax" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "bench/wcache-ab.sh: tgtd and cgroups need root" >&2; exit 1; }
[[ -d /sys/fs/cgroup/blkio ]] || { echo "bench/wcache-ab.sh: no cgroup v1 blkio controller" >&2; exit 1; }

work=$(mktemp -d "$dir/plx-bench-wcache-ab.XXXXXX")
cg=/sys/fs/cgroup/blkio/plx-wcache-ab-$$
tgtd_pid="" srv_pid="" nbdkit_pid=""
cleanup() {
    if [[ -n $srv_pid ]]; then kill -9 "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; fi
    if [[ -n $nbdkit_pid ]]; then kill -9 "$nbdkit_pid" 2>/dev/null || true; wait "$nbdkit_pid" 2>/dev/null || true; fi
    if [[ -n $tgtd_pid ]]; then kill -9 "$tgtd_pid" 2>/dev/null || true; wait "$tgtd_pid" 2>/dev/null || true; fi
    if [[ -d $cg ]]; then rmdir "$cg" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # the EXIT trap then stops what was started (an untrapped TERM would skip it)
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR"
P=$b/parallax

load_start=$(load)
bytes=$(numfmt --from=iec "$burst")

# ---- references: the local disk (fio, O_DIRECT) and nbdkit over NBD on a file of the same disk
local_burst() { # BS -> bytes/s
    local w jobs=()
    for ((w = 1; w <= writers; w++)); do jobs+=(--name="w$w" --offset=$(((w - 1) * bytes))); done
    fio_json --filename="$work/local.bin" --rw=write --bs="$1" --iodepth=8 --ioengine=libaio \
        --direct=1 --size="$burst" --end_fsync=1 --group_reporting "${jobs[@]}" |
        jq '.jobs[0].write.bw_bytes'
}
# QD1 completion latency, us: "p50 mean p99 p99.9 max" (the mean and the tail show the drain's
# work beside the writer, which the median hides: bench/notes/wcache.md, "QD1 tail with the drain").
qd1_lat='.jobs[0].write.clat_ns | "\(.percentile["50.000000"] / 1000) \(.mean / 1000 | floor) \(.percentile["99.000000"] / 1000) \(.percentile["99.900000"] / 1000) \(.max / 1000 | floor)"'
local_qd1() {
    fio_json --name=qd1 --filename="$work/local.bin" --size=256M --rw=randwrite --bs=4k \
        --iodepth=1 --ioengine=libaio --direct=1 --runtime="$seconds" --time_based | jq -r "$qd1_lat"
}
local_mib=$(((bytes * writers >> 20) > 256 ? (bytes * writers >> 20) : 256))
dd if=/dev/zero of="$work/local.bin" bs=1M count="$local_mib" oflag=direct status=none
dd if=/dev/zero of="$work/nbd-local.bin" bs=1M count="$local_mib" oflag=direct status=none
nbdkit -f -U "$work/nbdkit.sock" file "$work/nbd-local.bin" cache=none >"$work/nbdkit.log" 2>&1 &
nbdkit_pid=$!
for ((i = 0; i < 100; i++)); do [[ -S $work/nbdkit.sock ]] && break; sleep 0.1; done
[[ -S $work/nbdkit.sock ]] || { echo "nbdkit did not start: $(cat "$work/nbdkit.log")" >&2; exit 1; }
nbdkit_uri="nbd+unix:///?socket=$work/nbdkit.sock"
nbdkit_burst() { # BS -> bytes/s
    local w jobs=()
    for ((w = 1; w <= writers; w++)); do jobs+=(--name="w$w" --offset=$(((w - 1) * bytes))); done
    fio_json --ioengine=nbd --uri="$nbdkit_uri" --rw=write --bs="$1" --iodepth=8 --size="$burst" \
        --end_fsync=1 --group_reporting "${jobs[@]}" | jq '.jobs[0].write.bw_bytes'
}
nbdkit_qd1() {
    fio_json --name=lat --ioengine=nbd --uri="$nbdkit_uri" --rw=randwrite --bs=4k --iodepth=1 \
        --size=256M --runtime="$seconds" --time_based | jq -r "$qd1_lat"
}
local_bw=$(local_burst 1M)
slow=$((local_bw / 5))
[[ -n $slow_mibs ]] && slow=$((slow_mibs << 20))

# ---- the shared store: tgtd in a throttled cgroup (as bench/wcache.sh) ---------------------------
slow_store_start "$work" "$cg" "$slow" 2048 iqn.2026-11.org.parallax.bench:wcache-ab
store=$url
"$P" -b "$store" format --size 2G >/dev/null
for ((w = 1; w <= writers; w++)); do "$P" -b "$store" vdi-create "w$w" --size "$burst" >/dev/null; done
"$P" -b "$store" vdi-create lat --size 256M >/dev/null

start_server() { # BUILD_DIR LOG
    rm -f "$work/nbd.sock"
    "$1/parallax" -b "$store" serve --unix "$work/nbd.sock" --write-cache "$2" \
        --write-cache-size 1G >"$work/serve.log" 2>&1 &
    srv_pid=$!
    zc_seen="0 0 0" # (a new server: its log's counters start at 0)
    for ((i = 0; i < 300; i++)); do [[ -S $work/nbd.sock ]] && return 0; sleep 0.1; done
    echo "server did not start: $(cat "$work/serve.log")" >&2
    exit 1
}
stop_server() {
    kill "$srv_pid"
    wait "$srv_pid" 2>/dev/null || true
    srv_pid=""
}
# CPU time of all the server's threads, ns (schedstat: the scheduler's run time, not ticks).
cpu_ns() { cat /proc/"$srv_pid"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f", s }'; }
# Until the server has closed every VDI (the log drained them): at most 120 s.
wait_drained() {
    for ((i = 0; i < 1200; i++)); do
        [[ $("$P" -b "$store" cache status --json 2>/dev/null | jq length) == 0 ]] && return 0
        sleep 0.1
    done
    echo "the log did not drain in 120 s" >&2
}
# The log's counters since the server attached it (`cache status --json`, API 1.6; 0 from an
# older server): "LOGGED_BYTES ZC_BYTES ZC_RECORDS", read while the burst's VDIs are still open
# (the drain has not finished yet; a server closes a drained client's VDI).
zc_seen="0 0 0"
log_counters() {
    "$P" -b "$store" cache status --json 2>/dev/null |
        jq -r '[.[] | select(.log != null)][0] // {} | "\(.logged_bytes // 0) \(.zc_bytes // 0) \(.zc_records // 0)"'
}
cache_burst() { # BS -> "bytes/s ms-CPU-per-MiB ZC" (ZC: MiB without a copy/MiB logged/records)
    local w jobs=() c0 c1 bw l0 z0 r0 l1 z1 r1
    for ((w = 1; w <= writers; w++)); do jobs+=(--name="w$w" --uri="nbd+unix:///w$w?socket=$work/nbd.sock"); done
    c0=$(cpu_ns)
    bw=$(fio_json --ioengine=nbd --rw=write --bs="$1" --iodepth=8 --size="$burst" --end_fsync=1 \
        --group_reporting "${jobs[@]}" | jq '.jobs[0].write.bw_bytes')
    c1=$(cpu_ns)
    read -r l0 z0 r0 <<<"$zc_seen"
    read -r l1 z1 r1 <<<"$(log_counters)"
    [[ -n $l1 && $l1 -ge $l0 ]] || l1=$l0 z1=$z0 r1=$r0
    zc_seen="$l1 $z1 $r1"
    wait_drained
    echo "$bw $(echo "scale=3; ($c1 - $c0) / 1000000 / ($writers * $bytes / 1048576)" | bc)" \
        "$(((z1 - z0) >> 20))/$(((l1 - l0) >> 20))/$((r1 - r0))"
}
cache_qd1() {
    local p
    p=$(fio_json --name=lat --ioengine=nbd --uri="nbd+unix:///lat?socket=$work/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth=1 --size=256M --runtime="$seconds" --time_based | jq -r "$qd1_lat")
    wait_drained
    echo "$p"
}

# Each build's log made once before the rounds (creating one writes all of it, which must not
# overlap a measurement), and written back.
for which in A B; do
    d=$a
    [[ $which == B ]] && d=$b
    start_server "$d" "$work/wlog-$which"
    stop_server
done
sync

mib() { echo "scale=0; $1 / 1048576" | bc; }
echo "A: $a ($(git -C "$a/.." rev-parse --short HEAD 2>/dev/null || echo '?'))  B: $b ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "local disk $((local_bw >> 20)) MiB/s (1 MiB, QD 8); shared store: tgtd LUN throttled to $((slow >> 20)) MiB/s; burst $writers x $burst QD 8; QD1 $seconds s"
declare -A L N CA CB UA UB ZA ZB
for ((r = 1; r <= pairs; r++)); do
    for bs in $bss; do
        L[$r,$bs]=$(local_burst "$bs")
        N[$r,$bs]=$(nbdkit_burst "$bs")
    done
    if ((seconds > 0)); then
        L[$r,qd1]=$(local_qd1)
        N[$r,qd1]=$(nbdkit_qd1)
    fi
    order="A B"
    ((r % 2 == 0)) && order="B A"
    for which in $order; do
        d=$a
        [[ $which == B ]] && d=$b
        start_server "$d" "$work/wlog-$which"
        for bs in $bss; do
            read -r bw cpu zc <<<"$(cache_burst "$bs")"
            if [[ $which == A ]]; then CA[$r,$bs]=$bw UA[$r,$bs]=$cpu ZA[$r,$bs]=$zc; else CB[$r,$bs]=$bw UB[$r,$bs]=$cpu ZB[$r,$bs]=$zc; fi
        done
        if ((seconds > 0)); then
            p=$(cache_qd1)
            if [[ $which == A ]]; then CA[$r,qd1]=$p; else CB[$r,qd1]=$p; fi
        fi
        stop_server
    done
    for bs in $bss; do
        printf 'round %d, burst bs %s: local %s MiB/s, nbdkit %s, A %s (%s ms CPU/MiB; no copy/logged MiB/records %s), B %s (%s ms CPU/MiB; %s)\n' "$r" "$bs" \
            "$(mib "${L[$r,$bs]}")" "$(mib "${N[$r,$bs]}")" "$(mib "${CA[$r,$bs]}")" "${UA[$r,$bs]}" \
            "${ZA[$r,$bs]}" "$(mib "${CB[$r,$bs]}")" "${UB[$r,$bs]}" "${ZB[$r,$bs]}"
    done
    ((seconds > 0)) && printf 'round %d, 4 KiB QD1 p50/mean/p99/p99.9/max: local %s us, nbdkit %s, A %s, B %s\n' "$r" \
        "${L[$r,qd1]// //}" "${N[$r,qd1]// //}" "${CA[$r,qd1]// //}" "${CB[$r,qd1]// //}"
done
mean() { # ARRAY-NAME KEY [FIELD]: of the values' FIELD-th word (default 1)
    local -n arr=$1
    local s=0 i v
    for ((i = 1; i <= pairs; i++)); do
        v=$(awk -v f="${3:-1}" '{ print $f }' <<<"${arr[$i,$2]}")
        s=$(echo "$s + $v" | bc)
    done
    echo "scale=3; $s / $pairs" | bc
}
ratio() { echo "scale=2; $1 / $2" | bc; }
for bs in $bss; do
    l=$(mean L "$bs") n=$(mean N "$bs") ca=$(mean CA "$bs") cb=$(mean CB "$bs")
    printf 'burst bs %s, mean of %d: local %s MiB/s, nbdkit %s, A %s (%s ms CPU/MiB), B %s (%s ms CPU/MiB); A/local %s, B/local %s; A/nbdkit %s, B/nbdkit %s; B/A %s\n' \
        "$bs" "$pairs" "$(mib "$l")" "$(mib "$n")" "$(mib "$ca")" "$(mean UA "$bs")" "$(mib "$cb")" \
        "$(mean UB "$bs")" "$(ratio "$ca" "$l")" "$(ratio "$cb" "$l")" "$(ratio "$ca" "$n")" \
        "$(ratio "$cb" "$n")" "$(ratio "$cb" "$ca")"
done
((seconds > 0)) || { echo "load average (1, 5, 15 min): $load_start at the start, $(load) at the end"; exit 0; }
f=1
for what in median mean p99 p99.9 max; do
    l=$(mean L qd1 $f) n=$(mean N qd1 $f) ca=$(mean CA qd1 $f) cb=$(mean CB qd1 $f)
    printf '4 KiB QD1 %s, mean of %d: local %s us, nbdkit %s, A %s, B %s; A/local %s, B/local %s; A/nbdkit %s, B/nbdkit %s; B/A %s\n' \
        "$what" "$pairs" "$l" "$n" "$ca" "$cb" "$(ratio "$ca" "$l")" "$(ratio "$cb" "$l")" \
        "$(ratio "$ca" "$n")" "$(ratio "$cb" "$n")" "$(ratio "$cb" "$ca")"
    f=$((f + 1))
done
echo "load average (1, 5, 15 min): $load_start at the start, $(load) at the end"
