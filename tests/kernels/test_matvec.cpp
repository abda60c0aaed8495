// tests/kernels/test_matvec.cpp: decode's matrix-vector products against double sums, and the
// same bits however rows are split between threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <edl/core/exec.hpp>
#include <edl/kernels/matvec.hpp>

using namespace edl;

TEST(Matvec, LinearOfAFewRowsEqualsTheDotProducts) {
  // The matrix-vector path (1-16 rows, in blocks of 4 with 1-3 left over) and the GEMM beyond it
  // against a double-precision sum, with K a multiple of the vector width and not.
  for (const std::int64_t K : {64, 37}) {
    const std::int64_t N = 11;
    for (const std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17}) {
      std::vector<float> x(static_cast<std::size_t>(M * K)), W(static_cast<std::size_t>(N * K)), b(static_cast<std::size_t>(N));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
      for (std::size_t i = 0; i < W.size(); ++i) W[i] = std::cos(0.23f * static_cast<float>(i));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.5f - 0.1f * static_cast<float>(i);
      std::vector<float> y(static_cast<std::size_t>(M * N), -99.f);
      kernels::linear_nt(x.data(), M, W.data(), b.data(), y.data(), N, K);
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t j = 0; j < N; ++j) {
          double s = b[static_cast<std::size_t>(j)];
          for (std::int64_t k = 0; k < K; ++k)
            s += static_cast<double>(x[static_cast<std::size_t>(m * K + k)]) * W[static_cast<std::size_t>(j * K + k)];
          EXPECT_NEAR(y[static_cast<std::size_t>(m * N + j)], s, 1e-4) << "M " << M << " K " << K << " row " << m << " out " << j;
        }
    }
  }
}

TEST(Matvec, LinearOfManyRowsInBlocksOfFourWeightRows) {
  // From kMatvecRowsBlocked rows (and rows of kMatvecBlockedMinK or more) linear_nt applies four
  // weight rows at a time, the last N % 4 alone: against double sums, with and without a tail
  // past the vector width, and the same bits on 1, 2 and 3 threads.
  using kernels::detail::kMatvecBlockedMinK;
  for (const std::int64_t K : {kMatvecBlockedMinK, kMatvecBlockedMinK + 3})
    for (const std::int64_t N : {11, 64})
      for (const std::int64_t M : {kernels::detail::kMatvecRowsBlocked, std::int64_t{9}, kernels::detail::kMatvecRows}) {
        std::vector<float> x(static_cast<std::size_t>(M * K)), W(static_cast<std::size_t>(N * K)), b(static_cast<std::size_t>(N));
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
        for (std::size_t i = 0; i < W.size(); ++i) W[i] = std::cos(0.23f * static_cast<float>(i));
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.5f - 0.1f * static_cast<float>(i);
        std::vector<float> first;
        const int threads_before = exec::num_threads();
        for (const int threads : {1, 2, 3}) {
          exec::set_num_threads(threads);
          std::vector<float> y(static_cast<std::size_t>(M * N), -99.f);
          kernels::linear_nt(x.data(), M, W.data(), b.data(), y.data(), N, K);
          if (first.empty()) {
            first = y;
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t j = 0; j < N; ++j) {
                double s = b[static_cast<std::size_t>(j)];
                for (std::int64_t k = 0; k < K; ++k)
                  s += static_cast<double>(x[static_cast<std::size_t>(m * K + k)]) * W[static_cast<std::size_t>(j * K + k)];
                EXPECT_NEAR(y[static_cast<std::size_t>(m * N + j)], s, 1e-3) << "M " << M << " N " << N << " K " << K;
              }
          } else {
            EXPECT_EQ(y, first) << threads << " threads, M " << M << " N " << N << " K " << K;
          }
        }
        exec::set_num_threads(threads_before);
      }
}

