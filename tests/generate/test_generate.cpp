// tests/generate/test_generate.cpp: generate() vs the PyTorch greedy oracle, caches, beams, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/rng.hpp>
#include <edl/generate/generate.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/module.hpp>
#include "small_llama.hpp"

using namespace edl::generate;
using edl::Key;
namespace nn = edl::nn;
namespace io = edl::io;
using edl::models::LlamaConfig;
using edl::models::LlamaForCausalLM;

namespace {

std::filesystem::path tiny_dir() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return std::filesystem::path(env ? env : "tests/data") / "tiny_hf";
}

struct Tiny {
  LlamaConfig cfg;
  LlamaForCausalLM<> model;
  std::vector<std::int64_t> prompt, want;
};

const Tiny* tiny() {
  static const Tiny* t = []() -> const Tiny* {
    const auto dir = tiny_dir();
    if (!std::filesystem::exists(dir / "oracle" / "greedy.json")) return nullptr;
    auto* r = new Tiny;
    r->cfg = LlamaConfig::from_file((dir / "config.json").string());
    r->model = LlamaForCausalLM<>(r->cfg);
    nn::load_params(r->model, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
    nlohmann::json j;
    std::ifstream((dir / "oracle" / "greedy.json").string()) >> j;
    r->prompt = j["prompt"].get<std::vector<std::int64_t>>();
    r->want = j["new_tokens"].get<std::vector<std::int64_t>>();
    const auto tok = io::load_npy<std::int64_t>((dir / "oracle" / "tokens.npy").string());
    const std::size_t S = tok.shape(1);
    std::vector<std::int64_t> row0(tok.data(), tok.data() + S);
    EXPECT_EQ(row0, r->prompt) << "greedy.json prompt should be row 0 of tokens.npy";
    return r;
  }();
  return t;
}

LlamaConfig small_config() { return test_support::small_llama(40, 32, "no_eos"); }

GenerationConfig greedy(std::int64_t n, const LlamaConfig& c) {
  auto g = GenerationConfig::from_model_config(c);
  g.max_new_tokens = n;
  return g;
}

}  // namespace

TEST(Generate, GreedyMatchesPyTorchOracle) {
  const Tiny* t = tiny();
  if (!t) FAIL() << "no fixture at " << tiny_dir() << " (EDL_TEST_DATA)";
  std::vector<std::int64_t> streamed;
  GenerateOptions o;
  o.on_token = [&](std::int64_t seq, std::int64_t tok) {
    EXPECT_EQ(seq, 0);
    streamed.push_back(tok);
  };
  const auto r = generate(t->model, {t->prompt}, greedy(16, t->cfg), o);
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0], t->want);
  EXPECT_EQ(streamed, t->want);
  EXPECT_EQ(r.finish_reason[0], "length");
}

TEST(Generate, AllCachesAndOneBeamGiveTheOracleTokens) {
  const Tiny* t = tiny();
  if (!t) FAIL() << "no fixture at " << tiny_dir() << " (EDL_TEST_DATA)";
  for (CacheKind k : {CacheKind::standard, CacheKind::paged}) {
    GenerateOptions o;
    o.cache = k;
    o.paged.page_size = 4;
    o.paged.budget_bytes = 1 << 20;
    EXPECT_EQ(generate(t->model, {t->prompt}, greedy(16, t->cfg), o).tokens[0], t->want) << int(k);
    auto g = greedy(16, t->cfg);
    g.num_beams = 1;
    EXPECT_EQ(generate(t->model, {t->prompt}, g, o).tokens[0], t->want);
  }
  // Beam search code path with one beam (num_beams = 1 normally takes the greedy loop).
  StandardKVCache cache(kv_cache_shape(t->cfg, 1, 24));
  Decoder dec(t->model, cache);
  const std::int64_t S = static_cast<std::int64_t>(t->prompt.size());
  const std::vector<std::int64_t> mask(static_cast<std::size_t>(S), 1);
  const auto b = beam_search(dec, {t->prompt}, greedy(16, t->cfg), {16}, t->prompt, S, mask, t->cfg.vocab_size);
  EXPECT_EQ(b[0], t->want);
}

