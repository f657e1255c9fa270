#!/usr/bin/env bash
# The hotplug scripts inside a storage driver domain (docs/storage-vm.md), without Xen. There,
# `xl devd` runs block-parallax with XENBUS_PATH=backend/vbd/<guest>/<devid>, a path xenstore
# resolves under the driver domain's own /local/domain/<domid>, and the domain may write only
# below that. The xenstore stand-ins here do the same: relative paths resolve under
# /local/domain/$XS_DOMID, and a write or removal outside it is refused (Permission denied), as
# xenstored refuses it to an unprivileged domain. The toolstack's part (dom0 writing the backend
# directory into the driver domain's tree for a disk with backend=) is done by the test.
#
# Checks, with the real `parallax serve` on a file blockstore: add, run as xl devd would (empty
# environment, cwd /), connects the VDI and writes physical-device, physical-device-path and
# hotplug-status under the driver domain's backend path, touches nothing outside it; a second
# guest's disk and a snapshot go through the same server; remove disconnects. The blockstore as
# an iSCSI URI with a password reaches `parallax -b` intact (a wrapper maps it to the file
# blockstore: the iSCSI backend is not needed to test the script), is kept in a file only root
# can read, and is shown with the password hidden in hotplug-error and syslog. block-parallax-tap
# also writes only below its own backend path. The example configs agree: the storage domain
# has driver_domain=1 and every disk with backend= names it and has target= last.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock setsid nbdinfo
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax"
tapscript="$src/xen-configs/block-parallax-tap"
[[ -x $script && -x $tapscript ]] || fail "hotplug scripts missing or not executable"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs" "$T/run"
real_stat=$(command -v stat)
real_parallax=$PARALLAX
DD=3 # the storage driver domain's domid

export FAKE_XS="$T/xs" FAKE_CALLS="$T/calls.log"
: >"$FAKE_CALLS"

plx format --size 64M --extent-size 1M >/dev/null
plx vdi-create web3 --size 16M >/dev/null
plx vdi-snapshot web3 --label pristine >/dev/null
plx vdi-create web4 --size 8M >/dev/null

# ---- Stand-ins ---------------------------------------------------------------------------------
# xenstore: FAKE_XS/<absolute path>; the caller is domain XS_DOMID (0 = dom0, may write anywhere).
cat >"$bin/xs-path" <<'EOF'
#!/bin/bash
# xs-path PATH: the absolute xenstore path of PATH as seen by domain $XS_DOMID.
case $1 in
/*) echo "$1" ;;
*) echo "/local/domain/${XS_DOMID:?}/$1" ;;
esac
EOF
cat >"$bin/xs-may-write" <<'EOF'
#!/bin/bash
# xs-may-write ABSPATH: may domain $XS_DOMID write there?
[[ ${XS_DOMID:?} == 0 || $1 == /local/domain/$XS_DOMID/* ]]
EOF
cat >"$bin/xenstore-read" <<'EOF'
#!/bin/bash
rc=0
for p in "$@"; do
    a=$(xs-path "$p")
    echo "read $a" >>"$FAKE_CALLS"
    if [[ -f $FAKE_XS$a ]]; then cat "$FAKE_XS$a"; echo; else echo "couldn't read path $p" >&2; rc=1; fi
done
exit $rc
EOF
cat >"$bin/xenstore-write" <<'EOF'
#!/bin/bash
if [[ $# -eq 0 || $(($# % 2)) -ne 0 ]]; then
    echo "usage: xenstore-write key value [key value ...]" >&2
    exit 1
fi
while [[ $# -gt 0 ]]; do
    a=$(xs-path "$1")
    if ! xs-may-write "$a"; then
        echo "DENIED write $a (domain $XS_DOMID)" >>"$FAKE_CALLS"
        echo "could not write path $1: Permission denied" >&2
        exit 1
    fi
    echo "write $a" >>"$FAKE_CALLS"
    mkdir -p "$(dirname "$FAKE_XS$a")"
    printf '%s' "$2" >"$FAKE_XS$a"
    shift 2
done
EOF
cat >"$bin/xenstore-rm" <<'EOF'
#!/bin/bash
for p in "$@"; do
    a=$(xs-path "$p")
    if ! xs-may-write "$a"; then
        echo "DENIED rm $a (domain $XS_DOMID)" >>"$FAKE_CALLS"
        echo "could not remove path $p: Permission denied" >&2
        exit 1
    fi
    echo "rm $a" >>"$FAKE_CALLS"
    rm -rf "${FAKE_XS:?}$a"
done
EOF
# nbd-client: instead of handing the export to the kernel, ask the server for it.
cat >"$bin/nbd-client" <<'EOF'
#!/bin/bash
echo "nbd-client $*" >>"$FAKE_CALLS"
if [[ $1 == -d ]]; then
    rm -f "$PARALLAX_SYSFS/block/${2##*/}/pid"
    exit 0
