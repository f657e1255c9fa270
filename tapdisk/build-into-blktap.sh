#!/usr/bin/env bash
# Add the Parallax driver to a blktap3 source tree (xapi-project/blktap) and build it.
#
#   tapdisk/build-into-blktap.sh BLKTAP_DIR [PREFIX]
#
# BLKTAP_DIR is a checkout of xapi-project/blktap (nothing from it is part of Parallax). PREFIX
# (default BLKTAP_DIR/_install) is where `make install` puts tapdisk and tap-ctl: tap-ctl starts
# tapdisk from the libexec directory compiled into it, so a tree is only usable after install.
#
# What it does (docs/tapdisk.md, "Adding the driver to a blktap3 tree", says why):
#   1. builds libparallax here (make build/libparallax.so) and installs it as
#      PREFIX/lib/libparallax.so.1 (with a libparallax.so link);
#   2. copies the driver (tapdisk/block-parallax.c, block-parallax-open.c, block-parallax.h),
#      tapdisk/tapdisk-iface.h and what it shares with
#      `parallax serve` from host/ (parallax_control.h, parallax_handover.h; control_server.c,
#      control_client.c and handover.c as parallax-control-*.c and parallax-handover.c) into
#      BLKTAP_DIR/drivers/, unchanged;
#   3. appends to drivers/Makefile.am, after its own definitions (so that its `+=` extend them): the
#      sources, the include path of parallax.h, libparallax, and an rpath to PREFIX/lib for the
#      programs;
#   4. adds DISK_TYPE_PARALLAX (17) to drivers/tapdisk-disktype.h and the "parallax" entries to
#      both tables of drivers/tapdisk-disktype.c;
#   5. writes the VERSION file (4.0.0) that version.m4 includes, if it is missing;
#   6. ./autogen.sh, ./configure --prefix=PREFIX, make, make install (CFLAGS -Wno-error: gcc 12
#      warns about truncation in blktap's own code).
# Steps 2-4 are idempotent: running the script again refreshes the copies and builds again.
#
# Packages (Debian 12): build-essential autoconf automake libtool pkg-config libaio-dev uuid-dev
# zlib1g-dev libssl-dev libxen-dev libglib2.0-dev libcmocka-dev. Run as a user who may write
# BLKTAP_DIR and PREFIX.
set -euo pipefail

