#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/optim/clip.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/sharded_optimizer.hpp>

#include "../support/small_llama.hpp"

using namespace edl;

namespace {

using Dims = std::array<std::int64_t, 4>;

models::LlamaConfig config() { return test_support::small_llama_config(); }

std::vector<std::int64_t> tokens(std::int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<std::int64_t>(g() % 64u);
  return t;
}

struct Trace {
  std::vector<double> losses, norms;
};

constexpr std::int64_t kBatch = 4, kSeq = 8, kSteps = 3;
constexpr double kLr = 1e-3, kClip = 0.5;

optim::OptimizerOptions options(optim::OptimizerKind k) {
  optim::OptimizerOptions o;
  o.kind = k;
  o.weight_decay = 0.1;
  o.momentum = 0.9;
  return o;
}

/// kSteps of loss, backward, clipping and update on one device.
Trace run_one_device(models::LlamaForCausalLM<>& m, optim::Optimizer& opt) {
  Trace t;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const auto ids = tokens(kBatch * kSeq, 100 + static_cast<unsigned>(s));
    nn::zero_grad(m);
    t.losses.push_back(m.forward_backward(ids.data(), nn::TokenLayout{kBatch, kSeq}, nullptr).loss);
    t.norms.push_back(optim::clip_by_global_norm(m, kClip));
    opt.step(m, kLr);
  }
  return t;
}

/// The same steps on a mesh, with the optimizer state sharded like the parameters.
Trace run_sharded(models::ShardedLlama<>& sm, optim::ShardedOptimizer<models::ShardedLlama<>>& opt) {
  Trace t;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const auto ids = tokens(kBatch * kSeq, 100 + static_cast<unsigned>(s));
    sm.zero_grad();
    t.losses.push_back(sm.loss_and_grads(ids.data(), nullptr, kBatch, kSeq).loss);
    t.norms.push_back(opt.clip_by_global_norm(sm, kClip));
    opt.step(sm, kLr);
  }
  return t;
}

}  // namespace

class ShardedOptimizerMeshes : public ::testing::TestWithParam<std::tuple<Dims, optim::OptimizerKind>> {};

TEST_P(ShardedOptimizerMeshes, TrainingStepsEqualOneDevice) {
  const auto [dims, kind] = GetParam();
  models::LlamaForCausalLM<> ref(config());
  ref.init(Key::from_seed(3), 0.2f);
  models::LlamaForCausalLM<> start = ref;
  optim::Optimizer ref_opt(options(kind));
  const Trace want = run_one_device(ref, ref_opt);

  const DefaultMesh mesh = create_mesh(dims);
  models::ShardedLlama<> sm(start, mesh);
  optim::ShardedOptimizer<models::ShardedLlama<>> opt(options(kind), sm);
  const Trace got = run_sharded(sm, opt);

  for (std::int64_t s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s])) << "step " << s;
    EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << "step " << s;
    EXPECT_GT(want.norms[s], kClip);  // clipping is exercised
  }
  EXPECT_EQ(opt.step_count(), kSteps);
  // Parameters after the updates, and the gathered optimizer state, equal the one-device ones.
  const models::LlamaForCausalLM<> got_model = sm.gather_model();
  auto& gm = const_cast<models::LlamaForCausalLM<>&>(got_model);
  const optim::Optimizer full = opt.gather(sm);
  ref.visit_params("", [&](std::string_view path, auto& p) {
    const std::string name(path);
    const auto& w = sm.param(name);
    (void)w;
    const float* want_w = p.data();
    float* got_w = nullptr;
    gm.visit_params("", [&](std::string_view q, auto& pq) {
      if (q == path) got_w = pq.data();
    });
    ASSERT_NE(got_w, nullptr);
    // RMSprop steps every element by about lr whatever its gradient's size, so an element whose
    // gradient is near the f32 rounding of the mesh's sums moves by a different share of lr:
    // 2e-5 is 0.7 % of the 3 x lr (x momentum) the updates move it.
    const double w_tol = kind == optim::OptimizerKind::rmsprop ? 2e-5 : 2e-6;
    for (std::int64_t i = 0; i < p.numel(); ++i)
      ASSERT_NEAR(got_w[i], want_w[i], w_tol + 2e-5 * std::abs(want_w[i])) << name << "[" << i << "]";
    ref_opt.visit_state([&](const std::string& sp, const std::string& slot, const std::vector<float>& v) {
      if (sp != name) return;
      const std::vector<float>* g = full.find_slot(sp, slot);
      ASSERT_NE(g, nullptr) << sp << "." << slot;
      ASSERT_EQ(g->size(), v.size());
      // Its momentum buffer sums g / sqrt(mean g^2): O(1) values, the same amplification.
      const bool rms_buffer = kind == optim::OptimizerKind::rmsprop && slot == "momentum_buffer";
      const double abs_tol = rms_buffer ? 1e-3 : 1e-6, rel_tol = rms_buffer ? 1e-3 : 1e-4;
      for (std::size_t i = 0; i < v.size(); ++i)
        ASSERT_NEAR((*g)[i], v[i], abs_tol + rel_tol * std::abs(v[i])) << sp << "." << slot << "[" << i << "]";
    });
  });
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShardedOptimizerMeshes,
    ::testing::Combine(::testing::Values(Dims{1, 2, 1, 1}, Dims{2, 1, 1, 1}, Dims{1, 1, 2, 1}, Dims{1, 2, 2, 1},
                                         Dims{2, 1, 1, 2}),
                       ::testing::Values(optim::OptimizerKind::adamw, optim::OptimizerKind::sgd,
                                         optim::OptimizerKind::lion, optim::OptimizerKind::rmsprop)));

