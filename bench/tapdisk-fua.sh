#!/usr/bin/env bash
# durability=fua through a real tapdisk against tapdisk's own aio: driver (bench/README.md, "FUA
# writes and tapdisk"; issue 31 item 4: fua at least 0.8x of aio:). Every disk is served by its
# own tapdisk over its NBD unix socket (/run/blktap-control/nbd<pid>.<minor>), where fio's nbd
# engine writes 4 KiB at random at QD 32 (tapdisk's NBD server keeps at most 8 of them in flight
# per client, NBD_SERVER_NUM_REQS, where Xen's ring to tapdisk holds 32 requests: --nbd-reqs N
# starts every tapdisk with TAPDISK_NBD_REQS=N, which a blktap built with that local change, see
# bench/notes/fua-tapdisk.md, takes for the limit; a second NBD connection to one tapdisk is no
# way round it: blktap's NBD server then spins on EBADF). Disks, one tapdisk each, open for the
# whole run:
#   aio      `aio:FILE`, a raw file on the local disk written through once: the baseline (a write
#            completes when its O_DIRECT write does, not flushed);
#   fua      `parallax:durability=fua:STORE:fua`, a VDI of a file blockstore on the same disk,
#            written through once (no snapshot: every write overwrites in place);
#   ordered  `parallax:durability=ordered:STORE:ordered`, another VDI of that store, the same;
#   base     with --base-lib DIR: `parallax:durability=fua` again, on a third VDI, with the
#            libparallax.so.1 in DIR (LD_LIBRARY_PATH: tapdisk's RUNPATH gives way to it), e.g. a
#            build of main, to compare the engine before and after a change in the same run;
#            --base-env VAR=VALUE (repeatable) sets that tapdisk's environment, e.g.
#            PARALLAX_IOPRIO=0, with or without --base-lib (then this tree's library).
# The other tapdisks load build/libparallax.so.1 of this tree (so a rebuild needs no reinstall), or
# that of --lib DIR (a copy, so that the tree can be rebuilt while the run waits for its lock).
# Per round every disk runs once, in an order rotated each round, for SECONDS: IOPS, mean and p99
# completion latency, and the tapdisk's flushes per write: its fdatasync calls (perf stat on the
# syscall tracepoint while fio runs), which is how the file backend flushes, for a flush and for
# the FUA of a FUA write alike, by default (with $PARALLAX_IOPRIO=0 it uses aio FDSYNC and
# RWF_DSYNC instead, which this does not count), and the flushes the disk under --dir completed
# per write over the run (its /sys/dev/block stat counter: every process on that disk counts, and
# the kernel's own flushes for RWF_DSYNC writes too, which the fdatasync count misses). Prints
# every round (with the tapdisk's CPU time per write: user + system, all its threads, from /proc)
# and, per comparison with aio:, the ratio of the means and the median (min, max) of
# the per-round ratios.
#
#   bench/tapdisk-fua.sh [--blktap PREFIX] [--dir DIR] [--size SIZE] [--seconds N] [--rounds N]
#                        [--qd N] [--nbd-reqs N] [--lib DIR] [--base-lib DIR]
#                        [--base-env VAR=VALUE]...
# PREFIX: where tapdisk/build-into-blktap.sh installed blktap (default $BLKTAP_PREFIX, else
# /var/tmp/blktap). Without tap-ctl and a tapdisk that has the parallax driver there, it prints
# "NOT RUN" and exits 77. Needs root (tap-ctl, perf). Not part of `make check`. Results:
# bench/results/tapdisk-fua-HOST-STAMP.txt (not committed).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# (bench/lib/wcache.sh needs no tgtd for what is used here: fio_json, load, mean, ratio, pstat)
# shellcheck source=bench/lib/wcache.sh
source "$root/bench/lib/wcache.sh"
cd "$root"
blktap=${BLKTAP_PREFIX:-/var/tmp/blktap}
dir=/var/tmp size=1G seconds=10 rounds=3 qd=32 nbd_reqs="" lib="" base_lib="" with_base=0 base_env=()
usage() {
    echo "usage: $0 [--blktap PREFIX] [--dir DIR] [--size SIZE] [--seconds N] [--rounds N] [--qd N] [--nbd-reqs N] [--lib DIR] [--base-lib DIR] [--base-env VAR=VALUE]..." >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case $1 in
    --blktap) blktap=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --nbd-reqs) nbd_reqs=$2; shift 2 ;;
    --lib) lib=$(cd "$2" && pwd); shift 2 ;;
    --base-lib) base_lib=$(cd "$2" && pwd) with_base=1; shift 2 ;;
    --base-env) base_env+=("$2") with_base=1; shift 2 ;;
    *) usage ;;
    esac
