#!/usr/bin/env bash
# Everyday mistakes get a message in the user's terms, and change nothing: an empty file as a
# blockstore, snapshotting a snapshot, an all-digits name that matches nothing, snapshotting a
# VDI that a non-server process holds, serve with a port that is not one; vdi-list counts only
# live snapshots, marks a clone whose source snapshot was deleted, and lines its columns up by
# display width for names in UTF-8.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
has() { [[ $PLX_LAST_STDERR == *"$1"* ]] || fail "message [$PLX_LAST_STDERR] lacks [$1]"; }

: >"$T/empty.img"
expect_fail 1 "$PARALLAX" -b "$T/empty.img" info
has "is empty"
has "parallax format"
[[ ! -s $T/empty.img ]] || fail "info wrote to the empty file"

plx format --size 64M >/dev/null
plx vdi-create gold --size 8M >/dev/null
plx vdi-snapshot gold >/dev/null
plx vdi-snapshot gold >/dev/null
expect_fail 1 plx vdi-snapshot gold@1
has "gold@1 is a snapshot"
has "vdi-create NAME --from gold@1"
assert_eq 2 "$(plx snap-list gold --json | jq length)" "snapshots after the refused snapshot"
expect_fail 1 plx vdi-snapshot 999
has "no VDI named '999' and none with id 999"

# A VDI held by vdi-import (reading a FIFO, so it waits with the VDI open).
mkfifo "$T/fifo"
"$PARALLAX" -b "$T/store.img" vdi-import gold "$T/fifo" >"$T/import.log" 2>&1 &
imp=$!
bg_pid "$imp"
exec 4>"$T/fifo"
for ((i = 0; i < 100; i++)); do
    [[ -n $(plx vdi-list --json | jq -r '.[] | select(.name == "gold") | .lock_holder') ]] && break
    sleep 0.05
done
expect_fail 1 plx vdi-snapshot gold
has "open for writing by pid $imp (parallax vdi-import)"
has "not a server"
[[ $PLX_LAST_STDERR != *"cannot reach"* ]] || fail "still talks of a server: $PLX_LAST_STDERR"
exec 4>&-
wait "$imp" || fail "import: $(cat "$T/import.log")"

# Ports: refused as usage errors, before anything listens.
for p in 99999 65536 '' -1 abc 80x 123456; do
    expect_fail 2 plx serve --port "$p"
    has "not a TCP port number"
done

# vdi-list after a snapshot delete, with a clone of the deleted snapshot.
plx vdi-create c --from gold@2 >/dev/null
plx snap-delete gold@2 >/dev/null
assert_eq 1 "$(plx vdi-list --json | jq '.[] | select(.name == "gold") | .snapshots')" "live snapshots of gold"
expect_fail 1 plx snap-delete gold@2
has "snapshot gold@2 was deleted"
expect_fail 1 plx vdi-export gold@9 "$T/x"
has "numbered 1 to 2"
assert_eq true "$(plx vdi-list --json | jq '.[] | select(.name == "c") | .parent_snap_deleted')" "clone's source deleted"
plx vdi-list | contains 'gold@2 (deleted)' || fail "vdi-list does not mark the deleted source: $(plx vdi-list)"

# Columns by display width: the SIZE column starts at the same column on every row.
plx vdi-create 'héllo' --size 1M >/dev/null
plx vdi-create '日本語' --size 1M >/dev/null
cols=$(plx vdi-list | python3 -c '
import re, sys, unicodedata
def width(s):
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1 for c in s)
for line in sys.stdin.read().splitlines():
    m = re.search(r"SIZE|[0-9]+[.][0-9] [KMG]iB", line)
    print(width(line[:m.start()]))
' | sort -u | wc -l)
assert_eq 1 "$cols" "rows whose third column starts at a different display column"
# The misleading messages of issue 29, each saying what happened and what to do.
printf 'not a store, just a few words of text\n%.0s' {1..25} >"$T/text.img" # about 1 KiB
expect_fail 1 "$PARALLAX" -b "$T/text.img" info
has "is not a Parallax blockstore"
[[ $PLX_LAST_STDERR != *"is empty"* ]] || fail "a 1 KiB file called empty: $PLX_LAST_STDERR"
expect_fail 2 "$PARALLAX" -b "$T/new.img" format --size 0
has "--size must be more than 0"
[[ ! -e $T/new.img ]] || fail "format --size 0 created a file"
sum=$(sha256sum <"$T/store.img")
expect_fail 2 plx format --size 0 --force
has "--size must be more than 0"
assert_eq "$sum" "$(sha256sum <"$T/store.img")" "store after format --size 0 --force"
plx vdi-create lonely --size 1M >/dev/null
expect_fail 1 plx vdi-export lonely@1 "$T/x"
has "VDI lonely has no snapshots yet ('parallax vdi-snapshot lonely' takes one)"
expect_fail 1 plx vdi-delete gold@1
has "gold@1 is a snapshot: 'parallax snap-delete gold@1' deletes it"
plx vdi-list | contains '^[0-9]* *gold ' || fail "vdi-delete of a snapshot changed the VDIs"
expect_fail 2 plx cache
assert_eq 5 "$(wc -l <<<"$PLX_LAST_STDERR")" "lines of cache's usage error (error, 3 usage, hint)"
has "usage: parallax cache enable (VDI|--all)"
"$PARALLAX" --help | contains "3 not run" || fail "--help lacks exit status 3"
"$PARALLAX" --help | contains "/etc/parallax/blockstore" || fail "--help lacks the default store file"

