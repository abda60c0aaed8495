# tests/cli/tiny_chat_model.sh, sourced: make_tiny_chat_model EDL DIR trains a one-layer model
# with its own BPE tokenizer on a few lines of dialogue (2 steps, a second), adds a chat template
# and special tokens to its tokenizer_config.json, writes DIR/chat.json (one user message), and
# sets C to the checkpoint folder. Shared by the CLI tests that need a chat model.
make_tiny_chat_model() {
  local edl=$1 w=$2
  for i in $(seq 1 60); do printf 'user asks %d and the assistant answers %d\n%%\n' "$i" "$i"; done >"$w/train.txt"
  cat >"$w/train.json" <<JSON
{"model": {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "max_position_embeddings": 128},
 "tokenizer": {"type": "bpe", "vocab_size": 300}, "train_data": "$w/train.txt",
 "max_sequence_length": 32, "total_batch_size": 4, "max_training_steps": 2, "log_steps": 1,
 "learning_rate": 0.003, "progress": false, "peak_gflops": 10, "write_report": false,
 "save_directory": "$w/run"}
JSON
  "$edl" train --config "$w/train.json" >/dev/null
  C="$w/run/checkpoint-2"
  cat >"$C/tokenizer_config.json" <<'JSON'
{"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
 "chat_template": "{% for message in messages %}{{ '<s>' + message['role'] + '\n' + message['content'] + '</s>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}"}
JSON
  echo '[{"role": "user", "content": "what does the user ask?"}]' >"$w/chat.json"
}