usage() {
    echo "usage: $0 BLKTAP_DIR [PREFIX]" >&2
    exit 2
}
[[ $# -ge 1 && $# -le 2 ]] || usage
here=$(cd "$(dirname "$0")/.." && pwd)
bt=$(cd "$1" && pwd) || { echo "$0: $1: no such directory" >&2; exit 1; }
prefix=${2:-$bt/_install}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
drv=$bt/drivers

for f in Makefile.am tapdisk.h tapdisk-disktype.h tapdisk-disktype.c; do
    [[ -f $drv/$f ]] || { echo "$0: $bt does not look like a blktap3 tree (no drivers/$f)" >&2; exit 1; }
done
missing=()
for p in build-essential autoconf automake libtool pkg-config libaio-dev uuid-dev zlib1g-dev \
    libssl-dev libxen-dev libglib2.0-dev libcmocka-dev; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *" ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "$0: missing Debian packages: ${missing[*]} (apt-get install them first)" >&2
    exit 1
fi

echo "== 1. libparallax"
make -C "$here" -s build/libparallax.so
mkdir -p "$prefix/lib"
install -m 0755 "$here/build/libparallax.so" "$prefix/lib/libparallax.so.1"
ln -sf libparallax.so.1 "$prefix/lib/libparallax.so"

echo "== 2. driver sources -> $drv"
install -m 0644 "$here/tapdisk/block-parallax.c" "$here/tapdisk/block-parallax-open.c" \
    "$here/tapdisk/block-parallax.h" "$here/tapdisk/tapdisk-iface.h" "$drv/"
# The same files `parallax serve` is built from. Their headers' names (parallax_*.h) are free
# beside blktap's own (it has a tapdisk-control.h, a lock.h, a log.h); the sources take a prefix
# here for the same reason.
install -m 0644 "$here/host/parallax_control.h" "$here/host/parallax_handover.h" "$drv/"
install -m 0644 "$here/host/control_server.c" "$drv/parallax-control-server.c"
install -m 0644 "$here/host/control_client.c" "$drv/parallax-control-client.c"
install -m 0644 "$here/host/handover.c" "$drv/parallax-handover.c"
rm -f "$drv/parallax-control.h" # what an older version of this script made of the header

echo "== 3. drivers/Makefile.am"
begin='# ---- parallax (tapdisk/build-into-blktap.sh) ----'
end='# ---- end parallax ----'
sed -i "\\|^$begin\$|,\\|^$end\$|d" "$drv/Makefile.am"
# The rpath goes to the programs (automake refuses linker flags in a library's LIBADD); they
# take AM_LDFLAGS since none has LDFLAGS of its own.
ldop='='
grep -q '^AM_LDFLAGS' "$drv/Makefile.am" && ldop='+='
cat >>"$drv/Makefile.am" <<EOF
$begin
AM_CPPFLAGS += -I$here/libparallax/include
libtapdisk_la_SOURCES += block-parallax.c block-parallax-open.c block-parallax.h tapdisk-iface.h
libtapdisk_la_SOURCES += parallax-control-server.c parallax-control-client.c parallax_control.h
libtapdisk_la_SOURCES += parallax-handover.c parallax_handover.h
libtapdisk_la_LIBADD += -L$prefix/lib -lparallax
AM_LDFLAGS $ldop -Wl,-rpath,$prefix/lib
$end
EOF

echo "== 4. disk type 'parallax' (17)"
if ! grep -q DISK_TYPE_PARALLAX "$drv/tapdisk-disktype.h"; then
    sed -i 's|^/\*#define DISK_TYPE_NTNX .*|&\n#define DISK_TYPE_PARALLAX    17|' "$drv/tapdisk-disktype.h"
fi
grep -q '^#define DISK_TYPE_PARALLAX' "$drv/tapdisk-disktype.h" ||
    { echo "$0: could not add DISK_TYPE_PARALLAX to tapdisk-disktype.h" >&2; exit 1; }
if ! grep -q parallax_disk "$drv/tapdisk-disktype.c"; then
    # The name/description table entry, after nbd's.
    sed -i 's|^const disk_info_t \*tapdisk_disk_types\[\] = {|static const disk_info_t parallax_disk = {\n\t"parallax",\n\t"Parallax VDI (parallax)",\n\t0,\n};\n\n&|' "$drv/tapdisk-disktype.c"
    sed -i 's|^\t\[DISK_TYPE_NBD\]         = &nbd_disk,|&\n\t[DISK_TYPE_PARALLAX]    = \&parallax_disk,|' "$drv/tapdisk-disktype.c"
    sed -i 's|^extern struct tap_disk tapdisk_nbd;|&\nextern struct tap_disk tapdisk_parallax;|' "$drv/tapdisk-disktype.c"
    sed -i 's|^\t\[DISK_TYPE_NBD\]         = &tapdisk_nbd,|&\n\t[DISK_TYPE_PARALLAX]    = \&tapdisk_parallax,|' "$drv/tapdisk-disktype.c"
fi
for want in '= &parallax_disk,' '= &tapdisk_parallax,' 'extern struct tap_disk tapdisk_parallax;'; do
    grep -qF "$want" "$drv/tapdisk-disktype.c" ||
        { echo "$0: could not add '$want' to tapdisk-disktype.c (its layout changed?)" >&2; exit 1; }
done

echo "== 5. VERSION"
# version.m4 includes it; a git checkout has no such file.
[[ -f $bt/VERSION ]] || echo "4.0.0" >"$bt/VERSION"

echo "== 6. build and install into $prefix"
cd "$bt"
# tap-ctl has the libexec path of tapdisk compiled in: rebuild it when the prefix changes.
[[ -f .parallax-prefix && $(cat .parallax-prefix) == "$prefix" ]] || touch control/tap-ctl-spawn.c 2>/dev/null || true
echo "$prefix" >.parallax-prefix
./autogen.sh >autogen.parallax.log 2>&1 || { tail -20 autogen.parallax.log >&2; echo "$0: autogen.sh failed" >&2; exit 1; }
./configure --prefix="$prefix" CFLAGS="-g -O2 -Wno-error" >configure.parallax.log 2>&1 ||
    { tail -20 configure.parallax.log >&2; echo "$0: configure failed (log: $bt/configure.parallax.log)" >&2; exit 1; }
make -j"$(nproc)" >make.parallax.log 2>&1 ||
    { grep -m20 -E 'error|Error' make.parallax.log >&2; echo "$0: make failed (log: $bt/make.parallax.log)" >&2; exit 1; }
make install >install.parallax.log 2>&1 ||
    { tail -20 install.parallax.log >&2; echo "$0: make install failed (log: $bt/install.parallax.log)" >&2; exit 1; }
echo "built: $prefix/sbin/tap-ctl, $(find "$prefix" -name tapdisk -type f | head -1)"
echo "try:   mkdir -p /run/blktap-control && $prefix/sbin/tap-ctl create -a parallax:STORE:VDI"
