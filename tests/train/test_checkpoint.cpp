// Tests for edl/train/checkpoint.hpp: save/load round trip (model, optimizer slots, state),
// HF loadability of model.safetensors, atomicity (a save that throws midway leaves the previous
// checkpoint loadable and no checkpoint-<step> folder), the optimizer state split by rank
// (the layout of a save by several MPI ranks) loading like optimizer.safetensors, and
// keep-last-N + best pruning.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include <edl/models/llama/llama.hpp>
#include <edl/optim/all.hpp>
#include <edl/tokenizer/bpe_trainer.hpp>
#include <edl/train/checkpoint.hpp>
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;

models::LlamaConfig tiny_config() {
  models::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("ck_" + name) {}
};

// One optimizer step so the optimizer has state.
void step_once(models::LlamaForCausalLM<>& m, optim::Optimizer& opt) {
  std::vector<std::int64_t> ids = {1, 5, 9, 3, 7, 2, 8, 4};
  optim::zero_grad(m);
  m.forward_backward(ids.data(), nn::TokenLayout{2, 4});
  opt.step(m, 1e-2);
}

template <class M>
std::vector<float> flat_params(M& m) {
  std::vector<float> v;
  m.visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
  return v;
}

TEST(Checkpoint, SaveLoadRoundTrip) {
  TempDir t("roundtrip");
  models::LlamaForCausalLM<> m(tiny_config());
  m.init(Key::from_seed(1));
  optim::Optimizer opt(optim::OptimizerOptions{});
  step_once(m, opt);
  step_once(m, opt);
  TrainState s;
  s.step = 2;
  s.epoch = 1;
  s.batch_in_epoch = 3;
  s.data_key = Key{5, 6};
  s.tokens_seen = 99;
  s.eval_loss = 1.5;
  const auto tok = tokenizer::byte_level_tokenizer();
  const std::string dir = (t.p / "checkpoint-2").string();
  save_state(dir, m, opt, s, &tok);
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;

  models::LlamaForCausalLM<> m2(tiny_config());
  m2.init(Key::from_seed(2));
  optim::Optimizer opt2(optim::OptimizerOptions{});
  TrainState r = load_state(dir, m2, opt2);
  EXPECT_EQ(flat_params(m2), flat_params(m));
  EXPECT_EQ(opt2.step_count(), 2);
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.epoch, 1);
  EXPECT_EQ(r.batch_in_epoch, 3);
  EXPECT_EQ(r.data_key, (Key{5, 6}));
  EXPECT_EQ(r.tokens_seen, 99);
  EXPECT_EQ(r.eval_loss, 1.5);
  std::map<std::string, std::vector<float>> a, b;
  opt.visit_state([&](const std::string& p, const std::string& sl, const std::vector<float>& v) { a[p + "." + sl] = v; });
  opt2.visit_state([&](const std::string& p, const std::string& sl, const std::vector<float>& v) { b[p + "." + sl] = v; });
  EXPECT_EQ(a, b);
  EXPECT_TRUE(a.count("model.norm.weight.exp_avg_sq"));
  // The same next step on both.
  step_once(m, opt);
  step_once(m2, opt2);
  EXPECT_EQ(flat_params(m2), flat_params(m));
  // model.safetensors carries HF names and shapes (config_check of `edl inspect`).
  auto ck = io::ShardedCheckpoint::open(dir);
  auto cfg = models::LlamaConfig::from_file((fs::path(dir) / "config.json").string());
  for (const auto& [name, shape] : cfg.parameter_shapes()) {
    ASSERT_TRUE(ck.contains(name)) << name;
    EXPECT_EQ(ck.info(name).shape, shape) << name;
  }
}

