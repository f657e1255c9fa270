# bench/suite/lib.sh - shared by bench/suite/run.sh (sourced, not run).
#
# Servers: every server is started in the background, its pid recorded, its sockets waited for
# with a bounded wait, and stopped by pid (suite_cleanup, run from the EXIT trap, stops whatever
# is still running, newest first). File systems over NBD: nbdfuse -> losetup (direct I/O) ->
# ext4, torn down in reverse order.
# shellcheck shell=bash

SUITE_PIDS=()   # pids we started and must stop
SUITE_MOUNTS=() # "mnt|loopdev|fusedir|nbdfuse-pid|bdi-restore" stacks to tear down

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "FATAL: $*"
    exit 1
}

# wait_for TEST-ARGS... : until `test ARGS` holds, at most $WAIT_S seconds (default 20).
wait_for() {
    local i n=$((${WAIT_S:-20} * 20))
    for ((i = 0; i < n; i++)); do
        test "$@" && return 0
        sleep 0.05
    done
    return 1
}

track_pid() { SUITE_PIDS+=("$1"); }

# stop_pid PID: SIGTERM, wait up to 10 s, then SIGKILL. Only pids this script started.
stop_pid() {
    local pid=$1 i
    [[ -n $pid ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
    local keep=() p
    for p in "${SUITE_PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    SUITE_PIDS=("${keep[@]}")
}

# ---- Parallax ---------------------------------------------------------------------------------

# plx_format STORE SIZE: a fresh file blockstore.
plx_format() {
    rm -f "$1"
    "$PARALLAX" -b "$1" format --size "$2" --extent-size "${PLX_EXTENT:-256M}" >/dev/null
}

# plx_start STORE SOCK LOG: `parallax serve` in the background; sets PLX_PID and PLX_CTL (the
# control socket that `parallax vdi-snapshot` uses). PARALLAX_RUN_DIR must be set.
plx_start() {
    local store=$1 sock=$2 logf=$3
    rm -f "$sock"
    "$PARALLAX" -b "$store" serve --unix "$sock" ${PLX_PLACEMENT:+--placement "$PLX_PLACEMENT"} >"$logf" 2>&1 &
    PLX_PID=$!
    track_pid "$PLX_PID"
    PLX_CTL=$PARALLAX_RUN_DIR/serve-$PLX_PID.sock
    WAIT_S=20 wait_for -S "$sock" || die "parallax serve: no socket $sock after 20 s: $(cat "$logf")"
    WAIT_S=20 wait_for -S "$PLX_CTL" || die "parallax serve: no control socket $PLX_CTL: $(cat "$logf")"
}

# plx_vdi_id STORE NAME
plx_vdi_id() { "$PARALLAX" -b "$1" vdi-list --json | jq -r --arg n "$2" '.[] | select(.name == $n) | .id'; }

# plx_meta STORE: reachable metadata blocks (used - leaked; a running server claims blocks in
# chunks, and its claimed but unlinked blocks count as leaked), the raw used count, and the
# reachable data blocks, as "REACHABLE USED DATA".
plx_meta() {
    "$PARALLAX" -b "$1" info --json |
        jq -r '"\(.blocks_used.metadata - .blocks_leaked.metadata) \(.blocks_used.metadata) \(.blocks_used.data - .blocks_leaked.data)"'
}

# hold_start SOCK EXPORT: keep one NBD connection open (the VDI stays open in the server, so
# snapshots are live ones, carried out by the server). Sets HOLD_PID.
hold_start() {
    local ready=$SUITE_TMP/hold-$RANDOM.ready
    python3 "$SUITE_DIR/suite.py" hold --nbd "$1" --export "$2" --ready "$ready" &
    HOLD_PID=$!
    track_pid "$HOLD_PID"
    WAIT_S=20 wait_for -e "$ready" || die "could not hold a connection to $2 on $1"
}

# ---- qemu-storage-daemon ------------------------------------------------------------------------

# qsd_start FORMAT IMAGE SOCK QMP LOG: serve IMAGE (raw or qcow2; cache.direct=on, aio=native)
# as NBD export "v". qcow2 nodes are q0 (base), q1, ...; the export is created on q0 and follows
# each new top after blockdev-snapshot-sync. Sets QSD_PID.
qsd_start() {
    local fmt=$1 img=$2 sock=$3 qmp=$4 logf=$5 node
    node=$([[ $fmt == qcow2 ]] && echo q0 || echo r0)
    rm -f "$sock" "$qmp"
    qemu-storage-daemon \
        --blockdev "driver=file,node-name=f0,filename=$img,cache.direct=on,aio=native" \
        --blockdev "driver=$fmt,node-name=$node,file=f0" \
        --nbd-server "addr.type=unix,addr.path=$sock" \
        --export "type=nbd,id=e0,node-name=$node,name=v,writable=on" \
        --chardev "socket,id=qmp,path=$qmp,server=on,wait=off" --monitor chardev=qmp \
        >"$logf" 2>&1 &
    QSD_PID=$!
    track_pid "$QSD_PID"
    WAIT_S=20 wait_for -S "$sock" || die "qemu-storage-daemon: no socket $sock after 20 s: $(cat "$logf")"
    WAIT_S=20 wait_for -S "$qmp" || die "qemu-storage-daemon: no QMP socket $qmp: $(cat "$logf")"
}

# ---- fio ----------------------------------------------------------------------------------------

# fio_nbd OUT.json SOCK EXPORT ARGS...: run fio's nbd engine, save its JSON (the engine prints a
# line before it: the JSON is taken from the first "{").
fio_nbd() {
    local out=$1 sock=$2 export=$3
    shift 3
    local raw c0=""
    [[ -n ${CPU_PID:-} ]] && c0=$(proc_cpu_ticks "$CPU_PID")
    if ! raw=$(fio --name=j --ioengine=nbd --uri="nbd+unix:///$export?socket=$sock" --output-format=json "$@" 2>&1); then
        [[ -n ${FIO_NO_DIE:-} ]] && return 1
        die "fio failed ($*): $raw"
    fi
    # the server's CPU time during the run (user + system, seconds)
    [[ -n $c0 ]] && awk -v a="$c0" -v b="$(proc_cpu_ticks "$CPU_PID")" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.3f\n", (b - a) / hz }' >"${out%.json}.cpu"
    sed -n '/^{/,$p' <<<"$raw" >"$out"
    if ! jq -e '.jobs[0].error == 0' "$out" >/dev/null 2>&1; then
        [[ -n ${FIO_NO_DIE:-} ]] && return 1
        die "fio reported an error ($*): $(head -c 2000 <<<"$raw")"
    fi
}

# proc_cpu_ticks PID: user + system clock ticks of the process, all its threads.
proc_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# fio_value FILE: IOPS for 4 KiB jobs, MiB/s otherwise (read + write).
fio_value() {
    jq -r '.jobs[0] as $j | ($j["job options"].bs // "4k") as $bs |
        if ($bs == "4k" or $bs == "4096") then ($j.read.iops + $j.write.iops)
        else (($j.read.bw_bytes + $j.write.bw_bytes) / 1048576) end' "$1"
}

# ---- file systems over NBD -----------------------------------------------------------------------

# fs_up SOCK EXPORT DIR [mkfs]: nbdfuse DIR/fuse/disk -> loop (direct I/O) -> ext4 on DIR/mnt.
# With "mkfs", makes the file system first (no discard, no lazy init, so nothing runs behind
# the benchmark). With FS_DIRTY_MIB set (> 0), the loop device gets a strict per-device limit of
# that many MiB of dirty pages (strict_limit and max_bytes in /sys/class/bdi; the old values are
# put back at teardown), so buffered writers are throttled to the device's own writeback instead
# of filling the page cache of a machine with far more RAM than the benchmark writes. Sets FS_MNT.
fs_up() {
    local sock=$1 export=$2 dir=$3 mk=${4:-} fpid loop bdi restore=""
    mkdir -p "$dir/fuse" "$dir/mnt"
    rm -f "$dir/nbdfuse.pid"
    nbdfuse -P "$dir/nbdfuse.pid" "$dir/fuse/disk" "nbd+unix:///$export?socket=$sock" >"$dir/nbdfuse.log" 2>&1 &
    fpid=$!
    track_pid "$fpid"
    WAIT_S=20 wait_for -s "$dir/nbdfuse.pid" || die "nbdfuse did not start: $(cat "$dir/nbdfuse.log")"
    loop=$(losetup -f --show --direct-io=on "$dir/fuse/disk") || die "losetup failed"
    if ((${FS_DIRTY_MIB:-0} > 0)); then
        bdi=/sys/class/bdi/$(($(stat -c '0x%t' "$loop"))):$(($(stat -c '0x%T' "$loop")))
        if [[ -w $bdi/strict_limit && -w $bdi/max_bytes && -w $bdi/max_ratio ]]; then
            # max_ratio_fine (parts per million) where the kernel has it: restores exactly
            local attr=max_ratio
            [[ -w $bdi/max_ratio_fine ]] && attr=max_ratio_fine
            restore="$bdi,$attr,$(cat "$bdi/$attr"),$(cat "$bdi/strict_limit")"
        fi
    fi
    SUITE_MOUNTS+=("$dir/mnt|$loop|$dir/fuse|$fpid|$restore")
    if [[ -n $restore ]]; then
        echo $((FS_DIRTY_MIB << 20)) >"$bdi/max_bytes" || die "cannot set $bdi/max_bytes"
        echo 1 >"$bdi/strict_limit" || die "cannot set $bdi/strict_limit"
    elif ((${FS_DIRTY_MIB:-0} > 0)); then
        die "cannot limit the dirty pages of $loop (no writable strict_limit/max_bytes in ${bdi:-/sys/class/bdi})"
    fi
    if [[ $mk == mkfs ]]; then
        mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$loop" || die "mkfs.ext4 $loop"
    fi
    mount "$loop" "$dir/mnt" || die "mount $loop"
    # shellcheck disable=SC2034 # used by run.sh
    FS_MNT=$dir/mnt
}

# fs_remount DIR: unmount and mount again (drops this file system's page cache, and only its).
fs_remount() {
    local s m l
    for s in "${SUITE_MOUNTS[@]}"; do
        IFS='|' read -r m l _ _ _ <<<"$s"
        if [[ $m == "$1/mnt" ]]; then
            umount "$m" || die "unmount $m"
            mount "$l" "$m" || die "mount $m"
            return 0
        fi
    done
    die "fs_remount: $1 is not mounted by the suite"
}

# fs_down DIR: tear down the stack fs_up built on DIR.
fs_down() {
    local keep=() s m l f p r
    for s in "${SUITE_MOUNTS[@]}"; do
        IFS='|' read -r m l f p r <<<"$s"
        if [[ $m == "$1/mnt" ]]; then
            _fs_teardown "$m" "$l" "$f" "$p" "$r"
        else
            keep+=("$s")
        fi
    done
    SUITE_MOUNTS=("${keep[@]}")
}

# _fs_teardown MNT LOOP FUSEDIR NBDFUSE-PID BDI-RESTORE ("bdi-dir,ratio-attr,value,strict_limit"
# or "")
_fs_teardown() {
    local m=$1 l=$2 f=$3 p=$4 r=${5:-} i bdi attr ratio strict
    mountpoint -q "$m" && { umount "$m" || umount -l "$m"; }
    if [[ -n $r ]]; then
        IFS=, read -r bdi attr ratio strict <<<"$r"
        echo "$strict" >"$bdi/strict_limit" 2>/dev/null || log "warning: could not restore $bdi/strict_limit"
        echo "$ratio" >"$bdi/$attr" 2>/dev/null || log "warning: could not restore $bdi/$attr"
    fi
    losetup -d "$l" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        losetup "$l" >/dev/null 2>&1 || break
        sleep 0.05
    done
    fusermount3 -u "$f" 2>/dev/null || true
    stop_pid "$p"
}

# ---- cleanup --------------------------------------------------------------------------------------

suite_cleanup() {
    local i m l f p r
    for ((i = ${#SUITE_MOUNTS[@]} - 1; i >= 0; i--)); do
        IFS='|' read -r m l f p r <<<"${SUITE_MOUNTS[i]}"
        _fs_teardown "$m" "$l" "$f" "$p" "$r"
    done
    SUITE_MOUNTS=()
    for ((i = ${#SUITE_PIDS[@]} - 1; i >= 0; i--)); do
        stop_pid "${SUITE_PIDS[i]}"
    done
}

# ---- the machine ------------------------------------------------------------------------------------

# machine_json DATA_DIR
machine_json() {
    local dir=$1 commit dirty
    commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -c . || true)
    jq -n --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        --arg commit "$commit" --arg dirty "$dirty files modified or untracked" \
        --arg host "$(hostname -s 2>/dev/null || echo host)" \
        --arg nproc "$(nproc)" \
        --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
        --arg mem "$(awk '/MemTotal/ {printf "%.1f", $2/1048576}' /proc/meminfo)" \
        --arg kernel "$(uname -r)" \
        --arg dir "$dir" \
        --arg fs "$(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}')" \
        --arg qemu "$(qemu-storage-daemon --version | head -1)" \
        --arg fio "$(fio --version)" \
        --arg nbdkit "$(nbdkit --version | head -1)" \
        --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" \
        --arg bin "${PLX_BIN_NOTE:-}" \
        '{date: $date, git_commit: $commit, git_dirty: $dirty, hostname: $host, nproc: ($nproc|tonumber),
          cpu: $cpu, mem_gib: $mem, kernel: $kernel, data_dir: $dir, data_fs: $fs, qemu: $qemu,
          fio: $fio, nbdkit: $nbdkit, load_before: $load, parallax_binary: $bin}'
}
