#include <gtest/gtest.h>

#include <edl/nn/decoder_layer.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnDecoderLayer, BackwardMatchesFiniteDifferences) {
  nn::DecoderLayerConfig cfg;
  cfg.attention = {.hidden = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .qkv_bias = false, .o_bias = false, .sliding_window = {}, .rope = {}};
  cfg.intermediate = 24;
  cfg.rms_norm_eps = 1e-5;
  nn::DecoderLayer<DefaultPolicy> layer(cfg);
  layer.init(Key::from_seed(4), 0.3f);
  fill_randn(layer.input_layernorm.weight.data(), 16, 8, 1.0f);
  const std::int64_t B = 2, S = 5, T = B * S, H = 16;
  nn::TokenLayout lay{B, S};
  auto x = randn(T * H, 1);
  auto c = randn(T * H, 2);
  std::vector<float> y(T * H), dx(T * H);
  nn::DecoderLayer<DefaultPolicy>::Saved s;
  layer.forward(x.data(), lay, y.data(), s);
  layer.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(T * H);
    layer.apply(x.data(), lay, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss, 40);
  std::vector<std::string> names;
  layer.visit_params("model.layers.3", [&](std::string_view path, auto& p) {
    names.emplace_back(path);
    expect_fd(std::string(path), p.data(), p.value.size(), p.grad.data(), loss, 12);
  });
  EXPECT_EQ(names.front(), "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(names[1], "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(names.back(), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(names.size(), 9u);
}
