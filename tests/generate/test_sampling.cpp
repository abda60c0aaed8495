// tests/generate/test_sampling.cpp: processors, warpers, reproducible draws, GenerationConfig.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/sampling.hpp>
#include "support/temp_dir.hpp"

using namespace edl;
using namespace edl::generate;

namespace {

std::vector<std::int64_t> kept(const std::vector<float>& probs) {
  std::vector<std::int64_t> k;
  for (std::size_t i = 0; i < probs.size(); ++i)
    if (probs[i] > 0) k.push_back(static_cast<std::int64_t>(i));
  return k;
}

std::vector<double> softmax_d(const std::vector<double>& z) {
  double mx = -INFINITY, s = 0;
  for (double v : z) mx = std::max(mx, v);
  std::vector<double> p(z.size());
  for (std::size_t i = 0; i < z.size(); ++i) s += (p[i] = std::isinf(z[i]) ? 0.0 : std::exp(z[i] - mx));
  for (double& v : p) v /= s;
  return p;
}

/// The tokens a processor set to -inf.
std::set<std::int64_t> banned(const std::vector<float>& l) {
  std::set<std::int64_t> b;
  for (std::size_t i = 0; i < l.size(); ++i)
    if (std::isinf(l[i]) && l[i] < 0) b.insert(static_cast<std::int64_t>(i));
  return b;
}

/// HF's NoRepeatNGramLogitsProcessor written out: every n-gram of the context by its first
/// n - 1 tokens, then the continuations of the context's last n - 1 tokens.
std::set<std::int64_t> ngram_bans(const std::vector<std::int64_t>& ctx, std::size_t n) {
  if (ctx.size() + 1 < n) return {};
  std::map<std::vector<std::int64_t>, std::set<std::int64_t>> seen;
  for (std::size_t i = 0; i + n <= ctx.size(); ++i)
    seen[std::vector<std::int64_t>(ctx.begin() + static_cast<std::ptrdiff_t>(i), ctx.begin() + static_cast<std::ptrdiff_t>(i + n - 1))]
        .insert(ctx[i + n - 1]);
  const std::vector<std::int64_t> prefix(ctx.end() - static_cast<std::ptrdiff_t>(n - 1), ctx.end());
  const auto it = seen.find(prefix);
  return it == seen.end() ? std::set<std::int64_t>{} : it->second;
}

/// HF's TypicalLogitsWarper step by step, in double: the kept tokens of logits z.
std::vector<std::int64_t> typical_reference(const std::vector<double>& z, double mass) {
  const std::size_t V = z.size();
  const std::vector<double> p = softmax_d(z);
  double ent = 0;
  for (std::size_t i = 0; i < V; ++i)
    if (p[i] > 0) ent -= std::log(p[i]) * p[i];  // nansum: -inf * 0 left out
  std::vector<double> shifted(V);
  for (std::size_t i = 0; i < V; ++i) shifted[i] = p[i] > 0 ? std::fabs(-std::log(p[i]) - ent) : INFINITY;
  std::vector<std::size_t> idx(V);
  for (std::size_t i = 0; i < V; ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return shifted[a] < shifted[b]; });
  std::size_t below = 0;  // (cumulative_probs < mass).sum()
  double cum = 0;
  for (std::size_t r = 0; r < V; ++r) below += (cum += p[idx[r]]) < mass ? 1 : 0;
  const double limit = shifted[idx[std::min(below, V - 1)]];
  std::vector<std::int64_t> keep;
  for (std::size_t i = 0; i < V; ++i)
    if (shifted[i] <= limit || i == idx[0]) keep.push_back(static_cast<std::int64_t>(i));
  return keep;
}

}  // namespace

TEST(Sampling, ArgmaxFirstOnTies) {
  const float x[5] = {1, 3, 2, 3, -1};
  EXPECT_EQ(argmax(x, 5), 1);
}

