// Tests of the FMA peak measurement (kernels/peak.hpp). Speed is never asserted: what is
// checked is that the measured loops compute what they claim (each chain against a naive
// std::fma loop or its closed form, bit for bit), that a measurement is a finite positive
// number, that bf16 / int8 are reported exactly when the build has their instructions, and
// the argument check.
#include <edl/kernels/peak.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace p = edl::kernels::peak_detail;

/// Whether the build's float batches have a fused multiply-add (x86 FMA3 or AVX-512, Arm);
/// without one (plain SSE2) xsimd computes x * y + z with two roundings, and so does the reference.
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
constexpr bool kFused = true;
#else
constexpr bool kFused = false;
#endif

float step(float acc) {
  if (kFused) return std::fma(acc, p::kMul, p::kAdd);
  volatile float product = acc * p::kMul;  // rounded on its own, never contracted
  return product + p::kAdd;
}

/// The f32 chain computed one lane at a time (one rounding per step with an FMA, as the kernel).
std::vector<float> naive_fma_chain(std::int64_t iterations) {
  std::vector<float> out(p::kAccumulators * p::kLanes);
  for (std::size_t j = 0; j < p::kAccumulators; ++j)
    for (std::size_t l = 0; l < p::kLanes; ++l) {
      float acc = p::chain_start(j, l);
      for (std::int64_t i = 0; i < iterations; ++i) acc = step(acc);
      out[j * p::kLanes + l] = acc;
    }
  return out;
}

TEST(Peak, FmaChainEqualsNaiveFmaLoopBitForBit) {
  for (std::int64_t n : {0, 1, 2, 7, 100, 5000}) {
    const auto got = p::fma_chain(n), want = naive_fma_chain(n);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "iterations = " << n;
  }
}

TEST(Peak, FmaChainStartsDistinctAndConvergesToOne) {
  const auto start = p::fma_chain(0);
  for (std::size_t i = 1; i < start.size(); ++i) EXPECT_NE(start[i], start[i - 1]) << i;
  // acc = acc * (1 - 2^-10) + 2^-10 has fixed point 1; from (0.5, 1) it stays a normal float.
  for (float x : p::fma_chain(200000)) {
    EXPECT_TRUE(std::isnormal(x));
    EXPECT_NEAR(x, 1.0f, 1e-3f);
  }
}

TEST(Peak, FmaChainFlopsCountTwoPerLanePerFma) {
  EXPECT_EQ(p::fma_chain_flops(1000), 2.0 * static_cast<double>(p::kLanes) * 12.0 * 1000.0);
}

#if defined(__AVX512BF16__)
TEST(Peak, Bf16ChainMatchesClosedForm) {
  for (std::int64_t n : {0, 1, 3, 1000}) {
    const auto got = p::bf16_chain(n);
    ASSERT_EQ(got.size(), p::kAccumulators * 16);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], static_cast<float>(i / 16) + 0.5f * static_cast<float>(n)) << "iterations = " << n << ", lane " << i;
  }
  EXPECT_EQ(p::bf16_chain_flops(10), 2.0 * 32.0 * 12.0 * 10.0);
}
#endif

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
TEST(Peak, Int8ChainMatchesClosedForm) {
  for (std::int64_t n : {0, 1, 3, 1000}) {
    const auto got = p::int8_chain(n);
    ASSERT_EQ(got.size(), p::kAccumulators * p::kInt32Lanes);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], static_cast<std::int32_t>(i / p::kInt32Lanes) + 4 * n) << "iterations = " << n << ", lane " << i;
  }
  EXPECT_EQ(p::int8_chain_ops(10), 2.0 * static_cast<double>(p::kInt8Products) * 12.0 * 10.0);
}
#endif

TEST(Peak, MeasurementIsFinitePositiveAndReportsExactlyTheBuildsKinds) {
  const auto r = edl::kernels::measure_peak(1);
  EXPECT_TRUE(std::isfinite(r.f32_gflops));
  EXPECT_GT(r.f32_gflops, 0.0);
#if defined(__AVX512BF16__)
  ASSERT_TRUE(r.bf16_gflops.has_value());
  EXPECT_TRUE(std::isfinite(*r.bf16_gflops));
  EXPECT_GT(*r.bf16_gflops, 0.0);
#else
  EXPECT_FALSE(r.bf16_gflops.has_value());
#endif
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
  ASSERT_TRUE(r.int8_gops.has_value());
  EXPECT_TRUE(std::isfinite(*r.int8_gops));
  EXPECT_GT(*r.int8_gops, 0.0);
#else
  EXPECT_FALSE(r.int8_gops.has_value());
#endif
  EXPECT_EQ(p::kHaveBf16, r.bf16_gflops.has_value());
  EXPECT_EQ(p::kHaveInt8, r.int8_gops.has_value());
}

TEST(Peak, RejectsFewerThanOneThread) {
  try {
    (void)edl::kernels::measure_peak(0);
    FAIL() << "expected edl::Error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("threads = 0, expected >= 1"), std::string::npos) << e.what();
  }
}

}  // namespace
