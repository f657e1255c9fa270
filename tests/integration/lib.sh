# shellcheck shell=bash
# Shared helpers for the integration scripts. Source it first:
#
#   . "$(dirname "$0")/lib.sh"
#
# It turns on `set -euo pipefail`. tests/run-integration.sh exports PARALLAX (the command) and
# PLX_TEST_TMP (a fresh directory, also the cwd, removed afterwards). A script run by hand gets
# the same: build/parallax and a temp dir removed at exit.
#
# Exit codes: 0 pass, 1 fail, 77 skip (never counted as a pass).
#
#   fail MSG...                      print "FAIL: MSG" to stderr and exit 1
#   skip MSG...                      print "SKIP: MSG" and exit 77
#   require_cmd CMD...               skip unless every CMD is on PATH
#   plx ARGS...                      $PARALLAX -b $PLX_TEST_TMP/store.img ARGS...
#   expect_fail CODE CMD...          CMD must exit with CODE and its stderr must start
#                                    with "parallax:"; stderr is left in $PLX_LAST_STDERR
#   assert_eq EXPECTED ACTUAL [MSG]  fail unless the two strings are equal
#   bg_pid PID                       kill PID (TERM, then KILL after 5 s) when the script exits
#   on_exit CMD                      run the shell command CMD when the script exits (in
#                                    reverse order of registration, before killing bg pids)
#
# Do not set your own EXIT trap: use on_exit. Note that `fail` inside $(...) or ( ... ) only
# leaves that subshell; with set -e the script still stops, but prefer calling it directly.
set -euo pipefail

_plx_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${PARALLAX:=$_plx_lib_dir/../../build/parallax}"
export PARALLAX

_plx_own_tmp=""
if [[ -z ${PLX_TEST_TMP:-} ]]; then
    PLX_TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/plx-test.XXXXXX")
    _plx_own_tmp=$PLX_TEST_TMP
fi
export PLX_TEST_TMP

_plx_bg_pids=()
_plx_exit_cmds=()

_plx_cleanup() {
    local rc=$? i pid n
    set +e
    for ((i = ${#_plx_exit_cmds[@]} - 1; i >= 0; i--)); do
        eval "${_plx_exit_cmds[i]}"
    done
    for pid in ${_plx_bg_pids[@]+"${_plx_bg_pids[@]}"}; do
        kill -TERM "$pid" 2>/dev/null || continue
        for ((n = 0; n < 50; n++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ -n $_plx_own_tmp ]]; then
        rm -rf --one-file-system "$_plx_own_tmp"
    fi
    exit "$rc"
}
trap _plx_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

skip() {
    echo "SKIP: $*"
    exit 77
}

require_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || skip "$c not found"
    done
}

plx() {
    "$PARALLAX" -b "$PLX_TEST_TMP/store.img" "$@"
}

PLX_LAST_STDERR=""
expect_fail() {
    [[ $# -ge 2 ]] || fail "usage: expect_fail EXPECTED_EXIT CMD..."
    local want=$1 rc=0 errf
    shift
    errf=$(mktemp "$PLX_TEST_TMP/stderr.XXXXXX")
    "$@" 2>"$errf" || rc=$?
    PLX_LAST_STDERR=$(cat "$errf")
    rm -f "$errf"
    if [[ $rc -ne $want ]]; then
        [[ -n $PLX_LAST_STDERR ]] && printf '%s\n' "$PLX_LAST_STDERR" >&2
        fail "expected exit $want, got $rc: $*"
    fi
    if [[ $PLX_LAST_STDERR != parallax:* ]]; then
        printf 'stderr was: [%s]\n' "$PLX_LAST_STDERR" >&2
        fail "stderr does not start with 'parallax:': $*"
    fi
}

assert_eq() {
    [[ $1 == "$2" ]] || fail "${3:-values differ}: expected [$1], got [$2]"
}

bg_pid() {
    [[ $1 =~ ^[0-9]+$ ]] || fail "bg_pid: not a pid: $1"
    _plx_bg_pids+=("$1")
}

on_exit() {
    _plx_exit_cmds+=("$1")
}