fi
sock=$2 dev=$3 name=""
shift 3
while [[ $# -gt 0 ]]; do
    case $1 in
    -name) name=$2; shift 2 ;;
    -block-size) shift 2 ;;
    -readonly) shift ;;
    *) exit 2 ;;
    esac
done
json=$(nbdinfo --json "nbd+unix:///$name?socket=$sock") || exit 1
size=$(sed -n 's/.*"export-size": *\([0-9]*\).*/\1/p' <<<"$json" | head -1)
echo "export $name size $size" >>"$FAKE_CALLS"
echo 4242 >"$PARALLAX_SYSFS/block/${dev##*/}/pid"
EOF
# parallax: the real one; an iscsi:// blockstore is recorded and mapped to the file blockstore.
cat >"$bin/parallax" <<EOF
#!/bin/bash
echo "parallax \$*" >>"\$FAKE_CALLS"
if [[ \$1 == -b && \$2 == iscsi://* ]]; then
    shift 2
    exec "$real_parallax" -b "$T/store.img" "\$@"
fi
exec "$real_parallax" "\$@"
EOF
cat >"$bin/stat" <<EOF
#!/bin/bash
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/nbd([0-9]+)\$ ]]; then
    printf '2b:%x\n' \$((BASH_REMATCH[1] * 32))
    exit 0
fi
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/xen/blktap-2/tapdev([0-9]+)\$ ]]; then
    printf 'fe:%x\n' "\${BASH_REMATCH[1]}"
    exit 0
fi
exec "$real_stat" "\$@"
EOF
cat >"$bin/tap-ctl" <<'EOF'
#!/bin/bash
echo "tap-ctl $*" >>"$FAKE_CALLS"
case $1 in
create) echo /run/blktap-control/tapdisk/tapdisk-2 ;;
list) echo "pid=888 minor=$3 state=0 args=parallax:x" ;;
destroy) ;;
*) exit 22 ;;
esac
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

# The stand-in's permission check is live: the driver domain cannot write into dom0's tree.
if PATH="$bin:$PATH" XS_DOMID=$DD xenstore-write /local/domain/0/backend/x 1 2>/dev/null; then
    fail "the xenstore stand-in let domain $DD write into dom0's tree"
fi
PATH="$bin:$PATH" XS_DOMID=$DD xenstore-write backend/probe 1 || fail "own tree not writable"
[[ -f $FAKE_XS/local/domain/$DD/backend/probe ]] || fail "relative path not under the domain"
rm -f "$FAKE_XS/local/domain/$DD/backend/probe"
: >"$FAKE_CALLS"

# ---- The toolstack's part (dom0) and xl devd's (the driver domain) ------------------------------
# toolstack_add GUEST DEVID TARGET MODE [TYPE SCRIPT]: what libxl in dom0 writes for a disk with
# backend=<driver domain>: the backend directory in the driver domain's tree, the frontend in
# the guest's. Prints the XENBUS_PATH xl devd gives the script.
toolstack_add() {
    local g=$1 d=$2 target=$3 mode=$4 type=${5:-vbd} sname=${6:-block-parallax}
    local be=/local/domain/$DD/backend/$type/$g/$d fe=/local/domain/$g/device/$type/$d
    rm -rf "${FAKE_XS:?}$be" "${FAKE_XS:?}$fe"
    XS_DOMID=0 FAKE_CALLS=/dev/null PATH="$bin:$PATH" xenstore-write "$be/params" "$target" "$be/mode" "$mode" \
        "$be/script" "/etc/xen/scripts/$sname" "$be/frontend" "$fe" "$be/frontend-id" "$g" \
        "$be/online" 1 "$be/state" 1 "$be/type" phy "$be/dev" xvda \
        "$fe/backend" "$be" "$fe/backend-id" "$DD" "$fe/state" 1 >/dev/null
    echo "backend/$type/$g/$d"
}

