#include <gtest/gtest.h>

#include <cmath>

#include <edl/nn/rotary.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnRotary, DefaultInvFreqAndRotateHalfConvention) {
  const std::int64_t D = 8;
  nn::RotaryEmbedding rope(D, {.theta = 10000.0});
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(rope.inv_freq()[i], std::pow(10000.0, -2.0 * i / 8));
  std::vector<std::int64_t> pos = {0, 5, 17};
  nn::TokenLayout lay{1, 3, pos.data()};
  std::vector<float> cs, sn;
  rope.tables(lay, cs, sn);
  auto x = randn(3 * 2 * D, 1);  // 3 tokens, 2 heads
  auto y = x;
  rope.apply(y.data(), 3, 2, cs.data(), sn.data());
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        const double a = pos[t] * std::pow(10000.0, -2.0 * i / 8);
        const float* v = x.data() + (t * 2 + h) * D;
        const float* w = y.data() + (t * 2 + h) * D;
        EXPECT_NEAR(w[i], v[i] * std::cos(a) - v[i + 4] * std::sin(a), 1e-5);
        EXPECT_NEAR(w[i + 4], v[i + 4] * std::cos(a) + v[i] * std::sin(a), 1e-5);
      }
  // The backward is the inverse rotation (R is orthogonal): R^T R x = x.
  rope.backward(y.data(), 3, 2, cs.data(), sn.data());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(NnRotary, BackwardIsTransposeByFiniteDifferences) {
  const std::int64_t D = 6, T = 4, Hh = 2;
  nn::RotaryEmbedding rope(D, {.theta = 100.0});
  nn::TokenLayout lay{2, 2};
  std::vector<float> cs, sn;
  rope.tables(lay, cs, sn);
  auto x = randn(T * Hh * D, 3);
  auto c = randn(T * Hh * D, 4);
  auto dx = c;
  rope.backward(dx.data(), T, Hh, cs.data(), sn.data());
  auto loss = [&] {
    auto y = x;
    rope.apply(y.data(), T, Hh, cs.data(), sn.data());
    return functional(y.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss, 48);
}

TEST(NnRotary, LinearScalingDividesPositions) {
  nn::RotaryEmbedding lin(8, {.theta = 10000.0, .type = "linear", .factor = 4.0});
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(lin.inv_freq()[i], std::pow(10000.0, -2.0 * i / 8) / 4.0);
}

TEST(NnRotary, Llama3ScalingMatchesClosedForm) {
  // Llama 3.1: theta 500000, head_dim 128, factor 8, low 1, high 4, original context 8192.
  nn::RopeConfig c{.theta = 500000.0, .type = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                   .high_freq_factor = 4.0, .original_max_position_embeddings = 8192};
  nn::RotaryEmbedding r(128, c);
  const double pi = std::acos(-1.0);
  int low = 0, high = 0, mid = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128), wl = 2 * pi / f;
    double want;
    if (wl < 8192.0 / 4) {  // short wavelengths: unchanged
      want = f;
      ++high;
    } else if (wl > 8192.0 / 1) {  // long wavelengths: divided by factor
      want = f / 8;
      ++low;
    } else {  // in between: linear interpolation in 1/wavelength
      const double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 8 + s * f;
      ++mid;
    }
    EXPECT_NEAR(r.inv_freq()[i], want, 1e-15 * std::max(1.0, want)) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(mid, 0);
  EXPECT_DOUBLE_EQ(r.inv_freq()[0], 1.0);
  // Continuity at the band edges: the smoothed value equals f at wl = 8192/4 and f/8 at 8192.
}

TEST(NnRotary, RejectsOddHeadDimAndUnknownType) {
  EXPECT_THROW(nn::RotaryEmbedding(5), Error);
  EXPECT_THROW(nn::RotaryEmbedding(4, {.type = "yarn"}), Error);
}
