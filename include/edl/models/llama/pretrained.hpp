// edl/models/llama/pretrained.hpp
// HuggingFace checkpoints for Llama models, and the module-protocol conveniences that work on
// any model with visit_params (docs/llama.md).
//
//   auto m = models::from_pretrained("ckpt/");                  // config.json + model.safetensors
//   auto g = models::from_pretrained("model.q4_0.gguf");       // a GGUF file (models::from_gguf)
//   auto mb = models::from_pretrained<BF16ParamsPolicy>("ckpt/"); // or the sharded index
//   models::save_pretrained("out/", m);                          // HF layout, loads in transformers
//   models::save_pretrained("out/", m, {.max_shard_bytes = 2'000'000'000, .dtype = DType::bf16});
//   auto b = models::to_dtype<BF16ParamsPolicy>(m);              // f32 -> bf16, round to nearest even
//   for (auto& p : models::lazy_init<>(cfg)) ...                 // names, shapes, bytes; no allocation
//
// Loading (load_weights, reusable for any head): every parameter is read by its HF name and
// converted from the checkpoint's F32 / BF16 / F16 (or F64) to the parameter dtype with one
// round-to-nearest-even. A parameter the checkpoint lacks, a tensor of another shape and a
// checkpoint tensor the model does not have are edl::Error naming the tensor and the file
// (errc::format, errc::shape_mismatch, errc::format). Ignored: HF's non-parameter buffers
// ("*.rotary_emb.inv_freq", "*.masked_bias", "*.attn.bias") and, for a model with tied
// embeddings, an "lm_head.weight" the checkpoint may still carry (HF ignores it too).
//
// Saving: config.json (unknown fields kept, torch_dtype set to the saved dtype) and
// model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json when
// the tensors pass max_shard_bytes (HF's default is "5GB" = 5e9 bytes), every file written
// atomically, metadata {"format": "pt"}, tensors in HF order: the layout
// transformers' from_pretrained reads unchanged.
//
// Quantized Linears (nn::quantize) are saved as their blocks: the weight's name holds a U8
// tensor [out, bytes per row] (q8_0: in / 32 * 34, q4_0: in / 32 * 18, nf4: in / 2, so the
// width says the format), and nf4 adds "<name>.absmax" (U8 codes), "<name>.nested_absmax" (F32
// group scales) and "<name>.offset" (F32 [1]), its double-quantized scales. config.json gets
// "quantization_config": {"quant_method": "edl", "format": ...}. load_weights reads them into
// quantized Linears (docs/quantization.md).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/checkpoint_source.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/fused_checkpoint.hpp>
#include <edl/models/llama/transform_rules.hpp>
#include <edl/models/llama/gguf.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/quant/matrix.hpp>

