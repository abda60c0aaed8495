// tests/nn/test_quantize.cpp: quantizing a model's Linears at run time (nn::quantize) and by
// policy. A quantized model's forward stays within the activations' rounding of the f32 model
// whose Linears hold the dequantized weights (nf4, which multiplies f32 activations, equals it
// bit for bit at prefill size); a quantized folder saves and loads back to the same logits;
// bad patterns and shapes fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <edl/generate/decoder.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/nn/quantize.hpp>

using namespace edl;
using models::LlamaConfig;
using models::LlamaForCausalLM;

namespace {

/// Widths that split into nf4's blocks of 64: hidden 64, intermediate 128, 4 heads of 16.
LlamaConfig quant_config() {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.validate();
  return c;
}

std::vector<std::int64_t> ids_of(std::int64_t n, std::int64_t V) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = (7 * i + 3) % V;
  return ids;
}

std::vector<float> logits_of(const LlamaForCausalLM<>& m, const std::vector<std::int64_t>& ids, std::int64_t batch) {
  const std::int64_t seq = static_cast<std::int64_t>(ids.size()) / batch;
  std::vector<float> out(ids.size() * static_cast<std::size_t>(m.config().vocab_size));
  m.logits(ids.data(), nn::TokenLayout{batch, seq}, out.data());
  return out;
}

/// The f32 model with each quantized Linear of `q` replaced by its dequantized weight.
LlamaForCausalLM<> dequantized(const LlamaForCausalLM<>& q, const LlamaForCausalLM<>& f32) {
  LlamaForCausalLM<> d = f32;
  auto& qq = const_cast<LlamaForCausalLM<>&>(q);
  std::vector<const quant::Matrix*> mats;
  qq.visit_linears("", [&](const std::string&, auto& lin) { mats.push_back(lin.is_quantized() ? &lin.qweight : nullptr); });
  std::size_t i = 0;
  d.visit_linears("", [&](const std::string&, auto& lin) {
    if (const quant::Matrix* m = mats[i++]) m->dequantize(lin.weight.data());
  });
  return d;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("edl_test_quantize_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST(QuantizeModel, DefaultPatternTakesTheDecoderLinearsOnly) {
  LlamaForCausalLM<> m(quant_config());
  m.init(Key::from_seed(1));
  EXPECT_FALSE(nn::is_quantized(m));
  EXPECT_EQ(nn::quantize(m, {quant::Format::q8_0}), 2 * 7);
  EXPECT_TRUE(nn::is_quantized(m));
  std::vector<std::string> params;
  m.visit_params("", [&](std::string_view p, auto&) { params.emplace_back(p); });
  for (const std::string& p : params) EXPECT_EQ(p.find("_proj.weight"), std::string::npos) << p;
  EXPECT_NE(std::find(params.begin(), params.end(), "lm_head.weight"), params.end());
  // Already quantized Linears are left alone.
  EXPECT_EQ(nn::quantize(m, {quant::Format::q4_0}), 0);
  EXPECT_EQ(nn::quantized_format(m), quant::Format::q8_0);
}

// Mixture-of-experts models: the experts' and the shared expert's projections are quantized,
// the routers and the shared expert's gate are not; the quantized model decodes as it scores.
TEST(QuantizeModel, DefaultPatternTakesTheExpertsButNotTheRouters) {
  for (const char* type : {"mixtral", "qwen2_moe"}) {
    LlamaConfig c = quant_config();
    c.model_type = type;
    c.num_local_experts = 3;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    c.shared_expert_intermediate_size = std::string(type) == "qwen2_moe" ? 128 : 0;
    c.validate();
    LlamaForCausalLM<> m(c);
    m.init(Key::from_seed(2));
    const LlamaForCausalLM<> f32 = m;
    const std::int64_t per_layer = 4 + 3 * 3 + (c.shared_expert_size() > 0 ? 3 : 0);
    EXPECT_EQ(nn::quantize(m, {quant::Format::q8_0}), 2 * per_layer) << type;
    m.visit_linears("", [&](const std::string& path, auto& lin) {
      const bool router = path.ends_with(".gate") || path.ends_with("shared_expert_gate");
      EXPECT_EQ(lin.is_quantized(), !router && path != "lm_head") << path;
    });
    // The cached forward (prefill, then one-row steps) gives the full forward's logits.
    const auto ids = ids_of(12, c.vocab_size);
    const std::vector<float> full = logits_of(m, ids, 1);
    generate::StandardKVCache cache(generate::kv_cache_shape(c, 1, 12));
    generate::Decoder dec(m, cache);
    std::vector<float> last(static_cast<std::size_t>(c.vocab_size));
    dec.prefill(ids.data(), 6, nullptr, last.data());
    double worst = 0;
    for (std::int64_t s = 6; s < 12; ++s) {
      dec.decode(ids.data() + s, last.data());
      for (std::int64_t v = 0; v < c.vocab_size; ++v)
        worst = std::max(worst, double(std::fabs(last[v] - full[static_cast<std::size_t>(s * c.vocab_size + v)])));
    }
    EXPECT_LT(worst, 1e-4) << type;
    EXPECT_NE(full, logits_of(f32, ids, 1)) << type;  // quantization did change the weights
  }
}

TEST(QuantizeModel, ForwardStaysWithinTheActivationsRoundingOfTheDequantizedModel) {
  const LlamaConfig cfg = quant_config();
  LlamaForCausalLM<> f32(cfg);
  f32.init(Key::from_seed(2));
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4}) {
    LlamaForCausalLM<> q = f32;
    nn::quantize(q, {f});
    const LlamaForCausalLM<> d = dequantized(q, f32);
    // 2 x 12 = 24 rows (prefill's products), then 6 rows (decode's row by row).
    const std::vector<std::int64_t> ids = ids_of(24, cfg.vocab_size);
    if (f == quant::Format::nf4) {
      EXPECT_EQ(logits_of(q, ids, 2), logits_of(d, ids, 2));
    }
    for (const std::int64_t n : {24, 6}) {
      const std::vector<std::int64_t> few = ids_of(n, cfg.vocab_size);
      const std::int64_t batch = n == 24 ? 2 : 1;
      const std::vector<float> a = logits_of(q, few, batch), b = logits_of(d, few, batch);
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
      }
      EXPECT_LT(worst, (f == quant::Format::nf4 ? 1e-5 : 2e-2) * scale) << quant::format_name(f) << " rows " << n;
      if (n == 6 || f != quant::Format::nf4) {
        EXPECT_GT(worst, 0.0) << quant::format_name(f) << ": quantized products should have run";
      }
    }
  }
}

