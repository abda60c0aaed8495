// tests/generate/test_sharded_decoder.cpp: decoding on a mesh (tp, sp, dp, fsdp) gives the
// logits and tokens of one device; generate() on a mesh (sharded_generate.hpp) too.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/generate.hpp>
#include <edl/generate/sharded_decoder.hpp>
#include <edl/generate/sharded_generate.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/nn/quantize.hpp>
#include "small_llama.hpp"

using namespace edl;
using namespace edl::generate;
using models::LlamaConfig;
using models::LlamaForCausalLM;

namespace {

using Dims = std::array<std::int64_t, 4>;  // dp, fsdp, tp, sp

// vocab 51 is not divisible by the head's column split: uneven vocabulary blocks.
LlamaConfig config(const std::string& variant = "") { return test_support::small_llama(51, 64, variant); }
using test_support::random_ids;


double max_diff(const float* a, const float* b, std::int64_t n) {
  double w = 0;
  for (std::int64_t i = 0; i < n; ++i) w = std::max(w, static_cast<double>(std::fabs(a[i] - b[i])));
  return w;
}

std::string mesh_name(const Dims& d) {
  std::string s;
  const char* n[4] = {"dp", "fsdp", "tp", "sp"};
  for (int a = 0; a < 4; ++a)
    if (d[static_cast<std::size_t>(a)] > 1) s += (s.empty() ? "" : "_") + std::string(n[a]) + std::to_string(d[static_cast<std::size_t>(a)]);
  return s.empty() ? "one" : s;
}

struct Case {
  Dims dims;
  std::string variant;
};

}  // namespace

class ShardedDecoderMeshes : public ::testing::TestWithParam<Case> {};

// Two left-padded prompts (12 and 4 tokens: the first attends on the GEMM path, the second row
// by row): prefill with every position's logits, then 9 decode steps fed with the
// one-device greedy tokens; every logit within 1e-4 of one device, and the greedy tokens identical.
TEST_P(ShardedDecoderMeshes, LogitsAndGreedyTokensEqualOneDevice) {
  const auto [dims, variant] = GetParam();
  const auto cfg = config(variant);
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(7), 0.2f);
  test_support::spread_norm_weights(m, 8);
  const std::int64_t V = cfg.vocab_size, B = 2, S = 12, steps = 9, len = S + steps;
  const std::vector<std::vector<std::int64_t>> prompts = {random_ids(12, V, 11), random_ids(4, V, 12)};
  static_assert(generate::detail::kGemmAttentionRows <= 12 && generate::detail::kGemmAttentionRows > 4);
  std::vector<std::int64_t> ids(B * S, 0), mask(B * S, 0);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<std::size_t>(b)];
    const std::int64_t pad = S - static_cast<std::int64_t>(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) ids[b * S + pad + i] = p[i], mask[b * S + pad + i] = 1;
  }

  StandardKVCache cache(kv_cache_shape(cfg, B, len));
  Decoder one(m, cache);
  ShardedDecoder<> dec(m, create_mesh(dims), B, len);
  std::vector<float> all1(B * S * V), last1(B * V), allm(B * S * V), lastm(B * V);
  one.prefill(ids.data(), S, mask.data(), last1.data(), all1.data());
  dec.prefill(ids.data(), S, mask.data(), lastm.data(), allm.data());
  double err = max_diff(all1.data(), allm.data(), B * S * V);
  err = std::max(err, max_diff(last1.data(), lastm.data(), B * V));
  std::vector<std::int64_t> next1(B), nextm(B);
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::int64_t b = 0; b < B; ++b) {
      next1[b] = argmax(last1.data() + b * V, V);
      nextm[b] = argmax(lastm.data() + b * V, V);
    }
    EXPECT_EQ(next1, nextm) << "greedy tokens differ at step " << t;
    one.decode(next1.data(), last1.data());
    dec.decode(next1.data(), lastm.data());
    err = std::max(err, max_diff(last1.data(), lastm.data(), B * V));
  }
  EXPECT_LT(err, 1e-4) << mesh_name(dims) << " " << variant;
  for (std::int64_t b = 0; b < B; ++b) EXPECT_EQ(dec.length(b), cache.length(b));
}