done
me=bench/tapdisk-fua.sh
tapctl=$blktap/sbin/tap-ctl
tapdisk_bin=$(find "$blktap" -name tapdisk -type f -perm -u+x 2>/dev/null | head -1 || true)
if [[ ! -x $tapctl || -z $tapdisk_bin ]] || ! grep -qa 'Parallax VDI (parallax)' "$tapdisk_bin"; then
    echo "$me: NOT RUN: no blktap build with the parallax driver under $blktap" \
        "(tap-ctl and tapdisk; build one with tapdisk/build-into-blktap.sh BLKTAP_DIR $blktap," \
        "docs/tapdisk.md, or name it with --blktap / \$BLKTAP_PREFIX)" >&2
    exit 77
fi
[[ $(id -u) -eq 0 ]] || { echo "$me: tap-ctl and perf need root" >&2; exit 1; }
[[ -z $lib || -f $lib/libparallax.so.1 ]] || { echo "$me: no libparallax.so.1 in $lib" >&2; exit 1; }
[[ -z $base_lib || -f $base_lib/libparallax.so.1 ]] || { echo "$me: no libparallax.so.1 in $base_lib" >&2; exit 1; }
command -v perf >/dev/null || { echo "$me: needs perf (linux-perf) to count the flushes" >&2; exit 1; }
make -s all
P=$root/build/parallax
lib=${lib:-$root/build}

