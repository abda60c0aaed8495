// edl/nn/module.hpp
// The module protocol shared by every layer in nn/ (docs/modules.md), and generic helpers
// that work on any module through its parameter visitor.
//
// A module is a class template on a precision policy `Pol` with
//   template <class F> void visit_params(std::string_view prefix, F&& f);  // f(path, Param&), HF names
//   std::int64_t param_count() const;
//   double flops_forward(...) const;          // multiply-add = 2 flops, matmul-like work only
//   struct Saved;                             // what backward needs, filled by forward
//   void forward(const float* x, ..., float* y, Saved&);
//   void backward(const float* dy, Saved&, float* dx);  // ACCUMULATES parameter gradients
//   void init(Key key, float std = 0.02f);    // counter-based, see init_params
// Activations between modules are f32 storage, row-major [tokens, features] with tokens =
// batch*seq, holding values of the policy's compute dtype (round_activations below).
//
// Lifetime rule for Saved: a module's Saved owns the activations the module computes, and
// keeps a non-owning pointer to its input `x`; the caller (the parent module's Saved, or the
// user for a top-level call) keeps `x` alive until backward has run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/nn/param.hpp>

namespace edl::nn {

#define EDL_NN_CHECK_POLICY(Pol) \
  static_assert(::edl::PolicyLike<Pol>, "edl::nn: the module's template argument must be an edl::Policy")

/// The compute dtype (Policy's Compute, the seeds' `dtype`): activations are values of
/// Compute. Kernels compute and accumulate in f32 as always; where a kernel's result becomes an
/// activation, it is rounded to Compute (round to nearest even) and kept in f32 storage, so a
/// bf16 model holds the values a bf16 run would and every f32 kernel serves it. The points are
/// listed in docs/modules.md ("Compute dtype"); f32 (the default) rounds nothing.
template <class Pol>
inline void round_activations(float* x, std::size_t n) {
  if constexpr (!std::is_same_v<typename Pol::compute_t, float>)
    kernels::round_to<typename Pol::compute_t>(x, static_cast<std::ptrdiff_t>(n));
}
template <class Pol>
inline void round_activations(std::vector<float>& x) {
  round_activations<Pol>(x.data(), x.size());
}

/// How the tokens of a batch are laid out: tokens = batch * seq, row t = b * seq + s.
///  position_ids:   [batch * seq] or null (then position = s, as HF without position_ids)
///  attention_mask: [batch * seq] of 0/1 (HF padding mask: 0 = padding key) or null (all 1)
///  segment_ids:    [batch * seq] document ids of packed rows, or null (one document per row):
///                  a token attends only to keys of its own document, the contiguous run of
///                  equal ids it is in (the positions restart there through position_ids)
struct TokenLayout {
  std::int64_t batch = 1;
  std::int64_t seq = 0;
  const std::int64_t* position_ids = nullptr;
  const std::int64_t* attention_mask = nullptr;
  const std::int64_t* segment_ids = nullptr;
  /// The sequence length rope scalings that depend on it (dynamic, longrope) see; 0: the
  /// largest position + 1 (a mesh device passes the whole batch's, see nn/rotary.hpp).
  std::int64_t context = 0;
  /// The seeds' inputs_embeds: [batch * seq, hidden] vectors that take the place of the token
  /// ids' embeddings (a soft prompt, another model's projected features), in the embedding
  /// table's space: the model's embed scale (Gemma's sqrt(hidden)) still applies, as in HF's
  /// Llama and Gemma 2. The ids may then be null (a loss needs its labels).
  const float* inputs_embeds = nullptr;
  /// With inputs_embeds: where backward adds d loss / d inputs_embeds [batch * seq, hidden]
  /// (null: not wanted). The embedding table gets no gradient from such a batch.
  float* inputs_embeds_grad = nullptr;

