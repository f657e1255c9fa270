#!/usr/bin/env bash
# fio's nbd engine against `parallax serve`: 4 KiB random writes at queue depth 32 from two jobs,
# each on its own connection to the same VDI (multi-conn), then every block read back and
# checked (crc32c headers); afterwards the blockstore checks clean.
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
rc=0
fio --name=plx --ioengine=nbd --uri="nbd+unix:///disk?socket=$sock" --thread --numjobs=2 \
    --rw=randwrite --bs=4k --iodepth=32 --size=$per_job --offset_increment=$per_job \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=json \
    --output="$T/fio.json" >"$T/fio.out" 2>&1 || rc=$?
if [[ $rc -ne 0 ]]; then
    cat "$T/fio.out" >&2
    fail "fio exited $rc (a verify error or an I/O error)"
fi
# fio may print a line before the JSON: parse from the first '{'.
sed -n '/^{/,$p' "$T/fio.json" >"$T/fio.clean.json"
assert_eq 2 "$(jq '.jobs | length' "$T/fio.clean.json")" "fio jobs"
for j in 0 1; do
    job=$(jq -c ".jobs[$j] | {error, w: .write.io_bytes, r: .read.io_bytes}" "$T/fio.clean.json")
    assert_eq "{\"error\":0,\"w\":$per_job,\"r\":$per_job}" "$job" "job $j wrote and verified its half"
done
echo "fio: $(jq -r '[.jobs[].write.iops] | add | floor' "$T/fio.clean.json") write IOPS," \
    "$(jq -r '[.jobs[].read.iops] | add | floor' "$T/fio.clean.json") verify-read IOPS"

kill -TERM "$server"
wait "$server" || true
plx check >"$T/check.out" || { cat "$T/check.out" >&2; fail "check after the fio run"; }
tail -n1 "$T/check.out"