TEST(Generate, PagedAndStandardIdenticalWhenSampling) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(3), 0.3f);
  auto g = greedy(12, cfg);
  g.do_sample = true;
  g.temperature = 0.9f;
  g.top_p = 0.95f;
  g.repetition_penalty = 1.2f;
  g.seed = 77;
  const std::vector<std::vector<std::int64_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}, {9, 10, 11}};
  GenerateOptions std_o, paged_o;
  paged_o.cache = CacheKind::paged;
  paged_o.paged.page_size = 3;
  const auto a = generate(m, prompts, g, std_o), b = generate(m, prompts, g, paged_o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(generate(m, prompts, g, std_o).tokens, a.tokens);  // reproducible
  // Each prompt alone draws the same tokens (the stream depends on (seed, b, t) only for b = 0).
  const auto alone = generate(m, {prompts[0]}, g, std_o);
  EXPECT_EQ(alone.tokens[0], a.tokens[0]);
}

TEST(Generate, BatchedGreedyEqualsEachPromptAlone) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const std::vector<std::vector<std::int64_t>> prompts = {{3, 1, 4, 1, 5, 9}, {2, 6}, {5, 3, 5}};
  const auto all = generate(m, prompts, greedy(10, cfg));
  for (std::size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(generate(m, {prompts[p]}, greedy(10, cfg)).tokens[0], all.tokens[p]);
  GenerateOptions o8;
  o8.cache = CacheKind::int8;
  const auto q = generate(m, prompts, greedy(10, cfg), o8);
  EXPECT_EQ(q.tokens.size(), 3u);
}

// HF's generate(inputs_embeds=...): prompts given as vectors. The embedding table's rows of a
// prompt generate as its ids (batched, padded, beams); other vectors follow a greedy loop of
// full forwards over [prompt vectors, new tokens' rows] (the model's own inputs_embeds path);
// processors see the new tokens only, as HF passes no ids.
TEST(Generate, FromEmbedsFollowsTheFullForwardOfTheVectors) {
  for (const std::string variant : {"", "tied"}) {
    SCOPED_TRACE(variant);
    const auto cfg = test_support::small_llama(61, 64, variant);
    LlamaForCausalLM<> m(cfg);
    m.init(Key::from_seed(6), 0.3f);
    const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size;
    const auto rows_of = [&](const std::vector<std::int64_t>& ids) {
      xt::xtensor<float, 2> e = xt::zeros<float>({ids.size(), static_cast<std::size_t>(H)});
      for (std::size_t i = 0; i < ids.size(); ++i)
        for (std::int64_t h = 0; h < H; ++h) e(i, h) = m.model.embed_tokens.weight.value(ids[i], h);
      return e;
    };
    const std::vector<std::vector<std::int64_t>> prompts = {{3, 1, 4, 1, 5, 9}, {2, 6}, {5, 3, 5}};
    std::vector<xt::xtensor<float, 2>> vectors;
    for (const auto& p : prompts) vectors.push_back(rows_of(p));
    EXPECT_EQ(generate_from_embeds(m, vectors, greedy(8, cfg)).tokens, generate(m, prompts, greedy(8, cfg)).tokens);
    auto beams = greedy(5, cfg);
    beams.num_beams = 3;
    EXPECT_EQ(generate_from_embeds(m, vectors, beams).tokens, generate(m, prompts, beams).tokens);

    // Vectors no id has: greedy by full forwards, the new tokens entering as table rows.
    xt::xtensor<float, 2> soft = xt::zeros<float>({std::size_t{5}, static_cast<std::size_t>(H)});
    edl::fill_normal(Key::from_seed(9), 0, std::span<float>(soft.data(), soft.size()));
    const std::int64_t n = 7;
    std::vector<std::int64_t> want;
    std::vector<float> seq(soft.begin(), soft.end());
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t S = static_cast<std::int64_t>(seq.size()) / H;
      nn::TokenLayout lay{1, S};
      lay.inputs_embeds = seq.data();
      std::vector<float> logits(static_cast<std::size_t>(S * V));
      m.logits(nullptr, lay, logits.data());
      const float* last = logits.data() + (S - 1) * V;
      const std::int64_t tok = std::max_element(last, last + V) - last;
      want.push_back(tok);
      const auto row = rows_of({tok});
      seq.insert(seq.end(), row.begin(), row.end());
    }
    auto g = greedy(n, cfg);
    g.eos_token_id = {};
    GenerateOptions o;
    std::size_t calls = 0;
    o.logits_processor = [&](std::int64_t, std::span<const std::int64_t> ctx, std::span<float>) {
      EXPECT_EQ(ctx.size(), calls);  // the new tokens so far, no prompt ids
      ++calls;
    };
    EXPECT_EQ(generate_from_embeds(m, {soft}, g, o).tokens[0], want);
    EXPECT_EQ(calls, static_cast<std::size_t>(n));
    EXPECT_THROW(generate_from_embeds(m, {xt::xtensor<float, 2>(xt::zeros<float>({3, 5}))}, g), edl::Error);
  }
}

