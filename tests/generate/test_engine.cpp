// tests/generate/test_engine.cpp: the continuous batching engine gives every request the tokens
// generate() gives its prompt alone, however requests join, leave, chunk and get preempted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/generate/engine.hpp>
#include <edl/generate/generate.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/nn/module.hpp>
#include "small_llama.hpp"

using namespace edl::generate;
using edl::Key;
using edl::models::LlamaConfig;
using edl::models::LlamaForCausalLM;

namespace {

LlamaConfig engine_config() { return test_support::small_llama(40, 64, "no_eos"); }

const LlamaForCausalLM<>& engine_model() {
  static const LlamaForCausalLM<>* m = [] {
    auto* p = new LlamaForCausalLM<>(engine_config());
    p->init(Key::from_seed(21), 0.3f);
    return p;
  }();
  return *m;
}

GenerationConfig greedy_n(std::int64_t n) {
  auto g = GenerationConfig::from_model_config(engine_config());
  g.max_new_tokens = n;
  return g;
}

GenerationConfig sampled_n(std::int64_t n, std::uint64_t seed) {
  auto g = greedy_n(n);
  g.do_sample = true;
  g.temperature = 0.9f;
  g.top_p = 0.95f;
  g.repetition_penalty = 1.2f;
  g.typical_p = 0.9f;  // and the processors that read the request's own context
  g.no_repeat_ngram_size = 3;
  g.min_new_tokens = 2;
  g.seed = seed;
  return g;
}

/// What generate() gives `prompt` alone: the independent path every request is checked against
/// (one sequence, whole-prompt prefill, the standard cache, sampler stream 0).
GenerateResult reference(const std::vector<std::int64_t>& prompt, const GenerationConfig& g, std::int64_t mml = 0,
                         CacheKind cache = CacheKind::standard) {
  GenerateOptions o;
  o.max_model_length = mml;
  o.cache = cache;
  return generate(engine_model(), {prompt}, g, o);
}

std::vector<std::int64_t> make_prompt(std::int64_t len, std::int64_t salt) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(len));
  for (std::int64_t i = 0; i < len; ++i) p[static_cast<std::size_t>(i)] = (7 * i + 13 * salt + 3) % 40;
  return p;
}

struct Job {
  std::vector<std::int64_t> prompt;
  GenerationConfig g;
};

/// Submits jobs in waves (between steps) and checks every request against generate() with the
/// `cache` kind of cache.
void run_and_compare(Engine<>& e, const std::vector<Job>& jobs, const std::vector<int>& steps_between,
                     CacheKind cache = CacheKind::standard) {
  std::vector<std::vector<std::int64_t>> streamed(jobs.size());
  std::size_t next = 0;
  const auto submit = [&](std::size_t j) {
    const auto id = e.submit(jobs[j].prompt, jobs[j].g, [&streamed](std::int64_t id, std::int64_t tok) {
      streamed[static_cast<std::size_t>(id)].push_back(tok);
    });
    EXPECT_EQ(id, static_cast<std::int64_t>(j));
  };
  for (int wave : steps_between) {
    // Two requests, then `wave` steps (requests join while others prefill or decode).
    for (int k = 0; k < 2 && next < jobs.size(); ++k) submit(next++);
    for (int s = 0; s < wave; ++s) e.step();
  }
  while (next < jobs.size()) submit(next++);
  e.run();
  EXPECT_TRUE(e.idle());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const auto& r = e.result(static_cast<std::int64_t>(j));
    const auto want = reference(jobs[j].prompt, jobs[j].g, e.max_model_length(), cache);
    EXPECT_EQ(r.state, RequestState::done);
    EXPECT_EQ(r.tokens, want.tokens[0]) << "request " << j;
    EXPECT_EQ(r.finish_reason, want.finish_reason[0]) << "request " << j;
    EXPECT_EQ(streamed[j], r.tokens) << "request " << j;
    if (!r.tokens.empty()) {
      EXPECT_GT(r.time_to_first_token_s, 0.0);
      EXPECT_GE(r.total_s, r.time_to_first_token_s);
    }
  }
  // Every page is back in the pool.
  EXPECT_EQ(e.pages_in_use(), 0);
}

