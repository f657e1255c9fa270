#!/usr/bin/env bash
# `xl migrate` of a guest whose disk is a Parallax VDI served by tapdisk (Xen 4.19+,
# backendtype=tap, script=block-parallax-tap), with the hotplug script run in the order libxl
# runs it: `add` on the destination host while the guest still runs on the source, then
# `remove` on the source once the guest stopped there. Two hosts are two sets of script state
# (PARALLAX_RUNDIR, PARALLAX_HOST_ID) on one blockstore.
#
# tapdisk itself is not built here (blktap needs Xen's headers and its own tree; see
# docs/tapdisk.md for the check run in a real tapdisk). The tap-ctl stand-in starts, per disk,
# build/tapdisk-standin: the real driver (tapdisk/block-parallax.c) on the tapdisk test
# double's event loop, one process per disk as tapdisk is, with the guest's requests arriving
# as lines on a FIFO instead of tapdisk's NBD socket. Checks: the destination's add succeeds
# while the source holds the VDI; its requests are not answered while the source can still
# write; after the source's remove they are answered, in order, with everything the guest wrote
# on the source; a destination whose source never lets go fails its requests with EIO after
# PARALLAX_HANDOVER_WAIT and says why; `parallax check` is clean afterwards.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock setsid
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax-tap"
standin="$src/build/tapdisk-standin"
[[ -x $standin ]] || fail "$standin not built (make build/tapdisk-standin; make integration does)"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs"
export FAKE_XS="$T/xs" PARALLAX_BLOCKSTORE_FILE="$T/blockstore.conf" TAPDISK_STANDIN="$standin"
export PARALLAX_TAP_NBD_DIR="$T/blktap-control" PARALLAX_HANDOVER_WAIT=30
unset PARALLAX_BLOCKSTORE
plx format --size 256M >/dev/null
plx vdi-create web1 --size 16M >/dev/null
echo "$T/store.img" >"$PARALLAX_BLOCKSTORE_FILE"

# ---- Stand-ins: xenstore, tap-ctl ------------------------------------------------------------------
xen_fake_xenstore "$bin"
# tap-ctl create -a parallax:PARAMS [-R]: one tapdisk stand-in process for the disk, its input a
# FIFO kept open by a holder (the guest writes requests to it); list -m M: its pid; pause: a
# no-op here (the stand-in has no NBD clients to quiesce); destroy: close the disk and wait for
# the process to end, as tap-ctl destroy does.
cat >"$bin/tap-ctl" <<'EOS'
#!/bin/bash
dir="$PARALLAX_RUNDIR/tap"
mkdir -p "$dir"
case $1 in
create)
    [[ $2 == -a && $3 == parallax:* ]] || exit 22
    ro=(); [[ ${4:-} == -R ]] && ro=(-R)
    minor=0
    while [[ -e $dir/$minor ]]; do minor=$((minor + 1)); done
    d="$dir/$minor"
    mkdir -p "$d"
    mkfifo "$d/in"
    TDD_VERBOSE=1 setsid "$TAPDISK_STANDIN" "${ro[@]}" "${3#parallax:}" <"$d/in" >"$d/out" 2>"$d/log" &
    echo $! >"$d/pid"
    exec 9>"$d/in"
    setsid sleep 100000 >"$d/in" &
    echo $! >"$d/holder.pid"
    for ((i = 0; i < 100; i++)); do grep -q '^open' "$d/out" && break; sleep 0.05; done
    if ! grep -qx 'open 0' "$d/out"; then
        cat "$d/log" >&2
        kill "$(cat "$d/holder.pid")"
        exit 1
    fi
    echo "/run/blktap-control/tapdisk/tapdisk-$minor"
    ;;
list)
    [[ $2 == -m && -f $dir/$3/pid ]] || exit 1
    echo "pid=$(cat "$dir/$3/pid") minor=$3 state=0 args=parallax:x"
    ;;
pause)
    [[ -f $dir/$5/pid ]]
    ;;
destroy)
    d="$dir/$5"
    [[ -f $d/pid && $(cat "$d/pid") == "$3" ]] || exit 1
    echo quit >"$d/in"
    for ((i = 0; i < 200; i++)); do kill -0 "$3" 2>/dev/null || break; sleep 0.05; done
    kill "$(cat "$d/holder.pid")" 2>/dev/null
    ! kill -0 "$3" 2>/dev/null
    ;;
*)
    exit 22
    ;;
