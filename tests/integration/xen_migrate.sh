#!/usr/bin/env bash
# `xl migrate` of a guest whose disk is a Parallax VDI, with the hotplug script block-parallax
# run in the order libxl runs it: `add` on the destination host while the guest still runs on
# the source, then `remove` on the source once the guest stopped there. Two hosts are two
# sets of script state (PARALLAX_RUNDIR, PARALLAX_HOST_ID, a fake sysfs) on one blockstore; each
# host's script starts its own `parallax serve`. The kernel side of nbd-client is a stand-in that
# holds an NBD connection (qemu-io reading commands from a FIFO) for as long as the device is
# connected: the guest's disk. The destination's attach succeeds while the source holds the
# VDI, its device answers nothing until the source's remove, and then it reads every byte the
# guest wrote on the source and writes on.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd flock setsid qemu-io nbdinfo
src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
script="$src/xen-configs/block-parallax"

T=$PLX_TEST_TMP
bin="$T/bin"
mkdir -p "$bin" "$T/xs"
real_stat=$(command -v stat)
export FAKE_XS="$T/xs" FAKE_CALLS="$T/calls.log" PARALLAX_BLOCKSTORE_FILE="$T/blockstore.conf"
export PARALLAX_SERVE_WAIT=30 PARALLAX_RUN_DIR="$T/ctl"
unset PARALLAX_BLOCKSTORE
mkdir -p "$PARALLAX_RUN_DIR"
: >"$FAKE_CALLS"
plx format --size 256M >/dev/null
plx vdi-create web1 --size 16M >/dev/null
echo "$T/store.img" >"$PARALLAX_BLOCKSTORE_FILE"

# ---- Stand-ins: xenstore, the kernel side of nbd-client (a held connection), stat -------------
xen_fake_xenstore "$bin"
# nbd-client SOCK /dev/nbdN -name EXPORT ...: connect the "device": a qemu-io session on a FIFO,
# left running; nbd-client -d /dev/nbdN: disconnect it (quit, wait for the session to end).
cat >"$bin/nbd-client" <<'EOS'
#!/bin/bash
echo "$PARALLAX_HOST_ID: nbd-client $*" >>"$FAKE_CALLS"
dir="$PARALLAX_SYSFS/block"
if [[ $1 == -d ]]; then
    dev=${2##*/}
    pid=$(cat "$dir/$dev/qemu-io.pid")
    echo quit >"$dir/$dev/in"
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    rm -f "$dir/$dev/pid" "$dir/$dev/in"
    exit 0
fi
sock=$2 dev=${3##*/} name=""
shift 3
while [[ $# -gt 0 ]]; do
    case $1 in -name) name=$2; shift 2 ;; -block-size) shift 2 ;; -readonly) shift ;; *) exit 2 ;; esac
