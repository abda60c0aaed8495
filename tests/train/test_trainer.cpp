// Tests for edl/train/trainer.hpp: resume gives bit-identical losses, a NaN loss stops with a
// clear error and keeps the last good checkpoint, gradient accumulation equals one big batch,
// every gradient_checkpointing policy trains bit-identically, the loss falls on a memorization task, the time limit stops with a checkpoint, metrics.jsonl
// holds the documented fields, a Trainer built from JSON arguments trains, the same run on
// meshes gives the same losses, and bf16 mixed precision follows f32 training.
#include <algorithm>
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <numeric>

#include <edl/core/process_memory.hpp>
#include <edl/train/all.hpp>
#include "../support/fortune_run.hpp"
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

models::LlamaConfig tiny_config(std::int64_t vocab = 64) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  return c;
}

// Its own folder name under the temp directory; the code under test creates the folder.
struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("tr_" + name, Make::name_only) {}
};

// n random sequences of length len (some shorter, to exercise padding).
TokenDataset random_data(std::int64_t n, std::int64_t len, std::int64_t vocab, std::uint64_t seed, bool ragged = false) {
  TokenDataset d;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t l = ragged ? len - (i % 3) * 2 : len;
    std::vector<std::int32_t> s(static_cast<std::size_t>(l));
    for (std::int64_t j = 0; j < l; ++j)
      s[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(
          random_bits_at(fold_in(Key::from_seed(seed), static_cast<std::uint32_t>(i)), static_cast<std::uint64_t>(j)) %
          static_cast<std::uint32_t>(vocab));
    d.add(std::span<const std::int32_t>(s));
  }
  return d;
}

TrainingArguments base_args(const std::string& dir) {
  TrainingArguments a;
  a.save_directory = dir;
  a.learning_rate = 3e-3;
  a.learning_rate_end = 3e-4;
  a.scheduler = "cosine";
  a.warmup_steps = 2;
  a.weight_decay = 0.1;
  a.clip_grad = 1.0;
  a.total_batch_size = 4;
  a.gradient_accumulation_steps = 2;
  a.max_sequence_length = 16;
  a.max_training_steps = 6;
  a.log_steps = 1;
  a.resume_if_possible = true;
  a.progress = false;
  a.peak_gflops = 100;  // skip the GEMM measurement in tests
  a.seed = 11;
  return a;
}

/// The precision comparisons' run: 100 steps, each logged, a checkpoint at 50 and 100.
TrainingArguments hundred_step_args(const std::string& dir) {
  auto a = base_args(dir);
  a.max_training_steps = 100;
  a.save_steps = 50;
  return a;
}

models::LlamaForCausalLM<> make_model(std::uint64_t seed = 0, std::int64_t vocab = 64) {
  models::LlamaForCausalLM<> m(tiny_config(vocab));
  m.init(Key::from_seed(seed));
  return m;
}

std::vector<ojson> read_metrics(const std::string& dir, const std::string& file = "metrics.jsonl") {
  std::vector<ojson> out;
  std::ifstream in(fs::path(dir) / file);
  std::string line;
  while (std::getline(in, line)) out.push_back(ojson::parse(line));
  return out;
}
std::vector<double> losses(const std::vector<ojson>& m, std::vector<double>* gnorms = nullptr) {
  std::vector<double> l;
  for (const auto& j : m)
    if (j.contains("loss")) {
      l.push_back(j["loss"].get<double>());
      if (gnorms) gnorms->push_back(j["grad_norm"].get<double>());
    }
  return l;
}

// The callbacks see every evaluation and every save; save_total_limit keeps the newest
// checkpoints only; eval_batch_size batches evaluation differently with the same mean loss.
TEST(Trainer, CallbacksSaveTotalLimitAndEvalBatchSize) {
  TempDir d("callbacks");
  auto data = random_data(10, 16, 64, 5, true);
  auto eval = random_data(6, 16, 64, 6, true);
  auto args = base_args(d.str());
  args.save_steps = 2;
  args.save_total_limit = 2;
  args.evaluation_steps = 3;
  Trainer t(args, make_model(), std::nullopt, data, eval);
  std::vector<std::int64_t> evaluated;
  std::vector<std::string> saved;
  TrainerCallback cb;
  cb.on_evaluate = [&](Trainer&, const EvalMetrics& e) { evaluated.push_back(e.step); };
  cb.on_save = [&](Trainer&, const std::string& p) { saved.push_back(fs::path(p).filename().string()); };
  t.callbacks.push_back(cb);
  t.train();
  EXPECT_EQ(evaluated, (std::vector<std::int64_t>{3, 6}));
  EXPECT_EQ(saved, (std::vector<std::string>{"checkpoint-2", "checkpoint-4", "checkpoint-6"}));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d.str()))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"checkpoint-4", "checkpoint-6"}));

  const double by_micro = t.evaluate().loss;  // micro-batches of 2 sequences
  TempDir d2("eval_batch");
  auto args2 = base_args(d2.str());
  args2.eval_batch_size = 5;
  Trainer t2(args2, t.model(), std::nullopt, data, eval);
  EXPECT_EQ(t2.eval_options().batch_size, 5);
  EXPECT_NEAR(t2.evaluate().loss, by_micro, 1e-6 * by_micro);
}

// EasyDeL's start_training_hook, start_evaluation_hook and finish (on_train_begin,
// on_evaluate_begin, on_train_end) run in order around the steps; on_log changes the lines
// metrics.jsonl receives (a field added to every line, the training loss replaced).
TEST(Trainer, HooksRunInOrderAndOnLogRewritesTheMetricsLines) {
  TempDir d("hooks");
  auto data = random_data(10, 16, 64, 5, true);
  auto eval = random_data(6, 16, 64, 6, true);
  auto args = base_args(d.str());
  args.evaluation_steps = 3;
  Trainer t(args, make_model(), std::nullopt, data, eval);
  std::vector<std::string> events;
  const auto at = [](const char* what, std::int64_t step) { return std::string(what) + "@" + std::to_string(step); };
  TrainerCallback cb;
  cb.on_train_begin = [&](Trainer& tr) { events.push_back(at("begin", tr.state().step)); };
  cb.on_evaluate_begin = [&](Trainer&, std::int64_t step) { events.push_back(at("eval", step)); };
  cb.on_evaluate = [&](Trainer&, const EvalMetrics& e) { events.push_back(at("evaluated", e.step)); };
  cb.on_save = [&](Trainer&, const std::string& p) { events.push_back(fs::path(p).filename().string()); };
  cb.on_train_end = [&](Trainer&, const TrainResult& r) {
    events.push_back(at("end", r.steps));
    EXPECT_TRUE(fs::exists(r.checkpoint)) << r.checkpoint;
  };
  cb.on_log = [&](Trainer&, ojson& line) {
    line["custom/twice_step"] = 2 * line["step"].get<std::int64_t>();
    if (line.contains("loss")) line["loss"] = -1.0;
  };
  t.callbacks.push_back(cb);
  t.train();
  EXPECT_EQ(events, (std::vector<std::string>{"begin@0", "eval@3", "evaluated@3", "eval@6", "evaluated@6",
                                              "checkpoint-6", "end@6"}));
  const auto lines = read_metrics(d.str());
  ASSERT_GE(lines.size(), 8u);  // six steps and two evaluations
  std::int64_t train_lines = 0;
  for (const auto& j : lines) {
    EXPECT_EQ(j["custom/twice_step"].get<std::int64_t>(), 2 * j["step"].get<std::int64_t>()) << j.dump();
    if (j.contains("loss")) {
      EXPECT_EQ(j["loss"].get<double>(), -1.0);
      ++train_lines;
    }
  }
  EXPECT_EQ(train_lines, 6);
}

TEST(Trainer, ResumeIsBitIdentical) {
  TempDir a("full"), b("resumed");
  // 10 sequences, batches of 4: 2 steps per epoch, so 6 steps cross epochs (and the resume point).
  auto data = random_data(10, 16, 64, 5, true);
  auto eval = random_data(4, 16, 64, 6);
  {
    auto args = base_args(a.str());
    Trainer t(args, make_model(), std::nullopt, data, eval);
    auto r = t.train();
    EXPECT_EQ(r.steps, 6);
    EXPECT_EQ(r.stop_reason, "max_steps");
  }
  {
    auto args = base_args(b.str());
    Trainer t(args, make_model(), std::nullopt, data, eval);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    auto r = t.train();
    EXPECT_EQ(r.steps, 3);
    EXPECT_EQ(r.stop_reason, "callback");
    EXPECT_TRUE(fs::exists(b.p / "checkpoint-3" / "state.json"));
  }
  {
    auto args = base_args(b.str());
    Trainer t(args, make_model(99), std::nullopt, data, eval);  // other init: the checkpoint must win
    auto r = t.train();
    EXPECT_TRUE(r.resumed);
    EXPECT_EQ(r.steps, 6);
  }
  std::vector<double> ga, gb;
  const auto la = losses(read_metrics(a.str()), &ga), lb = losses(read_metrics(b.str()), &gb);
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;  // exact
    EXPECT_EQ(ga[i], gb[i]) << "step " << i + 1;
  }
  // The final models are identical too.
  models::LlamaForCausalLM<> ma(tiny_config()), mb(tiny_config());
  load_model_weights((a.p / "checkpoint-6").string(), ma);
  load_model_weights((b.p / "checkpoint-6").string(), mb);
  std::vector<float> va, vb;
  ma.visit_params("", [&](std::string_view, auto& p) { va.insert(va.end(), p.data(), p.data() + p.numel()); });
  mb.visit_params("", [&](std::string_view, auto& p) { vb.insert(vb.end(), p.data(), p.data() + p.numel()); });
  EXPECT_EQ(va, vb);
}

