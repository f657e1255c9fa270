#!/usr/bin/env bash
# The side-by-side benchmark suite: Parallax vs qcow2 (with live external snapshots) vs direct
# (a raw file), all reached the same way, NBD over a unix socket, so that only the storage
# behind the socket differs. Parallax: `parallax serve` on a file blockstore. qcow2 and direct:
# qemu-storage-daemon (cache.direct=on, aio=native). Sections (thesis chapter 5):
#   depth      fio 4k randread/randwrite QD32, 1M read/write QD8 at snapshot depth 1..1000
#   latency    snapshot latency histograms, idle and busy disk (figure 5.7)
#   frequency  sequential write and untar on ext4 with a snapshot every 1 s .. 10 ms;
#              metadata per snapshot (figures 5.8, 5.9)
#   fs         Bonnie++ and PostMark on ext4, cold and warm (figures 5.1-5.4)
#   placement  reads of a VDI written in random vs sequential order (figure 5.5)
#
#   bench/suite/run.sh               full suite (< 30 min on 2 cores); results in
#                                    bench/results/suite-HOST-STAMP/, plots in bench/plots/
#   bench/suite/run.sh --quick       smaller sizes and fewer points (~5 min)
#   bench/suite/run.sh --smoke       tiny sizes: proves every step works (~1 min); output goes
#                                    to a temporary directory, removed unless --keep
#   options: --dir DIR (data directory, default /var/tmp; use a real disk, not tmpfs)
#            --only "depth latency ..." (sections to run)   --keep (keep smoke output)
#
# Needs (Debian 12): qemu-system-common (qemu-storage-daemon), qemu-utils, nbdkit, libnbd-bin
# (nbdfuse), fuse3, fio, jq, python3, gnuplot-nox, bonnie++, postmark, e2fsprogs, util-linux.

# Per-disk variables (dp_sock, fr_store, ...) are set by sys_start through printf -v.
# shellcheck disable=SC2154
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE_DIR=$ROOT/bench/suite
# shellcheck source=bench/suite/lib.sh
. "$SUITE_DIR/lib.sh"

MODE=full
BASE_DIR=/var/tmp
ONLY="depth latency frequency fs placement"
KEEP=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --smoke) MODE=smoke ;;
    --quick) MODE=quick ;;
    --dir) BASE_DIR=$2 && shift ;;
    --only) ONLY=$2 && shift ;;
    --keep) KEEP=1 ;;
    -h | --help)
        sed -n '2,22p' "$0"
        exit 0
        ;;
    *)
        echo "usage: bench/suite/run.sh [--smoke|--quick] [--dir DIR] [--only SECTIONS] [--keep]" >&2
        exit 2
        ;;
    esac
    shift
done

case $MODE in
full)
    VDI=1G RUNTIME=3 REPS=2 DEPTHS="1 10 100 1000" GROW_KIB=16 QCOW2_BUDGET=480 QCOW2_MAX_CHAIN=1000
    LAT_IDLE=500 LAT_CLI=200 LAT_BUSY=200 LAT_BUSY_CLI=100
    INTERVALS="1 0.1 0.02 0.01" ROUNDS=2 TRICKLE_S=10 FREQ_VDI=1G FREQ_LOOPS=2 UNTAR_COPIES=4
    FS_VDI=2G BONNIE_S=1024 BONNIE_R=512 PM_FILES=20000 PM_TX=50000 DD_MB=1024
    PLACE=512M
    ;;
quick)
    VDI=256M RUNTIME=2 REPS=1 DEPTHS="1 10 100" GROW_KIB=8 QCOW2_BUDGET=60 QCOW2_MAX_CHAIN=1000
    LAT_IDLE=100 LAT_CLI=30 LAT_BUSY=50 LAT_BUSY_CLI=20
    INTERVALS="1 0.1 0.01" ROUNDS=1 TRICKLE_S=5 FREQ_VDI=256M FREQ_LOOPS=2 UNTAR_COPIES=1
    FS_VDI=1G BONNIE_S=256 BONNIE_R=128 PM_FILES=2000 PM_TX=5000 DD_MB=256
    PLACE=128M
    ;;
