#!/bin/sh
# Run each Check unit-test binary given as an argument, show its output, and total the Check
# results. Exits non-zero if any test failed or any binary did not finish cleanly.
#
# Binaries run $PLX_TEST_JOBS at a time (default: the number of CPUs), in the order given, so
# pass the longest first. A binary under build/unit-san/ runs with the sanitizer settings
# (PLX_TEST_QUICK=1, leak detection, UBSan stack traces), so one run can mix both builds and
# keep both cores busy. Each binary's output is shown whole when it ends, never interleaved;
# while the console has been quiet for $PLX_TEST_HEARTBEAT seconds (default 30), a line per
# binary still running says how long it has run and what it printed last (so far its output is
# only in its log), so that a long binary is seen to move.
# An argument may start with `env NAME=VALUE ...` (it is split into words): make check runs the
# crash harness as two shards that way.
#
# Each binary's line at its end gives its wall seconds and CPU seconds (user + system).
#
# A binary fails by itself when Check reports fewer results than the tests it added
# (tests/unit/testutil.c, tu_run_suite), unless CK_RUN_CASE or the like picked some.
#
# A binary that exits 77 after its suite passed ran everything it could but skipped a part
# (e.g. test_backend without a tgtd it may start): reported as skipped, with its SKIP line, and
# never counted as a pass; it fails the run only with PLX_TEST_STRICT=1.
set -u

jobs=${PLX_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
beat=${PLX_TEST_HEARTBEAT:-30}
work=$(mktemp -d "${TMPDIR:-/tmp}/plx-unit.XXXXXX")
trap 'rm -rf "$work"' EXIT
# (A trap on INT and TERM that only cleaned up let the run go on; exiting runs the EXIT trap.)
trap 'exit 1' INT TERM

# run_one N BIN: run BIN, leaving its output in $work/N.out and its exit status in $work/N.rc.
run_one() {
    start=$(cat "$work/$1.start")
    case "$2" in
    */unit-san/*)
        PLX_TEST_QUICK=1 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
            UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} $2 >"$work/$1.out" 2>&1
        ;;
    *) $2 >"$work/$1.out" 2>&1 ;;
    esac
    rc=$?
    echo "$(($(date +%s) - start))" >"$work/$1.secs"
    # CPU seconds (user + system) of the binary and its children: on a busy machine the wall
    # time says more about the load than about the test.
    # (times itself, not in a pipeline: a pipeline's subshell has no children of its own.)
    times >"$work/$1.times"
    awk 'NR == 2 { split($1 " " $2, t, /[ms ]+/); printf "%d\n", t[1] * 60 + t[2] + t[3] * 60 + t[4] }' \
        "$work/$1.times" >"$work/$1.cpu"
    echo "$rc" >"$work/$1.rc"
}

passed=0
failed=0
skipped=""
status=0

# report N BIN: show the output of a finished binary and add its Check summary to the totals.
report() {
    rc=$(cat "$work/$1.rc")
    cat "$work/$1.out"
    echo "== $2: exit $rc after $(cat "$work/$1.secs") s (CPU $(cat "$work/$1.cpu") s)"
    quiet_since=$(date +%s)
    echo "$(cat "$work/$1.secs") $2, CPU $(cat "$work/$1.cpu") s" >>"$work/times"
    # Check prints "NN%: Checks: X, Failures: Y, Errors: Z" once per suite.
    summary=$(sed -n 's/.*Checks: \([0-9][0-9]*\), Failures: \([0-9][0-9]*\), Errors: \([0-9][0-9]*\).*/\1 \2 \3/p' "$work/$1.out")
    if [ -z "$summary" ]; then
        # No summary at all: the binary crashed or never ran its suite. Count it as one failure
        # so that it cannot pass unnoticed.
        echo "$2: no Check summary (exit status $rc)"
        failed=$((failed + 1))
        status=1
        return
    fi
    while read -r checks failures errors; do
        bad=$((failures + errors))
        passed=$((passed + checks - bad))
        failed=$((failed + bad))
    done <<SUMMARY
$summary
SUMMARY
    if [ "$rc" -eq 77 ] && [ "${PLX_TEST_STRICT:-0}" != 1 ]; then
        skipped="$skipped $2"
    elif [ "$rc" -ne 0 ]; then
        status=1
    fi
}

# Start binaries while fewer than $jobs run; report each as soon as it has finished, in the
# order they finish.
n=0
running=""
reap() {
    still=""
    while IFS= read -r job; do
        [ -n "$job" ] || continue
        i=${job%%:*}
        if [ -e "$work/$i.rc" ]; then
            report "$i" "${job#*:}"
        else
            still="$still
$job"
        fi
    done <<JOBS
$running
JOBS
    running=$still
}

# heartbeat: a line for each binary still running: seconds so far and its latest output line.
heartbeat() {
    while IFS= read -r job; do
        [ -n "$job" ] || continue
        i=${job%%:*}
        last=$(grep -v '^[[:space:]]*$' "$work/$i.out" 2>/dev/null | tail -n 1 | cut -c 1-110)
        echo "== running for $(($1 - $(cat "$work/$i.start"))) s: ${job#*:}${last:+ (last line: $last)}"
    done <<JOBS
$running
JOBS
}

# wait_until N: wait until at most N binaries run, reporting those that end and, when nothing
# was printed for $beat seconds, the ones still running.
quiet_since=$(date +%s)
wait_until() {
    while [ "$(echo "$running" | wc -l)" -gt $(($1 + 1)) ]; do
        sleep 0.2
        reap
        now=$(date +%s)
        if [ $((now - quiet_since)) -ge "$beat" ]; then
            heartbeat "$now"
            quiet_since=$now
        fi
    done
}

for bin in "$@"; do
    n=$((n + 1))
    wait_until $((jobs - 1))
    echo "== $bin ($n of $#) started"
    date +%s >"$work/$n.start"
    quiet_since=$(cat "$work/$n.start")
    run_one "$n" "$bin" &
    running="$running
$n:$bin"
done
wait_until 0
wait

if [ "$failed" -ne 0 ]; then
    status=1
fi
# Where the time went: the slowest binaries (a run is at least as long as its slowest one).
echo "unit: slowest (seconds):"
sort -rn "$work/times" 2>/dev/null | head -n 15 | sed 's/^/    /'
echo "unit: $passed passed, $failed failed"
[ -n "$skipped" ] && echo "unit: parts SKIPPED (see their SKIP lines):$skipped"
exit "$status"