EngineOptions small_options(std::int64_t max_batch, std::int64_t chunk) {
  EngineOptions o;
  o.max_batch = max_batch;
  o.prefill_chunk = chunk;
  o.paged.page_size = 4;
  o.paged.budget_bytes = 1 << 20;
  return o;
}

}  // namespace

TEST(Engine, GreedyRequestsJoiningAndLeavingEqualGenerateAlone) {
  // Prompts longer than the chunk (4): prefill takes several steps while others decode.
  std::vector<Job> jobs;
  const std::int64_t lens[] = {7, 3, 11, 5, 9, 2, 13};
  const std::int64_t news[] = {6, 12, 4, 9, 1, 10, 7};
  for (int j = 0; j < 7; ++j) jobs.push_back({make_prompt(lens[j], j), greedy_n(news[j])});
  // A stop token: request 3 stops at the third token of its free run.
  const auto free_run = generate(engine_model(), {jobs[3].prompt}, jobs[3].g).tokens[0];
  ASSERT_GE(free_run.size(), 3u);
  jobs[3].g.stop_token_ids = {free_run[2]};
  Engine<> e(engine_model(), small_options(3, 4));
  run_and_compare(e, jobs, {1, 3, 2});
  EXPECT_EQ(e.result(3).finish_reason, "stop");
  EXPECT_LE(e.stats().peak_running, 3);
  EXPECT_EQ(e.stats().preemptions, 0);
  std::int64_t total = 0;
  for (int j = 0; j < 7; ++j) total += static_cast<std::int64_t>(e.result(j).tokens.size());
  EXPECT_EQ(e.stats().generated_tokens, total);
  EXPECT_GT(e.stats().tokens_per_s(), 0.0);
  EXPECT_GT(e.stats().peak_pages, 0);
}

TEST(Engine, SeededSamplingIsEachRequestsOwnStream) {
  std::vector<Job> jobs;
  const std::int64_t lens[] = {6, 10, 3, 8, 5};
  for (int j = 0; j < 5; ++j) jobs.push_back({make_prompt(lens[j], 10 + j), sampled_n(8 + j, 100 + j % 2)});
  Engine<> e(engine_model(), small_options(2, 3));
  run_and_compare(e, jobs, {2, 1});
  // Same requests, one slot, all submitted at once: same tokens (slots and batch do not matter).
  Engine<> solo(engine_model(), small_options(1, 64));
  for (const auto& j : jobs) solo.submit(j.prompt, j.g);
  solo.run();
  for (int j = 0; j < 5; ++j) EXPECT_EQ(solo.result(j).tokens, e.result(j).tokens) << j;
}

TEST(Engine, MaxModelLengthCapsTheOutput) {
  auto o = small_options(2, 4);
  o.max_model_length = 12;
  Engine<> e(engine_model(), o);
  run_and_compare(e, {{make_prompt(9, 1), greedy_n(10)}, {make_prompt(4, 2), greedy_n(5)}, {make_prompt(12, 3), greedy_n(5)}},
                  {1});
  EXPECT_EQ(e.result(0).tokens.size(), 3u);
  EXPECT_EQ(e.result(0).finish_reason, "length");
  EXPECT_TRUE(e.result(2).tokens.empty());  // the prompt fills max_model_length already
}

