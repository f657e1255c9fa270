#!/usr/bin/env bash
# Run the integration scripts tests/integration/*.sh (lib.sh excluded): the alone ones first (see
# below), then the others, each group sorted by name.
#
#   tests/run-integration.sh            run them all
#   tests/run-integration.sh NAME...    run only these (with or without the .sh)
#   tests/run-integration.sh --long     run only the scripts with long parts, those parts included
#                                       (make check-long; see below)
#   tests/run-integration.sh --beside CMD [NAME...]
#                                       also run the shell command CMD (e.g. the bench
#                                       smokes) in one of the job slots, beside the scripts that
#                                       may share the machine and never beside an alone one; its
#                                       output is passed through, and the run fails if it fails
#
# Each script runs with bash in a fresh, empty directory that is its cwd and is exported as
# PLX_TEST_TMP (removed afterwards), with PARALLAX pointing at build/parallax, stdin from
# /dev/null and a time limit (PLX_TEST_TIMEOUT seconds, default 600). Output goes to
# build/test-logs/integration/NAME.log; on failure the log's tail is printed. Each script's line
# at its end gives its wall seconds and CPU seconds; the 15 slowest are listed at the end, and
# every script's times are in build/test-logs/integration/times.txt.
#
# Scripts run PLX_TEST_JOBS at a time (default: one more than the CPUs): most of their time is
# spent waiting on servers, targets and guests (in make check beside two CPU hogs their CPU seconds
# were 0.41 of their wall seconds), and each picks its own ports, sockets and temp files.
# Two kinds of script never share the machine with the others, and run first, so that the
# machine is never drained for one in the middle of the run (each drain left a CPU idle while the
# last script before it finished):
# - `# plx-test: alone`: a timing script: it asserts how long something may take (no write waits
#   1 s, a takeover within two leases), and mostly waits on servers, so little CPU is its own;
# - `# plx-test: alone-cpu`: a CPU-bound script with a time limit (it boots guests under QEMU,
#   or runs Bonnie++).
# They run in two lanes, one script of each kind at a time: a timing script beside at most one
# CPU-bound one (which takes one of the machine's CPUs, as a busy machine's other work would),
# never beside another timing script or the rest; a CPU-bound one beside at most one timing one
# (with PLX_TEST_JOBS=1, one after the other). The other scripts start once the timing lane is
# done, beside the last CPU-bound script if it still runs.
#
# A script whose header has the line `# plx-test: long-parts` keeps its longer parts (more cases of
# the same feature, a wider sweep) for make check-long: make check runs its short case with
# PLX_TEST_LONG=0, and `--long` runs it again whole with PLX_TEST_LONG=1 (lib.sh: long_parts;
# logs in build/test-logs/integration-long/).
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

long=0
if [[ ${1:-} == --long ]]; then
    long=1
    shift
    log_dir+=-long
    mkdir -p "$log_dir"
fi
export PLX_TEST_LONG=$long

