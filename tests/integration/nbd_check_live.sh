#!/usr/bin/env bash
# `parallax check` beside a server that writes. Plain `check` refuses (exit 3) and names the
# writing process instead of reporting half-made changes as damage; `check --live` checks
# anyway, in passes, and reports only what persists: run again and again during heavy random
# writes it never reports an error, while a real corruption of a tree nobody writes is reported
# with exit 1.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd fio jq python3
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
plx format --size 1G --extent-size 16M >/dev/null
# "cold" is created first: its root is the first block after extent 1's bitmap.
plx vdi-create cold --size 16M >/dev/null
plx vdi-create hot --size 256M >/dev/null
plx check >/dev/null || fail "fresh store does not check clean"

sock=$T/nbd.sock
# shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
"$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve.log"

fio --name=hot --ioengine=nbd --uri="nbd+unix:///hot?socket=$sock" --rw=randwrite --bs=4k \
    --iodepth=32 --size=256M --time_based --runtime=${PLX_CHECK_LIVE_SECONDS:-12} \
    --output="$T/fio.out" >/dev/null 2>&1 &
fio_pid=$!
bg_pid "$fio_pid"
# Until fio has connected, the server has not opened hot and nothing writes: wait (bounded) for
# its lock on hot (a fixed `sleep 1` was too short beside CPU hogs: plain check then found no
# writer and exited 0).
for ((i = 0; i < 300; i++)); do
    [[ $(plx vdi-list --json | jq -r '.[] | select(.name == "hot") | .lock_holder') == "" ]] || break
    kill -0 "$fio_pid" 2>/dev/null || fail "fio exited before it wrote: $(cat "$T/fio.out")"
    sleep 0.1
done

# Plain check: refused, names the server, changes nothing.
expect_fail 3 plx check
[[ $PLX_LAST_STDERR == *"pid $server"* && $PLX_LAST_STDERR == *"--live"* ]] ||
    fail "refusal does not name the writer and the way out: $PLX_LAST_STDERR"

runs=0
while kill -0 "$fio_pid" 2>/dev/null; do
    rc=0
    plx check --live --json >"$T/live.json" 2>"$T/live.err" || rc=$?
    if [[ $rc -ne 0 ]] || [[ $(jq .errors "$T/live.json") != 0 ]]; then
        fail "check --live run $runs reported damage beside a writer (exit $rc): $(cat "$T/live.json" "$T/live.err")"
    fi
    runs=$((runs + 1))
done
wait "$fio_pid" || fail "fio failed: $(cat "$T/fio.out")"
((runs >= 5)) || fail "only $runs live checks ran during the writes"
echo "check --live: $runs runs beside the writer, no error"

# A real corruption while the server runs: --live reports it.
eb=$(($(plx info --json | jq .extent_size) / 4096))
python3 - "$T/store.img" $(((eb + 1) * 4096 + 5 * 8)) <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    f.write(b"\xff" * 8)
PY
rc=0
plx check --live --json >"$T/bad.json" 2>"$T/bad.err" || rc=$?
assert_eq 1 "$rc" "check --live on a corrupt tree"
jq -e '.errors >= 1 and (.messages | map(select(startswith("error:") and contains("radix node"))) | length >= 1)' \
    "$T/bad.json" >/dev/null || fail "corruption not reported: $(cat "$T/bad.json")"
kill "$server"
wait "$server" 2>/dev/null || true
echo ok
