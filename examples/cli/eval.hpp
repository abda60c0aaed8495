// examples/cli/eval.hpp: `edl eval` scores a checkpoint on held-out data.
//
//   edl eval --model DIR --data FILE[,FILE...] [--max-seq N] [--batch N] [--max-batches N]
//            [--unigram-data FILE[,FILE...] | --no-unigram]
//
// DIR is a checkpoint folder (or any HF folder with config.json + model.safetensors). The data
// is read as the trainer reads train_data (text, .jsonl, .npy, .bin; dataset.hpp), tokenized
// with DIR/tokenizer.json: the tokenizer the run trained with. Defaults come from the run when
// DIR/state.json records its arguments: --max-seq = max_sequence_length (else the model's
// max_position_embeddings), the truncation mode, and the unigram baseline's training text =
// train_data; --batch defaults to 8 sequences (the loss is a mean over target tokens, so the
// batch size changes it only by float rounding). Prints one JSON line:
//   {"loss", "perplexity", "accuracy", "tokens", "sequences", "unigram_loss", "unigram_perplexity",
//    "unigram_train_tokens", "max_seq", "batch"}
// and a readable summary line on stderr. unigram_* (evaluation.hpp: the cross-entropy of the add-one-smoothed token frequencies of the
// training data on the same held-out targets) are null when no training data is known.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/json_config.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include <edl/train/checkpoint.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/evaluation.hpp>
#include "adapter_flags.hpp"
#include "args.hpp"

namespace edl::cli {

namespace eval_detail {

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t c = s.find(',', start);
    const std::string item = s.substr(start, c == std::string::npos ? std::string::npos : c - start);
    if (!item.empty()) out.push_back(item);
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

}  // namespace eval_detail

inline int cmd_eval(Args& args) {
  namespace fs = std::filesystem;
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "eval");
  const std::string dir = af.model;
  const auto data = eval_detail::split_list(args.required("--data"));
  const std::int64_t max_seq_flag = args.integer("--max-seq", 0);
  const std::int64_t batch = args.integer("--batch", 8);
  const std::int64_t max_batches = args.integer("--max-batches", 0);
  const std::string unigram_flag = args.has("--unigram-data") ? args.required("--unigram-data") : "";
  const bool no_unigram = args.has("--no-unigram");
  args.finish();
  EDL_CLI_USAGE_CHECK(batch > 0, errc::invalid_argument, "edl eval", "--batch must be positive, found ", batch);
  EDL_CLI_USAGE_CHECK(max_seq_flag >= 0, errc::invalid_argument, "edl eval", "--max-seq must be positive, found ",
                      max_seq_flag);
  EDL_CLI_USAGE_CHECK(!data.empty(), errc::invalid_argument, "edl eval", "--data names no file");
  EDL_CHECK(fs::exists(fs::path(dir) / "config.json"), errc::io, dir,
            "--model expects a checkpoint folder with config.json and model.safetensors");

  // What the run recorded about itself (absent for a plain HF folder).
  // (A LoRA run's checkpoint holds it beside the adapter.)
  train::ojson run = nullptr;
  for (const std::string& f : {dir, af.adapter})
    if (!f.empty() && run.is_null() && fs::exists(fs::path(f) / "state.json"))
      run = train::TrainState::from_file((fs::path(f) / "state.json").string()).training_arguments;
  auto run_field = [&](const char* k) -> train::ojson {
    return run.is_object() && run.contains(k) ? run[k] : train::ojson(nullptr);
  };

  auto model = models::from_pretrained<>(dir);
  apply_adapter(model, af);
  std::optional<tokenizer::Tokenizer> tok;
  if (fs::exists(fs::path(dir) / "tokenizer.json"))
    tok = tokenizer::Tokenizer::from_file((fs::path(dir) / "tokenizer.json").string());
  else if (!af.adapter.empty() && fs::exists(fs::path(af.adapter) / "tokenizer.json"))
    tok = tokenizer::Tokenizer::from_file((fs::path(af.adapter) / "tokenizer.json").string());

