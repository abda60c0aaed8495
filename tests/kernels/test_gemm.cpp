#include <edl/kernels/gemm.hpp>
#include <edl/kernels/reference/gemm.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace {

using edl::Trans;
using i64 = std::int64_t;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
std::vector<T> random_matrix(i64 rows, i64 cols, i64 ld, std::uint32_t seed, float pad = kNaN) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<T> m(static_cast<std::size_t>(std::max<i64>(rows * ld, 1)), edl::from_f32<T>(pad));
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) m[static_cast<std::size_t>(r * ld + c)] = edl::from_f32<T>(dist(gen));
  return m;
}

/// Double-precision C = alpha op(A) op(B) + beta C, and per element the bound
/// |alpha| sum|a b| + |beta c| that scales the allowed f32 rounding error.
template <class TA, class TB>
void naive(Trans ta, Trans tb, i64 M, i64 N, i64 K, float alpha, const std::vector<TA>& A, i64 lda,
           const std::vector<TB>& B, i64 ldb, float beta, const std::vector<float>& C0, i64 ldc,
           std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(static_cast<std::size_t>(M * N), 0.0);
  mag.assign(static_cast<std::size_t>(M * N), 0.0);
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < N; ++j) {
      double s = 0, m = 0;
      for (i64 k = 0; k < K; ++k) {
        const double a = edl::to_f32(ta == Trans::yes ? A[k * lda + i] : A[i * lda + k]);
        const double b = edl::to_f32(tb == Trans::yes ? B[j * ldb + k] : B[k * ldb + j]);
        s += a * b;
        m += std::abs(a * b);
      }
      const double c = beta == 0.f ? 0.0 : static_cast<double>(beta) * C0[i * ldc + j];
      ref[i * N + j] = alpha * s + c;
      mag[i * N + j] = std::abs(alpha) * m + std::abs(c);
    }
}

struct Case {
  i64 M, N, K;
  Trans ta, tb;
  float alpha, beta;
  i64 pad;  // extra elements per row of A, B and C beyond the minimal leading dimension
};

std::string name(const Case& c) {
  return std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) +
         (c.ta == Trans::yes ? " At" : " A") + (c.tb == Trans::yes ? " Bt" : " B") + " alpha=" +
         std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pad);
}

template <class TA, class TB>
void check_case(const Case& c, std::uint32_t seed = 7, bool serial = false) {
  SCOPED_TRACE(name(c));
  const i64 arows = c.ta == Trans::yes ? c.K : c.M, acols = c.ta == Trans::yes ? c.M : c.K;
  const i64 brows = c.tb == Trans::yes ? c.N : c.K, bcols = c.tb == Trans::yes ? c.K : c.N;
  const i64 lda = std::max<i64>(1, acols) + c.pad, ldb = std::max<i64>(1, bcols) + c.pad;
  const i64 ldc = std::max<i64>(1, c.N) + c.pad;
  const auto A = random_matrix<TA>(arows, acols, lda, seed);
  const auto B = random_matrix<TB>(brows, bcols, ldb, seed + 1);
  // C: beta == 0 starts from NaN (must never be read); padding holds a sentinel.
  auto C = random_matrix<float>(c.M, c.N, ldc, seed + 2, 12345.f);
  if (c.beta == 0.f)
    for (i64 i = 0; i < c.M; ++i)
      for (i64 j = 0; j < c.N; ++j) C[i * ldc + j] = kNaN;
  const auto C0 = C;
  std::vector<double> ref, mag;
  naive(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, C0, ldc, ref, mag);

  if (serial) edl::gemm_serial(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  else edl::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);

  const double eps = std::numeric_limits<float>::epsilon();
  int bad = 0;
  for (i64 i = 0; i < c.M && bad < 5; ++i) {
    for (i64 j = 0; j < c.N && bad < 5; ++j) {
      const double got = C[i * ldc + j], want = ref[i * c.N + j];
      const double tol = (c.K + 4) * eps * mag[i * c.N + j] + 1e-30;
      if (!(std::abs(got - want) <= tol)) {
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got << ", want " << want << " +- " << tol;
        ++bad;
      }
    }
    for (i64 j = c.N; j < ldc; ++j)
      if (C[i * ldc + j] != 12345.f) {
        ADD_FAILURE() << "padding C(" << i << ", " << j << ") was written";
        ++bad;
      }
  }
}

const Trans kT[2] = {Trans::no, Trans::yes};

