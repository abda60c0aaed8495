// tests/core/test_allocator.cpp: huge-page advice covers only whole aligned 2 MiB blocks of
// the range and leaves the contents as they were.
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