smoke)
    VDI=32M RUNTIME=1 REPS=1 DEPTHS="2" GROW_KIB=4 QCOW2_BUDGET=20 QCOW2_MAX_CHAIN=1000
    LAT_IDLE=10 LAT_CLI=3 LAT_BUSY=5 LAT_BUSY_CLI=2
    INTERVALS="0.05" ROUNDS=1 TRICKLE_S=1 FREQ_VDI=32M FREQ_LOOPS=1 UNTAR_COPIES=1
    FS_VDI=128M BONNIE_S=16 BONNIE_R=8 PM_FILES=100 PM_TX=200 DD_MB=16
    PLACE=8M
    ;;
esac

for c in qemu-storage-daemon qemu-img nbdkit nbdfuse fusermount3 fio jq python3 gnuplot \
    bonnie++ postmark mkfs.ext4 losetup; do
    command -v "$c" >/dev/null || die "missing command: $c (see the package list at the top of $0)"
done
# File systems over NBD need root, FUSE and a free loop device; without them the untar workload
# and the fs section are skipped with a note.
CAN_FS=1
FS_WHY=""
if [[ $(id -u) -ne 0 ]]; then
    CAN_FS=0 FS_WHY="not root"
elif [[ ! -c /dev/fuse ]]; then
    CAN_FS=0 FS_WHY="no /dev/fuse"
elif ! losetup -f >/dev/null 2>&1; then
    CAN_FS=0 FS_WHY="no free loop device"
fi
[[ $(stat -f -c %T "$BASE_DIR") != tmpfs ]] || die "$BASE_DIR is tmpfs: give --dir on a real disk"

# ---- build ----------------------------------------------------------------------------------------
if [[ -z ${PARALLAX:-} ]]; then
    make -C "$ROOT" -s all >/dev/null || die "make all failed"
    PARALLAX=$ROOT/build/parallax
fi
export PARALLAX

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
HOST=$(hostname -s 2>/dev/null || echo host)
DATA=$BASE_DIR/plx-suite-$$
SUITE_TMP=$DATA/tmp
if [[ $MODE == smoke ]]; then
    OUT=$DATA/out
    PLOTS=$OUT/plots
else
    OUT=$ROOT/bench/results/suite-$HOST-$STAMP${MODE/full/}
    [[ $MODE == quick ]] && OUT=$ROOT/bench/results/suite-$HOST-$STAMP-quick
    PLOTS=$ROOT/bench/plots
fi
RAW=$OUT/raw
mkdir -p "$DATA" "$SUITE_TMP" "$RAW"/{depth,latency,freq,fs,place} "$PLOTS"
export PARALLAX_RUN_DIR=$DATA/run
mkdir -p "$PARALLAX_RUN_DIR"
S="python3 $SUITE_DIR/suite.py"

