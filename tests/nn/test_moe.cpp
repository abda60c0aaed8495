// tests/nn/test_moe.cpp: the sparse mixture-of-experts block against a PyTorch reference
// (scripts/moe_reference.py: HF MixtralSparseMoeBlock, transformers' load-balancing loss and
// the router z-loss, in float64) for Mixtral's routing and Qwen2-MoE's (no renormalisation),
// and against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <edl/io/safetensors.hpp>
#include <edl/nn/moe.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

namespace {

std::filesystem::path fixture(const std::string& name) {
  const char* d = std::getenv("EDL_TEST_DATA");
  return std::filesystem::path(d ? d : "tests/data") / "tiny_moe" / (name + ".safetensors");
}

struct Case {
  io::SafeTensorsFile f;
  nn::MoE<DefaultPolicy> moe;
  std::int64_t T = 0, H = 0;
  std::vector<float> vec(const std::string& n) const {
    const auto a = f.read_f32(n);
    return {a.begin(), a.end()};
  }
};

Case load(const std::string& name) {
  auto f = io::SafeTensorsFile::open(fixture(name).string());
  const auto& m = f.metadata();
  nn::MoeConfig c;
  c.hidden = std::stoll(m.at("hidden"));
  c.intermediate = std::stoll(m.at("intermediate"));
  c.num_experts = std::stoll(m.at("num_experts"));
  c.top_k = std::stoll(m.at("top_k"));
  c.norm_topk_prob = m.at("norm_topk_prob") == "true";
  Case k{std::move(f), nn::MoE<DefaultPolicy>(c)};
  k.moe.visit_params("", [&](std::string_view path, auto& p) {
    const auto v = k.f.read_f32(std::string(path));
    ASSERT_EQ(v.size(), p.value.size()) << path;
    std::copy(v.begin(), v.end(), p.data());
  });
  k.H = c.hidden;
  k.T = static_cast<std::int64_t>(k.vec("x").size()) / c.hidden;
  return k;
}

void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * scale + 1e-7) << what << "[" << i << "]";
}

}  // namespace

class MoeReference : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeReference, ForwardLossesAndGradientsEqualPyTorch) {
  auto k = load(GetParam());
  const auto x = k.vec("x"), dy = k.vec("dy");
  const float aux_coef = k.vec("aux_coef")[0], z_coef = k.vec("z_coef")[0];
  std::vector<float> y(x.size()), dx(x.size());
  nn::MoE<DefaultPolicy>::Saved s;
  k.moe.forward(x.data(), k.T, y.data(), s);
  expect_close("y", y, k.vec("y"), 1e-5);
  EXPECT_NEAR(k.moe.aux_loss(s), k.vec("aux_loss")[0], 1e-6);
  EXPECT_NEAR(k.moe.z_loss(s), k.vec("z_loss")[0], 1e-5 * std::fabs(k.vec("z_loss")[0]));
  k.moe.aux_loss_backward(s, aux_coef);
  k.moe.z_loss_backward(s, z_coef);
  k.moe.backward(dy.data(), s, dx.data());
  expect_close("dx", dx, k.vec("dx"), 1e-5);
  k.moe.visit_params("", [&](std::string_view path, auto& p) {
    const std::vector<float> g(p.grad.begin(), p.grad.end());
    expect_close("grad " + std::string(path), g, k.vec("grad." + std::string(path)), 1e-5);
  });
}

INSTANTIATE_TEST_SUITE_P(Routing, MoeReference, ::testing::Values("mixtral", "qwen2_moe"));

// Finite differences of L = sum(c * y) + a * aux + b * z through the routing weights, the
// softmax and every expert (the fixture's routing has no near ties, so a small step keeps the
// chosen experts).
TEST(Moe, GradientsMatchFiniteDifferences) {
  auto k = load("mixtral");
  auto x = k.vec("x");
  const auto c = k.vec("dy");
  const float a = 0.5f, b = 0.1f;
  std::vector<float> y(x.size()), dx(x.size());
  nn::MoE<DefaultPolicy>::Saved s;
  k.moe.forward(x.data(), k.T, y.data(), s);
  k.moe.aux_loss_backward(s, a);
  k.moe.z_loss_backward(s, b);
  k.moe.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(x.size());
    nn::MoE<DefaultPolicy>::Saved t;
    k.moe.forward(x.data(), k.T, yy.data(), t);
    return functional(yy.data(), c) + a * k.moe.aux_loss(t) + b * k.moe.z_loss(t);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss, 24, 1e-3f);
  k.moe.visit_params("", [&](std::string_view path, auto& p) {
    expect_fd(std::string(path), p.data(), p.value.size(), p.grad.data(), loss, 12, 1e-3f);
  });
}

