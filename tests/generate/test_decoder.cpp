// tests/generate/test_decoder.cpp: the incremental decoder equals the full forward.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/lora/apply.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/quantize.hpp>
#include "small_llama.hpp"

using namespace edl;
using namespace edl::generate;
using models::LlamaConfig;
using models::LlamaForCausalLM;

namespace {

LlamaConfig small_config(const std::string& variant = "") { return test_support::small_llama(50, 64, variant); }
using test_support::random_ids;


template <class Pol>
std::vector<float> full_logits(const LlamaForCausalLM<Pol>& m, const std::vector<std::int64_t>& ids) {
  const std::int64_t S = static_cast<std::int64_t>(ids.size()), V = m.config().vocab_size;
  std::vector<float> out(static_cast<std::size_t>(S * V));
  nn::TokenLayout lay{1, S};
  m.logits(ids.data(), lay, out.data());
  return out;
}

double max_diff(const float* a, const float* b, std::int64_t n) {
  double w = 0;
  for (std::int64_t i = 0; i < n; ++i) w = std::max(w, static_cast<double>(std::fabs(a[i] - b[i])));
  return w;
}

/// Prefill p tokens (all logits), then decode one at a time; max |diff| vs the full forward.
template <class Pol, class Cache>
double incremental_error(const LlamaForCausalLM<Pol>& m, Cache& cache, const std::vector<std::int64_t>& ids,
                         std::int64_t p) {
  const std::int64_t S = static_cast<std::int64_t>(ids.size()), V = m.config().vocab_size;
  const auto want = full_logits(m, ids);
  Decoder dec(m, cache);
  std::vector<float> all(static_cast<std::size_t>(p * V)), last(static_cast<std::size_t>(V));
  dec.prefill(ids.data(), p, nullptr, last.data(), all.data());
  double w = max_diff(all.data(), want.data(), p * V);
  w = std::max(w, max_diff(last.data(), want.data() + (p - 1) * V, V));
  for (std::int64_t t = p; t < S; ++t) {
    dec.decode(ids.data() + t, last.data());
    w = std::max(w, max_diff(last.data(), want.data() + t * V, V));
  }
  EXPECT_EQ(cache.length(0), S);
  return w;
}

}  // namespace

class DecoderVariants : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderVariants, IncrementalEqualsFullForward) {
  const auto cfg = small_config(GetParam());
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(7), 0.2f);
  test_support::spread_norm_weights(m, 8);
  const auto ids = random_ids(20, cfg.vocab_size, 3);
  for (std::int64_t p : {1, 6, 20}) {
    StandardKVCache cache(kv_cache_shape(cfg, 1, 24));
    EXPECT_LT(incremental_error(m, cache, ids, p), 1e-4) << "prefill " << p;
  }
}