TEST(ShardedOptimizer, StateIsShardedAndRoundTripsThroughTheFullState) {
  models::LlamaForCausalLM<> m(config());
  m.init(Key::from_seed(5), 0.2f);
  const DefaultMesh mesh = create_mesh(Dims{1, 2, 1, 1});
  models::ShardedLlama<> sm(m, mesh);
  optim::ShardedOptimizer<models::ShardedLlama<>> opt(options(optim::OptimizerKind::adamw), sm);
  const auto ids = tokens(kBatch * kSeq, 9);
  sm.zero_grad();
  sm.loss_and_grads(ids.data(), nullptr, kBatch, kSeq);
  opt.step(sm, kLr);
  // fsdp=2: each device holds about half of the state (norm weights are replicated).
  optim::Optimizer one(options(optim::OptimizerKind::adamw));
  const std::int64_t total = opt.gather(sm).state_bytes();
  EXPECT_LT(opt.state_bytes(0), total * 0.55);
  EXPECT_EQ(opt.state_bytes(0), opt.state_bytes(1));
  // gather then load gives back every device's blocks bit for bit (a checkpoint moves between meshes).
  optim::ShardedOptimizer<models::ShardedLlama<>> again(options(optim::OptimizerKind::adamw), sm);
  again.load(opt.gather(sm), sm);
  EXPECT_EQ(again.step_count(), opt.step_count());
  for (std::int64_t d = 0; d < 2; ++d)
    opt.device(d).visit_state([&](const std::string& p, const std::string& s, const std::vector<float>& v) {
      const std::vector<float>* w = again.device(d).find_slot(p, s);
      ASSERT_NE(w, nullptr);
      EXPECT_EQ(*w, v) << p << "." << s;
    });
  EXPECT_THROW(again.load(optim::Optimizer(options(optim::OptimizerKind::sgd)), sm), Error);
}

TEST(ShardedOptimizer, AdafactorIsRefusedOnAMesh) {
  models::LlamaForCausalLM<> m(config());
  m.init(Key::from_seed(5), 0.2f);
  models::ShardedLlama<> sm(m, create_mesh(Dims{1, 2, 1, 1}));
  try {
    optim::ShardedOptimizer<models::ShardedLlama<>> opt(options(optim::OptimizerKind::adafactor), sm);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adafactor"), std::string::npos) << e.what();
  }
}
