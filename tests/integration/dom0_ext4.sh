#!/usr/bin/env bash
# plx-test: alone-cpu (Bonnie++ and PostMark on ext4 with snapshots: CPU-bound, the longest script)
# The dom0 stack with a real file system: `parallax serve` -> nbdfuse (the VDI as a file) ->
# loop device -> ext4, running a small Bonnie++ and a small PostMark while `parallax
# vdi-snapshot` is taken every half second through the server. Snapshots are crash-consistent:
# each exported snapshot, once its journal is replayed (what mounting it would do), checks clean
# with `fsck.ext4 -n -f`; and the VDI itself checks clean after a normal unmount. make check
# checks the last snapshot taken during the workloads and the one after the sync; make
# check-long a spread of five more (each an export of the 1 GiB VDI and a full fsck).
# plx-test: long-parts
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fsck.ext4 dumpe2fs debugfs mount \
    umount bonnie++ postmark
[[ $(id -u) -eq 0 ]] || skip "needs root (loop devices, mount)"
[[ -c /dev/fuse ]] || skip "no /dev/fuse: FUSE is not usable here"
losetup -f >/dev/null 2>&1 || skip "no free loop device (losetup -f failed)"

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR" "$T/fuse" "$T/fs"
sock=$T/nbd.sock

plx format --size 2G --extent-size 64M >/dev/null
plx vdi-create disk --size 1G >/dev/null

# shellcheck disable=SC2086 # PLX_SERVE_ARGS: extra `serve` options
"$PARALLAX" -b "$T/store.img" serve ${PLX_SERVE_ARGS:-} --unix "$sock" >"$T/serve.log" 2>&1 &
server=$!
bg_pid "$server"
for ((i = 0; i < 100; i++)); do
    [[ -S $sock && -S $PARALLAX_RUN_DIR/serve-$server.sock ]] && break
    sleep 0.1
done
[[ -S $sock ]] || fail "server did not start: $(cat "$T/serve.log")"

# nbdfuse: the VDI as the file fuse/disk. Cleanups run in reverse order of registration.
nbdfuse "$T/fuse/disk" "nbd+unix:///disk?socket=$sock" >"$T/nbdfuse.log" 2>&1 &
fuse_pid=$!
bg_pid "$fuse_pid"
on_exit "fusermount3 -u '$T/fuse' 2>/dev/null"
for ((i = 0; i < 100; i++)); do [[ -f $T/fuse/disk ]] && break; sleep 0.1; done
if [[ ! -f $T/fuse/disk ]]; then
    grep -qi 'fuse' "$T/nbdfuse.log" && skip "FUSE mount failed: $(head -c 300 "$T/nbdfuse.log")"
    fail "nbdfuse did not present the VDI: $(cat "$T/nbdfuse.log")"
fi
loop=$(losetup -f --show "$T/fuse/disk") || skip "losetup could not attach a loop device"
on_exit "losetup -d '$loop' 2>/dev/null"
mkfs.ext4 -q -F "$loop"
mount -o commit=1 "$loop" "$T/fs"
on_exit "umount '$T/fs' 2>/dev/null"

# Snapshots every half second while the workloads run, each through the server.
: >"$T/snaps.txt"
(
    while [[ ! -e $T/stop-snapshots ]]; do
        if out=$(timeout 20 "$PARALLAX" -b "$T/store.img" vdi-snapshot disk 2>&1); then
            echo "$out" >>"$T/snaps.txt"
        else
            echo "FAILED: $out" >>"$T/snaps.txt"
        fi
        sleep 0.5
    done
) &
snapper=$!
bg_pid "$snapper"

start=$SECONDS
# Bonnie++: 256 MiB file, block I/O only (-f); block writes with O_DIRECT (-D), so they reach
# the VDI while it runs (O_DIRECT cannot do the per-character tests).
bonnie++ -d "$T/fs" -s 256 -r 128 -n 0 -f -D -u root -q >"$T/bonnie.csv" 2>"$T/bonnie.err" ||
    fail "bonnie++ failed: $(cat "$T/bonnie.err")"
