// Tests for edl/mesh/backends/mpi.hpp, run under mpirun on 2 and 4 ranks (1 or 2 devices per
// rank): every collective gives, bit for bit, what the simulated mesh of the same shape gives
// on the devices this rank runs; a mesh that does not match the launch is refused before any
// work; a peer that never answers ends in an error within the deadline, not a hang.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/mesh/all.hpp>
#include <edl/mesh/backends/mpi.hpp>

#include "session.hpp"

namespace edl {
namespace {

using test::g_session;

// Deterministic inputs: device d's element i.
template <class T>
std::vector<T> input(std::int64_t d, std::size_t n, int salt) {
  std::vector<T> v(n);
  const Key k = fold_in(Key::from_seed(7), static_cast<std::uint32_t>(d * 131 + salt));
  for (std::size_t i = 0; i < n; ++i) v[i] = from_f32<T>(normal_at(k, i));
  return v;
}

using Outputs = std::map<std::int64_t, std::vector<std::byte>>;

// Runs `body(dev, out_bytes)` on `mesh` and returns each (local) device's output bytes.
template <class MeshT, class F>
Outputs collect(const MeshT& mesh, F&& body) {
  Outputs out;
  std::mutex mu;
  mesh.run([&](Device& dev) {
    std::vector<std::byte> bytes;
    body(dev, bytes);
    std::lock_guard<std::mutex> lk(mu);
    out[dev.id()] = std::move(bytes);
  });
  return out;
}

template <class T>
void append(std::vector<std::byte>& b, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  b.insert(b.end(), p, p + v.size() * sizeof(T));
}

// Every collective over several axis sets, f32 and bf16, odd sizes.
template <class T>
void all_collectives(Device& dev, std::vector<std::byte>& b) {
  const std::vector<AxisList> axis_sets = {{}, {"dp"}, {"fsdp"}, {"tp"}, {"dp", "tp"}, {"fsdp", "tp"}};
  for (std::size_t a = 0; a < axis_sets.size(); ++a) {
    const auto& axes = axis_sets[a];
    const std::int64_t n = axis_size(dev, axes);
    const int salt = static_cast<int>(a) * 10;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min}) {
      auto v = input<T>(dev.id(), 1001, salt + static_cast<int>(op));
      all_reduce(dev, std::span<T>(v), op, axes);
      append(b, v);
    }
    {  // large enough for the two-phase (reduce-scatter + all-gather) path
      auto v = input<T>(dev.id(), 40001, salt + 8);
      all_reduce(dev, std::span<T>(v), ReduceOp::sum, axes);
      append(b, v);
    }
    if (std::is_same_v<T, float> && a == 2) {  // parts larger than a reduction's staging chunk (4 MiB over the peers): folded in pieces (one axis set: they are large)
      const std::size_t part = (std::size_t{4} << 20) / sizeof(T) + 1001;
      auto v = input<T>(dev.id(), part * static_cast<std::size_t>(n) + 3, salt + 9);
      all_reduce(dev, std::span<T>(v), ReduceOp::sum, axes);
      append(b, v);
      auto w = input<T>(dev.id(), part * static_cast<std::size_t>(n), salt + 10);
      std::vector<T> mine(part);
      reduce_scatter(dev, std::span<const T>(w), std::span<T>(mine), axes);
      append(b, mine);
    }
    auto in = input<T>(dev.id(), 37, salt + 5);
    std::vector<T> gathered(37 * static_cast<std::size_t>(n));
    all_gather(dev, std::span<const T>(in), std::span<T>(gathered), axes);
    append(b, gathered);
    auto big = input<T>(dev.id(), 13 * static_cast<std::size_t>(n), salt + 6);
    std::vector<T> part(13);
    reduce_scatter(dev, std::span<const T>(big), std::span<T>(part), axes);
    append(b, part);
    std::vector<T> swapped(big.size());
    all_to_all(dev, std::span<const T>(big), std::span<T>(swapped), axes);
    append(b, swapped);
    if (!axes.empty()) {
      std::vector<T> shifted(in.size());
      ppermute(dev, std::span<const T>(in), std::span<T>(shifted), axes, shift_pairs(n, 1, false));
      append(b, shifted);
    }
    auto root = input<T>(dev.id(), 19, salt + 7);
    broadcast(dev, std::span<T>(root), n - 1, axes);
    append(b, root);
    barrier(dev, axes);
  }
}

