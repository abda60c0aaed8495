#include <edl/core/error.hpp>

#include <vector>

#include <gtest/gtest.h>

namespace {

TEST(Error, MessageNamesIdObjectExpectedAndFound) {
  try {
    std::vector<long> shape{4, 4095};
    EDL_CHECK(shape[1] == 4096, edl::errc::shape_mismatch, "nn.Linear model.layers.3.self_attn.q_proj",
              "x is ", edl::detail::shape_str(shape), ", weight expects C = 4096");
    FAIL() << "EDL_CHECK did not throw";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::shape_mismatch);
    EXPECT_EQ(e.where(), "nn.Linear model.layers.3.self_attn.q_proj");
    EXPECT_STREQ(e.what(),
                 "[edl.shape_mismatch.101] nn.Linear model.layers.3.self_attn.q_proj: x is (4, 4095), "
                 "weight expects C = 4096");
    EXPECT_EQ(e.message(), "x is (4, 4095), weight expects C = 4096");  // what alone, for a caller to re-raise
  }
}

TEST(Error, PassingCheckDoesNotThrow) {
  EXPECT_NO_THROW(EDL_CHECK(1 + 1 == 2, edl::errc::invalid_argument, "x", "never"));
}

}  // namespace
