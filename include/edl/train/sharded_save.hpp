// edl/train/sharded_save.hpp
// A training checkpoint written straight from a sharded model and its ZeRO optimizer: each
// process writes the blocks of its own devices, and nothing is gathered.
//
//   models::ShardedLlama<> sm(config, key, mesh);
//   optim::ShardedOptimizer<models::ShardedLlama<>> so(options, sm);
//   ...training...
//   save_sharded_state("out/checkpoint-300", sm, so, state);  // every process calls it
//
// The folder holds the files a one-device save_state writes for the gathered state, byte for
// byte: config.json, model.safetensors (or HF shards and their index), optimizer.safetensors
// with every slot as "<parameter>.<slot>" (whole tensors, flattened), tokenizer.json and
// state.json. So it loads in transformers, in load_state on one device and in
// load_sharded_state on any mesh shape. Rank 0 lays out every file first (headers and sizes,
// io::PlannedFolder); each process then writes at their places the distinct blocks its
// devices hold of the parameters and of every optimizer slot, and syncs; rank 0 commits
// (checkpoint.hpp's atomic protocol, unchanged: a kill at any point leaves the previous
// checkpoint the newest). A process's memory does not grow with the save.
// A LoRA run's checkpoint (the adapters alone, a PEFT folder) is written by save_state from
// the gathered adapters; this writes models without adapters.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/planned_safetensors.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/models/llama/sharded_save.hpp>
#include <edl/optim/sharded_optimizer.hpp>
#include <edl/train/checkpoint.hpp>

