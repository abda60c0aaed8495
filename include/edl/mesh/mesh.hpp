// edl/mesh/mesh.hpp
// Mesh<"dp", "fsdp", "ep", "tp", "sp">: a device mesh whose axis names are part of its type, so a
// PartitionSpec naming an axis the mesh lacks is a compile error where both types are known.
// Sizes are run-time values (at most one -1, inferred from the device count).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <edl/core/fixed_string.hpp>
#include <edl/mesh/backend.hpp>
#include <edl/mesh/device.hpp>
#include <edl/mesh/device_count.hpp>
#include <edl/mesh/memory.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

/// What every copy of a Mesh shares: the topology, the per-device memory accounting and
/// the backend that runs devices and moves bytes between them. Tensors keep a pointer to
/// it so their shards are accounted on the right mesh for as long as they live.
struct MeshContext {
  MeshShape shape;
  MemoryTracker memory;
  std::shared_ptr<CollectiveBackend> backend;  // set by the mesh backend layer
  explicit MeshContext(MeshShape s) : shape(std::move(s)), memory(shape.size()) {}
};

/// The default backend of a Mesh: every device a thread of this process (defined in
/// mesh/backends/simulated.hpp, which this header includes at its end). The backend keeps
/// only a weak reference to the context, so the two do not keep each other alive.
inline std::shared_ptr<CollectiveBackend> make_simulated_backend(std::shared_ptr<MeshContext> ctx);

template <Name... Axes>
class Mesh {
 public:
  static constexpr std::size_t rank = sizeof...(Axes);
  static_assert(rank > 0, "edl::Mesh: a mesh needs at least one axis");
  static constexpr std::array<Name, rank> axis_names{Axes...};

  template <Name A>
  static constexpr bool has_axis = ((A == Axes) || ...);

  template <Name A>
  static constexpr std::size_t axis_index() {
    static_assert(has_axis<A>, "edl::Mesh: this axis name is not one of the mesh's axes");
    std::size_t i = 0;
    for (; i < rank; ++i)
      if (axis_names[i] == A) break;
    return i;
  }

  /// sizes: one per axis; one may be -1 and is inferred from `devices`.
  explicit Mesh(std::array<std::int64_t, rank> sizes, std::int64_t devices = -1)
      : ctx_(std::make_shared<MeshContext>(
            MeshShape(names_vector(), std::vector<std::int64_t>(sizes.begin(), sizes.end()), devices))) {
    ctx_->backend = make_simulated_backend(ctx_);
  }

  const MeshShape& shape() const noexcept { return ctx_->shape; }
  std::int64_t size() const noexcept { return ctx_->shape.size(); }
  template <Name A>
  std::int64_t axis_size() const { return ctx_->shape.sizes()[axis_index<A>()]; }
  std::int64_t axis_size(std::string_view name) const { return ctx_->shape.axis_size(name); }
  MemoryTracker& memory() const noexcept { return ctx_->memory; }
  const std::shared_ptr<MeshContext>& context() const noexcept { return ctx_; }
  CollectiveBackend& backend() const noexcept { return *ctx_->backend; }
  /// Replaces the backend (e.g. with an MPI one); every copy of this mesh shares the change.
  void set_backend(std::shared_ptr<CollectiveBackend> b) const { ctx_->backend = std::move(b); }

  /// shard_map: runs body(Device&) once on every device, concurrently, and waits for all.
  /// Collectives (mesh/collectives.hpp) called inside the body synchronise the devices of
  /// their group. If a body throws, run() throws an edl::Error naming the first failing device.
  template <class F>
    requires std::is_invocable_v<F&, Device&>
  void run(F&& body) const {
    ctx_->backend->run(std::function<void(Device&)>([&body](Device& d) { body(d); }));
  }

 private:
  static std::vector<std::string> names_vector() {
    std::vector<std::string> v;
    for (const auto& n : axis_names) v.emplace_back(n.view());
    return v;
  }
  std::shared_ptr<MeshContext> ctx_;
};

/// The axes EasyDeL meshes use: data, fully-sharded data, expert, tensor and sequence parallel.
using DefaultMesh = Mesh<"dp", "fsdp", "ep", "tp", "sp">;

/// The sizes of DefaultMesh's axes, in its order: {dp, fsdp, ep, tp, sp}.
using MeshDims = std::array<std::int64_t, 5>;

/// {dp, fsdp, tp, sp} (the mesh without an expert axis) as MeshDims, ep = 1.
constexpr MeshDims mesh_dims_without_ep(const std::array<std::int64_t, 4>& d) noexcept {
  return {d[0], d[1], 1, d[2], d[3]};
}

/// `dims` with an axis of -1 filled so that the mesh has `devices` devices (default: the
/// launch's, device_count()). Errors (two axes of -1, a size below 1, devices the other axes do
/// not divide) are raised with `code`, naming `where` (the field or flag the sizes came from).
inline MeshDims infer_mesh_dims(const MeshDims& dims, std::int64_t devices = -1, const std::string& where = "Mesh",
                                errc code = errc::not_divisible) {
  std::int64_t known = 1, minus_one = 0;
  for (auto d : dims) {
    EDL_CHECK(d == -1 || d >= 1, code, where, "axis sizes must be positive or -1, found ", d);
    d == -1 ? ++minus_one : known *= d;
  }
  EDL_CHECK(minus_one <= 1, code, where, "at most one axis may be -1, found ", minus_one);
  if (minus_one == 0) return dims;
  if (devices <= 0) devices = device_count();
  EDL_CHECK(devices % known == 0, code, where, "-1 takes the devices left over, but ", devices,
            " devices (device_count(): EDL_DEVICES, else one per process or MPI rank) do not divide by the other "
            "axes' product ", known);
  MeshDims out = dims;
  for (auto& d : out)
    if (d == -1) d = devices / known;
  return out;
}

/// EasyDeL's create_mesh(axis_dims): DefaultMesh with one size per axis, -1 inferred from
/// `devices` (default: the launch's, device_count()); five sizes are {dp, fsdp, ep, tp, sp},
/// four are {dp, fsdp, tp, sp} with ep = 1.
inline DefaultMesh create_mesh(const MeshDims& dims, std::int64_t devices = -1) {
  return DefaultMesh(infer_mesh_dims(dims, devices), devices);
}
inline DefaultMesh create_mesh(const std::array<std::int64_t, 4>& dims, std::int64_t devices = -1) {
  return create_mesh(mesh_dims_without_ep(dims), devices);
}
/// create_mesh({1, 2, 1, 1}) and create_mesh({1, 1, 2, 1, 1}): a braced list of four or five sizes.
template <std::size_t N>
  requires(N == 4 || N == 5)
DefaultMesh create_mesh(const std::int64_t (&dims)[N], std::int64_t devices = -1) {
  std::array<std::int64_t, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = dims[i];
  return create_mesh(a, devices);
}

}  // namespace edl

// The default backend's definition needs MeshContext and Device, so it comes last.
#include <edl/mesh/backends/simulated.hpp>
