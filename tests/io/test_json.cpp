// tests/io/test_json.cpp: parse_json refuses what nlohmann's parser alone accepts or throws
// outside edl::Error (duplicate keys, unbounded nesting, numbers beyond a double) and keeps
// what it parses equal to nlohmann's own result.
#include <edl/io/json.hpp>

#include <string>

#include <gtest/gtest.h>

namespace {

using edl::errc;
using edl::io::parse_json;

std::string error_of(const std::string& text, int depth = edl::io::kMaxJsonDepth) {
  try {
    (void)parse_json(text, "doc.json", depth);
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format) << e.what();
    EXPECT_EQ(e.where(), "doc.json") << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for " << text.substr(0, 80);
  return {};
}

TEST(ParseJson, EqualsNlohmannOnValidDocuments) {
  for (const std::string text : {R"({"b": 1, "a": [1, 2.5, "x", null, true, {"c": {}}], "a/b~": {"a": 2}})",
                                 R"([{"a": 1}, {"a": 2}])", R"("just a string")", R"(-12)"}) {
    EXPECT_EQ(parse_json(text, "doc"), nlohmann::ordered_json::parse(text)) << text;
    EXPECT_EQ(parse_json<nlohmann::json>(text, "doc"), nlohmann::json::parse(text)) << text;
  }
  // The same key in different objects is fine; order is kept by ordered_json.
  const auto j = parse_json(R"({"z": {"k": 1}, "y": {"k": 2}})", "doc");
  EXPECT_EQ(j.begin().key(), "z");
}

TEST(ParseJson, DuplicateKeysAreRefusedWithTheirPath) {
  EXPECT_NE(error_of(R"({"a": 1, "a": 2})").find("duplicate key \"a\" in the object at /"), std::string::npos);
  EXPECT_NE(error_of(R"({"x": {"y/z": {"k": 1, "k": 2}}})").find("duplicate key \"k\" in the object at /x/y~1z"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"k": 1}, {"k": 1, "k": 3}])").find("duplicate key \"k\""), std::string::npos);
}

TEST(ParseJson, NestingIsBounded) {
  const auto nest = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW((void)parse_json(nest(5), "doc", 5));
  EXPECT_NE(error_of(nest(6), 5).find("nested deeper than 5 levels"), std::string::npos);
  // A million levels: refused at the limit instead of a stack overflow when dumped or freed.
  EXPECT_NE(error_of(nest(1'000'000)).find("nested deeper"), std::string::npos);
  EXPECT_NE(error_of("{\"a\":" + nest(200) + "}").find("(at /a)"), std::string::npos);
}

TEST(ParseJson, SyntaxErrorsAndHugeNumbersNameThePosition) {
  EXPECT_NE(error_of("{\n  \"a\": 1,\n  \"b\" 2}").find("line 3, column"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1e309})").find("not valid JSON"), std::string::npos);  // nlohmann: out_of_range
  EXPECT_NE(error_of(R"({"a": "\ud800"})").find("not valid JSON"), std::string::npos);  // lone surrogate
  EXPECT_NE(error_of("{\"a\": \"\xff\"}").find("not valid JSON"), std::string::npos);    // invalid UTF-8
  EXPECT_NE(error_of("").find("not valid JSON"), std::string::npos);
}

}  // namespace
