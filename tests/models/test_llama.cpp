#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <edl/core/exec.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
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

// output_hidden_states: the embeddings' rows, then each layer's output as that layer alone
// computes it from the previous entry, and last the normed states the head turns into logits().
TEST(Llama, HiddenStatesAreTheEmbeddingsEachLayersOutputAndTheNormedLast) {
  LlamaForCausalLM<> m(tiny_config(false));
  m.init(Key::from_seed(5), 0.3f);
  const std::int64_t B = 2, S = 5, H = 16, V = 32, T = B * S;
  const auto ids = tokens(T, V, 3);
  const nn::TokenLayout lay{B, S};
  const auto hs = m.hidden_states(ids.data(), lay);
  ASSERT_EQ(hs.size(), 3u);  // 2 layers + 1
  const float* table = m.model.embed_tokens.weight.data();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      ASSERT_EQ(hs[0][static_cast<std::size_t>(t * H + h)], table[ids[static_cast<std::size_t>(t)] * H + h]);
  std::vector<float> y(static_cast<std::size_t>(T * H));
  nn::DecoderLayer<DefaultPolicy>::Saved ls;
  m.model.layers[0].forward(hs[0].data(), lay, y.data(), ls);
  EXPECT_EQ(y, hs[1]);
  m.model.layers[1].forward(hs[1].data(), lay, y.data(), ls);
  std::vector<float> normed(y.size());
  nn::RMSNorm<DefaultPolicy>::Saved ns;
  m.model.norm.forward(y.data(), T, normed.data(), ns);
  EXPECT_EQ(normed, hs[2]);
  std::vector<float> want(static_cast<std::size_t>(T * V)), got(want.size());
  m.logits(ids.data(), lay, want.data());
  m.apply_lm_head(hs[2].data(), T, got.data());
  EXPECT_EQ(got, want);
}

// output_attentions: one [batch, heads, seq, seq] array per layer whose rows give that layer's
// context (p v = ctx of the same forward) and vanish above the diagonal.
TEST(Llama, AttentionsArePerLayerProbabilitiesThatGiveTheContext) {
  LlamaForCausalLM<> m(tiny_config(false));
  m.init(Key::from_seed(5), 0.3f);
  const std::int64_t B = 2, S = 5, nh = 4, kv = 2, D = 4, T = B * S;
  const auto ids = tokens(T, 32, 3);
  const nn::TokenLayout lay{B, S};
  const auto att = m.attentions(ids.data(), lay);
  ASSERT_EQ(att.size(), 2u);
  LlamaForCausalLM<>::Saved s;
  m.forward(ids.data(), lay, s);
  for (std::size_t l = 0; l < att.size(); ++l) {
    ASSERT_EQ(att[l].size(), static_cast<std::size_t>(B * nh * S * S));
    const auto& as = s.model_s.layer_s[l].attn_s;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < nh; ++h)
        for (std::int64_t i = 0; i < S; ++i) {
          const float* row = att[l].data() + ((b * nh + h) * S + i) * S;
          for (std::int64_t j = i + 1; j < S; ++j) ASSERT_EQ(row[j], 0.0f);
          for (std::int64_t c = 0; c < D; ++c) {
            double ctx = 0;
            for (std::int64_t j = 0; j <= i; ++j)
              ctx += static_cast<double>(row[j]) * as.v[static_cast<std::size_t>((b * S + j) * kv * D + (h / 2) * D + c)];
            ASSERT_NEAR(ctx, as.ctx[static_cast<std::size_t>((b * S + i) * nh * D + h * D + c)], 1e-5) << l;
          }
        }
  }
}

