#!/usr/bin/env bash
# The write cache against a slow shared store (bench/README.md, "Write cache"; thesis §3.4.5 and
# figures 5.10/5.11). The shared store is a tgtd LUN whose tgtd is throttled with cgroup v1 blkio
# (write_bps_device) to a fifth of what this host's disk writes; `parallax serve` reaches it over
# iSCSI, and its write log is a file on the (unthrottled) local disk, sized to hold the burst
# twice (at least 1 GiB). Every burst below is the same: WRITERS fio jobs in one fio process,
# each writing BURST sequentially, 1 MiB at QD 8, fsync at the end (default 3 x 256 MiB: at
# 1.5 GiB/s the 3 x 64 MiB of the runs before 2026-11-27 lasted 0.13 s, and fio's start and a
# round's noise were as large as what was measured). In one run:
#   1. the local disk alone (fio, libaio, O_DIRECT): the burst (the WRITERS jobs on their own
#      regions of one file written through once, as the log is), the reference the issue's
#      targets name; 4 KiB random writes at QD 1. A first burst sets the store's throttle;
#   1b. the local disk over NBD: a file on it served by nbdkit's file plugin on a unix socket and
#      measured with the same fio nbd-engine jobs as the cache (the burst, and QD1 interleaved
#      with the cache's), so the ratio against it leaves out what the NBD transport costs (fio's
#      nbd engine, libnbd, the socket, a server's loop). nbdkit 1.32 cannot open O_DIRECT; its
#      cache=none writes through the page cache, starts each write's writeback at once
#      (sync_file_range) and evicts behind: the closest it has, and what the write log does too;
#   2. the second reference, what the serving path carries: `parallax serve` over a blockstore
#      that is a plain file on the local disk (no iSCSI, no cache), the same burst and QD1 runs;
#   3. the burst through serve with the cache off (each writer its own VDI over NBD);
#   4. the burst in PAIRS rounds of local disk, nbdkit, cache on, back to back (the local disk's
#      own speed moved by 1.6x from one round to the next on this VM): each cache-on burst
#      starts with the log drained (the target is for a burst that fits the log), and the first
#      one's time until the log has drained and the VDIs are closed is printed (the server
#      closes a departed client's VDI once drained; `cache status` lists it until then); the
#      drain waits while the writers write (docs/DESIGN.md, "The deferred drain": it starts once
#      no write has come for 50 ms, the log is half full or its oldest record is 2 s old, or
#      something waits for it), so the drain time counts from about the burst's end;
#   4b. 4 KiB random writes at QD 1 for SECONDS, cache off and on: mean latency; with the cache on,
#      PAIRS rounds interleaved with fio on the local disk and on the local disk over NBD (local,
#      nbdkit, cache on, local, ...), since the local disk's QD1 latency moves from run to run;
#      the log's use after each cache-on round is printed (a full log makes writers wait for the
#      drain: QD1 writes fill the ring twice as fast as their data, a header block each), and the
#      next round waits until the log has drained: 10 s rounds (the default until 2026-11-26)
#      filled the 1 GiB log in each, so most of each round measured the drain's pace;
#   5. the burst and the QD1 run again with the cache in its automatic mode
#      (--write-cache-mode auto, threshold AUTO_MS, default 20 ms): it starts off and turns on
#      once the store's write latency has stayed above the threshold for a second;
#   6. the engine without the NBD transport (build/bench-wcache-engine, bench/wcache-engine.c):
#      the burst's shape (WRITERS writers at QD 8, a flush at the end) with 4 KiB, 64 KiB and
#      1 MiB writes through the library with the cache on, against libaio + O_DIRECT on a file
#      on the local disk, and 4 KiB QD1 writes the same way, rounds alternating; at its earlier
#      sizes (64 MiB a writer, 3 rounds; --quick: the quick burst, 1 round), so that its numbers
#      compare with the runs before 2026-11-27 (not tried at 256 MiB a writer).
# Each target's comparison is printed as the ratio of the means over the rounds and as the median
# of the per-round ratios (each cache-on round against the local disk's round next to it), with
# their min and max: on this VM single rounds fall on both sides of a target, and the two
# statistics disagree when one round is far off.
# The load average is recorded at the start and the end. Results:
# bench/results/wcache-HOST-STAMP.txt and .dat (not committed); the figure (thesis figures
# 5.10/5.11: burst time with its drain, and QD1 latency, for the local disk, serve over a local
# file, and the cache off, on and automatic) goes to bench/plots/wcache.png (bench/wcache.gp).
#
#   bench/wcache.sh [--dir DIR] [--writers N] [--burst SIZE] [--seconds N] [--slow MIB/S]
#                   [--pairs N] [--auto-ms MS] [--log SIZE] [--store-cpu shared|idle] [--quick]
# (--slow: the shared store's write limit in MiB/s instead of a fifth of the local disk's;
# --store-cpu idle: tgtd at SCHED_IDLE, as if the shared store were another machine (default
# shared: tgtd competes for the two cores with fio and serve, as it does in every earlier run);
# --log: the write log's size instead of twice the burst (at least 1 GiB): a burst of more than
# half the log starts the drain while the writers still write (the deferred drain's half-full
# rule), so a log only a little larger than the burst measures a burst with the drain beside it;
# --pairs: rounds of QD1 runs and of bursts, local disk, over NBD and cache on, default 6. The
# whole run took 100 s on this 2-core VM with the defaults.)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
source "$root/bench/lib/wcache.sh"
cd "$root"
dir=/var/tmp writers=3 burst=256M seconds=2 slow_mibs="" pairs=6 auto_ms=20
engine_burst=64M engine_rounds=3 log_size="" store_cpu=shared
while [[ $# -gt 0 ]]; do
    case $1 in
    --slow) slow_mibs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --writers) writers=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --auto-ms) auto_ms=$2; shift 2 ;;
    --log) log_size=$2; shift 2 ;;
    --store-cpu) store_cpu=$2; shift 2 ;;
    --quick) writers=2 burst=16M seconds=3 pairs=1 engine_burst=16M engine_rounds=1; shift ;;
    *) echo "usage: $0 [--dir DIR] [--writers N] [--burst SIZE] [--seconds N] [--slow MIB/S] [--pairs N] [--auto-ms MS] [--log SIZE] [--store-cpu shared|idle] [--quick]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/wcache.sh: tgtd and cgroups need root" >&2; exit 1; }
