// edl/kernels/quant_gemm.hpp
// Prefill with int8 weights: y [M, N] = x [M, K] W^T for q8_0 / q4_0 W and many rows of x,
// each output the same sum as the decode dot product (kernels/quant_dot.hpp) bit for bit.
//
//   kernels::quant_gemm_nt(xa, M, W, bias, y);   // xa: M rows of K / 32 ActivationBlocks
//
// With AVX-512 VNNI a tile of 4 weight rows by 4 activation rows runs two blocks per 512-bit
// vector: the even block in lanes 0-7 and the odd one in lanes 8-15, which is exactly the
// two accumulators of the dot's definition. The activations go unsigned (x + 128, a flip of
// the sign bit) so vpdpbusd takes the weights as they are, and -128 * (each lane's weight sum),
// made once per weight block, starts the sum: the same integers as the dot's. Tiles are
// parallel over chunks of weight rows and walk the activations in blocks that stay in L2;
// the edges (and builds without AVX-512 VNNI) run the dot products themselves.
#pragma once

#include <algorithm>
#include <cstdint>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define EDL_QUANT_GEMM_ZMM 1
#endif

namespace edl::kernels {

namespace detail {

/// The dot of weight row r (q8_0 or q4_0) with one activation row.
inline float int8_row_dot(const quant::MatrixView& W, std::int64_t r, const ActivationBlock* xa) noexcept {
  const std::int64_t nb = W.blocks_per_row();
  if (W.format == quant::Format::q8_0) return dot_q8_0(reinterpret_cast<const quant::BlockQ8_0*>(W.row(r)), xa, nb);
  return dot_q4_0(reinterpret_cast<const quant::BlockQ4_0*>(W.row(r)), xa, nb);
}

#if defined(EDL_QUANT_GEMM_ZMM)
/// Blocks b and b + 1 of a weight row as signed int8 in one vector (b + 1 zero when absent),
/// and their scales.
inline __m512i weight_pair(const quant::MatrixView& W, std::int64_t r, std::int64_t b, bool second, float& d0,
                           float& d1) noexcept {
  if (W.format == quant::Format::q8_0) {
    const auto* w = reinterpret_cast<const quant::BlockQ8_0*>(W.row(r)) + b;
    d0 = f16_to_f32(w[0].d);
    d1 = second ? f16_to_f32(w[1].d) : 0.f;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0].qs));
    const __m256i hi = second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[1].qs)) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  const auto* w = reinterpret_cast<const quant::BlockQ4_0*>(W.row(r)) + b;
  d0 = f16_to_f32(w[0].d);
  d1 = second ? f16_to_f32(w[1].d) : 0.f;
  const __m256i eight = _mm256_set1_epi8(8);
  const __m256i lo = _mm256_sub_epi8(unpack_q4_0(w[0].qs), eight);
  const __m256i hi = second ? _mm256_sub_epi8(unpack_q4_0(w[1].qs), eight) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/// y[m * ldy + r] for 4 weight rows r0.. and 4 activation rows (xa rows m0.., nb blocks each).
inline void int8_tile_4x4(const quant::MatrixView& W, std::int64_t r0, const ActivationBlock* xa, std::int64_t m0,
                          std::int64_t nb, float* y, std::int64_t ldy) noexcept {
  __m512 acc[4][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));  // 128 as unsigned
  for (std::int64_t b = 0; b < nb; b += 2) {
    const bool second = b + 1 < nb;
    __m512i w[4], negc[4];
    __m512 dw[4];
    for (int i = 0; i < 4; ++i) {
      float d0, d1;
      w[i] = weight_pair(W, r0 + i, b, second, d0, d1);
      negc[i] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, w[i]));
      dw[i] = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
    }
    for (int j = 0; j < 4; ++j) {
      const ActivationBlock* x = xa + (m0 + j) * nb + b;
      const __m256i xl = _mm256_load_si256(reinterpret_cast<const __m256i*>(x[0].qs));
      const __m256i xh = second ? _mm256_load_si256(reinterpret_cast<const __m256i*>(x[1].qs)) : _mm256_setzero_si256();
      const __m512i xu = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(xl), xh, 1), flip);
      const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(x[0].d), _mm256_set1_ps(second ? x[1].d : 0.f), 1);
      for (int i = 0; i < 4; ++i) {
        const __m512i s = _mm512_dpbusd_epi32(negc[i], xu, w[i]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[i], dx), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const __m512 a = acc[i][j];
      y[(m0 + j) * ldy + r0 + i] =
          sum_lanes8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
    }
}
#endif

}  // namespace detail

/// y [M, N] = the dots of W's rows (q8_0 or q4_0, N = W.rows) with M activation rows (xa:
/// K / 32 blocks a row), plus bias[j] when given.
template <class TB>
void quant_gemm_nt(const ActivationBlock* xa, std::int64_t M, const quant::MatrixView& W, const TB* bias, float* y) {
  const std::int64_t N = W.rows, nb = W.blocks_per_row();
  constexpr std::int64_t kRowChunk = 16, kActBlock = 64;
  exec::parallel_for(0, (N + kRowChunk - 1) / kRowChunk, 1, [&](std::ptrdiff_t c0, std::ptrdiff_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t r_lo = c * kRowChunk, r_hi = std::min(N, r_lo + kRowChunk);
      for (std::int64_t m_lo = 0; m_lo < M; m_lo += kActBlock) {
        const std::int64_t m_hi = std::min(M, m_lo + kActBlock);
        std::int64_t r = r_lo;
#if defined(EDL_QUANT_GEMM_ZMM)
        for (; r + 4 <= r_hi; r += 4) {
          std::int64_t m = m_lo;
          for (; m + 4 <= m_hi; m += 4) detail::int8_tile_4x4(W, r, xa, m, nb, y, N);
          for (; m < m_hi; ++m)
            for (std::int64_t i = r; i < r + 4; ++i) y[m * N + i] = detail::int8_row_dot(W, i, xa + m * nb);
        }
#endif
        for (; r < r_hi; ++r)
          for (std::int64_t m = m_lo; m < m_hi; ++m) y[m * N + r] = detail::int8_row_dot(W, r, xa + m * nb);
      }
      if (bias)
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t r = r_lo; r < r_hi; ++r) y[m * N + r] += to_f32(bias[r]);
    }
  });
}

}  // namespace edl::kernels