TEST(Matvec, MatrixVectorRowsMatchDoubleSumsOverBlocksAndChunks) {
  // matvec_rows in blocks of kStreams streams of R rows (R * K * 4 ~ kStreamBytes), each block's
  // sums staged and written a chunk of steps at a time, the last < kStreams rows in one group:
  // N = 5005 at K = 64 (R = 512) makes a block of 4 full chunks, a shorter block and a group of
  // 5; K = 37 adds a tail past the vector width. Any split of the rows gives the same bits.
  for (const std::int64_t K : {64, 37}) {
    const std::int64_t N = 5005;
    std::vector<float> x(static_cast<std::size_t>(K)), W(static_cast<std::size_t>(N * K)), b(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
    for (std::size_t i = 0; i < W.size(); ++i) W[i] = std::cos(0.23f * static_cast<float>(i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.5f - 0.001f * static_cast<float>(i);
    std::vector<float> y(static_cast<std::size_t>(N), -99.f), split(y);
    kernels::detail::matvec_rows(x.data(), W.data(), b.data(), y.data(), K, 0, N);
    for (std::int64_t j = 0; j < N; ++j) {
      double s = b[static_cast<std::size_t>(j)];
      for (std::int64_t k = 0; k < K; ++k) s += static_cast<double>(x[static_cast<std::size_t>(k)]) * W[static_cast<std::size_t>(j * K + k)];
      ASSERT_NEAR(y[static_cast<std::size_t>(j)], s, 1e-4) << "K " << K << " row " << j;
    }
    const std::int64_t cuts[] = {0, 3, 1030, 4100, N};
    for (std::size_t c = 0; c + 1 < std::size(cuts); ++c)
      kernels::detail::matvec_rows(x.data(), W.data(), b.data(), split.data(), K, cuts[c], cuts[c + 1]);
    for (std::int64_t j = 0; j < N; ++j)
      ASSERT_EQ(split[static_cast<std::size_t>(j)], y[static_cast<std::size_t>(j)]) << "K " << K << " row " << j;
  }
}

TEST(Matvec, GroupedMatrixVectorIsEachProductBitForBit) {
  // Decode's q/k/v and gate/up products run as one parallel region (matvec_group): each output
  // equals its own product computed alone and a double-precision sum, and does not change with
  // the thread count (every row is one FMA chain whatever chunk it falls in).
  const std::int64_t K = 300, Ns[3] = {64, 19, 19};  // rows not a multiple of 4; K not of the width
  std::vector<float> x(static_cast<std::size_t>(K));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  std::vector<std::vector<float>> W(3), b(3), alone(3);
  for (int p = 0; p < 3; ++p) {
    W[p].resize(static_cast<std::size_t>(Ns[p] * K));
    b[p].resize(static_cast<std::size_t>(Ns[p]));
    for (std::size_t i = 0; i < W[p].size(); ++i) W[p][i] = std::cos(0.23f * static_cast<float>(i) + static_cast<float>(p));
    for (std::size_t i = 0; i < b[p].size(); ++i) b[p][i] = 0.01f * static_cast<float>(i) - 0.2f;
    alone[p].assign(static_cast<std::size_t>(Ns[p]), -99.f);
    kernels::linear_nt(x.data(), 1, W[p].data(), b[p].data(), alone[p].data(), Ns[p], K);
  }
  const int threads_before = exec::num_threads();
  for (const int threads : {1, 2, 3}) {
    exec::set_num_threads(threads);
    std::vector<std::vector<float>> y(3);
    for (int p = 0; p < 3; ++p) y[p].assign(static_cast<std::size_t>(Ns[p]), -99.f);
    kernels::matvec_group<float, 3>(x.data(),
                                             {kernels::MatvecPart<float>{W[0].data(), b[0].data(), y[0].data(), Ns[0]},
                                              {W[1].data(), b[1].data(), y[1].data(), Ns[1]},
                                              {W[2].data(), nullptr, y[2].data(), Ns[2]}},
                                             K);
    for (int p = 0; p < 3; ++p)
      for (std::int64_t j = 0; j < Ns[p]; ++j) {
        const float bias = p == 2 ? 0.f : b[p][static_cast<std::size_t>(j)];
        if (p < 2) {
          EXPECT_EQ(y[p][static_cast<std::size_t>(j)], alone[p][static_cast<std::size_t>(j)]) << p << " " << j;
        }
        double s = bias;
        for (std::int64_t k = 0; k < K; ++k)
          s += static_cast<double>(x[static_cast<std::size_t>(k)]) * W[p][static_cast<std::size_t>(j * K + k)];
        EXPECT_NEAR(y[p][static_cast<std::size_t>(j)], s, 1e-4) << "threads " << threads << " matrix " << p << " row " << j;
      }
  }
  exec::set_num_threads(threads_before);
}

// The roofline's read pattern visits every element of its blocks once: its sum is the naive
// sum (small integers: exact in f32 whatever the order), and nothing past the blocks is read
// into it (the element after them is huge).
TEST(Matvec, LockstepReadSumAddsEveryElementOfItsBlocks) {
  for (const std::size_t len : {std::size_t{64}, std::size_t{256}, std::size_t{2048}}) {  // whole AVX-512 batch pairs too
    const std::size_t blocks = 3, n = blocks * 8 * len;
    std::vector<float> x(n + 1);
    double naive = 0;
    for (std::size_t i = 0; i < n; ++i) naive += (x[i] = static_cast<float>(i % 13) - 6.0f);
    x[n] = 1e30f;
    EXPECT_EQ(static_cast<double>(edl::kernels::detail::lockstep_read_sum(x.data(), blocks, len)), naive) << "len " << len;
  }
}
