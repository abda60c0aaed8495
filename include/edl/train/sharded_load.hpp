// edl/train/sharded_load.hpp
// Loading a training checkpoint straight into a sharded model and its ZeRO optimizer: each
// process copies only the blocks of its own devices out of the memory-mapped files.
//
//   models::ShardedLlama<> sm(config_model, mesh);            // any mesh shape, any processes
//   optim::ShardedOptimizer<models::ShardedLlama<>> so(options, sm);
//   ShardedLoadStats st;
//   TrainState s = load_sharded_state("out/checkpoint-300", sm, so, &st);
//
// The checkpoint holds whole tensors (model.safetensors, or the HF index of shards, and the
// optimizer slots in optimizer.safetensors or the N parts of N saving processes; see
// checkpoint.hpp), so it loads on any mesh shape: each device's block is the block at its
// offset of the saved tensor, bit for bit (resharding is copying other blocks). Nothing is
// gathered and no whole tensor is materialised: a process reads (and, the files being mapped,
// pages in from disk) the blocks its devices hold and nothing else, so on fsdp=N ranks each
// reads about 1/N of the matrices, and stores only the blocks of its own devices.
//
// A LoRA run's checkpoint (a PEFT adapter folder) holds the adapters alone: they are read into
// their blocks and the base the model holds stays as it is, as load_state does on one device.
//
// load_state (checkpoint.hpp) is the one-device form: the whole model and optimizer state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <map>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/lora/peft.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>
#include <edl/optim/sharded_optimizer.hpp>
#include <edl/train/checkpoint.hpp>

namespace edl::train {

using models::ShardedLoadStats;

/// Reads every adapter's local blocks from the PEFT files of a LoRA run's checkpoint `dir`.
template <class Pol>
void load_adapter_blocks(const std::string& dir, models::ShardedLlama<Pol>& model, ShardedLoadStats& st) {
  namespace fs = std::filesystem;
  using T = typename Pol::param_t;
  EDL_CHECK(model.has_adapters(), errc::config, dir,
            "is a LoRA checkpoint (adapter_config.json) but the model has no adapters: resume with the run's "
            "\"lora\" section");
  const std::string file = (fs::path(dir) / lora::kAdapterWeightsFile).string();
  EDL_CHECK(fs::is_regular_file(file), errc::io, dir, "adapter_model.safetensors is missing");
  const auto f = io::SafeTensorsFile::open(file);
  for (const auto& name : model.trainable_names()) {
    // A part of a fused module (Phi-3) may be saved in the fused form (lora/peft.hpp): the
    // module's A whole, its B's rows.
    const std::string path = name.substr(0, name.size() - std::string_view(".lora_A.weight").size());
    const lora::detail::AdapterSource src = lora::detail::adapter_source(model, f, path, name);
    const std::string& tensor = src.key;
    const std::int64_t row0 = src.row0;
    const bool part_rows = src.rows >= 0;
    EDL_CHECK(f.contains(tensor), errc::format, file, "tensor \"", tensor,
              "\" is missing: the model being loaded has this adapter");
    auto& arr = model.param(name);
    const std::vector<std::int64_t>& file_shape = f.info(tensor).shape;
    auto shape = file_shape;
    if (part_rows && shape.size() == 2 && shape[0] >= row0 + arr.layout().global_shape()[0])
      shape[0] = arr.layout().global_shape()[0];
    EDL_CHECK(shape == arr.layout().global_shape(), errc::shape_mismatch,
              io::detail::tensor_where(file, tensor), "has shape ", ::edl::detail::shape_str(file_shape),
              ", the model's adapter is ", ::edl::detail::shape_str(arr.layout().global_shape()),
              part_rows ? " (rows of the fused tensor)" : "");
    const std::vector<T*> blocks = models::detail::block_pointers(arr);
    st.parameter_bytes_read += models::detail::read_local_blocks<T>(f, tensor, arr.layout(), model, blocks.data(), &st.blocks_read,
                                                            part_rows ? &file_shape : nullptr, row0);
  }
}

/// Loads checkpoint folder `dir` into `model`'s blocks and `opt`'s per-device state (replacing
/// what they held); returns its state.json. Every tensor of the model must be in the checkpoint
/// with the model's shape, and every optimizer slot must belong to a parameter of the model
/// and have its element count; errors name the file and tensor. Every process of a
/// multi-process mesh calls it with the same arguments (no collective runs).
template <class Pol>
TrainState load_sharded_state(const std::string& dir, models::ShardedLlama<Pol>& model,
                              optim::ShardedOptimizer<models::ShardedLlama<Pol>>& opt,
                              ShardedLoadStats* stats = nullptr) {
  namespace fs = std::filesystem;
  const std::string state_path = (fs::path(dir) / "state.json").string();
  EDL_CHECK(fs::exists(state_path), errc::io, dir, "not a complete checkpoint: state.json is missing");
  TrainState s = TrainState::from_file(state_path);
  ShardedLoadStats st;
  const std::int64_t D = model.mesh().size();
  // A LoRA run's checkpoint holds the adapters alone: the base is the run's model, already in place.
  if (lora::is_adapter_folder(dir)) load_adapter_blocks(dir, model, st);
  else models::load_parameter_blocks(dir, model, st);

  opt.reset();
  if (!s.optimizer_saved) {  // a weights-only checkpoint: the optimizer starts afresh
    if (stats) *stats = st;
    return s;
  }
  for (const std::string& path : optimizer_files(dir)) {
    const auto f = io::SafeTensorsFile::open(path);
    for (const auto& name : f.names()) {
      const auto dot = name.rfind('.');
      EDL_CHECK(dot != std::string::npos && dot > 0, errc::format, path, "tensor \"", name,
                "\" is not named <path>.<slot>");
      const std::string param = name.substr(0, dot), slot = name.substr(dot + 1);
      const auto& names = model.trainable_names();
      EDL_CHECK(std::find(names.begin(), names.end(), param) != names.end(), errc::format,
                io::detail::tensor_where(path, name), "is the state of \"", param,
                "\", which is not a trained parameter of the model being loaded");
      const ShardLayout& layout = model.param(param).layout();
      const auto& be = model.mesh().backend();
      std::vector<std::vector<float>> v(static_cast<std::size_t>(D));
      for (std::int64_t d = 0; d < D; ++d)
        if (be.is_local(d)) v[static_cast<std::size_t>(d)].resize(static_cast<std::size_t>(layout.local_elements(d)));
      std::vector<float*> blocks(static_cast<std::size_t>(D));
      for (std::int64_t d = 0; d < D; ++d) blocks[static_cast<std::size_t>(d)] = v[static_cast<std::size_t>(d)].data();
      st.optimizer_bytes_read += models::detail::read_local_blocks<float>(f, name, layout, model, blocks.data(), &st.blocks_read);
      for (std::int64_t d = 0; d < D; ++d)
        if (layout.holds(d) && be.is_local(d)) opt.set_device_slot(d, param, slot, std::move(v[static_cast<std::size_t>(d)]));
    }
  }
  opt.set_step_count(s.optimizer_step_count);
  if (stats) *stats = st;
  return s;
}

}  // namespace edl::train
