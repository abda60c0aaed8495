// edl/models/llama/fused_checkpoint.hpp
// Checkpoints that store some Linears fused, read and written under edl's names. Phi-3
// (model_type "phi3") keeps the attention's q, k and v projections in one tensor and the MLP's
// gate and up projections in another, row blocks one after the other:
//
//   model.layers.N.self_attn.qkv_proj.weight   [q; k; v]   (heads*D + 2*kv_heads*D, hidden)
//   model.layers.N.mlp.gate_up_proj.weight     [gate; up]  (2*intermediate, hidden)
//
// Phi-3's math is Llama's otherwise, so edl's layers hold the parts as separate Linears
// (q_proj, ..., up_proj): loading reads each part's rows of the fused tensor (FusedCheckpointView,
// the checkpoint seen with edl's names), saving joins them back (fuse_tensors), so a folder edl
// writes loads in transformers' Phi3ForCausalLM unchanged. Quantized Linears (U8 block rows) are
// fused and split the same way: rows stay whole.
//
// Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration, config model_type "gemma3")
// keep the text model's tensors under a prefix, beside the vision tower's:
//
//   language_model.model.layers.N...   language_model.lm_head.weight   (transformers 4.50, 4.51)
//   model.language_model.layers.N...   lm_head.weight                  (transformers 4.52 and later)
//   vision_tower..., multi_modal_projector...  (either under model. or not)
//
// The view reads the text tensors under edl's names (model.layers.N..., lm_head.weight) and
// leaves the vision tower's out: edl runs the text model, and saves it as Gemma3ForCausalLM.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/checkpoint_source.hpp>
#include <edl/models/llama/config.hpp>

