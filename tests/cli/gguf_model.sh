#!/usr/bin/env bash
# A .gguf file as --model: edl convert writes one, then edl loss and edl generate read it
# directly (models::from_pretrained takes the file); an f32 file gives the folder's loss and
# greedy tokens exactly, a q8_0 file a loss within 0.01; --dtype f16 on an f16 file's weights
# the same greedy tokens, --dtype on a quantized file a usage error.
#   usage: gguf_model.sh EDL DATA WORKDIR
set -euo pipefail
EDL=$1
D=$2/tiny_hf
W=$3
rm -rf "$W"
mkdir -p "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }
"$EDL" convert --model "$D" --out "$W/f32.gguf" --type f32 >/dev/null
"$EDL" convert --model "$D" --out "$W/q8_0.gguf" --type q8_0 >/dev/null
loss() { "$EDL" loss --model "$1" --tokens "$D/oracle/tokens.npy" | grep -o '"loss":[^,]*' | cut -d: -f2; }
[ "$(loss "$D")" = "$(loss "$W/f32.gguf")" ] || fail "the f32 file's loss differs from the folder's"
awk -v a="$(loss "$D")" -v b="$(loss "$W/q8_0.gguf")" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.01) }' ||
  fail "the q8_0 file's loss is far from the folder's"
a=$("$EDL" generate --model "$D" --prompt-tokens 1,2,3 --max-new-tokens 8)
b=$("$EDL" generate --model "$W/f32.gguf" --prompt-tokens 1,2,3 --max-new-tokens 8)
[ "$a" = "$b" ] || fail "greedy tokens differ: $a vs $b"
# --dtype f16 on the weights of an f16 file (exact in f32 and in f16): the same greedy tokens.
"$EDL" convert --model "$D" --out "$W/f16.gguf" --type f16 >/dev/null
a=$("$EDL" generate --model "$W/f16.gguf" --prompt-tokens 1,2,3 --max-new-tokens 8)
b=$("$EDL" generate --model "$W/f16.gguf" --prompt-tokens 1,2,3 --max-new-tokens 8 --dtype f16)
[ "$a" = "$b" ] || fail "greedy tokens of --dtype f16 differ: $a vs $b"
rc=0
"$EDL" generate --model "$W/q8_0.gguf" --prompt-tokens 1,2,3 --max-new-tokens 8 --dtype bf16 2>"$W/err" >/dev/null || rc=$?
[ "$rc" -eq 2 ] && grep -q "quantized" "$W/err" || fail "--dtype bf16 of a q8_0 model: exit $rc, $(cat "$W/err")"
echo "ok"