namespace edl::models {

// ============================================================================ module protocol

/// Number of parameter elements of any model with visit_params (tied weights counted once).
template <class M>
std::int64_t parameter_count(const M& m) {
  std::int64_t n = 0;
  // visit_params is non-const only because it hands out mutable references; counting does not write.
  const_cast<M&>(m).visit_params("", [&](std::string_view, auto& p) { n += p.numel(); });
  return n;
}

/// Bytes of the parameter values (not gradients).
template <class M>
std::uint64_t parameter_bytes(const M& m) {
  std::uint64_t n = 0;
  const_cast<M&>(m).visit_params("", [&](std::string_view, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    n += static_cast<std::uint64_t>(p.numel()) * sizeof(T);
  });
  return n;
}

/// One parameter as lazy_init describes it: no memory behind it.
struct ParamSpec {
  std::string name;                 // HF name
  std::vector<std::int64_t> shape;  // HF shape
  DType dtype = DType::f32;         // the policy's parameter dtype
  std::uint64_t bytes = 0;          // numel x dtype size
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// The parameters a model of `cfg` with policy `Pol` would have (HF names and order, shapes,
/// dtype, bytes) computed from the config alone: nothing is allocated, so this sizes a 70B
/// model as cheaply as a tiny one. Equal to the model's visit_params order.
template <class Pol = DefaultPolicy>
std::vector<ParamSpec> lazy_init(const LlamaConfig& cfg, LlamaHead head = LlamaHead::causal_lm) {
  static_assert(PolicyLike<Pol>, "edl::models::lazy_init: the template argument must be an edl::Policy");
  using T = typename Pol::param_t;
  std::vector<ParamSpec> out;
  for (auto& [name, shape] : cfg.parameter_shapes(head)) {
    ParamSpec p{name, shape, dtype_v<T>, 0};
    p.bytes = static_cast<std::uint64_t>(p.numel()) * sizeof(T);
    out.push_back(std::move(p));
  }
  return out;
}

/// Sum of ParamSpec::bytes.
inline std::uint64_t total_bytes(const std::vector<ParamSpec>& specs) {
  std::uint64_t n = 0;
  for (const auto& p : specs) n += p.bytes;
  return n;
}

/// Counter-based initialization of any model (docs/modules.md): parameter k in visit order
/// draws from fold_in(key, k). std < 0 takes the model config's initializer_range when the
/// model has a config(), else 0.02.
template <class M>
void init(M& m, Key key, float std = -1.0f) {
  if (std < 0) {
    if constexpr (requires { m.config().initializer_range; }) std = static_cast<float>(m.config().initializer_range);
    else std = 0.02f;
  }
  nn::init_params(m, key, std);
}

/// The same model with another precision policy (e.g. f32 -> bf16 parameters): every value is
/// converted with one round-to-nearest-even; allocated gradients (always f32) are copied.
/// Works for every model class template Model<Pol> constructible from its config().
template <class NewPol, template <class> class Model, class Pol>
Model<NewPol> to_dtype(const Model<Pol>& src) {
  using S = typename Pol::param_t;
  using D = typename NewPol::param_t;
  Model<NewPol> dst(src.config());
  struct Entry {
    std::string name;
    const S* value;
    const float* grad;
    std::vector<std::int64_t> shape;
  };
  std::vector<Entry> entries;
  const_cast<Model<Pol>&>(src).visit_params("", [&](std::string_view path, auto& p) {
    entries.push_back({std::string(path), p.data(), p.has_grad() ? p.grad.data() : nullptr, p.shape()});
  });
  std::size_t k = 0;
  dst.visit_params("", [&](std::string_view path, auto& p) {
    EDL_CHECK(k < entries.size() && entries[k].name == path && entries[k].shape == p.shape(), errc::shape_mismatch,
              "models::to_dtype", "parameter ", path, " does not match the source model's");
    const Entry& e = entries[k++];
    const std::size_t n = p.value.size();
    D* out = p.data();
    if constexpr (std::is_same_v<S, D>) {
      if (n) std::memcpy(out, e.value, n * sizeof(D));
    } else {
      for (std::size_t i = 0; i < n; ++i) out[i] = from_f32<D>(to_f32(e.value[i]));
    }
    if (e.grad) std::memcpy(p.grad_data(), e.grad, n * sizeof(float));
  });
  EDL_CHECK(k == entries.size(), errc::shape_mismatch, "models::to_dtype", "the models have different parameter counts");
  return dst;
}

// ============================================================================ loading

/// What load_weights did.
struct LoadReport {
  std::vector<std::string> loaded;      // model parameters read, in visit order
  std::vector<std::string> missing;     // only with LoadOptions::allow_missing
  std::vector<std::string> unexpected;  // only with LoadOptions::allow_unexpected
  std::vector<std::string> ignored;     // buffers and a tied lm_head.weight
};

struct LoadOptions {
  /// Leave parameters the checkpoint lacks as they are (e.g. a new classification head on a
  /// causal-LM checkpoint) instead of failing; they are listed in LoadReport::missing.
  bool allow_missing = false;
  /// Skip checkpoint tensors the model does not have instead of failing (LoadReport::unexpected).
  bool allow_unexpected = false;
  /// Back the weights with transparent huge pages where the OS allows (nn::advise_huge_pages):
  /// decode reads every weight once per token, and huge pages spare it the TLB misses. Values
  /// are unchanged; servers turn it on, training has no need.
  bool huge_pages = false;
  /// Loading rules for checkpoints with other names or layouts (transform_rules.hpp): the
  /// folder's tensors are read under the names the rules give, transformed where they say.
  TransformRules transform_rules;
};

namespace detail {

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// HF non-parameter buffers that older checkpoints carry.
inline bool is_hf_buffer(std::string_view name) {
  return ends_with(name, "rotary_emb.inv_freq") || ends_with(name, ".masked_bias") || ends_with(name, ".attn.bias");
}

/// The block format of a saved quantized weight [rows, width] of a Linear with `in` inputs.
inline quant::Format quantized_format_of_width(std::int64_t width, std::int64_t in) {
  for (quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4})
    if (in % quant::block_elems(f) == 0 && width == in / quant::block_elems(f) * quant::block_bytes(f)) return f;
  return quant::Format::none;
}

/// The companion tensors of a saved nf4 weight (its double-quantized block scales).
inline std::array<std::string, 3> nf4_scale_names(const std::string& weight) {
  return {weight + ".absmax", weight + ".nested_absmax", weight + ".offset"};
}

}  // namespace detail

namespace detail {
template <class M, class Ckpt>
LoadReport load_named_weights(M& model, const Ckpt& ckpt, const LoadOptions& opt);
}  // namespace detail

/// Loads every parameter of `model` (any class with visit_params: LlamaForCausalLM,
/// LlamaForSequenceClassification, LlamaModel with its own names, ...) by HF name from
/// `ckpt` (io::ShardedCheckpoint or io::SafeTensorsFile). See the header comment for the rules.
/// A model whose config stores projections fused (Phi-3) reads them through
/// FusedCheckpointView (fused_checkpoint.hpp), as does a Gemma 3 multimodal checkpoint's text model.
template <class M, class Ckpt>
LoadReport load_weights(M& model, const Ckpt& ckpt, const LoadOptions& opt = {}) {
  if constexpr (requires { model.config().checkpoint_names_differ(); }) {
    if (model.config().checkpoint_names_differ()) {
      // The fused view reads blocks of a file: a safetensors file or a sharded checkpoint.
      if constexpr (std::is_same_v<Ckpt, io::SafeTensorsFile> ||
                    requires(const Ckpt& c, const std::string& t) { c.shard_of(t); }) {
        std::vector<std::string> names;
        model.visit_params("", [&](std::string_view path, auto&) { names.emplace_back(path); });
        return detail::load_named_weights(model, FusedCheckpointView<Ckpt>(ckpt, model.config(), names), opt);
      } else {
        ::edl::detail::raise(errc::unsupported, detail::checkpoint_source(ckpt),
                             "this model's checkpoint fuses or nests its tensors; it loads from the checkpoint itself");
      }
    }
  }
  return detail::load_named_weights(model, ckpt, opt);
}

/// load_weights with the checkpoint's names taken as they are.
template <class M, class Ckpt>
LoadReport detail::load_named_weights(M& model, const Ckpt& ckpt, const LoadOptions& opt) {
  const std::string source = detail::checkpoint_source(ckpt);
  LoadReport rep;
  std::set<std::string> wanted;
  bool tied = false;
  if constexpr (requires { model.tied(); }) tied = model.tied();
  // Quantized weights first (U8 blocks): their Linears then no longer list a weight parameter.
  if constexpr (requires { model.visit_linears("", [](const std::string&, auto&) {}); }) {
    model.visit_linears("", [&](const std::string& path, auto& lin) {
      const std::string name = path + ".weight";
      if (!ckpt.contains(name) || ckpt.info(name).dtype != DType::u8) return;
      const std::string where = detail::file_of(ckpt, name) + " tensor " + name;
      const auto& shape = ckpt.info(name).shape;
      EDL_CHECK(shape.size() == 2 && shape[0] == lin.out_features(), errc::shape_mismatch, where,
                "a quantized weight must be [", lin.out_features(), ", bytes per row], found ",
                ::edl::detail::shape_str(shape));
      const quant::Format f = detail::quantized_format_of_width(shape[1], lin.in_features());
      EDL_CHECK(f != quant::Format::none, errc::format, where, "a row of ", shape[1],
                " bytes is no block format of ", lin.in_features(), " values (q8_0: ", lin.in_features() / 32 * 34,
                ", q4_0: ", lin.in_features() / 32 * 18, ", nf4: ", lin.in_features() / 2, ")");
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(shape[0] * shape[1]));
      ckpt.template read_into<std::uint8_t>(name, std::span<std::uint8_t>(bytes));
      quant::DoubleQuant dq;
      if (f == quant::Format::nf4) {
        const auto names = detail::nf4_scale_names(name);
        for (const std::string& n : names)
          EDL_CHECK(ckpt.contains(n), errc::format, where, "an nf4 weight needs tensor \"", n, "\"");
        EDL_CHECK(ckpt.info(names[0]).dtype == DType::u8 && ckpt.info(names[1]).dtype == DType::f32 &&
                      ckpt.info(names[2]).dtype == DType::f32 && ckpt.info(names[2]).numel() == 1,
                  errc::format, where, "nf4 scales must be U8 codes, F32 group scales and one F32 offset");
        dq.codes.resize(static_cast<std::size_t>(ckpt.info(names[0]).numel()));
        dq.scales.resize(static_cast<std::size_t>(ckpt.info(names[1]).numel()));
        ckpt.template read_into<std::uint8_t>(names[0], std::span<std::uint8_t>(dq.codes));
        ckpt.template read_into<float>(names[1], std::span<float>(dq.scales));
        ckpt.template read_into<float>(names[2], std::span<float>(&dq.offset, 1));
        for (const std::string& n : names) wanted.insert(n);
      }
      lin.set_quantized(quant::Matrix::from_bytes(f, lin.out_features(), lin.in_features(), bytes, &dq, where), where);
      wanted.insert(name);
      rep.loaded.push_back(name);
    });
  }
  model.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const std::string name(path);
    wanted.insert(name);
    if (!ckpt.contains(name)) {
      EDL_CHECK(opt.allow_missing, errc::format, source + " tensor " + name,
                "the model needs this parameter, but the checkpoint does not hold it");
      rep.missing.push_back(name);
      return;
    }
    const auto& have = ckpt.info(name).shape;
    const auto want = p.shape();
    EDL_CHECK(std::equal(have.begin(), have.end(), want.begin(), want.end()), errc::shape_mismatch,
              detail::file_of(ckpt, name) + " tensor " + name, "has shape ", ::edl::detail::shape_str(have),
              " (", dtype_name(ckpt.info(name).dtype), "), but the model's parameter has shape ",
              ::edl::detail::shape_str(want));
    const DType dt = ckpt.info(name).dtype;
    EDL_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f16 || dt == DType::f64, errc::dtype_mismatch,
              detail::file_of(ckpt, name) + " tensor " + name, "has dtype ", dtype_name(dt),
              ", expected a floating-point tensor (F32, BF16, F16 or F64)");
    ckpt.template read_into<T>(name, std::span<T>(p.data(), p.value.size()));
    rep.loaded.push_back(name);
  });
  for (const auto& name : ckpt.names()) {
    if (wanted.count(name)) continue;
    if (detail::is_hf_buffer(name) || (tied && name == "lm_head.weight")) {
      rep.ignored.push_back(name);
      continue;
    }
    EDL_CHECK(opt.allow_unexpected, errc::format, detail::file_of(ckpt, name) + " tensor " + name,
              "unexpected tensor: the model (", wanted.size(), " parameters) has no parameter of this name");
    rep.unexpected.push_back(name);
  }
  return rep;
}

