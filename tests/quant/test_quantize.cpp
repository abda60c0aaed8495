// tests/quant/test_quantize.cpp: the block formats' quantize/dequantize against their
// definitions: the largest value of a block lands on the format's extreme code, every value
// comes back within half a step, codes are the nearest (nf4, the dynamic map), and the bytes
// are ggml's layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <edl/quant/quantize.hpp>

using namespace edl;

namespace {
std::vector<float> normal_values(std::size_t n, unsigned seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(Quantize, Q8_0ScalesEachBlockToItsLargestMagnitude) {
  const std::int64_t K = 256;
  const std::vector<float> x = normal_values(K, 1);
  std::vector<quant::BlockQ8_0> q(K / 32);
  quant::quantize_row_q8_0(x.data(), q.data(), K);
  std::vector<float> y(K);
  quant::dequantize_row_q8_0(q.data(), y.data(), K);
  for (std::int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.f;
    int arg = 0;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[b * 32 + i]) > amax) amax = std::fabs(x[b * 32 + i]), arg = i;
    EXPECT_EQ(q[b].d, f16(amax / 127.f));
    EXPECT_EQ(std::abs(q[b].qs[arg]), 127);
    const float d = q[b].d.to_float();
    for (int i = 0; i < 32; ++i) {
      // Half a step of rounding, plus the f16 rounding of d (relative 2^-11) times |q| <= 127.
      EXPECT_LE(std::fabs(y[b * 32 + i] - x[b * 32 + i]), 0.5f * amax / 127.f + 127.f * d * 0x1p-11f) << b << " " << i;
      EXPECT_EQ(y[b * 32 + i], d * q[b].qs[i]);
    }
  }
}

TEST(Quantize, Q8_0RoundsHalfAwayFromZeroAndKeepsZeroBlocks) {
  std::vector<float> x(32, 0.f);
  quant::BlockQ8_0 q;
  quant::quantize_row_q8_0(x.data(), &q, 32);
  EXPECT_EQ(q.d.bits, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q.qs[i], 0);
  // amax 127: d = 1, so x = 2.5 is a tie that roundf takes away from zero (3), -2.5 to -3.
  x[0] = 127.f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f;
  quant::quantize_row_q8_0(x.data(), &q, 32);
  EXPECT_EQ(q.qs[1], 3);
  EXPECT_EQ(q.qs[2], -3);
  EXPECT_EQ(q.qs[3], 1);
  // The activations' rounding goes to even.
  quant::quantize_activations_ref(x.data(), &q, 32);
  EXPECT_EQ(q.qs[1], 2);
  EXPECT_EQ(q.qs[2], -2);
  EXPECT_EQ(q.qs[3], 0);
}

TEST(Quantize, Q4_0HasGgmlsNibbleOrderAndScale) {
  const std::int64_t K = 128;
  const std::vector<float> x = normal_values(K, 2);
  std::vector<quant::BlockQ4_0> q(K / 32);
  quant::quantize_row_q4_0(x.data(), q.data(), K);
  std::vector<float> y(K);
  quant::dequantize_row_q4_0(q.data(), y.data(), K);
  for (std::int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.f, m = 0.f;
    int arg = 0;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[b * 32 + i]) > amax) amax = std::fabs(x[b * 32 + i]), m = x[b * 32 + i], arg = i;
    EXPECT_EQ(q[b].d, f16(m / -8.f));
    EXPECT_EQ(quant::q4_0_value(q[b], arg), -8);  // the largest magnitude is the code 0
    const float d = q[b].d.to_float();
    for (int i = 0; i < 32; ++i) {
      const std::uint8_t byte = q[b].qs[i % 16];
      const int nibble = i < 16 ? byte & 15 : byte >> 4;  // value j low, j + 16 high
      EXPECT_EQ(y[b * 32 + i], d * static_cast<float>(nibble - 8));
      // Within half a step, except at the clamped top code (15 stands for 7.5 .. 8 steps).
      EXPECT_LE(std::fabs(y[b * 32 + i] - x[b * 32 + i]), std::fabs(d) * (nibble == 15 ? 1.0f : 0.5f) + 8.f * std::fabs(d) * 0x1p-11f)
          << b << " " << i;
    }
  }
}

TEST(Quantize, Nf4CodesAreTheNearestLevels) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(quant::nf4_code(quant::kNF4Levels[static_cast<std::size_t>(i)]), i);
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int t = 0; t < 2000; ++t) {
    const float v = u(g);
    const int c = quant::nf4_code(v);
    for (int i = 0; i < 16; ++i)
      EXPECT_LE(std::fabs(v - quant::kNF4Levels[static_cast<std::size_t>(c)]),
                std::fabs(v - quant::kNF4Levels[static_cast<std::size_t>(i)]))
          << v;
  }
  // Packing: the first value of a pair in the high nibble.
  std::vector<float> x(64, 0.f), absmax{1.f};
  x[0] = -1.f, x[1] = 1.f;
  quant::BlockNF4 blk;
  quant::quantize_row_nf4(x.data(), absmax.data(), &blk, 64);
  EXPECT_EQ(blk.qs[0], 0x0F);
  EXPECT_EQ(blk.qs[1], 0x77);
}

TEST(Quantize, DynamicMapIsBitsandbytesSigned8BitMap) {
  const auto& m = quant::dynamic_map();
  EXPECT_FLOAT_EQ(m.front(), -0.99296875f);  // -(0.9859375 + 1) / 2, the last midpoint of i = 6
  EXPECT_EQ(m.back(), 1.0f);
  for (std::size_t i = 1; i < m.size(); ++i) EXPECT_LT(m[i - 1], m[i]);
  // 0 is a code, and every value maps back to itself.
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(quant::dynamic_code(m[i]), i);
  // Double quantization keeps each absmax within the map's relative step.
  const std::vector<float> absmax = [] {
    auto v = normal_values(600, 4, 0.1f);
    for (float& a : v) a = std::fabs(a) + 0.01f;
    return v;
  }();
  const quant::DoubleQuant dq = quant::DoubleQuant::quantize(absmax);
  ASSERT_EQ(dq.codes.size(), absmax.size());
  ASSERT_EQ(dq.scales.size(), 3u);
  for (std::size_t i = 0; i < absmax.size(); ++i)
    EXPECT_NEAR(dq.value(i), absmax[i], 0.02f * dq.scales[i / 256] + 1e-6f) << i;
}
