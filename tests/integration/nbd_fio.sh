#!/usr/bin/env bash
# fio's nbd engine against `parallax serve`: 4 KiB random writes at queue depth 32 from two jobs,
# each on its own connection to the same VDI (multi-conn), then every block read back and
# checked (crc32c headers); then one connection mixing 4 KiB to 2 MiB writes, verified the same
# way; afterwards the blockstore checks clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdinfo fio jq
fio --enghelp 2>/dev/null | contains -w nbd || skip "fio has no nbd engine"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 128M >/dev/null

# shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
"$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
wait_socket "$sock" "$server" "$T/serve.log"
assert_eq true "$(nbdinfo --json "nbd+unix:///disk?socket=$sock" | jq -r '.exports[0].can_multi_conn')" \
    "multi-conn advertised"

# Two jobs (threads, one NBD connection each) on disjoint 48 MiB halves: each block written once
# in random order, then the verify phase reads every block back.
per_job=$((48 << 20))
# fio_verify NAME ARGS...: random writes to the VDI with crc32c verification, every block read
# back; fails on fio's error; its JSON (from the first '{': fio may print a line before it) in
# $T/NAME.clean.json.
fio_verify() {
    local name=$1 rc=0
    shift
    fio --name="$name" --ioengine=nbd --uri="nbd+unix:///disk?socket=$sock" --rw=randwrite \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=json \
        --output="$T/$name.json" "$@" >"$T/$name.out" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
        cat "$T/$name.out" >&2
        fail "$name: fio exited $rc (a verify error or an I/O error)"
    fi
    sed -n '/^{/,$p' "$T/$name.json" >"$T/$name.clean.json"
}
fio_verify plx --thread --numjobs=2 --bs=4k --iodepth=32 --size=$per_job --offset_increment=$per_job
assert_eq 2 "$(jq '.jobs | length' "$T/plx.clean.json")" "fio jobs"
for j in 0 1; do
    job=$(jq -c ".jobs[$j] | {error, w: .write.io_bytes, r: .read.io_bytes}" "$T/plx.clean.json")
    assert_eq "{\"error\":0,\"w\":$per_job,\"r\":$per_job}" "$job" "job $j wrote and verified its half"
done
echo "fio: $(jq -r '[.jobs[].write.iops] | add | floor' "$T/plx.clean.json") write IOPS," \
    "$(jq -r '[.jobs[].read.iops] | add | floor' "$T/plx.clean.json") verify-read IOPS"

# One connection mixing small and large writes (4 KiB to 2 MiB) at depth 8 on the last 32 MiB,
# every byte read back: a large write's payload goes straight into its own buffer and the read
# after it takes only the next request's header (conn_read), so small requests after large ones
# and large after small are both parsed from what each read left.
fio_verify mixed --bssplit=4k/30:12k/10:64k/20:1m/30:2m/10 --iodepth=8 --offset=$((2 * per_job)) \
    --size=32M
assert_eq '{"error":0,"w":33554432,"r":33554432}' \
    "$(jq -c '.jobs[0] | {error, w: .write.io_bytes, r: .read.io_bytes}' "$T/mixed.clean.json")" \
    "mixed sizes written and verified"

kill -TERM "$server"
wait "$server" || true
plx check >"$T/check.out" || { cat "$T/check.out" >&2; fail "check after the fio run"; }
tail -n1 "$T/check.out"