[[ -d /sys/fs/cgroup/blkio ]] || { echo "bench/wcache.sh: no cgroup v1 blkio controller" >&2; exit 1; }
command -v nbdkit >/dev/null || { echo "bench/wcache.sh: needs nbdkit (make deps)" >&2; exit 1; }
make -s all build/bench-wcache-engine
P=$root/build/parallax

work=$(mktemp -d "$dir/plx-bench-wcache.XXXXXX")
cg=/sys/fs/cgroup/blkio/plx-wcache-$$
tgtd_pid="" srv_pid="" nbdkit_pid=""
# (set -e holds in the trap too: a killed process's wait status must not end it early, which
# left the work directory and the cgroup behind.)
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

load_start=$(load)
# ---- 1. the local disk ---------------------------------------------------------------------------
burst_bytes=$(numfmt --from=iec "$burst")
total=$((writers * burst_bytes))
total_mib=$((total >> 20))
((total_mib >= 256)) || total_mib=256 # (the QD1 runs use 256 MiB of each reference file)
# The burst on the local disk: the writers side by side in one file written through once (the
# log is too; an O_DIRECT write into a hole allocates), one fio process as for the cache.
dd if=/dev/zero of="$work/local.bin" bs=1M count="$total_mib" oflag=direct status=none
local_burst() {
    local w jobs=()
    for ((w = 1; w <= writers; w++)); do
        jobs+=(--name="w$w" --offset=$(((w - 1) * burst_bytes)))
    done
    fio_json --filename="$work/local.bin" --rw=write --bs=1M --iodepth=8 --ioengine=libaio \
        --direct=1 --size="$burst" --end_fsync=1 --group_reporting "${jobs[@]}" |
        jq '.jobs[0].write.bw_bytes'
}
local_bw=$(local_burst) # sets the throttle; not one of the rounds
local_qd1() {
    fio_json --name=qd1 --filename="$work/local.bin" --size=256M --rw=randwrite --bs=4k \
        --iodepth=1 --ioengine=libaio --direct=1 --runtime="$seconds" --time_based |
        jq -r "$qd1_us"
}
# ---- 1b. the local disk over NBD: nbdkit's file plugin on a unix socket ----------------------------
# Its own file on the same disk, written through once like the log (not sparse), big enough for
# the burst's writers side by side.
dd if=/dev/zero of="$work/nbd-local.bin" bs=1M count="$total_mib" oflag=direct status=none
nbdkit -f -U "$work/nbdkit.sock" file "$work/nbd-local.bin" cache=none >"$work/nbdkit.log" 2>&1 &
nbdkit_pid=$!
for ((i = 0; i < 100; i++)); do [[ -S $work/nbdkit.sock ]] && break; sleep 0.1; done
[[ -S $work/nbdkit.sock ]] || { echo "nbdkit did not start: $(cat "$work/nbdkit.log")" >&2; exit 1; }
nbdkit_uri="nbd+unix:///?socket=$work/nbdkit.sock"
nbdkit_qd1() {
    fio_json --name=lat --ioengine=nbd --uri="$nbdkit_uri" --rw=randwrite --bs=4k --iodepth=1 \
        --size=256M --runtime="$seconds" --time_based | jq -r "$qd1_us"
}
slow=$((local_bw / 5))
[[ -n $slow_mibs ]] && slow=$((slow_mibs << 20))

