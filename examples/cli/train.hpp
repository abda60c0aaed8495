// examples/cli/train.hpp: `edl train --args ARGS.json [--set key=value [key=value ...]]`
// Trains a causal LM with edl::train::Trainer from EasyDeL-style TrainingArguments (see
// docs/training.md). --set overrides fields (the value is JSON, or a plain string); further
// key=value words after it are overrides too. Progress goes to stderr (and metrics.jsonl in
// save_directory); stdout gets one JSON line at the end:
//   {"steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "seconds", "checkpoint", "stop_reason"}
#pragma once

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/train/all.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_train(Args& args) {
  const std::string path = args.required("--args");
  std::vector<std::string> overrides;
  if (args.has("--set")) overrides.push_back(args.str("--set", ""));
  for (const auto& p : args.positional()) overrides.push_back(p);
  args.finish();

  auto ta = train::TrainingArguments::from_file(path);
  for (const auto& o : overrides) ta.apply_override(o);
  train::Trainer t(ta);
  if (ta.progress)
    std::fprintf(stderr, "edl train: %lld parameters, %lld training sequences (%lld tokens), %lld steps of %lld sequences x %lld tokens, %lld steps per epoch\n",
                 static_cast<long long>(t.model().param_count()), static_cast<long long>(t.train_dataset().size()),
                 static_cast<long long>(t.train_dataset().num_tokens()), static_cast<long long>(t.total_steps()),
                 static_cast<long long>(ta.total_batch_size), static_cast<long long>(ta.max_sequence_length),
                 static_cast<long long>(t.steps_per_epoch()));
  const train::TrainResult r = t.train();
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["first_loss"] = r.first_loss;
  j["final_loss"] = r.final_loss;
  j["eval_loss"] = r.eval_loss ? nlohmann::ordered_json(*r.eval_loss) : nlohmann::ordered_json(nullptr);
  j["tokens_per_s"] = r.tokens_per_s;
  j["seconds"] = r.seconds;
  j["checkpoint"] = r.checkpoint;
  j["stop_reason"] = r.stop_reason;
  j["peak_gflops"] = t.peak_gflops();
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace edl::cli
