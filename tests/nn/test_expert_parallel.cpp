// tests/nn/test_expert_parallel.cpp: a mixture-of-experts block whose experts are split over an
// "ep" mesh axis (nn/expert_parallel.hpp) against the same block on one device: each device
// routes its own slice of the tokens, and outputs, input gradients and every weight gradient
// (an expert's on the rank that holds it, the router's summed over the ranks) equal one
// device's to f32 rounding -- with balanced routing and with every token sent to one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <edl/mesh/mesh.hpp>
#include <edl/nn/expert_parallel.hpp>
#include <edl/nn/moe.hpp>

using namespace edl;

namespace {

using MoE = nn::MoE<DefaultPolicy>;

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void expect_close(const float* want, const float* got, std::size_t n, const std::string& what) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(double(want[i])));
    err = std::max(err, std::fabs(double(want[i]) - double(got[i])));
  }
  EXPECT_LE(err, 1e-5 * std::max(scale, 1e-12)) << what << ": max error " << err << ", max |want| " << scale;
}

std::map<std::string, std::vector<float>> grads_of(MoE& m) {
  std::map<std::string, std::vector<float>> g;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (p.has_grad()) g[std::string(path)] = std::vector<float>(p.grad.begin(), p.grad.end());
  });
  return g;
}

/// The block on one device and on an ep mesh of `ranks`, tokens split evenly.
void expect_ep_matches_one_device(const MoE& block, std::int64_t ranks, std::int64_t T, bool shared_tokens_to_one_rank) {
  SCOPED_TRACE("ep = " + std::to_string(ranks) + (shared_tokens_to_one_rank ? ", every token to rank 0" : ""));
  const nn::MoeConfig& c = block.config();
  const std::int64_t H = c.hidden, E = c.num_experts, Tl = T / ranks;
  const auto x = randn(static_cast<std::size_t>(T * H), 3);
  const auto dy = randn(static_cast<std::size_t>(T * H), 4);

  MoE ref = block;
  MoE::Saved rs;
  std::vector<float> y_ref(x.size()), dx_ref(x.size());
  ref.forward(x.data(), T, y_ref.data(), rs);
  ref.backward(dy.data(), rs, dx_ref.data());
  const auto g_ref = grads_of(ref);

  auto mesh = create_mesh({1, 1, ranks, 1, 1});
  std::vector<MoE> blocks(static_cast<std::size_t>(ranks), block);
  std::vector<float> y(x.size()), dx(x.size());
  std::vector<std::int64_t> max_rows(static_cast<std::size_t>(ranks));
  mesh.run([&](Device& dev) {
    const std::int64_t r = dev.axis_index("ep");
    MoE& m = blocks[static_cast<std::size_t>(r)];
    nn::ExpertParallel<DefaultPolicy> ep(dev);
    MoE::Saved s;
    m.forward(x.data() + r * Tl * H, Tl, y.data() + r * Tl * H, s, &ep);
    m.backward(dy.data() + r * Tl * H, s, dx.data() + r * Tl * H, &ep);
    max_rows[static_cast<std::size_t>(r)] = s.exchange.back();
  });
  expect_close(y_ref.data(), y.data(), y.size(), "outputs");
  expect_close(dx_ref.data(), dx.data(), dx.size(), "input gradients");
  if (shared_tokens_to_one_rank) {  // dropless: the chunk grew to hold every row of a device
    EXPECT_EQ(max_rows[0], Tl * c.top_k);
  }

  // An expert's gradient lives on its rank alone; the router's is a sum over the ranks.
  std::vector<std::map<std::string, std::vector<float>>> got;
  for (auto& m : blocks) got.push_back(grads_of(m));
  for (const auto& [name, want] : g_ref) {
    const std::int64_t e = name.rfind("experts.", 0) == 0 ? std::stoll(name.substr(8)) : -1;
    std::vector<float> sum(want.size(), 0.0f);
    for (std::int64_t r = 0; r < ranks; ++r) {
      const auto& g = got[static_cast<std::size_t>(r)];
      const auto it = g.find(name);
      const bool owner = e >= 0 && nn::expert_owner(e, E, ranks) == r;
      if (e >= 0 && !owner) {
        const bool untouched = it == g.end() || std::all_of(it->second.begin(), it->second.end(), [](float v) { return v == 0.0f; });
        EXPECT_TRUE(untouched) << name << " has a gradient on rank " << r << ", which does not hold it";
        continue;
      }
      ASSERT_NE(it, g.end()) << name << " on rank " << r;
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += it->second[i];
    }
    expect_close(want.data(), sum.data(), want.size(), "gradient of " + name);
  }
}

MoE make_block(bool shared_expert) {
  nn::MoeConfig c{.hidden = 16, .intermediate = 24, .num_experts = 4, .top_k = 2};
  if (shared_expert) {
    c.norm_topk_prob = false;
    c.shared_intermediate = 20;
    c.names = nn::MoeConfig::Names::qwen;
  }
  MoE m(c);
  m.init(Key::from_seed(shared_expert ? 8 : 7), 0.3f);
  return m;
}

}  // namespace

TEST(NnExpertParallel, SplitExpertsMatchOneDevice) {
  for (const bool shared : {false, true})
    for (const std::int64_t ranks : {2, 4}) expect_ep_matches_one_device(make_block(shared), ranks, 16, false);
}

// A router of zeros ties every expert, so every token picks experts 0 and 1, both on rank 0:
// the busiest exchange carries all of a device's rows and none is dropped.
TEST(NnExpertParallel, EveryTokenToOneRankIsDropless) {
  MoE m = make_block(false);
  m.gate.weight.value.fill(0.0f);
  expect_ep_matches_one_device(m, 2, 12, true);
}

TEST(NnExpertParallel, ExpertsMustSplitEvenly) {
  MoE m = make_block(false);  // 4 experts
  auto mesh = create_mesh({1, 1, 3, 1, 1});
  const auto x = randn(16 * 3, 5);
  std::vector<float> y(x.size());
  try {
    mesh.run([&](Device& dev) {
      MoE local = m;
      nn::ExpertParallel<DefaultPolicy> ep(dev);
      MoE::Saved s;
      local.forward(x.data() + dev.axis_index("ep") * 16, 1, y.data() + dev.axis_index("ep") * 16, s, &ep);
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 experts do not split over ep = 3"), std::string::npos) << e.what();
  }
}
