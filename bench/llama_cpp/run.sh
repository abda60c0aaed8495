#!/usr/bin/env bash
# bench/llama_cpp/run.sh: llama.cpp's pp and tg on edl's preset shapes (docs/benchmarks.md).
#   bash bench/llama_cpp/run.sh --model tiny --prompt-len 128 --gen-len 128 --threads 2 [--mmap 0]
# and llama.cpp's greedy continuation of token ids from a GGUF file (greedy.mjs), to check
# `edl convert`'s files against `edl generate --greedy` (docs/gguf.md):
#   bash bench/llama_cpp/run.sh greedy --model F.gguf --prompt 1,2,3 --n 16 [--ignore-eog]
# Installs node-llama-cpp (prebuilt llama.cpp CPU libraries) into bench/llama_cpp/node_modules
# on first use; GGUF models are written to bench/llama_cpp/models/ (neither is committed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "bench/llama_cpp: node and npm are needed (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
if [ ! -d "$here/node_modules/node-llama-cpp" ]; then
  (cd "$here" && npm install --ignore-scripts --no-audit --no-fund >&2)
fi
# One libuv worker: with node's default four, llama.cpp's 2-thread decode ran 3-4x slower here
# (its compute threads spin-wait while idle pool threads compete for the 2 cores).
export UV_THREADPOOL_SIZE=1
if [ "${1:-}" = greedy ]; then
  shift
  exec node "$here/greedy.mjs" "$@"
fi
exec node "$here/llama_bench.mjs" "$@"
