// Llama on MPI ranks (models/llama/sharded.hpp, optim/sharded_optimizer.hpp over the MPI
// backend): logits, loss, gradients and five training steps on 2 and 4 ranks (1 or 2 devices
// per rank) equal, bit for bit, the simulated mesh of the same shape; on fsdp over every rank
// a rank holds (by the library's accounting and by its resident set) about 1/ranks of the
// one-device model's parameters, gradients and optimizer state, drawn straight into its
// blocks and equal to the one-device init; reads and writes only its own blocks of a HF folder.
#include <gtest/gtest.h>

#include <cmath>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <random>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include <edl/core/process_memory.hpp>
#include <edl/mesh/all.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>
#include <edl/models/llama/sharded_save.hpp>
#include <edl/models/llama/sharded_sequence_classification.hpp>
#include <edl/optim/sharded_optimizer.hpp>

#include "../support/same_params.hpp"
#include "../support/small_llama.hpp"
#include "../support/temp_dir.hpp"
#include "session.hpp"

namespace edl {
namespace {

using test::g_session;
using Dims = std::array<std::int64_t, 4>;

models::LlamaConfig config() { return test_support::small_llama_config(); }

std::vector<std::int64_t> tokens(std::int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<std::int64_t>(g() % 64u);
  return t;
}

std::vector<Dims> meshes_for(std::int64_t devices) {
  if (devices == 2) return {{2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2}};
  if (devices == 4) return {{2, 1, 2, 1}, {1, 2, 2, 1}, {1, 4, 1, 1}, {2, 1, 1, 2}};
  return {};
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> logits, grads, params;
};

// Logits, loss and gradients, then five AdamW steps, on `mesh`.
Outcome run(const models::LlamaForCausalLM<>& model, const DefaultMesh& mesh) {
  constexpr std::int64_t B = 4, S = 8;
  Outcome r;
  models::ShardedLlama<> sm(model, mesh);
  const auto ids = tokens(B * S, 1);
  const auto lg = sm.logits(ids.data(), B, S);
  r.logits.assign(lg.begin(), lg.end());
  sm.zero_grad();
  r.losses.push_back(sm.loss_and_grads(ids.data(), nullptr, B, S).loss);
  for (const auto& [name, g] : sm.gather_grads()) r.grads.insert(r.grads.end(), g.begin(), g.end());
  optim::OptimizerOptions o;
  o.weight_decay = 0.1;
  optim::ShardedOptimizer<models::ShardedLlama<>> opt(o, sm);
  for (unsigned step = 0; step < 5; ++step) {
    if (step > 0) {
      const auto t = tokens(B * S, 10 + step);
      sm.zero_grad();
      r.losses.push_back(sm.loss_and_grads(t.data(), nullptr, B, S).loss);
    }
    opt.clip_by_global_norm(sm, 1.0);
    opt.step(sm, 1e-2);
  }
  const auto m = sm.gather_model();
  auto& mm = const_cast<models::LlamaForCausalLM<>&>(m);
  mm.visit_params("", [&](std::string_view, auto& p) { r.params.insert(r.params.end(), p.data(), p.data() + p.numel()); });
  // The gathered optimizer state is complete on every rank (a checkpoint can be written from it).
  const optim::Optimizer full = opt.gather(sm);
  EXPECT_GT(full.state_bytes(), 0);
  EXPECT_EQ(full.step_count(), 5);
  return r;
}

class MpiLlama : public ::testing::TestWithParam<int> {};

// The MPI run of `model` on each of `meshes` (with `local` devices per rank) equals the
// simulated mesh's: logits, gradients, five training steps and the weights, bit for bit.
void expect_mpi_equals_simulated(const models::LlamaForCausalLM<>& model, const std::vector<Dims>& meshes, int local) {
  for (const Dims& dims : meshes) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const Outcome want = run(model, create_mesh(dims));
    auto real = create_mesh(dims);
    mpi::attach(real, *g_session, local);
    const Outcome got = run(model, real);
    EXPECT_EQ(got.losses, want.losses);  // five training steps, exactly
    ASSERT_EQ(got.logits.size(), want.logits.size());
    EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)), 0);
    ASSERT_EQ(got.grads.size(), want.grads.size());
    EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), got.grads.size() * sizeof(float)), 0);
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), got.params.size() * sizeof(float)), 0);
  }
}

