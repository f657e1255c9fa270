#!/usr/bin/env bash
# Clones of the golden image: space and boot time, Parallax against qcow2 clones and raw copies.
#
# The golden image is scripts/golden-image.sh's (Debian's cloud kernel, an ext4 root on the disk
# holding busybox and the kernel's modules). Three ways to give N guests their own copy of it:
#
#   Parallax   one file blockstore; the image imported into VDI gold, snapshotted gold@pristine;
#              clone K = `parallax vdi-create cK --from gold@pristine`; all served by one
#              `parallax serve --unix`, QEMU opens nbd+unix:///cK
#   qcow2      the image as a raw base file; clone K = a qcow2 overlay with it as backing file
#              (qemu-img create -b, default 64 KiB clusters); QEMU opens the overlay
#   raw copy   clone K = a copy of the image (cp, holes kept); QEMU opens the copy
#
# Every guest is the same kernel and initramfs under QEMU TCG (-accel tcg, 256 MiB, one vCPU),
# virtio-blk, cache=none.
#
# Space: clones are booted (plx.mode=clone: write 1 MiB of random data and an identity file,
# sync, power off), two at a time, and after 1, 10 and 30 of them (COUNTS) the space used is
# measured: Parallax, the store's used blocks (`parallax info`: system + metadata + data);
# qcow2, the allocated bytes of the base plus every overlay; raw, the allocated bytes of every
# copy. "What the guests wrote" is measured apart from any of the three: the 4 KiB blocks of
# each raw copy that differ from the golden image. Target: Parallax < 1.1 x (one image + what
# the guests wrote).
#
# Boot time: ROUNDS (12) rounds, each booting one fresh clone of each kind in turn (plx.mode=boot),
# one guest at a time; the time from starting QEMU to the guest's first line of user space on
# its root disk ("plx-guest: up", printed by /sbin/init on the disk, after the initramfs switched
# root), polled on the serial log every 10 ms, and to QEMU's exit. Medians. Target: Parallax no
# slower than qcow2.
#
#   bench/clones.sh [--dir DIR] [--out DIR] [--counts "1 10 30"] [--rounds N] [--smoke]
#
# --dir: data directory (default /var/tmp; a mktemp directory inside it is removed at the end).
# --out: results directory (default bench/results/clones-HOST-STAMP; raw outputs are not
# committed). A full run (no --smoke, no --out) also draws bench/plots/clones.png; otherwise the
# figure goes to OUT/clones.png. --smoke: 1 and 2 clones, one round, for make check: fails when
# anything fails, judges no number.
#
# Needs: qemu-system-x86_64, qemu-img, e2fsprogs, cpio, dpkg-deb, jq, python3, gnuplot-nox
# (scripts/install-deps.sh test), and the Debian mirror or a filled package cache.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/vm/lib.sh
. "$ROOT/tests/vm/lib.sh"
PARALLAX=${PARALLAX:-$ROOT/build/parallax}

BASE_DIR=/var/tmp
OUT=""
COUNTS="1 10 30"
ROUNDS=12
SMOKE=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --dir) BASE_DIR=$2 && shift ;;
    --out) OUT=$2 && shift ;;
    --counts) COUNTS=$2 && shift ;;
    --rounds) ROUNDS=$2 && shift ;;
    --smoke) SMOKE=1 COUNTS="1 2" ROUNDS=1 ;;
    -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "usage: bench/clones.sh [--dir DIR] [--out DIR] [--counts LIST] [--rounds N] [--smoke]" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "FATAL: $*"
    exit 1
}
for c in qemu-system-x86_64 qemu-img jq python3 gnuplot; do
    command -v "$c" >/dev/null || die "$c not found (scripts/install-deps.sh test)"
done
[[ -x $PARALLAX ]] || die "$PARALLAX not built (make all)"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
default_out=0
if [[ -z $OUT ]]; then
    OUT=$ROOT/bench/results/clones-$(hostname -s)-$stamp
    [[ $SMOKE -eq 1 ]] && OUT=$ROOT/build/bench-clones-smoke
    default_out=1
