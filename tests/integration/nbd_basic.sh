#!/usr/bin/env bash
# `parallax serve` exports VDIs and snapshots over NBD to ordinary clients: nbdinfo lists them,
# qemu-io writes and reads patterns, nbdcopy round-trips a file byte for byte, block status
# (base:allocation) reports holes where nothing was written so copies skip them, and flush, FUA,
# trim and write-zeroes work (trimmed and zeroed ranges read back as zeros; trim leaves a hole).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdkit nbdinfo nbdcopy qemu-io qemu-img jq

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"
sock=$T/nbd.sock
uri() { echo "nbd+unix:///$1?socket=$sock"; }

# start_server: `parallax serve` in the background, stopped by pid at exit; waits (bounded) for
# its socket. Sets SERVER_PID.
start_server() {
    local i
    rm -f "$sock"
    # shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
    "$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >>"$T/serve.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    wait_socket "$sock" "$SERVER_PID" "$T/serve.log"
}
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
}
# qio URI CMD...: qemu-io (read-only for a snapshot) with one -c per CMD; fails the test on any error or pattern mismatch.
qio() {
    local u=$1 out rc=0 a=()
    shift
    [[ $u == *@* ]] && a+=(-r) # snapshots are read-only exports
    for c in "$@"; do a+=(-c "$c"); done
    out=$(qemu-io -f raw "${a[@]}" "$u" 2>&1) || rc=$?
    if [[ $rc -ne 0 ]] || contains -Ei 'fail|error' <<<"$out"; then
        printf '%s\n' "$out" >&2
        fail "qemu-io on $u (exit $rc): $*"
    fi
}
# map_at URI OFFSET: the "TYPE DESCRIPTION" of the base:allocation extent holding OFFSET.
map_at() {
    nbdinfo --map "$1" | awk -v o="$2" '$1 <= o && o < $1 + $2 { print $3, $4; exit }'
}

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 64M >/dev/null
plx vdi-create sparse --size 256M >/dev/null
plx vdi-create copy --size 32M >/dev/null
start_server

# ---- Listing: every VDI, and each snapshot once it exists ---------------------------------------
list_names() { nbdinfo --list --json "nbd+unix:///?socket=$sock" | jq -r '.exports[]."export-name"' | sort | tr '\n' ' '; }
assert_eq "copy disk sparse " "$(list_names)" "exports before any snapshot"

# ---- qemu-io patterns: aligned, unaligned, and reads of never-written space -------------------
qio "$(uri disk)" "write -P 0xa1 0 1M" "write -P 0xa2 1049088 5000" "write -P 0xa3 8M 4k"
qio "$(uri disk)" "read -P 0xa1 0 512" "read -P 0xa1 512 1048064" "read -P 0 1048576 512" "read -P 0xa2 1049088 5000" \
    "read -P 0 1054088 4096" "read -P 0xa3 8M 4k" "read -P 0 16M 1M" "read -P 0 63M 1M"
# A mismatching pattern must be caught (so the checks above can fail).
if qemu-io -f raw -c "read -P 0x5a 0 4k" "$(uri disk)" >/dev/null 2>&1; then
    fail "qemu-io did not notice a wrong pattern"
fi

# A snapshot while a client holds the VDI (so the server takes it) appears as VDI@N, read-only,
# and by label. (A snapshot of a VDI no client has open is taken by the command itself; that case
# is nbd_stale_extents.sh.)
mkfifo "$T/hold.fifo"
qemu-io -f raw "$(uri disk)" <"$T/hold.fifo" >"$T/hold.log" 2>&1 &
holder=$!
bg_pid "$holder"
exec 3>"$T/hold.fifo"
for ((i = 0; i < 100; i++)); do grep -q 'qemu-io>' "$T/hold.log" && break; sleep 0.1; done
grep -q 'qemu-io>' "$T/hold.log" || fail "qemu-io did not open the VDI: $(cat "$T/hold.log")"
plx vdi-list | contains "^1 .* pid $SERVER_PID\$" || fail "the server does not hold disk: $(plx vdi-list)"
assert_eq disk@1 "$(plx vdi-snapshot disk --label one)" "live snapshot"
echo quit >&3
exec 3>&-
wait "$holder" || fail "qemu-io holding the VDI failed: $(cat "$T/hold.log")"
assert_eq "copy disk disk@1 disk@one sparse " "$(list_names)" "exports after a labelled snapshot"
# list_desc NAME: the description the list gives export NAME ("" when none).
list_desc() {
    nbdinfo --list --json "nbd+unix:///?socket=$sock" |
        jq -r --arg n "$1" '.exports[] | select(."export-name" == $n) | .description // ""'
}
assert_eq disk@1 "$(list_desc disk@one)" "description of the label's export"
assert_eq "" "$(list_desc disk@1)" "description of a snapshot's number"
info=$(nbdinfo --json "$(uri disk@1)")
assert_eq true "$(jq -r '.exports[0].is_read_only' <<<"$info")" "snapshot export read-only"
assert_eq false "$(nbdinfo --json "$(uri disk)" | jq -r '.exports[0].is_read_only')" "VDI read-write"
assert_eq $((64 << 20)) "$(jq -r '.exports[0]."export-size"' <<<"$info")" "snapshot size"
qio "$(uri disk@one)" "read -P 0xa1 0 1M" "read -P 0xa3 8M 4k" "read -P 0 16M 1M"