std::vector<std::array<std::int64_t, 4>> shapes_for(std::int64_t devices) {
  if (devices == 2) return {{2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}};
  if (devices == 4) return {{2, 1, 2, 1}, {1, 2, 2, 1}, {1, 4, 1, 1}};
  if (devices == 8) return {{2, 2, 2, 1}, {1, 4, 2, 1}};
  return {{devices, 1, 1, 1}};
}

class MpiCollectives : public ::testing::TestWithParam<int> {};

TEST_P(MpiCollectives, EqualSimulatedMeshBitForBit) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  for (const auto& dims : shapes_for(devices)) {
    auto sim = create_mesh(dims);
    auto real = create_mesh(dims);
    auto backend = mpi::attach(real, *g_session, local);
    for (bool bf : {false, true}) {
      auto body = [&](Device& dev, std::vector<std::byte>& b) {
        if (bf) all_collectives<bf16>(dev, b);
        else all_collectives<float>(dev, b);
      };
      const Outputs want = collect(sim, body), got = collect(real, body);
      ASSERT_EQ(got.size(), static_cast<std::size_t>(local));
      for (const auto& [d, bytes] : got) {
        ASSERT_TRUE(backend->is_local(d));
        ASSERT_EQ(bytes.size(), want.at(d).size());
        EXPECT_EQ(std::memcmp(bytes.data(), want.at(d).data(), bytes.size()), 0)
            << "device " << d << " on mesh " << sim.shape().axes_str() << (bf ? " bf16" : " f32");
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(LocalDevices, MpiCollectives, ::testing::Values(1, 2));

// EasyDeL's get_ranks_and_size under mpirun: the processes of one mp node are exactly those
// that hold the devices of this process's tp x sp groups, nodes tile the launch, and every
// process agrees on the sizes.
TEST_P(MpiCollectives, NodeRanksGroupTheProcessesOfOneModelParallelGroup) {
  const int local = GetParam();
  const std::int64_t devices = static_cast<std::int64_t>(g_session->size()) * local;
  for (const auto& dims : shapes_for(devices)) {
    auto mesh = create_mesh(dims);
    auto backend = mpi::attach(mesh, *g_session, local);
    const ProcessGroup pg(mesh);
    const NodeRanks n = pg.node_ranks();
    SCOPED_TRACE(mesh.shape().axes_str());
    EXPECT_EQ(n.mp_node_size * n.dp_node_size, pg.size());
    EXPECT_EQ(n.dp_node_rank * n.mp_node_size + n.mp_node_rank, pg.rank());
    std::set<std::int64_t> spanned;  // the processes holding devices of this process's mp groups
    const std::vector<std::string> mp_axes = {"tp", "sp"};
    for (std::int64_t d = 0; d < devices; ++d)
      if (backend->is_local(d))
        for (std::int64_t g : mesh.shape().group(d, std::span<const std::string>(mp_axes)).devices) spanned.insert(g / local);
    std::set<std::int64_t> node;
    for (int i = 0; i < n.mp_node_size; ++i) node.insert(n.dp_node_rank * n.mp_node_size + i);
    EXPECT_EQ(spanned, node);
    const auto sizes = pg.each(n.mp_node_size);
    for (auto v : sizes) EXPECT_EQ(v, n.mp_node_size);
  }
}

TEST(MpiBackend, MeshThatDoesNotMatchTheLaunchIsRefused) {
  auto mesh = create_mesh({1, 1, g_session->size() + 1, 1});
  try {
    mpi::attach(mesh, *g_session, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("mpirun -np"), std::string::npos) << e.what();
  }
}

TEST(MpiBackend, SilentPeerEndsInAnErrorWithinTheDeadline) {
  setenv("EDL_MPI_TIMEOUT", "1", 1);
  auto mesh = create_mesh({1, 1, g_session->size(), 1});
  mpi::attach(mesh, *g_session, 1);
  unsetenv("EDL_MPI_TIMEOUT");
  const auto t0 = std::chrono::steady_clock::now();
  bool threw = false;
  try {
    mesh.run([&](Device& dev) {
      if (dev.id() == 0) return;  // device 0 never joins: the others must not hang
      std::vector<float> v(4, 1.f);
      psum(dev, std::span<float>(v), {"tp"});
    });
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.code(), errc::collective) << e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(threw, g_session->rank() != 0);
  EXPECT_LT(s, 10.0);
  // Drain: device 0's rank must not leave before the others timed out (their sends were
  // cancelled); a barrier on the world keeps the next test clean.
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace edl

int main(int argc, char** argv) {
  edl::mpi::Session session(argc, argv);
  edl::test::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  if (session.rank() != 0)  // one rank prints; every rank's failures count in the exit code
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  const int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