n_bonnie=$(wc -l <"$T/snaps.txt")
# PostMark: small files through the page cache; commit=1 makes ext4 write them out every second.
mkdir "$T/fs/pm"
printf 'set location %s\nset number 4000\nset transactions 20000\nset size 500 65536\nrun\nquit\n' \
    "$T/fs/pm" | postmark >"$T/postmark.out" 2>&1 || fail "postmark failed: $(cat "$T/postmark.out")"
grep -q 'transactions' "$T/postmark.out" || fail "postmark printed no results"
n_postmark=$(wc -l <"$T/snaps.txt")
echo marker >"$T/fs/pm/marker"
sync
touch "$T/stop-snapshots"
wait "$snapper" || true
echo "workloads: $((SECONDS - start)) s; snapshots: $n_bonnie during Bonnie++," \
    "$((n_postmark - n_bonnie)) during PostMark, $(wc -l <"$T/snaps.txt") in all"
# One more after the sync: it must hold what was synced (content, not only consistency).
synced=$(plx vdi-snapshot disk) || fail "snapshot after sync"

if grep -q FAILED "$T/snaps.txt"; then
    cat "$T/snaps.txt" >&2
    fail "a live snapshot failed"
fi
((n_bonnie >= 3)) || fail "only $n_bonnie snapshots were taken during Bonnie++"
sed -n '1p;$p' "$T/snaps.txt" | tr '\n' ' ' | contains -E '^disk@1 disk@[0-9]+ $' ||
    fail "unexpected snapshot names: $(cat "$T/snaps.txt")"

umount "$T/fs"
losetup -d "$loop"
fusermount3 -u "$T/fuse"
wait "$fuse_pid" || true
kill -TERM "$server"
wait "$server" || true
plx check >"$T/check.out" || { cat "$T/check.out" >&2; fail "check"; }

# fsck_snap SNAP: export it; replay its journal if it needs it (a crash-consistent image of a
# mounted file system usually does); then a read-only full check must find nothing.
fsck_snap() {
    local img=$T/snap.img rc=0
    rm -f "$img"
    plx vdi-export "$1" "$img"
    if dumpe2fs -h "$img" 2>/dev/null | contains needs_recovery; then
        # For the record: the same check without the replay (it can legitimately find the
        # in-place metadata behind the journal, so it is not a criterion).
        fsck.ext4 -n -f "$img" >"$T/fsck-noreplay.out" 2>&1 || rc=$?
        echo "$1: before journal replay, fsck.ext4 -n -f exit $rc"
        rc=0
        e2fsck -E journal_only -p "$img" >"$T/replay.out" 2>&1 || rc=$?
        ((rc <= 1)) || fail "$1: journal replay failed (exit $rc): $(cat "$T/replay.out")"
        echo "$1: journal replayed"
    fi
    rc=0
    fsck.ext4 -n -f "$img" >"$T/fsck.out" 2>&1 || rc=$?
    [[ $rc -eq 0 ]] || { cat "$T/fsck.out" >&2; fail "fsck.ext4 -n -f of $1 exit $rc"; }
    echo "$1: clean ($(tail -n1 "$T/fsck.out"))"
}
# The last snapshot taken during the workloads, and (long parts) a spread of others: early,
# during Bonnie++, at its end, during PostMark and at its end.
spread=""
long_parts && spread="2p;$((n_bonnie / 2))p;${n_bonnie}p;$(((n_bonnie + n_postmark) / 2))p;${n_postmark}p"
picks=$(sed -n "\$p;$spread" "$T/snaps.txt" | awk '!seen[$0]++')
for s in $picks; do
    fsck_snap "$s"
done
fsck_snap "$synced"
debugfs -R "cat /pm/marker" "$T/snap.img" 2>/dev/null | contains '^marker$' ||
    fail "$synced lacks a file synced before it was taken"
fsck_snap disk