TEST(QuantizeModel, ForwardBackwardGivesInputGradientsAndFreezesQuantizedWeights) {
  LlamaForCausalLM<> m(quant_config());
  m.init(Key::from_seed(3));
  nn::quantize(m, {quant::Format::q8_0, 0, "mlp\\.down_proj"});
  const std::vector<std::int64_t> ids = ids_of(20, m.config().vocab_size);
  const nn::LossMetrics loss = m.forward_backward(ids.data(), nn::TokenLayout{1, 20});
  EXPECT_TRUE(std::isfinite(loss.loss));
  m.visit_params("", [&](std::string_view p, auto& param) { EXPECT_TRUE(param.has_grad()) << p; });
  EXPECT_FALSE(m.model.layers[0].mlp.down_proj.weight.has_grad());
}

TEST(QuantizeModel, SavedFolderLoadsBackToTheSameLogits) {
  LlamaForCausalLM<> f32(quant_config());
  f32.init(Key::from_seed(4));
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4}) {
    LlamaForCausalLM<> q = f32;
    nn::quantize(q, {f});
    TempDir dir(quant::format_name(f));
    models::save_pretrained(dir.path, q);
    const LlamaForCausalLM<> back = models::from_pretrained(dir.path);
    EXPECT_EQ(nn::quantized_format(const_cast<LlamaForCausalLM<>&>(back)), f);
    const std::vector<std::int64_t> ids = ids_of(24, f32.config().vocab_size);
    EXPECT_EQ(logits_of(back, ids, 2), logits_of(q, ids, 2)) << quant::format_name(f);
  }
}

TEST(QuantizeModel, AQuantizedHeadScoresWithItsDequantizedWeight) {
  // kWithHeadPattern adds lm_head: logits multiply its blocks; the loss scores the dequantized
  // head (the same logits at prefill size) and leaves it without a gradient.
  LlamaForCausalLM<> f32(quant_config());
  f32.init(Key::from_seed(8));
  LlamaForCausalLM<> q = f32;
  EXPECT_EQ(nn::quantize(q, {quant::Format::q4_0, 0, nn::QuantizationConfig::kWithHeadPattern}), 2 * 7 + 1);
  ASSERT_TRUE(q.lm_head.is_quantized());
  LlamaForCausalLM<> d = dequantized(q, f32);
  q.lm_head.qweight.dequantize(d.lm_head.weight.data());
  const std::vector<std::int64_t> ids = ids_of(24, f32.config().vocab_size);
  // The loss scores the dequantized head: against the model that has it, only the decoder's
  // int8 products differ.
  EXPECT_NEAR(q.loss(ids.data(), nn::TokenLayout{2, 12}).loss, d.loss(ids.data(), nn::TokenLayout{2, 12}).loss, 1e-3);
  const std::vector<float> lq = logits_of(q, ids, 2), ld = logits_of(d, ids, 2);
  for (std::size_t i = 0; i < lq.size(); ++i) ASSERT_NEAR(lq[i], ld[i], 2e-2) << i;
  q.forward_backward(ids.data(), nn::TokenLayout{2, 12});
  EXPECT_FALSE(q.lm_head.weight.has_grad());
  EXPECT_TRUE(q.model.embed_tokens.weight.has_grad());
}

TEST(QuantizeModel, PolicyQuantizesWhenBuilt) {
  using Q8 = with_quant<DefaultPolicy, quant::q8_0>;
  LlamaForCausalLM<Q8> m(quant_config());
  m.init(Key::from_seed(5));
  EXPECT_TRUE(nn::is_quantized(m));
  EXPECT_EQ(nn::quantized_format(m), quant::Format::q8_0);
  std::vector<float> out(static_cast<std::size_t>(4 * m.config().vocab_size));
  const std::vector<std::int64_t> ids = ids_of(4, m.config().vocab_size);
  m.logits(ids.data(), nn::TokenLayout{1, 4}, out.data());
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

TEST(QuantizeModel, BadRequestsNameWhatIsWrongAndChangeNothing) {
  LlamaForCausalLM<> m(quant_config());
  m.init(Key::from_seed(6));
  EXPECT_THROW(nn::quantize(m, {quant::Format::q8_0, 0, "("}), Error);
  EXPECT_THROW(nn::quantize(m, {quant::Format::q8_0, 64}), Error);
  EXPECT_THROW(nn::quantize(m, {quant::Format::none}), Error);
  EXPECT_FALSE(nn::is_quantized(m));
  LlamaConfig c = quant_config();
  c.intermediate_size = 96;  // down_proj's 96 inputs are not blocks of 64
  LlamaForCausalLM<> odd(c);
  odd.init(Key::from_seed(7));
  try {
    nn::quantize(odd, {quant::Format::nf4});
    FAIL() << "nf4 of 96 inputs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.down_proj.weight"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(nn::is_quantized(odd));
}
