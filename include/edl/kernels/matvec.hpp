// edl/kernels/matvec.hpp
// Matrix-vector products for decode: y = W x (+ b) with W [N, K] stored row-major (a Linear's
// weight), for one row of x or a few (a decode step of a batch). Decode reads every weight
// once per token, so these kernels are built around the memory read: weight rows stream in
// lockstep blocks (matvec_rows), several products of one x share one parallel region
// (matvec_group), and small batches apply each weight row to all rows from L1 (linear_nt).
// More rows go to the GEMM (kernels::matmul_nt).
//
//   kernels::linear_nt(x, M, W, bias, y, N, K);          // y [M, N] = x [M, K] W^T (+ bias)
//   kernels::matvec_group<T, 3>(x, {{Wq, bq, q, Nq}, {Wk, bk, k, Nk}, {Wv, bv, v, Nv}}, K);
//
// Every output is one fixed-order sum whatever the thread count or how rows are split.
// T is float or bf16 (widened to f32 as it is read); sums are f32. A part may instead hold
// a quantized matrix (MatvecPart::q), multiplied by kernels/quant_matvec.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/quant_matvec.hpp>
#include <edl/quant/matrix.hpp>

namespace edl::kernels {

namespace detail {

/// Up to this many rows, linear_nt reads each weight row once and applies it to the rows from
/// L1: decode steps of a batch are memory bound, and the GEMM would pack the whole matrix.
inline constexpr std::int64_t kMatvecRows = 16;

/// From this many rows up to kMatvecRows, four weight rows go at once (dot_rows4): the step is
/// then bound by the loads feeding the FMAs, not by memory.
inline constexpr std::int64_t kMatvecRowsBlocked = 8;
/// ... for rows of at least this many elements (shorter rows gained nothing).
inline constexpr std::int64_t kMatvecBlockedMinK = 512;

/// y[m * ldy] = x[m, :] . w (+ *bias) for MB (1-4) rows of x: MB is a compile-time constant so
/// the accumulators stay in registers (unrolled: at -O2 GCC otherwise keeps acc in memory and
/// every FMA waits for a store to forward, 3-4x slower).
template <int MB, class T>
inline void dot_rows(const float* x, const T* w, const T* bias, float* y, std::int64_t ldy, std::int64_t K) {
  using detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  fbatch acc[MB][2];
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = fbatch(0.f);
  std::int64_t k = 0;
  for (; k + 2 * Wd <= K; k += 2 * Wd) {
    const fbatch w0 = detail::load(w + k), w1 = detail::load(w + k + Wd);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      acc[m][0] = detail::fmadd(fbatch::load_unaligned(x + m * K + k), w0, acc[m][0]);
      acc[m][1] = detail::fmadd(fbatch::load_unaligned(x + m * K + k + Wd), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    float s = xsimd::hadd(acc[m][0] + acc[m][1]);
    for (std::int64_t kk = k; kk < K; ++kk) s = std::fma(x[m * K + kk], to_f32(w[kk]), s);
    y[m * ldy] = bias ? s + to_f32(*bias) : s;
  }
}

/// dot_rows for four weight rows at once: y[m * ldy + c] = x[m, :] . w[c * K + :] (+ bias[c])
/// for c < 4 and MB (1 or 2) rows of x. Each sum: two accumulators over alternate lane
/// batches, added, reduced in hsum8's fixed tree, then the tail; the same for every (m, c),
/// whatever MB. Sixteen accumulators take 12 loads per 16 FMAs where dot_rows<4> takes 10 per
/// 8: a decode step of many sequences (the serving engine's) is bound by those loads.
template <int MB, class T>
inline void dot_rows4(const float* x, const T* w, const T* bias, float* y, std::int64_t ldy, std::int64_t K) {
  using detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  fbatch acc[MB][4][2];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[m][c][0] = acc[m][c][1] = fbatch(0.f);
  std::int64_t k = 0;
  for (; k + 2 * Wd <= K; k += 2 * Wd) {
    fbatch w0[4], w1[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      w0[c] = detail::load(w + c * K + k);
      w1[c] = detail::load(w + c * K + k + Wd);
    }
#pragma GCC unroll 2
    for (int m = 0; m < MB; ++m) {
      const fbatch x0 = fbatch::load_unaligned(x + m * K + k), x1 = fbatch::load_unaligned(x + m * K + k + Wd);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        acc[m][c][0] = detail::fmadd(x0, w0[c], acc[m][c][0]);
        acc[m][c][1] = detail::fmadd(x1, w1[c], acc[m][c][1]);
      }
    }
  }
  fbatch t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) t[i] = i < 4 * MB ? acc[i / 4][i % 4][0] + acc[i / 4][i % 4][1] : fbatch(0.f);
  float sums[8];
  detail::hsum8(t, sums);
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < 4; ++c) {
      float s = sums[m * 4 + c];
      for (std::int64_t kk = k; kk < K; ++kk) s = std::fma(x[m * K + kk], to_f32(w[c * K + kk]), s);
      y[m * ldy + c] = bias ? s + to_f32(bias[c]) : s;
    }
}

