// tests/support/same_params.hpp: two models hold the same parameters, by name, bit for bit
// (compared as f32, so bf16 and f16 storage compare their values exactly too).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include <edl/core/dtype.hpp>

namespace edl::test_support {

template <class A, class B>
void expect_same_params(A& want, B& got, const std::string& where) {
  std::map<std::string, std::vector<float>> w;
  want.visit_params("", [&](std::string_view path, auto& p) {
    for (std::size_t i = 0; i < p.value.size(); ++i) w[std::string(path)].push_back(to_f32(p.value.data()[i]));
  });
  std::size_t count = 0;
  got.visit_params("", [&](std::string_view path, auto& p) {
    ASSERT_TRUE(w.count(std::string(path))) << where << ": unexpected parameter " << path;
    const auto& v = w.at(std::string(path));
    ASSERT_EQ(v.size(), p.value.size()) << where << " " << path;
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], to_f32(p.value.data()[i])) << where << " " << path << "[" << i << "]";
    ++count;
  });
  EXPECT_EQ(count, w.size()) << where;
}

}  // namespace edl::test_support