TEST_P(DecoderVariants, DecodeIsTheSameOnAnyThreadCount) {
  // A decode step of one sequence runs as one phased region (run_one_row): on 1, 2 or 3
  // threads every logit is the same, bit for bit, and a batch of two sequences (the general
  // path, one product at a time) gives each sequence the logits it gets alone, within rounding.
  const auto cfg = small_config(GetParam());
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(11), 0.2f);
  const std::int64_t V = cfg.vocab_size, P = 5, G = 12;
  const auto ids = random_ids(P + G, cfg.vocab_size, 9);
  const auto decode_all = [&](int threads) {
    exec::set_num_threads(threads);
    StandardKVCache cache(kv_cache_shape(cfg, 1, 24));
    Decoder dec(m, cache);
    std::vector<float> out(static_cast<std::size_t>((G + 1) * V));
    dec.prefill(ids.data(), P, nullptr, out.data());
    for (std::int64_t t = 0; t < G; ++t) dec.decode(ids.data() + P + t, out.data() + (t + 1) * V);
    return out;
  };
  const int threads_before = exec::num_threads();
  const auto one = decode_all(1);
  for (const int threads : {2, 3}) {
    const auto many = decode_all(threads);
    for (std::size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], many[i]) << threads << " threads, logit " << i;
  }
  // Timed steps (time_phases) give the same logits; every kind of phase took time, the G
  // one-row steps were counted (prefill is not one row), and one thread's mean phases fit in
  // the steps' wall time.
  for (const int threads : {1, 2}) {
    exec::set_num_threads(threads);
    StandardKVCache cache(kv_cache_shape(cfg, 1, 24));
    Decoder dec(m, cache);
    std::vector<float> out(static_cast<std::size_t>((G + 1) * V));
    dec.prefill(ids.data(), P, nullptr, out.data());
    dec.time_phases(true);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t t = 0; t < G; ++t) dec.decode(ids.data() + P + t, out.data() + (t + 1) * V);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    dec.time_phases(false);
    for (std::size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], out[i]) << "timed, " << threads << " threads, logit " << i;
    const auto ps = dec.phase_seconds();
    EXPECT_EQ(ps.steps, G);
    for (const double s : {ps.qkv, ps.attention, ps.o_proj, ps.gate_up, ps.down, ps.lm_head}) EXPECT_GT(s, 0.0);
    if (threads == 1) {
      EXPECT_EQ(ps.barrier_wait, 0.0);
    }
    const double sum = ps.qkv + ps.attention + ps.o_proj + ps.gate_up + ps.down + ps.lm_head + ps.barrier_wait;
    EXPECT_LE(sum * static_cast<double>(G), wall * 1.001) << threads << " threads";
    dec.decode(ids.data(), out.data());  // not timed
    EXPECT_EQ(dec.phase_seconds().steps, G);
    dec.reset_phase_times();
    EXPECT_EQ(dec.phase_seconds().steps, 0);
  }
  exec::set_num_threads(threads_before);
  // Two sequences at once: the same prompt twice, left to the general path.
  StandardKVCache cache(kv_cache_shape(cfg, 2, 24));
  Decoder dec(m, cache);
  std::vector<std::int64_t> prompt2(static_cast<std::size_t>(2 * P)), step2(2);
  for (std::int64_t b = 0; b < 2; ++b) std::copy(ids.begin(), ids.begin() + P, prompt2.begin() + b * P);
  std::vector<float> last2(static_cast<std::size_t>(2 * V));
  dec.prefill(prompt2.data(), P, nullptr, last2.data());
  for (std::int64_t t = 0; t < G; ++t) {
    step2[0] = step2[1] = ids[static_cast<std::size_t>(P + t)];
    dec.decode(step2.data(), last2.data());
    for (std::int64_t b = 0; b < 2; ++b)
      EXPECT_LT(max_diff(last2.data() + b * V, one.data() + (t + 1) * V, V), 1e-5) << "step " << t << " sequence " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Generate, DecoderVariants,
                         ::testing::Values("", "bias", "llama3", "window", "tied", "mha", "qwen3"));

TEST(Decoder, ChunkedPrefillEqualsOneChunk) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(1), 0.2f);
  const auto ids = random_ids(13, cfg.vocab_size, 5);
  const auto want = full_logits(m, ids);
  const std::int64_t V = cfg.vocab_size;
  StandardKVCache cache(kv_cache_shape(cfg, 1, 16));
  Decoder dec(m, cache);
  std::vector<float> all(static_cast<std::size_t>(13 * V)), last(static_cast<std::size_t>(V));
  dec.prefill(ids.data(), 4, nullptr, last.data(), all.data());
  dec.prefill(ids.data() + 4, 9, nullptr, last.data(), all.data() + 4 * V);
  EXPECT_LT(max_diff(all.data(), want.data(), 13 * V), 1e-4);
}

TEST(Decoder, LongPrefillOnTheGemmEqualsTheFullForward) {
  // Prefill chunks of 10 and 140 tokens attend through the GEMM path (runs of at least
  // kGemmAttentionRows rows), the second one over three query blocks (kGemmAttentionBlock)
  // and over slots the first chunk cached; then 6 decode steps on the per-row path. With a
  // sliding window (5) every block starts at a different first slot. Standard, paged (pages
  // of 16: a block's keys cross pages) and int8 caches.
  static_assert(generate::detail::kGemmAttentionRows <= 10 && 140 > 2 * kernels::kAttentionQueryBlock);
  for (const std::string variant : {"", "window"}) {
    const auto cfg = test_support::small_llama(50, 160, variant);
    LlamaForCausalLM<> m(cfg);
    m.init(Key::from_seed(12), 0.2f);
    const auto ids = random_ids(156, cfg.vocab_size, 31);
    const auto want = full_logits(m, ids);
    const std::int64_t V = cfg.vocab_size;
    const auto run = [&](auto& cache) {
      Decoder dec(m, cache);
      std::vector<float> all(static_cast<std::size_t>(150 * V)), last(static_cast<std::size_t>(V));
      dec.prefill(ids.data(), 10, nullptr, last.data(), all.data());
      dec.prefill(ids.data() + 10, 140, nullptr, last.data(), all.data() + 10 * V);
      double w = max_diff(all.data(), want.data(), 150 * V);
      for (std::int64_t t = 150; t < 156; ++t) {
        dec.decode(ids.data() + t, last.data());
        w = std::max(w, max_diff(last.data(), want.data() + t * V, V));
      }
      return w;
    };
    StandardKVCache standard(kv_cache_shape(cfg, 1, 160));
    EXPECT_LT(run(standard), 1e-4) << variant;
    PagedKVCacheOptions po;
    po.page_size = 16;
    PagedKVCache paged(kv_cache_shape(cfg, 1, 160), po);
    EXPECT_LT(run(paged), 1e-4) << variant;
    double scale = 0;
    for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    Int8KVCache int8(kv_cache_shape(cfg, 1, 160));
    EXPECT_LT(run(int8), 3e-2 * scale) << variant;
  }
}

