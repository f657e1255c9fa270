#!/usr/bin/env bash
# A VDI handed back and forth between two `parallax serve` processes on one blockstore: each
# round a client writes (new blocks and overwrites) through one server, flushes and disconnects,
# and the whole VDI is read back through the other server and compared with a byte model. The
# server that held the VDI before keeps its node cache; it must not trust it (writer_gen).
# Afterwards `parallax check` is clean with no leaked block beyond what gc reclaims.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io nbdcopy python3 jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
size=$((16 << 20))
rounds=${PLX_HANDOVER_ROUNDS:-40}

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create vm --size $size >/dev/null
truncate -s $size "$T/model.img"

start_server() { # SOCK LOG -> SERVER_PID
    local i
    # shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
    "$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$1" >"$2" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$1" "$SERVER_PID" "$2"
}
start_server "$T/s0.sock" "$T/s0.log"
pid0=$SERVER_PID
start_server "$T/s1.sock" "$T/s1.log"
pid1=$SERVER_PID
uri() { echo "nbd+unix:///vm?socket=$T/s$1.sock"; }

# Random writes for one round: "PATTERN OFFSET LENGTH" lines, 512-byte aligned, half of them in
# the first MiB (overwrites), the rest anywhere (new blocks).
python3 - "$rounds" "$size" >"$T/plan" <<'PY'
import random, sys
rounds, size = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(1234)
for r in range(rounds):
    ops = []
    for _ in range(rnd.randint(3, 10)):
        span = (1 << 20) if rnd.random() < 0.5 else size
        ln = rnd.choice([512, 4096, 8192, 65536, 3 * 4096 + 512, 131072])
        off = rnd.randrange(0, (span - ln) // 512) * 512
        ops.append(f"{rnd.randint(1, 255)} {off} {ln}")
    print(r, ";".join(ops))
PY

apply_model() { # "PAT OFF LEN;..." -> model.img
    python3 - "$T/model.img" "$1" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    for op in sys.argv[2].split(";"):
        p, o, n = map(int, op.split())
        f.seek(o)
        f.write(bytes([p]) * n)
PY
}

while read -r round ops; do
    w=$((round % 2))
    r=$((1 - w))
    args=()
    IFS=';' read -ra list <<<"$ops"
    for op in "${list[@]}"; do
        read -r p o n <<<"$op"
        args+=(-c "write -P $p $o $n")
    done
    out=$(qemu-io -f raw "${args[@]}" -c flush "$(uri $w)" 2>&1) || fail "round $round: qemu-io through server $w: $out"
    if grep -Eqi 'error|fail' <<<"$out"; then fail "round $round: qemu-io: $out"; fi
    apply_model "$ops"
    rm -f "$T/read.img"
    nbdcopy "$(uri $r)" "$T/read.img" || fail "round $round: nbdcopy through server $r"
    if ! cmp -s "$T/model.img" "$T/read.img"; then
        fail "round $round: server $r reads what server $w flushed wrongly: $(cmp "$T/model.img" "$T/read.img" | head -1)"
    fi
done <"$T/plan"

kill "$pid0" "$pid1"
wait "$pid0" "$pid1" 2>/dev/null || true
plx check --json >"$T/check.json" || fail "check failed: $(cat "$T/check.json")"
assert_eq 0 "$(jq .errors "$T/check.json")" "check errors"
# The servers released their unused claims when they stopped: nothing is allocated that no
# tree reaches.
assert_eq 0 "$(jq .leaked_blocks "$T/check.json")" "leaked blocks"
plx vdi-export vm "$T/final.img"
cmp "$T/model.img" "$T/final.img" || fail "exported VDI differs from the model"
echo "ok: $rounds handovers between two servers, every flushed byte read back through the other"
