// edl/kernels/gemm.hpp
// General matrix multiply, row-major:  C = alpha * op(A) * op(B) + beta * C
// with op(X) = X or X^T, A and B in f32, bf16 or f16 (widened to f32 while packing), f32
// accumulation and f32 output. Design notes and measurements: docs/gemm.md.
//
//   gemm(Trans::no, Trans::yes, M, N, K, 1.f, x, K, w, K, 0.f, y, N);   // y = x W^T
//   matmul(A, B, C, M, N, K);          // C = A B        A [M,K], B [K,N]
//   matmul_nt(A, B, C, M, N, K);       // C = A B^T      B stored [N,K] (Linear layer)
//   matmul_tn(A, B, C, M, N, K);       // C = A^T B      A stored [K,M] (weight gradients)
//
// The result is bit-for-bit the same whatever the number of threads: each element of C is
// computed by one thread, over K in a fixed order (K blocks depend only on K), with the
// same instructions whatever tile it lies in.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/gemm_microkernel.hpp>
#include <edl/kernels/detail/gemm_pack.hpp>

namespace edl {

/// Whether gemm uses an operand as stored or transposed.
enum class Trans { no, yes };

namespace detail::gemm {

/// Cache blocking (upper bounds; the driver splits each dimension into equal blocks).
/// kc changes the order of floating-point sums, so it must not depend on the thread count.
struct Blocking {
  std::int64_t kc = 384;   // depth of packed panels: Bp micro-panel kc*NR*4 bytes (24 KiB) stays in L1
  std::int64_t mc = 144;   // rows of the packed A block (mc*kc*4 bytes in L2)
  std::int64_t nc = 4080;  // columns of the packed B block (all of K: K*nc*4 bytes in L3) ...
  std::int64_t b_bytes = 12 << 20;  // ... capped so the packed B block stays within this budget
  std::int64_t chunk_panels = 16;   // NR-column panels per tile (a tile's C stays in L2/L3)
};
/// Process-wide blocking parameters (for tuning experiments; not thread-safe to change
/// while a gemm runs).
inline Blocking& blocking() {
  static Blocking b;
  return b;
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

template <class TA, class TB>
inline void check_args(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, const TA* A,
                       std::int64_t lda, const TB* B, std::int64_t ldb, const float* C, std::int64_t ldc) {
  const char* w = "gemm";
  EDL_CHECK(M >= 0, errc::invalid_argument, w, "M must be >= 0, found M = ", M);
  EDL_CHECK(N >= 0, errc::invalid_argument, w, "N must be >= 0, found N = ", N);
  EDL_CHECK(K >= 0, errc::invalid_argument, w, "K must be >= 0, found K = ", K);
  const bool at = ta == Trans::yes, bt = tb == Trans::yes;
  const std::int64_t min_lda = std::max<std::int64_t>(1, at ? M : K);
  const std::int64_t min_ldb = std::max<std::int64_t>(1, bt ? K : N);
  const std::int64_t min_ldc = std::max<std::int64_t>(1, N);
  EDL_CHECK(lda >= min_lda, errc::shape_mismatch, w, "lda must be >= ", min_lda, " (A stored ",
            at ? "[K, M]" : "[M, K]", " with M = ", M, ", K = ", K, "), found lda = ", lda);
  EDL_CHECK(ldb >= min_ldb, errc::shape_mismatch, w, "ldb must be >= ", min_ldb, " (B stored ",
            bt ? "[N, K]" : "[K, N]", " with K = ", K, ", N = ", N, "), found ldb = ", ldb);
  EDL_CHECK(ldc >= min_ldc, errc::shape_mismatch, w, "ldc must be >= ", min_ldc, " (C is [M, N] with N = ", N,
            "), found ldc = ", ldc);
  EDL_CHECK(A != nullptr || M == 0 || K == 0, errc::invalid_argument, w, "A must not be null for M = ", M,
            ", K = ", K);
  EDL_CHECK(B != nullptr || N == 0 || K == 0, errc::invalid_argument, w, "B must not be null for K = ", K,
            ", N = ", N);
  EDL_CHECK(C != nullptr || M == 0 || N == 0, errc::invalid_argument, w, "C must not be null for M = ", M,
            ", N = ", N);
}

/// C = beta * C (beta == 0 writes zeros without reading C).
inline void scale_c(std::int64_t M, std::int64_t N, float beta, float* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (beta == 0.f) std::fill(c, c + N, 0.f);
    else if (beta != 1.f)
      for (std::int64_t j = 0; j < N; ++j) c[j] *= beta;
  }
}

inline float finish(float s, float alpha, float beta, const float* out) {
  return beta == 0.f ? alpha * s : std::fma(alpha, s, beta * *out);
}

/// Loads one f32 batch from n >= simd_width elements of T at p (widening bf16 / f16).
template <class T>
inline fbatch load_f32(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return fbatch::load_unaligned(p);
  } else {
    alignas(64) float tmp[simd_width];
    widen(p, tmp, simd_width);
    return fbatch::load_aligned(tmp);
  }
}

/// Matrix-vector, "axpy" form: out[j*os] = alpha * sum_k x[k] * Mat[k*ldm + j] (+ beta*out),
/// j in [0, n). Columns are processed in chunks of GW; each chunk sums over k in order.
template <class T>
void gemv_axpy(std::int64_t n, std::int64_t K, const float* x, const T* Mat, std::int64_t ldm, float* out,
               std::int64_t os, float alpha, float beta) {
  constexpr int NV = 8;
  constexpr std::int64_t GW = NV * simd_width;
  const std::int64_t chunks = ceil_div(n, GW);
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, K * GW));
  exec::parallel_for(0, chunks, grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::int64_t ch = lo; ch < hi; ++ch) {
      const std::int64_t j0 = ch * GW;
      const std::int64_t w = std::min(GW, n - j0);
      alignas(64) float res[GW];
      if (w == GW) {
        fbatch acc[NV];
        for (int v = 0; v < NV; ++v) acc[v] = fbatch(0.f);
        for (std::int64_t k = 0; k < K; ++k) {
          const fbatch xv(x[k]);
          const T* row = Mat + k * ldm + j0;
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) acc[v] = kernels::detail::fmadd(xv, load_f32(row + v * simd_width), acc[v]);
        }
        for (int v = 0; v < NV; ++v) acc[v].store_aligned(res + v * simd_width);
      } else {
        for (std::int64_t j = 0; j < w; ++j) res[j] = 0.f;
        for (std::int64_t k = 0; k < K; ++k) {
          const T* row = Mat + k * ldm + j0;
          for (std::int64_t j = 0; j < w; ++j) res[j] = std::fma(x[k], to_f32(row[j]), res[j]);
        }
      }
      for (std::int64_t j = 0; j < w; ++j) {
        float* o = out + (j0 + j) * os;
        *o = finish(res[j], alpha, beta, o);
      }
    }
  });
}

