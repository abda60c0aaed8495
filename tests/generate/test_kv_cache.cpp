// tests/generate/test_kv_cache.cpp: the caches store, read, reorder and run out as documented,
// and their storage is on huge pages where the kernel gives them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/kernels/attention.hpp>

#include "support/huge_pages.hpp"

using namespace edl;
using namespace edl::generate;

namespace {

const KVCacheShape kShape{2, 3, 10, 2, 8};  // layers, batch, max_length, kv_heads, head_dim

std::vector<float> row(std::int64_t layer, std::int64_t b, std::int64_t slot, float salt, std::int64_t width = 16) {
  std::vector<float> r(static_cast<std::size_t>(width));
  for (std::size_t i = 0; i < r.size(); ++i)
    r[i] = std::sin(salt + 0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(layer) + 2.1f * static_cast<float>(b) +
                    0.7f * static_cast<float>(slot));
  return r;
}

/// Writes n slots of every sequence, then checks the attention kernels against naive loops over
/// the rows written: detail::slot_scores (scores of slots [j0, n)) and detail::weighted_values
/// (weights over slots [j0, n)), for j0 = 0 and 3. tol_per_term: error allowed per |q_i| (or
/// per |p_j|), 0 plus rounding for f32, half an int8 step for int8 (|x| <= 1: 1/254).
template <class Cache>
void check_roundtrip(Cache& c, const KVCacheShape& sh, std::int64_t n, double tol_per_term) {
  const std::int64_t D = sh.head_dim, W = sh.row();
  for (std::int64_t b = 0; b < sh.batch; ++b) {
    c.reserve(b, n);
    for (std::int64_t l = 0; l < sh.num_layers; ++l)
      for (std::int64_t s = 0; s < n; ++s) c.store(l, b, s, row(l, b, s, 0.f, W).data(), row(l, b, s, 5.f, W).data());
    c.set_length(b, n);
  }
  std::vector<float> q(static_cast<std::size_t>(D)), p(static_cast<std::size_t>(n));
  double qabs = 0, pabs = 0;
  for (std::int64_t i = 0; i < D; ++i) qabs += std::fabs(q[static_cast<std::size_t>(i)] = 0.1f * static_cast<float>(i % 9) - 0.3f);
  for (std::int64_t j = 0; j < n; ++j) pabs += std::fabs(p[static_cast<std::size_t>(j)] = std::cos(0.9f * static_cast<float>(j)));
  const float scale = 0.5f, w = 0.25f;
  for (std::int64_t l = 0; l < sh.num_layers; ++l)
    for (std::int64_t b = 0; b < sh.batch; ++b)
      for (std::int64_t g = 0; g < sh.kv_heads; ++g) {
        const auto v = c.view(l, b, g);
        for (std::int64_t j0 : {std::int64_t{0}, std::int64_t{3}}) {
          std::vector<float> sc(static_cast<std::size_t>(n), -99.f), out(static_cast<std::size_t>(D), -99.f);
          kernels::detail::slot_scores(v, q.data(), j0, n - j0, scale, sc.data());
          for (std::int64_t s = j0; s < n; ++s) {
            const auto k = row(l, b, s, 0.f, W);
            double want = 0;
            for (std::int64_t i = 0; i < D; ++i) want += q[static_cast<std::size_t>(i)] * k[static_cast<std::size_t>(g * D + i)];
            EXPECT_NEAR(sc[static_cast<std::size_t>(s - j0)], scale * want, scale * (qabs * tol_per_term + 1e-5))
                << "layer " << l << " seq " << b << " head " << g << " slot " << s;
          }
          for (std::int64_t s = n - j0; s < n; ++s) EXPECT_EQ(sc[static_cast<std::size_t>(s)], -99.f) << "wrote past cnt";
          kernels::detail::weighted_values(v, p.data(), j0, n - j0, w, out.data());
          for (std::int64_t i = 0; i < D; ++i) {
            double want = 0;
            for (std::int64_t s = j0; s < n; ++s) want += w * p[static_cast<std::size_t>(s - j0)] * row(l, b, s, 5.f, W)[static_cast<std::size_t>(g * D + i)];
            EXPECT_NEAR(out[static_cast<std::size_t>(i)], want, w * (pabs * tol_per_term + 1e-5)) << "column " << i;
          }
        }
      }
}

template <class Cache>
void check_roundtrip(Cache& c, std::int64_t n, double tol_per_term) {
  check_roundtrip(c, kShape, n, tol_per_term);
}

}  // namespace