/// Weight streams matvec_rows reads in lockstep, whatever the vector width (sixteen on
/// AVX-512 were slower: docs/notes/2026-11-benchmark-log.md).
inline constexpr std::int64_t kStreams = 8;

/// Bytes of consecutive weight rows one stream reads before the block of streams moves on.
inline constexpr std::int64_t kStreamBytes = 131072;

/// How far ahead of its loads each stream prefetches (into L2).
inline constexpr std::int64_t kPrefetchBytes = 1024;

/// The sum of `blocks` consecutive blocks of kStreams streams of `len` floats (len a multiple
/// of two lane batches) read in lockstep: matvec_rows' read order without the multiplies, the
/// read the kernel is measured against (`edl bench decode --bandwidth`, bench_kernels). It
/// lives beside the kernel so that both change together.
inline float lockstep_read_sum(const float* x, std::size_t blocks, std::size_t len) noexcept {
  using B = xsimd::batch<float>;
  constexpr std::size_t W = B::size, S = static_cast<std::size_t>(kStreams);
  static_assert(S % 2 == 0);
  B a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  for (std::size_t blk = 0; blk < blocks; ++blk, x += S * len)
    for (std::size_t i = 0; i < len; i += 2 * W)
      for (std::size_t st = 0; st < S; st += 2) {
        for (std::size_t u = 0; u < 2; ++u)  // the kernel prefetches once per load of a lane batch
          for (std::size_t v = 0; v < 2 * W; v += W)
            __builtin_prefetch(reinterpret_cast<const char*>(x + (st + u) * len + i + v) + kPrefetchBytes, 0, 2);
        a0 += B::load_unaligned(x + st * len + i);
        a1 += B::load_unaligned(x + st * len + i + W);
        a2 += B::load_unaligned(x + (st + 1) * len + i);
        a3 += B::load_unaligned(x + (st + 1) * len + i + W);
      }
  return xsimd::hadd((a0 + a1) + (a2 + a3));
}

