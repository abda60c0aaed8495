#!/usr/bin/env bash
# The main job: train a small byte-level Llama on a real corpus (Debian's fortunes) with the
# trainer and EasyDeL-style arguments (examples/train_fortunes.json), then generate from the
# last checkpoint, then show what the checkpoint holds and how fast the kernels are.
#   OUT (default $BUILD_DIR/fortunes-run) may be set; a finished run is resumed (nothing to do)
#   unless OUT is removed first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/examples
EDL=$BIN/edl
OUT=${OUT:-${BUILD_DIR:-build}/fortunes-run}
echo "== edl info";  "$EDL" info
echo "== edl train (fortunes, 400 steps on a simulated fsdp=2 mesh; metrics in $OUT/metrics.jsonl)"
"$EDL" train --args examples/train_fortunes.json --set "save_directory=$OUT"
CKPT=$(ls -d "$OUT"/checkpoint-* | sort -t- -k2 -n | tail -1)
echo "== edl generate from $CKPT"
"$EDL" generate --model "$CKPT" --prompt "Q: " --temperature 0.8 --top-k 20 --seed 0 --max-new-tokens 300
echo "== edl inspect $CKPT (HF layout)"; "$EDL" inspect "$CKPT" | cut -c1-300; echo " ..."
echo "== GEMM against OpenBLAS"; "$EDL" bench gemm --m 2048 --n 768 --k 768 --threads "$(nproc)" --repeat 5
echo "== the same loss on a 2-device fsdp (ZeRO-3) simulated mesh as on one device"
"$EDL" loss --model "$CKPT" --tokens tests/data/tiny_hf/oracle/tokens.npy
"$EDL" loss --model "$CKPT" --tokens tests/data/tiny_hf/oracle/tokens.npy --mesh fsdp=2
