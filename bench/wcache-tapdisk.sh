#!/usr/bin/env bash
# The write cache through a real tapdisk (bench/README.md, "Write cache"; issue 14's targets
# against tapdisk's own aio driver, the guest's path on Xen 4.19+ with blktap3). bench/wcache.sh
# measures through `parallax serve`; here every disk is served by tapdisk over its NBD unix
# socket (/run/blktap-control/nbd<pid>.<minor>, what tapback connects to), so the baseline and
# the cache pay the same transport. The slow shared store is bench/wcache.sh's: a tgtd LUN whose
# tgtd is throttled (cgroup v1 blkio) to a fifth of what this host's disk writes; the write log
# is a file on the (unthrottled) local disk, sized to hold the burst twice (at least 1 GiB).
# Disks, one tapdisk each, open for the whole run:
#   aio     tapdisk's own aio driver on a file on the local disk, written through once
#           (`tap-ctl create -a aio:FILE`): the baseline;
#   cache   `parallax:durability=D:write-cache=LOG:write-cache-size=SIZE:wc-on`, a VDI of the
#           slow store with the cache on;
#   off     `parallax:durability=D:wc-off`, a VDI of the slow store without the cache;
# and, for context, fio directly on a file on the local disk (libaio, O_DIRECT).
# Like for like: tapdisk sends its drivers no flush, and aio: completes a write when its O_DIRECT
# write completes (in the disk's volatile cache, not flushed). D is `ordered` by default, the
# Parallax driver's mode with aio:'s contract (docs/tapdisk.md, "Durability of a completed
# write"); with the cache, an ordered write completes once its record is in the log file
# (through the page cache: it survives tapdisk, not the host, until the log is flushed, as an
# aio: write survives tapdisk but not a power failure until the disk flushes). --durability fua
# measures the driver's default instead (each cached write waits for a flush of the log).
# Each burst through tapdisk also shows the tapdisk's CPU time per MiB (all its threads,
# schedstat) and its minor page faults. The cache's burst also shows how much of it the log wrote without a copy (`cache status
# --json`: MiB written straight from tapdisk's buffers / MiB logged, and those records).
# Per round, in this order: the burst (one fio job writing BURST sequentially, 1 MiB at QD
# QD, default 768 MiB at QD 8: tapdisk's NBD server serves one connection at a time, and a
# second one wedged it, so bench/wcache.sh's 3 writers x 256 MiB are one stream here) on the
# local disk (with an fsync at the end), aio, cache (then waiting until the log has drained: `parallax cache status --json`
# through the driver's control socket) and off; then 4 KiB random writes at QD 1 for SECONDS on
# each (median and p99 completion latency), waiting for the drain after the cache's. Prints
# every round, and per comparison the ratio of the means and the median (min, max) of the
# per-round ratios.
#
#   bench/wcache-tapdisk.sh [--blktap PREFIX] [--dir DIR] [--burst SIZE] [--qd N]
#                           [--seconds N] [--slow MIB/S] [--rounds N] [--durability ordered|fua]
# PREFIX: where tapdisk/build-into-blktap.sh installed blktap (default $BLKTAP_PREFIX, else
# /var/tmp/blktap). Without tap-ctl and a tapdisk that has the parallax driver there, it prints
# "NOT RUN" and exits 77. Needs root (tgtd, cgroups, tap-ctl). Results:
# bench/results/wcache-tapdisk-HOST-STAMP.txt (not committed).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
source "$root/bench/lib/wcache.sh"
cd "$root"
blktap=${BLKTAP_PREFIX:-/var/tmp/blktap}
dir=/var/tmp qd=8 burst=768M seconds=2 slow_mibs="" rounds=5 durability=ordered
usage() {
    echo "usage: $0 [--blktap PREFIX] [--dir DIR] [--burst SIZE] [--qd N] [--seconds N] [--slow MIB/S] [--rounds N] [--durability ordered|fua]" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case $1 in
    --blktap) blktap=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --slow) slow_mibs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --durability) durability=$2; shift 2 ;;
    *) usage ;;
    esac
