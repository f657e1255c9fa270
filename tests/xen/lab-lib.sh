# shellcheck shell=bash
# Helpers of the Xen lab's cases (tests/xen/cases/*.sh), which run in dom0 as root with bash.
#
# A case exits 0 (pass), 1 (a failure of Parallax, its scripts or the data) or 2 (the toolstack
# crashed: an xl process died by a signal, the rare TCG memory corruption of the notes'
# pitfall 7; the lab runs such a case once more in a fresh boot, never a data failure).
#
# Guests are waited for without polling `xl list` (the pitfall's crashes were mostly `xl list`
# beside guest I/O): `xl create -F` stays in the foreground until its domain dies, and guests'
# progress is read from their console logs, which xenconsoled writes.
#
#   guest_cfg NAME OPS DISK...   write /tmp/NAME.cfg: a 128 MiB PV guest (the kernel alone takes 58 MiB) of the lab's kernel whose
#                                init runs OPS (tests/xen/guest-init.sh), with these xl disks
#   guest_start NAME [OPTION...] xl create -F [OPTION...] in the background
#   guest_wait NAME SECONDS      wait for that xl to end; 0 when the guest said "done OK"
#   wait_console NAME REGEX SECONDS   wait for a console line of the guest (0), else 1
#   last_wrote NAME DEV          the highest chunk the guest said it wrote (and flushed), or -1
#   xlc ARGS...                  run xl; a crash of it ends the case with 2
#   vdi_check VDI SEED START N   the VDI (or VDI@SNAP) holds those chunks, read through
#                                the Parallax server in dom0 (nbd-client, read-only)
#   vdi_prefix VDI SEED START N MIN [MAX]   the VDI holds a clean prefix of the guest's
#                                sequential writes: chunks complete, at most one partly written,
#                                then untouched ones; at least MIN and at most MAX complete
#   migrate_local NAME           `xl migrate NAME localhost`, ended in a failure if it fails
#   guest_wait_any, wait_console_any, wait_domain_gone, no_nbd_left: see below
#   fail MSG                     print the guest consoles (and the storage VM's logs) and MSG,
#                                exit 1
#   dd_run, dd_logs, domid_of    the storage VM: see the end of this file
set -u
export PATH=/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin

CHUNK=65536
declare -A XL_PID=()

ts() { cut -d' ' -f1 /proc/uptime; }
log() { echo "[$(ts)] $*"; }

