// The trainer with a "lora" section (LoRA) and "quantize_base" (QLoRA): only adapters train,
// the base keeps its bits, resume is exact, checkpoints and the end of training write PEFT
// adapter folders that load back to the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <edl/lora/all.hpp>
#include <edl/train/all.hpp>
#include "../support/fortune_run.hpp"
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

models::LlamaConfig config(std::int64_t hidden = 32) {
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = hidden;
  c.intermediate_size = 2 * hidden;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  return c;
}

models::LlamaForCausalLM<> make_model(std::int64_t hidden = 32) {
  models::LlamaForCausalLM<> m(config(hidden));
  m.init(Key::from_seed(0));
  return m;
}

// Its own folder name under the temp directory; the code under test creates the folder.
struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("lora_tr_" + name, Make::name_only) {}
};

// Repeats of a few fixed sequences: a task the adapters can memorize.
TokenDataset repeated_data(std::int64_t n, std::int64_t len) {
  TokenDataset d;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> s(static_cast<std::size_t>(len));
    for (std::int64_t j = 0; j < len; ++j) s[static_cast<std::size_t>(j)] = static_cast<std::int32_t>((j * 7 + (i % 2) * 3) % 64);
    d.add(std::span<const std::int32_t>(s));
  }
  return d;
}

TrainingArguments lora_args(const std::string& dir, std::int64_t steps = 6) {
  TrainingArguments a;
  a.save_directory = dir;
  a.learning_rate = 1e-2;
  a.total_batch_size = 4;
  a.gradient_accumulation_steps = 2;
  a.max_sequence_length = 16;
  a.max_training_steps = steps;
  a.save_steps = 3;
  a.log_steps = 1;
  a.progress = false;
  a.write_report = false;
  a.peak_gflops = 100;
  a.seed = 5;
  lora::LoraConfig c;
  c.r = 4;
  c.lora_alpha = 8;
  c.lora_dropout = 0.1f;
  c.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  a.lora = c;
  return a;
}

template <class M>
std::vector<unsigned char> base_bytes(M& m) {
  std::vector<unsigned char> out;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (path.find(".lora_") != std::string_view::npos) return;
    const auto* b = reinterpret_cast<const unsigned char*>(p.data());
    out.insert(out.end(), b, b + p.value.size() * sizeof(*p.data()));
  });
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (lin.is_quantized()) out.insert(out.end(), reinterpret_cast<const unsigned char*>(lin.qweight.bytes().data()),
                                       reinterpret_cast<const unsigned char*>(lin.qweight.bytes().data()) +
                                           lin.qweight.bytes().size());
  });
  return out;
}

std::vector<double> losses(const std::string& dir) {
  std::vector<double> l;
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = ojson::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

std::vector<float> logits(const models::LlamaForCausalLM<>& m) {
  std::vector<std::int64_t> ids = {1, 8, 15, 22, 29, 36, 43, 50};
  std::vector<float> out(static_cast<std::size_t>(8 * m.config().vocab_size));
  m.logits(ids.data(), nn::TokenLayout{1, 8}, out.data());
  return out;
}

}  // namespace

TEST(LoraTraining, OnlyAdaptersTrainAndTheBaseKeepsItsBits) {
  TempDir d("only");
  auto start = make_model();
  const auto before = base_bytes(start);
  Trainer t(lora_args(d.str(), 24), start, std::nullopt, repeated_data(8, 16));
  const TrainResult r = t.train();
  EXPECT_LT(r.final_loss, r.first_loss - 0.3);  // the adapters learn (slowly: head and embeddings stay random)
  EXPECT_EQ(base_bytes(t.model()), before);
  t.optimizer().visit_state([](const std::string& path, const std::string&, const std::vector<float>&) {
    EXPECT_NE(path.find(".lora_"), std::string::npos) << path;  // no optimizer state for the base
  });
  // Checkpoints hold the adapter, not the model; the end writes save_directory/adapter.
  const fs::path ck = d.p / "checkpoint-24";
  EXPECT_TRUE(fs::exists(ck / lora::kAdapterConfigFile));
  EXPECT_TRUE(fs::exists(ck / lora::kAdapterWeightsFile));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors"));
  ASSERT_TRUE(fs::exists(d.p / "adapter" / lora::kAdapterWeightsFile));
  // The adapter folder on the untouched base is the trained model.
  auto fresh = make_model();
  lora::load_adapter(d.p / "adapter", fresh);
  const auto want = logits(t.model()), got = logits(fresh);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
}