INSTANTIATE_TEST_SUITE_P(
    Generate, ShardedDecoderMeshes,
    ::testing::Values(Case{{1, 1, 2, 1}, ""}, Case{{1, 1, 1, 2}, ""}, Case{{1, 1, 2, 2}, ""}, Case{{2, 1, 1, 1}, ""},
                      Case{{1, 2, 1, 1}, ""}, Case{{2, 1, 2, 1}, ""}, Case{{1, 1, 1, 3}, ""}, Case{{1, 1, 2, 2}, "bias"},
                      Case{{1, 1, 2, 2}, "window"}, Case{{1, 1, 1, 3}, "window"}, Case{{1, 1, 2, 2}, "tied"},
                      Case{{1, 1, 4, 1}, "mha"}, Case{{1, 1, 2, 2}, "qwen3"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return mesh_name(i.param.dims) + (i.param.variant.empty() ? "" : "_" + i.param.variant);
    });

// Long prefill chunks with sp: chunks of 10 and 140 tokens attend on the GEMM (the second over
// three query blocks) over each sp rank's round-robin slots, and the partial softmax records of
// the ranks are combined; with sp = 3 and a window of 5 some rows have no slot on a rank. Every
// position's logits and 6 decode steps against one device, standard, paged and int8 caches.
TEST(ShardedDecoder, LongPrefillOnTheGemmEqualsOneDevice) {
  static_assert(generate::detail::kGemmAttentionRows <= 10 && 140 > 2 * kernels::kAttentionQueryBlock);
  for (const std::string variant : {"", "window"}) {
    const auto cfg = test_support::small_llama(50, 160, variant);
    LlamaForCausalLM<> m(cfg);
    m.init(Key::from_seed(12), 0.2f);
    const std::int64_t V = cfg.vocab_size, L = 156;
    const auto ids = random_ids(L, V, 31);
    // Every position's logits: 150 from the two prefill chunks, then one per decode step.
    const auto logits = [&](auto& dec) {
      std::vector<float> all(static_cast<std::size_t>(L * V)), last(static_cast<std::size_t>(V));
      dec.prefill(ids.data(), 10, nullptr, last.data(), all.data());
      dec.prefill(ids.data() + 10, 140, nullptr, last.data(), all.data() + 10 * V);
      for (std::int64_t t = 150; t < L; ++t) {
        dec.decode(ids.data() + t, last.data());
        std::copy(last.begin(), last.end(), all.begin() + t * V);
      }
      return all;
    };
    const auto compare = [&]<class Cache>(Cache& one_cache, typename ShardedDecoder<DefaultPolicy, Cache>::CacheFactory make,
                                          double tol) {
      Decoder one(m, one_cache);
      const auto want = logits(one);
      for (const Dims dims : {Dims{1, 1, 1, 2}, Dims{1, 1, 1, 3}, Dims{1, 1, 2, 2}}) {
        ShardedDecoder<DefaultPolicy, Cache> dec(m, create_mesh(dims), 1, L, make);
        const auto got = logits(dec);
        EXPECT_LT(max_diff(got.data(), want.data(), L * V), tol) << mesh_name(dims) << " " << variant;
      }
    };
    StandardKVCache standard(kv_cache_shape(cfg, 1, L));
    compare(standard, {}, 1e-4);
    PagedKVCacheOptions po;
    po.page_size = 16;
    PagedKVCache paged(kv_cache_shape(cfg, 1, L), po);
    compare(paged, [po](const KVCacheShape& s) { return std::make_unique<PagedKVCache>(s, po); }, 1e-4);
    Int8KVCache int8(kv_cache_shape(cfg, 1, L));  // the same quantized entries on every mesh
    compare(int8, {}, 1e-4);
  }
}

/// Gemma 2 and 3 (the fixtures' weights: sliding and global layers, local rope, sandwich norms,
/// soft-capping) decode on tp and sp meshes as on one device: a prefill chunk, then one token
/// at a time past the window.
TEST(ShardedDecoder, GemmaEqualsOneDevice) {
  const char* env = std::getenv("EDL_TEST_DATA");
  for (const char* family : {"tiny_gemma2", "tiny_gemma3"}) {
    SCOPED_TRACE(family);
    const auto dir = std::filesystem::path(env ? env : "tests/data") / family;
    const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
    LlamaForCausalLM<> m(cfg);
    nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
    const std::int64_t V = cfg.vocab_size, L = 12;
    const auto ids = random_ids(L, V, 41);
    const auto logits = [&](auto& dec) {
      std::vector<float> all(static_cast<std::size_t>(L * V)), last(static_cast<std::size_t>(V));
      dec.prefill(ids.data(), 5, nullptr, last.data(), all.data());
      for (std::int64_t t = 5; t < L; ++t) {
        dec.decode(ids.data() + t, last.data());
        std::copy(last.begin(), last.end(), all.begin() + t * V);
      }
      return all;
    };
    StandardKVCache cache(kv_cache_shape(cfg, 1, L));
    Decoder one(m, cache);
    const auto want = logits(one);
    for (const Dims dims : {Dims{1, 1, 2, 1}, Dims{1, 1, 1, 2}, Dims{1, 1, 2, 2}}) {
      ShardedDecoder<DefaultPolicy, StandardKVCache> dec(m, create_mesh(dims), 1, L);
      const auto got = logits(dec);
      EXPECT_LT(max_diff(got.data(), want.data(), L * V), 1e-4) << mesh_name(dims);
    }
  }
}

TEST(ShardedDecoder, CacheHoldsOnlyTheDevicesHeadsAndPositions) {
  const auto cfg = config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(1), 0.2f);
  ShardedDecoder<> dec(m, create_mesh({1, 1, 2, 2}), 1, 10);
  for (std::int64_t d = 0; d < 4; ++d) {
    const KVCacheShape s = dec.cache(d).shape();
    EXPECT_EQ(s.kv_heads, 1);    // 2 kv heads / tp 2
    EXPECT_EQ(s.max_length, 5);  // 10 positions / sp 2
  }
  const auto ids = random_ids(7, cfg.vocab_size, 3);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  dec.prefill(ids.data(), 7, nullptr, logits.data());
  EXPECT_EQ(dec.cache(0).length(0), 4);  // positions 0 2 4 6 on sp rank 0
  EXPECT_EQ(dec.cache(1).length(0), 3);  // 1 3 5 on sp rank 1 (device 1 = tp 0, sp 1)
  EXPECT_EQ(dec.length(0), 7);
}

