// examples/cli/bench_train.hpp: `edl bench train` times Llama training steps (forward + loss +
// backward; no optimizer yet).
//
//   edl bench train --config tiny|small|gqa1b|DIR --batch B --seq S --threads T [--mesh ...] [--steps N]
//                   [--remat everything_saveable|nothing_saveable|dots_saveable|dots_with_no_batch_dims_saveable|
//                            save_only_these_names(attn_out, ...)|...]
//                   [--param-dtype float32|bfloat16] [--dtype float32|bfloat16] [--lora R [--quantize-base nf4|q4_0|q8_0]] [--optimizer-step]
//
// --config names a preset (random weights from Key seed 0, initializer_range) or a HF folder
// (weights loaded). Tokens are uniform random ids (seed 0); labels = tokens (HF shift). One
// warm-up step, then N timed steps (default 3). Prints one JSON line:
//   {"config", "batch", "seq", "threads", "mesh": {"dp","fsdp","tp","sp"}, "tokens_per_s",
//    "ms_per_step", "peak_bytes", "params", "flops_per_token", "gflops"}
// ms_per_step is the median step; tokens_per_s = batch * seq / median step. peak_bytes is the
// process's peak resident set (VmHWM of /proc/self/status; 0 where unavailable), so it includes
// everything the process ever held, not only the model. flops_per_token = 3 x forward FLOPs
// (matmul-like work, multiply-add = 2, attention pairs counted causally) / tokens; gflops =
// flops_per_token x tokens_per_s / 1e9. --param-dtype bfloat16 runs the step of the trainer's
// mixed precision (BF16ParamsPolicy: bf16 weights; f32 gradients, activations and
// accumulation), the weights rounded from the same f32 initialization. --dtype bfloat16 runs
// it with bf16 activations (Policy's Compute: every activation rounded to bf16, f32
// accumulation), as the trainer's dtype "bfloat16" does.
// --lora R trains LoRA adapters of rank R (lora_alpha 2R) on q, k, v, o, gate, up and down with
// the rest frozen; --quantize-base quantizes the base's decoder Linears first (QLoRA).
// --optimizer-step adds an AdamW update to every step (its state then counts in the peak).
// On a mesh the model is sharded once, before the steps, and a step is the sharded forward,
// loss and backward (and the ZeRO optimizer's update), as the trainer runs it. On a mesh
// (without --lora) a random preset is drawn, and a folder's weights read
// (models::from_pretrained_sharded), straight into the blocks each process stores, so no
// process builds the whole model; rank_peak_bytes and rank_train_peak_bytes then list every
// process's peak_bytes and train_peak_bytes by rank (one process: one entry).
// train_peak_bytes is the peak resident set of the timed steps alone: after the model is
// built, freed pages are returned to the system (malloc_trim) and the peak is reset
// (/proc/self/clear_refs), so a QLoRA base drawn in f32 and then quantized is counted at its
// quantized size. trainable_params counts the parameters that get gradients.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/rng.hpp>
#include <edl/lora/apply.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/sharded_optimizer.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>
#include <edl/core/process_memory.hpp>
#include "args.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

/// The layers' drop mask of --remat's policy (remat::parse: a name, or a call such as
/// save_only_these_names(attn_out, gate)); a policy that does not parse is a usage error.
inline remat::DropMask remat_drop_mask(const std::string& name) {
  try {
    return remat::parse(name, "--remat");
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.code(), e.where(), e.message());
  }
}

