// Llama on MPI ranks (models/llama/sharded.hpp, optim/sharded_optimizer.hpp over the MPI
// backend): logits, loss, gradients and five training steps on 2 and 4 ranks (1 or 2 devices
// per rank) equal, bit for bit, the simulated mesh of the same shape.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <vector>

#include <edl/mesh/all.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/optim/sharded_optimizer.hpp>

#include "session.hpp"

namespace edl {
namespace {

using test::g_session;
using Dims = std::array<std::int64_t, 4>;

models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.validate();
  return c;
}

std::vector<std::int64_t> tokens(std::int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<std::int64_t>(g() % 64u);
  return t;
}

std::vector<Dims> meshes_for(std::int64_t devices) {
  if (devices == 2) return {{2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2}};
  if (devices == 4) return {{2, 1, 2, 1}, {1, 2, 2, 1}, {1, 4, 1, 1}, {2, 1, 1, 2}};
  return {};
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> logits, grads, params;
};

// Logits, loss and gradients, then five AdamW steps, on `mesh`.
Outcome run(const models::LlamaForCausalLM<>& model, const DefaultMesh& mesh) {
  constexpr std::int64_t B = 4, S = 8;
  Outcome r;
  models::ShardedLlama<> sm(model, mesh);
  const auto ids = tokens(B * S, 1);
  const auto lg = sm.logits(ids.data(), B, S);
  r.logits.assign(lg.begin(), lg.end());
  sm.zero_grad();
  r.losses.push_back(sm.loss_and_grads(ids.data(), nullptr, B, S).loss);
  for (const auto& [name, g] : sm.gather_grads()) r.grads.insert(r.grads.end(), g.begin(), g.end());
  optim::OptimizerOptions o;
  o.weight_decay = 0.1;
  optim::ShardedOptimizer<models::ShardedLlama<>> opt(o, sm);
  for (unsigned step = 0; step < 5; ++step) {
    if (step > 0) {
      const auto t = tokens(B * S, 10 + step);
      sm.zero_grad();
      r.losses.push_back(sm.loss_and_grads(t.data(), nullptr, B, S).loss);
    }
    opt.clip_by_global_norm(sm, 1.0);
    opt.step(sm, 1e-2);
  }
  const auto m = sm.gather_model();
  auto& mm = const_cast<models::LlamaForCausalLM<>&>(m);
  mm.visit_params("", [&](std::string_view, auto& p) { r.params.insert(r.params.end(), p.data(), p.data() + p.numel()); });
  // The gathered optimizer state is complete on every rank (a checkpoint can be written from it).
  const optim::Optimizer full = opt.gather(sm);
  EXPECT_GT(full.state_bytes(), 0);
  EXPECT_EQ(full.step_count(), 5);
  return r;
}

class MpiLlama : public ::testing::TestWithParam<int> {};

TEST_P(MpiLlama, EqualsSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaForCausalLM<> model(config());
  model.init(Key::from_seed(3), 0.2f);
  for (const Dims& dims : meshes_for(devices)) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const Outcome want = run(model, create_mesh(dims));
    auto real = create_mesh(dims);
    mpi::attach(real, *g_session, local);
    const Outcome got = run(model, real);
    EXPECT_EQ(got.losses, want.losses);  // five training steps, exactly
    ASSERT_EQ(got.logits.size(), want.logits.size());
    EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)), 0);
    ASSERT_EQ(got.grads.size(), want.grads.size());
    EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), got.grads.size() * sizeof(float)), 0);
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), got.params.size() * sizeof(float)), 0);
  }
}
INSTANTIATE_TEST_SUITE_P(LocalDevices, MpiLlama, ::testing::Values(1, 2));

}  // namespace
}  // namespace edl
