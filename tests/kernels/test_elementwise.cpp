// Tests of the elementwise and reduction kernels (softmax.hpp, rms_norm.hpp,
// activations.hpp, elementwise.hpp): each against its naive double-accumulating twin in
// kernels/reference/elementwise.hpp, every backward against central finite differences in
// double, masking edge cases, thread-count determinism and argument checks.
#include <edl/kernels/activations.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/reference/elementwise.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/kernels/softmax.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace k = edl::kernels;
namespace ref = edl::kernels::reference;
using edl::bf16;
using edl::f16;

constexpr float kInf = std::numeric_limits<float>::infinity();
const std::vector<std::ptrdiff_t> kOddSizes = {1, 7, 8, 9, 31, 1000};

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// |a - b| <= atol + rtol * |b| elementwise, reporting the first failure.
template <class A, class B>
void expect_close(const std::vector<A>& a, const std::vector<B>& b, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isinf(y) && x == y) continue;
    ASSERT_LE(std::abs(x - y), atol + rtol * std::abs(y)) << what << " at " << i << ": got " << x << ", want " << y;
  }
}

template <class T>
bool bit_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Central differences of the scalar L(x) at every element of x (double).
std::vector<double> numeric_grad(std::vector<double> x, const std::function<double(const std::vector<double>&)>& L,
                                 double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = L(x);
    x[i] = x0 - h;
    const double lm = L(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

double weighted_sum(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    if (std::isfinite(y[i])) s += w[i] * y[i];
  return s;
}

/// Runs f once with 1 thread and once with 2, restoring the default.
template <class F>
void with_threads(int n, F&& f) {
  edl::exec::set_num_threads(n);
  f();
  edl::exec::set_num_threads(0);
}

// ---------------------------------------------------------------------------------- exp

TEST(KernelsSimd, ExpMatchesStdExp) {
  double worst = 0;
  for (float x = -86.6f; x <= 88.72f; x += 0.01234f) {
    const double want = std::exp(static_cast<double>(x));
    const double got = k::detail::exp1(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // about 2 ulp
  EXPECT_EQ(k::detail::exp1(-kInf), 0.0f);
  EXPECT_EQ(k::detail::exp1(-200.0f), 0.0f);
  EXPECT_EQ(k::detail::exp1(-87.0f), 0.0f);  // flushed below -86.64, never a denormal
  EXPECT_GT(k::detail::exp1(-86.6f), 0.0f);
  EXPECT_EQ(k::detail::exp1(kInf), kInf);
  EXPECT_EQ(k::detail::exp1(100.0f), kInf);
  EXPECT_TRUE(std::isfinite(k::detail::exp1(88.72f)));
  EXPECT_TRUE(std::isnan(k::detail::exp1(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(k::detail::exp1(0.0f), 1.0f);
}

// ---------------------------------------------------------------------------------- softmax

// The building blocks every kernel's sums go through, on the build's widest batch (16 lanes
// with AVX-512, where xsimd 8.1's own fma is two roundings and its haddp misplaces rows).
TEST(KernelsSimd, FusedMultiplyAddRoundsOnce) {
  using B = k::detail::fbatch;
  const auto a = randn(B::size, 7), b = randn(B::size, 8), c = randn(B::size, 9);
  alignas(64) float add[B::size], sub[B::size], nadd[B::size];
  const B x = B::load_unaligned(a.data()), y = B::load_unaligned(b.data()), z = B::load_unaligned(c.data());
  k::detail::fmadd(x, y, z).store_aligned(add);
  k::detail::fmsub(x, y, z).store_aligned(sub);
  k::detail::fnmadd(x, y, z).store_aligned(nadd);
  for (std::size_t i = 0; i < B::size; ++i) {
    EXPECT_EQ(add[i], std::fma(a[i], b[i], c[i])) << i;
    EXPECT_EQ(sub[i], std::fma(a[i], b[i], -c[i])) << i;
    EXPECT_EQ(nadd[i], std::fma(-a[i], b[i], c[i])) << i;
  }
}

// n batches of small integers (every order of summing them is exact) and each one's sum.
void integer_rows(k::detail::fbatch* rows, float* want, std::size_t n) {
  using B = k::detail::fbatch;
  for (std::size_t r = 0; r < n; ++r) {
    alignas(64) float v[B::size];
    want[r] = 0;
    for (std::size_t i = 0; i < B::size; ++i) {
      v[i] = static_cast<float>(r * 1000 + i * 7 + 1);
      want[r] += v[i];
    }
    rows[r] = B::load_aligned(v);
  }
}

TEST(KernelsSimd, HaddpPutsEachRowsSumInItsLane) {
  using B = k::detail::fbatch;
  constexpr std::size_t W = B::size;
  B rows[W];
  float want[W];
  integer_rows(rows, want, W);
  alignas(64) float got[W];
  k::detail::haddp(rows).store_aligned(got);
  for (std::size_t r = 0; r < W; ++r) EXPECT_EQ(got[r], want[r]) << "row " << r;
}

TEST(KernelsSimd, Hsum8PutsEachRowsSumInItsSlot) {
  k::detail::fbatch rows[8];
  float want[8];
  integer_rows(rows, want, 8);
  float got[9];
  got[8] = -99.f;
  k::detail::hsum8(rows, got);
  for (std::size_t r = 0; r < 8; ++r) EXPECT_EQ(got[r], want[r]) << "row " << r;
  EXPECT_EQ(got[8], -99.f) << "wrote past the eighth sum";
}

TEST(KernelsSoftmax, MatchesReference) {
  std::vector<std::ptrdiff_t> sizes = kOddSizes;
  sizes.push_back(32000);
  for (std::ptrdiff_t cols : sizes) {
    const std::ptrdiff_t rows = cols >= 32000 ? 2 : 5;
    const auto x = randn(rows * cols, 1 + cols, 3.0f);
    std::vector<float> y(x.size()), want(x.size());
    k::softmax_rows(x.data(), y.data(), rows, cols);
    ref::softmax_rows(x.data(), want.data(), rows, cols);
    expect_close(y, want, 2e-6, 1e-12, "softmax cols=" + std::to_string(cols));

    k::log_softmax_rows(x.data(), y.data(), rows, cols);
    ref::log_softmax_rows(x.data(), want.data(), rows, cols);
    expect_close(y, want, 1e-6, 1e-5, "log_softmax cols=" + std::to_string(cols));

    auto inplace = x;  // in place
    k::softmax_rows(inplace.data(), inplace.data(), rows, cols);
    ref::softmax_rows(x.data(), want.data(), rows, cols);
    expect_close(inplace, want, 2e-6, 1e-12, "softmax in place");
  }
}

TEST(KernelsSoftmax, LargeLogitsAreStable) {
  std::vector<float> x = {1000.0f, 999.0f, -1000.0f, 998.0f, 1000.0f, 0.0f, 3.0f, 1e30f, -1e30f};
  std::vector<float> y(x.size()), want(x.size());
  k::softmax_rows(x.data(), y.data(), 1, 9);
  ref::softmax_rows(x.data(), want.data(), 1, 9);
  expect_close(y, want, 1e-6, 1e-30, "softmax large");
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

TEST(KernelsSoftmax, MaskedAndFullyMaskedRows) {
  const std::ptrdiff_t rows = 4, cols = 19;
  auto x = randn(rows * cols, 7);
  for (std::ptrdiff_t j = 0; j < cols; j += 3) x[j] = -kInf;          // row 0: some masked
  for (std::ptrdiff_t j = 0; j < cols; ++j) x[cols + j] = -kInf;      // row 1: fully masked
  for (std::ptrdiff_t j = 1; j < cols; ++j) x[2 * cols + j] = -kInf;  // row 2: one survivor
  std::vector<float> y(x.size()), want(x.size());
  k::softmax_rows(x.data(), y.data(), rows, cols);
  ref::softmax_rows(x.data(), want.data(), rows, cols);
  expect_close(y, want, 2e-6, 1e-12, "masked softmax");
  for (std::ptrdiff_t j = 0; j < cols; j += 3) EXPECT_EQ(y[j], 0.0f);
  for (std::ptrdiff_t j = 0; j < cols; ++j) EXPECT_EQ(y[cols + j], 0.0f) << "fully masked row must be 0, not NaN";
  EXPECT_EQ(y[2 * cols], 1.0f);
  for (float v : y) EXPECT_FALSE(std::isnan(v));

  k::log_softmax_rows(x.data(), y.data(), rows, cols);
  ref::log_softmax_rows(x.data(), want.data(), rows, cols);
  expect_close(y, want, 1e-6, 1e-5, "masked log_softmax");
  for (std::ptrdiff_t j = 0; j < cols; ++j) EXPECT_EQ(y[cols + j], -kInf);
  EXPECT_EQ(y[2 * cols], 0.0f);

  // Backward through masked rows: no NaN, masked entries get zero (softmax) or dy (log_softmax).
  const auto dy = randn(x.size(), 8);
  std::vector<float> p(x.size()), dx(x.size());
  k::softmax_rows(x.data(), p.data(), rows, cols);
  k::softmax_backward_rows(p.data(), dy.data(), dx.data(), rows, cols);
  for (std::ptrdiff_t j = 0; j < cols; ++j) EXPECT_EQ(dx[cols + j], 0.0f);
  for (float v : dx) EXPECT_FALSE(std::isnan(v));
  k::log_softmax_rows(x.data(), p.data(), rows, cols);
  k::log_softmax_backward_rows(p.data(), dy.data(), dx.data(), rows, cols);
  for (std::ptrdiff_t j = 0; j < cols; j += 3) EXPECT_FLOAT_EQ(dx[j], dy[j]);
  for (float v : dx) EXPECT_FALSE(std::isnan(v));
}

TEST(KernelsSoftmax, BackwardMatchesReference) {
  for (std::ptrdiff_t cols : {1, 7, 8, 9, 31, 1000, 32000}) {
    const std::ptrdiff_t rows = cols >= 32000 ? 2 : 3;
    const auto x = randn(rows * cols, 11 + cols, 2.0f);
    const auto dy = randn(x.size(), 12 + cols);
    std::vector<float> y(x.size()), dx(x.size()), want(x.size());
    k::softmax_rows(x.data(), y.data(), rows, cols);
    k::softmax_backward_rows(y.data(), dy.data(), dx.data(), rows, cols);
    ref::softmax_backward_rows(y.data(), dy.data(), want.data(), rows, cols);
    expect_close(dx, want, 1e-5, 1e-7, "softmax_backward cols=" + std::to_string(cols));

    k::log_softmax_rows(x.data(), y.data(), rows, cols);
    k::log_softmax_backward_rows(y.data(), dy.data(), dx.data(), rows, cols);
    ref::log_softmax_backward_rows(y.data(), dy.data(), want.data(), rows, cols);
    expect_close(dx, want, 1e-5, 1e-4, "log_softmax_backward cols=" + std::to_string(cols));
  }
}

TEST(KernelsSoftmax, BackwardMatchesFiniteDifferences) {
  for (std::ptrdiff_t cols : {1, 7, 9, 33}) {
    const std::ptrdiff_t rows = 3;
    auto x = randn(rows * cols, 21 + cols, 1.5f);
    x[1] = -kInf;  // a masked entry: FD never moves it off -Inf by a finite h
    auto w = to_double(randn(x.size(), 22 + cols));
    w[1] = 0;  // L skips the -Inf output, so its weight (= dy) is 0
    const std::vector<float> wf(w.begin(), w.end());
    std::vector<float> y(x.size()), dx(x.size());

    for (bool log : {false, true}) {
      if (log) {
        k::log_softmax_rows(x.data(), y.data(), rows, cols);
        k::log_softmax_backward_rows(y.data(), wf.data(), dx.data(), rows, cols);
      } else {
        k::softmax_rows(x.data(), y.data(), rows, cols);
        k::softmax_backward_rows(y.data(), wf.data(), dx.data(), rows, cols);
      }
      auto L = [&](const std::vector<double>& xd) {
        std::vector<double> yd(xd.size());
        if (log) ref::log_softmax_rows(xd.data(), yd.data(), rows, cols);
        else ref::softmax_rows(xd.data(), yd.data(), rows, cols);
        return weighted_sum(w, yd);
      };
      auto num = numeric_grad(to_double(x), L);
      expect_close(dx, num, 1e-4, 2e-5, log ? "log_softmax FD" : "softmax FD");
    }
  }
}

// ---------------------------------------------------------------------------------- cross-entropy

template <class Label>
void check_cross_entropy_vs_reference() {
  for (std::ptrdiff_t vocab : {1, 7, 9, 1000, 32000}) {
    const std::ptrdiff_t rows = 4;
    const auto logits = randn(rows * vocab, 31 + vocab, 2.0f);
    std::vector<Label> labels = {0, static_cast<Label>(vocab - 1), -100, static_cast<Label>(vocab / 2)};
    std::vector<float> loss(rows), d(logits.size()), want_loss(rows), want_d(logits.size());
    const float scale = 1.0f / 3.0f;
    const auto valid = k::cross_entropy_rows(logits.data(), rows, vocab, labels.data(), loss.data(), d.data(), scale);
    const auto want_valid =
        ref::cross_entropy_rows(logits.data(), rows, vocab, labels.data(), want_loss.data(), want_d.data(), scale);
    EXPECT_EQ(valid, 3);
    EXPECT_EQ(valid, want_valid);
    expect_close(loss, want_loss, 1e-6, 2e-6, "ce loss vocab=" + std::to_string(vocab));
    expect_close(d, want_d, 2e-6, 1e-9, "ce grad vocab=" + std::to_string(vocab));
    EXPECT_EQ(loss[2], 0.0f);

    // Without a gradient, and in place (dlogits == logits).
    std::vector<float> loss2(rows);
    k::cross_entropy_rows(logits.data(), rows, vocab, labels.data(), loss2.data());
    EXPECT_TRUE(bit_equal(loss, loss2));
    auto inplace = logits;
    k::cross_entropy_rows(inplace.data(), rows, vocab, labels.data(), loss2.data(), inplace.data(), scale);
    EXPECT_TRUE(bit_equal(loss, loss2));
    EXPECT_TRUE(bit_equal(d, inplace));
  }
}

TEST(KernelsCrossEntropy, MatchesReferenceInt32) { check_cross_entropy_vs_reference<std::int32_t>(); }
TEST(KernelsCrossEntropy, MatchesReferenceInt64) { check_cross_entropy_vs_reference<std::int64_t>(); }

TEST(KernelsCrossEntropy, GradientMatchesFiniteDifferences) {
  const std::ptrdiff_t rows = 3, vocab = 13;
  const auto logits = randn(rows * vocab, 41, 1.5f);
  const std::vector<std::int64_t> labels = {4, -100, 12};
  std::vector<float> loss(rows), d(logits.size());
  k::cross_entropy_rows(logits.data(), rows, vocab, labels.data(), loss.data(), d.data(), 0.5f);
  auto L = [&](const std::vector<double>& x) {
    std::vector<double> l(rows);
    ref::cross_entropy_rows(x.data(), rows, vocab, labels.data(), l.data());
    return 0.5 * (l[0] + l[1] + l[2]);
  };
  expect_close(d, numeric_grad(to_double(logits), L), 1e-4, 2e-5, "ce FD");
}

TEST(KernelsCrossEntropy, MaskedLogitsAndBadLabels) {
  const std::ptrdiff_t vocab = 10;
  std::vector<float> logits(2 * vocab, -kInf);
  logits[3] = 1.0f;  // row 0: one finite logit, the label
  std::vector<std::int32_t> labels = {3, 5};
  std::vector<float> loss(2), d(logits.size(), 42.0f);
  k::cross_entropy_rows(logits.data(), 2, vocab, labels.data(), loss.data(), d.data());
  EXPECT_EQ(loss[0], 0.0f);
  EXPECT_EQ(loss[1], kInf);  // fully masked row
  for (float v : d) EXPECT_EQ(v, 0.0f);

  labels = {3, 10};
  EXPECT_THROW(k::cross_entropy_rows(logits.data(), 2, vocab, labels.data(), loss.data()), edl::Error);
  labels = {-1, 0};
  try {
    k::cross_entropy_rows(logits.data(), 2, vocab, labels.data(), loss.data());
    FAIL() << "expected edl::Error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("labels[0] = -1"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------- rms_norm

TEST(KernelsRmsNorm, ForwardMatchesReference) {
  for (std::ptrdiff_t cols : kOddSizes) {
    const std::ptrdiff_t rows = 6;
    const auto x = randn(rows * cols, 51 + cols, 2.0f);
    const auto w = randn(cols, 52 + cols);
    std::vector<float> y(x.size()), want(x.size()), ir(rows);
    std::vector<double> want_ir(rows);
    k::rms_norm_forward(x.data(), w.data(), y.data(), ir.data(), rows, cols, 1e-5f);
    ref::rms_norm_forward(x.data(), w.data(), want.data(), want_ir.data(), rows, cols, 1e-5);
    expect_close(y, want, 2e-6, 1e-7, "rms_norm y cols=" + std::to_string(cols));
    expect_close(ir, want_ir, 1e-6, 0, "rms_norm inv_rms");

    auto inplace = x;
    k::rms_norm_forward(inplace.data(), w.data(), inplace.data(), static_cast<float*>(nullptr), rows, cols, 1e-5f);
    EXPECT_TRUE(bit_equal(inplace, y));

    // bf16 storage: computed in f32 from the widened inputs, rounded once.
    std::vector<bf16> xb(x.size()), wb(cols), yb(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xb[i] = bf16(x[i]);
    for (std::ptrdiff_t j = 0; j < cols; ++j) wb[j] = bf16(w[j]);
    k::rms_norm_forward(xb.data(), wb.data(), yb.data(), ir.data(), rows, cols, 1e-5f);
    std::vector<float> xw(x.size()), ww(cols), yw(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xw[i] = xb[i].to_float();
    for (std::ptrdiff_t j = 0; j < cols; ++j) ww[j] = wb[j].to_float();
    ref::rms_norm_forward(xw.data(), ww.data(), want.data(), want_ir.data(), rows, cols, 1e-5);
    for (std::size_t i = 0; i < x.size(); ++i) yw[i] = yb[i].to_float();
    expect_close(yw, want, 1.0 / 128, 1e-6, "rms_norm bf16");
  }
}

TEST(KernelsRmsNorm, BackwardMatchesReference) {
  for (std::ptrdiff_t cols : kOddSizes) {
    for (std::ptrdiff_t rows : {1, 33, 70}) {
      const auto x = randn(rows * cols, 61 + cols, 2.0f);
      const auto w = randn(cols, 62 + cols);
      const auto dy = randn(x.size(), 63 + cols);
      std::vector<float> y(x.size()), ir(rows), dx(x.size()), want_dx(x.size());
      std::vector<float> dw(cols, 0.25f), want_dw(cols, 0.25f);  // accumulated into
      k::rms_norm_forward(x.data(), w.data(), y.data(), ir.data(), rows, cols, 1e-6f);
      k::rms_norm_backward(x.data(), w.data(), ir.data(), dy.data(), dx.data(), dw.data(), rows, cols);
      const std::vector<double> ird(ir.begin(), ir.end());
      ref::rms_norm_backward(x.data(), w.data(), ird.data(), dy.data(), want_dx.data(), want_dw.data(), rows, cols);
      const std::string what = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
      expect_close(dx, want_dx, 1e-5, 1e-5, "rms_norm dx " + what);
      expect_close(dw, want_dw, 1e-5, 1e-4, "rms_norm dweight " + what);

      // dx may alias dy; dweight may be null.
      auto alias = dy;
      k::rms_norm_backward(x.data(), w.data(), ir.data(), alias.data(), alias.data(), static_cast<float*>(nullptr),
                           rows, cols);
      EXPECT_TRUE(bit_equal(alias, dx)) << what;
    }
  }
}

TEST(KernelsRmsNorm, BackwardMatchesFiniteDifferences) {
  const std::ptrdiff_t rows = 3, cols = 11;
  const double eps = 1e-5;
  const auto x = randn(rows * cols, 71, 1.5f);
  const auto w = randn(cols, 72);
  const auto r = to_double(randn(x.size(), 73));  // L = sum(r * y)
  const std::vector<float> rf(r.begin(), r.end());
  std::vector<float> y(x.size()), ir(rows), dx(x.size()), dw(cols, 0.0f);
  k::rms_norm_forward(x.data(), w.data(), y.data(), ir.data(), rows, cols, static_cast<float>(eps));
  k::rms_norm_backward(x.data(), w.data(), ir.data(), rf.data(), dx.data(), dw.data(), rows, cols);

  const auto wd = to_double(w);
  auto Lx = [&](const std::vector<double>& xd) {
    std::vector<double> yd(xd.size());
    ref::rms_norm_forward(xd.data(), wd.data(), yd.data(), static_cast<double*>(nullptr), rows, cols, eps);
    return weighted_sum(r, yd);
  };
  expect_close(dx, numeric_grad(to_double(x), Lx), 1e-4, 1e-5, "rms_norm dx FD");
  const auto xd = to_double(x);
  auto Lw = [&](const std::vector<double>& wv) {
    std::vector<double> yd(xd.size());
    ref::rms_norm_forward(xd.data(), wv.data(), yd.data(), static_cast<double*>(nullptr), rows, cols, eps);
    return weighted_sum(r, yd);
  };
  expect_close(dw, numeric_grad(wd, Lw), 1e-4, 1e-5, "rms_norm dweight FD");
}

// ---------------------------------------------------------------------------------- activations

TEST(KernelsActivations, ForwardMatchesReference) {
  for (std::ptrdiff_t n : {1, 7, 8, 9, 31, 1000, 100000}) {
    auto x = randn(n, 81 + n, 4.0f);
    if (n > 8) x[3] = -120.0f, x[4] = 120.0f;  // saturated sigmoid
    const auto u = randn(n, 82 + n);
    std::vector<float> y(n), want(n);
    k::silu(x.data(), y.data(), n);
    ref::silu(x.data(), want.data(), n);
    expect_close(y, want, 2e-6, 1e-7, "silu");
    k::silu_mul(x.data(), u.data(), y.data(), n);
    ref::silu_mul(x.data(), u.data(), want.data(), n);
    expect_close(y, want, 2e-6, 1e-7, "silu_mul");
    k::gelu_tanh(x.data(), y.data(), n);
    ref::gelu_tanh(x.data(), want.data(), n);
    expect_close(y, want, 2e-6, 1e-6, "gelu_tanh");
    for (float v : y) EXPECT_FALSE(std::isnan(v));
  }
}

TEST(KernelsActivations, BackwardMatchesReferenceAndFiniteDifferences) {
  for (std::ptrdiff_t n : {1, 7, 9, 31, 1000}) {
    const auto x = randn(n, 91 + n, 3.0f);
    const auto u = randn(n, 92 + n);
    const auto dy = randn(n, 93 + n);
    std::vector<float> dx(n), want(n), dg(n), du(n), want_dg(n), want_du(n);
    const auto xd = to_double(x), ud = to_double(u), dyd = to_double(dy);
    const double h = 1e-5;
    auto fd = [&](auto f) {  // elementwise: d/dx_i sum dy * f(x) = dy_i * f'(x_i)
      std::vector<double> g(n);
      for (std::ptrdiff_t i = 0; i < n; ++i) g[i] = dyd[i] * (f(xd[i] + h, i) - f(xd[i] - h, i)) / (2 * h);
      return g;
    };
    auto silu1 = [](double v, std::ptrdiff_t) { double y; ref::silu(&v, &y, 1); return y; };
    auto gelu1 = [](double v, std::ptrdiff_t) { double y; ref::gelu_tanh(&v, &y, 1); return y; };
    auto swiglu_g = [&](double v, std::ptrdiff_t i) { double y; ref::silu_mul(&v, &ud[i], &y, 1); return y; };

    k::silu_backward(x.data(), dy.data(), dx.data(), n);
    ref::silu_backward(x.data(), dy.data(), want.data(), n);
    expect_close(dx, want, 1e-5, 1e-6, "silu_backward");
    expect_close(dx, fd(silu1), 1e-4, 1e-6, "silu_backward FD");

    k::gelu_tanh_backward(x.data(), dy.data(), dx.data(), n);
    ref::gelu_tanh_backward(x.data(), dy.data(), want.data(), n);
    expect_close(dx, want, 1e-5, 1e-6, "gelu_tanh_backward");
    expect_close(dx, fd(gelu1), 1e-4, 1e-6, "gelu_tanh_backward FD");

    k::silu_mul_backward(x.data(), u.data(), dy.data(), dg.data(), du.data(), n);
    ref::silu_mul_backward(x.data(), u.data(), dy.data(), want_dg.data(), want_du.data(), n);
    expect_close(dg, want_dg, 1e-5, 1e-6, "silu_mul_backward d_gate");
    expect_close(du, want_du, 1e-5, 1e-6, "silu_mul_backward d_up");
    expect_close(dg, fd(swiglu_g), 1e-4, 1e-6, "silu_mul d_gate FD");
    std::vector<double> fd_up(n);
    for (std::ptrdiff_t i = 0; i < n; ++i) fd_up[i] = dyd[i] * silu1(xd[i], i);  // linear in up
    expect_close(du, fd_up, 1e-5, 1e-6, "silu_mul d_up");

    // In place: d_gate over gate, d_up over up.
    auto g2 = x, u2 = u;
    k::silu_mul_backward(g2.data(), u2.data(), dy.data(), g2.data(), u2.data(), n);
    EXPECT_TRUE(bit_equal(g2, dg));
    EXPECT_TRUE(bit_equal(u2, du));
  }
}

// GeGLU (Gemma's gated_mul with the tanh GELU): forward against the reference gelu times up,
// backward against it and finite differences; softcap_row against c tanh(x / c) and its
// derivative; the (1 + w) RMSNorm against the plain one with w + 1.
TEST(KernelsActivations, GeGluSoftcapAndOffsetNorm) {
  const auto gelu_tanh = k::GatedActivation::gelu_tanh;
  for (std::ptrdiff_t n : {1, 7, 9, 31, 1000}) {
    const auto x = randn(n, 101 + n, 3.0f), u = randn(n, 102 + n), dy = randn(n, 103 + n);
    std::vector<float> y(n), want(n), dg(n), du(n);
    k::gated_mul(gelu_tanh, x.data(), u.data(), y.data(), n);
    ref::gelu_tanh(x.data(), want.data(), n);
    for (std::ptrdiff_t i = 0; i < n; ++i) want[i] *= u[i];
    expect_close(y, want, 2e-6, 1e-6, "gated_mul gelu_tanh");
    auto r = x;
    k::gated_mul_range(gelu_tanh, r.data(), u.data(), 0, n);
    EXPECT_TRUE(bit_equal(r, y));
    k::gated_mul_backward(gelu_tanh, x.data(), u.data(), dy.data(), dg.data(), du.data(), n);
    const double h = 1e-5;
    std::vector<double> fd_g(n), fd_u(n);
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      const auto f = [&](double v) { double g; ref::gelu_tanh(&v, &g, 1); return g; };
      fd_g[i] = double(dy[i]) * double(u[i]) * (f(double(x[i]) + h) - f(double(x[i]) - h)) / (2 * h);
      fd_u[i] = double(dy[i]) * f(double(x[i]));
    }
    expect_close(dg, fd_g, 1e-4, 1e-6, "gated_mul_backward d_gate FD");
    expect_close(du, fd_u, 1e-5, 1e-6, "gated_mul_backward d_up");

    auto c = x;
    std::vector<float> dfac(n);
    k::softcap_row(c.data(), dfac.data(), n, 2.5f);
    std::vector<double> want_c(n), want_d(n);
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      const double t = std::tanh(double(x[i]) / 2.5);
      want_c[i] = 2.5 * t;
      want_d[i] = 1 - t * t;
    }
    expect_close(c, want_c, 1e-6, 1e-6, "softcap_row");
    expect_close(dfac, want_d, 1e-6, 1e-6, "softcap_row derivative");
  }
  const std::ptrdiff_t rows = 3, cols = 37;
  const auto xn = randn(rows * cols, 111), w = randn(cols, 112, 0.3f);
  auto w1 = w;
  for (float& v : w1) v += 1.0f;
  std::vector<float> y(rows * cols), want(rows * cols);
  k::rms_norm_forward(xn.data(), w.data(), y.data(), static_cast<float*>(nullptr), rows, cols, 1e-6f, 1.0f);
  k::rms_norm_forward(xn.data(), w1.data(), want.data(), static_cast<float*>(nullptr), rows, cols, 1e-6f);
  EXPECT_TRUE(bit_equal(y, want));
}

// ---------------------------------------------------------------------------------- elementwise

TEST(KernelsElementwise, LaneWiseOpsMatchReference) {
  for (std::ptrdiff_t n : {0, 1, 7, 8, 9, 31, 1000, 100003}) {
    const auto a = randn(n, 101 + n), b = randn(n, 102 + n);
    std::vector<float> out(n), want(n);
    k::add(a.data(), b.data(), out.data(), n);
    ref::add(a.data(), b.data(), want.data(), n);
    EXPECT_TRUE(bit_equal(out, want)) << "add is exact";
    k::mul(a.data(), b.data(), out.data(), n);
    ref::mul(a.data(), b.data(), want.data(), n);
    EXPECT_TRUE(bit_equal(out, want)) << "mul is exact";
    out = a;
    k::add_inplace(out.data(), b.data(), n);
    ref::add(a.data(), b.data(), want.data(), n);
    EXPECT_TRUE(bit_equal(out, want));
    out = a;
    want = a;
    k::axpy(-0.37f, b.data(), out.data(), n);
    ref::axpy(static_cast<double>(-0.37f), b.data(), want.data(), n);
#if defined(__FMA__)
    EXPECT_TRUE(bit_equal(out, want)) << "axpy rounds once (fma)";
#else
    expect_close(out, want, 1e-6, 1e-7, "axpy");  // no FMA in this build: two roundings
#endif
    out = a;
    k::scale(out.data(), 0.5f, n);
    for (std::ptrdiff_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] * 0.5f);
    k::scale(a.data(), 3.0f, out.data(), n);
    for (std::ptrdiff_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] * 3.0f);
    k::fill(out.data(), 2.5f, n);
    for (float v : out) ASSERT_EQ(v, 2.5f);

    std::vector<bf16> ab(n), bb(n), ob(n);
    for (std::ptrdiff_t i = 0; i < n; ++i) ab[i] = bf16(a[i]), bb[i] = bf16(b[i]);
    k::add(ab.data(), bb.data(), ob.data(), n);
    for (std::ptrdiff_t i = 0; i < n; ++i) ASSERT_EQ(ob[i], bf16(ab[i].to_float() + bb[i].to_float()));
  }
}

TEST(KernelsElementwise, ReductionsMatchReference) {
  for (std::ptrdiff_t n : {0, 1, 7, 8, 9, 31, 1000, 8192, 8193, 1000003}) {
    const auto a = randn(n, 111 + n), b = randn(n, 112 + n);
    double abs_dot = 0;
    for (std::ptrdiff_t i = 0; i < n; ++i) abs_dot += std::abs(static_cast<double>(a[i]) * b[i]);
    EXPECT_NEAR(k::dot(a.data(), b.data(), n), ref::dot(a.data(), b.data(), n), 1e-6 * abs_dot + 1e-30) << n;
    const double ss = ref::sum_squares(a.data(), n);
    EXPECT_NEAR(k::sum_squares(a.data(), n), ss, 1e-6 * ss + 1e-30) << n;
  }
}

TEST(KernelsElementwise, ConvertIsBitIdenticalToScalar) {
  edl::exec::set_flush_denormals();  // the conversions must not depend on FTZ/DAZ
  // Every 16-bit pattern widened to f32.
  std::vector<bf16> all_b(65536);
  std::vector<f16> all_h(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    all_b[i] = bf16::from_bits(static_cast<std::uint16_t>(i));
    all_h[i] = f16::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<float> fb(65536), fh(65536);
  k::convert(all_b.data(), fb.data(), 65536);
  k::convert(all_h.data(), fh.data(), 65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(fb[i]), std::bit_cast<std::uint32_t>(all_b[i].to_float())) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(fh[i]), std::bit_cast<std::uint32_t>(all_h[i].to_float())) << i;
  }
  // f32 -> bf16 / f16 on random bit patterns, specials and f16's subnormal/overflow edges.
  std::mt19937 g(5);
  std::vector<float> src;
  for (int i = 0; i < 200000; ++i) src.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(g())));
  for (int i = 0; i < 200000; ++i) src.push_back(std::ldexp(std::uniform_real_distribution<float>(-2, 2)(g), -(i % 40)));
  for (float v : {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65519.99f, 65520.0f,
                  std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25), std::ldexp(1.0f, -14),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()})
    src.push_back(v);
  std::vector<bf16> ob(src.size());
  std::vector<f16> oh(src.size());
  k::convert(src.data(), ob.data(), static_cast<std::ptrdiff_t>(src.size()));
  k::convert(src.data(), oh.data(), static_cast<std::ptrdiff_t>(src.size()));
  for (std::size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(ob[i].bits, bf16(src[i]).bits) << std::hex << std::bit_cast<std::uint32_t>(src[i]);
    ASSERT_EQ(oh[i].bits, f16(src[i]).bits) << std::hex << std::bit_cast<std::uint32_t>(src[i]);
  }
  // bf16 <-> f16 directly.
  std::vector<f16> bh(65536);
  k::convert(all_b.data(), bh.data(), 65536);
  for (std::uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(bh[i].bits, f16(all_b[i].to_float()).bits) << i;
}

// ---------------------------------------------------------------------------------- determinism

TEST(KernelsDeterminism, BitIdenticalForOneAndTwoThreads) {
  const std::ptrdiff_t rows = 200, cols = 1031, vocab = 32000, ce_rows = 8, n = 3000017;
  const auto x = randn(rows * cols, 121), dy = randn(rows * cols, 122), w = randn(cols, 123);
  const auto logits = randn(ce_rows * vocab, 124, 3.0f);
  std::vector<std::int32_t> labels(ce_rows);
  for (std::ptrdiff_t r = 0; r < ce_rows; ++r) labels[r] = static_cast<std::int32_t>(r * 3999);
  const auto a = randn(n, 125), b = randn(n, 126);

  struct Out {
    std::vector<float> sm, lsm, smb, y, ir, dx, dw, ce_loss, ce_d, act, dg, du;
    float dot = 0, ss = 0;
  };
  auto run = [&] {
    Out o;
    o.sm.resize(x.size());
    o.lsm.resize(x.size());
    o.smb.resize(x.size());
    k::softmax_rows(x.data(), o.sm.data(), rows, cols);
    k::log_softmax_rows(x.data(), o.lsm.data(), rows, cols);
    k::softmax_backward_rows(o.sm.data(), dy.data(), o.smb.data(), rows, cols);
    o.y.resize(x.size());
    o.ir.resize(rows);
    o.dx.resize(x.size());
    o.dw.assign(cols, 1.0f);
    k::rms_norm_forward(x.data(), w.data(), o.y.data(), o.ir.data(), rows, cols, 1e-5f);
    k::rms_norm_backward(x.data(), w.data(), o.ir.data(), dy.data(), o.dx.data(), o.dw.data(), rows, cols);
    o.ce_loss.resize(ce_rows);
    o.ce_d.resize(logits.size());
    k::cross_entropy_rows(logits.data(), ce_rows, vocab, labels.data(), o.ce_loss.data(), o.ce_d.data(), 0.125f);
    o.act.resize(n);
    o.dg.resize(n);
    o.du.resize(n);
    k::silu_mul(a.data(), b.data(), o.act.data(), n);
    k::silu_mul_backward(a.data(), b.data(), b.data(), o.dg.data(), o.du.data(), n);
    o.dot = k::dot(a.data(), b.data(), n);
    o.ss = k::sum_squares(a.data(), n);
    return o;
  };
  Out one, two;
  with_threads(1, [&] { one = run(); });
  with_threads(2, [&] { two = run(); });
  EXPECT_TRUE(bit_equal(one.sm, two.sm));
  EXPECT_TRUE(bit_equal(one.lsm, two.lsm));
  EXPECT_TRUE(bit_equal(one.smb, two.smb));
  EXPECT_TRUE(bit_equal(one.y, two.y));
  EXPECT_TRUE(bit_equal(one.ir, two.ir));
  EXPECT_TRUE(bit_equal(one.dx, two.dx));
  EXPECT_TRUE(bit_equal(one.dw, two.dw));
  EXPECT_TRUE(bit_equal(one.ce_loss, two.ce_loss));
  EXPECT_TRUE(bit_equal(one.ce_d, two.ce_d));
  EXPECT_TRUE(bit_equal(one.act, two.act));
  EXPECT_TRUE(bit_equal(one.dg, two.dg));
  EXPECT_TRUE(bit_equal(one.du, two.du));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(one.dot), std::bit_cast<std::uint32_t>(two.dot));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(one.ss), std::bit_cast<std::uint32_t>(two.ss));
}

// ---------------------------------------------------------------------------------- arguments

template <class F>
void expect_arg_error(F&& f, const std::string& kernel, const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << "expected edl::Error from " << kernel;
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::invalid_argument) << e.what();
    EXPECT_EQ(e.where(), "kernels." + kernel) << e.what();
    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
  }
}

TEST(KernelsArguments, BadArgumentsThrow) {
  std::vector<float> v(64, 1.0f);
  float* p = v.data();
  float* null = nullptr;
  expect_arg_error([&] { k::softmax_rows(null, p, 2, 3); }, "softmax_rows", "x is null");
  expect_arg_error([&] { k::softmax_rows(p, null, 2, 3); }, "softmax_rows", "y is null");
  expect_arg_error([&] { k::softmax_rows(p, p, -1, 3); }, "softmax_rows", "rows = -1");
  expect_arg_error([&] { k::log_softmax_rows(p, p, 2, -3); }, "log_softmax_rows", "cols = -3");
  expect_arg_error([&] { k::softmax_backward_rows(p, null, p, 2, 3); }, "softmax_backward_rows", "dy is null");
  expect_arg_error([&] { k::log_softmax_backward_rows(p, p, null, 2, 3); }, "log_softmax_backward_rows", "dx is null");
  expect_arg_error([&] { k::rms_norm_forward(p, null, p, p, 2, 3, 1e-5f); }, "rms_norm_forward", "weight is null");
  expect_arg_error([&] { k::rms_norm_forward(p, p, p, p, 2, 3, -1.0f); }, "rms_norm_forward", "eps");
  expect_arg_error([&] { k::rms_norm_backward(p, p, null, p, p, p, 2, 3); }, "rms_norm_backward", "inv_rms is null");
  expect_arg_error([&] { k::silu(null, p, 5); }, "silu", "x is null");
  expect_arg_error([&] { k::silu_mul(p, p, p, -2); }, "silu_mul", "n = -2");
  expect_arg_error([&] { k::silu_mul_backward(p, p, p, null, p, 4); }, "silu_mul_backward", "d_gate is null");
  expect_arg_error([&] { k::add(p, null, p, 4); }, "add", "b is null");
  expect_arg_error([&] { k::axpy(1.0f, null, p, 4); }, "axpy", "x is null");
  expect_arg_error([&] { (void)k::dot(p, p, -1); }, "dot", "n = -1");
  expect_arg_error([&] { (void)k::sum_squares(null, 3); }, "sum_squares", "x is null");
  expect_arg_error([&] { k::convert(p, static_cast<bf16*>(nullptr), 3); }, "convert", "dst is null");
  std::vector<std::int32_t> labels = {0, 1};
  expect_arg_error([&] { k::cross_entropy_rows(p, 2, 3, labels.data(), null); }, "cross_entropy_rows",
                   "loss_per_row is null");
  expect_arg_error([&] { k::cross_entropy_rows(p, 2, -3, labels.data(), p); }, "cross_entropy_rows", "vocab = -3");

  // Null is fine for zero elements.
  EXPECT_NO_THROW(k::softmax_rows(null, null, 0, 5));
  EXPECT_NO_THROW(k::add(null, null, null, 0));
  EXPECT_EQ(k::dot(null, null, 0), 0.0f);
}

}  // namespace

// round_to<T> rounds in place as a trip through T's storage does (edl::from_f32, round to
// nearest even), for every length (the vector body and the tail), NaN and Inf included.
template <class T>
void expect_round_to_is_a_trip_through(std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> x(1000);
  for (auto& v : x) {
    std::uint32_t bits = g();
    std::memcpy(&v, &bits, sizeof v);
  }
  const float specials[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            1.00390625f /* a bf16 tie */, 1.001953125f};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(17), x.size()}) {
    std::vector<float> got(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
    k::round_to<T>(got.data(), static_cast<std::ptrdiff_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
      const float want = edl::to_f32(edl::from_f32<T>(x[i]));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
        continue;
      }
      std::uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "n " << n << ", x[" << i << "] = " << x[i];
    }
  }
  std::vector<float> same(x);
  k::round_to<float>(same.data(), static_cast<std::ptrdiff_t>(same.size()));
  EXPECT_EQ(0, std::memcmp(same.data(), x.data(), x.size() * sizeof(float)));
}

TEST(KernelsElementwise, RoundToIsATripThroughTheStorageType) {
  expect_round_to_is_a_trip_through<bf16>(1);
  expect_round_to_is_a_trip_through<f16>(2);
}