# ---- nbdcopy a file in and back out, byte-identical -----------------------------------------------
truncate -s 32M "$T/in.raw"
head -c $((3 << 20)) /dev/urandom | dd of="$T/in.raw" conv=notrunc status=none
head -c 12345 /dev/urandom | dd of="$T/in.raw" bs=1 seek=$((20 << 20)) conv=notrunc status=none
head -c 4096 /dev/urandom | dd of="$T/in.raw" bs=4096 seek=$((8191)) conv=notrunc status=none
nbdcopy "$T/in.raw" "$(uri copy)"
nbdcopy "$(uri copy)" "$T/out.raw"
cmp "$T/in.raw" "$T/out.raw" || fail "nbdcopy round trip differs"
qemu-img convert -f raw -O raw "$(uri copy)" "$T/out2.raw"
cmp "$T/in.raw" "$T/out2.raw" || fail "qemu-img convert of the VDI differs"

# ---- Sparse VDI: block status shows holes, copies read only the data ------------------------------
qio "$(uri sparse)" "write -P 0x66 8M 1M" "write -P 0x77 200M 64k"
map=$(nbdinfo --map "$(uri sparse)" | awk '{ print $1, $2, $4 }')
want="0 8388608 hole,zero
8388608 1048576 data
9437184 200278016 hole,zero
209715200 65536 data
209780736 58654720 hole,zero"
[[ $map == "$want" ]] || { printf 'map:\n%s\n' "$map" >&2; fail "base:allocation map of the sparse VDI"; }

# Copy through a logging NBD proxy to see exactly what the copier asked the server for.
psock=$T/proxy.sock
nbdkit --foreground --unix "$psock" --filter=log nbd socket="$sock" export=sparse \
    logfile="$T/proxy.log" >"$T/proxy.out" 2>&1 &
proxy=$!
bg_pid "$proxy"
for ((i = 0; i < 100; i++)); do [[ -S $psock ]] && break; sleep 0.1; done
[[ -S $psock ]] || fail "proxy did not start: $(cat "$T/proxy.out")"
# read_bytes LINE: total count of the Read requests in the proxy log from line LINE on.
read_bytes() {
    tail -n +"$1" "$T/proxy.log" | grep -ao ' Read id=[0-9]* offset=0x[0-9a-f]* count=0x[0-9a-f]*' |
        sed 's/.*count=//' | while read -r c; do echo $((c)); done | awk '{ s += $1 } END { print s + 0 }'
}
nbdcopy "nbd+unix:///?socket=$psock" "$T/sparse.raw"
nb=$(read_bytes 1)
((nb > 0 && nb <= 2 << 20)) || fail "nbdcopy read $nb bytes of a 256 MiB VDI with 1.06 MiB of data"
from=$(($(wc -l <"$T/proxy.log") + 1))
qemu-img convert -f raw -O raw "nbd+unix:///?socket=$psock" "$T/sparse2.raw"
nb=$(read_bytes "$from")
((nb > 0 && nb <= 2 << 20)) || fail "qemu-img convert read $nb bytes of a mostly empty VDI"
kill -TERM "$proxy"
wait "$proxy" || true
truncate -s 256M "$T/sparse.want"
qemu-io -f raw -c "write -P 0x66 8M 1M" -c "write -P 0x77 200M 64k" "$T/sparse.want" >/dev/null
cmp "$T/sparse.want" "$T/sparse.raw" || fail "nbdcopy of the sparse VDI differs"
cmp "$T/sparse.want" "$T/sparse2.raw" || fail "qemu-img convert of the sparse VDI differs"
alloc=$(($(stat -c %b "$T/sparse.raw") * 512))
((alloc < 8 << 20)) || fail "nbdcopy output is not sparse ($alloc bytes allocated)"

