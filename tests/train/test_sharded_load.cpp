// Tests for edl/train/sharded_load.hpp: a checkpoint saved by one device loads straight into
// the blocks of a sharded model and its optimizer on other mesh shapes, bit for bit; each
// device reads only its block; a checkpoint of another model is a clear error.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <edl/core/rng.hpp>
#include <edl/lora/apply.hpp>
#include <edl/lora/peft.hpp>
#include <edl/train/sharded_load.hpp>
#include <edl/train/state.hpp>

#include "../generate/small_llama.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;

// The generation tests' small GQA Llama (vocab 48; another vocab is another model).
models::LlamaConfig load_config(std::int64_t vocab = 48) { return generate::test_support::small_llama(vocab, 32); }

std::map<std::string, std::vector<float>> params_of(models::LlamaForCausalLM<>& m) {
  std::map<std::string, std::vector<float>> v;
  m.visit_params("", [&](std::string_view n, auto& p) { v[std::string(n)].assign(p.data(), p.data() + p.numel()); });
  return v;
}
std::map<std::string, std::vector<float>> slots_of(const optim::Optimizer& o) {
  std::map<std::string, std::vector<float>> v;
  o.visit_state([&](const std::string& p, const std::string& s, const std::vector<float>& x) { v[p + "." + s] = x; });
  return v;
}

/// A checkpoint of two AdamW steps on one device (so every slot holds non-trivial values).
struct SavedRun {
  fs::path dir;
  TrainingState<> state;
};
SavedRun saved_run(const std::string& tag, const models::LlamaConfig& cfg = load_config()) {
  const fs::path dir = fs::temp_directory_path() / ("edl_sharded_load_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  models::LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(3));
  auto st = TrainingState<>::create(std::move(m), {.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1});
  std::vector<std::int64_t> ids(24);
  for (std::uint32_t b = 0; b < 2; ++b) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int64_t>(random_bits_at(fold_in(Key::from_seed(5), b), i) % 48u);
    optim::zero_grad(st.model);
    st.model.forward_backward(ids.data(), nn::TokenLayout{2, 12}, nullptr);
    st.apply_gradients(1e-2, 1.0);
  }
  st.save_state((dir / "checkpoint-2").string());
  return {dir, std::move(st)};
}

TEST(ShardedLoad, ReshardsOntoAnyMeshBitForBit) {
  SavedRun run = saved_run("reshard");
  const std::string ck = (run.dir / "checkpoint-2").string();
  const auto want_params = params_of(run.state.model);
  const auto want_slots = slots_of(run.state.optimizer);
  std::int64_t model_bytes = 0;
  for (const auto& [n, v] : want_params) model_bytes += static_cast<std::int64_t>(v.size() * sizeof(float));
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {2, 1, 1, 1},
                                                 {1, 2, 2, 1}, {1, 1, 1, 2}}) {
    SCOPED_TRACE("mesh " + std::to_string(dims[0]) + "," + std::to_string(dims[1]) + "," + std::to_string(dims[2]) +
                 "," + std::to_string(dims[3]));
    // A model of other weights on the mesh, then the checkpoint loaded into its blocks.
    models::ShardedLlama<> sm(load_config(), Key::from_seed(77), create_mesh(dims));
    optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
    ShardedLoadStats stats;
    const TrainState s = load_sharded_state(ck, sm, so, &stats);
    EXPECT_EQ(s.step, 2);
    EXPECT_EQ(so.step_count(), 2);
    auto back = sm.gather_model();
    EXPECT_EQ(params_of(back), want_params);  // bit-exact
    EXPECT_EQ(slots_of(so.gather(sm)), want_slots);
    // Each device read exactly its blocks: the sum of block sizes over devices.
    std::int64_t block_bytes = 0;
    for (const auto& n : sm.names())
      for (std::int64_t d = 0; d < sm.mesh().size(); ++d)
        block_bytes += sm.param(n).layout().local_elements(d) * static_cast<std::int64_t>(sizeof(float));
    EXPECT_EQ(stats.parameter_bytes_read, block_bytes);
    EXPECT_EQ(stats.optimizer_bytes_read, 2 * block_bytes);  // exp_avg and exp_avg_sq
    // The blocks equal the ones sharding the saved model gives.
    models::ShardedLlama<> ref(run.state.model, create_mesh(dims));
    for (const auto& n : sm.names())
      for (std::int64_t d = 0; d < sm.mesh().size(); ++d) {
        const auto a = sm.param(n).local_span(d), b = ref.param(n).local_span(d);
        ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << n << " device " << d;
      }
  }
  // On fsdp=2 the matrices are split in half, so a device reads about half of the model.
  models::ShardedLlama<> sm(load_config(), Key::from_seed(77), create_mesh({1, 2, 1, 1}));
  optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw}, sm);
  ShardedLoadStats stats;
  load_sharded_state(ck, sm, so, &stats);
  EXPECT_LT(stats.parameter_bytes_read / 2, model_bytes * 6 / 10);
  fs::remove_all(run.dir);
}

