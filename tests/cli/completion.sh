#!/usr/bin/env bash
# `edl completion bash` gives a script that bash accepts: sourced, `complete -p edl` names its
# function, and that function offers the commands, a command's flags and a flag's allowed values.
#   usage: completion.sh EDL
set -euo pipefail
EDL=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

script=$("$EDL" completion bash)
# shellcheck disable=SC1090
source <(printf '%s\n' "$script")
complete -p edl | grep -q -- '-F _edl' || fail "complete -p edl: $(complete -p edl)"

# offers WORD... : the completions of the current COMP_WORDS include every WORD.
offers() {
  COMPREPLY=()
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  _edl || fail "_edl failed on ${COMP_WORDS[*]}"
  for w in "$@"; do
    [[ " ${COMPREPLY[*]} " == *" $w "* ]] || fail "completing '${COMP_WORDS[*]}' offers '${COMPREPLY[*]}', not $w"
  done
}
COMP_WORDS=(edl gen) && offers generate
COMP_WORDS=(edl "") && offers train bench logits info --help --version
COMP_WORDS=(edl bench de) && offers decode
COMP_WORDS=(edl generate --max-new) && offers --max-new-tokens
COMP_WORDS=(edl generate --model m --t) && offers --temperature --top-k --top-p --threads
COMP_WORDS=(edl bench decode --rep) && offers --repetitions
COMP_WORDS=(edl generate --cache "") && offers standard int8 paged
COMP_WORDS=(edl quantize --method q) && offers q8_0 q4_0
# A flag of one command is not offered for another.
COMP_WORDS=(edl tokenize --max-new) && COMP_CWORD=2 && { _edl || true; }
[ ${#COMPREPLY[@]} -eq 0 ] || fail "edl tokenize offers ${COMPREPLY[*]}"
echo "completion: ok"
