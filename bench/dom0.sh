#!/usr/bin/env bash
# bench/dom0.sh - file system benchmarks on a Parallax VDI against the same stack on a raw file
# (Parallax thesis, figures 5.1 and 5.2): Bonnie++ cold and warm, and PostMark, on ext4.
#
#   NBD server on a unix socket -> nbdfuse (the export as a file) -> loop device -> ext4
#
#   parallax:  `parallax serve` exporting a fresh VDI of a fresh file blockstore (its built-in NBD
#              server; --serve-args --nbdkit for the nbdkit plugin)
#   direct:    `nbdkit file FILE` exporting a fresh sparse raw file (cache=none by default)
#
# Both stacks are built side by side and the phases alternate between them, so that load from
# elsewhere on the machine falls on both:
#   cold      Bonnie++ on the new file system of a new VDI / new raw file (every write allocates)
#   fill      the file system's free space is filled with random data (O_DIRECT) and the file
#             deleted, so that every block ext4 can hand out exists in the VDI / raw file: ext4
#             does not put the next Bonnie++ file where the last one was, so without this the
#             second run would still allocate
#   warm      Bonnie++ again on the same file system (overwrites: no allocation)
#   postmark  PostMark on the same file system, timed with and without a `sync` after it
# Caches: `echo 3 > /proc/sys/vm/drop_caches` before every run. Bonnie++ runs with -f -D: block
# I/O only, and the block writes are O_DIRECT, so they reach the server while they are timed.
# Bonnie++ reopens its file without O_DIRECT for rewrite and read: rewrite reads from the device
# (nothing of the file is cached after the O_DIRECT writes) and its writes are buffered; the read
# phase then reads what rewrite left in the page cache, so "block read" measures the page cache
# (bonnie prints +++++ when it is too fast to time). Buffered writes (rewrite, PostMark) are
# throttled to the device by a per-device dirty limit on the loop device (strict_limit and
# max_bytes in /sys/class/bdi, --dirty-limit, restored afterwards); the loop device uses direct
# I/O on the nbdfuse file so that no second page cache sits under ext4.
#
#   bench/dom0.sh [--size MIB] [--pm-files N] [--pm-transactions N] [--dirty-limit MIB]
#                 [--direct-cache none|default] [--serve-args ARGS] [--dir DIR] [--quick]
#
# Results: bench/results/dom0-HOST-STAMP.md (the table, with date, machine and command), .csv
# (the raw Bonnie++ lines) and .postmark.txt (PostMark's reports). Needs root, /dev/fuse, a free loop device, and the packages
# nbdkit libnbd-bin e2fsprogs bonnie++ postmark (scripts/install-deps.sh test).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cmdline="bench/dom0.sh $*"
size=512          # Bonnie++ file size, MiB
pm_files=20000    # PostMark: simultaneous files
pm_trans=200000   # PostMark: transactions
dirty_mib=64      # per-device dirty page limit, MiB (0: leave the kernel's defaults)
direct_cache=none # nbdkit file plugin cache= for the direct baseline
base_dir=/var/tmp
serve_args=""     # extra `parallax serve` options, e.g. --nbdkit
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) size=$2; shift 2 ;;
    --pm-files) pm_files=$2; shift 2 ;;
    --pm-transactions) pm_trans=$2; shift 2 ;;
    --dirty-limit) dirty_mib=$2; shift 2 ;;
    --direct-cache) direct_cache=$2; shift 2 ;;
    --dir) base_dir=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    --quick) size=128; pm_files=2000; pm_trans=20000; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "dom0.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