/// y[j] = x . W[j, :] (+ bias[j]) for weight rows j in [lo, hi). The rows go in blocks of
/// kStreams streams of R consecutive rows (R rows about kStreamBytes, fewer in the last blocks
/// when fewer rows remain): at step r stream s computes row lo + s * R + r, so the streams
/// advance together through memory, each prefetching kPrefetchBytes ahead (into its next row at
/// a row's end). The last fewer than kStreams rows go in one group. Every row's sum has the
/// same order whatever block, chunk or stream it falls in (one accumulator over K in steps of
/// Wd, its lanes reduced in hsum8's fixed tree, then the tail), so the result does not depend
/// on how the rows were split between threads.
template <class T>
inline void matvec_rows(const float* x, const T* W, const T* bias, float* y, std::int64_t K, std::int64_t lo,
                        std::int64_t hi) {
  using detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size), S = kStreams;
  static_assert(S == 8, "detail::hsum8 reduces the streams' eight accumulators");
  const std::int64_t row_bytes = K * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t R = std::max<std::int64_t>(1, (kStreamBytes + row_bytes / 2) / row_bytes);
  const std::int64_t K0 = K / Wd * Wd;
  // sums[q] = x . row (first + q * stride) over [0, K0) for q < n <= S, one accumulator per row
  // reduced in registers (hsum8; unused accumulators stay zero and their sums are dropped).
  const auto rows_at = [&](std::int64_t first, std::int64_t stride, std::int64_t n, float* sums) {
    fbatch a[S];
    for (std::int64_t q = 0; q < S; ++q) a[q] = fbatch(0.f);
    const T* w0 = W + first * K;
    const std::int64_t ws = stride * K;
    if (n == S) {
      for (std::int64_t k = 0; k < K0; k += Wd) {
        const fbatch xv = fbatch::load_unaligned(x + k);
#pragma GCC unroll 8
        for (std::int64_t q = 0; q < S; ++q) {
          // A prefetch past the matrix's end is harmless: prefetches do not fault.
          __builtin_prefetch(reinterpret_cast<const char*>(w0 + q * ws + k) + kPrefetchBytes, 0, 2);
          a[q] = detail::fmadd(xv, detail::load(w0 + q * ws + k), a[q]);
        }
      }
    } else {
      for (std::int64_t k = 0; k < K0; k += Wd) {
        const fbatch xv = fbatch::load_unaligned(x + k);
        for (std::int64_t q = 0; q < n; ++q) a[q] = detail::fmadd(xv, detail::load(w0 + q * ws + k), a[q]);
      }
    }
    detail::hsum8(a, sums);
  };
  // y[j] from row j's sum over [0, K0): the tail, then the bias.
  const auto finish = [&](std::int64_t j, float v) {
    const T* wr = W + j * K;
    for (std::int64_t k = K0; k < K; ++k) v = std::fma(x[k], to_f32(wr[k]), v);
    y[j] = bias ? v + to_f32(bias[j]) : v;
  };
  // A block's sums go to `stage` in the order they are made (one vector store a step) and
  // reach y a chunk at a time from L1, instead of eight scalar stores to far-apart lines.
  constexpr std::int64_t kChunk = 128;
  alignas(64) float stage[kChunk * S];
  while (hi - lo >= S) {
    const std::int64_t r_len = std::min(R, (hi - lo) / S);
    for (std::int64_t r0 = 0; r0 < r_len; r0 += kChunk) {
      const std::int64_t r1 = std::min(r_len, r0 + kChunk);
      for (std::int64_t r = r0; r < r1; ++r) rows_at(lo + r, r_len, S, stage + (r - r0) * S);
      for (std::int64_t q = 0; q < S; ++q)
        for (std::int64_t r = r0; r < r1; ++r) finish(lo + q * r_len + r, stage[(r - r0) * S + q]);
    }
    lo += S * r_len;
  }
  if (lo < hi) {
    alignas(64) float sums[S];
    rows_at(lo, 1, hi - lo, sums);
    for (std::int64_t q = 0; q < hi - lo; ++q) finish(lo + q, sums[q]);
  }
}

}  // namespace detail

/// Rows of weight matrix j a parallel chunk of a matrix-vector product takes: enough for the
/// fork/join to pay (16 K floats), at least 8.
inline std::int64_t matvec_grain(std::int64_t K) { return std::max<std::int64_t>(8, 16384 / std::max<std::int64_t>(1, K)); }

/// One matrix of a grouped matrix-vector product: y = W x (+ bias), W [N, K] dense, or
/// quantized in q when q.format is not none (W is then unused).
/// A LoRA adapter on a product (nn::LowRankAdapter's values): y += scale * B (A x), with
/// A [r, K] and B [N, r] in the weight's dtype. Empty when A is null.
template <class T>
struct LowRankPart {
  const T* A = nullptr;
  const T* B = nullptr;
  std::int64_t r = 0;
  float scale = 0.0f;
  explicit operator bool() const noexcept { return A != nullptr; }
};

template <class T>
struct MatvecPart {
  const T* W;
  const T* bias;
  float* y;
  std::int64_t N;
  quant::MatrixView q{};
  LowRankPart<T> lora{};

  bool quantized() const noexcept { return q.format != quant::Format::none; }
};

