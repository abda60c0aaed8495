// Tests for edl/train/sharded_save.hpp: a checkpoint written block by block from a sharded
// model and its ZeRO optimizer holds, byte for byte, the files save_state writes for the
// gathered state (on fsdp, tp, dp and mixed meshes; bf16 copies, weights-only, adafactor's
// factored slots on one device); it resumes on another mesh as the uninterrupted run; a save
// that dies after any file leaves the previous checkpoint the newest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/lora/apply.hpp>
#include <edl/train/sharded_load.hpp>
#include <edl/train/sharded_save.hpp>
#include <edl/train/state.hpp>

#include "../generate/small_llama.hpp"
#include "../support/folder_bytes.hpp"
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using Sharded = models::ShardedLlama<>;
using ShardedOpt = optim::ShardedOptimizer<Sharded>;

models::LlamaConfig config() { return generate::test_support::small_llama(48, 32); }

using test_support::expect_same_folder;
using test_support::file_names;
using test_support::read_bytes;

/// `steps` AdamW steps of a sharded model on `mesh` (every slot non-trivial).
struct ShardedRun {
  Sharded model;
  ShardedOpt opt;
  TrainState state;
};
ShardedRun trained(const DefaultMesh& mesh, int steps, optim::OptimizerOptions o = {.kind = optim::OptimizerKind::adamw,
                                                                             .weight_decay = 0.1}) {
  ShardedRun r{Sharded(config(), Key::from_seed(3), mesh), ShardedOpt(o, Sharded(config(), mesh)), {}};
  r.opt = ShardedOpt(o, r.model);
  std::vector<std::int64_t> ids(24);
  for (int b = 0; b < steps; ++b) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int64_t>(random_bits_at(fold_in(Key::from_seed(5), static_cast<std::uint32_t>(b)), i) % 48u);
    r.model.zero_grad();
    r.model.loss_and_grads(ids.data(), nullptr, 6, 4);
    r.opt.clip_by_global_norm(r.model, 1.0);
    r.opt.step(r.model, 1e-2);
  }
  r.state.step = steps;
  r.state.optimizer_step_count = r.opt.step_count();
  return r;
}

TEST(ShardedSave, WritesTheFilesOfTheGatheredStateOnEveryMesh) {
  // fsdp = 3 splits hidden 32 into blocks of 11, 11 and 10 (uneven).
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {2, 1, 1, 1},
                                                 {1, 2, 2, 1}, {1, 1, 1, 1}, {1, 3, 1, 1}, {1, 3, 2, 1}}) {
    const auto mesh = create_mesh(dims);
    const std::string where = mesh.shape().axes_str();
    ShardedRun r = trained(mesh, 2);
    test_support::TempDir want("sharded_save_state_want"), got("sharded_save_state_got");
    auto m = r.model.gather_model();
    save_state((want.p / "checkpoint-2").string(), m, r.opt.gather(r.model), r.state);
    const models::ShardedSaveStats st = save_sharded_state((got.p / "checkpoint-2").string(), r.model, r.opt, r.state);
    expect_same_folder(want.p / "checkpoint-2", got.p / "checkpoint-2", where);
    EXPECT_EQ(file_names(got.p), std::vector<std::string>{"checkpoint-2"}) << where;  // no temporary left
    // One process here: it wrote every distinct block once, parameters and two AdamW slots.
    std::int64_t elements = 0;
    for (const auto& n : r.model.names())
      for (std::int64_t d : r.model.param(n).layout().block_owners()) elements += r.model.param(n).layout().local_elements(d);
    EXPECT_EQ(st.bytes_written, 3 * elements * 4) << where;
  }
}

