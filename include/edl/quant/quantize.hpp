// edl/quant/quantize.hpp
// Quantizing and dequantizing rows of f32 values to the block formats (quant/formats.hpp).
// These are the reference definitions; kernels/quant_matvec.hpp has the fast activation
// quantizer and the dot products, each tested against the functions here.
//
// Rounding, as the reference implementations define it:
//  - q8_0 weights (ggml's quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d) (half
//    away from zero), with the f32 d; the block stores d as f16 (round to nearest even).
//  - q4_0 weights (ggml's quantize_row_q4_0_ref): m = the value of largest magnitude (the
//    first on ties), d = m / -8, q = min(15, (int8)(x / d + 8.5)) (truncation toward zero).
//  - q8_0 activations (the dot products' other side, as llama.cpp's SIMD quantize_row_q8_0):
//    d = amax / 127, q = x * (127 / amax) rounded to nearest even.
//  - nf4 (bitsandbytes' kQuantizeBlockwise with dQuantizeNF4): absmax per block of 64, each
//    x / absmax to the nearest of the 16 NF4 levels (ties to the lower level), the first
//    value of a pair in the high nibble; the absmax values are double-quantized (see
//    DoubleQuant) and the weights use their dequantized value.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/quant/formats.hpp>

namespace edl::quant {

// ---------------------------------------------------------------- q8_0
/// Quantizes K values (K a multiple of 32) into K / 32 q8_0 blocks (weights' rounding).
inline void quantize_row_q8_0(const float* x, BlockQ8_0* out, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 32; ++b, x += 32) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    out[b].d = f16(d);
    for (int i = 0; i < 32; ++i) out[b].qs[i] = static_cast<std::int8_t>(std::roundf(x[i] * id));
  }
}

/// Quantizes K values into q8_0 blocks with the activations' rounding (the reference of
/// kernels::quantize_activations).
inline void quantize_activations_ref(const float* x, BlockQ8_0* out, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 32; ++b, x += 32) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    out[b].d = f16(d);
    for (int i = 0; i < 32; ++i) out[b].qs[i] = static_cast<std::int8_t>(std::nearbyint(x[i] * id));
  }
}

inline void dequantize_row_q8_0(const BlockQ8_0* in, float* y, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 32; ++b, y += 32) {
    const float d = in[b].d.to_float();
    for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(in[b].qs[i]);
  }
}

// ---------------------------------------------------------------- q4_0
inline void quantize_row_q4_0(const float* x, BlockQ4_0* out, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 32; ++b, x += 32) {
    float amax = 0.f, m = 0.f;
    for (int i = 0; i < 32; ++i)
      if (amax < std::fabs(x[i])) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    const float d = m / -8.f, id = d != 0.f ? 1.f / d : 0.f;
    out[b].d = f16(d);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j + 16] * id + 8.5f)));
      out[b].qs[j] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

/// Value i (0..31) of a q4_0 block as its integer q - 8.
inline int q4_0_value(const BlockQ4_0& blk, int i) noexcept {
  const std::uint8_t byte = blk.qs[i & 15];
  return (i < 16 ? byte & 0xF : byte >> 4) - 8;
}

inline void dequantize_row_q4_0(const BlockQ4_0* in, float* y, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 32; ++b, y += 32) {
    const float d = in[b].d.to_float();
    for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q4_0_value(in[b], i));
  }
}

// ---------------------------------------------------------------- nf4
/// The 16 NF4 levels (QLoRA, bitsandbytes' NF4 code), in code order.
inline constexpr std::array<float, 16> kNF4Levels = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f};

/// The NF4 code of a normalised value: the nearest level, ties to the lower one (bitsandbytes
/// compares against the midpoints with `>`).
inline std::uint8_t nf4_code(float v) noexcept {
  std::uint8_t c = 0;
  for (int i = 1; i < 16; ++i) {
    const float mid = static_cast<float>((static_cast<double>(kNF4Levels[static_cast<std::size_t>(i - 1)]) +
                                          static_cast<double>(kNF4Levels[static_cast<std::size_t>(i)])) /
                                         2.0);
    if (v > mid) c = static_cast<std::uint8_t>(i);
  }
  return c;
}

/// Code i (0..63) of an nf4 block.
inline int nf4_code_at(const BlockNF4& blk, int i) noexcept {
  const std::uint8_t byte = blk.qs[i / 2];
  return i % 2 == 0 ? byte >> 4 : byte & 0xF;
}

/// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True, max_exponent_bits=7,
/// total_bits=8)): 254 values +-10^(i-6) * m over the midpoints m of linspace(0.1, 1, 2^i + 1)
/// for i = 0..6, plus 0 and 1, sorted. The scales of nf4 blocks are quantized with it.
inline const std::array<float, 256>& dynamic_map() {
  static const std::array<float, 256> map = [] {
    std::vector<float> v;
    for (int i = 0; i < 7; ++i) {
      const int n = (1 << i) + 1;
      for (int j = 0; j + 1 < n; ++j) {
        const float a = static_cast<float>(0.1 + 0.9 * j / (n - 1)), b = static_cast<float>(0.1 + 0.9 * (j + 1) / (n - 1));
        const float mean = (a + b) / 2.f;
        const float scale = static_cast<float>(std::pow(10.0, -6 + i));
        v.push_back(scale * mean);
        v.push_back(-scale * mean);
      }
    }
    v.push_back(0.f);
    v.push_back(1.f);
    std::sort(v.begin(), v.end());
    std::array<float, 256> a{};
    std::copy(v.begin(), v.end(), a.begin());
    return a;
  }();
  return map;
}

/// The index of the value of dynamic_map() nearest to v (v in [-1, 1]; ties to the lower).
inline std::uint8_t dynamic_code(float v) noexcept {
  const auto& m = dynamic_map();
  const auto it = std::lower_bound(m.begin(), m.end(), v);
  if (it == m.begin()) return 0;
  if (it == m.end()) return 255;
  const std::size_t hi = static_cast<std::size_t>(it - m.begin()), lo = hi - 1;
  return static_cast<std::uint8_t>(v - m[lo] <= m[hi] - v ? lo : hi);
}

/// Double quantization of nf4's per-block absmax (bitsandbytes' compress_statistics): the
/// mean is subtracted (offset), and the rest quantized blockwise over groups of 256 with
/// dynamic_map(), each group scaled by its own absmax (scales).
struct DoubleQuant {
  static constexpr std::int64_t group = 256;
  float offset = 0.f;
  std::vector<std::uint8_t> codes;  // one per nf4 block
  std::vector<float> scales;        // one per group of 256 blocks

  static DoubleQuant quantize(std::span<const float> absmax) {
    DoubleQuant q;
    double sum = 0;
    for (float a : absmax) sum += a;
    q.offset = absmax.empty() ? 0.f : static_cast<float>(sum / static_cast<double>(absmax.size()));
    const std::size_t n = absmax.size();
    q.codes.resize(n);
    for (std::size_t g0 = 0; g0 < n; g0 += group) {
      const std::size_t g1 = std::min(n, g0 + static_cast<std::size_t>(group));
      float amax = 0.f;
      for (std::size_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(absmax[i] - q.offset));
      q.scales.push_back(amax);
      const float inv = amax != 0.f ? 1.f / amax : 0.f;
      for (std::size_t i = g0; i < g1; ++i) q.codes[i] = dynamic_code((absmax[i] - q.offset) * inv);
    }
    return q;
  }
  /// The absmax of block i as the weights use it.
  float value(std::size_t i) const noexcept {
    return dynamic_map()[codes[i]] * scales[i / static_cast<std::size_t>(group)] + offset;
  }
};

/// Quantizes K values (K a multiple of 64) into nf4 codes with the given per-block scales
/// (block b is divided by absmax[b]; a block whose absmax is 0 gets the code of 0.0).
inline void quantize_row_nf4(const float* x, const float* absmax, BlockNF4* out, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 64; ++b, x += 64) {
    const float inv = absmax[b] != 0.f ? 1.f / absmax[b] : 0.f;
    for (int j = 0; j < 32; ++j)
      out[b].qs[j] = static_cast<std::uint8_t>((nf4_code(x[2 * j] * inv) << 4) | nf4_code(x[2 * j + 1] * inv));
  }
}

inline void dequantize_row_nf4(const BlockNF4* in, const float* absmax, float* y, std::int64_t K) {
  for (std::int64_t b = 0; b < K / 64; ++b, y += 64)
    for (int i = 0; i < 64; ++i) y[i] = absmax[b] * kNF4Levels[static_cast<std::size_t>(nf4_code_at(in[b], i))];
}

}  // namespace edl::quant
