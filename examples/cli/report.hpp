// examples/cli/report.hpp: `edl report DIR` writes the end-of-training report of an existing
// run: DIR/report.md, DIR/report.html, DIR/loss.svg and DIR/learning_rate.svg from
// DIR/metrics.jsonl (edl/train/report.hpp; docs/training.md). The parameter count and model
// name come from the newest checkpoint in DIR when there is one. Prints one JSON line:
//   {"report": "DIR/report.html", "markdown": "DIR/report.md", "steps", "final_train_loss",
//    "final_eval_loss", "train_points", "eval_points"}
#pragma once

#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/train/checkpoint.hpp>
#include <edl/train/report.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_report(Args& args) {
  namespace fs = std::filesystem;
  const auto& pos = args.positional();
  EDL_CLI_USAGE_CHECK(pos.size() == 1, errc::invalid_argument, "edl report",
                      "expected one run folder (the save_directory), found ", pos.size(), " arguments");
  args.finish();
  const std::string dir = pos.front();
  const std::string metrics = (fs::path(dir) / "metrics.jsonl").string();
  EDL_CHECK(fs::exists(metrics), errc::io, dir, "no metrics.jsonl: not the save_directory of a training run");
  train::RunReport rep = train::report_from_metrics(metrics);
  if (auto latest = train::CheckpointManager(dir).latest()) {
    const auto cfg = models::LlamaConfig::from_file((fs::path(*latest) / "config.json").string());
    rep.summary.parameters = models::LlamaForCausalLM<>(cfg).param_count();
    const auto s = train::TrainState::from_file((fs::path(*latest) / "state.json").string());
    if (s.training_arguments.is_object() && s.training_arguments.contains("model_name") &&
        s.training_arguments["model_name"].is_string())
      rep.summary.model_name = s.training_arguments["model_name"].get<std::string>();
  }
  train::write_report(dir, rep);
  nlohmann::ordered_json j;
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr); };
  j["report"] = (fs::path(dir) / "report.html").string();
  j["markdown"] = (fs::path(dir) / "report.md").string();
  j["steps"] = rep.summary.steps;
  j["final_train_loss"] = opt(rep.summary.final_train_loss);
  j["final_eval_loss"] = opt(rep.summary.final_eval_loss);
  j["train_points"] = rep.train_loss.size();
  j["eval_points"] = rep.eval_loss.size();
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command report_command() {
  return {.name = "report",
          .group = "training",
          .summary = "(re)write a training run's report (report.md, report.html, loss and learning-rate charts)",
          .synopsis = "DIR",
          .positional = "DIR",
          .positional_help = "the run's save_directory (with metrics.jsonl)",
          .examples = {"edl report build/fortunes-run"},
          .run = cmd_report};
}

}  // namespace edl::cli
