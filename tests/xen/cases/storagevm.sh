#!/bin/bash
# xen-lab: shadow
# The storage VM (docs/storage-vm.md) under real Xen: dom0 creates the driver domain from
# /etc/xen/storage-dd.cfg (xen-configs/storage-dd.cfg as installed), which runs Parallax, blkback
# and `xl devd` with the blockstore on its second disk; a guest whose disks are the two lines
# of /etc/xen/web3-pv-dd.cfg (backend=parallax-storage: a clone of a golden VDI, and the golden
# snapshot read-only) is served by it. Prepared in the storage VM as the docs say (vdi-create,
# vdi-import, vdi-snapshot, vdi-create --from). While the guest writes: a live
# `parallax vdi-snapshot` inside the storage VM, then `xl migrate web3 localhost` (the storage VM
# runs block-parallax add for the new domain's disks while the old one still has them, then
# remove for the old one's), and the guest goes on writing. Everything read back in the storage
# VM; dom0 never opens the blockstore or a VDI while the storage VM runs.
#
# The line "# xen-lab: shadow" above makes scripts/xen-lab.sh boot a Xen with shadow paging,
# which the log-dirty mode of a PV guest's live migration needs (docs/xen-lab.md).
#
# The lab-only lines of the storage VM's config (everything else is the file as shipped): the
# lab's kernel and the storage VM's initramfs (tests/xen/dd-init.sh) instead of pygrub and a
# system disk; the blockstore as the second disk, xvdb: dom0's /dev/vda; no network; 512 MiB
# and one vCPU (the lab's QEMU has 2 GiB and one CPU).
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

DD=parallax-storage
DDCFG=/etc/xen/storage-dd.cfg GCFG=/etc/xen/web3-pv-dd.cfg
grep -q '^driver_domain *= *1' "$DDCFG" || fail "$DDCFG does not say driver_domain = 1"
grep -q "^name *= *\"$DD\"" "$DDCFG" || fail "$DDCFG does not name the domain $DD"

# dom0 hands its blockstore disk to the storage VM: no server of its own may have it open (an
# earlier case's block-parallax started one), and no guest may use it.
if [ -f /run/parallax/serve.pid ]; then
    pid=$(cat /run/parallax/serve.pid)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "dom0's Parallax server did not stop"
    rm -f /run/parallax/serve.pid
fi
no_nbd_left

sed -E '/^(bootloader|disk|vif|memory|maxmem|vcpus) *=/d' "$DDCFG" >"/tmp/$DD.cfg"
cat >>"/tmp/$DD.cfg" <<'EOF'
# -- the lab's lines (tests/xen/cases/storagevm.sh)
kernel = "/plx/guest/vmlinux"
ramdisk = "/plx/dd/initrd"
extra = "console=hvc0"
memory = 512
maxmem = 512
vcpus = 1
disk = [ 'format=raw,vdev=xvdb,access=rw,target=/dev/vda' ]
EOF
t0=$(ts)
guest_start "$DD"
wait_console "$DD" '^plx-dd: up' 300 || fail "the storage VM did not come up"
echo "PLX-TIME dd-up $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"
wait_console "$DD" '^plx-dd: (ready|BAD)' 300 || fail "the storage VM did not start xl devd"
console_has '^plx-dd: BAD' "/var/log/xen/console/guest-$DD.log" && fail "the storage VM's setup failed"
echo "PLX-TIME dd-ready $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"
DD_ID=$(domid_of "$DD")
[ -n "$DD_ID" ] || fail "no domain $DD in xenstore"
log "storage VM $DD is domain $DD_ID"

# The VDIs, made inside the storage VM as docs/storage-vm.md says (a golden image, its
# snapshot, a clone for web3); no server runs yet, so parallax opens the blockstore itself.
NG=8
dd_run "for ((i = 0; i < $NG; i++)); do chunk gold \$i; done >/tmp/gold.img &&
    parallax vdi-create gold --size 64M && parallax vdi-import gold /tmp/gold.img --quiet &&
    parallax vdi-snapshot gold --label pristine && parallax vdi-create web3 --from gold@pristine" ||
    fail "preparing the VDIs in the storage VM: $DD_OUT"

# The Parallax server started before the guest, by block-parallax itself (an add and a remove
# of a read-only disk on a scratch path of the storage VM's own xenstore tree; the server stays,
# as it does for every later disk). Under TCG on a loaded machine the first add, which starts
# the server, took longer than the 40 s libxl gives a hotplug script before killing it (seen
# twice: "killing execution of /etc/xen/scripts/block-parallax add because of timeout"); on
# real hardware it takes well under a second.
t0=$(ts)
dd_run "xenstore-write data/warm/params gold data/warm/mode r &&
    XENBUS_PATH=data/warm /etc/xen/scripts/block-parallax add &&
    XENBUS_PATH=data/warm /etc/xen/scripts/block-parallax remove && xenstore-rm data/warm" ||
    fail "starting the Parallax server in the storage VM: $DD_OUT"
echo "PLX-TIME dd-server-start $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"

