// edl/kernels/quant_matvec.hpp
// Products with quantized weights (quant::MatrixView [N, K], a Linear's [out, in]):
//
//   kernels::quant_matvec_rows(W, x, xq, bias, y, lo, hi);   // rows [lo, hi) of y = W x (+ b)
//   kernels::linear_quant(x, M, W, bias, y);                  // y [M, N] = x [M, K] W^T (+ b)
//
// Decode (up to 16 rows of x) reads each weight row once and multiplies it by every row from
// L1: int8 formats against the rows quantized to q8_0 (kernels/quant_dot.hpp), nf4 against
// f32. More rows (prefill): int8 formats go to kernels/quant_gemm.hpp, whose outputs are the
// same dot products bit for bit, so a row's result does not depend on how many rows came
// with it; nf4 goes to the f32 GEMM, whose packing dequantizes the weight panels (dequantized
// values are exact in f32: the dequantized model's product bit for bit). Each output is one
// fixed sum whatever the threads.
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

/// How far ahead of the row it multiplies a matrix-vector product asks for the weights.
inline constexpr std::int64_t kRowPrefetchBytes = 4096;

/// Asks for the 64-byte lines of [p, p + bytes) into L2. On x86 an asm statement: GCC 12 drops
/// __builtin_prefetch from a function that does nothing else once it inlines it (the function
/// looks free of effects, so its calls go).
inline void prefetch_lines(const std::uint8_t* p, std::int64_t bytes) noexcept {
  for (std::int64_t c = 0; c < bytes; c += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht1 %0" : : "m"(p[c]));
#else
    __builtin_prefetch(p + c, 0, 2);
#endif
  }
}

/// Starts the bytes kRowPrefetchBytes past row r on their way to L2, a row's worth: decode is a
/// stream of rows, and one core's hardware prefetcher alone left the dots waiting on memory
/// (or on a large L3) about half the time.
inline void prefetch_rows_ahead(const quant::MatrixView& W, std::int64_t r) noexcept {
  prefetch_lines(W.row(r) + kRowPrefetchBytes, W.row_bytes());
}

/// The dot product of weight row r with one activation row (xq: its q8_0 blocks, x: f32). The
/// caller asks for the rows ahead (prefetch_rows_ahead), once a row however many x it multiplies.
inline float quant_row_dot(const quant::MatrixView& W, std::int64_t r, const float* x, const ActivationBlock* xq) noexcept {
  if (W.format == quant::Format::nf4)
    return dot_nf4(reinterpret_cast<const quant::BlockNF4*>(W.row(r)), W.row_absmax(r), x, W.blocks_per_row());
  return int8_row_dot(W, r, xq);
}

/// Whether the format multiplies q8_0 activations (else f32).
constexpr bool uses_int8_activations(quant::Format f) noexcept { return f == quant::Format::q8_0 || f == quant::Format::q4_0; }

/// A thread's buffer of n T (activation blocks, their pairs), kept from call to call.
template <class T>
T* thread_buffer(std::int64_t n) {
  static thread_local aligned_vector<T> buf;
  if (static_cast<std::int64_t>(buf.size()) < n) buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

}  // namespace detail

/// y[j] = W[j, :] . x (+ bias[j]) for rows j in [lo, hi). xq holds x quantized
/// (quantize_activations into ActivationBlocks) when W's format multiplies int8 activations, else it is unused.
template <class TB>
void quant_matvec_rows(const quant::MatrixView& W, const float* x, const ActivationBlock* xq, const TB* bias, float* y,
                       std::int64_t lo, std::int64_t hi) {
  // One row at a time: memory reads a single stream of rows faster than several rows side by
  // side (which would share each activation block's loads, the better choice only in cache).
#if defined(EDL_QUANT_ZMM)
  const std::int64_t nb = W.blocks_per_row();
  ActivationPair* pairs = nullptr;  // q4_0: x's blocks paired once for all the rows
  if (W.format == quant::Format::q4_0) {
    pairs = detail::thread_buffer<ActivationPair>((nb + 1) / 2);
    pair_activations(xq, nb, pairs);
  }
#endif
  for (std::int64_t j = lo; j < hi; ++j) {
    detail::prefetch_rows_ahead(W, j);
#if defined(EDL_QUANT_ZMM)
    const float s = pairs ? dot_q4_0(reinterpret_cast<const quant::BlockQ4_0*>(W.row(j)), pairs, nb)
                          : detail::quant_row_dot(W, j, x, xq);
#else
    const float s = detail::quant_row_dot(W, j, x, xq);
#endif
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
  const std::int64_t nb = K / 32;
  if (M > 16) {
    // int8 formats: int8 tiles, x's rows quantized and packed once for all those parts, in the
    // call's own buffer, not its thread's: while it waits for the tasks its thread may run
    // another product's (a simulated mesh runs devices as tasks). nf4: the dequantized GEMM.
    std::vector<QuantGemmPart<TB>> int8;
    for (const QuantGemmPart<TB>& p : parts) {
      if (detail::uses_int8_activations(p.W.format)) {
        int8.push_back(p);
        continue;
      }
      matmul_nt_dequantized(x, M, p.W, p.y);
      if (p.bias) add_bias_rows(p.y, M, p.W.rows, p.bias);
    }
    if (!int8.empty()) quant_gemm_nt<TB>(Int8Rows(x, M, K), std::span<const QuantGemmPart<TB>>(int8));
    return;
  }
  // Fewer rows than a tile's worth: row dots, which read the quantized rows unpacked (quantized
  // once for all the int8 parts).
  std::vector<ActivationBlock> xq_buf;
  if (std::any_of(parts.begin(), parts.end(),
                  [](const QuantGemmPart<TB>& p) { return detail::uses_int8_activations(p.W.format); })) {
    xq_buf.resize(static_cast<std::size_t>(M * nb));
    quantize_activation_rows(x, M, K, xq_buf.data());
  }
  for (const QuantGemmPart<TB>& p : parts) {
    const std::int64_t N = p.W.rows;
    const ActivationBlock* xq = detail::uses_int8_activations(p.W.format) ? xq_buf.data() : nullptr;
    const std::int64_t grain = std::max<std::int64_t>(8, 16384 / std::max<std::int64_t>(1, K));
    exec::parallel_for(0, N, grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = lo; j < hi; ++j) {
        detail::prefetch_rows_ahead(p.W, j);
        for (std::int64_t m = 0; m < M; ++m) {
          const float s = detail::quant_row_dot(p.W, j, x + m * K, xq ? xq + m * nb : nullptr);
          p.y[m * N + j] = p.bias ? s + to_f32(p.bias[j]) : s;
        }
      }
    });
  }
}

/// y [M, N] = x [M, K] W^T (+ bias), W quantized [N, K].
template <class TB>
void linear_quant(const float* x, std::int64_t M, const quant::MatrixView& W, const TB* bias, float* y) {
  const QuantGemmPart<TB> part{W, bias, y};
  linear_quant<TB>(x, M, W.cols, std::span<const QuantGemmPart<TB>>(&part, 1));
}

}  // namespace edl::kernels
