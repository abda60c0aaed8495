// A Linear with a LoRA adapter: forward against the naive W x + scale B (A x), backward against
// finite differences (with and without dropout, over a float and an nf4 base), and the
// base frozen.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <edl/nn/linear.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

namespace {

using Lin = nn::ColumnLinear<DefaultPolicy>;

Lin adapted_linear(std::int64_t in, std::int64_t out, std::int64_t r, float dropout) {
  Lin lin(in, out, /*bias=*/true);
  lin.init(Key::from_seed(3), 0.5f);
  fill_randn(lin.bias.data(), static_cast<std::size_t>(out), 9, 0.5f);
  lin.lora.emplace(in, out, r, /*alpha=*/2.0 * static_cast<double>(r), /*rslora=*/false, dropout);
  lin.lora->reset(Key::from_seed(4));
  fill_randn(lin.lora->B.data(), static_cast<std::size_t>(out * r), 5, 0.5f);  // a trained adapter
  lin.weight.frozen = true;
  return lin;
}

// y = x W^T + b + scale * h A^T B^T in double, h = x with dropped elements zeroed and kept ones scaled.
std::vector<double> naive(const Lin& lin, const std::vector<float>& x, std::int64_t rows) {
  const auto& a = *lin.lora;
  const std::int64_t in = lin.in_features(), out = lin.out_features(), r = a.rank();
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  std::vector<float> w(static_cast<std::size_t>(out * in));
  if (lin.is_quantized()) lin.qweight.dequantize(w.data());
  else std::copy(lin.weight.data(), lin.weight.data() + w.size(), w.begin());
  for (std::int64_t t = 0; t < rows; ++t) {
    std::vector<double> h(static_cast<std::size_t>(in)), u(static_cast<std::size_t>(r));
    for (std::int64_t i = 0; i < in; ++i)
      h[i] = a.drops() ? (a.keeps(t, i) ? x[t * in + i] / (1.0 - a.dropout) : 0.0) : x[t * in + i];
    for (std::int64_t k = 0; k < r; ++k)
      for (std::int64_t i = 0; i < in; ++i) u[k] += h[i] * a.A.data()[k * in + i];
    for (std::int64_t o = 0; o < out; ++o) {
      double s = lin.bias.data()[o];
      for (std::int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
      double d = 0;
      for (std::int64_t k = 0; k < r; ++k) d += a.B.data()[o * r + k] * u[k];
      y[t * out + o] = s + a.scale * d;
    }
  }
  return y;
}

void check_forward_backward(Lin& lin, std::int64_t rows) {
  const std::int64_t in = lin.in_features(), out = lin.out_features();
  auto x = randn(static_cast<std::size_t>(rows * in), 1);
  const auto c = randn(static_cast<std::size_t>(rows * out), 2);
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  Lin::Saved s;
  lin.forward(x.data(), rows, y.data(), s);
  const auto ref = naive(lin, x, rows);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;

  std::vector<float> dx(x.size());
  lin.backward(c.data(), s, dx.data());
  EXPECT_FALSE(lin.weight.has_grad());  // the base is frozen: no gradient buffer
  EXPECT_EQ(lin.weight.grad.size(), 0u);
  auto loss = [&] {
    std::vector<float> yy(y.size());
    lin.apply(x.data(), rows, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss);
  expect_fd("dA", lin.lora->A.data(), lin.lora->A.value.size(), lin.lora->A.grad.data(), loss);
  expect_fd("dB", lin.lora->B.data(), lin.lora->B.value.size(), lin.lora->B.grad.data(), loss);
  expect_fd("db", lin.bias.data(), static_cast<std::size_t>(out), lin.bias.grad.data(), loss);
}

}  // namespace

TEST(NnLowRankAdapter, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  Lin lin = adapted_linear(12, 10, 3, 0.0f);
  check_forward_backward(lin, 5);
}

TEST(NnLowRankAdapter, DropoutIsAFixedMaskPerKeyAndItsGradientIsExact) {
  Lin lin = adapted_linear(12, 10, 3, 0.3f);
  lin.lora->dropout_key = Key::from_seed(11);
  check_forward_backward(lin, 6);
  // About p of the elements dropped; another key drops others.
  int dropped = 0, differ = 0;
  Lin::Adapter other = *lin.lora;
  other.dropout_key = Key::from_seed(12);
  for (std::int64_t t = 0; t < 50; ++t)
    for (std::int64_t j = 0; j < 12; ++j) {
      dropped += !lin.lora->keeps(t, j);
      differ += lin.lora->keeps(t, j) != other.keeps(t, j);
    }
  EXPECT_NEAR(dropped / 600.0, 0.3, 0.06);
  EXPECT_GT(differ, 100);
}

TEST(NnLowRankAdapter, QuantizedBaseGradientsFlowThroughTheDequantizedBlocks) {
  Lin lin = adapted_linear(64, 8, 4, 0.0f);
  lin.weight.frozen = false;
  lin.quantize(quant::Format::nf4, "q_proj.weight");  // f32 activations: a smooth function of x
  check_forward_backward(lin, 3);
  EXPECT_TRUE(lin.is_quantized());
}

TEST(NnLowRankAdapter, FreshAdapterAddsExactZeros) {
  Lin lin(16, 8);
  lin.init(Key::from_seed(1), 0.5f);
  const auto x = randn(4 * 16, 3);
  std::vector<float> before(4 * 8), after(4 * 8);
  lin.apply(x.data(), 4, before.data());
  lin.lora.emplace(16, 8, 4, 8.0, false, 0.0f);
  lin.lora->reset(Key::from_seed(2));
  lin.apply(x.data(), 4, after.data());
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i], after[i]);
  // PEFT's bounds: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0.
  for (std::size_t i = 0; i < lin.lora->A.value.size(); ++i) EXPECT_LE(std::fabs(lin.lora->A.data()[i]), 0.25f);
  EXPECT_GT(max_abs(lin.lora->A.data(), lin.lora->A.value.size()), 0.1);
  EXPECT_EQ(max_abs(lin.lora->B.data(), lin.lora->B.value.size()), 0.0);
}
