// tests/generate/test_prefix_cached_generator.cpp: a conversation that keeps its KV cache
// between turns gives, every turn, the tokens generate() gives the whole prompt, while
// prefilling only what follows the prefix it shares with the cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/generate/generate.hpp>
#include <edl/generate/prefix_cached_generator.hpp>
#include <edl/models/llama/llama.hpp>
#include "small_llama.hpp"

using namespace edl::generate;
using edl::Key;
using edl::models::LlamaConfig;
using edl::models::LlamaForCausalLM;

namespace {

LlamaForCausalLM<> make_model(const LlamaConfig& c) {
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(23), 0.3f);
  return m;
}

std::vector<std::int64_t> tokens(std::int64_t n, std::int64_t salt) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = (11 * i + 5 * salt + 1) % 40;
  return p;
}

GenerationConfig config(std::int64_t n, bool sample) {
  auto g = GenerationConfig::from_model_config(test_support::small_llama(40, 96, "no_eos"));
  g.max_new_tokens = n;
  if (sample) {
    g.do_sample = true;
    g.temperature = 0.8f;
    g.top_p = 0.9f;
    g.repetition_penalty = 1.3f;
    g.seed = 5;
  }
  return g;
}

/// Three turns of a conversation, each checked against generate() on the whole prompt.
void expect_turns_equal_generate(const LlamaForCausalLM<>& m, bool sample, bool reuses) {
  PrefixCachedGenerator gen(m);
  const auto g = config(6, sample);
  // Turn 1: nothing cached.
  auto p = tokens(10, 1);
  auto r = gen.generate(p, g);
  EXPECT_EQ(r.tokens[0], generate(m, {p}, g).tokens[0]);
  EXPECT_EQ(gen.reused_tokens(), 0);
  EXPECT_EQ(gen.cached_tokens(), 10 + 6 - 1);
  // Turn 2: the conversation so far and a new message (the cache grows: 21 + 6 > 16 tokens).
  auto p2 = p;
  p2.insert(p2.end(), r.tokens[0].begin(), r.tokens[0].end());
  const auto msg = tokens(5, 2);
  p2.insert(p2.end(), msg.begin(), msg.end());
  r = gen.generate(p2, g);
  EXPECT_EQ(r.tokens[0], generate(m, {p2}, g).tokens[0]);
  EXPECT_EQ(gen.reused_tokens(), reuses ? 10 + 6 - 1 : 0);
  EXPECT_EQ(r.stats.prefill_tokens, static_cast<std::int64_t>(p2.size()) - gen.reused_tokens());
  // Turn 3: a prompt that leaves the conversation after 7 tokens (an edited message).
  auto p3 = p2;
  p3[7] = (p3[7] + 1) % 40;
  r = gen.generate(p3, g);
  EXPECT_EQ(r.tokens[0], generate(m, {p3}, g).tokens[0]);
  EXPECT_EQ(gen.reused_tokens(), reuses ? 7 : 0);
  // The same prompt again: all but its last token come from the cache.
  r = gen.generate(p3, g);
  EXPECT_EQ(r.tokens[0], generate(m, {p3}, g).tokens[0]);
  EXPECT_EQ(gen.reused_tokens(), reuses ? static_cast<std::int64_t>(p3.size()) - 1 : 0);
}

}  // namespace

TEST(PrefixCachedGenerator, TurnsEqualGenerateOnTheWholePrompt) {
  const auto m = make_model(test_support::small_llama(40, 96, "no_eos"));
  expect_turns_equal_generate(m, /*sample=*/false, /*reuses=*/true);
  expect_turns_equal_generate(m, /*sample=*/true, /*reuses=*/true);
}

TEST(PrefixCachedGenerator, SlidingWindowAndQwen3LayersToo) {
  for (const char* variant : {"window", "qwen3"}) {
    SCOPED_TRACE(variant);
    auto c = test_support::small_llama(40, 96, variant);
    c.eos_token_id = {};
    expect_turns_equal_generate(make_model(c), false, true);
  }
}

TEST(PrefixCachedGenerator, LengthDependentRopeStartsOverEachTurn) {
  auto c = test_support::small_llama(40, 96, "no_eos");
  edl::models::RopeScaling rs;
  rs.rope_type = "dynamic";
  rs.factor = 2;
  c.rope_scaling = rs;
  c.max_position_embeddings = 12;  // the prompts pass it: the frequencies change with the length
  c.validate();
  const auto m = make_model(c);
  PrefixCachedGenerator gen(m);
  GenerateOptions o;
  o.max_model_length = 96;
  auto g = config(6, false);
  auto p = tokens(10, 3);
  auto r = gen.generate(p, g, o);
  p.insert(p.end(), r.tokens[0].begin(), r.tokens[0].end());
  r = gen.generate(p, g, o);
  EXPECT_EQ(gen.reused_tokens(), 0);
  EXPECT_EQ(r.tokens[0], generate(m, {p}, g, o).tokens[0]);
}

TEST(PrefixCachedGenerator, AReplyStoppedByTheCallerKeepsWhatWasFed) {
  const auto m = make_model(test_support::small_llama(40, 96, "no_eos"));
  PrefixCachedGenerator gen(m);
  const auto g = config(8, false);
  const auto p = tokens(9, 4);
  struct Stop {};
  GenerateOptions o;
  int n = 0;
  o.on_token = [&](std::int64_t, std::int64_t) {
    if (++n == 3) throw Stop{};
  };
  EXPECT_THROW(gen.generate(p, g, o), Stop);
  EXPECT_EQ(gen.cached_tokens(), 9 + 2);  // the prompt and the two tokens fed back
  const auto want = generate(m, {p}, g).tokens[0];
  auto p2 = p;
  p2.insert(p2.end(), want.begin(), want.begin() + 3);
  const auto r = gen.generate(p2, g);
  EXPECT_EQ(gen.reused_tokens(), 9 + 2);
  EXPECT_EQ(r.tokens[0], generate(m, {p2}, g).tokens[0]);
  EXPECT_THROW(gen.generate({}, g), edl::Error);
  auto beams = g;
  beams.num_beams = 2;
  EXPECT_THROW(gen.generate(p, beams), edl::Error);
}
