#include <edl/io/json_config.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using edl::errc;
using edl::io::JsonConfig;

std::string tmp_file(const std::string& name) {
  return (fs::temp_directory_path() / ("edl_json_" + std::to_string(::getpid()) + "_" + name)).string();
}

/// `f` must throw edl::Error with `code`, `where` and `text` in its message.
template <class F>
void expect_error(F&& f, errc code, const std::string& where, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.where(), where) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(JsonConfig, TypedGettersWithDefaults) {
  const auto c = JsonConfig::parse(R"({"n": 12, "f": 2048.0, "x": 1e-5, "s": "silu", "b": true, "nul": null,
                                       "v": [1, 2, 3], "big": 5000000000})",
                                   "config.json");
  EXPECT_EQ(c.get<int>("n"), 12);
  EXPECT_EQ(c.get<std::int64_t>("f"), 2048);  // an integral float is accepted as an integer
  EXPECT_DOUBLE_EQ(c.get<double>("x"), 1e-5);
  EXPECT_DOUBLE_EQ(c.get<double>("n"), 12.0);  // and an integer as a number
  EXPECT_EQ(c.get<std::string>("s"), "silu");
  EXPECT_TRUE(c.get<bool>("b"));
  EXPECT_EQ(c.get<std::vector<std::int64_t>>("v"), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(c.get<std::int64_t>("big"), 5000000000);
  EXPECT_EQ(c.get<int>("missing", 7), 7);
  EXPECT_EQ(c.get<int>("nul", 8), 8);  // null takes the default
  EXPECT_FALSE(c.optional<int>("nul").has_value());
  EXPECT_FALSE(c.optional<int>("missing").has_value());
  EXPECT_EQ(c.optional<int>("n"), 12);
  EXPECT_TRUE(c.has("nul"));
  EXPECT_FALSE(c.has_value("nul"));
}

TEST(JsonConfig, ErrorsNameFieldExpectedTypeAndFoundValue) {
  const auto c = JsonConfig::parse(R"({"heads": "32", "eps": 0.5, "act": 3, "flag": 1, "v": [1, "x"], "big": 5000000000})",
                                   "ckpt/config.json");
  expect_error([&] { (void)c.get<int>("heads"); }, errc::config, "ckpt/config.json field heads",
               "expected an integer, found \"32\" (string)");
  expect_error([&] { (void)c.get<std::int64_t>("eps"); }, errc::config, "ckpt/config.json field eps",
               "expected an integer, found 0.5 (number)");
  expect_error([&] { (void)c.get<std::string>("act", "silu"); }, errc::config, "ckpt/config.json field act",
               "expected a string, found 3 (number)");
  expect_error([&] { (void)c.get<bool>("flag"); }, errc::config, "ckpt/config.json field flag",
               "expected a boolean, found 1");
  expect_error([&] { (void)c.get<std::vector<int>>("v"); }, errc::config, "ckpt/config.json field v[1]",
               "expected an integer, found \"x\"");
  expect_error([&] { (void)c.get<int>("big"); }, errc::config, "ckpt/config.json field big",
               "expected an integer, found 5000000000");
  expect_error([&] { (void)c.get<int>("hidden_size"); }, errc::config, "ckpt/config.json field hidden_size",
               "missing required field (expected an integer)");
}

// Found by fuzzing (adapter_config.json's "r": 9.3e18): a float at or beyond an integer type's
// range, or a double beyond a float's, was converted with undefined behaviour.
TEST(JsonConfig, OutOfRangeNumbersAreErrorsNotConversions) {
  const auto c = JsonConfig::parse(R"({"at": 9223372036854775808.0, "below": 9223372036854774784.0,
                                       "i32": 2147483648.0, "huge": 1e300, "small": 1e-300})",
                                   "c.json");
  expect_error([&] { (void)c.get<std::int64_t>("at"); }, errc::config, "c.json field at", "expected an integer");
  EXPECT_EQ(c.get<std::int64_t>("below"), 9223372036854774784LL);
  expect_error([&] { (void)c.get<std::int32_t>("i32"); }, errc::config, "c.json field i32", "expected an integer");
  expect_error([&] { (void)c.get<float>("huge"); }, errc::config, "c.json field huge", "expected");
  EXPECT_EQ(c.get<double>("huge"), 1e300);
  EXPECT_EQ(c.get<float>("small"), 0.0f);
}

TEST(JsonConfig, ParseErrorsGiveLineAndColumn) {
  expect_error([] { (void)JsonConfig::parse("{\n  \"a\": 1,\n  \"b\": }\n", "c.json"); }, errc::format, "c.json",
               "line 3, column 8");
  expect_error([] { (void)JsonConfig::parse("[1, 2]", "c.json"); }, errc::format, "c.json",
               "expected a JSON object, found array");
  const std::string p = tmp_file("bad.json");
  std::ofstream(p) << "{\"a\": tru}";
  expect_error([&] { (void)JsonConfig::from_file(p); }, errc::format, p, "line 1, column");
  fs::remove(p);
  expect_error([&] { (void)JsonConfig::from_file(p); }, errc::io, p, "No such file or directory");
}

TEST(JsonConfig, SaveKeepsUnknownFieldsAndTheirOrder) {
  const std::string text = R"({"zeta": 1, "alpha": {"nested": [1, 2]}, "hidden_size": 16, "weird": null})";
  auto c = JsonConfig::parse(text, "in.json");
  c.set("hidden_size", 32);
  c.set("added", "yes");
  const std::string p = tmp_file("out.json");
  c.save(p);
  const auto back = JsonConfig::from_file(p);
  std::vector<std::string> keys;
  for (auto it = back.json().begin(); it != back.json().end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "alpha", "hidden_size", "weird", "added"}));
  EXPECT_EQ(back.get<int>("hidden_size"), 32);
  EXPECT_EQ(back.json()["alpha"]["nested"][1], 2);
  EXPECT_TRUE(back.json()["weird"].is_null());
  EXPECT_EQ(back.source(), p);
  // No temp file is left next to it.
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    EXPECT_EQ(e.path().filename().string().find("edl_json_" + std::to_string(::getpid()) + "_out.json.tmp"),
              std::string::npos);
  fs::remove(p);
}

}  // namespace
