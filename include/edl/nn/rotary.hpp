// edl/nn/rotary.hpp
// Rotary position embeddings, HF convention (rotate_half, not interleaved pairs):
//   for a head vector x of dim d, half = d / 2, i < half, angle a_i = position * inv_freq_i:
//     y_i        = m (x_i cos a_i - x_{i+half} sin a_i)
//     y_{i+half} = m (x_{i+half} cos a_i + x_i sin a_i)
//   inv_freq_i = 1 / theta^(2i / d), m = 1 (the attention factor of yarn and longrope).
// Scaling (HF rope_scaling, transformers' modeling_rope_utils):
//   "linear"   divides inv_freq by factor (= positions / factor);
//   "llama3"   _compute_llama3_parameters (wavelengths above original_max / low_freq_factor
//              divided by factor, below original_max / high_freq_factor kept, smooth in between);
//   "yarn"     _compute_yarn_parameters: a ramp between interpolated (/ factor) and original
//              frequencies over the dimensions whose rotations in original_max positions lie
//              between beta_slow and beta_fast; m = attention_factor, or 0.1 ln(factor) + 1
//              (mscale / mscale_all_dim as DeepSeek writes them);
//   "dynamic"  NTK: while a forward's sequence length L (its largest position + 1) exceeds
//              max_position_embeddings, theta becomes theta (factor L / max - (factor - 1))^(d/(d-2));
//   "longrope" per-dimension divisors: short_factor while L <= original_max, long_factor above;
//              m = attention_factor, or sqrt(1 + ln(factor) / ln(original_max)).
// dynamic and longrope depend on L, so their tables are a function of (position, L): a full forward
// uses its own L for every token (TokenLayout::context, or its largest position + 1) as a freshly
// loaded HF model does; a cached decoder uses each sequence's L at the step that wrote the token
// (generate/rope_table.hpp), as HF generation does -- the cached keys keep the rotation they had.
// Backward is the transpose (angle -a, same m). Angles and cos/sin are computed in double
// and rounded once to f32. No parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/nn/module.hpp>

namespace edl::nn {

/// HF rope parameters (rope_theta, max_position_embeddings and rope_scaling of config.json).
struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // "default" | "linear" | "llama3" | "yarn" | "dynamic" | "longrope"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;  // llama3, yarn, longrope
  double max_position_embeddings = 8192;           // dynamic: the length scaling starts beyond
  double attention_factor = 0;                     // yarn, longrope: 0 = the formula's default
  double beta_fast = 32, beta_slow = 1;            // yarn
  double mscale = 0, mscale_all_dim = 0;           // yarn (DeepSeek): 0 = absent
  bool truncate = true;                            // yarn: integer ramp bounds
  std::vector<double> short_factor, long_factor;   // longrope: head_dim / 2 each

  /// True when the frequencies depend on the forward's sequence length (dynamic, longrope).
  bool length_dependent() const noexcept { return type == "dynamic" || type == "longrope"; }
};

