#include <gtest/gtest.h>

#include <cmath>

#include <edl/nn/loss.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

namespace {

struct LossSetup {
  std::int64_t B = 2, S = 7, H = 6, V = 13;
  std::vector<float> hidden, W;
  std::vector<std::int64_t> labels;
  LossSetup() {
    hidden = randn(B * S * H, 1);
    W = randn(V * H, 2, 0.7f);
    labels = {3, 5, -100, 12, 0, 7, 7, 1, 2, 2, 9, -100, -100, 4};
  }
  nn::LossMetrics run(const nn::LossOptions& o, std::vector<float>* dh = nullptr, std::vector<float>* dw = nullptr) {
    if (dh) dh->assign(hidden.size(), 0.f);
    if (dw) dw->assign(W.size(), 0.f);
    return nn::causal_lm_loss(hidden.data(), B, S, H, W.data(), V, labels.data(), o, dh ? dh->data() : nullptr,
                              dw ? dw->data() : nullptr);
  }
};

/// Double reference: mean over shifted, non-ignored targets of CE with smoothing and z-loss.
double naive_loss(const LossSetup& st, double eps, double zc, std::int64_t* count) {
  double sum = 0;
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < st.B; ++b)
    for (std::int64_t s = 0; s + 1 < st.S; ++s) {
      const std::int64_t l = st.labels[b * st.S + s + 1];
      if (l == -100) continue;
      std::vector<double> x(st.V);
      for (std::int64_t v = 0; v < st.V; ++v)
        for (std::int64_t h = 0; h < st.H; ++h) x[v] += double(st.hidden[(b * st.S + s) * st.H + h]) * st.W[v * st.H + h];
      double m = *std::max_element(x.begin(), x.end()), z = 0, mean = 0;
      for (double xv : x) z += std::exp(xv - m), mean += xv / st.V;
      const double lse = m + std::log(z);
      sum += (1 - eps) * (lse - x[l]) + eps * (lse - mean) + zc * lse * lse;
      ++n;
    }
  *count = n;
  return n ? sum / n : 0.0;
}

}  // namespace

TEST(NnLoss, MatchesNaiveWithShiftAndIgnoreIndex) {
  LossSetup st;
  std::int64_t n = 0;
  const double want = naive_loss(st, 0, 0, &n);
  const auto m = st.run({});
  EXPECT_EQ(m.tokens, n);
  EXPECT_EQ(n, 9);  // 12 shifted targets, 3 of them -100
  EXPECT_NEAR(m.loss, want, 1e-5);
  EXPECT_NEAR(m.perplexity, std::exp(want), 1e-4 * std::exp(want));
  EXPECT_EQ(m.z_loss, 0.0);
  EXPECT_GE(m.accuracy, 0.0);
  EXPECT_LE(m.accuracy, 1.0);
}

TEST(NnLoss, ChunkedEqualsUnchunkedLossAndGradients) {
  LossSetup st;
  std::vector<float> dh_full, dw_full, dh, dw;
  nn::LossOptions o;
  o.chunk_rows = 1 << 20;
  const auto full = st.run(o, &dh_full, &dw_full);
  for (std::int64_t chunk : {1, 2, 3, 5, 13, 14}) {
    o.chunk_rows = chunk;
    const auto m = st.run(o, &dh, &dw);
    EXPECT_NEAR(m.loss, full.loss, 1e-6) << chunk;
    EXPECT_EQ(m.tokens, full.tokens);
    EXPECT_EQ(m.accuracy, full.accuracy);
    for (std::size_t i = 0; i < dh.size(); ++i) EXPECT_NEAR(dh[i], dh_full[i], 1e-6) << chunk;
    for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], dw_full[i], 1e-6) << chunk;
  }
}

TEST(NnLoss, GradientsMatchFiniteDifferencesWithZLossAndSmoothing) {
  LossSetup st;
  nn::LossOptions o;
  o.chunk_rows = 4;
  o.z_loss = 1e-2f;
  o.label_smoothing = 0.1f;
  std::int64_t n = 0;
  std::vector<float> dh, dw;
  const auto m = st.run(o, &dh, &dw);
  EXPECT_NEAR(m.loss, naive_loss(st, 0.1, 1e-2, &n), 1e-5);
  EXPECT_GT(m.z_loss, 0.0);
  auto loss = [&] { return st.run(o).loss; };
  expect_fd("dhidden", st.hidden.data(), st.hidden.size(), dh.data(), loss, 40, 1e-2f, 1e-2);
  expect_fd("dW", st.W.data(), st.W.size(), dw.data(), loss, 40, 1e-2f, 1e-2);
}

TEST(NnLoss, AllIgnoredGivesZeroWithoutNaN) {
  LossSetup st;
  std::fill(st.labels.begin(), st.labels.end(), -100);
  std::vector<float> dh, dw;
  const auto m = st.run({}, &dh, &dw);
  EXPECT_EQ(m.loss, 0.0);
  EXPECT_EQ(m.tokens, 0);
  EXPECT_EQ(m.perplexity, 1.0);
  for (float v : dh) EXPECT_EQ(v, 0.0f);
  for (float v : dw) EXPECT_EQ(v, 0.0f);
}

TEST(NnLoss, BadLabelThrows) {
  LossSetup st;
  st.labels[3] = 13;
  EXPECT_THROW(st.run({}), Error);
}
