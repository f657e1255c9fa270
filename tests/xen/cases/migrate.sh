#!/bin/bash
# xen-lab: shadow
# `xl migrate GUEST localhost` of a writing PV guest whose disk is a Parallax disk string: Xen's
# log-dirty mode copies the running guest's memory to a new domain while it writes, libxl runs
# block-parallax add for the new domain's disk while the old domain still has the same VDI
# attached, then block-parallax remove for the old one once it is gone. The guest goes on
# writing on the new domain and reads everything back; the VDI holds every chunk, and the
# hotplug log shows the add of the destination before the remove of the source, each once,
# with nothing attached afterwards.
#
# The line "# xen-lab: shadow" above makes scripts/xen-lab.sh boot a Xen with shadow paging,
# which the log-dirty mode of a PV guest's live migration needs (docs/xen-lab.md).
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

# block-parallax logs each add and remove to syslog (logger), as on a Debian dom0; the lab's
# dom0 runs no syslog daemon of its own, so the case starts one for the order check below.
syslogd -n -O /var/log/plx-syslog.log &
SYSLOGD=$!
trap 'kill "$SYSLOGD" 2>/dev/null' EXIT
until_up 30 test -S /dev/log || fail "syslogd did not start"

parallax vdi-create web4 --size 64M >/dev/null || fail "vdi-create web4"
# Half a second between chunks: still writing when the migration ends (at a load average of 10
# the guest wrote 30 chunks 0.3 s apart during a 55 s migration).
N=64
guest_cfg web4 "w:xvda:web4:0:$N:0.5" 'script=block-parallax,vdev=xvda,target=web4'
guest_start web4
wait_console web4 '^plx-guest: wrote xvda 4$' 300 || fail "guest web4 did not write"

old=$(domid_of web4)
be=/local/domain/0/backend/vbd/$old/51712
old_dev=$(xenstore-read "$be/parallax-nbd-device" 2>/dev/null) ||
    fail "no parallax-nbd-device in $be"
hlog=/var/log/plx-syslog.log
hstart=$(($(wc -l <"$hlog") + 1))
log "migrating web4 (domain $old, $old_dev) after chunk $(last_wrote web4 xvda)"
migrate_local web4
# The xl that created the guest ends with the old domain.
guest_wait_any web4 120
new=$(domid_of web4)
if [ -z "$new" ] || [ "$new" = "$old" ]; then
    fail "no new domain web4 after the migration ($new)"
fi
new_dev=$(xenstore-read "/local/domain/0/backend/vbd/$new/51712/parallax-nbd-device" 2>/dev/null) ||
    fail "the new domain $new has no Parallax disk"
during=$(last_wrote web4 xvda)
log "web4 is domain $new on $new_dev; the old domain had written up to chunk $during"
[ "$during" -lt $((N - 1)) ] || fail "the guest had finished before the migration ended"

# The new domain's console (xenconsoled names its log after the domain's name when it sees it:
# web4--incoming during the migration) must show writes past the migration.
wait_console_any 'web4*' "^plx-guest: wrote xvda $((during + 1))\$" 300 ||
    fail "the migrated guest did not go on writing after chunk $during"
wait_console_any 'web4*' '^plx-guest: done' 600 || fail "the migrated guest did not finish"
console_has '^plx-guest: done OK' /var/log/xen/console/guest-web4*.log ||
    fail "the migrated guest found wrong data"
wait_domain_gone web4 120
vdi_check web4 web4 0 $N
no_nbd_left

# libxl's order, from the hotplug log since the migration began: the destination's add (a
# second NBD device on the same VDI), the source's remove (its device), then at the guest's end
# the destination's remove; nothing else.
events=$(tail -n +"$hstart" "$hlog" | sed -n \
    -e 's/.*block-parallax: VDI web4 .* attached as \(\/dev\/nbd[0-9]*\)$/add \1/p' \
    -e 's/.*block-parallax: disconnected \(\/dev\/nbd[0-9]*\)$/remove \1/p' | tr '\n' ' ')
want="add $new_dev remove $old_dev remove $new_dev "
[ "$events" = "$want" ] ||
    fail "hotplug events since the migration: '$events', expected '$want' (libxl's order);" \
        "the log: $(tail -n +"$hstart" "$hlog")"
log "hotplug order: $events"
parallax check --live --quiet || fail "parallax check --live"
log "migrate: all verified"