fi
mkdir -p "$OUT"
W=$(mktemp -d "$BASE_DIR/plx-clones.XXXXXX")
PIDS=()
cleanup() {
    local p
    set +e
    for p in ${PIDS[@]+"${PIDS[@]}"}; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    rm -rf --one-file-system "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
t_start=$SECONDS

rc=0
golden=$(vm_golden) || rc=$?
[[ $rc -eq 0 ]] || die "no golden image (scripts/golden-image.sh exit $rc)"
img=$golden/root.img
img_size=$(stat -c %s "$img")
alloc() { du -B1 -c "$@" | tail -1 | cut -f1; } # allocated bytes of files
img_alloc=$(alloc "$img")
log "golden image: $(tr '\n' ' ' <"$golden/manifest"); $img_size bytes, $img_alloc allocated"

# ---- the three kinds of clone ------------------------------------------------------------------
store=$W/store.img
sock=$W/nbd.sock
export PARALLAX_RUN_DIR=$W/run
mkdir -p "$PARALLAX_RUN_DIR" "$W/qcow2" "$W/raw" "$W/logs"
"$PARALLAX" -b "$store" format --size 32G --extent-size 64M >/dev/null
"$PARALLAX" -b "$store" vdi-create gold --size "$img_size" >/dev/null
"$PARALLAX" -b "$store" vdi-import gold "$img"
"$PARALLAX" -b "$store" vdi-snapshot gold --label pristine >/dev/null
cp --sparse=always "$img" "$W/qcow2/base.raw"
"$PARALLAX" -b "$store" serve --unix "$sock" >"$W/serve.log" 2>&1 &
srv=$!
PIDS+=("$srv")
for ((i = 0; i < 200; i++)); do
    [[ -S $sock ]] && break
    sleep 0.05
done
[[ -S $sock ]] || die "parallax serve did not start: $(cat "$W/serve.log")"

# make_clone KIND NAME: create the clone; print its QEMU -drive spec.
make_clone() {
    case $1 in
    parallax)
        "$PARALLAX" -b "$store" vdi-create "$2" --from gold@pristine >/dev/null
        echo "file=nbd+unix:///$2?socket=$sock,format=raw"
        ;;
    qcow2)
        qemu-img create -q -f qcow2 -b "$W/qcow2/base.raw" -F raw "$W/qcow2/$2.qcow2"
        echo "file=$W/qcow2/$2.qcow2,format=qcow2"
        ;;
    raw)
        cp --sparse=always "$img" "$W/raw/$2.raw"
        echo "file=$W/raw/$2.raw,format=raw"
        ;;
    esac
}

