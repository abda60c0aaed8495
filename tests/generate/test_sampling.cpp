// tests/generate/test_sampling.cpp: processors, warpers, reproducible draws, GenerationConfig.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/sampling.hpp>

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
