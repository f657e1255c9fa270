#!/usr/bin/env bash
# The write cache against a slow shared store (bench/README.md, "Write cache"; thesis §3.4.5 and
# figures 5.10/5.11). The shared store is a tgtd LUN whose tgtd is throttled with cgroup v1 blkio
# (write_bps_device) to a fifth of what this host's disk writes; `parallax serve` reaches it over
# iSCSI, and its write log is a file on the (unthrottled) local disk. In one run:
#   1. the local disk alone (fio, O_DIRECT): 1 MiB sequential writes at QD 8, 4 KiB random writes
#      at QD 1: the reference;
#   2. a burst: WRITERS fio clients (NBD) each write BURST to their own VDI, 1 MiB at QD 8, and
#      fsync at the end, with the cache off and on; the burst's completion time, and with the
#      cache on the time until the log has drained (the server closes the VDIs, which drains);
#   3. 4 KiB random writes at QD 1 for SECONDS, cache off and on: mean latency.
# Results: bench/results/wcache-HOST-STAMP.txt (not committed).
#
#   bench/wcache.sh [--dir DIR] [--writers N] [--burst SIZE] [--seconds N] [--slow MIB/S] [--quick]
# (--slow: the shared store's write limit in MiB/s instead of a fifth of the local disk's.)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=/var/tmp writers=3 burst=64M seconds=10 slow_mibs=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --slow) slow_mibs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --writers) writers=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --quick) writers=2 burst=16M seconds=3; shift ;;
    *) echo "usage: $0 [--dir DIR] [--writers N] [--burst SIZE] [--seconds N] [--quick]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/wcache.sh: tgtd and cgroups need root" >&2; exit 1; }
[[ -d /sys/fs/cgroup/blkio ]] || { echo "bench/wcache.sh: no cgroup v1 blkio controller" >&2; exit 1; }
make -s all
P=$root/build/parallax

