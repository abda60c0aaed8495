// tests/kernels/test_quant_dot.cpp: the SIMD dot products of quantized blocks against their
// written-out definitions (kernels::reference), bit for bit, and against the f32 dot product
// of the dequantized values within the activations' rounding.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <edl/core/allocator.hpp>
#include <edl/kernels/quant_dot.hpp>

using namespace edl;

namespace {
std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(QuantDot, ActivationsQuantizeAsTheReference) {
  for (const std::int64_t K : {32, 160, 2048}) {
    std::vector<float> x = normal_values(static_cast<std::size_t>(K), 5);
    if (K == 160) {
      for (int i = 32; i < 64; ++i) x[static_cast<std::size_t>(i)] = 0.f;  // a zero block
      x[64] = 127.f;                                                         // ties: d = 1
      for (int i = 65; i < 96; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i - 80) + 0.5f;
      for (int i = 96; i < 128; ++i) x[static_cast<std::size_t>(i)] *= 1e-4f;  // d a subnormal f16
      for (int i = 128; i < 160; ++i) x[static_cast<std::size_t>(i)] *= 1e7f;  // d past f16's range
    }
    const std::size_t nb = static_cast<std::size_t>(K / 32);
    std::vector<quant::BlockQ8_0> a(nb), b(nb);
    kernels::quantize_activations(x.data(), a.data(), K);
    quant::quantize_activations_ref(x.data(), b.data(), K);
    // In one go into the blocks the dot products read: the reference's blocks, prepared.
    std::vector<kernels::ActivationBlock> xa(nb), want(nb);
    kernels::quantize_activations(x.data(), xa.data(), K);
    for (std::size_t i = 0; i < nb; ++i) kernels::prepare_activation(b[i], want[i]);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].d, b[i].d) << "block " << i;
      for (int j = 0; j < 32; ++j) EXPECT_EQ(a[i].qs[j], b[i].qs[j]) << "block " << i << " value " << j;
      EXPECT_EQ(std::memcmp(xa[i].qs, want[i].qs, 32), 0) << "block " << i;
      EXPECT_EQ(std::memcmp(xa[i].neg8_lane_sums, want[i].neg8_lane_sums, 32), 0) << "block " << i;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(xa[i].d), std::bit_cast<std::uint32_t>(want[i].d)) << "block " << i;
    }
  }
}

TEST(QuantDot, Int8DotsEqualTheirDefinition) {
  std::printf("quantized dot path: %s\n", kernels::quant_dot_path);
  for (const std::int64_t K : {32, 64, 160, 4096}) {  // one, two, an odd and many blocks
    const std::int64_t nb = K / 32;
    const std::vector<float> w = normal_values(static_cast<std::size_t>(K), 6), x = normal_values(static_cast<std::size_t>(K), 7);
    std::vector<quant::BlockQ8_0> w8(static_cast<std::size_t>(nb)), xq(static_cast<std::size_t>(nb));
    std::vector<quant::BlockQ4_0> w4(static_cast<std::size_t>(nb));
    quant::quantize_row_q8_0(w.data(), w8.data(), K);
    quant::quantize_row_q4_0(w.data(), w4.data(), K);
    quant::quantize_activations_ref(x.data(), xq.data(), K);
    if (K == 160) w8[1].qs[3] = -128;  // the one int8 value quantization never makes
    std::vector<kernels::ActivationBlock> xa(static_cast<std::size_t>(nb)), xb(xa.size());
    for (std::int64_t b = 0; b < nb; ++b) kernels::prepare_activation(xq[static_cast<std::size_t>(b)], xa[static_cast<std::size_t>(b)]);
    kernels::quantize_activations(x.data(), xb.data(), K);  // the same blocks, prepared in one go
    for (std::int64_t b = 0; b < nb; ++b) {
      EXPECT_EQ(std::memcmp(xa[static_cast<std::size_t>(b)].qs, xb[static_cast<std::size_t>(b)].qs, 32), 0);
      EXPECT_EQ(std::memcmp(xa[static_cast<std::size_t>(b)].neg8_lane_sums, xb[static_cast<std::size_t>(b)].neg8_lane_sums, 32), 0);
      EXPECT_EQ(xa[static_cast<std::size_t>(b)].d, xb[static_cast<std::size_t>(b)].d);
    }
    EXPECT_EQ(kernels::dot_q8_0(w8.data(), xa.data(), nb), kernels::reference::dot_int8(w8.data(), xq.data(), nb)) << K;
    EXPECT_EQ(kernels::dot_q4_0(w4.data(), xa.data(), nb), kernels::reference::dot_int8(w4.data(), xq.data(), nb)) << K;
#if defined(EDL_QUANT_ZMM)
    // The activations paired once for all rows (what decode's matrix-vector product does).
    aligned_vector<kernels::ActivationPair> pairs(static_cast<std::size_t>((nb + 1) / 2));
    kernels::pair_activations(xa.data(), nb, pairs.data());
    EXPECT_EQ(kernels::dot_q4_0(w4.data(), pairs.data(), nb), kernels::reference::dot_int8(w4.data(), xq.data(), nb)) << K;
#endif
    // Against the dequantized values in double: the integer sums are exact, so only the f32
    // accumulation of the block terms differs.
    std::vector<float> wd(static_cast<std::size_t>(K)), xd(static_cast<std::size_t>(K));
    quant::dequantize_row_q8_0(xq.data(), xd.data(), K);
    for (const bool four : {false, true}) {
      if (four) quant::dequantize_row_q4_0(w4.data(), wd.data(), K);
      else quant::dequantize_row_q8_0(w8.data(), wd.data(), K);
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(wd[static_cast<std::size_t>(k)]) * xd[static_cast<std::size_t>(k)];
        mag += std::fabs(static_cast<double>(wd[static_cast<std::size_t>(k)]) * xd[static_cast<std::size_t>(k)]);
      }
      const float got = four ? kernels::dot_q4_0(w4.data(), xa.data(), nb) : kernels::dot_q8_0(w8.data(), xa.data(), nb);
      EXPECT_NEAR(got, s, 1e-6 * mag + 1e-6) << K << (four ? " q4_0" : " q8_0");
    }
  }
}