// flops_per_token against a count by hand: the seven projections, attention's q.k and p.v
// over the causal pairs, the head; x3 with the backward. The forward of a batch is tokens x it.
TEST(Llama, FlopsPerTokenIsTheHandCount) {
  const auto c = tiny_config(false);  // hidden 16, 4 heads of 4, 2 kv heads, intermediate 24, vocab 32, 2 layers
  LlamaForCausalLM<> m(c);
  for (std::int64_t S : {1, 7, 64}) {
    const double H = 16, D = 4, nh = 4, kv = 2, I = 24, V = 32, L = 2;
    const double proj = 2 * (H * nh * D + 2 * H * kv * D + nh * D * H) + 2 * 3 * H * I;
    const double pairs = static_cast<double>(S) * static_cast<double>(S + 1) / 2;  // causal (query, key) pairs
    const double attn = 2 * 2 * nh * D * pairs / static_cast<double>(S);
    const double body = L * (proj + attn), head = 2 * H * V;
    EXPECT_DOUBLE_EQ(m.flops_per_token(S, false, false), body) << S;
    EXPECT_DOUBLE_EQ(m.flops_per_token(S, true, false), body + head) << S;
    EXPECT_DOUBLE_EQ(m.flops_per_token(S, true, true), 3 * (body + head)) << S;
    EXPECT_DOUBLE_EQ(m.flops_forward(3, S), 3 * static_cast<double>(S) * (body + head)) << S;
  }
}

// update_module: the same weights under a changed config (rope_theta changes the logits, not
// the weights); a change of shapes or of the set of parameters is refused by name.
TEST(Llama, UpdateModuleKeepsTheWeightsUnderANewConfig) {
  LlamaForCausalLM<> m(tiny_config(false));
  m.init(Key::from_seed(6), 0.3f);
  auto u = models::update_module(m, {{"rope_theta", 500000.0}, {"rms_norm_eps", 1e-6}});
  EXPECT_EQ(u.config().rope_theta, 500000.0);
  EXPECT_EQ(u.config().rms_norm_eps, 1e-6);
  auto a = nn::split_params(m), b = nn::split_params(u);
  EXPECT_EQ(a, b);
  // The new config is in effect: the logits are those of a model built with it and given the weights.
  auto cfg = m.config();
  cfg.rope_theta = 500000.0;
  cfg.rms_norm_eps = 1e-6;
  LlamaForCausalLM<> fresh(cfg);
  nn::merge_params(fresh, a);
  const auto ids = tokens(6, 32, 1);
  std::vector<float> lu(6 * 32), lf(lu.size()), lm(lu.size());
  u.logits(ids.data(), nn::TokenLayout{1, 6}, lu.data());
  fresh.logits(ids.data(), nn::TokenLayout{1, 6}, lf.data());
  m.logits(ids.data(), nn::TokenLayout{1, 6}, lm.data());
  EXPECT_EQ(lu, lf);
  EXPECT_NE(lu, lm);
  const auto refused = [&](nlohmann::ordered_json o, const std::string& what) {
    try {
      models::update_module(m, o);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{"intermediate_size", 32}}, "model.layers.0.mlp.gate_proj.weight");
  refused({{"tie_word_embeddings", true}}, "lm_head.weight");
  refused({{"num_hidden_layers", 3}}, "model.layers.2");
  refused(7, "expected an object");
}

