#!/usr/bin/env bash
# A VDI's life through the command line: create, snapshot, label, clone, draw the family tree,
# delete; and lookups of things that do not exist fail cleanly.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

have_jq=0
command -v jq >/dev/null 2>&1 && have_jq=1
iso='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z'

plx format --size 256M --extent-size 16M >/dev/null

read -r name gold <<<"$(plx vdi-create gold --size 64M)"
assert_eq gold "$name" "vdi-create output"
[[ $gold =~ ^[0-9]+$ ]] || fail "vdi-create printed no id: $gold"
plx vdi-list | contains -E "^$gold +gold +64\.0 MiB +0 +- +-$" || fail "vdi-list: $(plx vdi-list)"
plx vdi-list | head -n1 | contains -E '^ID +NAME +SIZE +SNAPS +PARENT +LOCKED-BY$' ||
    fail "vdi-list header"
expect_fail 1 plx vdi-create gold --size 1M

# Snapshots: by name or id, with the option before or after the VDI.
assert_eq gold@1 "$(plx vdi-snapshot gold)" "first snapshot"
assert_eq gold@2 "$(plx vdi-snapshot --label pristine gold)" "labelled snapshot"
assert_eq gold@3 "$(plx vdi-snapshot "$gold" --label third)" "snapshot by id"
snaps=$(plx snap-list gold)
head -n1 <<<"$snaps" | contains -E '^N +TIME +LABEL$' || fail "snap-list header: $snaps"
grep -Eq "^1 +$iso +-$" <<<"$snaps" || fail "snap-list @1: $snaps"
grep -Eq "^2 +$iso +pristine$" <<<"$snaps" || fail "snap-list @2: $snaps"
plx snap-label gold@1 first
plx snap-list gold | contains -E "^1 +$iso +first$" || fail "snap-label did not stick"
expect_fail 1 plx snap-label gold@2 first # labels are unique within a VDI
if ((have_jq)); then
    assert_eq "first pristine third" "$(plx snap-list gold --json | jq -r 'map(.label) | join(" ")')"
    assert_eq "1 2 3" "$(plx snap-list --json "$gold" | jq -r 'map(.index) | join(" ")')"
    # Pages: after N, at most --limit, newest first counting down from below N.
    assert_eq "2 3" "$(plx snap-list gold --json --after 1 | jq -r 'map(.index) | join(" ")')"
    assert_eq "2" "$(plx snap-list gold --json --after 1 --limit 1 | jq -r 'map(.index) | join(" ")')"
    assert_eq "3 2" "$(plx snap-list gold --json --newest-first --limit 2 | jq -r 'map(.index) | join(" ")')"
    assert_eq "1" "$(plx snap-list gold --json --newest-first --after 2 | jq -r 'map(.index) | join(" ")')"
    assert_eq "[]" "$(plx snap-list gold --json --after 3)"
fi
assert_eq 2 "$(plx snap-list gold --after 1 --limit 1 | wc -l)" "snap-list page: header and one row"
expect_fail 2 plx snap-list gold --limit x
expect_fail 2 plx snap-list gold --after -1

# Clones from a snapshot named by label and by number.
read -r name web1 <<<"$(plx vdi-create web1 --from gold@pristine)"
assert_eq web1 "$name" "clone output"
read -r name web2 <<<"$(plx vdi-create --from gold@1 web2)"
assert_eq web2 "$name" "clone output"
plx vdi-list | contains -E "^$web1 +web1 +64\.0 MiB +0 +gold@2 +-$" || fail "vdi-list web1"
plx vdi-list | contains -E "^$web2 +web2 +64\.0 MiB +0 +gold@1 +-$" || fail "vdi-list web2"
if ((have_jq)); then
    got=$(plx vdi-list --json | jq -r '.[] | select(.name == "web1") | "\(.parent) \(.parent_snap)"')
    assert_eq "$gold 2" "$got" "vdi-list --json parent of web1"
    assert_eq null "$(plx vdi-list --json | jq -r '.[] | select(.name == "gold") | .parent')"
fi

tree=$(plx vdi-tree)
expected="gold (id $gold)
├─ @1 first TIME
│  └─ web2 (id $web2)
├─ @2 pristine TIME
│  └─ web1 (id $web1)
└─ @3 third TIME"
assert_eq "$expected" "$(sed -E "s/$iso/TIME/" <<<"$tree")" "vdi-tree"

dotsrc=$(plx vdi-tree --dot)
grep -q "^digraph " <<<"$dotsrc" || fail "vdi-tree --dot is not a digraph"
grep -q "v${gold}_s2 -> v${web1};" <<<"$dotsrc" || fail "vdi-tree --dot misses the clone edge"
if command -v dot >/dev/null 2>&1; then
    dot -Tsvg <<<"$dotsrc" >"$PLX_TEST_TMP/tree.svg" || fail "dot rejected vdi-tree --dot"