namespace edl::train {

namespace detail {

/// The slots of each trained parameter, by parameter. On a mesh of several devices every
/// parameter has the same slots (its kind decides them; adafactor, whose factored slots depend
/// on the shape, is refused there), taken from this process's devices, so every process lays
/// the file out alike, whichever blocks it holds. On one device, each parameter's own.
template <class ShardedModel>
std::map<std::string, std::set<std::string>> optimizer_slots(const optim::ShardedOptimizer<ShardedModel>& opt,
                                                             const ShardedModel& m) {
  std::map<std::string, std::set<std::string>> out;
  const auto& be = m.mesh().backend();
  if (m.mesh().size() == 1) {
    opt.device(0).visit_state([&](const std::string& p, const std::string& slot, const std::vector<float>&) {
      out[p].insert(slot);
    });
    return out;
  }
  std::set<std::string> slots;
  for (std::int64_t d = 0; d < m.mesh().size(); ++d)
    if (be.is_local(d))
      opt.device(d).visit_state([&](const std::string&, const std::string& slot, const std::vector<float>&) {
        slots.insert(slot);
      });
  if (!slots.empty())
    for (const auto& p : m.trainable_names()) out[p] = slots;
  return out;
}

/// optimizer.safetensors laid out as save_optimizer_part writes it for the gathered optimizer
/// (slots by parameter, then slot name, in name order; the same metadata).
template <class ShardedModel>
io::PlannedFolder optimizer_plan(const optim::ShardedOptimizer<ShardedModel>& opt, const ShardedModel& m,
                                 const std::map<std::string, std::set<std::string>>& slots) {
  io::TensorShapes shapes;
  for (const auto& [p, names] : slots)
    for (const auto& slot : names) {
      std::int64_t n = 1;
      for (auto x : m.param(p).layout().global_shape()) n *= x;
      // One device holds whole tensors, and a slot may have its own size there (adafactor's
      // factored moments); on larger meshes every slot has its parameter's elements.
      if (m.mesh().size() == 1) n = static_cast<std::int64_t>(opt.device(0).find_slot(p, slot)->size());
      shapes.emplace_back(p + "." + slot, io::TensorShape{DType::f32, {n}});
    }
  return io::PlannedFolder(shapes, std::numeric_limits<std::uint64_t>::max(),
                           {{"format", "edl"},
                            {"optimizer", optim::optimizer_name(opt.options().kind)},
                            {"step_count", std::to_string(opt.step_count())},
                            {"options", optimizer_options_json(opt.options()).dump()},
                            {"part", "1"},
                            {"parts", "1"}},
                           optimizer_file_name(0, 1));
}

/// Writes this process's blocks of every optimizer slot (laid out by optimizer_plan).
template <class ShardedModel>
void write_optimizer_blocks(io::PlannedWriter& w, const optim::ShardedOptimizer<ShardedModel>& opt,
                            const ShardedModel& m, const std::map<std::string, std::set<std::string>>& slots,
                            models::ShardedSaveStats& st) {
  const auto& be = m.mesh().backend();
  for (const auto& [p, names] : slots)
    for (const auto& slot : names) {
      const std::string name = p + "." + slot;
      auto block = [&](std::int64_t d) {
        const std::vector<float>* v = opt.device(d).find_slot(p, slot);
        EDL_CHECK(v != nullptr, errc::invalid_argument, name, "device ", d, " does not hold this optimizer slot");
        return std::span<const float>(*v);
      };
      if (m.mesh().size() == 1) {  // whole tensors, of the slot's own size
        if (be.is_local(0)) {
          const auto v = block(0);
          w.write(name, 0, std::as_bytes(v));
          st.bytes_written += static_cast<std::int64_t>(v.size_bytes());
          ++st.blocks_written;
        }
        continue;
      }
      // The slot is the parameter's tensor flattened: its blocks are the parameter's.
      models::detail::write_local_blocks<float>(w, name, m.param(p).layout(), be, DType::f32, 0, block, st);
    }
}

}  // namespace detail

/// Writes a complete checkpoint of a sharded run to `dir` atomically (see the header
/// comment). `processes`: the processes of the model's mesh (every one calls this).
template <class Pol>
models::ShardedSaveStats save_sharded_state(const std::string& dir, const models::ShardedLlama<Pol>& model,
                                            const optim::ShardedOptimizer<models::ShardedLlama<Pol>>& opt,
                                            const TrainState& state, const tokenizer::Tokenizer* tokenizer = nullptr,
                                            const CheckpointHooks& hooks = {}, const ProcessGroup& processes = {},
                                            const SaveStateOptions& contents = {}) {
  using T = typename Pol::param_t;
  EDL_CHECK(!model.has_adapters(), errc::unsupported, dir,
            "save_sharded_state writes a model without LoRA adapters (a LoRA run's checkpoint is the adapters alone: "
            "save_state on the gathered state)");
  const int mesh_processes = ProcessGroup(model.mesh()).size();
  EDL_CHECK(processes.size() == mesh_processes, errc::invalid_argument, dir, "the processes that save (",
            processes.size(), ") are not those of the model's mesh (", mesh_processes, ")");
  auto after = [&](const std::string& f) {
    if (hooks.after_file) hooks.after_file(f);
  };
  const DType dtype = contents.float_dtype.value_or(dtype_v<T>);
  const io::PlannedFolder weights(models::saved_tensor_shapes(model, dtype), models::SavePretrainedOptions{}.max_shard_bytes,
                                  {{"format", "pt"}});
  const auto slots = detail::optimizer_slots(opt, model);
  const io::PlannedFolder optimizer = detail::optimizer_plan(opt, model, slots);
  TrainState s = state;
  s.optimizer_step_count = contents.save_optimizer ? opt.step_count() : 0;
  s.optimizer_saved = contents.save_optimizer;
  models::ShardedSaveStats st;
  detail::commit_checkpoint(
      dir, s, hooks, processes,
      [&](const fs::path& tmp) {  // rank 0: every file's layout, the config and the tokenizer
        weights.create(tmp);
        models::detail::saved_config<models::LlamaForCausalLM<Pol>>(model.config(), dtype).save((tmp / "config.json").string());
        if (contents.save_optimizer) optimizer.create(tmp);
        if (tokenizer) {
          tokenizer->save(tmp.string());
          after("tokenizer.json");
        }
      },
      [&](const fs::path& tmp) {  // every rank: its blocks
        io::PlannedWriter w(tmp, weights);
        models::write_parameter_blocks(w, model, dtype, st);
        w.sync();
        after("model.safetensors");  // on every rank: its part is written
        if (!contents.save_optimizer) return;
        io::PlannedWriter o(tmp, optimizer);
        detail::write_optimizer_blocks(o, opt, model, slots, st);
        o.sync();
        after(optimizer_file_name(0, 1));
      });
  return st;
}

/// Saves checkpoint-<step> of a sharded run with `manager` and prunes (CheckpointManager::save
/// for a sharded state). Returns its path.
template <class Pol>
std::string save_sharded_checkpoint(const CheckpointManager& manager, const models::ShardedLlama<Pol>& model,
                                    const optim::ShardedOptimizer<models::ShardedLlama<Pol>>& opt,
                                    const TrainState& state, const tokenizer::Tokenizer* tokenizer = nullptr,
                                    const CheckpointHooks& hooks = {}, const ProcessGroup& processes = {}) {
  const std::string p = manager.path_for(state.step);
  save_sharded_state(p, model, opt, state, tokenizer, hooks, processes);
  if (processes.is_primary()) manager.prune();
  return p;
}

}  // namespace edl::train