// split_params / merge_params: a name -> value map out of a model and back in, bit for bit in
// f32 and bf16; missing, mis-sized and unknown entries are named.
TEST(Llama, SplitAndMergeParamsRoundTrip) {
  LlamaForCausalLM<> m(tiny_config(true));
  m.init(Key::from_seed(7), 0.3f);
  const nn::ParamValues v = nn::split_params(m);
  EXPECT_EQ(static_cast<std::int64_t>(v.size()), static_cast<std::int64_t>(nn::named_shapes(m).size()));
  LlamaForCausalLM<> other(tiny_config(true));
  nn::merge_params(other, v);
  EXPECT_EQ(nn::split_params(other), v);
  LlamaForCausalLM<BF16ParamsPolicy> half(tiny_config(true));
  nn::merge_params(half, v);  // rounded to nearest even
  const nn::ParamValues hv = nn::split_params(half);
  for (const auto& [name, x] : v)
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(hv.at(name)[i], static_cast<float>(bf16(x[i]))) << name << " " << i;
  LlamaForCausalLM<BF16ParamsPolicy> half2(tiny_config(true));
  nn::merge_params(half2, hv);
  EXPECT_EQ(nn::split_params(half2), hv);  // bf16 -> f32 -> bf16 is exact
  const auto refused = [&](nn::ParamValues w, const std::string& what) {
    try {
      nn::merge_params(other, w);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto missing = v;
  missing.erase("model.norm.weight");
  refused(missing, "no value for parameter \"model.norm.weight\"");
  auto short_one = v;
  short_one["model.norm.weight"].pop_back();
  refused(short_one, "model.norm.weight");
  auto extra = v;
  extra["lm_head.weight"] = {1.0f};
  refused(extra, "\"lm_head.weight\" is not a parameter");
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

// 16-bit parameters (bf16, and f16 for half()) are storage: the model computes as the f32
// model whose weights are the rounded values, bit for bit (logits, loss and every gradient).
template <class HalfPolicy>
void check_half_params_compute_as_rounded_f32() {
  LlamaConfig c = tiny_config(false);
  c.vocab_size = 70;
  c.hidden_size = 32;
  c.intermediate_size = 80;
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(8), 0.2f);
  const auto half = models::to_dtype<HalfPolicy>(m);
  auto rounded = models::to_dtype<DefaultPolicy>(half);
  std::size_t changed = 0, total = 0;
  std::vector<float> orig, back;
  m.visit_params("", [&](std::string_view, auto& p) { orig.insert(orig.end(), p.data(), p.data() + p.value.size()); });
  rounded.visit_params("", [&](std::string_view, auto& p) { back.insert(back.end(), p.data(), p.data() + p.value.size()); });
  for (std::size_t i = 0; i < orig.size(); ++i, ++total) {
    ASSERT_EQ(back[i], to_f32(from_f32<typename HalfPolicy::param_t>(orig[i]))) << i;
    changed += back[i] != orig[i];
  }
  EXPECT_GT(changed, total / 2);
  const auto ids = tokens(3 * 9, c.vocab_size, 5);
  const nn::TokenLayout lay{3, 9};
  std::vector<float> lh(27 * 70), lr(27 * 70);
  half.logits(ids.data(), lay, lh.data());
  rounded.logits(ids.data(), lay, lr.data());
  EXPECT_EQ(lh, lr);
  auto h2 = half;
  auto r2 = rounded;
  EXPECT_EQ(h2.forward_backward(ids.data(), lay).loss, r2.forward_backward(ids.data(), lay).loss);
  std::vector<float> gh, gr;
  h2.visit_params("", [&](std::string_view, auto& p) { gh.insert(gh.end(), p.grad.begin(), p.grad.end()); });
  r2.visit_params("", [&](std::string_view, auto& p) { gr.insert(gr.end(), p.grad.begin(), p.grad.end()); });
  EXPECT_EQ(gh, gr);
}

TEST(Llama, Bf16ParamsComputeAsTheirRoundedF32Weights) { check_half_params_compute_as_rounded_f32<BF16ParamsPolicy>(); }
TEST(Llama, F16ParamsComputeAsTheirRoundedF32Weights) { check_half_params_compute_as_rounded_f32<F16ParamsPolicy>(); }

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

// ---------------------------------------------------------------- compute dtype (bf16 / f16 activations)

namespace {

template <class C>
bool representable(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return to_f32(from_f32<C>(x)) == x; });
}

/// The tiny_hf fixture's model under policy Pol, its tokens and layout.
template <class Pol>
struct TinyHf {
  std::filesystem::path dir;
  LlamaForCausalLM<Pol> m;
  std::vector<std::int64_t> ids;
  nn::TokenLayout lay;
  static TinyHf load() {
    const char* env = std::getenv("EDL_TEST_DATA");
    TinyHf t;
    t.dir = std::filesystem::path(env ? env : "tests/data") / "tiny_hf";
    t.m = LlamaForCausalLM<Pol>(LlamaConfig::from_file((t.dir / "config.json").string()));
    nn::load_params(t.m, io::SafeTensorsFile::open((t.dir / "model.safetensors").string()));
    const auto tok = io::load_npy<std::int64_t>((t.dir / "oracle" / "tokens.npy").string());
    t.ids.assign(tok.begin(), tok.end());
    t.lay = nn::TokenLayout{static_cast<std::int64_t>(tok.shape(0)), static_cast<std::int64_t>(tok.shape(1))};
    return t;
  }
  std::vector<float> logits() const {
    std::vector<float> out(static_cast<std::size_t>(lay.tokens() * m.config().vocab_size));
    m.logits(ids.data(), lay, out.data());
    return out;
  }
};

double max_abs_diff(const std::vector<float>& a, const float* b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, double(std::fabs(a[i] - b[i])));
  return w;
}