done
mkfifo "$dir/$dev/in"
setsid qemu-io -f raw "nbd+unix:///$name?socket=$sock" <"$dir/$dev/in" >"$dir/$dev/out" 2>&1 &
echo $! >"$dir/$dev/qemu-io.pid"
exec 9>"$dir/$dev/in"   # keep the FIFO open until the session has read its first command
echo "" >&9
sleep 0.3
kill -0 "$(cat "$dir/$dev/qemu-io.pid")" 2>/dev/null || { cat "$dir/$dev/out" >&2; exit 1; }
# Keep a writer on the FIFO for the device's life: the "guest" writes commands to it.
setsid sleep 100000 >"$dir/$dev/in" &
echo $! >"$dir/$dev/holder.pid"
echo 4242 >"$dir/$dev/pid"
EOS
cat >"$bin/stat" <<EOS
#!/bin/bash
if [[ \$# -eq 4 && \$1 == -L && \$2 == -c && \$3 == %t:%T && \$4 =~ ^/dev/nbd([0-9]+)\$ ]]; then
    printf '2b:%x\n' \$((BASH_REMATCH[1] * 32)); exit 0
fi
exec "$real_stat" "\$@"
EOS
printf '#!/bin/bash\n' >"$bin/logger"
printf '#!/bin/bash\n' >"$bin/modprobe"
ln -s "$PARALLAX" "$bin/parallax"
chmod +x "$bin"/*
export PATH="$bin:$PATH"

# host NAME: the environment of that host's hotplug script and server.
host() {
    export PARALLAX_HOST_ID=$1 PARALLAX_RUNDIR="$T/$1/run" PARALLAX_SYSFS="$T/$1/sys"
    export PARALLAX_SERVE_LOG="$T/$1/serve.log"
    mkdir -p "$PARALLAX_RUNDIR" "$PARALLAX_SYSFS/block/nbd0" "$PARALLAX_SYSFS/block/nbd1"
}
stop_servers() {
    local h pid
    for h in source dest; do
        for f in "$T/$h"/sys/block/*/qemu-io.pid "$T/$h"/sys/block/*/holder.pid; do
            [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null || true
        done
        pid=$(cat "$T/$h/run/serve.pid" 2>/dev/null || true)
        [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
    done
    return 0
}
on_exit stop_servers
hook() { # HOST XENBUS_PATH add|remove
    host "$1"
    rc=0
    XENBUS_PATH=$2 XENBUS_TYPE=vbd "$script" "$3" >/dev/null 2>"$T/stderr" || rc=$?
    err=$(cat "$T/stderr")
}
guest() { echo "$3" >"$T/$1/sys/block/$2/in"; } # HOST DEV COMMAND
out() { cat "$T/$1/sys/block/$2/out"; }
backend() { # DOMID -> xenstore path of the disk's backend
    local path="backend/vbd/$1/51712"
    mkdir -p "$FAKE_XS/$path"
    printf web1 >"$FAKE_XS/$path/params"
    printf w >"$FAKE_XS/$path/mode"
    echo "$path"
}

# 1. The guest runs on the source.
bs=$(backend 3)
hook source "$bs" add
[[ $rc -eq 0 ]] || fail "add on the source: $err $(cat "$T/source/serve.log")"
guest source nbd0 "write -P 0x41 0 64k"
guest source nbd0 "flush"
sleep 0.5
grep -q "wrote 65536/65536" <(out source nbd0) || fail "the guest's write on the source: $(out source nbd0)"

# 2. xl migrate: libxl attaches the disk on the destination first.
bd=$(backend 9)
hook dest "$bd" add
[[ $rc -eq 0 ]] || fail "add on the destination while the source holds the VDI: $err $(cat "$T/dest/serve.log")"
assert_eq connected "$(cat "$FAKE_XS/$bd/hotplug-status")" "destination hotplug-status"
guest dest nbd0 "read -P 0x42 64k 4k"   # the source writes this below; nothing may answer yet
sleep 1
! grep -q "read 4096/4096" <(out dest nbd0) || fail "the destination answered while the source held the VDI"

# 3. The guest still runs on the source while its memory is copied.
guest source nbd0 "write -P 0x42 64k 4k"
guest source nbd0 "flush"
sleep 0.5

# 4. The guest stops on the source; libxl removes the disk there.
hook source "$bs" remove
[[ $rc -eq 0 ]] || fail "remove on the source: $err"
for ((i = 0; i < 100; i++)); do grep -q "read 4096/4096" <(out dest nbd0) && break; sleep 0.05; done
grep -q "read 4096/4096" <(out dest nbd0) || fail "the destination's read never ran: $(out dest nbd0) $(cat "$T/dest/serve.log")"
! grep -qi 'fail\|error' <(out dest nbd0) || fail "the destination read wrong data: $(out dest nbd0)"
# One command at a time from here: qemu-io takes lines that arrive together after a long wait
# as one read of its input.
waitfor() { # HOST DEV TEXT COUNT
    for ((i = 0; i < 100; i++)); do (($(out "$1" "$2" | grep -c "$3") >= $4)) && return 0; sleep 0.05; done
    fail "$1 $2: no [$3] x$4: $(out "$1" "$2") $(cat "$T/$1/serve.log")"
}
guest dest nbd0 "read -P 0x41 0 64k"
waitfor dest nbd0 "read 65536/65536" 1
guest dest nbd0 "write -P 0x43 128k 4k"
waitfor dest nbd0 "wrote 4096/4096" 1
guest dest nbd0 "flush"
sleep 0.3
! grep -qi 'fail\|error' <(out dest nbd0) || fail "destination: $(out dest nbd0)"
grep -q "handed over after" "$T/dest/serve.log" || fail "the destination's server did not log the handover"
hook dest "$bd" remove
[[ $rc -eq 0 ]] || fail "remove on the destination: $err"
stop_servers
sleep 0.5
plx check >/dev/null || fail "check after the migration"
echo ok
