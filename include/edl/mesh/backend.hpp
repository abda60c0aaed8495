// edl/mesh/backend.hpp
// The interface between device code and whatever moves bytes between devices.
//
// Models never talk to a backend directly: they call the typed collectives of
// mesh/collectives.hpp (psum, all_gather, ...) from inside mesh.run(body). Those turn axis
// names into a *group* (device ids in group order, MeshShape::group) and call one of the
// virtual functions below with raw bytes, a DType and element counts. A backend therefore
// knows nothing about tensors, axis names or element types beyond DType:
//   - SimulatedBackend (mesh/backends/simulated.hpp): every device is a thread of this
//     process, collectives rendezvous in shared memory;
//   - an MPI backend would map each device to a rank, each distinct group to a communicator
//     (MPI_Comm_split keyed on the group), and each call to the matching MPI collective.
//
// The contract every backend keeps (docs/mesh.md):
//   - SPMD: every member of `group` calls the same collective, in the same order relative
//     to its other calls on that group, with the same op, dtype and counts. A mismatch is
//     an edl::Error(errc::collective) naming the op and what differs, where it can be seen.
//   - `group` lists device ids in group order; the caller is one of them, and its index in
//     the list is its position (what axis_index returns for the grouped axes).
//   - Reductions on bf16/f16 widen to f32, combine in f32 and round once; f64 combines in
//     f64; integers combine in int64 and are narrowed back. Elements are combined in group
//     order (position 0, 1, 2, ...), so every member receives the same bits and the result
//     does not depend on thread scheduling or arrival order.
//   - Buffers may be used in place where the sizes allow (in == out for all_reduce,
//     ppermute, all_to_all, broadcast); otherwise in and out must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>

namespace edl {

class Device;         // mesh/device.hpp
struct MeshContext;   // mesh/mesh.hpp

/// How a reduction combines the members' values. mean = sum / group size (in f32 for
/// floating storage; integer division for integer storage).
enum class ReduceOp { sum, max, min, mean };

constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::mean: return "mean";
  }
  return "?";
}

/// A (source, destination) pair of ppermute, as positions in the group (JAX's `perm`).
using PermutePair = std::pair<std::int64_t, std::int64_t>;

/// Runs device bodies and moves bytes between devices. Counts are in elements of `dtype`.
/// Every collective is called by each member of `group` with its own buffers, from inside
/// run(); `self` is the calling device.
class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;

  /// Short name for logs and benchmarks ("simulated", "mpi").
  virtual std::string_view name() const noexcept = 0;

  /// Runs body once per device of the mesh (concurrently: collectives inside the body block
  /// until their whole group arrives) and returns when all bodies have returned. If a body
  /// throws, the others are released from any collective they wait in and run() throws an
  /// edl::Error naming the first device that failed.
  virtual void run(const std::function<void(Device&)>& body) = 0;

  /// out[i] = op over members (in group order) of in[i]; `count` elements on every member.
  virtual void all_reduce(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                          std::span<const std::int64_t> group) = 0;

  /// out = concatenation of every member's `count` elements, in group order
  /// (out holds count * group.size() elements).
  virtual void all_gather(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                          std::span<const std::int64_t> group) = 0;

  /// Reduces the members' in (count * group.size() elements each) as all_reduce does, and the
  /// member at position p keeps chunk p: out = reduced[p * count, (p + 1) * count).
  virtual void reduce_scatter(Device& self, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                              std::span<const std::int64_t> group) = 0;

  /// in and out hold group.size() chunks of `count` elements; chunk q of position p's out is
  /// chunk p of position q's in (MPI_Alltoall; JAX all_to_all with split = concat axis 0).
  virtual void all_to_all(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                          std::span<const std::int64_t> group) = 0;

  /// For each (src, dst) in pairs, position dst's out = position src's in. A position that
  /// is no pair's destination gets zeros (as jax.lax.ppermute). Sources and destinations are
  /// each distinct; `pairs` is the same list on every member.
  virtual void ppermute(Device& self, const void* in, void* out, std::size_t count, DType dtype,
                        std::span<const PermutePair> pairs, std::span<const std::int64_t> group) = 0;

  /// Every member's out = the in of the member at position `root` (in is read on the root only).
  virtual void broadcast(Device& self, const void* in, void* out, std::size_t count, DType dtype, std::int64_t root,
                         std::span<const std::int64_t> group) = 0;

  /// Returns once every member of the group has called barrier.
  virtual void barrier(Device& self, std::span<const std::int64_t> group) = 0;

  // Host side, outside run(). A backend spread over processes runs a slice of the devices in
  // each; results that the devices leave on the host (gathered tensors, logits) then exist in
  // part on every process, and these calls let the layers above complete them.

  /// Processes the mesh spans (1: this process runs every device).
  virtual int processes() const noexcept { return 1; }
  /// Whether this process runs device d.
  virtual bool is_local(std::int64_t device) const noexcept {
    (void)device;
    return true;
  }
  /// buf = the sum over processes of every process's buf (`count` elements of `dtype`; bf16
  /// and f16 are summed in f32). Called by every process, in the same order. Used to assemble
  /// results whose parts are disjoint (zeros elsewhere), so the sum is exact.
  virtual void sum_over_processes(void* buf, std::size_t count, DType dtype) {
    (void)buf;
    (void)count;
    (void)dtype;
  }
  /// A backend over the same processes for another mesh of the same shape (`ctx`), whose
  /// messages can never meet this one's (MPI: a communicator of its own), so that one thread may
  /// run its collectives while another runs this backend's: a checkpoint agreed on and committed
  /// in the background while training goes on. Every process calls it, in the same order. Null
  /// where there is no such twin; one process needs none.
  virtual std::shared_ptr<CollectiveBackend> twin(std::weak_ptr<MeshContext> ctx) const {
    (void)ctx;
    return nullptr;
  }
};

}  // namespace edl
