#!/bin/sh
# The layer rule of libparallax, checked against the built objects: docs/DESIGN.md's table
# "Layers: which file holds what" gives every library file its row, and
#   - a file refers only to functions and data defined in files of its own row or a lower one
#     (nm: each object's undefined symbols, found among the other objects' defined ones); inside
#     a row whose cell says "in that order from the top", the files so listed refer only to those
#     listed after them (the others of the row are not ordered; every .c file so listed has a
#     place of its own, in parentheses or not: no two files share one);
#   - no files refer to each other in a circle, through any number of others and in any rows
#     (tsort over every reference between two files: this catches the unordered files of a row);
#   - a header includes only headers of its own row or a lower one;
#   - every .c and .h under libparallax/ has a row, and every file the table names exists.
# The NBD server (server/) has its own order, docs/DESIGN.md's table "The NBD server's files",
# one row per file from the top: a server file refers only to the files of rows below its own,
# every .c under server/ has a row and every file the table names exists; its references join
# the circle check.
# A lower layer reaching an upper one through a callback the upper one registered names no symbol
# of it, so the rule holds for it. The document is the rule: a new file gets its row there.
#
#   tests/layers.sh [OBJDIR]    OBJDIR: where the library's and the server's objects are (default
#                               build/obj), as `make layers` builds them; run from anywhere
# Exit 0 when the rule holds, 1 naming each break.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
objdir=${1:-$root/build/obj}
design=$root/docs/DESIGN.md
work=$(mktemp -d "${TMPDIR:-/tmp}/plx-layers.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$root"

# The table: one line "FILE ROW RANK" per file named in a row's files cell (RANK: its place in
# the row's "in that order from the top" list, 0 when not in one). The row column is a number,
# or empty for the medium below layer 0 (row -1).
awk -F'|' '
    /^## / { in_layers = ($0 ~ /^## Layers/); table = 0; next }
    !in_layers { next }
    /^\| *layer *\| *files/ { table = 1; next }
    table && !/^\|/ { table = 0 }
    !table || /^\|[-: |]*$/ { next }
    {
        row = $2; gsub(/ /, "", row); if (row == "") row = -1
        nseg = split($3, seg, ";")
        for (s = 1; s <= nseg; s++) {
            ordered = seg[s] ~ /in that order from the top/
            rank = 0; rest = seg[s]
            while (match(rest, /`[A-Za-z0-9_.]+\.[ch]`/)) {
                f = substr(rest, RSTART + 1, RLENGTH - 2)
                rest = substr(rest, RSTART + RLENGTH)
                print f, row, ordered && f ~ /\.c$/ ? ++rank : 0
            }
        }
    }' "$design" >"$work/table"
[ -s "$work/table" ] || { echo "layers: no layers table found in $design" >&2; exit 1; }

fail=0
say() { echo "layers: $*"; fail=1; }

# Every library file has exactly one row, and names are unique (the table uses bare names).
find libparallax -name '*.[ch]' | sort >"$work/files"
awk -F/ '{ print $NF }' "$work/files" | sort | uniq -d >"$work/dups"
while read -r f; do say "two library files are named $f: the table cannot tell them apart"; done <"$work/dups"
awk '{ print $1 }' "$work/table" | sort | uniq -d >"$work/dups"
while read -r f; do say "$f has more than one row in docs/DESIGN.md's layers table"; done <"$work/dups"
awk 'FILENAME == ARGV[1] { row[$1] = 1; next }
     { n = split($0, part, "/"); if (!(part[n] in row)) print }' "$work/table" "$work/files" >"$work/norow"
while read -r p; do
    say "$p has no row in docs/DESIGN.md's layers table (\"Layers: which file holds what\"): add it to the row of its layer"
done <"$work/norow"

awk 'FILENAME == ARGV[1] { n = split($0, part, "/"); have[part[n]] = 1; next }
     !($1 in have) { print $1 }' "$work/files" "$work/table" >"$work/stale"
while read -r f; do
    say "$f has a row in docs/DESIGN.md's layers table but no file under libparallax/: remove or rename it there"
done <"$work/stale"

# Symbols: "FILE SYMBOL" for each global symbol an object defines, and for each it leaves
# undefined (one nm for all objects: nm -A names the object on each line).
objs=$(sed -n "s|^\(.*\)\.c\$|$objdir/\1.o|p" "$work/files")
for o in $objs; do
    [ -f "$o" ] || { echo "layers: $o is not built (make layers builds the objects first)" >&2; exit 1; }
done
# shellcheck disable=SC2086 # one word per object
nm -A -g --defined-only $objs | awk 'NF == 3 { sub(/\.o:.*/, ".c", $1); n = split($1, p, "/"); print p[n], $3 }' >"$work/defs"
# shellcheck disable=SC2086
nm -A -u $objs | awk '{ sub(/\.o:.*/, ".c", $1); n = split($1, p, "/"); print p[n], $NF }' >"$work/uses"

# Calls: caller callee symbol, rows and ranks looked up; a break when the callee sits higher.
awk '
    FILENAME == ARGV[1] { row[$1] = $2; rank[$1] = $3; next }
    FILENAME == ARGV[2] { def[$2] = $1; next }
    {
        caller = $1; sym = $2; callee = def[sym]
        if (callee == "" || callee == caller || !(caller in row) || !(callee in row)) next
        print caller, callee >"/dev/stderr"
        rc = row[caller] + 0; re = row[callee] + 0
        if (re > rc)
            printf "%s (row %s) refers to %s of %s (row %s): calls go down only\n",
                caller, name(rc), sym, callee, name(re)
        else if (re == rc && rank[caller] > 0 && rank[callee] > 0 && rank[callee] < rank[caller])
            printf "%s (row %s, %s in its order) refers to %s of %s (%s in the order): a row listed \"in that order from the top\" calls only down its list\n",
                caller, name(rc), ord(rank[caller]), sym, callee, ord(rank[callee])
    }
    function name(r) { return r < 0 ? "below 0" : r }
    function ord(k) { return k == 1 ? "1st" : k == 2 ? "2nd" : k == 3 ? "3rd" : k "th" }
' "$work/table" "$work/defs" "$work/uses" 2>"$work/edges" | sort -u >"$work/calls"
while read -r line; do say "$line"; done <"$work/calls"

# Header includes: a header includes only headers of its row or a lower one.
grep '\.h$' "$work/files" | while read -r p; do
    sed -n 's/^#include "\([^"]*\)".*/\1/p' "$p" | while read -r inc; do echo "${p##*/} $inc"; done
done >"$work/includes"
awk '
    FILENAME == ARGV[1] { row[$1] = $2; next }
    ($1 in row) && ($2 in row) && row[$2] + 0 > row[$1] + 0 {
        printf "header %s (row %s) includes %s (row %s): headers include only their row or lower\n",
            $1, row[$1] < 0 ? "below 0" : row[$1], $2, row[$2] < 0 ? "below 0" : row[$2]
    }
' "$work/table" "$work/includes" >"$work/incbreaks"
while read -r line; do say "$line"; done <"$work/incbreaks"

# The NBD server: "FILE RANK" per file named in the first cell of a row of its table (RANK: the
# row's place from the top for a .c file, 0 for a header).
awk -F'|' '
    /^#+ / { in_srv = ($0 ~ /^#+ The NBD server.s files/); table = 0; next }
    !in_srv { next }
    /^\| *file \(server\/\) *\|/ { table = 1; next }
    table && !/^\|/ { table = 0 }
    !table || /^\|[-: |]*$/ { next }
    {
        row++; rest = $2
        while (match(rest, /`[A-Za-z0-9_.]+\.[ch]`/)) {
            f = substr(rest, RSTART + 1, RLENGTH - 2)
            rest = substr(rest, RSTART + RLENGTH)
            print f, f ~ /\.c$/ ? row : 0
        }
    }' "$design" >"$work/srvtable"
: >"$work/srvedges"
if [ ! -s "$work/srvtable" ]; then
    say "no table \"The NBD server's files\" (| file (server/) | holds |) in $design: the server's files need their order"
else
    find server -maxdepth 1 -name '*.c' | sort >"$work/srvfiles"
    awk 'FILENAME == ARGV[1] { row[$1] = 1; next }
         { n = split($0, part, "/"); if (!(part[n] in row)) print }' "$work/srvtable" "$work/srvfiles" >"$work/norow"
    while read -r p; do
        say "$p has no row in docs/DESIGN.md's table \"The NBD server's files\": add it where it belongs in the order"
    done <"$work/norow"
    awk '{ print $1 }' "$work/srvtable" | while read -r f; do
        [ -f "server/$f" ] || echo "$f"
    done >"$work/stale"
    while read -r f; do
        say "$f has a row in docs/DESIGN.md's table \"The NBD server's files\" but no file under server/: remove or rename it there"
    done <"$work/stale"
    srvobjs=$(sed -n "s|^\(.*\)\.c\$|$objdir/\1.o|p" "$work/srvfiles")
    for o in $srvobjs; do
        [ -f "$o" ] || { echo "layers: $o is not built (make layers builds the objects first)" >&2; exit 1; }
    done
    # shellcheck disable=SC2086 # one word per object
    nm -A -g --defined-only $srvobjs | awk 'NF == 3 { sub(/\.o:.*/, ".c", $1); n = split($1, p, "/"); print p[n], $3 }' >"$work/srvdefs"
    # shellcheck disable=SC2086
    nm -A -u $srvobjs | awk '{ sub(/\.o:.*/, ".c", $1); n = split($1, p, "/"); print p[n], $NF }' >"$work/srvuses"
    awk '
        FILENAME == ARGV[1] { rank[$1] = $2; next }
        FILENAME == ARGV[2] { def[$2] = $1; next }
        {
            caller = $1; sym = $2; callee = def[sym]
            if (callee == "" || callee == caller || !(caller in rank) || !(callee in rank)) next
            print caller, callee >"/dev/stderr"
            if (rank[callee] + 0 < rank[caller] + 0)
                printf "server/%s (row %d of the server'"'"'s files) refers to %s of server/%s (row %d): calls go down the server'"'"'s order only\n",
                    caller, rank[caller], sym, callee, rank[callee]
        }
    ' "$work/srvtable" "$work/srvdefs" "$work/srvuses" 2>"$work/srvedges" | sort -u >"$work/calls"
    while read -r line; do say "$line"; done <"$work/calls"