// Beam sampling (num_beams > 1 with do_sample, HF's beam_sample). The same seed gives the same
// beams and other seeds other beams; with top_k = 4 every new token is one of the four most
// likely tokens of its own context (a full forward): the warpers act on each beam. (With top_k
// = 2 the 3 beams would have 6 candidates, all of them drawn: no randomness left.)
TEST(Generate, BeamSamplingDrawsFromEachBeamsWarpedTokens) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const std::int64_t V = cfg.vocab_size;
  const std::vector<std::vector<std::int64_t>> prompts = {{3, 1, 4, 1, 5, 9}, {2, 6}};
  auto g = greedy(6, cfg);
  g.num_beams = 3;
  g.num_return_sequences = 3;
  g.do_sample = true;
  g.top_k = 4;
  g.seed = 11;
  const auto a = generate(m, prompts, g).tokens;
  EXPECT_EQ(generate(m, prompts, g).tokens, a);
  std::set<std::vector<std::vector<std::int64_t>>> seen;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    g.seed = seed;
    seen.insert(generate(m, prompts, g).tokens);
  }
  EXPECT_GT(seen.size(), 1u);
  ASSERT_EQ(a.size(), 6u);
  for (std::size_t r = 0; r < a.size(); ++r) {
    std::vector<std::int64_t> ctx = prompts[r / 3];
    for (const std::int64_t tok : a[r]) {
      const std::int64_t S = static_cast<std::int64_t>(ctx.size());
      std::vector<float> logits(static_cast<std::size_t>(S * V));
      m.logits(ctx.data(), nn::TokenLayout{1, S}, logits.data());
      const float* last = logits.data() + (S - 1) * V;
      EXPECT_LT(std::count_if(last, last + V, [&](float x) { return x > last[tok]; }), 4) << "sequence " << r;
      ctx.push_back(tok);
    }
  }
}