namespace edl::models {

/// Where a parameter lives inside a fused tensor: its name and the parameter's rows there.
struct FusedSlice {
  std::string tensor;
  std::int64_t row0 = 0, rows = 0;
};

/// The fused tensor holding parameter `name` of a model of `c`, or none (stored as it is).
inline std::optional<FusedSlice> fused_slice(const LlamaConfig& c, std::string_view name) {
  if (!c.fused_projections()) return std::nullopt;
  const std::int64_t D = c.head_size(), q = c.num_attention_heads * D, kv = c.num_key_value_heads * D,
                     I = c.intermediate_size;
  struct Part {
    std::string_view name, fused;
    std::int64_t row0, rows;
  };
  const Part parts[] = {{"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, q},
                        {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", q, kv},
                        {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", q + kv, kv},
                        {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, I},
                        {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", I, I}};
  for (const Part& p : parts)
    if (name.size() > p.name.size() && name.substr(name.size() - p.name.size()) == p.name)
      return FusedSlice{std::string(name.substr(0, name.size() - p.name.size())) + std::string(p.fused), p.row0, p.rows};
  return std::nullopt;
}

/// The name edl gives checkpoint tensor `name` of a model of `c`: the name itself, or a
/// multimodal checkpoint's text tensor without its prefix; "" for a tensor outside the text
/// model (the vision tower, the projector), which the view leaves out.
inline std::string text_model_name(const LlamaConfig& c, const std::string& name) {
  if (c.multimodal_type.empty()) return name;
  const auto strip = [&](std::string_view prefix, std::string_view with) -> std::optional<std::string> {
    if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
    return std::string(with) + name.substr(prefix.size());
  };
  for (const auto& [prefix, with] : {std::pair<std::string_view, std::string_view>{"language_model.model.", "model."},
                                     {"language_model.lm_head.", "lm_head."},
                                     {"model.language_model.", "model."}})
    if (auto n = strip(prefix, with)) return *n;
  if (name.compare(0, 8, "lm_head.") == 0) return name;
  return "";
}

/// A checkpoint (io::ShardedCheckpoint or io::SafeTensorsFile) seen with edl's parameter
/// names: each part of a fused tensor is a tensor of its own (its rows), read from the fused
/// one; a multimodal checkpoint's text tensors lose their prefix and the others are left out;
/// every other tensor is the checkpoint's. What load_weights reads a Phi-3 or a Gemma 3
/// multimodal folder through.
template <class Ckpt>
class FusedCheckpointView {
 public:
  FusedCheckpointView(const Ckpt& ckpt, const LlamaConfig& cfg, const std::vector<std::string>& parameter_names)
      : ckpt_(ckpt) {
    std::vector<std::string> edl_names;  // the checkpoint's tensors under edl's names, in its order
    for (const std::string& n : ckpt.names()) {
      std::string e = text_model_name(cfg, n);
      if (e.empty()) continue;
      const auto [it, fresh] = stored_.emplace(e, n);
      EDL_CHECK(fresh, errc::format, ckpt_file_of(n) + " tensor " + n, "and tensor ", it->second,
                " are both the text model's ", e);
      edl_names.push_back(std::move(e));
    }
    std::map<std::string, bool> fused_seen;
    for (const std::string& p : parameter_names) {
      const auto s = fused_slice(cfg, p);
      if (!s || !stored_.count(s->tensor)) continue;
      io::TensorInfo info = ckpt.info(stored_.at(s->tensor));
      const std::string where = file_of(s->tensor) + " tensor " + s->tensor;
      EDL_CHECK(info.shape.size() == 2, errc::shape_mismatch, where, "a fused weight must be 2-D, found ",
                ::edl::detail::shape_str(info.shape));
      EDL_CHECK(s->row0 + s->rows <= info.shape[0], errc::shape_mismatch, where, "has ", info.shape[0],
                " rows, but ", cfg.source, " puts ", p, " at rows ", s->row0, "..", s->row0 + s->rows - 1);
      info.shape[0] = s->rows;
      parts_.emplace(p, Part{*s, info});
      fused_seen[s->tensor] = true;
    }
    for (const std::string& n : edl_names) {
      if (fused_seen.count(n) == 0) names_.push_back(n);
      else if (fused_seen[n]) {  // the parts, in place of the fused tensor
        for (const std::string& p : parameter_names)
          if (parts_.count(p) && parts_.at(p).slice.tensor == n) names_.push_back(p);
        fused_seen[n] = false;
      }
    }
    for (const auto& [p, part] : parts_) {
      EDL_CHECK(part.info.shape[0] > 0, errc::shape_mismatch, p, "has no rows in ", part.slice.tensor);
      covered_[part.slice.tensor] += part.slice.rows;
    }
    for (const auto& [t, rows] : covered_)
      EDL_CHECK(rows == ckpt.info(stored_.at(t)).shape[0], errc::shape_mismatch, file_of(t) + " tensor " + t, "has ",
                ckpt.info(stored_.at(t)).shape[0], " rows, but the parts ", cfg.source, " gives it hold ", rows);
  }

  const std::vector<std::string>& names() const noexcept { return names_; }
  bool contains(const std::string& name) const { return parts_.count(name) > 0 || (stored_.count(name) && !covered_.count(name)); }
  const io::TensorInfo& info(const std::string& name) const {
    const auto it = parts_.find(name);
    return it != parts_.end() ? it->second.info : ckpt_.info(stored(name));
  }
  std::string file_of(const std::string& name) const {
    const auto it = parts_.find(name);
    return ckpt_file_of(stored(it != parts_.end() ? it->second.slice.tensor : name));
  }
  std::string path() const { return detail::checkpoint_source(ckpt_); }

  /// Tensor `name` converted to T: a part's rows of its fused tensor, or the tensor itself.
  template <class T>
  void read_into(const std::string& name, std::span<T> out) const {
    const auto it = parts_.find(name);
    if (it == parts_.end()) return ckpt_.template read_into<T>(stored(name), out);
    const std::string& t = stored(it->second.slice.tensor);
    const auto& full = ckpt_.info(t).shape;
    const std::vector<std::int64_t> offset{it->second.slice.row0, 0}, block{it->second.slice.rows, full[1]};
    file_holding(t).template read_block<T>(t, full, offset, block, out);
  }

 private:
  struct Part {
    FusedSlice slice;
    io::TensorInfo info;  // the part's shape, the fused tensor's dtype
  };
  /// The checkpoint's name of tensor `name` (edl's); a name the checkpoint lacks is passed on,
  /// for the checkpoint's own error.
  const std::string& stored(const std::string& name) const {
    const auto it = stored_.find(name);
    return it != stored_.end() ? it->second : name;
  }
  std::string ckpt_file_of(const std::string& t) const { return detail::file_of(ckpt_, t); }
  const io::SafeTensorsFile& file_holding(const std::string& tensor) const {
    if constexpr (requires { ckpt_.shard_of(tensor); }) return ckpt_.shard_of(tensor);
    else return ckpt_;
  }

  const Ckpt& ckpt_;
  std::map<std::string, Part> parts_;
  std::map<std::string, std::string> stored_;      // edl's name -> the checkpoint's
  std::map<std::string, std::int64_t> covered_;  // fused tensor -> rows its parts take
  std::vector<std::string> names_;
};

/// Joins the parts of each fused tensor of `list` (edl's names, as named_tensors gives them) into
/// the tensor a checkpoint of `cfg` stores (rows in order); `storage` owns the joined bytes.
/// Nothing changes for a model without fused projections.
template <class TensorList>
void fuse_tensors(const LlamaConfig& cfg, TensorList& list, std::vector<std::vector<std::byte>>& storage) {
  if (!cfg.fused_projections()) return;
  TensorList out;
  std::map<std::string, std::vector<std::size_t>> parts;  // fused name -> indices into list
  for (std::size_t i = 0; i < list.size(); ++i)
    if (const auto s = fused_slice(cfg, list[i].first)) parts[s->tensor].push_back(i);
  std::map<std::string, bool> written;
  storage.reserve(storage.size() + parts.size());  // keep earlier buffers' addresses stable
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto s = fused_slice(cfg, list[i].first);
    if (!s) {
      out.push_back(list[i]);
      continue;
    }
    if (written[s->tensor]) continue;
    written[s->tensor] = true;
    // Parts in row order; all of one dtype and width (a quantized part's rows are blocks).
    auto idx = parts.at(s->tensor);
    std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      return fused_slice(cfg, list[a].first)->row0 < fused_slice(cfg, list[b].first)->row0;
    });
    const auto& first = list[idx.front()].second;
    std::int64_t rows = 0;
    std::size_t bytes = 0;
    for (std::size_t k : idx) {
      const auto& t = list[k].second;
      EDL_CHECK(t.dtype == first.dtype && t.shape.size() == 2 && t.shape[1] == first.shape[1], errc::invalid_argument,
                list[k].first, "cannot be fused into ", s->tensor, ": its dtype or width differs from ",
                list[idx.front()].first, "'s (a fused tensor's parts must be stored alike)");
      rows += t.shape[0];
      bytes += t.data.size();
    }
    auto& buf = storage.emplace_back(bytes);
    std::size_t at = 0;
    for (std::size_t k : idx) {
      std::memcpy(buf.data() + at, list[k].second.data.data(), list[k].second.data.size());
      at += list[k].second.data.size();
    }
    out.emplace_back(s->tensor, typename TensorList::value_type::second_type(first.dtype, {rows, first.shape[1]},
                                                                             std::span<const std::byte>(buf)));
  }
  list = std::move(out);
}

}  // namespace edl::models