TEST(Decoder, Bf16ParamsMatchTheirFullForward) {
  const auto cfg = small_config();
  LlamaForCausalLM<BF16ParamsPolicy> m(cfg);
  m.init(Key::from_seed(2), 0.2f);
  const auto ids = random_ids(10, cfg.vocab_size, 9);
  StandardKVCache cache(kv_cache_shape(cfg, 1, 10));
  EXPECT_LT(incremental_error(m, cache, ids, 3), 1e-4);
}

// half(): f16 weights decode as their full forward, and prefill and decode give the logits of
// the f32 model holding the rounded weights (the decode kernels widen f16 exactly).
TEST(Decoder, F16ParamsDecodeAsTheRoundedF32Model) {
  const auto cfg = small_config();
  LlamaForCausalLM<> f(cfg);
  f.init(Key::from_seed(2), 0.2f);
  const auto h = models::to_dtype<F16ParamsPolicy>(f);
  const auto r = models::to_dtype<DefaultPolicy>(h);
  const auto ids = random_ids(10, cfg.vocab_size, 9);
  StandardKVCache cache(kv_cache_shape(cfg, 1, 10));
  EXPECT_LT(incremental_error(h, cache, ids, 3), 1e-4);
  const std::int64_t V = cfg.vocab_size;
  const auto run = [&](const auto& m) {
    StandardKVCache c(kv_cache_shape(cfg, 1, 10));
    Decoder dec(m, c);
    std::vector<float> all(static_cast<std::size_t>(4 * V)), last(static_cast<std::size_t>(V));
    dec.prefill(ids.data(), 4, nullptr, last.data(), all.data());
    for (std::int64_t t = 4; t < 10; ++t) {
      dec.decode(ids.data() + t, last.data());
      all.insert(all.end(), last.begin(), last.end());
    }
    return all;
  };
  EXPECT_EQ(run(h), run(r));
}

TEST(Decoder, LeftPaddedBatchEqualsEachPromptAlone) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(4), 0.2f);
  const std::int64_t V = cfg.vocab_size;
  // 12 and 9 real tokens attend through the GEMM path, 3 through the per-row path, in one call.
  const std::vector<std::vector<std::int64_t>> prompts = {random_ids(12, V, 11), random_ids(3, V, 12), random_ids(9, V, 13)};
  const std::int64_t B = 3, S = 12, steps = 5;
  static_assert(generate::detail::kGemmAttentionRows <= 9 && generate::detail::kGemmAttentionRows > 3);
  std::vector<std::int64_t> ids(B * S, 0), mask(B * S, 0);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[b];
    const std::int64_t pad = S - static_cast<std::int64_t>(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) ids[b * S + pad + i] = p[i], mask[b * S + pad + i] = 1;
  }
  StandardKVCache cache(kv_cache_shape(cfg, B, S + steps));
  Decoder dec(m, cache);
  std::vector<float> logits(B * V);
  dec.prefill(ids.data(), S, mask.data(), logits.data());
  std::vector<std::vector<float>> batch_logits(B);
  for (std::int64_t b = 0; b < B; ++b) batch_logits[b].assign(logits.begin() + b * V, logits.begin() + (b + 1) * V);
  const auto feed = random_ids(B * steps, V, 99);
  std::vector<std::vector<float>> step_logits;
  for (std::int64_t t = 0; t < steps; ++t) {
    dec.decode(feed.data() + t * B, logits.data());
    step_logits.push_back(logits);
  }
  for (std::int64_t b = 0; b < B; ++b) {
    StandardKVCache c1(kv_cache_shape(cfg, 1, S + steps));
    Decoder d1(m, c1);
    std::vector<float> l1(V);
    d1.prefill(prompts[b].data(), static_cast<std::int64_t>(prompts[b].size()), nullptr, l1.data());
    EXPECT_LT(max_diff(l1.data(), batch_logits[b].data(), V), 1e-5) << "prompt " << b;
    for (std::int64_t t = 0; t < steps; ++t) {
      d1.decode(feed.data() + t * B + b, l1.data());
      EXPECT_LT(max_diff(l1.data(), step_logits[t].data() + b * V, V), 1e-5) << "prompt " << b << " step " << t;
    }
  }
}