namespace detail {

/// The config's parameter shapes against the checkpoint's tensors, before the model is built: a
/// config.json whose sizes disagree with the weights beside it (or a huge one over a small
/// file) is an error naming the tensor, not an allocation the size of the config's claim.
template <class Ckpt>
void check_named_shapes(const LlamaConfig& cfg, const Ckpt& ckpt, const LoadOptions& opt) {
  for (const auto& [name, want] : cfg.parameter_shapes()) {
    if (!ckpt.contains(name)) {
      EDL_CHECK(opt.allow_missing || (name == "lm_head.weight" && cfg.tie_word_embeddings), errc::format,
                checkpoint_source(ckpt) + " tensor " + name,
                "the model needs this parameter, but the checkpoint does not hold it");
      continue;
    }
    const auto& info = ckpt.info(name);
    const bool quantized = info.dtype == DType::u8;  // block rows: only the row count is the config's
    const bool same = quantized ? !info.shape.empty() && info.shape[0] == want[0]
                                : std::equal(info.shape.begin(), info.shape.end(), want.begin(), want.end());
    EDL_CHECK(same, errc::shape_mismatch, file_of(ckpt, name) + " tensor " + name, "has shape ",
              ::edl::detail::shape_str(info.shape), ", but ", cfg.source, " gives the model a parameter of shape ",
              ::edl::detail::shape_str(want));
  }
}

inline void check_shapes_before_allocating(const LlamaConfig& cfg, const io::ShardedCheckpoint& ckpt,
                                           const LoadOptions& opt) {
  if (!cfg.checkpoint_names_differ()) return check_named_shapes(cfg, ckpt, opt);
  std::vector<std::string> names;
  for (const auto& [name, shape] : cfg.parameter_shapes()) names.push_back(name);
  check_named_shapes(cfg, FusedCheckpointView<io::ShardedCheckpoint>(ckpt, cfg, names), opt);
}

}  // namespace detail

