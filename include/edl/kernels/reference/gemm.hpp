// edl/kernels/reference/gemm.hpp
// Naive twin of edl::gemm (same signature and argument checks): a triple loop accumulating
// in double, for tests and for checking the fast kernel on a new machine. Slow on purpose.
#pragma once

#include <cstdint>

#include <edl/core/dtype.hpp>
#include <edl/kernels/gemm.hpp>

namespace edl::reference {

template <class TA, class TB>
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const TA* A,
          std::int64_t lda, const TB* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  detail::gemm::check_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  const bool at = ta == Trans::yes, bt = tb == Trans::yes;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = to_f32(at ? A[k * lda + i] : A[i * lda + k]);
        const double b = to_f32(bt ? B[j * ldb + k] : B[k * ldb + j]);
        s += a * b;
      }
      float& c = C[i * ldc + j];
      const double prev = beta == 0.f ? 0.0 : static_cast<double>(beta) * c;
      c = static_cast<float>(static_cast<double>(alpha) * s + prev);
    }
  }
}

}  // namespace edl::reference