TEST(Gemm, ShapesAllTransposes) {
  const i64 shapes[][3] = {{1, 1, 1},    {7, 13, 5},   {127, 255, 63}, {1000, 1, 1000}, {1, 1000, 1000},
                           {6, 16, 256}, {5, 17, 257}, {67, 33, 600},  {2, 3, 1},       {300, 40, 9}};
  for (const auto& s : shapes)
    for (Trans ta : kT)
      for (Trans tb : kT) check_case<float, float>({s[0], s[1], s[2], ta, tb, 1.f, 0.f, 0});
}

TEST(Gemm, LeadingDimensionsLargerThanMinimal) {
  for (Trans ta : kT)
    for (Trans tb : kT) {
      check_case<float, float>({37, 45, 29, ta, tb, 1.f, 0.f, 3});
      check_case<float, float>({130, 70, 300, ta, tb, 1.f, 1.f, 17});
      check_case<float, float>({1, 50, 40, ta, tb, 1.f, 0.f, 5});
      check_case<float, float>({50, 1, 40, ta, tb, 1.f, 0.f, 5});
    }
}

TEST(Gemm, AlphaBeta) {
  for (Trans ta : kT)
    for (Trans tb : kT) {
      check_case<float, float>({33, 41, 300, ta, tb, -0.75f, 0.5f, 1});
      check_case<float, float>({64, 64, 64, ta, tb, 2.f, 1.f, 0});
      check_case<float, float>({19, 1, 70, ta, tb, 0.5f, -2.f, 2});
      check_case<float, float>({1, 23, 70, ta, tb, 0.5f, 3.f, 2});
    }
}

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  // check_case fills C with NaN when beta == 0; also the degenerate paths.
  for (Trans ta : kT)
    for (Trans tb : kT) {
      check_case<float, float>({20, 30, 40, ta, tb, 1.5f, 0.f, 0});
      check_case<float, float>({8, 9, 0, ta, tb, 1.f, 0.f, 0});    // K == 0: C = 0
      check_case<float, float>({8, 9, 10, ta, tb, 0.f, 0.f, 0});   // alpha == 0: C = 0
    }
  std::vector<float> a(6, 1.f), b(6, 1.f), c(4, kNaN);
  edl::matmul(a.data(), b.data(), c.data(), 2, 2, 3);
  for (float v : c) EXPECT_EQ(v, 3.f);
}

TEST(Gemm, AlphaZeroOrEmptyK) {
  Case c{8, 9, 10, Trans::no, Trans::no, 0.f, 2.f, 1};
  check_case<float, float>(c);
  c.K = 0;
  c.alpha = 1.f;
  check_case<float, float>(c);
}

// 16-bit inputs are widened exactly while packing: every shape path (vector, blocked, serial)
// against the double-precision reference, alone and mixed with f32 and the other 16-bit type.
template <class H, class Other>
void check_16bit_inputs() {
  for (Trans ta : kT)
    for (Trans tb : kT) {
      check_case<H, H>({1, 1, 1, ta, tb, 1.f, 0.f, 0});
      check_case<H, H>({7, 13, 5, ta, tb, 1.f, 0.f, 0});
      check_case<H, H>({127, 255, 63, ta, tb, 1.f, 0.f, 2});
      check_case<H, H>({1000, 1, 1000, ta, tb, 1.f, 0.f, 0});
      check_case<H, H>({1, 300, 100, ta, tb, 1.f, 0.f, 0});
      check_case<float, H>({40, 70, 300, ta, tb, 0.5f, 1.f, 1});
      check_case<H, float>({40, 70, 300, ta, tb, 1.f, 0.25f, 1});
      check_case<H, Other>({40, 70, 300, ta, tb, 1.f, 0.25f, 1});
      check_case<H, float>({33, 41, 77, ta, tb, 1.f, 0.f, 0}, 7, /*serial=*/true);
    }
}

TEST(Gemm, Bf16Inputs) { check_16bit_inputs<edl::bf16, edl::f16>(); }
TEST(Gemm, F16Inputs) { check_16bit_inputs<edl::f16, edl::bf16>(); }