die() { echo "dom0.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (loop devices, mount, drop_caches)"
for c in nbdkit nbdfuse fusermount3 losetup mkfs.ext4 mount umount bonnie++ postmark; do
    command -v "$c" >/dev/null || die "$c not found (scripts/install-deps.sh test)"
done
[[ -c /dev/fuse ]] || die "no /dev/fuse"
losetup -f >/dev/null 2>&1 || die "no free loop device"
make -C "$root" -s all >/dev/null
P=$root/build/parallax

work=$(mktemp -d "$base_dir/plx-dom0.XXXXXX")
export PARALLAX_RUN_DIR=$work/run
mkdir -p "$PARALLAX_RUN_DIR"
pids=()
cleanup_cmds=()
cleanup() {
    set +e
    local i
    for ((i = ${#cleanup_cmds[@]} - 1; i >= 0; i--)); do eval "${cleanup_cmds[i]}"; done
    for i in "${pids[@]}"; do kill -TERM "$i" 2>/dev/null && wait "$i" 2>/dev/null; done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() { # PATH TEST: up to 10 s for [[ TEST PATH ]]
    local i
    for ((i = 0; i < 100; i++)); do
        test "$2" "$1" && return 0
        sleep 0.1
    done
    die "$1 did not appear"
}

vsize=$(((size * 2 + 1023) / 1024 + 1))G # room for Bonnie++ and PostMark with ext4 overhead
stacks=(parallax direct)
declare -A loopdev mnt
build_stack() { # NAME URI
    local s=$1 dir=$work/$1
    mkdir -p "$dir/fuse" "$dir/fs"
    nbdfuse "$dir/fuse/disk" "$2" >"$dir/nbdfuse.log" 2>&1 &
    pids+=($!)
    cleanup_cmds+=("fusermount3 -u '$dir/fuse' 2>/dev/null")
    wait_for "$dir/fuse/disk" -f
    loopdev[$s]=$(losetup -f --show --direct-io=on "$dir/fuse/disk")
    cleanup_cmds+=("losetup -d ${loopdev[$s]}")
    local bdi=/sys/class/bdi/$(($(stat -c '0x%t' "${loopdev[$s]}"))):$(($(stat -c '0x%T' "${loopdev[$s]}")))
    if ((dirty_mib > 0)) && [[ -w $bdi/strict_limit && -w $bdi/max_bytes ]]; then
        cleanup_cmds+=("echo $(cat "$bdi/max_ratio") >$bdi/max_ratio; echo $(cat "$bdi/strict_limit") >$bdi/strict_limit")
        echo $((dirty_mib << 20)) >"$bdi/max_bytes"
        echo 1 >"$bdi/strict_limit"
    elif ((dirty_mib > 0)); then
        echo "dom0.sh: warning: cannot limit dirty pages of ${loopdev[$s]} ($bdi)" >&2
        dirty_mib=0
    fi
    mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "${loopdev[$s]}"
    mount "${loopdev[$s]}" "$dir/fs"
    cleanup_cmds+=("umount '$dir/fs'")
    mnt[$s]=$dir/fs
}

# ---- servers ----------------------------------------------------------------------------------
"$P" -b "$work/store.img" format --size $((2 * ${vsize%G} + 1))G --extent-size 64M >/dev/null
"$P" -b "$work/store.img" vdi-create disk --size "$vsize" >/dev/null
# shellcheck disable=SC2086 # serve_args is a list of options
"$P" -b "$work/store.img" serve $serve_args --unix "$work/parallax.sock" >"$work/serve.log" 2>&1 &
pids+=($!)
wait_for "$work/parallax.sock" -S
truncate -s "$vsize" "$work/raw.img"
direct_args=()
[[ $direct_cache == default ]] || direct_args=(cache="$direct_cache")
nbdkit --foreground --unix "$work/direct.sock" file "$work/raw.img" "${direct_args[@]}" \
    >"$work/nbdkit.log" 2>&1 &
pids+=($!)
wait_for "$work/direct.sock" -S

build_stack parallax "nbd+unix:///disk?socket=$work/parallax.sock"
build_stack direct "nbd+unix:///?socket=$work/direct.sock"

# ---- runs ---------------------------------------------------------------------------------------
declare -A bon pm_wall pm_sync fill_s
csv=$work/bonnie.csv
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
for phase in cold warm; do
    if [[ $phase == warm ]]; then
        for s in "${stacks[@]}"; do
            echo "== filling the free space of $s" >&2
            t0=$(date +%s)
            dd if=/dev/urandom of="${mnt[$s]}/fill" bs=1M oflag=direct status=none 2>/dev/null || true
            rm -f "${mnt[$s]}/fill"
            sync
            fill_s[$s]=$(($(date +%s) - t0))
            echo "   ${fill_s[$s]} s" >&2
        done
    fi
    for s in "${stacks[@]}"; do
        drop
        echo "== $phase Bonnie++ on $s ($size MiB)" >&2
        t0=$(date +%s.%N)
        line=$(bonnie++ -d "${mnt[$s]}" -s "$size" -r $((size / 2)) -n 0 -f -D -u root -q \
            -m "$s-$phase" 2>"$work/bonnie.err") || die "bonnie++ failed: $(cat "$work/bonnie.err")"
        echo "$line" >>"$csv"
        bon[$s-$phase]=$line
        echo "   $(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.0f s", t1 - t0 }')" >&2
    done
done
for s in "${stacks[@]}"; do
    drop
    echo "== PostMark on $s ($pm_files files, $pm_trans transactions)" >&2
    mkdir -p "${mnt[$s]}/pm"
    t0=$(date +%s%N)
    printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' \
        "${mnt[$s]}/pm" "$pm_files" "$pm_trans" | postmark >"$work/pm-$s.out" 2>&1
    t1=$(date +%s%N)
    sync
    t2=$(date +%s%N)
    pm_wall[$s]=$(((t1 - t0) / 1000000))
    pm_sync[$s]=$(((t2 - t0) / 1000000))
    echo "   ${pm_wall[$s]} ms, with sync ${pm_sync[$s]} ms" >&2
done

# ---- table -------------------------------------------------------------------------------------
# Bonnie++ 2.00a CSV: 11 block write K/s, 13 rewrite K/s, 17 block read K/s, 19 seeks/s
# (0-based); "+++++" = too fast to time.
field() { cut -d, -f$(($2 + 1)) <<<"${bon[$1]}"; }
ratio() { # A B [higher|lower]: A/B, or - when either is not a number
    [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ && $2 != 0 ]] || { echo "-"; return; }
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'
}
verdict() { # RATIO MIN: met / missed
    [[ $1 == - ]] && { echo "-"; return; }
    awk -v r="$1" -v m="$2" 'BEGIN { print (r >= m ? "met" : "**missed**") }'
}
show() { [[ $1 =~ ^[0-9.]+$ ]] && echo "$1" || echo "cached ($1)"; }

host=$(hostname -s 2>/dev/null || echo host)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$root/bench/results/dom0-$host-$stamp
mkdir -p "$root/bench/results"
cp "$csv" "$out.csv"
for s in "${stacks[@]}"; do
    echo "== PostMark on $s"
    cat "$work/pm-$s.out"
done >"$out.postmark.txt"
{
    echo "### dom0 file system benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- machine: $host, $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) RAM, Linux $(uname -r); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- files: $(df -T "$base_dir" | awk 'NR == 2 { print $2 " on " $1 }') ($base_dir)"
    echo "- command: \`$cmdline\` (git $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo ", with local changes"))"
    echo "- stack: NBD on a unix socket -> nbdfuse -> loop (direct I/O) -> ext4; parallax: \`parallax serve${serve_args:+ $serve_args}\` ($([[ $serve_args == *--nbdkit* ]] && echo "nbdkit plugin" || echo "built-in NBD server")), $vsize VDI; direct: \`nbdkit file\` ${direct_args[*]:-(default cache)}, $vsize sparse raw file"
    echo "- Bonnie++ $size MiB, -f -D (block I/O, O_DIRECT writes); PostMark $pm_files files, $pm_trans transactions; drop_caches before every run; dirty limit per loop device: $( ((dirty_mib > 0)) && echo "$dirty_mib MiB (strict)" || echo none)"
    echo
    echo "| benchmark | parallax | direct | parallax/direct | target |"
    echo "| --- | ---: | ---: | ---: | --- |"
    for phase in cold warm; do
        for m in "11 block write (KiB/s)" "13 rewrite (KiB/s)" "17 block read (KiB/s)" "19 random seeks (/s)"; do
            f=${m%% *}
            a=$(field "parallax-$phase" "$f")
            b=$(field "direct-$phase" "$f")
            r=$(ratio "$a" "$b")
            target="-"
            if [[ $phase == warm && $f == 11 ]]; then target="≥ 0.95: $(verdict "$r" 0.95)"; fi
            echo "| Bonnie++ $phase: ${m#* } | $(show "$a") | $(show "$b") | $r | $target |"
        done
    done
    r=$(ratio "${pm_wall[direct]}" "${pm_wall[parallax]}")
    echo "| PostMark, ms (ratio: direct time / parallax time) | ${pm_wall[parallax]} | ${pm_wall[direct]} | $r | ≥ 0.90: $(verdict "$r" 0.90) |"
    r=$(ratio "${pm_sync[direct]}" "${pm_sync[parallax]}")
    echo "| PostMark + sync, ms (same ratio) | ${pm_sync[parallax]} | ${pm_sync[direct]} | $r | ≥ 0.90: $(verdict "$r" 0.90) |"
    echo "| filling the free space before the warm run, s | ${fill_s[parallax]} | ${fill_s[direct]} | - | - |"
} >"$out.md"
cat "$out.md"
echo "saved: ${out#"$root"/}.md .csv .postmark.txt" >&2
