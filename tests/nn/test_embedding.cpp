#include <gtest/gtest.h>

#include <edl/nn/embedding.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnEmbedding, GatherAndScatterAddMatchFiniteDifferences) {
  const std::int64_t V = 11, H = 6;
  nn::Embedding<DefaultPolicy> emb(V, H);
  emb.init(Key::from_seed(5), 1.0f);
  std::vector<std::int64_t> ids = {3, 0, 3, 10, 7, 3, 0};
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  std::vector<float> y(T * H);
  nn::Embedding<DefaultPolicy>::Saved s;
  emb.forward(ids.data(), T, y.data(), s);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t j = 0; j < H; ++j) EXPECT_EQ(y[t * H + j], emb.weight.value(ids[t], j));
  auto c = randn(T * H, 7);
  emb.backward(c.data(), s);
  auto loss = [&] {
    std::vector<float> yy(T * H);
    emb.apply(ids.data(), T, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dW", emb.weight.data(), emb.weight.value.size(), emb.weight.grad.data(), loss, 66);
  // Row 3 is used three times: its gradient is the sum, rows never used get 0.
  for (std::int64_t j = 0; j < H; ++j) {
    EXPECT_NEAR(emb.weight.grad(3, j), c[0 * H + j] + c[2 * H + j] + c[5 * H + j], 1e-6);
    EXPECT_EQ(emb.weight.grad(1, j), 0.0f);
  }
}

TEST(NnEmbedding, RejectsOutOfRangeIds) {
  nn::Embedding<DefaultPolicy> emb(4, 2);
  std::vector<std::int64_t> ids = {1, 4};
  std::vector<float> y(4);
  EXPECT_THROW(emb.apply(ids.data(), 2, y.data()), Error);
  static_assert(std::is_same_v<nn::Embedding<DefaultPolicy>::WeightParam::spec, P<"tp", none>>);
}