TEST(Decoder, Int8CacheLogitErrorIsSmall) {
  // Documented bound (docs/generation.md): max |logit error| <= 3% of max |logit| on these models.
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(6), 0.2f);
  const auto ids = random_ids(24, cfg.vocab_size, 21);
  const auto want = full_logits(m, ids);
  double scale = 0;
  for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  Int8KVCache cache(kv_cache_shape(cfg, 1, 24));
  const double err = incremental_error(m, cache, ids, 4);
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 3e-2 * scale) << "int8 cache logit error";
  std::printf("[int8 cache] random model: max |logit error| = %.3g, max |logit| = %.3g\n", err, scale);
}

TEST(Decoder, PagedCacheEqualsStandard) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(8), 0.2f);
  const auto ids = random_ids(21, cfg.vocab_size, 22);
  PagedKVCacheOptions po;
  po.page_size = 4;
  po.budget_bytes = 1 << 20;
  PagedKVCache cache(kv_cache_shape(cfg, 1, 32), po);
  EXPECT_LT(incremental_error(m, cache, ids, 5), 1e-4);
  EXPECT_EQ(cache.page_table(0).size(), 6u);  // ceil(21 / 4)
}

TEST(Decoder, MatchesTinyHfForward) {
  const char* env = std::getenv("EDL_TEST_DATA");
  const std::filesystem::path dir = std::filesystem::path(env ? env : "tests/data") / "tiny_hf";
  if (!std::filesystem::exists(dir / "model.safetensors")) FAIL() << "no fixture at " << dir << " (EDL_TEST_DATA)";
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<> m(cfg);
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  const auto ids = random_ids(30, cfg.vocab_size, 31);
  StandardKVCache cache(kv_cache_shape(cfg, 1, 30));
  EXPECT_LT(incremental_error(m, cache, ids, 8), 1e-4);
  Int8KVCache c8(kv_cache_shape(cfg, 1, 30));
  const double e8 = incremental_error(m, c8, ids, 8);
  const auto want = full_logits(m, ids);
  double scale = 0;
  for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  EXPECT_LT(e8, 3e-2 * scale);
  std::printf("[int8 cache] tiny_hf: max |logit error| = %.3g, max |logit| = %.3g over 30 positions\n", e8, scale);
}

TEST(Decoder, BadTokenAndShapeErrors) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(9));
  StandardKVCache cache(kv_cache_shape(cfg, 1, 4));
  Decoder dec(m, cache);
  std::vector<float> l(cfg.vocab_size);
  const std::int64_t bad[2] = {1, 50};
  EXPECT_THROW(dec.prefill(bad, 2, nullptr, l.data()), edl::Error);
  EXPECT_EQ(cache.length(0), 0);
  const std::int64_t ok[5] = {1, 2, 3, 4, 5};
  EXPECT_THROW(dec.prefill(ok, 5, nullptr, l.data()), edl::Error);  // more than max_length
  const std::int64_t mask[3] = {1, 0, 1};
  EXPECT_THROW(dec.prefill(ok, 3, mask, l.data()), edl::Error);  // not left padding
  StandardKVCache wrong({3, 1, 4, 2, 8});
  EXPECT_THROW((Decoder<DefaultPolicy, StandardKVCache>(m, wrong)), edl::Error);
}

