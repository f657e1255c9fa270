#!/usr/bin/env bash
# The garbage collector benchmark (thesis section 3.4.3). On a sparse file blockstore of at least
# 50 GiB holding many VDIs and snapshots, measure:
#   1. the collector's throughput in GiB of blockstore per second (store_blocks * 4096 / seconds
#      from `parallax gc --json`; the first run frees the data set's garbage, the later ones only
#      mark and sweep), its wall time per run, and its peak memory;
#   2. a writer's throughput (bench/gc-writer.c: sequential 1 MiB writes to a VDI of its own,
#      4 in flight, for a fixed time) without and with `parallax gc` running in a loop beside it,
#      interleaved (base, gc, base, gc, ...), each run into a fresh VDI deleted afterwards;
#   3. what happens when the reachability maps do not fit: gc on a 15 TiB sparse store under
#      `ulimit -v` (allocation fails, "gc: out of memory", nothing changed).
# Targets (stated with the numbers): >= 5 GiB/s of blockstore, < 10% writer throughput lost.
#
#   bench/gc.sh                 full run (~4 minutes): 50 GiB store in /var/tmp
#   bench/gc.sh --quick         smoke run (~30 s): 8 GiB store, small data set
#   bench/gc.sh --dir DIR --size 64G --extent-size 2G --seconds 20 --pairs 3
#
# Prints a report and saves it as bench/results/gc-HOST-YYYYmmddTHHMMSSZ.txt. Needs jq.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

dir=/var/tmp
size=50G
extent=1G
seconds=15
pairs=4
vdis=50
snaps=20
clones=10
delete=5
gc_runs=5
quick=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --quick) quick=1 size=8G seconds=3 pairs=1 vdis=10 snaps=5 clones=2 delete=1 gc_runs=3 ;;
    --dir) dir=$2 && shift ;;
    --size) size=$2 && shift ;;
    --extent-size) extent=$2 && shift ;;
    --seconds) seconds=$2 && shift ;;
    --pairs) pairs=$2 && shift ;;
    --vdis) vdis=$2 && shift ;;
    --snaps) snaps=$2 && shift ;;
    *)
        echo "usage: bench/gc.sh [--quick] [--dir DIR] [--size SIZE] [--extent-size SIZE]" \
            "[--seconds T] [--pairs N] [--vdis N] [--snaps N]" >&2
        exit 2
        ;;
    esac
    shift
done
command -v jq >/dev/null || { echo "bench/gc.sh: jq is needed" >&2; exit 1; }

# ---- Build -------------------------------------------------------------------------------------
make all >/dev/null
writer=build/bench-gc-writer
if make -n bench-gc-writer >/dev/null 2>&1; then
    make bench-gc-writer >/dev/null
elif [[ ! -x $writer || bench/gc-writer.c -nt $writer || build/libparallax.a -nt $writer ]]; then
    # Before the Makefile has the target: build it the same way by hand.
    ${CC:-cc} -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
        -Wmissing-prototypes -Wno-unused-parameter -O2 -g -Ilibparallax/include -Ilibparallax \
        bench/gc-writer.c build/libparallax.a -laio -o "$writer"
fi
parallax=${PARALLAX:-$root/build/parallax}

