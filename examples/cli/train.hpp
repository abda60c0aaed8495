// examples/cli/train.hpp: `edl train --config ARGS.json [--resume DIR] [--set key=value [key=value ...]]`
// Trains a causal LM with edl::train::Trainer from EasyDeL-style TrainingArguments (see
// docs/training.md). --args is the older name of --config. --set overrides fields (the value
// is JSON, or a plain string); further key=value words after it are overrides too. --resume
// continues from that checkpoint folder (its weights, optimizer state, data position and, for
// a tokenizer trained by the run, its tokenizer.json) instead of the newest checkpoint in
// save_directory; a folder that is not a checkpoint is an error. Under mpirun the
// sharding_axis_dims devices are spread over the ranks (ranks x devices per rank, checked
// before any work), every rank trains its devices, only rank 0 prints and writes the run's
// files, and checkpoints are written by all ranks and committed by rank 0
// (docs/distributed.md); EDL_FAULT_INJECTION (fault_injection.hpp) makes one rank fail on
// purpose, for tests. Progress goes to stderr
// (and metrics.jsonl in save_directory); stdout gets one JSON line at the end:
//   {"steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "seconds", "checkpoint",
//    "stop_reason", "resumed", "peak_gflops", "report"}
#pragma once

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/train/all.hpp>
#include "args.hpp"
#include "fault_injection.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

/// Runs one trainer type (f32 or bf16 parameters) and prints the result line.
template <class TrainerT>
int run_training(const train::TrainingArguments& ta, const std::string& resume) {
  TrainerT t(ta);  // under mpirun its mesh spreads over the ranks (edl::launch_mesh)
  install_fault_injection(t);
  if (!resume.empty()) t.resume_from(resume);
  const bool pairs = ta.preference();  // preference pairs: two sequences each
  const char* unit = pairs ? "preference pairs" : "sequences";
  if (ta.progress && launch().is_primary())
    std::fprintf(stderr, "edl train (%s): %lld parameters, %lld training %s (%lld tokens, %lld scored), %lld steps of %lld %s x %lld tokens, %lld steps per epoch%s%s\n",
                 ta.trainer.c_str(), static_cast<long long>(t.param_count()),
                 static_cast<long long>(t.train_dataset().size() / (pairs ? 2 : 1)), unit,
                 static_cast<long long>(t.train_dataset().num_tokens()), static_cast<long long>(t.train_dataset().num_scored()),
                 static_cast<long long>(t.total_steps()),
                 static_cast<long long>(ta.total_batch_size), unit, static_cast<long long>(ta.max_sequence_length),
                 static_cast<long long>(t.steps_per_epoch()), resume.empty() ? "" : ", resuming from ",
                 resume.c_str());
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
  j["resumed"] = r.resumed;
  j["peak_gflops"] = t.peak_gflops();
  // Every rank's peak resident set (VmHWM, one entry per process; a collective, so every rank
  // takes part): on a mesh it falls with the mesh, since no rank holds the whole model.
  j["rank_peak_bytes"] = t.processes().each(peak_resident_bytes());
  const auto report = std::filesystem::path(ta.save_directory) / "report.html";
  j["report"] = std::filesystem::exists(report) ? nlohmann::ordered_json(report.string()) : nlohmann::ordered_json(nullptr);
  std::cout << j.dump() << "\n";
  return 0;
}

inline int cmd_train(Args& args) {
  EDL_CLI_USAGE_CHECK(!(args.has("--config") && args.has("--args")), errc::invalid_argument, "edl train",
                      "--args is another name for --config: give one of them");
  const std::string path = args.has("--args") ? args.required("--args") : args.required("--config");
  const std::string resume = args.has("--resume") ? args.required("--resume") : "";
  std::vector<std::string> overrides;
  for (const auto& s : args.all("--set")) overrides.push_back(s);  // --set a=1 b=2, or --set a=1 --set b=2
  for (const auto& p : args.positional()) overrides.push_back(p);
  args.finish();

  auto ta = train::TrainingArguments::from_file(path);
  for (const auto& o : overrides) ta.apply_override(o);
  if (!resume.empty()) {
    namespace fs = std::filesystem;
    EDL_CHECK(fs::is_directory(resume) && fs::exists(fs::path(resume) / "state.json"), errc::io, resume,
              "--resume expects a checkpoint folder (checkpoint-<step> with state.json, model.safetensors and "
              "optimizer.safetensors)");
    // A tokenizer the run trained must be the one the checkpoint was trained with, not a new one.
    if (ta.tokenizer.is_object() && fs::exists(fs::path(resume) / "tokenizer.json"))
      ta.tokenizer = (fs::path(resume) / "tokenizer.json").string();
  }
  // param_dtype picks the trainer's parameter storage: f32, or bf16 / f16 with f32 master
  // weights; dtype the activations': f32, or bf16 (with f32 or bf16 parameters).
  ta.validate();
  const DType param = ta.param_storage(), compute = ta.compute_storage();
  if (compute == DType::bf16 && param == DType::f32) return run_training<train::BF16ComputeTrainer>(ta, resume);
  if (compute == DType::bf16 && param == DType::bf16) return run_training<train::BF16Bf16Trainer>(ta, resume);
  EDL_CHECK(compute == DType::f32, errc::unsupported, ta.where("dtype"), "edl train computes in float32, or in "
            "bfloat16 with param_dtype float32 or bfloat16; found dtype \"", ta.dtype, "\" with param_dtype \"",
            ta.param_dtype, "\" (the library's BasicTrainer<Policy<Param, Compute>> takes any pair)");
  if (param == DType::bf16) return run_training<train::BF16Trainer>(ta, resume);
  if (param == DType::f16) return run_training<train::F16Trainer>(ta, resume);
  return run_training<train::Trainer>(ta, resume);
}


inline Command train_command() {
  return {
      .name = "train",
      .group = "training",
      .summary = "train a causal LM from TrainingArguments JSON (checkpoints, metrics.jsonl, report)",
      .synopsis = "--config ARGS.json [--resume DIR] [--set key=value [key=value ...]]",
      .flags = {text_flag("--config", "ARGS.json", "the TrainingArguments (docs/training.md); required unless --args"),
                text_flag("--args", "ARGS.json", "the older name of --config"),
                text_flag("--resume", "DIR", "continue from this checkpoint folder").defaults("the newest in save_directory"),
                text_flag("--set", "key=value", "override a field (JSON value, or a plain string)").repeatable()},
      .positional = "OVERRIDES",
      .positional_help = "more key=value overrides, as --set",
      .examples = {"edl train --config examples/train_fortunes.json",
                   "edl train --config args.json --set max_training_steps=100 learning_rate=0.001"},
      .run = cmd_train};
}

}  // namespace edl::cli
