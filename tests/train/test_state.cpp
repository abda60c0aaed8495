// Tests for edl/train/state.hpp: apply_gradients against a hand-written clipped SGD step, the
// sharded state following one device on fsdp and tp meshes, save/load continuing bit for bit,
// and the byte accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <edl/core/rng.hpp>
#include <edl/train/state.hpp>

namespace edl::train {
namespace {

namespace fs = std::filesystem;

models::LlamaConfig state_config() {
  models::LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.validate();
  return c;
}

models::LlamaForCausalLM<> state_model() {
  models::LlamaForCausalLM<> m(state_config());
  m.init(Key::from_seed(3));
  return m;
}

// [B, S] random token ids of batch `b`.
std::vector<std::int64_t> tokens(std::int64_t B, std::int64_t S, std::uint32_t b) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(B * S));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int64_t>(random_bits_at(fold_in(Key::from_seed(9), b), i) % 48u);
  return t;
}

std::vector<float> flat_params(models::LlamaForCausalLM<>& m) {
  std::vector<float> v;
  m.visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
  return v;
}
std::vector<float> flat_grads(models::LlamaForCausalLM<>& m) {
  std::vector<float> v;
  m.visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.grad.data(), p.grad.data() + p.numel()); });
  return v;
}

TEST(TrainingState, ApplyGradientsIsAClippedOptimizerStep) {
  // Plain SGD (no momentum, no decay): w' = w - lr * g * min(1, max_norm / |g|), in double.
  auto st = TrainingState<>::create(state_model(), {.kind = optim::OptimizerKind::sgd});
  const auto ids = tokens(2, 12, 0);
  optim::zero_grad(st.model);
  st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr);
  const std::vector<float> w = flat_params(st.model), g = flat_grads(st.model);
  double sq = 0;
  for (float x : g) sq += static_cast<double>(x) * x;
  const double norm = std::sqrt(sq), max_norm = 0.5 * norm, lr = 0.1;
  EXPECT_NEAR(st.apply_gradients(lr, max_norm), norm, 1e-9 * norm);
  EXPECT_EQ(st.step, 1);
  EXPECT_EQ(st.optimizer.step_count(), 1);
  const std::vector<float> w1 = flat_params(st.model);
  ASSERT_EQ(w1.size(), w.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    ASSERT_NEAR(w1[i], w[i] - lr * g[i] * (max_norm / norm), 1e-6) << i;
  // A non-finite gradient is refused before anything changes.
  st.model.visit_params("", [](std::string_view, auto& p) { p.grad.data()[0] = NAN; });
  EXPECT_THROW(st.apply_gradients(lr, 1.0), Error);
  EXPECT_EQ(st.step, 1);
  EXPECT_EQ(flat_params(st.model), w1);
}

TEST(TrainingState, ShardedStateFollowsOneDevice) {
  const optim::OptimizerOptions adamw{.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1};
  const std::int64_t B = 4, S = 12;
  auto one = TrainingState<>::create(state_model(), adamw);
  std::vector<double> ref;
  for (std::uint32_t b = 0; b < 3; ++b) {
    const auto ids = tokens(B, S, b);
    optim::zero_grad(one.model);
    ref.push_back(one.model.forward_backward(ids.data(), nn::TokenLayout{B, S}, nullptr).loss);
    one.apply_gradients(1e-2, 1.0);
  }
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {2, 1, 1, 1}}) {
    SCOPED_TRACE("mesh " + std::to_string(dims[0]) + "," + std::to_string(dims[1]) + "," + std::to_string(dims[2]));
    auto start = TrainingState<>::create(state_model(), adamw);
    auto sh = start.shard_state(create_mesh(dims));
    for (std::uint32_t b = 0; b < 3; ++b) {
      const auto ids = tokens(B, S, b);
      sh.model->zero_grad();
      const double loss = sh.model->loss_and_grads(ids.data(), nullptr, B, S).loss;
      EXPECT_NEAR(loss, ref[b], 1e-5 * ref[b]) << "step " << b + 1;
      sh.apply_gradients(1e-2, 1.0);
    }
    EXPECT_EQ(sh.step, 3);
    auto back = sh.gather_state();
    EXPECT_EQ(back.step, 3);
    EXPECT_EQ(back.optimizer.step_count(), one.optimizer.step_count());
    const auto a = flat_params(back.model), b = flat_params(one.model);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << i;
    one.optimizer.visit_state([&](const std::string& path, const std::string& slot, const std::vector<float>& v) {
      const std::vector<float>* w = back.optimizer.find_slot(path, slot);
      ASSERT_NE(w, nullptr) << path << "." << slot;
      ASSERT_EQ(w->size(), v.size());
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_NEAR((*w)[i], v[i], 1e-5 + 1e-4 * std::fabs(v[i])) << path;
    });
  }
}

