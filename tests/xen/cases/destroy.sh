#!/bin/bash
# xl destroy of a guest in the middle of its writes, then the same VDI given to a new guest:
# every chunk the first guest had flushed is there, and the VDI is a clean prefix of its
# writes. A clone of a live snapshot taken before the destroy boots and reads its prefix too.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

parallax vdi-create web4 --size 64M >/dev/null || fail "vdi-create web4"
N=200
guest_cfg web4 "w:xvda:web4:0:$N" 'script=block-parallax,vdev=xvda,target=web4'
guest_start web4
wait_console web4 '^plx-guest: wrote xvda 6$' 180 || fail "guest web4 did not write"
snapped=$(last_wrote web4 xvda)
parallax vdi-snapshot web4 --label live >/dev/null || fail "vdi-snapshot web4"
wait_console web4 '^plx-guest: wrote xvda 14$' 180 || fail "guest web4 stopped writing"
flushed=$(last_wrote web4 xvda)
xlc destroy web4 || fail "xl destroy web4 failed"
log "destroyed web4 after it flushed chunk $flushed (snapshot after chunk $snapped)"
guest_wait_any web4 60
vdi_prefix web4 web4 0 40 $((flushed + 1))
parallax vdi-create web4b --from web4@live >/dev/null || fail "vdi-create web4b --from web4@live"
guest_cfg web5 "c:xvda:web4:0:$((flushed + 1)),c:xvdb:web4:0:$((snapped + 1))" \
    'script=block-parallax,vdev=xvda,target=web4' 'script=block-parallax,vdev=xvdb,target=web4b'
guest_start web5
guest_wait web5 240
no_nbd_left
parallax check --live --quiet || fail "parallax check --live"
log "destroy: all verified"
