#!/usr/bin/env bash
# The training command line end to end on a tiny corpus: `edl train --config` (with a BPE
# tokenizer trained by the run), `--resume` from a checkpoint folder continuing with the very
# same losses (in f32 and with param_dtype float16), `--resume` of a folder that is not a
# checkpoint failing, `edl eval` giving the trainer's own eval loss, and the report and
# weights.jsonl being written.
#   usage: train_eval_report.sh EDL WORKDIR
set -euo pipefail
EDL=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
for i in $(seq 1 120); do printf 'fortune %d: the quick brown fox jumps over the lazy dog\n%%\n' "$i"; done >"$W/train.txt"
for i in $(seq 1 20); do printf 'held out %d: a lazy brown dog\n%%\n' "$i"; done >"$W/eval.txt"
cat >"$W/args.json" <<JSON
{"model": {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "max_position_embeddings": 64},
 "tokenizer": {"type": "bpe", "vocab_size": 300},
 "train_data": "$W/train.txt", "eval_data": "$W/eval.txt",
 "max_sequence_length": 32, "total_batch_size": 4, "max_training_steps": 6, "save_steps": 3,
 "log_steps": 1, "learning_rate": 0.003, "progress": false, "peak_gflops": 10,
 "weight_distribution_log_steps": 3}
JSON
fail() { echo "FAIL: $*" >&2; exit 1; }
losses() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"loss":[^,]*' "$1" | grep -E '"step":[4-6],'; }

"$EDL" train --config "$W/args.json" --set "save_directory=$W/a" >"$W/a.json"
# --set repeats (each override applies) and sits beside positional key=value overrides.
"$EDL" train --config "$W/args.json" --set "save_directory=$W/r" --set max_training_steps=4 log_steps=3 >"$W/r.json"
grep -q '"steps":4,' "$W/r.json" || fail "a repeated --set was not applied: $(cat "$W/r.json")"
[ "$(grep -c '"loss":' "$W/r/metrics.jsonl")" -eq 3 ] || fail "log_steps=3 (steps 1, 3, 4 logged) was not applied"
if "$EDL" eval --model "$W/a/checkpoint-3" --data "$W/eval.txt" --batch 2 --batch 4 2>"$W/err.txt"; then
  fail "a flag given twice was accepted"
fi
grep -q "given 2 times" "$W/err.txt" || fail "unclear repeated-flag error: $(cat "$W/err.txt")"
"$EDL" train --config "$W/args.json" --resume "$W/a/checkpoint-3" --set "save_directory=$W/b" >"$W/b.json"
grep -q '"resumed":true' "$W/b.json" || fail "the second run did not resume"
[ "$(losses "$W/a/metrics.jsonl")" = "$(losses "$W/b/metrics.jsonl")" ] || fail "resumed losses differ"
[ "$(losses "$W/a/metrics.jsonl" | wc -l)" -eq 3 ] || fail "expected losses of steps 4-6"

if "$EDL" train --config "$W/args.json" --resume "$W" --set "save_directory=$W/c" 2>"$W/err.txt"; then
  fail "--resume of a folder that is not a checkpoint succeeded"
fi
grep -q "checkpoint folder" "$W/err.txt" || fail "unclear --resume error: $(cat "$W/err.txt")"

# The trainer evaluates in micro-batches of 4 over all of eval_data: edl eval with --batch 4
# must print the same number.
trainer=$(grep -o '"eval_loss":[^,]*' "$W/a.json" | cut -d: -f2)
"$EDL" eval --model "$W/a/checkpoint-6" --data "$W/eval.txt" --batch 4 >"$W/eval.json"
cli=$(grep -o '"loss":[^,]*' "$W/eval.json" | head -1 | cut -d: -f2)
[ "$trainer" = "$cli" ] || fail "edl eval loss $cli differs from the trainer's $trainer"
grep -q '"unigram_loss":[0-9]' "$W/eval.json" || fail "no unigram baseline: $(cat "$W/eval.json")"

# param_dtype picks the trainer: float16 trains f16 parameters (f32 master weights in the
# optimizer), saves F16 tensors with torch_dtype "float16", and resumes with the same losses.
"$EDL" train --config "$W/args.json" --set "save_directory=$W/h" param_dtype=float16 >"$W/h.json"
grep -q '"torch_dtype": "float16"' "$W/h/checkpoint-6/config.json" || fail "float16 run: $(grep torch_dtype "$W/h/checkpoint-6/config.json")"
[ "$(losses "$W/h/metrics.jsonl")" != "$(losses "$W/a/metrics.jsonl")" ] || fail "param_dtype float16 trained as float32"
"$EDL" train --config "$W/args.json" --resume "$W/h/checkpoint-3" --set "save_directory=$W/h2" param_dtype=float16 >/dev/null
[ "$(losses "$W/h/metrics.jsonl")" = "$(losses "$W/h2/metrics.jsonl")" ] || fail "float16 resumed losses differ"
if "$EDL" train --config "$W/args.json" --set "save_directory=$W/x" param_dtype=float8 2>"$W/err.txt"; then
  fail "param_dtype float8 was accepted"
fi
grep -q "param_dtype" "$W/err.txt" || fail "unclear param_dtype error: $(cat "$W/err.txt")"
# dtype picks the activations' type: bfloat16 trains with bf16 activations (other losses than
# f32's, f32 parameters saved); float16 activations are the library's, not the tool's.
"$EDL" train --config "$W/args.json" --set "save_directory=$W/act" dtype=bfloat16 >/dev/null
[ "$(losses "$W/act/metrics.jsonl")" != "$(losses "$W/a/metrics.jsonl")" ] || fail "dtype bfloat16 trained as float32"
grep -q '"torch_dtype": "float32"' "$W/act/checkpoint-6/config.json" || fail "dtype bfloat16 changed the parameters' dtype"
if "$EDL" train --config "$W/args.json" --set "save_directory=$W/x" dtype=float16 2>"$W/err.txt"; then
  fail "dtype float16 was accepted by edl train"
fi
grep -q "field dtype" "$W/err.txt" || fail "unclear dtype error: $(cat "$W/err.txt")"

for f in report.md report.html loss.svg learning_rate.svg weights.jsonl; do
  [ -s "$W/a/$f" ] || fail "$f missing"
done
grep -q '<svg' "$W/a/report.html" || fail "report.html has no chart"
[ "$(wc -l <"$W/a/weights.jsonl")" -eq 2 ] || fail "weights.jsonl should hold steps 3 and 6"
rm "$W/a/report.md"
"$EDL" report "$W/a" >/dev/null
grep -q '| steps | 6 |' "$W/a/report.md" || fail "edl report did not rewrite report.md"
echo "ok"
