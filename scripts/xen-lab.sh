#!/usr/bin/env bash
# The Xen lab: a real Xen 4.17 host (Debian 12's hypervisor, toolstack and kernel) booted under
# QEMU's TCG emulator, with this tree's Parallax installed in dom0 by `make install`. No KVM and
# nothing installed on the machine beyond QEMU: the Xen and kernel packages are fetched with
# `apt-get download` into build/cache/debs and unpacked with dpkg-deb (docs/xen-lab.md).
#
#   scripts/xen-lab.sh fetch            only fetch the packages into build/cache/debs (make
#                                       check does it in the background while it builds)
#   scripts/xen-lab.sh build            assemble build/xen-lab/ (Xen, kernel, dom0 and guest
#                                       initramfs); `shell` and `run` do it first themselves
#   scripts/xen-lab.sh shell            boot Xen and dom0 with a root shell on this terminal
#                                       (the store is set up, xl and parallax ready; `exit`
#                                       or Ctrl-A X ends it)
#   scripts/xen-lab.sh run CASE...      boot, run the cases (tests/xen/cases/CASE.sh) in dom0,
#                                       print each case's result; a case that failed through a
#                                       toolstack crash (not a data error) is run once more in a
#                                       fresh boot
#   scripts/xen-lab.sh bench            dom0 Bonnie++ and PostMark on ext4: a Parallax VDI against
#                                       a raw file and the same file behind qemu-nbd
#                                       (tests/xen/cases/dom0-bench.sh; a scratch disk of
#                                       --scratch SIZE, default 8G, sparse; PLX_BENCH_ROUNDS
#                                       rounds, default 2; 20-40 minutes); its images, with
#                                       qemu-nbd, are build/xen-lab/bench/
#   scripts/xen-lab.sh list             the cases
#
# Options (before the command): --out DIR (a run's serial log and blockstore image; default
# a new directory under build/xen-lab/runs), --store-size SIZE (default 2G, sparse),
# --timeout SECONDS (of one boot; default 300 plus 400 per case), --keep (keep the run directory of a passing run),
# --scratch SIZE (a second, empty virtio disk for dom0: /dev/vdb), --shadow (a Xen with shadow
# paging, which `xl migrate` of a PV guest needs; `run` takes it by itself for a case whose
# file says "# xen-lab: shadow": see "Shadow paging" below and docs/xen-lab.md).
#
# The blockstore is a raw image given to dom0 as a virtio disk (/dev/vda, the dom0's
# /etc/parallax/blockstore); after the run this script checks it with `parallax check` on the
# host, so a run's data is judged by a second reader that did not take part.
#
# Exit: 0 all cases passed; 1 a case failed (its dom0 and guest console lines are printed);
# 3 the Debian packages could be neither downloaded nor found in the cache; 2 usage.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PLX_DEB_CACHE:-$ROOT/build/cache/debs}
QEMU=${PLX_QEMU:-qemu-system-x86_64}
OUT="" STORE_SIZE=2G TIMEOUT="" KEEP=0 SCRATCH="" SCRATCH_IMG="" BOOT_EXTRA=""
SHADOW=${PLX_XEN_SHADOW:-0}

die() { echo "xen-lab: $*" >&2; exit 1; }
die_fetch() { echo "xen-lab: $*" >&2; exit 3; }

while [[ $# -gt 0 ]]; do
    case $1 in
    --out) OUT=$2 && shift ;;
    --store-size) STORE_SIZE=$2 && shift ;;
    --timeout) TIMEOUT=$2 && shift ;;
    --keep) KEEP=1 ;;
    --scratch) SCRATCH=$2 && shift ;;
    --shadow) SHADOW=1 ;;
    -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
    -*) echo "xen-lab: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
