#!/usr/bin/env bash
# gc never frees blocks that a corrupt radix node may still reach: with a junk link in a VDI's
# root, `parallax gc` refuses with the same kind of message check gives, and every allocated
# block stays allocated.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd jq python3

T=$PLX_TEST_TMP
plx format --size 256M --extent-size 8M >/dev/null
# "cold" is created first: its root is the first block after extent 1's bitmap.
plx vdi-create cold --size 16M >/dev/null
head -c 4M /dev/urandom >"$T/data"
plx vdi-import cold "$T/data" >/dev/null
plx vdi-create other --size 16M >/dev/null
plx vdi-import other "$T/data" >/dev/null
plx vdi-snapshot other >/dev/null
plx vdi-import other "$T/data" >/dev/null # overwrites: the snapshot keeps the old blocks
plx snap-delete other@1 >/dev/null         # ...which are now garbage
used() { plx info --json | jq '[.blocks_used[]] | add'; }
plx check >/dev/null || fail "store does not check clean before the corruption"

eb=$(($(plx info --json | jq .extent_size) / 4096))
python3 - "$T/store.img" $(((eb + 1) * 4096)) <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    f.write(b"\xff" * 8) # entry 0 of cold's root: the link to everything cold holds
PY
expect_fail 1 plx check
before=$(used)
expect_fail 1 plx gc
[[ $PLX_LAST_STDERR == *"nothing freed"* && $PLX_LAST_STDERR == *"radix node $((eb + 1)) is corrupt"* ]] ||
    fail "gc message: $PLX_LAST_STDERR"
assert_eq "$before" "$(used)" "blocks in use after the refused gc"
expect_fail 1 plx gc --dry-run
plx info --json | jq -e ".blocks_leaked.data == null" >/dev/null || fail "info should say leaked blocks are unknown"
plx info | contains "leaked: unknown" || fail "info text should say leaked is unknown"

# Links without reserved bits that still name no metadata or data block: a block of the system
# extent, one of an extent nobody uses (the last), the first block past the medium, and one far
# past it. gc checks each link's extent type itself (a shift, not plx_block_type's division).
blocks=$(plx info --json | jq .block_count)
for link in 1 $((blocks - eb + 5)) "$blocks" $((1 << 47)); do
    python3 - "$T/store.img" $(((eb + 1) * 4096)) "$link" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    f.write(struct.pack("<Q", int(sys.argv[3])))
PY
    expect_fail 1 plx gc --dry-run
    [[ $PLX_LAST_STDERR == *"radix node $((eb + 1)) is corrupt: entry 0"* ]] ||
        fail "gc message for link $link: $PLX_LAST_STDERR"
    expect_fail 1 plx gc
    assert_eq "$before" "$(used)" "blocks in use after the refused gc (link $link)"
done
echo ok
