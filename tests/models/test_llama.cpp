#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <edl/core/exec.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sequence_classification.hpp>

#include "../nn/nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;
using models::LlamaConfig;
using models::LlamaForCausalLM;

namespace {

LlamaConfig tiny_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.validate();
  return c;
}

std::vector<std::int64_t> tokens(std::int64_t n, std::int64_t vocab, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(n);
  for (auto& v : t) v = static_cast<std::int64_t>(g() % vocab);
  return t;
}

}  // namespace

TEST(Llama, ParamNamesMatchConfigShapes) {
  for (bool tied : {false, true}) {
    const auto c = tiny_config(tied);
    LlamaForCausalLM<> m(c);
    auto got = nn::named_shapes(m);
    auto want = c.parameter_shapes();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_EQ(got[i].second, want[i].second) << got[i].first;
    }
    EXPECT_EQ(m.param_count(), c.parameter_count());
  }
}

// apply_lm_head on the final hidden states gives logits() (tied or not), and can_generate()
// tells a causal LM from a classification head.
TEST(Llama, ApplyLmHeadGivesTheLogits) {
  static_assert(LlamaForCausalLM<>::can_generate());
  static_assert(!models::LlamaForSequenceClassification<>::can_generate());
  for (bool tied : {false, true}) {
    LlamaForCausalLM<> m(tiny_config(tied));
    m.init(Key::from_seed(4), 0.2f);
    const auto ids = tokens(2 * 6, 32, 9);
    const nn::TokenLayout lay{2, 6};
    std::vector<float> want(static_cast<std::size_t>(12 * 32)), got(want.size());
    m.logits(ids.data(), lay, want.data());
    LlamaForCausalLM<>::Saved s;
    m.forward(ids.data(), lay, s);
    m.apply_lm_head(s.hidden.data(), 12, got.data());
    EXPECT_EQ(got, want) << (tied ? "tied" : "untied");
  }
}

TEST(Llama, WholeModelLossGradientMatchesFiniteDifferences) {
  for (bool tied : {false, true}) {
    LlamaForCausalLM<> m(tiny_config(tied));
    m.init(Key::from_seed(1), 0.3f);
    const std::int64_t B = 2, S = 6;
    auto ids = tokens(B * S, 32, 5);
    auto labels = ids;
    labels[3] = -100;
    nn::TokenLayout lay{B, S};
    nn::LossOptions o;
    o.chunk_rows = 5;
    nn::zero_grad(m);
    const auto metrics = m.forward_backward(ids.data(), lay, labels.data(), o);
    EXPECT_EQ(metrics.tokens, B * (S - 1) - 1);
    auto loss = [&] { return m.loss(ids.data(), lay, labels.data(), o).loss; };
    EXPECT_NEAR(loss(), metrics.loss, 1e-6);
    m.visit_params("", [&](std::string_view path, auto& p) {
      expect_fd(std::string(tied ? "tied " : "") + std::string(path), p.data(), p.value.size(), p.grad.data(), loss,
                tied && path == "model.embed_tokens.weight" ? 64 : 10, 1e-2f, 2e-2, 2e-5);
    });
  }
}