/// The reference's logits and loss against the model's (Compute = C), and the f32 model's
/// distance from that reference: the compute dtype must bring the model to the reference, far
/// closer than f32 activations are.
template <class C>
void expect_compute_dtype_matches_reference(const char* name) {
  auto r = TinyHf<Policy<float, C>>::load();
  auto f = TinyHf<DefaultPolicy>::load();
  const auto want = io::load_npy<float>((r.dir / "oracle" / (std::string(name) + "_compute_logits.npy")).string());
  const std::vector<float> got = r.logits(), f32 = f.logits();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(representable<C>(got)) << "logits are values of the compute dtype";
  const double err = max_abs_diff(got, want.data()), f32_err = max_abs_diff(f32, want.data());
  // An f32 sum that lands within an f32 ulp of a rounding midpoint may round the other way than
  // the float64 reference's: rare, one ulp of C where it happens.
  EXPECT_LT(err, 0.1 * f32_err) << name << ": max |logits - reference| " << err << ", f32 activations: " << f32_err;
  nlohmann::json lj;
  std::ifstream((r.dir / "oracle" / (std::string(name) + "_compute_loss.json")).string()) >> lj;
  const double want_loss = lj["loss"].get<double>();
  const double loss = r.m.loss(r.ids.data(), r.lay).loss, f32_loss = f.m.loss(f.ids.data(), f.lay).loss;
  EXPECT_LT(std::fabs(loss - want_loss), 0.1 * std::fabs(f32_loss - want_loss) + 1e-6)
      << name << ": loss " << loss << ", reference " << want_loss << ", f32 activations " << f32_loss;
}

}  // namespace

TEST(LlamaComputeDtype, Bf16ActivationsMatchTheirReference) { expect_compute_dtype_matches_reference<bf16>("bfloat16"); }
TEST(LlamaComputeDtype, F16ActivationsMatchTheirReference) { expect_compute_dtype_matches_reference<f16>("float16"); }

// Every activation forward keeps (so every input of backward) holds a bf16 value, and the
// f32 model's do not (the check can fail).
TEST(LlamaComputeDtype, EveryKeptActivationIsAComputeDtypeValue) {
  auto b = TinyHf<BF16ComputePolicy>::load();
  auto f = TinyHf<DefaultPolicy>::load();
  typename LlamaForCausalLM<BF16ComputePolicy>::Saved s;
  typename LlamaForCausalLM<>::Saved sf;
  b.m.forward(b.ids.data(), b.lay, s);
  f.m.forward(f.ids.data(), f.lay, sf);
  auto kept = [](const auto& s) {
    std::vector<std::pair<std::string, const std::vector<float>*>> v{{"hidden", &s.hidden}};
    for (std::size_t l = 0; l < s.model_s.hs.size(); ++l) v.push_back({"hs" + std::to_string(l), &s.model_s.hs[l]});
    for (const auto& L : s.model_s.layer_s) {
      for (auto* p : {&L.n1, &L.h, &L.n2, &L.attn_s.q, &L.attn_s.k, &L.attn_s.v, &L.attn_s.ctx, &L.mlp_s.g,
                      &L.mlp_s.u, &L.mlp_s.a})
        v.push_back({"layer", p});
    }
    return v;
  };
  const auto kb = kept(s), kf = kept(sf);
  ASSERT_EQ(kb.size(), kf.size());
  std::size_t f32_values = 0;
  for (std::size_t i = 0; i < kb.size(); ++i) {
    ASSERT_FALSE(kb[i].second->empty()) << kb[i].first;
    EXPECT_TRUE(representable<bf16>(*kb[i].second)) << kb[i].first << " #" << i;
    f32_values += !representable<bf16>(*kf[i].second);
  }
  EXPECT_GT(f32_values, kf.size() / 2) << "the f32 model's activations are mostly not bf16 values";
}

