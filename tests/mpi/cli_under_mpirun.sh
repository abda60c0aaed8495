#!/usr/bin/env bash
# `mpirun -np 2 edl loss|logits|generate ... --mesh ...` writes the same bytes as the same
# command on one process with a simulated mesh (and generate the tokens of one device), and a
# mesh the ranks cannot share is refused.
set -euo pipefail
EDL=$1; DATA=$2; OUT=$3
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
M=$DATA/tiny_hf; T=$M/oracle/tokens.npy
mkdir -p "$OUT"
for mesh in fsdp=2 dp=2,tp=2 tp=2,sp=2; do
  "$EDL" loss --model "$M" --tokens "$T" --mesh "$mesh" --grads "$OUT/g1.safetensors" > "$OUT/l1.json"
  "${MPIRUN[@]}" "$EDL" loss --model "$M" --tokens "$T" --mesh "$mesh" --grads "$OUT/g2.safetensors" > "$OUT/l2.json"
  cmp "$OUT/l1.json" "$OUT/l2.json"
  cmp "$OUT/g1.safetensors" "$OUT/g2.safetensors"
  "$EDL" logits --model "$M" --tokens "$T" --mesh "$mesh" --out "$OUT/o1.npy" > /dev/null
  "${MPIRUN[@]}" "$EDL" logits --model "$M" --tokens "$T" --mesh "$mesh" --out "$OUT/o2.npy" > /dev/null
  cmp "$OUT/o1.npy" "$OUT/o2.npy"
  echo "mesh $mesh: loss, gradients and logits identical on 2 ranks"
done
P=(--prompt-tokens 1,2,3,4,5 --max-new-tokens 16)
S=(--prompt-tokens 7,3,9 --max-new-tokens 12 --temperature 0.8 --top-k 20 --seed 5)
"$EDL" generate --model "$M" "${P[@]}" > "$OUT/gen1.json"
"$EDL" generate --model "$M" "${S[@]}" > "$OUT/sam1.json"
for mesh in tp=2 sp=2 dp=2,tp=2 tp=2,sp=2; do
  "$EDL" generate --model "$M" "${P[@]}" --mesh "$mesh" > "$OUT/gen2.json"
  "${MPIRUN[@]}" "$EDL" generate --model "$M" "${P[@]}" --mesh "$mesh" > "$OUT/gen3.json"
  cmp "$OUT/gen1.json" "$OUT/gen2.json"
  cmp "$OUT/gen1.json" "$OUT/gen3.json"
  "${MPIRUN[@]}" "$EDL" generate --model "$M" "${S[@]}" --mesh "$mesh" > "$OUT/sam3.json"
  cmp "$OUT/sam1.json" "$OUT/sam3.json"
  echo "mesh $mesh: generate (greedy and sampled) gives one device's tokens on 2 ranks"
done
if "${MPIRUN[@]}" "$EDL" generate --model "$M" "${P[@]}" > /dev/null 2> "$OUT/err.txt"; then
  echo "generate with a 1-device mesh on 2 ranks was accepted"; exit 1
fi
grep -q "cannot share evenly" "$OUT/err.txt"
if "${MPIRUN[@]}" "$EDL" loss --model "$M" --tokens "$T" --mesh tp=3 > /dev/null 2> "$OUT/err.txt"; then
  echo "a 3-device mesh on 2 ranks was accepted"; exit 1
fi
grep -q "cannot share evenly" "$OUT/err.txt"
echo "a mesh the ranks cannot share is refused"
