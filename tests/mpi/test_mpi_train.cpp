// The trainer on MPI ranks (train/trainer.hpp with a MeshFactory that attaches its mesh to the
// ranks; train/checkpoint.hpp's commit protocol): every rank gets, bit for bit, the losses of
// the simulated mesh of the same shape; the checkpoint the ranks write together loads on one
// process with the weights and optimizer state of the simulated run's checkpoint (same
// logits, same slots) and a one-process resume continues with the same losses; a save that
// fails on one rank commits nothing and leaves the previous checkpoint the newest.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <edl/models/llama/pretrained.hpp>
#include <edl/train/all.hpp>

#include "../support/small_llama.hpp"
#include "session.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using test::g_session;
using Dims = std::array<std::int64_t, 4>;

models::LlamaForCausalLM<> make_model() {
  models::LlamaForCausalLM<> m(test_support::small_llama_config());
  m.init(Key::from_seed(7));
  return m;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TokenDataset data() {
  TokenDataset d;
  for (std::uint32_t i = 0; i < 12; ++i) {
    std::vector<std::int32_t> s(16);
    for (std::size_t j = 0; j < s.size(); ++j)
      s[j] = static_cast<std::int32_t>(random_bits_at(fold_in(Key::from_seed(5), i), j) % 64u);
    d.add(std::span<const std::int32_t>(s));
  }
  return d;
}

TrainingArguments args(const fs::path& dir, const Dims& dims) {
  TrainingArguments a;
  a.save_directory = dir.string();
  a.learning_rate = 3e-3;
  a.weight_decay = 0.1;
  a.clip_grad = 1.0;
  a.total_batch_size = 4;
  a.gradient_accumulation_steps = 2;
  a.max_sequence_length = 16;
  a.max_training_steps = 6;
  a.save_steps = 3;
  a.log_steps = 1;
  a.resume_if_possible = false;
  a.progress = false;
  a.write_report = false;
  a.peak_gflops = 100;  // skip the GEMM measurement
  a.sharding_axis_dims = {dims.begin(), dims.end()};
  return a;
}

// The mesh spread over every rank, one device per rank.
MeshFactory on_ranks() {
  return [](const MeshDims& dims) {
    DefaultMesh m = create_mesh(dims);
    mpi::attach(m, *g_session, static_cast<int>(m.size() / g_session->size()));
    return m;
  };
}

// A folder every rank names the same (rank 0's process id).
fs::path shared_dir(const std::string& name) {
  long long pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return fs::temp_directory_path() / ("edl_mpitr_" + name + "_" + std::to_string(pid));
}
fs::path own_dir(const std::string& name) {
  return fs::temp_directory_path() / ("edl_mpitr_" + name + "_" + std::to_string(::getpid()));
}

std::vector<double> train_losses(Trainer& t) {
  std::vector<double> losses;
  TrainerCallback cb;
  cb.on_step_end = [&](Trainer&, const StepMetrics& m) {
    losses.push_back(m.loss);
    return true;
  };
  t.callbacks.push_back(cb);
  t.train();
  return losses;
}

std::map<std::string, std::vector<float>> slots(const optim::Optimizer& o) {
  std::map<std::string, std::vector<float>> s;
  o.visit_state([&](const std::string& p, const std::string& slot, const std::vector<float>& v) { s[p + "." + slot] = v; });
  return s;
}

std::vector<float> logits_of(const fs::path& checkpoint) {
  auto m = models::from_pretrained(checkpoint);
  std::vector<std::int64_t> ids(16);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % 64);
  std::vector<float> out(ids.size() * 64);
  m.logits(ids.data(), nn::TokenLayout{1, 16}, out.data());
  return out;
}

std::vector<Dims> meshes() {
  if (g_session->size() == 2) return {{1, 2, 1, 1}, {1, 1, 2, 1}};
  if (g_session->size() == 4) return {{1, 2, 2, 1}, {2, 1, 1, 2}};
  return {};
}

TEST(MpiTrainer, TrainsAndCheckpointsLikeTheSimulatedMesh) {
  for (const Dims& dims : meshes()) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const fs::path sim = own_dir("sim"), real = shared_dir("real");
    fs::remove_all(sim);
    std::vector<double> want, got;
    {
      Trainer t(args(sim, dims), make_model(), std::nullopt, data());
      want = train_losses(t);
    }
    {
      Trainer t(args(real, dims), make_model(), std::nullopt, data(), std::nullopt, on_ranks());
      EXPECT_EQ(t.processes().size(), g_session->size());
      EXPECT_EQ(t.processes().rank(), g_session->rank());
      got = train_losses(t);
    }
    EXPECT_EQ(got, want);  // on every rank, exactly
    // async_checkpointing: the ranks write their blocks in the background, agreeing over a
    // communicator of their own while the next steps' collectives run; the same files.
    const fs::path async = shared_dir("async");
    {
      TrainingArguments a = args(async, dims);
      a.async_checkpointing = true;
      Trainer t(a, make_model(), std::nullopt, data(), std::nullopt, on_ranks());
      EXPECT_EQ(train_losses(t), want);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_session->rank() == 0) {
      for (const char* step : {"checkpoint-3", "checkpoint-6"})
        for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"})
          EXPECT_TRUE(read_bytes(async / step / f) == read_bytes(sim / step / f)) << step << " " << f;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_session->rank() == 0) fs::remove_all(async);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_session->rank() == 0) {
      // Rank 0 alone wrote metrics.jsonl: one line per step.
      std::ifstream in(real / "metrics.jsonl");
      std::string line;
      int lines = 0;
      while (std::getline(in, line)) ++lines;
      EXPECT_EQ(lines, 6);
      for (const char* step : {"checkpoint-3", "checkpoint-6"}) {
        SCOPED_TRACE(step);
        const fs::path a = sim / step, b = real / step;
        // Each rank wrote its blocks into the files one process writes: the same bytes.
        for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"})
          EXPECT_TRUE(read_bytes(b / f) == read_bytes(a / f)) << f;
        // One process loads what the ranks wrote: the simulated run's weights and optimizer state.
        const auto la = logits_of(a), lb = logits_of(b);
        ASSERT_EQ(la.size(), lb.size());
        EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
        auto ma = make_model(), mb = make_model();
        optim::Optimizer oa, ob;
        const TrainState sa = load_state(a.string(), ma, oa), sb = load_state(b.string(), mb, ob);
        EXPECT_EQ(sb.step, sa.step);
        EXPECT_EQ(sb.optimizer_step_count, sa.optimizer_step_count);
        EXPECT_EQ(slots(ob), slots(oa));
      }
      // A one-process resume (simulated mesh of the same shape) continues with the same losses.
      const fs::path resumed = own_dir("resumed");
      fs::remove_all(resumed);
      Trainer t(args(resumed, dims), make_model(), std::nullopt, data());
      t.resume_from((real / "checkpoint-3").string());
      const auto rest = train_losses(t);
      EXPECT_EQ(rest, std::vector<double>(want.begin() + 3, want.end()));
      fs::remove_all(resumed);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_session->rank() == 0) fs::remove_all(real);
    fs::remove_all(sim);
  }
}

