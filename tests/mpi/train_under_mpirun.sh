#!/usr/bin/env bash
# `mpirun -np 2 edl train --config X` on fsdp=2 and tp=2: the losses of metrics.jsonl are the
# bytes of the same config on one process (simulated mesh of the same shape); only rank 0
# writes metrics.jsonl and weights.jsonl; the checkpoint the ranks write together is the
# one-process checkpoint for `edl eval` on one process; `mpirun ... --resume` continues with
# the uninterrupted run's losses, and a one-process, one-device resume with them to f32
# rounding. Faults (EDL_FAULT_INJECTION, deadline EDL_MPI_TIMEOUT=5): a rank killed or hung
# mid-training ends the run with an error within a bound, a save failing on one rank commits
# nothing, and in every case the newest checkpoint with state.json is a complete, loadable one.
# LoRA runs the same way: mpirun's losses and adapter file are the simulated mesh's; so does a
# mixture-of-experts model on ep=2. An axis of -1 takes the ranks' devices.
#   usage: train_under_mpirun.sh EDL WORKDIR
set -euo pipefail
EDL=$1; W=$2
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
rm -rf "$W"; mkdir -p "$W"
for i in $(seq 1 40); do printf 'fortune %d: the quick brown fox jumps over the lazy dog\n%%\n' "$i"; done >"$W/train.txt"
cat >"$W/args.json" <<JSON
{"model": {"vocab_size": 260, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "max_position_embeddings": 32},
 "tokenizer": "byte", "train_data": "$W/train.txt",
 "max_sequence_length": 16, "total_batch_size": 4, "max_training_steps": 6, "save_steps": 3,
 "log_steps": 1, "learning_rate": 0.003, "progress": false, "peak_gflops": 10, "write_report": false,
 "weight_distribution_log_steps": 3, "sharding_axis_names": ["dp", "fsdp", "tp", "sp"]}
JSON
fail() { echo "FAIL: $*" >&2; exit 1; }
losses() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"loss":[^,]*' "$1"; }
late_losses() { losses "$1" | grep -E '"step":[4-6],'; }
eval_of() { "$EDL" eval --model "$1" --data "$W/train.txt" --batch 4 2>/dev/null; }
# The newest folder checkpoint-<n> holding state.json.
newest() { ls -d "$1"/checkpoint-* 2>/dev/null | while read -r d; do [ -f "$d/state.json" ] && echo "${d##*-}"; done | sort -n | tail -1; }

for mesh in "[1,2,1,1]" "[1,1,2,1]"; do
  D=$W/$(echo "$mesh" | tr -d '[],'); mkdir -p "$D"
  "$EDL" train --config "$W/args.json" --set "sharding_axis_dims=$mesh" "save_directory=$D/one" >/dev/null
  "${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --set "sharding_axis_dims=$mesh" "save_directory=$D/mpi" >"$D/mpi.json"
  [ "$(losses "$D/one/metrics.jsonl")" = "$(losses "$D/mpi/metrics.jsonl")" ] || fail "mesh $mesh: losses differ under mpirun"
  [ "$(wc -l <"$D/mpi/metrics.jsonl")" -eq 6 ] || fail "mesh $mesh: metrics.jsonl should hold 6 lines (rank 0 only)"
  [ "$(wc -l <"$D/mpi/weights.jsonl")" -eq 2 ] || fail "mesh $mesh: weights.jsonl should hold 2 lines (rank 0 only)"
  [ "$(wc -l <"$D/mpi.json")" -eq 1 ] || fail "mesh $mesh: one result line expected on stdout"
  # Each rank wrote its blocks into the files one process writes: the same bytes.
  cmp "$D/one/checkpoint-6/model.safetensors" "$D/mpi/checkpoint-6/model.safetensors"
  cmp "$D/one/checkpoint-6/optimizer.safetensors" "$D/mpi/checkpoint-6/optimizer.safetensors"
  grep -q '"rank_peak_bytes":\[[0-9]*,[0-9]*\]' "$D/mpi.json" || fail "mesh $mesh: no peak per rank: $(cat "$D/mpi.json")"
  [ "$(eval_of "$D/one/checkpoint-6")" = "$(eval_of "$D/mpi/checkpoint-6")" ] || fail "mesh $mesh: edl eval differs"

  "${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --resume "$D/mpi/checkpoint-3" \
    --set "sharding_axis_dims=$mesh" "save_directory=$D/resumed" >"$D/resumed.json"
  grep -q '"resumed":true' "$D/resumed.json" || fail "mesh $mesh: did not resume"
  [ "$(late_losses "$D/one/metrics.jsonl")" = "$(late_losses "$D/resumed/metrics.jsonl")" ] || fail "mesh $mesh: resumed losses differ"
  cmp "$D/one/checkpoint-6/model.safetensors" "$D/resumed/checkpoint-6/model.safetensors"

  # One process, one device: the same run to f32 rounding (another reduction order).
  "$EDL" train --config "$W/args.json" --resume "$D/mpi/checkpoint-3" --set "sharding_axis_dims=[1,1,1,1]" \
    "save_directory=$D/single" >/dev/null
  paste <(late_losses "$D/one/metrics.jsonl" | sed 's/.*"loss"://') <(late_losses "$D/single/metrics.jsonl" | sed 's/.*"loss"://') |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1 } END { exit bad }' ||
    fail "mesh $mesh: the one-device resume drifted beyond f32 rounding"
  echo "mesh $mesh: mpirun losses, checkpoint and resume equal one process"
