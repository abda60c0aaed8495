// tests/generate/test_bench_decode.cpp: the read patterns `edl bench decode --bandwidth` and
// `--paired-bandwidth` time (examples/cli/generate.hpp) read every element they are given
// once and nothing else, and a paired read walks the buffer without rereading what it just read.
#include <cstddef>
#include <vector>

#include <gtest/gtest.h>

#include "../../examples/cli/generate.hpp"

namespace {

namespace gd = edl::cli::gen_detail;

// Every pattern's sum over `per` floats is the naive sum (small integers: exact in f32 in any
// order), and the huge element right after them is never read into it.
TEST(BenchDecode, EveryReadPatternSumsExactlyTheFloatsItIsGiven) {
  const std::size_t per = 2 * gd::kReadQuantum;
  std::vector<float> x(per + 1);
  double naive = 0;
  for (std::size_t i = 0; i < per; ++i) naive += (x[i] = static_cast<float>(i % 13) - 6.0f);
  x[per] = 1e30f;
  for (int p = 0; p < gd::kReadPatterns; ++p)
    EXPECT_EQ(static_cast<double>(gd::read_pattern(p, x.data(), per)), naive) << gd::kReadPatternNames[p];
}

// timed_read rounds a request to whole quanta per thread, reports what it read, moves the
// offset past it and starts over at the buffer's start when the next read would not fit.
TEST(BenchDecode, PairedReadsWalkTheBufferAndWrapAtItsEnd) {
  const int threads_before = edl::exec::num_threads();
  for (const int threads : {1, 2}) {
    edl::exec::set_num_threads(threads);
    const std::size_t q = gd::kReadQuantum, t = static_cast<std::size_t>(threads);
    edl::aligned_vector<float> buf;
    gd::ensure_read_buffer(buf, 5 * t * q * sizeof(float));
    ASSERT_EQ(buf.size(), 5 * t * q);
    std::size_t offset = 0, done = 0;
    EXPECT_GT(gd::timed_read(buf, 5, 2 * t * q, offset, done), 0.0);
    EXPECT_EQ(done, 2 * t * q);
    EXPECT_EQ(offset, 2 * t * q);
    gd::timed_read(buf, 0, 2 * t * q + 1, offset, done);  // rounds to the nearest whole quanta
    EXPECT_EQ(done, 2 * t * q);
    EXPECT_EQ(offset, 4 * t * q);
    gd::timed_read(buf, 2, 2 * t * q, offset, done);  // does not fit after 4: starts over
    EXPECT_EQ(offset, 2 * t * q);
    gd::timed_read(buf, 3, 1, offset, done);  // at least one quantum per thread
    EXPECT_EQ(done, t * q);
    EXPECT_EQ(offset, 3 * t * q);
    gd::timed_read(buf, 4, 12 * t * q, offset, done);  // more than the buffer: several passes
    EXPECT_EQ(done, 12 * t * q);
  }
  edl::exec::set_num_threads(threads_before);
}

}  // namespace
