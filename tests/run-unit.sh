#!/bin/sh
# Run each Check unit-test binary given as an argument, show its output, and total the Check
# results. Exits non-zero if any test failed or any binary did not finish cleanly.
#
# A binary that exits 77 after its suite passed ran everything it could but skipped a part
# (e.g. test_backend without a tgtd it may start): reported as skipped, with its SKIP line, and
# never counted as a pass; it fails the run only with PLX_TEST_STRICT=1.
set -u

passed=0
failed=0
skipped=""
status=0

n=0
for bin in "$@"; do
    n=$((n + 1))
    # A line as each binary starts and one as it ends, so a long run shows where it is.
    echo "== $bin ($n of $#)"
    start=$(date +%s)
    out=$("$bin" 2>&1)
    rc=$?
    [ -n "$out" ] && printf '%s\n' "$out"
    echo "== $bin: exit $rc after $(($(date +%s) - start)) s"
    # Check prints "NN%: Checks: X, Failures: Y, Errors: Z" once per suite.
    summary=$(printf '%s\n' "$out" |
        sed -n 's/.*Checks: \([0-9][0-9]*\), Failures: \([0-9][0-9]*\), Errors: \([0-9][0-9]*\).*/\1 \2 \3/p')
    if [ -z "$summary" ]; then
        # No summary at all: the binary crashed or never ran its suite. Count it as one failure
        # so that it cannot pass unnoticed.
        echo "$bin: no Check summary (exit status $rc)"
        failed=$((failed + 1))
        status=1
        continue
    fi
    while read -r checks failures errors; do
        bad=$((failures + errors))
        passed=$((passed + checks - bad))
        failed=$((failed + bad))
    done <<SUMMARY
$summary
SUMMARY
    if [ "$rc" -eq 77 ] && [ "${PLX_TEST_STRICT:-0}" != 1 ]; then
        skipped="$skipped $bin"
    elif [ "$rc" -ne 0 ]; then
        status=1
    fi
done

if [ "$failed" -ne 0 ]; then
    status=1
fi
echo "unit: $passed passed, $failed failed"
[ -n "$skipped" ] && echo "unit: parts SKIPPED (see their SKIP lines):$skipped"
exit "$status"
