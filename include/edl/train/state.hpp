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
// (the mesh's reductions run in another order). The rest of the seeds' state protocol:
//
//   st.init_tx({.kind = optim::OptimizerKind::lion});       // a new optimizer, fresh slots
//   auto sm = st.shard_model(mesh);                        // the model alone on a mesh
//   auto sh = st.shard_state(mesh, my_rules);              // user partition rules
//   auto specs = sh.shardings();                           // name -> spec, parameters and slots
//   auto again = st.shard_with_shape(mesh, specs);         // the state laid out by those specs
//   st.save_state(dir, {.float_dtype = DType::bf16, .save_optimizer = false});  // a bf16 weights-only copy
//   auto st2 = TrainingState<>::load_state(dir, {.optimizer = o, .config_overrides = {{"rope_theta", 5e5}}}); save_state writes the Trainer's checkpoint
// layout (train/checkpoint.hpp: config.json, model.safetensors, optimizer.safetensors,
// state.json), so a TrainingState saved here resumes a Trainer run and the other way round.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
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
#include <edl/tensor/partition_rules.hpp>
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

/// The layout of a sharded state (the seeds' shardings): each parameter's spec by its HF name,
/// and each optimizer slot's by "<parameter>.<slot>" (as optimizer files name them).
using Shardings = std::map<std::string, SpecValue>;

/// What load_state takes in place of what the checkpoint says.
struct LoadStateOptions {
  /// The optimizer's kind and hyper-parameters; none: the checkpoint's own (its optimizer files
  /// record them). A weights-only checkpoint needs them.
  std::optional<optim::OptimizerOptions> optimizer;
  /// config.json fields replaced before the model is built (the seeds' config_kwargs), e.g.
  /// rope_theta or max_position_embeddings; the weights must still fit the shapes.
  nlohmann::ordered_json config_overrides = nullptr;
};

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

  /// A new optimizer of options `o` (the seeds' init_tx): fresh slots, step count 0; the
  /// state's step and the model stay.
  void init_tx(optim::OptimizerOptions o) { optimizer = optim::Optimizer(o); }

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

  /// The state on `mesh`: parameters split by `rules` (the Llama partition rules unless
  /// given), the optimizer state like the parameters it belongs to (ZeRO), the step carried over.
  ShardedTrainingState<Pol> shard_state(const DefaultMesh& mesh, PartitionRules rules = llama_partition_rules()) const;

  /// The state on `mesh` laid out by `shardings` (the seeds' shard_with_shape; what
  /// ShardedTrainingState::shardings returns): every parameter needs its spec; an optimizer
  /// slot's entry, when given, must be its parameter's (slots follow their parameter).
  ShardedTrainingState<Pol> shard_with_shape(const DefaultMesh& mesh, const Shardings& shardings) const;

  /// The model alone on `mesh` (the seeds' shard_model); the state, optimizer included, is unchanged.
  std::unique_ptr<models::ShardedLlama<Pol>> shard_model(const DefaultMesh& mesh,
                                                          PartitionRules rules = llama_partition_rules()) const {
    return std::make_unique<models::ShardedLlama<Pol>>(model, mesh, std::move(rules));
  }

  /// Writes a checkpoint folder atomically (train::save_state; a crash leaves no partial
  /// folder), with the weights in `o.float_dtype` and without the optimizer if asked.
  void save_state(const std::string& dir, const SaveStateOptions& o = {}, const CheckpointHooks& hooks = {}) const {
    TrainState s;
    s.step = step;
    train::save_state(dir, const_cast<Model&>(model), optimizer, s, nullptr, hooks, ProcessGroup{}, o);
  }

  /// Reads a checkpoint folder written by save_state or by the Trainer; errors name the
  /// folder and what is missing. The optimizer is the checkpoint's (kind, hyper-parameters,
  /// slots, step count) unless `o.optimizer` names another kind or hyper-parameters for the
  /// saved slots; a weights-only checkpoint gets a fresh optimizer of `o.optimizer`. The
  /// weights convert to the policy's parameter dtype (a bf16 copy loads into f32 exactly).
  static TrainingState load_state(const std::string& dir, const LoadStateOptions& o = {}) {
    namespace fs = std::filesystem;
    const fs::path config_path = fs::path(dir) / "config.json";
    EDL_CHECK(fs::exists(config_path), errc::io, dir, "not a checkpoint folder: config.json is missing");
    const fs::path state_path = fs::path(dir) / "state.json";
    EDL_CHECK(fs::exists(state_path), errc::io, dir, "not a complete checkpoint: state.json is missing");
    models::LlamaConfig cfg = models::LlamaConfig::from_file(config_path.string());
    if (!o.config_overrides.is_null()) {
      EDL_CHECK(o.config_overrides.is_object(), errc::invalid_argument, "LoadStateOptions::config_overrides",
                "expected an object of config.json fields, found ", o.config_overrides.type_name());
      nlohmann::ordered_json j = cfg.to_json();
      for (const auto& [k, v] : o.config_overrides.items()) j[k] = v;
      cfg = models::LlamaConfig::from_json(j, config_path.string() + " with config_overrides");
      cfg.validate();
    }
    Model m(cfg);
    std::optional<optim::Optimizer> opt;
    if (o.optimizer) {
      opt.emplace(*o.optimizer);
    } else {
      EDL_CHECK(TrainState::from_file(state_path.string()).optimizer_saved, errc::invalid_argument, dir,
                "is a weights-only checkpoint: LoadStateOptions::optimizer must give the optimizer to start");
      const std::string first = optimizer_files(dir).front();
      opt.emplace(saved_optimizer_options(io::SafeTensorsFile::open(first), first).first);
    }
    const TrainState s = train::load_state(dir, m, *opt);
    return TrainingState{s.step, std::move(m), std::move(*opt)};
  }
  /// load_state with the optimizer's kind and hyper-parameters given.
  static TrainingState load_state(const std::string& dir, optim::OptimizerOptions o) {
    LoadStateOptions lo;
    lo.optimizer = o;
    return load_state(dir, lo);
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
  /// The one-device model alone (the seeds' gather_model); the optimizer state stays sharded.
  models::LlamaForCausalLM<Pol> gather_model() const { return model->gather_model(); }

  /// Every parameter's spec and every optimizer slot's (those this process's devices hold;
  /// before the first update the optimizer has none).
  Shardings shardings() const {
    Shardings out;
    for (const auto& name : model->names()) out.emplace(name, model->param(name).layout().spec());
    const CollectiveBackend& be = model->mesh().backend();
    for (std::int64_t d = 0; d < model->mesh().size(); ++d)
      if (be.is_local(d))
        optimizer->device(d).visit_state([&](const std::string& path, const std::string& slot, const std::vector<float>&) {
          out.emplace(path + "." + slot, model->param(path).layout().spec());
        });
    return out;
  }
};