# A corrupt snapshot-log block: info says what stopped its count of leaked blocks, and gc names
# the VDI as check does (by name, not id).
"$PARALLAX" -b "$T/c.img" format --size 64M >/dev/null
"$PARALLAX" -b "$T/c.img" vdi-create named --size 4M >/dev/null
"$PARALLAX" -b "$T/c.img" vdi-snapshot named >/dev/null
blk=$(python3 - "$T/c.img" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
for b in range(len(data) // 4096):
    if struct.unpack_from("<I", data, b * 4096)[0] == 0x474F4C53:  # snapshot log block
        print(b)
        with open(sys.argv[1], "r+b") as f:
            f.seek(b * 4096 + 100)
            f.write(b"\xee" * 16)
PY
)
[[ -n $blk ]] || fail "no snapshot log block found"
"$PARALLAX" -b "$T/c.img" info | contains "leaked: unknown: snapshot log block $blk of VDI named is corrupt" ||
    fail "info on a corrupt snapshot log: $("$PARALLAX" -b "$T/c.img" info | tail -1)"
expect_fail 1 "$PARALLAX" -b "$T/c.img" gc
has "snapshot log block $blk of VDI named is corrupt"
out=$("$PARALLAX" -b "$T/c.img" check 2>/dev/null || true)
contains "snapshot log block $blk of VDI named is corrupt" <<<"$out" || fail "check: $out"

# A label already taken: refused before anything is written (the writable open used to write the
# VDI's record, taking and giving back its lock), so the store stays byte for byte as it was.
plx vdi-snapshot gold --label keep >/dev/null
leaks=$(plx check --json | jq .leaked_blocks)
sum=$(sha256sum <"$T/store.img")
expect_fail 1 plx vdi-snapshot gold --label keep
assert_eq "$sum" "$(sha256sum <"$T/store.img")" "store changed by a refused vdi-snapshot --label"
assert_eq "$leaks" "$(plx check --json | jq .leaked_blocks)" "leaked blocks after the refused snapshot"
has "already has a snapshot labelled 'keep' (@3)"

# A store that cannot be opened: one line, as every error (issue 30: vdi-snapshot printed two).
for cmd in "vdi-snapshot x" "vdi-snapshot x --label l" "info" "vdi-list"; do
    # shellcheck disable=SC2086
    expect_fail 1 "$PARALLAX" -b "$T/nonexistent" $cmd
    assert_eq 1 "$(wc -l <<<"$PLX_LAST_STDERR")" "error lines of '$cmd' on a missing store"
done

# A killed server leaves its control socket behind; the next server to start removes it, and only
# sockets whose pid no process has (here the script's own pid stands for a live server).
"$PARALLAX" -b "$T/store.img" serve --unix "$T/s1.sock" >"$T/s1.log" 2>&1 &
s1=$!
bg_pid $s1
wait_socket "$T/s1.sock" $s1 "$T/s1.log"
for ((i = 0; i < 100; i++)); do
    [[ -S $PARALLAX_RUN_DIR/serve-$s1.sock ]] && break
    sleep 0.05
done
kill -KILL $s1
wait $s1 2>/dev/null || true
[[ -S $PARALLAX_RUN_DIR/serve-$s1.sock ]] || fail "no control socket left by the killed server"
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
    "$PARALLAX_RUN_DIR/serve-$$.sock"
"$PARALLAX" -b "$T/store.img" serve --unix "$T/s2.sock" >"$T/s2.log" 2>&1 &
s2=$!
bg_pid $s2
wait_socket "$T/s2.sock" $s2 "$T/s2.log"
[[ ! -e $PARALLAX_RUN_DIR/serve-$s1.sock ]] || fail "the killed server's socket is still there"
[[ -S $PARALLAX_RUN_DIR/serve-$$.sock ]] || fail "a live pid's socket was removed"
kill $s2
wait $s2 2>/dev/null || true

echo ok
