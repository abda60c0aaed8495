#!/usr/bin/env bash
# The tool explains itself, and docs/cli.md says the same: walking the commands `edl --help`
# lists, each answers `--help` and `-h` with exit 0 before checking its flags (no required flag
# given), shows its usage line, and every flag its --help lists appears in the command's
# section of docs/cli.md; every command documented there exists in this build (edl serve only
# when built with it). And every flag the commands' code reads (examples/cli/*.hpp) is in some
# command's --help: none is accepted undocumented.
#   usage: help.sh EDL DOCS_CLI_MD CLI_SOURCE_DIR WORKDIR
set -euo pipefail
EDL=$1
DOC=$2
SRC=$3
W=$4
rm -rf "$W"
mkdir -p "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$EDL" --help >"$W/main.txt" || fail "edl --help exited with $?"
# Command lines of `edl --help`: two spaces, the name (one or two words), three or more spaces.
sed -nE 's/^  ([a-z][a-z-]*( [a-z][a-z-]*)?)   +.*/\1/p' "$W/main.txt" >"$W/commands.txt"
[ "$(wc -l <"$W/commands.txt")" -ge 20 ] || fail "edl --help lists too few commands: $(cat "$W/main.txt")"
for group in models: tokenizers: training: measuring:; do
  grep -qx "$group" "$W/main.txt" || fail "edl --help has no group $group"
done
if ! "$EDL" --version | grep -q '^serve: no'; then
  grep -qx "serving:" "$W/main.txt" || fail "edl --help has no group serving:"
fi

# The section of docs/cli.md for a command: from its "### `edl CMD`" heading to the next heading.
section() { awk -v h="### \`edl $1\`" '$0 == h { on = 1; next } on && /^#/ { exit } on { print }' "$DOC"; }

: >"$W/all_flags.txt"
while read -r cmd; do
  # shellcheck disable=SC2086
  "$EDL" $cmd --help >"$W/help.txt" 2>"$W/err.txt" || fail "edl $cmd --help exited with $?: $(cat "$W/err.txt")"
  # shellcheck disable=SC2086
  "$EDL" $cmd -h >"$W/h.txt" || fail "edl $cmd -h exited with $?"
  cmp -s "$W/help.txt" "$W/h.txt" || fail "edl $cmd -h differs from --help"
  grep -q "^usage: edl $cmd" "$W/help.txt" || fail "edl $cmd --help has no usage line: $(cat "$W/help.txt")"
  grep -q "^examples:" "$W/help.txt" || fail "edl $cmd --help has no examples"
  section "$cmd" >"$W/section.md"
  [ -s "$W/section.md" ] || fail "docs/cli.md has no section ### \`edl $cmd\`"
  sed -nE 's/^  (--[a-z0-9-]+).*/\1/p' "$W/help.txt" >"$W/flags.txt"
  while read -r flag; do
    echo "$flag" >>"$W/all_flags.txt"
    grep -q "\`$flag[\` ]" "$W/section.md" || fail "docs/cli.md's section of edl $cmd does not list $flag"
  done <"$W/flags.txt"
  # Each flag's meaning ends with its type (and default): "(integer, default 20)".
  [ "$(grep -cE '\((text|integer|number|switch)[,)]' "$W/help.txt")" -ge "$(wc -l <"$W/flags.txt")" ] ||
    fail "edl $cmd --help does not give every flag's type: $(cat "$W/help.txt")"
  # Every flag of the docs' section is one the command takes.
  { grep -oE '^\| `--[a-z0-9-]+' "$W/section.md" || true; } | sed 's/^| `//' | while read -r flag; do
    grep -qx -- "$flag" "$W/flags.txt" || fail "docs/cli.md lists $flag for edl $cmd, which its --help does not"
  done
done <"$W/commands.txt"

# Every command documented exists (serve only where it was built).
grep -oE '^### `edl [a-z -]+`' "$DOC" | sed -E 's/^### `edl (.*)`$/\1/' | while read -r cmd; do
  grep -qx "$cmd" "$W/commands.txt" && continue
  [ "$cmd" = serve ] && "$EDL" --version | grep -q '^serve: no' && continue
  fail "docs/cli.md documents edl $cmd, which edl --help does not list"
done

# Every flag the code reads is listed by some command's --help.
grep -ohE 'args\.(has|str|required|integer|number|all)\("--[a-z0-9-]+"' "$SRC"/*.hpp |
  sed -E 's/.*\("(--[a-z0-9-]+)"/\1/' | sort -u >"$W/read_flags.txt"
[ -s "$W/read_flags.txt" ] || fail "found no flag reads in $SRC"
while read -r flag; do
  grep -qx -- "$flag" "$W/all_flags.txt" || {
    # edl serve's flags are listed only in a build with it.
    "$EDL" --version | grep -q '^serve: no' && grep -q "args\.[a-z]*(\"$flag\"" "$SRC/serve.hpp" && continue
    fail "the code reads $flag, but no command's --help lists it"
  }
done <"$W/read_flags.txt"
echo "help: ok ($(wc -l <"$W/commands.txt") commands, $(sort -u "$W/all_flags.txt" | wc -l) distinct flags)"