/// Reads `dir`/config.json and the weights (model.safetensors, or the sharded index), memory
/// mapped, into a new LlamaForCausalLM with parameters in Pol's dtype. A path ending in .gguf
/// is a GGUF file, read by from_gguf (its quantized Linears keep the file's blocks); of the
/// options it takes huge_pages only.
template <class Pol = DefaultPolicy>
LlamaForCausalLM<Pol> from_pretrained(const std::filesystem::path& dir, const LoadOptions& opt = {}) {
  if (dir.extension() == ".gguf") {
    auto g = from_gguf<Pol>(dir);
    if (opt.huge_pages) nn::advise_huge_pages(g);
    return g;
  }
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  const auto ckpt = io::ShardedCheckpoint::open(dir.string());
  std::optional<TransformedCheckpoint<io::ShardedCheckpoint>> renamed;
  if (!opt.transform_rules.empty()) {
    EDL_CHECK(!cfg.checkpoint_names_differ(), errc::unsupported, (dir / "config.json").string(),
              "loading rules apply to checkpoints stored under HF's Llama names; this config's checkpoint fuses "
              "or nests its tensors");
    renamed.emplace(ckpt, opt.transform_rules);
    detail::check_named_shapes(cfg, *renamed, opt);
  } else {
    detail::check_shapes_before_allocating(cfg, ckpt, opt);
  }
  LlamaForCausalLM<Pol> m(cfg);
  if (opt.huge_pages) nn::advise_huge_pages(m);  // before the weights are written: faulted in as huge pages
  if (renamed) load_weights(m, *renamed, opt);
  else load_weights(m, ckpt, opt);
  m.quantize_as_policy();
  if (opt.huge_pages && Pol::quant_t::quantized) nn::advise_huge_pages(m);  // the new blocks too
  return m;
}