on_exit() {
    local rc=$?
    set +e
    suite_cleanup
    if [[ $MODE == smoke && $KEEP -eq 0 ]]; then
        rm -rf "$DATA"
    else
        # keep the output; drop the images
        find "$DATA" -mindepth 1 -maxdepth 1 ! -name out -exec rm -rf {} + 2>/dev/null
        rmdir "$DATA" 2>/dev/null
    fi
    exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

T_START=$(date +%s)
note() { printf '%s\n' "$*" >>"$RAW/notes.txt"; }
: >"$RAW/notes.txt"
((CAN_FS)) || note "SKIPPED: the untar workload of the frequency section needs ext4 over nbdfuse + loop ($FS_WHY)."
machine_json "$BASE_DIR" >"$RAW/machine.json"
log "suite ($MODE): data in $DATA, results in $OUT"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
note "Open-file limit for the servers: $(ulimit -n) (a qcow2 chain keeps one descriptor per image)."

bytes() { numfmt --from=iec "$1"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f\n", b - a }'; }

# ---- system handles ----------------------------------------------------------------------------
# sys_start SYS NAME SIZE: a fresh disk of SIZE for system SYS (parallax|qcow2|direct), served on
# $DATA/NAME.sock as export "v" (Parallax: a store of its own, the VDI held open by one
# connection so snapshots are live). Sets the variables NAME_{pid,sock,ctl,id,store,qdir,qmp,hold}.
sys_start() {
    local sys=$1 name=$2 size=$3 d=$DATA/$2
    mkdir -p "$d"
    case $sys in
    parallax)
        # sparse, so generous: the depth section rewrites the whole disk after each snapshot
        local ssize=$(($(bytes "$size") * 16 + (1 << 30)))
        plx_format "$d/store.img" "$ssize"
        "$PARALLAX" -b "$d/store.img" vdi-create v --size "$size" >/dev/null
        plx_start "$d/store.img" "$d/nbd.sock" "$d/serve.log"
        hold_start "$d/nbd.sock" v
        printf -v "${name}_pid" %s "$PLX_PID"
        printf -v "${name}_ctl" %s "$PLX_CTL"
        printf -v "${name}_hold" %s "$HOLD_PID"
        printf -v "${name}_id" %s "$(plx_vdi_id "$d/store.img" v)"
        printf -v "${name}_store" %s "$d/store.img"
        ;;
    qcow2)
        qemu-img create -q -f qcow2 "$d/q0.qcow2" "$size"
        qsd_start qcow2 "$d/q0.qcow2" "$d/nbd.sock" "$d/qmp.sock" "$d/qsd.log"
        printf -v "${name}_pid" %s "$QSD_PID"
        printf -v "${name}_qmp" %s "$d/qmp.sock"
        printf -v "${name}_qdir" %s "$d"
        ;;
    direct)
        fallocate -l "$size" "$d/disk.raw"
        qsd_start raw "$d/disk.raw" "$d/nbd.sock" "$d/qmp.sock" "$d/qsd.log"
        printf -v "${name}_pid" %s "$QSD_PID"
        ;;
    esac
    printf -v "${name}_sock" %s "$d/nbd.sock"
    printf -v "${name}_sys" %s "$sys"
}

# sys_restart NAME: stop the server and start it again on the same disk (cold caches).
sys_restart() {
    local name=$1 d=$DATA/$1 sys pid hold
    sys=${name}_sys sys=${!sys}
    pid=${name}_pid
    hold=${name}_hold
    [[ -n ${!hold:-} ]] && stop_pid "${!hold}"
    stop_pid "${!pid}"
    case $sys in
    parallax)
        plx_start "$d/store.img" "$d/nbd.sock" "$d/serve.log"
        hold_start "$d/nbd.sock" v
        printf -v "${name}_pid" %s "$PLX_PID"
        printf -v "${name}_ctl" %s "$PLX_CTL"
        printf -v "${name}_hold" %s "$HOLD_PID"
        ;;
    qcow2)
        qsd_start qcow2 "$d/q0.qcow2" "$d/nbd.sock" "$d/qmp.sock" "$d/qsd.log"
        printf -v "${name}_pid" %s "$QSD_PID"
        ;;
    direct)
        qsd_start raw "$d/disk.raw" "$d/nbd.sock" "$d/qmp.sock" "$d/qsd.log"
        printf -v "${name}_pid" %s "$QSD_PID"
        ;;
    esac
}

# sys_stop NAME: stop the server (and holder) and delete the disk.
sys_stop() {
    local name=$1 pid=${1}_pid hold=${1}_hold
    [[ -n ${!hold:-} ]] && stop_pid "${!hold}"
    stop_pid "${!pid}"
    printf -v "${name}_hold" %s ""
    rm -rf "${DATA:?}/$name"
}

# snap_args NAME: the suite.py options that take live snapshots of NAME's disk.
snap_args() {
    local name=$1 sys=${1}_sys
    case ${!sys} in
    parallax)
        local ctl=${name}_ctl id=${name}_id
        echo "--plx-ctl ${!ctl} --vdi-id ${!id}"
        ;;
    qcow2)
        local qmp=${name}_qmp qdir=${name}_qdir
        echo "--qmp ${!qmp} --qcow2-dir ${!qdir}"
        ;;
    esac
}

sockof() { local v=${1}_sock && echo "${!v}"; }

fill() { # fill NAME SIZE: sequential 1 MiB writes over the whole disk
    fio_nbd "$SUITE_TMP/fill.json" "$(sockof "$1")" v --rw=write --bs=1M --iodepth=8 --size="$2"
}

