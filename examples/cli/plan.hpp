// examples/cli/plan.hpp: `edl plan` prints the pre-flight plan of a Llama step on a mesh
// (models/llama/plan.hpp) without allocating any tensor: only the config is read.
//
//   edl plan --model DIR | --config tiny|small|gqa1b|FILE.json  --mesh dp=..,fsdp=..,tp=..,sp=..
//            [--batch B] [--seq S] [--train] [--optimizer adamw|sgd|lion|adafactor|rmsprop] [--momentum M]
//            [--dtype f32|bf16|f16] [--threads T] [--chunk-rows C] [--remat none|nothing_saveable]
//
// --batch defaults to dp * fsdp (one row per data-parallel rank), --seq to the config's
// max_position_embeddings. Without --train the plan is the loss-only forward: no gradients,
// no optimizer state. Prints one JSON object (docs/distributed.md, "The pre-flight plan").
#pragma once

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/mesh/mesh_shape.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/plan.hpp>
#include <edl/optim/optimizer.hpp>
#include "args.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

inline int cmd_plan(Args& args) {
  const std::string where = "edl plan";
  const bool has_model = args.has("--model"), has_config = args.has("--config");
  const std::string model_dir = args.str("--model", ""), config = args.str("--config", "");
  const MeshDims dims = mesh_flag(args);
  const bool train = args.has("--train");
  const std::string optimizer = args.str("--optimizer", "adamw");
  const double momentum = args.number("--momentum", 0.0);
  const std::string dtype = args.str("--dtype", "f32");
  const std::int64_t threads = args.integer("--threads", exec::num_threads());
  const std::int64_t chunk_rows = args.integer("--chunk-rows", 1024);
  const std::string remat = args.str("--remat", "none");
  EDL_CLI_USAGE_CHECK(remat == "none" || remat == "nothing_saveable", errc::invalid_argument, "--remat",
                      "expected none or nothing_saveable (whole layers run again in backward, the policy meshes run), found \"",
                      remat, "\"");
  const bool has_batch = args.has("--batch"), has_seq = args.has("--seq");
  const std::int64_t batch_flag = args.integer("--batch", 0), seq_flag = args.integer("--seq", 0);
  args.finish();
  EDL_CLI_USAGE_CHECK(has_model != has_config, errc::invalid_argument, where,
                      "give exactly one of --model DIR (its config.json) or --config tiny|small|gqa1b|FILE.json");

  models::LlamaConfig cfg;
  std::string name;
  if (has_model) {
    EDL_CLI_USAGE_CHECK(!model_dir.empty(), errc::invalid_argument, "--model", "expected a checkpoint folder");
    cfg = models::LlamaConfig::from_file((std::filesystem::path(model_dir) / "config.json").string());
    name = model_dir;
  } else if (config.ends_with(".json")) {  // an HF config.json: plan a model before owning it
    cfg = models::LlamaConfig::from_file(config);
    name = config;
  } else {
    EDL_CLI_USAGE_CHECK(!config.empty(), errc::invalid_argument, "--config",
                        "expected a preset (tiny, small, gqa1b, small_moe, small_wide) or an HF config.json file");
    cfg = models::LlamaConfig::preset(config);
    name = config;
  }
  const MeshShape mesh({"dp", "fsdp", "ep", "tp", "sp"}, {dims[0], dims[1], dims[2], dims[3], dims[4]});  // no devices are started

  models::PlanOptions o;
  o.batch = has_batch ? batch_flag : dims[0] * dims[1] * dims[2];
  o.seq = has_seq ? seq_flag : cfg.max_position_embeddings;
  EDL_CLI_USAGE_CHECK(o.batch > 0, errc::invalid_argument, "--batch", "must be > 0, found ", o.batch);
  EDL_CLI_USAGE_CHECK(o.seq > 0, errc::invalid_argument, "--seq", "must be > 0, found ", o.seq);
  EDL_CLI_USAGE_CHECK(threads > 0, errc::invalid_argument, "--threads", "must be > 0, found ", threads);
  EDL_CLI_USAGE_CHECK(momentum >= 0, errc::invalid_argument, "--momentum", "must be >= 0, found ", momentum);
  o.train = train;
  o.optimizer.kind = optim::optimizer_from_name(optimizer);
  o.optimizer.momentum = momentum;
  o.param_dtype = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : DType::f32;
  o.threads = threads;
  o.chunk_rows = chunk_rows;
  o.remat = train && remat == "nothing_saveable";
  const models::MemoryPlan p = models::plan_llama(cfg, mesh, o);

  nlohmann::ordered_json j;
  j["model"] = name;
  j["mesh"] = mesh_json(dims);
  j["devices"] = p.devices;
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["train"] = train;
  j["dtype"] = dtype;
  j["optimizer"] = train ? nlohmann::ordered_json(optimizer) : nlohmann::ordered_json(nullptr);
  j["remat"] = o.remat ? "nothing_saveable" : "none";
  j["parameters"] = p.parameters;
  nlohmann::ordered_json d;
  d["parameter_bytes"] = p.parameter_bytes;
  if (cfg.is_moe()) d["expert_parameter_bytes"] = p.expert_parameter_bytes;
  d["gradient_bytes"] = p.gradient_bytes;
  d["optimizer_state_bytes"] = p.optimizer_state_bytes;
  d["gathered_bytes"] = p.gathered_bytes;
  d["activation_peak_bytes"] = p.activation_peak_bytes;
  d["staging_bytes"] = p.staging_bytes;
  d["peak_bytes"] = p.peak_bytes;
  d["local_batch"] = p.local_batch;
  d["local_seq"] = p.local_seq;
  d["local_tokens"] = p.local_tokens;
  j["per_device"] = d;
  nlohmann::ordered_json cs = nlohmann::ordered_json::array();
  std::int64_t total = 0;
  for (const auto& c : p.collectives) {
    nlohmann::ordered_json e;
    e["op"] = c.op;
    e["axes"] = c.axes;
    e["group"] = c.group;
    e["what"] = c.what;
    e["calls"] = c.calls;
    e["payload_bytes"] = c.payload_bytes;
    e["wire_bytes"] = c.wire_bytes;
    cs.push_back(e);
    total += c.wire_bytes;
  }
  nlohmann::ordered_json step;
  step["collectives"] = cs;
  nlohmann::ordered_json by = nlohmann::ordered_json::object();
  for (const auto& [axes, bytes] : p.wire_bytes_by_axes()) by[axes] = bytes;
  step["wire_bytes_by_axes"] = by;
  step["wire_bytes"] = total;
  j["per_step"] = step;
  std::cout << j.dump(2) << "\n";
  return 0;
}