TEST(ShardedDecoder, KvHeadsNotDivisibleByTpIsAnError) {
  const auto cfg = config();  // 4 heads, 2 kv heads
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(1), 0.2f);
  try {
    ShardedDecoder<> dec(m, create_mesh({1, 1, 4, 1}), 1, 8);
    FAIL() << "tp = 4 with 2 kv heads was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::not_divisible);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("num_key_value_heads = 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tp = 4"), std::string::npos) << msg;
  }
  GenerationConfig g;
  EXPECT_THROW(generate::generate(m, create_mesh({1, 1, 4, 1}), {{1, 2}}, g), Error);
}

TEST(ShardedDecoder, TooManyTokensIsAnErrorBeforeWork) {
  const auto cfg = config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(1), 0.2f);
  ShardedDecoder<> dec(m, create_mesh({1, 1, 1, 2}), 1, 4);
  const auto ids = random_ids(5, cfg.vocab_size, 3);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  EXPECT_THROW(dec.prefill(ids.data(), 5, nullptr, logits.data()), Error);
  EXPECT_EQ(dec.length(0), 0);
  const std::int64_t bad = cfg.vocab_size;
  EXPECT_THROW(dec.prefill(&bad, 1, nullptr, logits.data()), Error);
}

// generate() on a mesh: the same GenerationConfig gives the one-device tokens.
class ShardedGenerateMeshes : public ::testing::TestWithParam<Dims> {};

