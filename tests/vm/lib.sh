# shellcheck shell=bash
# Booting the golden image under QEMU: shared by tests/integration/vm_*.sh and bench/clones.sh.
#
#   vm_golden                 build the golden image if needed and print its directory
#                             (build/vm/golden, rebuilt when scripts/golden-image.sh or
#                             tests/vm/guest-init.sh changed); exit 3 = the Debian packages could
#                             be neither downloaded nor found in the cache
#   vm_start LOG DRIVE MODE ID [ARGS]
#                             boot the golden kernel with DRIVE (a QEMU -drive spec, e.g.
#                             "file=nbd+unix:///vm1?socket=S,format=raw") as the virtio root
#                             disk; the guest runs plx.mode=MODE plx.id=ID plus ARGS (more kernel
#                             arguments); serial console to LOG; sets VM_PID
#   vm_wait PID LOG SECONDS   wait for that QEMU to exit (killed after SECONDS); returns 0 when
#                             it exited 0 and the guest printed "plx-guest: done"; LOG's CR LF
#                             line ends become LF
#   vm_wait_line LOG REGEX SECONDS PID
#                             wait until LOG has a line matching REGEX (0), or PID exited or
#                             time ran out (1)
#
# TCG only: KVM aborts on the development machines ("failed to set MSR 0x10a"). The guest
# prints "plx-guest: up" as the first line of user space on the disk and "plx-guest: done MODE"
# before it powers off; panic=-1 with -no-reboot makes a kernel panic end QEMU at once.

_vm_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM_QEMU=${VM_QEMU:-qemu-system-x86_64}
VM_MEM=${VM_MEM:-256}
VM_GOLDEN_DIR=${VM_GOLDEN_DIR:-$_vm_src/build/vm/golden}
VM_PID=""

vm_golden() {
    local stamp want rc=0
    want=$(cat "$_vm_src/scripts/golden-image.sh" "$_vm_src/tests/vm/guest-init.sh" | sha256sum | cut -c1-16)
    mkdir -p "$(dirname "$VM_GOLDEN_DIR")"
    (
        flock 8
        stamp=$(cat "$VM_GOLDEN_DIR/stamp" 2>/dev/null || true)
        if [[ $stamp != "$want" || ! -s $VM_GOLDEN_DIR/root.img ]]; then
            "$_vm_src/scripts/golden-image.sh" "$VM_GOLDEN_DIR" >&2 || exit $?
            echo "$want" >"$VM_GOLDEN_DIR/stamp"
        fi
    ) 8>"$(dirname "$VM_GOLDEN_DIR")/.golden.lock" || rc=$?
    [[ $rc -eq 0 ]] || return $rc
    echo "$VM_GOLDEN_DIR"
}

# no_timer_check: on a busy host the TCG guest's check that the IO-APIC timer ticks can miss its
# window and the kernel panics ("IO-APIC + timer doesn't work!"; vm_clones failed so under
# make check at load 19).
vm_start() {
    local log=$1 drive=$2 mode=$3 id=$4 extra=${5:-}
    "$VM_QEMU" -accel tcg -M pc -m "$VM_MEM" -smp 1 -nodefaults -no-user-config \
        -display none -serial "file:$log" -no-reboot \
        -kernel "$VM_GOLDEN_DIR/vmlinuz" -initrd "$VM_GOLDEN_DIR/initrd.img" \
        -append "console=ttyS0 root=/dev/vda quiet panic=-1 no_timer_check plx.mode=$mode plx.id=$id $extra" \
        -drive "$drive,if=virtio,cache=none" </dev/null >"$log.qemu" 2>&1 &
    # shellcheck disable=SC2034 # read by the caller
    VM_PID=$!
}

vm_wait() {
    local pid=$1 log=$2 secs=$3 i rc=0
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "vm: QEMU $pid still running after ${secs}s; killed" >&2
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        return 1
    fi
    wait "$pid" || rc=$?
    # The serial console ends lines with CR LF.
    if [[ -f $log ]]; then
        tr -d '\r' <"$log" >"$log.tmp" && mv -f "$log.tmp" "$log"
    fi
    if [[ $rc -ne 0 ]]; then
        echo "vm: QEMU exited $rc: $(cat "$log.qemu")" >&2
        return 1
    fi
    grep -q '^plx-guest: done' "$log" || {
        echo "vm: the guest did not finish; its console:" >&2
        tail -20 "$log" >&2
        return 1
    }
}

vm_wait_line() {
    local log=$1 re=$2 secs=$3 pid=$4 i
    for ((i = 0; i < secs * 20; i++)); do
        grep -Eq "$re" <<<"$(tr -d '\r' 2>/dev/null <"$log")" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    grep -Eq "$re" <<<"$(tr -d '\r' 2>/dev/null <"$log")"
}