/// Dot of x (f32) with K elements of T, in a fixed order.
template <class T>
inline float dot_f32(const float* x, const T* y, std::int64_t K) {
  constexpr std::int64_t W = simd_width;
  fbatch a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  std::int64_t k = 0;
  for (; k + 4 * W <= K; k += 4 * W) {
    a0 = kernels::detail::fmadd(fbatch::load_unaligned(x + k), load_f32(y + k), a0);
    a1 = kernels::detail::fmadd(fbatch::load_unaligned(x + k + W), load_f32(y + k + W), a1);
    a2 = kernels::detail::fmadd(fbatch::load_unaligned(x + k + 2 * W), load_f32(y + k + 2 * W), a2);
    a3 = kernels::detail::fmadd(fbatch::load_unaligned(x + k + 3 * W), load_f32(y + k + 3 * W), a3);
  }
  for (; k + W <= K; k += W) a0 = kernels::detail::fmadd(fbatch::load_unaligned(x + k), load_f32(y + k), a0);
  float s = xsimd::hadd((a0 + a1) + (a2 + a3));
  for (; k < K; ++k) s = std::fma(x[k], to_f32(y[k]), s);
  return s;
}

/// Matrix-vector, "dot" form: out[j*os] = alpha * dot(x, Mat[j*ldm, :K]) (+ beta*out).
template <class T>
void gemv_dot(std::int64_t n, std::int64_t K, const float* x, const T* Mat, std::int64_t ldm, float* out,
              std::int64_t os, float alpha, float beta) {
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, K));
  exec::parallel_for(0, n, grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::int64_t j = lo; j < hi; ++j) {
      float* o = out + j * os;
      *o = finish(dot_f32(x, Mat + j * ldm, K), alpha, beta, o);
    }
  });
}