TEST_P(ShardedGenerateMeshes, GreedyAndSampledTokensEqualOneDevice) {
  const auto cfg = config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const std::int64_t V = cfg.vocab_size;
  const std::vector<std::vector<std::int64_t>> prompts = {random_ids(6, V, 31), random_ids(3, V, 32), random_ids(5, V, 33)};
  GenerationConfig g;
  g.max_new_tokens = 12;
  const auto mesh = create_mesh(GetParam());
  const auto want = generate::generate(m, prompts, g);
  const auto got = generate::generate(m, mesh, prompts, g);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish_reason, want.finish_reason);

  g.do_sample = true;
  g.temperature = 0.9f;
  g.top_k = 20;
  g.top_p = 0.95f;
  g.seed = 123;
  const auto want_s = generate::generate(m, prompts, g);
  const auto got_s = generate::generate(m, mesh, prompts, g);
  EXPECT_EQ(got_s.tokens, want_s.tokens);

  GenerateOptions o;  // the paged cache on the mesh gives the same tokens
  o.cache = CacheKind::paged;
  o.paged.page_size = 2;
  o.paged.budget_bytes = 1 << 20;
  EXPECT_EQ(generate::generate(m, mesh, prompts, g, o).tokens, want_s.tokens);

  // A logits processor runs on the mesh as on one device: here it bans each prompt's last
  // token and every even id after the third new token.
  GenerateOptions h;
  h.logits_processor = [&](std::int64_t p, std::span<const std::int64_t> ctx, std::span<float> scores) {
    scores[static_cast<std::size_t>(prompts[static_cast<std::size_t>(p)].back())] = -INFINITY;
    if (ctx.size() >= prompts[static_cast<std::size_t>(p)].size() + 3)
      for (std::size_t t = 0; t < scores.size(); t += 2) scores[t] = -INFINITY;
  };
  const auto want_h = generate::generate(m, prompts, g, h);
  EXPECT_NE(want_h.tokens, want_s.tokens);
  EXPECT_EQ(generate::generate(m, mesh, prompts, g, h).tokens, want_h.tokens);
}

INSTANTIATE_TEST_SUITE_P(Generate, ShardedGenerateMeshes,
                         ::testing::Values(Dims{1, 1, 2, 1}, Dims{1, 1, 1, 2}, Dims{1, 1, 2, 2}, Dims{2, 1, 1, 1},
                                           Dims{2, 1, 1, 2}),
                         [](const ::testing::TestParamInfo<Dims>& i) { return mesh_name(i.param); });

TEST(ShardedGenerate, FromAShardedLlama) {
  auto cfg = config("bias");
  cfg.vocab_size = 52;  // the embedding's partition rule splits the vocabulary over tp
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(9), 0.3f);
  const std::vector<std::vector<std::int64_t>> prompts = {random_ids(5, cfg.vocab_size, 41), random_ids(2, cfg.vocab_size, 42)};
  GenerationConfig g;
  g.max_new_tokens = 10;
  const auto want = generate::generate(m, prompts, g);
  auto sm = models::shard_model(m, create_mesh({1, 2, 2, 1}));  // fsdp-sharded weights, gathered once
  EXPECT_EQ(generate::generate(sm, prompts, g).tokens, want.tokens);
}