// ============================================================================ saving

/// HF's torch_dtype name of a storage dtype.
inline std::string torch_dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    default: break;
  }
  ::edl::detail::raise(errc::invalid_argument, "models::save_pretrained",
                       ::edl::detail::concat("dtype must be F32, BF16 or F16, found ", dtype_name(d)));
}

namespace detail {

/// The config.json a save writes for a model of type M: its config with the stored dtype and
/// M's HF architecture.
template <class M>
LlamaConfig saved_config(const LlamaConfig& c, DType dtype) {
  LlamaConfig cfg = c;
  cfg.torch_dtype = torch_dtype_name(dtype);
  if constexpr (requires { M::hf_architecture; }) cfg.extra["architectures"] = {std::string(M::hf_architecture)};
  return cfg;
}

/// Element conversion into the file's dtype (round to nearest even), or a plain copy.
template <class T>
void convert_run(const T* src, std::size_t n, DType dtype, std::vector<std::byte>& out) {
  out.resize(n * dtype_size(dtype));
  auto to = [&](auto tag) {
    using D = decltype(tag);
    D* o = reinterpret_cast<D*>(out.data());
    for (std::size_t i = 0; i < n; ++i) o[i] = from_f32<D>(to_f32(src[i]));
  };
  switch (dtype) {
    case DType::f32: to(float{}); break;
    case DType::bf16: to(bf16{}); break;
    case DType::f16: to(f16{}); break;
    default:
      ::edl::detail::raise(errc::invalid_argument, "models::save_pretrained",
                           ::edl::detail::concat("dtype must be F32, BF16 or F16, found ", dtype_name(dtype)));
  }
}
}  // namespace detail

struct SavePretrainedOptions {
  /// A new shard starts when the next tensor would pass this (HF max_shard_size "5GB").
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
  /// Dtype of the saved tensors (nullopt: the parameter dtype). Conversions round to nearest even.
  std::optional<DType> dtype;
};

