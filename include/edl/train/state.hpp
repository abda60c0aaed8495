// edl/train/state.hpp: the training state as one value (EasyDeL's EasyDeLState): the step,
// the model's parameters and the optimizer state, with apply_gradients, shard_state /
// gather_state, its size in bytes and save_state / load_state. For users who write their own
// loop instead of running the Trainer:
//
//   auto st = train::TrainingState<>::create(std::move(model), {.kind = optim::OptimizerKind::adamw});
//   optim::zero_grad(st.model);
//   st.model.forward_backward(ids, layout, labels);       // gradients into Param::grad
//   st.apply_gradients(schedule.lr_at(st.step), 1.0);      // clip at 1.0, one AdamW step, step += 1
//   st.save_state("ckpt/checkpoint-100");                  // atomic; from_pretrained loads it
//
//   auto sh = st.shard_state(create_mesh({1, 2, 1, 1}));   // fsdp=2: parameters and optimizer
//   sh.model->zero_grad();                                 // state split (ZeRO), see
//   sh.model->loss_and_grads(tokens, labels, B, S);        // optim/sharded_optimizer.hpp
//   sh.apply_gradients(lr, 1.0);
//   auto back = sh.gather_state();                         // the one-device state again
//
// The same state on a mesh and on one device follows the same trajectory within f32 rounding
// (the mesh's reductions run in another order). save_state writes the Trainer's checkpoint
// layout (train/checkpoint.hpp: config.json, model.safetensors, optimizer.safetensors,
// state.json), so a TrainingState saved here resumes a Trainer run and the other way round.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/optim/clip.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/sharded_optimizer.hpp>
#include <edl/train/checkpoint.hpp>

namespace edl::train {

/// Bytes a training state holds (on one device, or on device d of a mesh).
struct StateBytes {
  std::int64_t parameters = 0;  // in the parameter dtype
  std::int64_t gradients = 0;   // f32
  std::int64_t optimizer = 0;   // f32 slots (and f32 master weights for bf16 parameters)
  std::int64_t total() const noexcept { return parameters + gradients + optimizer; }
};

template <PolicyLike Pol>
struct ShardedTrainingState;

/// Step, model and optimizer of a one-device run.
template <PolicyLike Pol = DefaultPolicy>
struct TrainingState {
  using Model = models::LlamaForCausalLM<Pol>;

  std::int64_t step = 0;  // optimizer updates applied
  Model model;
  optim::Optimizer optimizer;

  /// Step 0 of `model` with an empty optimizer of options `o` (its slots appear at the first update).
  static TrainingState create(Model model, optim::OptimizerOptions o) {
    return TrainingState{0, std::move(model), optim::Optimizer(o)};
  }

  /// One update from the gradients in the model's Param::grad: global-norm clipping to
  /// `max_norm` (<= 0: none), then the optimizer at learning rate `lr`; step += 1. Returns the
  /// gradient norm before clipping. A non-finite norm is an error and changes nothing.
  double apply_gradients(double lr, double max_norm = 0.0) {
    const double norm = optim::clip_by_global_norm(model, max_norm);
    EDL_CHECK(std::isfinite(norm), errc::invalid_argument, "TrainingState::apply_gradients",
              "the gradient norm is ", norm, " at step ", step, "; the parameters were not updated");
    optimizer.step(model, lr);
    ++step;
    return norm;
  }

  /// Parameters, gradients (allocated or not) and optimizer state.
  StateBytes size_bytes() const {
    StateBytes b;
    const_cast<Model&>(model).visit_params("", [&](std::string_view, auto& p) {
      b.parameters += p.numel() * static_cast<std::int64_t>(sizeof(*p.data()));
      if (p.has_grad()) b.gradients += p.numel() * static_cast<std::int64_t>(sizeof(float));
    });
    b.optimizer = optimizer.state_bytes();
    return b;
  }

  /// The state on `mesh`: parameters split by the Llama partition rules, the optimizer state
  /// like the parameters it belongs to (ZeRO), the step carried over.
  ShardedTrainingState<Pol> shard_state(const DefaultMesh& mesh) const;

  /// Writes a checkpoint folder atomically (train::save_state; a crash leaves no partial folder).
  void save_state(const std::string& dir, const CheckpointHooks& hooks = {}) const {
    TrainState s;
    s.step = step;
    train::save_state(dir, const_cast<Model&>(model), optimizer, s, nullptr, hooks);
  }

  /// Reads a checkpoint folder written by save_state or by the Trainer; errors name the
  /// folder and what is missing. `o` gives the optimizer kind and hyperparameters (the
  /// checkpoint holds only its slots).
  static TrainingState load_state(const std::string& dir, optim::OptimizerOptions o) {
    namespace fs = std::filesystem;
    EDL_CHECK(fs::exists(fs::path(dir) / "config.json"), errc::io, dir,
              "not a checkpoint folder: config.json is missing");
    Model m(models::LlamaConfig::from_file((fs::path(dir) / "config.json").string()));
    optim::Optimizer opt(o);
    const TrainState s = train::load_state(dir, m, opt);
    return TrainingState{s.step, std::move(m), std::move(opt)};
  }
};

/// Step, model and optimizer split over a mesh (models::ShardedLlama, optim::ShardedOptimizer).
template <PolicyLike Pol>
struct ShardedTrainingState {
  using ShardedModel = models::ShardedLlama<Pol>;

  std::int64_t step = 0;
  std::unique_ptr<ShardedModel> model;
  std::unique_ptr<optim::ShardedOptimizer<ShardedModel>> optimizer;

  /// As TrainingState::apply_gradients, on every device's blocks; the norm is the mesh-wide one.
  double apply_gradients(double lr, double max_norm = 0.0) {
    const double norm = optimizer->clip_by_global_norm(*model, max_norm);
    EDL_CHECK(std::isfinite(norm), errc::invalid_argument, "ShardedTrainingState::apply_gradients",
              "the gradient norm is ", norm, " at step ", step, "; the parameters were not updated");
    optimizer->step(*model, lr);
    ++step;
    return norm;
  }

  /// Bytes device `d` holds: its parameter blocks, their gradients (once allocated) and its
  /// optimizer slots. Summed over an fsdp axis this is the one-device size.
  StateBytes size_bytes(std::int64_t d) const {
    StateBytes b;
    b.parameters = model->param_bytes(d);
    if (model->has_grads())
      for (const auto& n : model->trainable_names())
        b.gradients += static_cast<std::int64_t>(model->grad(n).local(d).size() * sizeof(float));
    b.optimizer = optimizer->state_bytes(d);
    return b;
  }

  /// The one-device state (every process of a multi-process mesh calls it).
  TrainingState<Pol> gather_state() const {
    return TrainingState<Pol>{step, model->gather_model(), optimizer->gather(*model)};
  }
};

template <PolicyLike Pol>
ShardedTrainingState<Pol> TrainingState<Pol>::shard_state(const DefaultMesh& mesh) const {
  ShardedTrainingState<Pol> s;
  s.step = step;
  s.model = std::make_unique<models::ShardedLlama<Pol>>(model, mesh);
  s.optimizer = std::make_unique<optim::ShardedOptimizer<models::ShardedLlama<Pol>>>(optimizer.options(), *s.model);
  s.optimizer->load(optimizer, *s.model);
  return s;
}

}  // namespace edl::train
