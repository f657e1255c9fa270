#!/usr/bin/env bash
# Run the integration scripts tests/integration/*.sh (lib.sh excluded), sorted by name.
#
#   tests/run-integration.sh            run them all
#   tests/run-integration.sh NAME...    run only these (with or without the .sh)
#
# Each script runs with bash in a fresh, empty directory that is its cwd and is exported as
# PLX_TEST_TMP (removed afterwards), with PARALLAX pointing at build/parallax, stdin from
# /dev/null and a time limit (PLX_TEST_TIMEOUT seconds, default 600). Output goes to
# build/test-logs/integration/NAME.log; on failure the log's tail is printed.
#
# Exit 0 = pass, 77 = skip (a required tool or facility is missing), anything else = fail.
# A skip is never counted as a pass. With PLX_TEST_STRICT=1 a skip counts as a failure.
# PLX_KEEP_TMP=1 keeps the temp dir of a failed script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

export PARALLAX="$root/build/parallax"
export PLX_SRCDIR="$root"
timeout_s=${PLX_TEST_TIMEOUT:-600}
tmp_base=${PLX_TEST_TMPDIR:-$root/tests/tmp}
log_dir="$root/build/test-logs/integration"

if [[ ! -x $PARALLAX ]]; then
    echo "run-integration: $PARALLAX not built (run make first)" >&2
    exit 1
fi
mkdir -p "$tmp_base" "$log_dir"

scripts=()
if [[ $# -gt 0 ]]; then
    for name in "$@"; do
        f="tests/integration/${name%.sh}.sh"
        [[ -f $f ]] || { echo "run-integration: no such script: $f" >&2; exit 2; }
        scripts+=("$f")
    done
else
    while IFS= read -r f; do
        [[ $(basename "$f") == lib.sh ]] || scripts+=("$f")
    done < <(find tests/integration -maxdepth 1 -name '*.sh' -type f | LC_ALL=C sort)
fi

cur_tmp=""
cleanup_tmp() {
    if [[ -n $cur_tmp && -d $cur_tmp ]]; then
        # Never follow a mount a failed script left behind into another file system.
        rm -rf --one-file-system "$cur_tmp" 2>/dev/null ||
            echo "run-integration: could not remove $cur_tmp (a mount left behind?)" >&2
    fi
    cur_tmp=""
}
trap cleanup_tmp EXIT
trap 'exit 130' INT TERM

passed=0 failed=0 skipped=0
failed_names=()
n=0
for f in ${scripts[@]+"${scripts[@]}"}; do
    name=$(basename "$f" .sh)
    log="$log_dir/$name.log"
    n=$((n + 1))
    # A line as each script starts (PASS/FAIL/SKIP follows when it ends): some take minutes.
    echo "RUN  $name ($n of ${#scripts[@]})"
    cur_tmp=$(mktemp -d "$tmp_base/$name.XXXXXX")
    start=$SECONDS
    rc=0
    (cd "$cur_tmp" && PLX_TEST_TMP="$cur_tmp" exec timeout -k 10 "$timeout_s" \
        bash "$root/$f") </dev/null >"$log" 2>&1 || rc=$?
    secs=$((SECONDS - start))
    if [[ $rc -eq 124 ]]; then
        echo "run-integration: timed out after ${timeout_s}s" >>"$log"
    elif [[ $rc -eq 137 ]]; then
        echo "run-integration: killed (SIGKILL; timed out and ignored SIGTERM?)" >>"$log"
    fi

    if [[ $rc -eq 0 ]]; then
        echo "PASS $name (${secs}s)"
        passed=$((passed + 1))
    elif [[ $rc -eq 77 && ${PLX_TEST_STRICT:-0} != 1 ]]; then
        reason=$(grep -m1 '^SKIP' "$log" || true)
        reason=${reason#SKIP}
        reason=${reason#:}
        reason=${reason# }
        echo "SKIP $name${reason:+: $reason}"
        skipped=$((skipped + 1))
    else
        echo "FAIL $name (exit $rc, ${secs}s; log: ${log#"$root"/})"
        tail -n 40 "$log" | sed 's/^/    | /'
        failed=$((failed + 1))
        failed_names+=("$name")
        if [[ ${PLX_KEEP_TMP:-0} == 1 ]]; then
            echo "    (kept $cur_tmp)"
            cur_tmp=""
        fi
    fi
    cleanup_tmp
done

if [[ $failed -gt 0 ]]; then
    echo "failed: ${failed_names[*]}"
fi
summary="integration: $passed passed, $failed failed"
[[ $skipped -gt 0 ]] && summary+=", $skipped skipped"
echo "$summary"
[[ $failed -eq 0 ]]
