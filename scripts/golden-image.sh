#!/usr/bin/env bash
# Build the golden image: a small bootable Linux guest made only from Debian packages.
#
#   scripts/golden-image.sh [--cache DIR] [--size SIZE] OUTDIR
#   scripts/golden-image.sh [--cache DIR] --fetch      only fetch its packages into the cache
#                                                      (make check does it in the background)
#
# OUTDIR receives
#   vmlinuz       the kernel of Debian's linux-image-cloud-amd64 (the package it depends on)
#   initrd.img    a tiny initramfs: busybox, the six virtio modules the cloud kernel needs to see
#                 a virtio disk, and an init that mounts /dev/vda and switches root to it
#   root.img      a raw disk image holding an ext4 file system (no partition table): the root
#                 the guest runs from (busybox, the kernel's modules, /sbin/init = guest-init.sh)
#   manifest      which packages it was built from
#
# The root file system lives on the disk: the initramfs only loads drivers. A test imports
# root.img into a VDI and boots clones of it (tests/integration/vm_clones.sh); bench/clones.sh
# compares it with qcow2 clones and raw copies.
#
# Packages come from the Debian mirror by `apt-get download` (no install, no root needed for the
# download itself) and are kept in the cache directory (default build/cache/debs, or
# $PLX_DEB_CACHE; scripts/deb-cache.sh, shared with the Xen lab), so a second build fetches
# nothing. Without network the cached .deb files are used. The image is made without mounting
# anything: `mkfs.ext4 -d` fills it from a directory.
#
# What the guest does is chosen on the kernel command line (plx.mode=..., see
# tests/vm/guest-init.sh), so one image serves every test.
#
# Exit: 0; 3 if a package could be neither downloaded nor found in the cache; 1 otherwise.
# Needs: apt-get, apt-cache, dpkg-deb, mkfs.ext4 (e2fsprogs >= 1.43 for -d), cpio, gzip.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PLX_DEB_CACHE:-$ROOT/build/cache/debs}
SIZE=192M
OUT=""
FETCH_ONLY=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --cache) CACHE=$2 && shift ;;
    --size) SIZE=$2 && shift ;;
    --fetch) FETCH_ONLY=1 ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "golden-image: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1 ;;
    esac
    shift
done
[[ -n $OUT || $FETCH_ONLY -eq 1 ]] ||
    { echo "usage: scripts/golden-image.sh [--cache DIR] [--size SIZE] OUTDIR | --fetch" >&2; exit 2; }

die() {
    echo "golden-image: $*" >&2
    exit 1
}
# Exit 3: a package could be neither downloaded nor found in the cache (tests skip on it).
die_fetch() {
    echo "golden-image: $*" >&2
    exit 3
}
# The packages, from the cache shared with the Xen lab (one fetcher at a time, whole files only).
DEB_WHO=golden-image
# shellcheck source=scripts/deb-cache.sh
. "$ROOT/scripts/deb-cache.sh"

# The cloud kernel: linux-image-cloud-amd64 is a metapackage; the kernel is in the package it
# depends on (linux-image-<abi>-cloud-amd64); with no package lists, the newest cached one.
kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | head -1 || true)
deb_fetch ${kpkg:+"$kpkg"} busybox-static
bdeb=${DEB[busybox-static]}
if [[ -z $kpkg ]]; then
    kdeb=$(find "$CACHE" -maxdepth 1 -name 'linux-image-[0-9]*-cloud-amd64_*_amd64.deb' |
        LC_ALL=C sort | tail -1)
    [[ -n $kdeb ]] || die_fetch "apt-cache knows no linux-image-cloud-amd64 and none is cached (apt-get update?)"
    echo "golden-image: using cached $(basename "$kdeb")" >&2
else
    kdeb=${DEB[$kpkg]}
fi
[[ $FETCH_ONLY -eq 0 ]] || exit 0

