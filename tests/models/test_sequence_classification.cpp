// LlamaForSequenceClassification (models/llama/sequence_classification.hpp): pooling rule,
// logits, finite differences of each problem type's loss, HF names and loading.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <edl/io/safetensors.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sequence_classification.hpp>

#include "../nn/nn_test_util.hpp"

using namespace edl;
using models::LlamaConfig;
using models::LlamaForSequenceClassification;
using models::ProblemType;
namespace fs = std::filesystem;

namespace {

LlamaConfig cls_config(std::int64_t num_labels, std::optional<std::int64_t> pad = std::nullopt) {
  LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.num_labels = num_labels;
  c.pad_token_id = pad;
  c.validate();
  return c;
}

fs::path fixture() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return fs::path(env ? env : "tests/data") / "tiny_hf";
}

}  // namespace

TEST(SequenceClassification, PoolingRule) {
  // pad = 0. Right padding, left padding, no padding, all padding.
  const std::vector<std::int64_t> ids = {5, 6, 7, 0, 0,   //
                                         0, 0, 5, 6, 7,   //
                                         1, 2, 3, 4, 5,   //
                                         0, 0, 0, 0, 0,   //
                                         3, 0, 4, 0, 0};  // a pad inside: the last non-pad wins
  EXPECT_EQ(models::pooled_positions(ids.data(), 5, 5, 0), (std::vector<std::int64_t>{2, 4, 4, 0, 2}));
  EXPECT_EQ(models::pooled_positions(ids.data(), 5, 5, std::nullopt), (std::vector<std::int64_t>{4, 4, 4, 4, 4}));
}

TEST(SequenceClassification, LogitsReadThePooledHiddenState) {
  LlamaForSequenceClassification<> m(cls_config(3, 0));
  m.init(Key::from_seed(2), 0.3f);
  const std::vector<std::int64_t> ids = {5, 6, 7, 0, 0, 0, 9, 9, 8, 1};
  const nn::TokenLayout lay{2, 5};
  std::vector<float> logits(6);
  m.logits(ids.data(), lay, logits.data());
  typename LlamaForSequenceClassification<>::Saved s;
  m.forward(ids.data(), lay, s);
  EXPECT_EQ(s.pos, (std::vector<std::int64_t>{2, 4}));
  for (int b = 0; b < 2; ++b)
    for (int l = 0; l < 3; ++l) {
      const std::int64_t row = b * 5 + s.pos[b];
      double want = 0;
      for (int j = 0; j < 16; ++j) want += double(s.hidden[row * 16 + j]) * m.score.weight.data()[l * 16 + j];
      EXPECT_NEAR(logits[b * 3 + l], want, 1e-5);
    }
}

TEST(SequenceClassification, NamesAreHf) {
  const auto c = cls_config(3);
  LlamaForSequenceClassification<> m(c);
  const auto got = nn::named_shapes(m);
  const auto want = c.parameter_shapes(models::LlamaHead::sequence_classification);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second, want[i].second);
  }
  EXPECT_EQ(got.back().first, "score.weight");
  EXPECT_EQ(m.param_count(), c.parameter_count(models::LlamaHead::sequence_classification));
  EXPECT_EQ(models::parameter_count(m), m.param_count());
}

TEST(SequenceClassification, ProblemTypes) {
  EXPECT_EQ(LlamaForSequenceClassification<>(cls_config(1)).problem_type(false), ProblemType::regression);
  EXPECT_EQ(LlamaForSequenceClassification<>(cls_config(3)).problem_type(true),
            ProblemType::single_label_classification);
  EXPECT_EQ(LlamaForSequenceClassification<>(cls_config(3)).problem_type(false),
            ProblemType::multi_label_classification);
  auto c = cls_config(3);
  c.problem_type = "regression";
  EXPECT_EQ(LlamaForSequenceClassification<>(c).problem_type(false), ProblemType::regression);
  c.problem_type = "ordinal";
  EXPECT_THROW(LlamaForSequenceClassification<>{c}, Error);
}