store=$dir/plx-gc-bench-$$.img
big=$dir/plx-gc-bench-big-$$.img
cleanup() {
    # A gc loop still running (interrupted run) stops at its stop file.
    if [[ -n ${countf:-} ]]; then
        touch "$countf.stop"
        sleep 1
    fi
    rm -f "$store" "$big" "$countf" "$countf.stop"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

plx() { "$parallax" -b "$store" "$@"; }

# gc_json: one collection, its report as JSON. If this binary's --json is broken (it ran the
# collection and then failed to print), the human-readable report is parsed instead; that is
# decided once, on a scratch store, so no collection is ever run twice.
json_ok=1
"$parallax" -b "$big" format --size 64M --extent-size 16M >/dev/null
("$parallax" -b "$big" gc --json) >/dev/null 2>&1 || json_ok=0
rm -f "$big"
gc_json() {
    if [[ $json_ok == 1 ]]; then
        plx gc --json
        return
    fi
    plx gc | awk '
        $2 == "freed" { m = $3; d = $6 }
        $2 == "would" { m = $4; d = $7 }
        /blocks reachable/ { r = $2; n = $5; s = $(NF - 3) }
        END { printf "{\"fallback\":1,\"seconds\":%s,\"metadata_read\":%d,", s, n;
              printf "\"reachable\":%d,\"freed\":{\"metadata\":%d,\"data\":%d}}\n", r, m, d }'
}

mkdir -p bench/results
host=$(hostname -s 2>/dev/null || echo host)
report=bench/results/gc-$host-$(date -u +%Y%m%dT%H%M%SZ).txt
exec > >(tee "$report") 2>&1

echo "# Parallax garbage collector benchmark"
echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "machine:  $(nproc) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)," \
    "$(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo)," \
    "kernel $(uname -r)"
echo "medium:   $dir on $(df -T "$dir" | awk 'NR == 2 { print $1 " (" $2 ")" }')"
echo "command:  bench/gc.sh $([[ $quick == 1 ]] && echo --quick) (size $size, extent $extent," \
    "$vdis VDIs x $snaps snapshots, $clones clones, writer $seconds s x $pairs pairs)"
echo "commit:   $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
echo

# ---- The data set ------------------------------------------------------------------------------
t0=$(date +%s.%N)
plx format --size "$size" --extent-size "$extent" >/dev/null
"$writer" populate "$store" --vdis "$vdis" --snaps "$snaps" --clones "$clones" --delete "$delete"
info=$(plx info --json)
t1=$(date +%s.%N)
blocks=$(jq .block_count <<<"$info")
echo "data set: $(jq -r '"\(.vdi_count) live VDIs, extents: \(.extents.metadata) metadata, \(.extents.data) data, \(.extents.unused) unused; used blocks: \(.blocks_used.metadata) metadata, \(.blocks_used.data) data; garbage: \(.blocks_leaked.metadata) metadata, \(.blocks_leaked.data) data"' <<<"$info")"
echo "          built in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s;" \
    "allocated on disk: $(du -h "$store" | cut -f1) of $(du -h --apparent-size "$store" | cut -f1)"
echo

# ---- 1. Collector throughput -------------------------------------------------------------------
echo "## 1. Collector throughput (target: >= 5 GiB of blockstore per second)"
if [[ $json_ok == 0 ]]; then
    echo "(this binary's \`gc --json\` fails after collecting: numbers parsed from \`gc\`'s report)"
fi
printf '%-4s %10s %9s %9s %11s %10s %10s %8s %8s\n' run "store GiB" seconds "GiB/s" \
    "nodes read" "nodes/s" reachable freed "wall s"
rates=()
for ((i = 1; i <= gc_runs; i++)); do
    w0=$(date +%s.%N)
    j=$(gc_json)
    w1=$(date +%s.%N)
    rate=$(jq -r --argjson b "$blocks" '$b * 4096 / 1073741824 / .seconds' <<<"$j")
    rates+=("$rate")
    printf '%-4s %10.1f %9.3f %9.1f %11s %10.0f %10s %8s %8.2f\n' "$i" \
        "$(jq -r --argjson b "$blocks" '$b * 4096 / 1073741824' <<<"$j")" \
        "$(jq -r .seconds <<<"$j")" "$rate" "$(jq -r .metadata_read <<<"$j")" \
        "$(jq -r '.metadata_read / .seconds' <<<"$j")" \
        "$(jq -r .reachable <<<"$j")" "$(jq -r '.freed.metadata + .freed.data' <<<"$j")" \
        "$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
med=$(median "${rates[@]}")
min=$(printf '%s\n' "${rates[@]}" | sort -g | head -n1)
verdict=$(awk -v m="$min" 'BEGIN { print (m >= 5) ? "met" : "NOT met" }')
echo "median $(printf '%.1f' "$med") GiB/s, slowest $(printf '%.1f' "$min") GiB/s: target >= 5 GiB/s $verdict"
echo "leaked after the runs: $(plx info --json | jq '.blocks_leaked.metadata + .blocks_leaked.data') blocks; check: $(plx check | tail -n1)"

# Memory: the maps are calloc'd (one bit per block each) and touched sparsely.
mem_kib=$( { /usr/bin/time -f '%M' "$parallax" -b "$store" gc >/dev/null; } 2>&1 | tail -n1)
neb=$(jq '.extents.metadata + .extents.data' <<<"$(plx info --json)")
ebytes=$(jq .extent_size <<<"$info")
words=$(((blocks + 63) / 64))
map=$((words * 8))
ckpt=$((neb * ebytes / 4096 / 8))
echo "memory: reachability map $((map / 1024)) KiB + read-once map $((map / 1024)) KiB" \
    "(one bit per block each) + checkpointed bitmaps $((ckpt / 1024)) KiB ($neb extents);" \
    "peak RSS of a whole \`parallax gc\` run: $((mem_kib / 1024)) MiB"
echo

# ---- 2. Writer beside the collector --------------------------------------------------------------
echo "## 2. Writer throughput without and with gc in a loop beside it (target: < 10% lost)"
# One untimed run first, so the timed ones write over file regions the file system has already
# allocated (each run's VDI is deleted and collected afterwards, and the next reuses the space).
wsize=4G
run_writer() { # run_writer NAME: prints MiB/s
    "$writer" write "$store" --vdi "$1" --seconds "$seconds" --size "$wsize" --depth 4 |
        awk '{ print $4 }'
}
retire() { # retire NAME: delete the writer's VDI and collect it (untimed)
    plx vdi-delete "$1"
    plx gc >/dev/null
}
run_writer warmup >/dev/null
retire warmup
base=()
with=()
# with_gc NAME: the writer's MiB/s with `parallax gc` looping beside it; the number of gc runs
# the loop completed goes to $countf.
countf=$dir/plx-gc-bench-count-$$
with_gc() {
    local stop=$countf.stop loop r
    rm -f "$stop"
    (
        n=0
        while [[ ! -e $stop ]]; do
            "$parallax" -b "$store" gc >/dev/null 2>&1 || true
            n=$((n + 1))
        done
        echo "$n" >"$countf"
    ) &
    loop=$!
    r=$(run_writer "$1")
    touch "$stop"
    wait "$loop"
    rm -f "$stop"
    echo "$r"
}
printf '%-6s %14s %14s %12s\n' pair "alone MiB/s" "with gc MiB/s" "gc runs"
for ((p = 1; p <= pairs; p++)); do
    # Alternate the order (alone first, then gc first) so drift of the medium cancels out.
    if ((p % 2)); then
        b=$(run_writer "base$p")
        retire "base$p"
        g=$(with_gc "gc$p")
        retire "gc$p"
    else
        g=$(with_gc "gc$p")
        retire "gc$p"
        b=$(run_writer "base$p")
        retire "base$p"
    fi
    base+=("$b")
    with+=("$g")
    printf '%-6s %14s %14s %12s\n' "$p" "$b" "$g" "$(cat "$countf")"
done
mb=$(median "${base[@]}")
mw=$(median "${with[@]}")
loss=$(awk -v a="$mb" -v b="$mw" 'BEGIN { printf "%.1f", (a - b) / a * 100 }')
echo "alone: $(printf '%s ' "${base[@]}")MiB/s; with gc: $(printf '%s ' "${with[@]}")MiB/s"
echo "median alone $mb MiB/s, with gc $mw MiB/s: ratio $(awk -v a="$mb" -v b="$mw" 'BEGIN { printf "%.3f", b / a }')," \
    "$loss% lost: target < 10% $(awk -v l="$loss" 'BEGIN { print (l < 10) ? "met" : "NOT met" }')"
echo "check after the writer runs: $(plx check | tail -n1)"
echo

# ---- 3. Beyond the memory the maps need ------------------------------------------------------------
echo "## 3. When the maps do not fit"
if "$parallax" -b "$big" format --size 15T >/dev/null 2>&1; then
    bb=$("$parallax" -b "$big" info --json | jq .block_count)
    bwords=$(((bb + 63) / 64))
    echo "15 TiB sparse store: $bb blocks, two maps of $((bwords * 8 / 1048576)) MiB each"
    rc=0
    msg=$( (ulimit -v 716800 && "$parallax" -b "$big" gc) 2>&1) || rc=$?
    echo "gc under ulimit -v 700 MiB: exit $rc: $msg"
    echo "gc without the limit: $("$parallax" -b "$big" gc | tail -n1)"
else
    echo "(skipped: cannot create a 15 TiB sparse file in $dir)"
fi
rm -f "$big"
echo
echo "saved: $report"