for c in dpkg-deb mkfs.ext4 cpio gzip; do
    command -v "$c" >/dev/null || die "$c not found (scripts/install-deps.sh test installs it)"
done
mkdir -p "$OUT"

work=$(mktemp -d "${TMPDIR:-/tmp}/golden-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

dpkg-deb -x "$kdeb" "$work/kernel"
dpkg-deb -x "$bdeb" "$work/busybox"
kver=$(basename "$(find "$work/kernel/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -1)")
[[ -n $kver ]] || die "no /lib/modules in $(basename "$kdeb")"
vmlinuz="$work/kernel/boot/vmlinuz-$kver"
[[ -f $vmlinuz ]] || die "no kernel in $(basename "$kdeb")"
busybox="$work/busybox/bin/busybox"
[[ -x $busybox ]] || die "no busybox in $(basename "$bdeb")"
moddir="$work/kernel/lib/modules/$kver/kernel"

# ---- the initramfs: drivers only ---------------------------------------------------------------
# The cloud kernel has ext4 built in but virtio as modules; loaded in dependency order.
VIRTIO_MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk"
ird="$work/initramfs"
mkdir -p "$ird"/{bin,dev,proc,sys,newroot,modules}
cp "$busybox" "$ird/bin/busybox"
for m in $VIRTIO_MODULES; do
    f=$(find "$moddir" -name "$m.ko" | head -1)
    [[ -n $f ]] || die "module $m.ko not in $(basename "$kdeb")"
    cp "$f" "$ird/modules/"
done
cat >"$ird/init" <<EOF
#!/bin/busybox sh
# Load the virtio disk driver, mount the root file system from /dev/vda and switch to it.
/bin/busybox mkdir -p /bin && /bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
echo "plx-initramfs: start \$(cut -d' ' -f1 /proc/uptime)"
for m in $VIRTIO_MODULES; do
    insmod /modules/\$m.ko || echo "plx-initramfs: insmod \$m failed"
done
i=0
while [ ! -b /dev/vda ] && [ \$i -lt 500 ]; do sleep 0.01; i=\$((i + 1)); done
if ! mount -t ext4 /dev/vda /newroot; then
    echo "plx-initramfs: cannot mount /dev/vda"
    poweroff -f
fi
umount /proc
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
EOF
chmod 755 "$ird/init"
(cd "$ird" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$OUT/initrd.img.new"

# ---- the root file system: what lives on the disk ---------------------------------------------
rootdir="$work/root"
mkdir -p "$rootdir"/{bin,sbin,dev,proc,sys,tmp,etc,plx,lib/modules,root}
cp "$busybox" "$rootdir/bin/busybox"
for a in $("$busybox" --list); do
    [[ $a == busybox ]] || ln -s busybox "$rootdir/bin/$a"
done
# The kernel's modules, as a Debian root has them: the bulk of the image that clones share.
cp -a "$work/kernel/lib/modules/$kver" "$rootdir/lib/modules/"
install -m 755 "$ROOT/tests/vm/guest-init.sh" "$rootdir/sbin/init"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$rootdir/etc/passwd"
printf 'plx-golden\n' >"$rootdir/etc/hostname"
{
    echo "kernel $(basename "$kdeb")"
    echo "busybox $(basename "$bdeb")"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} | tee "$rootdir/etc/plx-golden" >"$OUT/manifest.new"
rm -f "$OUT/root.img.new"
truncate -s "$SIZE" "$OUT/root.img.new"
mkfs.ext4 -q -F -L plxroot -E root_owner=0:0 -d "$rootdir" "$OUT/root.img.new" "$SIZE" ||
    die "mkfs.ext4 -d failed"

cp "$vmlinuz" "$OUT/vmlinuz.new"
for f in vmlinuz initrd.img root.img manifest; do
    mv -f "$OUT/$f.new" "$OUT/$f"
done
echo "golden-image: $OUT ($(basename "$kdeb"), root $SIZE)" >&2