TEST(Decoder, QuantizedModelsDecodeOnEveryPath) {
  // q8_0, q4_0 and nf4 Linears: a 20-token prefill and the decode steps after it equal the
  // full forward of the same quantized model up to the attention's order (a quantized product's
  // row does not depend on how many rows come with it), and the one-row phased step gives the
  // same bits on 1, 2 and 3 threads.
  models::LlamaConfig cfg = small_config();
  cfg.hidden_size = 64, cfg.intermediate_size = 128, cfg.head_dim = 16;
  cfg.validate();
  LlamaForCausalLM<> base(cfg);
  base.init(Key::from_seed(21), 0.1f);
  const std::int64_t V = cfg.vocab_size, P = 20, G = 6;
  const auto ids = random_ids(P + G, V, 5);
  const int threads_before = exec::num_threads();
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4}) {
    LlamaForCausalLM<> m = base;
    nn::quantize(m, {f});
    const auto want = full_logits(m, ids);
    const auto decode_all = [&](int threads) {
      exec::set_num_threads(threads);
      StandardKVCache cache(kv_cache_shape(cfg, 1, P + G));
      Decoder dec(m, cache);
      std::vector<float> out(static_cast<std::size_t>((P + G) * V)), last(static_cast<std::size_t>(V));
      dec.prefill(ids.data(), P, nullptr, last.data(), out.data());
      for (std::int64_t t = P; t < P + G; ++t) dec.decode(ids.data() + t, out.data() + t * V);
      return out;
    };
    const auto one = decode_all(1);
    EXPECT_LT(max_diff(one.data(), want.data(), P * V), 1e-4) << quant::format_name(f) << " prefill";
    EXPECT_LT(max_diff(one.data() + P * V, want.data() + P * V, G * V), 1e-4) << quant::format_name(f) << " decode";
    for (const int threads : {2, 3}) EXPECT_EQ(decode_all(threads), one) << quant::format_name(f) << " " << threads;
    exec::set_num_threads(threads_before);
  }
  exec::set_num_threads(threads_before);
}

TEST(Decoder, LoraAdaptersDecodeUnmergedOnEveryPath) {
  // Adapters applied unmerged (over a float and an nf4 base): prefill and decode equal the
  // full forward, and the merged model's; the one-row phased step gives the same bits on 1, 2
  // and 3 threads.
  models::LlamaConfig cfg = small_config();
  cfg.hidden_size = 64, cfg.intermediate_size = 128, cfg.head_dim = 16;
  cfg.validate();
  const std::int64_t V = cfg.vocab_size, P = 20, G = 6;
  const auto ids = random_ids(P + G, V, 5);
  const int threads_before = exec::num_threads();
  for (const bool quantized : {false, true}) {
    LlamaForCausalLM<> m(cfg);
    m.init(Key::from_seed(21), 0.1f);
    if (quantized) nn::quantize(m, {quant::Format::nf4});
    lora::LoraConfig lc;
    lc.r = 4, lc.lora_alpha = 8, lc.target_modules = {"all-linear"};
    lora::apply_lora(m, lc);
    std::uint32_t i = 0;
    m.visit_linears("", [&](const std::string&, auto& lin) {
      if (lin.lora)
        fill_normal(fold_in(Key::from_seed(3), i++), 0, std::span<float>(lin.lora->B.data(), lin.lora->B.value.size()),
                    0.0f, 0.3f);
    });
    const auto want = full_logits(m, ids);
    LlamaForCausalLM<> merged = m;
    lora::merge_lora(merged);
    const auto want_merged = full_logits(merged, ids);
    EXPECT_LT(max_diff(want.data(), want_merged.data(), (P + G) * V), 1e-4);
    const auto decode_all = [&](int threads) {
      exec::set_num_threads(threads);
      StandardKVCache cache(kv_cache_shape(cfg, 1, P + G));
      Decoder dec(m, cache);
      std::vector<float> out(static_cast<std::size_t>((P + G) * V)), last(static_cast<std::size_t>(V));
      dec.prefill(ids.data(), P, nullptr, last.data(), out.data());
      for (std::int64_t t = P; t < P + G; ++t) dec.decode(ids.data() + t, out.data() + t * V);
      return out;
    };
    const auto one = decode_all(1);
    EXPECT_LT(max_diff(one.data(), want.data(), (P + G) * V), 1e-4) << "quantized " << quantized;
    for (const int threads : {2, 3}) EXPECT_EQ(decode_all(threads), one) << "quantized " << quantized << " " << threads;
    exec::set_num_threads(threads_before);
  }
}
