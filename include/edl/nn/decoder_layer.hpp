// edl/nn/decoder_layer.hpp
// One pre-norm Llama decoder layer (HF LlamaDecoderLayer):
//   h = x + attn(input_layernorm(x))
//   y = h + mlp(post_attention_layernorm(h))
// Saved: norm outputs, h, and the sub-modules' Saved (x itself stays with the caller).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/nn/attention.hpp>
#include <edl/nn/mlp.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/rms_norm.hpp>

namespace edl::nn {

struct DecoderLayerConfig {
  AttentionConfig attention;
  std::int64_t intermediate = 0;
  bool mlp_bias = false;
  double rms_norm_eps = 1e-6;
};

template <class Pol>
class DecoderLayer {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename RMSNorm<Pol>::Saved norm1_s, norm2_s;
    typename Attention<Pol>::Saved attn_s;
    typename MLP<Pol>::Saved mlp_s;
    std::vector<float> n1, h, n2;  // [T, hidden]
  };

  DecoderLayer() = default;
  explicit DecoderLayer(const DecoderLayerConfig& c)
      : input_layernorm(c.attention.hidden, c.rms_norm_eps),
        self_attn(c.attention),
        post_attention_layernorm(c.attention.hidden, c.rms_norm_eps),
        mlp(c.attention.hidden, c.intermediate, c.mlp_bias),
        hidden_(c.attention.hidden) {}

  RMSNorm<Pol> input_layernorm;
  Attention<Pol> self_attn;
  RMSNorm<Pol> post_attention_layernorm;
  MLP<Pol> mlp;

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    input_layernorm.visit_params(join_path(prefix, "input_layernorm"), f);
    self_attn.visit_params(join_path(prefix, "self_attn"), f);
    post_attention_layernorm.visit_params(join_path(prefix, "post_attention_layernorm"), f);
    mlp.visit_params(join_path(prefix, "mlp"), f);
  }
  std::int64_t param_count() const noexcept {
    return input_layernorm.param_count() + self_attn.param_count() + post_attention_layernorm.param_count() +
           mlp.param_count();
  }
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    return self_attn.flops_forward(batch, seq) + mlp.flops_forward(batch * seq);
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  void forward(const float* x, const TokenLayout& layout, float* y, Saved& s) const {
    const std::int64_t T = layout.tokens();
    const std::size_t n = static_cast<std::size_t>(T * hidden_);
    s.n1.resize(n);
    s.h.resize(n);
    s.n2.resize(n);
    input_layernorm.forward(x, T, s.n1.data(), s.norm1_s);
    self_attn.forward(s.n1.data(), layout, s.h.data(), s.attn_s);
    kernels::add_inplace(s.h.data(), x, static_cast<std::ptrdiff_t>(n));
    post_attention_layernorm.forward(s.h.data(), T, s.n2.data(), s.norm2_s);
    mlp.forward(s.n2.data(), T, y, s.mlp_s);
    kernels::add_inplace(y, s.h.data(), static_cast<std::ptrdiff_t>(n));
  }
  void apply(const float* x, const TokenLayout& layout, float* y) const {
    Saved s;
    forward(x, layout, y, s);
  }

  /// Accumulates every parameter gradient; writes dx [T, hidden] (dx must not alias dy).
  void backward(const float* dy, Saved& s, float* dx) {
    const std::size_t n = s.h.size();
    std::vector<float> a(n), dh(dy, dy + n);
    mlp.backward(dy, s.mlp_s, a.data());                       // d n2
    post_attention_layernorm.backward(a.data(), s.norm2_s, a.data());  // d h (via the norm)
    kernels::add_inplace(dh.data(), a.data(), static_cast<std::ptrdiff_t>(n));
    self_attn.backward(dh.data(), s.attn_s, a.data());        // d n1
    input_layernorm.backward(a.data(), s.norm1_s, dx);        // d x (via the norm)
    kernels::add_inplace(dx, dh.data(), static_cast<std::ptrdiff_t>(n));
  }

 private:
  std::int64_t hidden_ = 0;
};

}  // namespace edl::nn