  std::int64_t tokens() const noexcept { return batch * seq; }
  std::int64_t position(std::int64_t t) const noexcept { return position_ids ? position_ids[t] : t % seq; }
  bool attends(std::int64_t t) const noexcept { return !attention_mask || attention_mask[t] != 0; }
};

inline std::string join_path(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  std::string s(prefix);
  s += '.';
  s += name;
  return s;
}

/// Fills every parameter of `m` from `key`: parameter number k (visit order) draws from
/// fold_in(key, k), element i from counter i of that stream, so element values do not depend
/// on threads or sharding. Init::normal -> Normal(0, std), ones -> 1, zeros -> 0. Chunks of a
/// parameter fill in parallel (a random 1.1B-parameter model is minutes of Box-Muller on one
/// thread); each element depends on its counter alone, so the thread count changes nothing.
/// The values `how` gives elements [first, first + out.size()) of a parameter drawn from key
/// `k`: normal from the elements' counters, or ones, or zeros. init_params and the sharded
/// draw (models::ShardedLlama) fill through it, so their values are the same.
inline void fill_init(Init how, Key k, std::uint64_t first, std::span<float> out, float std) {
  if (how == Init::normal) fill_normal(k, first, out, 0.0f, std);
  else std::fill(out.begin(), out.end(), how == Init::ones ? 1.0f : 0.0f);
}

template <class M>
void init_params(M& m, Key key, float std = 0.02f) {
  std::uint32_t index = 0;
  m.visit_params("", [&](std::string_view, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const Key k = fold_in(key, index++);
    const std::size_t n = p.value.size();
    T* dst = p.data();
    constexpr std::size_t chunk = 1 << 16;
    const Init init = p.init;
    exec::parallel_for(0, static_cast<std::ptrdiff_t>((n + chunk - 1) / chunk), 1, [&](std::ptrdiff_t c0, std::ptrdiff_t c1) {
      std::vector<float> buf;
      for (std::ptrdiff_t c = c0; c < c1; ++c) {
        const std::size_t lo = static_cast<std::size_t>(c) * chunk, hi = std::min(n, lo + chunk);
        buf.resize(hi - lo);
        fill_init(init, k, lo, std::span<float>(buf), std);
        for (std::size_t i = lo; i < hi; ++i) dst[i] = from_f32<T>(buf[i - lo]);
      }
    });
  });
}

/// Backs the parameter values of `m` with transparent huge pages where the OS allows
/// (edl::advise_huge_pages): the parameters' address ranges, sorted, merged where less than
/// 2 MiB apart (small tensors between large ones share huge pages), each advised once.
/// Returns the bytes advised. A performance hint for weights read in full every step (decode);
/// values are unchanged. Programs opt in (the edl tool does for the models it serves).
template <class M>
std::size_t advise_huge_pages(M& m) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  m.visit_params("", [&](std::string_view, auto& p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p.data());
    ranges.emplace_back(a, a + p.value.size() * sizeof(*p.data()));
  });
  if constexpr (requires { m.visit_linears("", [](const std::string&, auto&) {}); }) {
    m.visit_linears("", [&](const std::string&, auto& lin) {
      if (!lin.is_quantized()) return;
      const auto a = reinterpret_cast<std::uintptr_t>(lin.qweight.bytes().data());
      ranges.emplace_back(a, a + lin.qweight.bytes().size());
    });
  }
  std::sort(ranges.begin(), ranges.end());
  constexpr std::uintptr_t kGap = std::uintptr_t{2} << 20;
  std::size_t advised = 0;
  for (std::size_t i = 0; i < ranges.size();) {
    std::uintptr_t lo = ranges[i].first, hi = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first < hi + kGap; ++i) hi = std::max(hi, ranges[i].second);
    advised += edl::advise_huge_pages(reinterpret_cast<const void*>(lo), static_cast<std::size_t>(hi - lo));
  }
  return advised;
}

