#!/usr/bin/env bash
# block-parallax (xen-configs/) with the real `parallax serve`: the hotplug script starts the
# real server (the built-in NBD server) on its unix socket, and the nbd-client
# stand-in, instead of handing the export to the kernel (no nbd module, no Xen here), asks
# the server for it with nbdinfo. So this checks that the script's server command line and
# export names work with the real server: the VDI and a snapshot are exported at the right
# size, a missing VDI makes add fail, and the server keeps no hotplug lock.
# With PLX_HOTPLUG_ISCSI=1 (xen_hotplug_serve_iscsi.sh) the blockstore in
# /etc/parallax/blockstore is an iSCSI LUN of a tgtd on loopback instead of a file.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock setsid nbdinfo
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax"
[[ -x $PARALLAX ]] || skip "$PARALLAX not built"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs" "$T/run"
real_stat=$(command -v stat)

export FAKE_XS="$T/xs" FAKE_CALLS="$T/calls.log"
export PARALLAX_SYSFS="$T/sys"
export PARALLAX_RUNDIR="$T/run"
export PARALLAX_BLOCKSTORE_FILE="$T/blockstore.conf"
export PARALLAX_SERVE_LOG="$T/serve.log"
export PARALLAX_SERVE_WAIT=30
unset PARALLAX_BLOCKSTORE
: >"$FAKE_CALLS"

blockstore=$T/store.img
if [[ ${PLX_HOTPLUG_ISCSI:-0} == 1 ]]; then
    tgt_start
    blockstore=$(tgt_add_lun 1 64M)
fi
plx() { "$PARALLAX" -b "$blockstore" "$@"; }
plx format --size 64M --extent-size 1M >/dev/null
plx vdi-create web1 --size 16M >/dev/null
plx vdi-snapshot web1 --label pristine >/dev/null
plx vdi-create web2 --size 8M >/dev/null
echo "$blockstore" >"$PARALLAX_BLOCKSTORE_FILE"

# ---- Stand-ins: xenstore, the kernel side of nbd-client, stat, logger ---------------------------
xen_fake_xenstore "$bin"
cat >"$bin/nbd-client" <<'EOF'
#!/bin/bash
echo "nbd-client $*" >>"$FAKE_CALLS"
if [[ $1 == -d ]]; then
    rm -f "$PARALLAX_SYSFS/block/${2##*/}/pid"
    exit 0
fi
sock=$2 dev=$3 name="" ro=false
shift 3
while [[ $# -gt 0 ]]; do
    case $1 in
    -name) name=$2; shift 2 ;;
    -block-size) shift 2 ;;
    -readonly) ro=true; shift ;;
    *) exit 2 ;;
    esac
done
json=$(nbdinfo --json "nbd+unix:///$name?socket=$sock") || exit 1
size=$(sed -n 's/.*"export-size": *\([0-9]*\).*/\1/p' <<<"$json" | head -1)
echo "export $name size $size readonly-wanted $ro" >>"$FAKE_CALLS"
echo 4242 >"$PARALLAX_SYSFS/block/${dev##*/}/pid"
EOF
cat >"$bin/stat" <<EOF
#!/bin/bash
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/nbd([0-9]+)\$ ]]; then
    printf '2b:%x\n' \$((BASH_REMATCH[1] * 32))
    exit 0
fi
exec "$real_stat" "\$@"
EOF
cat >"$bin/logger" <<'EOF'
#!/bin/bash
EOF
cat >"$bin/modprobe" <<'EOF'
#!/bin/bash
EOF
ln -s "$PARALLAX" "$bin/parallax"
chmod +x "$bin"/*
export PATH="$bin:$PATH"
mkdir -p "$PARALLAX_SYSFS"/block/nbd{0,1,2,3}

stop_server() {
    local pid
    pid=$(cat "$PARALLAX_RUNDIR/serve.pid" 2>/dev/null || true)
    [[ -n $pid ]] || return 0
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
}
on_exit stop_server

backend() {
    local path="backend/vbd/$1/$2"
    mkdir -p "$FAKE_XS/$path"
    printf '%s' "$3" >"$FAKE_XS/$path/params"
    printf '%s' "$4" >"$FAKE_XS/$path/mode"
    echo "$path"
}

hook() {
    rc=0
    XENBUS_PATH=$1 XENBUS_TYPE=vbd "$script" "$2" >/dev/null 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}

# ---- The VDI, read-write: the real server is started and exports it ------------------------------
b1=$(backend 5 51712 web1 w)
hook "$b1" add
if [[ $rc -ne 0 ]]; then
    cat "$PARALLAX_SERVE_LOG" >&2 || true
    fail "add web1 failed ($rc): $err"
fi
grep -qx "export web1 size 16777216 readonly-wanted false" "$FAKE_CALLS" ||
    fail "web1 not exported as expected: $(grep '^export' "$FAKE_CALLS")"
assert_eq /dev/nbd0 "$(cat "$FAKE_XS/$b1/physical-device-path")" "device"
assert_eq connected "$(cat "$FAKE_XS/$b1/hotplug-status")" "hotplug-status"
pid=$(cat "$PARALLAX_RUNDIR/serve.pid")
tr '\0' ' ' <"/proc/$pid/cmdline" | contains ' serve ' ||
    fail "serve.pid ($pid) is not \`parallax serve\`: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
for fd in /proc/"$pid"/fd/*; do
    [[ $(readlink "$fd") != *hotplug.lock ]] || fail "the server holds the hotplug lock ($fd)"
done

# ---- A snapshot, read-only, and a second VDI: same server ---------------------------------------
b2=$(backend 6 51712 web1@pristine r)
hook "$b2" add
[[ $rc -eq 0 ]] || fail "add web1@pristine failed ($rc): $err"
grep -qx "export web1@pristine size 16777216 readonly-wanted true" "$FAKE_CALLS" ||
    fail "snapshot not exported: $(grep '^export' "$FAKE_CALLS")"
b3=$(backend 7 51712 web2 w)
hook "$b3" add
[[ $rc -eq 0 ]] || fail "add web2 failed ($rc): $err"
grep -qx "export web2 size 8388608 readonly-wanted false" "$FAKE_CALLS" || fail "web2 not exported"
assert_eq "$pid" "$(cat "$PARALLAX_RUNDIR/serve.pid")" "a second server was started"

# ---- A VDI that does not exist: add fails, nothing recorded --------------------------------------
b4=$(backend 8 51712 nosuch w)
hook "$b4" add
[[ $rc -ne 0 && $err == *"could not connect"* ]] || fail "add of a missing VDI: rc $rc: $err"
assert_eq error "$(cat "$FAKE_XS/$b4/hotplug-status")" "hotplug-status"
[[ ! -e $FAKE_XS/$b4/parallax-nbd-device ]] || fail "a failed add recorded a device"

# ---- remove -----------------------------------------------------------------------------------------
hook "$b1" remove
[[ $rc -eq 0 ]] || fail "remove failed ($rc): $err"
grep -qx "nbd-client -d /dev/nbd0" "$FAKE_CALLS" || fail "nbd0 not disconnected"
kill -0 "$pid" || fail "the server stopped"
assert_eq "$blockstore" "$(cat "$PARALLAX_RUNDIR/serve.blockstore")" "the server's blockstore"

echo "xen_hotplug_serve: ok ($blockstore)"