# The console of every guest of this case, and xl's own output.
show_guests() {
    local f
    for f in /var/log/xen/console/guest-*.log /tmp/*.xl; do
        [ -f "$f" ] || continue
        echo "---- $f"
        tail -n 60 "$f" | tr -d '\r'
    done
    echo "---- hotplug and server logs"
    tail -n 20 /var/log/xen/xen-hotplug.log /var/log/xen/parallax-serve.log 2>/dev/null
    # Last: it asks the storage VM, which may be slow to answer.
    dd_logs
}

fail() {
    show_guests
    echo "FAIL: $*"
    exit 1
}

toolstack_crash() {
    show_guests
    echo "TOOLSTACK: $*"
    exit 2
}

# xl died by a signal (abort, segfault): rc 128+N.
xlc() {
    local rc=0
    xl "$@" || rc=$?
    [ "$rc" -lt 128 ] || toolstack_crash "xl $* died with status $rc"
    return "$rc"
}

guest_cfg() {
    local name=$1 ops=$2 d disks=""
    shift 2
    for d in "$@"; do disks+="${disks:+, }'$d'"; done
    cat >"/tmp/$name.cfg" <<EOF
name = "$name"
type = "pv"
memory = 128
vcpus = 1
kernel = "/plx/guest/vmlinux"
ramdisk = "/plx/guest/initrd"
extra = "console=hvc0 plx.do=$ops"
disk = [ $disks ]
on_crash = "destroy"
EOF
}

guest_start() {
    local name=$1
    shift
    rm -f "/var/log/xen/console/guest-$name.log"
    log "xl create $* $name"
    xl create -F "$@" "/tmp/$name.cfg" >"/tmp/$name.xl" 2>&1 &
    XL_PID[$name]=$!
}

guest_wait() {
    local name=$1 secs=$2 pid=${XL_PID[$1]} rc=0 i
    for ((i = 0; i < secs * 5; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && fail "guest $name still running after ${secs}s"
    wait "$pid" || rc=$?
    [ "$rc" -lt 128 ] || toolstack_crash "xl create -F $name died with status $rc"
    console_has '^plx-guest: done OK' "/var/log/xen/console/guest-$name.log" || {
        [ "$rc" -eq 0 ] || fail "xl create $name failed ($rc): $(tail -n 5 "/tmp/$name.xl")"
        fail "guest $name did not finish cleanly"
    }
    log "guest $name done"
}

# console_has REGEX FILE...: a line matches; the console's CR LF line ends taken as LF, so
# that a REGEX may end in $.
console_has() {
    local re=$1
    shift
    cat "$@" 2>/dev/null | tr -d '\r' | grep -q -E "$re"
}

wait_console() {
    local name=$1 re=$2 secs=$3 i f=/var/log/xen/console/guest-$1.log
    for ((i = 0; i < secs * 5; i++)); do
        console_has "$re" "$f" && return 0
        if [ -n "${XL_PID[$name]:-}" ] && ! kill -0 "${XL_PID[$name]}" 2>/dev/null; then
            console_has "$re" "$f" && return 0
            return 1
        fi
        sleep 0.2
    done
    return 1
}

last_wrote() {
    local n
    n=$(tr -d '\r' <"/var/log/xen/console/guest-$1.log" 2>/dev/null |
        sed -n "s/^plx-guest: wrote $2 \([0-9]*\)$/\1/p" | tail -n 1)
    echo "${n:--1}"
}

chunk() { # SEED I: as tests/xen/guest-init.sh makes it
    printf '%-63s\n' "plx seed=$1 chunk=$2"
    tail -c +65 /plx/pattern
}

# nbd_attach VDI: connect the VDI read-only to dom0's last NBD device (block-parallax takes the
# first free ones), through the server the hotplug script started; prints the device.
NBD_DEV=/dev/nbd31
nbd_attach() {
    [ -S /run/parallax/nbd.sock ] || fail "no Parallax server socket (/run/parallax/nbd.sock)"
    nbd-client -unix /run/parallax/nbd.sock "$NBD_DEV" -name "$1" -block-size 512 -readonly \
        >/dev/null 2>&1 || fail "nbd-client could not attach $1"
}
nbd_detach() { nbd-client -d "$NBD_DEV" >/dev/null 2>&1; }

# vdi_read VDI START N: chunks START..START+N-1 of the VDI into /tmp/got, in one read through
# the server (one process and a long NBD read instead of one per chunk: this is TCG).
vdi_read() {
    nbd_attach "$1"
    dd if=$NBD_DEV of=/tmp/got bs=$CHUNK skip="$2" count="$3" 2>/dev/null
    nbd_detach
    [ "$(stat -c %s /tmp/got)" -eq $(($3 * CHUNK)) ] || fail "$1: short read"
}

# first_diff A B: the offset (from 1) of the first byte where two files of one size differ, or
# nothing when they are equal. (cmp -l: busybox and GNU word their plain output differently.)
first_diff() {
    cmp -l "$1" "$2" 2>/dev/null | head -n 1 | awk '{ print $1 }'
}

vdi_check() {
    local vdi=$1 seed=$2 start=$3 n=$4 i off
    for ((i = start; i < start + n; i++)); do chunk "$seed" "$i"; done >/tmp/want
    vdi_read "$vdi" "$start" "$n"
    if ! cmp -s /tmp/want /tmp/got; then
        off=$(first_diff /tmp/want /tmp/got)
        fail "$vdi: chunk $((start + (${off:-1} - 1) / CHUNK)) is not the guest's (seed $seed)"
    fi
    log "$vdi: chunks $start..$((start + n - 1)) verified"
}

# (Few processes: each costs a lot under TCG.) The complete chunks are the common prefix of
# what the guest wrote and what the VDI holds; the next chunk may be partly written, in 4 KiB
# pieces each the guest's or zero; everything after it must be zero.
vdi_prefix() {
    local vdi=$1 seed=$2 start=$3 n=$4 min=$5 max=${6:-$4} i p off full nz
    for ((i = start; i < start + n; i++)); do chunk "$seed" "$i"; done >/tmp/want
    vdi_read "$vdi" "$start" "$n"
    off=$(first_diff /tmp/want /tmp/got)
    full=$n
    [ -z "$off" ] || full=$(((off - 1) / CHUNK))
    if [ "$full" -lt "$n" ]; then
        for ((p = 0; p < 16; p++)); do
            dd if=/tmp/got of=/tmp/gp bs=4096 skip=$((full * 16 + p)) count=1 2>/dev/null
            dd if=/tmp/want of=/tmp/wp bs=4096 skip=$((full * 16 + p)) count=1 2>/dev/null
            cmp -s /tmp/gp /tmp/wp || [ "$(tr -d '\0' </tmp/gp | wc -c)" -eq 0 ] ||
                fail "$vdi: chunk $((start + full)) piece $p is neither the guest's nor zero"
        done
        nz=$(tail -c +$(((full + 1) * CHUNK + 1)) /tmp/got | tr -d '\0' | wc -c)
        [ "$nz" -eq 0 ] || fail "$vdi is not a prefix of the guest's writes: data after chunk" \
            "$((start + full)), which is not complete"
    fi
    log "$vdi: the first $full of chunks $start..$((start + n - 1)) complete, the rest untouched" \
        "but for partial pieces of the next"
    [ "$full" -ge "$min" ] ||
        fail "$vdi lacks flushed writes: $full complete chunks, the guest had flushed $min"
    [ "$full" -le "$max" ] ||
        fail "$vdi has $full complete chunks: more than the guest can have written before it ($max)"
}

# guest_wait_any NAME SECONDS: wait for the xl of a guest that is not expected to finish its
# work (destroyed): only a crash of xl counts.
guest_wait_any() {
    local name=$1 secs=$2 pid=${XL_PID[$1]} rc=0 i
    for ((i = 0; i < secs * 5; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && fail "xl of $name still running after ${secs}s"
    wait "$pid" || rc=$?
    [ "$rc" -lt 128 ] || toolstack_crash "xl create -F $name died with status $rc"
}

# wait_console_any GLOB REGEX SECONDS: a line in any guest console log named guest-GLOB.log.
wait_console_any() {
    local glob=$1 re=$2 secs=$3 i
    for ((i = 0; i < secs * 5; i++)); do
        # shellcheck disable=SC2086 # the glob is meant
        console_has "$re" /var/log/xen/console/guest-$glob.log && return 0
        sleep 0.2
    done
    return 1
}

# wait_domain_gone NAME SECONDS: no domain of that name in xenstore and no disk backend of it
# left (read from xenstore, not from xl: see the top of this file).
wait_domain_gone() {
    local name=$1 secs=$2 i d found
    for ((i = 0; i < secs * 5; i++)); do
        found=""
        for d in $(xenstore-list /local/domain 2>/dev/null); do
            [ "$(xenstore-read "/local/domain/$d/name" 2>/dev/null)" = "$name" ] && found=$d
            [ "$d" != 0 ] && xenstore-list "/local/domain/0/backend/vbd/$d" >/dev/null 2>&1 &&
                found=$d
        done
        [ -z "$found" ] && return 0
        sleep 0.2
    done
    fail "domain $name (or a disk backend) still there after ${secs}s"
}

# no_nbd_left: every hotplug remove ran: no NBD device is connected any more.
no_nbd_left() {
    local d left=""
    for d in /sys/block/nbd*; do [ -e "$d/pid" ] && left+=" ${d##*/}"; done
    [ -z "$left" ] || fail "NBD devices still connected after the guests ended:$left"
}