# ---- the slow shared store: tgtd in a throttled cgroup -------------------------------------------
# The store holds the burst's VDIs, the QD1 VDI and the engine's (each sized as its writes).
store_mib=$((2 * total_mib + 1024))
((store_mib >= 2048)) || store_mib=2048
# The log holds the burst twice over (its records' headers, the drain's lag), at least 1 GiB.
log_mib=$((2 * total_mib))
((log_mib >= 1024)) || log_mib=1024
[[ -z $log_size ]] || log_mib=$(($(numfmt --from=iec "$log_size") >> 20))
slow_store_start "$work" "$cg" "$slow" "$store_mib" iqn.2026-11.org.parallax.bench:wcache
case $store_cpu in
shared) ;;
idle) store_cpu_idle ;;
*) echo "bench/wcache.sh: --store-cpu shared|idle" >&2; exit 2 ;;
esac
"$P" -b "$url" format --size "${store_mib}M" >/dev/null
for ((w = 1; w <= writers; w++)); do "$P" -b "$url" vdi-create "w$w" --size "$burst" >/dev/null; done
"$P" -b "$url" vdi-create lat --size 256M >/dev/null
# The second reference: the same VDIs in a blockstore that is a plain file on the local disk.
"$P" -b "$work/file-store.img" format --size "${store_mib}M" >/dev/null
for ((w = 1; w <= writers; w++)); do "$P" -b "$work/file-store.img" vdi-create "w$w" --size "$burst" >/dev/null; done
"$P" -b "$work/file-store.img" vdi-create lat --size 256M >/dev/null

store=$url
start_server() { # [serve args...]
    rm -f "$work/nbd.sock"
    "$P" -b "$store" serve --unix "$work/nbd.sock" "$@" >"$work/serve.log" 2>&1 &
    srv_pid=$!
    for ((i = 0; i < 100; i++)); do [[ -S $work/nbd.sock ]] && return 0; sleep 0.1; done
    echo "server did not start: $(cat "$work/serve.log")" >&2
    exit 1
}
stop_server() {
    kill "$srv_pid"
    wait "$srv_pid" 2>/dev/null || true
    srv_pid=""
}
now() { date +%s.%N; }

# One fio process, a job per writer: its aggregate bandwidth (bytes over the longest job's run)
# compares with the local disk's, measured by fio the same way; the wall time also counts fio
# starting and connecting.
burst_run() { # -> "WALL_SECONDS FIO_BYTES_PER_S DRAIN_SECONDS"
    local t0 t1 t2 w i bw jobs=()
    for ((w = 1; w <= writers; w++)); do
        jobs+=(--name="w$w" --uri="nbd+unix:///w$w?socket=$work/nbd.sock")
    done
    t0=$(now)
    bw=$(fio_json --ioengine=nbd --rw=write --bs=1M --iodepth=8 --size="$burst" --end_fsync=1 \
        --group_reporting "${jobs[@]}" | jq '.jobs[0].write.bw_bytes')
    t1=$(now)
    # The clients have left: the server closes each VDI once the log has drained it; until then
    # `cache status` lists it.
    for ((i = 0; i < 3000; i++)); do
        [[ $("$P" -b "$store" cache status --json 2>/dev/null | jq length) == 0 ]] && break
        sleep 0.1
    done
    t2=$(now)
    echo "$(echo "$t1 - $t0" | bc) $bw $(echo "$t2 - $t1" | bc)"
}

