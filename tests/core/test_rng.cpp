#include <edl/core/rng.hpp>

#include <cmath>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace {

TEST(Threefry2x32, MatchesRandom123KnownAnswers) {
  // Known-answer vectors of Threefry-2x32-20 from Random123's kat_vectors.
  auto a = edl::threefry2x32({0u, 0u}, 0u, 0u);
  EXPECT_EQ(a[0], 0x6b200159u);
  EXPECT_EQ(a[1], 0x99ba4efeu);
  auto b = edl::threefry2x32({0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b[0], 0x1cb996fcu);
  EXPECT_EQ(b[1], 0xbb002be7u);
  auto c = edl::threefry2x32({0x13198a2eu, 0x03707344u}, 0x243f6a88u, 0x85a308d3u);
  EXPECT_EQ(c[0], 0xc4923a9cu);
  EXPECT_EQ(c[1], 0x483df7a0u);
}

TEST(Key, SplittingTheSameWayGivesIdenticalStreams) {
  const edl::Key root = edl::Key::from_seed(42);
  auto s1 = edl::split(root, 4), s2 = edl::split(root, 4);
  ASSERT_EQ(s1, s2);
  EXPECT_EQ(edl::fold_in(s1[2], 7), edl::fold_in(s2[2], 7));
  std::vector<float> x(100), y(100);
  edl::fill_normal(edl::fold_in(s1[3], 1), 0, x);
  edl::fill_normal(edl::fold_in(s2[3], 1), 0, y);
  EXPECT_EQ(x, y);
}

TEST(Key, SplitKeysAreDistinctFromEachOtherAndFromFolds) {
  const edl::Key root = edl::Key::from_seed(1);
  auto ks = edl::split(root, 64);
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
  for (auto k : ks) seen.insert({k.k0, k.k1});
  for (std::uint32_t i = 0; i < 64; ++i) {
    auto f = edl::fold_in(root, i);
    seen.insert({f.k0, f.k1});
  }
  EXPECT_EQ(seen.size(), 128u);
}

TEST(Key, ElementStreamIsIndexLocalSoShardsAgree) {
  // A shard [a, b) filled from its global offset equals that slice of the whole stream.
  const edl::Key k = edl::Key::from_seed(3);
  std::vector<float> whole(1000);
  edl::fill_uniform(k, 0, whole);
  for (std::uint64_t a : {0u, 1u, 333u, 999u}) {
    std::vector<float> part(1000 - a);
    edl::fill_uniform(k, a, part);
    for (std::size_t j = 0; j < part.size(); ++j) ASSERT_EQ(part[j], whole[a + j]);
  }
}

TEST(Key, NormalIsBoxMullerOfTheCountersTwoIAndTwoIPlusOne) {
  // The definition, from random_bits_at (normal_at computes both words in one cipher call).
  const edl::Key k = edl::Key::from_seed(5);
  for (std::uint64_t i : {0ull, 1ull, 2ull, 77ull, 65535ull, 65536ull, (1ull << 32) + 3, (1ull << 40) + 1}) {
    const std::uint32_t b0 = edl::random_bits_at(k, 2 * i), b1 = edl::random_bits_at(k, 2 * i + 1);
    const double u1 = (static_cast<double>(b0 >> 8) + 1.0) / 16777216.0;
    const double u2 = static_cast<double>(b1 >> 8) / 16777216.0;
    const float want = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    ASSERT_EQ(edl::normal_at(k, i), want) << "element " << i;
  }
}

TEST(Key, UniformAndNormalHaveTheirMoments) {
  const edl::Key k = edl::Key::from_seed(11);
  const std::size_t n = 200000;
  std::vector<float> u(n), g(n);
  edl::fill_uniform(k, 0, u);
  edl::fill_normal(edl::fold_in(k, 1), 0, g);
  double su = 0, sg = 0, sg2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_GE(u[i], 0.0f);
    ASSERT_LT(u[i], 1.0f);
    su += u[i];
    sg += g[i];
    sg2 += double(g[i]) * g[i];
  }
  // Standard errors: uniform mean 0.29/sqrt(n) ~ 6.5e-4, normal mean 1/sqrt(n) ~ 2.2e-3.
  EXPECT_NEAR(su / n, 0.5, 4e-3);
  EXPECT_NEAR(sg / n, 0.0, 1.2e-2);
  EXPECT_NEAR(sg2 / n, 1.0, 1.5e-2);
}

}  // namespace
