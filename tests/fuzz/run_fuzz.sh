#!/usr/bin/env bash
# run_fuzz.sh EXE CORPUS_DIR SEED_DIR [libFuzzer flags...]: one bounded fuzzing run. New inputs
# go to CORPUS_DIR (made here, so a cleaned build dir still runs), the committed seeds are read
# after it and never written.
set -euo pipefail
exe=$1 corpus=$2 seeds=$3
shift 3
mkdir -p "$corpus"
exec "$exe" "$@" "$corpus" "$seeds"
