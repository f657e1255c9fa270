#!/usr/bin/env bash
# The command reference stays true to the program: every command `parallax --help` lists has its
# section in docs/parallax.md; every option a command's own --help names is in that section and
# in the man page docs/man/parallax.8; every PARALLAX_* environment variable the C sources read
# is described somewhere under docs/. (A new option or variable without its documentation fails
# here, not in a user's hands.)
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

src=${PLX_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
md=$src/docs/parallax.md man=$src/docs/man/parallax.8
[[ -f $md && -f $man ]] || fail "docs/parallax.md or docs/man/parallax.8 missing under $src"

help=$("$PARALLAX" --help)
cmds=$(sed -n '/^Commands:/,/^$/p' <<<"$help" | awk '/^  [a-z]/ { print $1 }')
[[ $(wc -w <<<"$cmds") -ge 15 ]] || fail "found only these commands in parallax --help: $cmds"
problems=()
n_opts=0
for c in $cmds; do
    if ! grep -qx "## $c" "$md"; then
        problems+=("docs/parallax.md has no section '## $c'")
        continue
    fi
    section=$(awk -v h="## $c" '$0 == h { on = 1; next } /^## / { on = 0 } on' "$md")
    opts=$("$PARALLAX" "$c" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u || true)
    for o in $opts; do
        [[ $o == --help ]] && continue
        n_opts=$((n_opts + 1))
        printf '%s\n' "$section" | contains -F -- "$o" ||
            problems+=("docs/parallax.md, section $c: no $o")
        # The man page writes a dash as \- (or plain).
        contains -F -e "$o" -e "${o//-/\\-}" <"$man" || problems+=("parallax.8: no $o (parallax $c)")
    done
done
((n_opts >= 40)) || fail "found only $n_opts options in the commands' --help"

vars=$(grep -rhoE 'getenv\("PARALLAX_[A-Z_]+"\)' "$src"/libparallax "$src"/server "$src"/host "$src"/tools \
    "$src"/tapdisk "$src"/gc "$src"/lockd | sed 's/getenv("//; s/")//' | sort -u)
[[ $(wc -w <<<"$vars") -ge 10 ]] || fail "found only these variables read by the sources: $vars"
for v in $vars; do
    grep -rqF -- "$v" "$src"/docs || problems+=("no document under docs/ describes $v")
done

if ((${#problems[@]})); then
    printf '%s\n' "${problems[@]}" >&2
    fail "${#problems[@]} gaps between the program and its reference"
fi
echo "docs_reference: ok ($(wc -w <<<"$cmds") commands, $n_opts options, $(wc -w <<<"$vars") variables)"