TEST(Checkpoint, LoadsOptimizerStateSplitByRank) {
  // The layout N MPI ranks write (optimizer-<r>-of-<N>.safetensors instead of
  // optimizer.safetensors) loads into the same slots; a missing part is a format error naming it.
  TempDir t("parts");
  models::LlamaForCausalLM<> m(tiny_config());
  m.init(Key::from_seed(1));
  optim::Optimizer opt(optim::OptimizerOptions{});
  step_once(m, opt);
  TrainState s;
  s.step = 1;
  const fs::path dir = t.p / "checkpoint-1";
  save_state(dir.string(), m, opt, s);
  fs::remove(dir / "optimizer.safetensors");
  for (int r = 0; r < 3; ++r)
    detail::save_optimizer_part((dir / optimizer_file_name(r, 3)).string(), opt, r, 3);
  EXPECT_EQ(optimizer_file_name(1, 3), "optimizer-00002-of-00003.safetensors");
  models::LlamaForCausalLM<> m2(tiny_config());
  optim::Optimizer opt2(optim::OptimizerOptions{});
  load_state(dir.string(), m2, opt2);
  std::vector<float> a, b;
  opt.visit_state([&](const std::string&, const std::string&, const std::vector<float>& v) { a.insert(a.end(), v.begin(), v.end()); });
  opt2.visit_state([&](const std::string&, const std::string&, const std::vector<float>& v) { b.insert(b.end(), v.begin(), v.end()); });
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  fs::remove(dir / optimizer_file_name(1, 3));
  try {
    optim::Optimizer opt3(optim::OptimizerOptions{});
    load_state(dir.string(), m2, opt3);
    ADD_FAILURE() << "a checkpoint with a missing optimizer part loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("optimizer-00002-of-00003.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SavedOptimizerReadsBackWithItsOptionsAndContinuesTheRun) {
  TempDir t("optimizer_alone");
  models::LlamaForCausalLM<> m(tiny_config());
  m.init(Key::from_seed(1));
  optim::OptimizerOptions oo;
  oo.kind = optim::OptimizerKind::rmsprop;
  oo.momentum = 0.5;
  oo.rmsprop_alpha = 0.9;
  oo.rmsprop_centered = true;
  oo.weight_decay = 0.01;
  oo.eps = 1e-6;
  optim::Optimizer opt(oo);
  step_once(m, opt);
  step_once(m, opt);
  const std::string path = (t.p / "opt.safetensors").string();
  save_optimizer(path, opt);
  optim::Optimizer back = load_optimizer(path);
  EXPECT_EQ(optimizer_options_json(back.options()), optimizer_options_json(oo));
  EXPECT_EQ(back.step_count(), 2);
  const auto slots = [](const optim::Optimizer& o) {
    std::map<std::string, std::vector<float>> v;
    o.visit_state([&](const std::string& p, const std::string& s, const std::vector<float>& x) { v[p + "." + s] = x; });
    return v;
  };
  EXPECT_FALSE(slots(opt).empty());
  EXPECT_EQ(slots(back), slots(opt));
  // Resumed == uninterrupted: two more steps from the read-back optimizer give the bits of two
  // more steps from the original.
  models::LlamaForCausalLM<> m2 = m;
  step_once(m, opt);
  step_once(m, opt);
  step_once(m2, back);
  step_once(m2, back);
  EXPECT_EQ(flat_params(m2), flat_params(m));

  // A checkpoint folder's optimizer (one file or every rank's part) reads back the same way.
  TrainState s;
  s.step = 4;
  const fs::path dir = t.p / "checkpoint-4";
  save_state(dir.string(), m, opt, s);
  EXPECT_EQ(slots(load_optimizer(dir.string())), slots(opt));
  fs::remove(dir / "optimizer.safetensors");
  for (int r = 0; r < 2; ++r) detail::save_optimizer_part((dir / optimizer_file_name(r, 2)).string(), opt, r, 2);
  const optim::Optimizer parts = load_optimizer(dir.string());
  EXPECT_EQ(slots(parts), slots(opt));
  EXPECT_EQ(parts.step_count(), 4);
  EXPECT_EQ(parts.options().kind, optim::OptimizerKind::rmsprop);

  // A safetensors file that is no optimizer's is named.
  try {
    load_optimizer((dir / "model.safetensors").string());
    ADD_FAILURE() << "a model file loaded as an optimizer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, FailedSaveLeavesThePreviousOne) {
  TempDir t("atomic");
  models::LlamaForCausalLM<> m(tiny_config());
  m.init(Key::from_seed(1));
  optim::Optimizer opt(optim::OptimizerOptions{});
  step_once(m, opt);
  CheckpointManager mgr(t.p.string(), 3);
  TrainState s;
  s.step = 1;
  const std::string first = mgr.save(m, opt, s);
  const auto saved = flat_params(m);
  step_once(m, opt);
  for (const char* fail_after : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    s.step = 2;
    CheckpointHooks hooks;
    hooks.after_file = [&](const std::string& f) {
      if (f == fail_after) throw std::runtime_error("simulated crash");
    };
    EXPECT_THROW(mgr.save(m, opt, s, nullptr, hooks), std::runtime_error);
    EXPECT_FALSE(fs::exists(t.p / "checkpoint-2")) << fail_after;
    std::size_t entries = 0;
    for (const auto& e : fs::directory_iterator(t.p)) (void)e, ++entries;
    EXPECT_EQ(entries, 1u) << "no temporary folder left after failing at " << fail_after;
    ASSERT_EQ(mgr.latest(), first);
  }
  // A re-save of step 1 that fails keeps the old checkpoint-1.
  s.step = 1;
  CheckpointHooks hooks;
  hooks.after_file = [](const std::string&) { throw std::runtime_error("crash"); };
  EXPECT_THROW(mgr.save(m, opt, s, nullptr, hooks), std::runtime_error);
  models::LlamaForCausalLM<> m2(tiny_config());
  optim::Optimizer opt2(optim::OptimizerOptions{});
  load_state(first, m2, opt2);
  EXPECT_EQ(flat_params(m2), saved);
  // A crashed process leaves a hidden temp folder: ignored by list(), removed by remove_temporaries().
  fs::create_directories(t.p / ".checkpoint-7.tmp-12345");
  fs::create_directories(t.p / "checkpoint-8");  // no state.json: incomplete
  EXPECT_EQ(mgr.list().size(), 1u);
  mgr.remove_temporaries();
  EXPECT_FALSE(fs::exists(t.p / ".checkpoint-7.tmp-12345"));
}

TEST(Checkpoint, KeepsLastNAndTheBest) {
  TempDir t("prune");
  models::LlamaForCausalLM<> m(tiny_config());
  m.init(Key::from_seed(1));
  optim::Optimizer opt(optim::OptimizerOptions{});
  CheckpointManager mgr(t.p.string(), 2);
  const double eval[] = {3.0, 1.0, 2.0, 2.5, 2.7};
  for (int step = 1; step <= 5; ++step) {
    TrainState s;
    s.step = step;
    s.eval_loss = eval[step - 1];
    mgr.save(m, opt, s);
  }
  std::vector<std::int64_t> steps;
  for (const auto& [st, p] : mgr.list()) steps.push_back(st);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 4, 5}));
  EXPECT_EQ(mgr.best(), mgr.path_for(2));
  EXPECT_EQ(mgr.latest(), mgr.path_for(5));
}

}  // namespace
}  // namespace edl::train