done

# EasyDeL's -1: under mpirun -np 2 fsdp = -1 takes the two ranks' devices, the run of fsdp = 2.
"${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --set "sharding_axis_dims=[1,-1,1,1]" "save_directory=$W/inferred" >/dev/null
[ "$(losses "$W/1211/one/metrics.jsonl")" = "$(losses "$W/inferred/metrics.jsonl")" ] || fail "fsdp=-1 under mpirun -np 2 is not fsdp=2"
echo "fsdp=-1 under mpirun -np 2: the run of fsdp=2"

# LoRA (dropout on) on tp=2 and fsdp=2: mpirun gives the simulated mesh's losses and adapter
# bytes; the checkpoint is a PEFT adapter folder that resumes under mpirun to the same losses.
LORA='lora={"r":4,"lora_alpha":8,"lora_dropout":0.1,"target_modules":["q_proj","o_proj","up_proj","down_proj"]}'
for mesh in "[1,1,2,1]" "[1,2,1,1]"; do
  D=$W/lora$(echo "$mesh" | tr -d '[],'); mkdir -p "$D"
  "$EDL" train --config "$W/args.json" --set "sharding_axis_dims=$mesh" "$LORA" "save_directory=$D/one" >/dev/null
  "${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --set "sharding_axis_dims=$mesh" "$LORA" "save_directory=$D/mpi" >/dev/null
  [ "$(losses "$D/one/metrics.jsonl")" = "$(losses "$D/mpi/metrics.jsonl")" ] || fail "lora mesh $mesh: losses differ under mpirun"
  cmp "$D/one/adapter/adapter_model.safetensors" "$D/mpi/adapter/adapter_model.safetensors"
  [ -s "$D/mpi/checkpoint-3/adapter_config.json" ] || fail "lora mesh $mesh: checkpoint-3 is not an adapter folder"
  "${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --resume "$D/mpi/checkpoint-3" \
    --set "sharding_axis_dims=$mesh" "$LORA" "save_directory=$D/resumed" >/dev/null
  [ "$(late_losses "$D/one/metrics.jsonl")" = "$(late_losses "$D/resumed/metrics.jsonl")" ] || fail "lora mesh $mesh: resumed losses differ"
  cmp "$D/one/adapter/adapter_model.safetensors" "$D/resumed/adapter/adapter_model.safetensors"
  echo "lora mesh $mesh: mpirun losses, adapter and resume equal one process"
done

