// edl/kernels/quant_matvec.hpp
// Products with quantized weights (quant::MatrixView [N, K], a Linear's [out, in]):
//
//   kernels::quant_matvec_rows(W, x, xq, bias, y, lo, hi);   // rows [lo, hi) of y = W x (+ b)
//   kernels::linear_quant(x, M, W, bias, y);                  // y [M, N] = x [M, K] W^T (+ b)
//
// int8 formats multiply x's rows quantized to q8_0 by groups of 16 weight rows
// (kernels/quant_dot.hpp's dot_group; many rows in kernels/quant_gemm.hpp's tiles): every
// output is the definition's dot product, so a row's result does not depend on how many rows
// came with it. nf4: up to 16 rows of x multiply each weight row from L1 (against f32); more
// go to the f32 GEMM, whose packing dequantizes the weight panels (dequantized values are
// exact in f32: the dequantized model's product bit for bit). Each output is one fixed sum
// whatever the threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/kernels/quant_gemm.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>

namespace edl::kernels {

namespace detail {

/// How far ahead of the row it multiplies a matrix-vector product asks for nf4's weights.
inline constexpr std::int64_t kRowPrefetchBytes = 4096;

/// Starts the bytes kRowPrefetchBytes past row r on their way to L2, a row's worth: decode is a
/// stream of rows, and one core's hardware prefetcher alone left the dots waiting on memory
/// (or on a large L3) about half the time.
inline void prefetch_rows_ahead(const quant::MatrixView& W, std::int64_t r) noexcept {
  prefetch_lines(W.row(r) + kRowPrefetchBytes, W.row_bytes());
}

/// The dot product of nf4 weight row r with one f32 activation row. The caller asks for the
/// rows ahead (prefetch_rows_ahead), once a row however many x it multiplies.
inline float nf4_row_dot(const quant::MatrixView& W, std::int64_t r, const float* x) noexcept {
  return dot_nf4(reinterpret_cast<const quant::BlockNF4*>(W.row(r)), W.row_absmax(r), x, W.blocks_per_row());
}

/// Whether the format multiplies q8_0 activations (else f32).
constexpr bool uses_int8_activations(quant::Format f) noexcept { return f == quant::Format::q8_0 || f == quant::Format::q4_0; }

/// A thread's buffer of n T (activation blocks), kept from call to call.
template <class T>
T* thread_buffer(std::int64_t n) {
  static thread_local aligned_vector<T> buf;
  if (static_cast<std::int64_t>(buf.size()) < n) buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

}  // namespace detail

/// y[j] = W[j, :] . x (+ bias[j]) for rows j in [lo, hi). xq holds x quantized
/// (quantize_activations into ActivationBlocks) when W's format multiplies int8 activations, else it is unused.
/// int8 formats compute whole groups of 16 rows: ranges that start and end on a group's edge
/// compute no row twice.
template <class TB>
void quant_matvec_rows(const quant::MatrixView& W, const float* x, const ActivationBlock* xq, const TB* bias, float* y,
                       std::int64_t lo, std::int64_t hi) {
  if (lo >= hi) return;
  if (quant::in_row_groups(W.format)) {
    alignas(64) float out[quant::kGroupRows];
    for (std::int64_t g = lo / quant::kGroupRows; g * quant::kGroupRows < hi; ++g) {
      dot_group<1>(W, g, xq, W.blocks_per_row(), out);
      const std::int64_t r0 = g * quant::kGroupRows;
      for (std::int64_t j = std::max(lo, r0); j < std::min(hi, r0 + quant::kGroupRows); ++j)
        y[j] = bias ? out[j - r0] + to_f32(bias[j]) : out[j - r0];
    }
    return;
  }
  for (std::int64_t j = lo; j < hi; ++j) {
    detail::prefetch_rows_ahead(W, j);
    const float s = detail::nf4_row_dot(W, j, x);
    y[j] = bias ? s + to_f32(bias[j]) : s;
  }
}

/// Multiplies x [M, K] by W^T through the f32 GEMM, dequantizing W's panels as they are packed.
inline void matmul_nt_dequantized(const float* x, std::int64_t M, const quant::MatrixView& W, float* y, bool accumulate = false) {
  ::edl::detail::gemm::gemm_blocked(false, true, M, W.rows, W.cols, 1.f, x, W.cols, &W, W.cols, accumulate ? 1.f : 0.f, y, W.rows);
}

/// dx [M, K] (+)= dy [M, N] W: the input gradient of a frozen quantized Linear.
inline void matmul_dequantized(const float* dy, std::int64_t M, const quant::MatrixView& W, float* dx, bool accumulate = false) {
  ::edl::detail::gemm::gemm_blocked(false, false, M, W.cols, W.rows, 1.f, dy, W.rows, &W, W.cols, accumulate ? 1.f : 0.f, dx, W.cols);
}

/// y [M, N] = the products of one set of rows x [M, K] with several quantized matrices (each
/// part's W [N_i, K], bias, y [M, N_i]): the rows are prepared once for the int8 formats.
template <class TB>
void linear_quant(const float* x, std::int64_t M, std::int64_t K, std::span<const QuantGemmPart<TB>> parts) {
  // int8 formats: groups of weight rows by tiles of activation rows, x's rows quantized once
  // for all those parts, in the call's own buffer, not its thread's: while it waits for the
  // tasks its thread may run another product's (a simulated mesh runs devices as tasks).
  std::vector<QuantGemmPart<TB>> int8;
  for (const QuantGemmPart<TB>& p : parts) {
    if (detail::uses_int8_activations(p.W.format)) {
      int8.push_back(p);
      continue;
    }
    if (M > 16) {  // nf4: the dequantized GEMM
      matmul_nt_dequantized(x, M, p.W, p.y);
      if (p.bias) add_bias_rows(p.y, M, p.W.rows, p.bias);
      continue;
    }
    // Fewer rows than a tile's worth: row dots, which read the nf4 rows unpacked.
    const std::int64_t N = p.W.rows;
    const std::int64_t grain = std::max<std::int64_t>(8, 16384 / std::max<std::int64_t>(1, K));
    exec::parallel_for(0, N, grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = lo; j < hi; ++j) {
        detail::prefetch_rows_ahead(p.W, j);
        for (std::int64_t m = 0; m < M; ++m) {
          const float s = detail::nf4_row_dot(p.W, j, x + m * K);
          p.y[m * N + j] = p.bias ? s + to_f32(p.bias[j]) : s;
        }
      }
    });
  }
  if (!int8.empty()) quant_gemm_nt<TB>(Int8Rows(x, M, K), std::span<const QuantGemmPart<TB>>(int8));
}

/// y [M, N] = x [M, K] W^T (+ bias), W quantized [N, K].
template <class TB>
void linear_quant(const float* x, std::int64_t M, const quant::MatrixView& W, const TB* bias, float* y) {
  const QuantGemmPart<TB> part{W, bias, y};
  linear_quant<TB>(x, M, W.cols, std::span<const QuantGemmPart<TB>>(&part, 1));
}

}  // namespace edl::kernels
