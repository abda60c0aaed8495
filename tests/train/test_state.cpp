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

// One step of batch b (2 x 12 tokens): gradients, clipping at 1, lr 1e-2; returns the loss.
double run_step(TrainingState<>& st, std::uint32_t b) {
  const auto ids = tokens(2, 12, b);
  optim::zero_grad(st.model);
  const double loss = st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr).loss;
  st.apply_gradients(1e-2, 1.0);
  return loss;
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


// init_tx: a new optimizer with fresh slots; the model and the step stay. Lion's first update
// from empty moments is w - lr * sign(g) (no decay), which the new optimizer must take.
TEST(TrainingState, InitTxStartsAFreshOptimizer) {
  auto st = TrainingState<>::create(state_model(), {.kind = optim::OptimizerKind::adamw});
  for (std::uint32_t b = 0; b < 2; ++b) {
    const auto ids = tokens(2, 12, b);
    optim::zero_grad(st.model);
    st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr);
    st.apply_gradients(1e-2);
  }
  const std::vector<float> w = flat_params(st.model);
  ASSERT_GT(st.optimizer.state_bytes(), 0);
  st.init_tx({.kind = optim::OptimizerKind::lion, .weight_decay = 0.0});
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.optimizer.options().kind, optim::OptimizerKind::lion);
  EXPECT_EQ(st.optimizer.step_count(), 0);
  EXPECT_EQ(st.optimizer.state_bytes(), 0);
  EXPECT_EQ(flat_params(st.model), w);
  const auto ids = tokens(2, 12, 2);
  optim::zero_grad(st.model);
  st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr);
  const std::vector<float> g = flat_grads(st.model);
  const float lr = 1e-3f;
  st.apply_gradients(lr);
  EXPECT_EQ(st.step, 3);
  const std::vector<float> w1 = flat_params(st.model);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float sign = g[i] > 0 ? 1.0f : (g[i] < 0 ? -1.0f : 0.0f);
    ASSERT_FLOAT_EQ(w1[i], w[i] - lr * sign) << i;
  }
}

// shard_model / gather_model move the model alone: the state's optimizer is untouched, and
// the gathered model is the one that was sharded.
TEST(TrainingState, ShardModelAndGatherModelLeaveTheOptimizer) {
  auto st = TrainingState<>::create(state_model(), {.kind = optim::OptimizerKind::adamw});
  const auto ids = tokens(2, 12, 0);
  optim::zero_grad(st.model);
  const double loss = st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr).loss;
  st.apply_gradients(1e-2);
  const std::int64_t opt_bytes = st.optimizer.state_bytes();
  auto sm = st.shard_model(create_mesh({1, 2, 1, 1}));
  EXPECT_EQ(st.optimizer.state_bytes(), opt_bytes);
  EXPECT_EQ(flat_params(st.model), [&] {
    auto m = sm->gather_model();
    return flat_params(m);
  }());
  const double sharded_loss = sm->loss_and_grads(ids.data(), nullptr, 2, 12).loss;
  EXPECT_NEAR(sharded_loss, st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr).loss, 1e-5 * loss);
  auto sh = st.shard_state(create_mesh({1, 1, 2, 1}));
  auto gathered = sh.gather_model();
  EXPECT_EQ(flat_params(gathered), flat_params(st.model));
}

