#!/usr/bin/env bash
# `parallax upgrade` on a format-version-1 store made through the CLI: before it, commands name
# the old version and the command to run; after it, the VDIs, clones, snapshots, labels and data
# are all there, `check` is clean, and the store takes new VDIs and snapshots. The version-1
# store is this run's own: a store made with the CLI, rewritten as version 1 by build/make-v1
# (tests/integration/make_v1.c), since `parallax format` makes only version 2.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

make_v1=$(dirname "$PARALLAX")/make-v1
[[ -x $make_v1 ]] || fail "$make_v1 not built (make build/make-v1)"
store=$PLX_TEST_TMP/store.img

# 4 MiB extents: extent 0 has room for version 1's slots (1,021 here).
plx format --size 256M --extent-size 4M >/dev/null
plx vdi-create web --size 64M >/dev/null
plx vdi-create db --size 16M >/dev/null
plx vdi-create gone --size 16M >/dev/null
head -c $((1 << 20)) /dev/urandom >"$PLX_TEST_TMP/one"
head -c $((1 << 20)) /dev/urandom >"$PLX_TEST_TMP/two"
plx vdi-import web "$PLX_TEST_TMP/one" --quiet
plx vdi-snapshot web --label base >/dev/null
plx vdi-import web "$PLX_TEST_TMP/two" --quiet
plx vdi-snapshot web >/dev/null
plx vdi-snapshot web --label newest >/dev/null
plx snap-label web@2 middle
plx vdi-create web-clone --from web@base >/dev/null
plx vdi-delete gone >/dev/null
plx vdi-import db "$PLX_TEST_TMP/two" --quiet

"$make_v1" "$store" >/dev/null

# Before the upgrade: every command refuses, naming the version and `parallax upgrade`.
expect_fail 1 plx vdi-list
grep -q "format version 1" <<<"$PLX_LAST_STDERR" || fail "vdi-list did not name version 1: $PLX_LAST_STDERR"
grep -q "parallax upgrade" <<<"$PLX_LAST_STDERR" || fail "vdi-list did not name the upgrade: $PLX_LAST_STDERR"
expect_fail 1 plx vdi-export web@base "$PLX_TEST_TMP/out"
grep -q "parallax upgrade" <<<"$PLX_LAST_STDERR" || fail "vdi-export did not name the upgrade"

out=$(plx upgrade)
grep -qi "version 2" <<<"$out" || fail "upgrade said: $out"
plx upgrade | contains "already current" || fail "a second upgrade did something"

# After: names, snapshots, labels, clones and data survive.
list=$(plx vdi-list --json)
for name in web db web-clone; do
    grep -q "\"name\":\"$name\"" <<<"$list" || fail "vdi-list lost $name: $list"
done
! grep -q '"name":"gone"' <<<"$list" || fail "the deleted VDI came back: $list"
snaps=$(plx snap-list web --json)
grep -q '"label":"base"' <<<"$snaps" || fail "label base lost: $snaps"
grep -q '"label":"middle"' <<<"$snaps" || fail "label middle lost: $snaps"
grep -q '"label":"newest"' <<<"$snaps" || fail "label newest lost: $snaps"
check_export() { # SPEC FILE: the first MiB of SPEC equals FILE
    plx vdi-export "$1" "$PLX_TEST_TMP/out" --quiet
    cmp -n $((1 << 20)) "$PLX_TEST_TMP/out" "$2" || fail "$1 does not hold its data"
}
check_export web@base "$PLX_TEST_TMP/one"
check_export web@middle "$PLX_TEST_TMP/two"
check_export web@newest "$PLX_TEST_TMP/two"
check_export web "$PLX_TEST_TMP/two"
check_export web-clone "$PLX_TEST_TMP/one"
check_export db "$PLX_TEST_TMP/two"
plx check --quiet || fail "check after the upgrade"

# The upgraded store works: new VDIs, snapshots and labels, a collection, still clean.
plx vdi-create fresh --size 16M >/dev/null
plx vdi-snapshot web --label after >/dev/null
expect_fail 1 plx vdi-snapshot web --label base
plx snap-label web@base renamed
check_export web@renamed "$PLX_TEST_TMP/one"
plx gc --quiet >/dev/null
check_export web@renamed "$PLX_TEST_TMP/one"
check_export web-clone "$PLX_TEST_TMP/one"
plx check --quiet || fail "check after using the upgraded store"
echo "cli_upgrade: ok"
