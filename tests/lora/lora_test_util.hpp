// Helpers shared by tests/lora: the tiny_hf fixture, its tokens and logits.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <edl/io/npy.hpp>
#include <edl/models/llama/pretrained.hpp>

namespace edl_lora_test {

namespace fs = std::filesystem;

inline fs::path tiny_hf() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return fs::path(env ? env : "tests/data") / "tiny_hf";
}

/// The fixture's [2, 8] tokens (a missing fixture fails the test that needs it).
inline std::vector<std::int64_t> tokens() {
  const auto t = edl::io::load_npy<std::int64_t>((tiny_hf() / "oracle" / "tokens.npy").string());
  return std::vector<std::int64_t>(t.begin(), t.end());
}

template <class M>
std::vector<float> logits(const M& m, const std::vector<std::int64_t>& ids, std::int64_t batch = 2) {
  const std::int64_t seq = static_cast<std::int64_t>(ids.size()) / batch;
  std::vector<float> out(static_cast<std::size_t>(batch * seq * m.config().vocab_size));
  m.logits(ids.data(), edl::nn::TokenLayout{batch, seq}, out.data());
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const float* b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

/// A fresh temp folder per test, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("edl_test_lora_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace edl_lora_test
