#!/usr/bin/env bash
# The Debian packages: `dpkg-buildpackage -b -us -uc` on a copy of the tree builds parallax,
# libparallax1 and libparallax-dev, and each holds what it should. They are unpacked with
# dpkg-deb -x into a scratch root rather than installed with dpkg -i, so the test leaves the
# machine's package database alone (other jobs share it); then, from that root:
# - the packaged `parallax` runs, reports the package's version and formats and lists a store;
# - the packaged libparallax1 exports exactly parallax.h's functions (tests/check-exports.sh);
# - a program builds against libparallax-dev's parallax.pc and runs with libparallax1's library;
# - the package metadata says what links what: libparallax-dev depends on libparallax1 of the
#   same version, and libparallax1 provides the shlibs entry for libparallax.so.1.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd dpkg-buildpackage dh dpkg-deb dpkg-architecture cc pkg-config readelf tar
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$PLX_TEST_TMP

# The tree as it is (committed or not), without build outputs.
mkdir -p "$T/pkg/parallax"
tar -C "$src" --exclude=./.git --exclude=./build --exclude=./bench/results --exclude=./tests/tmp \
    -cf - . | tar -C "$T/pkg/parallax" -xf -
start=$SECONDS
(cd "$T/pkg/parallax" && dpkg-buildpackage -b -us -uc -j2) >"$T/build.log" 2>&1 ||
    { tail -40 "$T/build.log"; fail "dpkg-buildpackage"; }
echo "deb_package: dpkg-buildpackage took $((SECONDS - start)) s"
# What the build leaves in debian/ is ignored by git: a package build in the tree leaves nothing
# untracked behind (debian/*.debhelper.log was).
if command -v git >/dev/null && [[ -e $src/.git ]]; then
    while IFS= read -r f; do
        [[ -e $src/debian/$f ]] && continue
        [[ -d $T/pkg/parallax/debian/$f ]] && f+=/ # a directory pattern matches only so
        git -C "$src" check-ignore -q --no-index "debian/$f" ||
            fail "the package build leaves debian/$f, which .gitignore does not cover"
    done < <(cd "$T/pkg/parallax/debian" && find . -maxdepth 1 -mindepth 1 -printf '%P\n')
fi

version=$(sed -n 's/^#define PLX_API_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
    "$src/libparallax/include/parallax.h" | paste -sd.)
deb_version=$(cd "$T/pkg/parallax" && dpkg-parsechangelog -S Version)
# The package is a release of the library: same version (debian/changelog follows parallax.h).
assert_eq "$version" "$deb_version" "debian/changelog version vs PLX_API_VERSION"
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

root="$T/root"
for p in parallax libparallax1 libparallax-dev; do
    deb="$T/pkg/${p}_${deb_version}_${arch}.deb"
    [[ -f $deb ]] || fail "no package $p ($deb)"
    dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$' >"$T/$p.files"
    dpkg-deb -x "$deb" "$root"
done

has() { # PACKAGE PATH...
    local p=$1 f
    shift
    for f in "$@"; do
        grep -qxF "$f" "$T/$p.files" || fail "package $p lacks $f"
    done
}
has parallax /usr/bin/parallax \
    /usr/share/man/man8/parallax.8.gz /etc/xen/scripts/block-parallax \
    /etc/xen/scripts/block-parallax-tap /etc/xen/scripts/parallax-hotplug-common.sh \
    /lib/systemd/system/parallax-serve@.service /etc/parallax/serve/qemu-nbd.conf
has libparallax1 "/usr/lib/$multiarch/libparallax.so.$version" "/usr/lib/$multiarch/libparallax.so.1"
has libparallax-dev /usr/include/parallax.h "/usr/lib/$multiarch/libparallax.so" \
    "/usr/lib/$multiarch/libparallax.a" "/usr/lib/$multiarch/pkgconfig/parallax.pc" \
    /usr/share/man/man3/libparallax.3.gz
# Each file in exactly one package.
dups=$(cat "$T"/parallax.files "$T"/libparallax1.files "$T"/libparallax-dev.files | sort | uniq -d)
[[ -z $dups ]] || fail "files in more than one package: $dups"

# Package metadata.
dev_deps=$(dpkg-deb -f "$T/pkg/libparallax-dev_${deb_version}_${arch}.deb" Depends)
[[ $dev_deps == *"libparallax1 (= $deb_version)"* ]] || fail "libparallax-dev Depends: $dev_deps"
dpkg-deb -I "$T/pkg/libparallax1_${deb_version}_${arch}.deb" shlibs | contains '^libparallax 1 libparallax1' ||
    fail "libparallax1 has no shlibs entry for libparallax.so.1"
dpkg-deb -I "$T/pkg/parallax_${deb_version}_${arch}.deb" conffiles | contains -x /etc/parallax/serve/qemu-nbd.conf ||
    fail "the serve settings are not a conffile"
grep -qx 'ExecStart=/usr/bin/parallax serve $PARALLAX_SERVE_ARGS' "$root/lib/systemd/system/parallax-serve@.service" ||
    fail "the packaged unit does not run /usr/bin/parallax"

# The packaged command.
assert_eq "parallax $version" "$("$root/usr/bin/parallax" --version)" "packaged parallax --version"
"$root/usr/bin/parallax" -b "$T/store.img" format --size 64M --extent-size 1M >/dev/null ||
    fail "packaged parallax format"
"$root/usr/bin/parallax" -b "$T/store.img" vdi-create web1 --size 4M >/dev/null
"$root/usr/bin/parallax" -b "$T/store.img" vdi-list | contains '^1 *web1 ' || fail "packaged vdi-list"

# The packaged library and its development files.
libdir="$root/usr/lib/$multiarch"
"$src/tests/check-exports.sh" "$libdir/libparallax.so.$version" "$root/usr/include" ||
    fail "exports of the packaged library"
export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$libdir/pkgconfig" PKG_CONFIG_PATH=""
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags parallax) "$src/tests/integration/install_prog.c" \
    -o "$T/prog" $(pkg-config --libs parallax) || fail "building against libparallax-dev"
LD_LIBRARY_PATH="$libdir" ldd "$T/prog" | contains "libparallax.so.1 => $libdir/libparallax.so.1 " ||
    fail "the program does not load the packaged libparallax.so.1"
out=$(LD_LIBRARY_PATH="$libdir" "$T/prog" "$T/prog.img") || fail "program against the packages"
[[ $out == "ok "* ]] || fail "program said: $out"
echo "deb_package: parallax, libparallax1, libparallax-dev $deb_version built, unpacked and used"
