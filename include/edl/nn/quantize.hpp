// edl/nn/quantize.hpp
// Quantizing a model's Linear layers at run time, EasyDeL's quantize(quantization_config):
//
//   nn::quantize(model, {quant::Format::q8_0});                       // every decoder Linear
//   nn::quantize(model, {quant::Format::q4_0, 0, "mlp\\.(gate|up)_proj"});
//   nn::is_quantized(model);
//
// `pattern` is an ECMAScript regex searched in each Linear's weight path (HF names,
// "model.layers.3.mlp.up_proj.weight"); the default takes the Linears of the decoder layers,
// so embeddings, norms and lm_head stay in the policy's dtype unless the pattern names them
// (kWithHeadPattern adds lm_head: a quantized head decodes and scores, and stays frozen). A
// Linear whose input width is not a multiple of the format's block is an error naming it,
// before any layer changes.
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/quant/formats.hpp>

namespace edl::nn {

struct QuantizationConfig {
  quant::Format method = quant::Format::q8_0;
  std::int64_t block_size = 0;  // 0: the format's own (32 for q8_0 / q4_0, 64 for nf4)
  std::string pattern = kDefaultPattern;

  /// The decoder's projections: attention, MLP, experts and shared experts (a router,
  /// block_sparse_moe.gate or mlp.gate, and the shared expert's gate stay in the policy's dtype,
  /// as llama.cpp keeps ffn_gate_inp in f32).
  static constexpr const char* kDefaultPattern =
      R"(\.layers\.\d+\.((self_attn|mlp)\.\w+_proj|mlp\.(experts\.\d+|shared_expert)\.\w+_proj|block_sparse_moe\.experts\.\d+\.w[123])\.weight$)";
  /// The decoder's Linears and lm_head (what llama.cpp's q8_0 / q4_0 files quantize).
  static constexpr const char* kWithHeadPattern =
      R"((\.layers\.\d+\.((self_attn|mlp)\.\w+_proj|mlp\.(experts\.\d+|shared_expert)\.\w+_proj|block_sparse_moe\.experts\.\d+\.w[123])|^lm_head)\.weight$)";
};

/// Quantizes every Linear of `m` whose weight path matches cfg.pattern and is not quantized
/// yet. Returns how many it quantized.
template <class M>
std::int64_t quantize(M& m, const QuantizationConfig& cfg) {
  const char* where = "nn::quantize";
  EDL_CHECK(cfg.method != quant::Format::none, errc::invalid_argument, where, "method must be q8_0, q4_0 or nf4, found none");
  EDL_CHECK(cfg.block_size == 0 || cfg.block_size == quant::block_elems(cfg.method), errc::unsupported, where,
            quant::format_name(cfg.method), " uses blocks of ", quant::block_elems(cfg.method), ", found block_size ",
            cfg.block_size);
  std::regex re;
  try {
    re = std::regex(cfg.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    ::edl::detail::raise(errc::invalid_argument, where,
                         ::edl::detail::concat("pattern \"", cfg.pattern, "\" is not a valid regex: ", e.what()));
  }
  // Check every match first, so that a bad layer leaves the model unchanged.
  std::vector<std::string> paths;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    const std::string name = path + ".weight";
    if (lin.is_quantized() || !std::regex_search(name, re)) return;
    EDL_CHECK(lin.in_features() % quant::block_elems(cfg.method) == 0, errc::shape_mismatch, name, "has ",
              lin.in_features(), " input features, not a multiple of ", quant::format_name(cfg.method), "'s block of ",
              quant::block_elems(cfg.method));
    paths.push_back(name);
  });
  std::size_t i = 0;
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (i < paths.size() && path + ".weight" == paths[i]) lin.quantize(cfg.method, paths[i++]);
  });
  return static_cast<std::int64_t>(paths.size());
}

/// Dequantizes every quantized Linear of `m` to the policy's dtype. Returns how many.
template <class M>
std::int64_t dequantize(M& m) {
  std::int64_t n = 0;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (!lin.is_quantized()) return;
    lin.dequantize();
    ++n;
  });
  return n;
}

/// Whether any Linear of `m` holds a quantized weight.
template <class M>
bool is_quantized(M& m) {
  bool any = false;
  m.visit_linears("", [&](const std::string&, auto& lin) { any = any || lin.is_quantized(); });
  return any;
}

/// The format of `m`'s quantized Linears (Format::none when none is; the first one's if mixed).
template <class M>
quant::Format quantized_format(M& m) {
  quant::Format f = quant::Format::none;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (f == quant::Format::none && lin.is_quantized()) f = lin.qweight.format();
  });
  return f;
}

}  // namespace edl::nn
