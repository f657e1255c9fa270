#!/usr/bin/env bash
# The block-parallax-tap hotplug script (Xen 4.19+, backendtype=tap) without Xen or blktap:
# stand-ins for xenstore-read/-write/-rm, tap-ctl and stat log their arguments and answer like
# the real ones. Checks: add strips libxl's "aio:" and opens "parallax:<target>" in tapdisk
# (-R for access=ro), records pid and minor, and writes tapdisk's NBD socket as
# physical-device-path for tapback (vbd3) or physical-device for a blktap2 tapdev (vbd);
# remove destroys that tapdisk; wrong formats, missing or malformed targets and tap-ctl
# failures fail with a clear message and hotplug-status=error.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax-tap"
[[ -x $script ]] || fail "$script missing or not executable"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs"
real_stat=$(command -v stat)

export FAKE_XS="$T/xs" FAKE_CALLS="$T/calls.log"
export PARALLAX_RUNDIR="$T/run"
export PARALLAX_TAP_NBD_DIR="$T/blktap-control"
: >"$FAKE_CALLS"

# ---- Stand-ins -----------------------------------------------------------------------------------
xen_fake_xenstore "$bin"
# tap-ctl: create prints the device of minor $FAKE_TAP_MINOR (default 3) of tapdisk pid 777.
cat >"$bin/tap-ctl" <<'EOF'
#!/bin/bash
echo "tap-ctl $*" >>"$FAKE_CALLS"
[[ -e /proc/$$/fd/9 ]] && echo "LOCK-FD-LEAKED tap-ctl $1" >>"$FAKE_CALLS"
minor=${FAKE_TAP_MINOR:-3}
case $1 in
create)
    if [[ -n ${FAKE_TAP_FAIL:-} ]]; then
        echo "tap-ctl: open failed: -2" >&2
        exit 2
    fi
    echo "${FAKE_TAP_DEVNAME:-/run/blktap-control/tapdisk/tapdisk-$minor}"
    ;;
list)
    [[ $2 == -m ]] || exit 22
    [[ -n ${FAKE_TAP_NOPID:-} ]] || echo "pid=777 minor=$3 state=0 args=parallax:x"
    ;;
pause)
    [[ -z ${FAKE_TAP_FAIL:-}${FAKE_PAUSE_FAIL:-} ]] || exit 2
    ;;
destroy)
    [[ -z ${FAKE_TAP_FAIL:-} ]] || exit 2
    ;;
*)
    exit 22
    ;;
esac
EOF
cat >"$bin/stat" <<EOF
#!/bin/bash
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/xen/blktap-2/tapdev([0-9]+)\$ ]]; then
    printf 'fe:%x\n' "\${BASH_REMATCH[1]}"
    exit 0
