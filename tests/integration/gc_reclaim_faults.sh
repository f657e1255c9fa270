#!/usr/bin/env bash
# Collecting in held extents, with faults (issue 30, item 1): two servers on one file store each
# hold garbage (deleted snapshots) in their extents.
#  - gc killed -9 at several points (asking, marking, publishing, waiting for the folds): the
#    servers serve on, what was flushed reads back, and the next gc frees the rest;
#  - a server frozen (SIGSTOP) so that gc waits for its answer, then killed -9 while gc runs:
#    gc ends, its extents are a dead holder's and are collected, its VDI reads back elsewhere;
#  - a server killed -9 while it folds what gc published, at several points: a restarted server
#    reads everything back and the next gc frees what the dead one had not.
# parallax check is clean at the end (no errors, no leaks).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
# A collector waits this long for holders to answer and to fold (a loaded machine may be slow);
# the one beside a frozen holder waits less (below).
export PARALLAX_RECLAIM_WAIT_MS=30000

plx format --size 512M --extent-size 2M >/dev/null
for v in a b; do plx vdi-create "$v" --size 8M >/dev/null; done

declare -A SRV
start() { # NAME
    rm -f "$T/$1.sock"
    PARALLAX_RECLAIM_POLL_MS=20 "$PARALLAX" -b "$T/store.img" serve --unix "$T/$1.sock" \
        >>"$T/$1.log" 2>&1 &
    SRV[$1]=$!
    bg_pid "${SRV[$1]}"
    wait_socket "$T/$1.sock" "${SRV[$1]}" "$T/$1.log"
    # The control socket is there before the NBD socket: the snapshots below go through it (it
    # came after, and a snapshot right after the first write once found none).
    [[ -S $PARALLAX_RUN_DIR/serve-${SRV[$1]}.sock ]] || fail "server $1: NBD socket before its control socket"
}
uri() { echo "nbd+unix:///$2?socket=$T/$1.sock"; }
io() { # SERVER VDI CMD...: qemu-io commands through SERVER; any error fails the test
    local s=$1 v=$2 out
    shift 2
    local args=()
    for c in "$@"; do args+=(-c "$c"); done
    out=$(qemu-io -f raw "${args[@]}" "$(uri "$s" "$v")" 2>&1) || fail "qemu-io $* on $v via $s: $out"
    ! grep -qi 'error\|fail' <<<"$out" || fail "qemu-io $* on $v via $s: $out"
}
declare -A PAT=([a]=0 [b]=0)
# Garbage in the server's extents: the VDI written three times with a snapshot between, both
# snapshots deleted. PAT holds the pattern it must read back.
garbage() { # SERVER VDI
    local p=$((PAT[$2] + 1)) s1 s2
    io "$1" "$2" "write -P $p 0 8M" flush
    s1=$(plx vdi-snapshot "$2")
    io "$1" "$2" "write -P $((p + 1)) 0 8M" flush
    s2=$(plx vdi-snapshot "$2")
    io "$1" "$2" "write -P $((p + 2)) 0 8M" flush
    plx snap-delete "$s1"
    plx snap-delete "$s2"
    PAT[$2]=$((p + 2))
}
check_data() { # SERVER VDI WHAT
    io "$1" "$2" "read -P ${PAT[$2]} 0 8M"
}
gc_ok() { plx gc --json >"$T/gc.json" 2>"$T/gc.err" || fail "$1: gc: $(cat "$T/gc.err")"; }

start sa
start sb
garbage sa a
garbage sb b

# gc killed -9 at several points of its run.
for d in 0.02 0.05 0.1 0.2 0.4; do
    plx gc >/dev/null 2>&1 &
    g=$!
    sleep "$d"
    kill -9 "$g" 2>/dev/null || true
    wait "$g" 2>/dev/null || true
    for s in sa sb; do kill -0 "${SRV[$s]}" || fail "server $s exited (gc killed after $d s)"; done
    check_data sa a
    check_data sb b
    garbage sa a
done
gc_ok "after the killed collectors"
# (What the killed ones published may have been freed by the holders since: no count here; the
# end shows that nothing is left.)
check_data sa a
check_data sb b

# A holder frozen while gc waits for its answer, then killed -9: gc goes on without it, and its
# extents are collected as a dead holder's.
garbage sb b
kill -STOP "${SRV[sb]}"
PARALLAX_RECLAIM_WAIT_MS=2000 plx gc --json >"$T/gc-dead.json" 2>"$T/gc-dead.err" &
g=$!
sleep 0.5
kill -9 "${SRV[sb]}"
wait "${SRV[sb]}" 2>/dev/null || true
wait "$g" || fail "gc beside a holder killed -9: $(cat "$T/gc-dead.err")"
check_data sa b
check_data sa a

# A holder killed -9 while it folds: at several points after gc starts.
start sb
for d in 0.05 0.1 0.15 0.2 0.3; do
    garbage sb b
    plx gc >/dev/null 2>"$T/gc-fold.err" &
    g=$!
    sleep "$d"
    kill -9 "${SRV[sb]}"
    wait "${SRV[sb]}" 2>/dev/null || true
    wait "$g" || fail "gc beside a holder killed -9 after $d s: $(cat "$T/gc-fold.err")"
    start sb
    check_data sb b
    check_data sa a
done
gc_ok "after the killed holders"
check_data sb b
check_data sa a

for s in sa sb; do
    kill "${SRV[$s]}"
    wait "${SRV[$s]}" 2>/dev/null || true
done
# Once nobody holds anything, one more collection leaves nothing leaked.
gc_ok "with every server stopped"
plx check --json >"$T/check.json" || fail "check: $(cat "$T/check.json")"
[[ $(jq .leaked_blocks "$T/check.json") == 0 ]] || fail "check reports leaks: $(cat "$T/check.json")"