class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(std::int64_t head_dim, RopeConfig cfg = {}) : head_dim_(head_dim), cfg_(std::move(cfg)) {
    EDL_CHECK(head_dim > 0 && head_dim % 2 == 0, errc::invalid_argument, "nn.RotaryEmbedding",
              "head_dim must be positive and even, found ", head_dim);
    EDL_CHECK(cfg_.type == "default" || cfg_.type == "linear" || cfg_.type == "llama3" || cfg_.type == "yarn" ||
                  cfg_.type == "dynamic" || cfg_.type == "longrope",
              errc::unsupported, "nn.RotaryEmbedding", "rope type \"", cfg_.type,
              "\" is not supported (default, linear, llama3, yarn, dynamic, longrope)");
    if (cfg_.type == "longrope")
      for (const auto* f : {&cfg_.short_factor, &cfg_.long_factor})
        EDL_CHECK(static_cast<std::int64_t>(f->size()) == head_dim / 2, errc::config, "nn.RotaryEmbedding",
                  "longrope ", f == &cfg_.short_factor ? "short_factor" : "long_factor", " needs head_dim / 2 = ",
                  head_dim / 2, " values, found ", f->size());
    inv_freq_ = compute_inv_freq(head_dim, cfg_, 0);
    scale_ = attention_scaling(cfg_);
  }

  /// inv_freq for head_dim and cfg in a forward whose sequence length is `context` (read only
  /// by dynamic and longrope; 0 = short), HF's formulas in double.
  static std::vector<double> compute_inv_freq(std::int64_t head_dim, const RopeConfig& c, std::int64_t context) {
    const std::int64_t half = head_dim / 2;
    const double d = static_cast<double>(head_dim);
    double theta = c.theta;
    if (c.type == "dynamic" && static_cast<double>(context) > c.max_position_embeddings)
      theta *= std::pow(c.factor * static_cast<double>(context) / c.max_position_embeddings - (c.factor - 1), d / (d - 2));
    std::vector<double> f(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      f[static_cast<std::size_t>(i)] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / d);
    const double pi = 3.14159265358979323846;
    if (c.type == "linear") {
      for (double& v : f) v /= c.factor;
    } else if (c.type == "llama3") {
      const double old_ctx = c.original_max_position_embeddings;
      const double low_wavelen = old_ctx / c.low_freq_factor, high_wavelen = old_ctx / c.high_freq_factor;
      for (double& v : f) {
        const double wavelen = 2 * pi / v;
        if (wavelen > low_wavelen) {
          v = v / c.factor;  // low frequency: scaled
        } else if (wavelen >= high_wavelen) {  // medium: interpolate
          const double smooth = (old_ctx / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
          v = (1 - smooth) * v / c.factor + smooth * v;
        }  // high frequency: unchanged
      }
    } else if (c.type == "yarn") {
      // The dimension whose wavelength fits `rotations` times into the original context.
      const auto correction_dim = [&](double rotations) {
        return d * std::log(c.original_max_position_embeddings / (rotations * 2 * pi)) / (2 * std::log(c.theta));
      };
      double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
      if (c.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1);
      if (low == high) high += 0.001;  // HF: avoids a zero-width ramp
      for (std::int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // 1: keep the original frequency
        double& v = f[static_cast<std::size_t>(i)];
        v = v / c.factor * (1 - extrapolation) + v * extrapolation;
      }
    } else if (c.type == "longrope") {
      const auto& ext = static_cast<double>(context) > c.original_max_position_embeddings ? c.long_factor : c.short_factor;
      for (std::int64_t i = 0; i < half; ++i) f[static_cast<std::size_t>(i)] /= ext[static_cast<std::size_t>(i)];
    }
    return f;
  }

  /// m, the factor HF multiplies cos and sin by (1 but for yarn and longrope).
  static double attention_scaling(const RopeConfig& c) {
    if (c.attention_factor > 0) return c.attention_factor;
    const auto mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    if (c.type == "yarn")
      return c.mscale != 0 && c.mscale_all_dim != 0 ? mscale(c.factor, c.mscale) / mscale(c.factor, c.mscale_all_dim)
                                                    : mscale(c.factor, 1.0);
    if (c.type == "longrope")
      return c.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(c.factor) / std::log(c.original_max_position_embeddings));
    return 1.0;
  }

  std::int64_t head_dim() const noexcept { return head_dim_; }
  const std::vector<double>& inv_freq() const noexcept { return inv_freq_; }
  const RopeConfig& config() const noexcept { return cfg_; }

  double scale() const noexcept { return scale_; }

  /// A forward's sequence length as the length-dependent scalings see it: layout.context when
  /// set (a mesh device's share of a batch passes the whole batch's), else the largest position + 1.
  static std::int64_t context_of(const TokenLayout& layout) {
    if (layout.context > 0) return layout.context;
    std::int64_t L = 0;
    for (std::int64_t t = 0; t < layout.tokens(); ++t) L = std::max(L, layout.position(t) + 1);
    return L;
  }

  /// cos and sin tables [tokens, head_dim / 2] for the tokens' positions.
  void tables(const TokenLayout& layout, std::vector<float>& cos, std::vector<float>& sin) const {
    const std::int64_t T = layout.tokens(), half = head_dim_ / 2;
    cos.resize(static_cast<std::size_t>(T * half));
    sin.resize(static_cast<std::size_t>(T * half));
    std::vector<double> scaled;
    const std::vector<double>& f =
        cfg_.length_dependent() ? (scaled = compute_inv_freq(head_dim_, cfg_, context_of(layout))) : inv_freq_;
    for (std::int64_t t = 0; t < T; ++t) angles(f, layout.position(t), cos.data() + t * half, sin.data() + t * half);
  }

  /// cos and sin [head_dim / 2] of one position under frequencies f (inv_freq, or those of a length).
  void angles(const std::vector<double>& f, std::int64_t position, float* cos, float* sin) const {
    const double pos = static_cast<double>(position);
    for (std::size_t i = 0; i < f.size(); ++i) {
      const double a = pos * f[i];
      cos[i] = static_cast<float>(scale_ * std::cos(a));
      sin[i] = static_cast<float>(scale_ * std::sin(a));
    }
  }

  /// Rotates x [tokens, heads * head_dim] in place (inverse = the backward when `inverse`:
  /// the transpose, which with m != 1 is m times the inverse rotation, as autograd computes).
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
  double scale_ = 1.0;
};

}  // namespace edl::nn
