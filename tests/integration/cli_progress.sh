#!/usr/bin/env bash
# The progress line of vdi-import, vdi-export, check and gc: drawn on stderr when stderr is a
# terminal (here a pseudo-terminal from script(1)), never when stderr is a pipe or a file, and
# not with --quiet. The commands' results stay the same either way.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd script head cmp
T=$PLX_TEST_TMP
store="$T/store.img"

plx format --size 256M --extent-size 4M >/dev/null
plx vdi-create disk --size 64M >/dev/null
head -c $((24 << 20)) /dev/urandom >"$T/in.raw"
plx vdi-snapshot disk >/dev/null

# Run "parallax ARGS" on a pseudo-terminal; what the terminal showed goes to $T/tty.out.
on_tty() {
    local cmd
    printf -v cmd '%q ' "$PARALLAX" -b "$store" "$@"
    script -qefc "$cmd" /dev/null >"$T/tty.out" </dev/null ||
        fail "parallax $* failed on a terminal: $(tr '\r' '\n' <"$T/tty.out" | tail -3)"
}
# The lines the terminal showed, with the progress redraws (\r) split into lines of their own.
tty_lines() { tr '\r' '\n' <"$T/tty.out" | sed 's/\x1b\[K//g'; }

# ---- on a terminal: a progress line ---------------------------------------------------------
on_tty vdi-import disk "$T/in.raw"
tty_lines | contains -E '^vdi-import: [0-9.]+ [KMG]iB of 24\.0 MiB \([0-9]+%\)' ||
    fail "vdi-import on a terminal drew no progress line: $(tty_lines | head -5)"
tty_lines | contains -E '^vdi-import: 24\.0 MiB of 24\.0 MiB \(100%\)' || fail "vdi-import never reached 100%"

on_tty vdi-export disk "$T/out.raw"
tty_lines | contains -E '^vdi-export: 64\.0 MiB of 64\.0 MiB \(100%\)' ||
    fail "vdi-export on a terminal drew no final progress line: $(tty_lines | head -5)"
cmp -n $((24 << 20)) "$T/in.raw" "$T/out.raw" || fail "exported image differs"

on_tty check
tty_lines | contains -E '^check: (reading bitmaps|reading snapshot logs|walking trees)' ||
    fail "check on a terminal drew no progress line: $(tty_lines | head -5)"
tty_lines | contains '^check: 0 errors' || fail "check's summary missing on a terminal"

on_tty gc --dry-run
tty_lines | contains -E '^gc: (checkpoint|marking|sweeping)' ||
    fail "gc on a terminal drew no progress line: $(tty_lines | head -5)"
tty_lines | contains '^gc: would free' || fail "gc's summary missing on a terminal"

# ---- --quiet on a terminal: none ---------------------------------------------------------------
on_tty vdi-import --quiet disk "$T/in.raw"
[[ ! -s $T/tty.out ]] || fail "vdi-import --quiet wrote to the terminal: $(tty_lines | head -3)"
on_tty vdi-export disk "$T/out2.raw" --quiet
[[ ! -s $T/tty.out ]] || fail "vdi-export --quiet wrote to the terminal: $(tty_lines | head -3)"
on_tty check --quiet
! tty_lines | contains -E '^check: (reading|walking|counting)' || fail "check --quiet drew progress"
on_tty gc --dry-run --quiet
! tty_lines | contains -E '^gc: (checkpoint|marking|sweeping)' || fail "gc --quiet drew progress"

# ---- stderr a pipe or a file: none, on any command ---------------------------------------------
plx vdi-import disk "$T/in.raw" 2>"$T/err" | cat
[[ ! -s $T/err ]] || fail "vdi-import wrote to a non-terminal stderr: $(head -c 200 "$T/err")"
plx vdi-export disk "$T/out3.raw" 2>&1 | cat >"$T/piped"
[[ ! -s $T/piped ]] || fail "vdi-export wrote to a pipe: $(head -c 200 "$T/piped")"
out=$(plx check 2>&1)
assert_eq "check: 0 errors, 0 leaked blocks, 2 trees, 1 snapshots" "$out" "check output on a pipe"
out=$(plx gc --dry-run 2>&1 | grep -c . || true)
assert_eq 2 "$out" "gc --dry-run lines on a pipe"
echo "cli_progress: progress on a terminal, none with --quiet or without a terminal"