// Phi-3's checkpoint holds q/k/v and gate/up fused; each device reads its blocks out of the
// fused tensors' rows, and the model and optimizer come back bit for bit on any mesh.
TEST(ShardedLoad, Phi3FusedTensorsReshardBitForBit) {
  models::LlamaConfig cfg = load_config();
  cfg.model_type = "phi3";
  SavedRun run = saved_run("phi3", cfg);
  const std::string ck = (run.dir / "checkpoint-2").string();
  ASSERT_TRUE(io::ShardedCheckpoint::open(ck).contains("model.layers.0.self_attn.qkv_proj.weight"));
  const auto want_params = params_of(run.state.model);
  const auto want_slots = slots_of(run.state.optimizer);
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {1, 2, 2, 1}}) {
    models::ShardedLlama<> sm(cfg, Key::from_seed(77), create_mesh(dims));
    optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
    load_sharded_state(ck, sm, so);
    auto back = sm.gather_model();
    EXPECT_EQ(params_of(back), want_params) << dims[1] << " " << dims[2];
    EXPECT_EQ(slots_of(so.gather(sm)), want_slots);
  }
  fs::remove_all(run.dir);
}

// Phi-3's adapters saved in PEFT's fused form (qkv_proj, gate_up_proj: one A, the parts' B
// rows) load onto the parts' adapter blocks on any mesh, bit for bit.
TEST(ShardedLoad, Phi3FusedAdaptersReshardBitForBit) {
  models::LlamaConfig cfg = load_config();
  cfg.model_type = "phi3";
  models::LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(3));
  lora::LoraConfig lc;
  lc.r = 2;
  lc.lora_alpha = 4;
  lc.target_modules = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"};
  lora::apply_lora(m, lc);
  // Each fused module's parts share one A (as a PEFT Phi-3 adapter has it); B's differ.
  std::map<std::string, std::vector<float>> first_a;
  std::uint32_t k = 1;
  m.visit_params("", [&](std::string_view name, auto& p) {
    const std::string n(name);
    if (n.ends_with("lora_B.weight"))
      for (std::int64_t i = 0; i < p.numel(); ++i) p.data()[i] = 0.01f * static_cast<float>((k++ * 37) % 23) - 0.1f;
    if (!n.ends_with("lora_A.weight") || n.find("down_proj") != std::string::npos) return;
    const std::string group = n.substr(0, n.find(n.find("self_attn") != std::string::npos ? "self_attn" : "mlp"));
    const std::string key = group + (n.find("self_attn") != std::string::npos ? "qkv" : "gate_up");
    if (!first_a.count(key)) first_a[key].assign(p.data(), p.data() + p.numel());
    std::copy(first_a[key].begin(), first_a[key].end(), p.data());
  });
  const fs::path dir = fs::temp_directory_path() / ("edl_sharded_load_phi3_lora_" + std::to_string(::getpid()));
  lora::save_adapter(dir, m, "phi3");
  ASSERT_TRUE(io::SafeTensorsFile::open((dir / lora::kAdapterWeightsFile).string())
                  .contains("base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight"));
  const auto want = params_of(m);
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}}) {
    models::LlamaForCausalLM<> fresh(cfg);
    fresh.init(Key::from_seed(3));
    lora::apply_lora(fresh, lc);
    auto sm = models::shard_model(fresh, create_mesh(dims));
    ShardedLoadStats st;
    load_adapter_blocks(dir.string(), sm, st);
    auto back = sm.gather_model();
    EXPECT_EQ(params_of(back), want) << dims[1] << " " << dims[2];
  }
  fs::remove_all(dir);
}

TEST(ShardedLoad, ContinuesTrainingLikeTheSavedState) {
  // The loaded sharded state takes the next step as the sharded run that was never saved.
  SavedRun run = saved_run("continue");
  const std::string ck = (run.dir / "checkpoint-2").string();
  std::vector<std::int64_t> ids(24);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % 48);
  auto uninterrupted = run.state.shard_state(create_mesh({1, 2, 1, 1}));
  models::ShardedLlama<> sm(load_config(), Key::from_seed(77), create_mesh({1, 2, 1, 1}));
  optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
  load_sharded_state(ck, sm, so);
  for (int step = 0; step < 2; ++step) {
    uninterrupted.model->zero_grad();
    sm.zero_grad();
    const double a = uninterrupted.model->loss_and_grads(ids.data(), nullptr, 2, 12).loss;
    const double b = sm.loss_and_grads(ids.data(), nullptr, 2, 12).loss;
    EXPECT_EQ(a, b) << "step " << step;
    uninterrupted.optimizer->step(*uninterrupted.model, 1e-2);
    so.step(sm, 1e-2);
  }
  auto loaded = sm.gather_model(), reference = uninterrupted.model->gather_model();
  EXPECT_EQ(params_of(loaded), params_of(reference));
  fs::remove_all(run.dir);
}

TEST(ShardedLoad, AnotherModelsCheckpointIsAnErrorNamingTheTensor) {
  SavedRun run = saved_run("mismatch");
  const std::string ck = (run.dir / "checkpoint-2").string();
  models::ShardedLlama<> sm(load_config(64), Key::from_seed(1), create_mesh({1, 2, 1, 1}));  // vocab 64
  optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw}, sm);
  try {
    load_sharded_state(ck, sm, so);
    ADD_FAILURE() << "a checkpoint of vocab_size 48 loaded into a model of 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_NE(std::string(e.where()).find("model.embed_tokens.weight"), std::string::npos) << e.where();
  }
  fs::remove_all(run.dir / "checkpoint-2" / "state.json");
  EXPECT_THROW(load_sharded_state(ck, sm, so), Error);
  fs::remove_all(run.dir);
}

}  // namespace
}  // namespace edl::train