template <PolicyLike Pol>
ShardedTrainingState<Pol> TrainingState<Pol>::shard_state(const DefaultMesh& mesh, PartitionRules rules) const {
  ShardedTrainingState<Pol> s;
  s.step = step;
  s.model = std::make_unique<models::ShardedLlama<Pol>>(model, mesh, std::move(rules));
  s.optimizer = std::make_unique<optim::ShardedOptimizer<models::ShardedLlama<Pol>>>(optimizer.options(), *s.model);
  s.optimizer->load(optimizer, *s.model);
  return s;
}

template <PolicyLike Pol>
ShardedTrainingState<Pol> TrainingState<Pol>::shard_with_shape(const DefaultMesh& mesh, const Shardings& shardings) const {
  // Each parameter's spec becomes a rule matching its name alone.
  const auto exact = [](const std::string& name) {
    std::string re = "^";
    for (char c : name) {
      if (std::string_view(".[]{}()*+?^$|\\").find(c) != std::string_view::npos) re += '\\';
      re += c;
    }
    return re + "$";
  };
  PartitionRules rules;
  std::map<std::string, const SpecValue*> params;
  const_cast<Model&>(model).visit_params("", [&](std::string_view path, auto&) {
    const std::string name(path);
    const auto it = shardings.find(name);
    EDL_CHECK(it != shardings.end(), errc::invalid_argument, "shard_with_shape", "no spec for parameter \"", name,
              "\": every parameter of the model needs one");
    rules.add(exact(name), it->second);
    params.emplace(name, &it->second);
  });
  for (const auto& [key, spec] : shardings) {
    if (params.count(key)) continue;
    const auto dot = key.rfind('.');
    const auto owner = dot == std::string::npos ? params.end() : params.find(key.substr(0, dot));
    EDL_CHECK(owner != params.end(), errc::invalid_argument, "shard_with_shape", "\"", key,
              "\" is neither a parameter of the model nor an optimizer slot (<parameter>.<slot>) of one");
    EDL_CHECK(spec.dims == owner->second->dims, errc::invalid_argument, "shard_with_shape", "optimizer slot \"", key,
              "\" has spec ", spec.str(), " but its parameter has ", owner->second->str(),
              ": slots are laid out like their parameter");
  }
  return shard_state(mesh, std::move(rules));
}

}  // namespace edl::train