# The guest's disks: the lines of web3-pv-dd.cfg as written.
mapfile -t disks < <(grep -o "'backend=$DD,[^']*'" "$GCFG" | tr -d "'")
[ "${#disks[@]}" -eq 2 ] || fail "$GCFG: expected two disks with backend=$DD, found ${#disks[@]}"
N=64 # web3's own chunks, from chunk $NG on, a second apart: the guest is still writing when
#      the live snapshot and the migration, slow under TCG, have been done (a migration at a
#      load average of 10 took 165 s, while the guest wrote 35 chunks half a second apart)
guest_cfg web3 "c:xvdb:gold:0:$NG,ro:xvdb,c:xvda:gold:0:$NG,w:xvda:web3:$NG:$N:1" "${disks[@]}"
t0=$(ts)
# Paused until the storage VM's xl devd has run block-parallax for both disks: xl create does
# not wait for a driver domain's hotplug, and under TCG a booting guest starves the storage VM
# (libxl kills a hotplug script after 40 s: seen with the guest running).
guest_start web3 -p
connected() {
    local d
    G=$(domid_of web3)
    [ -n "$G" ] || return 1
    for d in 51712 51728; do
        [ "$(xenstore-read "/local/domain/$DD_ID/backend/vbd/$G/$d/hotplug-status" 2>/dev/null)" = \
            connected ] || return 1
    done
}
until_up 150 connected || fail "the storage VM's hotplug did not connect web3's disks" \
    "($(xenstore-ls "/local/domain/$DD_ID/backend/vbd" 2>&1 | grep -E 'params|hotplug|state' | tr '\n' ' '))"
log "the storage VM's block-parallax connected web3's disks"
echo "PLX-TIME guest-disks-connected $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"
t1=$(ts)
xlc unpause web3 || fail "xl unpause web3"
wait_console web3 '^plx-guest: up' 300 || fail "guest web3 did not come up"
echo "PLX-TIME guest-up $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')" \
    "(from xl unpause: $(awk -v a="$t1" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }'))"
wait_console web3 "^plx-guest: wrote xvda $((NG + 3))\$" 300 || fail "guest web3 did not write"

# The disks are the storage VM's: their backends are in its xenstore tree, none in dom0's.
be=$(xenstore-read "/local/domain/$G/device/vbd/51712/backend" 2>/dev/null) || be=""
[ "$be" = "/local/domain/$DD_ID/backend/vbd/$G/51712" ] ||
    fail "web3's xvda has its backend at '$be', not in the storage VM ($DD_ID)"
[ "$(xenstore-read "$be/hotplug-status" 2>/dev/null)" = connected ] ||
    fail "$be/hotplug-status is not connected"
xenstore-list "/local/domain/0/backend/vbd/$G" >/dev/null 2>&1 && fail "dom0 serves a disk of web3"
log "web3 (domain $G): xvda served by the storage VM at $be"

# The live snapshot, inside the storage VM, while the guest writes.
flushed=$(last_wrote web3 xvda)
dd_run "parallax vdi-snapshot web3 --label live" || fail "vdi-snapshot in the storage VM: $DD_OUT"
after=$(last_wrote web3 xvda)
log "live snapshot $DD_OUT taken in the storage VM after the guest flushed chunk $flushed"
[ "$after" -lt $((NG + N - 4)) ] || fail "the guest had (nearly) finished before the snapshot"

# A live migration with the storage VM serving.
wait_console web3 "^plx-guest: wrote xvda $((after + 2))\$" 300 || fail "guest web3 stopped writing"
old=$G
log "migrating web3 (domain $old) after chunk $(last_wrote web3 xvda)"
migrate_local web3
# (The xl that created the guest ends with the old domain; the new domain's console is logged
# under the name it had when xenconsoled saw it, web3--incoming.)
guest_wait_any web3 120
before=$(last_wrote web3 xvda)
[ "$before" -lt $((NG + N - 1)) ] || fail "the guest had finished before the migration ended"
# (xl devd runs the old domain's removes after xl migrate has returned, then deletes the
# backends.)
dd_gone() { ! xenstore-list "/local/domain/$DD_ID/backend/vbd/$old" >/dev/null 2>&1; }
until_up 120 dd_gone || fail "the old web3's backends still in the storage VM after the migration"
until_up 150 connected || fail "the storage VM's hotplug did not connect the migrated web3's disks" \
    "($(xenstore-ls "/local/domain/$DD_ID/backend/vbd" 2>&1 | grep -E 'params|hotplug|state' | tr '\n' ' '))"
[ "$G" != "$old" ] || fail "web3 is still domain $old after the migration"
log "web3 migrated after chunk $before: domain $G, its disks served by the storage VM, the" \
    "old domain's released"
wait_console_any 'web3*' "^plx-guest: wrote xvda $((before + 1))\$" 300 ||
    fail "the migrated guest did not go on writing after chunk $before"
wait_console_any 'web3*' '^plx-guest: done' 300 || fail "the migrated guest did not finish"
console_has '^plx-guest: done OK' /var/log/xen/console/guest-web3*.log ||
    fail "the migrated guest found wrong data"
web3_gone() {
    [ -z "$(domid_of web3)" ] && ! xenstore-list "/local/domain/$DD_ID/backend/vbd" 2>/dev/null |
        grep -q .
}
until_up 120 web3_gone
[ -z "$(domid_of web3)" ] || fail "web3 still there"
xenstore-list "/local/domain/$DD_ID/backend/vbd" 2>/dev/null | grep -q . &&
    fail "disk backends left in the storage VM: $(xenstore-list "/local/domain/$DD_ID/backend/vbd")"

# Everything read back in the storage VM, through its server.
dd_run "vdi_check web3 gold 0 $NG && vdi_check web3 web3 $NG $N &&
    vdi_check gold@pristine gold 0 $NG && vdi_check gold gold 0 $NG &&
    vdi_check web3@live gold 0 $NG && vdi_prefix web3@live web3 $NG $N $((flushed - NG + 1)) $((after - NG + 3)) &&
    no_nbd_left && parallax check --live --quiet" || fail "verifying in the storage VM: $DD_OUT"

# Stop it (its server releases its claims) and check that dom0 never attached a VDI.
t0=$(ts)
dd_send stop 120 || fail "the storage VM did not stop"
guest_wait_any "$DD" 120
no_nbd_left
log "storagevm: all verified"