TEST(Llama, InputsEmbedsTakeThePlaceOfTheIdsEmbeddings) {
  LlamaForCausalLM<> m(tiny_config(false));
  m.init(Key::from_seed(4), 0.3f);
  const std::int64_t B = 2, S = 6, H = 16, V = 32, T = B * S;
  const auto ids = tokens(T, V, 11);
  // The embedding table's rows of the ids, given as inputs_embeds: the same logits, bit for bit.
  std::vector<float> embeds(static_cast<std::size_t>(T * H));
  const float* table = m.model.embed_tokens.weight.data();
  for (std::int64_t t = 0; t < T; ++t)
    std::copy(table + ids[static_cast<std::size_t>(t)] * H, table + (ids[static_cast<std::size_t>(t)] + 1) * H,
              embeds.begin() + t * H);
  std::vector<float> want(static_cast<std::size_t>(T * V)), got(want.size());
  nn::TokenLayout by_ids{B, S};
  m.logits(ids.data(), by_ids, want.data());
  nn::TokenLayout by_embeds{B, S};
  by_embeds.inputs_embeds = embeds.data();
  m.logits(nullptr, by_embeds, got.data());
  EXPECT_EQ(got, want);

  // Backward: the same loss and the same gradients of every other parameter; the embeddings'
  // gradient lands in inputs_embeds_grad, and summed into the ids' rows it is the table's
  // gradient of the ids run. The table itself gets none.
  nn::zero_grad(m);
  const auto a = m.forward_backward(ids.data(), by_ids);
  std::map<std::string, std::vector<float>> ga;
  m.visit_params("", [&](std::string_view p, auto& prm) { ga[std::string(p)].assign(prm.grad.begin(), prm.grad.end()); });
  nn::zero_grad(m);
  std::vector<float> dembeds(embeds.size(), 0.0f);
  by_embeds.inputs_embeds_grad = dembeds.data();
  const auto b = m.forward_backward(nullptr, by_embeds, ids.data());
  EXPECT_EQ(a.loss, b.loss);
  m.visit_params("", [&](std::string_view p, auto& prm) {
    const auto& want_g = ga.at(std::string(p));
    if (p == "model.embed_tokens.weight") {
      std::vector<float> summed(want_g.size(), 0.0f);
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          summed[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)] * H + h)] += dembeds[static_cast<std::size_t>(t * H + h)];
      for (std::size_t i = 0; i < summed.size(); ++i) EXPECT_NEAR(summed[i], want_g[i], 1e-6) << i;
      for (std::size_t i = 0; i < prm.grad.size(); ++i) EXPECT_EQ(prm.grad.data()[i], 0.0f) << i;
    } else {
      EXPECT_EQ(std::vector<float>(prm.grad.begin(), prm.grad.end()), want_g) << p;
    }
  });
  // d loss / d inputs_embeds by finite differences, on a few elements.
  auto loss = [&] { return m.loss(nullptr, by_embeds, ids.data()).loss; };
  expect_fd("inputs_embeds", embeds.data(), embeds.size(), dembeds.data(), loss, 12, 1e-2f, 2e-2, 2e-5);
  // Without ids a loss needs its labels; without both, forward names what it needs.
  EXPECT_THROW(m.loss(nullptr, by_embeds), Error);
  EXPECT_THROW(m.logits(nullptr, by_ids, got.data()), Error);
}

TEST(Llama, TiedGradientIsTheSumOfBothPaths) {
  // Same weights, untied: grad(tied embedding) = grad(embed) + grad(lm_head).
  LlamaForCausalLM<> tied(tiny_config(true)), untied(tiny_config(false));
  tied.init(Key::from_seed(2), 0.3f);
  std::vector<float> src;
  std::map<std::string, std::vector<float>> vals;
  tied.visit_params("", [&](std::string_view p, auto& prm) {
    vals[std::string(p)] = std::vector<float>(prm.data(), prm.data() + prm.value.size());
  });
  untied.visit_params("", [&](std::string_view p, auto& prm) {
    const auto& v = vals[p == "lm_head.weight" ? std::string("model.embed_tokens.weight") : std::string(p)];
    std::copy(v.begin(), v.end(), prm.data());
  });
  auto ids = tokens(12, 32, 9);
  nn::TokenLayout lay{2, 6};
  const auto a = tied.forward_backward(ids.data(), lay);
  const auto b = untied.forward_backward(ids.data(), lay);
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
  const float* gt = tied.model.embed_tokens.weight.grad.data();
  const float* ge = untied.model.embed_tokens.weight.grad.data();
  const float* gh = untied.lm_head.weight.grad.data();
  for (std::size_t i = 0; i < tied.model.embed_tokens.weight.value.size(); ++i) EXPECT_NEAR(gt[i], ge[i] + gh[i], 1e-6);
}

