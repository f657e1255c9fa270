#!/usr/bin/env bash
# The crash harness and the gc tests, round after round, on a machine kept busy by CPU hogs: a
# test suite that flakes under load fails here.
#
#   tests/stress-loop.sh [ROUNDS] [-- BINARY...]
#
# Starts STRESS_HOGS busy loops (default two per CPU: a load of about 8 on two cores, on top of
# whatever else runs), then runs tests/run-unit.sh on the binaries ROUNDS times (default 10),
# stopping at the first round that fails. The default binaries are make check's crash-harness
# shards (PLX_CRASH_RUNS=first, three shards) and test_gc, plain and sanitized; build them first
# (make build/unit/test_crash build/unit/test_gc build/unit-san/test_gc). Each round's output
# goes to build/test-logs/stress/round-N.log; a line per round says how it ended, how long it
# took and the load average at its end. The hogs are stopped by their pids when the loop ends.
# Exit 0 when every round passed.
set -u
cd "$(dirname "$0")/.."

rounds=10
if [[ $# -gt 0 && $1 != -- ]]; then
    rounds=$1
    shift
fi
[[ ${1:-} == -- ]] && shift
if [[ $# -eq 0 ]]; then
    set -- "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=0/3 build/unit/test_crash" \
        "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=1/3 build/unit/test_crash" \
        "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=2/3 build/unit/test_crash" \
        build/unit-san/test_gc build/unit/test_gc
fi
for b in "$@"; do
    exe=${b##* }
    [[ -x $exe ]] || { echo "stress-loop: $exe not built" >&2; exit 2; }
done

hogs=${STRESS_HOGS:-$((2 * $(nproc 2>/dev/null || echo 1)))}
hog_pids=()
stop_hogs() {
    for p in ${hog_pids[@]+"${hog_pids[@]}"}; do
        kill "$p" 2>/dev/null
    done
    for p in ${hog_pids[@]+"${hog_pids[@]}"}; do
        wait "$p" 2>/dev/null
    done
    hog_pids=()
}
trap stop_hogs EXIT
trap 'exit 1' INT TERM
for ((i = 0; i < hogs; i++)); do
    sh -c 'while :; do :; done' &
    hog_pids+=($!)
done

log_dir=build/test-logs/stress
mkdir -p "$log_dir"
echo "stress-loop: $rounds rounds of: $*"
echo "stress-loop: $hogs CPU hogs (pids ${hog_pids[*]}) beside them"
for ((r = 1; r <= rounds; r++)); do
    start=$(date +%s)
    tests/run-unit.sh "$@" >"$log_dir/round-$r.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    load=$(cut -d' ' -f1 /proc/loadavg)
    totals=$(grep '^unit: [0-9]* passed' "$log_dir/round-$r.log")
    if [[ $rc -ne 0 ]]; then
        echo "round $r of $rounds: FAILED (exit $rc, ${secs} s, load $load; ${totals:-no totals}; log $log_dir/round-$r.log)"
        grep -E "no Check summary|check_pack|check_msg|check_run|:[EF]:" "$log_dir/round-$r.log" | head -n 20
        echo "stress-loop: $((r - 1)) rounds passed in a row before round $r failed"
        exit 1
    fi
    echo "round $r of $rounds: passed (${secs} s, load $load; $totals)"
done
echo "stress-loop: all $rounds rounds passed"