# The same burst on the local disk over NBD: the writers side by side in nbdkit's one export.
nbdkit_burst() { # -> "WALL_SECONDS FIO_BYTES_PER_S"
    local t0 t1 w bw jobs=()
    for ((w = 1; w <= writers; w++)); do
        jobs+=(--name="w$w" --offset=$(((w - 1) * burst_bytes)))
    done
    t0=$(now)
    bw=$(fio_json --ioengine=nbd --uri="$nbdkit_uri" --rw=write --bs=1M --iodepth=8 \
        --size="$burst" --end_fsync=1 --group_reporting "${jobs[@]}" | jq '.jobs[0].write.bw_bytes')
    t1=$(now)
    echo "$(echo "$t1 - $t0" | bc) $bw"
}

# QD1 runs print "MEAN_US MEDIAN_US" (the median: completion latency, clat).
qd1_us='.jobs[0].write | "\(.lat_ns.mean / 1000) \(.clat_ns.percentile["50.000000"] / 1000)"'
lat_run() {
    fio_json --name=lat --ioengine=nbd --uri="nbd+unix:///lat?socket=$work/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth=1 --size=256M --runtime="$seconds" --time_based |
        jq -r "$qd1_us"
}

mkdir -p bench/results
base=bench/results/wcache-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "local disk: $((local_bw >> 20)) MiB/s for the burst (its first run, which set the throttle)"
    echo "local disk over NBD: nbdkit $(nbdkit --version | cut -d' ' -f2) file plugin, cache=none, unix socket"
    echo "shared store: tgtd LUN throttled to $((slow >> 20)) MiB/s of writes (cgroup v1 blkio, $majmin); tgtd's CPU: $store_cpu"
    echo "burst: $writers writers x $burst (1 MiB, QD 8, fsync at the end), write log $log_mib MiB; $pairs rounds; QD1: $pairs rounds of $seconds s"
} | tee "$base.txt"

# The second reference: the serving path over a plain file, no iSCSI, no cache.
store=$work/file-store.img
start_server
read -r file_s file_bw _ <<<"$(burst_run)"
read -r file_lat file_p50 <<<"$(lat_run)"
stop_server
store=$url
start_server
read -r off_s off_bw _ <<<"$(burst_run)"
read -r off_lat off_p50 <<<"$(lat_run)"
stop_server
start_server --write-cache "$work/wlog" --write-cache-size "${log_mib}M"
sync # (the new log was written through the page cache: not into the first burst)
# The burst in PAIRS rounds (local, nbdkit, cache on), back to back: each moves from run to run.
# Before the QD1 rounds, whose records can fill the log: burst_run waits for the drain after
# each burst, so each cache-on burst starts with an empty log (a burst that fits the log). The
# first round's wall times and drain are printed.
local_bws=() nbd_bws=() on_bws=()
for ((i = 0; i < pairs; i++)); do
    local_bws+=("$(local_burst)")
    read -r s b <<<"$(nbdkit_burst)"
    nbd_bws+=("$b")
    ((i == 0)) && nbd_s=$s
    read -r s b d <<<"$(burst_run)"
    on_bws+=("$b")
    ((i == 0)) && on_s=$s on_d=$d
