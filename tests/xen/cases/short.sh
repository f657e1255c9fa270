#!/bin/bash
# The short Xen test (make check, tests/integration/xen_real.sh): one PV guest created by xl
# whose disk is the documented Parallax disk string (script=block-parallax, a VDI name), writing
# and reading back checksummed chunks; a live `parallax vdi-snapshot` while it writes; the VDI
# and the snapshot verified through the server afterwards and the store checked live.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

parallax vdi-create web1 --size 64M >/dev/null || fail "vdi-create web1"
N=24
# Half a second between chunks: the guest must still be writing when the snapshot command,
# slow under TCG, returns, however fast the guest itself runs.
guest_cfg web1 "w:xvda:web1:0:$N:0.5" 'script=block-parallax,vdev=xvda,target=web1'
t0=$(ts)
guest_start web1
wait_console web1 '^plx-guest: up' 300 || fail "guest web1 did not come up"
echo "PLX-TIME guest-up $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"

# The live snapshot, once the guest has flushed a few chunks and is still writing.
wait_console web1 '^plx-guest: wrote xvda 3$' 300 || fail "guest web1 did not write"
flushed=$(last_wrote web1 xvda)
snap=$(parallax vdi-snapshot web1 --label live) || fail "parallax vdi-snapshot web1 failed"
log "live snapshot $snap taken after the guest flushed chunk $flushed"
after=$(last_wrote web1 xvda)
[ "$after" -lt $((N - 1)) ] || fail "the guest had finished before the snapshot"

guest_wait web1 300
vdi_check web1 web1 0 $N
# At most the chunks flushed when the snapshot returned, the one being written and one more
# whose line the console had not yet delivered.
vdi_prefix web1@live web1 0 $N $((flushed + 1)) $((after + 3))
parallax check --live --quiet || fail "parallax check --live after the guest"
log "short: all verified"