TEST(MpiTrainer, ResumeReadsOnlyEachRanksBlocks) {
  // A one-process checkpoint loads into the ranks' blocks (train/sharded_load.hpp): each rank
  // reads the blocks of its own devices, the gathered state is the checkpoint's bit for bit,
  // and a resume on the ranks continues with the uninterrupted run's losses.
  for (const Dims& dims : meshes()) {
    SCOPED_TRACE(create_mesh(dims).shape().axes_str());
    const fs::path sim = own_dir("sim_blocks"), resumed = shared_dir("resumed_blocks");
    fs::remove_all(sim);
    std::vector<double> want;
    {
      Trainer t(args(sim, dims), make_model(), std::nullopt, data());
      want = train_losses(t);
    }
    const std::string ck = (sim / "checkpoint-3").string();
    DefaultMesh mesh = on_ranks()(mesh_dims_without_ep(dims));
    models::ShardedLlama<> sm(make_model(), mesh);
    optim::ShardedOptimizer<models::ShardedLlama<>> so({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
    ShardedLoadStats st;
    load_sharded_state(ck, sm, so, &st);
    std::int64_t own = 0, whole = 0;
    for (const auto& n : sm.names()) {
      const ShardLayout& l = sm.param(n).layout();
      std::int64_t numel = 1;
      for (auto d : l.global_shape()) numel *= d;
      whole += numel * 4;
      for (std::int64_t d = 0; d < mesh.size(); ++d)
        if (mesh.backend().is_local(d)) own += l.local_elements(d) * 4;
    }
    EXPECT_EQ(st.parameter_bytes_read, own);
    EXPECT_LT(st.parameter_bytes_read, whole);
    auto loaded = sm.gather_model();
    auto want_model = models::from_pretrained(ck);
    std::map<std::string, std::vector<float>> a, b;
    loaded.visit_params("", [&](std::string_view n, auto& p) { a[std::string(n)].assign(p.data(), p.data() + p.numel()); });
    want_model.visit_params("", [&](std::string_view n, auto& p) { b[std::string(n)].assign(p.data(), p.data() + p.numel()); });
    EXPECT_EQ(a, b);
    auto m1 = make_model();
    optim::Optimizer o1;
    load_state(ck, m1, o1);
    EXPECT_EQ(slots(so.gather(sm)), slots(o1));
    {
      Trainer t(args(resumed, dims), make_model(), std::nullopt, data(), std::nullopt, on_ranks());
      t.resume_from(ck);
      EXPECT_EQ(train_losses(t), std::vector<double>(want.begin() + 3, want.end()));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_session->rank() == 0) fs::remove_all(resumed);
    fs::remove_all(sim);
  }
}

TEST(MpiTrainer, SaveFailingOnOneRankCommitsNothing) {
  const Dims dims = meshes().front();
  const fs::path dir = shared_dir("failsave");
  const int last = g_session->size() - 1;
  {
    Trainer t(args(dir, dims), make_model(), std::nullopt, data(), std::nullopt, on_ranks());
    // The last rank cannot write its blocks of checkpoint-6's optimizer state.
    if (g_session->rank() == last)
      t.checkpoint_hooks.after_file = [&t](const std::string& f) {
        if (t.state().step == 6 && f == "optimizer.safetensors") throw Error(errc::io, f, "disk full (test)");
      };
    try {
      t.train();
      ADD_FAILURE() << "the failed save was not reported on rank " << g_session->rank();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (g_session->rank() == last) EXPECT_NE(what.find("disk full"), std::string::npos) << what;
      else EXPECT_NE(what.find("rank " + std::to_string(last) + " failed to write its part"), std::string::npos) << what;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_session->rank() == 0) {
    CheckpointManager ck(dir.string());
    ASSERT_TRUE(ck.latest().has_value());
    EXPECT_EQ(fs::path(*ck.latest()).filename(), "checkpoint-3");
    EXPECT_FALSE(fs::exists(dir / "checkpoint-6"));
    for (const auto& e : fs::directory_iterator(dir))  // rank 0 removed the uncommitted folder
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    auto m = make_model();
    optim::Optimizer o;
    EXPECT_EQ(load_state(*ck.latest(), m, o).step, 3);
    fs::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace edl::train