[[ $# -ge 1 ]] || { sed -n '7,24p' "$0" >&2; exit 2; }
CMD=$1
shift

# ---- packages ----------------------------------------------------------------------------------
# What the dom0 and the guests are made of. The Xen packages and their libraries that a Debian
# machine without Xen lacks; busybox for the small user space; nbd-client for block-parallax.
XEN_DEBS=(xen-hypervisor-4.17-amd64 xen-utils-4.17 xen-utils-common xenstore-utils
    libxenmisc4.17 libxenstore4 libxencall1 libxenevtchn1 libxenforeignmemory1 libxengnttab1
    libxentoollog1 libxendevicemodel1 libxenhypfs1 libxentoolcore1 libyajl2)
OTHER_DEBS=(nbd-client libnl-genl-3-200 busybox-static)
# For the dom0 benchmark only (`bench`, tests/xen/cases/dom0-bench.sh): qemu-nbd, the plain
# user-space NBD server it measures Parallax against; of its package only qemu-nbd is kept, in
# dom0 only (not the storage VM). `bench` has images of its own (build/xen-lab/bench/), so the
# other commands (and make check) neither fetch nor unpack it.
BENCH_DEBS=(qemu-utils)
WITH_BENCH=0
# Programs taken from this (Debian 12) machine with their libraries: the hotplug scripts are
# bash and need util-linux's flock (busybox has none); e2fsprogs, the two benchmarks and
# util-linux's losetup (direct I/O) for the dom0 file-system runs; util-linux's mountpoint,
# which xen-configs/xl-devd.service runs in the storage VM (busybox-static has none).
HOST_PROGS=(bash flock mke2fs e2fsck bonnie++ postmark losetup mountpoint)
# Kernel modules dom0 and the guests load (whole directories: their dependencies are inside).
MOD_DIRS=(drivers/block drivers/xen drivers/virtio fs/ext4 fs/jbd2 fs/mbcache.ko lib crypto
    arch/x86/crypto)

# The packages, from the cache shared with the golden image (scripts/deb-cache.sh: one fetcher at a
# time, whole files only).
DEB_WHO=xen-lab
# shellcheck source=scripts/deb-cache.sh
. "$ROOT/scripts/deb-cache.sh"

# fetch_packages: the .deb of every package the images need (DEB[...]; the kernel's in KDEB).
# The kernel: linux-image-amd64 names the versioned package (it has the PV dom0 support and
# hvc0; the cloud kernel lacks the backends); with no package lists, the newest cached one.
KDEB=""
fetch_packages() {
    local k t0=$SECONDS
    k=$(apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -1 || true)
    [[ $SHADOW -eq 0 ]] || shadow_pin
    local pkgs=("${XEN_DEBS[@]}" "${OTHER_DEBS[@]}" ${k:+"$k"})
    [[ $WITH_BENCH -eq 0 ]] || pkgs+=("${BENCH_DEBS[@]}")
    deb_fetch "${pkgs[@]}"
    if [[ -n $k ]]; then
        KDEB=${DEB[$k]}
    else
        KDEB=$(find "$CACHE" -maxdepth 1 -name 'linux-image-[0-9]*-amd64_*_amd64.deb' |
            grep -v cloud | LC_ALL=C sort | tail -1)
        [[ -n $KDEB ]] || die_fetch "apt-cache knows no linux-image-amd64 and none is cached"
    fi
    echo "xen-lab: packages ready in ${CACHE#"$ROOT"/} ($((SECONDS - t0)) s)" >&2
}

# ---- shadow paging ------------------------------------------------------------------------------
# `xl migrate` of a PV guest needs Xen's log-dirty mode, which Xen implements for PV guests with
# shadow paging. Debian's security update 4.17.7+13-g2445b30a44-0+deb12u1 builds Xen without it
# (XSA-495 "x86 shadow paging is deprecated": `# CONFIG_SHADOW_PAGING is not set` in its
# /boot/xen-4.17-amd64.config; `xl migrate` then fails at once with "xc: error: Failed to
# enable logdirty: 95"). bookworm's own 4.17.5+72-g01140da4e8-1 has it. With --shadow the lab
# takes the newest version of Xen apt knows whose hypervisor package says
# CONFIG_SHADOW_PAGING=y, and every package built from the xen source at that same version (the
# toolstack must match the hypervisor), in a lab directory of its own (build/xen-lab-shadow).
# (Not a rebuild of the security update with shadow paging turned back on: the mirror serves no
# source for it, only for 4.17.5+72, whose build is the package's own configuration.)
XEN_SRC_DEBS=(xen-hypervisor-4.17-amd64 xen-utils-4.17 xen-utils-common xenstore-utils
    libxenmisc4.17 libxenstore4 libxencall1 libxenevtchn1 libxenforeignmemory1 libxengnttab1
    libxentoollog1 libxendevicemodel1 libxenhypfs1 libxentoolcore1)

has_shadow() { # HYPERVISOR_DEB
    dpkg-deb --fsys-tarfile "$1" | tar -xO ./boot/xen-4.17-amd64.config 2>/dev/null |
        grep -qx 'CONFIG_SHADOW_PAGING=y'
}

# shadow_pin: pin DEB_CAND (scripts/deb-cache.sh: deb_fetch asks apt only for the others) to
# such a version for every package of XEN_SRC_DEBS.
shadow_pin() {
    local hv=xen-hypervisor-4.17-amd64 v deb pick=""
    for v in $(apt-cache madison "$hv" 2>/dev/null | awk -F' *[|] *' '{ print $2 }' |
        LC_ALL=C sort -u | sort -r -V); do
        DEB_CAND[$hv]=$v
        # (In a subshell: a version that cannot be fetched ends only it.)
        deb=$(deb_fetch "$hv" 2>/dev/null && echo "${DEB[$hv]}") || continue
        [[ $deb == *"_${v//:/%3a}_amd64.deb" ]] && has_shadow "$deb" && { pick=$v; break; }
    done
    if [[ -z $pick ]]; then # no package lists or no network: a cached one
        for deb in $(find "$CACHE" -maxdepth 1 -name "${hv}_*_amd64.deb" | sort -r -V); do
            has_shadow "$deb" || continue
            pick=${deb##*/"${hv}"_} pick=${pick%_amd64.deb} pick=${pick//%3a/:}
            break
        done
    fi
    [[ -n $pick ]] || die_fetch "no version of $hv with CONFIG_SHADOW_PAGING=y in apt or $CACHE"
    echo "xen-lab: shadow paging: Xen $pick" >&2
    for p in "${XEN_SRC_DEBS[@]}"; do DEB_CAND[$p]=$pick; done
}

# ---- assembling the images ---------------------------------------------------------------------
# copy_with_libs ROOT FILE...: copy host programs into ROOT (same path) with the shared libraries
# they need that ROOT does not have yet.
copy_with_libs() {
    local root=$1 f
    shift
    for f in "$@"; do
        mkdir -p "$root$(dirname "$f")"
        # (Never through a busybox link of the same name: that would overwrite busybox.)
        rm -f "$root$f"
        cp -L "$f" "$root$f"
    done
}

is_elf() { cmp -s -n 4 "$1" <(printf '\177ELF'); }

# add_libs ROOT [FILE...]: give every ELF program and library in ROOT (or only these FILEs of
# it) the libraries it needs. ldd is
# asked with ROOT's own library directories first, so what the packages brought wins and only
# the rest (glibc, libaio, ...) comes from this machine, which is Debian 12 as well.
add_libs() {
    local root=$1 f lib libpath
    shift
    libpath="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
    libpath+=":$root/usr/lib/xen-4.17/lib/x86_64-linux-gnu"
    while IFS= read -r f; do
        is_elf "$f" || continue
        # (ldd fails on static programs: nothing to add for them.)
        { LD_LIBRARY_PATH=$libpath ldd "$f" 2>/dev/null || true; } | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/lib64\/[^ ]*\) .*/\1/p'
    done < <(if [[ $# -gt 0 ]]; then printf '%s\n' "$@"; else
        find "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" \
            "$root/usr/lib/xen-4.17/bin" "$root/usr/lib/x86_64-linux-gnu" -type f 2>/dev/null
    fi) |
        LC_ALL=C sort -u | while IFS= read -r lib; do
        [[ $lib == "$root"/* ]] && continue
        [[ -e $root$lib ]] || { mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"; }
    done
}

# The inputs of the images besides the packages: when none changed since the last build (and
# the packages are the same), the images are kept.
inputs_hash() {
    (
        cd "$ROOT" && cat scripts/xen-lab.sh tests/xen/*.sh tests/xen/*.cfg tests/xen/cases/*.sh \
            xen-configs/* build/parallax build/parallax-lockd Makefile mk/install.mk
        printf '%s\n' "$@"
    ) | sha256sum | cut -c1-16
}

build() {
    local stamp want work kdeb kver deb d p t0=$SECONDS
    mkdir -p "$CACHE" "$IMG"
    make -C "$ROOT" --no-print-directory -s all
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found (Debian 12 only)"
    for p in cpio xz "$QEMU"; do
        command -v "$p" >/dev/null || die "$p not found (run scripts/install-deps.sh xen as root)"
    done
    work=$(mktemp -d "$IMG/assemble.XXXXXX")
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf '$work'" EXIT

    local debs=() root="$work/dom0" groot="$work/guest"
    fetch_packages
    for p in "${XEN_DEBS[@]}" "${OTHER_DEBS[@]}"; do debs+=("${DEB[$p]}"); done
    local bench_debs=()
    if [[ $WITH_BENCH -eq 1 ]]; then
        for p in "${BENCH_DEBS[@]}"; do bench_debs+=("${DEB[$p]}"); done
    fi
    kdeb=$KDEB
    want=$(inputs_hash "${debs[@]}" ${bench_debs[@]+"${bench_debs[@]}"} "$kdeb")
    stamp=$(cat "$IMG/stamp" 2>/dev/null || true)
    if [[ $stamp == "$want" && -s $IMG/dom0.cpio && -s $IMG/xen && -s $IMG/vmlinux ]]; then
        rm -rf "$work"
        trap - EXIT
        return 0
    fi
    echo "xen-lab: assembling Xen, dom0 and guest images in ${IMG#"$ROOT"/}" >&2
    t0=$SECONDS
    mkdir -p "$root" "$groot" "$work/k"
    for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$root"; done
    # Of the kernel's package only what the images take: vmlinuz, the module lists and MOD_DIRS.
    # Unpacking all of it (some 5,000 files, 400 MB of modules) and deleting them afterwards took
    # 23 of the 37 s the images took on a busy machine. (tar stops at the archive's end marker;
    # cat reads the rest, so that dpkg-deb is not killed by a broken pipe.)
    local kpat=('./boot/vmlinuz-*' './lib/modules/*/modules.builtin' './lib/modules/*/modules.order')
    for d in "${MOD_DIRS[@]}"; do kpat+=("./lib/modules/*/kernel/$d"); done
    dpkg-deb --fsys-tarfile "$kdeb" | { tar -x -C "$work/k" --wildcards "${kpat[@]}" && cat >/dev/null; }
    kver=$(basename "$(find "$work/k/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -1)")

    # Xen's ELF: QEMU's multiboot loader takes it uncompressed.
    zcat "$root/boot/xen-4.17-amd64.gz" >"$work/xen"
    # The kernel as a plain ELF (vmlinux), for dom0 and the guests: the bzImage's xz payload
    # unpacked here costs nothing, while unpacking it under TCG costs seconds at every boot
    # and every `xl create`. xz stops at the payload's end and complains of what follows.
    local bz="$work/k/boot/vmlinuz-$kver" off
    off=$(grep -abo $'\xfd7zXZ\x00' "$bz" | head -1 | cut -d: -f1)
    [[ -n $off ]] || die "no xz payload in $bz"
    tail -c +$((off + 1)) "$bz" | xz -dc >"$work/vmlinux" 2>/dev/null || true
    is_elf "$work/vmlinux" || die "could not unpack the kernel of $(basename "$kdeb")"

    # -- dom0: the packages, busybox's applets for what they lack, host programs, Parallax.
    local bb="$root/bin/busybox"
    for d in bin sbin usr/bin usr/sbin; do mkdir -p "$root/$d"; done
    for p in $("$bb" --list-full); do
        [[ -e $root/bin/${p##*/} || -e $root/sbin/${p##*/} || -e $root/usr/bin/${p##*/} ||
            -e $root/usr/sbin/${p##*/} ]] || ln -s /bin/busybox "$root/$p"
    done
    for p in "${HOST_PROGS[@]}"; do
        copy_with_libs "$root" "$(command -v "$p" || die "$p not found on this machine")"
    done
    # libxl runs the hotplug scripts with /bin/bash; glibc dlopens libgcc_s for pthread_cancel
    # (pitfall 3 in the notes), which ldd does not list.
    [[ -e $root/bin/bash ]] || ln -s /usr/bin/bash "$root/bin/bash"
    copy_with_libs "$root" "$(find /lib/x86_64-linux-gnu/ /usr/lib/x86_64-linux-gnu/ -maxdepth 1 \
        -name 'libgcc_s.so.1' | head -1)"
    # Parallax the way a user installs it (PREFIX=/usr puts the hotplug scripts in
    # /etc/xen/scripts, where Xen looks).
    make -C "$ROOT" --no-print-directory -s install PREFIX=/usr DESTDIR="$root" >/dev/null
    add_libs "$root"
    # Modules, and the dependency list busybox's modprobe reads.
    local m="lib/modules/$kver"
    mkdir -p "$root/$m/kernel"
    for d in "${MOD_DIRS[@]}"; do
        mkdir -p "$root/$m/kernel/$(dirname "$d")"
        cp -a "$work/k/$m/kernel/$d" "$root/$m/kernel/$d"
    done
    cp "$work/k/$m/modules.builtin" "$work/k/$m/modules.order" "$root/$m/"
    "$bb" depmod -b "$root" "$kver"
    # The lab's own files: init, the case library and cases, the guest's kernel and initramfs.
    install -m 755 "$ROOT/tests/xen/dom0-init.sh" "$root/init"
    mkdir -p "$root/plx/cases" "$root/plx/guest"
    install -m 644 "$ROOT/tests/xen/lab-lib.sh" "$root/plx/"
    install -m 755 "$ROOT"/tests/xen/cases/*.sh "$root/plx/cases/"
    install -m 644 "$ROOT/tests/xen/example.cfg" "$root/plx/"
    # The random part of every chunk the guests write (tests/xen/guest-init.sh), the same in
    # dom0 and the guests.
    head -c 65536 /dev/urandom >"$root/plx/pattern"
    printf 'root:x:0:0:root:/root:/bin/bash\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
    mkdir -p "$root/etc/parallax" "$root/root" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" \
        "$root/run" "$root/var/log/xen" "$root/var/lib/xen" "$root/var/run"
    echo /dev/vda >"$root/etc/parallax/blockstore"

    # The storage VM's configs where a user puts them (docs/storage-vm.md), for the storagevm case.
    install -m 644 "$ROOT/xen-configs/storage-dd.cfg" "$ROOT/xen-configs/web3-pv-dd.cfg" \
        "$root/etc/xen/"

    # -- the storage VM (tests/xen/cases/storagevm.sh): dom0's user space (the Xen tools, bash,
    # nbd-client, Parallax installed by make install, the modules, the case library) without
    # what only dom0 uses, its own init (tests/xen/dd-init.sh), and its blockstore on its
    # second disk. Made before the guests' images are added to dom0's root, which it lacks.
    local droot="$work/dd"
    cp -a "$root" "$droot"
    # (Smaller is faster: libxc copies the initramfs into the domain under TCG. The Xen, block
    # and NBD modules need none of the ones removed.)
    rm -rf "${droot:?}/boot" "$droot/usr/share/doc" "$droot/usr/share/man" "$droot/plx/cases" \
        "$droot/usr/lib/xen-4.17/boot"
    for d in fs lib crypto arch drivers/virtio; do rm -rf "$droot/lib/modules/$kver/kernel/$d"; done
    for p in bonnie++ postmark mke2fs e2fsck xenstored oxenstored xenconsoled; do
        find "$droot" -name "$p" -type f -delete
    done
    install -m 755 "$ROOT/tests/xen/dd-init.sh" "$droot/init"
    # Where docs/storage-vm.md has the user put it (dd-init.sh runs its commands).
    install -D -m 644 "$ROOT/xen-configs/xl-devd.service" "$droot/etc/systemd/system/xl-devd.service"
    printf '# the second disk (tests/xen/cases/storagevm.sh)\n/dev/xvdb\n' \
        >"$droot/etc/parallax/blockstore"
    mkdir -p "$root/plx/dd"
    (cd "$droot" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$root/plx/dd/initrd"

    # -- the benchmark's images only: qemu-nbd with the libraries it needs that dom0 lacks.
    if [[ $WITH_BENCH -eq 1 ]]; then
        mkdir -p "$work/qemu"
        for deb in "${bench_debs[@]}"; do dpkg-deb -x "$deb" "$work/qemu"; done
        install -m 755 "$work/qemu/usr/bin/qemu-nbd" "$root/usr/bin/qemu-nbd"
        add_libs "$root" "$root/usr/bin/qemu-nbd"
    fi

    # -- the PV guests: busybox, the block frontend, the guest init.
    mkdir -p "$groot"/{bin,dev,proc,sys,tmp}
    cp "$bb" "$groot/bin/busybox"
    cp "$work/k/$m/kernel/drivers/block/xen-blkfront.ko" "$groot/"
    install -m 755 "$ROOT/tests/xen/guest-init.sh" "$groot/init"
    cp "$root/plx/pattern" "$groot/pattern"
    (cd "$groot" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$root/plx/guest/initrd"
    cp "$work/vmlinux" "$root/plx/guest/vmlinux"

    # Uncompressed cpio: dom0 unpacks it without decompressing under TCG.
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work/dom0.cpio"
    {
        echo "kernel $(basename "$kdeb")"
        for deb in "${debs[@]}" ${bench_debs[@]+"${bench_debs[@]}"}; do basename "$deb"; done
        echo "host: ${HOST_PROGS[*]}"
    } >"$work/manifest"
    # Each file is replaced by a rename, so a lab booting beside this build reads whole files.
    for f in xen vmlinux dom0.cpio manifest; do mv -f "$work/$f" "$IMG/$f"; done
    echo "$want" >"$IMG/stamp"
    rm -rf "$work"
    trap - EXIT
    echo "xen-lab: images assembled ($((SECONDS - t0)) s)" >&2
}

# ---- booting -----------------------------------------------------------------------------------
XEN_ARGS="console=com1 com1=115200,8n1 dom0_mem=1024M,max:1024M dom0_max_vcpus=1 noreboot"
XEN_ARGS+=" console_timestamps=boot smap=0"
# -cpu max with Xen's smap=0 (pitfall 1 of the notes), but without XSAVE: with it, processes
# in dom0 and the guests crashed now and then under QEMU 7.2's TCG with garbage in their
# registers or memory whenever two domains were busy (pitfall 7: segfaults at TLS loads, xl
# aborts), seen in every one of 3 runs of the short case; without it Xen saves vector state
# with FXSAVE and no run has crashed since. PLX_XEN_CPU overrides it (Nehalem works too, about
# three times slower).
CPU=${PLX_XEN_CPU:-max,-xsave}
DOM0_ARGS="console=hvc0 earlyprintk=xen mitigations=off"

# boot SERIAL_LOG STORE DOM0_EXTRA: one Xen boot; the serial console goes to SERIAL_LOG (and to
# this terminal when it is one and the lab is interactive).
boot() {
    local log=$1 store=$2 tmo=$3 extra=$4
    # -cpu max with smap=0 (pitfall 1); -smp 1: one host core is faster and steadier (pitfall 6).
    # shellcheck disable=SC2054 # the commas belong to the options
    local q=("$QEMU" -accel tcg,thread=multi -cpu "$CPU" -smp 1 -m 2048 -display none -monitor none
        -no-reboot -kernel "$IMG/xen" -append "$XEN_ARGS"
        -initrd "$IMG/vmlinux $DOM0_ARGS $extra,$IMG/dom0.cpio"
        -drive "file=$store,format=raw,if=virtio,cache=unsafe")
    # The benchmarks' scratch disk (dom0's /dev/vdb), with the host's page cache out of the way.
    [[ -z $SCRATCH_IMG ]] || q+=(-drive "file=$SCRATCH_IMG,format=raw,if=virtio,cache=none")
    if [[ $CMD == shell ]]; then
        "${q[@]}" -serial mon:stdio
    else
        timeout -k 10 "$tmo" "${q[@]}" -serial "file:$log" </dev/null >"$log.qemu" 2>&1
    fi
}

# run_cases CASE...: boot once with these cases; sets RES[CASE]=PASS|FAIL|TOOLSTACK|MISSING.
declare -A RES=()
run_cases() {
    local n=$1 log store rc=0 c r
    shift
    log="$OUT/serial-$n.log" store="$OUT/store-$n.img"
    rm -f "$store" && truncate -s "$STORE_SIZE" "$store"
    if [[ -n $SCRATCH ]]; then
        SCRATCH_IMG="$OUT/scratch-$n.img"
        rm -f "$SCRATCH_IMG" && truncate -s "$SCRATCH" "$SCRATCH_IMG"
    fi
    local t0=$SECONDS
    echo "xen-lab: boot $n: $* (serial console: ${log#"$ROOT"/})"
    # On a machine whose cores are shared with other work a boot alone can take a minute.
    local tmo=${TIMEOUT:-$((300 + 400 * $#))}
    # dom0 ends a case that would outlast the boot's time limit itself (plx.deadline, its
    # uptime; Xen and dom0's kernel start take the first seconds, the poweroff the last), so
    # that the case's guest consoles, which only dom0 has, are still printed.
    boot "$log" "$store" "$tmo" "plx.cases=$(IFS=:; echo "$*") plx.deadline=$((tmo - 30))$BOOT_EXTRA" ||
        rc=$?
    tr -d '\r' <"$log" >"$log.tmp" && mv -f "$log.tmp" "$log"
    if [[ $rc -eq 0 ]]; then
        echo "xen-lab: boot $n ended after $((SECONDS - t0)) s"
    else
        echo "xen-lab: QEMU ended with $rc after $((SECONDS - t0)) s$([[ $rc -eq 124 ]] && echo " (timed out)")"
    fi
    for c in "$@"; do
        r=$(sed -n "s/.*PLX-CASE $c \(PASS\|FAIL\|TOOLSTACK\).*/\1/p" "$log" | tail -1)
        RES[$c]=${r:-MISSING}
    done
    # The timings dom0 reported (its uptime in seconds at each milestone; case-* are durations).
    # Xen's own: its uptime when it handed the console to dom0 (console_timestamps=boot).
    sed -n 's/^(XEN) \[ *\([0-9.]*\)\] \*\*\* Serial input to DOM0.*/xen-lab:   PLX-TIME xen-to-dom0 \1/p' \
        "$log" | head -n 1
    grep -o 'PLX-TIME .*' "$log" | sed 's/^/xen-lab:   /' || true
    # The blockstore read by a second reader, on the host: consistent after the run?
    if [[ ${RES[*]} != *MISSING* ]] && ! "$ROOT/build/parallax" -b "$store" check --quiet \
        >"$OUT/check-$n.txt" 2>&1; then
        echo "xen-lab: parallax check on the host found the blockstore inconsistent:"
        sed 's/^/    /' "$OUT/check-$n.txt"
        for c in "$@"; do [[ ${RES[$c]} == PASS ]] && RES[$c]=FAIL; done
    fi
    rm -f "$store" ${SCRATCH_IMG:+"$SCRATCH_IMG"}
}

show_failure() {
    local c=$1 log=$2
    echo "---- $c: dom0 and guest console lines (from ${log#"$ROOT"/}) ----"
    # Every line from the case's start marker to its result, or the tail of the log.
    if grep -q "PLX-START $c" "$log"; then
        sed -n "/PLX-START $c\$/,/PLX-CASE $c /p" "$log" | tail -n 200
    else
        tail -n 80 "$log"
    fi
    echo "---- end of $c ----"
}

run() {
    [[ $# -ge 1 ]] || die "run: name the cases (scripts/xen-lab.sh list)"
    local c cases=() again=() failed=0 n=1
    for c in "$@"; do
        c=${c%.sh}
        [[ -f $ROOT/tests/xen/cases/$c.sh ]] || die "no case $c (scripts/xen-lab.sh list)"
        cases+=("$c")
    done
    [[ -x $ROOT/build/parallax ]] || make -C "$ROOT" --no-print-directory -s all
    local own=0
    if [[ -z $OUT ]]; then
        OUT=$(mkdir -p "$LAB/runs" && mktemp -d "$LAB/runs/run.XXXXXX")
        own=1
    fi
    mkdir -p "$OUT"
    run_cases 1 "${cases[@]}"
    # A toolstack crash (xl or a library it loads died by a signal: pitfall 7 in the notes) is
    # not Parallax's; such a case gets one more, fresh boot. A data failure never does.
    for c in "${cases[@]}"; do [[ ${RES[$c]} == TOOLSTACK ]] && again+=("$c"); done
    if [[ ${#again[@]} -gt 0 ]]; then
        echo "xen-lab: toolstack crash in ${again[*]}: once more in a fresh boot"
        show_failure "${again[0]}" "$OUT/serial-1.log" | tail -n 30
        n=2
        run_cases 2 "${again[@]}"
    fi
    for c in "${cases[@]}"; do
        echo "${RES[$c]} xen:$c"
        if [[ ${RES[$c]} != PASS ]]; then
            failed=1
            show_failure "$c" "$OUT/serial-$([[ " ${again[*]} " == *" $c "* ]] && echo 2 || echo 1).log"
        fi
    done
    if [[ $failed -eq 0 && $KEEP -eq 0 && $own -eq 1 ]]; then
        rm -rf "$OUT"
    else
        echo "xen-lab: logs kept in ${OUT#"$ROOT"/}"
    fi
    [[ $failed -eq 0 ]]
}

# A case that needs shadow paging says so in its file; the whole run then takes that Xen.
if [[ $CMD == run ]]; then
    for c in "$@"; do
        grep -qx '# xen-lab: shadow' "$ROOT/tests/xen/cases/${c%.sh}.sh" 2>/dev/null && SHADOW=1
    done
fi
LAB=${PLX_XEN_LAB:-$ROOT/build/xen-lab$([[ $SHADOW -eq 0 ]] || echo -shadow)}
# The images booted: LAB's, or for `bench` LAB/bench (with qemu-nbd).
IMG=$LAB

case $CMD in
build) build ;;
fetch) fetch_packages ;;
list) find "$ROOT/tests/xen/cases" -name "*.sh" -printf "%f\n" | sed "s/\.sh$//" | LC_ALL=C sort ;;
shell)
    build
    OUT=${OUT:-$(mkdir -p "$LAB/runs" && mktemp -d "$LAB/runs/shell.XXXXXX")}
    mkdir -p "$OUT"
    [[ -e $OUT/store.img ]] || truncate -s "$STORE_SIZE" "$OUT/store.img"
    echo "xen-lab: booting Xen (about 30 s to a dom0 shell); the blockstore is $OUT/store.img"
    boot "" "$OUT/store.img" 0 "plx.cases=shell"
    ;;
run)
    build
    run "$@"
    ;;
bench)
    # dom0 Bonnie++ and PostMark: a Parallax VDI, a raw file, the raw file behind qemu-nbd
    # (tests/xen/cases/dom0-bench.sh), in PLX_BENCH_ROUNDS rounds.
    SCRATCH=${SCRATCH:-8G}
    ROUNDS=${PLX_BENCH_ROUNDS:-2}
    [[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "PLX_BENCH_ROUNDS must be a positive number"
    BOOT_EXTRA=" plx.bench_rounds=$ROUNDS"
    TIMEOUT=${PLX_XEN_BENCH_TIMEOUT:-$((600 + 2400 * ROUNDS))}
    WITH_BENCH=1 IMG=$LAB/bench
    build
    OUT=${OUT:-$(mkdir -p "$LAB/runs" && mktemp -d "$LAB/runs/bench.XXXXXX")}
    KEEP=1
    rc=0
    # The machine's load during the run, once a minute: on shared cores it decides the figures.
    (while :; do uptime; sleep 60; done) >"$OUT/load.txt" 2>&1 &
    loadlog=$!
    run dom0-bench || rc=$?
    kill "$loadlog" 2>/dev/null || true
    grep -h -o 'PLX-BENCH .*' "$OUT"/serial-*.log | tee "$OUT/bench.txt"
    # Per figure the median of each target's rounds (raw, raw2, ... are target raw) and the
    # ratios of the medians (above 1 the first is faster; for postmark-seconds, slower).
    echo "xen-lab: medians over $ROUNDS round(s); ratios parallax/raw, parallax/nbd, nbd/raw:"
    awk 'function median(s,  a, n, i, j, x) {
            n = split(s, a, " ")
            for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) {
                x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        function ratio(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
        { t = $2; sub(/[0-9]+$/, "", t); v[t, $3] = v[t, $3] " " $4; f[$3] = $5 }
        END { for (k in f) {
            r = median(v["raw", k]); n = median(v["nbd", k]); p = median(v["parallax", k])
            printf "%-22s raw %8s  nbd %8s  parallax %8s %-5s  %s  %s  %s  (raw%s; nbd%s; parallax%s)\n",
                k, r, n, p, f[k], ratio(p, r), ratio(p, n), ratio(n, r),
                v["raw", k], v["nbd", k], v["parallax", k] } }' "$OUT/bench.txt" | LC_ALL=C sort
    echo "xen-lab: load average during the run (${OUT#"$ROOT"/}/load.txt):" \
        "$(sed -n 's/.*load average: \([0-9.]*\),.*/\1/p' "$OUT/load.txt" |
            sort -n | sed -n '1p;$p' | paste -sd- -)"
    exit "$rc"
    ;;
*) echo "xen-lab: unknown command $CMD" >&2; exit 2 ;;
esac
