#!/usr/bin/env bash
# The main job: train a small byte-level Llama on a real corpus (Debian's fortunes), then
# generate from it; then show what the saved checkpoint holds and the machine's kernels.
#   STEPS (default 400, about 2-3 minutes on 2 cores) and OUT (default $BUILD_DIR/fortunes_lm)
#   may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/examples
EDL=$BIN/edl
OUT=${OUT:-${BUILD_DIR:-build}/fortunes_lm}
echo "== edl info";                       "$EDL" info
echo "== train on fortunes, then generate"
"$BIN/edl_example_fortunes_lm" --steps "${STEPS:-400}" --out "$OUT"
echo "== edl inspect $OUT (HF layout)";   "$EDL" inspect "$OUT" | cut -c1-300; echo " ..."
echo "== GEMM against OpenBLAS";          "$EDL" bench gemm --m 2048 --n 768 --k 768 --threads "$(nproc)" --repeat 5
echo "== a SwiGLU MLP on a (dp=2, tp=2) simulated mesh vs one device"
"$BIN/edl_example_sharded_mlp" 2 2