# migrate_local NAME: xl reaches the destination host with `ssh HOST xl migrate-receive`; -s
# names the command used instead of ssh, here one that runs the rest of its arguments on this
# host (the destination is this dom0, and the lab has no sshd). The case's file needs the line
# "# xen-lab: shadow" (a Xen with shadow paging: docs/xen-lab.md). xl's output in /tmp/migrate.xl.
migrate_local() {
    local t0
    printf '#!/bin/sh\n# ssh HOST COMMAND... for HOST = this host\nshift\nexec "$@"\n' >/tmp/local-ssh
    chmod 755 /tmp/local-ssh
    t0=$(ts)
    xlc migrate -s /tmp/local-ssh "$1" localhost >/tmp/migrate.xl 2>&1 ||
        fail "xl migrate $1 localhost failed"
    echo "PLX-TIME migrate $(awk -v a="$t0" -v b="$(ts)" 'BEGIN { printf "%.1f", b - a }')"
}

# ---- the storage VM (tests/xen/dd-init.sh; tests/xen/cases/storagevm.sh) ----------------------
#   domid_of NAME                the domain's id, from xenstore (empty when there is none)
#   dd_run CMD [SECONDS]         run CMD (bash, lab-lib.sh loaded) in the storage VM $DD_ID;
#                                its status is dd_run's, its stdout (up to 3000 bytes) in DD_OUT
#   dd_logs                      the storage VM's xl devd, hotplug and server logs (failures)
#   until_up SECONDS CMD...      run CMD until it succeeds (0) or dom0's clock has gone on
#                                SECONDS (1): a time, not a count of tries, which a loaded
#                                machine stretches
DD_ID="" DD_SEQ=0 DD_OUT=""

