#!/bin/bash
# xl migrate of a writing guest to this same host: libxl runs block-parallax add for the
# incoming domain while the outgoing one still holds the VDI, then remove for the old one. The
# guest keeps writing across the move, reads everything back at the end, and the VDI holds it.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

parallax vdi-create web3 --size 64M >/dev/null || fail "vdi-create web3"
N=32
guest_cfg web3 "w:xvda:web3:0:$N" 'script=block-parallax,vdev=xvda,target=web3'
guest_start web3
wait_console web3 '^plx-guest: wrote xvda 4$' 180 || fail "guest web3 did not write"
log "migrating web3 after chunk $(last_wrote web3 xvda)"
# No ssh in the lab: -s '' runs the host argument itself as the receiving end.
xlc migrate -s '' web3 'xl migrate-receive' || fail "xl migrate web3 failed"
log "migrated web3"
# The incoming domain's console is logged under the name it had while arriving.
wait_console_any 'web3*' '^plx-guest: done' 300 || fail "the migrated guest did not finish"
console_has '^plx-guest: done OK' /var/log/xen/console/guest-web3*.log ||
    fail "the migrated guest found wrong data"
wait_domain_gone web3 60
vdi_check web3 web3 0 $N
no_nbd_left
parallax check --live --quiet || fail "parallax check --live"
log "migrate: all verified"
