// edl/lora/apply.hpp
// Adding, folding and removing LoRA adapters on any model with visit_linears / visit_params
// (EasyDeL's apply_lora_to_layers, merge_lora_params, unwrap_lora_to_layers,
// split_lora_params, lora_is_enabled):
//
//   lora::apply_lora(model, cfg);      // adapters on cfg's targets; every other parameter frozen
//   ... train: only lora_A / lora_B get gradients and optimizer state ...
//   lora::merge_lora(model);           // W += scale * B A, adapters removed: a plain model again
//   lora::unwrap_lora(model);          // adapters removed, base unchanged
//
// A fresh adapter adds exact zeros (B = 0), so logits are unchanged bit for bit. A quantized
// base (QLoRA) keeps its blocks; merge_lora dequantizes it first and the Linear holds the
// merged weight in the model's float dtype.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/lora/config.hpp>
#include <edl/nn/linear.hpp>

namespace edl::lora {

/// Whether any Linear of `m` carries an adapter.
template <class M>
bool lora_is_enabled(M& m) {
  bool any = false;
  m.visit_linears("", [&](const std::string&, auto& lin) { any = any || lin.lora.has_value(); });
  return any;
}

/// Adds an adapter (cfg.r, cfg.lora_alpha, ...) to every Linear cfg targets and freezes every
/// other parameter of `m` (their gradients are released). Returns how many Linears it adapted.
/// Errors, before anything changes: a target name that matches no Linear, lm_head as a target,
/// a Linear that already has an adapter.
template <class M>
std::int64_t apply_lora(M& m, const LoraConfig& cfg, const std::string& where = "lora") {
  cfg.validate(where);
  const TargetMatcher match(cfg, where);
  std::vector<std::string> paths;
  std::set<std::string> used;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!match.matches(path)) return;
    EDL_CHECK(path.rfind("lm_head", 0) != 0, errc::unsupported, where,
              "target_modules selects lm_head; edl adapts the decoder's Linears only (",
              "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
    EDL_CHECK(!lin.lora, errc::invalid_argument, path, "already has a LoRA adapter");
    paths.push_back(path);
    for (const std::string& t : cfg.target_modules)
      if (TargetMatcher::name_matches(path, t)) used.insert(t);
  });
  if (cfg.target_regex.empty())
    for (const std::string& t : cfg.target_modules)
      EDL_CHECK(used.count(t) > 0, errc::unsupported, where, "target module \"", t,
                "\" matches no Linear of the model; the decoder layers have q_proj, k_proj, v_proj, o_proj, gate_proj, "
                "up_proj and down_proj (or use all-linear)");
  EDL_CHECK(!paths.empty(), errc::unsupported, where, "target_modules regex \"", cfg.target_regex,
            "\" matches no Linear of the model (paths look like model.layers.0.self_attn.q_proj)");

  m.visit_params("", [](std::string_view, auto& p) {
    p.frozen = true;
    p.grad = std::remove_reference_t<decltype(p.grad)>();
  });
  const Key key = Key::from_seed(cfg.seed);
  std::size_t i = 0;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (i >= paths.size() || path != paths[i]) return;
    lin.lora.emplace(lin.in_features(), lin.out_features(), cfg.r, cfg.lora_alpha, cfg.use_rslora, cfg.lora_dropout);
    lin.lora->reset(fold_in(key, static_cast<std::uint32_t>(i)));
    ++i;
  });
  return static_cast<std::int64_t>(paths.size());
}

/// Gives every adapter a dropout key for the next forward and backward (a micro-batch's), or
/// none (no dropout: evaluation and inference). Adapter i draws from fold_in(key, i).
template <class M>
void set_dropout(M& m, std::optional<Key> key) {
  std::uint32_t i = 0;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (!lin.lora) return;
    lin.lora->dropout_key = key ? std::optional<Key>(fold_in(*key, i)) : std::nullopt;
    ++i;
  });
}

/// Switches every adapter of `m` on or off; off, each Linear computes its base alone (PEFT's
/// disable_adapter), which is how DPO's reference model is the base without a second copy. A
/// model with a set_adapters_active(bool) of its own (a sharded model) switches itself.
template <class M>
void set_adapters_active(M& m, bool active) {
  if constexpr (requires { m.set_adapters_active(active); }) {
    m.set_adapters_active(active);
  } else {
    m.visit_linears("", [&](const std::string&, auto& lin) {
      if (lin.lora) lin.lora->active = active;
    });
  }
}

/// The adapters of a model switched off for a scope (and back on when it ends).
template <class M>
class AdaptersOff {
 public:
  explicit AdaptersOff(M& m) : m_(m) { set_adapters_active(m_, false); }
  ~AdaptersOff() { set_adapters_active(m_, true); }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  M& m_;
};

