#!/bin/sh
# /sbin/init of the golden image (scripts/golden-image.sh puts it there). The guest's work is
# chosen on the kernel command line; every line meant for the host starts with "plx-guest:" on
# the serial console, and every mode but "shell" ends with sync and poweroff -f.
#
#   plx.mode=boot                 print the first line and power off (boot-time benchmark)
#   plx.mode=clone plx.id=ID      write /plx/data (1 MiB from /dev/urandom) and /plx/identity
#                                 (id, sha256 and size of the data as read back), sync
#   plx.mode=live plx.id=ID plx.n=N
#                                 N rounds of: write /plx/live/fK (256 KiB), sync, write
#                                 /plx/live/fK.sum (its sha256sum line), sync; the host takes a
#                                 snapshot meanwhile
#   plx.mode=verify plx.id=ID     check every /plx/live/*.sum (a snapshot taken in live mode,
#                                 its journal replayed by this kernel at mount), then as clone
#   plx.mode=shell (default)      a shell on the console
export PATH=/bin:/sbin
mount -t proc proc /proc
echo "plx-guest: up $(cut -d' ' -f1 /proc/uptime)"
mount -t sysfs sys /sys
mount -o remount,rw / 2>/dev/null

mode=shell id=none n=20
read -r cmdline </proc/cmdline
for arg in $cmdline; do
    case $arg in
    plx.mode=*) mode=${arg#plx.mode=} ;;
    plx.id=*) id=${arg#plx.id=} ;;
    plx.n=*) n=${arg#plx.n=} ;;
    esac
done

write_identity() {
    dd if=/dev/urandom of=/plx/data bs=64k count=16 2>/dev/null
    sync
    sum=$(sha256sum /plx/data | cut -d' ' -f1)
    size=$(wc -c </plx/data)
    printf 'id=%s\nsha256=%s\nbytes=%s\nmode=%s\n' "$id" "$sum" "$size" "$mode" >/plx/identity
    sync
    echo "plx-guest: identity $id $sum"
}

case $mode in
boot) ;;
clone)
    write_identity
    ;;
live)
    mkdir -p /plx/live
    i=1
    while [ "$i" -le "$n" ]; do
        dd if=/dev/urandom of=/plx/live/f$i bs=64k count=4 2>/dev/null
        sync
        sha256sum /plx/live/f$i >/plx/live/f$i.sum
        sync
        echo "plx-guest: live $i"
        i=$((i + 1))
    done
    ;;
verify)
    ok=0 bad=0
    for s in /plx/live/*.sum; do
        [ -e "$s" ] || continue
        if sha256sum -c -s "$s"; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "plx-guest: bad $s"; fi
    done
    echo "plx-guest: verify ok=$ok bad=$bad"
    write_identity
    ;;
*)
    echo "plx-guest: shell (exit to power off)"
    setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1'
    ;;
esac
sync
echo "plx-guest: done $mode"
poweroff -f