// Router jitter (Mixtral's training-time router_jitter_noise): with a key the block equals the
// plain block on x times factors drawn uniformly from [1 - j, 1 + j] (computed here from the
// counter definition: the element's place t * hidden + j), and its input gradient is the plain
// one times the factors; the weights' gradients are the plain block's on the jittered input;
// without a key nothing is jittered; another key draws other factors.
TEST(Moe, RouterJitterScalesTheInputAndItsGradient) {
  auto plain = load("mixtral");
  auto jit = load("mixtral");
  const float j = 0.1f;
  const Key key = Key::from_seed(5);
  jit.moe.jitter = j;
  const auto x = plain.vec("x"), dy = plain.vec("dy");
  const std::int64_t H = plain.H;
  std::vector<float> u(x.size()), xu(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    u[i] = 1.0f - j + 2.0f * j * bits_to_unit_float(random_bits_at(key, i));
    xu[i] = x[i] * u[i];
  }
  std::vector<float> y0(x.size()), y1(x.size()), dx0(x.size()), dx1(x.size());
  nn::MoE<DefaultPolicy>::Saved s0, s1;
  jit.moe.forward(x.data(), jit.T, y1.data(), s1);  // no key yet: no jitter
  plain.moe.forward(x.data(), plain.T, y0.data(), s0);
  EXPECT_EQ(y0, y1);
  jit.moe.jitter_key = key;
  jit.moe.forward(x.data(), jit.T, y1.data(), s1);
  plain.moe.forward(xu.data(), plain.T, y0.data(), s0);
  EXPECT_EQ(y0, y1);
  plain.moe.backward(dy.data(), s0, dx0.data());
  jit.moe.backward(dy.data(), s1, dx1.data());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dx1[i], dx0[i] * u[i]) << i;
  std::vector<std::vector<float>> g0, g1;
  plain.moe.visit_params("", [&](std::string_view, auto& p) { g0.emplace_back(p.grad.begin(), p.grad.end()); });
  jit.moe.visit_params("", [&](std::string_view, auto& p) { g1.emplace_back(p.grad.begin(), p.grad.end()); });
  EXPECT_EQ(g0, g1);
  jit.moe.jitter_key = Key::from_seed(6);
  std::vector<float> y2(x.size());
  jit.moe.forward(x.data(), jit.T, y2.data(), s1);
  EXPECT_NE(y2, y1);
  EXPECT_EQ(static_cast<std::int64_t>(x.size()) % H, 0);
}

TEST(Moe, NamesCountsAndBadConfigs) {
  nn::MoE<DefaultPolicy> m(nn::MoeConfig{8, 12, 4, 2, true});
  std::vector<std::string> names;
  m.visit_params("model.layers.0.block_sparse_moe", [&](std::string_view p, auto&) { names.emplace_back(p); });
  ASSERT_EQ(names.size(), 1u + 4u * 3u);
  EXPECT_EQ(names[0], "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(names[1], "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(names[2], "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(names[3], "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(m.param_count(), 4 * 8 + 4 * 3 * 8 * 12);
  // What runs per token: the router and k = 2 of the 4 experts.
  EXPECT_DOUBLE_EQ(m.flops_forward(5), 2.0 * 5 * 8 * 4 + 2 * (3 * 2.0 * 5 * 8 * 12));
  EXPECT_THROW(nn::MoE<DefaultPolicy>(nn::MoeConfig{8, 12, 4, 5, true}), Error);
  EXPECT_THROW(nn::MoE<DefaultPolicy>(nn::MoeConfig{8, 12, 0, 1, true}), Error);
}

// Every token reaches exactly k experts, and with k = E and no renormalisation the block is the
// probability-weighted sum of all experts, computed here expert by expert.
TEST(Moe, DroplessRoutingAndTheDenseLimit) {
  const std::int64_t H = 6, I = 10, E = 3, T = 7;
  nn::MoE<DefaultPolicy> m(nn::MoeConfig{H, I, E, E, false});
  m.init(Key::from_seed(4), 0.3f);
  const auto x = randn(static_cast<std::size_t>(T * H), 9);
  std::vector<float> y(x.size());
  nn::MoE<DefaultPolicy>::Saved s;
  m.forward(x.data(), T, y.data(), s);
  std::size_t routed = 0;
  for (const auto& r : s.rows) routed += r.size();
  EXPECT_EQ(routed, static_cast<std::size_t>(T * E));
  std::vector<float> want(x.size(), 0.f), ye(x.size()), logits(static_cast<std::size_t>(T * E));
  m.gate.apply(x.data(), T, logits.data());
  for (std::int64_t e = 0; e < E; ++e) {
    m.experts[static_cast<std::size_t>(e)].apply(x.data(), T, ye.data());
    for (std::int64_t t = 0; t < T; ++t) {
      double mx = -1e30, sum = 0;
      for (std::int64_t j = 0; j < E; ++j) mx = std::max(mx, double(logits[t * E + j]));
      for (std::int64_t j = 0; j < E; ++j) sum += std::exp(logits[t * E + j] - mx);
      const double p = std::exp(logits[t * E + e] - mx) / sum;
      for (std::int64_t h = 0; h < H; ++h) want[t * H + h] += static_cast<float>(p * ye[t * H + h]);
    }
  }
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << i;
}
