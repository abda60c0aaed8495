#include <gtest/gtest.h>

#include <edl/core/exec.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/param.hpp>
#include <edl/nn/rms_norm.hpp>

using namespace edl;

TEST(NnParam, GradIsLazyF32AndZeroGradClears) {
  nn::Param<bf16, P<"tp", none>> p({3, 4});
  static_assert(std::is_same_v<decltype(p.grad)::value_type, float>);
  EXPECT_FALSE(p.has_grad());
  p.grad_data()[5] = 2.0f;
  EXPECT_TRUE(p.has_grad());
  EXPECT_EQ(p.grad(1, 1), 2.0f);
  p.zero_grad();
  EXPECT_EQ(p.grad(1, 1), 0.0f);
  EXPECT_EQ(p.numel(), 12);
}

TEST(NnParam, InitIsCounterBasedAndPerParameter) {
  nn::ColumnLinear<DefaultPolicy> a(6, 5, true), b(6, 5, true);
  a.init(Key::from_seed(7), 0.02f);
  b.init(Key::from_seed(7), 0.02f);
  EXPECT_TRUE(a.weight.value == b.weight.value);
  // Element i of parameter k is element i of fold_in(key, k)'s normal stream.
  const Key k0 = fold_in(Key::from_seed(7), 0);
  EXPECT_FLOAT_EQ(a.weight.data()[13], 0.02f * normal_at(k0, 13));
  for (int j = 0; j < 5; ++j) EXPECT_EQ(a.bias.value(j), 0.0f);
  nn::RMSNorm<DefaultPolicy> n(4);
  n.init(Key::from_seed(1));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(n.weight.value(j), 1.0f);
  b.init(Key::from_seed(8), 0.02f);
  EXPECT_FALSE(a.weight.value == b.weight.value);
}

TEST(NnParam, InitOnOneThreadEqualsInitOnTwo) {
  // Larger than one fill chunk (2^16), so the chunks of a parameter split between threads.
  nn::ColumnLinear<DefaultPolicy> a(300, 500, true), b(300, 500, true);
  exec::set_num_threads(1);
  a.init(Key::from_seed(4), 0.02f);
  exec::set_num_threads(2);
  b.init(Key::from_seed(4), 0.02f);
  exec::set_num_threads(0);
  EXPECT_TRUE(a.weight.value == b.weight.value);
  EXPECT_FLOAT_EQ(a.weight.data()[300 * 500 - 1], 0.02f * normal_at(fold_in(Key::from_seed(4), 0), 300 * 500 - 1));
}

TEST(NnParam, NamedShapes) {
  nn::ColumnLinear<DefaultPolicy> a(6, 5, true);
  auto s = nn::named_shapes(a);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].first, "weight");
  EXPECT_EQ(s[0].second, (std::vector<std::int64_t>{5, 6}));
}

TEST(NnParam, AdvisingHugePagesKeepsEveryParameter) {
  // A 6 MiB weight and a small bias: the advice covers whole 2 MiB blocks of their merged
  // range (at most the two tensors and the gap between them) and changes no value.
  nn::ColumnLinear<DefaultPolicy> a(1024, 1536, true);
  a.init(Key::from_seed(3), 0.02f);
  const auto w = a.weight.value;
  const auto b = a.bias.value;
  const std::size_t advised = nn::advise_huge_pages(a);
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  EXPECT_EQ(advised % kHuge, 0u);
  EXPECT_LE(advised, (w.size() + b.size()) * sizeof(float) + kHuge);
  EXPECT_TRUE(a.weight.value == w);
  EXPECT_TRUE(a.bias.value == b);
}

// Values start on a cache line whatever their sizes (odd sizes would leave the
// next allocation mid-line under a 16-byte-aligned malloc), so decode's full-vector loads of a
// weight row never straddle two lines.
TEST(NnParam, StorageStartsOnACacheLine) {
  std::vector<nn::Param<float, P<none, none>>> fs;
  std::vector<nn::Param<bf16, P<none>>> hs;
  for (std::size_t n = 1; n <= 9; ++n) {
    fs.emplace_back(std::array<std::size_t, 2>{n, 3});
    hs.emplace_back(std::array<std::size_t, 1>{n});
  }
  for (auto& p : fs) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % kCacheLineBytes, 0u);
  for (auto& p : hs) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % kCacheLineBytes, 0u);
}