# A Mixtral-style model on ep=2 (one expert-parallel rank per process: each holds 2 of the 4
# experts, the token rows travel between the processes by MPI all_to_all): mpirun's losses
# (load-balancing loss included) and checkpoint are the simulated mesh's bytes, and a resume
# under mpirun continues with them.
MOE='model={"model_type":"mixtral","vocab_size":260,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":1,"num_attention_heads":2,"max_position_embeddings":32,"num_local_experts":4,"num_experts_per_tok":2,"output_router_logits":true,"router_aux_loss_coef":0.02}'
EP=(sharding_axis_names='["dp","fsdp","ep","tp","sp"]' "sharding_axis_dims=[1,1,2,1,1]")
D=$W/moe_ep2; mkdir -p "$D"
"$EDL" train --config "$W/args.json" --set "$MOE" "${EP[@]}" "save_directory=$D/one" >/dev/null
"${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --set "$MOE" "${EP[@]}" "save_directory=$D/mpi" >/dev/null
[ "$(losses "$D/one/metrics.jsonl")" = "$(losses "$D/mpi/metrics.jsonl")" ] || fail "moe ep=2: losses differ under mpirun"
grep -q '"aux_loss"' "$D/mpi/metrics.jsonl" || fail "moe ep=2: no aux_loss in metrics.jsonl"
cmp "$D/one/checkpoint-6/model.safetensors" "$D/mpi/checkpoint-6/model.safetensors"
"${MPIRUN[@]}" "$EDL" train --config "$W/args.json" --resume "$D/mpi/checkpoint-3" --set "$MOE" "${EP[@]}" \
  "save_directory=$D/resumed" >/dev/null
[ "$(late_losses "$D/one/metrics.jsonl")" = "$(late_losses "$D/resumed/metrics.jsonl")" ] || fail "moe ep=2: resumed losses differ"
cmp "$D/one/checkpoint-6/model.safetensors" "$D/resumed/checkpoint-6/model.safetensors"
echo "moe ep=2: mpirun losses, checkpoint and resume equal one process"

export EDL_MPI_TIMEOUT=5
# run_fault NAME FAULT: trains fsdp=2 under mpirun with the fault; must fail within 60 s.
run_fault() {
  local start=$SECONDS rc=0
  EDL_FAULT_INJECTION=$2 timeout 120 "${MPIRUN[@]}" "$EDL" train --config "$W/args.json" \
    --set "sharding_axis_dims=[1,2,1,1]" "save_directory=$W/$1" >/dev/null 2>"$W/$1.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "$1: the run succeeded despite $2"
  [ "$rc" -ne 124 ] || fail "$1: the run hung (killed by timeout after 120 s)"
  [ $((SECONDS - start)) -lt 60 ] || fail "$1: took $((SECONDS - start)) s to fail"
  [ "$(newest "$W/$1")" = 3 ] || fail "$1: the newest complete checkpoint is not checkpoint-3"
  [ ! -e "$W/$1/checkpoint-6" ] || fail "$1: checkpoint-6 exists"
  eval_of "$W/$1/checkpoint-3" >/dev/null || fail "$1: checkpoint-3 does not load"
}
run_fault killed kill:rank=1,step=4
grep -Eq 'rank 1 .*(signal 9|Killed)|no answer from device' "$W/killed.err" || fail "killed: unclear error: $(cat "$W/killed.err")"
run_fault hung hang:rank=1,step=4
grep -q 'no answer from device(s) 1 within 5 s (EDL_MPI_TIMEOUT)' "$W/hung.err" || fail "hung: unclear error: $(cat "$W/hung.err")"
run_fault failsave fail_save:rank=1,step=6
grep -q 'rank 1 failed to write its part; this checkpoint was not committed' "$W/failsave.err" ||
  fail "failsave: unclear error: $(cat "$W/failsave.err")"
ls -a "$W/failsave" | grep -q '\.tmp-' && fail "failsave: the uncommitted folder was left behind"
if EDL_FAULT_INJECTION=explode:rank=1 "$EDL" train --config "$W/args.json" --set "save_directory=$W/typo" 2>"$W/typo.err"; then
  fail "a malformed EDL_FAULT_INJECTION was accepted"
fi
grep -q EDL_FAULT_INJECTION "$W/typo.err" || fail "typo: unclear error: $(cat "$W/typo.err")"
echo "a killed or hung rank ends the run within the deadline, a failed save commits nothing"
