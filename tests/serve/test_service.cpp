// tests/serve/test_service.cpp: the engine on its own thread answers each ticket exactly as
// generate() answers its prompt alone; cancellation, a full queue, engine errors and shutdown
// end tickets cleanly and give every slot back.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/generate/generate.hpp>
#include <edl/serve/service.hpp>
#include "generate/small_llama.hpp"

using namespace edl::serve;
using edl::generate::GenerationConfig;
using edl::models::LlamaForCausalLM;

namespace {

const LlamaForCausalLM<>& model() {
  static const LlamaForCausalLM<>* m = [] {
    auto* p = new LlamaForCausalLM<>(edl::generate::test_support::small_llama(40, 64, "no_eos"));
    p->init(edl::Key::from_seed(5), 0.3f);
    return p;
  }();
  return *m;
}

ServiceOptions options(std::int64_t batch, std::int64_t queue) {
  ServiceOptions o;
  o.engine.max_batch = batch;
  o.engine.prefill_chunk = 4;
  o.engine.paged.page_size = 4;
  o.engine.paged.budget_bytes = 1 << 20;
  o.max_queue = queue;
  return o;
}

GenerationConfig config(std::int64_t n, bool sample, std::uint64_t seed) {
  GenerationConfig g;
  g.max_new_tokens = n;
  g.do_sample = sample;
  g.temperature = 0.8f;
  g.top_k = 0;
  g.seed = seed;
  return g;
}

struct Answer {
  std::vector<std::vector<std::int64_t>> tokens;
  std::vector<std::string> finish;
  std::vector<std::string> errors;
  std::vector<std::vector<float>> logprobs;
};

/// Collects a ticket's events until every choice finished (or failed).
Answer drain(Ticket& t) {
  Answer a;
  const auto n = static_cast<std::size_t>(t.choices());
  a.tokens.resize(n), a.finish.resize(n), a.errors.resize(n), a.logprobs.resize(n);
  std::size_t open = n;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (open > 0 && std::chrono::steady_clock::now() < until) {
    for (const auto& e : t.wait(std::chrono::milliseconds(100))) {
      const auto c = static_cast<std::size_t>(e.choice);
      if (e.kind == ChoiceEvent::Kind::token) {
        a.tokens[c].push_back(e.token);
        a.logprobs[c].push_back(e.logprob);
        EXPECT_TRUE(e.top.empty() || e.top.front().second >= e.logprob);
      } else if (e.kind == ChoiceEvent::Kind::finished) {
        a.finish[c] = e.finish_reason, --open;
      } else if (e.kind == ChoiceEvent::Kind::error) {
        a.errors[c] = e.error, --open;
      }
    }
  }
  EXPECT_EQ(open, 0u) << "the ticket did not finish";
  return a;
}

std::vector<std::int64_t> prompt(std::int64_t len, std::int64_t salt) {
  std::vector<std::int64_t> p;
  for (std::int64_t i = 0; i < len; ++i) p.push_back((5 * i + 11 * salt + 1) % 40);
  return p;
}

}  // namespace

TEST(Service, ConcurrentTicketsEqualGenerateAlone) {
  Service<> s(model(), options(3, 8));
  // Four tickets from four threads, one with three sampled choices (seeds 7, 8, 9).
  std::vector<std::shared_ptr<Ticket>> tickets(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      std::vector<GenerationConfig> cs;
      if (i == 2) cs = {config(9, true, 7), config(9, true, 8), config(9, true, 9)};
      else cs = {config(6 + i, i == 3, 100)};
      tickets[static_cast<std::size_t>(i)] = s.submit(prompt(5 + i, i), cs, i == 1 ? 3 : -1);
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < 4; ++i) {
    const auto a = drain(*tickets[static_cast<std::size_t>(i)]);
    for (int c = 0; c < tickets[static_cast<std::size_t>(i)]->choices(); ++c) {
      const GenerationConfig g = i == 2 ? config(9, true, 7 + static_cast<std::uint64_t>(c)) : config(6 + i, i == 3, 100);
      const auto want = edl::generate::generate(model(), {prompt(5 + i, i)}, g);
      EXPECT_EQ(a.tokens[static_cast<std::size_t>(c)], want.tokens[0]) << "ticket " << i << " choice " << c;
      EXPECT_EQ(a.finish[static_cast<std::size_t>(c)], "length");
    }
  }
  EXPECT_EQ(s.in_flight(), 0);
  EXPECT_GT(s.metrics().generation_tokens.load(), 0);
  EXPECT_EQ(s.metrics().time_to_first_token.count(), 6);  // one per choice
}