// The draw is one without replacement from the softmax of the scores. One new token from 2 beams:
// the first step draws 4 candidates from beam 0's log-probabilities and returns the two best, so
// the first sequence's token is the most likely of 4 tokens drawn without replacement. Its
// frequency over 2000 seeds matches that probability, enumerated over every ordered draw.
TEST(Generate, BeamSamplingDrawsWithoutReplacementFromTheSoftmax) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(2), 0.05f);  // a flat distribution: many tokens can be drawn
  const std::int64_t V = cfg.vocab_size;
  const std::vector<std::int64_t> prompt = {3, 1, 4};
  std::vector<float> logits(static_cast<std::size_t>(3 * V));
  m.logits(prompt.data(), nn::TokenLayout{1, 3}, logits.data());
  std::vector<double> p(static_cast<std::size_t>(V));
  double z = 0;
  for (std::int64_t t = 0; t < V; ++t) z += p[static_cast<std::size_t>(t)] = std::exp(static_cast<double>(logits[2 * V + t]));
  for (auto& x : p) x /= z;
  std::vector<double> want(static_cast<std::size_t>(V), 0.0);
  for (std::int64_t i = 0; i < V; ++i)
    for (std::int64_t j = 0; j < V; ++j) {
      if (j == i) continue;
      const double pij = p[i] * p[j] / (1 - p[i]);
      for (std::int64_t k = 0; k < V; ++k) {
        if (k == i || k == j) continue;
        const double pijk = pij * p[k] / (1 - p[i] - p[j]);
        for (std::int64_t l = 0; l < V; ++l) {
          if (l == i || l == j || l == k) continue;
          std::int64_t best = i;
          for (std::int64_t c : {j, k, l})
            if (p[c] > p[best]) best = c;
          want[static_cast<std::size_t>(best)] += pijk * p[l] / (1 - p[i] - p[j] - p[k]);
        }
      }
    }
  auto g = greedy(1, cfg);
  g.num_beams = 2;
  g.do_sample = true;
  const int N = 2000;
  std::vector<int> got(static_cast<std::size_t>(V), 0);
  for (int seed = 0; seed < N; ++seed) {
    g.seed = static_cast<std::uint64_t>(seed);
    ++got[static_cast<std::size_t>(generate(m, {prompt}, g).tokens[0].at(0))];
  }
  for (std::int64_t t = 0; t < V; ++t) {
    const double q = want[static_cast<std::size_t>(t)], f = got[static_cast<std::size_t>(t)] / static_cast<double>(N);
    EXPECT_NEAR(f, q, 5 * std::sqrt(q * (1 - q) / N) + 2e-3) << "token " << t;
  }
}

TEST(Generate, StopsOnEosAndStopTokens) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const auto free_run = generate(m, {{3, 1, 4}}, greedy(10, cfg)).tokens[0];
  ASSERT_GE(free_run.size(), 4u);
  auto g = greedy(10, cfg);
  g.stop_token_ids = {free_run[3]};
  const auto r = generate(m, {{3, 1, 4}}, g);
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(r.tokens[0], std::vector<std::int64_t>(free_run.begin(), free_run.begin() + first + 1));
  EXPECT_EQ(r.finish_reason[0], "stop");
  // max_model_length caps prompt + output.
  GenerateOptions o;
  o.max_model_length = 7;
  const auto capped = generate(m, {{3, 1, 4}}, greedy(10, cfg), o);
  EXPECT_EQ(capped.tokens[0].size(), 4u);
  EXPECT_EQ(capped.finish_reason[0], "length");
}