export FIO_TIMEOUT=$((seconds + 120))
work=$(mktemp -d "$dir/plx-bench-tapdisk-fua.XXXXXX")
tap_pids=() tap_minors=()
# tapdisk is not our child (tap-ctl spawns it): pause (a destroy with NBD requests in flight
# crashes tapdisk's NBD code), destroy, and kill by pid what is left.
tap_stop() { # PID MINOR
    timeout -s KILL 60 "$tapctl" pause -p "$1" -m "$2" >/dev/null 2>&1 || true
    timeout -s KILL 120 "$tapctl" destroy -p "$1" -m "$2" >/dev/null 2>&1 || true
    local k
    for ((k = 0; k < 50; k++)); do
        [[ -e /proc/$1/stat && $(awk '{ print $3 }' "/proc/$1/stat") != Z ]] || return 0
        sleep 0.1
    done
    echo "$me: tapdisk $1 still there after pause and destroy: killed" >&2
    kill -9 "$1" 2>/dev/null || true
}
cleanup() {
    local i
    for ((i = 0; i < ${#tap_pids[@]}; i++)); do tap_stop "${tap_pids[i]}" "${tap_minors[i]}"; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR" /run/blktap-control

load_start=$(load)
bytes=$(numfmt --from=iec "$size")
mib=$((bytes >> 20))
# The data every disk is written through with once (no zero block: vdi-import keeps those sparse).
head -c "$bytes" /dev/urandom >"$work/fill.bin"
cp "$work/fill.bin" "$work/aio.bin"
sync
store=$work/store.img
vdis=(fua ordered)
((with_base)) && vdis+=(base)
"$P" -b "$store" format --size "$((mib * ${#vdis[@]} + 512))M" >/dev/null
for v in "${vdis[@]}"; do
    "$P" -b "$store" vdi-create "$v" --size "${mib}M" >/dev/null
    "$P" -b "$store" vdi-import "$v" "$work/fill.bin" --quiet
done
rm -f "$work/fill.bin"
sync

tap_create() { # LIBDIR ARGS [VAR=VALUE...] -> sets td_uri, td_pid
    local out minor pid lib=$1 args=$2
    shift 2
    out=$(env LD_LIBRARY_PATH="$lib" ${nbd_reqs:+TAPDISK_NBD_REQS=$nbd_reqs} "$@" timeout -s KILL 120 "$tapctl" create -a "$args" 2>&1) ||
        { echo "$me: tap-ctl create -a $2: $out" >&2; exit 1; }
    minor=${out##*tapdisk-}
    [[ $minor =~ ^[0-9]+$ ]] || { echo "$me: tap-ctl create -a $2 printed '$out'" >&2; exit 1; }
    pid=$(timeout -s KILL 30 "$tapctl" list -m "$minor" | sed -n 's/^pid=\([0-9]*\) .*/\1/p' | head -1)
    [[ -n $pid ]] || { echo "$me: no tapdisk pid for minor $minor" >&2; exit 1; }
    tap_pids+=("$pid") tap_minors+=("$minor")
    td_uri="nbd+unix:///?socket=/run/blktap-control/nbd$pid.$minor" td_pid=$pid
    [[ -S /run/blktap-control/nbd$pid.$minor ]] || { echo "$me: no NBD socket for tapdisk $pid" >&2; exit 1; }
    # The library it really loaded.
    grep -o '/[^ ]*libparallax[^ ]*' "/proc/$pid/maps" | head -1 >"$work/lib.$pid" || true
}
names=(aio fua ordered) uris=() pids=()
tap_create "" "aio:$work/aio.bin"
uris+=("$td_uri") pids+=("$td_pid")
tap_create "$lib" "parallax:durability=fua:$store:fua"
uris+=("$td_uri") pids+=("$td_pid")
tap_create "$lib" "parallax:durability=ordered:$store:ordered"
uris+=("$td_uri") pids+=("$td_pid")
if ((with_base)); then
    tap_create "${base_lib:-$lib}" "parallax:durability=fua:$store:base" "${base_env[@]}"
    names+=(base) uris+=("$td_uri") pids+=("$td_pid")
fi

# The flushes the disk holding $work completed (field 16 of its stat, Linux 5.5+).
devstat=/sys/dev/block/$(mountpoint -d "$(df --output=target "$work" | tail -1)")/stat
[[ -r $devstat ]] || devstat=/dev/null
dev_flushes() { awk '{ print $16 + 0 }' "$devstat"; }
# The CPU time a tapdisk used so far, all its threads, in clock ticks (utime + stime).
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# One run on disk I: "IOPS MEAN_US P99_US FLUSHES_PER_WRITE DEVICE_FLUSHES_PER_WRITE CPU_US_PER_WRITE".
run() {
    local i=$1 out=$work/perf.$1 j writes flushes d0 d1 c0 c1
    perf stat -x, -e syscalls:sys_enter_fdatasync -e context-switches -e raw_syscalls:sys_enter \
        -e syscalls:sys_enter_io_submit -e syscalls:sys_enter_io_getevents -p "${pids[i]}" -o "$out" &
    local perf_pid=$!
    # System-wide: the kernel's direct-I/O completion work items (an RWF_DSYNC write's flush runs
    # in one), aio fsync work items, and every context switch (other processes count too).
    perf stat -a -x, -e workqueue:workqueue_queue_work --filter 'workqueue ~ "dio*"' \
        -e workqueue:workqueue_execute_start -e sched:sched_switch -o "$out.sys" &
    local perf_sys=$!
    sleep 0.2
    d0=$(dev_flushes) c0=$(cpu_ticks "${pids[i]}")
    j=$(fio_json --name=fua --ioengine=nbd --uri="${uris[i]}" --size="$size" --rw=randwrite \
        --bs=4k --iodepth="$qd" --runtime="$seconds" --time_based --norandommap --randrepeat=0)
    d1=$(dev_flushes) c1=$(cpu_ticks "${pids[i]}")
    kill -INT "$perf_pid" "$perf_sys"
    wait "$perf_pid" || true
    wait "$perf_sys" || true
    writes=$(jq '.jobs[0].write.total_ios' <<<"$j")
    flushes=$(awk -F, '/fdatasync/ { print $1 }' "$out")
    # Per write: the tapdisk's context switches, system calls, io_submit and io_getevents calls;
    # system-wide dio completion work items, work items run, context switches.
    awk -F, -v w="$writes" -v name="${names[i]}" '
        /context-switches/ { cs = $1 } /raw_syscalls/ { sc = $1 } /io_submit/ { sub_ = $1 }
        /io_getevents/ { ge = $1 }
        END { printf "%s: tapdisk per write: %.2f context switches, %.2f syscalls, %.2f io_submit, %.2f io_getevents;", name, cs / w, sc / w, sub_ / w, ge / w }' "$out" >>"$work/detail"
    awk -F, -v w="$writes" '
        /workqueue_queue_work/ { dio = $1 } /workqueue_execute_start/ { wq = $1 } /sched_switch/ { sw = $1 }
        END { printf " system per write: %.2f dio work, %.2f work items, %.2f context switches\n", dio / w, wq / w, sw / w }' "$out.sys" >>"$work/detail"
    [[ $flushes =~ ^[0-9]+$ ]] || flushes=0
    jq -r --arg f "$flushes" --arg w "$writes" --arg d "$((d1 - d0))" --arg c "$((c1 - c0))" --arg hz "$hz" \
        '.jobs[0].write | "\(.iops) \(.clat_ns.mean / 1000) \(.clat_ns.percentile["99.000000"] / 1000) \(($f | tonumber) / ($w | tonumber)) \(($d | tonumber) / ($w | tonumber)) \(($c | tonumber) * 1000000 / ($hz | tonumber) / ($w | tonumber))"' <<<"$j"
}

mkdir -p bench/results
base=bench/results/tapdisk-fua-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (modified)'); blktap: $tapdisk_bin"
    for ((i = 0; i < ${#names[@]}; i++)); do
        echo "disk ${names[i]}: tapdisk ${pids[i]}, library $(cat "$work/lib.${pids[i]}" 2>/dev/null || echo -)$([[ ${names[i]} == base && ${#base_env[@]} -gt 0 ]] && echo ", environment ${base_env[*]}")"
    done
    echo "4 KiB random writes at QD $qd through tapdisk's NBD socket (fio nbd; requests in flight per client: ${nbd_reqs:-8, NBD_SERVER_NUM_REQS}), $seconds s per run, $rounds rounds, disks of $size written through once"
} | tee "$base.txt"

declare -A iops lat p99 fpw dfpw cpw
n=${#names[@]}
for ((r = 1; r <= rounds; r++)); do
    line="round $r:"
    for ((k = 0; k < n; k++)); do
        i=$(((k + r - 1) % n)) # the order rotates each round
        read -r a b c d e f <<<"$(run "$i")"
        iops[$i,$r]=$a lat[$i,$r]=$b p99[$i,$r]=$c fpw[$i,$r]=$d dfpw[$i,$r]=$e cpw[$i,$r]=$f
    done
    for ((i = 0; i < n; i++)); do
        line+=$(printf ' %s %.0f IOPS (%.2fx aio, mean %.0f us, p99 %.0f us, fdatasync/write %.3f, device flushes/write %.3f, tapdisk CPU us/write %.1f);' \
            "${names[i]}" "${iops[$i,$r]}" "$(ratio "${iops[$i,$r]}" "${iops[0,$r]}")" "${lat[$i,$r]}" \
            "${p99[$i,$r]}" "${fpw[$i,$r]}" "${dfpw[$i,$r]}" "${cpw[$i,$r]}")
    done
    echo "$line" | tee -a "$base.txt"
    sed 's/^/  /' "$work/detail" | tee -a "$base.txt"
    rm -f "$work/detail"
done
load_end=$(load)
col() { # I -> that disk's IOPS per round, one a line
    local r
    for ((r = 1; r <= rounds; r++)); do echo "${iops[$1,$r]}"; done
}
# shellcheck disable=SC2034 # (read through pstat's namerefs)
{
    mapfile -t c0 < <(col 0)
    mapfile -t c1 < <(col 1)
    mapfile -t c2 < <(col 2)
    ((with_base)) && mapfile -t c3 < <(col 3)
    for ((i = 0; i < n; i++)); do
        printf '%s: mean %s IOPS; fdatasync/write by round: %s; device flushes/write by round: %s\n' \
            "${names[i]}" "$(mapfile -t cc < <(col "$i"); mean "${cc[@]}")" \
            "$(for ((r = 1; r <= rounds; r++)); do printf '%.3f ' "${fpw[$i,$r]}"; done)" \
            "$(for ((r = 1; r <= rounds; r++)); do printf '%.3f ' "${dfpw[$i,$r]}"; done)"
    done
    echo 'paired by round:'
    pstat 'fua / aio' c1 c0 '>= 0.8'
    pstat 'ordered / aio' c2 c0
    ((with_base)) && pstat 'fua / base' c1 c3
    ((with_base)) && pstat 'base / aio' c3 c0
    echo "load average (1, 5, 15 min): $load_start at the start, $load_end at the end"
} | tee -a "$base.txt"
echo "saved: $base.txt" >&2