beside=""
if [[ ${1:-} == --beside ]]; then
    [[ $# -ge 2 ]] || { echo "run-integration: --beside needs a command" >&2; exit 2; }
    beside=$2
    shift 2
fi

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

is_alone() { grep -q '^# plx-test: alone' "$1"; }
# lane_of SCRIPT: "cpu" (alone-cpu), "timing" (alone) or "shared".
lane_of() {
    if grep -q '^# plx-test: alone-cpu' "$1"; then
        echo cpu
    elif is_alone "$1"; then
        echo timing
    else
        echo shared
    fi
}
has_long() { grep -q '^# plx-test: long-parts' "$1"; }

if ((long)); then
    with_long=()
    for f in ${scripts[@]+"${scripts[@]}"}; do
        if has_long "$f"; then with_long+=("$f"); fi
    done
    scripts=(${with_long[@]+"${with_long[@]}"})
fi

# The alone scripts first, in the order given; then the others.
ordered=()
for f in ${scripts[@]+"${scripts[@]}"}; do
    if is_alone "$f"; then ordered+=("$f"); fi
done
for f in ${scripts[@]+"${scripts[@]}"}; do
    if ! is_alone "$f"; then ordered+=("$f"); fi
done
scripts=(${ordered[@]+"${ordered[@]}"})

jobs=${PLX_TEST_JOBS:-$(($(nproc 2>/dev/null || echo 1) + 1))}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || jobs=1

declare -A job_name=() job_tmp=() job_start=() job_lane=()
# The --beside command while it runs (its own session, so that all of it can be stopped), and how
# it ended.
beside_pid="" beside_start=0 beside_rc=""
cleanup_all() {
    local pid
    for pid in "${!job_tmp[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    if [[ -n $beside_pid ]]; then
        kill -TERM -- "-$beside_pid" 2>/dev/null || kill -TERM "$beside_pid" 2>/dev/null || true
    fi
    wait 2>/dev/null || true
    for pid in "${!job_tmp[@]}"; do
        rm -rf --one-file-system "${job_tmp[$pid]}" 2>/dev/null ||
            echo "run-integration: could not remove ${job_tmp[$pid]} (a mount left behind?)" >&2
    done
}
trap cleanup_all EXIT
trap 'exit 130' INT TERM

passed=0 failed=0 skipped=0
failed_names=()
times=() # "SECONDS NAME" of every finished script, for the table of the slowest

# finish PID RC: report a finished script and remove its temp dir.
finish() {
    local pid=$1 rc=$2 name=${job_name[$1]} tmp=${job_tmp[$1]}
    local log="$log_dir/$name.log" secs=$((SECONDS - job_start[$1]))
    unset "job_name[$pid]" "job_tmp[$pid]" "job_start[$pid]" "job_lane[$pid]"
    if [[ $rc -eq 124 ]]; then
        echo "run-integration: timed out after ${timeout_s}s" >>"$log"
    elif [[ $rc -eq 137 ]]; then
        echo "run-integration: killed (SIGKILL; timed out and ignored SIGTERM?)" >>"$log"
    fi
    local alone="" cpu=""
    is_alone "tests/integration/$name.sh" && alone=" (alone)"
    # CPU seconds (user + system) of the script and its children: on a busy machine the wall
    # time says more about the load than about the script.
    if [[ -s $log_dir/$name.cpu ]]; then
        cpu=$(awk 'NR == 2 { split($1 " " $2, t, /[ms ]+/); printf "%.1f", t[1] * 60 + t[2] + t[3] * 60 + t[4] }' \
            "$log_dir/$name.cpu")
    fi
    times+=("$secs $name$alone, CPU ${cpu:-?} s")
    if [[ $rc -eq 0 ]]; then
        echo "PASS $name (${secs}s, CPU ${cpu:-?} s)"
        passed=$((passed + 1))
    elif [[ $rc -eq 77 && ${PLX_TEST_STRICT:-0} != 1 ]]; then
        local reason
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
            echo "    (kept $tmp)"
            tmp=""
        fi
    fi
    if [[ -n $tmp && -d $tmp ]]; then
        # Never follow a mount a failed script left behind into another file system.
        rm -rf --one-file-system "$tmp" 2>/dev/null ||
            echo "run-integration: could not remove $tmp (a mount left behind?)" >&2
    fi
}

# running: how many job slots are taken (the scripts, and the --beside command).
running() { echo $((${#job_name[@]} + (${#beside_pid} > 0 ? 1 : 0))); }

# wait_below N: wait until fewer than N jobs are running.
wait_below() {
    local pid rc
    while [[ $(running) -ge $1 ]]; do
        rc=0
        pid=""
        wait -n -p pid "${!job_name[@]}" $beside_pid || rc=$?
        if [[ -n $pid && $pid == "$beside_pid" ]]; then
            beside_pid=""
            beside_rc=$rc
            times+=("$((SECONDS - beside_start)) beside: $beside")
            [[ $rc -eq 0 ]] || echo "FAIL beside: $beside (exit $rc)"
        elif [[ -n $pid && -n ${job_name[$pid]:-} ]]; then
            finish "$pid" "$rc"
        fi
    done
}

# start_beside: start the --beside command in a job slot, once, when the first script that may
# share the machine is due (the longest job, so it starts first).
start_beside() {
    [[ -n $beside && -z $beside_rc && -z $beside_pid ]] || return 0
    wait_below "$jobs"
    echo "RUN  beside: $beside"
    setsid -w bash -c "$beside" </dev/null &
    beside_pid=$!
    beside_start=$SECONDS
}

# lane_busy LANE: whether a script of that lane is running.
lane_busy() {
    local pid
    for pid in "${!job_lane[@]}"; do
        [[ ${job_lane[$pid]} != "$1" ]] || return 0
    done
    return 1
}

# start_script FILE: start one script in the background (its slot is taken until finish).
n=0
start_script() {
    local f=$1 name tmp
    name=$(basename "$f" .sh)
    n=$((n + 1))
    # A line as each script starts (PASS/FAIL/SKIP follows when it ends): some take minutes.
    echo "RUN  $name ($n of ${#scripts[@]})"
    tmp=$(mktemp -d "$tmp_base/$name.XXXXXX")
    # (bash -c around the script: its `times` gives the CPU seconds of the script and of the
    # children it waited for, written to NAME.cpu; timeout stops the whole group.)
    rm -f "$log_dir/$name.cpu"
    # shellcheck disable=SC2016 # expanded by that bash
    (cd "$tmp" && PLX_TEST_TMP="$tmp" exec timeout -k 10 "$timeout_s" \
        bash -c 'bash "$1"; rc=$?; times >"$2"; exit $rc' _ "$root/$f" "$log_dir/$name.cpu") \
        </dev/null >"$log_dir/$name.log" 2>&1 &
    job_name[$!]=$name
    job_tmp[$!]=$tmp
    job_start[$!]=$SECONDS
    job_lane[$!]=$(lane_of "$f")
}

# The alone scripts, in their two lanes, each lane in the order given.
lane_cpu=() lane_timing=()
for f in ${scripts[@]+"${scripts[@]}"}; do
    case $(lane_of "$f") in
    cpu) lane_cpu+=("$f") ;;
    timing) lane_timing+=("$f") ;;
    esac
done
# Once no timing script is left to run or running, the other scripts may start beside the last
# CPU-bound one (they share the machine as a busy machine's work would).
while [[ ${#lane_cpu[@]} -gt 0 || ${#lane_timing[@]} -gt 0 ]] || lane_busy timing; do
    started=0
    if [[ ${#lane_cpu[@]} -gt 0 ]] && ! lane_busy cpu; then
        start_script "${lane_cpu[0]}"
        lane_cpu=("${lane_cpu[@]:1}")
        started=1
    fi
    # (With PLX_TEST_JOBS=1, one script at a time here too.)
    if ((jobs == 1 && $(running) > 0)); then
        wait_below 1
        continue
    fi
    if [[ ${#lane_timing[@]} -gt 0 ]] && ! lane_busy timing; then
        start_script "${lane_timing[0]}"
        lane_timing=("${lane_timing[@]:1}")
        started=1
    fi
    # Neither lane free: wait for one script to end.
    ((started)) || wait_below "$(running)"
done

# The others, PLX_TEST_JOBS at a time (the last CPU-bound script, if it still runs, takes a slot).
for f in ${scripts[@]+"${scripts[@]}"}; do
    [[ $(lane_of "$f") == shared ]] || continue
    start_beside
    wait_below "$jobs"
    start_script "$f"
done
start_beside # when every script was an alone one
wait_below 1

# Where the time went: the slowest scripts (an alone script holds up every other one).
if [[ ${#times[@]} -gt 0 ]]; then
    echo "integration: slowest (seconds):"
    printf '%s\n' "${times[@]}" | sort -rn | head -n 15 | sed 's/^/    /'
    printf '%s\n' "${times[@]}" | sort -rn >"$log_dir/times.txt"
fi
if [[ $failed -gt 0 ]]; then
    echo "failed: ${failed_names[*]}"
fi
summary="integration: $passed passed, $failed failed"
[[ $skipped -gt 0 ]] && summary+=", $skipped skipped"
echo "$summary"
[[ -z $beside || $beside_rc -eq 0 ]] || { echo "integration: FAILED beside: $beside"; exit 1; }
[[ $failed -eq 0 ]]