// User partition rules reach the sharded state; shardings() names every parameter's and slot's
// spec; shard_with_shape lays a state out by such a map (the same specs, the same step) and
// names what is missing, unknown or inconsistent.
TEST(TrainingState, UserRulesShardingsAndShardWithShape) {
  const optim::OptimizerOptions adamw{.kind = optim::OptimizerKind::adamw};
  auto st = TrainingState<>::create(state_model(), adamw);
  const auto ids = tokens(4, 12, 0);
  optim::zero_grad(st.model);
  st.model.forward_backward(ids.data(), nn::TokenLayout{4, 12}, nullptr);
  st.apply_gradients(1e-2);  // slots exist now
  const auto mesh = create_mesh({1, 2, 1, 1});
  const auto q = std::string("model.layers.0.self_attn.q_proj.weight");

  auto by_default = st.shard_state(mesh);
  const Shardings specs = by_default.shardings();
  ASSERT_TRUE(specs.count(q));
  EXPECT_EQ(specs.at(q).str(), by_default.model->param(q).layout().spec().str());
  EXPECT_TRUE(specs.count(q + ".exp_avg") && specs.count(q + ".exp_avg_sq"));
  EXPECT_EQ(specs.at(q + ".exp_avg").dims, specs.at(q).dims);

  auto replicated = st.shard_state(mesh, PartitionRules{{".*", SpecValue{}}});
  EXPECT_NE(replicated.shardings().at(q).str(), specs.at(q).str());
  EXPECT_EQ(replicated.size_bytes(0).parameters, st.size_bytes().parameters);  // every device holds all

  auto again = st.shard_with_shape(mesh, specs);
  EXPECT_EQ(again.shardings(), specs);
  EXPECT_EQ(again.step, 1);
  // The three layouts take the same step.
  const auto ids2 = tokens(4, 12, 1);
  std::vector<double> losses;
  for (auto* s : {&by_default, &replicated, &again}) {
    s->model->zero_grad();
    losses.push_back(s->model->loss_and_grads(ids2.data(), nullptr, 4, 12).loss);
    s->apply_gradients(1e-2);
  }
  EXPECT_EQ(losses[2], losses[0]);
  EXPECT_NEAR(losses[1], losses[0], 1e-5 * losses[0]);
  auto a = again.gather_state(), b = by_default.gather_state();
  EXPECT_EQ(flat_params(a.model), flat_params(b.model));

  const auto refused = [&](Shardings m, const std::string& what) {
    try {
      st.shard_with_shape(mesh, m);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Shardings missing = specs;
  missing.erase(q);
  refused(missing, "no spec for parameter \"" + q + "\"");
  Shardings unknown = specs;
  unknown["model.layers.9.mlp.weight"] = SpecValue{};
  refused(unknown, "model.layers.9.mlp.weight");
  Shardings slot = specs;
  slot[q + ".exp_avg"] = SpecValue{};
  refused(slot, "slots are laid out like their parameter");
}

// save_state(float_dtype, save_optimizer): a bf16 weights-only copy is about half the size,
// loads into f32 as the bf16 rounding of the weights, and needs the optimizer to start; a full
// checkpoint loads with the optimizer it recorded; config overrides change what the shapes allow.
TEST(TrainingState, FloatDtypeWeightsOnlySavesAndLoadOverrides) {
  const optim::OptimizerOptions adamw{.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1};
  const fs::path dir = fs::temp_directory_path() / ("edl_state_opts_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto a = TrainingState<>::create(state_model(), adamw);
  run_step(a, 0);
  run_step(a, 1);
  const std::string full = (dir / "full").string(), half = (dir / "bf16").string();
  a.save_state(full);
  a.save_state(half, {.float_dtype = DType::bf16, .save_optimizer = false});
  EXPECT_FALSE(fs::exists(fs::path(half) / "optimizer.safetensors"));
  EXPECT_FALSE(TrainState::from_file((fs::path(half) / "state.json").string()).optimizer_saved);
  EXPECT_LT(fs::file_size(fs::path(half) / "model.safetensors"), fs::file_size(fs::path(full) / "model.safetensors") * 55 / 100);

  try {
    TrainingState<>::load_state(half);
    ADD_FAILURE() << "a weights-only checkpoint loaded without an optimizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights-only"), std::string::npos) << e.what();
  }
  auto h = TrainingState<>::load_state(half, adamw);
  EXPECT_EQ(h.step, 2);
  EXPECT_EQ(h.optimizer.step_count(), 0);
  EXPECT_EQ(h.optimizer.state_bytes(), 0);
  const std::vector<float> w = flat_params(a.model), wh = flat_params(h.model);
  ASSERT_EQ(w.size(), wh.size());
  for (std::size_t i = 0; i < w.size(); ++i) ASSERT_EQ(wh[i], static_cast<float>(bf16(w[i]))) << i;

  // The optimizer comes from the checkpoint when not given: the run continues bit for bit.
  auto f = TrainingState<>::load_state(full);
  EXPECT_EQ(f.optimizer.options().kind, optim::OptimizerKind::adamw);
  EXPECT_EQ(f.optimizer.options().weight_decay, 0.1);
  EXPECT_EQ(f.optimizer.step_count(), 2);
  auto a2 = a;
  EXPECT_EQ(run_step(f, 2), run_step(a2, 2));
  EXPECT_EQ(flat_params(f.model), flat_params(a2.model));

  LoadStateOptions o;
  o.config_overrides = {{"rope_theta", 500000.0}, {"max_position_embeddings", 64}};
  auto r = TrainingState<>::load_state(full, o);
  EXPECT_EQ(r.model.config().rope_theta, 500000.0);
  EXPECT_EQ(r.model.config().max_position_embeddings, 64);
  EXPECT_EQ(flat_params(r.model), flat_params(a.model));
  o.config_overrides = {{"intermediate_size", 96}};  // the weights no longer fit
  try {
    TrainingState<>::load_state(full, o);
    ADD_FAILURE() << "weights of the wrong shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp"), std::string::npos) << e.what();
  }
  o.config_overrides = 3;
  EXPECT_THROW(TrainingState<>::load_state(full, o), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace edl::train
