// edl/models/llama/sharded_pretrained.hpp
// A HF folder straight onto a mesh: each process reads, from the memory-mapped safetensors
// files (one file or a sharded index), only the blocks of the devices it runs.
//
//   auto mesh = edl::launch_mesh({1, 4, 1, 1, 1});                  // fsdp=4: here or over 4 ranks
//   ShardedLoadStats st;
//   auto sm = models::from_pretrained_sharded("Llama-3.2-1B/", mesh, llama_partition_rules(), &st);
//   // st.parameter_bytes_read: about a quarter of the matrices' bytes on each of 4 ranks
//
// No process builds the whole model: the blocks are allocated where they live and filled by
// SafeTensorsFile::read_block (one contiguous run per innermost row), so a model that needs a
// cluster loads on the cluster. The result equals from_pretrained(dir) sharded, bit for bit.
// Checkpoints that fuse tensors (Phi-3's qkv_proj) or nest the text model (Gemma 3) load by
// their rows and names as from_pretrained reads them. GGUF files and loading rules
// (LoadOptions::transform_rules) load on one device (from_pretrained, then shard_model).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded.hpp>

namespace edl::models {

/// What one process read while loading (the bytes of the blocks its devices hold).
struct ShardedLoadStats {
  std::int64_t parameter_bytes_read = 0;  // from model.safetensors, in the file's dtype
  std::int64_t optimizer_bytes_read = 0;  // from the optimizer file(s)
  std::int64_t blocks_read = 0;           // blocks copied (one per local device per tensor)
};

namespace detail {

/// Fills every local device's block of `arr` (global shape `shape` in the file) from tensor
/// `name` of `file`; the blocks of devices other processes own are not stored here and are
/// skipped. Returns bytes read.
/// A fused part (Phi-3's q_proj in qkv_proj, ...) is rows [row0, ...) of the file's tensor of
/// shape `fused_shape`; otherwise the tensor has the layout's global shape.
template <class T, class Model>
std::int64_t read_local_blocks(const io::SafeTensorsFile& file, const std::string& name,
                               const ShardLayout& layout, const Model& m, T* const* block_data,
                               std::int64_t* blocks_read, const std::vector<std::int64_t>* fused_shape = nullptr,
                               std::int64_t row0 = 0) {
  const auto& be = m.mesh().backend();
  const auto& gs = fused_shape ? *fused_shape : layout.global_shape();
  const std::size_t esize = dtype_size(file.info(name).dtype);
  std::int64_t bytes = 0;
  for (std::int64_t d = 0; d < m.mesh().size(); ++d) {
    T* out = block_data[d];
    if (!layout.holds(d) || !be.is_local(d)) continue;  // placed on other devices, or another process's
    const auto bs = layout.local_shape(d);
    const std::int64_t n = layout.local_elements(d);
    if (n == 0) continue;  // past the end of an uneven dimension
    auto off = layout.offset(d);
    off[0] += row0;
    file.read_block<T>(name, gs, off, bs, std::span<T>(out, static_cast<std::size_t>(n)));
    bytes += n * static_cast<std::int64_t>(esize);
    ++*blocks_read;
  }
  return bytes;
}

/// Each device's block of `arr`, as read_local_blocks takes them.
template <class T>
std::vector<T*> block_pointers(ShardedArray<T>& arr) {
  std::vector<T*> blocks(static_cast<std::size_t>(arr.num_devices()));
  for (std::size_t d = 0; d < blocks.size(); ++d) blocks[d] = arr.local(static_cast<std::int64_t>(d)).data();
  return blocks;
}

}  // namespace detail

/// Reads every parameter's local blocks from the model files of checkpoint `dir`.
template <class Pol>
void load_parameter_blocks(const std::string& dir, ShardedLlama<Pol>& model, ShardedLoadStats& st) {
  using T = typename Pol::param_t;
  const auto weights = io::ShardedCheckpoint::open(dir);
  // A Gemma 3 multimodal checkpoint keeps the text model's tensors under a prefix.
  std::map<std::string, std::string> stored;
  if (!model.config().multimodal_type.empty())
    for (const auto& n : weights.names())
      if (std::string e = text_model_name(model.config(), n); !e.empty()) stored.emplace(std::move(e), n);
  for (const auto& name : model.names()) {
    // Phi-3's q/k/v and gate/up are rows of one fused tensor in the file (fused_checkpoint.hpp).
    const auto fused = fused_slice(model.config(), name);
    const std::string edl_tensor = fused ? fused->tensor : name;
    const std::string tensor = stored.count(edl_tensor) ? stored.at(edl_tensor) : edl_tensor;
    EDL_CHECK(weights.contains(tensor), errc::format, dir + " tensor " + tensor,
              "missing: the model being loaded has this parameter", fused ? " (" + name + " is part of it)" : "");
    auto& arr = model.param(name);
    const ShardLayout& layout = arr.layout();
    auto shape = weights.info(tensor).shape;
    if (fused && shape.size() == 2 && shape[0] >= fused->row0 + fused->rows) shape[0] = fused->rows;
    EDL_CHECK(shape == layout.global_shape(), errc::shape_mismatch, weights.file_of(tensor) + " tensor " + tensor,
              "has shape ", ::edl::detail::shape_str(weights.info(tensor).shape), ", the model's parameter ", name, " is ",
              ::edl::detail::shape_str(layout.global_shape()), fused ? " (rows of the fused tensor)" : "");
    const std::vector<T*> blocks = detail::block_pointers(arr);
    const std::vector<std::int64_t>& file_shape = weights.info(tensor).shape;
    st.parameter_bytes_read +=
        detail::read_local_blocks<T>(weights.shard_of(tensor), tensor, layout, model, blocks.data(), &st.blocks_read,
                                     fused ? &file_shape : nullptr, fused ? fused->row0 : 0);
  }
}

/// The model of HF folder `dir` (config.json and its safetensors) on `mesh` by `rules`, each
/// process reading only its devices' blocks; `stats` (optional) gets what this process read.
template <class Pol = DefaultPolicy>
ShardedLlama<Pol> from_pretrained_sharded(const std::filesystem::path& dir, DefaultMesh mesh,
                                          PartitionRules rules = llama_partition_rules(),
                                          ShardedLoadStats* stats = nullptr) {
  EDL_CHECK(dir.extension() != ".gguf", errc::unsupported, dir.string(),
            "is a GGUF file: its quantized weights load on one device (models::from_pretrained)");
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  detail::check_shapes_before_allocating(cfg, io::ShardedCheckpoint::open(dir.string()), {});
  ShardedLlama<Pol> model(cfg, std::move(mesh), std::move(rules));
  ShardedLoadStats st;
  load_parameter_blocks(dir.string(), model, st);
  if (stats) *stats = st;
  return model;
}

}  // namespace edl::models