TEST(Generate, ProcessorsShapeTheGreedyOutput) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5), 0.3f);
  const std::vector<std::int64_t> prompt = {3, 1, 4, 1};
  const auto free_run = generate(m, {prompt}, greedy(24, cfg)).tokens[0];
  const auto has_repeated_bigram = [](const std::vector<std::int64_t>& t) {
    std::set<std::pair<std::int64_t, std::int64_t>> seen;
    for (std::size_t i = 0; i + 1 < t.size(); ++i)
      if (!seen.insert({t[i], t[i + 1]}).second) return true;
    return false;
  };
  std::vector<std::int64_t> all(prompt);
  all.insert(all.end(), free_run.begin(), free_run.end());
  ASSERT_TRUE(has_repeated_bigram(all));  // so the processor has something to change
  auto g = greedy(24, cfg);
  g.no_repeat_ngram_size = 2;
  const auto r = generate(m, {prompt}, g).tokens[0];
  // The prompt's own "1" after "3 1 4 1" may not be followed by 4 again; nothing repeats.
  all.assign(prompt.begin(), prompt.end());
  all.insert(all.end(), r.begin(), r.end());
  EXPECT_EQ(r.size(), 24u);
  EXPECT_FALSE(has_repeated_bigram(all));
  // bad_words_ids: the free run's first token is never generated alone.
  auto b = greedy(6, cfg);
  b.bad_words_ids = {{free_run[0]}};
  const auto rb = generate(m, {prompt}, b).tokens[0];
  EXPECT_EQ(std::count(rb.begin(), rb.end(), free_run[0]), 0);
  // min_new_tokens holds back a stop token: the free run's first token stops it at once
  // without, and not before 5 tokens with.
  auto s = greedy(8, cfg);
  s.stop_token_ids = {free_run[0]};
  EXPECT_EQ(generate(m, {prompt}, s).tokens[0].size(), 1u);
  s.min_new_tokens = 5;
  const auto rs = generate(m, {prompt}, s).tokens[0];
  ASSERT_GE(rs.size(), 5u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NE(rs[i], free_run[0]) << i;
  // A token id outside the vocabulary is an error naming the field.
  auto bad = greedy(4, cfg);
  bad.suppress_tokens = {cfg.vocab_size};
  EXPECT_THROW(generate(m, {prompt}, bad), edl::Error);
}

// num_return_sequences: n sequences per prompt, prompt by prompt, each what generate() gives
// the prompt repeated n times; sampled ones differ, greedy ones repeat; beam search gives at
// most its num_beams best (WideBeamSearchFindsTheBestPairOfTokens).
TEST(Generate, NumReturnSequencesRunsEachPromptNTimes) {
  const Tiny* t = tiny();
  if (!t) FAIL() << "no fixture at " << tiny_dir() << " (EDL_TEST_DATA)";
  const std::vector<std::int64_t> other{t->prompt[0], t->prompt.back()};
  auto g = greedy(6, t->cfg);
  g.do_sample = true;
  g.temperature = 1.5f;
  g.seed = 5;
  g.num_return_sequences = 3;
  std::vector<std::int64_t> processed_prompts;
  GenerateOptions o;
  o.logits_processor = [&](std::int64_t p, std::span<const std::int64_t>, std::span<float>) { processed_prompts.push_back(p); };
  const auto r = generate(t->model, {t->prompt, other}, g, o);
  ASSERT_EQ(r.tokens.size(), 6u);
  auto one = g;
  one.num_return_sequences = 1;
  const auto each = generate(t->model, {t->prompt, t->prompt, t->prompt, other, other, other}, one);
  EXPECT_EQ(r.tokens, each.tokens);
  EXPECT_EQ(r.finish_reason, each.finish_reason);
  EXPECT_FALSE(r.tokens[0] == r.tokens[1] && r.tokens[1] == r.tokens[2]) << "three samples of one prompt all equal";
  for (auto p : processed_prompts) EXPECT_TRUE(p == 0 || p == 1) << p;  // the prompt's index, not the sequence's
  auto gr = greedy(4, t->cfg);
  gr.num_return_sequences = 2;
  const auto twice = generate(t->model, {t->prompt}, gr);
  ASSERT_EQ(twice.tokens.size(), 2u);
  EXPECT_EQ(twice.tokens[0], twice.tokens[1]);
  gr.num_beams = 2;
  gr.num_return_sequences = 3;  // more than the beams: refused, as HF refuses it
  EXPECT_THROW(generate(t->model, {t->prompt}, gr), edl::Error);
}

// chain_processors (HF's LogitsProcessorList): each runs in order on what the one before left.
TEST(Generate, ChainedProcessorsRunInOrder) {
  std::vector<int> order;
  const LogitsProcessor chain = chain_processors(
      {[&](std::int64_t, std::span<const std::int64_t>, std::span<float> s) {
         order.push_back(1);
         s[0] = 2.0f;
       },
       {},
       [&](std::int64_t, std::span<const std::int64_t>, std::span<float> s) {
         order.push_back(2);
         s[1] = s[0] * 3.0f;  // sees the first one's change
       }});
  std::vector<float> scores{0.0f, 0.0f, 0.0f};
  const std::vector<std::int64_t> ctx{1};
  chain(0, ctx, scores);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(scores, (std::vector<float>{2.0f, 6.0f, 0.0f}));
}

