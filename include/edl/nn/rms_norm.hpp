// edl/nn/rms_norm.hpp
// RMSNorm as HF LlamaRMSNorm: y = weight * x / sqrt(mean(x^2) + eps); weight [hidden], P<none>.
// With offset 1, HF GemmaRMSNorm: y = (1 + weight) * x / rms, weights stored (and initialised)
// around 0; the gradient of weight is that of (1 + weight).
// Saved: a pointer to x and 1/rms per row; backward via kernels::rms_norm_backward.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/param.hpp>

namespace edl::nn {

template <class Pol>
class RMSNorm {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  using T = typename Pol::param_t;
  using WeightParam = Param<T, P<none>>;

  struct Saved {
    const float* x = nullptr;  // owned by the caller
    std::vector<float> inv_rms;
  };

  RMSNorm() = default;
  explicit RMSNorm(std::int64_t hidden, double eps = 1e-6, float offset = 0.0f)
      : hidden_(hidden), eps_(eps), offset_(offset) {
    EDL_CHECK(hidden > 0, errc::invalid_argument, "nn.RMSNorm", "hidden must be positive, found ", hidden);
    EDL_CHECK(eps >= 0, errc::invalid_argument, "nn.RMSNorm", "eps must be >= 0, found ", eps);
    weight = WeightParam({static_cast<std::size_t>(hidden)}, offset == 0.0f ? Init::ones : Init::zeros);
    std::fill(weight.value.begin(), weight.value.end(), from_f32<T>(offset == 0.0f ? 1.0f : 0.0f));
  }

  WeightParam weight;
  std::int64_t hidden_size() const noexcept { return hidden_; }
  double eps() const noexcept { return eps_; }
  /// Added to the weight: 0 (Llama) or 1 (Gemma).
  float offset() const noexcept { return offset_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    f(join_path(prefix, "weight"), weight);
  }
  std::int64_t param_count() const noexcept { return hidden_; }
  double flops_forward(std::int64_t) const noexcept { return 0.0; }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  void apply(const float* x, std::int64_t rows, float* y) const {
    kernels::rms_norm_forward(x, weight.data(), y, static_cast<float*>(nullptr), rows, hidden_,
                              static_cast<float>(eps_), offset_);
    round_activations<Pol>(y, static_cast<std::size_t>(rows * hidden_));
  }
  void forward(const float* x, std::int64_t rows, float* y, Saved& s) const {
    s.x = x;
    s.inv_rms.resize(static_cast<std::size_t>(rows));
    kernels::rms_norm_forward(x, weight.data(), y, s.inv_rms.data(), rows, hidden_, static_cast<float>(eps_), offset_);
    round_activations<Pol>(y, static_cast<std::size_t>(rows * hidden_));
  }
  /// Writes dx (may equal dy), accumulates dweight.
  void backward(const float* dy, const Saved& s, float* dx) {
    std::vector<float> scratch;
    const float* w = as_f32(weight, scratch);
    if (offset_ != 0.0f) {  // the effective weight, offset + w, in f32
      if (w != scratch.data()) scratch.assign(w, w + hidden_);
      for (float& v : scratch) v += offset_;
      w = scratch.data();
    }
    kernels::rms_norm_backward(s.x, w, s.inv_rms.data(), dy, dx, weight.trainable_grad(),
                               static_cast<std::int64_t>(s.inv_rms.size()), hidden_);
  }

 private:
  std::int64_t hidden_ = 0;
  double eps_ = 1e-6;
  float offset_ = 0.0f;
};

}  // namespace edl::nn