// Remat recomputes what it dropped with forward's kernels and roundings: the gradients equal
// those of a forward that kept everything, bit for bit.
TEST(LlamaComputeDtype, RematGivesBitIdenticalGradients) {
  auto t = TinyHf<BF16ComputePolicy>::load();
  auto grads_with = [&](remat::DropMask drop) {
    nn::zero_grad(t.m);
    const double loss = t.m.forward_backward(t.ids.data(), t.lay, nullptr, {}, drop).loss;
    std::vector<float> g{static_cast<float>(loss)};
    t.m.visit_params("", [&](std::string_view, auto& p) { g.insert(g.end(), p.grad.begin(), p.grad.end()); });
    return g;
  };
  const auto all = grads_with(0);
  for (const char* policy : {"nothing_saveable", "dots_saveable", "save_only_these_names(norm1, ctx)"}) {
    const auto g = grads_with(remat::parse(policy, "test"));
    ASSERT_EQ(g.size(), all.size());
    EXPECT_EQ(0, std::memcmp(g.data(), all.data(), g.size() * sizeof(float))) << policy;
  }
}

// The gradients of the bf16-activation model follow the f32 model's oracle gradients to bf16's
// precision (the backward is the f32 one through the rounded values), and differ from the f32
// model's.
TEST(LlamaComputeDtype, GradientsFollowTheF32GradientsToBf16Precision) {
  auto b = TinyHf<BF16ComputePolicy>::load();
  auto f = TinyHf<DefaultPolicy>::load();
  b.m.forward_backward(b.ids.data(), b.lay);
  f.m.forward_backward(f.ids.data(), f.lay);
  std::vector<float> gb, gf;
  b.m.visit_params("", [&](std::string_view, auto& p) { gb.insert(gb.end(), p.grad.begin(), p.grad.end()); });
  f.m.visit_params("", [&](std::string_view, auto& p) { gf.insert(gf.end(), p.grad.begin(), p.grad.end()); });
  ASSERT_EQ(gb.size(), gf.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < gb.size(); ++i) {
    diff += (double(gb[i]) - gf[i]) * (double(gb[i]) - gf[i]);
    norm += double(gf[i]) * gf[i];
  }
  const double rel = std::sqrt(diff / norm);
  EXPECT_LT(rel, 0.05) << "relative distance of the gradients";
  EXPECT_GT(rel, 1e-4) << "bf16 activations change the gradients";
}

// Decoding runs with f32 activations: a model trained with bf16 activations converts to the
// f32-activation policy with the same weights, bit for bit.
TEST(LlamaComputeDtype, ToDtypeKeepsTheWeightsAcrossComputeDtypes) {
  auto b = TinyHf<BF16ComputePolicy>::load();
  auto f = TinyHf<DefaultPolicy>::load();
  const auto back = models::to_dtype<DefaultPolicy>(b.m);
  const std::vector<float> want = f.logits();
  std::vector<float> got(want.size());
  back.logits(f.ids.data(), f.lay, got.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}