work=$(mktemp -d "$dir/plx-bench-wcache.XXXXXX")
cg=/sys/fs/cgroup/blkio/plx-wcache-$$
tgtd_pid="" srv_pid=""
cleanup() {
    [[ -n $srv_pid ]] && kill -9 "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null
    [[ -n $tgtd_pid ]] && kill -9 "$tgtd_pid" 2>/dev/null && wait "$tgtd_pid" 2>/dev/null
    [[ -d $cg ]] && rmdir "$cg" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR"

fio_json() { fio --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'; } # (the nbd engine says hello first)
# ---- 1. the local disk ---------------------------------------------------------------------------
local_bw=$(fio_json --name=seq --filename="$work/local.bin" --size=256M --rw=write --bs=1M \
    --iodepth=8 --ioengine=libaio --direct=1 | jq '.jobs[0].write.bw_bytes')
local_lat=$(fio_json --name=qd1 --filename="$work/local.bin" --size=256M --rw=randwrite --bs=4k \
    --iodepth=1 --ioengine=libaio --direct=1 --runtime="$seconds" --time_based |
    jq '.jobs[0].write.lat_ns.mean / 1000')
rm -f "$work/local.bin"
slow=$((local_bw / 5))
[[ -n $slow_mibs ]] && slow=$((slow_mibs << 20))

# ---- the slow shared store: tgtd in a throttled cgroup -------------------------------------------
majmin=$(lsblk -dno MAJ:MIN "$(findmnt -no SOURCE -T "$work" | sed 's/[0-9]*$//;s/p$//')" | tr -d ' ')
mkdir "$cg"
echo "$majmin $slow" >"$cg/blkio.throttle.write_bps_device"
truncate -s 2G "$work/lun.img"
for try in 1 2 3 4 5; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    ctl=$((20000 + RANDOM % 12000))
    tgtd -f -C "$ctl" --iscsi portal="127.0.0.1:$port" >"$work/tgtd.log" 2>&1 &
    tgtd_pid=$!
    for ((i = 0; i < 50; i++)); do
        tgtadm -C "$ctl" --op show --mode sys >/dev/null 2>&1 && break
        sleep 0.1
    done
    kill -0 "$tgtd_pid" 2>/dev/null && break
    tgtd_pid=""
done
[[ -n $tgtd_pid ]] || { echo "tgtd did not start: $(tail -3 "$work/tgtd.log")" >&2; exit 1; }
echo "$tgtd_pid" >"$cg/cgroup.procs"
iqn=iqn.2026-11.org.parallax.bench:wcache
adm() { tgtadm -C "$ctl" --lld iscsi "$@"; }
adm --op new --mode target --tid 1 -T "$iqn"
# O_DIRECT in tgtd: buffered writes would reach the disk from the kernel's flusher, outside the
# throttled group.
adm --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img" --bsoflags direct
adm --op bind --mode target --tid 1 -I ALL
url=iscsi://127.0.0.1:$port/$iqn/1
"$P" -b "$url" format --size 2G >/dev/null
for ((w = 1; w <= writers; w++)); do "$P" -b "$url" vdi-create "w$w" --size "$burst" >/dev/null; done
"$P" -b "$url" vdi-create lat --size 256M >/dev/null

start_server() { # [serve args...]
    "$P" -b "$url" serve --unix "$work/nbd.sock" "$@" >"$work/serve.log" 2>&1 &
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

burst_run() { # MODE -> "SECONDS DRAIN_SECONDS"
    local t0 t1 t2 pids=() w
    t0=$(now)
    for ((w = 1; w <= writers; w++)); do
        fio --name="w$w" --ioengine=nbd --uri="nbd+unix:///w$w?socket=$work/nbd.sock" \
            --rw=write --bs=1M --iodepth=8 --size="$burst" --end_fsync=1 >/dev/null 2>&1 &
        pids+=($!)
    done
    sleep 2
    "$P" -b "$url" cache status --json >"$work/mid-status.json" 2>&1 || true
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$(now)
    # The clients have left: the server closes the VDIs, which drains them; a read answers once
    # it is done (one engine thread).
    qemu-io -f raw -c "read 0 4k" "nbd+unix:///w1?socket=$work/nbd.sock" >/dev/null
    t2=$(now)
    echo "$(echo "$t1 - $t0" | bc) $(echo "$t2 - $t1" | bc)"
}

lat_run() {
    fio_json --name=lat --ioengine=nbd --uri="nbd+unix:///lat?socket=$work/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth=1 --size=256M --runtime="$seconds" --time_based |
        jq '.jobs[0].write.lat_ns.mean / 1000'
}

mkdir -p bench/results
base=bench/results/wcache-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
total=$(($(numfmt --from=iec "$burst") * writers))
{
    echo "source:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "local disk: $((local_bw >> 20)) MiB/s sequential (1 MiB, QD 8), 4 KiB QD1 write $(printf %.0f "$local_lat") us"
    echo "shared store: tgtd LUN throttled to $((slow >> 20)) MiB/s of writes (cgroup v1 blkio, $majmin)"
    echo "burst: $writers writers x $burst (1 MiB, QD 8, fsync at the end); QD1: $seconds s"
} | tee "$base.txt"

start_server
read -r off_s off_d <<<"$(burst_run)"
off_lat=$(lat_run)
stop_server
start_server --write-cache "$work/wlog" --write-cache-size 1G
read -r on_s on_d <<<"$(burst_run)"
echo "status 2 s into the burst: $(jq -c '[.[] | {vdi, mode, used_bytes, backlog_bytes}]' "$work/mid-status.json" 2>/dev/null || cat "$work/mid-status.json")" | tee -a "$base.txt"
on_lat=$(lat_run)
stop_server

mb() { echo "scale=1; $total / $1 / 1048576" | bc; }
{
    printf 'burst, cache off: %6.2f s (%s MiB/s)\n' "$off_s" "$(mb "$off_s")"
    printf 'burst, cache on:  %6.2f s (%s MiB/s), drained %.2f s later\n' "$on_s" "$(mb "$on_s")" "$on_d"
    printf 'burst speed with the cache / local disk: %s (target >= 0.8)\n' \
        "$(echo "scale=2; $total / $on_s / $local_bw" | bc)"
    printf 'burst time, cache off / cache on: %s\n' "$(echo "scale=2; $off_s / $on_s" | bc)"
    printf '4 KiB QD1 write: cache off %.0f us, cache on %.0f us, local disk %.0f us; on / local: %s (target <= 1.2)\n' \
        "$off_lat" "$on_lat" "$local_lat" "$(echo "scale=2; $on_lat / $local_lat" | bc)"
} | tee -a "$base.txt"
echo "saved: $base.txt" >&2