esac
EOS
printf '#!/bin/bash\n' >"$bin/logger"
chmod +x "$bin"/*
export PATH="$bin:$PATH"

# host NAME: the environment of that host's hotplug script and tapdisk.
host() {
    export PARALLAX_HOST_ID=$1 PARALLAX_RUNDIR="$T/$1/run" PARALLAX_RUN_DIR="$T/$1/ctl"
    mkdir -p "$PARALLAX_RUNDIR" "$PARALLAX_RUN_DIR"
}
stop_all() {
    local f
    for f in "$T"/*/run/tap/*/pid "$T"/*/run/tap/*/holder.pid; do
        [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null
    done
    return 0
}
on_exit stop_all
hook() { # HOST XENBUS_PATH add|remove
    host "$1"
    rc=0
    XENBUS_PATH=$2 XENBUS_TYPE=vbd3 "$script" "$3" >/dev/null 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}
tapdir() { echo "$T/$1/run/tap/$(cat "$FAKE_XS/$2/minor")"; } # HOST XENBUS_PATH
guest() { echo "$3" >"$(tapdir "$1" "$2")/in"; }              # HOST XENBUS_PATH REQUEST
out() { cat "$(tapdir "$1" "$2")/out"; }
log() { cat "$(tapdir "$1" "$2")/log"; }
waitfor() { # HOST XENBUS_PATH LINE [SECONDS]
    local i
    for ((i = 0; i < ${4:-5} * 20; i++)); do grep -qx -- "$3" <(out "$1" "$2") && return 0; sleep 0.05; done
    fail "$1: no '$3' from the disk: $(out "$1" "$2") $(log "$1" "$2")"
}
backend() { # DOMID -> xenstore path of the disk's backend
    local path="backend/vbd3/$1/51712"
    mkdir -p "$FAKE_XS/$path"
    printf aio:web1 >"$FAKE_XS/$path/params"
    printf w >"$FAKE_XS/$path/mode"
    echo "$path"
}

# 1. The guest runs on the source.
bs=$(backend 3)
hook source "$bs" add
[[ $rc -eq 0 ]] || fail "add on the source: $err"
assert_eq connected "$(cat "$FAKE_XS/$bs/hotplug-status")" "source hotplug-status"
guest source "$bs" "write 0 128 0x41"
waitfor source "$bs" "wrote 0+128 0"

# 2. xl migrate: libxl attaches the disk on the destination first.
bd=$(backend 9)
hook dest "$bd" add
[[ $rc -eq 0 ]] || fail "add on the destination while the source holds the VDI: $err"
assert_eq connected "$(cat "$FAKE_XS/$bd/hotplug-status")" "destination hotplug-status"
[[ -n $(cat "$FAKE_XS/$bd/physical-device-path") ]] || fail "no physical-device-path"
grep -q "requests are held, waiting for it" <(log dest "$bd") ||
    fail "the destination did not log its wait: $(log dest "$bd")"
guest dest "$bd" "read 128 8 0x42" # the source writes this below; nothing may answer yet
guest dest "$bd" "write 256 8 0x43"
sleep 1
! out dest "$bd" | contains -v '^open' ||
    fail "the destination answered while the source held the VDI: $(out dest "$bd")"

# 3. The guest still runs on the source while its memory is copied.
guest source "$bs" "write 128 8 0x42"
waitfor source "$bs" "wrote 128+8 0"

# 4. The guest stops on the source; libxl removes the disk there.
hook source "$bs" remove
[[ $rc -eq 0 ]] || fail "remove on the source: $err"
waitfor dest "$bd" "read 128+8 0 ok"
waitfor dest "$bd" "wrote 256+8 0"
assert_eq "open 0
read 128+8 0 ok
wrote 256+8 0" "$(out dest "$bd")" "the destination's answers, in order"
grep -q "handed over after" <(log dest "$bd") || fail "no handover log line: $(log dest "$bd")"
guest dest "$bd" "read 0 128 0x41"
waitfor dest "$bd" "read 0+128 0 ok"
# The destination holds the VDI now: admin commands reach its tapdisk.
out=$(PARALLAX_HOST_ID=dest PARALLAX_RUN_DIR="$T/dest/ctl" plx vdi-snapshot web1 --label migrated 2>&1) ||
    fail "vdi-snapshot after the migration: $out"

# 5. A migration whose source never lets go: the destination gives up after
#    PARALLAX_HANDOVER_WAIT, fails the waiting requests with EIO, and says why.
b2=$(backend 12)
PARALLAX_HANDOVER_WAIT=1 hook other "$b2" add
[[ $rc -eq 0 ]] || fail "add on a third host: $err"
guest other "$b2" "read 0 8 0x41"
waitfor other "$b2" "read 0+8 -5" 10
grep -q "gave up waiting for the VDI" <(log other "$b2") ||
    fail "no log line about giving up: $(log other "$b2")"
hook other "$b2" remove
[[ $rc -eq 0 ]] || fail "remove on the third host: $err"

hook dest "$bd" remove
[[ $rc -eq 0 ]] || fail "remove on the destination: $err"
plx check >/dev/null || fail "check after the migration"
info=$(plx snap-list web1 2>&1) || fail "snap-list: $info"
[[ $info == *migrated* ]] || fail "the snapshot taken on the destination is missing: $info"
echo ok