// The vectorized argmax against the scan it replaces (keep the first strictly larger value),
// over lengths around the vector blocks, with ties, NaN, +-inf and all -inf or NaN rows.
TEST(Sampling, ArgmaxMatchesTheScalarScan) {
  const auto scan = [](const std::vector<float>& x) {
    std::int64_t best = 0;
    float bv = -INFINITY;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] > bv) {
        bv = x[i];
        best = static_cast<std::int64_t>(i);
      }
    return best;
  };
  std::uint32_t state = 12345;
  const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (std::int64_t n : {1, 7, 8, 31, 32, 33, 64, 65, 100, 32000}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      // Few distinct values: ties of the maximum are common.
      for (float& v : x) v = static_cast<float>(next() % 7) - 3.0f;
      for (int k = 0; k < trial % 5; ++k) {
        const std::size_t at = next() % x.size();
        x[at] = trial % 3 == 0 ? NAN : trial % 3 == 1 ? -INFINITY : INFINITY;
      }
      if (trial == 7) std::fill(x.begin(), x.end(), -INFINITY);
      if (trial == 8) std::fill(x.begin(), x.end(), NAN);
      if (trial == 9 && n > 1) {
        std::fill(x.begin(), x.end(), NAN);
        x.back() = -2.0f;
      }
      ASSERT_EQ(argmax(x.data(), n), scan(x)) << "n = " << n << ", trial " << trial;
    }
  }
}

TEST(Sampling, TopKKeepsTiesAndTheKLargest) {
  GenerationConfig c;
  c.do_sample = true;
  c.top_k = 3;
  Sampler s;
  std::vector<float> p;
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.5f, 1.0f, 1.0f};
  s.distribution(l.data(), 6, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1, 3, 4, 5}));  // 3rd largest is 1.0, tied with token 5
  c.top_k = 2;
  s.distribution(l.data(), 6, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1, 3}));
  double sum = 0;
  for (float v : p) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(Sampling, TopPKeepsTheSmallestHeadWithEnoughMass) {
  GenerationConfig c;
  c.do_sample = true;
  c.top_k = 0;
  // probabilities 0.5, 0.25, 0.15, 0.1 (logs), in scrambled order
  const std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.1f), std::log(0.25f)};
  Sampler s;
  std::vector<float> p;
  c.top_p = 0.5f;  // 0.5 alone reaches 0.5
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1}));
  c.top_p = 0.6f;  // 0.5 + 0.25
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1, 3}));
  EXPECT_NEAR(p[1], 0.5 / 0.75, 1e-6);
  c.top_p = 0.8f;  // 0.5 + 0.25 + 0.15
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{0, 1, 3}));
  c.top_p = 0.01f;  // at least one token
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1}));
}

TEST(Sampling, MinPDropsTokensBelowAFractionOfTheTop) {
  GenerationConfig c;
  c.do_sample = true;
  c.top_k = 0;
  c.min_p = 0.29f;  // threshold 0.29 * 0.5 = 0.145: keeps 0.5, 0.25, 0.15
  const std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.1f), std::log(0.25f)};
  Sampler s;
  std::vector<float> p;
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{0, 1, 3}));
  c.min_p = 0.31f;
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1, 3}));
}

TEST(Sampling, RepetitionAndPresencePenaltiesFollowHf) {
  GenerationConfig c;
  c.repetition_penalty = 2.0f;
  c.presence_penalty = 0.5f;
  std::vector<float> l = {1.0f, -1.0f, 2.0f, 4.0f};
  const std::vector<std::int64_t> ctx = {0, 1, 1, 3}, gen = {3, 3};
  Penalties p;
  p.apply(l.data(), 4, ctx, gen, c);
  EXPECT_FLOAT_EQ(l[0], 0.5f);   // positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.0f);  // negative: multiplied (once, although seen twice)
  EXPECT_FLOAT_EQ(l[2], 2.0f);   // unseen
  EXPECT_FLOAT_EQ(l[3], 1.5f);   // 4 / 2 - 0.5
}

