// tests/core/test_allocator.cpp: huge-page advice covers only whole aligned 2 MiB blocks of
// the range and leaves the contents as they were; CacheLineAllocator blocks start on a line;
// HugePageAllocator blocks of a huge page or more start on one, and assign_on_huge_pages puts
// all of its storage on huge pages where the kernel gives them.
#include <edl/core/allocator.hpp>

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "support/huge_pages.hpp"

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

// Blocks of a huge page or more start on a huge page, smaller ones on a cache line; all hold
// what is written to them (interleaved lifetimes, as above).
TEST(HugePageAllocator, LargeBlocksStartOnAHugePageAndSmallOnesOnALine) {
  std::vector<edl::huge_page_vector<float>> live;
  for (const std::size_t bytes : {std::size_t{4}, std::size_t{4096}, edl::kHugePageBytes - 4, edl::kHugePageBytes,
                                  edl::kHugePageBytes + 4, 3 * edl::kHugePageBytes + 100}) {
    const std::size_t n = bytes / sizeof(float);
    auto& v = live.emplace_back(n);
    const std::size_t align = bytes >= edl::kHugePageBytes ? edl::kHugePageBytes : edl::kCacheLineBytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % align, 0u) << bytes << " bytes";
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(n + i);
    if (live.size() % 2 == 0) live.erase(live.begin());
  }
  for (const auto& v : live)
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(v.size() + i));
}

// assign_on_huge_pages holds n copies of the value (also when the vector held something) and,
// where the kernel gives huge pages, all of its storage is on them: the first and the last
// bytes as well as the middle (a block from malloc kept up to 2 MiB at each end on 4 KiB pages).
TEST(AssignOnHugePages, HoldsTheValuesAndAllOfItsStorageIsOnHugePages) {
  constexpr std::size_t n = (std::size_t{6} << 20) / sizeof(float) + 77;
  edl::huge_page_vector<float> v(5, 2.0f);
  edl::assign_on_huge_pages(v, n, 1.5f);
  ASSERT_EQ(v.size(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 1.5f) << i;
  if (!edl::test_support::thp_available()) GTEST_SKIP() << "transparent huge pages are off";
  // The block is 4 whole huge pages, every one written: all of them huge.
  EXPECT_GE(edl::test_support::huge_kb_of_mapping(v.data()), 4 * 2048);
}
