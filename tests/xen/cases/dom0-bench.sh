#!/bin/bash
# dom0 file-system benchmarks, as in the thesis's dom0 runs: Bonnie++ and PostMark on ext4 on a
# Parallax VDI against the same on a raw file, in the same dom0 and the same boot. All live on
# one ext4 file system on the lab's scratch disk (/dev/vdb, scripts/xen-lab.sh bench):
#   parallax  the Parallax blockstore as a file there, served by `parallax serve` and attached
#             with nbd-client exactly as block-parallax attaches a guest's disk;
#   raw       a raw file through a loop device with direct I/O (Parallax opens its store with
#             O_DIRECT: without it the raw side alone would get a second page cache);
#   nbd       the same raw file served by a plain user-space NBD server (qemu-nbd, O_DIRECT,
#             Linux native AIO) and attached with nbd-client like the VDI: every request makes
#             the same trip through the kernel's NBD client to a user process as Parallax's do,
#             which under QEMU's TCG costs far more than on hardware. parallax/nbd is then
#             Parallax's own cost, nbd/raw the cost of any user-space NBD path.
# Results are printed as "PLX-BENCH TARGET TEST VALUE UNIT" lines; TARGET is raw, nbd or
# parallax with the round's number after the first (raw, raw2, ...).
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

# bonnie++'s bulk phases with direct I/O (-D): dom0's 1 GiB of page cache would otherwise hold
# the whole file, and under TCG a file twice its size takes most of an hour per target. With
# direct I/O the file's size only sets the phases' length: 256 MiB (bonnie++ wants twice -r)
# lets two rounds of three targets run in about the time one round of 512 MiB took.
SIZE=256M RAM=128
# Rounds (plx.bench_rounds=N on dom0's command line, PLX_BENCH_ROUNDS=N scripts/xen-lab.sh bench):
# odd rounds run raw, nbd, parallax, even ones the reverse, so that a steady change of the
# machine's speed (other work on its cores) weighs the same on each target over two rounds.
ROUNDS=$(sed -n 's/.*plx\.bench_rounds=\([0-9]*\).*/\1/p' /proc/cmdline)
ROUNDS=${ROUNDS:-2}
[ -b /dev/vdb ] || fail "no scratch disk /dev/vdb (run it with scripts/xen-lab.sh bench)"
mkdir -p /mnt/scratch /mnt/t
mke2fs -q -t ext4 -F /dev/vdb || fail "mkfs of the scratch disk"
mount /dev/vdb /mnt/scratch || fail "mount of the scratch disk"

store=/mnt/scratch/store
parallax -b $store format --size 3G >/dev/null || fail "parallax format"
parallax -b $store vdi-create bench --size 2G >/dev/null || fail "vdi-create bench"
parallax -b $store serve --unix /run/bench.sock >/tmp/bench-serve.log 2>&1 &
serve=$!
for _ in $(seq 100); do [ -S /run/bench.sock ] && break; sleep 0.1; done
nbd-client -unix /run/bench.sock /dev/nbd20 -name bench -block-size 512 >/dev/null ||
    fail "nbd-client bench"
truncate -s 2G /mnt/scratch/raw.img
loop=$(losetup --direct-io=on -f --show /mnt/scratch/raw.img) || fail "losetup"
# --cache=none opens the file with O_DIRECT (as Parallax and the loop device do), --aio=native
# submits with Linux AIO; -t keeps the server after nbd-client's probe connection.
qemu-nbd -f raw --cache=none --aio=native -t -x base -k /run/base.sock /mnt/scratch/raw.img \
    >/tmp/bench-qemu-nbd.log 2>&1 &
base=$!
for _ in $(seq 100); do [ -S /run/base.sock ] && break; sleep 0.1; done
nbd-client -unix /run/base.sock /dev/nbd21 -name base -block-size 512 >/dev/null ||
    fail "nbd-client base: $(cat /tmp/bench-qemu-nbd.log)"

bench() { # NAME DEVICE
    local name=$1 dev=$2 out t0
    # (The raw file is written through the loop device and through qemu-nbd in turn: nothing of
    # one may stay cached for the other.)
    sync && echo 3 >/proc/sys/vm/drop_caches
    # nodiscard: the loop device would punch the raw file's blocks out at each mkfs, qemu-nbd
    # ignores discards; without it raw alone would write into a sparse file again every round.
    mke2fs -q -t ext4 -E nodiscard -F "$dev" || fail "mkfs on $name"
    mount "$dev" /mnt/t || fail "mount $name"
    echo 3 >/proc/sys/vm/drop_caches
    t0=$(ts)
    out=$(bonnie++ -d /mnt/t -s "$SIZE" -r "$RAM" -n 0 -f -D -u root -q 2>/dev/null | tail -n 1) ||
        fail "bonnie++ on $name"
    log "bonnie++ $name ($(awk -v a="$t0" -v b="$(ts)" 'BEGIN { print int(b - a) }') s): $out"
    # bonnie++ 2.00a's CSV: 6 file size, 10-11 putc (skipped: -f), 12 block write, 14 rewrite,
    # 18 block read, 20 random seeks (each followed by its CPU share).
    echo "$out" | awk -F, -v n="$name" '{
        printf "PLX-BENCH %s bonnie-write %s KB/s\n", n, $12
        printf "PLX-BENCH %s bonnie-rewrite %s KB/s\n", n, $14
        printf "PLX-BENCH %s bonnie-read %s KB/s\n", n, $18
        printf "PLX-BENCH %s bonnie-seeks %s /s\n", n, $20 }'
    rm -rf /mnt/t/* && sync && echo 3 >/proc/sys/vm/drop_caches
    out=$(printf 'set location /mnt/t\nset number 2000\nset transactions 5000\nrun\nquit\n' |
        postmark 2>&1) || fail "postmark on $name"
    echo "$out" | grep -E 'seconds total|transactions \(' | sed "s/^/[postmark $name] /"
    echo "$out" | sed -n 's/^[^0-9]*\([0-9]*\) seconds total.*/\1/p' |
        head -n 1 | sed "s/^/PLX-BENCH $name postmark-seconds /; s/$/ s/"
    echo "$out" | sed -n 's/.*(\([0-9]*\) per second).*/\1/p' | head -n 1 |
        sed "s/^/PLX-BENCH $name postmark-transactions /; s/$/ \/s/"
    umount /mnt/t
}

declare -A DEV=([raw]=$loop [nbd]=/dev/nbd21 [parallax]=/dev/nbd20)
for r in $(seq "$ROUNDS"); do
    order="raw nbd parallax"
    [ $((r % 2)) -eq 0 ] && order="parallax nbd raw"
    for t in $order; do bench "$t$([ "$r" -gt 1 ] && echo "$r")" "${DEV[$t]}"; done
done
nbd-client -d /dev/nbd20 >/dev/null
nbd-client -d /dev/nbd21 >/dev/null
losetup -d "$loop"
kill "$serve" "$base"
wait "$serve"
wait "$base"
parallax -b $store check --quiet || fail "parallax check of the bench store"
umount /mnt/scratch