namespace detail {
template <class M>
void unfreeze(M& m) {
  m.visit_params("", [](std::string_view, auto& p) { p.frozen = false; });
}
}  // namespace detail

/// Folds every adapter into its base, W += scale * (B A) (in f32, rounded once to the
/// weight's dtype; a quantized base is dequantized first and stays dequantized), then removes
/// the adapters and unfreezes the model. Returns how many it merged.
template <class M>
std::int64_t merge_lora(M& m) {
  std::int64_t n = 0;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (!lin.lora) return;
    using T = typename std::remove_reference_t<decltype(lin)>::T;
    const std::int64_t out = lin.out_features(), in = lin.in_features(), r = lin.lora->rank();
    std::vector<float> w(static_cast<std::size_t>(out * in)), delta(w.size());
    if (lin.is_quantized()) {  // dequantized straight to f32: the merge rounds once
      lin.qweight.dequantize(w.data());
      lin.qweight = quant::Matrix();
      lin.weight = typename std::remove_reference_t<decltype(lin)>::WeightParam(
          {static_cast<std::size_t>(out), static_cast<std::size_t>(in)});
    } else {
      const T* src = lin.weight.data();
      for (std::size_t k = 0; k < w.size(); ++k) w[k] = to_f32(src[k]);
    }
    nn::gemm_ops::mm(lin.lora->B.data(), lin.lora->A.data(), delta.data(), out, in, r);
    const float scale = lin.lora->scale;
    T* dst = lin.weight.data();
    for (std::size_t k = 0; k < w.size(); ++k) dst[k] = from_f32<T>(w[k] + delta[k] * scale);
    lin.lora.reset();
    ++n;
  });
  detail::unfreeze(m);
  return n;
}

/// Removes every adapter (the base is unchanged) and unfreezes the model.
template <class M>
std::int64_t unwrap_lora(M& m) {
  std::int64_t n = 0;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (!lin.lora) return;
    lin.lora.reset();
    ++n;
  });
  detail::unfreeze(m);
  return n;
}

/// One adapter tensor: its path ("model.layers.0.self_attn.q_proj.lora_A.weight"), shape and values.
struct AdapterTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

/// The adapter parameters alone, copied, in visit order (lora_A before lora_B of each Linear).
template <class M>
std::vector<AdapterTensor> split_lora_params(M& m) {
  std::vector<AdapterTensor> out;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (!lin.lora) return;
    lin.lora->visit_params(path, [&](std::string_view name, auto& p) {
      std::vector<float> v(static_cast<std::size_t>(p.numel()));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_f32(p.data()[i]);
      out.push_back({std::string(name), p.shape(), std::move(v)});
    });
  });
  return out;
}

/// The LoraConfig of `m`'s adapters (r, alpha, dropout and rsLoRA of the first; the targets as
/// module names when every Linear of those names is adapted, else a regex of the exact paths).
/// Errors when `m` has no adapters or they differ in r, alpha, dropout or rsLoRA.
template <class M>
LoraConfig config_of(M& m) {
  LoraConfig c;
  std::vector<std::string> adapted, all;
  bool first = true;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    all.push_back(path);
    if (!lin.lora) return;
    const auto& a = *lin.lora;
    if (first) {
      c.r = a.rank(), c.lora_alpha = a.alpha, c.lora_dropout = a.dropout, c.use_rslora = a.rslora;
      first = false;
    }
    EDL_CHECK(a.rank() == c.r && a.alpha == c.lora_alpha && a.dropout == c.lora_dropout && a.rslora == c.use_rslora,
              errc::unsupported, path, "adapter (r ", a.rank(), ", alpha ", a.alpha,
              ") differs from the model's first adapter (r ", c.r, ", alpha ", c.lora_alpha,
              "): one adapter config per model");
    adapted.push_back(path);
  });
  EDL_CHECK(!adapted.empty(), errc::invalid_argument, "lora::config_of", "the model has no LoRA adapters");
  std::set<std::string> names;
  for (const std::string& p : adapted) names.insert(p.substr(p.rfind('.') + 1));
  c.target_modules.assign(names.begin(), names.end());
  std::size_t covered = 0;
  for (const std::string& p : all)
    if (names.count(p.substr(p.rfind('.') + 1))) ++covered;
  if (covered != adapted.size()) {  // a subset of those modules: name the paths exactly
    std::string re;
    for (const std::string& p : adapted) {
      if (!re.empty()) re += "|";
      for (char ch : p) {
        if (ch == '.') re += "\\";
        re += ch;
      }
    }
    c.target_regex = "(" + re + ")";
    c.target_modules.clear();
  }
  return c;
}

}  // namespace edl::lora
