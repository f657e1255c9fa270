#!/usr/bin/env bash
# The block-parallax hotplug script (xen-configs/block-parallax), without Xen: every command
# it runs is a stand-in on PATH that logs its arguments and answers like the real one.
# xenstore is a directory tree; sysfs is a directory with nbdN entries (a connected device has
# a pid file, as in /sys/block/nbdN/pid); `parallax serve` is a process listening on the unix
# socket. Checks: add writes the right xenstore keys and values, starts one server and reuses
# it, picks a free device, passes -readonly for access=ro; remove disconnects the device add
# recorded; missing or malformed targets and every failure fail with a clear message, a
# non-zero exit and hotplug-status=error; it also works under a block-common.sh with an ERR
# trap (as Xen's), keeps the lock out of the server, and passes shellcheck.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock setsid python3
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax"
[[ -x $script ]] || fail "$script missing or not executable"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs" "$T/run"
real_stat=$(command -v stat)
python=$(python3 -c 'import sys; print(sys.executable)')

export FAKE_XS="$T/xs" FAKE_CALLS="$T/calls.log"
export PARALLAX_SYSFS="$T/sys"
export PARALLAX_RUNDIR="$T/run"
export PARALLAX_BLOCKSTORE_FILE="$T/blockstore.conf"
export PARALLAX_SERVE_LOG="$T/serve.log"
export PARALLAX_SERVE_WAIT=10
unset PARALLAX_BLOCKSTORE
: >"$FAKE_CALLS"
printf '# this host\n/srv/parallax/store.img\n' >"$PARALLAX_BLOCKSTORE_FILE"

# ---- Stand-ins -----------------------------------------------------------------------------------
xen_fake_xenstore "$bin"
cat >"$bin/nbd-client" <<'EOF'
#!/bin/bash
echo "nbd-client $*" >>"$FAKE_CALLS"
[[ -e /proc/$$/fd/9 ]] && echo "LOCK-FD-LEAKED nbd-client" >>"$FAKE_CALLS"
if [[ $1 == -d ]]; then
    rm -f "$PARALLAX_SYSFS/block/${2##*/}/pid"
    exit 0
fi
[[ $1 == -unix && $# -ge 3 ]] || { echo "nbd-client stand-in: unexpected: $*" >&2; exit 2; }
sock=$2 dev=$3 name=""
shift 3
while [[ $# -gt 0 ]]; do
    case $1 in
    -name | -N) name=$2; shift 2 ;;
    -block-size | -b) shift 2 ;;
    -readonly) shift ;;
    *) echo "nbd-client stand-in: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -S $sock ]] || { echo "Error: Socket failed: Connection refused" >&2; exit 1; }
[[ -n $name ]] || { echo "nbd-client stand-in: no -name" >&2; exit 2; }
if [[ -n ${FAKE_NBD_FAIL:-} ]]; then
    echo "Error: Server error: export '$name' not found" >&2
    exit 1