/// Bytes of `m`'s weights as stored: parameters in their dtype plus quantized blocks (and
/// nf4's scales).
template <class M>
std::int64_t storage_bytes(M& m) {
  std::int64_t n = 0;
  m.visit_params("", [&](std::string_view, auto& p) { n += p.numel() * static_cast<std::int64_t>(sizeof(*p.data())); });
  if constexpr (requires { m.visit_linears("", [](const std::string&, auto&) {}); })
    m.visit_linears("", [&](const std::string&, auto& lin) {
      if (lin.is_quantized()) n += lin.qweight.storage_bytes();
    });
  return n;
}

/// Sets every gradient of `m` to zero (allocated gradients only).
template <class M>
void zero_grad(M& m) {
  m.visit_params("", [](std::string_view, auto& p) { p.zero_grad(); });
}

/// Parameter names and shapes in visit order (HF names for the Llama modules).
template <class M>
std::vector<std::pair<std::string, std::vector<std::int64_t>>> named_shapes(M& m) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  m.visit_params("", [&](std::string_view path, auto& p) { out.emplace_back(std::string(path), p.shape()); });
  return out;
}

/// Parameter values by name, in f32 (the seeds' split_params result).
using ParamValues = std::map<std::string, std::vector<float>>;

/// The seeds' split_params: a copy of every parameter's value by name, widened to f32 (bf16 and
/// f16 widen exactly, so merge_params puts them back bit for bit). Quantized weights are not
/// parameters and are not in it.
template <class M>
ParamValues split_params(M& m) {
  ParamValues out;
  m.visit_params("", [&](std::string_view path, auto& p) {
    std::vector<float> v(static_cast<std::size_t>(p.numel()));
    const auto* src = p.data();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(src[i]);
    out.emplace(std::string(path), std::move(v));
  });
  return out;
}

/// The seeds' merge_params: sets every parameter of `m` from `values` (rounded to nearest even
/// into bf16 / f16 parameters). A parameter without a value, a value of another element count
/// and a value no parameter has are errors naming the tensor; on error `m` may be partly set.
template <class M>
void merge_params(M& m, const ParamValues& values, std::string_view where = "merge_params") {
  std::size_t used = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const auto it = values.find(std::string(path));
    EDL_CHECK(it != values.end(), errc::invalid_argument, std::string(where), "no value for parameter \"", path, "\"");
    EDL_CHECK(static_cast<std::int64_t>(it->second.size()) == p.numel(), errc::shape_mismatch, std::string(where),
              "parameter \"", path, "\" has ", p.numel(), " elements (shape ", ::edl::detail::shape_str(p.shape()),
              "), its value ", it->second.size());
    T* dst = p.data();
    for (std::size_t i = 0; i < it->second.size(); ++i) dst[i] = static_cast<T>(it->second[i]);
    ++used;
  });
  if (used == values.size()) return;
  std::map<std::string, bool> known;
  m.visit_params("", [&](std::string_view path, auto&) { known.emplace(std::string(path), true); });
  for (const auto& [name, v] : values)
    EDL_CHECK(known.count(name), errc::invalid_argument, std::string(where), "\"", name,
              "\" is not a parameter of the model");
}

/// Loads every parameter of `m` by name from `file`, an object with
/// `bool contains(name)`, `info(name).shape` and `read_into<T>(name, std::span<T>)`
/// (edl::io::SafeTensorsFile / ShardedCheckpoint). Throws errc::io naming the first missing
/// tensor and errc::shape_mismatch naming one of the wrong shape.
template <class M, class File>
void load_params(M& m, const File& file, std::string_view where = "load_params") {
  m.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const std::string name(path);
    EDL_CHECK(file.contains(name), errc::io, std::string(where), "tensor \"", name, "\" is missing");
    const auto& shape = file.info(name).shape;
    const auto want = p.shape();
    EDL_CHECK(std::equal(shape.begin(), shape.end(), want.begin(), want.end()), errc::shape_mismatch,
              std::string(where), "tensor \"", name, "\" has shape ", ::edl::detail::shape_str(shape), ", expected ",
              ::edl::detail::shape_str(want));
    file.template read_into<T>(name, std::span<T>(p.data(), p.value.size()));
  });
}

}  // namespace edl::nn
