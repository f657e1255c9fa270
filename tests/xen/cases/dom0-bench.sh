#!/bin/bash
# dom0 file-system benchmarks, as in the thesis's dom0 runs: Bonnie++ and PostMark on ext4 on a
# Parallax VDI against the same on a raw file, in the same dom0 and the same boot. Both live on
# one ext4 file system on the lab's scratch disk (/dev/vdb, scripts/xen-lab.sh bench): the
# Parallax blockstore as a file there, served by `parallax serve` and attached with nbd-client
# exactly as block-parallax attaches a guest's disk; the raw file through a loop device with
# direct I/O (Parallax opens its store with O_DIRECT: without it the raw side alone would get a
# second page cache). Results are printed as "PLX-BENCH TARGET TEST VALUE UNIT" lines.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

# bonnie++'s bulk phases with direct I/O (-D): dom0's 1 GiB of page cache would otherwise hold
# the whole file, and under TCG a file twice its size takes most of an hour per target.
SIZE=512M RAM=256
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

bench() { # NAME DEVICE
    local name=$1 dev=$2 out t0
    mke2fs -q -t ext4 -F "$dev" || fail "mkfs on $name"
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

# Raw first, then Parallax, then raw again: a drift of the machine's speed during the run
# (other work on its cores) shows as a difference between the two raw runs.
bench raw "$loop"
bench parallax /dev/nbd20
bench raw2 "$loop"
nbd-client -d /dev/nbd20 >/dev/null
losetup -d "$loop"
kill "$serve"
wait "$serve"
parallax -b $store check --quiet || fail "parallax check of the bench store"
umount /mnt/scratch
