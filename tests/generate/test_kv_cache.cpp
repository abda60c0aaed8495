// tests/generate/test_kv_cache.cpp: the caches store, read, reorder and run out as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/kv_cache.hpp>

using namespace edl;
using namespace edl::generate;

namespace {

const KVCacheShape kShape{2, 3, 10, 2, 8};  // layers, batch, max_length, kv_heads, head_dim

std::vector<float> row(std::int64_t layer, std::int64_t b, std::int64_t slot, float salt) {
  std::vector<float> r(16);
  for (std::size_t i = 0; i < r.size(); ++i)
    r[i] = std::sin(salt + 0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(layer) + 2.1f * static_cast<float>(b) +
                    0.7f * static_cast<float>(slot));
  return r;
}

/// Writes every slot, then checks dot_k / axpy_v against the rows written (tolerance for int8).
template <class Cache>
void check_roundtrip(Cache& c, std::int64_t n, double tol) {
  for (std::int64_t b = 0; b < kShape.batch; ++b) {
    c.reserve(b, n);
    for (std::int64_t l = 0; l < kShape.num_layers; ++l)
      for (std::int64_t s = 0; s < n; ++s) c.store(l, b, s, row(l, b, s, 0.f).data(), row(l, b, s, 5.f).data());
    c.set_length(b, n);
  }
  std::vector<float> q(8);
  for (std::size_t i = 0; i < 8; ++i) q[i] = 0.1f * static_cast<float>(i) - 0.3f;
  for (std::int64_t l = 0; l < kShape.num_layers; ++l)
    for (std::int64_t b = 0; b < kShape.batch; ++b)
      for (std::int64_t g = 0; g < kShape.kv_heads; ++g) {
        const auto v = c.view(l, b, g);
        for (std::int64_t s = 0; s < n; ++s) {
          const auto k = row(l, b, s, 0.f), vv = row(l, b, s, 5.f);
          double want = 0;
          for (int i = 0; i < 8; ++i) want += q[i] * k[g * 8 + i];
          EXPECT_NEAR(v.dot_k(s, q.data()), want, tol);
          std::vector<float> acc(8, 1.0f);
          v.axpy_v(s, 0.5f, acc.data());
          for (int i = 0; i < 8; ++i) EXPECT_NEAR(acc[i], 1.0f + 0.5f * vv[g * 8 + i], tol);
        }
      }
}

}  // namespace

TEST(KVCache, StandardRoundTrip) {
  StandardKVCache c(kShape);
  check_roundtrip(c, 7, 1e-6);
  EXPECT_EQ(c.length(1), 7);
  EXPECT_EQ(c.bytes(), 2 * 2 * 3 * 10 * 16 * 4);
  EXPECT_THROW(c.reserve(0, 11), edl::Error);
  EXPECT_THROW(c.reserve(3, 1), edl::Error);
}

TEST(KVCache, Int8RoundTripWithinHalfAStep) {
  Int8KVCache c(kShape);
  // |x| <= 1: step = absmax / 127 <= 1/127, error per element <= 1/254; dot of 8 terms |q| <= 0.4.
  check_roundtrip(c, 7, 8 * 0.4 / 254 + 1e-6);
  EXPECT_LT(c.bytes(), StandardKVCache(kShape).bytes() / 2);  // 8 int8 + one f32 scale per 8 values
}

TEST(KVCache, PagedRoundTripAndPages) {
  PagedKVCacheOptions o;
  o.page_size = 4;
  const std::int64_t page_bytes = 2 * kShape.num_layers * 4 * kShape.row() * 4;
  o.budget_bytes = 6 * page_bytes;
  o.utilization = 1.0;
  PagedKVCache c(kShape, o);
  EXPECT_EQ(c.num_pages(), 6);
  EXPECT_EQ(c.page_bytes(), page_bytes);
  check_roundtrip(c, 7, 1e-6);  // 3 sequences x 2 pages
  EXPECT_EQ(c.free_pages(), 0);
  try {
    c.reserve(0, 9);
    FAIL() << "expected out of pages";
  } catch (const edl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of pages"), std::string::npos) << e.what();
  }
  c.free(1);
  EXPECT_EQ(c.free_pages(), 2);
  EXPECT_EQ(c.length(1), 0);
  c.reserve(0, 9);
  EXPECT_EQ(c.page_table(0).size(), 3u);
  try {
    c.reserve(2, 11);
    FAIL() << "expected max_model_length error";
  } catch (const edl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_length"), std::string::npos) << e.what();
  }
}

TEST(KVCache, PagedUtilizationSizesThePool) {
  PagedKVCacheOptions o;
  o.page_size = 4;
  const std::int64_t page_bytes = 2 * kShape.num_layers * 4 * kShape.row() * 4;
  o.budget_bytes = 10 * page_bytes;
  o.utilization = 0.5;
  EXPECT_EQ(PagedKVCache(kShape, o).num_pages(), 5);
  o.budget_bytes = page_bytes / 2;
  EXPECT_THROW(PagedKVCache(kShape, o), edl::Error);
}

template <class Cache>
void check_reorder(Cache& c) {
  for (std::int64_t b = 0; b < kShape.batch; ++b) {
    c.reserve(b, 3 + b);
    for (std::int64_t l = 0; l < kShape.num_layers; ++l)
      for (std::int64_t s = 0; s < 3 + b; ++s) c.store(l, b, s, row(l, b, s, 0.f).data(), row(l, b, s, 5.f).data());
    c.set_length(b, 3 + b);
  }
  const std::int64_t src[3] = {2, 2, 0};
  c.reorder(src);
  EXPECT_EQ(c.length(0), 5);
  EXPECT_EQ(c.length(1), 5);
  EXPECT_EQ(c.length(2), 3);
  std::vector<float> q(8, 0.f);
  q[3] = 1.f;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t s = 0; s < c.length(b); ++s)
      EXPECT_NEAR(c.view(1, b, 1).dot_k(s, q.data()), row(1, src[b], s, 0.f)[8 + 3], 1e-2) << b << " " << s;
}

TEST(KVCache, ReorderCopiesSequences) {
  StandardKVCache s(kShape);
  check_reorder(s);
  Int8KVCache i(kShape);
  check_reorder(i);
  PagedKVCacheOptions o;
  o.page_size = 2;
  PagedKVCache p(kShape, o);
  check_reorder(p);
}