TEST_P(MpiLlama, EqualsSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaForCausalLM<> model(config());
  model.init(Key::from_seed(3), 0.2f);
  expect_mpi_equals_simulated(model, meshes_for(devices), local);
}

// Dimensions the mesh does not divide: a vocabulary of 67 over tp = 2, hidden 42 over
// fsdp = 4 (blocks of 11, 11, 11 and 9).
TEST_P(MpiLlama, UnevenDimensionsEqualSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaConfig c = config();
  c.vocab_size = 67;
  c.hidden_size = 42;
  c.head_dim = 8;  // 4 heads of 8 (explicit, as Qwen3 configs): q_proj is [32, 42]
  c.validate();
  models::LlamaForCausalLM<> model(c);
  model.init(Key::from_seed(4), 0.2f);
  std::vector<Dims> meshes;
  if (devices == 2) meshes = {{1, 1, 2, 1}};
  if (devices == 4) meshes = {{1, 4, 1, 1}, {1, 2, 2, 1}};
  expect_mpi_equals_simulated(model, meshes, local);
}

// inputs_embeds with a padding mask: logits, loss, gradients and d loss / d inputs_embeds (each
// process's rows summed over the processes, so every rank holds all of it) bit for bit.
TEST_P(MpiLlama, InputsEmbedsEqualSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaForCausalLM<> model(config());
  model.init(Key::from_seed(5), 0.2f);
  constexpr std::int64_t B = 4, S = 8;
  const std::int64_t H = model.config().hidden_size;
  const auto labels = tokens(B * S, 7);
  std::vector<float> embeds(static_cast<std::size_t>(B * S * H));
  for (std::size_t i = 0; i < embeds.size(); ++i) embeds[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
  std::vector<std::int64_t> mask(static_cast<std::size_t>(B * S), 1);
  mask[0] = 0;
  const auto run_embeds = [&](const DefaultMesh& mesh) {
    models::ShardedLlama<> sm(model, mesh);
    nn::TokenLayout lay{B, S};
    lay.attention_mask = mask.data();
    lay.inputs_embeds = embeds.data();
    Outcome r;
    const auto lg = sm.logits(nullptr, lay);
    r.logits.assign(lg.begin(), lg.end());
    std::vector<float> d(embeds.size(), 0.0f);
    lay.inputs_embeds_grad = d.data();
    r.losses.push_back(sm.loss_and_grads(nullptr, lay, labels.data()).loss);
    for (const auto& [name, g] : sm.gather_grads()) r.grads.insert(r.grads.end(), g.begin(), g.end());
    r.params = d;  // d loss / d inputs_embeds
    return r;
  };
  for (const Dims& dims : meshes_for(devices)) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const Outcome want = run_embeds(create_mesh(dims));
    auto real = create_mesh(dims);
    mpi::attach(real, *g_session, local);
    const Outcome got = run_embeds(real);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.grads, want.grads);
    EXPECT_EQ(got.params, want.params);
  }
}

