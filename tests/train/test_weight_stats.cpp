// Tests for edl/train/weight_stats.hpp: the statistics against a naive long-double loop, the
// gradient norm, the JSON record, and weights.jsonl written by the trainer every N steps with
// the figures of the model at that step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <edl/train/all.hpp>

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct Naive {
  long double mean = 0, std = 0, min = 0, max = 0, abs_max = 0;
};
Naive naive(const float* v, std::size_t n) {
  Naive r;
  long double s = 0;
  r.min = r.max = v[0];
  for (std::size_t i = 0; i < n; ++i) {
    s += v[i];
    r.min = std::min<long double>(r.min, v[i]);
    r.max = std::max<long double>(r.max, v[i]);
    r.abs_max = std::max<long double>(r.abs_max, std::fabs(v[i]));
  }
  r.mean = s / n;
  long double q = 0;
  for (std::size_t i = 0; i < n; ++i) q += (v[i] - r.mean) * (v[i] - r.mean);
  r.std = std::sqrt(q / n);
  return r;
}

models::LlamaConfig tiny() {
  models::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 16;
  return c;
}

void expect_matches(const TensorStats& s, const float* v, std::size_t n) {
  const Naive w = naive(v, n);
  const double tol = 1e-12 * std::max<double>(1.0, static_cast<double>(w.abs_max));
  EXPECT_EQ(s.numel, static_cast<std::int64_t>(n)) << s.name;
  EXPECT_NEAR(s.mean, static_cast<double>(w.mean), tol) << s.name;
  EXPECT_NEAR(s.std, static_cast<double>(w.std), 1e-10 * std::max<double>(1.0, static_cast<double>(w.std))) << s.name;
  EXPECT_EQ(s.min, static_cast<double>(w.min)) << s.name;
  EXPECT_EQ(s.max, static_cast<double>(w.max)) << s.name;
  EXPECT_EQ(s.abs_max, static_cast<double>(w.abs_max)) << s.name;
}

TEST(WeightStats, MatchNaiveLoops) {
  // A large offset: the two-pass std must not lose the spread.
  std::vector<float> v(1001);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1000.0f + 0.001f * static_cast<float>(i % 17) - (i == 500 ? 2000.0f : 0.0f);
  TensorStats s = tensor_stats(v.data(), static_cast<std::int64_t>(v.size()));
  expect_matches(s, v.data(), v.size());
  EXPECT_LT(s.min, -999.0);
  EXPECT_EQ(tensor_stats<float>(nullptr, 0).numel, 0);

  models::LlamaForCausalLM<> m(tiny());
  m.init(Key::from_seed(4));
  auto stats = weight_stats(m);
  std::size_t k = 0;
  m.visit_params("", [&](std::string_view name, auto& p) {
    ASSERT_LT(k, stats.size());
    EXPECT_EQ(stats[k].name, std::string(name));
    expect_matches(stats[k], p.data(), p.value.size());
    EXPECT_FALSE(stats[k].grad_norm.has_value());  // no backward yet
    ++k;
  });
  EXPECT_EQ(k, stats.size());
}

TEST(WeightStats, GradNormAndJson) {
  models::LlamaForCausalLM<> m(tiny());
  m.init(Key::from_seed(5));
  float* g = nullptr;
  std::string first;
  m.visit_params("", [&](std::string_view name, auto& p) {
    if (g) return;
    first = std::string(name);
    g = p.grad_data();
    for (std::size_t i = 0; i < p.value.size(); ++i) g[i] = (i % 2 ? -0.5f : 0.25f);
  });
  const auto stats = weight_stats(m);
  ASSERT_TRUE(stats[0].grad_norm.has_value());
  long double q = 0;
  for (std::int64_t i = 0; i < stats[0].numel; ++i) q += static_cast<long double>(g[i]) * g[i];
  EXPECT_NEAR(*stats[0].grad_norm, static_cast<double>(std::sqrt(q)), 1e-12);
  EXPECT_FALSE(stats[1].grad_norm.has_value());

  const ojson j = weight_stats_json(7, stats);
  EXPECT_EQ(j["step"], 7);
  ASSERT_EQ(j["tensors"].size(), stats.size());
  EXPECT_EQ(j["tensors"].begin().key(), first);
  for (const char* f : {"numel", "mean", "std", "min", "max", "abs_max", "grad_norm"})
    EXPECT_TRUE(j["tensors"][first].contains(f)) << f;
  EXPECT_DOUBLE_EQ(j["tensors"][first]["std"].get<double>(), stats[0].std);
}

TEST(WeightStats, TrainerAppendsWeightsJsonlEveryNSteps) {
  const fs::path dir = fs::temp_directory_path() / ("edl_ws_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TokenDataset data;
  for (int i = 0; i < 8; ++i) data.add(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, static_cast<std::int32_t>(10 + i)});
  TrainingArguments a;
  a.save_directory = dir.string();
  a.total_batch_size = 2;
  a.max_training_steps = 6;
  a.weight_distribution_log_steps = 3;
  a.save_steps = 3;
  a.progress = false;
  a.peak_gflops = 10;
  a.max_sequence_length = 8;
  a.learning_rate = 1e-2;
  models::LlamaForCausalLM<> m(tiny());
  m.init(Key::from_seed(6));
  Trainer t(a, std::move(m), std::nullopt, data);
  t.train();
  std::vector<ojson> lines;
  {
    std::ifstream in(dir / "weights.jsonl");
    std::string l;
    while (std::getline(in, l)) lines.push_back(ojson::parse(l));
  }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["step"], 3);
  EXPECT_EQ(lines[1]["step"], 6);
  // The step-3 record describes checkpoint-3's weights, and every tensor had a gradient.
  models::LlamaForCausalLM<> c3(tiny());
  load_model_weights((dir / "checkpoint-3").string(), c3);
  for (const auto& s : weight_stats(c3)) {
    const ojson& e = lines[0]["tensors"][s.name];
    EXPECT_EQ(e["mean"].get<double>(), s.mean) << s.name;
    EXPECT_EQ(e["std"].get<double>(), s.std) << s.name;
    EXPECT_EQ(e["abs_max"].get<double>(), s.abs_max) << s.name;
    EXPECT_TRUE(e.contains("grad_norm")) << s.name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace edl::train
