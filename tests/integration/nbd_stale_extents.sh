#!/usr/bin/env bash
# A running server must see what other processes do to the blockstore. Here the server has
# written (so it holds extents for its allocations), then no client has the VDI open, and the
# `parallax` command itself snapshots it and creates another VDI, allocating the snapshot log in
# a metadata extent that it claims for itself. The server must still list the exports, open the
# new snapshot, reopen the VDI and serve the new VDI.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdinfo qemu-io jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=$sock"; }

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 64M >/dev/null

# shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
"$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve.log"

qemu-io -f raw -c "write -P 0x41 0 64k" "$(uri disk)" >/dev/null || fail "first write"
# The connection is closed: the VDI is not open, so the command takes the snapshot itself.
assert_eq disk@1 "$(plx vdi-snapshot disk)" "snapshot of an idle served VDI"
plx vdi-create other --size 16M >/dev/null

problems=()
names=$(nbdinfo --list --json "nbd+unix:///?socket=$sock" 2>"$T/err" |
    jq -r '.exports[]."export-name"' | sort | tr '\n' ' ') || true
[[ $names == "disk disk@1 other " ]] ||
    problems+=("nbdinfo --list gave [$names]: $(cat "$T/err")")
qemu-io -r -f raw -c "read -P 0x41 0 64k" "$(uri disk@1)" >"$T/q1" 2>&1 ||
    problems+=("reading disk@1: $(grep -v '^read\|ops' "$T/q1")")
qemu-io -f raw -c "read -P 0x41 0 64k" -c "write -P 0x42 64k 4k" "$(uri disk)" >"$T/q2" 2>&1 ||
    problems+=("reopening disk: $(grep -v '^read\|^wrote\|ops' "$T/q2")")
qemu-io -f raw -c "write -P 0x43 0 4k" -c "read -P 0x43 0 4k" "$(uri other)" >"$T/q3" 2>&1 ||
    problems+=("opening the new VDI: $(grep -v '^read\|^wrote\|ops' "$T/q3")")

kill -TERM "$server"
wait "$server" || true
plx check >"$T/check.out" || problems+=("check: $(cat "$T/check.out")")
if [[ ${#problems[@]} -gt 0 ]]; then
    printf '  %s\n' "${problems[@]}" >&2
    echo "server log:" >&2
    sed 's/^/  /' "$T/serve.log" >&2
    fail "the server did not see the blockstore as changed by another process"
fi