/// Widens a strided vector to contiguous f32.
template <class T>
std::vector<float> gather_f32(const T* p, std::int64_t n, std::int64_t stride) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = to_f32(p[i * stride]);
  return v;
}

/// The packing buffer for B belongs to the calling thread. A gemm nested inside another on
/// the same thread (possible when TBB lets a waiting thread run another task) gets its own.
struct OwnerBuffer {
  AlignedBuffer buf;
  bool busy = false;
};

template <Store S>
inline void macro_kernel(std::int64_t mc, std::int64_t kc, std::int64_t q0, std::int64_t q1, std::int64_t nc,
                         const float* Ap, const float* Bp, float* C, std::int64_t ldc, float alpha, float beta) {
  for (std::int64_t q = q0; q < q1; ++q) {
    const std::int64_t j = q * NR;
    const int nr = static_cast<int>(std::min<std::int64_t>(NR, nc - j));
    const float* bp = Bp + j * kc;
    for (std::int64_t p = 0; p < mc; p += MR) {
      const int mr = static_cast<int>(std::min<std::int64_t>(MR, mc - p));
      microkernel<S>(kc, Ap + p * kc, bp, C + p * ldc + j, ldc, mr, nr, alpha, beta);
    }
  }
}

/// Runs body(lo, hi) over [0, n): split across threads, or on the calling thread when serial.
template <class Body>
inline void for_range(bool serial, std::int64_t n, std::int64_t grain, Body&& body) {
  if (serial) body(std::ptrdiff_t{0}, static_cast<std::ptrdiff_t>(n));
  else exec::parallel_for(0, n, grain, body);
}