TEST(Service, CancelledTicketEndsAndFreesItsSlot) {
  Service<> s(model(), options(1, 4));
  auto long_one = s.submit(prompt(6, 1), {config(50, false, 0)});
  auto next = s.submit(prompt(4, 2), {config(3, false, 0)});  // waits for the only slot
  // The first token, then the client leaves. (On a loaded machine this thread may wake only
  // after all 50 tokens and the end came in the same batch: then there is nothing to cancel.)
  std::size_t before = 0;
  bool ended = false;
  for (bool got = false; !got;)
    for (const auto& e : long_one->wait(std::chrono::milliseconds(100))) {
      got = got || e.kind == ChoiceEvent::Kind::token;
      before += e.kind == ChoiceEvent::Kind::token;
      ended = ended || e.kind == ChoiceEvent::Kind::finished;
    }
  long_one->cancel();
  if (!ended) {
    const auto a = drain(*long_one);
    EXPECT_EQ(a.finish[0], "cancelled");
    EXPECT_LT(before + a.tokens[0].size(), 50u);
  } else {
    EXPECT_EQ(before, 50u);
  }
  const auto b = drain(*next);
  EXPECT_EQ(b.tokens[0], edl::generate::generate(model(), {prompt(4, 2)}, config(3, false, 0)).tokens[0]);
  EXPECT_EQ(s.in_flight(), 0);
  EXPECT_EQ(s.metrics().kv_pages_used.load(), 0);
}

TEST(Service, FullQueueIsBusyAndEngineErrorsEndOnlyTheirTicket) {
  Service<> s(model(), options(1, 1));
  auto a = s.submit(prompt(6, 1), {config(40, false, 0)});
  auto b = s.submit(prompt(6, 2), {config(40, false, 0)});
  try {
    s.submit(prompt(3, 3), {config(2, false, 0)});
    FAIL() << "expected Busy";
  } catch (const Busy& e) {
    EXPECT_FALSE(e.shutting_down);
  }
  a->cancel();
  b->cancel();
  drain(*a);
  drain(*b);
  auto bad = s.submit({1, 2, 99}, {config(2, false, 0)});  // 99 is outside the vocabulary of 40
  const auto r = drain(*bad);
  EXPECT_NE(r.errors[0].find("outside the vocabulary"), std::string::npos) << r.errors[0];
  auto good = s.submit(prompt(3, 4), {config(2, false, 0)});
  EXPECT_EQ(drain(*good).tokens[0].size(), 2u);
  EXPECT_EQ(s.in_flight(), 0);
}

TEST(Service, ShutdownFinishesOrCancelsInFlightTicketsAndRefusesNewOnes) {
  auto s = std::make_unique<Service<>>(model(), options(2, 4));
  auto t = s->submit(prompt(5, 1), {config(60, false, 0)});
  auto u = s->submit(prompt(5, 2), {config(2, false, 0)});
  s->shutdown(std::chrono::milliseconds(0));  // no grace: cancelled at once
  EXPECT_THROW(s->submit(prompt(3, 3), {config(2, false, 0)}), Busy);
  const auto a = drain(*t);
  EXPECT_TRUE(a.finish[0] == "cancelled" || a.finish[0] == "length") << a.finish[0];
  drain(*u);
  EXPECT_EQ(s->in_flight(), 0);
  s.reset();
}
