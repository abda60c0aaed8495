// edl/models/llama/sharded_save.hpp
// A sharded model saved as a HF folder without gathering it: every process writes the blocks
// of its own devices straight into the files, at their places in the whole tensors.
//
//   auto sm = models::from_pretrained_sharded("in/", mesh);  // or trained on the mesh
//   models::save_pretrained_sharded("out/", sm);            // every process calls it
//
// The folder is the one save_pretrained(dir, sm.gather_model()) writes, byte for byte
// (config.json, model.safetensors or the shards and their index, in HF's names; Phi-3's fused
// projections joined), so transformers and from_pretrained load it unchanged, on any mesh.
// Rank 0 lays the files out first (headers, sizes: io::PlannedFolder); then each process
// writes the distinct blocks its devices hold (a block replicated on several devices is
// written once, by the lowest device holding it) and syncs; the processes agree before
// returning. No tensor is ever whole in any process's memory. Like save_pretrained it writes
// in place: train::save_sharded_state adds the atomic commit of a checkpoint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/io/planned_safetensors.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/models/llama/fused_checkpoint.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded.hpp>

namespace edl::models {

/// What one process wrote.
struct ShardedSaveStats {
  std::int64_t bytes_written = 0;   // tensor bytes, in the file's dtype
  std::int64_t blocks_written = 0;  // distinct blocks (one per tensor and block this process owns)
};

namespace detail {


/// Writes, for every device d of this process that is the lowest holder of its block of
/// `layout`, that block (`block(d)`, the block's elements in row-major order) into tensor
/// `tensor` of `writer`, converted to `dtype`. The tensor is the layout's global tensor, or,
/// for a fused part, rows from `row0` of a tensor of `row_elems` elements per row. Runs that
/// are consecutive in the file are written together.
template <class T, class Block>
void write_local_blocks(io::PlannedWriter& writer, const std::string& tensor, const ShardLayout& layout,
                        const CollectiveBackend& be, DType dtype, std::int64_t row0, Block&& block,
                        ShardedSaveStats& st) {
  const std::size_t esize = dtype_size(dtype);
  const std::int64_t base = layout.rank() == 0 ? 0 : row0 * [&] {
    std::int64_t e = 1;
    for (std::size_t i = 1; i < layout.rank(); ++i) e *= layout.global_shape()[i];
    return e;
  }();
  std::vector<std::byte> buf;
  for (std::int64_t d : layout.block_owners()) {
    if (!be.is_local(d)) continue;  // another process writes it
    const std::span<const T> data = block(d);
    EDL_CHECK(static_cast<std::int64_t>(data.size()) == layout.local_elements(d), errc::invalid_argument, tensor,
              "device ", d, "'s block holds ", data.size(), " values, its layout ", layout.local_elements(d));
    if (data.empty()) continue;  // past the end of an uneven dimension
    const auto off = layout.offset(d);
    const auto bs = layout.local_shape(d);
    std::int64_t start_g = -1, start_b = 0, count = 0;  // the pending run of consecutive elements
    auto flush = [&] {
      if (count == 0) return;
      const std::uint64_t at = static_cast<std::uint64_t>(base + start_g) * esize;
      if (dtype == dtype_v<T>) {
        writer.write(tensor, at, std::as_bytes(data.subspan(static_cast<std::size_t>(start_b), static_cast<std::size_t>(count))));
      } else {
        convert_run(data.data() + start_b, static_cast<std::size_t>(count), dtype, buf);
        writer.write(tensor, at, buf);
      }
      st.bytes_written += count * static_cast<std::int64_t>(esize);
      count = 0;
    };
    constexpr std::int64_t kMaxRun = std::int64_t{1} << 22;  // elements converted per write
    ::edl::detail::for_each_block_row(layout.global_shape(), off, bs, [&](std::int64_t g, std::int64_t b, std::int64_t n) {
      if (count > 0 && (g != start_g + count || count + n > kMaxRun)) flush();
      if (count == 0) {
        start_g = g;
        start_b = b;
      }
      count += n;
    });
    flush();
    ++st.blocks_written;
  }
}

}  // namespace detail

/// The tensors of `model`'s HF folder in file order, in `dtype`: each parameter by its HF
/// name, the parts of a fused checkpoint tensor (Phi-3) as that tensor at its first part's
/// place, as save_pretrained orders them.
template <class Pol>
io::TensorShapes saved_tensor_shapes(const ShardedLlama<Pol>& model, DType dtype) {
  const LlamaConfig& cfg = model.config();
  io::TensorShapes out;
  std::map<std::string, std::size_t> fused;  // fused tensor -> its index in out
  for (const std::string& name : model.names()) {
    const auto& gs = model.param(name).layout().global_shape();
    const auto s = fused_slice(cfg, name);
    if (!s) {
      out.emplace_back(name, io::TensorShape{dtype, gs});
      continue;
    }
    const auto [it, fresh] = fused.emplace(s->tensor, out.size());
    if (fresh) out.emplace_back(s->tensor, io::TensorShape{dtype, {0, gs[1]}});
    out[it->second].second.shape[0] += gs[0];
  }
  return out;
}

/// Writes this process's blocks of every parameter of `model` into a folder laid out by
/// saved_tensor_shapes (save_pretrained_sharded, train::save_sharded_state).
template <class Pol>
void write_parameter_blocks(io::PlannedWriter& w, const ShardedLlama<Pol>& model, DType dtype, ShardedSaveStats& st) {
  using T = typename Pol::param_t;
  for (const std::string& name : model.names()) {
    const auto& arr = model.param(name);
    const auto s = fused_slice(model.config(), name);
    detail::write_local_blocks<T>(w, s ? s->tensor : name, arr.layout(), model.mesh().backend(), dtype,
                                  s ? s->row0 : 0, [&](std::int64_t d) { return arr.local_span(d); }, st);
  }
}

/// Writes `model` to folder `dir` as save_pretrained writes its gathered form (see the header
/// comment); every process of the model's mesh calls it. Returns what this process wrote.
template <class Pol>
ShardedSaveStats save_pretrained_sharded(const std::filesystem::path& dir, const ShardedLlama<Pol>& model,
                                         const SavePretrainedOptions& opt = {}) {
  using T = typename Pol::param_t;
  static_assert(!Pol::quant_t::quantized, "save_pretrained_sharded writes float parameters; quantized blocks are saved "
                                          "by save_pretrained on one device");
  EDL_CHECK(!model.has_adapters(), errc::unsupported, dir.string(),
            "save_pretrained_sharded writes a model without LoRA adapters; save the adapters with "
            "lora::save_adapter on the gathered model, or merge them first");
  const DType dtype = opt.dtype.value_or(dtype_v<T>);
  const io::PlannedFolder plan(saved_tensor_shapes(model, dtype), opt.max_shard_bytes, {{"format", "pt"}});
  const ProcessGroup processes(model.mesh());
  processes.on_every_rank(dir.string(), "lay out the folder", [&] {
    if (!processes.is_primary()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    EDL_CHECK(std::filesystem::is_directory(dir), errc::io, dir.string(), "cannot create folder: ", ec.message());
    std::set<std::string> keep;
    for (const auto& f : plan.files()) keep.insert(f.name);
    if (!plan.index().empty()) keep.insert(io::kIndexFileName);
    io::detail::remove_other_weight_files(dir.string(), keep);
    plan.create(dir);
    detail::saved_config<LlamaForCausalLM<Pol>>(model.config(), dtype).save((dir / "config.json").string());
  });
  ShardedSaveStats st;
  processes.on_every_rank(dir.string(), "write its blocks", [&] {
    io::PlannedWriter w(dir, plan);
    write_parameter_blocks(w, model, dtype, st);
    w.sync();
  });
  return st;
}

}  // namespace edl::models