fi
n=${dev##*/}
[[ -d $PARALLAX_SYSFS/block/$n ]] || { echo "Error: $dev: no such device" >&2; exit 1; }
[[ ! -e $PARALLAX_SYSFS/block/$n/pid ]] || { echo "Error: $dev is in use" >&2; exit 1; }
echo 4242 >"$PARALLAX_SYSFS/block/$n/pid"
EOF
cat >"$bin/parallax" <<EOF
#!/bin/bash
echo "parallax \$*" >>"\$FAKE_CALLS"
[[ -e /proc/\$\$/fd/9 ]] && echo "LOCK-FD-LEAKED parallax" >>"\$FAKE_CALLS"
if [[ \$# -ne 5 || \$1 != -b || \$3 != serve || \$4 != --unix ]]; then
    echo "parallax stand-in: unexpected arguments: \$*" >&2
    exit 2
fi
if [[ -n \${FAKE_SERVE_FAIL:-} ]]; then
    echo "parallax: cannot open blockstore \$2: No such file or directory" >&2
    exit 1
fi
exec "$python" -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
while True:
    time.sleep(3600)' "\$5"
EOF
cat >"$bin/stat" <<EOF
#!/bin/bash
# The hex major:minor of /dev/nbdN (major 43 = 0x2b, minors 32 apart); the real stat otherwise.
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/nbd([0-9]+)\$ ]]; then
    printf '2b:%x\n' \$((BASH_REMATCH[1] * 32))
    exit 0
fi
exec "$real_stat" "\$@"
EOF
cat >"$bin/modprobe" <<'EOF'
#!/bin/bash
echo "modprobe $*" >>"$FAKE_CALLS"
EOF
cat >"$bin/logger" <<'EOF'
#!/bin/bash
echo "logger $*" >>"$FAKE_CALLS.syslog"
EOF
chmod +x "$bin"/*
export PATH="$bin:$PATH"

# ---- Helpers ---------------------------------------------------------------------------------------
kill_server() {
    local pid
    pid=$(cat "$PARALLAX_RUNDIR/serve.pid" 2>/dev/null || true)
    [[ -n $pid ]] && kill "$pid" 2>/dev/null
    rm -f "$PARALLAX_RUNDIR/serve.pid" "$PARALLAX_RUNDIR/nbd.sock"
}
on_exit kill_server

# Fresh sysfs: nbd0 is in use by something else, nbd1..nbd3 are free.
reset_sysfs() {
    rm -rf "$PARALLAX_SYSFS"
    mkdir -p "$PARALLAX_SYSFS"/block/nbd{0,1,2,3}
    echo 999 >"$PARALLAX_SYSFS/block/nbd0/pid"
}
reset_sysfs

# backend DOMID DEVID [TARGET [MODE]]: create a vbd backend directory; prints its path.
backend() {
    local path="backend/vbd/$1/$2"
    rm -rf "${FAKE_XS:?}/$path"
    mkdir -p "$FAKE_XS/$path"
    [[ $# -ge 3 ]] && printf '%s' "$3" >"$FAKE_XS/$path/params"
    printf '%s' "${4:-w}" >"$FAKE_XS/$path/mode"
    echo "$path"
}

xs() {
    cat "$FAKE_XS/$1" 2>/dev/null || echo "<missing $1>"
}

# hook PATH COMMAND [SCRIPT]: run the script as libxl would; rc, stderr in $err.
hook() {
    rc=0
    XENBUS_PATH=$1 XENBUS_TYPE=vbd "${3:-$script}" "$2" >"$T/stdout" 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}

calls_of() {
    grep -c -- "^$1" "$FAKE_CALLS" || true
}

# expect_add_fail PATH MESSAGE-FRAGMENT [NBD-CLIENT-RUNS]: add fails, says why, reports
# hotplug-status=error and connects nothing (nbd-client runs NBD-CLIENT-RUNS times, default 0).
expect_add_fail() {
    local before
    before=$(calls_of "nbd-client -unix")
    hook "$1" add
    [[ $rc -ne 0 ]] || fail "add of $1 ($(xs "$1/params")) succeeded"
    [[ $err == *"$2"* ]] || fail "add of $1: expected '$2' in the message, got: $err"
    assert_eq error "$(xs "$1/hotplug-status")" "hotplug-status after a failed add"
    [[ $(xs "$1/hotplug-error") == *"$2"* ]] || fail "hotplug-error: $(xs "$1/hotplug-error")"
    [[ ! -e $FAKE_XS/$1/physical-device ]] || fail "physical-device written by a failed add"
    assert_eq $((before + ${3:-0})) "$(calls_of "nbd-client -unix")" "nbd-client runs in a failed add"
}

# ---- add: the first disk starts the server and takes the first free device ----------------------
b1=$(backend 5 51712 web1 w)
hook "$b1" add
[[ $rc -eq 0 ]] || fail "add web1 failed ($rc): $err"
assert_eq "2b:20" "$(xs "$b1/physical-device")" "physical-device of /dev/nbd1"
assert_eq "/dev/nbd1" "$(xs "$b1/physical-device-path")" "physical-device-path"
assert_eq "/dev/nbd1" "$(xs "$b1/parallax-nbd-device")" "parallax-nbd-device"
assert_eq connected "$(xs "$b1/hotplug-status")" "hotplug-status"
grep -qx "xenstore-read $b1/params" "$FAKE_CALLS" || fail "params not read from xenstore"
assert_eq 1 "$(calls_of "parallax -b /srv/parallax/store.img serve --unix $T/run/nbd.sock")" \
    "the server's command line"
grep -qx "nbd-client -unix $T/run/nbd.sock /dev/nbd1 -name web1 -block-size 512" "$FAKE_CALLS" ||
    fail "nbd-client command line: $(grep '^nbd-client' "$FAKE_CALLS")"
[[ -e $PARALLAX_SYSFS/block/nbd1/pid ]] || fail "nbd1 not connected"

# The server: the recorded pid is the process listening, in its own session, without the lock.
pid=$(cat "$PARALLAX_RUNDIR/serve.pid")
kill -0 "$pid" || fail "server $pid not running after add"
grep -q socket "/proc/$pid/cmdline" || fail "serve.pid ($pid) is not the server"
[[ -S $PARALLAX_RUNDIR/nbd.sock ]] || fail "no server socket"
read -r -a st <"/proc/$pid/stat"
[[ ${st[5]} -eq $pid ]] || fail "the server is not a session leader (session ${st[5]})"
assert_eq /srv/parallax/store.img "$(cat "$PARALLAX_RUNDIR/serve.blockstore")" "serve.blockstore"
if grep -q LOCK-FD-LEAKED "$FAKE_CALLS"; then
    fail "the hotplug lock leaked: $(grep LOCK-FD-LEAKED "$FAKE_CALLS")"
fi
for fd in /proc/"$pid"/fd/*; do
    [[ $(readlink "$fd") != *hotplug.lock ]] || fail "the server holds the hotplug lock ($fd)"
done

# ---- a second disk, read-only: same server, next free device, -readonly --------------------------
b2=$(backend 6 51728 parallax:web2 r)
hook "$b2" add
[[ $rc -eq 0 ]] || fail "add web2 failed ($rc): $err"
assert_eq "/dev/nbd2" "$(xs "$b2/physical-device-path")" "second device"
assert_eq "2b:40" "$(xs "$b2/physical-device")" "physical-device of /dev/nbd2"
grep -qx "nbd-client -unix $T/run/nbd.sock /dev/nbd2 -name web2 -block-size 512 -readonly" \
    "$FAKE_CALLS" || fail "read-only nbd-client command line: $(grep '^nbd-client' "$FAKE_CALLS")"
assert_eq 1 "$(calls_of "parallax ")" "a second server was started"
assert_eq "$pid" "$(cat "$PARALLAX_RUNDIR/serve.pid")" "server pid changed"

# A snapshot, read-only.
b3=$(backend 7 51712 gold@pristine r)
hook "$b3" add
[[ $rc -eq 0 ]] || fail "add gold@pristine failed ($rc): $err"
grep -q -- "-name gold@pristine -block-size 512 -readonly" "$FAKE_CALLS" ||
    fail "snapshot export name not passed"
assert_eq "/dev/nbd3" "$(xs "$b3/physical-device-path")" "third device"

# ---- remove disconnects the device add recorded, and only that --------------------------------
hook "$b1" remove
[[ $rc -eq 0 ]] || fail "remove web1 failed ($rc): $err"
grep -qx "nbd-client -d /dev/nbd1" "$FAKE_CALLS" || fail "nbd1 not disconnected"
assert_eq 1 "$(calls_of "nbd-client -d")" "remove disconnected more than one device"
[[ ! -e $PARALLAX_SYSFS/block/nbd1/pid ]] || fail "nbd1 still connected"
[[ -e $PARALLAX_SYSFS/block/nbd2/pid ]] || fail "nbd2 disconnected by web1's remove"
[[ ! -e $FAKE_XS/$b1/parallax-nbd-device ]] || fail "parallax-nbd-device not removed"
grep -qx "xenstore-rm $b1/parallax-nbd-device" "$FAKE_CALLS" || fail "no xenstore-rm"
kill -0 "$pid" || fail "remove stopped the server"

# The freed device is taken again by the next add.
b4=$(backend 8 51712 web4 w)
hook "$b4" add
[[ $rc -eq 0 ]] || fail "add web4 failed ($rc): $err"
assert_eq "/dev/nbd1" "$(xs "$b4/physical-device-path")" "freed device reused"

# A second remove, and a remove of a disk never added: nothing to do, success.
hook "$b1" remove
[[ $rc -eq 0 ]] || fail "second remove failed ($rc): $err"
b5=$(backend 9 51712 web5 w)
hook "$b5" remove
[[ $rc -eq 0 ]] || fail "remove of a disk never added failed ($rc): $err"
assert_eq 1 "$(calls_of "nbd-client -d")" "remove without a device ran nbd-client"

# remove refuses to disconnect something that is not an NBD device.
printf '/dev/sda' >"$FAKE_XS/$b5/parallax-nbd-device"
hook "$b5" remove
[[ $rc -ne 0 && $err == *"not an NBD device"* ]] || fail "remove of /dev/sda: rc $rc: $err"

# ---- missing and malformed targets ---------------------------------------------------------------
b=$(backend 10 51712)
expect_add_fail "$b" "No information about the target"
for bad in "parallax:" "a/b" "web 1" "@1" "web1@" "a@b@c" $'web\t1' "../../etc/passwd"; do
    b=$(backend 11 51712 "$bad" w)
    expect_add_fail "$b" "malformed target"
done
b=$(backend 12 51712 web1@pristine w)
expect_add_fail "$b" "access=ro"

# ---- failures along the way ------------------------------------------------------------------------
reset_sysfs
# No blockstore configured.
b=$(backend 13 51712 web1 w)
PARALLAX_BLOCKSTORE_FILE="$T/none.conf" expect_add_fail "$b" "no Parallax blockstore configured"
printf '# nothing\n\n' >"$T/empty.conf"
PARALLAX_BLOCKSTORE_FILE="$T/empty.conf" expect_add_fail "$b" "$T/empty.conf"

# nbd-client fails (e.g. no such VDI).
FAKE_NBD_FAIL=1 expect_add_fail "$b" "could not connect" 1
[[ ! -e $FAKE_XS/$b/parallax-nbd-device ]] || fail "a failed connection was recorded"

# No free device.
for n in 1 2 3; do echo 1 >"$PARALLAX_SYSFS/block/nbd$n/pid"; done
expect_add_fail "$b" "no free NBD device"
reset_sysfs

# A server running for another blockstore.
PARALLAX_BLOCKSTORE=/srv/other.img expect_add_fail "$b" "serves '/srv/parallax/store.img'"

# The server does not start.
kill_server
FAKE_SERVE_FAIL=1 expect_add_fail "$b" "did not start"
grep -q "cannot open blockstore" "$PARALLAX_SERVE_LOG" || fail "server output not in the log"
[[ ! -e $PARALLAX_RUNDIR/serve.pid ]] || fail "pid file of a dead server left behind"

# A stale pid file and socket (the server died): a new server is started.
echo 999999 >"$PARALLAX_RUNDIR/serve.pid"
touch "$PARALLAX_RUNDIR/nbd.sock"
starts=$(calls_of "parallax -b")
b=$(backend 14 51712 web1 w)
hook "$b" add
[[ $rc -eq 0 ]] || fail "add after a dead server failed ($rc): $err"
assert_eq $((starts + 1)) "$(calls_of "parallax -b")" "no new server after a stale pid file"
[[ -S $PARALLAX_RUNDIR/nbd.sock ]] || fail "the stale socket file was not replaced"

# ---- bad invocations -----------------------------------------------------------------------------
hook "$b" frobnicate
[[ $rc -ne 0 ]] || fail "an unknown command succeeded"
rc=0
env -u XENBUS_PATH "$script" add >/dev/null 2>"$T/stderr" || rc=$?
[[ $rc -ne 0 ]] || fail "add without XENBUS_PATH succeeded"
grep -q XENBUS_PATH "$T/stderr" || fail "no XENBUS_PATH: unclear message: $(cat "$T/stderr")"

# ---- under a block-common.sh like Xen's (ERR trap, its own helpers) -------------------------------
# Not Xen's file (it is not part of this project): a stand-in with the same contract, whose
# ERR trap turns any unchecked failing command of the script into a fatal error.
xen="$T/xenscripts"
mkdir -p "$xen"
cp "$script" "$src/xen-configs/parallax-hotplug-common.sh" "$xen/"
cat >"$xen/block-common.sh" <<'EOF'
# shellcheck shell=bash
command=$1
[ "$command" = add ] || [ "$command" = remove ] || exit 1
XENBUS_PATH="${XENBUS_PATH:?}"
log() { echo "xen-log $*" >>"$FAKE_CALLS.syslog"; }
fatal() {
    xenstore-write "$XENBUS_PATH/hotplug-error" "$*" "$XENBUS_PATH/hotplug-status" error
    log err "$@"
    echo "fatal: $*" >&2
    exit 1
}
success() { xenstore_write "$XENBUS_PATH/hotplug-status" connected; }
xenstore_read_default() { xenstore-read "$1" 2>/dev/null || echo "$2"; }
xenstore_write() { xenstore-write "$@" || fatal "Writing $* to xenstore failed."; }
do_or_die() { "$@" || fatal "$* failed"; }
write_dev() {
    local mm
    mm=$(stat -L -c %t:%T "$1")
    xenstore_write "$XENBUS_PATH/physical-device" "$mm"
    xenstore_write "$XENBUS_PATH/physical-device-path" "$1"
    xenstore_write "$XENBUS_PATH/written-by" block-common
    success
}
sigerr() { fatal "$0 failed; error detected."; }
trap sigerr ERR
EOF
kill_server
reset_sysfs
b=$(backend 20 51712 web1 w)
hook "$b" add "$xen/block-parallax"
[[ $rc -eq 0 ]] || fail "add under block-common.sh failed ($rc): $err"
assert_eq block-common "$(xs "$b/written-by")" "block-common.sh's write_dev not used"
assert_eq "/dev/nbd1" "$(xs "$b/physical-device-path")" "device under block-common.sh"
b2=$(backend 21 51712 web2 r)
hook "$b2" add "$xen/block-parallax"
[[ $rc -eq 0 ]] || fail "second add under block-common.sh failed ($rc): $err"
hook "$b" remove "$xen/block-parallax"
[[ $rc -eq 0 ]] || fail "remove under block-common.sh failed ($rc): $err"
hook "$b" remove "$xen/block-parallax"
[[ $rc -eq 0 ]] || fail "second remove under block-common.sh failed ($rc): $err"
b=$(backend 22 51712 "a/b" w)
hook "$b" add "$xen/block-parallax"
[[ $rc -ne 0 && $err == *"malformed target"* ]] || fail "malformed under block-common.sh: $err"
if grep -q "error detected" "$FAKE_CALLS.syslog"; then
    fail "a command failed unchecked under the ERR trap: $(grep "error detected" "$FAKE_CALLS.syslog")"
fi

# ---- shellcheck ----------------------------------------------------------------------------------
if command -v shellcheck >/dev/null 2>&1; then
    shellcheck "$src/xen-configs/block-parallax" "$src/xen-configs/block-parallax-tap" \
        "$src/xen-configs/parallax-hotplug-common.sh" || fail "shellcheck: xen-configs"
    (cd "$src" && shellcheck -x tests/integration/xen_hotplug*.sh tests/integration/xen_migrate_tap.sh) ||
        fail "shellcheck: tests"
else
    echo "note: shellcheck not installed; not run"
fi

echo "xen_hotplug: ok"
