#!/usr/bin/env bash
# Training-step figures by precision and gradient-checkpointing policy, edl next to PyTorch,
# one run after the other on the same machine (docs/benchmarks.md, "Training step by precision
# and remat policy"). Prints one JSON line per run.
#   bench/train_figures.sh [EDL] [ORACLE]      (defaults: build/examples/edl, ../shared/oracle)
# PYTORCH_BF16_SMALL=1 also runs PyTorch's bf16 autocast on small (about 20x slower than f32
# on CPUs without AMX: tens of minutes).
set -euo pipefail
EDL=${1:-build/examples/edl}
export ORACLE=${2:-../shared/oracle}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
run() {  # config batch seq
  local c=$1 b=$2 s=$3
  for remat in everything_saveable nothing_saveable dots_saveable dots_with_no_batch_dims_saveable; do
    "$EDL" bench train --config "$c" --batch "$b" --seq "$s" --threads 2 --steps 2 --remat "$remat"
  done
  for remat in everything_saveable nothing_saveable; do
    "$EDL" bench train --config "$c" --batch "$b" --seq "$s" --threads 2 --steps 2 --remat "$remat" --param-dtype bfloat16
  done
  "$PY" "$HERE/pytorch_train_step.py" "$c" "$b" "$s" 2 f32
  "$PY" "$HERE/pytorch_train_step.py" "$c" "$b" "$s" 2 checkpoint
  if [[ $c == tiny || ${PYTORCH_BF16_SMALL:-0} == 1 ]]; then "$PY" "$HERE/pytorch_train_step.py" "$c" "$b" "$s" 2 bf16; fi
}
run tiny 8 256
run small 4 512