TEST(Llama, GradientsAccumulateOverCalls) {
  LlamaForCausalLM<> m(tiny_config(false));
  m.init(Key::from_seed(3), 0.3f);
  auto ids = tokens(8, 32, 1);
  nn::TokenLayout lay{1, 8};
  m.forward_backward(ids.data(), lay);
  const std::vector<float> g1(m.lm_head.weight.grad.begin(), m.lm_head.weight.grad.end());
  m.forward_backward(ids.data(), lay);
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(m.lm_head.weight.grad.data()[i], 2 * g1[i], 1e-6);
}

TEST(Llama, OneAndTwoThreadsBitIdentical) {
  auto run = [](int threads) {
    exec::set_num_threads(threads);
    LlamaConfig c = tiny_config(false);
    c.hidden_size = 64;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 8;
    c.intermediate_size = 160;
    c.vocab_size = 300;
    LlamaForCausalLM<> m(c);
    m.init(Key::from_seed(4), 0.1f);
    auto ids = tokens(2 * 40, 300, 2);
    nn::TokenLayout lay{2, 40};
    std::vector<float> logits(80 * 300);
    m.logits(ids.data(), lay, logits.data());
    nn::LossOptions o;
    o.chunk_rows = 16;
    m.forward_backward(ids.data(), lay, nullptr, o);
    std::vector<float> all(logits);
    m.visit_params("", [&](std::string_view, auto& p) { all.insert(all.end(), p.grad.begin(), p.grad.end()); });
    exec::set_num_threads(0);
    return all;
  };
  const auto a = run(1), b = run(2);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// tiny_hf: GQA (4 heads, 2 kv heads), untied; tiny_mha: multi-head (4 and 4), tied embeddings.
class LlamaOracle : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaOracle, MatchesPyTorch) {
  const char* env = std::getenv("EDL_TEST_DATA");
  const std::filesystem::path dir = std::filesystem::path(env ? env : "tests/data") / GetParam();
  if (!std::filesystem::exists(dir / "oracle" / "grads.safetensors")) FAIL() << "no fixture at " << dir << " (EDL_TEST_DATA)";
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<> m(cfg);
  const auto weights = io::SafeTensorsFile::open((dir / "model.safetensors").string());
  nn::load_params(m, weights);
  const auto tok = io::load_npy<std::int64_t>((dir / "oracle" / "tokens.npy").string());
  const auto want_logits = io::load_npy<float>((dir / "oracle" / "logits.npy").string());
  ASSERT_EQ(tok.dimension(), 2u);
  const std::int64_t B = static_cast<std::int64_t>(tok.shape(0)), S = static_cast<std::int64_t>(tok.shape(1));
  const std::int64_t V = cfg.vocab_size;
  std::vector<std::int64_t> ids(tok.begin(), tok.end());
  nn::TokenLayout lay{B, S};
  std::vector<float> logits(B * S * V);
  m.logits(ids.data(), lay, logits.data());
  ASSERT_EQ(want_logits.size(), logits.size());
  double worst = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, double(std::fabs(logits[i] - want_logits.data()[i])));
  EXPECT_LT(worst, 1e-4) << "max |logits - oracle|";

  nlohmann::json lj;
  std::ifstream((dir / "oracle" / "loss.json").string()) >> lj;
  nn::LossOptions o;
  o.chunk_rows = 5;
  const auto metrics = m.forward_backward(ids.data(), lay, nullptr, o);
  EXPECT_NEAR(metrics.loss, lj["loss"].get<double>(), 1e-5);
  EXPECT_EQ(metrics.tokens, lj["n_target_tokens"].get<std::int64_t>());

  const auto grads = io::SafeTensorsFile::open((dir / "oracle" / "grads.safetensors").string());
  std::size_t checked = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    const auto want = grads.read_vector<float>(std::string(path));
    ASSERT_EQ(want.size(), p.value.size()) << path;
    const double scale = max_abs(want.data(), want.size());
    double err = 0;
    for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, double(std::fabs(p.grad.data()[i] - want[i])));
    EXPECT_LE(err, 1e-4 * scale + 1e-7) << path << " (max |g| " << scale << ")";
    ++checked;
  });
  EXPECT_EQ(checked, grads.size());
}
INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaOracle, ::testing::Values("tiny_hf", "tiny_mha"));