  train::EvalOptions o;
  o.max_sequence_length = max_seq_flag > 0 ? max_seq_flag
                          : run_field("max_sequence_length").is_number_integer()
                              ? run_field("max_sequence_length").get<std::int64_t>()
                              : model.config().max_position_embeddings;
  o.batch_size = batch;
  if (max_batches > 0) o.max_batches = max_batches;
  // The trainer's padding id: the tokenizer's pad, else its eos, else 0 (padding is masked).
  o.pad_id = tok && tok->pad_id() ? *tok->pad_id() : (tok && tok->eos_id() ? *tok->eos_id() : 0);
  if (run_field("truncation_mode").is_string())
    o.truncation = train::truncation_from_name(run_field("truncation_mode").get<std::string>());

  const std::int64_t V = model.config().vocab_size;
  const train::DataOptions d{o.max_sequence_length, tok && tok->eos_id() ? *tok->eos_id() : -1, V};
  const train::TokenDataset heldout = train::load_dataset(data, tok ? &*tok : nullptr, d);
  EDL_CHECK(heldout.size() > 0, errc::invalid_argument, "edl eval", "--data holds no tokens");
  const train::EvalMetrics e = train::evaluate_dataset(model, heldout, o, "edl eval");

  std::vector<std::string> unigram_files;
  if (!no_unigram) {
    if (!unigram_flag.empty()) {
      unigram_files = eval_detail::split_list(unigram_flag);
    } else if (run_field("train_data").is_array()) {
      for (const auto& f : run_field("train_data"))
        if (f.is_string() && fs::is_regular_file(f.get<std::string>())) unigram_files.push_back(f.get<std::string>());
    }
  }
  std::optional<train::UnigramBaseline> u;
  if (!unigram_files.empty())
    u = train::unigram_baseline(train::load_dataset(unigram_files, tok ? &*tok : nullptr, d), heldout, V, o);

  nlohmann::ordered_json j;
  auto opt = [](bool has, double v) { return has ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  j["loss"] = e.loss;
  j["perplexity"] = e.perplexity;
  j["accuracy"] = e.accuracy;
  j["tokens"] = e.tokens;
  j["sequences"] = heldout.size();
  j["unigram_loss"] = opt(u.has_value(), u ? u->loss : 0.0);
  j["unigram_perplexity"] = opt(u.has_value(), u ? u->perplexity : 0.0);
  j["unigram_train_tokens"] = u ? nlohmann::ordered_json(u->train_tokens) : nlohmann::ordered_json(nullptr);
  j["max_seq"] = o.max_sequence_length;
  j["batch"] = o.batch_size;
  if (!af.adapter.empty()) j["adapter"] = af.adapter;
  std::cout << j.dump() << "\n";
  // The comparison a person wants to read, on stderr (stdout stays one JSON line).
  if (u)
    std::fprintf(stderr, "edl eval: held-out loss %.4f nats/token (perplexity %.2f) over %lld tokens; unigram baseline %.4f (perplexity %.2f)\n",
                 e.loss, e.perplexity, static_cast<long long>(e.tokens), u->loss, u->perplexity);
  else
    std::fprintf(stderr, "edl eval: held-out loss %.4f nats/token (perplexity %.2f) over %lld tokens\n", e.loss,
                 e.perplexity, static_cast<long long>(e.tokens));
  return 0;
}

inline Command eval_command() {
  return {
      .name = "eval",
      .group = "models",
      .summary = "score a checkpoint on held-out data: loss, perplexity, accuracy, unigram baseline",
      .synopsis = "--model DIR --data FILE[,FILE...] [--max-seq N] [--batch N] [--max-batches N] [flags]",
      .flags = flags(
          {{text_flag("--model", "DIR", "a checkpoint folder, or any HF folder with config.json").required(),
            text_flag("--data", "FILE[,FILE...]", "held-out data, read as the trainer reads train_data").required(),
            integer_flag("--max-seq", "N", "packing length of text, truncation limit of longer sequences")
                .defaults("the run's max_sequence_length, else max_position_embeddings"),
            integer_flag("--batch", "N", "sequences per forward pass").defaults("8"),
            integer_flag("--max-batches", "N", "score only the first N batches").defaults("all"),
            text_flag("--unigram-data", "FILE[,FILE...]", "text the unigram baseline's frequencies are counted on")
                .defaults("the run's train_data"),
            switch_flag("--no-unigram", "skip the unigram baseline (unigram_* are null)")},
           declare_adapter_flags()}),
      .examples = {"edl eval --model run/checkpoint-400 --data heldout.txt",
                   "edl eval --model base --adapter run/adapter --data heldout.jsonl --batch 4 --no-unigram"},
      .run = cmd_eval};
}

}  // namespace edl::cli