# devd PATH COMMAND [SCRIPT]: run the hotplug script as xl devd in the driver domain does:
# libxl's environment only (script, XENBUS_TYPE, XENBUS_PATH, XENBUS_BASE_PATH) plus the
# stand-ins' and the test's variables, cwd /. Sets rc and err.
devd() {
    local p=$1 s=${3:-$script} type=${1#backend/}
    type=${type%%/*}
    rc=0
    (cd / && env -i PATH="$bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/ \
        script="/etc/xen/scripts/${s##*/}" XENBUS_TYPE="$type" XENBUS_PATH="$p" \
        XENBUS_BASE_PATH=backend XS_DOMID=$DD FAKE_XS="$FAKE_XS" FAKE_CALLS="$FAKE_CALLS" \
        PARALLAX_SYSFS="$T/sys" PARALLAX_RUNDIR="$T/run" PARALLAX_SERVE_LOG="$T/serve.log" \
        PARALLAX_SERVE_WAIT=30 PARALLAX_BLOCKSTORE_FILE="$T/blockstore.conf" \
        PARALLAX_RUN_DIR="$T/run" PARALLAX_TAP_NBD_DIR="$T/blktap-control" \
        "$s" "$2") >"$T/stdout" 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}

dd_xs() { cat "$FAKE_XS/local/domain/$DD/$1" 2>/dev/null || echo "<missing $1>"; }
no_stray_writes() {
    if grep -q '^DENIED' "$FAKE_CALLS"; then
        fail "a write outside the driver domain's tree: $(grep '^DENIED' "$FAKE_CALLS")"
    fi
    local stray
    stray=$(grep -E '^(write|rm) ' "$FAKE_CALLS" | grep -v " /local/domain/$DD/backend/" || true)
    [[ -z $stray ]] || fail "writes outside the driver domain's backend tree: $stray"
}
kill_server() {
    local pid i
    pid=$(cat "$T/run/serve.pid" 2>/dev/null || true)
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$T/run/serve.pid" "$T/run/nbd.sock"
}
on_exit kill_server
mkdir -p "$T/sys/block/nbd0" "$T/sys/block/nbd1" "$T/sys/block/nbd2"

# ---- A file blockstore: two guests' disks and a snapshot ---------------------------------------
echo "$T/store.img" >"$T/blockstore.conf"
p1=$(toolstack_add 5 51712 web3 w)
: >"$FAKE_CALLS"
devd "$p1" add
[[ $rc -eq 0 ]] || { cat "$T/serve.log" >&2 2>/dev/null; fail "add web3 in the driver domain failed ($rc): $err"; }
assert_eq "2b:0" "$(dd_xs "$p1/physical-device")" "physical-device in the driver domain's tree"
assert_eq /dev/nbd0 "$(dd_xs "$p1/physical-device-path")" "physical-device-path"
assert_eq connected "$(dd_xs "$p1/hotplug-status")" "hotplug-status"
grep -qx "read /local/domain/$DD/$p1/params" "$FAKE_CALLS" || fail "params not read from the driver domain's tree"
grep -qx "export web3 size 16777216" "$FAKE_CALLS" || fail "web3 not served: $(grep '^export' "$FAKE_CALLS")"
[[ ! -e $FAKE_XS/backend && ! -e $FAKE_XS/local/domain/0/backend ]] || fail "wrote under dom0's or the root's backend"
no_stray_writes

p2=$(toolstack_add 6 51712 web3@pristine r)
p3=$(toolstack_add 6 51728 web4 w)
: >"$FAKE_CALLS"
devd "$p2" add
[[ $rc -eq 0 ]] || fail "add web3@pristine failed ($rc): $err"
devd "$p3" add
[[ $rc -eq 0 ]] || fail "add web4 failed ($rc): $err"
assert_eq /dev/nbd1 "$(dd_xs "$p2/physical-device-path")" "snapshot's device"
assert_eq /dev/nbd2 "$(dd_xs "$p3/physical-device-path")" "web4's device"
grep -qx "export web3@pristine size 16777216" "$FAKE_CALLS" || fail "snapshot not served"
assert_eq 0 "$(grep -c '^parallax ' "$FAKE_CALLS" || true)" "a second server was started"
no_stray_writes

: >"$FAKE_CALLS"
devd "$p1" remove
[[ $rc -eq 0 ]] || fail "remove failed ($rc): $err"
grep -qx "nbd-client -d /dev/nbd0" "$FAKE_CALLS" || fail "nbd0 not disconnected"
[[ ! -e $FAKE_XS/local/domain/$DD/$p1/parallax-nbd-device ]] || fail "record not removed"
no_stray_writes
devd "$p2" remove
devd "$p3" remove
kill_server

# ---- The blockstore as an iSCSI URI with a password ---------------------------------------------
uri='iscsi://plx%s3cret@192.0.2.10:3260/iqn.2026-11.org.example:plx/1'
shown='iscsi://plx%***@192.0.2.10:3260/iqn.2026-11.org.example:plx/1'
printf '# the LUN, reached from inside the storage domain\n%s\n' "$uri" >"$T/blockstore.conf"
: >"$FAKE_CALLS"
: >"$FAKE_CALLS.syslog"
p1=$(toolstack_add 7 51712 web3 w)
devd "$p1" add
[[ $rc -eq 0 ]] || { cat "$T/serve.log" >&2 2>/dev/null; fail "add with an iSCSI blockstore failed ($rc): $err"; }
grep -qxF "parallax -b $uri serve --unix $T/run/nbd.sock" "$FAKE_CALLS" ||
    fail "the URI did not reach parallax intact: $(grep '^parallax' "$FAKE_CALLS")"
grep -qx "export web3 size 16777216" "$FAKE_CALLS" || fail "web3 not served"
assert_eq 600 "$("$real_stat" -c %a "$T/run/serve.blockstore")" "mode of the file recording the URI"
# The domain's blockstore changes under the running server: the error names both, no password.
printf '%s\n' "${uri/plx\/1/plx\/2}" >"$T/blockstore.conf"
p2=$(toolstack_add 8 51712 web4 w)
devd "$p2" add
[[ $rc -ne 0 ]] || fail "add with a changed blockstore succeeded"
assert_eq error "$(dd_xs "$p2/hotplug-status")" "hotplug-status"
he=$(dd_xs "$p2/hotplug-error")
[[ $he == *"'$shown'"* && $he == *"'${shown/plx\/1/plx\/2}'"* ]] || fail "hotplug-error: $he"
for f in "$FAKE_XS" "$FAKE_CALLS.syslog" "$T/stderr"; do
    if grep -rqF s3cret "$f"; then fail "the password leaked into $f: $(grep -rF s3cret "$f")"; fi
done
no_stray_writes
devd "$p1" remove
kill_server

# ---- block-parallax-tap in the driver domain ------------------------------------------------------
: >"$FAKE_CALLS"
p=$(toolstack_add 9 51712 aio:web3 w vbd3 block-parallax-tap)
devd "$p" add "$tapscript"
[[ $rc -eq 0 ]] || fail "tap add in the driver domain failed ($rc): $err"
assert_eq "$T/blktap-control/nbd888.2" "$(dd_xs "$p/physical-device-path")" "tapdisk's socket"
assert_eq 888 "$(dd_xs "$p/pid")" "tapdisk pid"
no_stray_writes
devd "$p" remove "$tapscript"
[[ $rc -eq 0 ]] || fail "tap remove failed ($rc): $err"
grep -qx "tap-ctl destroy -p 888 -m 2" "$FAKE_CALLS" || fail "no tap-ctl destroy"

# ---- The example configs agree with each other ----------------------------------------------------
cfg="$src/xen-configs/storage-dd.cfg"
[[ -f $cfg ]] || fail "$cfg missing"
grep -Eq '^driver_domain *= *1\b' "$cfg" || fail "storage-dd.cfg: no driver_domain = 1"
ddname=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$cfg")
[[ -n $ddname ]] || fail "storage-dd.cfg: no name"
n=0
while IFS= read -r spec; do
    [[ $spec == *"backend=$ddname,"* ]] || fail "disk '$spec' names another backend than $ddname"
    [[ $spec == *,target=* && ${spec##*,target=} != *=* ]] || fail "disk '$spec': target= must come last"
    n=$((n + 1))
done < <(grep -ho "'[^']*backend=[^']*'" "$src"/xen-configs/*.cfg | tr -d "'")
((n >= 2)) || fail "no guest disk specs with backend= in xen-configs/ (found $n)"

if command -v shellcheck >/dev/null 2>&1; then
    (cd "$src" && shellcheck -x tests/integration/xen_hotplug_driver_domain.sh) || fail "shellcheck"
fi
echo "xen_hotplug_driver_domain: ok"