// Beam search on a mesh: each prompt's beams stay on one group of devices (dp cuts the batch by
// prompts: 3 prompts over dp = 2 give 1 and 2), whose caches reorder in place; the beams, their
// order and finish reasons are one device's, with every cache kind.
TEST_P(ShardedGenerateMeshes, BeamSearchAndReturnSequencesEqualOneDevice) {
  const auto cfg = config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const std::int64_t V = cfg.vocab_size;
  const std::vector<std::vector<std::int64_t>> prompts = {random_ids(6, V, 31), random_ids(3, V, 32), random_ids(5, V, 33)};
  GenerationConfig g;
  g.max_new_tokens = 8;
  g.num_beams = 3;
  g.num_return_sequences = 2;
  const auto mesh = create_mesh(GetParam());
  const auto want = generate::generate(m, prompts, g);
  ASSERT_EQ(want.tokens.size(), 6u);
  const auto got = generate::generate(m, mesh, prompts, g);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish_reason, want.finish_reason);
  for (const CacheKind k : {CacheKind::int8, CacheKind::paged}) {
    GenerateOptions o;
    o.cache = k;
    o.paged.page_size = 2;
    o.paged.budget_bytes = 1 << 20;
    EXPECT_EQ(generate::generate(m, mesh, prompts, g, o).tokens, generate::generate(m, prompts, g, o).tokens);
  }
  GenerationConfig s;  // sampled: each prompt runs num_return_sequences times, as on one device
  s.max_new_tokens = 6;
  s.do_sample = true;
  s.seed = 7;
  s.num_return_sequences = 2;
  const auto want_s = generate::generate(m, prompts, s);
  ASSERT_EQ(want_s.tokens.size(), 6u);
  EXPECT_EQ(generate::generate(m, mesh, prompts, s).tokens, want_s.tokens);
  s.num_beams = 3;  // beam sampling: the same draws on the mesh
  s.top_p = 0.9f;
  EXPECT_EQ(generate::generate(m, mesh, prompts, s).tokens, generate::generate(m, prompts, s).tokens);
}

TEST(ShardedDecoder, ReorderStaysWithinTheSequencesKeptTogether) {
  const auto cfg = config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(3), 0.2f);
  const std::int64_t V = cfg.vocab_size;
  generate::ShardedDecoder<DefaultPolicy, StandardKVCache> dec(m, create_mesh({2, 1, 1, 1}), 4, 16, {}, 2);
  EXPECT_EQ(dec.sequence_group(1), 0);
  EXPECT_EQ(dec.sequence_group(2), 1);
  StandardKVCache one(generate::kv_cache_shape(cfg, 4, 16));
  generate::Decoder ref(m, one);
  const auto ids = random_ids(4 * 3, V, 7);
  std::vector<float> got(4 * V), want(4 * V);
  dec.prefill(ids.data(), 3, nullptr, got.data());
  ref.prefill(ids.data(), 3, nullptr, want.data());
  const std::vector<std::int64_t> src = {1, 1, 2, 2};
  dec.reorder(src.data());
  ref.reorder(src.data());
  const std::vector<std::int64_t> next = {3, 4, 5, 6};
  dec.decode(next.data(), got.data());
  ref.decode(next.data(), want.data());
  for (std::int64_t i = 0; i < 4 * V; ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
  const std::vector<std::int64_t> across = {2, 1, 2, 3};  // sequence 0 from the other group
  EXPECT_THROW(dec.reorder(across.data()), Error);
  EXPECT_THROW((generate::ShardedDecoder<DefaultPolicy, StandardKVCache>(m, create_mesh({2, 1, 1, 1}), 3, 16, {}, 2)),
               Error);
}

TEST(ShardedDecoder, QuantizedModelsEqualOneDevice) {
  // q8_0, q4_0 and nf4 Linears (lm_head too) on tp = 2 (each device a whole-block share of every
  // weight) and with sp = 2: the logits of one device within the psum's rounding, the same
  // greedy tokens.
  LlamaConfig cfg = config();
  cfg.hidden_size = 128, cfg.intermediate_size = 256, cfg.head_dim = 32;
  cfg.validate();
  LlamaForCausalLM<> base(cfg);
  base.init(Key::from_seed(8), 0.1f);
  const std::int64_t V = cfg.vocab_size, S = 10, steps = 5;
  const auto ids = random_ids(S, V, 13);
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4}) {
    LlamaForCausalLM<> m = base;
    nn::quantize(m, {f, 0, nn::QuantizationConfig::kWithHeadPattern});
    for (const Dims dims : {Dims{1, 1, 2, 1}, Dims{1, 1, 2, 2}}) {
      StandardKVCache cache(kv_cache_shape(cfg, 1, S + steps));
      Decoder one(m, cache);
      ShardedDecoder<> dec(m, create_mesh(dims), 1, S + steps);
      std::vector<float> last1(V), lastm(V);
      one.prefill(ids.data(), S, nullptr, last1.data());
      dec.prefill(ids.data(), S, nullptr, lastm.data());
      double err = max_diff(last1.data(), lastm.data(), V);
      for (std::int64_t t = 0; t < steps; ++t) {
        const std::int64_t a = argmax(last1.data(), V), b = argmax(lastm.data(), V);
        EXPECT_EQ(a, b) << quant::format_name(f) << " " << mesh_name(dims) << " step " << t;
        one.decode(&a, last1.data());
        dec.decode(&a, lastm.data());
        err = std::max(err, max_diff(last1.data(), lastm.data(), V));
      }
      EXPECT_LT(err, 1e-4) << quant::format_name(f) << " " << mesh_name(dims);
    }
  }
}