TEST(Engine, TightPageBudgetPreemptsAndStillGivesTheSameTokens) {
  auto o = small_options(4, 4);
  Engine<> probe(engine_model(), o);
  const std::int64_t page_bytes = probe.page_bytes();
  // 7 pages of 4 tokens: four requests of up to 5 + 12 - 1 = 16 tokens (4 pages each) cannot
  // all grow, so the newest running ones are sent back and recomputed.
  o.paged.budget_bytes = 7 * page_bytes;
  o.paged.utilization = 1.0;
  Engine<> e(engine_model(), o);
  ASSERT_EQ(e.num_pages(), 7);
  std::vector<Job> jobs;
  for (int j = 0; j < 4; ++j) jobs.push_back({make_prompt(5, 30 + j), j % 2 ? sampled_n(12, 5) : greedy_n(12)});
  run_and_compare(e, jobs, {});
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_GT(e.stats().recomputed_tokens, 0);
  EXPECT_LE(e.stats().peak_pages, 7);
  std::int64_t preempted = 0;
  for (int j = 0; j < 4; ++j) preempted += e.result(j).preemptions;
  EXPECT_EQ(preempted, e.stats().preemptions);
  EXPECT_EQ(e.result(0).preemptions, 0);  // the oldest request is never sent back
}