TEST(TrainingState, SaveAndLoadContinueBitForBit) {
  const optim::OptimizerOptions adamw{.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1};
  const fs::path dir = fs::temp_directory_path() / ("edl_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto run_step = [](TrainingState<>& st, std::uint32_t b) {
    const auto ids = tokens(2, 12, b);
    optim::zero_grad(st.model);
    const double loss = st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr).loss;
    st.apply_gradients(1e-2, 1.0);
    return loss;
  };
  auto a = TrainingState<>::create(state_model(), adamw);
  run_step(a, 0);
  run_step(a, 1);
  a.save_state((dir / "checkpoint-2").string());
  auto b = TrainingState<>::load_state((dir / "checkpoint-2").string(), adamw);
  EXPECT_EQ(b.step, 2);
  EXPECT_EQ(flat_params(b.model), flat_params(a.model));
  EXPECT_EQ(run_step(b, 2), run_step(a, 2));
  EXPECT_EQ(flat_params(b.model), flat_params(a.model));
  // The folder is a Hugging Face model folder too.
  auto hf = models::from_pretrained<>((dir / "checkpoint-2").string());
  EXPECT_EQ(hf.config().hidden_size, 32);
  try {
    TrainingState<>::load_state((dir / "checkpoint-9").string(), adamw);
    ADD_FAILURE() << "loading a missing folder succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.where()).find("checkpoint-9"), std::string::npos) << e.where();
  }
  fs::remove_all(dir);
}

TEST(TrainingState, SizeInBytes) {
  auto st = TrainingState<>::create(state_model(), {.kind = optim::OptimizerKind::adamw});
  const std::int64_t n = static_cast<std::int64_t>(flat_params(st.model).size());
  StateBytes s0 = st.size_bytes();
  EXPECT_EQ(s0.parameters, 4 * n);
  EXPECT_EQ(s0.optimizer, 0);  // slots appear at the first update
  const auto ids = tokens(2, 12, 0);
  optim::zero_grad(st.model);
  st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr);
  st.apply_gradients(1e-3);
  const StateBytes s1 = st.size_bytes();
  EXPECT_EQ(s1.gradients, 4 * n);
  EXPECT_EQ(s1.optimizer, 2 * 4 * n);  // AdamW: m and v
  EXPECT_EQ(s1.total(), 4 * 4 * n);
  // fsdp=2: each device holds part of the parameters and of the optimizer state, and the two
  // together hold at least everything (1-D norm weights are replicated).
  auto sh = st.shard_state(create_mesh({1, 2, 1, 1}));
  const StateBytes d0 = sh.size_bytes(0), d1 = sh.size_bytes(1);
  EXPECT_LT(d0.parameters, s1.parameters * 6 / 10);
  EXPECT_LT(d0.optimizer, s1.optimizer * 6 / 10);
  EXPECT_GE(d0.parameters + d1.parameters, s1.parameters);
  EXPECT_GE(d0.optimizer + d1.optimizer, s1.optimizer);
  EXPECT_EQ(d0.optimizer, 2 * d0.parameters);
}

}  // namespace
}  // namespace edl::train
