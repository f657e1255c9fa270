#!/usr/bin/env bash
# format makes a sparse blockstore of the asked size, info reports its geometry, and format
# refuses to overwrite a store (or open garbage) without being told to.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

store=$PLX_TEST_TMP/store.img
size=$((256 << 20))

out=$(plx format --size 256M --extent-size 16M)
[[ $out == "formatted $store: 256.0 MiB, 16 extents of 16.0 MiB" ]] || fail "format said: $out"
assert_eq "$size" "$(stat -c %s "$store")" "blockstore size"
allocated=$(($(stat -c %b "$store") * $(stat -c %B "$store")))
((allocated < size / 4)) || fail "blockstore is not sparse: $allocated bytes allocated"

# Read a field of `info --json` with jq, or python3 when jq is missing.
json=$(plx info --json)
field() {
    if command -v jq >/dev/null 2>&1; then
        jq -er "$1" <<<"$json"
    else
        python3 -c 'import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1].lstrip(".").split("."): d = d[k]
print(d)' "$1" <<<"$json"
    fi
}
assert_eq 16 "$(field .extent_count)" "extent_count"
assert_eq $((16 << 20)) "$(field .extent_size)" "extent_size"
assert_eq 4096 "$(field .block_size)" "block_size"
assert_eq "$size" "$(field .size_bytes)" "size_bytes"
assert_eq 0 "$(field .vdi_count)" "vdi_count"
sum=$(($(field .extents.unused) + $(field .extents.system) + $(field .extents.metadata) +
    $(field .extents.data)))
assert_eq 16 "$sum" "extents by type do not add up"
(($(field .extents.system) >= 1)) || fail "no system extent"

human=$(plx info)
grep -Eq '^extents +16$' <<<"$human" || fail "info: extents line missing: $human"
grep -Eq '^lock manager +none$' <<<"$human" || fail "info: lock manager line missing"

expect_fail 1 plx format --size 256M --extent-size 16M
plx vdi-create keep --size 1M >/dev/null
plx format --size 256M --extent-size 16M --force | contains "^formatted $store: " || fail "format --force"
json=$(plx info --json)
assert_eq 0 "$(field .vdi_count)" "vdi_count after reformat"

head -c $((4 << 20)) /dev/urandom >"$PLX_TEST_TMP/garbage.img"
expect_fail 1 "$PARALLAX" -b "$PLX_TEST_TMP/garbage.img" info
[[ $(wc -l <<<"$PLX_LAST_STDERR") -eq 1 && ${#PLX_LAST_STDERR} -gt 20 ]] ||
    fail "unclear message for a garbage blockstore: [$PLX_LAST_STDERR]"
expect_fail 1 "$PARALLAX" -b "$PLX_TEST_TMP/absent.img" info
