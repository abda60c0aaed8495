// edl/mesh/process_group.hpp
// The processes a mesh spans, seen from the host (outside mesh.run): which one this is, and
// small agreements between them. Host code that must act once per run (print, write a file,
// commit a checkpoint) asks is_primary(); code that must not go on unless every process
// succeeded asks failed_ranks().
//
//   ProcessGroup pg(mesh);             // one process on a simulated mesh, N on an MPI mesh
//   bool ok = write_my_part();
//   if (!pg.failed_ranks(ok).empty()) ...   // every process gets the same answer
//
// The agreements are collectives of the mesh itself (a psum over every device), so on the MPI
// backend they have its deadline (EDL_MPI_TIMEOUT): a dead peer is an errc::collective error,
// never a hang. Every process must call them in the same order, as with any collective.
// Device order (mesh/backends/mpi.hpp): process r runs devices [r * local, (r + 1) * local).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/mesh/mesh.hpp>

namespace edl {

/// Where a process sits among the launch's processes by model-parallel and data-parallel
/// groups (EasyDeL's get_ranks_and_size): the processes one tp x sp group spans
/// (mp_node_size), how many such process groups there are (dp_node_size), and this process's
/// place in each. Processes of one mp node run the same model-parallel groups, so they take
/// the same data: a loader reads shard dp_node_rank of dp_node_size.
struct NodeRanks {
  int mp_node_size = 1, dp_node_size = 1;
  int mp_node_rank = 0, dp_node_rank = 0;
  bool operator==(const NodeRanks&) const = default;
};

/// NodeRanks of process `rank` of `processes`, each running `local_devices` devices of a mesh
/// whose model-parallel axes (tp x sp) hold `mp_devices` devices: mp_node_size =
/// max(1, mp_devices / local_devices), dp_node_size = processes / mp_node_size.
inline NodeRanks node_ranks(std::int64_t mp_devices, std::int64_t local_devices, int processes, int rank) {
  EDL_CHECK(mp_devices > 0 && local_devices > 0 && processes > 0 && rank >= 0 && rank < processes,
            errc::invalid_argument, "node_ranks", "expected positive sizes and 0 <= rank < processes, found mp_devices ",
            mp_devices, ", local_devices ", local_devices, ", processes ", processes, ", rank ", rank);
  NodeRanks n;
  n.mp_node_size = static_cast<int>(std::max<std::int64_t>(1, mp_devices / local_devices));
  EDL_CHECK(processes % n.mp_node_size == 0, errc::not_divisible, "node_ranks", processes,
            " processes do not divide into model-parallel nodes of ", n.mp_node_size);
  n.dp_node_size = processes / n.mp_node_size;
  n.dp_node_rank = rank / n.mp_node_size;
  n.mp_node_rank = rank % n.mp_node_size;
  return n;
}

class ProcessGroup {
 public:
  /// One process, no mesh.
  ProcessGroup() = default;
  explicit ProcessGroup(DefaultMesh mesh) : mesh_(std::move(mesh)) {
    size_ = mesh_->backend().processes();
    const std::int64_t local = mesh_->size() / size_;
    for (std::int64_t d = 0; d < mesh_->size(); ++d)
      if (mesh_->backend().is_local(d)) {
        rank_ = static_cast<int>(d / local);
        first_local_ = d;
        break;
      }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// The same processes, agreeing over channels of their own (CollectiveBackend::twin): a
  /// thread may run this group's agreements while another runs the mesh's collectives (a
  /// checkpoint committed in the background). Every process calls it, in the same order. One
  /// process: this group.
  ProcessGroup separate() const {
    if (size_ == 1) return *this;
    MeshDims dims{};
    std::copy(mesh_->shape().sizes().begin(), mesh_->shape().sizes().end(), dims.begin());
    DefaultMesh fresh(dims, mesh_->size());
    auto twin = mesh_->backend().twin(fresh.context());
    EDL_CHECK(twin != nullptr, errc::unsupported, "ProcessGroup::separate", "the ", mesh_->backend().name(),
              " backend has no twin for agreements of their own");
    fresh.set_backend(std::move(twin));
    return ProcessGroup(std::move(fresh));
  }
  /// The process that prints, writes the run's files and commits checkpoints (rank 0).
  bool is_primary() const noexcept { return rank_ == 0; }

  /// The sum over processes of each process's `values` (same length on every process).
  std::vector<std::int64_t> sum(std::vector<std::int64_t> values) const {
    if (size_ == 1) return values;
    std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(mesh_->size()));
    mesh_->run([&](Device& dev) {
      // Only the process's first device contributes, so each process counts once.
      std::vector<std::int64_t> v = dev.id() == first_local_ ? values : std::vector<std::int64_t>(values.size(), 0);
      psum(dev, v);
      out[static_cast<std::size_t>(dev.id())] = std::move(v);
    });
    return out[static_cast<std::size_t>(first_local_)];
  }

  /// The ranks whose `ok` is false, in increasing order; the same list on every process.
  std::vector<int> failed_ranks(bool ok) const {
    std::vector<std::int64_t> flags(static_cast<std::size_t>(size_), 0);
    flags[static_cast<std::size_t>(rank_)] = ok ? 0 : 1;
    flags = sum(std::move(flags));
    std::vector<int> failed;
    for (int r = 0; r < size_; ++r)
      if (flags[static_cast<std::size_t>(r)] != 0) failed.push_back(r);
    return failed;
  }

  /// Runs `f` on every process, then agrees (a collective): a process whose `f` threw rethrows
  /// its own error; the others throw an errc::io error at `where` naming the ranks that failed
  /// to do `what`, followed by `consequence`. So no process goes on alone.
  template <class F>
  void on_every_rank(const std::string& where, std::string_view what, F&& f, std::string_view consequence = {}) const {
    std::exception_ptr mine;
    try {
      f();
    } catch (...) {
      mine = std::current_exception();
    }
    const std::vector<int> failed = failed_ranks(mine == nullptr);
    if (mine) std::rethrow_exception(mine);
    if (failed.empty()) return;
    std::string ranks;
    for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    ::edl::detail::raise(errc::io, where, ::edl::detail::concat("rank ", ranks, " failed to ", what, consequence));
  }

  /// Every process's `value`, by rank (e.g. each rank's peak memory, for rank 0 to report).
  std::vector<std::int64_t> each(std::int64_t value) const {
    std::vector<std::int64_t> v(static_cast<std::size_t>(size_), 0);
    v[static_cast<std::size_t>(rank_)] = value;
    return sum(std::move(v));
  }

  /// The primary's `value` on every process.
  std::int64_t from_primary(std::int64_t value) const { return sum({is_primary() ? value : 0})[0]; }

  /// This process's NodeRanks on its mesh (one process: a node of its own, rank 0).
  NodeRanks node_ranks() const {
    if (!mesh_) return {};
    const std::int64_t mp = mesh_->axis_size("tp") * mesh_->axis_size("sp");
    return ::edl::node_ranks(mp, mesh_->size() / size_, size_, rank_);
  }

 private:
  std::optional<DefaultMesh> mesh_;
  int rank_ = 0, size_ = 1;
  std::int64_t first_local_ = 0;
};

}  // namespace edl
