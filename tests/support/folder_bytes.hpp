// tests/support/folder_bytes.hpp: files compared byte for byte, and the fixtures under
// EDL_TEST_DATA, for the tests of writers that must reproduce another writer's files.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace edl::test_support {

/// A model folder of tests/data (EDL_TEST_DATA), checked to hold a config.json.
inline std::filesystem::path fixture(const std::string& name) {
  const char* env = std::getenv("EDL_TEST_DATA");
  const std::filesystem::path p = std::filesystem::path(env ? env : "tests/data") / name;
  if (!std::filesystem::exists(p / "config.json"))
    throw std::runtime_error("no fixture at " + p.string() + " (EDL_TEST_DATA)");
  return p;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// The names of the entries of folder `d`, sorted.
inline std::vector<std::string> file_names(const std::filesystem::path& d) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

/// Both folders hold the same files with the same bytes.
inline void expect_same_folder(const std::filesystem::path& want, const std::filesystem::path& got,
                               const std::string& where) {
  ASSERT_EQ(file_names(got), file_names(want)) << where;
  for (const auto& f : file_names(want))
    EXPECT_TRUE(read_bytes(got / f) == read_bytes(want / f)) << where << ": " << f << " differs";
}

}  // namespace edl::test_support