/// The tensors of `model` as an io::TensorList in HF order and `dtype`; `storage` owns the
/// converted bytes (tensors already in `dtype` are referenced in place).
template <class M>
io::TensorList named_tensors(M& model, DType dtype, std::vector<std::vector<std::byte>>& storage) {
  io::TensorList list;
  std::size_t count = 0;
  model.visit_params("", [&](std::string_view, auto&) { ++count; });
  storage.reserve(storage.size() + count);  // keep earlier buffers' addresses stable
  model.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const std::size_t n = p.value.size();
    if (dtype == dtype_v<T>) {
      list.emplace_back(std::string(path),
                        io::TensorRef(dtype, p.shape(), std::as_bytes(std::span<const T>(p.data(), n))));
      return;
    }
    auto& buf = storage.emplace_back();
    detail::convert_run(p.data(), n, dtype, buf);
    list.emplace_back(std::string(path), io::TensorRef(dtype, p.shape(), std::span<const std::byte>(buf)));
  });
  if constexpr (requires { model.visit_linears("", [](const std::string&, auto&) {}); }) {
    model.visit_linears("", [&](const std::string& path, auto& lin) {
      if (!lin.is_quantized()) return;
      const quant::Matrix& q = lin.qweight;
      const std::string name = path + ".weight";
      if (quant::in_row_groups(q.format())) {  // files hold GGUF's rows of blocks
        const quant::MatrixView v = q.view();
        auto& buf = storage.emplace_back(static_cast<std::size_t>(q.rows() * v.row_bytes()));
        for (std::int64_t r = 0; r < q.rows(); ++r) v.copy_row(r, buf.data() + r * v.row_bytes());
        list.emplace_back(name, io::TensorRef(DType::u8, {q.rows(), q.view().row_bytes()}, std::span<const std::byte>(buf)));
        return;
      }
      list.emplace_back(name, io::TensorRef(DType::u8, {q.rows(), q.view().row_bytes()}, std::as_bytes(q.bytes())));
      if (q.format() != quant::Format::nf4) return;
      const quant::DoubleQuant& dq = q.double_quant();
      const auto names = detail::nf4_scale_names(name);
      list.emplace_back(names[0], io::TensorRef(DType::u8, {static_cast<std::int64_t>(dq.codes.size())},
                                                std::as_bytes(std::span<const std::uint8_t>(dq.codes))));
      list.emplace_back(names[1], io::TensorRef(DType::f32, {static_cast<std::int64_t>(dq.scales.size())},
                                                std::as_bytes(std::span<const float>(dq.scales))));
      list.emplace_back(names[2], io::TensorRef(DType::f32, {1}, std::as_bytes(std::span<const float>(&dq.offset, 1))));
    });
  }
  return list;
}

/// Writes `model` to folder `dir` in the HF layout (see the header comment). Returns the
/// weight files written (shards, then the index when sharded).
template <class M>
std::vector<std::string> save_pretrained(const std::filesystem::path& dir, const M& model,
                                         const SavePretrainedOptions& opt = {}) {
  namespace fs = std::filesystem;
  M& m = const_cast<M&>(model);  // visit_params hands out mutable references; nothing is written
  DType dtype = DType::f32;
  m.visit_params("", [&](std::string_view, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    dtype = dtype_v<T>;
  });
  if (opt.dtype) dtype = *opt.dtype;
  LlamaConfig cfg = detail::saved_config<M>(model.config(), dtype);
  if constexpr (requires { nn::quantized_format(m); }) {
    const quant::Format f = nn::quantized_format(m);
    if (f != quant::Format::none) cfg.extra["quantization_config"] = {{"quant_method", "edl"}, {"format", quant::format_name(f)}};
  }
  std::vector<std::vector<std::byte>> storage;
  io::TensorList tensors = named_tensors(m, dtype, storage);
  fuse_tensors(cfg, tensors, storage);  // Phi-3: q/k/v and gate/up joined as the checkpoint stores them
  std::error_code ec;
  fs::create_directories(dir, ec);
  EDL_CHECK(fs::is_directory(dir), errc::io, dir.string(), "cannot create folder: ", ec.message());
  auto written = io::save_sharded(dir.string(), tensors, opt.max_shard_bytes, {{"format", "pt"}});
  cfg.save((dir / "config.json").string());
  return written;
}

/// save_pretrained with only a shard limit (and optionally a dtype).
template <class M>
std::vector<std::string> save_pretrained(const std::filesystem::path& dir, const M& model,
                                         std::uint64_t max_shard_bytes, std::optional<DType> dtype = std::nullopt) {
  SavePretrainedOptions o;
  o.max_shard_bytes = max_shard_bytes;
  o.dtype = dtype;
  return save_pretrained(dir, model, o);
}

}  // namespace edl::models
