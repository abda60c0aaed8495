// edl/nn/rotary.hpp
// Rotary position embeddings, HF convention (rotate_half, not interleaved pairs):
//   for a head vector x of dim d, half = d / 2, i < half, angle a_i = position * inv_freq_i:
//     y_i        = x_i cos a_i - x_{i+half} sin a_i
//     y_{i+half} = x_{i+half} cos a_i + x_i sin a_i
//   inv_freq_i = 1 / theta^(2i / d)
// Scaling (HF rope_scaling): "linear" divides inv_freq by factor (= positions / factor);
// "llama3" applies HF _compute_llama3_parameters (wavelengths above original_max / low_freq_factor
// divided by factor, below original_max / high_freq_factor kept, smooth interpolation in between).
// Backward is the inverse rotation (angle -a). Angles and cos/sin are computed in double and
// rounded once to f32. No parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/nn/module.hpp>

namespace edl::nn {

/// HF rope parameters (rope_theta and rope_scaling of config.json).
struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // "default" | "linear" | "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(std::int64_t head_dim, RopeConfig cfg = {}) : head_dim_(head_dim), cfg_(std::move(cfg)) {
    EDL_CHECK(head_dim > 0 && head_dim % 2 == 0, errc::invalid_argument, "nn.RotaryEmbedding",
              "head_dim must be positive and even, found ", head_dim);
    EDL_CHECK(cfg_.type == "default" || cfg_.type == "linear" || cfg_.type == "llama3", errc::unsupported,
              "nn.RotaryEmbedding", "rope type \"", cfg_.type, "\" is not supported (default, linear, llama3)");
    inv_freq_ = compute_inv_freq(head_dim, cfg_);
  }

  /// inv_freq for head_dim and cfg, HF's formulas in double.
  static std::vector<double> compute_inv_freq(std::int64_t head_dim, const RopeConfig& c) {
    const std::int64_t half = head_dim / 2;
    std::vector<double> f(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      f[static_cast<std::size_t>(i)] = 1.0 / std::pow(c.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (c.type == "linear") {
      for (double& v : f) v /= c.factor;
    } else if (c.type == "llama3") {
      const double old_ctx = c.original_max_position_embeddings;
      const double low_wavelen = old_ctx / c.low_freq_factor, high_wavelen = old_ctx / c.high_freq_factor;
      const double pi = 3.14159265358979323846;
      for (double& v : f) {
        const double wavelen = 2 * pi / v;
        if (wavelen > low_wavelen) {
          v = v / c.factor;  // low frequency: scaled
        } else if (wavelen >= high_wavelen) {  // medium: interpolate
          const double smooth = (old_ctx / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
          v = (1 - smooth) * v / c.factor + smooth * v;
        }  // high frequency: unchanged
      }
    }
    return f;
  }

  std::int64_t head_dim() const noexcept { return head_dim_; }
  const std::vector<double>& inv_freq() const noexcept { return inv_freq_; }
  const RopeConfig& config() const noexcept { return cfg_; }

  /// cos and sin tables [tokens, head_dim / 2] for the tokens' positions.
  void tables(const TokenLayout& layout, std::vector<float>& cos, std::vector<float>& sin) const {
    const std::int64_t T = layout.tokens(), half = head_dim_ / 2;
    cos.resize(static_cast<std::size_t>(T * half));
    sin.resize(static_cast<std::size_t>(T * half));
    for (std::int64_t t = 0; t < T; ++t) {
      const double pos = static_cast<double>(layout.position(t));
      for (std::int64_t i = 0; i < half; ++i) {
        const double a = pos * inv_freq_[static_cast<std::size_t>(i)];
        cos[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::cos(a));
        sin[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::sin(a));
      }
    }
  }

  /// Rotates x [tokens, heads * head_dim] in place (inverse = the backward when `inverse`).
  void rotate(float* x, std::int64_t tokens, std::int64_t heads, const float* cos, const float* sin,
              bool inverse = false) const {
    const std::int64_t D = head_dim_, half = D / 2, width = heads * D;
    const float sgn = inverse ? -1.0f : 1.0f;
    exec::parallel_for(0, tokens, std::max<std::int64_t>(1, 8192 / width), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t) {
        const float* c = cos + t * half;
        const float* s = sin + t * half;
        for (std::int64_t h = 0; h < heads; ++h) {
          float* v = x + t * width + h * D;
          for (std::int64_t i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half], si = sgn * s[i];
            v[i] = a * c[i] - b * si;
            v[i + half] = b * c[i] + a * si;
          }
        }
      }
    });
  }

  /// Forward on q or k in place.
  void apply(float* x, std::int64_t tokens, std::int64_t heads, const float* cos, const float* sin) const {
    rotate(x, tokens, heads, cos, sin, false);
  }
  /// Backward in place: dx = R^T dy (the rotation by -angle).
  void backward(float* d, std::int64_t tokens, std::int64_t heads, const float* cos, const float* sin) const {
    rotate(d, tokens, heads, cos, sin, true);
  }

 private:
  std::int64_t head_dim_ = 0;
  RopeConfig cfg_;
  std::vector<double> inv_freq_;
};

}  // namespace edl::nn