fi
exec "$real_stat" "\$@"
EOF
cat >"$bin/logger" <<'EOF'
#!/bin/bash
echo "logger $*" >>"$FAKE_CALLS.syslog"
EOF
chmod +x "$bin"/*
export PATH="$bin:$PATH"

# ---- Helpers ---------------------------------------------------------------------------------------
# backend TYPE DOMID DEVID [PARAMS [MODE]]: a backend directory; prints its path.
backend() {
    local path="backend/$1/$2/$3"
    rm -rf "${FAKE_XS:?}/$path"
    mkdir -p "$FAKE_XS/$path"
    [[ $# -ge 4 ]] && printf '%s' "$4" >"$FAKE_XS/$path/params"
    printf '%s' "${5:-w}" >"$FAKE_XS/$path/mode"
    echo "$path"
}

xs() {
    cat "$FAKE_XS/$1" 2>/dev/null || echo "<missing $1>"
}

# hook PATH COMMAND: run the script as libxl would (XENBUS_TYPE from the path); rc, $err.
hook() {
    local type=${1#backend/}
    rc=0
    XENBUS_PATH=$1 XENBUS_TYPE=${type%%/*} "$script" "$2" >"$T/stdout" 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}

calls_of() {
    grep -c -- "^$1" "$FAKE_CALLS" || true
}

expect_add_fail() {
    hook "$1" add
    [[ $rc -ne 0 ]] || fail "add of $1 ($(xs "$1/params")) succeeded"
    [[ $err == *"$2"* ]] || fail "add of $1: expected '$2' in the message, got: $err"
    assert_eq error "$(xs "$1/hotplug-status")" "hotplug-status after a failed add"
    [[ $(xs "$1/hotplug-error") == *"$2"* ]] || fail "hotplug-error: $(xs "$1/hotplug-error")"
    [[ ! -e $FAKE_XS/$1/physical-device-path ]] || fail "physical-device-path written"
}

# ---- add, tapback (vbd3): libxl's "aio:" replaced by the Parallax driver ------------------------
b=$(backend vbd3 5 51712 aio:web1 w)
hook "$b" add
[[ $rc -eq 0 ]] || fail "add failed ($rc): $err"
grep -qx "tap-ctl create -a parallax:web1" "$FAKE_CALLS" ||
    fail "tap-ctl command line: $(grep '^tap-ctl create' "$FAKE_CALLS")"
grep -qx "tap-ctl list -m 3" "$FAKE_CALLS" || fail "pid not looked up"
assert_eq 777 "$(xs "$b/pid")" "pid"
assert_eq 3 "$(xs "$b/minor")" "minor"
assert_eq "$T/blktap-control/nbd777.3" "$(xs "$b/physical-device-path")" "physical-device-path"
[[ ! -e $FAKE_XS/$b/physical-device ]] || fail "physical-device written for tapback"
assert_eq connected "$(xs "$b/hotplug-status")" "hotplug-status"
if grep -q LOCK-FD-LEAKED "$FAKE_CALLS"; then
    fail "the hotplug lock leaked into tap-ctl create (and so into tapdisk)"
fi

# remove pauses that tapdisk's disk (so that requests in flight finish), then destroys it.
hook "$b" remove
[[ $rc -eq 0 ]] || fail "remove failed ($rc): $err"
assert_eq "tap-ctl pause -p 777 -m 3
tap-ctl destroy -p 777 -m 3" "$(grep -E '^tap-ctl (pause|destroy)' "$FAKE_CALLS")" "remove: pause, then destroy"
# A pause that fails (already paused) still destroys, and says so.
FAKE_PAUSE_FAIL=1 hook "$b" remove
[[ $rc -eq 0 ]] || fail "remove after a failed pause failed ($rc): $err"
assert_eq 2 "$(calls_of "tap-ctl destroy -p 777 -m 3$")" "destroy after a failed pause"
grep -q "pause -p 777 -m 3 failed; destroying anyway" "$FAKE_CALLS.syslog" ||
    fail "failed pause not logged: $(cat "$FAKE_CALLS.syslog")"

# Read-only, a snapshot, an explicit blockstore, and the blktap2 device form for older tapdev
# setups (the kernel's blktap2 devices through blkback).
b=$(backend vbd3 6 51712 aio:gold@pristine r)
hook "$b" add
[[ $rc -eq 0 ]] || fail "read-only add failed ($rc): $err"
grep -qx "tap-ctl create -a parallax:gold@pristine -R" "$FAKE_CALLS" || fail "no -R"
b=$(backend vbd3 7 51712 aio:/srv/parallax/store.img:web1 w)
hook "$b" add
[[ $rc -eq 0 ]] || fail "add with a blockstore failed ($rc): $err"
grep -qx "tap-ctl create -a parallax:/srv/parallax/store.img:web1" "$FAKE_CALLS" ||
    fail "blockstore:vdi not passed through"
b=$(backend vbd3 8 51712 parallax:web1 w)
hook "$b" add
[[ $rc -eq 0 ]] || fail "add with parallax: failed ($rc): $err"
assert_eq 2 "$(calls_of "tap-ctl create -a parallax:web1$")" "parallax: prefix not stripped once"
b=$(backend vbd 9 51712 aio:web1 w)
FAKE_TAP_MINOR=5 FAKE_TAP_DEVNAME=/dev/xen/blktap-2/tapdev5 hook "$b" add
[[ $rc -eq 0 ]] || fail "blktap2 add failed ($rc): $err"
assert_eq "fe:5" "$(xs "$b/physical-device")" "physical-device of tapdev5"
assert_eq "/dev/xen/blktap-2/tapdev5" "$(xs "$b/physical-device-path")" "tapdev path"

# ---- failures ------------------------------------------------------------------------------------
b=$(backend vbd3 10 51712)
expect_add_fail "$b" "No information about the target"
for bad in "aio:" "aio:a/b" "aio:web 1" "aio:@1" "aio:web1@" "aio::web1"; do
    b=$(backend vbd3 11 51712 "$bad" w)
    expect_add_fail "$b" "malformed target"
done
b=$(backend vbd3 12 51712 vhd:/srv/web1.vhd w)
expect_add_fail "$b" "format=raw"
b=$(backend vbd3 13 51712 aio:web1@pristine w)
expect_add_fail "$b" "access=ro"
b=$(backend vbd3 14 51712 aio:web1 w)
FAKE_TAP_FAIL=1 expect_add_fail "$b" "could not open parallax:web1"
FAKE_TAP_DEVNAME=garbage expect_add_fail "$b" "no minor"
FAKE_TAP_NOPID=1 expect_add_fail "$b" "gave no pid"

# remove: nothing recorded is fine; a failing destroy is an error; bad records are refused.
b=$(backend vbd3 15 51712 aio:web1 w)
hook "$b" remove
[[ $rc -eq 0 ]] || fail "remove with nothing recorded failed ($rc): $err"
printf 777 >"$FAKE_XS/$b/pid"
printf 4 >"$FAKE_XS/$b/minor"
FAKE_TAP_FAIL=1 hook "$b" remove
[[ $rc -ne 0 && $err == *"tap-ctl destroy -p 777 -m 4 failed"* ]] || fail "failed destroy: $err"
printf 'x;y' >"$FAKE_XS/$b/pid"
hook "$b" remove
[[ $rc -ne 0 && $err == *"bad tapdisk pid"* ]] || fail "bad pid accepted: $err"

echo "xen_hotplug_tap: ok"
