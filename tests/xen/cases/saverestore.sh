#!/bin/bash
# xl save and xl restore of a writing guest: the save suspends the guest mid-write (blkfront
# quiesces its disk), destroys the domain and runs block-parallax remove; the restore builds
# a new domain, runs block-parallax add for the same VDI, and the guest resumes, finishes its
# writes and reads everything back; the VDI holds it all and nothing is left attached.
#
# A save/restore is the non-live half of a migration (xl migrate is a save piped into a
# restore) on Debian's current Xen, which lacks the shadow paging a live migration of a PV guest
# needs; the live one, with both domains holding the VDI for a moment, is
# tests/xen/cases/migrate.sh, booted on a Xen that has it (docs/xen-lab.md).
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

parallax vdi-create web3 --size 64M >/dev/null || fail "vdi-create web3"
N=32 # with a pause between chunks: still writing when the slow save begins
guest_cfg web3 "w:xvda:web3:0:$N:0.3" 'script=block-parallax,vdev=xvda,target=web3'
guest_start web3
wait_console web3 '^plx-guest: wrote xvda 4$' 300 || fail "guest web3 did not write"
log "saving web3 after chunk $(last_wrote web3 xvda)"
xlc save web3 /tmp/web3.save >/tmp/save.xl 2>&1 || { cat /tmp/save.xl; fail "xl save web3 failed"; }
guest_wait_any web3 120
before=$(last_wrote web3 xvda)
[ "$before" -lt $((N - 1)) ] || fail "the guest had finished before the save"
no_nbd_left
log "saved web3 after chunk $before; restoring"
xlc restore /tmp/web3.save >/tmp/restore.xl 2>&1 || { cat /tmp/restore.xl; fail "xl restore failed"; }
# (wait_console would stop at once: the xl that created the guest ended with the save.)
wait_console_any web3 '^plx-guest: done' 300 || fail "the restored guest did not finish"
console_has '^plx-guest: done OK' /var/log/xen/console/guest-web3.log ||
    fail "the restored guest found wrong data"
wait_domain_gone web3 120
vdi_check web3 web3 0 $N
no_nbd_left
parallax check --live --quiet || fail "parallax check --live"
log "saverestore: all verified"
