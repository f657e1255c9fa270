#!/usr/bin/env bash
# gc while a client holds a deleted snapshot's export (issue 29, item 1), with the real server
# and real NBD clients.
#
# A server on a file store; 64 MiB imported into VDI ro2 (every byte 0x5a), snapshot ro2@s; a
# qemu-io client opens export ro2@s read-only and keeps it open. Then snap-delete ro2@s,
# vdi-delete ro2 and gc; VDI filler2 is created and 128 MiB of 0xff are copied into it through
# the same server (nbdcopy --flush). Before the fix the collector freed the held snapshot's tree,
# the CLI and the server handed its blocks out again, and the copy failed with "radix node ...
# is corrupt" (or the server aborted). Now: the copy succeeds and filler2 reads back exactly;
# the held client still reads 0x5a everywhere (never filler2's data); check is clean; the held
# tree is not counted as garbage while the client holds it, and the first gc after the client
# disconnects frees it; so does the first one after the holding server is killed (kill -9: its
# hold names a dead process). Last, the reader is on another host (a server under another host
# id, which this host's gc cannot judge dead): a deleted VDI's snapshot it reads stays whole while
# this host deletes, collects and imports a new VDI into the freed space.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
require_cmd nbdcopy qemu-io jq cmp

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=$sock"; }
leaked() { plx info --json | jq '.blocks_leaked.metadata + .blocks_leaked.data'; }

plx format --size 1G >/dev/null
plx vdi-create ro2 --size 64M >/dev/null
head -c 64M /dev/zero | tr '\0' '\132' >"$T/ro2.raw" # 0x5a
plx vdi-import ro2 "$T/ro2.raw" --quiet
assert_eq ro2@1 "$(plx vdi-snapshot ro2 --label s)" "snapshot"

"$PARALLAX" -b "$T/store.img" serve --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve.log"

# ---- The client holding ro2@s: qemu-io reading commands from a FIFO ----------------------------
mkfifo "$T/qio.fifo"
on_exit 'exec 3>&-'
# qio_open EXPORT: a qemu-io client holding EXPORT read-only, its commands written to fd 3 (the
# FIFO), its output in a log of its own, $T/qioN.log, made here before qemu-io starts and only
# appended to by it. qemu-io's shell opens the log only after the FIFO's open returns, that is
# after `exec 3>` here, so a `>` there truncates the log at some moment after qio has begun to
# count prompts in it: on a shared log qio counted the last session's prompts, took them for the
# answer, and a moment later found none ("qemu-io stuck: " with an empty log, beside CPU hogs);
# or it went on before the new client had even connected.
qio_n=0
qio_open() {
    qio_n=$((qio_n + 1))
    qio_log=$T/qio$qio_n.log
    : >"$qio_log"
    qemu-io -r -f raw "$(uri "$1")" <"$T/qio.fifo" >>"$qio_log" 2>&1 &
    qio_pid=$!
    bg_pid "$qio_pid"
    exec 3>"$T/qio.fifo"
    qio_sent=0
}
# qio CMD: run one command on the held connection and wait (bounded) until qemu-io prompts again.
qio() {
    local i
    echo "$1" >&3
    qio_sent=$((qio_sent + 1))
    for ((i = 0; i < 600; i++)); do
        (($(grep -o 'qemu-io>' "$qio_log" | wc -l) > qio_sent)) && break
        kill -0 "$qio_pid" 2>/dev/null || fail "qemu-io exited: $(cat "$qio_log")"
        sleep 0.1
    done
    (($(grep -o 'qemu-io>' "$qio_log" | wc -l) > qio_sent)) ||
        fail "qemu-io stuck after $qio_sent commands (${qio_log##*/}): $(tail "$qio_log")"
    ! grep -Eqi 'fail|error' "$qio_log" || fail "qemu-io: $(grep -Ei 'fail|error' "$qio_log" | head -3)"
}
qio_open ro2@s
qio "read -P 0x5a 0 4k" # the server has opened ro2@s and cached a path of its tree

# ---- Delete what the client holds, collect, and write a new VDI through the same server ------
plx snap-delete ro2@s
plx vdi-delete ro2
plx gc --json >"$T/gc1.json" || fail "gc failed"
echo "gc with ro2@s held: $(cat "$T/gc1.json")"
held=$(leaked)
assert_eq 0 "$held" "blocks_leaked while the deleted snapshot is held (its tree is not garbage)"

plx vdi-create filler2 --size 128M >/dev/null
head -c 128M /dev/zero | tr '\0' '\377' >"$T/ff.raw"
nbdcopy --flush "$T/ff.raw" "$(uri filler2)" || fail "nbdcopy into filler2 failed: $(cat "$T/serve.log")"
nbdcopy "$(uri filler2)" "$T/back.raw" || fail "reading filler2 back failed: $(cat "$T/serve.log")"
cmp -s "$T/ff.raw" "$T/back.raw" || fail "filler2 reads back wrong"

# The held client still reads the deleted snapshot, all of it, and nothing of filler2.
qio "read -P 0x5a 0 64M"
! grep -qi "corrupt" "$T/serve.log" || fail "server: $(cat "$T/serve.log")"
plx check --live >"$T/check.out" || fail "check: $(cat "$T/check.out")"
# While the client holds it, gc frees nothing of it, however often it runs.
plx gc --json >"$T/gc2.json" || fail "second gc failed"
qio "read -P 0x5a 0 64M"
plx vdi-export filler2 "$T/back2.raw" --quiet
cmp -s "$T/ff.raw" "$T/back2.raw" || fail "filler2 exports wrong after the second gc"