TEST(Engine, RequestThatCanNeverFitIsAnErrorNamingIt) {
  auto o = small_options(2, 4);
  Engine<> probe(engine_model(), o);
  o.paged.budget_bytes = 6 * probe.page_bytes();
  o.paged.utilization = 1.0;
  Engine<> e(engine_model(), o);
  e.submit(make_prompt(5, 1), greedy_n(4));
  try {
    e.submit(make_prompt(10, 2), greedy_n(20));  // 29 tokens: 8 pages > 6
    FAIL() << "expected edl::Error";
  } catch (const edl::Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("request 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("can never fit"), std::string::npos) << msg;
  }
  // The engine keeps serving the others.
  e.run();
  EXPECT_EQ(e.result(0).tokens, reference(make_prompt(5, 1), greedy_n(4)).tokens[0]);
  EXPECT_EQ(e.pages_in_use(), 0);
}

TEST(Engine, BadRequestsAreClearErrors) {
  Engine<> e(engine_model(), small_options(2, 4));
  const auto message = [&](std::vector<std::int64_t> prompt, GenerationConfig g) -> std::string {
    try {
      e.submit(std::move(prompt), g);
    } catch (const edl::Error& err) {
      return err.what();
    }
    return "";
  };
  // A refused request takes no id: each of these would have been request 1.
  EXPECT_EQ(e.submit({1, 2}, greedy_n(2)), 0);
  const auto expect = [](const std::string& m, const std::string& what) {
    EXPECT_NE(m.find("generate.Engine request 1"), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  expect(message({1, 2, 40}, greedy_n(3)), "prompt token 2: id 40 is outside the vocabulary [0, 40)");
  expect(message({-1}, greedy_n(3)), "id -1 is outside the vocabulary");
  expect(message({}, greedy_n(3)), "the prompt is empty");
  expect(message(make_prompt(65, 0), greedy_n(3)), "the prompt has 65 tokens, more than max_model_length = 64");
  auto beams = greedy_n(3);
  beams.num_beams = 2;
  expect(message({1, 2}, beams), "beam search");
  EXPECT_EQ(e.num_requests(), 1);
  e.run();
  EXPECT_EQ(e.result(0).tokens, reference({1, 2}, greedy_n(2)).tokens[0]);
  EXPECT_TRUE(e.idle());
  EXPECT_FALSE(e.step());
  EXPECT_EQ(e.pages_in_use(), 0);
}

TEST(Engine, TinyFixtureGivesTheOracleTokens) {
  const char* env = std::getenv("EDL_TEST_DATA");
  const auto dir = std::filesystem::path(env ? env : "tests/data") / "tiny_hf";
  if (!std::filesystem::exists(dir / "oracle" / "greedy.json")) FAIL() << "no fixture at " << dir << " (EDL_TEST_DATA)";
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<> model(cfg);
  edl::nn::load_params(model, edl::io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  nlohmann::json j;
  std::ifstream((dir / "oracle" / "greedy.json").string()) >> j;
  const auto prompt = j["prompt"].get<std::vector<std::int64_t>>();
  const auto want = j["new_tokens"].get<std::vector<std::int64_t>>();
  auto g = GenerationConfig::from_model_config(cfg);
  g.max_new_tokens = static_cast<std::int64_t>(want.size());
  EngineOptions o;
  o.max_batch = 2;
  o.prefill_chunk = 3;
  o.paged.page_size = 4;
  o.paged.budget_bytes = 1 << 20;
  Engine<> e(model, o);
  e.submit(prompt, g);
  e.step();
  e.submit(prompt, g);  // joins while the first one is prefilling
  e.run();
  EXPECT_EQ(e.result(0).tokens, want);
  EXPECT_EQ(e.result(1).tokens, want);
}

TEST(Engine, CancelFreesTheRequestsPagesAndTheOthersGoOn) {
  Engine<> e(engine_model(), small_options(2, 4));
  const auto a = e.submit(make_prompt(9, 1), greedy_n(12));
  const auto b = e.submit(make_prompt(6, 2), greedy_n(10));
  const auto c = e.submit(make_prompt(5, 3), greedy_n(4));  // waits: two slots
  for (int s = 0; s < 4; ++s) e.step();
  ASSERT_EQ(e.result(a).state, RequestState::running);
  ASSERT_EQ(e.result(c).state, RequestState::waiting);
  e.cancel(c);  // from the queue
  e.cancel(a);  // running: its pages go back at once
  EXPECT_EQ(e.result(a).finish_reason, "cancelled");
  EXPECT_EQ(e.result(c).finish_reason, "cancelled");
  EXPECT_EQ(e.result(c).state, RequestState::done);
  e.run();
  EXPECT_EQ(e.result(b).tokens, reference(make_prompt(6, 2), greedy_n(10), e.max_model_length()).tokens[0]);
  EXPECT_EQ(e.pages_in_use(), 0);
  e.cancel(b);  // done: unchanged
  EXPECT_EQ(e.result(b).finish_reason, "length");
  e.forget(b);
  EXPECT_TRUE(e.result(b).tokens.empty());
  EXPECT_EQ(e.result(b).finish_reason, "length");
  EXPECT_THROW(e.cancel(99), edl::Error);
}

TEST(Engine, LogprobsAreTheLogSoftmaxOfTheFullForward) {
  // Independent path: the training forward over prompt + generated tokens, log-softmax by hand.
  const auto& m = engine_model();
  const std::int64_t V = engine_config().vocab_size;
  auto g = sampled_n(5, 3);
  g.repetition_penalty = 1.5f;  // penalties change the sampled row, not the reported logprobs
  Engine<> e(m, small_options(2, 4));
  std::vector<std::vector<float>> rows;
  const auto prompt = make_prompt(7, 4);
  e.submit(prompt, g, [&](const TokenEvent& ev) {
    EXPECT_EQ(ev.index, static_cast<std::int64_t>(rows.size()));
    ASSERT_EQ(static_cast<std::int64_t>(ev.logprobs.size()), V);
    rows.emplace_back(ev.logprobs.begin(), ev.logprobs.end());
  }, true);
  e.submit(make_prompt(3, 5), greedy_n(6));  // a neighbour in the batch
  e.run();
  const auto& out = e.result(0).tokens;
  ASSERT_EQ(rows.size(), out.size());
  std::vector<std::int64_t> ids = prompt;
  ids.insert(ids.end(), out.begin(), out.end());
  std::vector<float> l(ids.size() * static_cast<std::size_t>(V));
  m.logits(ids.data(), edl::nn::TokenLayout{1, static_cast<std::int64_t>(ids.size())}, l.data());
  for (std::size_t t = 0; t < out.size(); ++t) {
    const float* row = l.data() + (prompt.size() - 1 + t) * static_cast<std::size_t>(V);
    double mx = -INFINITY, s = 0;
    for (std::int64_t i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
    for (std::int64_t i = 0; i < V; ++i) s += std::exp(row[i] - mx);
    for (std::int64_t i = 0; i < V; ++i) EXPECT_NEAR(rows[t][i], row[i] - mx - std::log(s), 1e-4) << t << " " << i;
  }
}

// ------------------------------------------------------------------------------- on a mesh

namespace {

EngineOptions mesh_options(edl::MeshDims mesh, std::int64_t max_batch, std::int64_t chunk) {
  auto o = small_options(max_batch, chunk);
  o.mesh = mesh;
  return o;
}

struct EngineMesh {
  const char* name;
  edl::MeshDims dims;  // {dp, fsdp, ep, tp, sp}
};

class EngineMeshes : public ::testing::TestWithParam<EngineMesh> {};

}  // namespace

// The same waves of greedy and seeded requests as on one device, on a mesh: every request gets
// what generate() gives its prompt alone on one device, and the pools end empty.
TEST_P(EngineMeshes, RequestsGiveTheOneDeviceTokens) {
  std::vector<Job> jobs;
  const std::int64_t lens[] = {7, 3, 11, 5, 9, 2};
  const std::int64_t news[] = {6, 12, 4, 9, 1, 10};
  for (int j = 0; j < 6; ++j)
    jobs.push_back({make_prompt(lens[j], 40 + j), j % 2 ? sampled_n(news[j], 7 + j) : greedy_n(news[j])});
  Engine<> e(engine_model(), mesh_options(GetParam().dims, 3, 4));
  EXPECT_TRUE(e.on_mesh());
  run_and_compare(e, jobs, {1, 3, 2});
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineMeshes,
                         ::testing::Values(EngineMesh{"tp2", {1, 1, 1, 2, 1}}, EngineMesh{"sp2", {1, 1, 1, 1, 2}},
                                           EngineMesh{"dp2", {2, 1, 1, 1, 1}}, EngineMesh{"tp2_sp2", {1, 1, 1, 2, 2}},
                                           EngineMesh{"fsdp2_tp2", {1, 2, 1, 2, 1}}, EngineMesh{"ep2", {1, 1, 2, 1, 1}}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Engine, OnAMeshEachDeviceHoldsItsShareOfAPage) {
  const auto one = small_options(2, 4);
  Engine<> probe(engine_model(), one);
  // tp = 2 halves the kv heads of a device's page, sp = 2 its positions: a quarter of the
  // bytes, so the same per-device budget holds four times the pages.
  auto o = mesh_options({1, 1, 1, 2, 2}, 2, 4);
  o.paged.budget_bytes = 5 * probe.page_bytes();
  o.paged.utilization = 1.0;
  Engine<> e(engine_model(), o);
  EXPECT_EQ(e.page_bytes(), probe.page_bytes());
  EXPECT_EQ(e.num_pools(), 1);
  EXPECT_EQ(e.pages_per_pool(), 20);
  EXPECT_EQ(e.kv_pool_bytes(), 4 * 5 * probe.page_bytes());  // four devices, each its budget
  // dp = 2: a pool per group of slots, each on its own devices.
  Engine<> dp(engine_model(), mesh_options({2, 1, 1, 1, 1}, 4, 4));
  EXPECT_EQ(dp.num_pools(), 2);
  EXPECT_EQ(dp.num_pages(), 2 * dp.pages_per_pool());
}

TEST(Engine, OnAMeshATightPoolPreemptsWithinItsGroupAndStillGivesTheSameTokens) {
  // dp = 2: slots {0, 1} and {2, 3} draw on two pools of 7 pages of 4 tokens; four requests
  // of up to 16 tokens (4 pages each) cannot all grow, and a request only preempts requests
  // of its own pool.
  auto o = mesh_options({2, 1, 1, 1, 1}, 4, 4);
  Engine<> probe(engine_model(), o);
  o.paged.budget_bytes = 7 * probe.page_bytes();
  o.paged.utilization = 1.0;
  Engine<> e(engine_model(), o);
  ASSERT_EQ(e.pages_per_pool(), 7);
  std::vector<Job> jobs;
  for (int j = 0; j < 6; ++j) jobs.push_back({make_prompt(5, 50 + j), j % 2 ? sampled_n(12, 9) : greedy_n(12)});
  run_and_compare(e, jobs, {});
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_LE(e.stats().peak_pages, 14);
  EXPECT_EQ(e.result(0).preemptions, 0);  // the oldest request is never sent back
}

TEST(Engine, OnAMeshAPageSizeThatSpDoesNotDivideIsAnError) {
  auto o = mesh_options({1, 1, 1, 1, 2}, 2, 4);
  o.paged.page_size = 5;
  try {
    Engine<> e(engine_model(), o);
    FAIL() << "expected edl::Error";
  } catch (const edl::Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("page_size = 5 is not divisible by sp = 2"), std::string::npos) << msg;
  }
}

// A request's logits processor (the seeds' logits_processor in the engine): it sees the
// request's id and context, and its tokens are generate()'s with the same processor, greedy
// and sampled, with other requests running beside it.
TEST(Engine, LogitsProcessorPerRequestGivesGeneratesTokens) {
  const std::int64_t V = engine_config().vocab_size;
  // Bans the model's first choice at every step.
  const auto ban_next = [V](std::int64_t, std::span<const std::int64_t> ctx, std::span<float> scores) {
    ASSERT_EQ(static_cast<std::int64_t>(scores.size()), V);
    ASSERT_FALSE(ctx.empty());
    *std::max_element(scores.begin(), scores.end()) = -INFINITY;
  };
  std::vector<Job> jobs;
  for (int j = 0; j < 4; ++j) jobs.push_back({make_prompt(3 + 2 * j, 40 + j), j % 2 ? sampled_n(7, 9) : greedy_n(7)});
  Engine<> e(engine_model(), small_options(2, 4));
  std::vector<std::vector<std::int64_t>> seen_ids(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j)
    e.submit(jobs[j].prompt, jobs[j].g, {}, false,
             [&, j](std::int64_t id, std::span<const std::int64_t> ctx, std::span<float> scores) {
               seen_ids[j].push_back(id);
               ban_next(id, ctx, scores);
             });
  e.run();
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    GenerateOptions o;
    o.logits_processor = ban_next;
    const auto want = generate(engine_model(), {jobs[j].prompt}, jobs[j].g, o);
    EXPECT_EQ(e.result(static_cast<std::int64_t>(j)).tokens, want.tokens[0]) << j;
    EXPECT_EQ(seen_ids[j], std::vector<std::int64_t>(want.tokens[0].size(), static_cast<std::int64_t>(j))) << j;
    EXPECT_NE(want.tokens[0], reference(jobs[j].prompt, jobs[j].g).tokens[0]) << j;  // the ban mattered
  }
}

// ------------------------------------------------------------------------ 16-bit parameters

namespace {

/// Every request's tokens and logprob rows, one device or a mesh, for the same waves of
/// greedy and seeded requests.
template <class Pol>
std::pair<std::vector<std::vector<std::int64_t>>, std::vector<std::vector<float>>> serve_all(
    const LlamaForCausalLM<Pol>& m, const EngineOptions& o) {
  Engine<Pol> e(m, o);
  std::vector<std::vector<float>> rows;
  const std::int64_t lens[] = {7, 3, 11, 5};
  const std::int64_t news[] = {6, 9, 4, 7};
  for (int j = 0; j < 4; ++j) {
    const auto g = j % 2 ? sampled_n(news[j], 30 + j) : greedy_n(news[j]);
    e.submit(make_prompt(lens[j], 60 + j), g, [&](const TokenEvent& ev) {
      rows.emplace_back(ev.logprobs.begin(), ev.logprobs.end());
    }, true);
    if (j == 1) e.step();  // the last two join while the first two prefill or decode
  }
  e.run();
  std::vector<std::vector<std::int64_t>> tokens;
  for (int j = 0; j < 4; ++j) tokens.push_back(e.result(j).tokens);
  return {tokens, rows};
}

template <class Pol>
void sixteen_bit_parameters_serve_as_the_rounded_f32_model() {
  const auto h = edl::models::to_dtype<Pol>(engine_model());
  const auto r = edl::models::to_dtype<edl::DefaultPolicy>(h);
  for (const edl::MeshDims mesh : {edl::MeshDims{1, 1, 1, 1, 1}, edl::MeshDims{1, 1, 1, 2, 2}}) {
    const auto o = mesh_options(mesh, 3, 4);
    const auto got = serve_all(h, o), want = serve_all(r, o);
    EXPECT_EQ(got.first, want.first) << "tp " << mesh[3] << " sp " << mesh[4];
    EXPECT_EQ(got.second, want.second) << "tp " << mesh[3] << " sp " << mesh[4];
    EXPECT_FALSE(got.second.empty());
  }
}

}  // namespace

// `edl serve --dtype bf16|f16`: the engine on 16-bit parameters gives every request the tokens
// and logprobs, bit for bit, of the engine on the f32 model holding the rounded weights (the
// kernels widen 16-bit weights exactly and accumulate in f32), on one device and on a mesh.
TEST(Engine, Bf16ParametersServeAsTheRoundedF32Model) {
  sixteen_bit_parameters_serve_as_the_rounded_f32_model<edl::BF16ParamsPolicy>();
}
TEST(Engine, F16ParametersServeAsTheRoundedF32Model) {
  sixteen_bit_parameters_serve_as_the_rounded_f32_model<edl::F16ParamsPolicy>();
}

// ------------------------------------------------------------------------- int8 cache pages

// `edl serve --kv-cache int8`: on int8 pages every request gets the tokens generate() gives its
// prompt alone with the int8 cache (the same values and scales per token and kv head), however
// requests join, chunk and get preempted, on one device and on meshes; a page costs
// (D + 4) / (4 D) of an f32 one.
TEST(Engine, Int8CachePagesGiveTheInt8CachesTokens) {
  std::vector<Job> jobs;
  const std::int64_t lens[] = {7, 3, 11, 5, 9, 2};
  const std::int64_t news[] = {6, 12, 4, 9, 1, 10};
  for (int j = 0; j < 6; ++j)
    jobs.push_back({make_prompt(lens[j], 80 + j), j % 2 ? sampled_n(news[j], 17 + j) : greedy_n(news[j])});
  const std::int64_t D = engine_config().head_size();
  for (const edl::MeshDims mesh : {edl::MeshDims{1, 1, 1, 1, 1}, edl::MeshDims{1, 1, 1, 2, 2}, edl::MeshDims{2, 1, 1, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "dp " << mesh[0] << " tp " << mesh[3] << " sp " << mesh[4]);
    auto o = mesh_options(mesh, 3, 4);
    Engine<> f32(engine_model(), o);
    o.kv_cache = KVCacheDtype::int8;
    Engine<> e(engine_model(), o);
    EXPECT_EQ(e.page_bytes() * 4 * D, f32.page_bytes() * (D + 4));
    run_and_compare(e, jobs, {1, 3, 2}, CacheKind::int8);
  }
  // A pool of 5 pages for 3 slots: requests get preempted and recomputed, with the same tokens.
  auto o = small_options(3, 4);
  o.kv_cache = KVCacheDtype::int8;
  Engine<> probe(engine_model(), o);
  o.paged.budget_bytes = 5 * probe.page_bytes();
  o.paged.utilization = 1.0;
  Engine<> tight(engine_model(), o);
  run_and_compare(tight, jobs, {1, 3, 2}, CacheKind::int8);
  EXPECT_GT(tight.stats().preemptions, 0);
}
