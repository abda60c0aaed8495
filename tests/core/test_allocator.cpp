// tests/core/test_allocator.cpp: huge-page advice covers only whole aligned 2 MiB blocks of
// the range and leaves the contents as they were; CacheLineAllocator blocks start on a line.
#include <edl/core/allocator.hpp>

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace {

TEST(AdviseHugePages, AdvisesOnlyAlignedBlocksInsideTheRangeAndKeepsTheValues) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  std::vector<float> v(5 * kHuge / sizeof(float) + 123);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * 0.5f;
  const std::size_t bytes = v.size() * sizeof(float);
  const std::size_t advised = edl::advise_huge_pages(v.data(), bytes);
  // 0 where the kernel declines (THP off, not Linux); else whole aligned blocks inside the range.
  EXPECT_EQ(advised % kHuge, 0u);
  const auto a = reinterpret_cast<std::uintptr_t>(v.data());
  const std::uintptr_t lo = (a + kHuge - 1) / kHuge * kHuge, hi = (a + bytes) / kHuge * kHuge;
  EXPECT_TRUE(advised == 0 || advised == hi - lo) << advised << " of " << hi - lo;
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(i % 977) * 0.5f) << i;
  // Nothing to advise: no range, or one without an aligned 2 MiB block.
  EXPECT_EQ(edl::advise_huge_pages(nullptr, bytes), 0u);
  EXPECT_EQ(edl::advise_huge_pages(v.data(), 4096), 0u);
}

}  // namespace

// Blocks of every size start on a cache line, hold what is written to them, and go back to
// the plain operator delete (interleaved lifetimes, so a wrong shift would corrupt the heap).
TEST(CacheLineAllocator, EveryBlockStartsOnALineAndHoldsItsValues) {
  std::vector<edl::aligned_vector<float>> live;
  for (std::size_t n = 0; n < 300; n += 7) {
    auto& v = live.emplace_back(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % edl::kCacheLineBytes, 0u) << "size " << n;
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(n * 1000 + i);
    if (live.size() % 3 == 0) live.erase(live.begin());  // free some while others live
  }
  for (const auto& v : live)
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(v.size() * 1000 + i));
  edl::aligned_vector<std::int8_t> b(65);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % edl::kCacheLineBytes, 0u);
}