# ---- The client lets go: the next collection frees the deleted tree ----------------------------
exec 3>&-
wait "$qio_pid" || true
for ((i = 0; i < 100; i++)); do # the server closes the export when the client has gone
    [[ $(leaked) -gt 0 ]] && break
    sleep 0.1
done
garbage=$(leaked)
((garbage >= 16384)) || fail "after the client left only $garbage blocks are garbage (64 MiB of data expected)"
plx gc --json >"$T/gc3.json"
# ro2@s's 16384 data blocks are garbage now. Those in extents the server holds (it allocated
# filler2 in the rest of the last one) wait for the server to let go; the others go now.
freed=$(jq '.freed.data' "$T/gc3.json")
((freed > 8192)) || fail "gc after the client left freed $freed data blocks of ro2@s's 16384: $(cat "$T/gc3.json")"
plx check --live >"$T/check.out" || fail "check after the last gc: $(cat "$T/check.out")"
nbdcopy "$(uri filler2)" "$T/back3.raw"
cmp -s "$T/ff.raw" "$T/back3.raw" || fail "filler2 reads back wrong after the last gc"

# With the server gone too (it held extents, and blocks claimed in them), nothing is left over.
kill -TERM "$server"
wait "$server" || fail "the server exited with $?: $(cat "$T/serve.log")"
plx gc >/dev/null
assert_eq 0 "$(leaked)" "blocks_leaked after the server stopped and gc ran"
plx check >"$T/check.out" || fail "check at the end: $(cat "$T/check.out")"
plx vdi-export filler2 "$T/back4.raw" --quiet
cmp -s "$T/ff.raw" "$T/back4.raw" || fail "filler2 exports wrong at the end"

# ---- A holder that dies keeps nothing: kill -9 the server while its client holds a snapshot ----
assert_eq filler2@1 "$(plx vdi-snapshot filler2)" "snapshot of filler2"
head -c 16M /dev/zero | tr '\0' '\021' >"$T/x11.raw"
plx vdi-import filler2 "$T/x11.raw" --quiet # 4096 blocks of filler2@1 are its own now
rm -f "$sock" # as below: wait_socket must see this server's socket, not one left before it
"$PARALLAX" -b "$T/store.img" serve --unix "$sock" >"$T/serve2.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve2.log"
qio_open filler2@1
qio "read -P 0xff 0 16M"
plx snap-delete filler2@1
plx gc >/dev/null
qio "read -P 0xff 0 16M"
held=$(plx gc --dry-run --json | jq '.freed.data')
assert_eq 0 "$held" "data a dry run would free while the server holds filler2@1"
kill -KILL "$server"
wait "$server" 2>/dev/null || true
plx gc --json >"$T/gc4.json"
dead=$(jq '.freed.data' "$T/gc4.json")
((dead >= 4096)) || fail "gc after the holder was killed freed $dead data blocks, not filler2@1's 4096"
assert_eq 0 "$(leaked)" "blocks_leaked after the holder died and gc ran"
plx check >"$T/check.out" || fail "check after the holder died: $(cat "$T/check.out")"
exec 3>&-
wait "$qio_pid" 2>/dev/null || true

# ---- A reader on another host: a server under another host id holds filler2@b ----------------
assert_eq filler2@2 "$(plx vdi-snapshot filler2 --label b)" "snapshot filler2@b"
head -c 16M /dev/zero | tr '\0' '\042' >"$T/x22.raw"
plx vdi-import filler2 "$T/x22.raw" --quiet # filler2's own blocks, garbage once it is deleted
# The server killed -9 above left its socket file: remove it, or wait_socket would find that one
# before this server has replaced it (a client then races the server's unlink and bind).
rm -f "$sock"
PARALLAX_HOST_ID=host-b "$PARALLAX" -b "$T/store.img" serve --unix "$sock" >"$T/serve3.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve3.log"
qio_open filler2@b
qio "read -P 0x11 0 4k"
plx vdi-delete filler2 # and its snapshots; this host's gc must keep what host-b reads
plx gc --json >"$T/gc5.json"
head -c 64M /dev/zero | tr '\0' '\063' >"$T/x33.raw"
plx vdi-create filler3 --size 64M >/dev/null
plx vdi-import filler3 "$T/x33.raw" --quiet # takes the space filler2's own blocks had
qio "read -P 0x11 0 16M"
qio "read -P 0xff 16M 112M"
plx vdi-export filler3 "$T/back5.raw" --quiet
cmp -s "$T/x33.raw" "$T/back5.raw" || fail "filler3 exports wrong beside host-b's reader"
plx check --live >"$T/check.out" || fail "check beside host-b's reader: $(cat "$T/check.out")"
exec 3>&-
wait "$qio_pid" 2>/dev/null || true
kill -TERM "$server"
wait "$server" || fail "host-b's server exited with $?: $(cat "$T/serve3.log")"
plx gc --json >"$T/gc6.json"
other=$(jq '.freed.data' "$T/gc6.json")
((other >= 32768)) || fail "gc after host-b let go freed $other data blocks, not filler2@b's 32768"
assert_eq 0 "$(leaked)" "blocks_leaked after host-b let go and gc ran"
plx check >"$T/check.out" || fail "check at the very end: $(cat "$T/check.out")"
echo "held deleted snapshot survived gc; $freed data blocks freed once it was closed, $dead once its holder was killed, $other once host-b let go"
