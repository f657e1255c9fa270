#!/bin/bash
# /init of the Xen lab's storage VM (scripts/xen-lab.sh packs it into /plx/dd/initrd in dom0;
# tests/xen/cases/storagevm.sh creates the domain from /etc/xen/storage-dd.cfg). It sets up what
# docs/storage-vm.md asks of a storage VM: the Xen modules, blkback, nbd, /proc/xen, the
# blockstore on the domain's second disk (/dev/xvdb, named in /etc/parallax/blockstore) and
# `xl devd` as xen-configs/xl-devd.service starts it; then it waits for commands from dom0.
#
# Commands come through the domain's own xenstore directory, which dom0 and the domain may both
# write (no network in the lab): dom0 writes data/plx-cmd = "SEQ SHELL-COMMAND"; the domain runs
# the command with bash (with tests/xen/lab-lib.sh loaded), its output going to this console,
# which xenconsoled logs in dom0, and writes data/plx-out (the command's output, up to 3000 bytes)
# then data/plx-rc = "SEQ STATUS". The command `stop` stops the Parallax server (releasing
# its claims: the blockstore checks clean without --live afterwards), syncs and powers off.
#
# Console lines: "plx-dd: up UPTIME", "plx-dd: ready UPTIME", "plx-dd: run SEQ CMD",
# "plx-dd: rc SEQ STATUS", "plx-dd: BAD ...".
export PATH=/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /run/lock /var/run/xen /var/lib/xen /var/log/xen /tmp
mount -t devpts devpts /dev/pts
# As in dom0: Xen's hotplug helpers stat /dev/stdin.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "plx-dd: up $(uptime_s)"

# What udev and /etc/modules would load (docs/storage-vm.md: nbd with enough devices), then
# xen-configs/xl-devd.service's lines as written: its ExecStartPre= commands (the Xen modules,
# blkback, /proc/xen), and its ExecStart=, `xl devd -F`, which watches this domain's backend/
# tree and runs the hotplug scripts (block-parallax) for the disks guests ask of it.
modprobe xen-blkfront || echo "plx-dd: BAD modprobe xen-blkfront failed"
modprobe nbd nbds_max=32 || echo "plx-dd: BAD modprobe nbd failed"
# As systemd does, a failed ExecStartPre= (without a leading -) fails the unit: no xl devd.
unit=/etc/systemd/system/xl-devd.service
devd=$(sed -n 's/^ExecStart=//p' "$unit")
[ -n "$devd" ] || echo "plx-dd: BAD no ExecStart= in $unit"
while IFS= read -r line; do
    echo "plx-dd: $line"
    line=${line#ExecStartPre=}
    if ! bash -c "${line#-}" && [ "${line:0:1}" != - ]; then
        echo "plx-dd: BAD ExecStartPre=$line failed: the unit does not start"
        devd=""
    fi
done < <(grep '^ExecStartPre=' "$unit")

# The blockstore disk (/etc/parallax/blockstore): blkfront connects it in the background.
bs=$(sed -n '/^[^#]/{p;q}' /etc/parallax/blockstore)
for _ in $(seq 300); do [ -b "$bs" ] && break; sleep 0.1; done
[ -b "$bs" ] || echo "plx-dd: BAD no blockstore disk $bs"

if [ -n "$devd" ]; then
    echo "plx-dd: $devd"
    bash -c "exec $devd" >/var/log/xen/xl-devd.log 2>&1 &
    devd_pid=$!
    sleep 2
    if kill -0 "$devd_pid" 2>/dev/null; then
        echo "plx-dd: ready $(uptime_s)"
    else
        echo "plx-dd: BAD xl devd ended: $(tail -n 5 /var/log/xen/xl-devd.log)"
    fi
fi

# The command loop. (Polling: one xenstore-read every 0.3 s costs little, and a watch would need
# a second process per command.)
last=""
while :; do
    cmd=$(xenstore-read -R data/plx-cmd 2>/dev/null) || cmd=""
    seq=${cmd%% *}
    if [ -z "$cmd" ] || [ "$seq" = "$last" ]; then
        sleep 0.3
        continue
    fi
    last=$seq
    cmd=${cmd#* }
    echo "plx-dd: run $seq $cmd"
    if [ "$cmd" = stop ]; then
        break
    fi
    rc=0
    bash -c ". /plx/lab-lib.sh; $cmd" >/tmp/out 2>&1 </dev/null || rc=$?
    # The output on the console (dom0's log of it) and, its start, in xenstore for dom0.
    sed 's/^/plx-dd: | /' /tmp/out
    xenstore-write -R -- data/plx-out "$(head -c 3000 /tmp/out)"
    xenstore-write data/plx-rc "$seq $rc"
    echo "plx-dd: rc $seq $rc"
done

if [ -f /run/parallax/serve.pid ]; then
    pid=$(cat /run/parallax/serve.pid)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && echo "plx-dd: BAD the Parallax server did not stop"
fi
sync
echo "plx-dd: stopped $(uptime_s)"
xenstore-write data/plx-rc "$seq 0"
sleep 2
poweroff -f