TEST(ShardedSave, Bf16WeightsOnlyAndFactoredSlotsFollowSaveState) {
  const auto mesh = create_mesh({1, 2, 2, 1});
  ShardedRun r = trained(mesh, 1);
  auto m = r.model.gather_model();
  for (const SaveStateOptions o : {SaveStateOptions{.float_dtype = DType::bf16}, SaveStateOptions{.float_dtype = std::nullopt, .save_optimizer = false}}) {
    test_support::TempDir want("sharded_save_opts_want"), got("sharded_save_opts_got");
    save_state((want.p / "c").string(), m, r.opt.gather(r.model), r.state, nullptr, {}, {}, o);
    save_sharded_state((got.p / "c").string(), r.model, r.opt, r.state, nullptr, {}, {}, o);
    expect_same_folder(want.p / "c", got.p / "c", o.save_optimizer ? "bf16" : "weights only");
  }
  // Adafactor's second moment is factored over whole matrices: one device only, slots of their own size.
  ShardedRun a = trained(create_mesh({1, 1, 1, 1}), 2, {.kind = optim::OptimizerKind::adafactor});
  test_support::TempDir want("sharded_save_ada_want"), got("sharded_save_ada_got");
  auto am = a.model.gather_model();
  save_state((want.p / "c").string(), am, a.opt.device(0), a.state);  // one device: its optimizer is the whole one
  save_sharded_state((got.p / "c").string(), a.model, a.opt, a.state);
  expect_same_folder(want.p / "c", got.p / "c", "adafactor");
}

TEST(ShardedSave, ResumesOnAnotherMeshAsTheUninterruptedRun) {
  ShardedRun r = trained(create_mesh({1, 2, 2, 1}), 2);
  test_support::TempDir dir("sharded_save_resume");
  const std::string ck = (dir.p / "checkpoint-2").string();
  save_sharded_state(ck, r.model, r.opt, r.state);
  Sharded sm(config(), create_mesh({2, 1, 1, 1}));
  ShardedOpt so({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
  EXPECT_EQ(load_sharded_state(ck, sm, so).step, 2);
  std::vector<std::int64_t> ids(24);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7 % 48);
  for (int step = 0; step < 2; ++step) {
    r.model.zero_grad();
    sm.zero_grad();
    const double a = r.model.loss_and_grads(ids.data(), nullptr, 4, 6).loss;
    const double b = sm.loss_and_grads(ids.data(), nullptr, 4, 6).loss;
    EXPECT_NEAR(a, b, 1e-6 * std::abs(a)) << "step " << step;  // other meshes reduce in another order
    r.opt.step(r.model, 1e-2);
    so.step(sm, 1e-2);
  }
  // And on one device, load_state reads it as a one-device checkpoint.
  models::LlamaForCausalLM<> one(config());
  optim::Optimizer o({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1});
  EXPECT_EQ(load_state(ck, one, o).optimizer_step_count, 2);
}

TEST(ShardedSave, ADeathAfterAnyFileLeavesThePreviousCheckpoint) {
  ShardedRun r = trained(create_mesh({1, 2, 1, 1}), 1);
  test_support::TempDir dir("sharded_save_crash");
  CheckpointManager mgr(dir.p.string(), std::nullopt);
  r.state.step = 1;
  save_sharded_checkpoint(mgr, r.model, r.opt, r.state);
  const std::string first = read_bytes(dir.p / "checkpoint-1" / "model.safetensors");
  for (const std::string dies_after : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    CheckpointHooks hooks;
    hooks.after_file = [&](const std::string& f) {
      if (f == dies_after) throw std::runtime_error("killed after " + f);
    };
    r.state.step = 2;
    EXPECT_THROW(save_sharded_checkpoint(mgr, r.model, r.opt, r.state, nullptr, hooks), std::runtime_error) << dies_after;
    mgr.remove_temporaries();
    ASSERT_EQ(mgr.list().size(), 1u) << dies_after;
    EXPECT_EQ(mgr.list().back().first, 1) << dies_after;
    EXPECT_EQ(read_bytes(dir.p / "checkpoint-1" / "model.safetensors"), first);
  }
  // A LoRA model is saved as its adapters by save_state: refused here by name.
  models::LlamaForCausalLM<> base(config());
  lora::LoraConfig lc;
  lc.r = 2;
  lora::apply_lora(base, lc);
  Sharded adapted(base, create_mesh({1, 2, 1, 1}));
  ShardedOpt ao({}, adapted);
  try {
    save_sharded_state((dir.p / "lora").string(), adapted, ao, r.state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
  }
}

}  // namespace
}  // namespace edl::train
