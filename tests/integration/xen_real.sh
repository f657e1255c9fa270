#!/usr/bin/env bash
# plx-test: alone-cpu (boots Xen and a guest under QEMU TCG: CPU-bound, with a time limit)
# Parallax under a real Xen 4.17 hypervisor (scripts/xen-lab.sh, docs/xen-lab.md): Debian's Xen
# and kernel booted under QEMU with this tree installed in dom0 by `make install`; the case
# tests/xen/cases/short.sh runs in dom0:
#
# - `xl create` of a PV guest whose disk is the documented Parallax disk string
#   (script=block-parallax,vdev=xvda,target=web1): the hotplug script starts `parallax serve`
#   and attaches the VDI through nbd-client, blkback serves it to the guest;
# - the guest writes 24 checksummed chunks, each followed by a flush, reads them back and
#   compares;
# - `parallax vdi-snapshot web1` while the guest writes: afterwards the snapshot, read through
#   the server, is a clean prefix of the guest's writes holding every chunk the guest had
#   flushed before it was taken, and the VDI holds all 24 chunks;
# - `parallax check --live` in dom0, and after the lab powered off, `parallax check` of the
#   blockstore image on this host.
#
# A toolstack crash (pitfall 7 of the lab's notes) is retried once in a fresh boot; a data
# failure never. Every failure prints the dom0 and guest console lines.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}

require_cmd qemu-system-x86_64 dpkg-deb cpio xz apt-get
rc=0
# The boot's time limit only ends a hung boot: the case takes about 2 minutes at load 5, but at
# load 12 (each process a sixth of a CPU) the guest was still writing correctly at 280 s.
"$src/scripts/xen-lab.sh" --out "$PLX_TEST_TMP/lab" --timeout 480 run short || rc=$?
[[ $rc -ne 3 ]] || skip "the Debian Xen and kernel packages are neither cached nor downloadable"
[[ $rc -eq 0 ]] || fail "the Xen lab's short case failed"
echo "xen_real: passed"
