#!/usr/bin/env bash
# A server killed while it creates its write log (here by SIGXFSZ: a file-size limit below the
# log's size kills it inside posix_fallocate; a kill -9 during the write-through at creation
# leaves the same kind of half-made file) must not leave a file under the log's name that the
# next start refuses: the log is made under a temporary name and renamed only once its head is
# written, so after the crash the next `serve --write-cache` with the same path creates it afresh
# and serves. The leftover temporary file is removed by that start.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd qemu-io

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
plx format --size 40M --extent-size 4M >/dev/null
plx vdi-create vm --size 8M >/dev/null

# 1. The crash: a 48 MiB file-size limit, a 64 MiB log.
set +e
(
    ulimit -f 49152
    exec "$PARALLAX" -b "$T/store.img" serve --unix "$T/a.sock" --write-cache "$T/wlog" \
        --write-cache-size 64M
) >"$T/a.log" 2>&1
rc=$?
set -e
[[ $rc -eq $((128 + 25)) ]] || fail "the server was not killed by SIGXFSZ (exit $rc): $(cat "$T/a.log")"
[[ ! -e $T/wlog ]] || fail "a half-made log was left under its name ($(stat -c %s "$T/wlog") bytes)"

# 2. The next start with the same path creates the log and serves through it.
"$PARALLAX" -b "$T/store.img" serve --unix "$T/b.sock" --write-cache "$T/wlog" \
    --write-cache-size 64M >"$T/b.log" 2>&1 &
pid=$!
bg_pid $pid
wait_socket "$T/b.sock" "$pid" "$T/b.log" 60
qemu-io -f raw -c "write -P 0x3c 0 1M" -c flush -c "read -P 0x3c 0 1M" \
    "nbd+unix:///vm?socket=$T/b.sock" | contains "^read 1048576/1048576" ||
    fail "writes through the log made after the crash"
[[ -z $(find "$T" -maxdepth 1 -name '.wlog.*') ]] || fail "the temporary file was left: $(ls -a "$T")"
kill $pid
wait $pid 2>/dev/null || true
plx check --quiet || fail "check"
echo "wcache_create_crash: ok"