done
[[ $durability == ordered || $durability == fua ]] || usage
me=bench/wcache-tapdisk.sh
tapctl=$blktap/sbin/tap-ctl
tapdisk_bin=$(find "$blktap" -name tapdisk -type f -perm -u+x 2>/dev/null | head -1 || true)
if [[ ! -x $tapctl || -z $tapdisk_bin ]] || ! grep -qa 'Parallax VDI (parallax)' "$tapdisk_bin"; then
    echo "$me: NOT RUN: no blktap build with the parallax driver under $blktap" \
        "(tap-ctl and tapdisk; build one with tapdisk/build-into-blktap.sh BLKTAP_DIR $blktap," \
        "docs/tapdisk.md, or name it with --blktap / \$BLKTAP_PREFIX)" >&2
    exit 77
fi
[[ $(id -u) -eq 0 ]] || { echo "$me: tgtd, cgroups and tap-ctl need root" >&2; exit 1; }
[[ -d /sys/fs/cgroup/blkio ]] || { echo "$me: no cgroup v1 blkio controller" >&2; exit 1; }
make -s all
P=$root/build/parallax

export FIO_TIMEOUT=$((seconds + 120))
work=$(mktemp -d "$dir/plx-bench-wcache-tapdisk.XXXXXX")
cg=/sys/fs/cgroup/blkio/plx-wcache-tapdisk-$$
tgtd_pid="" tap_pids=() tap_minors=() tap_args=()
# tapdisk is not our child (tap-ctl spawns it): pause (a destroy with NBD requests in flight
# crashes tapdisk's NBD code), destroy, and kill by pid what is left.
tap_stop() { # PID MINOR ARGS
    timeout -s KILL 60 "$tapctl" pause -p "$1" -m "$2" >/dev/null 2>&1 || true
    timeout -s KILL 120 "$tapctl" destroy -p "$1" -m "$2" >/dev/null 2>&1 || true
    # tapdisk exits a moment after destroy returns (a zombie counts as gone: nothing here reaps
    # what tap-ctl spawned).
    local k
    for ((k = 0; k < 50; k++)); do
        [[ -e /proc/$1/stat && $(awk '{ print $3 }' "/proc/$1/stat") != Z ]] || return 0
        sleep 0.1
    done
    if [[ -e /proc/$1/stat && $(awk '{ print $3 }' "/proc/$1/stat") != Z ]]; then
        echo "$me: tapdisk $1 ($3) still there after pause and destroy: killed" >&2
        kill -9 "$1" 2>/dev/null || true
    fi
}
# (set -e holds in the trap too: every step may fail without ending it early.)
cleanup() {
    local i
    for ((i = 0; i < ${#tap_pids[@]}; i++)); do tap_stop "${tap_pids[i]}" "${tap_minors[i]}" "${tap_args[i]}"; done
    if [[ -n $tgtd_pid ]]; then kill -9 "$tgtd_pid" 2>/dev/null || true; wait "$tgtd_pid" 2>/dev/null || true; fi
    if [[ -d $cg ]]; then rmdir "$cg" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # the EXIT trap then stops what was started
# tapdisk inherits tap-ctl's environment: the driver's control socket goes here, where
# `parallax cache status` looks.
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR" /run/blktap-control

load_start=$(load)
burst_bytes=$(numfmt --from=iec "$burst")
total_mib=$((burst_bytes >> 20))
((total_mib >= 256)) || total_mib=256 # (the QD1 runs use the first 256 MiB of each disk)

# ---- the local disk: fio directly, and tapdisk's aio driver, each on a file written through once
dd if=/dev/zero of="$work/local.bin" bs=1M count="$total_mib" oflag=direct status=none
dd if=/dev/zero of="$work/aio.bin" bs=1M count="$total_mib" oflag=direct status=none
# (tapdisk's NBD server offers no flush: a completed write is as durable as the driver makes it)
local_burst() {
    fio_json --name=burst --filename="$work/local.bin" --rw=write --bs=1M --iodepth="$qd" \
        --ioengine=libaio --direct=1 --size="$burst" --end_fsync=1 | jq '.jobs[0].write.bw_bytes'
}
nbd_burst() { # URI
    fio_json --name=burst --ioengine=nbd --uri="$1" --rw=write --bs=1M --iodepth="$qd" \
        --size="$burst" | jq '.jobs[0].write.bw_bytes'
}
# QD1 runs print "MEDIAN_US P99_US" (completion latency).
qd1_us='.jobs[0].write.clat_ns.percentile | "\(.["50.000000"] / 1000) \(.["99.000000"] / 1000)"'
local_qd1() {
    fio_json --name=qd1 --filename="$work/local.bin" --size=256M --rw=randwrite --bs=4k \
        --iodepth=1 --ioengine=libaio --direct=1 --runtime="$seconds" --time_based | jq -r "$qd1_us"
}
nbd_qd1() { # URI
    fio_json --name=qd1 --ioengine=nbd --uri="$1" --size=256M --rw=randwrite --bs=4k \
        --iodepth=1 --runtime="$seconds" --time_based | jq -r "$qd1_us"
}
local_bw=$(local_burst) # sets the throttle; not one of the rounds
slow=$((local_bw / 5))
[[ -n $slow_mibs ]] && slow=$((slow_mibs << 20))

# ---- the slow shared store and its two VDIs --------------------------------------------------------
store_mib=$((2 * total_mib + 512))
log_mib=$((2 * total_mib))
((log_mib >= 1024)) || log_mib=1024
slow_store_start "$work" "$cg" "$slow" "$store_mib" iqn.2026-11.org.parallax.bench:wcache-tapdisk
"$P" -b "$url" format --size "${store_mib}M" >/dev/null
"$P" -b "$url" vdi-create wc-on --size "${total_mib}M" >/dev/null
"$P" -b "$url" vdi-create wc-off --size "${total_mib}M" >/dev/null
# The driver takes the blockstore from the environment: an iscsi:// URL has colons of its own.
export PARALLAX_BLOCKSTORE=$url

# ---- the three tapdisks ----------------------------------------------------------------------------
tap_create() { # ARGS -> sets td_uri; records pid and minor for the clean-up
    local out minor pid
    out=$(timeout -s KILL 120 "$tapctl" create -a "$1" 2>&1) || { echo "$me: tap-ctl create -a $1: $out" >&2; exit 1; }
    minor=${out##*tapdisk-}
    [[ $minor =~ ^[0-9]+$ ]] || { echo "$me: tap-ctl create -a $1 printed '$out'" >&2; exit 1; }
    pid=$(timeout -s KILL 30 "$tapctl" list -m "$minor" | sed -n 's/^pid=\([0-9]*\) .*/\1/p' | head -1)
    [[ -n $pid ]] || { echo "$me: no tapdisk pid for minor $minor" >&2; exit 1; }
    tap_pids+=("$pid") tap_minors+=("$minor") tap_args+=("$1")
    td_uri="nbd+unix:///?socket=/run/blktap-control/nbd$pid.$minor"
    [[ -S /run/blktap-control/nbd$pid.$minor ]] || { echo "$me: no NBD socket for tapdisk $pid" >&2; exit 1; }
}
tap_create "aio:$work/aio.bin"
aio_uri=$td_uri aio_pid=${tap_pids[-1]}
tap_create "parallax:durability=$durability:write-cache=$work/wlog:write-cache-size=${log_mib}M:wc-on"
on_uri=$td_uri on_pid=${tap_pids[-1]}
tap_create "parallax:durability=$durability:wc-off"
off_uri=$td_uri
sync # (the new log was written through the page cache: not into the first burst)

now() { date +%s.%N; }
# Until the log holds nothing (no backlog, no ring space in use); prints the seconds it took.
wait_drained() {
    local t0 i left
    t0=$(now)
    for ((i = 0; i < 6000; i++)); do
        left=$("$P" -b "$url" cache status --json 2>/dev/null |
            jq '[.[] | select(.vdi == "wc-on") | .backlog_bytes + .used_bytes] | add // -1')
        [[ $left == 0 ]] && break
        sleep 0.1
    done
    [[ $left == 0 ]] || { echo "$me: the log did not drain (cache status: $left bytes left)" >&2; exit 1; }
    echo "$(now) - $t0" | bc
}
wait_drained >/dev/null
# A tapdisk's CPU time (ns, all threads: schedstat) and minor page faults: "NS FAULTS".
td_cpu() {
    local ns flt
    ns=$(cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f", s }')
    flt=$(awk '{ print $10 }' /proc/"$1"/stat)
    echo "$ns $flt"
}
# A burst through tapdisk PID: its bytes/s, then the tapdisk's CPU ms per MiB and minor faults.
td_burst() { # URI PID -> "BYTES/S MS/MIB FAULTS"
    local c0 f0 c1 f1 bw
    read -r c0 f0 <<<"$(td_cpu "$2")"
    bw=$(nbd_burst "$1")
    read -r c1 f1 <<<"$(td_cpu "$2")"
    echo "$bw $(echo "scale=3; ($c1 - $c0) / 1000000 / ($burst_bytes / 1048576)" | bc) $((f1 - f0))"
}
# The log's counters since tapdisk attached it (API 1.6): "LOGGED_BYTES ZC_BYTES ZC_RECORDS".
log_counters() {
    "$P" -b "$url" cache status --json 2>/dev/null |
        jq -r '[.[] | select(.vdi == "wc-on")][0] // {} | "\(.logged_bytes // 0) \(.zc_bytes // 0) \(.zc_records // 0)"'
}

mkdir -p bench/results
base=bench/results/wcache-tapdisk-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown); blktap: $tapdisk_bin"
    echo "local disk: $((local_bw >> 20)) MiB/s for the burst (its first run, which set the throttle)"
    echo "shared store: tgtd LUN throttled to $((slow >> 20)) MiB/s of writes (cgroup v1 blkio, $majmin)"
    echo "disks: aio = tapdisk aio: on a local file; cache = tapdisk parallax:durability=$durability with write-cache ($log_mib MiB log on the local disk); off = tapdisk parallax:durability=$durability, no cache; local = fio libaio O_DIRECT on a local file"
    echo "burst: one stream of $burst (1 MiB, QD $qd); QD1: 4 KiB random writes for $seconds s; $rounds rounds"
} | tee "$base.txt"

lb=() ab=() cb=() ob=() drains=() zcs=() acpu=() ccpu=()
l50=() l99=() a50=() a99=() c50=() c99=() o50=() o99=() qdrains=()
for ((r = 1; r <= rounds; r++)); do
    lb+=("$(local_burst)")
    read -r bw cpu flt <<<"$(td_burst "$aio_uri" "$aio_pid")"
    ab+=("$bw") acpu+=("$cpu $flt")
    read -r l0 z0 n0 <<<"$(log_counters)"
    read -r bw cpu flt <<<"$(td_burst "$on_uri" "$on_pid")"
    cb+=("$bw") ccpu+=("$cpu $flt")
    read -r l1 z1 n1 <<<"$(log_counters)"
    zcs+=("$(((z1 - z0) >> 20))/$(((l1 - l0) >> 20)) MiB, $((n1 - n0)) records")
    drains+=("$(wait_drained)")
    ob+=("$(nbd_burst "$off_uri")")
    read -r m p <<<"$(local_qd1)"
    l50+=("$m") l99+=("$p")
    read -r m p <<<"$(nbd_qd1 "$aio_uri")"
    a50+=("$m") a99+=("$p")
    read -r m p <<<"$(nbd_qd1 "$on_uri")"
    c50+=("$m") c99+=("$p")
    qdrains+=("$(wait_drained)")
    read -r m p <<<"$(nbd_qd1 "$off_uri")"
    o50+=("$m") o99+=("$p")
    i=$((r - 1))
    mib() { echo "scale=0; $1 / 1048576" | bc; }
    printf 'round %d: burst MiB/s: local %s, aio %s, cache %s (no copy %s; drained %.1f s later), off %s; cache/aio %s, aio/local %s\n' \
        "$r" "$(mib "${lb[i]}")" "$(mib "${ab[i]}")" "$(mib "${cb[i]}")" "${zcs[i]}" "${drains[i]}" "$(mib "${ob[i]}")" \
        "$(ratio "${cb[i]}" "${ab[i]}")" "$(ratio "${ab[i]}" "${lb[i]}")" | tee -a "$base.txt"
    read -r ac af <<<"${acpu[i]}"
    read -r cc cf <<<"${ccpu[i]}"
    printf 'round %d: burst, tapdisk CPU ms per MiB (minor faults): aio %s (%s), cache %s (%s)\n' \
        "$r" "$ac" "$af" "$cc" "$cf" | tee -a "$base.txt"
    printf 'round %d: QD1 median (p99) us: local %.0f (%.0f), aio %.0f (%.0f), cache %.0f (%.0f) (drained %.1f s later), off %.0f (%.0f); cache/aio %s, aio/local %s\n' \
        "$r" "${l50[i]}" "${l99[i]}" "${a50[i]}" "${a99[i]}" "${c50[i]}" "${c99[i]}" "${qdrains[i]}" \
        "${o50[i]}" "${o99[i]}" "$(ratio "${c50[i]}" "${a50[i]}")" "$(ratio "${a50[i]}" "${l50[i]}")" |
        tee -a "$base.txt"
done
load_end=$(load)

mb() { echo "scale=1; $1 / 1048576" | bc; }
{
    printf 'burst, mean over %d rounds (MiB/s): local %s, aio %s, cache %s, off %s\n' "$rounds" \
        "$(mb "$(mean "${lb[@]}")")" "$(mb "$(mean "${ab[@]}")")" "$(mb "$(mean "${cb[@]}")")" "$(mb "$(mean "${ob[@]}")")"
    echo 'burst speed, paired by round:'
    pstat 'cache / aio' cb ab '>= 0.8'
    pstat 'cache / off' cb ob
    pstat 'cache / local (fio direct)' cb lb
    pstat 'aio / local (fio direct): the transport' ab lb
    printf '4 KiB QD1 write, mean over %d rounds of the median (p99) us: local %s (%s), aio %s (%s), cache %s (%s), off %s (%s)\n' \
        "$rounds" "$(mean "${l50[@]}")" "$(mean "${l99[@]}")" "$(mean "${a50[@]}")" "$(mean "${a99[@]}")" \
        "$(mean "${c50[@]}")" "$(mean "${c99[@]}")" "$(mean "${o50[@]}")" "$(mean "${o99[@]}")"
    echo '4 KiB QD1 write latency, paired by round:'
    pstat 'cache / aio, medians' c50 a50 '<= 1.2'
    pstat 'cache / aio, p99' c99 a99
    pstat 'cache / off, medians' c50 o50
    pstat 'cache / local (fio direct), medians' c50 l50
    pstat 'aio / local (fio direct), medians: the transport' a50 l50
    echo "load average (1, 5, 15 min): $load_start at the start, $load_end at the end"
    echo "the write log, the aio file and tgtd's LUN file are on the same disk ($majmin)"
} | tee -a "$base.txt"
echo "saved: $base.txt" >&2
