#include <gtest/gtest.h>

#include <cmath>

#include <edl/nn/mlp.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnMLP, SwiGLUForwardAndBackward) {
  const std::int64_t H = 8, I = 12, T = 5;
  nn::MLP<DefaultPolicy> mlp(H, I);
  mlp.init(Key::from_seed(2), 0.4f);
  auto x = randn(T * H, 1);
  auto c = randn(T * H, 2);
  std::vector<float> y(T * H), dx(T * H);
  nn::MLP<DefaultPolicy>::Saved s;
  mlp.forward(x.data(), T, y.data(), s);
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<double> a(I);
    for (std::int64_t k = 0; k < I; ++k) {
      double g = 0, u = 0;
      for (std::int64_t j = 0; j < H; ++j) {
        g += double(x[t * H + j]) * mlp.gate_proj.weight.value(k, j);
        u += double(x[t * H + j]) * mlp.up_proj.weight.value(k, j);
      }
      a[k] = g / (1 + std::exp(-g)) * u;
    }
    for (std::int64_t o = 0; o < H; ++o) {
      double r = 0;
      for (std::int64_t k = 0; k < I; ++k) r += a[k] * mlp.down_proj.weight.value(o, k);
      EXPECT_NEAR(y[t * H + o], r, 1e-5);
    }
  }
  mlp.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(T * H);
    mlp.apply(x.data(), T, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss);
  mlp.visit_params("mlp", [&](std::string_view path, auto& p) {
    expect_fd(std::string(path), p.data(), p.value.size(), p.grad.data(), loss);
  });
  EXPECT_EQ(mlp.param_count(), 3 * H * I);
  EXPECT_DOUBLE_EQ(mlp.flops_forward(T), 3 * 2.0 * T * H * I);
}
