#!/usr/bin/env bash
# Bad iSCSI blockstores get one clear line each and change nothing: a URL without a LUN number,
# a LUN number that is not one, an IQN the portal does not have, an IQN without that LUN, a
# portal nobody listens on, CHAP required but not given, a wrong CHAP password, a LUN smaller
# than its superblock says, `format --size` beyond the LUN. The CHAP password never appears in
# output.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

tgt_start
T=$PLX_TEST_TMP
URL=$(tgt_add_lun 1 64M)
base=iscsi://127.0.0.1:$TGT_PORT
bs() { "$PARALLAX" -b "$1" "${@:2}"; }

# has_error URL WORDS COMMAND...: the command fails (exit 1) and its one-line message says WORDS.
has_error() {
    local url=$1 words=$2
    shift 2
    expect_fail 1 "$PARALLAX" -b "$url" "$@"
    [[ $PLX_LAST_STDERR == *"$words"* ]] || fail "$url: message lacks [$words]: $PLX_LAST_STDERR"
    [[ $PLX_LAST_STDERR != *s3cret* ]] || fail "password shown: $PLX_LAST_STDERR"
    echo "ok: $PLX_LAST_STDERR"
}

has_error "$base/$TGT_IQN" "no LUN number after the target IQN" info
has_error "$base/$TGT_IQN/x1" "LUN 'x1' is not a number" info
has_error "$base/" "no target IQN" format
has_error "$base/iqn.2026-11.org.parallax.test:nosuch/1" "no such target IQN" info
has_error "$base/$TGT_IQN/9" "has no LUN 9" format
free=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
has_error "iscsi://127.0.0.1:$free/$TGT_IQN/1" "is the portal reachable" info
has_error "$URL" "not a Parallax blockstore" info
has_error "$URL" "more than the LUN's" format --size 1G

# A LUN smaller than its superblock says: LUN 2 holds the first 32 MiB of a formatted 64 MiB LUN.
bs "$URL" format --extent-size 1M >/dev/null
bs "$URL" vdi-create web --size 8M >/dev/null
head -c 32M "$T/lun1.img" >"$T/lun2.img"
URL2=$(tgt_add_lun 2 32M "$T/lun2.img")
has_error "$URL2" "is truncated: the blockstore needs 67108864 bytes, the medium has 33554432" info
has_error "$URL2" "is truncated" check

# CHAP: required, not given; given wrong; given right (and never shown).
tgt_chap plx s3cret
has_error "$URL" "the target wants CHAP" info
chap_url() { echo "iscsi://plx%$1@127.0.0.1:$TGT_PORT/$TGT_IQN/1"; }
has_error "$(chap_url wrong)" "wrong CHAP user or password" info
bs "$(chap_url s3cret)" info >"$T/info.out" || fail "info with the right password"
grep -q "^blockstore      iscsi://plx@127.0.0.1:$TGT_PORT/$TGT_IQN/1\$" "$T/info.out" ||
    fail "info shows: $(head -1 "$T/info.out")"
! grep -q s3cret "$T/info.out" || fail "info shows the password"
assert_eq 1 "$(bs "$(chap_url s3cret)" vdi-list --json | jq length)" "the VDI is still there"
# The password can stay out of the URL (and so out of process listings): libiscsi's variable.
LIBISCSI_CHAP_PASSWORD=s3cret bs "iscsi://plx@127.0.0.1:$TGT_PORT/$TGT_IQN/1" info >/dev/null ||
    fail "CHAP password from LIBISCSI_CHAP_PASSWORD"
bs "$(chap_url s3cret)" check | tail -n1