// The three caches put their keys and values on huge pages, the first slots of the first page
// too (decode attention reads them in full every step; docs/benchmarks.md).
TEST(KVCache, StorageIsOnHugePages) {
  using test_support::huge_kb_of_mapping;
  if (!test_support::thp_available()) GTEST_SKIP() << "transparent huge pages are off";
  const KVCacheShape big{4, 1, 2048, 4, 128};  // 16 MiB of keys and 16 of values in f32, 4 and 4 in int8
  StandardKVCache s(big);
  EXPECT_GT(huge_kb_of_mapping(s.view(2, 0, 0).k), 0);
  EXPECT_GT(huge_kb_of_mapping(s.view(2, 0, 0).v), 0);
  Int8KVCache q(big);
  EXPECT_GT(huge_kb_of_mapping(q.view(2, 0, 0).k), 0);
  PagedKVCacheOptions o;
  o.page_size = 16;
  o.budget_bytes = std::int64_t{16} << 20;
  PagedKVCache pg(big, o);
  pg.reserve(0, 512);
  EXPECT_GT(huge_kb_of_mapping(pg.view(2, 0, 0).k_row(0)), 0);
}

namespace {

}  // namespace

TEST(KVCache, StandardRoundTrip) {
  StandardKVCache c(kShape);
  check_roundtrip(c, 7, 1e-6);
  EXPECT_EQ(c.length(1), 7);
  EXPECT_EQ(c.bytes(), 2 * 2 * 3 * 10 * 16 * 4);
  EXPECT_THROW(c.reserve(0, 11), edl::Error);
  EXPECT_THROW(c.reserve(3, 1), edl::Error);
}

// With head rows a whole number of cache lines (16 floats, 64 int8), every row of every head
// starts on a line: attention's full-vector loads never straddle two.
TEST(KVCache, HeadRowsStartOnCacheLines) {
  const auto on_line = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kCacheLineBytes == 0; };
  StandardKVCache f(KVCacheShape{2, 3, 10, 2, 16});
  Int8KVCache q(KVCacheShape{2, 3, 10, 2, 64});
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t g = 0; g < 2; ++g)
        for (std::int64_t s = 0; s < 10; ++s) {
          EXPECT_TRUE(on_line(f.view(l, b, g).k_row(s)) && on_line(f.view(l, b, g).v_row(s)));
          EXPECT_TRUE(on_line(q.view(l, b, g).k_row(s)) && on_line(q.view(l, b, g).v_row(s)));
        }
}

TEST(KVCache, Int8RoundTripWithinHalfAStep) {
  Int8KVCache c(kShape);
  // |x| <= 1: step = absmax / 127 <= 1/127, error per element <= 1/254.
  check_roundtrip(c, 7, 1.0 / 254 + 1e-6);
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
  std::vector<float> q(8, 0.f), out(8);
  q[3] = 1.f;
  const float one = 1.f;
  for (std::int64_t l = 0; l < kShape.num_layers; ++l)
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t g = 0; g < kShape.kv_heads; ++g)
        for (std::int64_t s = 0; s < c.length(b); ++s) {  // key element 3 and the whole value row
          float score = 0.f;
          kernels::detail::slot_scores(c.view(l, b, g), q.data(), s, 1, 1.0f, &score);
          EXPECT_NEAR(score, row(l, src[b], s, 0.f)[static_cast<std::size_t>(8 * g + 3)], 1e-2) << b << " " << s;
          kernels::detail::weighted_values(c.view(l, b, g), &one, s, 1, 1.0f, out.data());
          for (std::size_t i = 0; i < 8; ++i)
            EXPECT_NEAR(out[i], row(l, src[b], s, 5.f)[8 * static_cast<std::size_t>(g) + i], 1e-2) << b << " " << s;
        }
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