TEST(LoraTraining, ResumeIsBitIdenticalWithDropout) {
  TempDir a("full"), b("resumed");
  const auto data = repeated_data(10, 16);
  {
    Trainer t(lora_args(a.str()), make_model(), std::nullopt, data);
    t.train();
  }
  {
    Trainer t(lora_args(b.str()), make_model(), std::nullopt, data);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  {
    Trainer t(lora_args(b.str()), make_model(), std::nullopt, data);
    const TrainResult r = t.train();
    EXPECT_TRUE(r.resumed);
    EXPECT_EQ(r.steps, 6);
  }
  const auto la = losses(a.str()), lb = losses(b.str());
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (std::size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
  const auto fa = io::SafeTensorsFile::open((a.p / "adapter" / lora::kAdapterWeightsFile).string());
  const auto fb = io::SafeTensorsFile::open((b.p / "adapter" / lora::kAdapterWeightsFile).string());
  for (const auto& n : fa.names()) EXPECT_EQ(fa.read_vector<float>(n), fb.read_vector<float>(n)) << n;
}

TEST(LoraTraining, GradientCheckpointingTrainsBitIdentically) {
  // A rematerialized forward recomputes the adapters' activations with the same dropout mask.
  std::vector<std::vector<double>> runs;
  for (const char* remat : {"", "nothing_saveable", "dots_saveable"}) {
    TempDir d(std::string("remat") + remat);
    auto args = lora_args(d.str(), 4);
    args.gradient_checkpointing = remat;
    Trainer t(args, make_model(), std::nullopt, repeated_data(8, 16));
    t.train();
    runs.push_back(losses(d.str()));
  }
  ASSERT_EQ(runs[0].size(), 4u);
  EXPECT_EQ(runs[1], runs[0]);
  EXPECT_EQ(runs[2], runs[0]);
}

TEST(LoraTraining, QLoRAKeepsTheQuantizedBaseAndLearns) {
  TempDir d("qlora");
  auto args = lora_args(d.str(), 12);
  args.quantize_base = "nf4";
  Trainer t(args, make_model(64), std::nullopt, repeated_data(8, 16));
  EXPECT_TRUE(nn::is_quantized(t.model()));
  const auto before = base_bytes(t.model());
  const TrainResult r = t.train();
  EXPECT_LT(r.final_loss, r.first_loss - 0.3);
  EXPECT_TRUE(nn::is_quantized(t.model()));
  EXPECT_EQ(base_bytes(t.model()), before);
}

TEST(LoraTraining, ArgumentsAreChecked) {
  auto args = lora_args("unused");
  args.train_data = {"x.txt"};
  EXPECT_NO_THROW(args.validate());
  args.quantize_base = "int3";
  EXPECT_THROW(args.validate(), Error);
  args.quantize_base = "nf4";
  args.lora.reset();
  EXPECT_THROW(args.validate(), Error);  // QLoRA needs adapters
  ojson j = {{"train_data", "x.txt"}, {"lora", {{"r", 8}, {"target_modules", {"q_proj"}}, {"alpha", 16}}}};
  try {
    TrainingArguments::from_json(j, "args.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("alpha"), std::string::npos) << e.what();
  }
  j["lora"] = {{"r", 8}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj"}}};
  const auto a = TrainingArguments::from_json(j, "args.json");
  ASSERT_TRUE(a.lora);
  EXPECT_EQ(a.lora->r, 8);
  EXPECT_EQ(TrainingArguments::from_json(a.to_json(), "again").lora->target_modules, a.lora->target_modules);
  auto mesh = a;
  mesh.sharding_axis_dims = {1, 2, 1, 1};
  mesh.total_batch_size = 2;
  EXPECT_NO_THROW(mesh.validate());  // LoRA runs on meshes
  mesh.quantize_base = "nf4";
  EXPECT_THROW(mesh.validate(), Error);  // QLoRA on one device only
}

// LoRA on a mesh: fsdp=2 and tp=2 (dropout on) train as one device does, within f32 rounding;
// the base keeps its bits, the optimizer holds the adapters' state alone, and the checkpoint
// and adapter folders are PEFT's, as on one device.
TEST(LoraTraining, OnAMeshTrainsAsOneDevice) {
  const auto data = repeated_data(8, 16);
  TempDir one("mesh_one");
  Trainer t1(lora_args(one.str(), 4), make_model(), std::nullopt, data);
  t1.train();
  const auto want = losses(one.str());
  ASSERT_EQ(want.size(), 4u);
  for (const std::vector<std::int64_t>& dims : {std::vector<std::int64_t>{1, 2, 1, 1}, {1, 1, 2, 1}}) {
    TempDir d("mesh_" + std::to_string(dims[1]) + std::to_string(dims[2]));
    auto args = lora_args(d.str(), 4);
    args.sharding_axis_dims = dims;
    auto start = make_model();
    const auto before = base_bytes(start);
    Trainer t(args, start, std::nullopt, data);
    ASSERT_EQ(t.mesh_devices(), 2);
    t.train();
    const auto got = losses(d.str());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
    EXPECT_EQ(base_bytes(t.model()), before);
    t.optimizer().visit_state([](const std::string& path, const std::string&, const std::vector<float>&) {
      EXPECT_NE(path.find(".lora_"), std::string::npos) << path;
    });
    EXPECT_TRUE(fs::exists(d.p / "checkpoint-4" / lora::kAdapterWeightsFile));
    const auto fa = io::SafeTensorsFile::open((one.p / "adapter" / lora::kAdapterWeightsFile).string());
    const auto fb = io::SafeTensorsFile::open((d.p / "adapter" / lora::kAdapterWeightsFile).string());
    ASSERT_EQ(fa.names(), fb.names());
    for (const auto& n : fa.names()) {
      const auto a = fa.read_vector<float>(n), b = fb.read_vector<float>(n);
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
      }
      EXPECT_LE(worst, 1e-4 * scale + 1e-7) << n;
    }
  }
}

// A LoRA run on fsdp=2 stopped at step 3 resumes from its adapter checkpoint (each device's
// blocks read from the PEFT file) to the uninterrupted run's losses, bit for bit.
TEST(LoraTraining, OnAMeshResumeIsBitIdentical) {
  const auto data = repeated_data(10, 16);
  TempDir a("mesh_full"), b("mesh_resumed");
  const auto args = [](const TempDir& d) {
    auto x = lora_args(d.str());
    x.sharding_axis_dims = {1, 2, 1, 1};
    return x;
  };
  Trainer(args(a), make_model(), std::nullopt, data).train();
  {
    Trainer t(args(b), make_model(), std::nullopt, data);
    TrainerCallback stop_at_3;
    stop_at_3.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 3; };
    t.callbacks.push_back(stop_at_3);
    EXPECT_EQ(t.train().steps, 3);
  }
  Trainer t(args(b), make_model(), std::nullopt, data);
  const TrainResult r = t.train();
  EXPECT_TRUE(r.resumed);
  EXPECT_EQ(losses(a.str()), losses(b.str()));
}

}  // namespace edl::train

namespace edl::train {

// A LoRA run built from its arguments on fsdp=2 x tp=2: the base is drawn straight into the
// devices' blocks and the adapters added there (ShardedLlama::add_adapters), so no process
// holds the model; it trains as one device does, its checkpoints and adapter folder are
// PEFT's, and a run stopped at step 2 resumes from its checkpoint to the uninterrupted losses.
TEST(LoraTraining, OnAMeshFromArgumentsKeepsNoHostCopy) {
  TempDir d("direct");
  ojson j = test_support::fortune_run(d.p);
  j["max_training_steps"] = 4;
  j["save_steps"] = 2;
  j["log_steps"] = 1;
  j["learning_rate"] = 1e-2;
  j["lora"] = {{"r", 4}, {"lora_alpha", 8}, {"lora_dropout", 0.1}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}};
  auto run = [&](const std::string& out, std::vector<std::int64_t> dims) {
    j["save_directory"] = (d.p / out).string();
    j["sharding_axis_dims"] = dims;
    return TrainingArguments::from_json(j, "args.json");
  };
  Trainer one(run("one", {1, 1, 1, 1}));
  one.train();
  Trainer mesh(run("mesh", {1, 2, 2, 1}));
  EXPECT_FALSE(mesh.host_holds_model());
  EXPECT_EQ(mesh.param_count(), one.param_count());
  mesh.train();
  EXPECT_FALSE(mesh.host_holds_model());  // trained, saved and wrote its adapter without one
  const auto want = losses((d.p / "one").string()), got = losses((d.p / "mesh").string());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
  for (const char* folder : {"checkpoint-4", "adapter"}) {
    const auto fa = io::SafeTensorsFile::open((d.p / "one" / folder / lora::kAdapterWeightsFile).string());
    const auto fb = io::SafeTensorsFile::open((d.p / "mesh" / folder / lora::kAdapterWeightsFile).string());
    ASSERT_EQ(fa.names(), fb.names()) << folder;
    for (const auto& n : fa.names()) {
      const auto a = fa.read_vector<float>(n), b = fb.read_vector<float>(n);
      ASSERT_EQ(a.size(), b.size()) << n;
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
      }
      EXPECT_LE(worst, 1e-4 * scale + 1e-7) << folder << " " << n;
    }
  }
  {  // stopped after step 2 (its checkpoint written), then resumed by a new run
    Trainer t(run("resumed", {1, 2, 2, 1}));
    TrainerCallback stop_at_2;
    stop_at_2.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 2; };
    t.callbacks.push_back(stop_at_2);
    EXPECT_EQ(t.train().steps, 2);
  }
  Trainer resumed(run("resumed", {1, 2, 2, 1}));
  EXPECT_TRUE(resumed.train().resumed);
  EXPECT_FALSE(resumed.host_holds_model());
  EXPECT_EQ(losses((d.p / "resumed").string()), got);
}

}  // namespace edl::train
