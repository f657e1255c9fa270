#!/usr/bin/env bash
# gc beside a writer in other processes, on a file blockstore, with the real binary.
#
# Garbage is made first: two deleted VDIs, a deleted snapshot, a deleted clone. Then a background
# writer (a loop of vdi-import / vdi-snapshot / vdi-create --from / vdi-import into the clone,
# each a separate process that holds extents while it runs) works on VDIs of its own while two
# loops run `parallax gc --json` over and over beside it, so collections also overlap each other
# (the later one must give up with "another collection ..." and free nothing wrongly).
# Afterwards: every VDI and snapshot the writer made exports byte-identical to its source file
# (kept), the surviving garbage-era VDI too, the deleted snapshot is gone, `parallax check`
# passes, gc --json reported freed blocks (never more than the garbage), and the garbage from
# before is gone (info --json blocks_leaked drops to 0). PLX_GC_ROUNDS sets the writer's rounds.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
require_cmd jq awk cmp

tmp=$PLX_TEST_TMP
store=$tmp/store.img
vsize=$((4 << 20))
rounds=${PLX_GC_ROUNDS:-24}

# mkdata FILE TAG: a VDI-sized file, the same for the same TAG (at most 5 characters), with every
# 4 KiB block distinct and none zero (no trims on import, so the writer makes no garbage).
mkdata() {
    awk -v t="$2" -v n=$((vsize / 16)) 'BEGIN { for (i = 0; i < n; i++) printf "%-5s%010d\n", t, i }' >"$1"
}

leaked() {
    plx info --json | jq '.blocks_leaked.metadata + .blocks_leaked.data'
}

plx format --size 1G --extent-size 16M >/dev/null

# ---- Garbage ---------------------------------------------------------------------------------
for i in 1 2 3; do
    plx vdi-create "g$i" --size "$vsize" >/dev/null
    mkdata "$tmp/g$i.a" "g${i}a"
    plx vdi-import "g$i" "$tmp/g$i.a"
    assert_eq "g$i@1" "$(plx vdi-snapshot "g$i")" "snapshot of g$i"
    mkdata "$tmp/g$i.b" "g${i}b"
    plx vdi-import "g$i" "$tmp/g$i.b"
done
plx vdi-create gclone --from g3@1 >/dev/null
mkdata "$tmp/gclone" gcl
plx vdi-import gclone "$tmp/gclone"
plx vdi-delete g1
plx vdi-delete g2
plx snap-delete g3@1
plx vdi-delete gclone
before=$(leaked)
((before > 0)) || fail "no garbage to collect: blocks_leaked is $before"
dry=$(plx gc --dry-run --json | jq '.freed.metadata + .freed.data')
assert_eq "$before" "$dry" "gc --dry-run against info's blocks_leaked"
echo "garbage before the writer: $before blocks"

# ---- The writer: a separate process; it records what each VDI and snapshot must hold ----------
for v in w0 w1 w2; do
    plx vdi-create "$v" --size "$vsize" >/dev/null
done
cat >"$tmp/writer.sh" <<'EOF'
set -euo pipefail
plx() { "$PARALLAX" -b "$STORE" "$@"; }
mkdata() {
    awk -v t="$2" -v n=$((VSIZE / 16)) 'BEGIN { for (i = 0; i < n; i++) printf "%-5s%010d\n", t, i }' >"$1"
}
for ((i = 1; i <= ROUNDS; i++)); do
    v=w$((i % 3))
    mkdata "$TMP/w$i" "w$i"
    plx vdi-import "$v" "$TMP/w$i"
    snap=$(plx vdi-snapshot "$v")
    echo "$snap $TMP/w$i" >>"$TMP/expect"
    if ((i % 4 == 0)); then
        plx vdi-create "c$i" --from "$snap" >/dev/null
        mkdata "$TMP/c$i" "c$i"
        plx vdi-import "c$i" "$TMP/c$i"
        echo "c$i $TMP/c$i" >>"$TMP/expect"
    fi
    echo "$v $TMP/w$i" >>"$TMP/expect.current"
done
EOF
PARALLAX=$PARALLAX STORE=$store VSIZE=$vsize ROUNDS=$rounds TMP=$tmp \
    bash "$tmp/writer.sh" >"$tmp/writer.log" 2>&1 &
wpid=$!
bg_pid "$wpid"

# gc_loop N: collect until the writer has exited. A collection that overlapped another one gives
# up with a message saying so; any other failure fails the test.
gc_loop() {
    local rc
    while kill -0 "$wpid" 2>/dev/null; do
        rc=0
        plx gc --json >>"$tmp/gc$1.jsonl" 2>"$tmp/gc$1.err" || rc=$?
        if ((rc != 0)); then
            if grep -q "another collection" "$tmp/gc$1.err"; then
                echo x >>"$tmp/gc$1.gaveup"
            else
                echo "gc loop $1: exit $rc: $(cat "$tmp/gc$1.err")" >&2
                return 1
            fi
        fi
    done
}
gc_loop 1 &
g1=$!
bg_pid "$g1"
gc_loop 2 &
g2=$!
bg_pid "$g2"

wrc=0
wait "$wpid" || wrc=$?
if ((wrc != 0)); then
    cat "$tmp/writer.log" >&2
    fail "the writer failed (exit $wrc)"
fi
wait "$g1" || fail "gc loop 1 failed"
wait "$g2" || fail "gc loop 2 failed"

runs=$(cat "$tmp"/gc?.jsonl | wc -l)
gaveup=$({ cat "$tmp"/gc?.gaveup 2>/dev/null || true; } | wc -l)
freed_during=$(jq -s 'map(.freed.metadata + .freed.data) | add // 0' "$tmp"/gc?.jsonl)
echo "gc runs beside the writer: $runs completed, $gaveup gave up (overlap); freed $freed_during"
((runs >= 3)) || fail "only $runs gc runs completed while the writer ran"

# ---- Afterwards --------------------------------------------------------------------------------
final=$(plx gc --json)
echo "final gc: $final"
freed=$((freed_during + $(jq '.freed.metadata + .freed.data' <<<"$final")))
# A collection that gave up may have freed some extents before it did (it reports nothing), so
# the reports add up to at most the garbage; the leaked count below is the exact check.
((freed > 0)) || fail "no gc run reported freed blocks"
((freed <= before)) || fail "gc reported $freed blocks freed, more than the $before of garbage"
after=$(leaked)
assert_eq 0 "$after" "blocks_leaked after the last gc"
plx check >"$tmp/check.out" || {
    cat "$tmp/check.out" >&2
    fail "parallax check failed"
}

n=0
while read -r spec file; do
    plx vdi-export "$spec" "$tmp/out"
    cmp -s "$file" "$tmp/out" || fail "$spec differs from $file"
    n=$((n + 1))
done <"$tmp/expect"
# The current contents: the last file imported into each of w0..w2.
for v in w0 w1 w2; do
    file=$(awk -v v="$v" '$1 == v { f = $2 } END { print f }' "$tmp/expect.current")
    plx vdi-export "$v" "$tmp/out"
    cmp -s "$file" "$tmp/out" || fail "$v differs from $file"
    n=$((n + 1))
done
plx vdi-export g3 "$tmp/out"
cmp -s "$tmp/g3.b" "$tmp/out" || fail "g3 differs from its last import"
expect_fail 1 plx vdi-export g3@1 "$tmp/out"
[[ $(plx vdi-list --json | jq '[.[] | select(.name | test("^g[12]$|^gclone$"))] | length') == 0 ]] ||
    fail "deleted VDIs still listed"
echo "verified $n VDIs and snapshots; garbage $before -> $after blocks"