namespace detail {
/// Adds an adapter's term to outputs [lo, hi) of rows [0, M): y[m, j] += sum_k B[j, k] u_m[k]
/// with u_m = scale * (A x_m). Every path (a decode task's range, a batch of rows) computes
/// u_m and each sum in the same order, so the one-row and many-row forwards agree bit for bit.
template <class T>
void low_rank_add(const float* x, std::int64_t M, std::int64_t K, const LowRankPart<T>& a, float* y, std::int64_t N,
                  std::int64_t lo, std::int64_t hi) {
  thread_local std::vector<float> u;  // a decode step runs this per part and task: no allocation per token
  u.resize(static_cast<std::size_t>(a.r));
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t k = 0; k < a.r; ++k)
      u[static_cast<std::size_t>(k)] = a.scale * ::edl::detail::gemm::dot_f32(x + m * K, a.A + k * K, K);
    for (std::int64_t j = lo; j < hi; ++j) {
      const T* b = a.B + j * a.r;
      float s = 0.0f;
      for (std::int64_t k = 0; k < a.r; ++k) s += to_f32(b[k]) * u[static_cast<std::size_t>(k)];
      y[m * N + j] += s;
    }
  }
}
}  // namespace detail

/// Tasks a grouped matrix-vector product of `rows` rows in all takes on `threads` threads: one
/// per thread, fewer when a task would get less than matvec_grain(K) rows.
inline std::int64_t matvec_tasks(std::int64_t rows, std::int64_t K, std::int64_t threads) {
  return std::max<std::int64_t>(1, std::min<std::int64_t>(threads, rows / matvec_grain(K)));
}

/// Task t of `tasks` of a grouped product: the t-th of `tasks` equal ranges of each matrix's rows.
/// A task runs serially, so its thread's buffer of quantized activations is not shared.
template <class T, std::size_t P>
void matvec_group_task(const float* x, const std::array<MatvecPart<T>, P>& parts, std::int64_t K, std::int64_t t,
                       std::int64_t tasks) {
  const ActivationBlock* xq = nullptr;
  for (const MatvecPart<T>& p : parts) {
    std::int64_t lo = p.N * t / tasks, hi = p.N * (t + 1) / tasks;
    if (p.quantized() && quant::in_row_groups(p.q.format)) {  // whole groups of rows to a task
      const auto edge = [&](std::int64_t j) { return j == p.N ? j : j / quant::kGroupRows * quant::kGroupRows; };
      lo = edge(lo);
      hi = edge(hi);
    }
    if (!p.quantized()) {
      detail::matvec_rows(x, p.W, p.bias, p.y, K, lo, hi);
      if (p.lora) detail::low_rank_add(x, 1, K, p.lora, p.y, p.N, lo, hi);
      continue;
    }
    if (!xq && detail::uses_int8_activations(p.q.format)) {
      ActivationBlock* buf = detail::thread_buffer<ActivationBlock>(K / 32);
      quantize_activations(x, buf, K);
      xq = buf;
    }
    quant_matvec_rows(p.q, x, xq, p.bias, p.y, lo, hi);
    if (p.lora) detail::low_rank_add(x, 1, K, p.lora, p.y, p.N, lo, hi);
  }
}

/// Several matrix-vector products of one x (q, k and v; gate and up) in one parallel region:
/// one fork/join instead of one per matrix. With T threads each matrix is cut into T equal
/// ranges of rows, one per task. Each y[j] is the sum matvec_rows computes alone, bit for bit.
template <class T, std::size_t P>
void matvec_group(const float* x, const std::array<MatvecPart<T>, P>& parts, std::int64_t K) {
  std::int64_t total = 0;
  for (const MatvecPart<T>& p : parts) total += p.N;
  const std::int64_t tasks = matvec_tasks(total, K, exec::num_threads());
  if (tasks <= 1) {
    exec::detail::ensure_flush_denormals();  // as exec::parallel_for would on this thread
    return matvec_group_task(x, parts, K, 0, 1);
  }
  exec::parallel_parts(tasks, [&](std::ptrdiff_t t) { matvec_group_task(x, parts, K, t, tasks); });
}

