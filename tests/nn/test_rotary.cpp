#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

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
  EXPECT_THROW(nn::RotaryEmbedding(4, {.type = "ntk"}), Error);
  // longrope needs head_dim / 2 factors of each kind.
  nn::RopeConfig lr{.type = "longrope"};
  lr.short_factor = {1, 1};
  lr.long_factor = {1, 1, 1};
  EXPECT_THROW(nn::RotaryEmbedding(4, lr), Error);
}

// yarn's attention factor: 0.1 ln(factor) + 1, DeepSeek's ratio of two such terms when mscale and
// mscale_all_dim are both given, 1 for a factor <= 1, and attention_factor as written when set.
TEST(NnRotary, YarnAttentionFactor) {
  nn::RopeConfig c{.theta = 10000.0, .type = "yarn", .factor = 40.0};
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(c), 0.1 * std::log(40.0) + 1);
  c.mscale = 0.707;
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(c), 0.1 * std::log(40.0) + 1);  // needs both
  c.mscale_all_dim = 1.0;
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(c),
                   (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * 1.0 * std::log(40.0) + 1));
  c.factor = 1.0;
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(c), 1.0);
  c.attention_factor = 1.5;
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(c), 1.5);
  // The rotation scales q (and k) by it: |rotated| = m |x|.
  c.factor = 4.0;
  c.attention_factor = 0;
  nn::RotaryEmbedding r(8, c);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, cos(4), sin(4);
  r.angles(r.inv_freq(), 5, cos.data(), sin.data());
  double before = 0, after = 0;
  for (float v : x) before += v * v;
  r.apply(x.data(), 1, 1, cos.data(), sin.data());
  for (float v : x) after += v * v;
  EXPECT_NEAR(std::sqrt(after / before), r.scale(), 1e-6);
}

// dynamic and longrope change with the forward's length L only past their threshold; yarn's ramp
// keeps the fastest frequencies (more than beta_fast turns in the original context) and
// interpolates the slowest (fewer than beta_slow), here without truncating the ramp's ends.
TEST(NnRotary, LengthDependentScalings) {
  nn::RopeConfig dyn{.theta = 10000.0, .type = "dynamic", .factor = 2.0};
  dyn.max_position_embeddings = 16;
  const auto plain = nn::RotaryEmbedding::compute_inv_freq(8, {.theta = 10000.0}, 0);
  EXPECT_EQ(nn::RotaryEmbedding::compute_inv_freq(8, dyn, 16), plain);
  const auto longer = nn::RotaryEmbedding::compute_inv_freq(8, dyn, 32);
  const double theta = 10000.0 * std::pow(2.0 * 32 / 16 - 1, 8.0 / 6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(longer[i], std::pow(theta, -2.0 * i / 8), 1e-15) << i;

  nn::RopeConfig lr{.theta = 10000.0, .type = "longrope", .factor = 8.0, .original_max_position_embeddings = 16};
  lr.short_factor = {1, 2, 3, 4};
  lr.long_factor = {5, 6, 7, 8};
  for (const std::int64_t L : {0, 16, 17}) {
    const auto f = nn::RotaryEmbedding::compute_inv_freq(8, lr, L);
    for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / (L > 16 ? lr.long_factor[i] : lr.short_factor[i]));
  }
  EXPECT_DOUBLE_EQ(nn::RotaryEmbedding::attention_scaling(lr), std::sqrt(1 + std::log(8.0) / std::log(16.0)));

  nn::RopeConfig y{.theta = 10000.0, .type = "yarn", .factor = 4.0, .original_max_position_embeddings = 4096};
  y.truncate = false;
  const auto f = nn::RotaryEmbedding::compute_inv_freq(64, y, 0);
  const auto base = nn::RotaryEmbedding::compute_inv_freq(64, {.theta = 10000.0}, 0);
  const double pi = std::acos(-1.0);
  for (int i = 0; i < 32; ++i) {
    const double turns = 4096 * base[i] / (2 * pi);  // rotations in the original context
    if (turns > 32) {
      EXPECT_DOUBLE_EQ(f[i], base[i]) << i;
    }
    if (turns < 1) {
      EXPECT_DOUBLE_EQ(f[i], base[i] / 4) << i;
    }
    if (turns < 32 && turns > 1) {
      EXPECT_TRUE(f[i] < base[i] && f[i] > base[i] / 4) << i;
    }
  }
}
