#!/usr/bin/env bash
# The main job: until the trainer lands, the richest thing edl does end to end:
#   1. the machine as edl sees it;
#   2. the tiny Llama fixture validated and inspected (HF safetensors layout);
#   3. GEMM against OpenBLAS on the shape of a Llama MLP projection;
#   4. collectives on an 8-device simulated mesh;
#   5. a SwiGLU MLP run data + tensor parallel on simulated meshes, checked against one device.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/examples
EDL=$BIN/edl
echo "== edl info";                 "$EDL" info
echo "== edl inspect tiny_hf";      "$EDL" inspect tests/data/tiny_hf | cut -c1-400; echo " ..."
echo "== edl bench gemm";           "$EDL" bench gemm --m 2048 --n 768 --k 768 --threads "$(nproc)" --repeat 5
echo "== edl bench collectives";    "$EDL" bench collectives --devices 8 --bytes 1M
echo "== sharded MLP (dp=2, tp=2)"; "$BIN/edl_example_sharded_mlp" 2 2
echo "== sharded MLP (dp=1, tp=4)"; "$BIN/edl_example_sharded_mlp" 1 4
