#!/usr/bin/env bash
# The main job: for now, the richest thing edl does end to end (until the trainer lands,
# this shows the machine, the GEMM against OpenBLAS and the simulated-mesh collectives).
set -euo pipefail
cd "$(dirname "$0")/.."
EDL=${BUILD_DIR:-build}/examples/edl
"$EDL" info