// The engine's int8 pages hold what Int8KVCache holds: the same int8 values and scales per
// (token, kv head), whatever page a slot lands in, so attention over them is the same.
TEST(KVCache, PagedInt8HoldsTheInt8CachesValuesInPages) {
  PagedKVCacheOptions o;
  o.page_size = 4;
  o.utilization = 1.0;
  const std::int64_t page_bytes = 2 * kShape.num_layers * 4 * (kShape.row() + 4 * kShape.kv_heads);
  o.budget_bytes = 6 * page_bytes;
  PagedInt8KVCache p(kShape, o);
  EXPECT_EQ(p.page_bytes(), page_bytes);
  EXPECT_EQ(p.num_pages(), 6);
  EXPECT_LT(p.page_bytes(), PagedKVCache(kShape, o).page_bytes() / 2);
  Int8KVCache c(kShape);
  const std::int64_t n = 7, D = kShape.head_dim;
  // Sequences fill pages in the order 2, 0, 1: a sequence's pages are not the first ones.
  for (std::int64_t b : {2, 0, 1}) {
    p.reserve(b, n);
    c.reserve(b, n);
    for (std::int64_t l = 0; l < kShape.num_layers; ++l)
      for (std::int64_t s = 0; s < n; ++s) {
        p.store(l, b, s, row(l, b, s, 1.f).data(), row(l, b, s, 3.f).data());
        c.store(l, b, s, row(l, b, s, 1.f).data(), row(l, b, s, 3.f).data());
      }
  }
  std::vector<float> pk(static_cast<std::size_t>(D)), pv(pk), ck(pk), cv(pk);
  for (std::int64_t l = 0; l < kShape.num_layers; ++l)
    for (std::int64_t b = 0; b < kShape.batch; ++b)
      for (std::int64_t g = 0; g < kShape.kv_heads; ++g) {
        const auto pw = p.view(l, b, g);
        const auto cw = c.view(l, b, g);
        for (std::int64_t s = 0; s < n; ++s) {
          EXPECT_EQ(std::vector<std::int8_t>(pw.k_row(s), pw.k_row(s) + D), std::vector<std::int8_t>(cw.k_row(s), cw.k_row(s) + D));
          EXPECT_EQ(std::vector<std::int8_t>(pw.v_row(s), pw.v_row(s) + D), std::vector<std::int8_t>(cw.v_row(s), cw.v_row(s) + D));
          EXPECT_EQ(pw.k_scale(s), cw.k_scale(s));
          EXPECT_EQ(pw.v_scale(s), cw.v_scale(s));
          pw.read(s, pk.data(), pv.data());
          cw.read(s, ck.data(), cv.data());
          EXPECT_EQ(pk, ck);
          EXPECT_EQ(pv, cv);
        }
      }
  try {
    p.reserve(0, 9);
    FAIL() << "expected out of pages";
  } catch (const edl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of pages"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("PagedInt8KVCache"), std::string::npos) << e.what();
  }
  PagedInt8KVCache fresh(kShape, o);
  check_roundtrip(fresh, n, 1.0 / 254 + 1e-6);
  o.page_size = 2;
  o.budget_bytes = 256 << 10;
  PagedInt8KVCache r(kShape, o);
  check_reorder(r);
}

// Head dims that leave lanes over (5: all tail; 20: 2 batches of 8 + 4 on AVX2; 72: a full pass
// of 8 batches + 1) and slot counts that leave a partial block of slots, on every cache.
TEST(KVCache, AttentionKernelsMatchNaiveLoopsOnOddShapes) {
  for (std::int64_t D : {5, 20, 72}) {
    SCOPED_TRACE(D);
    const KVCacheShape sh{1, 2, 24, 3, D};
    StandardKVCache s(sh);
    check_roundtrip(s, sh, 21, 1e-6);
    Int8KVCache i(sh);
    check_roundtrip(i, sh, 21, 1.0 / 254 + 1e-6);
    for (std::int64_t page : {4, 5}) {  // a shift and a division find the page
      PagedKVCacheOptions o;
      o.page_size = page;
      PagedKVCache p(sh, o);
      check_roundtrip(p, sh, 21, 1e-6);
      PagedInt8KVCache p8(sh, o);
      check_roundtrip(p8, sh, 21, 1.0 / 254 + 1e-6);
    }
  }
}