// A q4_0 row that ends where a page nobody may read begins: the dot reads whole vectors where
// they stay inside the row and no byte past its end (a byte beyond would fault here), and
// still equals its definition for every block count, odd and even.
TEST(QuantDot, Q4_0RowAtTheEndOfReadableMemory) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<char*>(map) + page, page, PROT_NONE), 0);
  for (std::int64_t nb = 1; nb <= 24; ++nb) {
    const std::int64_t K = nb * 32;
    const std::vector<float> w = normal_values(static_cast<std::size_t>(K), 11), x = normal_values(static_cast<std::size_t>(K), 12);
    auto* row = reinterpret_cast<quant::BlockQ4_0*>(static_cast<char*>(map) + page - nb * sizeof(quant::BlockQ4_0));
    quant::quantize_row_q4_0(w.data(), row, K);
    std::vector<quant::BlockQ8_0> xq(static_cast<std::size_t>(nb));
    quant::quantize_activations_ref(x.data(), xq.data(), K);
    std::vector<kernels::ActivationBlock> xa(static_cast<std::size_t>(nb));
    kernels::quantize_activations(x.data(), xa.data(), K);
    EXPECT_EQ(kernels::dot_q4_0(row, xa.data(), nb), kernels::reference::dot_int8(row, xq.data(), nb)) << nb << " blocks";
#if defined(EDL_QUANT_ZMM)
    aligned_vector<kernels::ActivationPair> pairs(static_cast<std::size_t>((nb + 1) / 2));
    kernels::pair_activations(xa.data(), nb, pairs.data());
    EXPECT_EQ(kernels::dot_q4_0(row, pairs.data(), nb), kernels::reference::dot_int8(row, xq.data(), nb)) << nb << " blocks, paired";
#endif
  }
  munmap(map, 2 * page);
}

TEST(QuantDot, Nf4DotEqualsItsDefinition) {
  for (const std::int64_t K : {64, 640}) {
    const std::int64_t nb = K / 64;
    const std::vector<float> w = normal_values(static_cast<std::size_t>(K), 8), x = normal_values(static_cast<std::size_t>(K), 9);
    std::vector<float> absmax(static_cast<std::size_t>(nb));
    for (std::int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < 64; ++i) absmax[static_cast<std::size_t>(b)] = std::max(absmax[static_cast<std::size_t>(b)], std::fabs(w[static_cast<std::size_t>(b * 64 + i)]));
    std::vector<quant::BlockNF4> q(static_cast<std::size_t>(nb));
    quant::quantize_row_nf4(w.data(), absmax.data(), q.data(), K);
    const float got = kernels::dot_nf4(q.data(), absmax.data(), x.data(), nb);
    EXPECT_EQ(got, (kernels::reference::dot_nf4<kernels::kNF4Lanes>(q.data(), absmax.data(), x.data(), nb))) << K;
    std::vector<float> wd(static_cast<std::size_t>(K));
    quant::dequantize_row_nf4(q.data(), absmax.data(), wd.data(), K);
    double s = 0, mag = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      s += static_cast<double>(wd[static_cast<std::size_t>(k)]) * x[static_cast<std::size_t>(k)];
      mag += std::fabs(static_cast<double>(wd[static_cast<std::size_t>(k)]) * x[static_cast<std::size_t>(k)]);
    }
    EXPECT_NEAR(got, s, 1e-5 * mag) << K;
  }
}
