#!/bin/bash
# A golden VDI imported in dom0 and snapshotted; a guest whose disks are the two strings the
# docs show (xen-configs/web1-pv.cfg): a clone of the golden snapshot, read-write, and the
# snapshot itself read-only (access=ro,target=gold@pristine). The guest finds the golden data
# on both, writes its own chunks to the clone, and is refused a write to the snapshot; the
# golden VDI and its snapshot are unchanged afterwards, the clone holds both.
# shellcheck source=tests/xen/lab-lib.sh
. /plx/lab-lib.sh

for ((i = 0; i < 16; i++)); do chunk gold "$i"; done >/tmp/gold.img
parallax vdi-create gold --size 64M >/dev/null || fail "vdi-create gold"
parallax vdi-import gold /tmp/gold.img --quiet || fail "vdi-import gold"
parallax vdi-snapshot gold --label pristine >/dev/null || fail "vdi-snapshot gold"
parallax vdi-create cl1 --from gold@pristine >/dev/null || fail "vdi-create cl1 --from gold@pristine"

guest_cfg cl1 "c:xvda:gold:0:16,w:xvda:cl1:16:16,c:xvdb:gold:0:16,ro:xvdb" \
    'script=block-parallax,vdev=xvda,target=cl1' \
    'script=block-parallax,vdev=xvdb,access=ro,target=gold@pristine'
guest_start cl1
guest_wait cl1 300
vdi_check cl1 gold 0 16
vdi_check cl1 cl1 16 16
vdi_check gold@pristine gold 0 16
vdi_check gold gold 0 16
vdi_prefix gold gold 16 16 0 0 # untouched beyond the image
no_nbd_left
parallax check --live --quiet || fail "parallax check --live"
log "clone: all verified"
