// edl/kernels/detail/gemm_microkernel.hpp
// The GEMM register-blocked micro-kernel: C[MR x NR] (+)= alpha * Ap[MR x kc] * Bp[kc x NR].
//
// Ap is an MR-row micro-panel packed k-major (Ap[k*MR + r]), Bp an NR-column micro-panel
// packed k-major (Bp[k*NR + c]), both zero-padded to full MR / NR by the packing routines.
// The kernel therefore always computes a full tile with the same instruction sequence; a
// partial edge tile goes through a small stack buffer with the same vector epilogue, so
// every element of C is produced by exactly the same arithmetic wherever its tile lies.
// That, plus a K-blocking that depends only on K, is what makes gemm bit-reproducible
// across thread counts.
#pragma once

#include <algorithm>
#include <cstdint>

#include <xsimd/xsimd.hpp>

#include <edl/kernels/detail/fma.hpp>

namespace edl::detail::gemm {

using fbatch = xsimd::batch<float>;

/// Lanes of one f32 SIMD register (8 on AVX2, 4 on SSE/NEON, 16 on AVX-512).
inline constexpr int simd_width = static_cast<int>(fbatch::size);
/// Micro-tile rows: MR broadcasts of A per k step.
inline constexpr int MR = 6;
/// Micro-tile columns: two registers of B per k step, so MR * 2 = 12 accumulators (of 16
/// architectural registers on AVX2: 12 accumulators + 2 B + 1 broadcast).
inline constexpr int NB = 2;
inline constexpr int NR = NB * simd_width;

/// How the epilogue combines the accumulator with C.
enum class Store : int {
  overwrite,  // C = alpha*acc            (beta == 0: C is never read)
  accumulate, // C = alpha*acc + C        (beta == 1, and every K block after the first)
  scale,      // C = alpha*acc + beta*C
};

/// Applies the epilogue to one row of NB registers at c (unaligned).
template <Store S>
inline void store_row(float* c, const fbatch* acc, fbatch alpha, fbatch beta) noexcept {
  for (int j = 0; j < NB; ++j) {
    float* p = c + j * simd_width;
    if constexpr (S == Store::overwrite) {
      (alpha * acc[j]).store_unaligned(p);
    } else if constexpr (S == Store::accumulate) {
      kernels::detail::fmadd(alpha, acc[j], fbatch::load_unaligned(p)).store_unaligned(p);
    } else {
      kernels::detail::fmadd(alpha, acc[j], beta * fbatch::load_unaligned(p)).store_unaligned(p);
    }
  }
}

template <Store S>
inline void store_tile(float* c, std::int64_t ldc, int mr, int nr, const fbatch (&acc)[MR][NB], float alpha,
                       float beta) noexcept {
  const fbatch va(alpha), vb(beta);
  if (mr == MR && nr == NR) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) store_row<S>(c + i * ldc, acc[i], va, vb);
    return;
  }
  // Partial tile: same vector epilogue on a buffer holding the valid part of C.
  alignas(64) float buf[MR * NR];
  if constexpr (S != Store::overwrite) {
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) buf[i * NR + j] = c[i * ldc + j];
  }
  for (int i = 0; i < MR; ++i) {
    if (i < mr) {
      if constexpr (S != Store::overwrite)
        for (int j = nr; j < NR; ++j) buf[i * NR + j] = 0.f;
      store_row<S>(buf + i * NR, acc[i], va, vb);
    }
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] = buf[i * NR + j];
}

/// acc = Ap * Bp over kc steps, then the epilogue S into C (mr x nr valid).
template <Store S>
inline void microkernel(std::int64_t kc, const float* __restrict a, const float* __restrict b, float* c,
                        std::int64_t ldc, int mr, int nr, float alpha, float beta) noexcept {
  fbatch acc[MR][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[i][j] = fbatch(0.f);

  // Warm the C tile while the k loop runs; it is touched only in the epilogue.
  for (int i = 0; i < mr; ++i) __builtin_prefetch(c + i * ldc, 1, 3);

#pragma GCC unroll 4
  for (std::int64_t k = 0; k < kc; ++k) {
#ifndef EDL_GEMM_NO_PREFETCH_A
    __builtin_prefetch(a + 8 * MR * 4, 0, 3);
#endif
    fbatch bv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) bv[j] = fbatch::load_aligned(b + j * simd_width);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const fbatch av(a[i]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = kernels::detail::fmadd(av, bv[j], acc[i][j]);
    }
    a += MR;
    b += NR;
  }
  store_tile<S>(c, ldc, mr, nr, acc, alpha, beta);
}

}  // namespace edl::detail::gemm
