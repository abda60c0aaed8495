// Generation on MPI ranks (generate/sharded_decoder.hpp over the MPI backend): prefill and
// decode logits on 2 and 4 ranks (1 or 2 devices per rank) equal the simulated mesh of the same
// shape, every rank holds the same logits, and generate() gives the same tokens.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <edl/generate/sharded_decoder.hpp>
#include <edl/generate/sharded_generate.hpp>
#include <edl/mesh/all.hpp>
#include <edl/models/llama/llama.hpp>

#include "../support/small_llama.hpp"
#include "session.hpp"

namespace edl {
namespace {

using test::g_session;
using Dims = std::array<std::int64_t, 4>;

models::LlamaConfig config() { return test_support::small_llama_config(61); }

std::vector<Dims> meshes_for(std::int64_t devices) {
  if (devices == 2) return {{1, 1, 2, 1}, {1, 1, 1, 2}, {2, 1, 1, 1}};
  if (devices == 4) return {{1, 1, 2, 2}, {2, 1, 2, 1}, {1, 2, 1, 2}};
  return {};
}

// Prefill of two left-padded prompts (every position's logits), then 6 greedy decode steps.
std::vector<float> run(const models::LlamaForCausalLM<>& model, const DefaultMesh& mesh) {
  constexpr std::int64_t B = 2, S = 5, steps = 6;
  const std::int64_t V = model.config().vocab_size;
  const std::vector<std::int64_t> ids = {3, 9, 27, 14, 5, 0, 0, 44, 8, 30}, mask = {1, 1, 1, 1, 1, 0, 0, 1, 1, 1};
  generate::ShardedDecoder<> dec(model, mesh, B, S + steps);
  std::vector<float> out(static_cast<std::size_t>(B * S * V)), last(static_cast<std::size_t>(B * V));
  dec.prefill(ids.data(), S, mask.data(), last.data(), out.data());
  std::vector<std::int64_t> next(B);
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::int64_t b = 0; b < B; ++b) next[static_cast<std::size_t>(b)] = generate::argmax(last.data() + b * V, V);
    dec.decode(next.data(), last.data());
    out.insert(out.end(), last.begin(), last.end());
  }
  return out;
}

class MpiGenerate : public ::testing::TestWithParam<int> {};

TEST_P(MpiGenerate, EqualsSimulatedMesh) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaForCausalLM<> model(config());
  model.init(Key::from_seed(5), 0.3f);
  generate::GenerationConfig g;
  g.max_new_tokens = 10;
  const std::vector<std::vector<std::int64_t>> prompts = {{1, 2, 3, 4}, {7, 8}};
  const auto want_tokens = generate::generate(model, prompts, g).tokens;
  generate::GenerationConfig beams = g;  // beam search: each rank reorders its devices' caches
  beams.max_new_tokens = 6;
  beams.num_beams = 3;
  beams.num_return_sequences = 2;
  const auto want_beams = generate::generate(model, prompts, beams).tokens;
  for (const Dims& dims : meshes_for(devices)) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const auto want = run(model, create_mesh(dims));
    auto real = create_mesh(dims);
    mpi::attach(real, *g_session, local);
    const auto got = run(model, real);
    ASSERT_EQ(got.size(), want.size());
    double err = 0;
    for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
    EXPECT_LT(err, 1e-5);
    // Every rank holds the same logits (so every rank samples the same tokens).
    for (int k = 0; k < g_session->size(); ++k) {  // rank k's logits, sent to every rank (x + 0 = x)
      std::vector<float> theirs(got.size(), 0.0f);
      if (g_session->rank() == k) theirs = got;
      real.backend().sum_over_processes(theirs.data(), theirs.size(), DType::f32);
      ASSERT_EQ(std::memcmp(theirs.data(), got.data(), got.size() * sizeof(float)), 0) << "rank " << k << " differs";
    }
    EXPECT_EQ(generate::generate(model, real, prompts, g).tokens, want_tokens);
    EXPECT_EQ(generate::generate(model, real, prompts, beams).tokens, want_beams);
  }
}
INSTANTIATE_TEST_SUITE_P(LocalDevices, MpiGenerate, ::testing::Values(1, 2));

}  // namespace
}  // namespace edl