fi

plx vdi-delete web2
plx vdi-list | contains web2 && fail "vdi-list still shows the deleted web2"
plx vdi-tree | contains web2 && fail "vdi-tree still shows the deleted web2"
if ((have_jq)); then
    assert_eq "gold web1" "$(plx vdi-list --json | jq -r 'map(.name) | join(" ")')"
fi

expect_fail 1 plx vdi-delete web2
expect_fail 1 plx snap-list nosuch
expect_fail 1 plx vdi-snapshot nosuch
expect_fail 1 plx vdi-create x --from gold@99
expect_fail 1 plx vdi-create x --from gold@nolabel
expect_fail 1 plx vdi-create x --from nosuch@1
expect_fail 1 plx snap-label gold@99 x
expect_fail 1 plx vdi-export gold@99 "$PLX_TEST_TMP/out.img"
[[ ! -e $PLX_TEST_TMP/out.img ]] || fail "a failed export created its file"

plx check >/dev/null

# vdi-list pages in id order: --limit N, --after VDI|ID (an id may be of a deleted VDI).
for i in 1 2 3 4 5; do plx vdi-create "page$i" --size 1M >/dev/null; done
ids=$(plx vdi-list | awk 'NR > 1 {print $1}' | tr '\n' ' ')
first_page=$(plx vdi-list --limit 2 | awk 'NR > 1 {print $2}' | tr '\n' ' ')
assert_eq "gold web1 " "$first_page" "vdi-list --limit 2"
assert_eq "page2 page3 " "$(plx vdi-list --after page1 --limit 2 | awk 'NR > 1 {print $2}' | tr '\n' ' ')" \
    "vdi-list --after page1 --limit 2"
page3_id=$(plx vdi-list | awk '$2 == "page3" {print $1}')
plx vdi-delete page3
assert_eq "page4 " "$(plx vdi-list --after "$page3_id" --limit 1 | awk 'NR > 1 {print $2}' | tr '\n' ' ')" \
    "vdi-list --after the id of a deleted VDI"
expect_fail 1 plx vdi-list --after page3
expect_fail 2 plx vdi-list --limit 0
expect_fail 2 plx vdi-list --limit x
if ((have_jq)); then
    assert_eq "page4 page5" "$(plx vdi-list --json --after page2 | jq -r 'map(.name) | join(" ")')"
fi
[[ -n $ids ]] || fail "vdi-list printed no ids"
# The store is current: upgrade has nothing to do.
plx upgrade | contains "already current" || fail "upgrade of a current store"

# Commands that are over in milliseconds use blocking I/O: a kernel aio context alone costs ~30 ms
# to tear down at exit. Imports, exports and gc (its mark phase keeps 32 reads in flight), which
# overlap many I/Os, keep aio.
if command -v strace >/dev/null 2>&1; then
    # io_setups ARGS...: how many io_setup calls `parallax -b store.img ARGS...` made.
    io_setups() {
        strace -f -qq -e trace=io_setup -o "$PLX_TEST_TMP/strace.out" \
            "$PARALLAX" -b "$PLX_TEST_TMP/store.img" "$@" >/dev/null || fail "strace parallax $*"
        grep -c 'io_setup(' "$PLX_TEST_TMP/strace.out" || true
    }
    for cmd in "vdi-snapshot gold" "snap-label gold@4 fourth" "snap-list gold" vdi-list info \
        vdi-tree "vdi-create short --size 1M" "vdi-delete short" check; do
        # shellcheck disable=SC2086 # cmd: a command and its arguments
        assert_eq 0 "$(io_setups $cmd)" "io_setup calls of \`parallax $cmd\`"
    done
    head -c 1M /dev/urandom >"$PLX_TEST_TMP/in.raw"
    assert_eq 1 "$(io_setups vdi-import web1 "$PLX_TEST_TMP/in.raw")" "io_setup calls of vdi-import"
    assert_eq 1 "$(io_setups vdi-export web1 "$PLX_TEST_TMP/out.raw")" "io_setup calls of vdi-export"
    assert_eq 1 "$(io_setups gc --dry-run)" "io_setup calls of gc --dry-run"
    cmp -n $((1 << 20)) "$PLX_TEST_TMP/in.raw" "$PLX_TEST_TMP/out.raw" || fail "import/export differ"
    rm -f "$PLX_TEST_TMP/store.img"
    assert_eq 0 "$(io_setups format --size 64M --extent-size 16M)" "io_setup calls of format"
fi