TEST(Sampling, FrequencyPenaltyCountsEachGeneratedToken) {
  GenerationConfig c;
  c.presence_penalty = 0.25f;
  c.frequency_penalty = 0.5f;
  std::vector<float> l = {1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<std::int64_t> ctx = {0, 2, 2, 2, 1}, gen = {2, 2, 2, 1};  // OpenAI: prompt tokens not counted
  Penalties p;
  p.apply(l.data(), 4, ctx, gen, c);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[2], 1.0f - 0.25f - 1.5f);
  EXPECT_FLOAT_EQ(l[3], 1.0f);
  p.apply(l.data(), 4, ctx, gen, c);  // counts reset between calls
  EXPECT_FLOAT_EQ(l[2], 1.0f - 2 * (0.25f + 1.5f));
}

TEST(Sampling, SameSeedSameDrawsOtherSeedOtherDraws) {
  GenerationConfig c;
  c.do_sample = true;
  c.top_k = 0;
  c.seed = 1234;
  std::vector<float> base(32);
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = std::sin(static_cast<float>(i));
  const auto run = [&](std::uint64_t seed, std::uint32_t b) {
    c.seed = seed;
    Sampler s;
    std::vector<std::int64_t> out;
    for (std::uint32_t t = 0; t < 64; ++t) {
      std::vector<float> l = base;
      out.push_back(s.next(l.data(), 32, c, {}, {}, b, t));
    }
    return out;
  };
  EXPECT_EQ(run(1234, 0), run(1234, 0));
  EXPECT_NE(run(1234, 0), run(1235, 0));
  EXPECT_NE(run(1234, 0), run(1234, 1));  // each sequence has its own stream
}

TEST(Sampling, EmpiricalDistributionMatchesFilteredSoftmax) {
  const std::vector<float> l = {1.2f, -0.3f, 0.8f, 2.0f, 0.0f, -2.0f, 1.9f, 0.5f, 1.0f, -1.0f};
  const std::int64_t V = static_cast<std::int64_t>(l.size());
  struct Case { float temperature; std::int64_t top_k; float top_p; float min_p; };
  for (const Case cs : {Case{1.0f, 0, 1.0f, 0.0f}, Case{0.7f, 6, 1.0f, 0.0f}, Case{1.3f, 0, 0.85f, 0.0f},
                        Case{1.0f, 0, 1.0f, 0.1f}, Case{0.9f, 8, 0.95f, 0.05f}}) {
    GenerationConfig c;
    c.do_sample = true;
    c.temperature = cs.temperature;
    c.top_k = cs.top_k;
    c.top_p = cs.top_p;
    c.min_p = cs.min_p;
    c.seed = 42;
    // Reference in double: temperature, top-k, top-p (mass before < top_p), min-p.
    std::vector<double> z(l.begin(), l.end());
    for (double& v : z) v /= cs.temperature;
    if (cs.top_k > 0) {
      std::vector<double> s = z;
      std::sort(s.rbegin(), s.rend());
      for (double& v : z)
        if (v < s[static_cast<std::size_t>(cs.top_k - 1)]) v = -INFINITY;
    }
    auto p = softmax_d(z);
    if (cs.top_p < 1) {
      std::vector<std::size_t> o(z.size());
      for (std::size_t i = 0; i < o.size(); ++i) o[i] = i;
      std::stable_sort(o.begin(), o.end(), [&](auto a, auto b) { return p[a] > p[b]; });
      double before = 0;
      for (std::size_t r = 0; r < o.size(); ++r) {
        if (r > 0 && before >= cs.top_p) z[o[r]] = -INFINITY;
        before += p[o[r]];
      }
      p = softmax_d(z);
    }
    if (cs.min_p > 0) {
      const double mx = *std::max_element(p.begin(), p.end());
      for (std::size_t i = 0; i < p.size(); ++i)
        if (p[i] < cs.min_p * mx) z[i] = -INFINITY;
      p = softmax_d(z);
    }
    Sampler s;
    const int N = 20000;
    std::vector<int> count(static_cast<std::size_t>(V), 0);
    for (int t = 0; t < N; ++t) {
      std::vector<float> row = l;
      ++count[static_cast<std::size_t>(s.next(row.data(), V, c, {}, {}, 0, static_cast<std::uint32_t>(t)))];
    }
    double chi2 = 0;
    int df = -1;
    for (std::int64_t i = 0; i < V; ++i) {
      if (p[static_cast<std::size_t>(i)] == 0) {
        EXPECT_EQ(count[static_cast<std::size_t>(i)], 0) << "filtered token " << i << " was drawn";
        continue;
      }
      const double e = N * p[static_cast<std::size_t>(i)];
      chi2 += (count[static_cast<std::size_t>(i)] - e) * (count[static_cast<std::size_t>(i)] - e) / e;
      ++df;
    }
    // Generous: the 99.99% quantile of chi2(df) is below 3 df + 25 for df <= 10.
    EXPECT_LT(chi2, 3.0 * df + 25.0) << "T " << cs.temperature << " k " << cs.top_k << " p " << cs.top_p << " min_p "
                                      << cs.min_p << " df " << df;
  }
}

