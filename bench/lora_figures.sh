#!/usr/bin/env bash
# LoRA training-step figures (docs/benchmarks.md, "LoRA and QLoRA training step"): full
# fine-tuning, LoRA over an f32 and a bf16 base, and QLoRA (nf4; q4_0 on tiny) in edl, with every
# activation kept and with nothing_saveable, next to PyTorch's full and LoRA steps, one run after the other on the same machine. Every step includes its AdamW
# update; LoRA is r 16 (alpha 32) on q, k, v, o, gate, up and down. Prints one JSON line per run.
#   bench/lora_figures.sh [EDL] [ORACLE]      (defaults: build/examples/edl, ../shared/oracle)
set -euo pipefail
EDL=${1:-build/examples/edl}
export ORACLE=${2:-../shared/oracle}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
run() {  # config batch seq qlora-format
  local c=$1 b=$2 s=$3 q=$4
  for remat in everything_saveable nothing_saveable; do
    local common=(bench train --config "$c" --batch "$b" --seq "$s" --threads 2 --steps 3 --optimizer-step --remat "$remat")
    "$EDL" "${common[@]}"
    "$EDL" "${common[@]}" --lora 16
    "$EDL" "${common[@]}" --lora 16 --param-dtype bfloat16
    "$EDL" "${common[@]}" --lora 16 --quantize-base "$q"
  done
  "$PY" "$HERE/pytorch_train_step.py" "$c" "$b" "$s" 2 f32 adamw
  "$PY" "$HERE/pytorch_train_step.py" "$c" "$b" "$s" 2 lora adamw
}
# tiny's hidden size (288) is not a multiple of nf4's block of 64: its QLoRA base is q4_0.
run tiny 8 256 q4_0
run small 4 512 nf4
# GQA1B=1: gqa1b, batch 1 x 512 (about 15 minutes; full fine-tuning needs 18 GB)
if [[ ${GQA1B:-0} == 1 ]]; then
  g=(bench train --config gqa1b --batch 1 --seq 512 --threads 2 --steps 2 --optimizer-step)
  "$EDL" "${g[@]}" --remat nothing_saveable
  "$EDL" "${g[@]}" --lora 16
  for extra in "" "--param-dtype bfloat16" "--quantize-base nf4"; do
    # shellcheck disable=SC2086
    "$EDL" "${g[@]}" --remat nothing_saveable --lora 16 $extra
  done
  "$PY" "$HERE/pytorch_train_step.py" gqa1b 1 512 2 lora adamw
fi