TEST(Gemm, MatmulWrappers) {
  const i64 M = 37, N = 29, K = 53;
  const auto A = random_matrix<float>(M, K, K, 1), B = random_matrix<float>(K, N, N, 2);
  const auto Bt = random_matrix<float>(N, K, K, 3), At = random_matrix<float>(K, M, M, 4);
  std::vector<float> C(M * N), R(M * N);
  auto expect_near = [&](const char* what) {
    for (std::size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(C[i], R[i], 1e-4) << what << " at " << i;
  };
  edl::matmul(A.data(), B.data(), C.data(), M, N, K);
  edl::reference::gemm(Trans::no, Trans::no, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, R.data(), N);
  expect_near("matmul");
  edl::matmul(A.data(), B.data(), C.data(), M, N, K, /*accumulate=*/true);
  edl::reference::gemm(Trans::no, Trans::no, M, N, K, 1.f, A.data(), K, B.data(), N, 1.f, R.data(), N);
  expect_near("matmul accumulate");
  edl::matmul_nt(A.data(), Bt.data(), C.data(), M, N, K);
  edl::reference::gemm(Trans::no, Trans::yes, M, N, K, 1.f, A.data(), K, Bt.data(), K, 0.f, R.data(), N);
  expect_near("matmul_nt");
  edl::matmul_nt(A.data(), Bt.data(), C.data(), M, N, K, true);
  edl::reference::gemm(Trans::no, Trans::yes, M, N, K, 1.f, A.data(), K, Bt.data(), K, 1.f, R.data(), N);
  expect_near("matmul_nt accumulate");
  edl::matmul_tn(At.data(), B.data(), C.data(), M, N, K);
  edl::reference::gemm(Trans::yes, Trans::no, M, N, K, 1.f, At.data(), M, B.data(), N, 0.f, R.data(), N);
  expect_near("matmul_tn");
  edl::matmul_tn(At.data(), B.data(), C.data(), M, N, K, true);
  edl::reference::gemm(Trans::yes, Trans::no, M, N, K, 1.f, At.data(), M, B.data(), N, 1.f, R.data(), N);
  expect_near("matmul_tn accumulate");
}

/// Runs gemm with n threads on fixed inputs and returns C.
template <class T>
std::vector<float> run_with_threads(int n, Trans ta, Trans tb, i64 M, i64 N, i64 K) {
  const i64 lda = ta == Trans::yes ? M : K, ldb = tb == Trans::yes ? K : N;
  const auto A = random_matrix<T>(ta == Trans::yes ? K : M, lda, lda, 11);
  const auto B = random_matrix<T>(tb == Trans::yes ? N : K, ldb, ldb, 12);
  auto C = random_matrix<float>(M, N, N, 13);
  edl::exec::set_num_threads(n);
  edl::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), N);
  edl::exec::set_num_threads(0);
  return C;
}

TEST(Gemm, BitIdenticalAcrossThreadCounts) {
  const i64 shapes[][3] = {{301, 517, 700}, {1, 3000, 200}, {3000, 1, 200}, {64, 2000, 33}, {1000, 40, 520}};
  for (const auto& s : shapes)
    for (Trans ta : kT)
      for (Trans tb : kT) {
        SCOPED_TRACE(std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]));
        const auto c1 = run_with_threads<float>(1, ta, tb, s[0], s[1], s[2]);
        const auto c2 = run_with_threads<float>(2, ta, tb, s[0], s[1], s[2]);
        const auto c3 = run_with_threads<float>(3, ta, tb, s[0], s[1], s[2]);
        EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)));
      }
  const auto b1 = run_with_threads<edl::bf16>(1, Trans::no, Trans::yes, 257, 300, 400);
  const auto b2 = run_with_threads<edl::bf16>(2, Trans::no, Trans::yes, 257, 300, 400);
  EXPECT_EQ(0, std::memcmp(b1.data(), b2.data(), b1.size() * sizeof(float)));
}

TEST(Gemm, BitIdenticalWithSmallBlocks) {
  // Small M/N blocks give many tiles and edge tiles; results must not depend on them either.
  auto& bl = edl::detail::gemm::blocking();
  const auto saved = bl;
  const auto big = run_with_threads<float>(1, Trans::no, Trans::no, 200, 150, 300);
  bl.mc = 12;
  bl.nc = 32;
  const auto small1 = run_with_threads<float>(1, Trans::no, Trans::no, 200, 150, 300);
  const auto small2 = run_with_threads<float>(2, Trans::no, Trans::no, 200, 150, 300);
  bl = saved;
  EXPECT_EQ(0, std::memcmp(big.data(), small1.data(), big.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(big.data(), small2.data(), big.size() * sizeof(float)));
  check_case<float, float>({200, 150, 300, Trans::yes, Trans::yes, 1.f, 0.f, 1});
}

TEST(Gemm, SerialMatchesNaiveAndParallelBits) {
  // gemm_serial (attention's per-head products) against the naive loops, M == 1 and N == 1
  // included (it takes the blocked path for them), with padding and alpha/beta.
  const i64 shapes[][3] = {{64, 150, 16}, {150, 16, 64}, {1, 37, 5}, {37, 1, 5}, {13, 9, 700}};
  for (const auto& s : shapes)
    for (Trans ta : kT)
      for (Trans tb : kT) {
        check_case<float, float>({s[0], s[1], s[2], ta, tb, 0.125f, 0.f, 3}, 7, true);
        check_case<float, float>({s[0], s[1], s[2], ta, tb, 1.f, 1.f, 0}, 9, true);
      }
  // Same tiles and K blocks as the parallel gemm, so the same bits (where gemm does not take
  // its gemv path), also when many serial products run at once on the thread pool.
  for (Trans ta : kT)
    for (Trans tb : kT) {
      const i64 M = 301, N = 517, K = 700, lda = ta == Trans::yes ? M : K, ldb = tb == Trans::yes ? K : N;
      const auto A = random_matrix<float>(ta == Trans::yes ? K : M, lda, lda, 11);
      const auto B = random_matrix<float>(tb == Trans::yes ? N : K, ldb, ldb, 12);
      const auto want = run_with_threads<float>(2, ta, tb, M, N, K);
      std::vector<std::vector<float>> got(4, random_matrix<float>(M, N, N, 13));
      edl::exec::parallel_for(0, 4, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        for (std::ptrdiff_t t = lo; t < hi; ++t)
          edl::gemm_serial(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, got[t].data(), N);
      });
      for (const auto& g : got) EXPECT_EQ(0, std::memcmp(want.data(), g.data(), want.size() * sizeof(float)));
    }
}