# ==== 1. throughput against snapshot depth ======================================================
section_depth() {
    log "depth: filling three $VDI disks"
    local sys d cur_p=0 cur_q=0 left=$QCOW2_BUDGET job
    sys_start parallax dp "$VDI"
    sys_start qcow2 dq "$VDI"
    sys_start direct dd "$VDI"
    for n in dp dq "dd"; do fill "$n" "$VDI"; done
    local -A JOBARGS=(
        [4k-randread]="--rw=randread --bs=4k --iodepth=32"
        [4k-randwrite]="--rw=randwrite --bs=4k --iodepth=32"
        [1M-read]="--rw=read --bs=1M --iodepth=8"
        [1M-write]="--rw=write --bs=1M --iodepth=8"
    )
    for d in $DEPTHS; do
        log "depth $d: parallax snapshots $cur_p -> $d"
        # shellcheck disable=SC2046
        $S grow $(snap_args dp) --nbd "$dp_sock" --export v --count $((d - cur_p)) \
            --write-kib "$GROW_KIB" --seed "$d" >"$RAW/depth/grow-parallax-$d.json"
        cur_p=$d
        if ((cur_q < d)); then
            if ((left > 0)); then
                log "depth $d: qcow2 snapshots $cur_q -> $d (budget left ${left}s)"
                # shellcheck disable=SC2046
                $S grow $(snap_args dq) --nbd "$dq_sock" --export v --count $((d - cur_q)) \
                    --write-kib "$GROW_KIB" --seed "$d" --budget "$left" >"$RAW/depth/grow-qcow2-$d.json"
                local got secs
                got=$(jq .count "$RAW/depth/grow-qcow2-$d.json")
                secs=$(jq '.seconds | floor' "$RAW/depth/grow-qcow2-$d.json")
                cur_q=$((cur_q + got))
                left=$((left - secs - 1))
                ((cur_q < d)) && note "qcow2 reached depth $cur_q of $d within its snapshot budget of ${QCOW2_BUDGET}s; its row for depth $d is measured at depth $cur_q."
            else
                note "qcow2 snapshot budget spent: depth $d measured at qcow2 depth $cur_q."
            fi
        fi
        echo "$cur_q" >"$RAW/depth/qcow2-depth-at-$d"
        for job in 4k-randread 1M-read 4k-randwrite 1M-write; do
            for ((rep = 1; rep <= REPS; rep++)); do
                for sys in parallax qcow2 direct; do
                    local n=dp
                    [[ $sys == qcow2 ]] && n=dq
                    [[ $sys == direct ]] && n="dd"
                    local pidv=${n}_pid
                    # shellcheck disable=SC2086
                    CPU_PID=${!pidv} fio_nbd "$RAW/depth/$sys-d$d-$job-r$rep.json" "$(sockof $n)" v ${JOBARGS[$job]} \
                        --size="$VDI" --runtime="$RUNTIME" --time_based
                done
                log "depth $d $job #$rep: parallax $(fio_value "$RAW/depth/parallax-d$d-$job-r$rep.json" | cut -d. -f1)" \
                    "qcow2 $(fio_value "$RAW/depth/qcow2-d$d-$job-r$rep.json" | cut -d. -f1)" \
                    "direct $(fio_value "$RAW/depth/direct-d$d-$job-r$rep.json" | cut -d. -f1)"
            done
        done
    done
    # Where does the qcow2 export point after the snapshots? (QEMU 7.2: at the new top.)
    $S qmp --qmp "$dq_qmp" query-block-exports >"$RAW/depth/qcow2-exports.json"
    note "qcow2 live snapshots: blockdev-snapshot-sync on the current top (node q<N>) with snapshot-node-name q<N+1>; in $(qemu-storage-daemon --version | head -1) the NBD export created on q0 follows the new top by itself (after the run query-block-exports names node $(jq -r '.[0]["node-name"]' "$RAW/depth/qcow2-exports.json")), so no blockdev-snapshot with a pre-created overlay and no re-added export is needed."
    jq -n --arg runtime "$RUNTIME" --arg vdi "$VDI" --arg depths "$DEPTHS" --arg kib "$GROW_KIB" --arg reps "$REPS" \
        '{runtime: ($runtime|tonumber), vdi_size: $vdi, depths: ($depths|split(" ")|map(tonumber)), write_kib: ($kib|tonumber), reps: ($reps|tonumber)}' \
        >"$RAW/depth/params.json"
    sys_stop dp
    sys_stop dq
    sys_stop dd
}

