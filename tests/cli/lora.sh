#!/usr/bin/env bash
# LoRA and QLoRA from the command line: a base trained by `edl train`, then a "lora" run over it
# (adapters in every checkpoint and in save_directory/adapter, resume with the same losses),
# `edl eval --adapter` giving the trainer's eval loss, a LoRA checkpoint as --model, `edl
# merge-lora` and --merge-adapter giving the same tokens, a QLoRA run over a q8_0 base, and a
# PEFT setting edl does not implement refused by name.
#   usage: lora.sh EDL WORKDIR
set -euo pipefail
EDL=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
for i in $(seq 1 120); do printf 'fortune %d: the quick brown fox jumps over the lazy dog\n%%\n' "$i"; done >"$W/train.txt"
for i in $(seq 1 20); do printf 'held out %d: a lazy brown dog\n%%\n' "$i"; done >"$W/eval.txt"
fail() { echo "FAIL: $*" >&2; exit 1; }
losses() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"loss":[^,]*' "$1" | grep -E '"step":[3-4],'; }

cat >"$W/base.json" <<JSON
{"model": {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "max_position_embeddings": 64},
 "tokenizer": {"type": "bpe", "vocab_size": 300}, "train_data": "$W/train.txt",
 "max_sequence_length": 32, "total_batch_size": 4, "max_training_steps": 4, "log_steps": 1,
 "learning_rate": 0.003, "progress": false, "peak_gflops": 10, "write_report": false,
 "save_directory": "$W/base"}
JSON
"$EDL" train --config "$W/base.json" >/dev/null
BASE="$W/base/checkpoint-4"

cat >"$W/lora.json" <<JSON
{"model": "$BASE", "tokenizer": "$BASE/tokenizer.json", "train_data": "$W/train.txt",
 "eval_data": "$W/eval.txt", "max_sequence_length": 32, "total_batch_size": 4, "max_training_steps": 4,
 "save_steps": 2, "log_steps": 1, "learning_rate": 0.01, "progress": false, "peak_gflops": 10,
 "write_report": false,
 "lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}}
JSON
"$EDL" train --config "$W/lora.json" --set "save_directory=$W/l" >"$W/l.json"
for f in checkpoint-2/adapter_config.json checkpoint-2/adapter_model.safetensors checkpoint-4/state.json \
         adapter/adapter_config.json adapter/adapter_model.safetensors; do
  [ -s "$W/l/$f" ] || fail "$f missing"
done
[ ! -e "$W/l/checkpoint-4/model.safetensors" ] || fail "a LoRA checkpoint holds the whole model"
grep -q '"peft_type": "LORA"' "$W/l/adapter/adapter_config.json" || fail "adapter_config.json is not PEFT's"

# Resume from checkpoint-2: steps 3 and 4 with the same losses (dropout masks included).
"$EDL" train --config "$W/lora.json" --resume "$W/l/checkpoint-2" --set "save_directory=$W/r" >"$W/r.json"
[ "$(losses "$W/l/metrics.jsonl")" = "$(losses "$W/r/metrics.jsonl")" ] || fail "resumed LoRA losses differ"

# edl eval with the adapter prints the trainer's eval loss; a LoRA checkpoint works as --model.
trainer=$(grep -o '"eval_loss":[^,]*' "$W/l.json" | cut -d: -f2)
"$EDL" eval --model "$BASE" --adapter "$W/l/adapter" --data "$W/eval.txt" --batch 4 >"$W/eval.json" 2>/dev/null
cli=$(grep -o '"loss":[^,]*' "$W/eval.json" | head -1 | cut -d: -f2)
[ "$trainer" = "$cli" ] || fail "edl eval --adapter loss $cli differs from the trainer's $trainer"
"$EDL" eval --model "$W/l/checkpoint-4" --data "$W/eval.txt" --batch 4 >"$W/eval2.json" 2>/dev/null
cli2=$(grep -o '"loss":[^,]*' "$W/eval2.json" | head -1 | cut -d: -f2)
[ "$trainer" = "$cli2" ] || fail "a LoRA checkpoint as --model gives $cli2, the trainer $trainer"

# merge-lora: a plain folder whose greedy tokens equal --merge-adapter's.
"$EDL" merge-lora --model "$BASE" --adapter "$W/l/adapter" --out "$W/merged" >"$W/merge.json"
grep -q '"merged_linears":7' "$W/merge.json" || fail "merge-lora: $(cat "$W/merge.json")"
a=$("$EDL" generate --model "$W/merged" --prompt "fortune 7" --max-new-tokens 12)
b=$("$EDL" generate --model "$BASE" --adapter "$W/l/adapter" --merge-adapter --prompt "fortune 7" --max-new-tokens 12)
[ "$a" = "$b" ] || fail "merged folder and --merge-adapter differ: $a vs $b"
"$EDL" generate --model "$BASE" --adapter "$W/l/adapter" --prompt "fortune 7" --max-new-tokens 12 | grep -q '"tokens"' ||
  fail "unmerged generate failed"

# QLoRA over a q8_0 base: trains, the base stays quantized in memory, the adapter is written.
"$EDL" train --config "$W/lora.json" --set "save_directory=$W/q" --set quantize_base=q8_0 >"$W/q.json"
[ -s "$W/q/adapter/adapter_model.safetensors" ] || fail "QLoRA wrote no adapter"
"$EDL" merge-lora --model "$BASE" --adapter "$W/q/adapter" --out "$W/qmerged" >/dev/null

# A PEFT setting edl does not implement is refused by name.
mkdir -p "$W/dora"
cp "$W/l/adapter/adapter_model.safetensors" "$W/dora/"
sed 's/"use_dora": false/"use_dora": true/' "$W/l/adapter/adapter_config.json" >"$W/dora/adapter_config.json"
if "$EDL" eval --model "$BASE" --adapter "$W/dora" --data "$W/eval.txt" 2>"$W/err.txt" >/dev/null; then
  fail "a DoRA adapter was accepted"
fi
grep -q "use_dora" "$W/err.txt" || fail "unclear DoRA error: $(cat "$W/err.txt")"
echo "ok"
