#!/bin/bash
# xl block-attach of a Parallax disk to a running guest, which writes and reads it; then
# xl block-detach while the guest runs: the disk leaves the guest, the hotplug remove
# disconnects its NBD device, and the data is in the VDI.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

parallax vdi-create base --size 64M >/dev/null || fail "vdi-create base"
parallax vdi-create att --size 64M >/dev/null || fail "vdi-create att"
guest_cfg web2 "w:xvda:base:0:4,w:xvdb:att:0:8,gone:xvdb" 'script=block-parallax,vdev=xvda,target=base'
guest_start web2
wait_console web2 '^plx-guest: ok w:xvda' 180 || fail "guest web2 did not come up"
xlc block-attach web2 'script=block-parallax,vdev=xvdb,target=att' ||
    fail "xl block-attach web2 failed"
log "attached att as xvdb"
wait_console web2 '^plx-guest: ok w:xvdb' 180 || fail "the guest did not write the attached disk"
xlc block-detach web2 xvdb || fail "xl block-detach web2 xvdb failed"
log "detached xvdb"
guest_wait web2 180
vdi_check att att 0 8
vdi_check base base 0 4
no_nbd_left
parallax check --live --quiet || fail "parallax check --live"
log "attach: all verified"