# ==== 2. snapshot latency ========================================================================
section_latency() {
    log "latency: idle ($LAT_IDLE snapshots each, $LAT_CLI through the parallax command)"
    sys_start parallax lp "$VDI"
    sys_start qcow2 lq "$VDI"
    # shellcheck disable=SC2046
    $S snaplat $(snap_args lp) $(snap_args lq) --cli "$PARALLAX" --store "$lp_store" --vdi v \
        --count "$LAT_IDLE" --cli-count "$LAT_CLI" >"$RAW/latency/idle.json"
    # Busy: a fresh qcow2 chain (its snapshot time grows with the chain), and both disks under
    # 4 KiB random writes at QD 32 while the snapshots are taken.
    sys_stop lq
    sys_start qcow2 lq "$VDI"
    log "latency: busy ($LAT_BUSY snapshots each under fio randwrite QD32 on both disks)"
    local f1 f2
    fio --name=busy --ioengine=nbd --uri="nbd+unix:///v?socket=$lp_sock" --rw=randwrite --bs=4k \
        --iodepth=32 --size="$VDI" --time_based --runtime=3600 --output-format=json \
        >"$SUITE_TMP/busy-parallax.out" 2>&1 &
    f1=$!
    track_pid $f1
    fio --name=busy --ioengine=nbd --uri="nbd+unix:///v?socket=$lq_sock" --rw=randwrite --bs=4k \
        --iodepth=32 --size="$VDI" --time_based --runtime=3600 --output-format=json \
        >"$SUITE_TMP/busy-qcow2.out" 2>&1 &
    f2=$!
    track_pid $f2
    sleep 1
    # shellcheck disable=SC2046
    $S snaplat $(snap_args lp) $(snap_args lq) --cli "$PARALLAX" --store "$lp_store" --vdi v \
        --count "$LAT_BUSY" --cli-count "$LAT_BUSY_CLI" >"$RAW/latency/busy.json"
    stop_pid $f1
    stop_pid $f2
    for s in parallax qcow2; do
        sed -n '/^{/,$p' "$SUITE_TMP/busy-$s.out" >"$RAW/latency/busy-fio-$s.json"
    done
    sys_stop lp
    sys_stop lq
}

# ==== 3. snapshot frequency ======================================================================
make_tarball() {
    TARBALL=$DATA/tree.tar
    if [[ $MODE == smoke ]]; then
        tar -C /usr/include -cf "$TARBALL" linux
    else
        tar -C /usr -cf "$TARBALL" include
    fi
    jq -n --arg bytes "$(stat -c %s "$TARBALL")" --arg files "$(tar -tf "$TARBALL" | grep -vc '/$')" \
        --arg copies "$UNTAR_COPIES" --arg src "$([[ $MODE == smoke ]] && echo /usr/include/linux || echo /usr/include)" \
        '{bytes: ($bytes|tonumber), files: ($files|tonumber), copies: ($copies|tonumber), source: $src}' \
        >"$RAW/freq/tarball.json"
}