/// edl bench train --config tiny|small|DIR --batch B --seq S --threads T [--mesh ...] [--steps N]
inline int cmd_bench_train(Args& args) {
  const std::string where = "edl bench train";
  const std::string config = args.required("--config");
  const std::int64_t batch = args.integer("--batch", 8), seq = args.integer("--seq", 256);
  const std::int64_t threads = args.integer("--threads", exec::num_threads());
  const std::int64_t steps = args.integer("--steps", 3);
  const std::string remat_name = args.str("--remat", "everything_saveable");
  const MeshDims mesh = mesh_flag(args);
  const std::string param_dtype = args.str("--param-dtype", "float32");
  const std::string compute_dtype = args.str("--dtype", "float32");
  const std::int64_t lora_r = args.integer("--lora", 0);
  const std::string quantize_base = args.str("--quantize-base", "");
  const bool optimizer_step = args.has("--optimizer-step");
  args.finish();
  EDL_CLI_USAGE_CHECK(lora_r >= 0, errc::invalid_argument, "--lora", "must be >= 0, found ", lora_r);
  EDL_CLI_USAGE_CHECK(quantize_base.empty() || lora_r > 0, errc::invalid_argument, "--quantize-base",
                      "a quantized base is frozen: add --lora R");
  const bool bf16 = param_dtype == "bfloat16" || param_dtype == "bf16";
  EDL_CLI_USAGE_CHECK(bf16 || param_dtype == "float32" || param_dtype == "fp32" || param_dtype == "f32", errc::invalid_argument,
                      "--param-dtype", "expected float32 or bfloat16, found \"", param_dtype, "\"");
  const bool bf16_compute = compute_dtype == "bfloat16" || compute_dtype == "bf16";
  EDL_CLI_USAGE_CHECK(bf16_compute || compute_dtype == "float32" || compute_dtype == "fp32" || compute_dtype == "f32",
                      errc::invalid_argument, "--dtype", "expected float32 or bfloat16, found \"", compute_dtype, "\"");
  EDL_CLI_USAGE_CHECK(!remat_name.empty(), errc::invalid_argument, "--remat", "expected a policy, found an empty value");
  const remat::DropMask drop = remat_drop_mask(remat_name);
  EDL_CLI_USAGE_CHECK(batch > 0, errc::invalid_argument, "--batch", "must be > 0, found ", batch);
  EDL_CLI_USAGE_CHECK(seq > 0, errc::invalid_argument, "--seq", "must be > 0, found ", seq);
  EDL_CLI_USAGE_CHECK(threads > 0, errc::invalid_argument, "--threads", "must be > 0, found ", threads);
  EDL_CLI_USAGE_CHECK(steps > 0, errc::invalid_argument, "--steps", "must be > 0, found ", steps);
  create_mesh(mesh);  // invalid mesh sizes fail before the model is built

  exec::set_num_threads(static_cast<int>(threads));
  models::LlamaForCausalLM<> f32_model;
  std::error_code ec;
  const bool from_folder = std::filesystem::is_directory(config, ec);
  // On a mesh a random preset is drawn, and a folder read, straight into the shards: no process
  // builds the whole model, so peak memory per process falls with the mesh as in a real run.
  const bool straight_into_shards = create_mesh(mesh).size() > 1 && lora_r == 0;
  if (straight_into_shards) {
    // The host model gives the shapes and FLOPs only: its values are never written, so its
    // pages never become resident.
    f32_model = models::LlamaForCausalLM<>(
        from_folder ? models::LlamaConfig::from_file((std::filesystem::path(config) / "config.json").string())
                    : models::LlamaConfig::preset(config));
  } else if (from_folder) {
    f32_model = models::from_pretrained<>(config);
  } else {
    f32_model = models::LlamaForCausalLM<>(models::LlamaConfig::preset(config));
    models::init(f32_model, Key::from_seed(0));
  }
  const std::int64_t V = f32_model.config().vocab_size, T = batch * seq;
  std::mt19937_64 gen(0);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(T));
  for (auto& v : ids) v = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(V));
  const nn::TokenLayout layout{batch, seq};
  const double flops_per_token = 3.0 * f32_model.flops_forward(batch, seq) / static_cast<double>(T);
  const auto params = models::parameter_count(f32_model);

  // QLoRA's quantized base, then the adapters (all seven projections, alpha = 2r).
  std::int64_t trainable = 0;
  auto prepare = [&](auto& model) {
    if (!quantize_base.empty()) nn::quantize(model, {quant::parse_format(quantize_base, "--quantize-base")});
    if (lora_r > 0) {
      lora::LoraConfig c;
      c.r = lora_r;
      c.lora_alpha = 2.0 * static_cast<double>(lora_r);
      c.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      lora::apply_lora(model, c);
    }
    model.visit_params("", [&](std::string_view, auto& p) { trainable += p.frozen ? 0 : p.numel(); });
  };
  optim::OptimizerOptions oo;
  oo.b2 = 0.95;
  optim::Optimizer opt(oo);
  bool peak_reset = false;
  std::vector<std::int64_t> rank_peaks, rank_train_peaks;  // each process's (on a mesh)
  std::int64_t build_peak = 0;  // the process's peak before the steps (the peak is reset then)
  // Median seconds of `steps` timed steps after one warm-up step (gradient buffers, page
  // faults, thread pool).
  // Median of `steps` timed calls of `step` after one warm-up call.
  auto median_of = [&](auto&& step) {
    step();
    std::vector<double> times;
    for (std::int64_t s = 0; s < steps; ++s) times.push_back(step());
    std::sort(times.begin(), times.end());
    const std::size_t n = times.size();
    return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  };
  const auto seconds_since = [](auto t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // On a mesh the model is sharded once and stays sharded across steps, as the trainer keeps
  // it: a step is the sharded forward, loss and backward (and the ZeRO optimizer update).
  auto time_sharded_steps = [&](auto& sm) {
    sm.set_remat(drop);
    optim::ShardedOptimizer<std::remove_cvref_t<decltype(sm)>> sopt(oo, sm);
    peak_reset = reset_peak_resident();
    const double sec = median_of([&] {
      const auto t0 = std::chrono::steady_clock::now();
      sm.zero_grad();
      sm.loss_and_grads(ids.data(), nullptr, batch, seq);
      if (optimizer_step) sopt.step(sm, 1e-4);
      return seconds_since(t0);
    });
    const ProcessGroup processes(sm.mesh());
    rank_train_peaks = processes.each(peak_reset ? peak_resident_bytes() : 0);
    rank_peaks = processes.each(std::max(build_peak, peak_resident_bytes()));
    return sec;
  };
  auto time_steps = [&](auto& model) {
    build_peak = peak_resident_bytes();
    if (create_mesh(mesh).size() == 1) {
      peak_reset = reset_peak_resident();
      return median_of([&] {
        const auto t0 = std::chrono::steady_clock::now();
        run_on_mesh(mesh, model, models::MeshOp::loss_and_grads, ids.data(), layout, nullptr, nullptr, remat_name);
        if (optimizer_step) opt.step(model, 1e-4);
        return seconds_since(t0);
      });
    }
    auto sm = models::shard_model(model, launch_mesh(mesh, "--mesh"));
    return time_sharded_steps(sm);
  };
  // The step of policy Pol: parameters drawn or read straight into the shards, or the f32
  // model converted (round to nearest even) with only the copy left resident.
  const auto run = [&]<class Pol>() -> double {
    if (straight_into_shards) {
      f32_model.visit_params("", [&](std::string_view, auto& p) { trainable += p.numel(); });
      auto sm = from_folder ? models::from_pretrained_sharded<Pol>(config, launch_mesh(mesh, "--mesh"))
                            : models::ShardedLlama<Pol>(f32_model.config(), Key::from_seed(0), launch_mesh(mesh, "--mesh"));
      build_peak = peak_resident_bytes();
      return time_sharded_steps(sm);
    }
    if constexpr (std::is_same_v<Pol, DefaultPolicy>) {
      prepare(f32_model);
      return time_steps(f32_model);
    } else {
      auto model = models::to_dtype<Pol>(f32_model);
      f32_model = models::LlamaForCausalLM<>();
      prepare(model);
      return time_steps(model);
    }
  };
  const double sec = bf16 ? (bf16_compute ? run.template operator()<BF16Policy>() : run.template operator()<BF16ParamsPolicy>())
                          : (bf16_compute ? run.template operator()<BF16ComputePolicy>() : run.template operator()<DefaultPolicy>());
  exec::set_num_threads(0);
  const double tps = static_cast<double>(T) / sec;
  const auto round2 = [](double x) { return std::round(x * 100.0) / 100.0; };
  nlohmann::ordered_json j;
  j["config"] = config;
  j["batch"] = batch;
  j["seq"] = seq;
  j["threads"] = threads;
  j["remat"] = remat_name;
  j["param_dtype"] = bf16 ? "bfloat16" : "float32";
  j["dtype"] = bf16_compute ? "bfloat16" : "float32";
  j["mesh"] = mesh_json(mesh);
  j["tokens_per_s"] = round2(tps);
  j["ms_per_step"] = round2(sec * 1e3);
  j["lora_r"] = lora_r;
  j["quantize_base"] = quantize_base.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(quantize_base);
  j["optimizer_step"] = optimizer_step;
  j["trainable_params"] = trainable;
  j["train_peak_bytes"] = peak_reset ? peak_resident_bytes() : 0;
  j["peak_bytes"] = std::max(build_peak, peak_resident_bytes());
  if (!rank_peaks.empty()) {
    j["rank_train_peak_bytes"] = rank_train_peaks;
    j["rank_peak_bytes"] = rank_peaks;
  }
  j["params"] = params;
  j["flops_per_token"] = std::round(flops_per_token);
  j["gflops"] = round2(flops_per_token * tps / 1e9);
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command bench_train_command() {
  const std::string remat_value = [&] {
    std::string v;
    for (const char* n : remat::runtime_names) v += (v.empty() ? "" : "|") + std::string(n);
    for (const char* n : remat::runtime_calls) v += "|" + std::string(n);
    return v;
  }();
  return {
      .name = "bench train",
      .group = "measuring",
      .summary = "time Llama training steps (forward + loss + backward): tokens/s, ms/step, GFLOP/s, peak memory",
      .synopsis = "--config tiny|small|gqa1b|DIR [--batch B] [--seq S] [--threads T] [--mesh ...] [--steps N] [flags]",
      .flags = {text_flag("--config", "tiny|small|gqa1b|DIR", "a preset (random weights) or an HF folder (weights loaded)")
                    .required(),
                integer_flag("--batch", "B", "sequences per step").defaults("8"),
                integer_flag("--seq", "S", "tokens per sequence").defaults("256"),
                integer_flag("--threads", "T", "threads of the step").defaults("all cores"),
                integer_flag("--steps", "N", "timed steps after one warm-up step").defaults("3"),
                text_flag("--remat", remat_value,
                          "the gradient-checkpointing policy (none: everything_saveable; a call names checkpoints: "
                          "norm1, q, k, v, ctx, attn_out, norm2, gate, up, act)")
                    .defaults("everything_saveable"),
                declare_mesh_flag("the mesh the step runs on (simulated devices)"),
                text_flag("--param-dtype", "float32|bfloat16", "parameter storage (bfloat16: the trainer's mixed precision)")
                    .one_of({"float32", "bfloat16", "f32", "fp32", "bf16"})
                    .defaults("float32"),
                text_flag("--dtype", "float32|bfloat16", "the activations' dtype (bfloat16: rounded to bf16, f32 accumulation)")
                    .one_of({"float32", "bfloat16", "f32", "fp32", "bf16"})
                    .defaults("float32"),
                integer_flag("--lora", "R", "train LoRA adapters of rank R on every projection, the rest frozen")
                    .defaults("0 (off)"),
                text_flag("--quantize-base", "", "quantize the base's decoder Linears first (QLoRA; needs --lora)")
                    .one_of({"nf4", "q4_0", "q8_0"}),
                switch_flag("--optimizer-step", "add an AdamW update to every step")},
      .examples = {"edl bench train --config tiny --batch 8 --seq 256 --threads 2",
                   "edl bench train --config small --lora 8 --quantize-base nf4 --param-dtype bfloat16"},
      .run = cmd_bench_train};
}

}  // namespace edl::cli