TEST(GenerationConfig, ReadsHfFields) {
  const auto j = nlohmann::ordered_json::parse(R"({
    "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "min_p": 0.05,
    "repetition_penalty": 1.1, "max_new_tokens": 7, "eos_token_id": [2, 7], "pad_token_id": 0,
    "num_beams": 1, "length_penalty": 0.8, "early_stopping": "never", "transformers_version": "4.44.0"})");
  const auto g = GenerationConfig::from_json(j);
  EXPECT_TRUE(g.do_sample);
  EXPECT_FLOAT_EQ(g.temperature, 0.6f);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_FLOAT_EQ(g.top_p, 0.9f);
  EXPECT_FLOAT_EQ(g.min_p, 0.05f);
  EXPECT_FLOAT_EQ(g.repetition_penalty, 1.1f);
  EXPECT_EQ(g.max_new_tokens, 7);
  EXPECT_EQ(g.eos_token_id, (std::vector<std::int64_t>{2, 7}));
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_FLOAT_EQ(g.length_penalty, 0.8f);
  EXPECT_EQ(g.early_stopping, EarlyStopping::never);
  EXPECT_TRUE(g.is_stop(7));
  const auto g2 = GenerationConfig::from_json(nlohmann::ordered_json::parse(R"({"eos_token_id": 5, "early_stopping": true})"));
  EXPECT_EQ(g2.eos_token_id, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(g2.early_stopping, EarlyStopping::yes);
  EXPECT_FALSE(g2.do_sample);
  EXPECT_EQ(g2.top_k, 50);  // HF default
  EXPECT_THROW(GenerationConfig::from_json(nlohmann::ordered_json::parse(R"({"temperature": 0})")), edl::Error);
  EXPECT_THROW(GenerationConfig::from_json(nlohmann::ordered_json::parse(R"({"top_p": "x"})")), edl::Error);
  EXPECT_THROW(GenerationConfig::from_json(nlohmann::ordered_json::parse(R"({"early_stopping": "sometimes"})")), edl::Error);
}