done
# QD1 with the cache on, interleaved with the local disk's and nbdkit's: local, nbdkit, on, ...
# After each cache-on round, how full the log is (MiB used of the ring; a full log holds writers
# to the drain's pace).
on_lats=() local_lats=() on_p50s=() local_p50s=() nbd_lats=() nbd_p50s=() on_used=()
for ((i = 0; i < pairs; i++)); do
    read -r m p <<<"$(local_qd1)"
    local_lats+=("$m") local_p50s+=("$p")
    read -r m p <<<"$(nbdkit_qd1)"
    nbd_lats+=("$m") nbd_p50s+=("$p")
    read -r m p <<<"$(lat_run)"
    on_lats+=("$m") on_p50s+=("$p")
    on_used+=("$("$P" -b "$store" cache status --json 2>/dev/null | jq '[.[].used_bytes] | max // 0 | . / 1048576 | floor')")
    # The next round starts with the log drained (the server closes the departed client's VDI
    # once its records are in the store).
    for ((k = 0; k < 3000; k++)); do
        [[ $("$P" -b "$store" cache status --json 2>/dev/null | jq length) == 0 ]] && break
        sleep 0.1
    done
done
stop_server
# The automatic mode: a fresh log (the last one's writes are drained), the same burst and QD1.
rm -f "$work/wlog"
start_server --write-cache "$work/wlog" --write-cache-size "${log_mib}M" --write-cache-mode auto \
    --write-cache-threshold "$auto_ms"
sync
read -r auto_s auto_bw auto_d <<<"$(burst_run)"
read -r auto_lat auto_p50 <<<"$(lat_run)"
stop_server
# The engine without the transport: its own VDIs (created and deleted), log and local file.
engine_out=$("$root/build/bench-wcache-engine" --store "$store" --log "$work/wlog-engine" \
    --local "$work/local-engine.bin" --writers "$writers" --burst "$engine_burst" --rounds "$engine_rounds")
kill "$nbdkit_pid"
wait "$nbdkit_pid" 2>/dev/null || true
nbdkit_pid=""
rm -f "$work/local.bin" "$work/nbd-local.bin"
load_end=$(load)