# used KIND: bytes the clones of KIND occupy now.
used() {
    case $1 in
    parallax)
        "$PARALLAX" -b "$store" info --json |
            jq '(.blocks_used.system + .blocks_used.metadata + .blocks_used.data) * .block_size'
        ;;
    parallax-leaked)
        "$PARALLAX" -b "$store" info --json |
            jq '(.blocks_leaked.system + .blocks_leaked.metadata + .blocks_leaked.data) * .block_size'
        ;;
    qcow2) alloc "$W"/qcow2/* ;;
    raw) alloc "$W"/raw/*.raw ;;
    esac
}

# written: the 4 KiB blocks of the raw copies that differ from the golden image, in bytes.
written() {
    python3 - "$img" "$W"/raw/*.raw <<'EOF'
import sys
B, CH = 4096, 4 << 20
gold, copies = sys.argv[1], sys.argv[2:]
total = 0
for c in copies:
    with open(gold, "rb") as g, open(c, "rb") as f:
        while True:
            a, b = g.read(CH), f.read(CH)
            if not a and not b:
                break
            if a == b:
                continue
            for i in range(0, max(len(a), len(b)), B):
                if a[i:i + B] != b[i:i + B]:
                    total += B
print(total)
EOF
}

# boot_one KIND NAME MODE: boot a guest on clone NAME and wait; fails if the guest fails.
boot_one() {
    local drive pid
    drive=$(make_clone "$1" "$2")
    vm_start "$W/logs/$1-$2.log" "$drive" "$3" "$2"
    pid=$VM_PID
    vm_wait "$pid" "$W/logs/$1-$2.log" 300 || die "guest $2 ($1) failed"
}

# ---- space: boot clones two at a time, measure at each count -----------------------------------
space=$OUT/space.dat
echo "# clones parallax_bytes qcow2_bytes raw_bytes image_plus_written_bytes written_bytes parallax_leaked_bytes" >"$space"
declare -A booted=([parallax]=0 [qcow2]=0 [raw]=0)
for n in $COUNTS; do
    for kind in parallax qcow2 raw; do
        while ((booted[$kind] < n)); do
            k=$((booted[$kind] + 1))
            if ((k + 1 <= n)); then
                boot_one "$kind" "c$k" clone &
                p1=$!
                boot_one "$kind" "c$((k + 1))" clone &
                p2=$!
                wait "$p1" || die "boot of $kind c$k failed"
                wait "$p2" || die "boot of $kind c$((k + 1)) failed"
                booted[$kind]=$((k + 1))
            else
                boot_one "$kind" "c$k" clone
                booted[$kind]=$k
            fi
        done
    done
    for kind in parallax qcow2 raw; do
        for ((k = 1; k <= n; k++)); do
            grep -q "^plx-guest: identity c$k " "$W/logs/$kind-c$k.log" || die "$kind c$k wrote no identity"
        done
    done
    wr=$(written)
    printf '%s %s %s %s %s %s %s\n' "$n" "$(used parallax)" "$(used qcow2)" "$(used raw)" \
        $((img_alloc + wr)) "$wr" "$(used parallax-leaked)" >>"$space"
    log "space after $n clones: $(tail -1 "$space")"
done

# ---- boot time ---------------------------------------------------------------------------------
boots=$OUT/boot.dat
echo "# kind round up_seconds exit_seconds guest_uptime_at_up guest_uptime_at_initramfs" >"$boots"
kinds=(parallax qcow2 raw)
for ((r = 1; r <= ROUNDS; r++)); do
    # Each round starts with another kind, so no kind always boots first.
    for ((j = 0; j < 3; j++)); do
        kind=${kinds[$(((r + j) % 3))]}
        name=b$r
        drive=$(make_clone "$kind" "$name")
        logf=$W/logs/boot-$kind-$r.log
        t0=$(date +%s%N)
        vm_start "$logf" "$drive" boot "$name"
        pid=$VM_PID
        vm_wait_line "$logf" '^plx-guest: up' 300 "$pid" || die "$kind boot $r: no user space"
        t_up=$(date +%s%N)
        vm_wait "$pid" "$logf" 300 || die "$kind boot $r failed"
        t_end=$(date +%s%N)
        g=$(sed -n 's/^plx-guest: up //p' "$logf")
        gi=$(sed -n 's/^plx-initramfs: start //p' "$logf")
        printf '%s %s %.3f %.3f %s %s\n' "$kind" "$r" "$(((t_up - t0) / 1000))e-6" \
            "$(((t_end - t0) / 1000))e-6" "$g" "$gi" >>"$boots"
    done
done
stop() { kill "$1" 2>/dev/null && wait "$1" 2>/dev/null; }
stop "$srv" || true
"$PARALLAX" -b "$store" check >"$OUT/check.txt" || die "parallax check failed: $(cat "$OUT/check.txt")"

# ---- results -----------------------------------------------------------------------------------
plots_dir=$OUT
[[ $SMOKE -eq 0 && $default_out -eq 1 ]] && plots_dir=$ROOT/bench/plots
python3 - "$space" "$boots" "$img_alloc" "$OUT" "$((SECONDS - t_start))" <<'EOF' >"$OUT/results.md"
import statistics, sys
space, boots, img_alloc, out, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
M = 1 << 20
rows = [l.split() for l in open(space) if not l.startswith("#")]
print("| clones | Parallax used | of which claimed ahead | qcow2 (backing file) | raw copies | one image + guests' writes | Parallax / (image + writes) | qcow2 / (image + writes) |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for n, p, q, r, base, wr, leaked in rows:
    p, q, r, base, leaked = int(p), int(q), int(r), int(base), int(leaked)
    print(f"| {n} | {p / M:.1f} MiB | {leaked / M:.1f} MiB | {q / M:.1f} MiB | {r / M:.1f} MiB | {base / M:.1f} MiB | {p / base:.3f} | {q / base:.3f} |")
print()
print("Parallax used: the store's used blocks (system + metadata + data, `parallax info`), with the "
      "server still running; claimed ahead: blocks the running server has claimed for coming "
      "writes but not linked yet (`parallax info` counts them as leaked while it runs).")
print()
print(f"One image: {img_alloc / M:.1f} MiB allocated. Guests' writes: 4 KiB blocks of the raw copies "
      "that differ from the golden image.")
print()
b = {}
for l in open(boots):
    if l.startswith("#"):
        continue
    kind, r, up, end, g, gi = l.split()
    b.setdefault(kind, {})[int(r)] = (float(up), float(end), float(g), float(g) - float(gi))
n_rounds = len(b.get("parallax", {}))
print("| boot (median of %d) | to first line of user space | to power-off | guest uptime at that line | of which initramfs to root's init (guest clock) |" % n_rounds)
print("| --- | ---: | ---: | ---: | ---: |")
med = {}
for kind, label in (("parallax", "Parallax clone (NBD)"), ("qcow2", "qcow2 clone"), ("raw", "raw copy")):
    v = list(b.get(kind, {}).values())
    if not v:
        continue
    up = statistics.median(x[0] for x in v)
    med[kind] = up
    print(f"| {label} | {up:.2f} s | {statistics.median(x[1] for x in v):.2f} s | "
          f"{statistics.median(x[2] for x in v):.2f} s | {statistics.median(x[3] for x in v):.3f} s |")
print()
# Paired: the same round's boots ran close together, under the same load from the rest of the
# machine, so the ratio within a round removes most of that noise.
pairs = [b["parallax"][r][0] / b["qcow2"][r][0] for r in b.get("parallax", {}) if r in b.get("qcow2", {})]
pr = statistics.median(pairs)
pr_raw = statistics.median(b["parallax"][r][0] / b["raw"][r][0] for r in b["parallax"] if r in b.get("raw", {}))
print(f"Paired by round (median of the per-round ratios): Parallax / qcow2 = {pr:.2f}, "
      f"Parallax / raw copy = {pr_raw:.2f}; Parallax faster than qcow2 in "
      f"{sum(1 for x in pairs if x < 1)} of {len(pairs)} rounds.")
print()
last = rows[-1]
ratio = int(last[1]) / int(last[4])
print(f"Targets: {last[0]} clones use {ratio:.3f} x (one image + writes) (target < 1.1: "
      f"{'met' if ratio < 1.1 else 'MISSED'}); boot to user space Parallax / qcow2 = "
      f"{pr:.2f} paired, {med['parallax'] / med['qcow2']:.2f} of medians (target <= 1: "
      f"{'met' if pr <= 1 else 'MISSED'}).")
print()
print(f"Wall time {wall} s.")
with open(out + "/boot-median.dat", "w") as f:
    for i, kind in enumerate(("parallax", "qcow2", "raw")):
        if kind in med:
            f.write(f"{i} {kind} {med[kind]:.3f}\n")
EOF
gnuplot -e "spacef='$space'; bootf='$OUT/boot-median.dat'; outf='$plots_dir/clones.png'" \
    "$ROOT/bench/clones.gp" || die "gnuplot failed"
[[ -s $plots_dir/clones.png ]] || die "no figure"
cat "$OUT/results.md"
log "results in $OUT, figure $plots_dir/clones.png ($((SECONDS - t_start)) s)"