// The sequence classifier (models/llama/sharded_sequence_classification.hpp): its pooled
// logits, single-label loss and every gradient (the replicated score head's included) on MPI
// ranks equal the simulated mesh's, bit for bit.
TEST_P(MpiLlama, SequenceClassifierEqualsSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  models::LlamaConfig c = config();
  c.num_labels = 3;
  c.pad_token_id = 0;
  models::LlamaForSequenceClassification<> model(c);
  model.init(Key::from_seed(4), 0.2f);
  constexpr std::int64_t B = 4, S = 8;
  auto ids = tokens(B * S, 6);
  for (std::int64_t b = 0; b < B; ++b)  // padding: the pooled positions fall in every sp block
    for (std::int64_t s = 1 + (b * 5 + 2) % S; s < S; ++s) ids[static_cast<std::size_t>(b * S + s)] = 0;
  const std::vector<std::int64_t> labels = {2, 0, -100, 1};
  const auto run_classifier = [&](const DefaultMesh& mesh, std::vector<float>& logits, std::vector<float>& grads) {
    auto sc = models::shard_model(model, mesh);
    logits.assign(static_cast<std::size_t>(B * c.num_labels), 0.0f);
    sc.logits(ids.data(), {B, S}, logits.data());
    const double loss = sc.loss_and_grads(ids.data(), {B, S}, labels.data()).loss;
    model.visit_params("", [&](std::string_view path, auto&) {
      const auto g = sc.gather_grad(std::string(path));
      grads.insert(grads.end(), g.begin(), g.end());
    });
    return loss;
  };
  for (const Dims& dims : meshes_for(devices)) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    std::vector<float> want_logits, want_grads, got_logits, got_grads;
    const double want = run_classifier(create_mesh(dims), want_logits, want_grads);
    auto real = create_mesh(dims);
    mpi::attach(real, *g_session, local);
    const double got = run_classifier(real, got_logits, got_grads);
    EXPECT_EQ(got, want);
    EXPECT_TRUE(got_logits == want_logits);
    ASSERT_EQ(got_grads.size(), want_grads.size());
    EXPECT_EQ(std::memcmp(got_grads.data(), want_grads.data(), got_grads.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(LocalDevices, MpiLlama, ::testing::Values(1, 2));

// A model whose state (13.6 M parameters: 218 MB of weights, gradients and AdamW moments)
// dwarfs the process's own noise in resident memory.
models::LlamaConfig wide_config() {
  models::LlamaConfig c = config();
  c.vocab_size = 8192;
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.validate();
  return c;
}

struct Held {
  std::int64_t accounted = 0;  // the library's accounting: blocks, gradients, optimizer state
  std::int64_t resident = 0;   // growth of the process's resident set (VmRSS)
};

// What this process holds after one AdamW step of a model drawn straight into its shards.
Held held_after_a_step(const DefaultMesh& mesh) {
  constexpr std::int64_t B = 4, S = 8;
  malloc_trim(0);
  const std::int64_t before = resident_bytes();
  models::ShardedLlama<> sm(wide_config(), Key::from_seed(11), mesh);
  optim::ShardedOptimizer<models::ShardedLlama<>> opt({}, sm);
  std::vector<std::int64_t> ids(B * S);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 977) % 8192);
  sm.zero_grad();
  sm.loss_and_grads(ids.data(), nullptr, B, S);
  opt.step(sm, 1e-2);
  Held h;
  for (std::int64_t d = 0; d < mesh.size(); ++d)
    if (mesh.backend().is_local(d)) h.accounted += mesh.memory().live(d) + opt.state_bytes(d);
  malloc_trim(0);  // the step's freed transients go back to the system
  h.resident = resident_bytes() - before;
  return h;
}

TEST(MpiLlamaMemory, EachRankStoresOnlyItsOwnDevicesBlocks) {
  const std::int64_t ranks = g_session->size();
  const Dims dims = {1, ranks, 1, 1};  // fsdp over every rank
  auto real = create_mesh(dims);
  mpi::attach(real, *g_session, 1);
  // glibc raises its mmap threshold after freeing a large block, and blocks below it then
  // live in per-thread arenas that keep freed memory resident: a fixed threshold makes the
  // resident set follow what is held (MALLOC_MMAP_THRESHOLD_ or MALLOC_ARENA_MAX=1 do the
  // same from the environment; docs/distributed.md).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const Held mine = held_after_a_step(real);
  const Held whole = held_after_a_step(create_mesh({1, 1, 1, 1}));  // one process, one device
  // A quarter on 4 ranks (the norms are replicated: a little more), never the whole model,
  // by the library's count and by the resident set alike.
  const double share = 1.0 / static_cast<double>(ranks) + 0.05;
  EXPECT_LE(static_cast<double>(mine.accounted), share * static_cast<double>(whole.accounted))
      << "rank " << g_session->rank() << " holds " << mine.accounted << " of " << whole.accounted << " bytes";
  EXPECT_LE(static_cast<double>(mine.resident), share * static_cast<double>(whole.resident))
      << "rank " << g_session->rank() << " grew by " << mine.resident << " resident bytes, one device by "
      << whole.resident;
  EXPECT_GT(whole.resident, whole.accounted / 2);  // the resident measure sees the state at all
  if (g_session->rank() == 0)
    std::printf("  per rank: %lld of %lld bytes accounted, %lld of %lld resident\n",
                static_cast<long long>(mine.accounted), static_cast<long long>(whole.accounted),
                static_cast<long long>(mine.resident), static_cast<long long>(whole.resident));

  // Other ranks' blocks are not stored here, and the model drawn into its shards is the
  // one-device init, bit for bit.
  models::ShardedLlama<> sm(config(), Key::from_seed(11), real);
  for (const auto& name : sm.names())
    for (std::int64_t d = 0; d < real.size(); ++d) {
      EXPECT_EQ(sm.param(name).has_block(d), real.backend().is_local(d)) << name;
      if (!real.backend().is_local(d)) {
        EXPECT_EQ(sm.param(name).local(d).size(), 0u) << name;
      }
    }
  models::LlamaForCausalLM<> one(config());
  one.init(Key::from_seed(11));
  auto back = sm.gather_model();
  test_support::expect_same_params(one, back, "gathered");
}

TEST(MpiLlamaMemory, FromPretrainedReadsOnlyEachRanksBlocks) {
  const std::int64_t ranks = g_session->size();
  models::LlamaForCausalLM<> one(wide_config());
  one.init(Key::from_seed(12));
  test_support::TempDir dir("mpi_sharded_pretrained_rank" + std::to_string(g_session->rank()));
  models::save_pretrained(dir.p, one);
  auto real = create_mesh({1, ranks, 1, 1});
  mpi::attach(real, *g_session, 1);
  models::ShardedLoadStats st;
  auto sm = models::from_pretrained_sharded<>(dir.p, real, llama_partition_rules(), &st);
  const std::int64_t file_bytes = one.param_count() * static_cast<std::int64_t>(sizeof(float));
  EXPECT_LE(static_cast<double>(st.parameter_bytes_read),
            (1.0 / static_cast<double>(ranks) + 0.05) * static_cast<double>(file_bytes));
  EXPECT_EQ(st.blocks_read, static_cast<std::int64_t>(sm.names().size()));  // one device per rank
  auto back = sm.gather_model();
  test_support::expect_same_params(one, back, "gathered");
}

TEST(MpiLlamaMemory, SavePretrainedWritesOnlyEachRanksBlocks) {
  // A shared folder: every rank writes its blocks into the same files.
  long long pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("edl_mpi_sharded_save_" + std::to_string(pid));
  const std::int64_t ranks = g_session->size();
  auto real = create_mesh({1, ranks, 1, 1});
  mpi::attach(real, *g_session, 1);
  models::ShardedLlama<> sm(wide_config(), Key::from_seed(13), real);
  const models::ShardedSaveStats st = models::save_pretrained_sharded(dir, sm);
  models::LlamaForCausalLM<> one(wide_config());
  one.init(Key::from_seed(13));
  const std::int64_t file_bytes = one.param_count() * static_cast<std::int64_t>(sizeof(float));
  EXPECT_LE(static_cast<double>(st.bytes_written), (1.0 / static_cast<double>(ranks) + 0.05) * static_cast<double>(file_bytes));
  // Together the ranks wrote every byte once: the file a one-device save writes.
  const auto each = ProcessGroup(real).each(st.bytes_written);
  std::int64_t sum = 0;
  for (auto b : each) sum += b;
  EXPECT_EQ(sum, file_bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_session->rank() == 0) {
    test_support::TempDir want("mpi_sharded_save_want");
    models::save_pretrained(want.p, one);
    for (const char* f : {"model.safetensors", "config.json"}) {
      std::ifstream a(want.p / f, std::ios::binary), b(dir / f, std::ios::binary);
      EXPECT_TRUE(std::string(std::istreambuf_iterator<char>(a), {}) == std::string(std::istreambuf_iterator<char>(b), {}))
          << f;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_session->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace edl