domid_of() {
    local d
    for d in $(xenstore-list /local/domain 2>/dev/null); do
        [ "$(xenstore-read "/local/domain/$d/name" 2>/dev/null)" = "$1" ] && echo "$d" && return 0
    done
    return 0
}

# dd_send CMD SECONDS: 0 and DD_OUT set when the storage VM answered, else 3.
dd_send() {
    # (One line: xenstore-read would give a newline back as the two characters \n.)
    local cmd=${1//$'\n'/ } secs=$2 i r="" base=/local/domain/$DD_ID/data
    # (A command's number names the process too: a second process sending commands, as
    # dom0-init's report of a case it ended does, never reuses one.)
    DD_SEQ=$((DD_SEQ + 1))
    local seq="$$.$DD_SEQ"
    DD_OUT=""
    xenstore-write -R "$base/plx-cmd" "$seq $cmd" || return 3
    for ((i = 0; i < secs * 5; i++)); do
        r=$(xenstore-read "$base/plx-rc" 2>/dev/null) || r=""
        [ "${r%% *}" = "$seq" ] && break
        sleep 0.2
    done
    [ "${r%% *}" = "$seq" ] || return 3
    # (-R: the output as written, its newlines not escaped.)
    DD_OUT=$(xenstore-read -R "$base/plx-out" 2>/dev/null) || DD_OUT=""
    return "${r#* }"
}

dd_run() {
    local rc=0
    dd_send "$1" "${2:-300}" || rc=$?
    [ "$rc" -ne 3 ] || fail "the storage VM did not answer '$1' within ${2:-300}s"
    return "$rc"
}

until_up() {
    local end
    end=$(awk -v a="$(ts)" -v b="$1" 'BEGIN { printf "%d", a + b }')
    shift
    while :; do
        "$@" && return 0
        [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ] || return 1
        sleep 0.5
    done
}

dd_logs() {
    [ -n "$DD_ID" ] && [ -n "$(xenstore-read "/local/domain/$DD_ID/name" 2>/dev/null)" ] || return 0
    echo "---- the storage VM's logs (xl devd, hotplug, server)"
    if dd_send "ps w | grep -v ' \[' | tail -n 12; tail -n 15 /var/log/xen/xl-devd.log \
        /var/log/xen/xen-hotplug.log /var/log/xen/parallax-serve.log 2>&1 | tail -c 2000" 20 ||
        [ $? -ne 3 ]; then
        echo "$DD_OUT"
    else
        echo "(the storage VM does not answer)"
    fi
}
