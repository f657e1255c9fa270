# shellcheck shell=bash
# Shared helpers for the integration scripts. Source it first:
#
#   . "$(dirname "$0")/lib.sh"
#
# It turns on `set -euo pipefail`. tests/run-integration.sh exports PARALLAX (the command) and
# PLX_TEST_TMP (a fresh directory, also the cwd, removed afterwards). A script run by hand gets
# the same: build/parallax and a temp dir removed at exit.
#
# Exit codes: 0 pass, 1 fail, 77 skip (never counted as a pass).
#
#   fail MSG...                      print "FAIL: MSG" to stderr and exit 1
#   skip MSG...                      print "SKIP: MSG" and exit 77
#   require_cmd CMD...               skip unless every CMD is on PATH
#   plx ARGS...                      $PARALLAX -b $PLX_TEST_TMP/store.img ARGS...
#   expect_fail CODE CMD...          CMD must exit with CODE and its stderr must start
#                                    with "parallax:"; stderr is left in $PLX_LAST_STDERR
#   assert_eq EXPECTED ACTUAL [MSG]  fail unless the two strings are equal
#   contains GREP-ARGS...            true if grep GREP-ARGS matches a line of stdin, which it
#                                    reads to the end: use it, never `CMD | grep -q`, whose
#                                    early exit kills CMD with SIGPIPE when CMD writes after
#                                    the match, and pipefail then fails the check (the CI run
#                                    of 7e9bcd3 failed deb_package so on ldd's output)
#   wait_socket SOCK PID LOG [SECS]  wait up to SECS (default 10) for the unix socket SOCK of the
#                                    server PID; fail with LOG's contents if PID exits first or
#                                    the time runs out
#   bg_pid PID                       kill PID (TERM, then KILL after 5 s) when the script exits
#   on_exit CMD                      run the shell command CMD when the script exits (in
#                                    reverse order of registration, before killing bg pids)
#   hold_open NAME URI FD            a qemu-io client that keeps the NBD export URI open: its
#                                    commands come from fd FD (the fifo $PLX_TEST_TMP/NAME.fifo;
#                                    `echo quit >&FD` ends it), its log is $PLX_TEST_TMP/NAME.log;
#                                    returns once it prompts (fails after 5 s); it is killed when
#                                    the script exits
#   long_parts                       true when the script's long parts run (PLX_TEST_LONG=1:
#                                    make check-long, or a script run by hand); a script with
#                                    such parts says so in its header, `# plx-test: long-parts`
#
# A real iSCSI target (tgtd) on loopback, for the iSCSI backend's tests:
#   tgt_start                        start tgtd on a free port with a free control port (skip
#                                    when tgtd is missing or may not run); sets TGT_PORT, TGT_CTL,
#                                    TGT_IQN (target 1) and TGT_PID; killed when the script exits
#   tgt_add_lun N SIZE [FILE]        LUN N of target 1 on FILE (default $PLX_TEST_TMP/lunN.img,
#                                    created sparse); prints its URL iscsi://127.0.0.1:PORT/IQN/N
#   tgt_add_direct_lun N SIZE        the same, tgtd opening the file O_DIRECT (a throttled tgtd's
#                                    buffered writes would reach the disk from the kernel's
#                                    flusher, outside its group)
#   tgt_throttle BYTES-PER-S         limit tgtd's writes to the disk under $PLX_TEST_TMP (cgroup
#                                    v1 blkio; 0: no limit): a slow shared store. The first call
#                                    makes the group and moves tgtd into it; skips when there is
#                                    no blkio controller or no block device to throttle
#   tgt_adm ARGS...                  tgtadm on this tgtd's control port
#   tgt_drop_connections             close every iSCSI connection from the target's side
#   tgt_restart [PAUSE]              kill -9 tgtd, wait PAUSE seconds (default 0), start it again
#                                    on the same ports with the same LUNs and accounts
#   tgt_restart_only PAUSE NAME...   tgt_restart, but target 1 admits only the initiators NAME...
#                                    (tgt's initiator-name ACL) until tgt_admit_all
#   tgt_admit_all                    target 1 admits every initiator again
#   tgt_chap USER PASSWORD           require CHAP login with USER/PASSWORD on target 1
#
# Xen without Xen, for the hotplug scripts' tests:
#   xen_fake_xenstore BIN            write stand-ins for xenstore-read, -write and -rm into BIN:
#                                    xenstore is the directory tree $FAKE_XS; each call is logged
#                                    to $FAKE_CALLS when that is set
#
# Do not set your own EXIT trap: use on_exit. Note that `fail` inside $(...) or ( ... ) only
# leaves that subshell; with set -e the script still stops, but prefer calling it directly.
set -euo pipefail

