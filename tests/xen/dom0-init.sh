#!/bin/bash
# /init of the Xen lab's dom0 (scripts/xen-lab.sh puts it in the dom0 initramfs): sets up what a
# Debian dom0's boot would (file systems, /dev links udev makes, the Xen modules, xenstored,
# xen-init-dom0, xenconsoled), formats the blockstore (/dev/vda) if it is blank, then runs the
# cases named on the kernel command line (plx.cases=a:b:c; each ended as a failure near
# plx.deadline=SECONDS of dom0's uptime) or gives a shell (plx.cases=shell),
# and powers the machine off.
#
# Output is the serial console, which scripts/xen-lab.sh parses:
#   PLX-START CASE                  a case begins (its lines follow)
#   PLX-CASE CASE PASS|FAIL|TOOLSTACK
#   PLX-TIME WHAT SECONDS           dom0's uptime at a milestone
export PATH=/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=${TERM:-vt100}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run/lock /var/run/xen /var/run/xenstored /var/lib/xenstored \
    /var/log/xen/console /var/lib/xen /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# Xen's block scripts stat /dev/stdin (locking.sh): a bare devtmpfs lacks what udev would add.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr

uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "PLX-TIME dom0-userspace $(uptime_s)"

for m in xenfs xen-evtchn xen-gntdev xen-gntalloc xen-privcmd xen-blkback loop virtio_pci \
    virtio_blk ext4; do
    modprobe "$m" || echo "dom0-init: modprobe $m failed"
done
# Enough NBD devices for every guest disk of a case plus dom0's own reads.
modprobe nbd nbds_max=32 || echo "dom0-init: modprobe nbd failed"
mount -t xenfs xenfs /proc/xen

# The C xenstored, as Debian's init script starts it (launch-xenstore).
xenstored --pid-file /var/run/xenstored.pid
for _ in $(seq 100); do xenstore-read /local >/dev/null 2>&1 && break; sleep 0.1; done
xen-init-dom0 >/var/log/xen/xen-init-dom0.log 2>&1 || echo "dom0-init: xen-init-dom0 failed"
# Guests' consoles are logged to /var/log/xen/console/guest-NAME.log: the cases read them.
xenconsoled --pid-file=/var/run/xenconsoled.pid --log=guest --log-dir=/var/log/xen/console
echo "PLX-TIME toolstack-up $(uptime_s)"

# The blockstore: the virtio disk, formatted on first use.
if ! parallax info >/dev/null 2>&1; then
    parallax format >/dev/null ||
        echo "dom0-init: parallax format /dev/vda failed"
fi

cases=$(sed -n 's/.*plx\.cases=\([^ ]*\).*/\1/p' /proc/cmdline)
deadline=$(sed -n 's/.*plx\.deadline=\([0-9]*\).*/\1/p' /proc/cmdline)
if [ "$cases" = shell ] || [ -z "$cases" ]; then
    cat <<'EOF'

  Xen 4.17 dom0 with Parallax. The blockstore is /dev/vda (/etc/parallax/blockstore).
  Try:  parallax vdi-create demo --size 64M
        xl create /plx/example.cfg -c        (a busybox guest on the VDI; Ctrl-] leaves it)
  Guest kernel and initramfs: /plx/guest/. `exit` ends the lab (dom0 stops the Parallax
  server, syncs and powers Xen off); Ctrl-A X stops QEMU at once.

EOF
    setsid -c /bin/bash -l </dev/hvc0 >/dev/hvc0 2>&1
else
    for c in ${cases//:/ }; do
        echo "PLX-START $c"
        # Each case's failure report shows its own guests' consoles and xl output only.
        rm -f /var/log/xen/console/guest-*.log /tmp/*.xl
        t0=$(uptime_s)
        rc=0
        # The case in the background, ended (as a failure, its consoles shown) 45 s before the
        # deadline the host gave: the host's own time limit would stop QEMU without them.
        setsid bash "/plx/cases/$c.sh" </dev/null 2>&1 &
        pid=$!
        while kill -0 "$pid" 2>/dev/null; do
            if [ -n "$deadline" ] && [ "$(cut -d. -f1 /proc/uptime)" -ge $((deadline - 45)) ]; then
                kill -KILL -- "-$pid" 2>/dev/null
                echo "dom0-init: case $c still running at the time limit (dom0 uptime $(uptime_s)): ended"
                bash -c '. /plx/lab-lib.sh; DD_ID=$(domid_of parallax-storage); show_guests' 2>&1
                break
            fi
            sleep 1
        done
        wait "$pid" || rc=$?
        case $rc in
        0) r=PASS ;;
        2) r=TOOLSTACK ;;
        *) r=FAIL ;;
        esac
        echo "PLX-TIME case-$c $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')"
        # Leave nothing to the next case: any guest still there is destroyed.
        for d in $(xenstore-list /local/domain 2>/dev/null); do
            [ "$d" = 0 ] || xl destroy "$d" >/dev/null 2>&1
        done
        echo "PLX-CASE $c $r"
    done
fi
# Stop the Parallax server the hotplug script started, as a shutdown would: it releases its
# claims, so the blockstore image checks without --live on the host afterwards.
if [ -f /run/parallax/serve.pid ]; then
    pid=$(cat /run/parallax/serve.pid)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
echo "PLX-TIME end $(uptime_s)"
sync
poweroff -f