/// y[m, j] = x[m, :] . W[j, :] (+ bias[j]) for M rows; small M goes row-of-W-major so each
/// weight row is read from memory once per call.
template <class T>
void linear_nt(const float* x, std::int64_t M, const T* W, const T* bias, float* y, std::int64_t N, std::int64_t K) {
  if (M == 1) return matvec_group<T, 1>(x, {MatvecPart<T>{W, bias, y, N}}, K);
  // Weight row j applied to the M rows of x, 4 at a time (the accumulators fit the registers;
  // the weight row is in L1 after the first block). Every row's sum has the same order whatever M.
  const auto one_weight_row = [&](std::int64_t j) {
    const T* w = W + j * K;
    const T* bj = bias ? bias + j : nullptr;
    for (std::int64_t m0 = 0; m0 < M; m0 += 4) {
      const float* xb = x + m0 * K;
      float* yb = y + m0 * N + j;
      switch (std::min<std::int64_t>(4, M - m0)) {
        case 4: detail::dot_rows<4>(xb, w, bj, yb, N, K); break;
        case 3: detail::dot_rows<3>(xb, w, bj, yb, N, K); break;
        case 2: detail::dot_rows<2>(xb, w, bj, yb, N, K); break;
        default: detail::dot_rows<1>(xb, w, bj, yb, N, K); break;
      }
    }
  };
  if (M >= detail::kMatvecRowsBlocked && M <= detail::kMatvecRows && K >= detail::kMatvecBlockedMinK) {
    // Blocks of four weight rows (the x rows two at a time); the last N % 4 rows alone. Every
    // row falls in the same kind of block whatever the thread count.
    exec::parallel_for(0, N / 4, std::max<std::int64_t>(1, matvec_grain(K) / 4), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = 4 * lo; j < 4 * hi; j += 4) {
        const T* w = W + j * K;
        const T* bj = bias ? bias + j : nullptr;
        std::int64_t m0 = 0;
        for (; m0 + 2 <= M; m0 += 2) detail::dot_rows4<2>(x + m0 * K, w, bj, y + m0 * N + j, N, K);
        if (m0 < M) detail::dot_rows4<1>(x + m0 * K, w, bj, y + m0 * N + j, N, K);
      }
    });
    for (std::int64_t j = N / 4 * 4; j < N; ++j) one_weight_row(j);
    return;
  }
  if (M <= detail::kMatvecRows) {
    exec::parallel_for(0, N, matvec_grain(K), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = lo; j < hi; ++j) one_weight_row(j);
    });
    return;
  }
  matmul_nt(x, W, y, M, N, K);
  if (bias) add_bias_rows(y, M, N, bias);
}

/// y += the part's low-rank (LoRA) product of x's M rows, when it has one.
template <class T>
void lora_add(const float* x, std::int64_t M, const MatvecPart<T>& p, std::int64_t K) {
  if (p.lora)
    exec::parallel_for(0, M, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      detail::low_rank_add(x + lo * K, hi - lo, K, p.lora, p.y + lo * p.N, p.N, 0, p.N);
    });
}

template <class T>
void linear_part(const float* x, std::int64_t M, const MatvecPart<T>& p, std::int64_t K) {
  if (p.quantized()) linear_quant(x, M, p.q, p.bias, p.y);
  else linear_nt(x, M, p.W, p.bias, p.y, p.N, K);
  lora_add(x, M, p, K);
}

/// Several products of one x, y_i = x W_i^T (+ b_i), for M rows: one parallel region for
/// all of them when M is 1 (decode; matvec_group) or their weights are all quantized
/// (linear_quant's groups), else linear_part for each.
template <class T, std::size_t P>
void linear_group(const float* x, std::int64_t M, const std::array<MatvecPart<T>, P>& parts, std::int64_t K) {
  if (M == 1) return matvec_group<T, P>(x, parts, K);
  bool quantized = true;
  for (const MatvecPart<T>& p : parts) quantized = quantized && p.quantized();
  if (!quantized) {
    for (const MatvecPart<T>& p : parts) linear_part(x, M, p, K);
    return;
  }
  // Quantized weights: x's rows are prepared once for all the parts, and one parallel region
  // runs their products (each output the sum linear_part computes, bit for bit).
  std::array<QuantGemmPart<T>, P> q;
  for (std::size_t i = 0; i < P; ++i) q[i] = {parts[i].q, parts[i].bias, parts[i].y};
  linear_quant<T>(x, M, K, std::span<const QuantGemmPart<T>>(q));
  for (const MatvecPart<T>& p : parts) lora_add(x, M, p, K);
}

}  // namespace edl::kernels
