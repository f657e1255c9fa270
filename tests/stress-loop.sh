#!/usr/bin/env bash
# The crash harness and the gc tests, round after round, on a machine kept busy by CPU hogs: a
# test suite that flakes under load fails here.
#
#   tests/stress-loop.sh [ROUNDS] [-- BINARY...]
#
# Starts STRESS_HOGS busy loops (default two per CPU: a load of about 8 on two cores, on top of
# whatever else runs), then runs tests/run-unit.sh on the binaries ROUNDS times (default 10),
# stopping at the first round that fails. The default binaries are make check's crash-harness
# shards (PLX_CRASH_RUNS=first, three shards) and the gc tests (test_gc, test_gc_crash,
# test_gc_races), plain and sanitized; build them first (make build/unit/test_crash
# build/unit/test_gc build/unit-san/test_gc and the same for the other two). Each round's output
# goes to build/test-logs/stress/round-N.log; a line per round says how it ended, how long it
# took and the range of the 1-minute load average during it. The hogs are stopped by their pids when the loop ends.
# Exit 0 when every round passed.
#
# With STRESS_LOAD=N (instead of a fixed STRESS_HOGS) the number of hogs is set again before each
# round so that the load average comes near N: the machine's own load (the 1-minute average less
# the hogs already running) is topped up with hogs, never more than two per CPU. On a machine that
# others share, a load of N is reached without starving them when they are busy.
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
        build/unit-san/test_gc_crash build/unit-san/test_gc build/unit-san/test_gc_races \
        build/unit/test_gc_crash build/unit/test_gc build/unit/test_gc_races
fi
for b in "$@"; do
    exe=${b##* }
    [[ -x $exe ]] || { echo "stress-loop: $exe not built" >&2; exit 2; }
done

max_hogs=$((2 * $(nproc 2>/dev/null || echo 1)))
hogs=${STRESS_HOGS:-$max_hogs}
target=${STRESS_LOAD:-}
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
sampler=""
trap 'stop_hogs; [[ -z $sampler ]] || kill "$sampler" 2>/dev/null' EXIT
trap 'exit 1' INT TERM
start_hogs() {
    local i
    for ((i = 0; i < $1; i++)); do
        sh -c 'while :; do :; done' &
        hog_pids+=($!)
    done
}
# set_hogs: with STRESS_LOAD, as many hogs as bring the load average near it.
set_hogs() {
    [[ -n $target ]] || return 0
    local load own want
    load=$(cut -d' ' -f1 /proc/loadavg)
    own=$(awk -v l="$load" -v h="${#hog_pids[@]}" 'BEGIN { o = l - h; print (o < 0 ? 0 : o) }')
    want=$(awk -v t="$target" -v o="$own" -v m="$max_hogs" \
        'BEGIN { w = int(t - o + 0.5); print (w < 0 ? 0 : (w > m ? m : w)) }')
    if [[ $want -ne ${#hog_pids[@]} ]]; then
        stop_hogs
        start_hogs "$want"
    fi
}
if [[ -n $target ]]; then
    set_hogs
else
    start_hogs "$hogs"
fi

log_dir=build/test-logs/stress
mkdir -p "$log_dir"
echo "stress-loop: $rounds rounds of: $*"
if [[ -n $target ]]; then
    echo "stress-loop: CPU hogs beside them set each round for a load of about $target"
else
    echo "stress-loop: $hogs CPU hogs (pids ${hog_pids[*]}) beside them"
fi
for ((r = 1; r <= rounds; r++)); do
    ((r == 1)) || set_hogs
    start=$(date +%s)
    # The 1-minute load average every 10 s of the round: its range goes on the round's line.
    (while :; do cut -d' ' -f1 /proc/loadavg; sleep 10; done) >"$log_dir/round-$r.load" &
    sampler=$!
    tests/run-unit.sh "$@" >"$log_dir/round-$r.log" 2>&1
    rc=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    secs=$(($(date +%s) - start))
    # shellcheck disable=SC2016 # a sed script: its lowest and highest line
    load=$(sort -n "$log_dir/round-$r.load" | sed -n '1h; ${H; x; s/\n/-/; p}')
    totals=$(grep '^unit: [0-9]* passed' "$log_dir/round-$r.log")
    if [[ $rc -ne 0 ]]; then
        echo "round $r of $rounds: FAILED (exit $rc, ${secs} s, load $load, ${#hog_pids[@]} hogs; ${totals:-no totals}; log $log_dir/round-$r.log)"
        grep -E "no Check summary|check_pack|check_msg|check_run|:[EF]:" "$log_dir/round-$r.log" | head -n 20
        echo "stress-loop: $((r - 1)) rounds passed in a row before round $r failed"
        exit 1
    fi
    echo "round $r of $rounds: passed (${secs} s, load $load, ${#hog_pids[@]} hogs; $totals)"
done
echo "stress-loop: all $rounds rounds passed"
