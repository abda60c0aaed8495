// tests/tokenizer/test_unicode.cpp: UTF-8 validation is Unicode's (Table 3-7), as PCRE2's
// matcher assumes once edl has checked a text, and lossy decoding replaces each maximal
// invalid subpart with one U+FFFD, as Python's bytes.decode("utf-8", "replace") and Rust's
// String::from_utf8_lossy do (the expected strings below are Python's output).
#include <gtest/gtest.h>

#include <string>

#include <edl/tokenizer/unicode.hpp>

using edl::tokenizer::invalid_utf8_at;
using edl::tokenizer::utf8_lossy;

TEST(Utf8, WellFormedIsUnicodesDefinition) {
  EXPECT_EQ(invalid_utf8_at("a\xE4\xB8\xAD" "b\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF\xC2\x80"), std::nullopt);
  // Found by fuzzing: a lead byte F6 passed and PCRE2's JIT-compiled matcher, told the text was
  // valid, read past it.
  EXPECT_EQ(invalid_utf8_at("ok \xF6\x9F\x98\x80"), 3u);
  EXPECT_EQ(invalid_utf8_at("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(invalid_utf8_at("x\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(invalid_utf8_at("\xC0\x80"), 0u);          // overlong NUL
  EXPECT_EQ(invalid_utf8_at("\xE0\x80\x80"), 0u);      // overlong
  EXPECT_EQ(invalid_utf8_at("\xF0\x80\x80\x80"), 0u);  // overlong
  EXPECT_EQ(invalid_utf8_at("ab\xE4\xB8"), 2u);        // truncated
  EXPECT_EQ(invalid_utf8_at("\x80"), 0u);              // a stray continuation byte
}

TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("\xE0\x80"), r + r);
  EXPECT_EQ(utf8_lossy("\xF0\x90\x80" "a"), r + "a");
  EXPECT_EQ(utf8_lossy("\xF6\x9F\x98\x80"), r + r + r + r);
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);
  EXPECT_EQ(utf8_lossy("\xC2"), r);
  EXPECT_EQ(utf8_lossy("a\xE4\xB8\xAD" "b"), "a\xE4\xB8\xAD" "b");
  EXPECT_EQ(utf8_lossy("\xF4\x8F\xBF\xBF"), "\xF4\x8F\xBF\xBF");
}