/// serial: everything on the calling thread (same tiles, same K blocks, so the same bits as
/// the parallel run).
template <class TA, class TB>
void gemm_blocked(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const TA* A,
                  std::int64_t lda, const TB* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                  bool serial = false) {
  const Blocking P = blocking();
  // K blocks depend on K only (they fix the summation order); M and N blocks may follow
  // the thread count freely since every element's sum is the same in any tile.
  const std::int64_t n_kb = ceil_div(K, std::max<std::int64_t>(1, P.kc));
  const std::int64_t KC = ceil_div(K, n_kb);
  const std::int64_t MC = round_up(ceil_div(M, ceil_div(M, std::max<std::int64_t>(MR, P.mc))), MR);
  // The packed B block holds all of K for NC columns, so it is capped by a byte budget.
  const std::int64_t nc_budget = std::max<std::int64_t>(16 * NR, P.b_bytes / (4 * n_kb * KC));
  const std::int64_t nc_max = std::max<std::int64_t>(NR, std::min(P.nc, nc_budget));
  const std::int64_t NC = round_up(ceil_div(N, ceil_div(N, nc_max)), NR);
  const std::int64_t n_ic = ceil_div(M, MC);
  const int threads = serial ? 1 : std::max(1, exec::num_threads());

  static thread_local OwnerBuffer owner;
  AlignedBuffer own_buf;
  const bool reuse = !owner.busy;
  AlignedBuffer& bbuf = reuse ? owner.buf : own_buf;
  if (reuse) owner.busy = true;
  struct Release {
    bool on;
    ~Release() {
      if (on) owner.busy = false;
    }
  } release{reuse};
  const std::int64_t b_block = KC * NC;  // floats per packed K block of B
  float* Bp = bbuf.get(static_cast<std::size_t>(n_kb * b_block));
  const Store first = beta == 1.f ? Store::accumulate : beta == 0.f ? Store::overwrite : Store::scale;
  std::unique_ptr<std::atomic<std::int64_t>[]> next_js(new std::atomic<std::int64_t>[static_cast<std::size_t>(n_ic)]);

  for (std::int64_t jc = 0; jc < N; jc += NC) {
    const std::int64_t nc = std::min(NC, N - jc);
    const std::int64_t panels = ceil_div(nc, NR);
    // Tiles are (M block, column chunk) pairs, each computed by one thread over all K
    // blocks. Chunks of at most chunk_panels panels keep a tile's C (mc x 256 floats)
    // cache-resident across its K blocks; with several threads, chunks shrink until there
    // are >= 16 tiles per thread so that the dynamic schedule below can balance them.
    std::int64_t chunk = std::min<std::int64_t>(panels, P.chunk_panels);
    while (threads > 1 && chunk > 2 && n_ic * ceil_div(panels, chunk) < 16 * threads) chunk = ceil_div(chunk, 2);
    const std::int64_t n_js = ceil_div(panels, chunk);

    // Pack all K blocks of B for these columns (in parallel over (K block, panel)).
    for_range(serial, n_kb * panels, 8, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t t = lo; t < hi;) {
        const std::int64_t kb = t / panels, q0 = t % panels;
        const std::int64_t q1 = std::min(panels, q0 + (hi - t));
        const std::int64_t pc = kb * KC;
        pack_b(tb, B, ldb, pc, std::min(KC, K - pc), jc, nc, q0, q1, Bp + kb * b_block);
        t += q1 - q0;
      }
    });

    // Dynamic two-level schedule: each thread claims whole M blocks (packing its A block
    // once), and threads that run out of M blocks help finish the column chunks of blocks
    // still in progress. A thread slowed by other work therefore delays the end by at most
    // one tile, and A is packed about once per M block.
    std::atomic<std::int64_t> next_ic{0};
    for (std::int64_t i = 0; i < n_ic; ++i) next_js[static_cast<std::size_t>(i)].store(0, std::memory_order_relaxed);
    for_range(serial, threads, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      static thread_local AlignedBuffer abuf;
      const std::int64_t a_block = MC * KC;
      float* Ap = abuf.get(static_cast<std::size_t>(n_kb * a_block));
      std::int64_t packed = -1;
      auto run_block = [&](std::int64_t ic) {
        const std::int64_t i0 = ic * MC, mc = std::min(MC, M - i0);
        float* Cb = C + i0 * ldc + jc;
        for (std::int64_t js; (js = next_js[static_cast<std::size_t>(ic)].fetch_add(1)) < n_js;) {
          if (ic != packed) {  // A block with all its K blocks
            for (std::int64_t kb = 0; kb < n_kb; ++kb) {
              const std::int64_t pc = kb * KC;
              pack_a(ta, A, lda, i0, mc, pc, std::min(KC, K - pc), Ap + kb * a_block);
            }
            packed = ic;
          }
          const std::int64_t q0 = js * chunk, q1 = std::min(panels, q0 + chunk);
          for (std::int64_t kb = 0; kb < n_kb; ++kb) {
            const std::int64_t kc = std::min(KC, K - kb * KC);
            const float* a = Ap + kb * a_block;
            const float* b = Bp + kb * b_block;
            switch (kb > 0 ? Store::accumulate : first) {
              case Store::overwrite: macro_kernel<Store::overwrite>(mc, kc, q0, q1, nc, a, b, Cb, ldc, alpha, beta); break;
              case Store::accumulate: macro_kernel<Store::accumulate>(mc, kc, q0, q1, nc, a, b, Cb, ldc, alpha, beta); break;
              case Store::scale: macro_kernel<Store::scale>(mc, kc, q0, q1, nc, a, b, Cb, ldc, alpha, beta); break;
            }
          }
        }
      };
      for (std::ptrdiff_t part = lo; part < hi; ++part) {
        for (std::int64_t ic; (ic = next_ic.fetch_add(1)) < n_ic;) run_block(ic);
        for (std::int64_t ic = 0; ic < n_ic; ++ic) run_block(ic);  // help unfinished blocks
      }
    });
  }
}

}  // namespace detail::gemm

