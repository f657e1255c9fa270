#!/usr/bin/env bash
# Many hosts on one blockstore through parallax-lockd. Three engine processes with their own
# host ids (h1, h2, h3) serve their own VDIs side by side under a byte model; a VDI moves
# between hosts a hundred times with every flushed byte read back on the other host; a host
# killed -9 gives its VDI up at once; a host frozen (SIGSTOP) past its lease loses its VDI to
# another host and, resumed, writes nothing more; while lockd is down (killed -9) open VDIs are
# still served, new opens fail after the lock timeout with a message naming the lock manager,
# and after lockd restarts everything works again; a second live host with the same id and an
# unreachable lockd are refused with clear messages. parallax check is clean at the end.
# With PLX_LOCKD_ON_ISCSI=1 (lockd_iscsi.sh) the store is a tgtd LUN instead of a file: each host
# then has its own iSCSI session and initiator name (from its host id) and its own reservation
# key, takeovers from dead hosts preempt their keys, and the target drops every connection in the
# middle of the handovers.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io nbdcopy python3 jq
LOCKD=$(dirname "$PARALLAX")/parallax-lockd
[[ -x $LOCKD ]] || fail "parallax-lockd not built"

T=$PLX_TEST_TMP
STORE=$T/store.img
if [[ -n ${PLX_LOCKD_ON_ISCSI:-} ]]; then
    tgt_start
    STORE=$(tgt_add_lun 1 4G)
    plx() { "$PARALLAX" -b "$STORE" "$@"; }
fi
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
export PARALLAX_LOCK_TIMEOUT=4
size=$((16 << 20))
lease=3

start_lockd() {
    local i
    for ((i = 0; i < 20; i++)); do
        port=${port:-$((20000 + RANDOM % 30000))}
        "$LOCKD" --listen "127.0.0.1:$port" --lease $lease >>"$T/lockd.log" 2>&1 &
        LOCKD_PID=$!
        bg_pid "$LOCKD_PID"
        sleep 0.2
        kill -0 "$LOCKD_PID" 2>/dev/null && return 0
        grep -q "Address already in use" "$T/lockd.log" && [[ -z ${keep_port:-} ]] && port=
    done
    fail "lockd did not start: $(cat "$T/lockd.log")"
}
start_lockd

plx format --size 4G >/dev/null
plx lockd-set "127.0.0.1:$port"
for v in a b c d; do plx vdi-create $v --size $size >/dev/null; done
for v in a b c d; do truncate -s $size "$T/model-$v.img"; done

declare -A SRV
start_host() { # HOST-ID
    local i
    PARALLAX_HOST_ID=$1 "$PARALLAX" -b "$STORE" serve --unix "$T/$1.sock" >"$T/$1.log" 2>&1 &
    SRV[$1]=$!
    bg_pid "${SRV[$1]}"
    wait_socket "$T/$1.sock" "${SRV[$1]}" "$T/$1.log"
}
uri() { echo "nbd+unix:///$2?socket=$T/$1.sock"; }
rm -f "$T"/h?.sock
for h in h1 h2 h3; do start_host $h; done

