#!/usr/bin/env bash
# vdi-list shows which Xen domain each VDI is attached to when a xenstore answers, and no such
# column when none does. No hypervisor runs here, so xenstore-list and xenstore-read are
# stand-ins on PATH serving a small tree from files (the real tools use the Xen libraries).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
require_cmd jq

T=$PLX_TEST_TMP
plx format --size 256M --extent-size 16M >/dev/null
for v in web1 web2 db; do plx vdi-create "$v" --size 16M >/dev/null; done

# Without any xenstore tool: no ATTACHED column, attached_to is null (unknown).
nox=$T/nox
mkdir -p "$nox"
PATH=$nox:/usr/bin:/bin
export PATH
plx vdi-list >"$T/list0"
grep -q ATTACHED "$T/list0" && fail "ATTACHED column without a xenstore"
assert_eq null "$(plx vdi-list --json | jq -c '.[0].attached_to')" "attached_to without xenstore"

# A fake xenstore: each node is a file under $T/xs, each directory a directory.
xs=$T/xs
mkb() { # DOMID DEV KIND PARAMS SCRIPT
    local d=$xs/local/domain/0/backend/$3/$1/$2
    mkdir -p "$d"
    printf '%s' "$4" >"$d/params"
    printf '%s' "$5" >"$d/script"
}
mkdir -p "$xs/local/domain/3" "$xs/local/domain/7"
printf web-vm >"$xs/local/domain/3/name"
printf db-vm >"$xs/local/domain/7/name"
mkb 3 51712 vbd web1 /etc/xen/scripts/block-parallax
mkb 3 51728 vbd /srv/store.img:web2 /etc/xen/scripts/block-parallax
mkb 7 51712 vbd3 parallax:db ""
mkb 7 51728 vbd /dev/sdb /etc/xen/scripts/block # not ours: ignored
bin=$T/bin
mkdir -p "$bin"
cat >"$bin/xenstore-list" <<EOS
#!/bin/sh
[ -d "$xs\$1" ] || exit 1
ls "$xs\$1"
EOS
cat >"$bin/xenstore-read" <<EOS
#!/bin/sh
[ -f "$xs\$1" ] || exit 1
cat "$xs\$1"; echo
EOS
chmod +x "$bin"/*
PATH=$bin:/usr/bin:/bin
plx vdi-list >"$T/list1"
cat "$T/list1"
grep -q ATTACHED "$T/list1" || fail "no ATTACHED column with a xenstore"
grep -E '^[0-9]+ +web1 ' "$T/list1" | contains 'web-vm (3)' || fail "web1 not shown attached to domain 3"
grep -E '^[0-9]+ +web2 ' "$T/list1" | contains 'web-vm (3)' || fail "web2 (BLOCKSTORE:VDI form) not shown"
grep -E '^[0-9]+ +db ' "$T/list1" | contains 'db-vm (7)' || fail "db (tapdisk parallax: form) not shown"
assert_eq '[{"domid":7,"name":"db-vm"}]' \
    "$(plx vdi-list --json | jq -c '.[] | select(.name=="db") | .attached_to')" "db attached_to"
rm -rf "$xs/local/domain/0/backend"
assert_eq '[]' "$(plx vdi-list --json | jq -c '.[] | select(.name=="web1") | .attached_to')" \
    "web1 attached_to once detached"