// What `edl train --resume DIR` does: a run in another save_directory, with
// resume_if_possible off, continues from an explicit checkpoint folder bit-identically.
TEST(Trainer, ResumeFromAFolderIsBitIdentical) {
  TempDir a("full2"), b("first"), c("elsewhere");
  auto data = random_data(10, 16, 64, 5, true);
  auto eval = random_data(4, 16, 64, 6);
  {
    Trainer t(base_args(a.str()), make_model(), std::nullopt, data, eval);
    t.train();
  }
  {
    auto args = base_args(b.str());
    args.max_training_steps = 4;
    args.save_steps = 2;
    Trainer t(args, make_model(), std::nullopt, data, eval);
    t.train();  // checkpoint-2 and checkpoint-4, but the schedule is that of 4 steps
  }
  auto args = base_args(c.str());
  args.resume_if_possible = false;
  Trainer t(args, make_model(7), std::nullopt, data, eval);
  // The 4-step run's checkpoint-2: same data position and optimizer state; only the schedule
  // (here: the arguments of this run) decides the rates of steps 3..6.
  const std::string from = (b.p / "checkpoint-2").string();
  t.resume_from(from);
  EXPECT_EQ(t.state().step, 2);
  auto r = t.train();
  EXPECT_TRUE(r.resumed);
  EXPECT_EQ(r.steps, 6);
  EXPECT_FALSE(fs::exists(c.p / "checkpoint-2"));  // nothing was re-saved at the resume point
  std::vector<double> ga, gc;
  const auto la = losses(read_metrics(a.str()), &ga), lc = losses(read_metrics(c.str()), &gc);
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lc.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(la[i + 2], lc[i]) << "step " << i + 3;
    EXPECT_EQ(ga[i + 2], gc[i]) << "step " << i + 3;
  }

  // Not a checkpoint: a clear error naming the folder, before anything changes.
  Trainer u(base_args(c.str()), make_model(), std::nullopt, data, eval);
  for (const std::string& bad : {(c.p / "missing").string(), c.str()}) {
    try {
      u.resume_from(bad);
      ADD_FAILURE() << "expected an edl::Error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::io);
      EXPECT_EQ(e.where(), bad);
    }
  }
  EXPECT_EQ(u.state().step, 0);
}

