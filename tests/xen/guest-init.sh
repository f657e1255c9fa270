#!/bin/busybox sh
# shellcheck shell=dash
# /init of the Xen lab's PV guests (busybox; scripts/xen-lab.sh packs it with xen-blkfront.ko).
# The guest carries out the operations named on its kernel command line, given by the case in
# the xl config's extra=, as plx.do=OP,OP,... and powers off:
#
#   w:DEV:SEED:START:N[:PAUSE]
#                        write chunks START..START+N-1 of /dev/DEV, each followed by an fsync
#                        (a flush through blkfront, blkback and the NBD device to Parallax), a
#                        line "plx-guest: wrote DEV I" and PAUSE seconds of sleep (default none:
#                        a pause keeps the guest writing while dom0 does something slow); then
#                        drop the caches, read them back and compare
#   c:DEV:SEED:START:N   read chunks START..START+N-1 and compare
#   ro:DEV               a write to /dev/DEV must be refused (a read-only disk)
#   p:SECONDS            pause
#   gone:DEV             wait until /dev/DEV has gone (xl block-detach)
# (A disk that is not there yet, one attached later with xl block-attach, is waited for.)
#
# A chunk is 64 KiB: a 64-byte header naming SEED and I, then the lab's random pattern
# (/pattern), so a chunk written to the wrong place or from the wrong run does not compare
# equal. tests/xen/lab-lib.sh makes the same chunks in dom0.
# Lines: "plx-guest: up", "plx-guest: ok OP", "plx-guest: BAD ...", "plx-guest: done OK|FAIL".
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
insmod /xen-blkfront.ko
echo "plx-guest: up $(cut -d' ' -f1 /proc/uptime)"

chunk() { # SEED I: the chunk on stdout
    printf '%-63s\n' "plx seed=$1 chunk=$2"
    tail -c +65 /pattern
}

# wait_dev DEV: blkfront connects each disk in the background.
wait_dev() {
    i=0
    while [ ! -b "/dev/$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ -b "/dev/$1" ] || { echo "plx-guest: BAD no /dev/$1"; return 1; }
}

# check DEV SEED START N
check() {
    echo 3 >/proc/sys/vm/drop_caches
    blockdev --flushbufs "/dev/$1"
    i=$3
    while [ "$i" -lt $(($3 + $4)) ]; do
        want=$(chunk "$2" "$i" | sha256sum | cut -c1-64)
        got=$(dd if="/dev/$1" bs=65536 skip="$i" count=1 2>/dev/null | sha256sum | cut -c1-64)
        if [ "$want" != "$got" ]; then
            echo "plx-guest: BAD $1 chunk $i differs (seed $2)"
            return 1
        fi
        i=$((i + 1))
    done
}

ops=$(sed -n 's/.*plx\.do=\([^ ]*\).*/\1/p' /proc/cmdline)
status=OK
for op in $(echo "$ops" | tr ',' ' '); do
    pause=""
    IFS=: read -r what dev seed start n pause <<EOF
$op
EOF
    case $what in
    w)
        wait_dev "$dev" || { status=FAIL; break; }
        i=$start
        while [ "$i" -lt $((start + n)) ]; do
            chunk "$seed" "$i" >/tmp/c
            if ! dd if=/tmp/c of="/dev/$dev" bs=65536 seek="$i" conv=notrunc,fsync 2>/tmp/err; then
                echo "plx-guest: BAD write of $dev chunk $i: $(cat /tmp/err)"
                status=FAIL
                break 2
            fi
            echo "plx-guest: wrote $dev $i"
            [ -z "$pause" ] || sleep "$pause"
            i=$((i + 1))
        done
        check "$dev" "$seed" "$start" "$n" || { status=FAIL; break; }
        ;;
    c)
        wait_dev "$dev" || { status=FAIL; break; }
        check "$dev" "$seed" "$start" "$n" || { status=FAIL; break; }
        ;;
    ro)
        wait_dev "$dev" || { status=FAIL; break; }
        if dd if=/pattern of="/dev/$dev" bs=65536 count=1 conv=fsync 2>/dev/null; then
            echo "plx-guest: BAD the read-only $dev took a write"
            status=FAIL
            break
        fi
        ;;
    p) sleep "$dev" ;;
    gone)
        i=0
        while [ -b "/dev/$dev" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
        [ ! -b "/dev/$dev" ] || { echo "plx-guest: BAD /dev/$dev was not detached"; status=FAIL; break; }
        ;;
    *)
        echo "plx-guest: BAD unknown operation $op"
        status=FAIL
        break
        ;;
    esac
    echo "plx-guest: ok $op"
done
echo "plx-guest: done $status"
# The last console lines can be lost when a guest powers off at once (pitfall 5).
sleep 2
poweroff -f