# ---- flush, FUA, trim, write-zeroes ----------------------------------------------------------------
qio "$(uri disk)" "write -P 0xb1 4M 1M" "flush" "write -f -P 0xb2 5M 64k" "write -f -P 0xb3 6M 4k"
qio "$(uri disk)" "read -P 0xb1 4M 1M" "read -P 0xb2 5M 64k" "read -P 0xb3 6M 4k"
qio "$(uri disk)" "discard 4M 512k" "write -z 5M 64k" "flush"
qio "$(uri disk)" "read -P 0 4M 512k" "read -P 0xb1 4718592 512k" "read -P 0 5M 64k" \
    "read -P 0xb3 6M 4k"
assert_eq "3 hole,zero" "$(map_at "$(uri disk)" $((4 << 20)))" "trimmed range in the map"
assert_eq "3 hole,zero" "$(map_at "$(uri disk)" $(((4 << 20) + 512 * 1024 - 1)))" "end of trimmed range"
assert_eq "0 data" "$(map_at "$(uri disk)" $(((4 << 20) + 512 * 1024)))" "data after the trim"
[[ $(map_at "$(uri disk)" $((5 << 20))) == *zero* ]] || fail "write-zeroes range not reported as zero"
assert_eq "0 data" "$(map_at "$(uri disk)" $((6 << 20)))" "FUA write in the map"
# Unaligned trim and write-zeroes: partial blocks become zeros, the rest stays.
qio "$(uri disk)" "write -P 0xc1 12M 64k" "discard 12587008 1000" "write -z 12591104 100"
qio "$(uri disk)" "read -P 0xc1 12M 4096" "read -P 0 12587008 1000" "read -P 0xc1 12588008 3096" \
    "read -P 0 12591104 100" "read -P 0xc1 12591204 57244" "read -P 0 12648448 4096"
# The snapshot kept what it had.
qio "$(uri disk@1)" "read -P 0 4M 4M" "read -P 0xa1 0 1M"

stop_server
plx check >"$T/check.out" || { cat "$T/check.out" >&2; fail "check after serving"; }

# ---- The server removes its socket when stopped, and starts over one a killed server left -------
# It also lists a snapshot's label as an export, and a new label at once.
n=0
what="serve"
start_server
assert_eq $((64 << 20)) "$(nbdinfo --size "$(uri disk)")" "$what: size of disk"
n=$((n + 1))
plx snap-label disk@1 "label$n"
assert_eq "copy disk disk@1 disk@label$n sparse " "$(list_names)" "$what: exports after relabelling"
assert_eq disk@1 "$(list_desc "disk@label$n")" "$what: description of disk@label$n"
qio "$(uri "disk@label$n")" "read -P 0xa1 0 1M"
# A second server on the same socket path is refused and leaves the running one alone.
if timeout 20 "$PARALLAX" -b "$T/store.img" serve --unix "$sock" >"$T/second.log" 2>&1; then
    fail "$what: a second server on a live socket started"
fi
grep -qi "in use\|listening" "$T/second.log" || { cat "$T/second.log" >&2; fail "$what: second server: no clear error"; }
assert_eq $((64 << 20)) "$(nbdinfo --size "$(uri disk)")" "$what: first server after a second was refused"
stop_server
[[ ! -e $sock ]] || fail "$what left its socket behind after SIGTERM"

start_server
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" || true
[[ -S $sock ]] || fail "$what: no stale socket after SIGKILL (nothing left to test)"
"$PARALLAX" -b "$T/store.img" serve --unix "$sock" >>"$T/serve.log" 2>&1 &
SERVER_PID=$!
bg_pid "$SERVER_PID"
for ((i = 0; i < 100; i++)); do
    nbdinfo --size "$(uri disk)" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 5 "$T/serve.log" >&2; fail "$what did not start over a stale socket"; }
    sleep 0.1
done
assert_eq $((64 << 20)) "$(nbdinfo --size "$(uri disk)")" "$what: size of disk after a restart"
stop_server
[[ ! -e $sock ]] || fail "$what left its socket behind after a restart"

# --placement takes leaf (the default) or arrival; anything else is a usage error (exit 2).
rc=0
"$PARALLAX" -b "$T/store.img" serve --placement sideways --unix "$sock" >"$T/place.log" 2>&1 || rc=$?
assert_eq 2 "$rc" "serve --placement sideways: exit status"
grep -q "arrival or leaf" "$T/place.log" || { cat "$T/place.log" >&2; fail "serve --placement sideways: no clear error"; }
for p in arrival leaf; do
    PLX_SERVE_ARGS="--placement $p" start_server
    qio "$(uri disk)" "write -P 0xb3 1M 64k" "read -P 0xb3 1M 64k"
    stop_server
done