TEST(Trainer, NanLossStopsAndKeepsTheLastGoodCheckpoint) {
  TempDir d("nan");
  auto args = base_args(d.str());
  args.save_steps = 1;
  Trainer t(args, make_model(), std::nullopt, random_data(8, 16, 64, 1));
  TrainerCallback poison;
  poison.on_step_start = [](Trainer& tr, std::int64_t step) {
    if (step == 2) tr.model().model.norm.weight.value(0) = std::numeric_limits<float>::quiet_NaN();
  };
  t.callbacks.push_back(poison);
  try {
    t.train();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_EQ(e.where(), "train step 3");
    const std::string m = e.what();
    EXPECT_NE(m.find("the loss is nan"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint-2"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(d.p / "checkpoint-3"));
  CheckpointManager mgr(d.str());
  ASSERT_EQ(mgr.latest(), (d.p / "checkpoint-2").string());
  models::LlamaForCausalLM<> m(tiny_config());
  optim::Optimizer opt;
  auto s = load_state(*mgr.latest(), m, opt);
  EXPECT_EQ(s.step, 2);
  EXPECT_TRUE(std::isfinite(m.model.norm.weight.value(0)));
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  auto data = random_data(4, 16, 64, 3, true);  // ragged: the normalizer matters
  std::vector<std::vector<float>> params;
  std::vector<double> loss;
  for (std::int64_t accum : {1, 2}) {
    TempDir d("accum" + std::to_string(accum));
    auto args = base_args(d.str());
    args.optimizer = "sgd";
    args.scheduler = "none";
    args.warmup_steps = 0;
    args.clip_grad = 0;
    args.learning_rate = 0.5;
    args.max_training_steps = 1;
    args.gradient_accumulation_steps = accum;
    args.shuffle_train_dataset = false;
    Trainer t(args, make_model(), std::nullopt, data);
    loss.push_back(t.train().final_loss);
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
    params.push_back(v);
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-6);
  double maxdiff = 0;
  for (std::size_t i = 0; i < params[0].size(); ++i)
    maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(params[0][i] - params[1][i])));
  EXPECT_LT(maxdiff, 1e-6);
}

TEST(Trainer, GradientCheckpointingPoliciesTrainBitIdentically) {
  // Ragged data: padded rows exercise the attention mask under every policy.
  auto data = random_data(4, 16, 64, 5, true);
  std::vector<std::vector<float>> params;
  std::vector<std::vector<double>> losses_of;
  for (const char* policy : {"", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                             "save_only_these_names(attn_out, gate)",
                             "save_from_both_policies(save_any_names_but_these(q, k), save_only_these_names(act))"}) {
    TempDir d(std::string("remat") + std::to_string(params.size()));
    auto args = base_args(d.str());
    args.max_training_steps = 2;
    args.shuffle_train_dataset = false;
    args.gradient_checkpointing = policy;
    Trainer t(args, make_model(), std::nullopt, data);
    t.train();
    losses_of.push_back(losses(read_metrics(d.str())));
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
    params.push_back(v);
  }
  for (std::size_t i = 1; i < params.size(); ++i) {
    EXPECT_EQ(losses_of[i], losses_of[0]) << "policy " << i;
    EXPECT_EQ(params[i], params[0]) << "policy " << i;
  }
}

// On a mesh (fsdp=2 x tp=2) the sharded step rematerializes whole layers (nothing_saveable) or
// what a finer policy drops: the same losses and parameters, bit for bit, as the step that
// keeps every activation.
TEST(Trainer, GradientCheckpointingOnAMeshTrainsBitIdentically) {
  auto data = random_data(4, 16, 64, 5, true);
  std::vector<std::vector<float>> params;
  std::vector<std::vector<double>> losses_of;
  for (const char* policy : {"", "nothing_saveable", "dots_saveable"}) {
    TempDir d(std::string("mesh_remat") + policy);
    auto args = base_args(d.str());
    args.max_training_steps = 2;
    args.shuffle_train_dataset = false;
    args.sharding_axis_dims = {1, 2, 2, 1};
    args.gradient_checkpointing = policy;
    Trainer t(args, make_model(), std::nullopt, data);
    EXPECT_EQ(t.mesh_devices(), 4);
    t.train();
    losses_of.push_back(losses(read_metrics(d.str())));
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
    params.push_back(v);
  }
  for (std::size_t i = 1; i < params.size(); ++i) {
    EXPECT_EQ(losses_of[i], losses_of[0]) << "policy " << i;
    EXPECT_EQ(params[i], params[0]) << "policy " << i;
  }
}

// tiny_config as a Mixtral-style model: 4 experts, 2 per token, the load-balancing loss on.
models::LlamaConfig tiny_moe_config(double router_jitter_noise = 0) {
  models::LlamaConfig c = tiny_config();
  c.router_jitter_noise = router_jitter_noise;
  c.model_type = "mixtral";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.output_router_logits = true;
  c.router_aux_loss_coef = 0.02;
  return c;
}

models::LlamaForCausalLM<> moe_model(std::uint64_t seed, double router_jitter_noise = 0) {
  models::LlamaForCausalLM<> m(tiny_moe_config(router_jitter_noise));
  m.init(Key::from_seed(seed));
  return m;
}

// A Mixtral-style model (4 experts, 2 per token, the load-balancing loss on) trains through
// the trainer: metrics.jsonl reports aux_loss, the loss falls, and a resumed run is bit
// identical to an uninterrupted one.
TEST(Trainer, MixtureOfExpertsTrainsAndResumesBitIdentically) {
  TempDir a("moe_full"), b("moe_resumed");
  auto data = random_data(10, 16, 64, 5, true);
  {
    Trainer t(base_args(a.str()), moe_model(0), std::nullopt, data);
    EXPECT_EQ(t.train().steps, 6);
  }
  {
    Trainer t(base_args(b.str()), moe_model(0), std::nullopt, data);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  {
    Trainer t(base_args(b.str()), moe_model(99), std::nullopt, data);
    EXPECT_TRUE(t.train().resumed);
  }
  const auto ma = read_metrics(a.str()), mb = read_metrics(b.str());
  const auto la = losses(ma), lb = losses(mb);
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
  ASSERT_TRUE(ma.front().contains("aux_loss"));
  // E * sum_e f_e P_e: k = 2 for even routing, at most E * k = 8.
  const double aux = ma.front()["aux_loss"].get<double>();
  EXPECT_GT(aux, 0.0);
  EXPECT_LE(aux, 8.0);
  EXPECT_LT(la.back(), la.front());
}

// A Mixtral-style model with router jitter on expert-parallel meshes (experts split over ep,
// token rows exchanged by all_to_all): the losses, the load-balancing loss, the gradient norms
// and the final weights follow one device (each token's jitter drawn from its place in the
// batch); the checkpoint is the one-device layout; a run stopped and resumed on the ep mesh
// gives its uninterrupted losses bit for bit; the jitter changes the losses.
TEST(Trainer, MixtureOfExpertsOnExpertParallelMeshesFollowsOneDevice) {
  const double jitter = 0.05;
  const models::LlamaConfig c = tiny_moe_config(jitter);
  auto data = random_data(10, 16, 64, 5, true);
  const auto args_on = [&](const std::string& dir, std::vector<std::int64_t> dims) {
    auto a = base_args(dir);
    a.gradient_accumulation_steps = 1;  // micro-batches of 4 rows: fsdp x ep = 4 splits them
    a.sharding_axis_names = {"dp", "fsdp", "ep", "tp", "sp"};
    a.sharding_axis_dims = std::move(dims);
    return a;
  };
  const std::vector<std::vector<std::int64_t>> meshes = {{1, 1, 1, 1, 1}, {1, 1, 2, 1, 1}, {1, 2, 2, 1, 1}, {1, 1, 4, 1, 1}};
  std::vector<std::vector<double>> ls, gs, aux;
  std::vector<std::vector<float>> ws;
  for (const auto& dims : meshes) {
    TempDir d("moe_mesh" + std::to_string(ls.size()));
    Trainer t(args_on(d.str(), dims), moe_model(0, jitter), std::nullopt, data);
    const auto r = t.train();
    std::vector<double> g, a;
    const auto ms = read_metrics(d.str());
    ls.push_back(losses(ms, &g));
    gs.push_back(g);
    for (const auto& m : ms)
      if (m.contains("aux_loss")) a.push_back(m["aux_loss"].get<double>());
    aux.push_back(a);
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
    ws.push_back(v);
    models::LlamaForCausalLM<> m(c);  // the checkpoint is the one-device layout
    load_model_weights(r.checkpoint, m);
    std::vector<float> w;
    m.visit_params("", [&](std::string_view, auto& p) { w.insert(w.end(), p.data(), p.data() + p.numel()); });
    EXPECT_EQ(w, v);
  }
  for (std::size_t k = 1; k < meshes.size(); ++k) {
    SCOPED_TRACE("mesh " + std::to_string(k));
    ASSERT_EQ(ls[k].size(), ls[0].size());
    ASSERT_EQ(aux[k].size(), ls[0].size());
    for (std::size_t i = 0; i < ls[0].size(); ++i) {
      EXPECT_NEAR(ls[k][i], ls[0][i], 1e-5 * std::abs(ls[0][i])) << "step " << i + 1;
      EXPECT_NEAR(aux[k][i], aux[0][i], 1e-5 * aux[0][i]) << "step " << i + 1;
      EXPECT_NEAR(gs[k][i], gs[0][i], 1e-4 * gs[0][i]) << "step " << i + 1;
    }
    double maxdiff = 0;
    for (std::size_t i = 0; i < ws[0].size(); ++i)
      maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(ws[k][i] - ws[0][i])));
    EXPECT_LT(maxdiff, 1e-5);
  }
  // Stopped at step 3 on ep = 2 and resumed there: the uninterrupted ep = 2 run's losses, bit for bit.
  TempDir b("moe_ep_resumed");
  {
    Trainer t(args_on(b.str(), {1, 1, 2, 1, 1}), moe_model(0, jitter), std::nullopt, data);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  {
    Trainer t(args_on(b.str(), {1, 1, 2, 1, 1}), moe_model(99, jitter), std::nullopt, data);
    EXPECT_TRUE(t.train().resumed);
  }
  const auto lb = losses(read_metrics(b.str()));
  ASSERT_EQ(lb.size(), ls[1].size());
  for (std::size_t i = 0; i < lb.size(); ++i) EXPECT_EQ(lb[i], ls[1][i]) << "step " << i + 1;
  TempDir n("moe_no_jitter");  // the jitter is applied: without it the first step's loss differs
  Trainer t(args_on(n.str(), {1, 1, 1, 1, 1}), moe_model(0), std::nullopt, data);
  t.train();
  EXPECT_NE(losses(read_metrics(n.str())).front(), ls[0].front());
}

TEST(Trainer, LossFallsOnAMemorizationTask) {
  TempDir d("memorize");
  auto args = base_args(d.str());
  args.max_training_steps = 40;
  args.learning_rate = 1e-2;
  args.learning_rate_end = 1e-3;
  args.log_steps = 10;
  auto data = random_data(4, 16, 64, 8);  // 4 sequences seen every step
  Trainer t(args, make_model(), std::nullopt, data);
  auto r = t.train();
  EXPECT_GT(r.first_loss, 3.5);  // ~ln(64) = 4.16 at init
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  // metrics.jsonl: documented fields.
  auto m = read_metrics(d.str());
  ASSERT_FALSE(m.empty());
  for (const char* f : {"step", "loss", "learning_rate", "grad_norm", "tokens_per_s", "epoch", "mfu", "elapsed_s"})
    EXPECT_TRUE(m.front().contains(f)) << f;
  EXPECT_EQ(m.front()["step"], 1);
  EXPECT_EQ(m.back()["step"], 40);
  EXPECT_GT(m.back()["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(r.checkpoint, (d.p / "checkpoint-40").string());
}

// track_memory (EasyDeL's name): every logged line carries the process's resident set and its
// peak, as /proc/self/status gives them; off (the default), no line has them.
TEST(Trainer, TrackMemoryLogsTheResidentSet) {
  for (const bool track : {true, false}) {
    TempDir d(track ? "mem_on" : "mem_off");
    auto args = base_args(d.str());
    args.max_training_steps = 3;
    args.track_memory = track;
    Trainer t(args, make_model(), std::nullopt, random_data(8, 16, 64, 3));
    t.train();
    const std::int64_t peak_after = peak_resident_bytes();
    std::int64_t lines = 0, last_peak = 0;
    for (const auto& j : read_metrics(d.str())) {
      if (!j.contains("loss")) continue;
      ++lines;
      ASSERT_EQ(j.contains("memory/resident_bytes"), track) << j.dump();
      ASSERT_EQ(j.contains("memory/peak_resident_bytes"), track) << j.dump();
      if (!track) continue;
      const auto rss = j["memory/resident_bytes"].get<std::int64_t>(), peak = j["memory/peak_resident_bytes"].get<std::int64_t>();
      EXPECT_GT(rss, 1 << 20);  // a process with a model and TBB's threads: more than a MiB
      EXPECT_LE(rss, peak);
      EXPECT_GE(peak, last_peak);  // a peak never falls within a run
      EXPECT_LE(peak, peak_after);
      last_peak = peak;
    }
    EXPECT_EQ(lines, 3);
  }
  // The argument round-trips through JSON.
  TrainingArguments a;
  a.track_memory = true;
  EXPECT_TRUE(TrainingArguments::from_json(a.to_json()).track_memory);
}

// The one event file a run wrote under save_directory/tensorboard.
std::string only_event_file(const fs::path& save_directory) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(save_directory / "tensorboard")) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? std::string() : files[0];
}

TEST(Trainer, TensorBoardHoldsEveryNumberOfTheMetricsLines) {
  TempDir d("tensorboard");
  auto args = base_args(d.str());
  args.max_training_steps = 4;
  args.log_steps = 2;
  args.evaluation_steps = 2;
  args.use_tensorboard = true;
  Trainer t(args, make_model(), std::nullopt, random_data(4, 16, 64, 8), random_data(8, 16, 64, 5));
  t.train();
  const auto events = io::read_scalar_events(only_event_file(d.p));
  // The metrics lines' numbers (step aside), in order, each at its line's step.
  std::size_t i = 0, evals = 0;
  for (const auto& j : read_metrics(d.str())) {
    evals += j.contains("eval_loss");
    for (const auto& [key, v] : j.items()) {
      if (!v.is_number() || key == "step") continue;
      ASSERT_LT(i, events.size()) << key;
      EXPECT_EQ(events[i].tag, key);
      EXPECT_EQ(events[i].value, v.get<float>()) << key;
      EXPECT_EQ(events[i].step, j["step"].get<std::int64_t>()) << key;
      ++i;
    }
  }
  EXPECT_EQ(i, events.size());
  EXPECT_GE(evals, 2u);
  // Off by default: no folder.
  TempDir off("tensorboard_off");
  auto a2 = base_args(off.str());
  a2.max_training_steps = 1;
  Trainer(a2, make_model(), std::nullopt, random_data(4, 16, 64, 1)).train();
  EXPECT_FALSE(fs::exists(off.p / "tensorboard"));
  TrainingArguments a;
  a.use_tensorboard = true;
  EXPECT_TRUE(TrainingArguments::from_json(a.to_json()).use_tensorboard);
}

TEST(Trainer, ReportStepsGiveTensorBoardItsOwnCadence) {
  // report_steps = 3 beside a metrics line every step: TensorBoard's training scalars come at
  // steps 3, 6 and the last (7), each the mean over its own steps; evaluations (step 6, and the
  // final one at 7) still go there as they run.
  TempDir d("report_steps");
  auto args = base_args(d.str());
  args.max_training_steps = 7;
  args.log_steps = 1;
  args.report_steps = 3;
  args.evaluation_steps = 6;
  args.use_tensorboard = true;
  Trainer t(args, make_model(), std::nullopt, random_data(4, 16, 64, 8), random_data(8, 16, 64, 5));
  t.train();
  std::map<std::int64_t, ojson> lines;  // the training lines by step
  std::map<std::int64_t, double> eval_loss;  // the evaluations' losses by step
  for (const auto& j : read_metrics(d.str())) {
    if (j.contains("eval_loss")) eval_loss[j["step"].get<std::int64_t>()] = j["eval_loss"].get<double>();
    else lines[j["step"].get<std::int64_t>()] = j;
  }
  ASSERT_EQ(eval_loss.size(), 2u);
  ASSERT_EQ(lines.size(), 7u);
  std::vector<std::int64_t> loss_steps, eval_steps;
  for (const auto& e : io::read_scalar_events(only_event_file(d.p))) {
    if (e.tag == "eval_loss") {
      eval_steps.push_back(e.step);
      EXPECT_EQ(e.value, static_cast<float>(eval_loss.at(e.step)));
    } else if (e.tag == "loss") {
      loss_steps.push_back(e.step);
      const std::int64_t first = e.step == 7 ? 7 : e.step - 2;
      double mean = 0;
      for (std::int64_t s = first; s <= e.step; ++s) mean += lines.at(s)["loss"].get<double>();
      mean /= static_cast<double>(e.step - first + 1);
      EXPECT_NEAR(e.value, mean, 1e-6 * mean) << "step " << e.step;
    } else if (e.tag == "learning_rate") {
      EXPECT_EQ(e.value, lines.at(e.step)["learning_rate"].get<float>()) << "step " << e.step;
    }
  }
  EXPECT_EQ(loss_steps, (std::vector<std::int64_t>{3, 6, 7}));
  EXPECT_EQ(eval_steps, (std::vector<std::int64_t>{6, 7}));
  EXPECT_EQ(TrainingArguments::from_json(args.to_json()).report_steps, std::optional<std::int64_t>(3));
  args.report_steps = 0;
  EXPECT_THROW(args.validate(), Error);
}

TEST(Trainer, TimeLimitStopsWithACheckpoint) {
  TempDir d("timelimit");
  auto args = base_args(d.str());
  args.max_training_steps = 1000;
  args.training_time_limit = 1e-6;
  Trainer t(args, make_model(), std::nullopt, random_data(8, 16, 64, 1));
  auto r = t.train();
  EXPECT_EQ(r.stop_reason, "time_limit");
  EXPECT_EQ(r.steps, 1);
  EXPECT_TRUE(fs::exists(d.p / "checkpoint-1" / "state.json"));
  // Resuming with a larger budget continues from there.
  auto args2 = args;
  args2.training_time_limit.reset();
  args2.max_training_steps = 3;
  Trainer t2(args2, make_model(), std::nullopt, random_data(8, 16, 64, 1));
  EXPECT_EQ(t2.train().steps, 3);
}

TEST(Trainer, BuildsFromJsonArguments) {
  TempDir d("json");
  fs::create_directories(d.p);
  {
    std::ofstream f(d.p / "corpus");
    for (int i = 0; i < 40; ++i) f << "fortune number " << i << " says hello\n%\n";
  }
  ojson j = {{"model", {{"vocab_size", 300}, {"hidden_size", 32}, {"intermediate_size", 64},
                        {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"max_position_embeddings", 64}}},
             {"tokenizer", {{"train_bpe", 280}}},
             {"train_data", (d.p / "corpus").string()},
             {"eval_data", (d.p / "corpus").string()},
             {"save_directory", (d.p / "out").string()},
             {"max_sequence_length", 32},
             {"total_batch_size", 4},
             {"max_training_steps", 3},
             {"evaluation_steps", 2},
             {"max_evaluation_steps", 2},
             {"learning_rate", 1e-3},
             {"progress", false},
             {"peak_gflops", 10}};
  Trainer t(TrainingArguments::from_json(j, "args.json"));
  ASSERT_TRUE(t.tokenizer().has_value());
  EXPECT_EQ(t.tokenizer()->vocab_size(), 280);
  EXPECT_EQ(t.model().config().eos_token_id, std::vector<std::int64_t>{257});
  auto r = t.train();
  EXPECT_EQ(r.steps, 3);
  ASSERT_TRUE(r.eval_loss.has_value());
  EXPECT_TRUE(fs::exists(d.p / "out" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(d.p / "out" / "checkpoint-3" / "tokenizer.json"));
  // An eval line was logged at step 2 and at the end.
  int evals = 0;
  for (const auto& m : read_metrics((d.p / "out").string())) evals += m.contains("eval_loss");
  EXPECT_EQ(evals, 2);
  // The model folder of a checkpoint works as "model" (weights loaded, not initialized).
  j["model"] = (d.p / "out" / "checkpoint-3").string();
  j["save_directory"] = (d.p / "out2").string();
  j["tokenizer"] = (d.p / "out" / "tokenizer.json").string();
  Trainer t2(TrainingArguments::from_json(j, "args.json"));
  std::vector<float> v1, v2;
  t.model().visit_params("", [&](std::string_view, auto& p) { v1.insert(v1.end(), p.data(), p.data() + p.numel()); });
  t2.model().visit_params("", [&](std::string_view, auto& p) { v2.insert(v2.end(), p.data(), p.data() + p.numel()); });
  EXPECT_EQ(v1, v2);
  // A too-small vocabulary names the model field.
  j["model"] = {{"vocab_size", 100}, {"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 1},
                {"num_attention_heads", 2}};
  j["tokenizer"] = "byte";
  try {
    Trainer t3(TrainingArguments::from_json(j, "args.json"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::config);
    EXPECT_EQ(e.where(), "args.json field model vocab_size");
  }
}

TEST(Trainer, OnAMeshBuildsStraightIntoTheBlocksAndKeepsNoHostCopy) {
  // The same JSON run on one device and on fsdp=2 x tp=2: the mesh's model is drawn (then read
  // from a checkpoint folder) straight into the devices' blocks, evaluation and weight
  // statistics run on the mesh, and no host copy exists until model() asks for one.
  TempDir d("direct");
  ojson j = test_support::fortune_run(d.p);
  j["eval_data"] = (d.p / "corpus").string();
  j["max_training_steps"] = 3;
  j["evaluation_steps"] = 2;
  j["max_evaluation_steps"] = 3;
  j["eval_batch_size"] = 3;
  j["weight_distribution_log_steps"] = 3;
  j["learning_rate"] = 1e-3;
  auto run = [&](const std::string& out, std::vector<std::int64_t> dims) {
    j["save_directory"] = (d.p / out).string();
    j["sharding_axis_dims"] = dims;
    return TrainingArguments::from_json(j, "args.json");
  };
  Trainer one(run("one", {1, 1, 1, 1}));
  const TrainResult r1 = one.train();
  Trainer mesh(run("mesh", {1, 2, 2, 1}));
  EXPECT_FALSE(mesh.host_holds_model());
  EXPECT_EQ(mesh.param_count(), one.param_count());
  const TrainResult r2 = mesh.train();
  EXPECT_FALSE(mesh.host_holds_model());  // trained, evaluated, logged and saved without one
  ASSERT_TRUE(r1.eval_loss && r2.eval_loss);
  EXPECT_NEAR(*r2.eval_loss, *r1.eval_loss, 1e-5 * *r1.eval_loss);  // eval batches of 3 rows, padded to 4
  EXPECT_NEAR(r2.final_loss, r1.final_loss, 1e-5 * r1.final_loss);
  const auto w1 = read_metrics((d.p / "one").string(), "weights.jsonl"),
             w2 = read_metrics((d.p / "mesh").string(), "weights.jsonl");
  ASSERT_EQ(w1.size(), 1u);
  ASSERT_EQ(w2.size(), 1u);
  for (const auto& [name, t] : w1[0]["tensors"].items()) {
    ASSERT_TRUE(w2[0]["tensors"].contains(name)) << name;
    EXPECT_NEAR(w2[0]["tensors"][name]["std"].get<double>(), t["std"].get<double>(), 1e-5) << name;
    EXPECT_NEAR(w2[0]["tensors"][name]["grad_norm"].get<double>(), t["grad_norm"].get<double>(),
                1e-4 * t["grad_norm"].get<double>()) << name;
  }
  // model() gathers on demand: the one-device run's weights within f32 rounding (AdamW's first
  // steps move a weight by about the learning rate whatever the gradient's size, so rounding
  // differences of small gradients show at a fraction of lr = 1e-3).
  std::vector<float> v1, v2;
  one.model().visit_params("", [&](std::string_view, auto& p) { v1.insert(v1.end(), p.data(), p.data() + p.numel()); });
  mesh.model().visit_params("", [&](std::string_view, auto& p) { v2.insert(v2.end(), p.data(), p.data() + p.numel()); });
  EXPECT_TRUE(mesh.host_holds_model());
  ASSERT_EQ(v1.size(), v2.size());
  for (std::size_t i = 0; i < v1.size(); ++i) ASSERT_NEAR(v2[i], v1[i], 1e-4) << i;
  // A checkpoint folder as the model: read straight into the blocks, the saved weights exactly.
  j["model"] = r2.checkpoint;
  Trainer again(run("again", {1, 2, 1, 1}));
  EXPECT_FALSE(again.host_holds_model());
  std::vector<float> v3;
  again.model().visit_params("", [&](std::string_view, auto& p) { v3.insert(v3.end(), p.data(), p.data() + p.numel()); });
  EXPECT_EQ(v3, v2);
}

TEST(Trainer, SameLossesOnMeshes) {
  // The same run on one device and on meshes (data parallel, fsdp with ZeRO optimizer state,
  // tensor parallel, a mix) gives the same losses, gradient norms and final weights within
  // f32 rounding; ragged data exercises the attention mask.
  auto data = random_data(10, 16, 64, 5, true);
  auto eval = random_data(4, 16, 64, 6);
  using Dims = std::vector<std::int64_t>;
  const std::vector<Dims> meshes = {{1, 1, 1, 1}, {1, 2, 1, 1}, {2, 1, 1, 1}, {1, 1, 2, 1}, {1, 2, 2, 1}};
  std::vector<std::vector<double>> ls, gs;
  std::vector<std::vector<float>> ws;
  std::vector<double> evals;
  for (const auto& dims : meshes) {
    TempDir d("mesh" + std::to_string(ls.size()));
    auto args = base_args(d.str());
    args.sharding_axis_dims = dims;
    Trainer t(args, make_model(), std::nullopt, data, eval);
    EXPECT_EQ(t.mesh_devices(), dims[0] * dims[1] * dims[2] * dims[3]);
    const auto r = t.train();
    ASSERT_TRUE(r.eval_loss.has_value());
    evals.push_back(*r.eval_loss);
    std::vector<double> g;
    ls.push_back(losses(read_metrics(d.str()), &g));
    gs.push_back(g);
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
    ws.push_back(v);
    // The checkpoint is the one-device layout whatever the mesh.
    models::LlamaForCausalLM<> m(tiny_config());
    load_model_weights(r.checkpoint, m);
    std::vector<float> c;
    m.visit_params("", [&](std::string_view, auto& p) { c.insert(c.end(), p.data(), p.data() + p.numel()); });
    EXPECT_EQ(c, v);
  }
  for (std::size_t k = 1; k < meshes.size(); ++k) {
    SCOPED_TRACE("mesh " + std::to_string(k));
    ASSERT_EQ(ls[k].size(), ls[0].size());
    for (std::size_t i = 0; i < ls[0].size(); ++i) {
      EXPECT_NEAR(ls[k][i], ls[0][i], 1e-5 * std::abs(ls[0][i])) << "step " << i + 1;
      EXPECT_NEAR(gs[k][i], gs[0][i], 1e-4 * gs[0][i]) << "step " << i + 1;
    }
    EXPECT_NEAR(evals[k], evals[0], 1e-5 * evals[0]);
    double maxdiff = 0;
    for (std::size_t i = 0; i < ws[0].size(); ++i)
      maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(ws[k][i] - ws[0][i])));
    EXPECT_LT(maxdiff, 1e-5);
  }
}

TEST(Trainer, ResumesOnAnotherMesh) {
  // 3 steps on fsdp=2, then the rest on one device: the losses of an uninterrupted one-device
  // run (the checkpoint holds the gathered weights and optimizer state).
  auto data = random_data(10, 16, 64, 5, true);
  TempDir a("mesh_full"), b("mesh_resumed");
  {
    Trainer t(base_args(a.str()), make_model(), std::nullopt, data);
    t.train();
  }
  {
    auto args = base_args(b.str());
    args.sharding_axis_dims = {1, 2, 1, 1};
    Trainer t(args, make_model(), std::nullopt, data);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  {
    Trainer t(base_args(b.str()), make_model(99), std::nullopt, data);
    const auto r = t.train();
    EXPECT_TRUE(r.resumed);
    EXPECT_EQ(r.steps, 6);
  }
  const auto la = losses(read_metrics(a.str())), lb = losses(read_metrics(b.str()));
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(lb[i], la[i], 1e-5 * std::abs(la[i])) << "step " << i + 1;
}

TEST(Trainer, MeshArgumentsAreChecked) {
  auto data = random_data(8, 16, 64, 1);
  TempDir d("mesh_bad");
  auto args = base_args(d.str());
  args.sharding_axis_dims = {2, 2, 1, 1};  // micro-batch of 2 over dp x fsdp = 4
  try {
    Trainer t(args, make_model(), std::nullopt, data);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data-parallel size"), std::string::npos) << e.what();
  }
  args.sharding_axis_dims = {1, 1, 1, 1};
  args.sharding_axis_names = {"dp", "fsdp", "tp", "pp"};
  EXPECT_THROW(Trainer(args, make_model(), std::nullopt, data), Error);
  args.sharding_axis_names = {"dp", "fsdp", "tp", "sp"};
  args.sharding_axis_dims = {1, 2, 1, 1};
  args.optimizer = "adafactor";
  EXPECT_THROW(Trainer(args, make_model(), std::nullopt, data), Error);
}

// Mixed precision (param_dtype bfloat16 or float16): 16-bit parameters, f32 master weights in
// the optimizer. Over 100 steps the losses follow f32 training from the same initial weights;
// the model's parameters are the round-to-nearest-even 16-bit values of the master weights after
// every step; the checkpoint stores 16-bit tensors and resume is bit-identical.
template <class Pol>
void mixed_precision_follows_f32_over_100_steps(const std::string& param_dtype, double tolerance) {
  using T = typename Pol::param_t;
  auto data = random_data(24, 16, 64, 21, true);
  TempDir f("f32_100_" + param_dtype), h(param_dtype + "_100");
  // Both start from the same representable weights, so the difference is the training's.
  const auto start = models::to_dtype<DefaultPolicy>(models::to_dtype<Pol>(make_model()));
  Trainer tf(hundred_step_args(f.str()), start, std::nullopt, data);
  tf.train();
  auto args_h = hundred_step_args(h.str());
  args_h.param_dtype = param_dtype;
  train::BasicTrainer<Pol> th(args_h, models::to_dtype<Pol>(start), std::nullopt, data);
  const auto rh = th.train();
  const auto lf = losses(read_metrics(f.str())), lh = losses(read_metrics(h.str()));
  ASSERT_EQ(lf.size(), 100u);
  ASSERT_EQ(lh.size(), 100u);
  EXPECT_EQ(lf[0], lh[0]);  // the first forward sees the same weights
  double worst = 0, mean_f = 0, mean_h = 0;
  for (std::size_t i = 0; i < 100; ++i) {
    worst = std::max(worst, std::abs(lh[i] - lf[i]) / lf[i]);
    if (i >= 90) mean_f += lf[i] / 10, mean_h += lh[i] / 10;
  }
  std::printf("[%s vs f32, 100 steps] first %.4f, last-10 mean f32 %.4f %s %.4f, worst step rel. diff %.4f\n",
              param_dtype.c_str(), lf[0], mean_f, param_dtype.c_str(), mean_h, worst);
  EXPECT_LT(mean_f, 0.8 * lf[0]);                      // it trained
  EXPECT_NEAR(mean_h, mean_f, tolerance * mean_f);     // and the 16-bit run followed
  EXPECT_LT(worst, 2.5 * tolerance);
  // Parameters = round(master) for every tensor; the master weights are not all on the grid.
  std::int64_t off_grid = 0;
  th.model().visit_params("", [&](std::string_view path, auto& p) {
    const std::vector<float>* master = th.optimizer().find_slot(std::string(path), "master");
    ASSERT_NE(master, nullptr) << path;
    ASSERT_EQ(static_cast<std::int64_t>(master->size()), p.numel());
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      ASSERT_EQ(to_f32(p.data()[i]), to_f32(from_f32<T>((*master)[static_cast<std::size_t>(i)]))) << path << "[" << i << "]";
      off_grid += to_f32(p.data()[i]) != (*master)[static_cast<std::size_t>(i)];
    }
  });
  EXPECT_GT(off_grid, 0);
  // The checkpoint holds 16-bit tensors (HF layout) that load into the 16-bit model unchanged.
  const auto st = io::SafeTensorsFile::open((fs::path(rh.checkpoint) / "model.safetensors").string());
  EXPECT_EQ(st.info("model.embed_tokens.weight").dtype, dtype_of<T>::value);
}

TEST(Trainer, Bf16MixedPrecisionFollowsF32Over100Steps) {
  mixed_precision_follows_f32_over_100_steps<BF16ParamsPolicy>("bfloat16", 0.02);
}
// f16 keeps 10 mantissa bits to bf16's 7, and is held to a bound 25 times tighter (about what
// bf16 itself reaches at its worst step).
TEST(Trainer, F16MixedPrecisionFollowsF32Over100Steps) {
  mixed_precision_follows_f32_over_100_steps<F16ParamsPolicy>("float16", 0.0008);
}

template <class Pol>
void mixed_precision_resume_is_bit_identical(const std::string& param_dtype) {
  using Tr = train::BasicTrainer<Pol>;
  auto data = random_data(10, 16, 64, 5, true);
  TempDir a(param_dtype + "_full"), b(param_dtype + "_resumed");
  auto args = [&](const std::string& dir) {
    auto x = base_args(dir);
    x.param_dtype = param_dtype;
    return x;
  };
  const auto start = models::to_dtype<Pol>(make_model());
  {
    Tr t(args(a.str()), start, std::nullopt, data);
    EXPECT_EQ(t.train().steps, 6);
  }
  {
    Tr t(args(b.str()), start, std::nullopt, data);
    BasicTrainerCallback<Pol> stop_at_3;
    stop_at_3.on_step_end = [](Tr&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  {
    Tr t(args(b.str()), models::to_dtype<Pol>(make_model(99)), std::nullopt, data);
    const auto r = t.train();
    EXPECT_TRUE(r.resumed);
    EXPECT_EQ(r.steps, 6);
  }
  const auto la = losses(read_metrics(a.str())), lb = losses(read_metrics(b.str()));
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
}

TEST(Trainer, Bf16ResumeIsBitIdentical) { mixed_precision_resume_is_bit_identical<BF16ParamsPolicy>("bf16"); }
TEST(Trainer, F16ResumeIsBitIdentical) { mixed_precision_resume_is_bit_identical<F16ParamsPolicy>("fp16"); }

TEST(Trainer, Bf16OnMeshesFollowsOneDevice) {
  // Mixed precision on fsdp=2 (ZeRO: each device keeps the f32 master of its block) and tp=2
  // gives the one-device bf16 run's losses and weights: the bf16 rounding happens after the
  // same f32 update, so only the mesh's f32 reduction order differs.
  auto data = random_data(10, 16, 64, 5, true);
  using Dims = std::vector<std::int64_t>;
  const std::vector<Dims> meshes = {{1, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}};
  const auto start = models::to_dtype<BF16ParamsPolicy>(make_model());
  std::vector<std::vector<double>> ls;
  std::vector<std::vector<float>> ws;
  for (const auto& dims : meshes) {
    TempDir d("bf16_mesh" + std::to_string(ls.size()));
    auto args = base_args(d.str());
    args.param_dtype = "bfloat16";
    args.sharding_axis_dims = dims;
    BF16Trainer t(args, start, std::nullopt, data);
    EXPECT_EQ(t.mesh_devices(), dims[0] * dims[1] * dims[2] * dims[3]);
    t.train();
    ls.push_back(losses(read_metrics(d.str())));
    std::vector<float> v;
    t.model().visit_params("", [&](std::string_view, auto& p) {
      for (std::int64_t i = 0; i < p.numel(); ++i) v.push_back(to_f32(p.data()[i]));
    });
    ws.push_back(v);
  }
  for (std::size_t k = 1; k < meshes.size(); ++k) {
    SCOPED_TRACE("mesh " + std::to_string(k));
    ASSERT_EQ(ls[k].size(), ls[0].size());
    for (std::size_t i = 0; i < ls[0].size(); ++i)
      EXPECT_NEAR(ls[k][i], ls[0][i], 1e-5 * std::abs(ls[0][i])) << "step " << i + 1;
    // A reduction-order difference may flip a bf16 rounding: one bf16 ulp (2^-8 relative; near
    // zero, where the update itself dominates, a small absolute amount).
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ws[0].size(); ++i) {
      EXPECT_LE(std::fabs(ws[k][i] - ws[0][i]), std::fabs(ws[0][i]) / 128.0f + 1e-6f) << i;
      differ += ws[k][i] != ws[0][i];
    }
    EXPECT_LT(differ, ws[0].size() / 100) << "weights differing from one device";
  }
}

TEST(Trainer, ParamDtypeMustNameTheTrainersStorage) {
  auto data = random_data(8, 16, 64, 1);
  TempDir d("dtype_bad");
  auto args = base_args(d.str());
  const auto param_error = [&](auto make) {
    try {
      make();
    } catch (const Error& e) {
      return std::string(e.where()) + ": " + e.what();
    }
    return std::string("no error");
  };
  args.param_dtype = "float64";
  EXPECT_NE(param_error([&] { Trainer(args, make_model(), std::nullopt, data); }).find("param_dtype"), std::string::npos);
  // A trainer told another storage than its own would train in its own without a word.
  args.param_dtype = "bfloat16";
  const std::string e = param_error([&] { Trainer(args, make_model(), std::nullopt, data); });
  EXPECT_NE(e.find("param_dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("BF16Trainer"), std::string::npos) << e;
  args.param_dtype = "float16";
  EXPECT_NE(param_error([&] { BF16Trainer(args, models::to_dtype<BF16ParamsPolicy>(make_model()), std::nullopt, data); })
                .find("param_dtype"), std::string::npos);
  EXPECT_NO_THROW(F16Trainer(args, models::to_dtype<F16ParamsPolicy>(make_model()), std::nullopt, data));
  args.param_dtype = "float32";
  args.dtype = "bfloat16";
  EXPECT_NE(param_error([&] { Trainer(args, make_model(), std::nullopt, data); }).find("field dtype"), std::string::npos);
  EXPECT_NO_THROW(BF16ComputeTrainer(args, models::to_dtype<BF16ComputePolicy>(make_model()), std::nullopt, data));
  args.dtype = "float32";  // a bf16-activation trainer told f32 would compute otherwise than asked
  EXPECT_NE(param_error([&] { BF16ComputeTrainer(args, models::to_dtype<BF16ComputePolicy>(make_model()), std::nullopt, data); })
                .find("field dtype"), std::string::npos);
}

// The compute dtype (dtype "bfloat16": bf16 activations, f32 accumulation, f32 parameters):
// over 100 steps the losses follow f32 training from the same weights, to bf16's precision;
// resume is bit-identical and a mesh follows one device.
TEST(Trainer, Bf16ActivationsFollowF32Over100Steps) {
  auto data = random_data(24, 16, 64, 21, true);
  TempDir f("f32_100_act"), h("bf16_act_100");
  const auto start = make_model();
  Trainer tf(hundred_step_args(f.str()), start, std::nullopt, data);
  tf.train();
  auto args_h = hundred_step_args(h.str());
  args_h.dtype = "bfloat16";
  BF16ComputeTrainer th(args_h, models::to_dtype<BF16ComputePolicy>(start), std::nullopt, data);
  th.train();
  const auto lf = losses(read_metrics(f.str())), lh = losses(read_metrics(h.str()));
  ASSERT_EQ(lf.size(), 100u);
  ASSERT_EQ(lh.size(), 100u);
  double worst = 0, mean_f = 0, mean_h = 0;
  for (std::size_t i = 0; i < 100; ++i) {
    worst = std::max(worst, std::abs(lh[i] - lf[i]) / lf[i]);
    if (i >= 90) mean_f += lf[i] / 10, mean_h += lh[i] / 10;
  }
  std::printf("[bf16 activations vs f32, 100 steps] first %.5f vs %.5f, last-10 mean f32 %.4f bf16 %.4f, worst step "
              "rel. diff %.4f\n", lf[0], lh[0], mean_f, mean_h, worst);
  EXPECT_NE(lf[0], lh[0]);                          // the activations are rounded
  EXPECT_LT(mean_f, 0.8 * lf[0]);                   // it trained
  EXPECT_NEAR(mean_h, mean_f, 0.02 * mean_f);       // and the bf16-activation run followed
  EXPECT_LT(worst, 0.05);
}

TEST(Trainer, Bf16ActivationsResumeIsBitIdenticalAndMeshesFollowOneDevice) {
  auto data = random_data(10, 16, 64, 5, true);
  TempDir a("bf16_act_full"), b("bf16_act_resumed"), m("bf16_act_fsdp");
  auto args = [&](const std::string& dir) {
    auto x = base_args(dir);
    x.dtype = "bfloat16";
    return x;
  };
  const auto start = models::to_dtype<BF16ComputePolicy>(make_model());
  EXPECT_EQ(BF16ComputeTrainer(args(a.str()), start, std::nullopt, data).train().steps, 6);
  {
    BF16ComputeTrainer t(args(b.str()), start, std::nullopt, data);
    BasicTrainerCallback<BF16ComputePolicy> stop_at_3;
    stop_at_3.on_step_end = [](BF16ComputeTrainer&, const StepMetrics& s) { return s.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  EXPECT_TRUE(BF16ComputeTrainer(args(b.str()), start, std::nullopt, data).train().resumed);
  auto on_mesh = args(m.str());
  on_mesh.sharding_axis_dims = {1, 2, 1, 1};
  EXPECT_EQ(BF16ComputeTrainer(on_mesh, start, std::nullopt, data).train().steps, 6);
  const auto la = losses(read_metrics(a.str())), lb = losses(read_metrics(b.str())), lm = losses(read_metrics(m.str()));
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  ASSERT_EQ(lm.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(la[i], lb[i]) << "resume, step " << i + 1;
    EXPECT_NEAR(lm[i], la[i], 4e-3 * la[i]) << "fsdp = 2, step " << i + 1;  // one bf16 ulp
  }
}


// ---------------------------------------------------------------- the state, optimizers, collators, async saves

std::vector<float> params_of(models::LlamaForCausalLM<>& m) {
  std::vector<float> v;
  m.visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.numel()); });
  return v;
}

// Appends every step's loss to `out` (a callback of `t`).
void record_losses(Trainer& t, std::vector<double>& out) {
  TrainerCallback cb;
  cb.on_step_end = [&out](Trainer&, const StepMetrics& m) {
    out.push_back(m.loss);
    return true;
  };
  t.callbacks.push_back(cb);
}

// The trainer's step written out by hand with a TrainingState: rows in file order (no
// shuffling, one micro-batch per step), the loss normalised by the step's targets, clipping,
// the schedule's rate. Runs `st` up to step `to`; returns the losses.
std::vector<double> hand_written_steps(TrainingState<>& st, const TrainingArguments& args, const TokenDataset& data,
                                       std::int64_t to, const DataCollator& collator = {}, nn::LossOptions lo = {}) {
  const optim::Schedule sched = args.schedule(*args.max_training_steps);
  const std::int64_t B = args.total_batch_size, per_epoch = data.size() / B;
  std::vector<double> out;
  while (st.step < to) {
    std::vector<std::int64_t> rows(static_cast<std::size_t>(B));
    std::iota(rows.begin(), rows.end(), (st.step % per_epoch) * B);
    const Batch b = collator ? collator(data, rows) : collate_rows(data, rows, args.max_sequence_length, 0);
    optim::zero_grad(st.model);
    lo.normalizer = static_cast<double>(std::max<std::int64_t>(b.target_tokens(), 1));
    out.push_back(guarded_causal_lm_loss(st.model, b, lo, /*backward=*/true).loss);
    st.apply_gradients(sched.lr_at(st.step), args.clip_grad);
  }
  return out;
}

TrainingArguments loop_args(const std::string& dir, const char* optimizer, const char* scheduler) {
  auto a = base_args(dir);
  a.optimizer = optimizer;
  a.scheduler = scheduler;
  a.gradient_accumulation_steps = 1;
  a.total_batch_size = 2;
  a.shuffle_train_dataset = false;
  a.max_training_steps = 5;
  a.write_report = false;
  return a;
}

// Every optimizer and schedule, through the trainer, equals the hand-written loop bit for bit
// (5 steps over 4-step epochs); and a Trainer built from a TrainingState (the seeds'
// Trainer(model_state=...)) continues a hand-written run from its step with its optimizer,
// whatever the arguments name.
TEST(Trainer, EveryOptimizerAndScheduleFollowsAHandWrittenLoop) {
  const auto data = random_data(8, 16, 64, 5, true);
  const std::vector<std::pair<const char*, const char*>> runs = {
      {"lion", "linear"}, {"adafactor", "warmup_stable_decay"}, {"rmsprop", "cosine"}, {"sgd", "none"}};
  for (const auto& [optimizer, scheduler] : runs) {
    SCOPED_TRACE(std::string(optimizer) + " with " + scheduler);
    TempDir d(std::string("loop_") + optimizer);
    auto args = loop_args(d.str(), optimizer, scheduler);
    if (std::string(optimizer) == "sgd") args.momentum = 0.9;
    if (std::string(optimizer) == "lion") args.learning_rate = 3e-4;
    Trainer t(args, make_model(1), std::nullopt, data);
    std::vector<double> seen;
    record_losses(t, seen);
    t.train();
    auto st = TrainingState<>::create(make_model(1), args.optimizer_options());
    EXPECT_EQ(seen, hand_written_steps(st, args, data, 5));
    EXPECT_EQ(params_of(t.model()), params_of(st.model));

    auto half = TrainingState<>::create(make_model(1), args.optimizer_options());
    hand_written_steps(half, args, data, 2);
    TempDir d2(std::string("from_state_") + optimizer);
    auto args2 = args;
    args2.save_directory = d2.str();
    args2.optimizer = std::string(optimizer) == "adamw" ? "sgd" : "adamw";  // the state's optimizer wins
    Trainer t2(args2, std::move(half), std::nullopt, data);
    EXPECT_EQ(t2.args().optimizer, optimizer);
    EXPECT_EQ(t2.state().step, 2);
    const TrainResult r = t2.train();
    EXPECT_EQ(r.steps, 5);
    EXPECT_EQ(params_of(t2.model()), params_of(st.model));
    TrainingState<> back = t2.model_state();
    EXPECT_EQ(back.step, 5);
    EXPECT_EQ(back.optimizer.step_count(), st.optimizer.step_count());
    EXPECT_EQ(params_of(back.model), params_of(st.model));
  }
}

// A collator of the user's: every row's first four positions are context, not targets.
Batch context_masked(const TokenDataset& ds, std::span<const std::int64_t> rows) {
  Batch b = collate_rows(ds, rows, 16, 0);
  for (std::int64_t r = 0; r < b.batch; ++r)
    for (std::int64_t s = 0; s < 4; ++s) b.labels[static_cast<std::size_t>(r * b.seq + s)] = -100;
  return b;
}

// The seeds' data_collator builds every training and evaluation batch: the trainer's losses
// are the hand-written loop's on the collator's batches, evaluation scores its batches, and a
// collator's bad batch is an error naming it, the step and the field.
TEST(Trainer, DataCollatorBuildsEveryBatch) {
  const auto data = random_data(8, 16, 64, 5, true);
  const auto eval = random_data(5, 16, 64, 6);
  TempDir d("collator");
  auto args = loop_args(d.str(), "adamw", "cosine");
  args.max_training_steps = 4;
  args.eval_batch_size = 2;
  Trainer t(args, make_model(1), std::nullopt, data, eval);
  std::vector<std::vector<std::int64_t>> calls;
  t.data_collator = [&](const TokenDataset& ds, std::span<const std::int64_t> rows) {
    calls.emplace_back(rows.begin(), rows.end());
    return context_masked(ds, rows);
  };
  std::vector<double> seen;
  record_losses(t, seen);
  const TrainResult r = t.train();
  const std::vector<std::vector<std::int64_t>> expected = {{0, 1}, {2, 3}, {4, 5}, {6, 7},  // four steps
                                                           {0, 1}, {2, 3}, {4}};            // the final evaluation
  EXPECT_EQ(calls, expected);
  auto st = TrainingState<>::create(make_model(1), args.optimizer_options());
  EXPECT_EQ(seen, hand_written_steps(st, args, data, 4, context_masked));
  ASSERT_TRUE(r.eval_loss.has_value());
  EvalOptions eo{16, 2, std::nullopt, 0, Truncation::keep_end, context_masked, 64};
  EXPECT_EQ(*r.eval_loss, evaluate_dataset(st.model, eval, eo).loss);
  eo.collator = nullptr;
  EXPECT_NE(*r.eval_loss, evaluate_dataset(st.model, eval, eo).loss);  // the masking mattered

  const auto fails = [&](DataCollator c, const std::string& field) {
    TempDir db("collator_bad");
    Trainer bad(loop_args(db.str(), "adamw", "cosine"), make_model(1), std::nullopt, data);
    bad.data_collator = std::move(c);
    try {
      bad.train();
      ADD_FAILURE() << "expected an error naming " << field;
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("data_collator (train step 1"), std::string::npos) << w;
      EXPECT_NE(w.find(field), std::string::npos) << w;
    }
  };
  fails([](const TokenDataset& ds, std::span<const std::int64_t> rows) {
    Batch b = context_masked(ds, rows);
    b.input_ids[3] = 64;  // outside the vocabulary
    return b;
  }, "input_ids[3] is 64");
  fails([](const TokenDataset& ds, std::span<const std::int64_t> rows) {
    Batch b = context_masked(ds, rows);
    b.labels.pop_back();
    return b;
  }, "labels has");
}

// State files of two runs' checkpoint-<step> folders, without what differs between runs
// (the clock, the folder, the checkpointing mode).
ojson comparable_state(const fs::path& checkpoint) {
  ojson j = ojson::parse(std::ifstream(checkpoint / "state.json"));
  j.erase("elapsed_s");
  j["training_arguments"].erase("save_directory");
  j["training_arguments"].erase("async_checkpointing");
  return j;
}
std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// async_checkpointing: training goes on while a checkpoint is written (the first save's
// writer waits for step 3 to end, which a synchronous save would never let happen), and
// every checkpoint holds the same bytes as a synchronous run's; on_save hears of each once it
// is complete; the training arguments keep the field. On one device, and on a simulated
// fsdp=2 x tp=2 mesh, whose blocks are copied for the writer (ShardedLlama::snapshot).
TEST(Trainer, AsyncCheckpointingWritesTheSameFilesWhileTrainingGoesOn) {
  for (const std::vector<std::int64_t>& dims : {std::vector<std::int64_t>{1, 1, 1, 1}, {1, 2, 2, 1}}) {
  SCOPED_TRACE("mesh " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]));
  const auto data = random_data(10, 16, 64, 5, true);
  const std::string tag = std::to_string(dims[1] * dims[2]);
  TempDir a("sync_saves" + tag), b("async_saves" + tag);
  auto args = base_args(a.str());
  args.save_steps = 2;
  args.write_report = false;
  args.sharding_axis_dims = dims;
  {
    Trainer t(args, make_model(), std::nullopt, data);
    t.train();
  }
  args.save_directory = b.str();
  args.async_checkpointing = true;
  EXPECT_TRUE(TrainingArguments::from_json(args.to_json()).async_checkpointing);
  Trainer t(args, make_model(), std::nullopt, data);
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t steps_done = 0;
  bool overtaken = false, first_file = true;
  t.checkpoint_hooks.after_file = [&](const std::string&) {
    std::unique_lock<std::mutex> lock(mu);
    if (!first_file) return;
    first_file = false;  // checkpoint-2's first file: hold the writer until step 3 is done
    overtaken = cv.wait_for(lock, std::chrono::seconds(120), [&] { return steps_done >= 3; });
  };
  std::vector<std::string> saved;
  TrainerCallback cb;
  cb.on_step_end = [&](Trainer&, const StepMetrics& m) {
    {
      std::lock_guard<std::mutex> lock(mu);
      steps_done = m.step;
    }
    cv.notify_all();
    return true;
  };
  cb.on_save = [&](Trainer&, const std::string& p) { saved.push_back(fs::path(p).filename().string()); };
  t.callbacks.push_back(cb);
  const TrainResult r = t.train();
  EXPECT_TRUE(overtaken) << "the step loop waited for the checkpoint";
  EXPECT_EQ(saved, (std::vector<std::string>{"checkpoint-2", "checkpoint-4", "checkpoint-6"}));
  EXPECT_EQ(fs::path(r.checkpoint).filename().string(), "checkpoint-6");
  EXPECT_EQ(losses(read_metrics(a.str())), losses(read_metrics(b.str())));
  for (const char* step : {"checkpoint-2", "checkpoint-4", "checkpoint-6"}) {
    SCOPED_TRACE(step);
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_EQ(file_bytes(a.p / step / f), file_bytes(b.p / step / f)) << f;
    EXPECT_EQ(comparable_state(a.p / step), comparable_state(b.p / step));
  }
  }
}

// A background save that fails stops training with its error at the next point that waits,
// leaves no part of its folder, and the previous checkpoint still resumes.
TEST(Trainer, AsyncCheckpointFailureIsRethrownAndKeepsThePreviousOne) {
  const auto data = random_data(10, 16, 64, 5, true);
  TempDir d("async_fail");
  auto args = base_args(d.str());
  args.save_steps = 2;
  args.async_checkpointing = true;
  args.write_report = false;
  int files = 0;
  {
    Trainer t(args, make_model(), std::nullopt, data);
    t.checkpoint_hooks.after_file = [&](const std::string& f) {
      if (++files == 4) throw std::runtime_error("disk full while writing " + f);  // checkpoint-4's first file
    };
    EXPECT_THROW(t.train(), std::runtime_error);
  }
  EXPECT_TRUE(fs::exists(d.p / "checkpoint-2" / "state.json"));
  EXPECT_FALSE(fs::exists(d.p / "checkpoint-4"));
  for (const auto& e : fs::directory_iterator(d.p))
    EXPECT_EQ(e.path().filename().string().find(".checkpoint-4"), std::string::npos) << e.path();
  Trainer again(args, make_model(7), std::nullopt, data);
  const TrainResult r = again.train();
  EXPECT_TRUE(r.resumed);
  EXPECT_EQ(r.steps, 6);
}


// loss_config (EasyDeL's name): z-loss, label smoothing and the chunking reach the trainer's
// loss, on one device bit for bit with the hand-written loop, and on a mesh to f32 rounding.
TEST(Trainer, LossConfigReachesTheLoss) {
  const auto data = random_data(8, 16, 64, 5, true);
  TempDir d("loss_config");
  auto args = loop_args(d.str(), "adamw", "cosine");
  args.max_training_steps = 3;
  args.loss_config = {1e-2, 0.1, 5};
  auto j = args.to_json();
  EXPECT_EQ(TrainingArguments::from_json(j).loss_config, args.loss_config);
  std::vector<double> seen, on_mesh;
  const auto run = [&](TrainingArguments a, std::vector<double>& out) {
    Trainer t(a, make_model(1), std::nullopt, data);
    record_losses(t, out);
    t.train();
  };
  run(args, seen);
  nn::LossOptions lo;
  lo.z_loss = 1e-2f;
  lo.label_smoothing = 0.1f;
  lo.chunk_rows = 5;
  auto st = TrainingState<>::create(make_model(1), args.optimizer_options());
  EXPECT_EQ(seen, hand_written_steps(st, args, data, 3, {}, lo));
  auto plain = TrainingState<>::create(make_model(1), args.optimizer_options());
  EXPECT_NE(seen, hand_written_steps(plain, args, data, 3));  // the options changed the loss
  TempDir dm("loss_config_mesh");
  auto margs = args;
  margs.save_directory = dm.str();
  margs.sharding_axis_dims = {1, 2, 1, 1};
  run(margs, on_mesh);
  ASSERT_EQ(on_mesh.size(), seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_NEAR(on_mesh[i], seen[i], 1e-5 * seen[i]) << i;

  j["loss_config"] = {{"z_loss", -1.0}};
  EXPECT_THROW(TrainingArguments::from_json(j).validate(), Error);
  j["loss_config"] = {{"temperature", 1.0}};
  EXPECT_THROW(TrainingArguments::from_json(j), Error);
}

// progress_bar_type "json": one JSON object per logged step on stderr with the metrics line's
// step and loss, the rest as {"message": ...}; "none" prints nothing; other names are refused.
TEST(Trainer, ProgressBarTypeJsonWritesJsonLines) {
  const auto data = random_data(8, 16, 64, 5, true);
  TempDir d("progress_json");
  auto args = loop_args(d.str(), "adamw", "cosine");
  args.progress = true;
  args.progress_bar_type = "json";
  args.max_training_steps = 3;
  testing::internal::CaptureStderr();
  {
    Trainer t(args, make_model(1), std::nullopt, data);
    t.train();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  std::vector<double> progress_losses;
  std::size_t messages = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    const ojson j = ojson::parse(line);  // every line is JSON
    if (j.contains("message")) ++messages;
    else progress_losses.push_back(j.at("loss").get<double>());
  }
  EXPECT_EQ(progress_losses, losses(read_metrics(d.str())));
  EXPECT_GE(messages, 1u);  // "saved ..."

  TempDir dn("progress_none");
  args.save_directory = dn.str();
  args.progress_bar_type = "none";
  testing::internal::CaptureStderr();
  {
    Trainer t(args, make_model(1), std::nullopt, data);
    t.train();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  args.progress_bar_type = "bar";
  EXPECT_THROW(Trainer(args, make_model(1), std::nullopt, data), Error);
}

// The trainer's MFU is the model's flops_per_token(seq, include_loss, include_backward) times
// the tokens per second over the peak (full rows: every position is a token).
TEST(Trainer, MfuIsFlopsPerTokenTimesTokensPerSecondOverThePeak) {
  const auto data = random_data(8, 16, 64, 5);
  TempDir d("mfu");
  auto args = loop_args(d.str(), "adamw", "cosine");
  args.max_training_steps = 3;
  Trainer t(args, make_model(1), std::nullopt, data);
  t.train();
  const double per_token = t.model().flops_per_token(16, true, true);
  std::size_t checked = 0;
  for (const auto& j : read_metrics(d.str())) {
    if (!j.contains("mfu")) continue;
    const double want = per_token * j["tokens_per_s"].get<double>() / (args.peak_gflops * 1e9);
    EXPECT_NEAR(j["mfu"].get<double>(), want, 1e-9 * want) << j.dump();
    ++checked;
  }
  EXPECT_EQ(checked, 3u);
}

}  // namespace
}  // namespace edl::train
