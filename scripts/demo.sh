#!/usr/bin/env bash
# A tour of Parallax: format a file blockstore, create a golden VDI, snapshot it, clone two VMs'
# disks from the snapshot, write to one of them, snapshot it, and look at the result.
#
# Uses ./build/parallax (run `make demo`, which builds it first). The blockstore lives in a temp
# dir removed at the end, or in $PARALLAX_DEMO_DIR, which is kept so you can go on exploring.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
PLX="$root/build/parallax"
if [[ ! -x $PLX ]]; then
    echo "demo: $PLX not found; run 'make demo' (or 'make' first)" >&2
    exit 1
fi

if [[ -n ${PARALLAX_DEMO_DIR:-} ]]; then
    mkdir -p "$PARALLAX_DEMO_DIR"
    dir=$(cd "$PARALLAX_DEMO_DIR" && pwd)
    keep=1
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/parallax-demo.XXXXXX")
    keep=0
fi
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "demo: failed (exit $rc)" >&2
    fi
    if [[ $keep -eq 0 ]]; then
        rm -rf "$dir"
    fi
}
trap cleanup EXIT
cd "$dir"

# Every `parallax` below is ./build/parallax on the blockstore named by PARALLAX_BLOCKSTORE.
parallax() { "$PLX" "$@"; }
run() {
    printf '$ %s\n' "$*"
    "$@"
}
say() { printf '\n# %s\n' "$*"; }

export PARALLAX_BLOCKSTORE="$dir/store.img"
echo "# working in $dir"
echo "\$ export PARALLAX_BLOCKSTORE=$PARALLAX_BLOCKSTORE"

say "Format a 4 GiB blockstore (a sparse file) with 64 MiB extents"
force=()
[[ -e $PARALLAX_BLOCKSTORE ]] && force=(--force) # a kept demo dir from an earlier run
run parallax format --size 4G --extent-size 64M ${force[@]+"${force[@]}"}

say "Create a 1 GiB golden image and fill its first 8 MiB"
run parallax vdi-create gold --size 1G
head -c 8M <(yes 'Parallax demo: golden image block. ') >gold.raw
echo "(gold.raw: 8 MiB of a text pattern)"
run parallax vdi-import gold gold.raw

say "Freeze it: snapshot gold, labelled pristine"
run parallax vdi-snapshot gold --label pristine

say "Clone two VM disks from the snapshot; they share all of gold's blocks"
run parallax vdi-create web1 --from gold@pristine
run parallax vdi-create web2 --from gold@pristine

say "web1 diverges: write 1 MiB, snapshot, write 2 MiB more, snapshot again"
head -c 1M <(yes 'web1 was here. ') >web1-a.raw
head -c 2M <(yes 'web1 changed again. ') >web1-b.raw
run parallax vdi-import web1 web1-a.raw
run parallax vdi-snapshot web1 --label configured
run parallax vdi-import web1 web1-b.raw
run parallax vdi-snapshot web1

say "Look around"
run parallax vdi-list
run parallax snap-list gold
run parallax snap-list web1
run parallax vdi-tree
run parallax info

say "web2 still holds exactly gold's data"
run parallax vdi-export web2 web2.img
run cmp -n 8M gold.raw web2.img
echo "(identical)"

say "Check the blockstore's consistency"
run parallax check

if [[ $keep -eq 1 ]]; then
    printf '\n# blockstore kept: export PARALLAX_BLOCKSTORE=%s\n' "$PARALLAX_BLOCKSTORE"
else
    printf '\n# done; removing %s\n' "$dir"
fi