# run_freq WORKLOAD SYS INTERVAL ROUND. A run that fails (the server dies, the workload or the
# snapshot loop fails) is recorded with the reason and the suite goes on.
run_freq() {
    local wl=$1 sys=$2 iv=$3 r=$4 size=$FREQ_VDI lp="" m0="null null" m1="null null" t0 t1
    local value=null unit=MiB/s failed="" maxc=0 spid
    [[ $wl == untar ]] && size=$FS_VDI unit=s
    [[ $sys == qcow2 ]] && maxc=$QCOW2_MAX_CHAIN
    sys_start "$sys" fr "$size"
    spid=$fr_pid
    [[ $wl == untar ]] && fs_up "$fr_sock" v "$DATA/fr" mkfs
    [[ $sys == parallax ]] && m0=$(plx_meta "$fr_store")
    rm -f "$SUITE_TMP/stop" "$SUITE_TMP/loop.ready"
    if [[ $iv != none ]]; then
        # shellcheck disable=SC2046
        $S snaploop $(snap_args fr) --interval "$iv" --stop-file "$SUITE_TMP/stop" --max-count "$maxc" \
            --ready "$SUITE_TMP/loop.ready" >"$SUITE_TMP/loop.json" 2>"$SUITE_TMP/loop.err" &
        lp=$!
        track_pid $lp
        WAIT_S=20 wait_for -e "$SUITE_TMP/loop.ready" || die "snapshot loop did not start: $(cat "$SUITE_TMP/loop.err")"
    fi
    t0=$(date +%s.%N)
    if [[ $wl == seqwrite || $wl == trickle ]]; then
        local args=(--rw=write --bs=1M --iodepth=8 --size="$size" --loops="$FREQ_LOOPS")
        [[ $wl == trickle ]] && args=(--rw=write --bs=4k --iodepth=1 --rate=600k --size="$size"
            --runtime="$TRICKLE_S" --time_based)
        if FIO_NO_DIE=1 fio_nbd "$SUITE_TMP/fw.json" "$fr_sock" v "${args[@]}"; then
            value=$(jq '.jobs[0].write.bw_bytes / 1048576' "$SUITE_TMP/fw.json")
        else
            failed="fio failed"
        fi
        t1=$(date +%s.%N)
    else
        if (
            for ((c = 1; c <= UNTAR_COPIES; c++)); do
                mkdir "$FS_MNT/c$c" && tar -C "$FS_MNT/c$c" -xf "$TARBALL" || exit 1
            done
            sync -f "$FS_MNT"
        ) 2>"$SUITE_TMP/untar.err"; then
            t1=$(date +%s.%N)
            value=$(elapsed "$t0" "$t1")
        else
            t1=$(date +%s.%N)
            failed="untar failed: $(head -c 300 "$SUITE_TMP/untar.err" | tr '\n' ' ')"
        fi
    fi
    if [[ -n $lp ]]; then
        touch "$SUITE_TMP/stop"
        wait "$lp" || failed="${failed:+$failed; }snapshot loop failed: $(jq -r '.error // empty' "$SUITE_TMP/loop.json" 2>/dev/null)"
        rm -f "$SUITE_TMP/stop" "$SUITE_TMP/loop.ready"
    fi
    if ! kill -0 "$spid" 2>/dev/null; then
        local st=0
        wait "$spid" 2>/dev/null || st=$?
        local sig=""
        ((st > 128)) && sig=", signal $((st - 128))"
        failed="${failed:+$failed; }the $sys server exited during the run (status $st$sig)"
        if [[ $sys == qcow2 ]]; then
            local imgs=("$DATA"/fr/q*.qcow2)
            failed+=" with ${#imgs[@]} images in the chain"
        fi
    fi
    [[ $wl == untar ]] && fs_down "$DATA/fr"
    [[ $sys == parallax && -z $failed ]] && m1=$(plx_meta "$fr_store")
    read -r mr0 mu0 <<<"$m0"
    read -r mr1 mu1 <<<"$m1"
    jq -n --arg wl "$wl" --arg sys "$sys" --arg iv "$iv" --arg r "$r" --argjson value "$value" \
        --arg unit "$unit" --arg secs "$(elapsed "$t0" "$t1")" --arg failed "$failed" \
        --argjson mr0 "$mr0" --argjson mu0 "$mu0" --argjson mr1 "$mr1" --argjson mu1 "$mu1" \
        --slurpfile loop <([[ -n $lp && -s $SUITE_TMP/loop.json ]] && cat "$SUITE_TMP/loop.json" || echo null) \
        '{workload: $wl, system: $sys, interval: $iv, round: ($r|tonumber), value: $value,
          unit: $unit, seconds: ($secs|tonumber), failed: (if $failed == "" then null else $failed end),
          meta_reachable_before: $mr0, meta_used_before: $mu0,
          meta_reachable_after: $mr1, meta_used_after: $mu1,
          snapshots: ($loop[0].count // 0), capped: ($loop[0].capped // false),
          mean_interval_s: $loop[0].mean_interval_s,
          snap_latency_ns: ($loop[0].latency_ns // [])}' >"$RAW/freq/$wl-$sys-$iv-r$r.json"
    log "frequency $wl $sys every $iv (round $r): $value $unit, $(jq .snapshots "$RAW/freq/$wl-$sys-$iv-r$r.json") snapshots${failed:+; FAILED: $failed}"
    [[ -n $failed ]] && note "frequency: $wl on $sys, a snapshot every $iv s (round $r) failed: $failed"
    sys_stop fr
}

section_frequency() {
    make_tarball
    note "qcow2 chains are capped at $QCOW2_MAX_CHAIN live snapshots per frequency run: qemu-storage-daemon ($(qemu-storage-daemon --version | head -1 | cut -d' ' -f4-)) crashed with SIGSEGV when a chain reached about 1090 images while ext4 was being written on it (seen twice here). After the cap a run takes no more snapshots; its achieved interval counts the time up to the cap."
    local r iv sys wl
    for ((r = 1; r <= ROUNDS; r++)); do
        for wl in seqwrite $( ((CAN_FS)) && echo untar); do
            for iv in none $INTERVALS; do
                for sys in parallax qcow2; do
                    run_freq "$wl" "$sys" "$iv" "$r"
                done
            done
        done
    done
    # The thesis's kernel build wrote about 0.6 MB/s on average (396 MB in about 11 minutes): a
    # writer at that rate gives the metadata per snapshot at a comparable amount of data per
    # snapshot (one round, no snapshots and the fastest interval).
    local fastest
    fastest=$(tr ' ' '\n' <<<"$INTERVALS" | sort -g | head -1)
    for iv in none "$fastest"; do
        for sys in parallax qcow2; do
            run_freq trickle "$sys" "$iv" 1
        done
    done
    jq -n --arg iv "$INTERVALS" --arg rounds "$ROUNDS" --arg size "$FREQ_VDI" --arg loops "$FREQ_LOOPS" \
        --arg fs "$FS_VDI" --arg ts "$TRICKLE_S" \
        '{intervals: ($iv|split(" ")), rounds: ($rounds|tonumber), seqwrite_size: $size,
          seqwrite_loops: ($loops|tonumber), untar_vdi: $fs, trickle_seconds: ($ts|tonumber)}' >"$RAW/freq/params.json"
}

# ==== 4. Bonnie++ and PostMark ===================================================================
# fs_bench NAME SYS RUN: Bonnie++ (block write, rewrite, read, seeks), a cold sequential read
# (write a file, remount, read it back) and PostMark (+ sync) in NAME's file system.
fs_bench() {
    local name=$1 sys=$2 run=$3 mnt=$DATA/$1/mnt out=$RAW/fs/$2-$3 t0 t1
    rm -rf "${mnt:?}"/*
    bonnie++ -d "$mnt" -s "$BONNIE_S" -r "$BONNIE_R" -n 0 -f -u root -q 2>/dev/null | tail -1 >"$out-bonnie.csv"
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$mnt/big" bs=1M count="$DD_MB" conv=fsync status=none
    t1=$(date +%s.%N)
    elapsed "$t0" "$t1" >"$out-ddwrite.s"
    fs_remount "$DATA/$name"
    t0=$(date +%s.%N)
    dd if="$mnt/big" of=/dev/null bs=1M status=none
    t1=$(date +%s.%N)
    elapsed "$t0" "$t1" >"$out-ddread.s"
    rm -f "$mnt/big"
    mkdir -p "$mnt/pm"
    t0=$(date +%s.%N)
    printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' "$mnt/pm" "$PM_FILES" "$PM_TX" |
        postmark >"$out-postmark.txt"
    local tp
    tp=$(date +%s.%N)
    sync -f "$mnt"
    t1=$(date +%s.%N)
    elapsed "$t0" "$tp" >"$out-postmark-only.s"
    elapsed "$t0" "$t1" >"$out-postmark.s"
    rm -rf "$mnt/pm"
    sync -f "$mnt"
    log "fs $sys $run: bonnie $(cut -d, -f12,14 "$out-bonnie.csv") KB/s (write,rewrite)," \
        "dd read $(printf %.2f "$(cat "$out-ddread.s")") s, postmark+sync $(printf %.2f "$(cat "$out-postmark.s")") s"
}

section_fs() {
    local sys run
    if ((!CAN_FS)); then
        note "SKIPPED: Bonnie++/PostMark and the untar workload need ext4 over nbdfuse + loop ($FS_WHY)."
        return 0
    fi
    log "fs: three $FS_VDI disks, filled, then ext4 (cold = servers just restarted)"
    sys_start parallax fsp "$FS_VDI"
    sys_start qcow2 fsq "$FS_VDI"
    sys_start direct fsd "$FS_VDI"
    for n in fsp fsq fsd; do
        fill "$n" "$FS_VDI"
        sys_restart "$n"
    done
    fs_up "$fsp_sock" v "$DATA/fsp" mkfs
    fs_up "$fsq_sock" v "$DATA/fsq" mkfs
    fs_up "$fsd_sock" v "$DATA/fsd" mkfs
    for run in cold warm; do
        fs_bench fsp parallax "$run"
        fs_bench fsq qcow2 "$run"
        fs_bench fsd direct "$run"
    done
    for n in fsp fsq fsd; do fs_down "$DATA/$n"; done
    jq -n --arg s "$BONNIE_S" --arg r "$BONNIE_R" --arg f "$PM_FILES" --arg t "$PM_TX" --arg dd "$DD_MB" --arg v "$FS_VDI" \
        '{bonnie_mib: ($s|tonumber), bonnie_ram_mib: ($r|tonumber), postmark_files: ($f|tonumber),
          postmark_transactions: ($t|tonumber), dd_mib: ($dd|tonumber), vdi: $v}' >"$RAW/fs/params.json"
    sys_stop fsp
    sys_stop fsq
    sys_stop fsd
}

# ==== 5. random placement ========================================================================
section_placement() {
    local sys order n
    log "placement: $PLACE disks written sequentially and in random order"
    for sys in parallax qcow2 direct; do
        for order in seq rand; do
            n=pl_${sys}_$order
            sys_start "$sys" "$n" "$PLACE"
            if [[ $order == seq ]]; then
                fill "$n" "$PLACE"
            else
                # every 4 KiB block once, in random order (fio's random map)
                fio_nbd "$SUITE_TMP/fill.json" "$(sockof "$n")" v --rw=randwrite --bs=4k \
                    --iodepth=32 --size="$PLACE"
            fi
            sys_restart "$n"
        done
    done
    for ((rep = 1; rep <= REPS; rep++)); do
        for order in seq rand; do
            for sys in parallax qcow2 direct; do
                n=pl_${sys}_$order
                fio_nbd "$RAW/place/$sys-$order-1M-read-r$rep.json" "$(sockof "$n")" v --rw=read --bs=1M \
                    --iodepth=8 --size="$PLACE" --runtime="$RUNTIME" --time_based
                fio_nbd "$RAW/place/$sys-$order-4k-randread-r$rep.json" "$(sockof "$n")" v --rw=randread \
                    --bs=4k --iodepth=32 --size="$PLACE" --runtime="$RUNTIME" --time_based
                log "placement $sys $order #$rep: $(fio_value "$RAW/place/$sys-$order-1M-read-r$rep.json" | cut -d. -f1) MiB/s," \
                    "$(fio_value "$RAW/place/$sys-$order-4k-randread-r$rep.json" | cut -d. -f1) IOPS"
            done
        done
    done
    jq -n --arg p "$PLACE" --arg rt "$RUNTIME" --arg reps "$REPS" '{size: $p, runtime: ($rt|tonumber), reps: ($reps|tonumber)}' >"$RAW/place/params.json"
    for sys in parallax qcow2 direct; do
        for order in seq rand; do sys_stop "pl_${sys}_$order"; done
    done
}

# ---- run ----------------------------------------------------------------------------------------
for sec in $ONLY; do
    case $sec in
    depth | latency | frequency | fs | placement) ;;
    *) die "unknown section $sec" ;;
    esac
    t=$(date +%s)
    "section_$sec"
    echo "$(($(date +%s) - t))" >"$RAW/time-$sec"
    log "$sec: $(($(date +%s) - t)) s"
done

echo "$(($(date +%s) - T_START))" >"$RAW/wall-seconds"
$S assemble --out "$OUT" --mode "$MODE" --plots "$PLOTS"
gnuplot -e "datadir='$OUT/plotdata'; outdir='$PLOTS'" "$SUITE_DIR/plot.gp" ||
    die "gnuplot failed"
$S report --results "$OUT"
log "done in $(($(date +%s) - T_START)) s: $OUT/results.md"
[[ $MODE == smoke ]] || cat "$OUT/results.md"