TEST(GenerationConfig, FromFolderReadsTheFileOverTheModelsDefaults) {
  test_support::TempDir dir("generation_config_folder");
  edl::models::LlamaConfig m;
  m.eos_token_id = {3};
  m.pad_token_id = 1;
  // No file: the model config's tokens.
  const auto none = GenerationConfig::from_folder(dir.p, m);
  EXPECT_EQ(none.eos_token_id, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(none.pad_token_id, 1);
  EXPECT_FALSE(none.do_sample);
  // A file without eos: its fields, the model's eos.
  dir.file("generation_config.json", R"({"do_sample": true, "temperature": 0.7, "max_new_tokens": 9})");
  const auto g = GenerationConfig::from_folder(dir.p, m);
  EXPECT_TRUE(g.do_sample);
  EXPECT_FLOAT_EQ(g.temperature, 0.7f);
  EXPECT_EQ(g.max_new_tokens, 9);
  EXPECT_EQ(g.eos_token_id, (std::vector<std::int64_t>{3}));
  // The file's eos wins; a bad file is named.
  dir.file("generation_config.json", R"({"eos_token_id": [5, 6]})");
  EXPECT_EQ(GenerationConfig::from_folder(dir.p, m).eos_token_id, (std::vector<std::int64_t>{5, 6}));
  dir.file("generation_config.json", R"({"temperature": 0})");
  try {
    GenerationConfig::from_folder(dir.p, m);
    FAIL() << "expected an error";
  } catch (const edl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
  }
}

TEST(Sampling, NoRepeatNgramBansWhatHfBans) {
  std::mt19937 rng(3);
  const std::int64_t V = 5;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<std::int64_t> ctx(static_cast<std::size_t>(rng() % 16));
    for (auto& t : ctx) t = static_cast<std::int64_t>(rng() % V);
    GenerationConfig c;
    c.no_repeat_ngram_size = 1 + static_cast<std::int64_t>(rng() % 4);
    std::vector<float> l(static_cast<std::size_t>(V), 0.5f);
    Penalties p;
    p.apply(l.data(), V, ctx, {}, c);
    EXPECT_EQ(banned(l), ngram_bans(ctx, static_cast<std::size_t>(c.no_repeat_ngram_size)))
        << "trial " << trial << " n " << c.no_repeat_ngram_size;
  }
  // By hand: after "1 2 ... 1" the bigram (1, 2) is taken, so 2 is banned; n = 3 needs "2 1" again.
  GenerationConfig c;
  c.no_repeat_ngram_size = 2;
  std::vector<float> l(5, 0.0f);
  Penalties p;
  p.apply(l.data(), 5, std::vector<std::int64_t>{1, 2, 3, 1}, {}, c);
  EXPECT_EQ(banned(l), (std::set<std::int64_t>{2}));
}

TEST(Sampling, BadWordsMinTokensAndSuppressionSetMinusInfinity) {
  GenerationConfig c;
  c.eos_token_id = {4};
  c.stop_token_ids = {5};
  c.bad_words_ids = {{1}, {4}, {2, 3}, {0, 2, 6}};  // {4}: an eos token alone is dropped, as HF does
  const auto run = [&](const std::vector<std::int64_t>& ctx, std::size_t generated) {
    std::vector<float> l(7, 1.0f);
    Penalties p;
    p.apply(l.data(), 7, ctx, std::span<const std::int64_t>(ctx).last(generated), c);
    return banned(l);
  };
  EXPECT_EQ(run({5, 5}, 1), (std::set<std::int64_t>{1}));
  EXPECT_EQ(run({0, 2}, 1), (std::set<std::int64_t>{1, 3, 6}));  // "2" ends the context: 3; "0 2": 6
  EXPECT_EQ(run({2}, 1), (std::set<std::int64_t>{1, 3}));
  c.bad_words_ids.clear();
  c.min_new_tokens = 2;  // the stop tokens (eos and stop_token_ids) wait for 2 new tokens
  EXPECT_EQ(run({0, 0, 0}, 1), (std::set<std::int64_t>{4, 5}));
  EXPECT_EQ(run({0, 0, 0}, 2), (std::set<std::int64_t>{}));
  c.min_new_tokens = 0;
  c.min_length = 4;  // and for a context of 4
  EXPECT_EQ(run({0, 0, 0}, 2), (std::set<std::int64_t>{4, 5}));
  EXPECT_EQ(run({0, 0, 0, 0}, 2), (std::set<std::int64_t>{}));
  c.min_length = 0;
  c.suppress_tokens = {6};
  c.begin_suppress_tokens = {0, 2};  // only before the first new token
  EXPECT_EQ(run({3}, 0), (std::set<std::int64_t>{0, 2, 6}));
  EXPECT_EQ(run({3}, 1), (std::set<std::int64_t>{6}));
  // Greedy picks the best token that is left.
  std::vector<float> l = {0.f, 3.f, 2.f, 1.f, 0.f, 0.f, 0.f};
  c.suppress_tokens = {1};
  Sampler s;
  EXPECT_EQ(s.next(l.data(), 7, c, std::vector<std::int64_t>{3}, {}, 0, 0), 3);  // 1 suppressed, 2 at the start
}