/// C = alpha * op(A) * op(B) + beta * C, all row-major. op(A) is M x K, op(B) is K x N, C is
/// M x N. A stored [M,K] (lda >= K) or, with ta == Trans::yes, [K,M] (lda >= M); B stored
/// [K,N] (ldb >= N) or, with tb == Trans::yes, [N,K] (ldb >= K); ldc >= N.
/// beta == 0 never reads C. Throws edl::Error (invalid_argument / shape_mismatch) naming
/// the bad argument.
template <class TA, class TB>
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const TA* A,
          std::int64_t lda, const TB* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  static_assert(detail::gemm::storage<TA>, "gemm: A must be float, edl::bf16 or edl::f16");
  static_assert(detail::gemm::storage<TB>, "gemm: B must be float, edl::bf16 or edl::f16");
  namespace g = detail::gemm;
  g::check_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {
    g::scale_c(M, N, beta, C, ldc);
    return;
  }
  const bool at = ta == Trans::yes, bt = tb == Trans::yes;
  if (M == 1) {
    // Row vector times matrix: no packing, B is streamed once.
    const std::vector<float> x = g::gather_f32(A, K, at ? lda : 1);
    if (bt) g::gemv_dot(N, K, x.data(), B, ldb, C, 1, alpha, beta);
    else g::gemv_axpy(N, K, x.data(), B, ldb, C, 1, alpha, beta);
    return;
  }
  if (N == 1) {
    const std::vector<float> x = g::gather_f32(B, K, bt ? 1 : ldb);
    if (at) g::gemv_axpy(M, K, x.data(), A, lda, C, ldc, alpha, beta);
    else g::gemv_dot(M, K, x.data(), A, lda, C, ldc, alpha, beta);
    return;
  }
  g::gemm_blocked(at, bt, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/// gemm on the calling thread only, for callers that are already parallel over independent
/// problems (attention runs one per (batch, head) task). Same arguments, checks and bits as
/// gemm; M == 1 and N == 1 go through the blocked path too (the gemv paths are parallel).
template <class TA, class TB>
void gemm_serial(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const TA* A,
                 std::int64_t lda, const TB* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  static_assert(detail::gemm::storage<TA>, "gemm_serial: A must be float, edl::bf16 or edl::f16");
  static_assert(detail::gemm::storage<TB>, "gemm_serial: B must be float, edl::bf16 or edl::f16");
  namespace g = detail::gemm;
  g::check_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {
    g::scale_c(M, N, beta, C, ldc);
    return;
  }
  g::gemm_blocked(ta == Trans::yes, tb == Trans::yes, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true);
}

/// C = A * B (accumulate: C += A * B). A [M,K], B [K,N], C [M,N], contiguous.
template <class TA, class TB>
void matmul(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K,
            bool accumulate = false) {
  gemm(Trans::no, Trans::no, M, N, K, 1.f, A, std::max<std::int64_t>(1, K), B, std::max<std::int64_t>(1, N),
       accumulate ? 1.f : 0.f, C, std::max<std::int64_t>(1, N));
}

/// C = A * B^T (accumulate: C += ...). A [M,K], B stored [N,K], C [M,N]: y = x W^T.
template <class TA, class TB>
void matmul_nt(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate = false) {
  gemm(Trans::no, Trans::yes, M, N, K, 1.f, A, std::max<std::int64_t>(1, K), B, std::max<std::int64_t>(1, K),
       accumulate ? 1.f : 0.f, C, std::max<std::int64_t>(1, N));
}

/// C[m, j] += bias[j] for C [M, N]: the bias a Linear layer adds after its GEMM.
template <class TB>
void add_bias_rows(float* C, std::int64_t M, std::int64_t N, const TB* bias) {
  exec::parallel_for(0, M, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::int64_t m = lo; m < hi; ++m)
      for (std::int64_t j = 0; j < N; ++j) C[m * N + j] += to_f32(bias[j]);
  });
}

/// C = A^T * B (accumulate: C += ...). A stored [K,M], B [K,N], C [M,N]: dW = dy^T x.
template <class TA, class TB>
void matmul_tn(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate = false) {
  gemm(Trans::yes, Trans::no, M, N, K, 1.f, A, std::max<std::int64_t>(1, M), B, std::max<std::int64_t>(1, N),
       accumulate ? 1.f : 0.f, C, std::max<std::int64_t>(1, N));
}

/// The GEMM family is also reachable as edl::kernels::*, beside the other kernels.
namespace kernels {
using edl::gemm;
using edl::gemm_serial;
using edl::matmul;
using edl::matmul_nt;
using edl::matmul_tn;
using edl::add_bias_rows;
using edl::Trans;
}  // namespace kernels

}  // namespace edl