fi

# Circles: tsort over every reference between two files (the engine's and the server's; the
# server's names are prefixed so that they never meet the engine's) finds any loop, also among
# the files of a row that are not ordered.
{ cat "$work/edges"; awk '{ print "server/" $1, "server/" $2 }' "$work/srvedges"; } | sort -u >"$work/pairs"
if ! tsort "$work/pairs" >/dev/null 2>"$work/loops"; then
    awk '/input contains a loop/ { if (loop != "") print loop; loop = ""; next }
         { sub(/^tsort: /, ""); loop = loop == "" ? $0 : loop " -> " $0 }
         END { if (loop != "") print loop }' "$work/loops" >"$work/circles"
    while read -r line; do
        say "files that call each other in a circle: $line (give them an order; a lower one reaches up only through a callback the upper one registered)"
    done <"$work/circles"
fi

if [ "$fail" -ne 0 ]; then
    echo "layers: the layer rule of docs/DESIGN.md (\"Layers: which file holds what\") is broken (above)"
    exit 1
fi
echo "layers: $(grep -c . "$work/table") files in $(awk '{ print $2 }' "$work/table" | sort -u | wc -l) rows;" \
    "$(wc -l <"$work/edges") references between them ($(sort -u "$work/edges" | wc -l) file pairs)" \
    "and $(wc -l <"$work/includes") header includes go down; the server's $(grep -c '\.c ' "$work/srvtable")" \
    "files: $(wc -l <"$work/srvedges") references ($(sort -u "$work/srvedges" | wc -l) file pairs) go down its order;" \
    "no circle"