namespace {

/// Backward vs central finite differences of loss() for every parameter tensor (sampled).
template <class Labels>
void check_fd(std::int64_t num_labels, const Labels& labels, ProblemType expect, double expect_examples) {
  LlamaForSequenceClassification<> m(cls_config(num_labels, 0));
  m.init(Key::from_seed(7), 0.3f);
  const std::vector<std::int64_t> ids = {5, 6, 7, 9, 0, 0, 11, 9, 9, 8, 1, 3, 4, 4, 2, 2, 0, 0};
  const nn::TokenLayout lay{3, 6};
  nn::zero_grad(m);
  const auto metrics = m.forward_backward(ids.data(), lay, labels.data());
  EXPECT_EQ(metrics.problem_type, expect);
  EXPECT_EQ(metrics.examples, expect_examples);
  EXPECT_TRUE(std::isfinite(metrics.loss));
  auto loss = [&] { return m.loss(ids.data(), lay, labels.data()).loss; };
  EXPECT_NEAR(loss(), metrics.loss, 1e-9);
  std::size_t checked = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    edl_nn_test::expect_fd(std::string(models::problem_type_name(expect)) + " " + std::string(path), p.data(),
                           p.value.size(), p.grad.data(), loss, 12, 1e-2f, 2e-2, 1e-5);
    ++checked;
  });
  EXPECT_EQ(checked, 21u);
  // Every gradient is non-zero somewhere (the pooled rows reach the whole decoder)...
  EXPECT_GT(edl_nn_test::max_abs(m.model.embed_tokens.weight.grad.data(), m.model.embed_tokens.weight.grad.size()),
            0.0);
  // ... and accumulates.
  const std::vector<float> g1(m.score.weight.grad.begin(), m.score.weight.grad.end());
  m.forward_backward(ids.data(), lay, labels.data());
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(m.score.weight.grad.data()[i], 2 * g1[i], 1e-6);
}

}  // namespace

TEST(SequenceClassification, RegressionGradientMatchesFiniteDifferences) {
  const std::vector<float> y = {0.5f, -1.0f, 2.0f};
  check_fd(1, y, ProblemType::regression, 3);
}

TEST(SequenceClassification, SingleLabelGradientMatchesFiniteDifferences) {
  const std::vector<std::int64_t> y = {2, -100, 0};
  check_fd(3, y, ProblemType::single_label_classification, 2);
}

TEST(SequenceClassification, MultiLabelGradientMatchesFiniteDifferences) {
  const std::vector<float> y = {1, 0, 1, 0, 0, 1, 1, 1, 0};
  check_fd(3, y, ProblemType::multi_label_classification, 3);
}

TEST(SequenceClassification, LossValuesMatchClosedForms) {
  LlamaForSequenceClassification<> m(cls_config(2));
  m.init(Key::from_seed(4), 0.3f);
  const std::vector<std::int64_t> ids = {1, 2, 3, 4, 5, 6};
  const nn::TokenLayout lay{2, 3};
  std::vector<float> x(4);
  m.logits(ids.data(), lay, x.data());
  // CE
  const std::vector<std::int64_t> cls = {1, 0};
  double ce = 0;
  for (int b = 0; b < 2; ++b)
    ce += std::log(std::exp(double(x[2 * b])) + std::exp(double(x[2 * b + 1]))) - x[2 * b + cls[b]];
  EXPECT_NEAR(m.loss(ids.data(), lay, cls.data()).loss, ce / 2, 1e-6);
  // BCE
  const std::vector<float> y = {1, 0, 0.25f, 1};
  double bce = 0;
  for (int i = 0; i < 4; ++i) {
    const double s = 1 / (1 + std::exp(-double(x[i])));
    bce -= y[i] * std::log(s) + (1 - y[i]) * std::log(1 - s);
  }
  EXPECT_NEAR(m.loss(ids.data(), lay, y.data()).loss, bce / 4, 1e-6);
  // MSE with num_labels 2 (problem_type given)
  auto c = cls_config(2);
  c.problem_type = "regression";
  LlamaForSequenceClassification<> r(c);
  r.init(Key::from_seed(4), 0.3f);
  double mse = 0;
  for (int i = 0; i < 4; ++i) mse += (x[i] - y[i]) * (x[i] - y[i]);
  EXPECT_NEAR(r.loss(ids.data(), lay, y.data()).loss, mse / 4, 1e-6);
  // Integer labels for a float problem type are refused.
  EXPECT_THROW(r.loss(ids.data(), lay, cls.data()), Error);
  // A class out of range names the sequence.
  const std::vector<std::int64_t> bad = {1, 2};
  try {
    m.loss(ids.data(), lay, bad.data());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 1"), std::string::npos) << e.what();
  }
}

