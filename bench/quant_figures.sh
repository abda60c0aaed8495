#!/usr/bin/env bash
# Quantized decode and prefill figures (docs/benchmarks.md, "Quantized decode and prefill
# against llama.cpp"): for each format and thread count, edl (and an optional second edl
# binary, say the previous main) and llama.cpp one after the other, ROUNDS times, so every
# ratio is read inside one round. Prints one JSON line per run, tagged with "side" and "round".
#   bench/quant_figures.sh [EDL] [EDL_BEFORE]      (defaults: build/examples/edl, none)
# Environment: MODEL (small), ROUNDS (2), PROMPT / GEN (decode run: 128 / 64; prefill run:
# 512 / 4), FORMATS ("q4_0 q8_0"), THREADS ("1 2").
set -euo pipefail
EDL=${1:-build/examples/edl}
BEFORE=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-small}
ROUNDS=${ROUNDS:-2}
tag() { sed "s/^{/{\"side\":\"$1\",\"round\":$2,/"; }
one() {  # round format threads prompt gen
  local r=$1 q=$2 t=$3 p=$4 g=$5
  local args=(bench decode --model "$MODEL" --prompt-len "$p" --gen-len "$g" --threads "$t" --repetitions 2 --quant "$q")
  "$EDL" "${args[@]}" | tail -1 | tag edl "$r"
  if [[ -n $BEFORE ]]; then "$BEFORE" "${args[@]}" | tail -1 | tag edl_before "$r"; fi
  bash "$HERE/llama_cpp/run.sh" --model "$MODEL" --prompt-len "$p" --gen-len "$g" --threads "$t" --mmap 0 --type "$q" |
    tail -1 | tag llama_cpp "$r"
}
for r in $(seq 1 "$ROUNDS"); do
  for q in ${FORMATS:-q4_0 q8_0}; do
    for t in ${THREADS:-1 2}; do
      one "$r" "$q" "$t" "${PROMPT:-128}" "${GEN:-64}"
      one "$r" "$q" "$t" 512 4
    done
  done
done