TEST(Sampling, TypicalPKeepsTheTokensClosestToTheEntropy) {
  GenerationConfig c;
  c.do_sample = true;
  c.top_k = 0;
  Sampler s;
  std::vector<float> p;
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 2.0);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t V = 2 + static_cast<std::int64_t>(rng() % 30);
    std::vector<float> l(static_cast<std::size_t>(V));
    std::vector<double> z(l.size());
    for (std::size_t i = 0; i < l.size(); ++i) z[i] = l[i] = static_cast<float>(nd(rng));
    c.typical_p = 0.05f + 0.9f * static_cast<float>(trial % 10) / 10.f;
    s.distribution(l.data(), V, c, p);
    EXPECT_EQ(kept(p), typical_reference(z, c.typical_p)) << "trial " << trial << " V " << V;
    double sum = 0;
    for (float v : p) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  // By hand: probabilities 0.4, 0.3, 0.2, 0.1 (entropy 1.2799 nats; surprises 0.92, 1.20, 1.61,
  // 2.30): closest first are 0.3, 0.2, 0.4, 0.1.
  const std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  c.typical_p = 0.25f;  // 0.3 alone reaches it
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1}));
  c.typical_p = 0.45f;  // 0.3 + 0.2
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{1, 2}));
  c.typical_p = 0.85f;  // + 0.4
  s.distribution(l.data(), 4, c, p);
  EXPECT_EQ(kept(p), (std::vector<std::int64_t>{0, 1, 2}));
}

TEST(GenerationConfig, ReadsHfProcessorFieldsAndChecksTheirTokens) {
  const auto g = GenerationConfig::from_json(nlohmann::ordered_json::parse(R"({
    "typical_p": 0.8, "no_repeat_ngram_size": 3, "bad_words_ids": [[5], [6, 7]], "min_length": 4,
    "min_new_tokens": 2, "suppress_tokens": [1, 2], "begin_suppress_tokens": [3]})"));
  EXPECT_FLOAT_EQ(g.typical_p, 0.8f);
  EXPECT_EQ(g.no_repeat_ngram_size, 3);
  EXPECT_EQ(g.bad_words_ids, (std::vector<std::vector<std::int64_t>>{{5}, {6, 7}}));
  EXPECT_EQ(g.min_length, 4);
  EXPECT_EQ(g.min_new_tokens, 2);
  EXPECT_EQ(g.suppress_tokens, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(g.begin_suppress_tokens, (std::vector<std::int64_t>{3}));
  g.validate("g", 8);
  const auto message = [&](const GenerationConfig& x, std::int64_t V) {
    try {
      x.validate("generation_config.json", V);
    } catch (const edl::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(g, 7).find("bad_words_ids"), std::string::npos);  // 7 is outside [0, 7)
  EXPECT_NE(message(g, 7).find("outside the vocabulary"), std::string::npos);
  for (const char* bad : {R"({"typical_p": 0})", R"({"no_repeat_ngram_size": -1})", R"({"bad_words_ids": [[]]})",
                          R"({"bad_words_ids": [1, 2]})", R"({"suppress_tokens": [-3]})", R"({"min_new_tokens": -2})"})
    EXPECT_THROW(GenerationConfig::from_json(nlohmann::ordered_json::parse(bad)), edl::Error) << bad;
}
