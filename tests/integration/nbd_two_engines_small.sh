#!/usr/bin/env bash
# Two servers writing to one small blockstore. Each process allocates in a metadata and a data
# extent of its own, so a store with few huge extents left the second one without space. With
# the default extent size (about 32 per store) an 8 GiB store serves two writers; a store that
# really has too few extents refuses the second writer's write with ENOSPC, and the server says
# why and what to do.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"

start_server() { # STORE SOCK LOG -> SERVER_PID
    local i
    # shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
    "$PARALLAX" -b "$1" serve ${PLX_SERVE_ARGS:-} --unix "$2" >"$3" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$2" "$SERVER_PID" "$3"
}
write() { # SOCK VDI -> qemu-io output; exit status of the write
    qemu-io -f raw -c "write -P 7 0 4M" -c flush "nbd+unix:///$2?socket=$1" 2>&1
}

# 1. An 8 GiB store formatted with the defaults: two writers side by side.
plx format --size 8G >/dev/null
plx vdi-create a --size 64M >/dev/null
plx vdi-create b --size 64M >/dev/null
start_server "$T/store.img" "$T/a.sock" "$T/a.log"
pa=$SERVER_PID
start_server "$T/store.img" "$T/b.sock" "$T/b.log"
pb=$SERVER_PID
out=$(write "$T/a.sock" a) || fail "writing a through server 1: $out"
out=$(write "$T/b.sock" b) || fail "writing b through server 2: $out $(cat "$T/b.log")"
! grep -qi 'error\|fail' <<<"$out" || fail "server 2: $out $(cat "$T/b.log")"
kill "$pa" "$pb"
wait "$pa" "$pb" 2>/dev/null || true
plx check >/dev/null || fail "check after two writers"

# 2. A store with three non-system extents: the second writer cannot have a data extent.
"$PARALLAX" -b "$T/small.img" format --size 64M --extent-size 16M >/dev/null
"$PARALLAX" -b "$T/small.img" vdi-create a --size 16M >/dev/null
"$PARALLAX" -b "$T/small.img" vdi-create b --size 16M >/dev/null
start_server "$T/small.img" "$T/sa.sock" "$T/sa.log"
pa=$SERVER_PID
start_server "$T/small.img" "$T/sb.sock" "$T/sb.log"
pb=$SERVER_PID
out=$(write "$T/sa.sock" a) || fail "writing a through server 1: $out"
if out=$(write "$T/sb.sock" b) && ! grep -qi 'error\|fail' <<<"$out"; then
    fail "server 2 wrote to a store with no extent left for it: $out"
fi
grep -q 'No space left' <<<"$out" || fail "client should see ENOSPC: $out"
grep -q "no free .* extent for this process" "$T/sb.log" || fail "server 2 does not say why: $(cat "$T/sb.log")"
grep -q -- "--extent-size" "$T/sb.log" || fail "server 2 does not say what to do: $(cat "$T/sb.log")"
kill "$pa" "$pb"
wait "$pa" "$pb" 2>/dev/null || true
"$PARALLAX" -b "$T/small.img" check >/dev/null || fail "check after the refused write"
echo ok
