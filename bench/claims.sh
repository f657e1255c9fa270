#!/bin/bash
# bench/claims.sh [--parallax PATH] [--pairs N] [--runtime S] [--dir DIR]: extent claims ahead
# against synchronous claims (PARALLAX_CLAIM_AHEAD=0), the same binary, in pairs back to back.
#
# Each run is the suite's busy latency setting, longer: a 1 GiB VDI on a 17 GiB store with
# 256 MiB extents, served by `parallax serve` on a unix socket; fio 4 KiB random writes at QD 32
# for S seconds while `parallax vdi-snapshot` takes a live snapshot every 0.2 s, so copy-on-write
# keeps taking new data extents. Prints fio's completion latency tail and the server's own
# account of its claims (PARALLAX_CLAIM_STATS): how many were taken from a spare, waited for or
# made synchronously, and how long requests waited in them. Outputs stay in a temporary
# directory that is removed at the end; nothing is written into the repository.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
P=$ROOT/build/parallax PAIRS=3 RUNTIME=40 BASE=/var/tmp
while [[ $# -gt 0 ]]; do
    case $1 in
    --parallax) P=$2 && shift ;;
    --pairs) PAIRS=$2 && shift ;;
    --runtime) RUNTIME=$2 && shift ;;
    --dir) BASE=$2 && shift ;;
    *) echo "usage: bench/claims.sh [--parallax PATH] [--pairs N] [--runtime S] [--dir DIR]" >&2
       exit 2 ;;
    esac
    shift
done
for t in fio jq; do command -v $t >/dev/null || { echo "claims.sh: needs $t" >&2; exit 2; }; done
[[ -x $P ]] || { echo "claims.sh: no $P (make all first)" >&2; exit 2; }

D=$(mktemp -d "$BASE/plx-claims.XXXXXX")
SPID="" FPID=""
cleanup() {
    [[ -n $FPID ]] && kill "$FPID" 2>/dev/null
    [[ -n $SPID ]] && kill "$SPID" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT INT TERM

# run AHEAD: one run with PARALLAX_CLAIM_AHEAD=AHEAD (0: synchronous claims only).
run() {
    local ahead=$1 n=0 i
    rm -rf "$D/run" && mkdir -p "$D/run"
    "$P" -b "$D/run/s.img" format --size 17G --extent-size 256M >/dev/null
    "$P" -b "$D/run/s.img" vdi-create v --size 1G >/dev/null
    PARALLAX_RUN_DIR=$D/run PARALLAX_CLAIM_AHEAD=$ahead PARALLAX_CLAIM_STATS=1 \
        "$P" -b "$D/run/s.img" serve --unix "$D/run/nbd.sock" >"$D/run/serve.log" 2>&1 &
    SPID=$!
    for i in $(seq 100); do [[ -S $D/run/nbd.sock ]] && break; sleep 0.1; done
    fio --name=busy --ioengine=nbd --uri="nbd+unix:///v?socket=$D/run/nbd.sock" --rw=randwrite \
        --bs=4k --iodepth=32 --size=1G --time_based --runtime="$RUNTIME" --output-format=json \
        >"$D/run/fio.out" 2>&1 &
    FPID=$!
    while kill -0 "$FPID" 2>/dev/null; do
        PARALLAX_RUN_DIR=$D/run "$P" -b "$D/run/s.img" vdi-snapshot v >/dev/null 2>&1 && n=$((n + 1))
        sleep 0.2
    done
    wait "$FPID" || true
    FPID=""
    kill -TERM "$SPID"
    wait "$SPID" || true
    SPID=""
    printf 'ahead=%s load %s: ' "$ahead" "$(cut -d' ' -f1 /proc/loadavg)"
    sed -n '/^{/,$p' "$D/run/fio.out" | jq -r --arg n "$n" '.jobs[0].write |
        "\($n) snapshots, \(.iops|floor) IOPS, clat ms p99 \(.clat_ns.percentile["99.000000"]/1e6)" +
        " p99.99 \(.clat_ns.percentile["99.990000"]/1e6) max \(.clat_ns.max/1e6|floor)"'
    grep -h "extent claims" "$D/run/serve.log" | sed 's/^/    /' || echo "    (no claim line)"
}

echo "claims.sh: $P, $PAIRS pairs of ${RUNTIME} s, $(nproc) CPUs"
for i in $(seq "$PAIRS"); do
    run 0
    run 1
done
