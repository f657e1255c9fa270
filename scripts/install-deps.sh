#!/usr/bin/env bash
# Ensure the Debian 12 packages Parallax needs are installed.
#
#   scripts/install-deps.sh build   compiler, libaio, Check, cppcheck, clang-format
#   scripts/install-deps.sh test    the above plus everything the tests use
#   scripts/install-deps.sh xen     build plus what the Xen lab needs on this machine
#
# Silent when nothing is missing. Installs the missing packages with apt-get when run as root;
# otherwise names them and exits 1.
set -euo pipefail

BUILD_PKGS=(build-essential pkg-config libaio-dev libiscsi-dev check libsubunit-dev cppcheck clang-format libgnutls28-dev libblkid-dev)
TEST_PKGS=(
    e2fsprogs util-linux jq python3 graphviz xxd
    # integration tests: NBD export, images, workloads, FUSE, iSCSI
    nbdkit libnbd-bin qemu-utils fio fuse3 bonnie++ postmark
    # TLS tests: certtool and psktool; bench/fua.c: libnbd's C API
    gnutls-bin libnbd-dev
    tgt libiscsi-bin
    # the side-by-side benchmark suite (bench/suite/run.sh; make bench, make bench-suite-smoke):
    # qemu-storage-daemon, gnuplot's PNG terminal and its font, loop devices and mounts, git
    # archive of the tree the frequency section builds
    qemu-system-common gnuplot-nox fonts-dejavu-core mount git tar coreutils
    # the install and package tests (tests/integration/install.sh, deb_package.sh): Debian
    # package builds, `script` for a terminal, nm and readelf
    debhelper dpkg-dev bsdutils binutils man-db
    # real guests on VDIs (tests/integration/vm_clones.sh, bench/clones.sh): QEMU with TCG, the
    # initramfs packer; the guest's kernel and busybox are fetched by scripts/golden-image.sh
    # with apt-get download, not installed
    qemu-system-x86 cpio
)

# The Xen lab (scripts/xen-lab.sh, make xen-lab, make check-xen, tests/integration/xen_real.sh):
# QEMU to boot Xen, the initramfs packer, xz for the kernel, and the host programs copied into
# dom0. The Xen hypervisor, its toolstack and the kernel are Debian packages too, but they are
# fetched with `apt-get download` into build/cache/debs and unpacked into the lab's images, not
# installed on this machine (installing xen-hypervisor would change how the machine boots).
XEN_PKGS=(qemu-system-x86 cpio xz-utils e2fsprogs util-linux bonnie++ postmark diffutils)

usage() {
    echo "usage: $0 build|test|xen" >&2
    exit 2
}

[[ $# -eq 1 ]] || usage
case "$1" in
build) want=("${BUILD_PKGS[@]}") ;;
test) want=("${BUILD_PKGS[@]}" "${TEST_PKGS[@]}" "${XEN_PKGS[@]}") ;;
xen) want=("${BUILD_PKGS[@]}" "${XEN_PKGS[@]}") ;;
*) usage ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-deps: dpkg-query not found; this script supports Debian 12 only." >&2
    echo "install-deps: install the equivalents of: ${want[*]}" >&2
    exit 1
fi

# A package counts as present only when dpkg reports it fully installed
# (Status "install ok installed" or "hold ok installed").
missing=()
for pkg in "${want[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    case "$status" in
    *" ok installed") ;;
    *) missing+=("$pkg") ;;
    esac
done

[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing Debian packages: ${missing[*]}" >&2
    echo "install-deps: run as root:  sudo $0 $1" >&2
    echo "install-deps: or by hand:   sudo apt-get install ${missing[*]}" >&2
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq </dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
