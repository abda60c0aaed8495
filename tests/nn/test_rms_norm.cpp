#include <gtest/gtest.h>

#include <edl/nn/rms_norm.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnRMSNorm, ForwardAndBackward) {
  const std::int64_t rows = 5, H = 12;
  nn::RMSNorm<DefaultPolicy> norm(H, 1e-5);
  for (std::int64_t j = 0; j < H; ++j) EXPECT_EQ(norm.weight.value(j), 1.0f);
  fill_randn(norm.weight.data(), H, 3, 1.0f);
  auto x = randn(rows * H, 1);
  auto c = randn(rows * H, 2);
  std::vector<float> y(rows * H), dx(rows * H);
  nn::RMSNorm<DefaultPolicy>::Saved s;
  norm.forward(x.data(), rows, y.data(), s);
  for (std::int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (std::int64_t j = 0; j < H; ++j) ms += double(x[r * H + j]) * x[r * H + j];
    const double ir = 1 / std::sqrt(ms / H + 1e-5);
    for (std::int64_t j = 0; j < H; ++j) EXPECT_NEAR(y[r * H + j], norm.weight.value(j) * x[r * H + j] * ir, 1e-5);
  }
  norm.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(rows * H);
    norm.apply(x.data(), rows, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss, 30, 1e-2f, 1e-2);
  expect_fd("dweight", norm.weight.data(), H, norm.weight.grad.data(), loss);
  EXPECT_EQ(norm.param_count(), H);
}