mb() { echo "scale=1; $1 / 1048576" | bc; }
# (mean, ratio, paired and pstat: bench/lib/wcache.sh)
lm=$(mean "${local_lats[@]}") om=$(mean "${on_lats[@]}")
lp=$(mean "${local_p50s[@]}") op=$(mean "${on_p50s[@]}")
nm=$(mean "${nbd_lats[@]}") np=$(mean "${nbd_p50s[@]}")
# The burst: each configuration's mean over the rounds.
lbw=$(mean "${local_bws[@]}") nbw=$(mean "${nbd_bws[@]}") obw=$(mean "${on_bws[@]}")
{
    printf 'burst (fio aggregate; wall time with fio starting):\n'
    printf '  local disk over NBD (nbdkit file, cache=none), round 1: %s MiB/s (%.2f s)\n' \
        "$(mb "${nbd_bws[0]}")" "$nbd_s"
    printf '  parallax over a local file (no iSCSI, no cache): %s MiB/s (%.2f s)\n' \
        "$(mb "$file_bw")" "$file_s"
    printf '  cache off: %s MiB/s (%.2f s)\n' "$(mb "$off_bw")" "$off_s"
    printf '  cache on, round 1 (a fresh server): %s MiB/s (%.2f s), drained and closed %.2f s later\n' \
        "$(mb "${on_bws[0]}")" "$on_s" "$on_d"
    printf '  cache auto (on above %s ms): %s MiB/s (%.2f s), drained and closed %.2f s later\n' \
        "$auto_ms" "$(mb "$auto_bw")" "$auto_s" "$auto_d"
    for ((i = 0; i < pairs; i++)); do
        printf 'burst, round %d: local disk %s MiB/s, over NBD %s MiB/s, cache on %s MiB/s; on / local: %s; on / over NBD: %s\n' \
            $((i + 1)) "$(mb "${local_bws[i]}")" "$(mb "${nbd_bws[i]}")" "$(mb "${on_bws[i]}")" \
            "$(ratio "${on_bws[i]}" "${local_bws[i]}")" "$(ratio "${on_bws[i]}" "${nbd_bws[i]}")"
    done
    printf 'burst, over %d rounds: local disk %s MiB/s, over NBD %s MiB/s, cache on %s MiB/s\n' \
        "$pairs" "$(mb "$lbw")" "$(mb "$nbw")" "$(mb "$obw")"
    printf 'burst speed with the cache (the mean over the rounds) / parallax over a local file: %s; / cache off: %s\n' \
        "$(ratio "$obw" "$file_bw")" "$(ratio "$obw" "$off_bw")"
    echo 'burst speed with the cache, paired with the round next to it:'
    pstat 'cache on / local disk' on_bws local_bws '>= 0.8'
    pstat 'cache on / local disk over NBD' on_bws nbd_bws
    printf 'burst speed in the automatic mode / local disk: %s; / cache off: %s\n' \
        "$(ratio "$auto_bw" "$lbw")" "$(ratio "$auto_bw" "$off_bw")"
    printf '4 KiB QD1 write, mean (median), automatic mode: %.0f us (%.0f)\n' "$auto_lat" "$auto_p50"
    printf '4 KiB QD1 write, mean (median): cache off %.0f us (%.0f), parallax over a local file %.0f us (%.0f)\n' \
        "$off_lat" "$off_p50" "$file_lat" "$file_p50"
    for ((i = 0; i < pairs; i++)); do
        printf '4 KiB QD1 write, round %d, mean (median): local disk %.0f us (%.0f), over NBD %.0f us (%.0f), cache on %.0f us (%.0f), log then %s MiB used; on / local: %s (%s); on / over NBD: %s (%s)\n' \
            $((i + 1)) "${local_lats[i]}" "${local_p50s[i]}" "${nbd_lats[i]}" "${nbd_p50s[i]}" \
            "${on_lats[i]}" "${on_p50s[i]}" "${on_used[i]}" \
            "$(ratio "${on_lats[i]}" "${local_lats[i]}")" "$(ratio "${on_p50s[i]}" "${local_p50s[i]}")" \
            "$(ratio "${on_lats[i]}" "${nbd_lats[i]}")" "$(ratio "${on_p50s[i]}" "${nbd_p50s[i]}")"
    done
    printf '4 KiB QD1 write, over %d rounds: local disk %s us (median %s), over NBD %s us (median %s), cache on %s us (median %s)\n' \
        "$pairs" "$lm" "$lp" "$nm" "$np" "$om" "$op"
    echo '4 KiB QD1 write latency with the cache, paired with the round next to it:'
    pstat 'cache on / local disk, means' on_lats local_lats '<= 1.2'
    pstat 'cache on / local disk, medians' on_p50s local_p50s '<= 1.2'
    pstat 'cache on / local disk over NBD, means' on_lats nbd_lats
    pstat 'cache on / local disk over NBD, medians' on_p50s nbd_p50s
    echo "the engine alone (build/bench-wcache-engine, no NBD; local disk: libaio, O_DIRECT):"
    echo "$engine_out" | sed 's/^/  /'
    echo "load average (1, 5, 15 min): $load_start at the start, $load_end at the end"
    echo "the write log and tgtd's LUN file are on the same disk ($majmin)"
} | tee -a "$base.txt"
# The figure's data: one row per configuration: burst seconds (the whole burst at fio's
# aggregate bandwidth; local disk, over NBD and cache on: the mean over the rounds), drain
# seconds after it (the first cache-on burst's), QD1 mean and median (us).
secs() { echo "scale=3; $total / $1" | bc; }
{
    echo "# index name burst_s drain_s qd1_mean_us qd1_median_us"
    printf '0 "local disk" %s 0 %s %s\n' "$(secs "$lbw")" "$lm" "$lp"
    printf '1 "local disk over NBD" %s 0 %s %s\n' "$(secs "$nbw")" "$nm" "$np"
    printf '2 "serve, local file" %s 0 %s %s\n' "$(secs "$file_bw")" "$file_lat" "$file_p50"
    printf '3 "cache off" %s 0 %s %s\n' "$(secs "$off_bw")" "$off_lat" "$off_p50"
    printf '4 "cache on" %s %s %s %s\n' "$(secs "$obw")" "$on_d" "$om" "$op"
    printf '5 "cache auto" %s %s %s %s\n' "$(secs "$auto_bw")" "$auto_d" "$auto_lat" "$auto_p50"
} >"$base.dat"
if command -v gnuplot >/dev/null; then
    mkdir -p bench/plots
    gnuplot -e "dataf='$base.dat'; outf='bench/plots/wcache.png'; \
        ttl='$writers writers x $burst against a store throttled to $((slow >> 20)) MiB/s'" \
        bench/wcache.gp && echo "plot: bench/plots/wcache.png" >&2
fi
echo "saved: $base.txt" >&2