TEST(Generate, LogitsProcessorSeesTheContextAndChangesTheChoice) {
  const Tiny* t = tiny();
  if (!t) FAIL() << "no fixture at " << tiny_dir() << " (EDL_TEST_DATA)";
  const std::int64_t V = t->cfg.vocab_size, k = 2;
  ASSERT_GT(t->want.size(), static_cast<std::size_t>(k));
  // Greedy with the oracle's token k banned at step k: steps before k keep the oracle's
  // tokens, step k takes the best other token of a full forward over the context.
  std::vector<std::int64_t> streamed;
  GenerateOptions o;
  o.on_token = [&](std::int64_t, std::int64_t tok) { streamed.push_back(tok); };
  o.logits_processor = [&](std::int64_t p, std::span<const std::int64_t> ctx, std::span<float> scores) {
    EXPECT_EQ(p, 0);
    std::vector<std::int64_t> want_ctx(t->prompt);
    want_ctx.insert(want_ctx.end(), streamed.begin(), streamed.end());
    EXPECT_EQ(std::vector<std::int64_t>(ctx.begin(), ctx.end()), want_ctx);
    EXPECT_EQ(static_cast<std::int64_t>(scores.size()), V);
    if (static_cast<std::int64_t>(streamed.size()) == k) scores[static_cast<std::size_t>(t->want[k])] = -INFINITY;
  };
  const auto r = generate(t->model, {t->prompt}, greedy(k + 1, t->cfg), o).tokens[0];
  ASSERT_EQ(r.size(), static_cast<std::size_t>(k + 1));
  for (std::int64_t i = 0; i < k; ++i) EXPECT_EQ(r[static_cast<std::size_t>(i)], t->want[static_cast<std::size_t>(i)]);
  std::vector<std::int64_t> ctx(t->prompt);
  ctx.insert(ctx.end(), t->want.begin(), t->want.begin() + k);
  const std::int64_t S = static_cast<std::int64_t>(ctx.size());
  std::vector<float> logits(static_cast<std::size_t>(S * V));
  t->model.logits(ctx.data(), nn::TokenLayout{1, S}, logits.data());
  const float* last = logits.data() + (S - 1) * V;
  std::int64_t best = -1;
  for (std::int64_t v = 0; v < V; ++v)
    if (v != t->want[static_cast<std::size_t>(k)] && (best < 0 || last[v] > last[best])) best = v;
  EXPECT_EQ(r[static_cast<std::size_t>(k)], best);

  // Beam search calls it on the log-probabilities of every beam: a token it bans never comes.
  auto b = greedy(6, t->cfg);
  b.num_beams = 3;
  const auto free_beam = generate(t->model, {t->prompt}, b).tokens[0];
  ASSERT_FALSE(free_beam.empty());
  GenerateOptions ban;
  std::int64_t calls = 0;
  ban.logits_processor = [&](std::int64_t, std::span<const std::int64_t>, std::span<float> scores) {
    EXPECT_LE(scores[0], 0.0f);  // log-probabilities
    scores[static_cast<std::size_t>(free_beam[0])] = -INFINITY;
    ++calls;
  };
  const auto banned = generate(t->model, {t->prompt}, b, ban).tokens[0];
  EXPECT_GE(calls, 3);
  EXPECT_EQ(std::count(banned.begin(), banned.end(), free_beam[0]), 0);
}

