#!/usr/bin/env bash
# The command line itself: usage errors exit 2 with a "parallax:" line and a hint, before any
# blockstore is touched; --help and --version exit 0.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

expect_fail 2 "$PARALLAX"
expect_fail 2 plx no-such-command
[[ $PLX_LAST_STDERR == *"(see 'parallax --help')"* ]] || fail "usage error without the help hint"
expect_fail 2 "$PARALLAX" --no-such-option vdi-list

for bad in 12Q '' -1 1.5G 4GB ' 4G' 99999999999999999999 16777216T; do
    expect_fail 2 plx format --size "$bad"
done
expect_fail 2 plx format --size 1G --extent-size 2X
[[ ! -e $PLX_TEST_TMP/store.img ]] || fail "a rejected format created the blockstore"

expect_fail 2 plx vdi-create                           # missing NAME
expect_fail 2 plx vdi-create a b --size 1M             # extra argument
expect_fail 2 plx vdi-create a                         # neither --size nor --from
expect_fail 2 plx vdi-create a --size 1M --from b@1    # both
expect_fail 2 plx vdi-create a --size 0
expect_fail 2 plx vdi-create a --size
expect_fail 2 plx vdi-list --bogus
expect_fail 2 plx vdi-list extra
expect_fail 2 plx info --json=yes
expect_fail 2 plx snap-label gold@1
expect_fail 2 plx vdi-export gold

# No -b and no $PARALLAX_BLOCKSTORE (or an empty one).
expect_fail 2 env -u PARALLAX_BLOCKSTORE "$PARALLAX" vdi-list
[[ $PLX_LAST_STDERR == *PARALLAX_BLOCKSTORE* ]] || fail "missing blockstore message: $PLX_LAST_STDERR"
expect_fail 2 env PARALLAX_BLOCKSTORE= "$PARALLAX" info

out=$("$PARALLAX" --help)
[[ $out == usage:* ]] || fail "--help does not start with usage:"
for cmd in format info vdi-create vdi-delete vdi-snapshot vdi-list snap-list snap-label \
    vdi-tree vdi-import vdi-export check; do
    grep -q -- "^  $cmd " <<<"$out" || fail "--help does not list $cmd"
done
assert_eq "$out" "$("$PARALLAX" help)" "help and --help differ"
"$PARALLAX" help vdi-create | contains -- '--from SNAP' || fail "help vdi-create"
plx vdi-create --help | contains '^usage: parallax .*vdi-create NAME' || fail "vdi-create --help"
"$PARALLAX" --version | contains -E '^parallax [0-9]' || fail "--version"