contains() {
    local input
    input=$(cat)
    grep -q "$@" <<<"$input"
}

_plx_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${PARALLAX:=$_plx_lib_dir/../../build/parallax}"
export PARALLAX

_plx_own_tmp=""
if [[ -z ${PLX_TEST_TMP:-} ]]; then
    PLX_TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/plx-test.XXXXXX")
    _plx_own_tmp=$PLX_TEST_TMP
fi
export PLX_TEST_TMP

_plx_bg_pids=()
_plx_exit_cmds=()

_plx_cleanup() {
    local rc=$? i pid n
    set +e
    for ((i = ${#_plx_exit_cmds[@]} - 1; i >= 0; i--)); do
        eval "${_plx_exit_cmds[i]}"
    done
    for pid in ${_plx_bg_pids[@]+"${_plx_bg_pids[@]}"}; do
        kill -TERM "$pid" 2>/dev/null || continue
        for ((n = 0; n < 50; n++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ -n $_plx_own_tmp ]]; then
        rm -rf --one-file-system "$_plx_own_tmp"
    fi
    exit "$rc"
}
trap _plx_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

skip() {
    echo "SKIP: $*"
    exit 77
}

require_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || skip "$c not found"
    done
}

plx() {
    "$PARALLAX" -b "$PLX_TEST_TMP/store.img" "$@"
}

PLX_LAST_STDERR=""
expect_fail() {
    [[ $# -ge 2 ]] || fail "usage: expect_fail EXPECTED_EXIT CMD..."
    local want=$1 rc=0 errf
    shift
    errf=$(mktemp "$PLX_TEST_TMP/stderr.XXXXXX")
    "$@" 2>"$errf" || rc=$?
    PLX_LAST_STDERR=$(cat "$errf")
    rm -f "$errf"
    if [[ $rc -ne $want ]]; then
        [[ -n $PLX_LAST_STDERR ]] && printf '%s\n' "$PLX_LAST_STDERR" >&2
        fail "expected exit $want, got $rc: $*"
    fi
    if [[ $PLX_LAST_STDERR != parallax:* ]]; then
        printf 'stderr was: [%s]\n' "$PLX_LAST_STDERR" >&2
        fail "stderr does not start with 'parallax:': $*"
    fi
}

assert_eq() {
    [[ $1 == "$2" ]] || fail "${3:-values differ}: expected [$1], got [$2]"
}

bg_pid() {
    [[ $1 =~ ^[0-9]+$ ]] || fail "bg_pid: not a pid: $1"
    _plx_bg_pids+=("$1")
}

wait_socket() {
    local sock=$1 pid=$2 log=$3 tries=$((${4:-10} * 10)) i
    for ((i = 0; i < tries; i++)); do
        [[ -S $sock ]] && return 0
        kill -0 "$pid" 2>/dev/null || fail "server $pid exited before its socket $sock appeared: $(cat "$log")"
        sleep 0.1
    done
    fail "server $pid: no socket $sock after ${4:-10} s: $(cat "$log")"
}

hold_open() {
    local fifo=$PLX_TEST_TMP/$1.fifo log=$PLX_TEST_TMP/$1.log i
    mkfifo "$fifo"
    qemu-io -f raw "$2" <"$fifo" >"$log" 2>&1 &
    bg_pid $!
    # Opening the fifo for writing lets qemu-io's open of it return; the fd stays with the script.
    eval "exec $3>\"\$fifo\""
    for ((i = 0; i < 50; i++)); do grep -q 'qemu-io>' "$log" && break; sleep 0.1; done
    grep -q 'qemu-io>' "$log" || fail "qemu-io did not open $2: $(cat "$log")"
}

long_parts() {
    [[ ${PLX_TEST_LONG:-1} == 1 ]]
}

on_exit() {
    _plx_exit_cmds+=("$1")
}

# ---- tgtd --------------------------------------------------------------------------------------
TGT_PORT="" TGT_CTL="" TGT_PID="" TGT_IQN="iqn.2026-11.org.parallax.test:t1"
# LUNs and the CHAP account live in files, so that tgt_add_lun works inside $(...) too.

_tgt_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

tgt_adm() {
    tgtadm -C "$TGT_CTL" --lld iscsi "$@"
}

# Start tgtd on TGT_PORT/TGT_CTL; 0 when it answers on both.
_tgt_launch() {
    tgtd -f -C "$TGT_CTL" --iscsi portal="127.0.0.1:$TGT_PORT" >>"$PLX_TEST_TMP/tgtd.log" 2>&1 &
    TGT_PID=$!
    local i
    for ((i = 0; i < 50; i++)); do
        kill -0 "$TGT_PID" 2>/dev/null || return 1
        if tgtadm -C "$TGT_CTL" --op show --mode sys >/dev/null 2>&1 &&
            (exec 3<>"/dev/tcp/127.0.0.1/$TGT_PORT") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# _tgt_configure [INITIATOR-NAME...]: target 1 with its LUNs and account, admitting every
# initiator, or only the named ones.
_tgt_configure() {
    tgt_adm --op new --mode target --tid 1 -T "$TGT_IQN"
    if [[ $# -eq 0 ]]; then
        tgt_adm --op bind --mode target --tid 1 -I ALL
    else
        local name
        for name in "$@"; do
            tgt_adm --op bind --mode target --tid 1 --initiator-name "$name"
        done
    fi
    local n file user pass
    if [[ -e $PLX_TEST_TMP/tgt.luns ]]; then
        local flags
        while read -r n file flags; do
            tgt_adm --op new --mode logicalunit --tid 1 --lun "$n" -b "$file" ${flags:+--bsoflags "$flags"}
        done <"$PLX_TEST_TMP/tgt.luns"
    fi
    if [[ -e $PLX_TEST_TMP/tgt.chap ]]; then
        read -r user pass <"$PLX_TEST_TMP/tgt.chap"
        tgt_adm --op new --mode account --user "$user" --password "$pass"
        tgt_adm --op bind --mode account --tid 1 --user "$user"
    fi
}

tgt_start() {
    require_cmd tgtd tgtadm python3
    [[ $(id -u) -eq 0 ]] || skip "tgtd needs root (its control socket lives in /var/run/tgtd)"
    local try
    for ((try = 0; try < 5; try++)); do
        TGT_PORT=$(_tgt_free_port)
        TGT_CTL=$((20000 + RANDOM % 12000)) # tgtd takes -C up to 32767
        if _tgt_launch; then
            on_exit "tgt_stop"
            _tgt_configure
            return 0
        fi
        kill -9 "$TGT_PID" 2>/dev/null || true
        wait "$TGT_PID" 2>/dev/null || true
    done
    fail "tgtd did not start: $(tail -5 "$PLX_TEST_TMP/tgtd.log")"
}

# tgtd ignores SIGTERM while it has targets: a test target is simply killed.
tgt_stop() {
    [[ -n $TGT_PID ]] || return 0
    kill -9 "$TGT_PID" 2>/dev/null || true
    wait "$TGT_PID" 2>/dev/null || true
    TGT_PID=""
}

tgt_add_lun() {
    local n=$1 size=$2 file=${3:-$PLX_TEST_TMP/lun$1.img}
    [[ -e $file ]] || truncate -s "$size" "$file"
    tgt_adm --op new --mode logicalunit --tid 1 --lun "$n" -b "$file"
    echo "$n $file" >>"$PLX_TEST_TMP/tgt.luns"
    echo "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/$n"
}

tgt_add_direct_lun() {
    local n=$1 size=$2 file=$PLX_TEST_TMP/lun$1.img
    [[ -e $file ]] || truncate -s "$size" "$file"
    tgt_adm --op new --mode logicalunit --tid 1 --lun "$n" -b "$file" --bsoflags direct
    echo "$n $file direct" >>"$PLX_TEST_TMP/tgt.luns"
    echo "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/$n"
}

_TGT_CG="" _TGT_MAJMIN=""
# (tgt_stop runs before the group's rmdir: an exit command registered later runs first, and a
# group with a process in it cannot be removed.)
tgt_throttle() {
    if [[ -z $_TGT_CG ]]; then
        require_cmd lsblk findmnt
        [[ -d /sys/fs/cgroup/blkio ]] || skip "no cgroup v1 blkio controller to slow the store down"
        local dev
        dev=$(findmnt -no SOURCE -T "$PLX_TEST_TMP" | sed 's/[0-9]*$//;s/p$//')
        _TGT_MAJMIN=$(lsblk -dno MAJ:MIN "$dev" 2>/dev/null | tr -d ' ') || true
        [[ $_TGT_MAJMIN =~ ^[0-9]+:[0-9]+$ ]] || skip "no block device under $PLX_TEST_TMP ($dev) to throttle"
        _TGT_CG=/sys/fs/cgroup/blkio/plx-test-$$
        mkdir "$_TGT_CG" || skip "cannot make a blkio cgroup"
        on_exit "tgt_stop; rmdir $_TGT_CG 2>/dev/null || true"
    fi
    echo "$_TGT_MAJMIN $1" >"$_TGT_CG/blkio.throttle.write_bps_device"
    echo "$TGT_PID" >"$_TGT_CG/cgroup.procs"
}

tgt_chap() {
    echo "$1 $2" >"$PLX_TEST_TMP/tgt.chap"
    tgt_adm --op new --mode account --user "$1" --password "$2"
    tgt_adm --op bind --mode account --tid 1 --user "$1"
}

tgt_drop_connections() {
    local sid dropped=0
    for sid in $(tgt_adm --op show --mode conn --tid 1 | awk '/Session:/ {print $2}'); do
        tgt_adm --op delete --mode conn --tid 1 --sid "$sid" --cid 0 && dropped=$((dropped + 1))
    done
    echo "$dropped"
}

tgt_restart() {
    tgt_stop
    sleep "${1:-0}"
    shift $(($# > 0 ? 1 : 0))
    local i
    for ((i = 0; i < 20; i++)); do
        _tgt_launch && { _tgt_configure "$@"; return 0; }
        kill -9 "$TGT_PID" 2>/dev/null || true
        wait "$TGT_PID" 2>/dev/null || true
        sleep 0.5 # the port may linger for a moment
    done
    fail "tgtd did not restart on port $TGT_PORT: $(tail -5 "$PLX_TEST_TMP/tgtd.log")"
}

tgt_restart_only() {
    [[ $# -ge 2 ]] || fail "usage: tgt_restart_only PAUSE INITIATOR-NAME..."
    tgt_restart "$@"
    printf '%s\n' "${@:2}" >"$PLX_TEST_TMP/tgt.only"
}

tgt_admit_all() {
    local name
    tgt_adm --op bind --mode target --tid 1 -I ALL
    if [[ -e $PLX_TEST_TMP/tgt.only ]]; then
        while read -r name; do
            tgt_adm --op unbind --mode target --tid 1 --initiator-name "$name"
        done <"$PLX_TEST_TMP/tgt.only"
        rm -f "$PLX_TEST_TMP/tgt.only"
    fi
}

# ---- Xen stand-ins -----------------------------------------------------------------------------
xen_fake_xenstore() {
    local bin=$1
    cat >"$bin/xenstore-read" <<'EOF'
#!/bin/bash
[[ -n ${FAKE_CALLS:-} ]] && echo "xenstore-read $*" >>"$FAKE_CALLS"
rc=0
for p in "$@"; do
    f="$FAKE_XS/${p#/}"
    if [[ -f $f ]]; then
        cat "$f"
        echo
    else
        echo "couldn't read path $p" >&2
        rc=1
    fi
done
exit $rc
EOF
    cat >"$bin/xenstore-write" <<'EOF'
#!/bin/bash
[[ -n ${FAKE_CALLS:-} ]] && echo "xenstore-write $*" >>"$FAKE_CALLS"
if [[ $# -eq 0 || $(($# % 2)) -ne 0 ]]; then
    echo "usage: xenstore-write key value [key value ...]" >&2
    exit 1
fi
while [[ $# -gt 0 ]]; do
    f="$FAKE_XS/${1#/}"
    mkdir -p "$(dirname "$f")"
    printf '%s' "$2" >"$f"
    shift 2
done
EOF
    cat >"$bin/xenstore-rm" <<'EOF'
#!/bin/bash
[[ -n ${FAKE_CALLS:-} ]] && echo "xenstore-rm $*" >>"$FAKE_CALLS"
for p in "$@"; do rm -rf "${FAKE_XS:?}/${p#/}"; done
EOF
    chmod +x "$bin/xenstore-read" "$bin/xenstore-write" "$bin/xenstore-rm"
}