# All the random writes the test makes, one plan per seed: "SEED PATTERN OFFSET LENGTH" lines.
python3 - $size >"$T/plans" <<'PY'
import random, sys
size = int(sys.argv[1])
for seed in list(range(10, 50)) + list(range(1000, 1400)) + [300, 301, 400, 500, 501]:
    r = random.Random(seed)
    for _ in range(r.randint(2, 6)):
        n = r.choice([4096, 65536, 12288, 512])
        print(seed, r.randint(1, 255), r.randrange(0, (size - n) // 512) * 512, n)
PY
# write HOST VDI SEED: the seed's writes and a flush through HOST; the model is brought up to
# date when the VDI is next verified.
write() {
    local args=() s p o n
    while read -r s p o n; do args+=(-c "write -P $p $o $n"); done < <(awk -v s="$3" '$1 == s' "$T/plans")
    out=$(qemu-io -f raw "${args[@]}" -c flush "$(uri "$1" "$2")" 2>&1) || return 1
    grep -qi 'error\|fail' <<<"$out" && return 1
    echo "$3" >>"$T/pending-$2"
}
# model VDI PATTERN OFFSET LENGTH: a write made by hand.
model() { echo "- $2 $3 $4" >>"$T/pending-$1"; }
sync_model() { # VDI
    [[ -s $T/pending-$1 ]] || return 0
    python3 - "$T/model-$1.img" "$T/plans" "$T/pending-$1" <<'PY'
import sys
plans = {}
for line in open(sys.argv[2]):
    s, p, o, n = line.split()
    plans.setdefault(s, []).append((int(p), int(o), int(n)))
with open(sys.argv[1], "r+b") as f:
    for line in open(sys.argv[3]):
        w = line.split()
        for p, o, n in ([tuple(map(int, w[1:]))] if w[0] == "-" else plans[w[0]]):
            f.seek(o); f.write(bytes([p]) * n)
PY
    : >"$T/pending-$1"
}
verify() { # HOST VDI WHAT
    sync_model "$2"
    rm -f "$T/read.img"
    nbdcopy "$(uri "$1" "$2")" "$T/read.img" || fail "$3: reading $2 through $1"
    cmp -s "$T/model-$2.img" "$T/read.img" || fail "$3: $2 read through $1 differs from what was flushed"
}

# 1. Three hosts, each writing its own VDI, at the same time, while a fourth host collects
# garbage (a snapshot deleted each round leaves some): what another host claimed is never freed.
for round in 1 2 3 4; do
    write h1 a "1$round" & w1=$!
    write h2 b "2$round" & w2=$!
    write h3 c "3$round" & w3=$!
    PARALLAX_HOST_ID=h4 "$PARALLAX" -b "$STORE" gc --quiet >"$T/gc.log" 2>&1 & g=$!
    wait $w1 && wait $w2 && wait $w3 || fail "concurrent writes, round $round"
    wait $g || contains "another collection" "$T/gc.log" || fail "gc on h4: $(cat "$T/gc.log")"
    snap=$(PARALLAX_HOST_ID=h4 "$PARALLAX" -b "$STORE" vdi-snapshot d)
    PARALLAX_HOST_ID=h4 "$PARALLAX" -b "$STORE" snap-delete "$snap" >/dev/null
done
verify h2 a "three hosts"; verify h3 b "three hosts"; verify h1 c "three hosts"
echo "three hosts wrote side by side"
if [[ -n ${PLX_LOCKD_ON_ISCSI:-} ]]; then
    sessions=$(tgt_adm --op show --mode target)
    for h in h1 h2 h3; do
        grep -q "Initiator: iqn.2026-11.org.parallax:$h " <<<"$sessions" ||
            contains "Initiator: iqn.2026-11.org.parallax:$h\$" <<<"$sessions" ||
            fail "no session with initiator name ...:$h: $sessions"
    done
    echo "each host has its own initiator name"
fi

# 2. VDI a handed between hosts a hundred times.
hosts=(h1 h2 h3)
for ((i = 0; i < ${PLX_LOCKD_HANDOVERS:-100}; i++)); do
    from=${hosts[i % 3]} to=${hosts[(i + 1) % 3]}
    if [[ -n ${PLX_LOCKD_ON_ISCSI:-} ]] && ((i == 50)); then
        dropped=$(tgt_drop_connections)
        ((dropped >= 3)) || fail "tgtadm dropped $dropped connections, not every host's"
    fi
    write "$from" a $((1000 + i)) || fail "handover $i: write through $from: $(tail -3 "$T/$from.log")"
    if ((i % 10 == 9)); then verify "$to" a "handover $i"; fi
done
verify h2 a "after the handovers"
echo "a handed between hosts ${PLX_LOCKD_HANDOVERS:-100} times"

# 3. A host killed -9 while a client writes: another host takes its VDI at once.
write h3 c 300 || fail "write through h3"
kill -9 "${SRV[h3]}"
wait "${SRV[h3]}" 2>/dev/null || true
write h1 c 301 || fail "h1 could not take c from the killed h3: $(tail -3 "$T/h1.log")"
verify h2 c "after h3 was killed"
echo "a killed host's VDI moved at once"

# 4. A host frozen past its lease: another host takes its VDI; resumed, it writes nothing.
mkfifo "$T/qio.fifo"
qemu-io -f raw "$(uri h2 b)" <"$T/qio.fifo" >"$T/qio.log" 2>&1 &
qio=$!
bg_pid $qio
exec 3>"$T/qio.fifo"
echo "write -P 77 0 4096" >&3
echo "flush" >&3
sleep 1
model b 77 0 4096
kill -STOP "${SRV[h2]}"
sleep $((lease + 2))
write h1 b 400 || fail "h1 could not take b from the frozen h2: $(tail -3 "$T/h1.log")"
kill -CONT "${SRV[h2]}"
echo "write -P 99 8192 4096" >&3
echo "flush" >&3
sleep 1
exec 3>&-
wait $qio 2>/dev/null || true
grep -q 'stopped for' "$T/h2.log" || fail "h2 does not say it was fenced: $(cat "$T/h2.log")"
grep -qi 'error\|fail' "$T/qio.log" || fail "the resumed host accepted a write: $(cat "$T/qio.log")"
verify h1 b "after the frozen host resumed"
echo "a frozen host lost its VDI and wrote nothing after it resumed"

# 5. lockd killed -9: open VDIs still served; new opens fail clearly; back after a restart.
qemu-io -f raw "$(uri h1 d)" -c "write -P 5 0 4096" -c flush >/dev/null 2>&1 || fail "open d"
model d 5 0 4096
mkfifo "$T/qio2.fifo"
qemu-io -f raw "$(uri h1 a)" <"$T/qio2.fifo" >"$T/qio2.log" 2>&1 &
qio2=$!
bg_pid $qio2
exec 4>"$T/qio2.fifo"
echo "read 0 4096" >&4
sleep 0.5
kill -9 "$LOCKD_PID"
wait "$LOCKD_PID" 2>/dev/null || true
echo "write -P 42 65536 4096" >&4
echo "flush" >&4
sleep 0.5
if write h1 c 500; then fail "a new open succeeded with no lock manager"; fi
grep -q "lock manager.*cannot be reached" "$T/h1.log" || fail "h1 does not say why the open failed: $(tail -5 "$T/h1.log")"
exec 4>&-
wait $qio2 2>/dev/null || true
! grep -qi 'error\|fail' "$T/qio2.log" || fail "an open VDI stopped being served without lockd: $(cat "$T/qio2.log")"
model a 42 65536 4096
keep_port=1 start_lockd
sleep 1
write h1 c 501 || fail "opens after lockd restarted: $(tail -3 "$T/h1.log")"
verify h1 a "after lockd restarted"
echo "served through a lockd outage; opens work again after its restart"

# 6. A second live host with the same id, and an unreachable lockd, are refused.
expect_fail 1 env PARALLAX_HOST_ID=h1 PARALLAX_HOST_INSTANCE=another-machine "$PARALLAX" -b "$STORE" vdi-list
[[ $PLX_LAST_STDERR == *"in use by another live host"* ]] || fail "same id: $PLX_LAST_STDERR"
expect_fail 1 env PARALLAX_LOCKD=127.0.0.1:1 "$PARALLAX" -b "$STORE" vdi-list
[[ $PLX_LAST_STDERR == *"cannot reach the lock manager at 127.0.0.1:1"* ]] || fail "unreachable: $PLX_LAST_STDERR"

# The end: everything stops, the store checks clean, nothing flushed was lost.
for h in h1 h2; do kill "${SRV[$h]}"; wait "${SRV[$h]}" 2>/dev/null || true; done
for v in a b c d; do
    sync_model $v
    plx vdi-export $v "$T/final.img"
    cmp -s "$T/model-$v.img" "$T/final.img" || fail "$v: the final image differs from the model"
done
# Holders lockd has not seen since its restart count as alive until its grace period ends.
for ((i = 0; i < 100; i++)); do plx lockd-status | contains '^GRACE' || break; sleep 0.2; done
plx gc >/dev/null
plx check --json >"$T/check.json" || fail "check: $(cat "$T/check.json")"
assert_eq 0 "$(jq .errors "$T/check.json")" "check errors"
kill "$LOCKD_PID"
wait "$LOCKD_PID" 2>/dev/null || true
echo ok