TEST(ShardedDecoder, QuantizedBlocksThatDoNotSplitOverTpAreAnError) {
  // down_proj's 96 inputs over tp = 2: 48 per device, not whole q8_0 blocks of 32.
  LlamaConfig cfg = config();
  cfg.hidden_size = 64, cfg.intermediate_size = 96, cfg.head_dim = 16;
  cfg.validate();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(9), 0.1f);
  nn::quantize(m, {quant::Format::q8_0});
  try {
    ShardedDecoder<> dec(m, create_mesh({1, 1, 2, 1}), 1, 8);
    FAIL() << "expected an edl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("down_proj.weight"), std::string::npos) << e.what();
  }
}

// Mixture-of-experts models on a mesh decoder: the router whole, every expert's width (Qwen2-MoE:
// and the shared expert's) split over tp with one psum of the block's output; ep and dp split
// the two sequences. Prefill and decode logits equal one device's.
TEST(ShardedDecoder, MixtureOfExpertsEqualsOneDevice) {
  const char* env = std::getenv("EDL_TEST_DATA");
  for (const char* family : {"tiny_mixtral", "tiny_qwen2_moe"}) {
    SCOPED_TRACE(family);
    const auto dir = std::filesystem::path(env ? env : "tests/data") / family;
    const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
    LlamaForCausalLM<> m(cfg);
    nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
    const std::int64_t V = cfg.vocab_size, B = 2, P = 5, L = 11;
    const auto ids = random_ids(B * L, V, 43);
    const auto logits = [&](auto& dec) {
      std::vector<std::int64_t> prompt(static_cast<std::size_t>(B * P)), step(static_cast<std::size_t>(B));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < P; ++t) prompt[static_cast<std::size_t>(b * P + t)] = ids[static_cast<std::size_t>(b * L + t)];
      std::vector<float> out, last(static_cast<std::size_t>(B * V));
      dec.prefill(prompt.data(), P, nullptr, last.data());
      out.insert(out.end(), last.begin(), last.end());
      for (std::int64_t t = P; t < L; ++t) {
        for (std::int64_t b = 0; b < B; ++b) step[static_cast<std::size_t>(b)] = ids[static_cast<std::size_t>(b * L + t)];
        dec.decode(step.data(), last.data());
        out.insert(out.end(), last.begin(), last.end());
      }
      return out;
    };
    StandardKVCache cache(kv_cache_shape(cfg, B, L));
    Decoder one(m, cache);
    const auto want = logits(one);
    for (const MeshDims dims : {MeshDims{1, 1, 1, 2, 1}, MeshDims{1, 1, 2, 1, 1}, MeshDims{1, 1, 2, 2, 1},
                                MeshDims{2, 1, 1, 1, 2}}) {
      ShardedDecoder<DefaultPolicy, StandardKVCache> dec(m, create_mesh(dims), B, L);
      const auto got = logits(dec);
      EXPECT_LT(max_diff(got.data(), want.data(), static_cast<std::int64_t>(want.size())), 1e-4)
          << "mesh dp " << dims[0] << " ep " << dims[2] << " tp " << dims[3] << " sp " << dims[4];
    }
  }
}