TEST(Gemm, ConcurrentAndNestedCallsAgree) {
  // Simulated devices call gemm from inside parallel loops; packing buffers must not clash.
  const i64 sizes[][3] = {{150, 170, 400}, {90, 300, 200}, {1, 500, 300}, {260, 64, 520}};
  std::vector<std::vector<float>> want(4), got(4);
  for (int i = 0; i < 4; ++i) want[i] = run_with_threads<float>(0, Trans::no, Trans::yes, sizes[i][0], sizes[i][1], sizes[i][2]);
  for (int rep = 0; rep < 3; ++rep) {
    edl::exec::parallel_for(0, 4, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t i = lo; i < hi; ++i) {
        const i64 M = sizes[i][0], N = sizes[i][1], K = sizes[i][2];
        const auto A = random_matrix<float>(M, K, K, 11);
        const auto B = random_matrix<float>(N, K, K, 12);
        auto C = random_matrix<float>(M, N, N, 13);
        edl::gemm(Trans::no, Trans::yes, M, N, K, 0.5f, A.data(), K, B.data(), K, 0.25f, C.data(), N);
        got[static_cast<std::size_t>(i)] = std::move(C);
      }
    });
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(0, std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float))) << "call " << i;
  }
}

template <class F>
void expect_error(F&& f, edl::errc code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no edl::Error thrown, expected one mentioning " << needle;
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.where(), "gemm");
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Gemm, BadArgumentsThrowNamingTheArgument) {
  std::vector<float> a(100, 1.f), b(100, 1.f), c(100, 0.f);
  auto g = [&](Trans ta, Trans tb, i64 M, i64 N, i64 K, i64 lda, i64 ldb, i64 ldc) {
    return [=, &a, &b, &c] {
      edl::gemm(ta, tb, M, N, K, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), ldc);
    };
  };
  using edl::errc;
  expect_error(g(Trans::no, Trans::no, -1, 4, 4, 4, 4, 4), errc::invalid_argument, "M must be >= 0, found M = -1");
  expect_error(g(Trans::no, Trans::no, 4, -2, 4, 4, 4, 4), errc::invalid_argument, "N must be >= 0, found N = -2");
  expect_error(g(Trans::no, Trans::no, 4, 4, -3, 4, 4, 4), errc::invalid_argument, "K must be >= 0, found K = -3");
  expect_error(g(Trans::no, Trans::no, 4, 5, 6, 5, 5, 5), errc::shape_mismatch, "lda must be >= 6");
  expect_error(g(Trans::yes, Trans::no, 4, 5, 6, 3, 5, 5), errc::shape_mismatch, "lda must be >= 4");
  expect_error(g(Trans::no, Trans::no, 4, 5, 6, 6, 4, 5), errc::shape_mismatch, "ldb must be >= 5");
  expect_error(g(Trans::no, Trans::yes, 4, 5, 6, 6, 5, 5), errc::shape_mismatch, "ldb must be >= 6");
  expect_error(g(Trans::no, Trans::no, 4, 5, 6, 6, 5, 4), errc::shape_mismatch, "found ldc = 4");
  expect_error(
      [&] {
        edl::gemm(Trans::no, Trans::no, 2, 2, 2, 1.f, static_cast<const float*>(nullptr), 2, b.data(), 2, 0.f,
                  c.data(), 2);
      },
      errc::invalid_argument, "A must not be null");
  // Empty problems with minimal arguments are fine.
  EXPECT_NO_THROW(g(Trans::no, Trans::no, 0, 0, 0, 1, 1, 1)());
}

}  // namespace
