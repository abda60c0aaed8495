#include <gtest/gtest.h>

#include <edl/nn/linear.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnLinear, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const std::int64_t in = 5, out = 7, rows = 6;
  nn::ColumnLinear<DefaultPolicy> lin(in, out, /*bias=*/true);
  lin.init(Key::from_seed(3), 0.5f);
  fill_randn(lin.bias.data(), out, 9, 0.5f);
  auto x = randn(rows * in, 1);
  auto c = randn(rows * out, 2);
  std::vector<float> y(rows * out);
  nn::ColumnLinear<DefaultPolicy>::Saved s;
  lin.forward(x.data(), rows, y.data(), s);
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int64_t o = 0; o < out; ++o) {
      double r = lin.bias.value(o);
      for (std::int64_t i = 0; i < in; ++i) r += double(x[t * in + i]) * lin.weight.value(o, i);
      EXPECT_NEAR(y[t * out + o], r, 1e-5);
    }
  std::vector<float> dx(rows * in);
  lin.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(rows * out);
    lin.apply(x.data(), rows, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss);
  expect_fd("dW", lin.weight.data(), lin.weight.value.size(), lin.weight.grad.data(), loss);
  expect_fd("db", lin.bias.data(), out, lin.bias.grad.data(), loss);

  // Gradients accumulate: a second backward doubles them.
  const std::vector<float> g1(lin.weight.grad.begin(), lin.weight.grad.end());
  lin.backward(c.data(), s, nullptr);
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_FLOAT_EQ(lin.weight.grad.data()[i], 2 * g1[i]);
}

TEST(NnLinear, ParamsNamesCountsAndSpecs) {
  nn::RowLinear<DefaultPolicy> lin(8, 4, true);
  std::vector<std::string> names;
  lin.visit_params("model.layers.0.self_attn.o_proj", [&](std::string_view p, auto&) { names.emplace_back(p); });
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(names[1], "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(lin.param_count(), 8 * 4 + 4);
  EXPECT_DOUBLE_EQ(lin.flops_forward(10), 2.0 * 10 * 8 * 4);
  static_assert(std::is_same_v<nn::RowLinear<DefaultPolicy>::WeightParam::spec, P<none, "tp">>);
  static_assert(std::is_same_v<nn::ColumnLinear<DefaultPolicy>::WeightParam::spec, P<"tp", none>>);
  EXPECT_EQ(lin.weight.shape(), (std::vector<std::int64_t>{4, 8}));
}

TEST(NnLinear, Bf16WeightsMatchF32OfRoundedWeights) {
  nn::ColumnLinear<BF16ParamsPolicy> lb(16, 8);
  nn::ColumnLinear<DefaultPolicy> lf(16, 8);
  lb.init(Key::from_seed(1), 0.3f);
  for (std::size_t i = 0; i < lf.weight.value.size(); ++i) lf.weight.data()[i] = to_f32(lb.weight.data()[i]);
  auto x = randn(3 * 16, 4);
  std::vector<float> yb(3 * 8), yf(3 * 8);
  lb.apply(x.data(), 3, yb.data());
  lf.apply(x.data(), 3, yf.data());
  for (std::size_t i = 0; i < yb.size(); ++i) EXPECT_NEAR(yb[i], yf[i], 1e-5);
}
