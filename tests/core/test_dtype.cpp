#include <edl/core/dtype.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace {

using edl::bf16;
using edl::f16;

float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

TEST(BF16, KnownBitPatterns) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16(-2.0f).bits, 0xc000);
  EXPECT_EQ(bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(bf16(3.140625f).bits, 0x4049);  // exactly representable
  EXPECT_EQ(bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up to Inf
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16(float_of(0x3f808000u)).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(bf16(float_of(0x3f818000u)).bits, 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(bf16(float_of(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(bf16(float_of(0x3f807fffu)).bits, 0x3f80);
}

TEST(BF16, NaNStaysNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(bf16(qnan).to_float()));
  // A signalling NaN whose payload lives only in the low bits must not become Inf.
  const float snan = float_of(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16(snan).to_float()));
  EXPECT_TRUE(std::signbit(bf16(-qnan).to_float()));
}

TEST(BF16, RoundTripOfEveryBitPatternIsExact) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 h = bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16(f).bits, h.bits) << std::hex << b;
  }
}

TEST(F16, KnownBitPatterns) {
  EXPECT_EQ(f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f16(65504.0f).bits, 0x7bff);                  // largest finite
  EXPECT_EQ(f16(65520.0f).bits, 0x7c00);                  // halfway to 65536: ties to even = Inf
  EXPECT_EQ(f16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(f16(std::ldexp(1.0f, -14)).bits, 0x0400);     // smallest normal
  EXPECT_EQ(f16(std::ldexp(1.0f, -24)).bits, 0x0001);     // smallest subnormal
  EXPECT_EQ(f16(std::ldexp(1.0f, -25)).bits, 0x0000);     // halfway to it: ties to even (0)
  EXPECT_EQ(f16(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(f16(0.1f).bits, 0x2e66);
  EXPECT_EQ(f16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(f16(std::numeric_limits<float>::quiet_NaN()).to_float()));
}

TEST(F16, ConversionMatchesDoublePrecisionRounding) {
  // Independent reference: round the float to the nearest f16 value computed in double
  // by enumerating neighbours, ties to even, for a sweep of values across all binades.
  auto reference = [](float x) -> std::uint16_t {
    double best = INFINITY;
    std::uint16_t best_bits = 0;
    for (std::uint32_t b = 0; b < 0x7c00u; ++b) {
      const double v = f16::to_float(static_cast<std::uint16_t>(b));
      const double d = std::fabs(v - std::fabs(static_cast<double>(x)));
      if (d < best || (d == best && (b & 1u) == 0)) { best = d; best_bits = static_cast<std::uint16_t>(b); }
    }
    return static_cast<std::uint16_t>(best_bits | (std::signbit(x) ? 0x8000u : 0u));
  };
  std::uint32_t state = 12345;
  for (int i = 0; i < 300; ++i) {
    state = state * 1664525u + 1013904223u;
    const int e = static_cast<int>(state % 40) - 26;  // 2^-26 .. 2^13
    const float x = std::ldexp(1.0f + static_cast<float>(state >> 9) / 8388608.0f, e) * ((state & 1) ? -1.0f : 1.0f);
    ASSERT_EQ(f16(x).bits, reference(x)) << x;
  }
}

TEST(F16, RoundTripOfEveryBitPatternIsExact) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const f16 h = f16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) continue;
    ASSERT_EQ(f16(f).bits, h.bits) << std::hex << b;
  }
}

TEST(F16, WideningEveryBitPatternGivesItsValue) {
  // Independent reference: sign, exponent and mantissa evaluated in double (IEEE binary16:
  // subnormals m * 2^-24, normals (1024 + m) * 2^(e - 25)); Inf and NaN keep their payload.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const std::uint32_t e = (b >> 10) & 0x1fu, m = b & 0x3ffu;
    const double sign = (b & 0x8000u) ? -1.0 : 1.0;
    const float got = f16::to_float(static_cast<std::uint16_t>(b));
    if (e == 0x1fu) {
      const std::uint32_t want = ((b & 0x8000u) << 16) | 0x7f800000u | (m << 13);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), want) << std::hex << b;
      continue;
    }
    const double v = e == 0 ? std::ldexp(static_cast<double>(m), -24)
                            : std::ldexp(static_cast<double>(1024 + m), static_cast<int>(e) - 25);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(static_cast<float>(sign * v)))
        << std::hex << b;
  }
}

TEST(DType, NamesAndSizesFollowSafetensors) {
  EXPECT_EQ(edl::dtype_name(edl::dtype_v<edl::bf16>), "BF16");
  EXPECT_EQ(edl::dtype_size(edl::DType::f16), 2u);
  EXPECT_EQ(edl::dtype_from_name("I64", "test"), edl::DType::i64);
  try {
    edl::dtype_from_name("F8", "model.safetensors tensor w");
    FAIL() << "expected an edl::Error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::format);
    EXPECT_NE(std::string(e.what()).find("[edl.format.202] model.safetensors tensor w: unknown dtype \"F8\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