TEST(Generate, WideBeamSearchFindsTheBestPairOfTokens) {
  // num_beams = vocab and two new tokens: beam search is exhaustive, so its answer is the
  // argmax over all V^2 continuations of (log p(a) + log p(b | a)) / 2^length_penalty, and its
  // n best beams are the n best of them.
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(11), 0.5f);
  const std::int64_t V = cfg.vocab_size;
  const std::vector<std::int64_t> prompt = {4, 8, 15};
  auto g = greedy(2, cfg);
  g.num_beams = V;
  const auto r = generate(m, {prompt}, g);
  const auto logp = [&](const std::vector<std::int64_t>& ids) {
    std::vector<float> l(ids.size() * V);
    nn::TokenLayout lay{1, static_cast<std::int64_t>(ids.size())};
    m.logits(ids.data(), lay, l.data());
    std::vector<double> out(V);
    const float* row = l.data() + (ids.size() - 1) * V;
    double mx = -INFINITY, s = 0;
    for (std::int64_t i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
    for (std::int64_t i = 0; i < V; ++i) s += std::exp(row[i] - mx);
    for (std::int64_t i = 0; i < V; ++i) out[i] = row[i] - mx - std::log(s);
    return out;
  };
  const auto l1 = logp(prompt);
  double best = -INFINITY;
  std::vector<std::int64_t> arg;
  for (std::int64_t a = 0; a < V; ++a) {
    auto ids = prompt;
    ids.push_back(a);
    const auto l2 = logp(ids);
    for (std::int64_t b = 0; b < V; ++b)
      if (l1[a] + l2[b] > best) best = l1[a] + l2[b], arg = {a, b};
  }
  EXPECT_EQ(r.tokens[0], arg);
  // num_return_sequences = 4: the four best pairs of all V^2, best first (HF's finalize).
  std::vector<std::pair<double, std::vector<std::int64_t>>> pairs;
  for (std::int64_t a = 0; a < V; ++a) {
    auto ids = prompt;
    ids.push_back(a);
    const auto l2 = logp(ids);
    for (std::int64_t b = 0; b < V; ++b) pairs.push_back({l1[a] + l2[b], {a, b}});
  }
  std::sort(pairs.begin(), pairs.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  auto g4 = g;
  g4.num_return_sequences = 4;
  const auto r4 = generate(m, {prompt, prompt}, g4);
  ASSERT_EQ(r4.tokens.size(), 8u);  // prompt by prompt
  for (std::size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(r4.tokens[j], pairs[j].second) << j;
    EXPECT_EQ(r4.tokens[4 + j], pairs[j].second) << j;
  }
  // And with 3 beams the result is a valid 2-token continuation.
  g.num_beams = 3;
  EXPECT_EQ(generate(m, {prompt}, g).tokens[0].size(), 2u);
}

TEST(Generate, ClearErrors) {
  const auto cfg = small_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(1));
  const auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected an edl::Error mentioning " << needle;
    } catch (const edl::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { generate(m, {{1, 2, 40}}, greedy(3, cfg)); }, "outside the vocabulary");
  expect_error([&] { generate(m, {{1, -1}}, greedy(3, cfg)); }, "outside the vocabulary");
  expect_error([&] { generate(m, {std::vector<std::int64_t>(33, 1)}, greedy(3, cfg)); }, "max_model_length");
  GenerateOptions o;
  o.cache = CacheKind::paged;
  o.paged.page_size = 4;
  o.paged.budget_bytes = 3 * 2 * 2 * 4 * 16 * 4;  // 3 pages of 4 tokens (2 layers, kv row 16, k and v, f32)
  o.paged.utilization = 1.0;
  expect_error([&] { generate(m, {{1, 2, 3, 4, 5}}, greedy(10, cfg), o); }, "out of pages");
  expect_error([&] { generate(m, {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}}, greedy(1, cfg), o); }, "out of pages");
  EXPECT_EQ(generate(m, {{1, 2, 3, 4, 5}}, greedy(7, cfg), o).tokens[0].size(), 7u);  // 12 tokens fit
}