inline Command plan_command() {
  return {
      .name = "plan",
      .group = "training",
      .summary = "the memory and collectives of a Llama step on a mesh, from the config alone (no tensor allocated)",
      .synopsis = "(--model DIR | --config tiny|small|gqa1b|FILE.json) --mesh dp=..,fsdp=..,ep=..,tp=..,sp=.. [--batch B] [--seq S] [--train] [flags]",
      .flags = {text_flag("--model", "DIR", "a folder whose config.json is planned (or --config)"),
                text_flag("--config", "tiny|small|gqa1b|FILE.json", "a preset config, or an HF config.json file (or --model)"),
                declare_mesh_flag("the mesh planned: any of dp, fsdp, ep, tp, sp with their sizes"),
                integer_flag("--batch", "B", "sequences per step").defaults("dp x fsdp"),
                integer_flag("--seq", "S", "tokens per sequence").defaults("max_position_embeddings"),
                switch_flag("--train", "plan a training step (gradients, optimizer state), not the loss-only forward"),
                text_flag("--optimizer", "", "the optimizer of --train")
                    .one_of({"adamw", "sgd", "lion", "adafactor", "rmsprop"})
                    .defaults("adamw"),
                number_flag("--momentum", "M", "sgd's and rmsprop's momentum (> 0 keeps a momentum buffer)").defaults("0"),
                text_flag("--dtype", "", "storage of the parameters").one_of({"f32", "bf16", "f16"}).defaults("f32"),
                integer_flag("--threads", "T", "threads per device, for the per-thread scratch").defaults("all cores"),
                integer_flag("--chunk-rows", "C", "rows of the chunked loss").defaults("1024"),
                text_flag("--remat", "none|nothing_saveable",
                          "with --train: keep every activation, or each layer's input only and run it again in backward")
                    .defaults("none")},
      .examples = {"edl plan --config gqa1b --mesh fsdp=2,tp=2 --batch 4 --seq 1024 --train",
                   "edl plan --model ckpt --mesh dp=2",
                   "edl plan --config Llama-2-7b-hf/config.json --mesh fsdp=8,tp=8 --batch 64 --seq 4096 --train"},
      .run = cmd_plan};
}

}  // namespace edl::cli