TEST(SequenceClassification, LoadsScoreWeightWithLoadWeights) {
  if (!fs::exists(fixture() / "model.safetensors")) FAIL() << "no fixture at " << fixture() << " (EDL_TEST_DATA)";
  const fs::path dir = fs::temp_directory_path() / ("edl_test_seqcls_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto cfg = LlamaConfig::from_file((fixture() / "config.json").string());
  cfg.num_labels = 3;
  const auto src = io::SafeTensorsFile::open((fixture() / "model.safetensors").string());
  std::vector<std::vector<float>> data;
  io::TensorList list;
  data.reserve(src.size() + 1);
  for (const auto& n : src.names()) {
    if (n == "lm_head.weight") continue;
    list.emplace_back(n, io::TensorRef(data.emplace_back(src.read_vector<float>(n)), src.info(n).shape));
  }
  std::vector<float> score(3 * 16);
  for (std::size_t i = 0; i < score.size(); ++i) score[i] = 0.01f * static_cast<float>(i) - 0.2f;
  list.emplace_back("score.weight", io::TensorRef(score, {3, 16}));
  io::save_safetensors((dir / "model.safetensors").string(), list, {{"format", "pt"}});

  LlamaForSequenceClassification<> m(cfg);
  const auto rep = models::load_weights(m, io::ShardedCheckpoint::open(dir.string()));
  EXPECT_EQ(rep.loaded.size(), 21u);
  EXPECT_EQ(std::vector<float>(m.score.weight.value.begin(), m.score.weight.value.end()), score);
  EXPECT_EQ(std::vector<float>(m.model.norm.weight.value.begin(), m.model.norm.weight.value.end()),
            src.read_vector<float>("model.norm.weight"));

  // A causal-LM checkpoint: score.weight missing, lm_head.weight unexpected.
  LlamaForSequenceClassification<> m2(cfg);
  const auto ck = io::ShardedCheckpoint::open((fixture() / "model.safetensors").string());
  try {
    models::load_weights(m2, ck);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("score.weight"), std::string::npos) << e.what();
  }
  const auto rep2 = models::load_weights(m2, ck, {.allow_missing = true, .allow_unexpected = true, .transform_rules = {}});
  EXPECT_EQ(rep2.missing, std::vector<std::string>{"score.weight"});
  EXPECT_EQ(rep2.unexpected, std::vector<std::string>{"lm_head.weight"});

  // save_pretrained writes the head under its HF name and architecture; it loads back.
  models::save_pretrained(dir / "saved", m);
  const auto cj = io::JsonConfig::from_file((dir / "saved" / "config.json").string());
  EXPECT_EQ(cj.json()["architectures"][0], "LlamaForSequenceClassification");
  EXPECT_EQ(cj.json()["num_labels"], 3);
  LlamaForSequenceClassification<> m3(LlamaConfig::from_file((dir / "saved" / "config.json").string()));
  models::load_weights(m3, io::ShardedCheckpoint::open((dir / "saved").string()));
  EXPECT_EQ(std::vector<float>(m3.score.weight.value.begin(), m3.score.weight.value.end()), score);
  auto mb = models::to_dtype<BF16ParamsPolicy>(m3);
  EXPECT_EQ(mb.score.weight.value(1, 2).bits, bf16(score[18]).bits);
  fs::remove_all(dir);
}
